"""Build semantics that must match E2B's template builder (ADR 0012), through the stock Python SDK.

Empty-diff steps, a layer repeated in a stack, the finalize rules (start/ready commands), WORKDIR
expansion, build-time ENV, and the status of a started build. Every effect is checked inside a
sandbox on the template (`strata template exec`).
"""

import re
import time
import uuid

import pytest

from e2b import Template, wait_for_file

from test_sdk_build import exec_in

STEP = re.compile(r"^\[(\d+)/(\d+)\] (CACHED )?(RUN|COPY|ENV|WORKDIR|USER) ")


def build(tpl, name, opts, **kw):
    logs = []
    Template.build(tpl, name, on_build_logs=logs.append, **opts, **kw)
    messages = [entry.message for entry in logs]
    executed, cached = [], []
    for m in messages:
        found = STEP.match(m)
        if found:
            (cached if found.group(3) else executed).append(int(found.group(1)))
    return messages, executed, cached


# Writes /home/user/same with a fixed mtime (and its directory's), so both writes seal the
# byte-identical layer.
SAME = "printf same > /home/user/same && touch -d @1700000000 /home/user/same /home/user"


def steps_that_change_nothing(last):
    return (
        Template()
        .from_image("busybox")
        .run_cmd("echo one")
        .run_cmd("echo two")
        .set_workdir("/home/user")
        .run_cmd(SAME)
        .run_cmd("rm /home/user/same")
        .run_cmd(SAME)
        .run_cmd(last)
        .set_start_cmd("echo started", "true")
    )


def test_steps_that_change_nothing_or_repeat_a_layer_build_and_resume(strata, team):
    team_name, opts = team
    nonce = uuid.uuid4().hex[:8]
    messages, executed, cached = build(steps_that_change_nothing(f"echo {nonce} > /home/user/last"), "empty-diffs", opts)
    assert executed == [1, 2, 3, 4, 5, 6, 7] and cached == [], messages
    check = "cat /home/user/same /home/user/last; echo; pwd"
    cold = exec_in(strata, team_name, "empty-diffs", check)
    assert cold == f"same{nonce}\n\n/home/user\n", cold

    # Unchanged: the final result is reused.
    messages, executed, cached = build(steps_that_change_nothing(f"echo {nonce} > /home/user/last"), "empty-diffs", opts)
    assert executed == [] and cached == [1, 2, 3, 4, 5, 6, 7], messages

    # The last step changed: the build resumes from the checkpoint after the repeated layer,
    # chained through the empty ones, and gives what a cold build gives.
    messages, executed, cached = build(steps_that_change_nothing(f"echo {nonce}-b > /home/user/last"), "empty-diffs", opts)
    assert executed == [7] and cached == [1, 2, 3, 4, 5, 6], messages
    resumed = exec_in(strata, team_name, "empty-diffs", check)
    messages, executed, _ = build(
        steps_that_change_nothing(f"echo {nonce}-b > /home/user/last"), "empty-diffs-cold", opts, skip_cache=True
    )
    assert executed == [1, 2, 3, 4, 5, 6, 7], messages
    assert resumed == exec_in(strata, team_name, "empty-diffs-cold", check) == f"same{nonce}-b\n\n/home/user\n"


def test_a_dockerfile_with_cmd_builds_and_finalizes(strata, team):
    team_name, opts = team
    dockerfile = "FROM busybox\nRUN echo built > /built\nCMD echo serving\n"
    messages, _, _ = build(Template().from_dockerfile(dockerfile), "df-cmd", opts)
    assert "[finalize] START echo serving" in messages, messages
    assert exec_in(strata, team_name, "df-cmd", "cat /built; id -un; pwd") == "built\nuser\n/home/user\n"


def test_a_ready_command_alone_runs_at_finalize(strata, team):
    team_name, opts = team
    tpl = Template().from_image("busybox").set_ready_cmd("echo ready-ran > /home/user/ready-ran")
    messages, _, _ = build(tpl, "ready-only", opts)
    assert "[finalize] READY echo ready-ran > /home/user/ready-ran" in messages, messages
    assert not any(m.startswith("[finalize] START") for m in messages), messages
    assert exec_in(strata, team_name, "ready-only", "cat /home/user/ready-ran") == "ready-ran\n"


def test_start_and_ready_commands_follow_e2b_rules(strata, team):
    team_name, opts = team
    # Start and ready: the ready command is retried until the start command made it true; the
    # start command runs with the build's ENV, user and workdir.
    parent = (
        Template()
        .from_image("busybox")
        .set_envs({"SERVED_BY": "parent-start"})
        .set_workdir("/home/user/srv")
        .set_start_cmd(
            'sleep 1; echo "$SERVED_BY $(id -un) $(pwd)" > /home/user/srv/started; echo started >> /home/user/srv/count',
            wait_for_file("/home/user/srv/started"),
        )
    )
    messages, _, _ = build(parent, "fin-parent", opts)
    assert any(m.startswith("[finalize] READY [ -f /home/user/srv/started ]") for m in messages), messages
    assert exec_in(strata, team_name, "fin-parent", "cat /home/user/srv/started /home/user/srv/count") == (
        "parent-start user /home/user/srv\nstarted\n"
    )

    # Neither set on a derived template: it keeps (and runs) the parent's commands. It extends
    # the parent's build-base checkpoint, so the parent's start command has not run in its base:
    # the ready file is absent until the child's own finalize runs that command once.
    child = Template().from_template("fin-parent").run_cmd("test ! -e /home/user/srv/started")
    messages, _, _ = build(child, "fin-child", opts)
    assert any(m.startswith("[finalize] START sleep 1;") for m in messages), messages
    assert exec_in(strata, team_name, "fin-child", "cat /home/user/srv/started /home/user/srv/count") == (
        "parent-start user /home/user/srv\nstarted\n"
    )

    # A start command that fails fails the build at finalize, with its exit code.
    failing = Template().from_image("busybox").set_start_cmd("echo boom >&2; exit 4", "sleep 60")
    started = time.time()
    try:
        Template.build(failing, "fin-fails", **opts)
        raise AssertionError("a failing start command must fail the build")
    except Exception as err:  # BuildException
        assert "start command" in str(err) and "exited with code 4" in str(err), str(err)
    assert time.time() - started < 45, "the failure ends the wait for the ready command"


def test_workdir_expands_variables_as_e2b(strata, team):
    team_name, opts = team
    tpl = (
        Template()
        .from_image("busybox")
        .set_envs({"APP_DIR": "/opt/expanded"})
        .set_workdir("/")
        .set_workdir("$APP_DIR/sub")
        .run_cmd("pwd > /tmp/pwd-at-build")
    )
    build(tpl, "workdir-var", opts)
    out = exec_in(strata, team_name, "workdir-var", "pwd; cat /tmp/pwd-at-build; stat -c %U /opt/expanded; test -e '/$APP_DIR' || echo no-literal")
    assert out == "/opt/expanded/sub\n/opt/expanded/sub\nuser\nno-literal\n", out


def test_envs_are_build_time_only(strata, team):
    team_name, opts = team
    tpl = (
        Template()
        .from_image("busybox")
        .set_envs({"BUILD_ONLY": "seen-at-build"})
        .run_cmd('echo "$BUILD_ONLY" > /home/user/at-build')
    )
    build(tpl, "env-build-time", opts)
    out = exec_in(strata, team_name, "env-build-time", 'cat /home/user/at-build; echo "[$BUILD_ONLY]"')
    assert out == "seen-at-build\n[]\n", out


def test_a_started_build_is_building_right_away(strata, team):
    """Never `waiting` once started. The step outlasts a held status request (ADR 0027: a quiet
    build's status waits for news, and a short build's first answer may be its end)."""
    _, opts = team
    tpl = Template().from_image("busybox").run_cmd(f"sleep 3; echo {uuid.uuid4().hex} > /home/user/n")
    info = Template.build_in_background(tpl, "status-now", **opts)
    status = Template.get_build_status(info, **opts)
    assert status.status.value == "building", status
    deadline = time.time() + 120
    while status.status.value == "building" and time.time() < deadline:
        time.sleep(0.3)
        status = Template.get_build_status(info, **opts)
    assert status.status.value == "ready", status


def test_a_run_that_cannot_start_fails_in_e2bs_words(strata, team):
    """A RUN whose user or working directory cannot be used fails as E2B's builder words it
    (envd's error behind `failed to run command ...`), which code written against E2B matches
    on; strata's own detail follows in parentheses."""
    _, opts = team
    cases = [
        (
            Template().from_image("busybox").run_cmd("whoami", user="ghost"),
            "failed to run command 'whoami': command failed: unauthenticated: invalid username: 'ghost'",
            "is not in the sandbox's /etc/passwd",
        ),
        (
            Template().from_image("busybox").set_user("root").set_workdir("/srv/gone").run_cmd("rmdir /srv/gone").run_cmd("true"),
            "failed to run command 'true': command failed: invalid_argument: cwd '/srv/gone' does not exist",
            "working directory /srv/gone",
        ),
    ]
    for i, (tpl, e2b_words, detail) in enumerate(cases):
        with pytest.raises(Exception) as err:
            Template.build(tpl, f"cannot-start-{i}", **opts)
        message = str(err.value)
        assert e2b_words in message, message
        assert detail in message, message
