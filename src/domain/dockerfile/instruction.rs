//! One logical line to one typed instruction: flags, exec (JSON) or shell form, key=value
//! lists. Values stay as written; [`super::plan`] expands them, since what a `$VAR` means
//! depends on the ARGs and ENVs in scope at that point of the stage.

use super::lines::{Heredoc, LogicalLine};
use super::words::split_words;
use super::DockerfileError;

/// RUN, CMD, ENTRYPOINT and HEALTHCHECK CMD take a shell string or an exec array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandForm {
    Shell(String),
    Exec(Vec<String>),
}

/// A COPY or ADD source: a context path (as written) or an inline heredoc file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopySource {
    Path(String),
    Heredoc(Heredoc),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Instruction {
    From {
        image: String,
        name: Option<String>,
        platform: Option<String>,
    },
    Run {
        command: CommandForm,
        heredocs: Vec<Heredoc>,
        /// `--mount`, `--network`, `--security`: accepted, not applied (the plan warns).
        ignored_flags: Vec<String>,
    },
    Copy {
        /// ADD rather than COPY (the plan refuses what only ADD does: URLs, archives).
        add: bool,
        sources: Vec<CopySource>,
        dest: String,
        chown: Option<String>,
        chmod: Option<String>,
        from: Option<String>,
    },
    Env(Vec<(String, String)>),
    Arg(Vec<(String, Option<String>)>),
    Workdir(String),
    User(String),
    Cmd(CommandForm),
    Entrypoint(CommandForm),
    /// `HEALTHCHECK NONE` is `None`; options such as `--interval` are not applied.
    Healthcheck(Option<CommandForm>),
    Label(Vec<(String, String)>),
    Expose(Vec<String>),
    Volume(Vec<String>),
    Maintainer(String),
}

/// Parses one logical line. The escape character is the file's (`\` or a backtick).
pub fn parse_line(line: &LogicalLine, escape: char) -> Result<Instruction, DockerfileError> {
    let at = |message: String| DockerfileError::at(line.line, message);
    let keyword = line.keyword.to_ascii_uppercase();
    let rest = line.rest.as_str();
    let needs_args = |what: &str| -> Result<(), DockerfileError> {
        if rest.is_empty() {
            Err(at(format!("{keyword} needs {what}")))
        } else {
            Ok(())
        }
    };
    match keyword.as_str() {
        "FROM" => {
            let (flags, rest) = leading_flags(rest);
            let mut platform = None;
            for (name, value) in flags {
                match name.as_str() {
                    "platform" => platform = value,
                    other => return Err(at(format!("FROM does not take --{other}"))),
                }
            }
            let words = split_words(rest, escape);
            match words.as_slice() {
                [image] => Ok(Instruction::From {
                    image: image.clone(),
                    name: None,
                    platform,
                }),
                [image, as_, name] if as_.eq_ignore_ascii_case("as") => {
                    let name = name.to_ascii_lowercase();
                    if !valid_stage_name(&name) {
                        return Err(at(format!(
                            "{name:?} is no valid stage name: use letters, digits, '-', '_' and '.', starting with a letter"
                        )));
                    }
                    Ok(Instruction::From {
                        image: image.clone(),
                        name: Some(name),
                        platform,
                    })
                }
                _ => Err(at("FROM takes an image and optionally AS <name>".into())),
            }
        }
        "RUN" => {
            let (flags, command) = leading_flags(rest);
            let mut ignored_flags = Vec::new();
            for (name, value) in flags {
                match name.as_str() {
                    "mount" | "network" | "security" => ignored_flags.push(match value {
                        Some(v) => format!("--{name}={v}"),
                        None => format!("--{name}"),
                    }),
                    other => return Err(at(format!("RUN does not take --{other}"))),
                }
            }
            if command.is_empty() {
                return Err(at("RUN needs a command".into()));
            }
            Ok(Instruction::Run {
                command: command_form(command),
                heredocs: line.heredocs.clone(),
                ignored_flags,
            })
        }
        "COPY" | "ADD" => {
            let add = keyword == "ADD";
            let (flags, rest) = leading_flags(rest);
            let (mut chown, mut chmod, mut from) = (None, None, None);
            for (name, value) in flags {
                let slot = match name.as_str() {
                    "chown" => &mut chown,
                    "chmod" => &mut chmod,
                    "from" if !add => &mut from,
                    // --link only changes how BuildKit stores the layer, not what it holds.
                    "link" => continue,
                    other => {
                        return Err(at(format!(
                            "{keyword} --{other} is not supported by strata build"
                        )))
                    }
                };
                *slot = Some(value.ok_or_else(|| at(format!("--{name} needs a value")))?);
            }
            let words = match command_form(rest) {
                CommandForm::Exec(words) => words,
                CommandForm::Shell(text) => split_words(&text, escape),
            };
            let Some((dest, sources)) = words.split_last() else {
                return Err(at(format!("{keyword} needs a source and a destination")));
            };
            if sources.is_empty() {
                return Err(at(format!("{keyword} needs a source and a destination")));
            }
            let mut heredocs = line.heredocs.iter();
            let sources = sources
                .iter()
                .map(|word| match word.strip_prefix("<<") {
                    Some(_) if !heredocs.as_slice().is_empty() => {
                        CopySource::Heredoc(heredocs.next().expect("checked").clone())
                    }
                    _ => CopySource::Path(word.clone()),
                })
                .collect();
            Ok(Instruction::Copy {
                add,
                sources,
                dest: dest.clone(),
                chown,
                chmod,
                from,
            })
        }
        "ENV" => {
            needs_args("a name and a value")?;
            Ok(Instruction::Env(pairs(rest, escape).map_err(at)?))
        }
        "LABEL" => {
            needs_args("a key and a value")?;
            Ok(Instruction::Label(pairs(rest, escape).map_err(at)?))
        }
        "ARG" => {
            needs_args("a name")?;
            let mut args = Vec::new();
            for word in split_words(rest, escape) {
                let (name, default) = match word.split_once('=') {
                    Some((name, default)) => (name.to_string(), Some(default.to_string())),
                    None => (word, None),
                };
                if !valid_variable_name(&name) {
                    return Err(at(format!("{name:?} is no valid ARG name")));
                }
                args.push((name, default));
            }
            Ok(Instruction::Arg(args))
        }
        "WORKDIR" => {
            needs_args("a path")?;
            Ok(Instruction::Workdir(rest.to_string()))
        }
        "USER" => {
            needs_args("a user")?;
            Ok(Instruction::User(rest.to_string()))
        }
        "CMD" => {
            needs_args("a command")?;
            Ok(Instruction::Cmd(command_form(rest)))
        }
        "ENTRYPOINT" => {
            needs_args("a command")?;
            Ok(Instruction::Entrypoint(command_form(rest)))
        }
        "HEALTHCHECK" => {
            needs_args("NONE or CMD <command>")?;
            let (_options, rest) = leading_flags(rest);
            if rest.eq_ignore_ascii_case("none") {
                return Ok(Instruction::Healthcheck(None));
            }
            let Some(("CMD" | "cmd", command)) = rest
                .split_once(char::is_whitespace)
                .map(|(k, c)| (k, c.trim_start()))
            else {
                return Err(at("HEALTHCHECK takes NONE or CMD <command>".into()));
            };
            Ok(Instruction::Healthcheck(Some(command_form(command))))
        }
        "EXPOSE" => {
            needs_args("a port")?;
            Ok(Instruction::Expose(split_words(rest, escape)))
        }
        "VOLUME" => {
            needs_args("a path")?;
            Ok(Instruction::Volume(match command_form(rest) {
                CommandForm::Exec(paths) => paths,
                CommandForm::Shell(text) => split_words(&text, escape),
            }))
        }
        "MAINTAINER" => Ok(Instruction::Maintainer(rest.to_string())),
        "SHELL" => Err(at(
            "SHELL is not supported by strata build: RUN steps run through /bin/bash -l -c; write the shell into the RUN command instead".into(),
        )),
        "ONBUILD" => Err(at(
            "ONBUILD is not supported by strata build: a template has no later builds to trigger".into(),
        )),
        "STOPSIGNAL" => Err(at(
            "STOPSIGNAL is not supported by strata build: a sandbox's processes are stopped with it".into(),
        )),
        _ => Err(at(format!("unknown instruction {:?}", line.keyword))),
    }
}

/// `["a", "b"]` is exec form; anything else (including JSON that is no array of strings) is
/// shell form, as Docker decides.
fn command_form(rest: &str) -> CommandForm {
    if rest.starts_with('[') {
        if let Ok(words) = serde_json::from_str::<Vec<String>>(rest) {
            return CommandForm::Exec(words);
        }
    }
    CommandForm::Shell(rest.to_string())
}

/// Leading `--name[=value]` words, and the text after them.
fn leading_flags(mut rest: &str) -> (Vec<(String, Option<String>)>, &str) {
    let mut flags = Vec::new();
    while let Some(flag) = rest.strip_prefix("--") {
        let end = flag.find(char::is_whitespace).unwrap_or(flag.len());
        let word = &flag[..end];
        if word.is_empty() {
            break;
        }
        flags.push(match word.split_once('=') {
            Some((name, value)) => (name.to_ascii_lowercase(), Some(value.to_string())),
            None => (word.to_ascii_lowercase(), None),
        });
        rest = flag[end..].trim_start();
    }
    (flags, rest)
}

/// ENV and LABEL: `k=v k2="v 2"`, or the legacy `k the rest of the line`.
fn pairs(rest: &str, escape: char) -> Result<Vec<(String, String)>, String> {
    let words = split_words(rest, escape);
    let first_has_equals = words
        .first()
        .and_then(|w| w.find('='))
        .is_some_and(|eq| !w_quote_before(&words[0], eq));
    if !first_has_equals {
        let (name, value) = rest
            .split_once(char::is_whitespace)
            .ok_or_else(|| format!("{rest:?} has no value: write NAME=VALUE"))?;
        return Ok(vec![(name.to_string(), value.trim_start().to_string())]);
    }
    words
        .into_iter()
        .map(|word| {
            word.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| format!("{word:?} is not NAME=VALUE"))
        })
        .collect()
}

fn w_quote_before(word: &str, index: usize) -> bool {
    word[..index].contains(['"', '\''])
}

pub(crate) fn valid_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn valid_stage_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::super::lines::logical_lines;
    use super::*;

    fn one(text: &str) -> Result<Instruction, DockerfileError> {
        let (d, lines) = logical_lines(text).unwrap();
        parse_line(&lines[0], d.escape)
    }

    #[test]
    fn run_takes_shell_and_exec_forms_and_sets_aside_mount_flags() {
        assert_eq!(
            one("RUN [\"echo\", \"a b\"]").unwrap(),
            Instruction::Run {
                command: CommandForm::Exec(vec!["echo".into(), "a b".into()]),
                heredocs: vec![],
                ignored_flags: vec![],
            }
        );
        let Instruction::Run {
            command,
            ignored_flags,
            ..
        } = one("RUN --mount=type=cache,target=/root/.cache pip install x").unwrap()
        else {
            panic!()
        };
        assert_eq!(command, CommandForm::Shell("pip install x".into()));
        assert_eq!(
            ignored_flags,
            vec!["--mount=type=cache,target=/root/.cache"]
        );
        // Not-quite JSON is shell form, as in Docker.
        assert_eq!(
            one("CMD [\"a\", 1]").unwrap(),
            Instruction::Cmd(CommandForm::Shell("[\"a\", 1]".into()))
        );
        assert!(one("RUN --privileged x").is_err());
    }

    #[test]
    fn copy_splits_flags_sources_and_destination() {
        let Instruction::Copy {
            sources,
            dest,
            chown,
            chmod,
            from,
            add,
        } = one("COPY --chown=app:app --chmod=0644 a.txt \"b c.txt\" /dst/").unwrap()
        else {
            panic!()
        };
        assert!(!add);
        assert_eq!(
            sources,
            vec![
                CopySource::Path("a.txt".into()),
                CopySource::Path("\"b c.txt\"".into())
            ]
        );
        assert_eq!(dest, "/dst/");
        assert_eq!(chown.as_deref(), Some("app:app"));
        assert_eq!(chmod.as_deref(), Some("0644"));
        assert_eq!(from, None);
        assert!(one("COPY only").is_err());
        assert!(one("ADD --from=x a b").is_err());
        assert!(one("COPY --parents a b").is_err());
        let Instruction::Copy { sources, .. } = one("COPY <<EOF /f\nhi\nEOF\n").unwrap() else {
            panic!()
        };
        assert!(matches!(&sources[0], CopySource::Heredoc(h) if h.body == "hi\n"));
    }

    #[test]
    fn env_and_label_take_pairs_or_the_legacy_form() {
        assert_eq!(
            one("ENV A=1 B=\"two words\"").unwrap(),
            Instruction::Env(vec![
                ("A".into(), "1".into()),
                ("B".into(), "\"two words\"".into())
            ])
        );
        assert_eq!(
            one("ENV A two words").unwrap(),
            Instruction::Env(vec![("A".into(), "two words".into())])
        );
        assert!(one("ENV A").is_err());
        assert_eq!(
            one("ARG A B=2").unwrap(),
            Instruction::Arg(vec![("A".into(), None), ("B".into(), Some("2".into()))])
        );
        assert!(one("ARG 9x").is_err());
    }

    #[test]
    fn what_strata_cannot_build_is_refused_by_name() {
        for (text, says) in [
            ("SHELL [\"/bin/sh\"]", "SHELL"),
            ("ONBUILD RUN x", "ONBUILD"),
            ("STOPSIGNAL 9", "STOPSIGNAL"),
            ("FROBNICATE x", "unknown instruction"),
            ("FROM a AS 1x", "stage name"),
        ] {
            let err = one(text).unwrap_err();
            assert!(err.message.contains(says), "{text}: {err}");
            assert_eq!(err.line, Some(1));
        }
        assert_eq!(
            one("HEALTHCHECK --interval=5s CMD curl -f localhost").unwrap(),
            Instruction::Healthcheck(Some(CommandForm::Shell("curl -f localhost".into())))
        );
        assert_eq!(
            one("HEALTHCHECK NONE").unwrap(),
            Instruction::Healthcheck(None)
        );
    }
}
