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
/// `$STRATA_OWNER`: a `user:group` as given, a name with its primary group, a uid without an
/// account with group 0 (Docker's rule for `USER 1234`). Runs as root; the path and owner come
/// in through the environment, never spliced into the script.
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
  case "$STRATA_OWNER" in
    *:*) owner="$STRATA_OWNER" ;;
    *[!0-9]*) owner="$STRATA_OWNER:$(id -g "$STRATA_OWNER")" ;;
    *) owner="$STRATA_OWNER:$(id -g "$STRATA_OWNER" 2>/dev/null || echo 0)" ;;
  esac
  chown -R "$owner" "$first"
fi
"#;

/// Finalization, by E2B's rules: start `$STRATA_START_CMD` in the background (when set), then
/// retry `$STRATA_READY_CMD` every second until it exits 0. A start command that exits non-zero
/// first ends the script at once with [`START_FAILED_EXIT`] (its own exit code on stderr); one
/// that exits 0 leaves the ready command to decide. Both go through `bash -l -c` when the image
/// has bash, else `sh -c`. The caller bounds the whole script with the ready timeout; whatever
/// the start command left running is stopped when the script ends.
pub const FINALIZE_SCRIPT: &str = r#"start="$STRATA_START_CMD"
ready="$STRATA_READY_CMD"
unset STRATA_START_CMD STRATA_READY_CMD
if [ -x /bin/bash ]; then run() { /bin/bash -l -c "$1"; }; else run() { /bin/sh -c "$1"; }; fi
probe=""
trap '[ -n "$probe" ] && kill "$probe" 2>/dev/null; exit 97' USR1
if [ -n "$start" ]; then
  ( run "$start"; code=$?
    if [ "$code" -ne 0 ]; then echo "the start command exited with code $code" >&2; kill -USR1 $$; fi ) &
fi
while :; do
  run "$ready" & probe=$!
  if wait "$probe"; then exit 0; fi
  probe=""
  sleep 1 & wait $!
done
"#;

/// The finalization script's exit code when the start command failed before the ready command
/// succeeded.
pub const START_FAILED_EXIT: i32 = 97;

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

    /// `strata build` expands ENV values itself, as Docker does, and encodes them so that this
    /// evaluation hands them back unchanged; only the references it deferred expand here.
    #[test]
    fn dockerfile_env_values_survive_the_evaluation() {
        use crate::domain::dockerfile::plan::encode_env_value;
        for value in [
            "plain",
            "$literal",
            "a\\b",
            "ends\\",
            "$(echo no)",
            "`echo no`",
            "say \"hi\"",
            "\\$(x)",
            "$$(",
            "\\\"",
            "multi\nline",
        ] {
            assert_eq!(
                eval(&encode_env_value(value), &[("X", "x")]),
                value,
                "{value:?}"
            );
        }
        let deferred = "/opt:\u{E000}PATH\u{E001}";
        assert_eq!(
            eval(&encode_env_value(deferred), &[("PATH", "/bin")]),
            "/opt:/bin"
        );
    }

    /// Runs the script; stderr goes to a file, since a killed ready command's own children may
    /// outlive it (in a sandbox they are stopped with the script) and would hold a pipe open.
    fn finalize(start: &str, ready: &str) -> (std::process::ExitStatus, String) {
        let err = tempfile::NamedTempFile::new().unwrap();
        let status = Command::new("/bin/sh")
            .arg("-c")
            .arg(FINALIZE_SCRIPT)
            .env("STRATA_START_CMD", start)
            .env("STRATA_READY_CMD", ready)
            .stdout(std::process::Stdio::null())
            .stderr(err.reopen().unwrap())
            .status()
            .unwrap();
        (status, std::fs::read_to_string(err.path()).unwrap())
    }

    #[test]
    fn finalize_waits_for_ready_and_fails_fast_on_a_failing_start() {
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("up");
        let (ok, err) = finalize(
            &format!("sleep 1; touch {}", flag.display()),
            &format!("test -e {}", flag.display()),
        );
        assert!(ok.success(), "{err}");
        // Ready only: nothing is started.
        assert!(finalize("", "true").0.success());
        // A start command that fails ends the wait at once, not after the ready command.
        let t = std::time::Instant::now();
        let (failed, err) = finalize("exit 3", "sleep 30; false");
        assert_eq!(failed.code(), Some(START_FAILED_EXIT), "{err}");
        assert!(err.contains("exited with code 3"), "{err}");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "{:?}",
            t.elapsed()
        );
        // A start command that exits 0 leaves the ready command to decide.
        assert!(finalize("true", "sleep 1").0.success());
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

    #[test]
    fn workdir_script_owns_new_directories_by_uid_gid_or_uid_with_group_zero() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let owner_of = |p: &std::path::Path| {
            let m = std::fs::metadata(p).unwrap();
            (m.uid(), m.gid())
        };
        for (owner, want) in [("4321:4322", (4321, 4322)), ("4321", (4321, 0))] {
            let base = dir.path().join(owner.replace(':', "-"));
            let out = Command::new("/bin/sh")
                .arg("-c")
                .arg(WORKDIR_SCRIPT)
                .env("STRATA_WORKDIR", base.join("x/y"))
                .env("STRATA_OWNER", owner)
                .output()
                .unwrap();
            assert!(out.status.success(), "{owner}: {out:?}");
            assert_eq!(owner_of(&base), want, "{owner}");
            assert_eq!(owner_of(&base.join("x/y")), want, "{owner}");
        }
        assert_eq!(
            owner_of(dir.path()),
            (0, 0),
            "an existing directory keeps its owner"
        );
    }
}
