"""The unmodified E2B JS SDK (pinned in tests/e2e/js): a build with a COPY, and the sweep of
every public builder method and build function (js/sweep.mjs, js/sweep_network.mjs).

The JS SDK differs from Python where a server can trip: it validates the key format, sends no
`limit` on status polls, forwards no upload headers, hashes differently, names directories in
the tar with a trailing `/` and serializes a GCP key without spaces. Every result is checked
inside a sandbox on the template.
"""

import json
import pathlib
import shutil
import subprocess
import urllib.request

from conftest import HELPER_IMAGES, free_port
from test_base_image import packages  # noqa: F401 (a fixture)
from test_sdk_build import exec_in
from test_sdk_cache import admin

JS_DIR = pathlib.Path(__file__).resolve().parent / "js"


def generations_per_files_stream(strata, team_name):
    """Generations published on each of the team's files streams (one per upload that landed)."""
    streams = [
        s["stream_id"]
        for s in admin(strata, "/admin/streams?category=files&limit=1000")["streams"]
        if s["stream_id"].startswith(f"files-{team_name}:")
    ]
    return {
        s: sum(1 for e in admin(strata, f"/admin/streams/{s}/events?limit=1000")["events"] if e["type"] == "GenerationPublished.v1")
        for s in streams
    }


def test_the_js_sdk_builds_a_template_with_a_copy(strata, team, context_dir):
    assert shutil.which("node"), "node is required (scripts/setup.sh installs it)"
    assert (JS_DIR / "node_modules" / "e2b").is_dir(), "run scripts/setup.sh (npm ci in tests/e2e/js)"
    team_name, opts = team
    out = subprocess.run(
        ["node", str(JS_DIR / "build_copy.mjs"), str(context_dir), "js-copy"],
        env={**strata.env, "E2B_API_KEY": opts["api_key"], "E2B_API_URL": opts["api_url"]},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"node failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["templateId"] and info["buildId"] and info["logs"] > 0, info

    got = exec_in(
        strata,
        team_name,
        "js-copy",
        "cat /tmp/copied.txt; stat -c '%a %U' /opt/js/app/bin/run.sh; readlink /opt/js/app/link.txt; "
        "cat /opt/js/app/nested/deep/data.txt; test ! -e /opt/js/app/secret.env && echo ignored",
    )
    assert got.split("\n")[:5] == ["config-v1", "755 user", "config.txt", "deep data", "ignored"], got


def test_every_js_builder_method_has_its_effect(strata, team, context_dir):
    """js/sweep.mjs calls every public builder method and build function of the JS SDK that
    needs nothing past the build context (js/sweep_network.mjs the others); each effect is
    checked here inside the built templates."""
    team_name, opts = team
    out = subprocess.run(
        ["node", str(JS_DIR / "sweep.mjs"), str(context_dir)],
        env={**strata.env, "E2B_API_KEY": opts["api_key"], "E2B_API_URL": opts["api_url"]},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, f"node failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    got = json.loads(out.stdout.strip().splitlines()[-1])

    assert got["files"]["executed"] == list(range(1, 25)), got
    files = exec_in(
        strata,
        team_name,
        "js-files:v2",
        "stat -c '%n %a %U' /opt/multi/a.md /opt/multi/b.md /opt/items/config.txt /opt/items/run.sh "
        "/home/user/d1 /opt/resolved.txt; "
        "test -L /opt/resolved.txt || echo resolved-not-link; cat /opt/resolved.txt; "
        "ls /opt/notes-plain; readlink /home/user/cfg-link; ls /home/user/d1; cat /home/user/d1/x-renamed; "
        "test -e /home/user/d2 || echo d2-removed; test -e /opt/rootdir || echo rootdir-removed; "
        "cat /opt/whoami-step /tmp/run-as /home/user/work/env-and-pwd /home/user/forced /home/user/started; "
        'echo "[$SWEEP_MSG]"; id -un; pwd',
    )
    assert files.split("\n") == [
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
        "[]",
        "user",
        "/home/user/work",
        "",
    ], files
    assert got["exists"] is True and got["aliasExists"] is True and got["missingExists"] is False, got
    assert {"v1", "v2"} <= set(got["tagsAfterBuild"]), got
    assert "stable" in got["assigned"]["tags"] and got["assigned"]["buildId"] == got["files"]["buildId"], got
    assert "v1" not in got["tagsAfterRemove"] and {"v2", "stable"} <= set(got["tagsAfterRemove"]), got
    assert exec_in(strata, team_name, "js-files:stable", "cat /home/user/forced") == "forced\n"
    # skipCache on the builder: only the steps after it ran again.
    assert got["filesAgain"] == [24], got

    # `WORKDIR $APP` from the JS Dockerfile parser is expanded, not created literally.
    assert exec_in(strata, team_name, "js-dockerfile", "cat /srv/js/here; pwd; test -e '/$APP' || echo no-literal") == (
        "/srv/js\n/srv/js\n/srv/js\nno-literal\n"
    )
    assert exec_in(strata, team_name, "js-base", "cat /home/user/sudo-as; test -e /home/user/up && echo up") == "root\nup\n"
    # defaultBuildLogger printed that build's steps.
    assert "RUN sudo -n id -un > /home/user/sudo-as" in out.stdout + out.stderr, out.stdout
    assert "[finalize] READY sleep 1" in got["debianLogs"], got
    assert exec_in(strata, team_name, "js-debian", "cat /home/user/codename") == "bookworm\n"
    assert got["againExecuted"] == [1], got

    assert got["toJSON"]["fromImage"] == "busybox", got
    assert [s["type"] for s in got["toJSON"]["steps"]] == ["ENV", "WORKDIR", "RUN", "USER"], got
    assert got["toDockerfile"].startswith("FROM busybox"), got
    assert exec_in(strata, team_name, "js-roundtrip", "cat /srv/round/made; id -un; pwd") == "trip\nroot\n/srv/round\n"

    assert got["statusRightAfterStart"] == "building" and got["statusAtEnd"] == "ready", got
    assert exec_in(strata, team_name, "js-background", "test -s /home/user/bg && echo built") == "built\n"

    assert exec_in(strata, team_name, "js-mcp", "cat /var/log/mcp-gateway.calls") == (
        "root /usr/local/bin/mcp-gateway pull exa brave\n"
    )
    assert exec_in(strata, team_name, "js-dev", "cat /var/log/devcontainer.calls /devcontainer.sh; test -e /devcontainer.up && echo up") == (
        "root /usr/local/bin/devcontainer build --workspace-folder /home/user/proj\n"
        "root /usr/local/bin/devcontainer up --workspace-folder /home/user/proj\n"
        "echo exec-into /home/user/proj\n"
        "up\n"
    )

    assert got["alpineError"] and "alpine" in got["alpineError"], got
    assert got["gitError"] and "git" in got["gitError"], got


def test_js_methods_that_reach_registries_package_servers_and_ports(strata, team, context_dir, registries, packages):
    """js/sweep_network.mjs: the image helpers through the docker.io mirror, a private registry
    with credentials, the package and clone helpers against loopback servers (as in
    test_base_image.py), port and URL ready commands, forceUpload and the build's resources."""
    team_name, opts = team
    reg = registries.private
    registries.push_image(reg, "private/js:1", "private-js")
    registries.push_image(registries.gcp, "project/js:1", "gcp-js")
    (context_dir / "sa.json").write_text(registries.GCP_KEY)
    port, url_port = free_port(), free_port()
    out = subprocess.run(
        [
            "node", str(JS_DIR / "sweep_network.mjs"), str(context_dir), f"{reg.addr}/private/js:1",
            registries.PASSWORD, f"{registries.gcp.addr}/project/js:1", packages, str(port), str(url_port),
        ],
        env={**strata.env, "E2B_API_KEY": opts["api_key"], "E2B_API_URL": opts["api_url"]},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, f"node failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    got = json.loads(out.stdout.strip().splitlines()[-1])

    for name, reference in {
        "debian": "debian:stable", "ubuntu": "ubuntu:latest", "fedora": "fedora:44", "alpine": "alpine:3.24",
        "arch": "archlinux:latest", "python": "python:3", "node": "node:lts", "bun": "oven/bun:latest",
    }.items():
        assert any(m.startswith(f"[base] {reference} resolved to sha256:") for m in got["helpers"][name]), got["helpers"]
        marker = HELPER_IMAGES[reference if "/" in reference else "library/" + reference]
        assert exec_in(strata, team_name, f"js-helper-{name}", "cat /home/user/seen") == marker + "\n", name
    # bunInstall (a stand-in `bun`: no bun installs offline): as the default user, -g as root.
    assert exec_in(strata, team_name, "js-helper-bun", "cat /var/log/bun.calls") == (
        "user /home/user bun install left-pad zod\n"
        "root /home/user bun install -g tsx\n"
        "user /home/user bun install --dev\n"
    )

    assert any(m.startswith(f"[base] {reg.addr}/private/js:1 resolved to") for m in got["private"]), got
    assert exec_in(strata, team_name, "js-private", "cat /home/user/seen") == "private-js\n"
    assert "refused access" in got["privateWrong"], got
    # fromGCPRegistry with a key file: the key, as read, is the password of `_json_key`.
    assert any(m.startswith(f"[base] {registries.gcp.addr}/project/js:1 resolved to") for m in got["gcp"]), got
    assert exec_in(strata, team_name, "js-gcp", "cat /home/user/seen") == "gcp-js\n"

    tools = exec_in(
        strata,
        team_name,
        "js-tools",
        "tree --version | cut -d' ' -f1; "
        "python3 -c 'import stratacheck; print(stratacheck.VALUE, stratacheck.__file__.startswith(\"/home/user/.local/\"))'; "
        "NODE_PATH=$(npm root -g) node -e 'console.log(require(\"strata-check\"))'; test -e /home/user/node_modules || echo not-local; "
        "cat /home/user/repo/README; git -C /home/user/repo branch --show-current; stat -c %U /home/user/repo",
    )
    # pipInstall {g: false} installed for the user, npmInstall {g: true} globally.
    assert tools == "tree\nwheel-ok True\nnpm-ok\nnot-local\ncloned-ok\nmain\nuser\n", tools

    assert f'[finalize] READY [ -n "$(ss -Htuln sport = :{port})" ]' in got["port"], got
    assert (
        f'[finalize] READY curl -s -o /dev/null -w "%{{http_code}}" http://localhost:{url_port}/ | grep -q "200"' in got["url"]
    ), got
    assert exec_in(strata, team_name, "js-port", "head -n1 /home/user/http.log").startswith("Serving HTTP")
    assert '"GET / HTTP/1.1" 200' in exec_in(strata, team_name, "js-url", "cat /home/user/http.log")

    # Template.build({alias, cpuCount, memoryMB, minFreeDiskMb}): named by the alias; the sandbox
    # had 512 MiB for a 300 MiB buffer, where 256 MiB killed it.
    assert got["sized"] == "js-sized", got
    assert exec_in(strata, team_name, "js-sized", "cat /home/user/sized") == "sized\n"
    assert "killed by signal 9" in got["starved"], got
    listing = urllib.request.Request(f"{strata.url}/templates", headers={"X-API-Key": opts["api_key"]})
    with urllib.request.urlopen(listing, timeout=10) as r:
        sized = [t for t in json.load(r) if t["names"] == ["js-sized"]]
    assert [(t["cpuCount"], t["memoryMB"]) for t in sized] == [(1, 512)], sized

    # forceUpload: the SDK uploaded again, and the server took a second generation of those files.
    assert got["force"]["uploads"] == [1, 1, 0], got
    assert [m.split(" ")[:2] for m in got["force"]["skippedSteps"]] == [["[1/1]", "COPY"]], got
    assert exec_in(strata, team_name, "js-force", "cat /opt/nested/deep/data.txt") == "deep data\n"
    per_stream = generations_per_files_stream(strata, team_name)
    assert sorted(per_stream.values()).count(2) == 1 and max(per_stream.values()) == 2, per_stream
