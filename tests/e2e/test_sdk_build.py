"""Template builds through the unmodified E2B Python SDK.

Every result is checked inside a sandbox booted on the template (`strata template exec`), and
the upload bookkeeping through the operator API, never through the SDK's own claims.
"""

import json
import time
import urllib.request

import pytest
from e2b import Template
from e2b.exceptions import BuildException


def exec_in(strata, team_name, template, script):
    """Runs `script` with /bin/sh in a sandbox on `template`'s result; returns stdout."""
    out = strata.cli("template", "exec", "--team", team_name, template, "--", "/bin/sh", "-c", script, check=False)
    assert out.returncode == 0, f"exec failed ({out.returncode}): {out.stderr}"
    return out.stdout


def admin_events(strata, stream):
    req = urllib.request.Request(
        f"{strata.url}/admin/streams/{stream}/events?limit=1000",
        headers={"Authorization": "Bearer e2e-admin"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)["events"]


def recipe(ctx):
    return (
        Template(file_context_path=str(ctx))
        .from_image("busybox")
        .set_envs({"GREETING": "hello", "DERIVED": "$GREETING-world"})
        .set_workdir("/opt/app")
        .copy("app", "/opt/app/app")
        .copy("notes/*.md", "/opt/notes/", gzip=False)
        .copy("app/bin/run.sh", "/opt/tools/run.sh", user="root", mode=0o750)
        .run_cmd('echo "$DERIVED" > /opt/app/out.txt && id -un >> /opt/app/out.txt && pwd >> /opt/app/out.txt')
        .set_user("root")
        .run_cmd("echo root-step > /root-mark")
        .set_user("user")
        .set_workdir("/home/user")
    )


def test_a_recipe_builds_and_its_files_env_user_and_outputs_are_in_the_template(strata, team, context_dir):
    team_name, opts = team
    logs = []
    info = Template.build(recipe(context_dir), "recipe", on_build_logs=logs.append, **opts)
    assert info.template_id and info.build_id
    messages = [entry.message for entry in logs]
    assert any("RUN" in m for m in messages), messages

    out = exec_in(
        strata,
        team_name,
        "recipe",
        "cat /opt/app/out.txt; "
        "stat -c '%a %U:%G' /opt/app/app/bin/run.sh /opt/app/app/config.txt /opt/tools/run.sh; "
        "readlink /opt/app/app/link.txt; cat /opt/app/app/nested/deep/data.txt; "
        "test ! -e /opt/app/app/secret.env && echo ignored; "
        "ls /opt/notes; cat /root-mark; stat -c %U /root-mark; echo \"[$GREETING $DERIVED]\"; id -un; pwd",
    )
    lines = out.split("\n")
    assert lines[0:3] == ["hello-world", "user", "/opt/app"], out
    assert lines[3] == "755 user:user", out
    assert lines[4] == "644 user:user", out
    assert lines[5] == "750 root:root", out
    assert lines[6] == "config.txt", out
    assert lines[7] == "deep data", out
    assert lines[8] == "ignored", out
    assert lines[9:11] == ["a.md", "b.md"], out
    assert lines[11:13] == ["root-step", "root"], out
    # ENV is build-time only, as on E2B: the RUN above saw it, a sandbox's commands do not.
    assert lines[13] == "[ ]", out
    assert lines[14:16] == ["user", "/home/user"], out


def test_a_failing_run_reports_its_step(strata, team, context_dir):
    _, opts = team
    tpl = (
        Template(file_context_path=str(context_dir))
        .from_image("busybox")
        .run_cmd("echo fine")
        .run_cmd("echo about-to-fail >&2; exit 3")
        .run_cmd("echo never")
    )
    with pytest.raises(BuildException) as err:
        Template.build(tpl, "fails", **opts)
    assert "3" in str(err.value)

    info = Template.build_in_background(tpl, "fails", **opts)
    deadline = time.time() + 120
    while True:
        status = Template.get_build_status(info, logs_offset=0, **opts)
        if status.status.value in ("ready", "error") or time.time() > deadline:
            break
        time.sleep(0.3)
    assert status.status.value == "error"
    assert status.reason.step == "2"
    assert "exit code 3" in status.reason.message


def test_from_dockerfile_and_from_template(strata, team, context_dir):
    team_name, opts = team
    dockerfile = (
        "FROM busybox\n"
        "ARG FLAVOUR=plain\n"
        "ENV PORT=3000 MODE=production\n"
        "WORKDIR /srv/app\n"
        "COPY app/config.txt ./\n"
        'RUN echo "$FLAVOUR $PORT $MODE" > settings.txt && cat config.txt >> settings.txt\n'
    )
    Template.build(Template(file_context_path=str(context_dir)).from_dockerfile(dockerfile), "from-df", **opts)
    assert exec_in(strata, team_name, "from-df", "cat /srv/app/settings.txt") == "plain 3000 production\nconfig-v1\n"

    # The parent's ENV reaches the derived build's steps (build-time), not its sandboxes.
    derived = Template().from_template("from-df").run_cmd(
        "cp /srv/app/settings.txt /home/user/derived.txt && echo \"port=$PORT\" >> /home/user/derived.txt"
    )
    Template.build(derived, "derived", **opts)
    out = exec_in(strata, team_name, "derived", "cat /home/user/derived.txt; echo \"[$PORT]\"")
    assert out == "plain 3000 production\nconfig-v1\nport=3000\n[]\n"


def test_from_template_extends_the_parents_steps_not_what_its_start_command_did(strata, team):
    """A derived template extends the parent's build-base checkpoint (RFC, DESIGN.md): the
    parent's steps are in the child, the files its start command wrote while finalizing are
    not."""
    team_name, opts = team
    parent = (
        Template()
        .from_image("busybox")
        .run_cmd("echo from-step > /home/user/step.txt")
        .set_start_cmd("echo side-effect > /home/user/started.txt; sleep 600", "test -f /home/user/started.txt")
    )
    Template.build(parent, "started-parent", **opts)
    # The parent itself is what finalization left: its start command's file is there.
    assert exec_in(strata, team_name, "started-parent", "cat /home/user/step.txt /home/user/started.txt") == (
        "from-step\nside-effect\n"
    )

    # The child sets its own commands, so the parent's start command is not inherited and run
    # again at the child's finalize (tests/e2e/test_sdk_semantics.py covers inheritance).
    child = (
        Template()
        .from_template("started-parent")
        .run_cmd("test ! -e /home/user/started.txt")
        .set_start_cmd("sleep 600", "test -f /home/user/step.txt")
    )
    Template.build(child, "started-child", **opts)
    out = exec_in(
        strata,
        team_name,
        "started-child",
        "cat /home/user/step.txt; test -e /home/user/started.txt && echo leaked || echo clean",
    )
    assert out == "from-step\nclean\n"


def test_deleting_a_template_ends_its_running_build_in_error_with_the_reason(strata, team):
    _, opts = team
    tpl = Template().from_image("busybox").run_cmd("sleep 60")
    info = Template.build_in_background(tpl, "deleted-mid-build", **opts)
    deadline = time.time() + 120
    while True:
        status = Template.get_build_status(info, logs_offset=0, **opts)
        if status.status.value != "waiting" or time.time() > deadline:
            break
        time.sleep(0.3)
    assert status.status.value == "building"

    req = urllib.request.Request(
        f"{strata.url}/templates/{info.template_id}",
        method="DELETE",
        headers={"X-API-KEY": opts["api_key"]},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 204

    status = Template.get_build_status(info, logs_offset=0, **opts)
    assert status.status.value == "error"
    assert f"template {info.template_id} was deleted" in status.reason.message


def test_skip_cache_and_force_upload(strata, team, context_dir):
    team_name, opts = team
    def tpl(force):
        return (
            Template(file_context_path=str(context_dir))
            .from_image("busybox")
            .copy("app/config.txt", "/data/config.txt", force_upload=force or None)
        )
    Template.build(tpl(False), "force", **opts)
    Template.build(tpl(False), "force", skip_cache=True, **opts)
    Template.build(tpl(True), "force", **opts)
    assert exec_in(strata, team_name, "force", "cat /data/config.txt") == "config-v1\n"

    files_streams = [
        s["stream_id"]
        for s in json.load(
            urllib.request.urlopen(
                urllib.request.Request(
                    f"{strata.url}/admin/streams?category=files&limit=1000",
                    headers={"Authorization": "Bearer e2e-admin"},
                ),
                timeout=10,
            )
        )["streams"]
        if s["stream_id"].startswith(f"files-{team_name}:")
    ]
    assert len(files_streams) == 1, files_streams
    published = [e for e in admin_events(strata, files_streams[0]) if e["type"] == "GenerationPublished.v1"]
    # The first build uploaded, the unchanged second one reused it, forceUpload made another.
    assert len(published) == 2, published


def test_two_teams_building_the_same_content_stay_isolated(strata, context_dir):
    teams = []
    for _ in range(2):
        name = f"iso{time.time_ns() % 10**9}"
        teams.append((name, {"api_key": strata.key(name), "api_url": strata.url}))
    for name, opts in teams:
        tpl = (
            Template(file_context_path=str(context_dir))
            .from_image("busybox")
            .copy("app/config.txt", "/data/config.txt")
            .run_cmd(f"echo {name} > /home/user/owner")
        )
        Template.build(tpl, "same-name", **opts)
    for name, _ in teams:
        assert exec_in(strata, name, "same-name", "cat /home/user/owner /data/config.txt") == f"{name}\nconfig-v1\n"
        uploads = [e for e in admin_events(strata, f"team-{name}") if e["type"] == "ApiKeyIssued.v1"]
        assert len(uploads) == 1
    # Each team uploaded its own copy: the files streams are per team.
    for name, _ in teams:
        streams = json.load(
            urllib.request.urlopen(
                urllib.request.Request(
                    f"{strata.url}/admin/streams?category=files&limit=1000",
                    headers={"Authorization": "Bearer e2e-admin"},
                ),
                timeout=10,
            )
        )["streams"]
        assert any(s["stream_id"].startswith(f"files-{name}:") for s in streams)
