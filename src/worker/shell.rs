//! The shell text the executor runs inside sandboxes: ENV evaluation, WORKDIR creation and the
//! start/ready script of finalization. Pure string building, tested here.

/// The command that evaluates an ENV value as E2B does: `printf "%s" "<value>"`, so `$VAR` and
/// `${VAR}` expand against the environment so far, while command substitution (`$(` and
/// backticks) is escaped and stays literal.
pub fn env_eval_command(value: &str) -> String {
    let mut escaped = value
        .replace('"', "\\\"")
        .replace('`', "\\`")
        .replace("$(", "\\$(");
    // A trailing odd backslash would escape the closing quote.
    let trailing = escaped.chars().rev().take_while(|c| *c == '\\').count();
    if trailing % 2 == 1 {
        escaped.push('\\');
    }
    format!("printf '%s' \"{escaped}\"")
}

/// WORKDIR: `mkdir -p "$STRATA_WORKDIR"`, then `chown -R` the first directory it created to
/// `$STRATA_OWNER` (and that user's primary group). Runs as root; the path and owner come in
/// through the environment, never spliced into the script.
pub const WORKDIR_SCRIPT: &str = r#"set -e
first=""
d=""
rest="${STRATA_WORKDIR#/}"
while [ -n "$rest" ]; do
  part="${rest%%/*}"
  if [ "$part" = "$rest" ]; then rest=""; else rest="${rest#*/}"; fi
  [ -z "$part" ] && continue
  d="$d/$part"
  if [ -z "$first" ] && [ ! -e "$d" ]; then first="$d"; fi
done
mkdir -p "$STRATA_WORKDIR"
if [ -n "$first" ] && [ "$STRATA_OWNER" != "root" ]; then
  chown -R "$STRATA_OWNER:$(id -g "$STRATA_OWNER")" "$first"
fi
"#;

/// Finalization: start `$STRATA_START_CMD` in the background, then run `$STRATA_READY_CMD`
/// every second until it exits 0. Both go through `bash -l -c` when the image has bash, else
/// `sh -c`, as the final user in the final workdir and environment. The caller bounds the whole
/// script with the ready timeout; the start command is stopped when the script ends.
pub const FINALIZE_SCRIPT: &str = r#"start="$STRATA_START_CMD"
ready="$STRATA_READY_CMD"
unset STRATA_START_CMD STRATA_READY_CMD
if [ -x /bin/bash ]; then run() { /bin/bash -l -c "$1"; }; else run() { /bin/sh -c "$1"; }; fi
run "$start" &
until run "$ready"; do sleep 1; done
"#;

/// Ready command when `startCmd` has none: wait 20 s (`wait_for_timeout(20_000)`).
pub const DEFAULT_READY_CMD: &str = "sleep 20";

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn eval(value: &str, env: &[(&str, &str)]) -> String {
        let out = Command::new("/bin/sh")
            .arg("-c")
            .arg(env_eval_command(value))
            .env_clear()
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success(), "{value:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn env_values_expand_variables_but_not_commands() {
        assert_eq!(
            eval("$A/bin:${B}", &[("A", "/opt"), ("B", "x")]),
            "/opt/bin:x"
        );
        assert_eq!(eval("$(echo hi) `echo hi`", &[]), "$(echo hi) `echo hi`");
        assert_eq!(eval("say \"hi\"", &[]), "say \"hi\"");
        assert_eq!(eval("ends with \\", &[]), "ends with \\");
        assert_eq!(eval("plain", &[]), "plain");
        assert_eq!(eval("$UNSET-x", &[]), "-x");
    }

    #[test]
    fn workdir_script_chowns_the_first_new_directory_only() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("a/b/c");
        let out = Command::new("/bin/sh")
            .arg("-c")
            .arg(WORKDIR_SCRIPT)
            .env("STRATA_WORKDIR", &target)
            .env("STRATA_OWNER", "root")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(target.is_dir());
    }
}
