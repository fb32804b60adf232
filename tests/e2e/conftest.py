"""Runs the real E2B Python SDK against a real strata.

One `strata up` per test session: embedded Postgres in a fresh data directory, the built-in
base images linked in from the node's image store (built by scripts/setup.sh), API on a free
loopback port. Each test gets its own team and API key from `strata keys create`.
"""

import os
import pathlib
import shutil
import socket
import subprocess
import time
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
        }
        self.env.pop("DATABASE_URL", None)
        self.log = open(data_dir / "strata.log", "w")
        self.proc = None
        # Every API key issued in this session, to check that none reaches a log line.
        self.issued_keys = []

    def start(self):
        self.proc = subprocess.Popen(
            [BIN, "up"], env=self.env, stdout=self.log, stderr=subprocess.STDOUT
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


def link_node_images(data_dir: pathlib.Path):
    """Hard-links the node's built-in base images into `data_dir` (instant, no copy), or
    builds the busybox base there when the node has none."""
    if (NODE_IMAGES / "images").is_dir():
        for part in ("blobs", "images", "layers"):
            src = NODE_IMAGES / part
            if src.is_dir():
                subprocess.run(["cp", "-al", str(src), str(data_dir / part)], check=True)
    else:
        subprocess.run(
            [BIN, "image", "build-base", "--busybox-only", "--data-dir", str(data_dir)],
            check=True,
        )


@pytest.fixture(scope="session")
def strata(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("strata-data")
    link_node_images(data_dir)
    server = Strata(data_dir)
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
