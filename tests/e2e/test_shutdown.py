"""A server of its own, started as systemd starts services (a soft open-file limit of 1024
under a higher hard one), then stopped as systemd stops them (SIGTERM):

* strata raises its own open-file limit to the hard one (a node holds pipes and sockets for
  what its tenants do) and gives its sandboxes the limit it was started with;
* a stop never waits on a client: with a command's output stream held open by a client that
  reads nothing, `strata up` still exits, after its drain. Before, the API's graceful shutdown
  waited for that connection for ever.
"""

import resource
import subprocess
import time
import uuid

import pytest
from e2b import Sandbox, Template

from conftest import Strata, copy_node_images

# The drain (src/serve.rs) and the rest of a stop, with room for a loaded machine.
STOPS_WITHIN = 45
SOFT_OPEN_FILES = 1024


def _as_systemd_starts_services():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT_OPEN_FILES, hard))


@pytest.fixture(scope="module")
def own_server(tmp_path_factory, registries):
    data_dir = tmp_path_factory.mktemp("strata-own")
    copy_node_images(data_dir)
    server = Strata(data_dir)
    server.env["STRATA_REGISTRY_MIRRORS"] = f"docker.io=http://{registries.open.addr}"
    server.start(preexec_fn=_as_systemd_starts_services)
    o = {"api_key": server.key("own"), "api_url": server.url, "sandbox_url": server.url}
    name = f"own-{uuid.uuid4().hex[:6]}"
    Template.build(Template().from_image("e2bdev/base"), name, api_key=o["api_key"], api_url=o["api_url"])
    yield server, name, o
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait()
        # Its embedded Postgres outlives a killed strata.
        subprocess.run(["pkill", "-f", str(data_dir)], check=False)
    server.log.close()


def _open_files(pid):
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError("no open-file limit")


def test_strata_raises_its_open_file_limit_and_sandboxes_keep_the_one_it_was_given(own_server):
    server, name, o = own_server
    soft, hard = _open_files(server.proc.pid)
    assert hard > SOFT_OPEN_FILES and soft == hard, (soft, hard)
    sbx = Sandbox.create(name, **o)
    try:
        assert sbx.commands.run("ulimit -n").stdout.strip() == str(SOFT_OPEN_FILES)
    finally:
        sbx.kill()


def test_a_stop_does_not_wait_on_a_client_that_stopped_reading(own_server):
    server, name, o = own_server
    sbx = Sandbox.create(name, timeout=300, **o)
    # More output than the connection's buffers hold, then the command waits: its stream stays
    # open and its client, never read, takes nothing.
    handle = sbx.commands.run("head -c 50000000 /dev/zero | tr '\\0' a; sleep 600", background=True)
    time.sleep(3)
    asked = time.time()
    server.proc.terminate()
    try:
        server.proc.wait(timeout=STOPS_WITHIN)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"strata up did not stop within {STOPS_WITHIN} s of SIGTERM")
    assert server.proc.returncode == 0, server.proc.returncode
    assert time.time() - asked < STOPS_WITHIN
    del handle
