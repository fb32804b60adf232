"""`strata build` against `docker build` (BuildKit): the same Dockerfile and context on the same
base rootfs give the same file tree (paths, types, modes, owners, contents, link targets), apart
from the differences docs/adr/0029-strata-build.md documents, each listed here with its reason.

The test starts its own Docker daemon (Debian's docker.io, installed by scripts/setup.sh) on a
private socket and data root, with no bridge and no iptables rules, and builds with
`--network=none`: nothing it runs reaches any network. It is skipped only when no daemon can
start on this machine, and says why.
"""

import hashlib
import gzip
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import tarfile
import time

import pytest

from conftest import BIN, NODE_IMAGES
from test_strata_build import build, write

DOCKERD = shutil.which("dockerd")
# Debian's client matches Debian's daemon; another client on PATH may speak a newer API.
DOCKER = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else shutil.which("docker")


class Docker:
    def __init__(self, root: pathlib.Path):
        self.root = root
        self.sock = root / "docker.sock"
        self.env = {**os.environ, "DOCKER_HOST": f"unix://{self.sock}", "DOCKER_BUILDKIT": "1"}
        self.log = open(root / "dockerd.log", "wb")
        self.proc = subprocess.Popen(
            [DOCKERD, "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
             "--pidfile", str(root / "dockerd.pid"), "-H", f"unix://{self.sock}",
             "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-masq=false"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )

    def ready(self, timeout=60) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.sock.exists() and self.run("info", check=False).returncode == 0:
                return True
            time.sleep(0.5)
        return False

    def run(self, *args, check=True, **kw):
        out = subprocess.run([DOCKER, *args], env=self.env, capture_output=True, timeout=600, **kw)
        if check:
            assert out.returncode == 0, f"docker {' '.join(args)}: {out.stderr.decode()}"
        return out

    def why_not(self) -> str:
        self.log.flush()
        text = (self.root / "dockerd.log").read_text(errors="replace").strip().splitlines()
        return "\n".join(text[-5:])

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        subprocess.run(["umount", "-R", str(self.root / "data")], capture_output=True)


@pytest.fixture(scope="module")
def docker(tmp_path_factory):
    if DOCKERD is None or DOCKER is None:
        pytest.skip("no Docker engine is installed (scripts/setup.sh installs Debian's docker.io)")
    daemon = Docker(tmp_path_factory.mktemp("docker"))
    if not daemon.ready():
        reason = daemon.why_not()
        daemon.stop()
        pytest.skip(f"no Docker daemon can start on this machine: {reason}")
    # Docker's busybox is strata's: the very layer strata's catalog boots, imported as an image.
    catalog = json.loads((NODE_IMAGES / "images" / "busybox.json").read_text())
    (layer,) = catalog["layers"]
    blob = NODE_IMAGES / "blobs" / "sha256" / layer["digest"].split(":", 1)[1]
    env = dict(catalog["config"]["env"])
    daemon.run("import", *[a for k, v in env.items() for a in ("--change", f"ENV {k}={v}")],
               str(blob), "busybox:latest")
    yield daemon
    daemon.stop()


# The account files, kept whole: the one documented difference inside them is compared line by line.
ACCOUNTS = ("/etc/passwd", "/etc/group", "/etc/shadow")


def tree_of_layers(layers) -> dict:
    """Applies tar layers (bytes, bottom first) with OCI whiteouts: path -> attributes."""
    tree = {}
    for data in layers:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar.getmembers():
                path = normal(m.name)
                parent, base = os.path.split(path)
                if base == ".wh..wh..opq":
                    for p in [p for p in tree if p.startswith(parent.rstrip("/") + "/")]:
                        del tree[p]
                    continue
                if base.startswith(".wh."):
                    gone = os.path.join(parent, base[4:])
                    for p in [p for p in tree if p == gone or p.startswith(gone + "/")]:
                        del tree[p]
                    continue
                if path in tree and tree[path]["type"] == "dir" and not m.isdir():
                    for p in [p for p in tree if p.startswith(path + "/")]:
                        del tree[p]
                tree[path] = attributes(tar, m)
    return tree


def normal(name: str) -> str:
    """A member name (`./a/b/`, `a/b`, `.`) as an absolute path (`/a/b`, `/`)."""
    name = name[2:] if name.startswith("./") else name
    name = name.strip("/")
    return "/" if name in ("", ".") else "/" + name


def attributes(tar, m) -> dict:
    kind = {tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink"}.get(
        m.type, "file" if m.isreg() else f"type-{m.type!r}")
    out = {"type": kind, "mode": oct(m.mode & 0o7777), "owner": f"{m.uid}:{m.gid}"}
    if m.isreg():
        data = tar.extractfile(m).read()
        out["sha256"] = hashlib.sha256(data).hexdigest()
        if normal(m.name) in ACCOUNTS:
            out["lines"] = data.decode().splitlines()
    if m.issym() or m.islnk():
        out["target"] = m.linkname
    if kind == "hardlink":
        # A hard link is the file it names: compare it as that file.
        out = {"type": "file", "mode": out["mode"], "owner": out["owner"], "link-of": m.linkname}
    return out


def saved_tree(saved: bytes) -> dict:
    """The image of a `docker save` archive: its layers applied bottom first."""
    with tarfile.open(fileobj=io.BytesIO(saved)) as tar:
        (manifest,) = json.load(tar.extractfile("manifest.json"))
        return tree_of_layers([tar.extractfile(layer).read() for layer in manifest["Layers"]])


def oci_tree(layout: pathlib.Path) -> dict:
    index = json.loads((layout / "index.json").read_text())
    blob = lambda d: (layout / "blobs" / d.replace(":", "/")).read_bytes()
    manifest = json.loads(blob(index["manifests"][0]["digest"]))
    layers = []
    for desc in manifest["layers"]:
        data = blob(desc["digest"])
        if desc["mediaType"].endswith("gzip"):
            data = gzip.decompress(data)
        layers.append(data)
    return tree_of_layers(layers)


def resolve_hardlinks(tree: dict) -> dict:
    for path, attrs in tree.items():
        if "link-of" in attrs:
            target = tree.get(normal(attrs["link-of"]), {})
            attrs.pop("link-of")
            attrs["sha256"] = target.get("sha256")
    return tree


EQUIVALENCE = r"""
FROM busybox
ARG VERSION=1.0
ENV APP_HOME=/opt/app GREETING="hello world"
WORKDIR ${APP_HOME}
COPY app/ ./
COPY --chown=1000:1000 data/*.txt /srv/data/
COPY --chmod=0640 config.ini /etc/app/config.ini
COPY bin/run.sh /usr/local/bin/
ADD notes /srv/notes
RUN mkdir -p /var/lib/app/cache && echo "$GREETING $VERSION" > /var/lib/app/version \
    && ln -s /var/lib/app/version /srv/current && chmod 0700 /var/lib/app/cache \
    && chown -R 1000:1000 /var/lib/app && rm /srv/data/old.txt
RUN ["/bin/sh", "-c", "echo exec-form > /srv/exec.txt"]
USER 1000:1000
WORKDIR /home/app
RUN echo "$(id -u):$(id -g) in $(pwd)" > /home/app/who
USER root
"""


def context(root: pathlib.Path):
    write(root, {
        "Dockerfile": EQUIVALENCE,
        "app/main.sh": "#!/bin/sh\necho main\n",
        "app/lib/util.sh": "util\n",
        "data/a.txt": "a\n",
        "data/old.txt": "old\n",
        "data/skip.md": "not copied\n",
        "config.ini": "[app]\nkey = value\n",
        "bin/run.sh": "#!/bin/sh\nexec /opt/app/main.sh\n",
        "notes/one.md": "one\n",
        "notes/deep/two.md": "two\n",
        ".dockerignore": "notes/deep/ignored*\n",
    })
    (root / "app" / "main.sh").chmod(0o755)
    (root / "bin" / "run.sh").chmod(0o755)
    (root / "app" / "link").symlink_to("main.sh")
    (root / "notes" / "deep" / "ignored.md").write_text("ignored\n")


def test_strata_build_and_docker_build_give_the_same_tree(strata, team, docker, tmp_path):
    team_name, opts = team
    ctx = tmp_path / "ctx"
    context(ctx)

    docker.run("build", "--network=none", "-q", "-t", "equivalence", str(ctx))
    docker_tree = resolve_hardlinks(saved_tree(docker.run("save", "equivalence").stdout))
    # The base has no /sys; Docker's runtime makes the mountpoint for a RUN and BuildKit keeps it
    # in the layer. It is Docker's artifact, not the Dockerfile's, so it leaves the comparison.
    base = saved_tree(docker.run("save", "busybox:latest").stdout)
    assert "/sys" not in base
    if "/sys" in docker_tree:
        assert docker_tree.pop("/sys")["type"] == "dir"

    out = build(strata, opts["api_key"], "-t", "equivalence", str(ctx))
    assert out.returncode == 0, out.stdout + out.stderr
    layout = tmp_path / "export"
    strata.cli("template", "export", "--team", team_name, "equivalence", str(layout))
    strata_tree = resolve_hardlinks(oci_tree(layout))

    # The one documented difference (ADR 0029): every E2B template has the account `user` (uid
    # 1000) with its home, made by the server's implicit first step. It is checked to be exactly
    # that, then taken out of the comparison.
    home = strata_tree.pop("/home/user")
    assert (home["type"], home["owner"]) == ("dir", "1000:1000"), home
    assert "/home/user" not in docker_tree
    for path in ACCOUNTS:
        ours, theirs = strata_tree[path].pop("lines"), docker_tree[path].pop("lines")
        added = [line for line in ours if line not in theirs]
        assert [line for line in theirs if line not in ours] == [], (path, ours, theirs)
        assert [line.split(":")[0] for line in added] == ["user"], (path, added)
        strata_tree[path].pop("sha256"), docker_tree[path].pop("sha256")
    only_strata = sorted(set(strata_tree) - set(docker_tree))
    only_docker = sorted(set(docker_tree) - set(strata_tree))
    differing = sorted(p for p in set(strata_tree) & set(docker_tree)
                       if strata_tree[p] != docker_tree[p])
    detail = "\n".join(f"{p}: strata {strata_tree[p]} docker {docker_tree[p]}" for p in differing)
    assert (only_strata, only_docker, detail) == ([], [], ""), (only_strata, only_docker, detail)
    # And the comparison compared something: the Dockerfile's own files are in the tree.
    for path in ["/opt/app/main.sh", "/opt/app/lib/util.sh", "/srv/data/a.txt", "/etc/app/config.ini",
                 "/srv/notes/deep/two.md", "/var/lib/app/version", "/home/app/who", "/srv/current"]:
        assert path in strata_tree, path
    assert "/srv/data/old.txt" not in strata_tree and "/srv/notes/deep/ignored.md" not in strata_tree


def test_bench_build_times_both_builders_on_every_scenario(docker):
    """`strata bench build` against this module's daemon: one small round, every scenario timed
    for both, each a positive figure with its ratio; the bench's own numbers come from release
    builds (README)."""
    out = subprocess.run(
        [BIN, "bench", "build", "--rounds", "1", "--files", "5", "--docker-host",
         f"unix://{docker.sock}", "--data-dir", str(NODE_IMAGES)],
        capture_output=True, text=True, timeout=600,
        env={k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
    )
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    rows = {}
    for line in out.stdout.splitlines():
        m = re.match(r"^(cold|unchanged|last step changed|one file changed)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s", line)
        if m:
            rows[m.group(1)] = [float(x) for x in m.groups()[1:]]
    assert set(rows) == {"cold", "unchanged", "last step changed", "one file changed"}, out.stdout
    for name, (docker_s, strata_s, ratio) in rows.items():
        assert docker_s > 0 and strata_s > 0, (name, out.stdout)
        assert abs(ratio - strata_s / docker_s) < 0.01 + 0.01 * ratio, (name, out.stdout)
