"""Base images from registries, through the unmodified E2B Python SDK: a real registry on
loopback (Debian's docker-registry) serves as the docker.io mirror and as a password-protected
private registry; images are pushed with skopeo. Each result is checked inside the template
(`strata template exec`)."""

import http.server
import json
import re
import threading
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2b import Template

RESOLVED = re.compile(r"^\[base\] (\S+) resolved to (sha256:[0-9a-f]{64}) \((\d+) layers, (\d+) downloaded\)$")


def build(tpl, name, opts, **kw):
    return build_info(tpl, name, opts, **kw)[1]


def build_info(tpl, name, opts, **kw):
    logs = []
    info = Template.build(tpl, name, on_build_logs=logs.append, **opts, **kw)
    return info, [entry.message for entry in logs]


def build_error(tpl, name, opts):
    logs = []
    with pytest.raises(Exception) as err:
        Template.build(tpl, name, on_build_logs=logs.append, **opts)
    return str(err.value), [entry.message for entry in logs]


def exec_in(strata, team_name, template, script):
    out = strata.cli("template", "exec", "--team", team_name, template, "--", "/bin/sh", "-c", script, check=False)
    assert out.returncode == 0, f"exec failed ({out.returncode}): {out.stderr}"
    return out.stdout


def resolved(messages):
    found = [RESOLVED.match(m) for m in messages]
    return [m for m in found if m]


def test_sdk_image_helpers_resolve_through_the_docker_io_mirror(strata, team):
    team_name, opts = team
    info, messages = build_info(
        Template()
        .from_debian_image()
        .run_cmd('cat /etc/image-marker > /home/user/seen && echo "$IMAGE_VAR" > /home/user/env'),
        "deb",
        opts,
    )
    lines = resolved(messages)
    assert len(lines) == 1 and lines[0].group(1) == "debian:stable", messages
    assert exec_in(strata, team_name, "deb", "cat /home/user/seen").strip() == "debian-stable"
    # E2B applies the image's ENV to the build (build-time, as every ENV: ADR 0012), not its
    # USER or WORKDIR (the image says nobody and /srv).
    assert exec_in(strata, team_name, "deb", "cat /home/user/env") == "from-image\n"
    assert exec_in(strata, team_name, "deb", 'echo "[$IMAGE_VAR]"') == "[]\n"

    build(Template().from_python_image().run_cmd("cat /etc/image-marker > /tmp/m"), "py", opts)
    assert exec_in(strata, team_name, "py", "cat /etc/image-marker").strip() == "python-3"

    history = strata.cli("history", "build", info.build_id, "--json")
    pins = [line for line in history.stdout.splitlines() if "BaseImageResolved.v1" in line]
    assert len(pins) == 1 and lines[0].group(2) in pins[0], history.stdout


# Every other image helper of the SDK, with the reference it asks for; the mirror serves each
# (conftest.py HELPER_IMAGES). `oven/bun` carries a stand-in `bun` (no bun installs offline)
# that records its calls, so `bun_install` is checked by the call it makes.
HELPERS = {
    "ubuntu": (lambda t: t.from_ubuntu_image(), "ubuntu:latest", "ubuntu-latest"),
    "fedora": (lambda t: t.from_fedora_image(), "fedora:44", "fedora-44"),
    "alpine": (lambda t: t.from_alpine_image(), "alpine:3.24", "alpine-3.24"),
    "arch": (lambda t: t.from_arch_image(), "archlinux:latest", "archlinux-latest"),
    "node": (lambda t: t.from_node_image(), "node:lts", "node-lts"),
    "bun": (
        lambda t: t.from_bun_image().bun_install(["left-pad", "zod"]).bun_install("tsx", g=True).bun_install(dev=True),
        "oven/bun:latest",
        "bun-latest",
    ),
}


def test_every_image_helper_resolves_through_the_docker_io_mirror(strata, team):
    team_name, opts = team

    def one(name):
        make, _, _ = HELPERS[name]
        return build(make(Template()).run_cmd("cat /etc/image-marker > /home/user/seen"), f"helper-{name}", opts)

    with ThreadPoolExecutor(3) as pool:
        runs = dict(zip(HELPERS, pool.map(one, HELPERS)))
    for name, (_, reference, marker) in HELPERS.items():
        lines = resolved(runs[name])
        assert len(lines) == 1 and lines[0].group(1) == reference, (name, runs[name])
        assert exec_in(strata, team_name, f"helper-{name}", "cat /home/user/seen") == marker + "\n", name
    # bun_install: as the default user in its home, globally (-g) as root, --dev with no names.
    assert exec_in(strata, team_name, "helper-bun", "cat /var/log/bun.calls") == (
        "user /home/user bun install left-pad zod\n"
        "root /home/user bun install -g tsx\n"
        "user /home/user bun install --dev\n"
    )


def test_default_and_fully_qualified_spellings_name_catalog_images(strata, team):
    team_name, opts = team
    build(Template().from_base_image().run_cmd("true"), "base-latest", opts)
    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(
            lambda args: build_info(Template().from_image(args[0]).run_cmd("echo built > /home/user/b"), args[1], opts)[1],
            [
                ("docker.io/library/busybox:latest", "bb-fq"),
                ("e2bdev/base:latest", "base-tagged"),
                ("docker.io/library/debian:bookworm", "deb-fq"),
            ],
        ))
    # Catalog images: nothing is resolved in a registry.
    assert all(resolved(messages) == [] for messages in runs), runs
    assert exec_in(strata, team_name, "bb-fq", "echo ok") == "ok\n"
    assert exec_in(strata, team_name, "base-tagged", "cat /home/user/b; for t in curl ss git; do command -v $t; done") == (
        "built\n/usr/bin/curl\n/usr/bin/ss\n/usr/bin/git\n"
    )
    assert exec_in(strata, team_name, "deb-fq", ". /etc/os-release && echo $VERSION_CODENAME") == "bookworm\n"


def test_digest_references_pull_exactly_that_manifest(strata, team, registries):
    team_name, opts = team
    dest = f"pinned/app:{uuid.uuid4().hex[:6]}"
    first = registries.push_image(registries.open, dest, "pinned-v1")
    registries.push_image(registries.open, dest, "pinned-v2")
    python = registries.pushed["library/python:3"]["digest"]
    refs = [
        # The tag has moved on; the digest still names the first push.
        (f"{registries.open.addr}/{dest.split(':')[0]}@{first['digest']}", "by-digest"),
        # Docker Hub spelling with tag and digest, through the mirror.
        (f"python:3@{python}", "py-digest"),
    ]
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(
            lambda args: build_info(Template().from_image(args[0]).run_cmd("cat /etc/image-marker > /home/user/m"), args[1], opts)[1],
            refs,
        ))
    assert [resolved(m)[0].group(2) for m in runs] == [first["digest"], python], runs
    assert exec_in(strata, team_name, "by-digest", "cat /home/user/m") == "pinned-v1\n"
    assert exec_in(strata, team_name, "py-digest", "cat /home/user/m") == "python-3\n"

    # A digest the registry does not have fails the build and names it.
    missing = "sha256:" + "0" * 64
    message, _ = build_error(
        Template().from_image(f"{registries.open.addr}/{dest.split(':')[0]}@{missing}").run_cmd("true"), "no-digest", opts
    )
    assert missing in message, message


def test_private_registry_with_right_and_wrong_passwords(strata, team, registries):
    team_name, opts = team
    reg = registries.private
    registries.push_image(reg, "private/app:1", "private-app")
    image = f"{reg.addr}/private/app:1"

    wrong = "wrong-Pa55word-e2e"
    message, logs = build_error(Template().from_image(image, username="builder", password=wrong).run_cmd("true"), "priv-bad", opts)
    assert "refused access" in message and "credentials" in message, message
    everything = message + "\n".join(logs)
    assert wrong not in everything and registries.PASSWORD not in everything

    info, _ = build_info(Template().from_image(image, username="builder", password=registries.PASSWORD).run_cmd("true"), "priv", opts)
    assert exec_in(strata, team_name, "priv", "cat /etc/image-marker").strip() == "private-app"

    # Without credentials the layers already on the node are not handed out.
    message, _ = build_error(Template().from_image(image).run_cmd("true"), "priv-anon", opts)
    assert "refused access" in message, message

    # The password is in no event, no log line of the server, no history.
    history = strata.cli("history", "build", info.build_id, "--json").stdout
    server_log = (strata.data_dir / "strata.log").read_text(errors="replace")
    for secret in (wrong, registries.PASSWORD):
        assert secret not in history and secret not in server_log
    streams = urllib.request.Request(
        strata.url + "/admin/streams?category=build&limit=1000", headers={"Authorization": "Bearer e2e-admin"}
    )
    with urllib.request.urlopen(streams, timeout=10) as r:
        listing = r.read().decode()
    for stream in re.findall(r'"stream_id":"(build-[^"]+)"', listing):
        req = urllib.request.Request(
            strata.url + f"/admin/streams/{stream}/events?limit=1000", headers={"Authorization": "Bearer e2e-admin"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read().decode()
        assert wrong not in body and registries.PASSWORD not in body


def test_a_gcp_registry_takes_the_service_account_key(strata, team, registries):
    """`from_gcp_registry` sends the key; strata presents it as the password of `_json_key`,
    the basic auth gcr.io and Artifact Registry accept. A loopback registry with that user
    stands in for Google's (the key is never exchanged, so nothing else differs)."""
    team_name, opts = team
    registries.push_image(registries.gcp, "project/app:1", "gcp-app")
    image = f"{registries.gcp.addr}/project/app:1"
    key = json.loads(registries.GCP_KEY)
    build(Template().from_gcp_registry(image, service_account_json=key).run_cmd("cat /etc/image-marker > /home/user/m"), "gcp", opts)
    assert exec_in(strata, team_name, "gcp", "cat /home/user/m") == "gcp-app\n"

    message, _ = build_error(
        Template().from_gcp_registry(image, service_account_json={**key, "project_id": "other"}).run_cmd("true"),
        "gcp-bad",
        opts,
    )
    assert "refused access" in message, message
    assert registries.GCP_KEY not in (strata.data_dir / "strata.log").read_text(errors="replace")


def test_a_moved_tag_misses_the_cache_and_an_unchanged_one_hits(strata, team, registries):
    team_name, opts = team
    dest = f"moving/app:{uuid.uuid4().hex[:6]}"
    registries.push_image(registries.open, dest, "v1")
    image = f"{registries.open.addr}/{dest}"
    recipe = lambda: Template().from_image(image).run_cmd("cat /etc/image-marker > /home/user/m")  # noqa: E731

    first = build(recipe(), "moving", opts)
    assert "[cache] final result: cache hit" not in first
    again = build(recipe(), "moving", opts)
    assert "[cache] final result: cache hit" in again, again
    registries.push_image(registries.open, dest, "v2")
    moved = build(recipe(), "moving", opts)
    assert "[cache] final result: cache hit" not in moved, moved
    assert resolved(moved)[0].group(2) != resolved(first)[0].group(2)
    assert exec_in(strata, team_name, "moving", "cat /home/user/m").strip() == "v2"


def test_two_concurrent_builds_of_one_new_image_pull_it_once(strata, team, registries):
    team_name, opts = team
    dest = f"fresh/app:{uuid.uuid4().hex[:6]}"
    registries.push_image(registries.open, dest, "fresh")
    image = f"{registries.open.addr}/{dest}"
    with ThreadPoolExecutor(2) as pool:
        runs = list(
            pool.map(
                lambda i: build(Template().from_image(image).run_cmd(f"echo {i} > /home/user/i"), f"fresh-{i}", opts),
                [1, 2],
            )
        )
    downloaded = [int(resolved(m)[0].group(4)) for m in runs]
    # The build that downloads shows its progress.
    assert any(m.startswith("[base] pulling ") for messages in runs for m in messages), runs
    # One build pulls and the other waits for it. The busybox layer is on the node already,
    # but this repository never served it, so it must serve it once too (verified, not stored
    # twice: ADR 0026); the marker layer is new. Both cross once, in one of the two builds.
    assert sorted(downloaded) == [0, 2], (downloaded, runs)


class Tamper(http.server.BaseHTTPRequestHandler):
    """Relays to the open registry, flipping a byte in every layer blob."""

    upstream = ""

    def do_GET(self):  # noqa: N802
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        req = urllib.request.Request(f"http://{self.upstream}{self.path}", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, out_headers, body = r.status, r.headers, bytearray(r.read())
        except urllib.error.HTTPError as e:
            status, out_headers, body = e.code, e.headers, bytearray(e.read())
        if "/blobs/" in self.path and len(body) > 64 and body[:1] != b"{":
            body[len(body) // 2] ^= 0x55
        self.send_response(status)
        for k, v in out_headers.items():
            if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(bytes(body))

    def log_message(self, *args):
        pass


def test_a_corrupted_blob_fails_the_build_and_nothing_is_stored(strata, team, registries):
    team_name, opts = team
    dest = f"tampered/app:{uuid.uuid4().hex[:6]}"
    image = registries.push_image(registries.open, dest, f"tampered-{uuid.uuid4().hex}")
    Tamper.upstream = registries.open.addr
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Tamper)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ref = f"127.0.0.1:{server.server_address[1]}/{dest}"
        message, _ = build_error(Template().from_image(ref).run_cmd("true"), "tampered", opts)
    finally:
        server.shutdown()
    assert "altered" in message and "nothing was stored" in message, message
    marker_layer = image["diff_ids"][1].split(":")[1]
    assert not (strata.data_dir / "blobs" / "sha256" / marker_layer).exists()
    assert not (strata.data_dir / "layers" / marker_layer).exists()
