//! The Dockerfile language, parsed by strata itself, and the build plan `strata build` sends as
//! ordinary template-build steps.
//!
//! Parsing runs in three passes, each in its own file: [`lines`] finds parser directives,
//! continuations and heredoc bodies; [`instruction`] turns each logical line into a typed
//! [`Instruction`] (refusing what strata cannot build, naming the line); [`plan`] evaluates
//! ARG/ENV scoping the way Docker does and emits the steps. ADR 0029 says why strata owns this
//! grammar rather than a crate, and where it differs from Docker.

pub mod instruction;
pub mod lines;
pub mod plan;
pub mod words;

pub use instruction::{CommandForm, Instruction};
pub use plan::{plan, BuildPlan, PlanOptions, PlannedStep, Recorded, StagePlan, StepKind};

use std::fmt;

/// A Dockerfile that parsed: its directives, the ARGs before the first FROM, and its stages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dockerfile {
    pub directives: lines::Directives,
    /// `ARG`s before the first `FROM`: usable in `FROM` lines, and in a stage that redeclares them.
    pub global_args: Vec<Located>,
    pub stages: Vec<Stage>,
}

impl Dockerfile {
    /// Whether any COPY or ADD gives its files an owner (`--chown`): only those need to know
    /// which of their sources are directories ([`PlanOptions::context_directories`]).
    pub fn has_chown(&self) -> bool {
        self.stages
            .iter()
            .flat_map(|s| &s.instructions)
            .any(|l| matches!(&l.instruction, Instruction::Copy { chown: Some(_), .. }))
    }
}

/// One `FROM` and the instructions up to the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub line: usize,
    /// The image word as written (ARGs not yet expanded).
    pub image: String,
    /// `AS name`, lower-cased as Docker compares stage names.
    pub name: Option<String>,
    /// `--platform=`: recorded; strata builds for the node's own platform.
    pub platform: Option<String>,
    pub instructions: Vec<Located>,
}

/// An instruction and the Dockerfile line it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub line: usize,
    pub instruction: Instruction,
}

/// Why a Dockerfile cannot be built, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct DockerfileError {
    /// The 1-based line the problem is on, when it is on one.
    pub line: Option<usize>,
    pub message: String,
}

impl DockerfileError {
    pub fn at(line: usize, message: impl Into<String>) -> Self {
        DockerfileError {
            line: Some(line),
            message: message.into(),
        }
    }

    pub fn whole(message: impl Into<String>) -> Self {
        DockerfileError {
            line: None,
            message: message.into(),
        }
    }
}

impl fmt::Display for DockerfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "Dockerfile line {line}: {}", self.message),
            None => write!(f, "Dockerfile: {}", self.message),
        }
    }
}

/// Parses a whole Dockerfile. Every instruction strata cannot build is refused here, before any
/// file is hashed or uploaded.
pub fn parse(text: &str) -> Result<Dockerfile, DockerfileError> {
    let (directives, logical) = lines::logical_lines(text)?;
    let mut global_args = Vec::new();
    let mut stages: Vec<Stage> = Vec::new();
    for line in logical {
        let instruction = instruction::parse_line(&line, directives.escape)?;
        match instruction {
            Instruction::From {
                image,
                name,
                platform,
            } => {
                if let Some(name) = &name {
                    if stages.iter().any(|s| s.name.as_deref() == Some(name)) {
                        return Err(DockerfileError::at(
                            line.line,
                            format!("a stage named {name:?} is already defined"),
                        ));
                    }
                }
                stages.push(Stage {
                    line: line.line,
                    image,
                    name,
                    platform,
                    instructions: Vec::new(),
                });
            }
            other => {
                let located = Located {
                    line: line.line,
                    instruction: other,
                };
                match stages.last_mut() {
                    Some(stage) => stage.instructions.push(located),
                    None if matches!(located.instruction, Instruction::Arg(_)) => {
                        global_args.push(located)
                    }
                    None => {
                        return Err(DockerfileError::at(
                            line.line,
                            format!(
                                "{} comes before the first FROM: only ARG may",
                                line.keyword.to_ascii_uppercase()
                            ),
                        ))
                    }
                }
            }
        }
    }
    if stages.is_empty() {
        return Err(DockerfileError::whole(
            "no FROM instruction: nothing to build",
        ));
    }
    Ok(Dockerfile {
        directives,
        global_args,
        stages,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_split_at_from_and_global_args_come_first() {
        let file =
            parse("ARG V=1\nFROM busybox:${V} AS Build\nRUN true\nFROM busybox\nUSER u\n").unwrap();
        assert_eq!(file.global_args.len(), 1);
        assert_eq!(file.stages.len(), 2);
        assert_eq!(file.stages[0].name.as_deref(), Some("build"));
        assert_eq!(file.stages[0].image, "busybox:${V}");
        assert_eq!(file.stages[1].line, 4);
        assert_eq!(file.stages[1].instructions[0].line, 5);
    }

    #[test]
    fn instructions_before_from_and_files_without_from_are_refused() {
        let err = parse("# c\nRUN true\nFROM a\n").unwrap_err();
        assert_eq!(err.line, Some(2));
        assert!(
            err.to_string()
                .starts_with("Dockerfile line 2: RUN comes before"),
            "{err}"
        );
        assert_eq!(parse("ARG A\n").unwrap_err().line, None);
        let dup = parse("FROM a AS x\nFROM b AS X\n").unwrap_err();
        assert_eq!(dup.line, Some(2));
    }
}
