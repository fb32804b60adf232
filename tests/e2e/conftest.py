"""Runs the real E2B Python SDK against a real strata.

One `strata up` per test session: embedded Postgres in a fresh data directory, the built-in
base images copied in from the node's image store (built by scripts/setup.sh; only read, never
written), API on a free loopback port. Each test gets its own team and API key from `strata keys create`.
"""

import gzip
import hashlib
import ipaddress
import io
import json
import os
import pathlib
import tarfile
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("STRATA_BIN", str(ROOT / "target" / "debug" / "strata"))
NODE_IMAGES = pathlib.Path(os.environ.get("STRATA_IMAGE_STORE", "/var/lib/strata"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Strata:
    """A running strata and the CLI pointed at it."""

    def __init__(self, data_dir: pathlib.Path):
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "STRATA_DATA_DIR": str(data_dir),
            "STRATA_LISTEN": f"127.0.0.1:{self.port}",
            "STRATA_EMBEDDED_PG_PORT": str(free_port()),
            "STRATA_ADMIN_TOKEN": "e2e-admin",
            # Above the SDK's 20 s default ready command (`wait_for_timeout(20_000)`, the Python
            # Dockerfile parser's ready command for CMD), below E2B's 10 minutes.
            "STRATA_READY_TIMEOUT_SECS": "60",
            # The test registries run on loopback, which a pull never reaches unless listed.
            "STRATA_INSECURE_REGISTRIES": "127.0.0.1",
        }
        self.env.pop("DATABASE_URL", None)
        self.log = open(data_dir / "strata.log", "w")
        self.proc = None
        # Every API key issued in this session, to check that none reaches a log line.
        self.issued_keys = []

    def start(self, preexec_fn=None):
        self.proc = subprocess.Popen(
            [BIN, "up"], env=self.env, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=preexec_fn
        )
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"strata up exited early; see {self.log.name}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("strata up did not become healthy in 120 s")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)
        self.log.close()

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [BIN, *args], env=self.env, capture_output=True, text=True, check=check
        )

    def key(self, team: str) -> str:
        key = self.cli("keys", "create", "--team", team).stdout.strip()
        self.issued_keys.append(key)
        return key


def copy_node_images(data_dir: pathlib.Path):
    """Copies the node's built-in base images into `data_dir` (`strata image copy` only reads
    the node's directory and checks every blob's digest), or builds the busybox base there
    when the node has none."""
    if (NODE_IMAGES / "images").is_dir():
        subprocess.run(
            [BIN, "image", "copy", "--from", str(NODE_IMAGES), "--data-dir", str(data_dir)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    else:
        subprocess.run(
            [BIN, "image", "build-base", "--busybox-only", "--data-dir", str(data_dir)],
            check=True,
        )


class Registry:
    """A real registry (Debian's docker-registry, CNCF distribution) on loopback, open or
    behind an htpasswd file; images are pushed to it with skopeo from OCI layouts."""

    def __init__(self, root: pathlib.Path, credentials=None):
        root.mkdir(parents=True)
        self.root = root
        self.addr = f"127.0.0.1:{free_port()}"
        self.credentials = credentials
        config = (
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {root / 'storage'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.addr}\n"
        )
        if credentials:
            user, password = credentials
            line = subprocess.run(
                ["htpasswd", "-Bbn", user, password], capture_output=True, check=True
            ).stdout
            (root / "htpasswd").write_bytes(line)
            config += f"auth:\n  htpasswd:\n    realm: e2e\n    path: {root / 'htpasswd'}\n"
        (root / "config.yml").write_text(config)
        self.log = open(root / "registry.log", "w")
        self.proc = subprocess.Popen(
            ["docker-registry", "serve", str(root / "config.yml")],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 15
        while True:
            try:
                socket.create_connection(tuple(self.addr.split(":")), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"docker-registry did not start; see {root / 'registry.log'}")
                time.sleep(0.05)

    def push(self, layout: "Layout", name: str, dest: str):
        cmd = ["skopeo", "copy", "--quiet", "--preserve-digests", "--dest-tls-verify=false"]
        if self.credentials:
            cmd.append("--dest-creds={}:{}".format(*self.credentials))
        cmd += [f"oci:{layout.dir}:{name}", f"docker://{self.addr}/{dest}"]
        subprocess.run(cmd, check=True, capture_output=True)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


class Layout:
    """An OCI image layout: gzip layers from tar bytes, a config, a manifest, named refs."""

    def __init__(self, root: pathlib.Path):
        self.dir = root
        (root / "blobs" / "sha256").mkdir(parents=True)
        (root / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
        self.refs = []

    def blob(self, data: bytes):
        digest = hashlib.sha256(data).hexdigest()
        (self.dir / "blobs" / "sha256" / digest).write_bytes(data)
        return f"sha256:{digest}", len(data)

    def image(self, tars, env, name):
        layers, diff_ids = [], []
        for tar in tars:
            diff_ids.append("sha256:" + hashlib.sha256(tar).hexdigest())
            digest, size = self.blob(gzip.compress(tar, compresslevel=1, mtime=0))
            layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest, "size": size})
        config = {
            "architecture": "amd64" if os.uname().machine == "x86_64" else "arm64",
            "os": "linux",
            "config": {"Env": env, "WorkingDir": "/srv", "User": "nobody"},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }
        cdigest, csize = self.blob(json.dumps(config).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cdigest, "size": csize},
            "layers": layers,
        }
        digest, size = self.blob(json.dumps(manifest).encode())
        self.refs = [r for r in self.refs if r["annotations"]["org.opencontainers.image.ref.name"] != name]
        self.refs.append({
            "mediaType": manifest["mediaType"], "digest": digest, "size": size,
            "annotations": {"org.opencontainers.image.ref.name": name},
        })
        (self.dir / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": self.refs}))
        return {"digest": digest, "diff_ids": diff_ids}


class Outside:
    """The tests' own outside world: a network namespace made here, linked to the host by a
    veth pair on a private /30 of 10.253.0.0/16, where the servers a build step reaches run
    (`popen`). Sandboxes reach it only because strata is started with its network in
    `STRATA_SANDBOX_EGRESS_ALLOW` (it is private, so denied by default); nothing of the test's
    traffic leaves the machine."""

    def __init__(self):
        slot = os.getpid() % 16384
        self.netns = f"strata-e2e-{slot}"
        link = f"ste{slot}"
        base = ipaddress.IPv4Address("10.253.0.0") + slot * 4
        self.host_ip, self.ip = str(base + 1), str(base + 2)
        self.network = f"{base}/30"
        ip = lambda *a: subprocess.run(["ip", *a], check=True, capture_output=True)  # noqa: E731
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        subprocess.run(["ip", "link", "del", link], capture_output=True)
        ip("netns", "add", self.netns)
        ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        ip("addr", "add", f"{self.host_ip}/30", "dev", link)
        ip("link", "set", link, "up")
        for args in (
            ["addr", "add", f"{self.ip}/30", "dev", "eth0"],
            ["link", "set", "eth0", "up"],
            ["link", "set", "lo", "up"],
            ["route", "add", "default", "via", self.host_ip],
        ):
            ip("-n", self.netns, *args)
        self.procs = []

    def popen(self, argv, **kw):
        """Starts `argv` inside the world; it is stopped with the world."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.netns, *argv], **kw)
        self.procs.append(proc)
        return proc

    def wait_for(self, port: int, proc):
        deadline = time.time() + 15
        while True:
            try:
                socket.create_connection((self.ip, port), timeout=1).close()
                return
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"nothing listens on {self.ip}:{port} in {self.netns}")
                time.sleep(0.05)

    def close(self):
        for proc in self.procs:
            proc.terminate()
            proc.wait(timeout=30)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)


def tar_of(files: dict) -> bytes:
    """An uncompressed layer tar holding `files` (path -> text, or path -> (text, mode))."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for path, content in files.items():
            text, mode = content if isinstance(content, tuple) else (content, 0o644)
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), mode, 1700000000
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# The images the SDK helpers name, by default variant, as the mirror path and marker.
HELPER_IMAGES = {
    "library/debian:stable": "debian-stable",
    "library/python:3": "python-3",
    "library/ubuntu:latest": "ubuntu-latest",
    "library/fedora:44": "fedora-44",
    "library/alpine:3.24": "alpine-3.24",
    "library/archlinux:latest": "archlinux-latest",
    "library/node:lts": "node-lts",
    "oven/bun:latest": "bun-latest",
}
# No bun installs offline: the bun image carries a stand-in `bun` that records who ran it,
# where, with what arguments, so `bun_install` can be checked by the call it makes.
HELPER_FILES = {
    "oven/bun:latest": {
        "usr/local/bin/bun": ("#!/bin/sh\necho \"$(id -un) $(pwd) bun $*\" >> /var/log/bun.calls\n", 0o755),
        "var/log/bun.calls": ("", 0o666),
    },
}


class Registries:
    """The open registry (the docker.io mirror), the password-protected one, the one standing in
    for a GCP registry (user `_json_key`, the key as password), plus the busybox root
    filesystem every pushed image starts from."""

    PASSWORD = "reg-Pa55word-e2e"
    # A GCP service-account key as the Python SDK serializes a dict of it (`json.dumps`). It is
    # the password of user `_json_key`, the basic auth Google's registries take for a key.
    GCP_KEY = '{"type": "service_account", "project_id": "e2e"}'

    def __init__(self, root: pathlib.Path, node_images: pathlib.Path):
        self.root = root
        self.open = Registry(root / "open")
        self.private = Registry(root / "private", ("builder", self.PASSWORD))
        self.gcp = Registry(root / "gcp", ("_json_key", self.GCP_KEY))
        manifest = json.loads((node_images / "images" / "busybox.json").read_text())
        hexdigest = manifest["layers"][0]["digest"].split(":")[1]
        self.busybox_tar = (node_images / "blobs" / "sha256" / hexdigest).read_bytes()
        # What `push_image` returned, by registry path, for the images pushed at the start.
        self.pushed = {}

    def push_image(self, registry: Registry, dest: str, marker: str, env=None, files=None):
        """Pushes busybox plus a layer with /etc/image-marker = marker and `files` (as for
        `tar_of`); returns its digests."""
        layout = Layout(self.root / f"layout-{uuid.uuid4().hex[:8]}")
        image = layout.image(
            [self.busybox_tar, tar_of({"etc/image-marker": marker, **(files or {})})],
            env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "IMAGE_VAR=from-image"],
            "img",
        )
        registry.push(layout, "img", dest)
        return image

    def stop(self):
        self.open.stop()
        self.private.stop()
        self.gcp.stop()


@pytest.fixture(scope="session")
def registries(tmp_path_factory):
    root = tmp_path_factory.mktemp("registries")
    node = NODE_IMAGES if (NODE_IMAGES / "images" / "busybox.json").exists() else None
    if node is None:
        node = root / "node"
        node.mkdir()
        subprocess.run(
            [BIN, "image", "build-base", "--busybox-only", "--data-dir", str(node)], check=True
        )
    regs = Registries(root, node)
    # What Docker Hub would serve, through the mirror: the SDKs' image helpers with their
    # default variants (from_debian_image() is `debian:stable`, from_bun_image()
    # `oven/bun:latest`, ...) resolve to these. Each carries its name as its marker.
    for dest in HELPER_IMAGES:
        regs.pushed[dest] = regs.push_image(regs.open, dest, HELPER_IMAGES[dest], files=HELPER_FILES.get(dest))
    yield regs
    regs.stop()


# The node's own Debian index (scripts/setup.sh's `apt-get update`) and the packages setup
# downloaded for `apt_install` tests, served in the outside world under the name of the mirror
# the base image's own apt sources name. No mirror is named here: the base image says which
# (it was built from the machine's), and apt says where the node keeps that release's index.
APT_LISTS = pathlib.Path("/var/lib/apt/lists")
APT_DEBS = pathlib.Path(os.environ.get("STRATA_TEST_APT_DEBS", "/var/cache/strata-test/apt"))


def base_image_source(node: pathlib.Path = NODE_IMAGES) -> tuple[str, str]:
    """The `deb URI SUITE main` line of e2bdev/base's /etc/apt/sources.list (debootstrap wrote
    it from the mirror the image was built from): the URI and the suite."""
    manifest = json.loads((node / "images" / "e2bdev%2Fbase.json").read_text())
    for layer in manifest["layers"]:
        sources = node / "layers" / layer["digest"].split(":", 1)[1] / "etc" / "apt" / "sources.list"
        if sources.is_file():
            for line in sources.read_text().splitlines():
                words = line.split()
                if len(words) >= 4 and words[0] == "deb" and "main" in words[3:]:
                    return words[1].rstrip("/"), words[2]
    raise AssertionError(f"e2bdev/base in {node} has no `deb URI SUITE main` source; run scripts/setup.sh")


def node_index(suite: str) -> tuple[pathlib.Path, pathlib.Path, str]:
    """Where this node's apt keeps `suite`'s main index (from whichever mirror it uses; every
    Debian mirror serves the same signed files): the InRelease, the Packages list, the arch."""
    arch = subprocess.run(["dpkg", "--print-architecture"], check=True, capture_output=True, text=True).stdout.strip()
    listed = subprocess.run(
        ["apt-get", "indextargets", "--no-release-info", "--format", "$(BASE_URI) $(FILENAME)",
         "Identifier: Packages", "Component: main", f"Release: {suite}", f"Architecture: {arch}"],
        check=True, capture_output=True, text=True,
    ).stdout.split()
    assert len(listed) >= 2, (
        f"this node's apt sources have no {suite} main for {arch}, the release the base image's "
        "sources name; the apt tests serve the node's own index of it (run scripts/setup.sh on such a host)"
    )
    base_uri, packages = listed[0], pathlib.Path(listed[1])
    inrelease = APT_LISTS / (base_uri.split("://", 1)[-1].replace("/", "_") + "InRelease")
    return inrelease, packages, arch


def debian_mirror(root: pathlib.Path) -> pathlib.Path:
    """The base image's suite's main as a Debian mirror lays it out, at the path of the
    base image's mirror URI: the node's signed InRelease, the Packages index it names (by path
    and by hash) and the .debs setup downloaded, each checked against the index, so apt in a
    sandbox verifies everything as it would against the real mirror."""
    uri, suite = base_image_source()
    inrelease_path, lists, arch = node_index(suite)
    top = root / urllib.parse.urlsplit(uri).path.strip("/")
    dists = top / "dists" / suite
    index = dists / "main" / f"binary-{arch}"
    (index / "by-hash" / "SHA256").mkdir(parents=True)
    inrelease = inrelease_path.read_bytes()
    (dists / "InRelease").write_bytes(inrelease)
    if lists.exists():
        packages = lists.read_bytes()
    else:
        packages = subprocess.run(["lz4", "-dc", f"{lists}.lz4"], check=True, capture_output=True).stdout
    digest = hashlib.sha256(packages).hexdigest()
    assert f"{digest} ".encode() in inrelease, (
        "the node's Packages index is not the one its InRelease names; run scripts/setup.sh"
    )
    (index / "Packages").write_bytes(packages)
    (index / "by-hash" / "SHA256" / digest).write_bytes(packages)
    # Index files setup fetched by hash (the English translations), served by hash.
    for fetched in APT_DEBS.iterdir():
        if len(fetched.name) == 64 and fetched.name.encode() in inrelease:
            data = fetched.read_bytes()
            assert hashlib.sha256(data).hexdigest() == fetched.name, f"{fetched} is torn"
            (dists / "main" / "i18n" / "by-hash" / "SHA256").mkdir(parents=True, exist_ok=True)
            (dists / "main" / "i18n" / "by-hash" / "SHA256" / fetched.name).write_bytes(data)
    wanted = {deb.name: deb for deb in APT_DEBS.glob("*.deb")}
    assert wanted, f"no .deb in {APT_DEBS}; run scripts/setup.sh"
    for stanza in packages.decode(errors="replace").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" "))
        name = fields.get("Filename", "").rsplit("/", 1)[-1]
        if name in wanted:
            data = wanted.pop(name).read_bytes()
            assert hashlib.sha256(data).hexdigest() == fields["SHA256"], f"{name} is not the one the index names"
            dest = top / fields["Filename"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
    assert not wanted, f"not in the node's index (run scripts/setup.sh): {sorted(wanted)}"
    return root


@pytest.fixture(scope="session")
def outside(tmp_path_factory):
    """The outside world, with the only DNS sandboxes get (the base image's mirror is the world
    itself) and that mirror on port 80."""
    world = Outside()
    mirror_uri = urllib.parse.urlsplit(base_image_source()[0])
    assert mirror_uri.scheme == "http" and mirror_uri.port in (None, 80), (
        f"the base image's mirror {mirror_uri.geturl()} is not plain HTTP on port 80, which the tests' mirror serves"
    )
    dns = world.popen(
        ["python3", str(ROOT / "tests" / "e2e" / "dns_server.py"), world.ip, f"{mirror_uri.hostname}={world.ip}"],
    )
    mirror = debian_mirror(tmp_path_factory.mktemp("debian-mirror"))
    http = world.popen(
        ["python3", "-m", "http.server", "--bind", world.ip, "--directory", str(mirror), "80"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    world.wait_for(80, http)
    assert dns.poll() is None, "the outside world's DNS server did not start"
    yield world
    world.close()


@pytest.fixture(scope="session")
def strata(tmp_path_factory, registries, outside):
    data_dir = tmp_path_factory.mktemp("strata-data")
    copy_node_images(data_dir)
    server = Strata(data_dir)
    server.env["STRATA_REGISTRY_MIRRORS"] = f"docker.io=http://{registries.open.addr}"
    # Build steps reach the test's outside world (private, so only through the allow list).
    server.env["STRATA_SANDBOX_EGRESS_ALLOW"] = outside.network
    # ... and resolve names only through its DNS: no sandbox lookup leaves the machine.
    server.env["STRATA_SANDBOX_DNS"] = outside.ip
    server.start()
    yield server
    server.stop()


@pytest.fixture
def team(strata):
    """A fresh team: its name and SDK connection options."""
    name = f"t{uuid.uuid4().hex[:10]}"
    return name, {"api_key": strata.key(name), "api_url": strata.url}


@pytest.fixture
def context_dir(tmp_path):
    """A build context like the captures': nested dirs, an executable, a relative symlink,
    a .dockerignore'd file and files for a glob."""
    root = tmp_path / "ctx"
    (root / "app" / "bin").mkdir(parents=True)
    (root / "app" / "nested" / "deep").mkdir(parents=True)
    (root / "app" / "config.txt").write_text("config-v1\n")
    run = root / "app" / "bin" / "run.sh"
    run.write_text("#!/bin/sh\necho running\n")
    run.chmod(0o755)
    (root / "app" / "nested" / "deep" / "data.txt").write_text("deep data\n")
    (root / "app" / "link.txt").symlink_to("config.txt")
    (root / "app" / "secret.env").write_text("SHOULD_NOT_SHIP=1\n")
    (root / ".dockerignore").write_text("app/secret.env\n")
    (root / "notes").mkdir()
    (root / "notes" / "a.md").write_text("a\n")
    (root / "notes" / "b.md").write_text("b\n")
    (root / "notes" / "c.txt").write_text("c\n")
    return root
