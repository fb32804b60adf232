"""Launching what was built: the stock Python SDK's `Sandbox` API on strata templates.

The SDK reaches every sandbox's agent through strata's own API port (`sandbox_url`, i.e.
`E2B_SANDBOX_URL`), which routes by the `E2b-Sandbox-Id` header to the node running it.
"""

import time
import uuid

import pytest
from e2b import Sandbox, Template
from e2b import CommandExitException
from e2b.exceptions import (
    InvalidArgumentException,
    NotFoundException,
    SandboxException,
)
from e2b.sandbox.filesystem.filesystem import FileType


def opts(strata, team):
    return {
        "api_key": strata.key(team),
        "api_url": strata.url,
        "sandbox_url": strata.url,
    }


@pytest.fixture(scope="module")
def built(strata, tmp_path_factory):
    """A template built once: a COPY of a file, an ENV, a user and a workdir."""
    team = f"sbx{uuid.uuid4().hex[:8]}"
    o = opts(strata, team)
    ctx = tmp_path_factory.mktemp("sbxctx")
    (ctx / "app.txt").write_text("copied into the template\n")
    name = f"launch-{uuid.uuid4().hex[:6]}"
    template = (
        Template(file_context_path=str(ctx))
        .from_image("e2bdev/base")
        .copy("app.txt", "/home/user/app.txt")
        .run_cmd("echo built > /home/user/built.txt")
    )
    Template.build(template, name, api_key=o["api_key"], api_url=o["api_url"])
    return {"opts": o, "name": name, "team": team, "strata": strata}


def test_a_built_template_launches_and_runs_commands_as_its_user(built):
    sbx = Sandbox.create(built["name"], timeout=120, envs={"GREETING": "hi"}, **built["opts"])
    try:
        r = sbx.commands.run("cat /home/user/app.txt /home/user/built.txt; whoami; pwd; echo $GREETING")
        assert r.exit_code == 0
        assert r.stdout.splitlines() == [
            "copied into the template",
            "built",
            "user",
            "/home/user",
            "hi",
        ], r.stdout
        # Per-command user, cwd and env; stderr apart from stdout.
        r = sbx.commands.run("id -u; pwd; echo $X; echo oops >&2", user="root", cwd="/tmp", envs={"X": "1"})
        assert r.stdout.splitlines() == ["0", "/tmp", "1"]
        assert r.stderr == "oops\n"
        # A failing command raises with its exit code and output.
        with pytest.raises(CommandExitException) as failed:
            sbx.commands.run("echo partial; exit 3")
        assert failed.value.exit_code == 3
        assert failed.value.stdout == "partial\n"
        # A missing working directory is the SDK's invalid-argument error, before anything runs.
        with pytest.raises(InvalidArgumentException):
            sbx.commands.run("true", cwd="/nope")
        assert sbx.is_running()
    finally:
        sbx.kill()


def test_background_commands_are_listed_and_killed_by_pid(built):
    sbx = Sandbox.create(built["name"], **built["opts"])
    try:
        handle = sbx.commands.run("sleep 60", background=True)
        pids = [p.pid for p in sbx.commands.list()]
        assert handle.pid in pids, pids
        # The process is in the sandbox's pid namespace: the sandbox sees that very pid.
        seen = sbx.commands.run(f"cat /proc/{handle.pid}/cmdline | tr '\\0' ' '").stdout
        assert "sleep 60" in seen, seen
        assert handle.kill()
        with pytest.raises(CommandExitException) as killed:
            handle.wait()
        assert killed.value.exit_code == -1
        assert handle.pid not in [p.pid for p in sbx.commands.list()]
        assert not sbx.commands.kill(999999), "an unknown pid is not found"
    finally:
        sbx.kill()


def test_stdin_reaches_a_background_command(built):
    sbx = Sandbox.create(built["name"], **built["opts"])
    try:
        handle = sbx.commands.run("head -n 1", background=True, stdin=True)
        sbx.commands.send_stdin(handle.pid, "through stdin\n")
        result = handle.wait()
        assert result.stdout == "through stdin\n"
    finally:
        sbx.kill()


def test_files_are_written_read_listed_and_removed_as_the_user(built):
    sbx = Sandbox.create(built["name"], **built["opts"])
    try:
        info = sbx.files.write("/home/user/dir/hello.txt", "hello")
        assert info.path == "/home/user/dir/hello.txt"
        assert sbx.files.read("/home/user/dir/hello.txt") == "hello"
        payload = bytes(range(256)) * 4096
        sbx.files.write("rel/blob.bin", payload)
        assert sbx.files.read("/home/user/rel/blob.bin", format="bytes") == payload
        owner = sbx.commands.run("stat -c %U /home/user/dir/hello.txt").stdout.strip()
        assert owner == "user"
        entries = {e.name: e for e in sbx.files.list("/home/user/dir")}
        assert entries["hello.txt"].type == FileType.FILE
        assert entries["hello.txt"].size == 5
        assert sbx.files.exists("/home/user/dir/hello.txt")
        assert not sbx.files.exists("/home/user/dir/missing")
        assert sbx.files.make_dir("/home/user/newdir")
        assert not sbx.files.make_dir("/home/user/newdir"), "an existing directory is not made again"
        moved = sbx.files.rename("/home/user/dir/hello.txt", "/home/user/dir/sub/moved.txt")
        assert moved.path == "/home/user/dir/sub/moved.txt"
        assert sbx.files.read("/home/user/dir/sub/moved.txt") == "hello"
        from e2b.sandbox.filesystem.filesystem import WriteEntry

        written = sbx.files.write_files(
            [WriteEntry(path="/home/user/many/a.txt", data="a"), WriteEntry(path="many/b.txt", data="b")]
        )
        assert sorted(w.path for w in written) == ["/home/user/many/a.txt", "/home/user/many/b.txt"]
        assert sbx.commands.run("cat /home/user/many/a.txt /home/user/many/b.txt").stdout == "ab"
        sbx.files.remove("/home/user/dir")
        assert not sbx.files.exists("/home/user/dir/sub/moved.txt")
        from e2b.exceptions import NotFoundException as FileMissing

        with pytest.raises(FileMissing):
            sbx.files.read("/home/user/dir/hello.txt")
        # The user cannot write where the sandbox's permissions say no; root can.
        with pytest.raises(SandboxException):
            sbx.files.write("/etc/owned-by-user", "x")
        sbx.files.write("/etc/owned-by-root", "x", user="root")
        assert sbx.commands.run("stat -c %U /etc/owned-by-root").stdout.strip() == "root"
    finally:
        sbx.kill()


def test_info_list_timeout_and_kill(built, strata):
    marker = uuid.uuid4().hex[:8]
    a = Sandbox.create(built["name"], metadata={"run": marker, "n": "1"}, **built["opts"])
    b = Sandbox.create(built["name"], metadata={"run": marker, "n": "2"}, **built["opts"])
    try:
        info = a.get_info()
        assert info.sandbox_id == a.sandbox_id
        assert info.metadata == {"run": marker, "n": "1"}
        assert info.name == built["name"]
        from e2b.sandbox.sandbox_api import SandboxQuery

        listed = Sandbox.list(query=SandboxQuery(metadata={"run": marker}), **built["opts"]).next_items()
        assert {s.sandbox_id for s in listed} == {a.sandbox_id, b.sandbox_id}
        # Paging: one per page, then the second, then nothing more.
        pager = Sandbox.list(query=SandboxQuery(metadata={"run": marker}), limit=1, **built["opts"])
        first = pager.next_items()
        assert pager.has_next
        second = pager.next_items()
        assert {first[0].sandbox_id, second[0].sandbox_id} == {a.sandbox_id, b.sandbox_id}
        assert not pager.has_next
        only_b = Sandbox.list(query=SandboxQuery(metadata={"run": marker, "n": "2"}), **built["opts"]).next_items()
        assert [s.sandbox_id for s in only_b] == [b.sandbox_id]

        # A short timeout ends the sandbox on its own.
        b.set_timeout(2)
        deadline = time.time() + 20
        while b.is_running() and time.time() < deadline:
            time.sleep(0.5)
        assert not b.is_running(), "the sandbox outlived its timeout"
        assert Sandbox.kill(b.sandbox_id, **built["opts"]) is False, "an expired sandbox is gone"

        # A connect answers for a running sandbox and extends it.
        again = Sandbox.connect(a.sandbox_id, timeout=300, **built["opts"])
        assert again.commands.run("echo connected").stdout == "connected\n"
        assert a.kill() is True
        assert a.kill() is False, "a killed sandbox is gone"
        assert not a.is_running()
    finally:
        for s in (a, b):
            try:
                s.kill()
            except Exception:
                pass


def test_metrics_are_what_the_sandbox_uses_now(built):
    import datetime

    sbx = Sandbox.create(built["name"], timeout=120, **built["opts"])
    try:
        sbx.commands.run("dd if=/dev/urandom of=/home/user/blob bs=1M count=6 2>/dev/null")
        sbx.commands.run("timeout 5 sh -c 'while :; do :; done'", background=True)
        time.sleep(0.5)
        [m] = sbx.get_metrics()
        assert m.cpu_count >= 1
        assert m.cpu_used_pct > 20, m
        assert 0 < m.mem_used <= m.mem_total, m
        assert m.disk_used >= 6 << 20 and m.disk_total >= m.disk_used, m
        assert abs((datetime.datetime.now(datetime.timezone.utc) - m.timestamp).total_seconds()) < 60, m
        # A window that leaves out the present has nothing; another team's sandbox is not found.
        later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
        assert sbx.get_metrics(start=later) == []
        other = opts_of_other_team(built)
        with pytest.raises(NotFoundException):
            Sandbox.get_metrics(sbx.sandbox_id, **other)
    finally:
        sbx.kill()


def opts_of_other_team(built):
    o = dict(built["opts"])
    o["api_key"] = built["strata"].key(f"other{uuid.uuid4().hex[:8]}")
    return o


def test_another_teams_sandbox_is_not_found(built, strata):
    sbx = Sandbox.create(built["name"], **built["opts"])
    try:
        other = opts(strata, f"other{uuid.uuid4().hex[:6]}")
        assert Sandbox.kill(sbx.sandbox_id, **other) is False
        from e2b.exceptions import SandboxNotFoundException

        with pytest.raises((SandboxNotFoundException, NotFoundException)):
            Sandbox.get_info(sbx.sandbox_id, **other)
        assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list(**other).next_items()]
        # Nor does another team's name resolve: templates are per team.
        with pytest.raises(SandboxException):
            Sandbox.create(built["name"], **other)
        # The sandbox's agent refuses requests without its token.
        import urllib.request

        req = urllib.request.Request(
            strata.url + "/process.Process/List",
            data=b"{}",
            headers={"content-type": "application/json", "e2b-sandbox-id": sbx.sandbox_id},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)
        assert refused.value.code == 401
        assert sbx.is_running()
    finally:
        sbx.kill()


def test_a_sandbox_without_internet_access_has_no_egress(built):
    sbx = Sandbox.create(built["name"], allow_internet_access=False, **built["opts"])
    try:
        links = sbx.commands.run("awk 'NR>2 {print $1}' /proc/net/dev").stdout.split()
        assert links == ["lo:"], links
        routes = sbx.commands.run("awk 'NR>1' /proc/net/route").stdout
        assert routes.strip() == "", routes
    finally:
        sbx.kill()
    # The same template with access has its link and a default route.
    sbx = Sandbox.create(built["name"], **built["opts"])
    try:
        links = sbx.commands.run("awk 'NR>2 {print $1}' /proc/net/dev").stdout.split()
        assert sorted(links) == ["eth0:", "lo:"], links
    finally:
        sbx.kill()


def test_an_unknown_template_is_refused_and_a_killed_sandboxs_agent_is_gone(built, strata):
    with pytest.raises(SandboxException) as missing:
        Sandbox.create("no-such-template", **built["opts"])
    assert "404" in str(missing.value)
    sbx = Sandbox.create(built["name"], **built["opts"])
    sbx.kill()
    assert not sbx.is_running()


def test_an_upload_cut_off_mid_body_leaves_the_old_file(built, strata):
    import socket
    from urllib.parse import urlparse

    sbx = Sandbox.create(built["name"], **built["opts"])
    try:
        sbx.files.write("/home/user/kept.txt", "original")
        url = urlparse(strata.url)
        conn = socket.create_connection((url.hostname, url.port), timeout=10)
        request = (
            "POST /files?path=%2Fhome%2Fuser%2Fkept.txt HTTP/1.1\r\n"
            f"Host: {url.netloc}\r\n"
            "Content-Type: application/octet-stream\r\n"
            "Content-Length: 100000\r\n"
            f"E2b-Sandbox-Id: {sbx.sandbox_id}\r\n"
            f"X-Access-Token: {sbx._envd_access_token}\r\n\r\n"
            "truncated!"
        )
        conn.sendall(request.encode())
        time.sleep(0.5)
        conn.close()
        time.sleep(0.5)
        assert sbx.files.read("/home/user/kept.txt") == "original"
        leftovers = sbx.commands.run("ls -a /home/user | grep -c strata-upload || true").stdout.strip()
        assert leftovers == "0", "the cut-off upload's temporary file was removed"
    finally:
        sbx.kill()


def test_signed_file_urls_work_without_the_token_and_a_tampered_one_is_refused(built):
    import urllib.error
    import urllib.request

    sbx = Sandbox.create(built["name"], **built["opts"])
    try:
        sbx.files.write("/home/user/signed.txt", "by signature")
        url = sbx.download_url("/home/user/signed.txt", use_signature_expiration=60)
        assert "signature=v1_" in url
        # With E2B_SANDBOX_URL the URL names no sandbox; the header does what a host name would.
        headers = {"e2b-sandbox-id": sbx.sandbox_id}
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            assert r.read() == b"by signature"
        for tampered in (
            url.replace("signed.txt", "other.txt"),
            url.replace("signature=v1_", "signature=v1_A"),
            url.split("&signature")[0],
        ):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(tampered, headers=headers), timeout=10)
            assert refused.value.code == 401, tampered
    finally:
        sbx.kill()


def test_a_signed_upload_url_writes_one_file_and_only_to_its_path(built):
    import urllib.error
    import urllib.request

    sbx = Sandbox.create(built["name"], **built["opts"])
    try:
        sbx.files.write("/home/user/.profile-kept", "untouched")
        url = sbx.upload_url("/home/user/signed-upload.txt", use_signature_expiration=60)
        headers = {"e2b-sandbox-id": sbx.sandbox_id}

        def post(parts):
            boundary = uuid.uuid4().hex
            body = b"".join(
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
                f"Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n"
                for name, data in parts
            ) + f"--{boundary}--\r\n".encode()
            req = urllib.request.Request(
                url, data=body, method="POST",
                headers={**headers, "Content-Type": f"multipart/form-data; boundary={boundary}"},
            )
            return urllib.request.urlopen(req, timeout=10)

        # One part: written to the signed path, whatever its file name says.
        with post([("/home/user/.profile-kept", b"mine")]) as r:
            assert r.status == 200
        assert sbx.files.read("/home/user/signed-upload.txt") == "mine"
        assert sbx.files.read("/home/user/.profile-kept") == "untouched"
        # A second part would be written where its file name says: refused.
        with pytest.raises(urllib.error.HTTPError) as refused:
            post([("a", b"first"), ("/home/user/.profile-kept", b"pwned")])
        assert refused.value.code == 403
        assert b"signed upload URL writes one file" in refused.value.read()
        assert sbx.files.read("/home/user/.profile-kept") == "untouched"
    finally:
        sbx.kill()


def test_the_js_sdk_launches_and_drives_a_sandbox(built, strata):
    import json
    import pathlib
    import shutil
    import subprocess

    js = pathlib.Path(__file__).resolve().parent / "js"
    assert shutil.which("node"), "node is required (scripts/setup.sh installs it)"
    out = subprocess.run(
        ["node", str(js / "sandbox.mjs"), built["name"]],
        env={
            **strata.env,
            "E2B_API_KEY": built["opts"]["api_key"],
            "E2B_API_URL": strata.url,
            "E2B_SANDBOX_URL": strata.url,
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"node failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["killed"] is True, result
    assert result["resumed"] is True, result
    assert result["served"] == "served-to-js", result


def test_operators_see_sandboxes_and_their_history(built, strata):
    import urllib.request

    sbx = Sandbox.create(built["name"], **built["opts"])
    live = strata.cli("sandbox", "ls", "--team", built["team"]).stdout
    assert sbx.sandbox_id in live and "running" in live, live
    ended = strata.cli("sandbox", "kill", sbx.sandbox_id)
    assert ended.returncode == 0, ended.stderr
    assert Sandbox.kill(sbx.sandbox_id, **built["opts"]) is False, "ended by the operator"
    listing = strata.cli("sandbox", "ls", "--team", built["team"], "--all").stdout
    line = [l for l in listing.splitlines() if l.startswith(sbx.sandbox_id)]
    assert line and "killed" in line[0], listing
    history = strata.cli("history", f"sandbox-{sbx.sandbox_id}").stdout
    for event in ("SandboxRequested.v1", "SandboxPlaced.v1", "SandboxRunning.v1", "SandboxEnded.v1"):
        assert event in history, history
    req = urllib.request.Request(strata.url + "/ui/sandboxes", headers={"Authorization": "Bearer e2e-admin"})
    with urllib.request.urlopen(req, timeout=10) as r:
        page = r.read().decode()
    assert sbx.sandbox_id in page and "killed" in page, page[:2000]
    with urllib.request.urlopen(strata.url + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    created = [l for l in metrics.splitlines() if l.startswith('strata_sandbox_creates_total{outcome="running"}')]
    assert created and float(created[0].split()[-1]) >= 1, created
    assert "strata_sandbox_create_duration_seconds_count" in metrics
    ended = [l for l in metrics.splitlines() if l.startswith('strata_sandboxes{state="ended"}')]
    assert ended and float(ended[0].split()[-1]) >= 1, ended


def test_stdin_streams_closes_and_a_running_command_can_be_reattached(built):
    sbx = Sandbox.create(built["name"], **built["opts"])
    try:
        cat = sbx.commands.run("cat", background=True, stdin=True)
        sbx.commands.stream_input(cat.pid, iter(["one\n", b"two\n"]))
        sbx.commands.close_stdin(cat.pid)
        assert cat.wait().stdout == "one\ntwo\n"

        ticker = sbx.commands.run("sleep 1; echo tick; sleep 1; echo done", background=True)
        again = sbx.commands.connect(ticker.pid)
        result = again.wait()
        assert result.exit_code == 0 and "done" in result.stdout, result.stdout
        with pytest.raises(NotFoundException):
            sbx.commands.connect(999999).wait()
    finally:
        sbx.kill()


def test_octet_stream_and_gzip_uploads(built):
    sbx = Sandbox.create(built["name"], **built["opts"])
    try:
        sbx.files.write("/home/user/raw.bin", b"\x00\x01\x02", use_octet_stream=True)
        assert sbx.files.read("/home/user/raw.bin", format="bytes") == b"\x00\x01\x02"
        big = b"compressible " * 100000
        sbx.files.write("/home/user/zipped.txt", big, gzip=True)
        assert sbx.files.read("/home/user/zipped.txt", format="bytes") == big
    finally:
        sbx.kill()


def test_a_pty_session_runs_a_shell_on_a_terminal_of_the_asked_size(built):
    from e2b.sandbox.commands.command_handle import PtySize

    sbx = Sandbox.create(built["name"], **built["opts"])
    try:
        term = sbx.pty.create(PtySize(rows=24, cols=80))
        seen = bytearray()
        events = iter(term)

        def read_until(needle: bytes):
            # The shell reads what is typed when it is ready; wait for each answer.
            deadline = time.time() + 20
            while needle not in seen:
                assert time.time() < deadline, bytes(seen)
                _, _, chunk = next(events)
                if chunk:
                    seen.extend(chunk)

        sbx.pty.send_stdin(term.pid, b"stty size; tty; echo marker-$((40+2))\n")
        read_until(b"marker-42\r\n")
        sbx.pty.resize(term.pid, PtySize(rows=40, cols=120))
        sbx.pty.send_stdin(term.pid, b"stty size; exit 5\n")
        read_until(b"logout")
        with pytest.raises(CommandExitException) as ended:
            term.wait()
        assert ended.value.exit_code == 5
        text = seen.decode(errors="replace")
        assert "24 80" in text and "40 120" in text, text
        assert "/dev/pts/" in text, text
        # A second terminal, killed: its end is the SDK's killed command.
        other = sbx.pty.create(PtySize(rows=10, cols=10))
        assert sbx.pty.kill(other.pid)
        with pytest.raises(CommandExitException) as killed:
            other.wait()
        assert killed.value.exit_code == -1
        # Terminal input is refused to a command without a terminal, and stdin to a terminal.
        plain = sbx.commands.run("sleep 30", background=True)
        with pytest.raises(SandboxException):
            sbx.pty.send_stdin(plain.pid, b"x")
        plain.kill()
    finally:
        sbx.kill()


def test_a_killed_sandbox_takes_its_processes_with_it_at_once(built):
    import subprocess

    marker = f"marker{uuid.uuid4().hex[:10]}"
    sbx = Sandbox.create(built["name"], **built["opts"])
    # A foreground command first: its 60 s lifetime timer must not keep the sandbox alive.
    sbx.commands.run("true")
    sbx.commands.run(f"exec -a {marker} sleep 600", background=True, timeout=0)
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0
    sbx.kill()
    deadline = time.time() + 5
    while subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0:
        assert time.time() < deadline, "the killed sandbox's process outlived it by 5 s"
        time.sleep(0.1)


def test_the_agent_acts_inside_the_sandbox_even_for_a_hostile_root(built, strata, tmp_path):
    """A tenant's root tries to reach the host through the file API: a symlink to a host path,
    a path climbing out, the kernel's tunables, a FIFO that would hang a reader."""
    host_secret = tmp_path / "host-secret.txt"
    host_secret.write_text("the host's own file")
    sbx = Sandbox.create(built["name"], **built["opts"])
    try:
        root = {"user": "root"}
        sbx.commands.run(f"ln -s {host_secret} /home/user/escape; mkfifo /home/user/fifo", **root)
        # The link resolves in the sandbox's root, where that path does not exist.
        with pytest.raises(NotFoundException):
            sbx.files.read("/home/user/escape", **root)
        with pytest.raises(NotFoundException):
            sbx.files.read("../../.." + str(host_secret), **root)
        # Writing through the link replaces the link inside the sandbox, never the host's file.
        sbx.files.write("/home/user/escape", "overwritten", **root)
        assert host_secret.read_text() == "the host's own file"
        assert sbx.files.read("/home/user/escape", **root) == "overwritten"
        # The kernel's tunables stay read-only to the sandbox's root.
        with pytest.raises(SandboxException):
            sbx.files.write("/proc/sys/kernel/hostname", "pwned", **root)
        # A FIFO is refused, not read forever.
        with pytest.raises(InvalidArgumentException):
            sbx.files.read("/home/user/fifo", **root)
        # An unknown user is refused before anything is touched.
        from e2b.exceptions import AuthenticationException

        with pytest.raises(AuthenticationException):
            sbx.files.read("/etc/passwd", user="nobody-here")
        # A method the agent does not serve says so, as Connect's unimplemented.
        import urllib.request

        token = sbx.connection_config.sandbox_headers["X-Access-Token"]
        req = urllib.request.Request(
            strata.url + "/filesystem.Filesystem/NoSuchMethod",
            data=b"{}",
            headers={"content-type": "application/json", "e2b-sandbox-id": sbx.sandbox_id, "x-access-token": token},
        )
        with pytest.raises(urllib.error.HTTPError) as unserved:
            urllib.request.urlopen(req, timeout=10)
        assert unserved.value.code == 501
        assert "not served" in unserved.value.read().decode()
    finally:
        sbx.kill()


def test_the_older_create_route_answers_as_the_v2_one(built, strata):
    import json
    import urllib.request

    req = urllib.request.Request(
        strata.url + "/sandboxes",
        data=json.dumps({"templateID": built["name"]}).encode(),
        headers={"content-type": "application/json", "x-api-key": built["opts"]["api_key"]},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 201
        created = json.load(r)
    assert created["domain"] and created["envdAccessToken"], created
    again = Sandbox.connect(created["sandboxID"], **built["opts"])
    assert again.commands.run("echo v1").stdout == "v1\n"
    assert Sandbox.kill(created["sandboxID"], **built["opts"]) is True


def test_a_template_whose_ready_command_talks_a_lot_still_launches(strata):
    """The ready command's output is capped in what the node keeps, and the rest is read away:
    a command printing past the cap must not stall the sandbox's start on a full pipe."""
    o = opts(strata, f"chatty{uuid.uuid4().hex[:6]}")
    name = f"chatty-{uuid.uuid4().hex[:6]}"
    template = Template().from_image("busybox").set_start_cmd(
        "echo started > /tmp/started; sleep 1000", "head -c 1000000 /dev/zero; test -e /tmp/started"
    )
    Template.build(template, name, api_key=o["api_key"], api_url=o["api_url"])
    started = time.time()
    sbx = Sandbox.create(name, **o)
    try:
        assert time.time() - started < 20
        assert sbx.commands.run("cat /tmp/started").stdout == "started\n"
    finally:
        sbx.kill()


@pytest.fixture(scope="module")
def pausable(strata, tmp_path_factory):
    """A template whose start command leaves a trace each time it runs."""
    team = f"pause{uuid.uuid4().hex[:8]}"
    o = opts(strata, team)
    ctx = tmp_path_factory.mktemp("pausectx")
    (ctx / "app.txt").write_text("copied\n")
    name = f"pausable-{uuid.uuid4().hex[:6]}"
    template = (
        Template(file_context_path=str(ctx))
        .from_image("e2bdev/base")
        .copy("app.txt", "/home/user/app.txt")
        .set_start_cmd("echo started >> /home/user/starts; sleep infinity", "test -s /home/user/starts")
    )
    Template.build(template, name, api_key=o["api_key"], api_url=o["api_url"])
    return {"opts": o, "name": name}


def test_pause_keeps_the_files_and_connect_resumes_with_the_start_command_run_again(pausable, strata):
    import urllib.request

    from e2b.sandbox.sandbox_api import SandboxQuery, SandboxState

    o = pausable["opts"]
    marker = uuid.uuid4().hex[:8]
    sbx = Sandbox.create(pausable["name"], timeout=120, metadata={"run": marker}, **o)
    try:
        # The template's own finalization ran the start command once before its snapshot.
        starts = int(sbx.commands.run("wc -l < /home/user/starts").stdout)
        sbx.files.write("/home/user/notes/kept.txt", "written before the pause")
        sbx.commands.run("echo in tmp > /tmp/kept; rm /home/user/app.txt")
        background = sbx.commands.run("sleep 600", background=True)

        assert sbx.pause() is True
        assert sbx.pause() is False, "a second pause answers 409: already paused"
        info = Sandbox.get_info(sbx.sandbox_id, **o)
        assert info.state == SandboxState.PAUSED
        assert not sbx.is_running(), "a paused sandbox's agent answers nothing"
        paused = Sandbox.list(
            query=SandboxQuery(metadata={"run": marker}, state=[SandboxState.PAUSED]), **o
        ).next_items()
        assert [s.sandbox_id for s in paused] == [sbx.sandbox_id]
        running = Sandbox.list(
            query=SandboxQuery(metadata={"run": marker}, state=[SandboxState.RUNNING]), **o
        ).next_items()
        assert running == []
        with urllib.request.urlopen(strata.url + "/metrics", timeout=10) as r:
            gauge = [l for l in r.read().decode().splitlines() if l.startswith('strata_sandboxes{state="paused"}')]
        assert gauge and float(gauge[0].split()[-1]) >= 1, gauge
        # Memory is not kept, and strata says so instead of pretending.
        with pytest.raises(SandboxException) as refused:
            sbx.pause(mode="full")
        assert "filesystem" in str(refused.value)

        resumed = Sandbox.connect(sbx.sandbox_id, timeout=120, **o)
        assert Sandbox.get_info(sbx.sandbox_id, **o).state == SandboxState.RUNNING
        assert resumed.files.read("/home/user/notes/kept.txt") == "written before the pause"
        assert resumed.commands.run("cat /tmp/kept").stdout == "in tmp\n"
        assert not resumed.files.exists("/home/user/app.txt"), "a deletion is kept too"
        # The start command ran again; the processes of before did not survive.
        assert int(resumed.commands.run("wc -l < /home/user/starts").stdout) == starts + 1
        assert background.pid not in [p.pid for p in resumed.commands.list()]
        assert resumed.commands.run("pgrep -x sleep | wc -l").stdout.strip() == "1"

        # A second cycle stacks on the first.
        resumed.files.write("/home/user/notes/second.txt", "second")
        assert resumed.pause() is True
        again = Sandbox.connect(sbx.sandbox_id, **o)
        out = again.commands.run("cat /home/user/notes/kept.txt /home/user/notes/second.txt").stdout
        assert out == "written before the pausesecond"
        assert int(again.commands.run("wc -l < /home/user/starts").stdout) == starts + 2
        history = strata.cli("history", f"sandbox-{sbx.sandbox_id}").stdout
        for event in ("SandboxPausing.v1", "SandboxPaused.v1", "SandboxResumed.v1"):
            assert history.count(event) == 2, history
        assert history.count("SandboxPlaced.v1") == 3, "every resume is a new placement"
    finally:
        sbx.kill()
    assert Sandbox.kill(sbx.sandbox_id, **o) is False


def test_a_paused_sandbox_is_killed_and_auto_pause_pauses_at_the_timeout(pausable):
    o = pausable["opts"]
    sbx = Sandbox.create(pausable["name"], **o)
    sbx.files.write("/home/user/x", "x")
    assert sbx.pause() is True
    assert Sandbox.kill(sbx.sandbox_id, **o) is True, "a paused sandbox is killed"
    with pytest.raises(SandboxException):
        Sandbox.connect(sbx.sandbox_id, **o)

    from e2b.sandbox.sandbox_api import SandboxState

    auto = Sandbox.create(pausable["name"], timeout=2, lifecycle={"on_timeout": "pause"}, **o)
    try:
        auto.files.write("/home/user/auto.txt", "kept through the timeout")
        deadline = time.time() + 30
        while Sandbox.get_info(auto.sandbox_id, **o).state != SandboxState.PAUSED:
            assert time.time() < deadline, "an auto-pause sandbox did not pause at its timeout"
            time.sleep(0.3)
        assert Sandbox.get_info(auto.sandbox_id, **o).lifecycle["on_timeout"] == "pause"
        back = Sandbox.connect(auto.sandbox_id, timeout=60, **o)
        assert back.files.read("/home/user/auto.txt") == "kept through the timeout"
    finally:
        auto.kill()

    # What strata cannot keep is refused at create, naming what it can do.
    with pytest.raises(SandboxException) as memory:
        Sandbox.create(pausable["name"], lifecycle={"on_timeout": {"action": "pause", "mode": "full"}}, **o)
    assert "filesystem" in str(memory.value)
    with pytest.raises(SandboxException) as resume:
        Sandbox.create(pausable["name"], lifecycle={"on_timeout": "pause", "auto_resume": True}, **o)
    assert "Sandbox.connect" in str(resume.value)


def _events_until(watch, wanted, limit=10):
    """The watch's events until every (name, type) in `wanted` came, polling as SDK users do."""
    seen = []
    deadline = time.time() + limit
    while not set(wanted) <= {(e.name, e.type) for e in seen}:
        assert time.time() < deadline, f"{wanted} not all seen in {seen}"
        seen.extend(watch.get_new_events())
        time.sleep(0.05)
    return seen


def test_directory_watches_report_changes_as_the_user_sees_them(built):
    import asyncio

    from e2b import AsyncSandbox
    from e2b.sandbox.filesystem.watch_handle import FilesystemEventType as T

    sbx = Sandbox.create(built["name"], **built["opts"])
    procs = "ls -d /proc/[0-9]* | wc -l"
    try:
        idle = int(sbx.commands.run(procs).stdout)
        sbx.files.make_dir("/home/user/watched/deep")
        watch = sbx.files.watch_dir("/home/user/watched")
        sbx.files.write("/home/user/watched/new.txt", "x")
        sbx.commands.run("cd /home/user/watched && mv new.txt moved.txt && chmod 600 moved.txt && rm moved.txt")
        sbx.files.write("/home/user/watched/deep/below.txt", "not reported: the watch is not recursive")
        seen = _events_until(
            watch,
            [("new.txt", T.CREATE), ("new.txt", T.RENAME), ("moved.txt", T.CREATE),
             ("moved.txt", T.CHMOD), ("moved.txt", T.REMOVE)],
        )
        assert not [e for e in seen if "below" in e.name], seen
        assert watch.get_new_events() == [], "events are drained by each call"
        assert int(sbx.commands.run(procs).stdout) > idle, "the watch runs in the sandbox"
        watch.stop()
        deadline = time.time() + 5
        while int(sbx.commands.run(procs).stdout) != idle:
            assert time.time() < deadline, "a stopped watch's agent is still running"
            time.sleep(0.1)

        deep = sbx.files.watch_dir("/home/user/watched", recursive=True)
        sbx.commands.run("mkdir -p /home/user/watched/made && echo y > /home/user/watched/made/in.txt")
        sbx.commands.run("echo now reported >> /home/user/watched/deep/below.txt")
        # files.write replaces a file whole (a cut-off upload leaves the old one): it is created.
        sbx.files.write("/home/user/watched/deep/replaced.txt", "whole")
        _events_until(
            deep,
            [("made", T.CREATE), ("made/in.txt", T.CREATE), ("deep/below.txt", T.WRITE),
             ("deep/replaced.txt", T.CREATE)],
        )
        assert int(sbx.commands.run(procs).stdout) > idle, "the recursive watch runs"
        deep.stop()
        deadline = time.time() + 5
        while int(sbx.commands.run(procs).stdout) != idle:
            assert time.time() < deadline, "a stopped watch's agent is still running"
            time.sleep(0.1)

        # A missing directory, a file, and a directory the user cannot read are refused.
        from e2b.exceptions import NotFoundException

        with pytest.raises(NotFoundException):
            sbx.files.watch_dir("/home/user/nope")
        with pytest.raises(InvalidArgumentException):
            sbx.files.watch_dir("/home/user/app.txt")
        with pytest.raises(SandboxException):
            sbx.files.watch_dir("/root")

        # The async SDK's streamed watch.
        async def streamed():
            asbx = await AsyncSandbox.connect(sbx.sandbox_id, **built["opts"])
            got = asyncio.Queue()
            handle = await asbx.files.watch_dir("/home/user/watched", on_event=got.put_nowait, recursive=True)
            await asbx.files.write("/home/user/watched/deep/streamed.txt", "s")
            names = set()
            while "deep/streamed.txt" not in names:
                names.add((await asyncio.wait_for(got.get(), 10)).name)
            await handle.stop()

        asyncio.run(streamed())
        # Closing the stream, through the API's forward, ends its agent too.
        deadline = time.time() + 5
        while int(sbx.commands.run(procs).stdout) != idle:
            assert time.time() < deadline, "a closed stream's watch agent is still running"
            time.sleep(0.1)
    finally:
        sbx.kill()
