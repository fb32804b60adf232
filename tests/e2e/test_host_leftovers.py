"""Nothing strata makes on the host outlives the process that made it.

`strata template exec` is a short-lived process with a sandbox backend of its own, which keeps
scratch disks mounted ahead of need (spares). Whether the command exits, fails or the process
is interrupted, it leaves no mount and no loop device in the data directory behind; the server
(`strata up`) keeps its own, which existed before.
"""

import os
import pathlib
import signal
import subprocess
import time
import uuid

import pytest
from e2b import Template

from conftest import BIN


def mounts_under(root: pathlib.Path) -> set:
    """Mount points under `root` and the loop devices whose backing files are under it."""
    prefix = str(root)
    found = set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4]
            if point.startswith(prefix):
                found.add(("mount", point))
    for dev in pathlib.Path("/sys/block").glob("loop*"):
        try:
            backing = (dev / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue
        if backing.startswith(prefix):
            found.add(("loop", dev.name, backing))
    return found


def assert_nothing_new(root, before, within=5.0):
    """What is under `root` now is what was there before (the kernel detaches an autoclear loop
    device a moment after its filesystem is unmounted)."""
    deadline = time.time() + within
    while True:
        new = mounts_under(root) - before
        if not new or time.time() > deadline:
            break
        time.sleep(0.05)
    assert not new, f"left behind: {sorted(new)}"


@pytest.fixture(scope="module")
def template(strata):
    team = f"lo{uuid.uuid4().hex[:8]}"
    key = strata.key(team)
    name = f"leftovers-{uuid.uuid4().hex[:6]}"
    Template.build(Template().from_image("busybox").run_cmd("echo made > /made", user="root"), name, api_key=key, api_url=strata.url)
    return team, name


def test_template_exec_leaves_no_mount_or_loop_device(strata, template):
    team, name = template
    before = mounts_under(strata.data_dir)
    exec_ = lambda *argv: strata.cli("template", "exec", "--team", team, name, "--", *argv, check=False)  # noqa: E731
    # Checked after each call: the next `strata template exec` sweeps what a dead one left.
    out = exec_("cat", "/made")
    assert out.returncode == 0 and out.stdout == "made\n", out
    assert_nothing_new(strata.data_dir, before)
    assert exec_("false").returncode == 1
    assert_nothing_new(strata.data_dir, before)
    # A command that cannot start: an error, after the sandbox booted.
    assert exec_("/no/such/program").returncode != 0
    assert_nothing_new(strata.data_dir, before)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_template_exec_destroys_its_sandbox_and_leaves_nothing(strata, template, sig):
    team, name = template
    before = mounts_under(strata.data_dir)
    proc = subprocess.Popen(
        [BIN, "template", "exec", "--team", team, name, "--", "sh", "-c", "echo started; exec sleep 600"],
        env=strata.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "started\n"
        # Its sandbox disk and its spares are mounted while the command runs.
        assert mounts_under(strata.data_dir) - before
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted; the sandbox was destroyed" in err, err
    assert_nothing_new(strata.data_dir, before)
    assert not sleepers(), "the command outlived its sandbox"


def sleepers():
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        try:
            if (proc / "cmdline").read_bytes() == b"sleep\x00600\x00":
                found.append(proc.name)
        except OSError:
            continue
    return found
