"""Every public builder method and build-related function of the stock Python SDK, each checked
by its effect inside the built template (`strata template exec`), a few builds combining many
methods. The JS SDK's sweep is tests/e2e/js/sweep.mjs and js/sweep_network.mjs, driven by
test_js_sdk.py.

The methods that reach past the build context are covered elsewhere against loopback stand-ins
for the networks they need: the image helpers (`from_ubuntu_image` ... `from_bun_image`), digest
references and `from_image` with credentials or `from_gcp_registry` in test_sdk_registry.py (a
real registry serving as the docker.io mirror and as private registries), and `apt_install`,
`pip_install`, `npm_install`, `git_clone` in test_base_image.py (package servers in the tests'
outside world, a network namespace of their own).
`bun_install` runs on a stand-in `bun` (no bun installs offline), `add_mcp_server` and
`beta_dev_container_*` on team templates named `mcp-gateway` and `devcontainer` whose tools
are stand-ins recording how they were called: the real tools pull from networks. Only
`from_aws_registry` is not run (it needs AWS's ECR API): ADR 0012 says why.
"""

import asyncio
import json
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2b import (
    AsyncTemplate,
    Template,
    TemplateBase,
    default_build_logger,
    wait_for_file,
    wait_for_port,
    wait_for_process,
    wait_for_timeout,
    wait_for_url,
)
from e2b.exceptions import BuildException

from conftest import free_port
from test_sdk_build import exec_in

STEP = re.compile(r"^\[(\d+)/(\d+)\] (CACHED )?(RUN|COPY|ENV|WORKDIR|USER) ")


def build(tpl, name, opts, **kw):
    logs = []
    info = Template.build(tpl, name, on_build_logs=logs.append, **opts, **kw)
    messages = [entry.message for entry in logs]
    executed = [int(m.group(1)) for m in map(STEP.match, messages) if m and not m.group(3)]
    return info, messages, executed


PGREP = (
    "mkdir -p /usr/local/bin && printf '%s\\n' '#!/bin/sh' 'exec pidof \"$1\"' > /usr/local/bin/pgrep"
    " && chmod 755 /usr/local/bin/pgrep"
)


def files_recipe(ctx):
    return (
        Template(file_context_path=str(ctx), file_ignore_patterns=["notes/c.txt"])
        .from_image("busybox")
        # wait_for_process runs `pgrep`, which busybox lacks: a stand-in on its `pidof`.
        .run_cmd(PGREP, user="root")
        # copy: several sources, owner and mode; a symlink resolved; no gzip; an ignore pattern.
        .copy(["notes/a.md", "notes/b.md"], "/opt/multi/", user="root", mode=0o640)
        .copy("app/link.txt", "/opt/resolved.txt", resolve_symlinks=True)
        .copy("notes", "/opt/notes-plain", gzip=False)
        .copy_items([
            {"src": "app/config.txt", "dest": "/opt/items/config.txt", "mode": 0o600},
            {"src": "app/bin/run.sh", "dest": "/opt/items/run.sh", "user": "root"},
        ])
        .make_dir(["/home/user/d1", "/home/user/d2"], mode=0o711)
        .make_dir("/opt/rootdir", user="root")
        .make_symlink("/opt/items/config.txt", "/home/user/cfg-link")
        .make_symlink("/opt/multi/a.md", "/home/user/cfg-link", force=True)
        .run_cmd(["echo a > /home/user/d1/x", "echo b > /home/user/d1/y"])
        .rename("/home/user/d1/x", "/home/user/d1/x-renamed")
        .rename("/home/user/d1/y", "/home/user/d1/x-renamed", force=True)
        .remove("/home/user/d2", recursive=True, force=True)
        .remove("/opt/rootdir", recursive=True, user="root")
        .set_user("root")
        .run_cmd("id -un > /opt/whoami-step")
        .set_user("user")
        .run_cmd("id -un > /tmp/run-as", user="root")
        # A relative WORKDIR joins the current one before expansion, as on E2B.
        .set_envs({"SWEEP_DIR": "work", "SWEEP_MSG": "from-env"})
        .set_workdir("$SWEEP_DIR")
        .run_cmd('echo "$SWEEP_MSG $(pwd)" > env-and-pwd')
        .skip_cache()
        .run_cmd("echo forced > /home/user/forced")
        .set_start_cmd("echo started > /home/user/started && exec tail -f /dev/null", wait_for_process("tail"))
    )


def test_file_user_workdir_env_and_start_methods_have_their_effect(strata, team, context_dir):
    team_name, opts = team
    info, messages, executed = build(files_recipe(context_dir), "sweep-files", opts, tags=["v1", "v2"])
    assert executed == list(range(1, 25)), messages
    out = exec_in(
        strata,
        team_name,
        "sweep-files:v2",
        "stat -c '%n %a %U' /opt/multi/a.md /opt/multi/b.md /opt/items/config.txt /opt/items/run.sh "
        "/home/user/d1 /opt/resolved.txt; "
        "test -L /opt/resolved.txt || echo resolved-not-link; cat /opt/resolved.txt; "
        "ls /opt/notes-plain; readlink /home/user/cfg-link; ls /home/user/d1; cat /home/user/d1/x-renamed; "
        "test -e /home/user/d2 || echo d2-removed; test -e /opt/rootdir || echo rootdir-removed; "
        "cat /opt/whoami-step /tmp/run-as /home/user/work/env-and-pwd /home/user/forced /home/user/started; id -un; pwd",
    )
    assert out.split("\n") == [
        "/opt/multi/a.md 640 root",
        "/opt/multi/b.md 640 root",
        "/opt/items/config.txt 600 user",
        "/opt/items/run.sh 755 root",
        "/home/user/d1 711 user",
        "/opt/resolved.txt 644 user",
        "resolved-not-link",
        "config-v1",
        "a.md",
        "b.md",
        "/opt/multi/a.md",
        "x-renamed",
        "b",
        "d2-removed",
        "rootdir-removed",
        "root",
        "root",
        "from-env /home/user/work",
        "forced",
        "started",
        "user",
        "/home/user/work",
        "",
    ], out

    # Tags: both build tags name the build; assign_tags, get_tags and remove_tags.
    assert Template.exists("sweep-files", **opts) and Template.alias_exists("sweep-files", **opts)
    assert not Template.exists("sweep-missing", **opts)
    tags = {t.tag for t in Template.get_tags(info.template_id, **opts)}
    assert {"v1", "v2"} <= tags, tags
    assigned = Template.assign_tags("sweep-files:v1", ["stable"], **opts)
    assert "stable" in assigned.tags and assigned.build_id == info.build_id
    assert exec_in(strata, team_name, "sweep-files:stable", "cat /home/user/forced") == "forced\n"
    Template.remove_tags("sweep-files", ["v1"], **opts)
    tags = {t.tag for t in Template.get_tags(info.template_id, **opts)}
    assert "v1" not in tags and {"v2", "stable"} <= tags, tags

    # skip_cache (builder): the steps after it run again; those before come from the cache.
    _, messages, executed = build(files_recipe(context_dir), "sweep-files", opts)
    assert executed == [24], messages


def test_base_images_ready_commands_and_template_level_skip_cache(strata, team, capsys):
    team_name, opts = team
    # from_base_image (e2bdev/base, with sudo for the default user) and wait_for_file.
    base = (
        Template()
        .from_base_image()
        .run_cmd("sudo -n id -un > /home/user/sudo-as")
        .set_start_cmd("sleep 1; touch /home/user/up", wait_for_file("/home/user/up"))
    )
    Template.build(base, "sweep-base", on_build_logs=default_build_logger(), **opts)
    printed = capsys.readouterr()
    assert "RUN sudo -n id -un > /home/user/sudo-as" in printed.out + printed.err, printed
    assert exec_in(strata, team_name, "sweep-base", "cat /home/user/sudo-as; test -e /home/user/up && echo up") == "root\nup\n"

    # from_debian_image and a ready command alone (wait_for_timeout: `sleep 1`).
    debian = (
        Template()
        .from_debian_image("bookworm")
        .run_cmd(". /etc/os-release && echo $VERSION_CODENAME > /home/user/codename")
        .set_ready_cmd(wait_for_timeout(1000))
    )
    _, messages, _ = build(debian, "sweep-debian", opts)
    assert "[finalize] READY sleep 1" in messages, messages
    assert exec_in(strata, team_name, "sweep-debian", "cat /home/user/codename") == "bookworm\n"

    # TemplateBase.skip_cache: the whole template is built again.
    def again():
        return Template().skip_cache().from_image("busybox").run_cmd("echo again > /home/user/again")
    build(again(), "sweep-again", opts)
    _, messages, executed = build(again(), "sweep-again", opts)
    assert executed == [1], messages


def test_to_json_and_to_dockerfile_describe_what_builds(strata, team):
    team_name, opts = team
    tpl = (
        Template()
        .from_image("busybox")
        .set_envs({"ROUND": "trip"})
        .set_workdir("/srv/round")
        .run_cmd('echo "$ROUND" > made')
        .set_user("root")
    )
    as_json = json.loads(TemplateBase.to_json(tpl))
    assert as_json["fromImage"] == "busybox"
    assert [s["type"] for s in as_json["steps"]] == ["ENV", "WORKDIR", "RUN", "USER"], as_json
    dockerfile = TemplateBase.to_dockerfile(tpl)
    assert dockerfile.startswith("FROM busybox"), dockerfile
    Template.build(Template().from_dockerfile(dockerfile), "sweep-roundtrip", **opts)
    assert exec_in(strata, team_name, "sweep-roundtrip", "cat /srv/round/made; id -un; pwd") == "trip\nroot\n/srv/round\n"


def test_the_async_template_api(strata, team):
    team_name, opts = team

    async def main():
        tpl = Template().from_image("busybox").run_cmd("echo async > /home/user/async")
        info = await AsyncTemplate.build(tpl, "sweep-async", tags=["a1"], **opts)
        status = await AsyncTemplate.get_build_status(info, **opts)
        assert status.status.value == "ready", status
        assert await AsyncTemplate.exists("sweep-async", **opts)
        assert await AsyncTemplate.alias_exists("sweep-async", **opts)
        await AsyncTemplate.assign_tags("sweep-async:a1", "a2", **opts)
        await AsyncTemplate.remove_tags("sweep-async", "a1", **opts)
        tags = {t.tag for t in await AsyncTemplate.get_tags(info.template_id, **opts)}
        assert "a2" in tags and "a1" not in tags, tags
        background = await AsyncTemplate.build_in_background(tpl, "sweep-async-bg", **opts)
        return background

    background = asyncio.run(main())
    assert background.build_id
    deadline = __import__("time").time() + 120
    while Template.get_build_status(background, **opts).status.value != "ready":
        assert __import__("time").time() < deadline
        __import__("time").sleep(0.3)
    assert exec_in(strata, team_name, "sweep-async:a2", "cat /home/user/async") == "async\n"
    assert exec_in(strata, team_name, "sweep-async-bg", "cat /home/user/async") == "async\n"


def test_methods_on_named_team_templates(strata, team):
    """`add_mcp_server` needs a template named `mcp-gateway`, `beta_dev_container_*` one named
    `devcontainer`. Here those are the team's own, with recording stand-ins for the tools."""
    team_name, opts = team
    recorder = (
        "printf '%s\\n' '#!/bin/sh' 'echo \"$(id -un) $0 $*\" >> /var/log/{0}.calls' > /usr/local/bin/{0}"
        " && chmod 755 /usr/local/bin/{0}"
    )
    gateway = (
        Template()
        .from_image("busybox")
        .run_cmd("mkdir -p /usr/local/bin /var/log && " + recorder.format("mcp-gateway"), user="root")
    )
    Template.build(gateway, "mcp-gateway", **opts)
    mcp = Template().from_template("mcp-gateway").add_mcp_server(["exa", "brave"])
    Template.build(mcp, "sweep-mcp", **opts)
    assert exec_in(strata, team_name, "sweep-mcp", "cat /var/log/mcp-gateway.calls") == (
        "root /usr/local/bin/mcp-gateway pull exa brave\n"
    )

    devcontainer = (
        Template()
        .from_base_image()
        .run_cmd(
            "mkdir -p /usr/local/bin /var/log && " + recorder.format("devcontainer")
            + " && printf '%s\\n' '#!/bin/sh' 'echo \"echo exec-into $1\"' > /prepare-exec.sh && chmod 755 /prepare-exec.sh",
            user="root",
        )
    )
    Template.build(devcontainer, "devcontainer", **opts)
    dev = (
        Template()
        .from_template("devcontainer")
        .beta_dev_container_prebuild("/home/user/proj")
        .beta_set_dev_container_start("/home/user/proj")
    )
    Template.build(dev, "sweep-dev", **opts)
    out = exec_in(strata, team_name, "sweep-dev", "cat /var/log/devcontainer.calls /devcontainer.sh; test -e /devcontainer.up && echo up")
    assert out == (
        "root /usr/local/bin/devcontainer build --workspace-folder /home/user/proj\n"
        "root /usr/local/bin/devcontainer up --workspace-folder /home/user/proj\n"
        "echo exec-into /home/user/proj\n"
        "up\n"
    ), out


def test_methods_that_need_a_network_fail_at_their_step_with_the_reason(strata, team):
    """What a user sees when a method needs what this node lacks: the build fails at the step,
    naming the image or the missing tool, instead of hanging or half-building."""
    _, opts = team
    with pytest.raises(BuildException) as err:
        Template.build(Template().from_alpine_image("edge"), "sweep-alpine", **opts)
    assert "alpine" in str(err.value), str(err.value)
    with pytest.raises(BuildException) as err:
        Template.build(Template().from_image("busybox").git_clone("https://example.invalid/r.git", "/tmp/r"), "sweep-git", **opts)
    assert "git" in str(err.value), str(err.value)


# One 300 MiB buffer, filled.
FILL_300_MIB = "dd if=/dev/zero of=/dev/null bs=300M count=1"


def test_port_and_url_ready_commands_alias_and_resources(strata, team):
    """`wait_for_port` (`ss`) and `wait_for_url` (`curl`) on e2bdev/base, with a start command
    that serves HTTP; and `Template.build` with the deprecated `alias=` and every resource
    option. The three builds are independent and run at once."""
    team_name, opts = team
    # Build sandboxes share the host's network: free ports, not fixed ones.
    port, url_port = free_port(), free_port()
    serve = "cd /home/user && exec python3 -u -m http.server {} > /home/user/http.log 2>&1"

    def port_build():
        tpl = Template().from_base_image().set_start_cmd(serve.format(port), wait_for_port(port))
        return build(tpl, "sweep-port", opts)[1]

    def url_build():
        tpl = Template().from_base_image().set_start_cmd(
            serve.format(url_port), wait_for_url(f"http://localhost:{url_port}/")
        )
        return build(tpl, "sweep-url", opts)[1]

    def alias_build(disk=256, logs=None):
        tpl = Template().from_image("busybox").run_cmd(f"{FILL_300_MIB} && echo aliased > /home/user/aliased")
        return Template.build(
            tpl, alias="sweep-alias", cpu_count=1, memory_mb=512, min_free_disk_mb=disk,
            on_build_logs=(logs if logs is not None else []).append, **opts,
        )

    def starved_build():
        # The same step under 256 MiB (and no swap) is killed.
        tpl = Template().from_image("busybox").run_cmd(FILL_300_MIB)
        with pytest.raises(BuildException) as err:
            Template.build(tpl, "sweep-starved", memory_mb=256, **opts)
        return str(err.value)

    with ThreadPoolExecutor(4) as pool:
        jobs = [pool.submit(f) for f in (port_build, url_build, alias_build, starved_build)]
        port_logs, url_logs, aliased, starved = [f.result() for f in jobs]

    assert f'[finalize] READY [ -n "$(ss -Htuln sport = :{port})" ]' in port_logs, port_logs
    assert (
        f'[finalize] READY curl -s -o /dev/null -w "%{{http_code}}" http://localhost:{url_port}/ | grep -q "200"'
        in url_logs
    ), url_logs
    # The server each start command ran was up; the URL check's request reached it.
    assert exec_in(strata, team_name, "sweep-port", "head -n1 /home/user/http.log").startswith("Serving HTTP")
    assert '"GET / HTTP/1.1" 200' in exec_in(strata, team_name, "sweep-url", "cat /home/user/http.log")

    # alias= names the template as name= does; the build ran with the resources asked for
    # (min_free_disk_mb is accepted and keys the cache only: ADR 0012).
    assert aliased.alias == "sweep-alias" and Template.exists("sweep-alias", **opts)
    assert exec_in(strata, team_name, "sweep-alias", "cat /home/user/aliased") == "aliased\n"
    listing = urllib.request.Request(f"{strata.url}/templates", headers={"X-API-Key": opts["api_key"]})
    with urllib.request.urlopen(listing, timeout=10) as r:
        by_id = {t["templateID"]: t for t in json.load(r)}
    assert (by_id[aliased.template_id]["cpuCount"], by_id[aliased.template_id]["memoryMB"]) == (1, 512)
    assert "killed by signal 9" in starved, starved
    # min_free_disk_mb keys the cache: the same value reuses the result, another does not.
    for disk, hit in ((256, True), (512, False)):
        logs = []
        alias_build(disk, logs)
        assert ("[cache] final result: cache hit" in [e.message for e in logs]) == hit, (disk, logs)
