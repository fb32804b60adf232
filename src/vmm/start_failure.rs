//! Why a command could not start in a sandbox: the agent's report, typed, so callers can word
//! it for their protocol (the build reports these as E2B's envd does) without parsing prose.
//!
//! The agent writes one status line `error start\t<kind>\t<field>\t<detail>` (tabs and newlines
//! in the fields are replaced by spaces); anything else after `error ` stays a plain message.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartFailure {
    /// The user to run as is not in the sandbox's `/etc/passwd` (or could not be resolved).
    User { user: String, detail: String },
    /// The working directory could not be entered; `missing` when it does not exist.
    Workdir {
        dir: String,
        missing: bool,
        detail: String,
    },
    /// The program itself could not be executed.
    Program { program: String, detail: String },
}

const PREFIX: &str = "start\t";

fn clean(s: &str) -> String {
    s.replace(['\t', '\n'], " ")
}

impl StartFailure {
    /// The status-line form (after `error `).
    pub fn encode(&self) -> String {
        let (kind, field, detail) = match self {
            StartFailure::User { user, detail } => ("user", user, detail),
            StartFailure::Workdir {
                dir,
                missing: true,
                detail,
            } => ("workdir-missing", dir, detail),
            StartFailure::Workdir { dir, detail, .. } => ("workdir", dir, detail),
            StartFailure::Program { program, detail } => ("program", program, detail),
        };
        format!("{PREFIX}{kind}\t{}\t{}", clean(field), clean(detail))
    }

    /// The failure a status message carries, if it is one.
    pub fn decode(message: &str) -> Option<StartFailure> {
        let mut parts = message.strip_prefix(PREFIX)?.splitn(3, '\t');
        let (kind, field, detail) = (parts.next()?, parts.next()?, parts.next()?);
        let (field, detail) = (field.to_owned(), detail.to_owned());
        Some(match kind {
            "user" => StartFailure::User {
                user: field,
                detail,
            },
            "workdir-missing" => StartFailure::Workdir {
                dir: field,
                missing: true,
                detail,
            },
            "workdir" => StartFailure::Workdir {
                dir: field,
                missing: false,
                detail,
            },
            "program" => StartFailure::Program {
                program: field,
                detail,
            },
            _ => return None,
        })
    }
}

/// strata's own sentence, with every detail.
impl fmt::Display for StartFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartFailure::User { detail, .. } => f.write_str(detail),
            StartFailure::Workdir { dir, detail, .. } => {
                write!(f, "working directory {dir}: {detail}")
            }
            StartFailure::Program { program, detail } => {
                write!(f, "cannot run {program}: {detail}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_survives_the_status_line() {
        for f in [
            StartFailure::User {
                user: "ghost".into(),
                detail: "user \"ghost\" is not in the sandbox's /etc/passwd".into(),
            },
            StartFailure::Workdir {
                dir: "/gone".into(),
                missing: true,
                detail: "No such file or directory (os error 2)".into(),
            },
            StartFailure::Workdir {
                dir: "/root".into(),
                missing: false,
                detail: "Permission denied (os error 13)".into(),
            },
            StartFailure::Program {
                program: "/bin/sh".into(),
                detail: "No such file or directory (os error 2)".into(),
            },
        ] {
            assert_eq!(StartFailure::decode(&f.encode()), Some(f.clone()), "{f}");
        }
        assert_eq!(StartFailure::decode("fork: out of memory"), None);
        assert_eq!(StartFailure::decode("start\tbogus\tx\ty"), None);
    }
}
