//! From a parsed Dockerfile to the steps of one template build: the target stage, ARG and ENV
//! evaluated with Docker's scoping, WORKDIR resolved, CMD/ENTRYPOINT combined into the start
//! command. The steps are the E2B protocol's own (RUN, COPY, ENV, WORKDIR, USER), so the server
//! needs nothing new for a single-stage file.

use std::collections::{BTreeMap, BTreeSet};

use super::instruction::{CommandForm, CopySource, Instruction};
use super::lines::Heredoc;
use super::words::{expand, expand_text, split_words};
use super::{Dockerfile, DockerfileError, Located};

/// What the command line adds to the file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanOptions {
    /// `--build-arg K=V`: overrides an ARG's default where the ARG is declared.
    pub build_args: BTreeMap<String, String>,
    /// `--target`: the stage to build; the last one when `None`.
    pub target: Option<String>,
    /// The build context's directories, relative and without slashes at either end (`app`,
    /// `app/lib`): `COPY --chown=u dir /new` makes `/new` itself owned by `u`, a file source
    /// only its parents, and only the context can say which a source is.
    pub context_directories: BTreeSet<String>,
}

/// One stage's build, and which stage it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagePlan {
    /// The stage's position in the file (0-based), which `COPY --from=<n>` may name.
    pub index: usize,
    pub name: Option<String>,
    /// Its FROM line.
    pub line: usize,
    pub plan: BuildPlan,
}

/// One template build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildPlan {
    /// The FROM image, or the name of the earlier stage in `from_stage`.
    pub from_image: String,
    /// `FROM <stage>`: this build extends that stage's template (`fromTemplate`).
    pub from_stage: Option<usize>,
    pub steps: Vec<PlannedStep>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    /// LABEL, EXPOSE, VOLUME and MAINTAINER: kept for the user to see, not applied.
    pub recorded: Vec<Recorded>,
    /// What was accepted but not applied as Docker would (the CLI prints each).
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedStep {
    /// The Dockerfile line the step comes from; `None` for the implicit first and last steps.
    pub line: Option<usize>,
    /// One line for progress output, e.g. `RUN pip install -r requirements.txt`.
    pub summary: String,
    pub kind: StepKind,
}

/// A step as the start request carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepKind {
    Run {
        command: String,
        /// Runs as this user instead of the current one (COPY heredocs run as root).
        user: Option<String>,
    },
    /// One context source; `chown` and `chmod` are always set (Docker's defaults are root and
    /// the file's own mode, where the E2B server's are the current user).
    Copy {
        src: String,
        dest: String,
        chown: String,
        chmod: String,
    },
    /// Names and values, each value encoded for the server's `printf '%s' "<value>"`.
    Env(Vec<(String, String)>),
    Workdir(String),
    User(String),
    /// `COPY --from=<stage>`: a literal absolute path of an earlier stage's filesystem
    /// (strata's COPY_FROM step).
    CopyFrom {
        stage: usize,
        src: String,
        dest: String,
        chown: String,
        chmod: String,
    },
}

/// A metadata instruction strata records but does not apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub line: usize,
    pub instruction: &'static str,
    pub values: Vec<String>,
}

/// The ready command when the Dockerfile sets a start command and no HEALTHCHECK: long enough
/// for a start command that fails at once (a missing binary, a bad flag) to fail the build,
/// where the SDK's `sleep 20` makes every build and launch wait 20 s.
pub const DEFAULT_READY_CMD: &str = "sleep 1";

/// Plans the build of the target stage.
/// Plans the builds of the target stage and of every stage it needs, each after the stages it
/// needs; the target's plan is last and carries the warnings that concern the whole file.
pub fn plan(file: &Dockerfile, options: &PlanOptions) -> Result<Vec<StagePlan>, DockerfileError> {
    let escape = file.directives.escape;
    let mut warnings = Vec::new();
    let mut used_build_args = std::collections::BTreeSet::new();

    // Global ARGs: visible in FROM lines, and as defaults for a stage that redeclares them.
    let mut global: BTreeMap<String, Option<String>> = BTreeMap::new();
    for located in &file.global_args {
        let Instruction::Arg(args) = &located.instruction else {
            unreachable!("only ARG precedes FROM")
        };
        for (name, default) in args {
            let value = match options.build_args.get(name) {
                Some(v) => {
                    used_build_args.insert(name.clone());
                    Some(v.clone())
                }
                None => match default {
                    Some(d) => Some(
                        expand(d, &|n| global.get(n).cloned().flatten(), escape)
                            .map_err(|e| DockerfileError::at(located.line, e))?,
                    ),
                    None => None,
                },
            };
            global.insert(name.clone(), value);
        }
    }

    let target = target_stage(file, options)?;
    let needed = needed_stages(file, target, &global)?;
    for (i, stage) in file.stages.iter().enumerate() {
        if !needed.contains(&i) {
            warnings.push(format!(
                "stage {} (line {}) is not needed for the target and is not built",
                stage.name.as_deref().unwrap_or("without a name"),
                stage.line
            ));
        }
    }
    let mut plans = Vec::new();
    for &index in &needed {
        let mut stage_warnings = Vec::new();
        let plan = plan_stage(
            file,
            index,
            &global,
            options,
            &mut used_build_args,
            &mut stage_warnings,
        )?;
        plans.push(StagePlan {
            index,
            name: file.stages[index].name.clone(),
            line: file.stages[index].line,
            plan: BuildPlan {
                warnings: stage_warnings,
                ..plan
            },
        });
    }
    for name in options.build_args.keys() {
        if !used_build_args.contains(name) {
            warnings.push(format!(
                "--build-arg {name} is not declared by an ARG the target stage sees, and is unused"
            ));
        }
    }
    let last = plans.last_mut().expect("the target is needed");
    last.plan.warnings.splice(0..0, warnings);
    Ok(plans)
}

/// The stage `reference` names among those before `before`: by `AS` name, or by index.
fn stage_named(file: &Dockerfile, reference: &str, before: usize) -> Option<usize> {
    let wanted = reference.to_ascii_lowercase();
    file.stages[..before]
        .iter()
        .position(|s| s.name.as_deref() == Some(wanted.as_str()))
        .or_else(|| reference.parse::<usize>().ok().filter(|i| *i < before))
}

/// The FROM image of stage `index`, ARGs expanded, and the earlier stage it names if it does.
fn stage_base(
    file: &Dockerfile,
    index: usize,
    global: &BTreeMap<String, Option<String>>,
) -> Result<(String, Option<usize>), DockerfileError> {
    let stage = &file.stages[index];
    let image = expand(
        &stage.image,
        &|n| global.get(n).cloned().flatten(),
        file.directives.escape,
    )
    .map_err(|e| DockerfileError::at(stage.line, e))?;
    if image.is_empty() {
        return Err(DockerfileError::at(stage.line, "FROM names no image"));
    }
    if image.eq_ignore_ascii_case("scratch") {
        return Err(DockerfileError::at(
            stage.line,
            "FROM scratch is not supported: a template needs a root filesystem with a shell",
        ));
    }
    let earlier = file.stages[..index]
        .iter()
        .position(|s| s.name.as_deref() == Some(image.to_ascii_lowercase().as_str()));
    Ok((image, earlier))
}

/// The stages the target needs, each after the stages it needs (BuildKit builds no other).
fn needed_stages(
    file: &Dockerfile,
    target: usize,
    global: &BTreeMap<String, Option<String>>,
) -> Result<Vec<usize>, DockerfileError> {
    fn visit(
        file: &Dockerfile,
        index: usize,
        global: &BTreeMap<String, Option<String>>,
        order: &mut Vec<usize>,
    ) -> Result<(), DockerfileError> {
        if order.contains(&index) {
            return Ok(());
        }
        if let (_, Some(base)) = stage_base(file, index, global)? {
            visit(file, base, global, order)?;
        }
        for located in &file.stages[index].instructions {
            if let Instruction::Copy {
                from: Some(from), ..
            } = &located.instruction
            {
                if let Some(source) = stage_named(file, from, index) {
                    visit(file, source, global, order)?;
                }
            }
        }
        order.push(index);
        Ok(())
    }
    let mut order = Vec::new();
    visit(file, target, global, &mut order)?;
    Ok(order)
}

/// Plans one stage: its own ARGs, ENVs and steps.
fn plan_stage(
    file: &Dockerfile,
    index: usize,
    global: &BTreeMap<String, Option<String>>,
    options: &PlanOptions,
    used_build_args: &mut std::collections::BTreeSet<String>,
    warnings: &mut Vec<String>,
) -> Result<BuildPlan, DockerfileError> {
    let stage = &file.stages[index];
    let (from_image, from_stage) = stage_base(file, index, global)?;
    if let Some(platform) = &stage.platform {
        warnings.push(format!(
            "line {}: --platform={platform} is not applied: strata builds for the node's platform",
            stage.line
        ));
    }
    let mut planner = StagePlanner {
        escape: file.directives.escape,
        file,
        index,
        global,
        build_args: &options.build_args,
        context_directories: &options.context_directories,
        used_build_args,
        args: Vec::new(),
        env: Vec::new(),
        workdir: "/".into(),
        user_set: false,
        workdir_set: false,
        steps: vec![
            implicit(StepKind::User("root".into()), "USER root"),
            implicit(StepKind::Workdir("/".into()), "WORKDIR /"),
        ],
        cmd: None,
        entrypoint: None,
        healthcheck: None,
        recorded: Vec::new(),
        warnings,
    };
    for located in &stage.instructions {
        planner
            .instruction(located)
            .map_err(|message| DockerfileError::at(located.line, message))?;
    }
    let StagePlanner {
        mut steps,
        user_set,
        workdir_set,
        cmd,
        entrypoint,
        healthcheck,
        recorded,
        ..
    } = planner;
    // The SDK's closing steps: a template's sandboxes run as `user` in its home unless the
    // Dockerfile chose otherwise.
    if !user_set {
        steps.push(implicit(StepKind::User("user".into()), "USER user"));
    }
    if !workdir_set {
        steps.push(implicit(
            StepKind::Workdir("/home/user".into()),
            "WORKDIR /home/user",
        ));
    }
    let start_cmd = start_command(entrypoint, cmd);
    let ready_cmd = match healthcheck {
        Some(Some(check)) => Some(join_command(&check)),
        _ if start_cmd.is_some() => Some(DEFAULT_READY_CMD.to_string()),
        _ => None,
    };
    Ok(BuildPlan {
        from_image,
        from_stage,
        steps,
        start_cmd,
        ready_cmd,
        recorded,
        warnings: Vec::new(),
    })
}

fn implicit(kind: StepKind, summary: &str) -> PlannedStep {
    PlannedStep {
        line: None,
        summary: summary.to_string(),
        kind,
    }
}

fn target_stage(file: &Dockerfile, options: &PlanOptions) -> Result<usize, DockerfileError> {
    let Some(target) = &options.target else {
        return Ok(file.stages.len() - 1);
    };
    let wanted = target.to_ascii_lowercase();
    file.stages
        .iter()
        .position(|s| s.name.as_deref() == Some(wanted.as_str()))
        .ok_or_else(|| {
            let names: Vec<&str> = file
                .stages
                .iter()
                .filter_map(|s| s.name.as_deref())
                .collect();
            DockerfileError::whole(if names.is_empty() {
                format!("--target {target}: the Dockerfile names no stages (FROM … AS name)")
            } else {
                format!(
                    "--target {target}: no such stage; the stages are {}",
                    names.join(", ")
                )
            })
        })
}

/// [`expand`] (a word) or [`expand_text`] (a heredoc body).
type Expander = fn(&str, &dyn Fn(&str) -> Option<String>, char) -> Result<String, String>;

/// A reference the server resolves: a variable this Dockerfile never set, which may come from
/// the base image's environment (`ENV PATH=/opt/bin:$PATH`). Private-use code points, replaced
/// by `${NAME}` once the value is encoded.
const DEFER_OPEN: char = '\u{E000}';
const DEFER_CLOSE: char = '\u{E001}';

struct StagePlanner<'a> {
    escape: char,
    file: &'a Dockerfile,
    /// This stage's index: `COPY --from` may name only stages before it.
    index: usize,
    global: &'a BTreeMap<String, Option<String>>,
    build_args: &'a BTreeMap<String, String>,
    context_directories: &'a BTreeSet<String>,
    used_build_args: &'a mut std::collections::BTreeSet<String>,
    /// ARGs declared in this stage, in order, with their values.
    args: Vec<(String, Option<String>)>,
    /// ENVs set in this stage, with values as Docker expanded them (deferred references kept).
    env: Vec<(String, String)>,
    workdir: String,
    user_set: bool,
    workdir_set: bool,
    steps: Vec<PlannedStep>,
    cmd: Option<CommandForm>,
    entrypoint: Option<CommandForm>,
    healthcheck: Option<Option<CommandForm>>,
    recorded: Vec<Recorded>,
    warnings: &'a mut Vec<String>,
}

impl StagePlanner<'_> {
    fn lookup(&self, name: &str, defer_unknown: bool) -> Option<String> {
        if let Some((_, value)) = self.env.iter().rev().find(|(n, _)| n == name) {
            return Some(if value.contains(DEFER_OPEN) {
                // The server knows this variable's value better than the plan does.
                format!("{DEFER_OPEN}{name}{DEFER_CLOSE}")
            } else {
                value.clone()
            });
        }
        if let Some((_, value)) = self.args.iter().rev().find(|(n, _)| n == name) {
            return value.clone();
        }
        defer_unknown.then(|| format!("{DEFER_OPEN}{name}{DEFER_CLOSE}"))
    }

    /// Expands a word; a variable this Dockerfile never set expands to nothing, with a warning
    /// (Docker would use the base image's value, which the plan cannot see).
    fn word(&mut self, word: &str, line: usize) -> Result<String, String> {
        self.expand_warning(word, line, expand)
    }

    fn expand_warning(&mut self, text: &str, line: usize, how: Expander) -> Result<String, String> {
        let unknown = std::cell::RefCell::new(Vec::new());
        let value = how(
            text,
            &|n| {
                let found = self.lookup(n, false);
                if found.is_none() {
                    unknown.borrow_mut().push(n.to_string());
                }
                found
            },
            self.escape,
        )?;
        self.warn_unknown(unknown.into_inner(), line);
        Ok(value)
    }

    fn warn_unknown(&mut self, unknown: Vec<String>, line: usize) {
        for name in unknown {
            let warning = format!(
                "line {line}: ${name} is not set by this Dockerfile and expands to nothing here (Docker would take the base image's value)"
            );
            if !self.warnings.contains(&warning) {
                self.warnings.push(warning);
            }
        }
    }

    fn step(&mut self, line: usize, summary: String, kind: StepKind) {
        self.steps.push(PlannedStep {
            line: Some(line),
            summary,
            kind,
        });
    }

    fn instruction(&mut self, located: &Located) -> Result<(), String> {
        let line = located.line;
        match &located.instruction {
            Instruction::From { .. } => unreachable!("FROM starts a stage"),
            Instruction::Arg(args) => {
                for (name, default) in args {
                    let value = match self.build_args.get(name) {
                        Some(v) => {
                            self.used_build_args.insert(name.clone());
                            Some(v.clone())
                        }
                        None => match default {
                            Some(d) => Some(self.word(d, line)?),
                            None => self.global.get(name).cloned().flatten(),
                        },
                    };
                    self.args.push((name.clone(), value));
                }
            }
            Instruction::Env(pairs) => {
                let mut encoded = Vec::new();
                for (name, raw) in pairs {
                    if !super::instruction::valid_variable_name(name) {
                        return Err(format!("{name:?} is no valid ENV name"));
                    }
                    let value = expand(raw, &|n| self.lookup(n, true), self.escape)?;
                    encoded.push((name.clone(), encode_env_value(&value)));
                    self.env.push((name.clone(), value));
                }
                let summary = pairs
                    .iter()
                    .map(|(n, v)| format!("{n}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ");
                self.step(line, format!("ENV {summary}"), StepKind::Env(encoded));
            }
            Instruction::Workdir(raw) => {
                let path = self.word(raw, line)?;
                if path.is_empty() {
                    return Err("WORKDIR expands to an empty path".into());
                }
                self.workdir = resolve(&self.workdir, &path);
                self.workdir_set = true;
                let workdir = self.workdir.clone();
                self.step(
                    line,
                    format!("WORKDIR {workdir}"),
                    StepKind::Workdir(workdir),
                );
            }
            Instruction::User(raw) => {
                let user = self.word(raw, line)?;
                if user.is_empty() || user.contains(char::is_whitespace) {
                    return Err(format!("USER {user:?} is no user name"));
                }
                self.user_set = true;
                self.step(line, format!("USER {user}"), StepKind::User(user));
            }
            Instruction::Run {
                command,
                heredocs,
                ignored_flags,
            } => {
                for flag in ignored_flags {
                    self.warnings.push(format!(
                        "line {line}: RUN {flag} is not applied by strata build"
                    ));
                }
                let script = run_script(command, heredocs);
                // As written: `RUN <<EOF`, not the first line of the script.
                let summary = match command {
                    CommandForm::Shell(text) => format!("RUN {}", first_line(text)),
                    CommandForm::Exec(_) => format!("RUN {}", first_line(&script)),
                };
                let command = format!("{}{script}", self.arg_exports());
                self.step(
                    line,
                    summary,
                    StepKind::Run {
                        command,
                        user: None,
                    },
                );
            }
            Instruction::Copy {
                add,
                sources,
                dest,
                chown,
                chmod,
                from,
            } => self.copy(line, *add, sources, dest, chown, chmod, from)?,
            Instruction::Cmd(command) => self.cmd = Some(command.clone()),
            Instruction::Entrypoint(command) => self.entrypoint = Some(command.clone()),
            Instruction::Healthcheck(check) => self.healthcheck = Some(check.clone()),
            Instruction::Label(pairs) => {
                let mut values = Vec::new();
                for (k, v) in pairs {
                    values.push(format!("{}={}", self.word(k, line)?, self.word(v, line)?));
                }
                self.record(line, "LABEL", values);
            }
            Instruction::Expose(ports) => {
                let values = ports
                    .iter()
                    .map(|p| self.word(p, line))
                    .collect::<Result<_, _>>()?;
                self.record(line, "EXPOSE", values);
            }
            Instruction::Volume(paths) => {
                let values = paths
                    .iter()
                    .map(|p| self.word(p, line))
                    .collect::<Result<_, _>>()?;
                self.record(line, "VOLUME", values);
            }
            Instruction::Maintainer(who) => self.record(line, "MAINTAINER", vec![who.clone()]),
        }
        Ok(())
    }

    fn record(&mut self, line: usize, instruction: &'static str, values: Vec<String>) {
        self.recorded.push(Recorded {
            line,
            instruction,
            values,
        });
    }

    /// Docker gives a RUN its stage's ARGs as environment variables without keeping them in the
    /// image; the E2B protocol's RUN has no environment of its own, so they lead the command.
    /// An ENV of the same name wins, as in Docker.
    fn arg_exports(&self) -> String {
        let mut seen = std::collections::BTreeSet::new();
        let mut exports = Vec::new();
        for (name, value) in self.args.iter().rev() {
            if !seen.insert(name) || self.env.iter().any(|(n, _)| n == name) {
                continue;
            }
            if let Some(value) = value {
                exports.push(format!("{name}={}", shell_quote(value)));
            }
        }
        if exports.is_empty() {
            return String::new();
        }
        exports.reverse();
        format!("export {}; ", exports.join(" "))
    }

    #[allow(clippy::too_many_arguments)]
    fn copy(
        &mut self,
        line: usize,
        add: bool,
        sources: &[CopySource],
        dest: &str,
        chown: &Option<String>,
        chmod: &Option<String>,
        from: &Option<String>,
    ) -> Result<(), String> {
        let keyword = if add { "ADD" } else { "COPY" };
        let from_stage = match from {
            Some(from) => Some(stage_named(self.file, from, self.index).ok_or_else(|| {
                format!(
                    "COPY --from={from}: no earlier stage is named {from}; to copy out of an image, add `FROM {from} AS <name>` before this stage and copy --from=<name>"
                )
            })?),
            None => None,
        };
        let dest = self.word(dest, line)?;
        if dest.is_empty() {
            return Err(format!("{keyword}'s destination expands to an empty path"));
        }
        if sources.len() > 1 && !dest.ends_with('/') {
            return Err(format!(
                "{keyword} with more than one source needs a destination directory ending in / (got {dest:?})"
            ));
        }
        let chown = match chown {
            Some(raw) => {
                let owner = self.word(raw, line)?;
                if owner.is_empty() {
                    return Err("--chown expands to an empty owner".into());
                }
                owner
            }
            None => "root:root".into(),
        };
        let chmod = match chmod {
            Some(raw) => normalize_mode(raw)?,
            None => String::new(),
        };
        for source in sources {
            match source {
                CopySource::Path(raw) if from_stage.is_some() => {
                    let src = self.word(raw, line)?;
                    if src.contains(['*', '?', '[']) {
                        return Err(format!(
                            "COPY --from {src}: globs are not supported in a copy between stages; name the file or directory"
                        ));
                    }
                    let src = resolve("/", &src);
                    let stage = from_stage.expect("matched");
                    self.own_new_directories(line, keyword, &chown, &dest, false);
                    self.step(
                        line,
                        format!(
                            "COPY --from={} {src} {dest}",
                            self.file.stages[stage]
                                .name
                                .clone()
                                .unwrap_or_else(|| stage.to_string())
                        ),
                        StepKind::CopyFrom {
                            stage,
                            src,
                            dest: dest.clone(),
                            chown: chown.clone(),
                            chmod: chmod.clone(),
                        },
                    );
                }
                CopySource::Heredoc(_) if from_stage.is_some() => {
                    return Err("COPY --from cannot copy a heredoc".into())
                }
                CopySource::Path(raw) => {
                    let src = self.word(raw, line)?;
                    if add {
                        refuse_add_only(&src)?;
                    }
                    let relative = resolve("/", &src);
                    let relative = relative.trim_start_matches('/');
                    let is_dir = relative.is_empty() || self.context_directories.contains(relative);
                    self.own_new_directories(line, keyword, &chown, &dest, is_dir);
                    self.step(
                        line,
                        format!("{keyword} {src} {dest}"),
                        StepKind::Copy {
                            src,
                            dest: dest.clone(),
                            chown: chown.clone(),
                            chmod: chmod.clone(),
                        },
                    );
                }
                CopySource::Heredoc(heredoc) => {
                    let target = if dest.ends_with('/') {
                        format!("{dest}{}", heredoc.delimiter)
                    } else {
                        dest.clone()
                    };
                    let path = resolve(&self.workdir, &target);
                    let body = if heredoc.quoted {
                        heredoc.body.clone()
                    } else {
                        self.expand_warning(&heredoc.body, line, expand_text)?
                    };
                    let mode = if chmod.is_empty() { "0644" } else { &chmod };
                    let parent = match path.rfind('/') {
                        Some(0) | None => "/".to_string(),
                        Some(at) => path[..at].to_string(),
                    };
                    let command = format!(
                        "{mkdir} && printf '%s' {body} > {file} && chmod {mode} {file} && chown {owner} {file}",
                        mkdir = make_directories(&parent, &chown),
                        body = shell_quote(&body),
                        file = shell_quote(&path),
                        owner = shell_quote(&chown),
                    );
                    self.step(
                        line,
                        format!("{keyword} <<{} {path}", heredoc.delimiter),
                        StepKind::Run {
                            command,
                            user: Some("root".into()),
                        },
                    );
                }
            }
        }
        Ok(())
    }
}

impl StagePlanner<'_> {
    /// Docker creates the directories a `COPY --chown=u` needs owned by `u`; the E2B server's
    /// COPY creates them as root (PROTOCOL.md §3.7). So before such a COPY a root RUN creates
    /// the ones missing, owned by `u`: the destination when it is a directory (it ends in `/`
    /// or the source is a directory), else its parent. Existing directories are not touched.
    fn own_new_directories(
        &mut self,
        line: usize,
        keyword: &str,
        chown: &str,
        dest: &str,
        source_is_directory: bool,
    ) {
        if chown == "root:root" {
            return;
        }
        let path = resolve(&self.workdir, dest);
        let directory = if dest.ends_with('/') || source_is_directory {
            path
        } else {
            match path.rfind('/') {
                Some(0) | None => "/".to_string(),
                Some(at) => path[..at].to_string(),
            }
        };
        if directory == "/" {
            return;
        }
        self.step(
            line,
            format!(
                "{keyword} --chown={chown}: new directories up to {directory} owned by {chown}"
            ),
            StepKind::Run {
                command: make_directories(&directory, chown),
                user: Some("root".into()),
            },
        );
    }
}

/// `mkdir -p directory`, with each directory it creates owned by `owner` (a root `sh` script).
fn make_directories(directory: &str, owner: &str) -> String {
    if owner == "root:root" {
        return format!("mkdir -p {}", shell_quote(directory));
    }
    let mut prefixes = Vec::new();
    let mut at = String::new();
    for part in directory.split('/').filter(|p| !p.is_empty()) {
        at = format!("{at}/{part}");
        prefixes.push(shell_quote(&at));
    }
    format!(
        "for d in {}; do [ -e \"$d\" ] || [ -L \"$d\" ] || {{ mkdir \"$d\" && chown {} \"$d\"; }} || exit 1; done",
        prefixes.join(" "),
        shell_quote(owner)
    )
}

/// What only ADD does, strata build does not do yet: fetch URLs, unpack local archives.
fn refuse_add_only(src: &str) -> Result<(), String> {
    let lower = src.to_ascii_lowercase();
    if ["http://", "https://", "git@", "git://", "ssh://"]
        .iter()
        .any(|p| lower.starts_with(p))
    {
        return Err(format!(
            "ADD {src}: fetching URLs is not supported by strata build; download in a RUN step"
        ));
    }
    if [
        ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst",
    ]
    .iter()
    .any(|s| lower.ends_with(s))
    {
        return Err(format!(
            "ADD {src}: unpacking archives is not supported by strata build; COPY it and unpack it in a RUN step"
        ));
    }
    Ok(())
}

/// `--chmod=755` → `0755`. Symbolic modes are refused.
fn normalize_mode(raw: &str) -> Result<String, String> {
    u32::from_str_radix(raw, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .map(|m| format!("{m:04o}"))
        .ok_or_else(|| format!("--chmod={raw} is not an octal mode such as 0644"))
}

/// `path` against `base`, `.` and `..` resolved; always absolute (the server's own rule).
fn resolve(base: &str, path: &str) -> String {
    crate::domain::build_spec::resolve_path(base, path)
}

/// The shell text of a RUN: its command, with any heredoc bodies where the shell reads them.
fn run_script(command: &CommandForm, heredocs: &[Heredoc]) -> String {
    let text = match command {
        CommandForm::Exec(words) => return join_words(words),
        CommandForm::Shell(text) => text,
    };
    if let [only] = heredocs {
        // `RUN <<EOF` alone: the body is the script.
        if split_words(text, '\\').len() == 1 && text.trim_start().starts_with("<<") {
            if only.body.starts_with("#!") {
                return format!(
                    "f=$(mktemp) && printf '%s' {} > \"$f\" && chmod +x \"$f\" && \"$f\"; rc=$?; rm -f \"$f\"; exit $rc",
                    shell_quote(&only.body)
                );
            }
            return only.body.clone();
        }
    }
    let mut script = text.clone();
    for heredoc in heredocs {
        script.push('\n');
        script.push_str(&heredoc.body);
        script.push_str(&heredoc.delimiter);
    }
    script
}

/// Docker's rules: an exec-form ENTRYPOINT takes CMD as its arguments; a shell-form one
/// ignores CMD; CMD alone is the command.
fn start_command(entrypoint: Option<CommandForm>, cmd: Option<CommandForm>) -> Option<String> {
    match (entrypoint, cmd) {
        (Some(CommandForm::Shell(entry)), _) => Some(entry),
        (Some(CommandForm::Exec(mut entry)), cmd) => {
            match cmd {
                Some(CommandForm::Exec(args)) => entry.extend(args),
                Some(CommandForm::Shell(text)) => {
                    entry.extend(["/bin/sh".to_string(), "-c".to_string(), text])
                }
                None => {}
            }
            (!entry.is_empty()).then(|| join_words(&entry))
        }
        (None, Some(cmd)) => Some(join_command(&cmd)),
        (None, None) => None,
    }
}

fn join_command(command: &CommandForm) -> String {
    match command {
        CommandForm::Shell(text) => text.clone(),
        CommandForm::Exec(words) => join_words(words),
    }
}

fn join_words(words: &[String]) -> String {
    words
        .iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Quotes a word for sh: bare when it is plainly safe, else in single quotes.
pub fn shell_quote(word: &str) -> String {
    let safe = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if safe {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

fn first_line(script: &str) -> &str {
    script.lines().next().unwrap_or("")
}

/// Encodes a value Docker already expanded so that the server's `printf '%s' "<value>"`
/// yields it unchanged: `\` and `$` are escaped (the server escapes `"`, backticks and `$(`
/// itself), and each deferred reference becomes `${NAME}` for the server to expand.
pub fn encode_env_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push_str("\\\\"),
            '$' if chars.peek() == Some(&'(') => out.push('$'),
            '$' => out.push_str("\\$"),
            DEFER_OPEN => {
                out.push_str("${");
                for n in chars.by_ref() {
                    if n == DEFER_CLOSE {
                        break;
                    }
                    out.push(n);
                }
                out.push('}');
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::parse;
    use super::*;

    fn plan_of(text: &str, args: &[(&str, &str)]) -> Result<BuildPlan, DockerfileError> {
        let options = PlanOptions {
            build_args: args
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            target: None,
            context_directories: BTreeSet::new(),
        };
        plan(&parse(text)?, &options).map(|mut plans| plans.pop().unwrap().plan)
    }

    #[test]
    fn only_a_file_with_a_chown_needs_the_contexts_directories() {
        assert!(parse("FROM busybox\nCOPY --chown=app a /b\n")
            .unwrap()
            .has_chown());
        assert!(!parse("FROM busybox\nCOPY a /b\nRUN chown app /b\n")
            .unwrap()
            .has_chown());
    }

    #[test]
    fn copy_chown_first_creates_the_missing_directories_owned_by_the_owner() {
        let text = "FROM busybox\nWORKDIR /w\n\
            COPY --chown=1000:1000 data/*.txt /srv/data/\n\
            COPY --chown=app ./app opt\n\
            COPY --chown=app one.txt /etc/x/one.txt\n\
            COPY --chown=app one.txt /top.txt\n\
            COPY one.txt /root-owned/\n\
            COPY --chown=app <<EOF /h/conf\nx\nEOF\n";
        let options = PlanOptions {
            context_directories: ["app".to_string(), "app/lib".to_string()].into(),
            ..Default::default()
        };
        let p = plan(&parse(text).unwrap(), &options)
            .unwrap()
            .pop()
            .unwrap()
            .plan;
        let summaries: Vec<&str> = p.steps.iter().map(|s| s.summary.as_str()).collect();
        assert_eq!(
            summaries[3..summaries.len() - 1],
            [
                "COPY --chown=1000:1000: new directories up to /srv/data owned by 1000:1000",
                "COPY data/*.txt /srv/data/",
                // A directory source: the destination itself is the new directory.
                "COPY --chown=app: new directories up to /w/opt owned by app",
                "COPY ./app opt",
                // A file source: its parent.
                "COPY --chown=app: new directories up to /etc/x owned by app",
                "COPY one.txt /etc/x/one.txt",
                "COPY one.txt /top.txt",
                "COPY one.txt /root-owned/",
                "COPY <<EOF /h/conf",
            ]
        );
        let StepKind::Run { command, user } = &p.steps[3].kind else {
            panic!("{:?}", p.steps[3])
        };
        assert_eq!(user.as_deref(), Some("root"));
        assert_eq!(
            command,
            "for d in /srv /srv/data; do [ -e \"$d\" ] || [ -L \"$d\" ] || { mkdir \"$d\" && chown 1000:1000 \"$d\"; } || exit 1; done"
        );
        let StepKind::Run { command, .. } = &p.steps[11].kind else {
            panic!("{:?}", p.steps[11])
        };
        assert!(
            command.starts_with("for d in /h; do") && command.ends_with("chown app /h/conf"),
            "{command}"
        );
    }

    fn kinds(plan: &BuildPlan) -> Vec<&StepKind> {
        plan.steps.iter().map(|s| &s.kind).collect()
    }

    #[test]
    fn a_plain_file_becomes_the_sdk_steps_with_docker_owners() {
        let p = plan_of(
            "FROM busybox\nENV A=1 B=\"two words\"\nWORKDIR app\nCOPY --chmod=755 run.sh ./\nRUN ./run.sh\nUSER nobody\nCMD [\"./run.sh\", \"serve\"]\n",
            &[],
        )
        .unwrap();
        assert_eq!(p.from_image, "busybox");
        assert_eq!(
            kinds(&p),
            vec![
                &StepKind::User("root".into()),
                &StepKind::Workdir("/".into()),
                &StepKind::Env(vec![
                    ("A".into(), "1".into()),
                    ("B".into(), "two words".into())
                ]),
                &StepKind::Workdir("/app".into()),
                &StepKind::Copy {
                    src: "run.sh".into(),
                    dest: "./".into(),
                    chown: "root:root".into(),
                    chmod: "0755".into()
                },
                &StepKind::Run {
                    command: "./run.sh".into(),
                    user: None
                },
                &StepKind::User("nobody".into()),
            ]
        );
        assert_eq!(p.steps[4].line, Some(4));
        assert_eq!(p.start_cmd.as_deref(), Some("./run.sh serve"));
        assert_eq!(p.ready_cmd.as_deref(), Some(DEFAULT_READY_CMD));
    }

    #[test]
    fn args_scope_per_stage_and_reach_run_without_persisting() {
        let text = "ARG BASE=busybox\nARG V=1\nFROM ${BASE}\nRUN echo $V\nARG V\nARG W=$V-x\nENV E=$W\nRUN echo $V $W\n";
        let p = plan_of(text, &[("V", "9"), ("UNUSED", "1")]).unwrap();
        let runs: Vec<&String> = p
            .steps
            .iter()
            .filter_map(|s| match &s.kind {
                StepKind::Run { command, .. } => Some(command),
                _ => None,
            })
            .collect();
        // Before the stage redeclares V, the global ARG is not visible.
        assert_eq!(runs[0], "echo $V");
        assert_eq!(runs[1], "export V=9 W=9-x; echo $V $W");
        assert!(kinds(&p).contains(&&StepKind::Env(vec![("E".into(), "9-x".into())])));
        assert!(
            p.warnings.iter().any(|w| w.contains("--build-arg UNUSED")),
            "{:?}",
            p.warnings
        );
        // An ENV shadows an ARG of the same name.
        let p = plan_of("FROM a\nARG X=1\nENV X=2\nRUN echo $X\n", &[]).unwrap();
        assert!(kinds(&p).contains(&&StepKind::Run {
            command: "echo $X".into(),
            user: None
        }));
    }

    #[test]
    fn env_values_defer_what_only_the_image_knows() {
        let p = plan_of(
            "FROM a\nENV P=/opt/bin:$PATH\nENV Q=$P L='$literal' S=a\\\\b\n",
            &[],
        )
        .unwrap();
        let envs: Vec<&StepKind> = kinds(&p)
            .into_iter()
            .filter(|k| matches!(k, StepKind::Env(_)))
            .collect();
        assert_eq!(
            envs,
            vec![
                &StepKind::Env(vec![("P".into(), "/opt/bin:${PATH}".into())]),
                &StepKind::Env(vec![
                    ("Q".into(), "${P}".into()),
                    ("L".into(), "\\$literal".into()),
                    ("S".into(), "a\\\\b".into())
                ]),
            ]
        );
    }

    #[test]
    fn heredocs_become_scripts_and_files() {
        let p = plan_of(
            "FROM a\nARG N=x\nWORKDIR /w\nRUN <<EOF\necho one\necho two\nEOF\nRUN cat <<'X' > /f\n$keep\nX\nCOPY <<EOF conf/\nname=$N\nEOF\nRUN <<EOF\n#!/usr/bin/env python3\nprint(1)\nEOF\n",
            &[],
        )
        .unwrap();
        let commands: Vec<(String, Option<String>)> = p
            .steps
            .iter()
            .filter_map(|s| match &s.kind {
                StepKind::Run { command, user } => Some((command.clone(), user.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(commands[0].0, "export N=x; echo one\necho two\n");
        assert_eq!(commands[1].0, "export N=x; cat <<'X' > /f\n$keep\nX");
        assert_eq!(
            commands[2],
            (
                "mkdir -p /w/conf && printf '%s' 'name=x\n' > /w/conf/EOF && chmod 0644 /w/conf/EOF && chown root:root /w/conf/EOF".into(),
                Some("root".into())
            )
        );
        assert!(
            commands[3].0.contains("mktemp") && commands[3].0.contains("#!/usr/bin/env python3")
        );
    }

    #[test]
    fn entrypoint_and_cmd_combine_as_in_docker() {
        let start = |text: &str| plan_of(&format!("FROM a\n{text}"), &[]).unwrap().start_cmd;
        assert_eq!(
            start("ENTRYPOINT [\"e\", \"x y\"]\nCMD [\"c\"]\n").as_deref(),
            Some("e 'x y' c")
        );
        assert_eq!(start("ENTRYPOINT e\nCMD [\"c\"]\n").as_deref(), Some("e"));
        assert_eq!(
            start("ENTRYPOINT [\"e\"]\nCMD c $X\n").as_deref(),
            Some("e /bin/sh -c 'c $X'")
        );
        assert_eq!(
            start("CMD python -m http.server\n").as_deref(),
            Some("python -m http.server")
        );
        assert_eq!(start("RUN true\n"), None);
        let p = plan_of(
            "FROM a\nCMD s\nHEALTHCHECK CMD [\"test\", \"-e\", \"/up\"]\n",
            &[],
        )
        .unwrap();
        assert_eq!(p.ready_cmd.as_deref(), Some("test -e /up"));
    }

    #[test]
    fn targets_pick_a_stage_and_only_the_stages_it_needs_are_planned() {
        let text = "FROM busybox AS one\nRUN echo 1\nFROM busybox AS two\nRUN echo 2\n";
        let file = parse(text).unwrap();
        let one = plan(
            &file,
            &PlanOptions {
                target: Some("ONE".into()),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(one.len(), 1);
        assert!(one[0].plan.steps.iter().any(|s| s.summary == "RUN echo 1"));
        assert!(one[0].plan.warnings[0].contains("stage two (line 3) is not needed"));
        assert!(plan(
            &file,
            &PlanOptions {
                target: Some("three".into()),
                ..Default::default()
            }
        )
        .unwrap_err()
        .message
        .contains("one, two"));
    }

    #[test]
    fn stages_a_target_copies_from_or_builds_on_come_first() {
        let text = "ARG V=1\nFROM busybox AS build\nRUN make\nFROM busybox AS unused\nFROM build AS test\nRUN test\nFROM busybox\nCOPY --from=build out/app /usr/bin/\nCOPY --from=0 /etc/os-release /x\n";
        let plans = plan(&parse(text).unwrap(), &PlanOptions::default()).unwrap();
        assert_eq!(
            plans.iter().map(|p| p.index).collect::<Vec<_>>(),
            vec![0, 3]
        );
        let last = &plans[1].plan;
        assert_eq!(last.from_stage, None);
        assert!(kinds(last).contains(&&StepKind::CopyFrom {
            stage: 0,
            src: "/out/app".into(),
            dest: "/usr/bin/".into(),
            chown: "root:root".into(),
            chmod: "".into(),
        }));
        assert!(
            last.warnings.iter().any(|w| w.contains("stage unused")),
            "{:?}",
            last.warnings
        );
        let test = plan(
            &parse(text).unwrap(),
            &PlanOptions {
                target: Some("test".into()),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(test.iter().map(|p| p.index).collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(test[1].plan.from_stage, Some(0));
        for (text, says) in [
            (
                "FROM a AS x\nCOPY --from=later /x /y\nFROM a AS later\nFROM a\nCOPY --from=x /x /y\n",
                "no earlier stage",
            ),
            ("FROM a\nCOPY --from=nginx /x /y\n", "FROM nginx AS"),
            ("FROM a AS b\nFROM a\nCOPY --from=b /lib/*.so /y/\n", "globs"),
        ] {
            let err = plan(&parse(text).unwrap(), &PlanOptions::default()).unwrap_err();
            assert!(err.message.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn add_only_features_and_bad_copies_are_refused_by_line() {
        for (text, says) in [
            ("ADD https://example.com/x /x", "URLs"),
            ("ADD pkg.tar.gz /opt/", "archives"),
            ("COPY a b /dst", "ending in /"),
            ("COPY --chmod=u+x a /a", "octal"),
            ("FROM scratch", "scratch"),
        ] {
            let err = plan_of(&format!("FROM a\n{text}\n"), &[]).unwrap_err();
            assert!(err.message.contains(says), "{text}: {err}");
        }
        let p = plan_of("FROM a\nADD local.txt /x\nLABEL a=b\nEXPOSE 80 443\n", &[]).unwrap();
        assert_eq!(p.recorded.len(), 2);
        assert_eq!(p.recorded[1].values, vec!["80", "443"]);
    }

    #[test]
    fn quoting_round_trips_through_sh() {
        for word in ["plain", "a b", "it's", "", "$HOME", "a\nb"] {
            let quoted = shell_quote(word);
            let out = super::super::words::split_words(&quoted, '\\');
            let back = expand(
                out.first().map(String::as_str).unwrap_or("''"),
                &|_| None,
                '\\',
            )
            .unwrap();
            assert_eq!(back, word, "{quoted}");
        }
    }
}
