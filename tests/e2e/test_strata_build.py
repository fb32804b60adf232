"""`strata build`: a Dockerfile and its context, built over the HTTP API of a running strata.

Each built result is checked inside a sandbox booted on the template (`strata template exec`);
refusals are checked to happen before anything reaches the server.
"""

import json
import os
import re
import subprocess
import textwrap
import urllib.error
import urllib.request

from conftest import BIN


def build(strata, key, *args, cwd=None):
    env = {**strata.env, "E2B_API_KEY": key, "STRATA_URL": strata.url}
    return subprocess.run(
        [BIN, "build", *args],
        env=env,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


def exec_in(strata, team_name, template, script):
    out = strata.cli("template", "exec", "--team", team_name, template, "--", "/bin/sh", "-c", script, check=False)
    assert out.returncode == 0, f"exec failed ({out.returncode}): {out.stderr}"
    return out.stdout


def alias_exists(strata, key, name):
    req = urllib.request.Request(f"{strata.url}/templates/aliases/{name}", headers={"X-API-Key": key})
    try:
        with urllib.request.urlopen(req, timeout=10):
            return True
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return False
        raise


def write(root, files):
    for path, text in files.items():
        p = root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n") if path == "Dockerfile" else text)


DOCKERFILE = r"""
# syntax=docker/dockerfile:1
ARG BASE=busybox
FROM ${BASE} AS final
ARG GREETING=hello
ARG WHO
ENV APP_HOME=/opt/app \
    MESSAGE="${GREETING}, ${WHO:-nobody}"
WORKDIR $APP_HOME
COPY app/ ./
COPY --chmod=755 tools/run.sh /usr/local/bin/run-app
RUN echo "arg=$GREETING env=$MESSAGE" > build-info.txt
RUN <<EOF
set -e
mkdir -p /opt/heredoc
echo "from a heredoc" > /opt/heredoc/out.txt
EOF
COPY <<EOF /etc/app.conf
greeting=${GREETING}
EOF
LABEL org.example.team=builders
EXPOSE 8080
CMD ["run-app"]
"""


def test_a_dockerfile_builds_with_args_env_ignores_and_heredocs(strata, team, tmp_path):
    team_name, opts = team
    ctx = tmp_path / "ctx"
    write(ctx, {
        "Dockerfile": DOCKERFILE,
        ".dockerignore": "app/*.log\n!app/keep.log\nsecret/\n",
        "app/main.txt": "main\n",
        "app/debug.log": "noise\n",
        "app/keep.log": "kept\n",
        "secret/token": "do-not-ship\n",
        "tools/run.sh": "#!/bin/sh\necho running\n",
    })
    out = build(strata, opts["api_key"], "-t", "dockerfile-app:v1", "--build-arg", "WHO=world", str(ctx))
    assert out.returncode == 0, out.stdout + out.stderr
    # Progress names the Dockerfile's own instructions, with the server's step numbers.
    assert "RUN echo \"arg=$GREETING env=$MESSAGE\" > build-info.txt" in out.stdout, out.stdout
    assert "] RUN <<EOF\n" in out.stdout, out.stdout
    assert "EXPOSE 8080 (line 21) is recorded, not applied" in out.stdout, out.stdout
    assert "built dockerfile-app:v1" in out.stdout
    # Each executed step ends with its duration on the server's clock, right after its output.
    run_header = next(i for i, l in enumerate(out.stdout.splitlines())
                      if l.endswith("] RUN echo \"arg=$GREETING env=$MESSAGE\" > build-info.txt"))
    step = out.stdout.splitlines()[run_header].split("]")[0] + "]"
    assert re.search(re.escape(step) + r" DONE \d+\.\d\d s\n", out.stdout), out.stdout

    got = exec_in(strata, team_name, "dockerfile-app:v1", """
        cat /opt/app/build-info.txt
        ls -a /opt/app | tr '\\n' ' '; echo
        stat -c '%a %U' /usr/local/bin/run-app /opt/app/main.txt
        cat /opt/heredoc/out.txt /etc/app.conf
        stat -c '%a %U' /etc/app.conf
        echo "MESSAGE=$MESSAGE GREETING=${GREETING-unset}"
        test ! -e /opt/app/secret
    """)
    lines = got.splitlines()
    assert lines[0] == "arg=hello env=hello, world"
    assert lines[1].split() == [".", "..", "build-info.txt", "keep.log", "main.txt"]
    assert lines[2:4] == ["755 root", "644 root"]
    assert lines[4:6] == ["from a heredoc", "greeting=hello"]
    assert lines[6] == "644 root"
    # The RUN above saw both; a sandbox's commands see neither: on E2B, and so in strata, ENV is
    # build-time only (ADR 0029), and an ARG never outlives its stage's RUNs.
    assert lines[7] == "MESSAGE= GREETING=unset"

    # Unchanged: every step is a cache hit and nothing is uploaded again.
    again = build(strata, opts["api_key"], "-t", "dockerfile-app:v1", "--build-arg", "WHO=world", str(ctx))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "uploading" not in again.stdout, again.stdout
    assert "CACHED RUN echo \"arg=$GREETING env=$MESSAGE\" > build-info.txt" in again.stdout, again.stdout
    assert not re.search(re.escape(step) + " DONE", again.stdout), again.stdout

    # --quiet prints only the template id, which the name resolves to.
    quiet = build(strata, opts["api_key"], "-t", "dockerfile-app:v1", "--progress", "quiet",
                  "--build-arg", "WHO=world", str(ctx))
    assert quiet.returncode == 0, quiet.stderr
    req = urllib.request.Request(f"{strata.url}/templates/aliases/dockerfile-app",
                                 headers={"X-API-Key": opts["api_key"]})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert quiet.stdout.strip() == json.load(r)["templateID"]


def test_a_target_stage_builds_alone(strata, team, tmp_path):
    team_name, opts = team
    ctx = tmp_path / "ctx"
    write(ctx, {"Dockerfile": """
        FROM busybox AS tools
        RUN echo tools > /stage
        FROM busybox AS app
        RUN echo app > /stage
    """})
    out = build(strata, opts["api_key"], "-t", "staged", "--target", "tools", str(ctx))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "stage app (line 3) is not needed for the target" in out.stderr
    assert exec_in(strata, team_name, "staged", "cat /stage") == "tools\n"


MULTI_STAGE = """
FROM busybox AS build
WORKDIR /src
COPY main.sh .
RUN mkdir -p /out/bin && sed 's/VERSION/1.2/' main.sh > /out/bin/app && chmod 755 /out/bin/app

FROM busybox AS docs
RUN mkdir -p /out/doc && echo manual > /out/doc/README

FROM build AS test
RUN /out/bin/app | grep -q 1.2 && echo tested > /tested

FROM busybox
COPY --from=build /out/bin/app /usr/local/bin/app
COPY --from=docs /out/doc /usr/share/doc/app/
COPY --from=docs --chown=1000:1000 /out/doc /opt/docs
RUN app > /built-with.txt
"""


def test_a_multi_stage_build_copies_between_stages_on_the_server(strata, team, tmp_path):
    team_name, opts = team
    ctx = tmp_path / "ctx"
    write(ctx, {"Dockerfile": MULTI_STAGE, "main.sh": "#!/bin/sh\necho app VERSION\n"})
    out = build(strata, opts["api_key"], "-t", "multi", str(ctx))
    assert out.returncode == 0, out.stdout + out.stderr
    # The stages the target copies from are built as templates of their own, each line labelled.
    assert "[build] building multi.stage-build" in out.stdout, out.stdout
    assert "[docs] building multi.stage-docs" in out.stdout, out.stdout
    assert "stage test (line 9) is not needed" in out.stderr, out.stderr
    assert "COPY --from=build /out/bin/app /usr/local/bin/app" in out.stdout, out.stdout
    got = exec_in(strata, team_name, "multi", "app; cat /usr/share/doc/app/README /built-with.txt; "
                  "test ! -e /src && echo no-build-tree")
    assert got == "app 1.2\nmanual\napp 1.2\nno-build-tree\n", got
    # --chown gives a directory's new destination to the owner too, as Docker does.
    owners = exec_in(strata, team_name, "multi", "stat -c %u:%g /opt/docs /opt/docs/README")
    assert owners == "1000:1000\n1000:1000\n", owners

    # --target builds a stage on another (FROM build) and leaves the rest.
    out = build(strata, opts["api_key"], "-t", "multi-test", "--target", "test", str(ctx))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[build] building multi-test.stage-build" in out.stdout, out.stdout
    assert "from multi-test.stage-build" in out.stdout, out.stdout
    assert exec_in(strata, team_name, "multi-test", "cat /tested; ls /out/bin") == "tested\napp\n"

    # Unchanged: every stage is served from the cache.
    again = build(strata, opts["api_key"], "-t", "multi", str(ctx))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "CACHED COPY --from=build /out/bin/app /usr/local/bin/app" in again.stdout, again.stdout


def test_a_dockerfiles_own_dockerignore_takes_the_place_of_the_contexts(strata, team, tmp_path):
    team_name, opts = team
    ctx = tmp_path / "ctx"
    write(ctx, {
        "Dockerfile": "FROM busybox\nCOPY . /ctx/\n",
        "other.Dockerfile": "FROM busybox\nCOPY . /ctx/\n",
        "Dockerfile.dockerignore": "b.txt\n*.Dockerfile\n",
        ".dockerignore": "a.txt\n",
        "a.txt": "a\n",
        "b.txt": "b\n",
    })
    listing = "ls -A /ctx | tr '\\n' ' '"
    out = build(strata, opts["api_key"], "-t", "own-ignore", str(ctx))
    assert out.returncode == 0, out.stdout + out.stderr
    assert exec_in(strata, team_name, "own-ignore", listing).split() == [
        ".dockerignore", "Dockerfile", "Dockerfile.dockerignore", "a.txt"]
    out = build(strata, opts["api_key"], "-t", "context-ignore", "-f", str(ctx / "other.Dockerfile"), str(ctx))
    assert out.returncode == 0, out.stdout + out.stderr
    assert exec_in(strata, team_name, "context-ignore", listing).split() == [
        ".dockerignore", "Dockerfile", "Dockerfile.dockerignore", "b.txt", "other.Dockerfile"]


def test_a_build_piped_into_a_reader_that_goes_away_ends_without_a_panic(strata, team, tmp_path):
    import signal
    _, opts = team
    ctx = tmp_path / "ctx"
    write(ctx, {"Dockerfile": "FROM busybox\n" + "".join(f"RUN echo step {i}\n" for i in range(8))})
    env = {**strata.env, "E2B_API_KEY": opts["api_key"], "STRATA_URL": strata.url}
    proc = subprocess.Popen([BIN, "build", "-t", "piped", str(ctx)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"building piped")
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGPIPE, (proc.returncode, err.decode())
    assert b"panicked" not in err, err.decode()


def wheel(root, name, version, module_source):
    """A pure-Python wheel, written by hand as pip reads one (a zip with dist-info and RECORD)."""
    import base64
    import hashlib
    import zipfile
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": module_source,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: strata-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join(record + [f"{dist}/RECORD,,"]) + "\n"
    path = root / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, text)
    return path


def test_a_python_app_installs_its_requirements_once_and_rebuilds_only_its_code(strata, team, outside, tmp_path):
    """The everyday Dockerfile: requirements first, code after. The package index is the tests'
    own (a simple index in the outside world); changing the code reruns only the last COPY."""
    import hashlib
    team_name, opts = team
    index = tmp_path / "index"
    (index / "simple" / "strata-greeting").mkdir(parents=True)
    whl = wheel(index, "strata_greeting", "1.0", "def greet(who):\n    return f'hello, {who}'\n")
    sha = hashlib.sha256(whl.read_bytes()).hexdigest()
    (index / "simple" / "strata-greeting" / "index.html").write_text(
        f'<html><body><a href="../../{whl.name}#sha256={sha}">{whl.name}</a></body></html>\n')
    port = 8081
    server = outside.popen(["python3", "-m", "http.server", "--bind", outside.ip, "--directory", str(index), str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    outside.wait_for(port, server)

    ctx = tmp_path / "ctx"
    write(ctx, {
        "Dockerfile": f"""
            FROM e2bdev/base
            WORKDIR /app
            COPY requirements.txt .
            RUN python3 -m venv /venv \\
                && /venv/bin/pip install --no-cache-dir --trusted-host {outside.ip} \\
                    --index-url http://{outside.ip}:{port}/simple/ -r requirements.txt
            COPY app.py .
        """,
        "requirements.txt": "strata-greeting==1.0\n",
        "app.py": "from strata_greeting import greet\nprint(greet('strata'))\n",
    })
    out = build(strata, opts["api_key"], "-t", "pyapp", str(ctx))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Successfully installed strata-greeting-1.0" in out.stdout, out.stdout
    assert exec_in(strata, team_name, "pyapp", "/venv/bin/python /app/app.py") == "hello, strata\n"

    (ctx / "app.py").write_text("from strata_greeting import greet\nprint(greet('again'))\n")
    again = build(strata, opts["api_key"], "-t", "pyapp", str(ctx))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "] CACHED RUN python3 -m venv /venv" in again.stdout, again.stdout
    assert "Successfully installed" not in again.stdout, again.stdout
    assert "uploading app.py" in again.stdout and "uploading requirements.txt" not in again.stdout, again.stdout
    assert exec_in(strata, team_name, "pyapp", "/venv/bin/python /app/app.py") == "hello, again\n"


def test_unsupported_instructions_are_refused_before_anything_is_sent(strata, team, tmp_path):
    _, opts = team
    ctx = tmp_path / "ctx"
    write(ctx, {"Dockerfile": """
        FROM busybox
        RUN true
        SHELL ["/bin/ash", "-c"]
    """})
    out = build(strata, opts["api_key"], "-t", "refused", str(ctx))
    assert out.returncode != 0
    assert "line 3: SHELL is not supported" in out.stderr, out.stderr
    assert not alias_exists(strata, opts["api_key"], "refused")

    # A COPY of nothing is refused the same way, naming its line and the SDK's words.
    write(ctx, {"Dockerfile": "FROM busybox\nCOPY missing/ /x/\n"})
    out = build(strata, opts["api_key"], "-t", "refused", str(ctx))
    assert out.returncode != 0
    assert "Dockerfile line 2" in out.stderr and "No files found" in out.stderr, out.stderr
    assert not alias_exists(strata, opts["api_key"], "refused")


def test_a_failing_run_reports_its_line_and_exit_code(strata, team, tmp_path):
    _, opts = team
    ctx = tmp_path / "ctx"
    write(ctx, {"Dockerfile": """
        FROM busybox
        RUN echo fine
        RUN echo about to fail && exit 7
        RUN echo never
    """})
    dockerfile = ctx / "Dockerfile"
    out = build(strata, opts["api_key"], "-t", "failing", "-f", str(dockerfile), str(ctx))
    assert out.returncode != 0
    assert f"{dockerfile}:3: RUN echo about to fail && exit 7 failed" in out.stderr, out.stderr
    assert "exit code 7" in out.stderr, out.stderr
    assert "about to fail" in out.stdout


def test_bad_credentials_and_servers_say_what_failed(strata, tmp_path):
    ctx = tmp_path / "ctx"
    write(ctx, {"Dockerfile": "FROM busybox\n"})
    out = build(strata, "e2b_not_a_key", "-t", "x", str(ctx))
    assert out.returncode != 0
    assert "registering the build: 401" in out.stderr, out.stderr
    env = {**strata.env, "E2B_API_KEY": "k", "STRATA_URL": "http://127.0.0.1:9"}
    out = subprocess.run([BIN, "build", str(ctx)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "cannot reach http://127.0.0.1:9" in out.stderr, out.stderr
