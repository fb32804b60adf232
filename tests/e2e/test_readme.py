"""Every example in README.md runs, as written, against the session's `strata up`.

The fenced `sh` and `python` blocks are read from README.md and run in order, sharing what a
reader would carry from one to the next (the API key, the template, its build ID). The test
knows each block by its first line and names, line by line, how each command is run:

* `run`: as written, in bash, with `strata` on PATH and the session's data directory;
* `help`: a benchmark, run with `--help` appended, which checks that every flag the README
  gives is accepted without starting the benchmark;
* `serve`: a process meant to run until stopped, which must still be running after 3 s;
* `syntax`: a script of this repository that sets up or tests the whole machine, checked to
  exist, be executable and parse (`bash -n`).

A block or a line the test does not know fails it, so a new example needs its entry here.
The README's placeholders (`<build id>`, `NAME`, `TEAM`, the key `e2b_...`, the default
address) are replaced by this session's values.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request

from conftest import BIN

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
ROOT = README.parent

# First line of each block -> (language, how each non-empty command line runs, or "python").
BLOCKS = {
    "./scripts/up.sh": ("sh", ["syntax", "syntax"]),
    "strata keys create --team acme": ("sh", ["run", "run"]),
    "from e2b import Template": ("python", "python"),
    "from e2b import Sandbox": ("python", "python"),
    "strata template exec --team acme my-template -- cat /home/user/out.txt": ("sh", ["run", "run", "run"]),
    "cd examples/hello && strata build -t hello .": ("sh", ["run", "run"]),
    "strata history build-<id>": ("sh", ["run", "run", "run", "run", "run", "help"]),
    "strata image build-base": ("sh", ["run", "run", "run", "run", "help"]),
    "strata template export NAME[:TAG] ./out --team TEAM": ("sh", ["run", "run"]),
    "strata reconcile --only attempt-expiry --only promotion --schedule '*/2 * * * * *'": ("sh", ["serve", "help"]),
    "strata bench upload": ("sh", ["help"] * 12),
    "strata settings pin --team acme cache.mode=final": ("sh", ["run"] * 4),
    # Several processes sharing one Postgres and one bucket: run as written by
    # tests/integration/multi_node.rs against a local S3-protocol server.
    "export DATABASE_URL=postgres://strata:secret@127.0.0.1:5432/strata": ("sh", ["multi_node"] * 14),
    # Pulling from a public registry needs the network: `--help` here; the pull itself runs
    # against loopback registries in tests/integration/registry_pull.rs and tests/e2e/test_sdk_registry.py.
    "strata image pull debian:stable": ("sh", ["help", "help", "help"]),
    # Starting a second `strata up` would take the session's port: `--help` for the first line.
    "STRATA_SANDBOX_EGRESS_ALLOW=10.1.2.3:3142 strata up": ("sh", ["help", "run"]),
    # The same: `--help` for `strata up`; the disk example runs as written.
    "STRATA_BUILD_DISK_MAX=1GiB strata up": ("sh", ["help", "run"]),
    # Needs a failed build and the admin token: run as written by tests/integration/ops_readme.rs.
    "strata why build $BUILD_ID": ("sh", ["ops_readme"] * 5),
    # Needs objects a pass may delete in a node directory of its own: run as written by
    # tests/integration/gc.rs.
    "strata storage": ("sh", ["gc_readme"] * 4),
}


def fenced_blocks(text):
    """(language, body) of every fenced block, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


def command(line):
    """A line without its trailing `# comment` (none of the README's commands quotes a #)."""
    return re.sub(r"\s+#.*$", "", line).strip()


class Reader:
    """What a reader carries from block to block."""

    def __init__(self, strata, tmp):
        self.strata = strata
        self.tmp = tmp
        bindir = tmp / "bin"
        bindir.mkdir()
        (bindir / "strata").symlink_to(os.path.abspath(BIN))
        self.env = {**strata.env, "PATH": f"{bindir}:{os.environ['PATH']}", "RUST_LOG": "error"}
        self.sdk_env = {}
        self.build_id = None
        self.outputs = []

    def fill(self, text):
        subs = {
            "http://127.0.0.1:3000": self.strata.url,
            "e2b_...": self.sdk_env.get("E2B_API_KEY", "e2b_..."),
            "<build id>": self.build_id or "<build id>",
            "<id>": self.build_id or "<id>",
            "NAME[:TAG]": "my-template",
            "--name NAME": "--name my-template-copy",
            "TEAM": "acme",
        }
        for placeholder, value in subs.items():
            text = text.replace(placeholder, value)
        return text

    def sh(self, script, cwd, **kw):
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=cwd, env={**self.env, **self.sdk_env}, capture_output=True, text=True, **kw,
        )


def run_line(reader, line, mode, cwd):
    cmd = reader.fill(command(line))
    if mode == "syntax":
        script = ROOT / cmd.split()[0]
        assert script.is_file() and os.access(script, os.X_OK), f"{script} is not an executable file"
        check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, f"{script}: {check.stderr}"
        return
    if mode == "help":
        out = reader.sh(f"{cmd} --help", cwd)
        assert out.returncode == 0 and "Usage:" in out.stdout, f"`{cmd} --help`: {out.stderr}"
        return
    if mode == "serve":
        out = reader.sh(f"timeout 3 {cmd}", cwd)
        assert out.returncode == 124, f"`{cmd}` exited {out.returncode} within 3 s: {out.stderr}"
        return
    if mode == "ops_readme":
        runner = (ROOT / "tests" / "integration" / "ops_readme.rs").read_text()
        assert "## Operators" in README.read_text() and "Operators" in runner, (
            "the Operators examples are run by tests/integration/ops_readme.rs"
        )
        return
    if mode == "gc_readme":
        runner = (ROOT / "tests" / "integration" / "gc.rs").read_text()
        assert "## Storage and garbage collection" in README.read_text() and (
            "Storage and garbage collection" in runner
        ), "the storage examples are run by tests/integration/gc.rs"
        return
    if mode == "multi_node":
        runner = (ROOT / "tests" / "integration" / "multi_node.rs").read_text()
        assert "## Past one machine" in README.read_text() and "Past one machine" in runner, (
            "the process-layout example is run by tests/integration/multi_node.rs"
        )
        return
    assert mode == "run", mode
    out = reader.sh(cmd, cwd, timeout=900)
    assert out.returncode == 0, f"`{cmd}` failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    reader.outputs.append((cmd, out.stdout))
    return out.stdout


def run_python(reader, body, cwd):
    (cwd / "app").mkdir()
    (cwd / "app" / "hello.txt").write_text("hi\n")
    script = cwd / "example.py"
    script.write_text(reader.fill(body))
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd, env={**reader.env, **reader.sdk_env}, capture_output=True, text=True, timeout=900,
    )
    assert out.returncode == 0, f"the Python example failed:\n{out.stdout}\n{out.stderr}"
    if body.startswith("from e2b import Sandbox"):
        # The template the first example built, then the file written into the sandbox.
        assert out.stdout == "hello\nhello.txt\nwritten from outside\n", out.stdout
    req = urllib.request.Request(
        f"{reader.strata.url}/templates", headers={"X-API-KEY": reader.sdk_env["E2B_API_KEY"]}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        (template,) = [t for t in json.load(r) if t["names"] == ["my-template"]]
    reader.build_id = template["buildID"]


def prepare(reader, first, cwd):
    """What a block expects to find in the reader's directory."""
    if first.startswith("cd examples/hello"):
        shutil.copytree(ROOT / "examples", cwd / "examples")
    if first == "strata image build-base":
        # `./image.tar`: an image archive, here the example template as an OCI layout tar.
        layout = cwd / "layout"
        run_line(reader, f"strata template export --team acme my-template {layout}", "run", cwd)
        with tarfile.open(cwd / "image.tar", "w") as tar:
            for entry in layout.iterdir():
                tar.add(entry, arcname=entry.name)


def check_results(reader, first):
    """What a block's commands must have shown."""
    if first == "strata keys create --team acme":
        assert reader.sdk_env["E2B_API_KEY"].startswith("e2b_"), reader.sdk_env
    if first.startswith("strata template exec"):
        out = reader.outputs[-3][1]
        assert out == "hello\nhello.txt\n", out
        # The example's comment on owners.
        owners = run_line(
            reader,
            "strata template exec --team acme my-template -- stat -c '%U %n' /opt/app /opt/app/hello.txt",
            "run",
            reader.tmp,
        )
        assert owners == "root /opt/app\nuser /opt/app/hello.txt\n", owners
    if first.startswith("cd examples/hello"):
        built, ran = reader.outputs[-2][1], reader.outputs[-1][1]
        assert "built hello" in built, built
        assert ran == "hello from a Dockerfile, built with hello\n", ran
    if first == "STRATA_BUILD_DISK_MAX=1GiB strata up":
        # `df -h /` in the sandbox: the overlay reports its upper's filesystem, the 64 MiB disk.
        size = reader.outputs[-1][1].splitlines()[-1].split()[1]
        assert size.endswith("M") and 40 <= float(size[:-1]) <= 64, reader.outputs[-1][1]
    if first == "strata image build-base":
        listing = reader.outputs[-1][1]
        assert "myimage" in listing and "e2bdev/base" in listing, listing


def test_every_readme_example_runs(strata, tmp_path):
    blocks = [(lang, body) for lang, body in fenced_blocks(README.read_text()) if lang in ("sh", "python")]
    others = [lang for lang, _ in fenced_blocks(README.read_text()) if lang not in ("sh", "python")]
    assert not others, f"README blocks in languages the test does not run: {others}"
    firsts = [command(body.splitlines()[0]) for _, body in blocks]
    unknown = [f for f in firsts if f not in BLOCKS]
    assert not unknown, f"README examples this test does not know (add them to BLOCKS): {unknown}"
    stale = [f for f in BLOCKS if f not in firsts]
    assert not stale, f"BLOCKS entries no longer in README.md: {stale}"

    reader = Reader(strata, tmp_path)
    for n, (lang, body) in enumerate(blocks):
        first = command(body.splitlines()[0])
        want_lang, modes = BLOCKS[first]
        assert lang == want_lang, f"block {first!r} is {lang}, expected {want_lang}"
        cwd = tmp_path / f"block{n}"
        cwd.mkdir()
        if modes == "python":
            run_python(reader, body, cwd)
            continue
        lines = [line for line in body.splitlines() if command(line)]
        assert len(lines) == len(modes), (
            f"block {first!r} has {len(lines)} commands, the test knows {len(modes)}: {lines}"
        )
        prepare(reader, first, cwd)
        for line, mode in zip(lines, modes):
            if first == "strata keys create --team acme" and line.startswith("export "):
                # The reader exports what the first line printed, for the Python example.
                key = reader.outputs[-1][1].strip()
                reader.sdk_env["E2B_API_KEY"] = key
                out = reader.sh(reader.fill(command(line)) + '; printf "%s\\n%s" "$E2B_API_URL" "$E2B_API_KEY"', cwd)
                assert out.returncode == 0, out.stderr
                url, exported = out.stdout.splitlines()
                reader.sdk_env = {"E2B_API_URL": url, "E2B_API_KEY": exported}
                continue
            run_line(reader, line, mode, cwd)
        check_results(reader, first)
