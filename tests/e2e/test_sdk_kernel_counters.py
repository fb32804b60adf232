"""What a sandbox counts against in the kernel is its own (ADR 0034), tried through the stock SDK:
one team's sandbox takes all it can of a counted resource and holds it; another team's sandbox
still gets its share.
"""

import time
import uuid

import pytest
from e2b import Sandbox, Template
from e2b.sandbox.commands.command_handle import PtySize

from test_sdk_sandbox import opts

# Holds every terminal it can open, then says how many and why it stopped.
HOARD_PTYS = r"""
import os, sys, time
held = []
try:
    while True:
        held.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
except OSError as e:
    print(len(held), e.strerror, flush=True)
time.sleep(600)
"""

# Holds every inotify instance it can make, then says how many and why it stopped.
HOARD_INOTIFY = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
held = []
while True:
    fd = libc.inotify_init1(0)
    if fd < 0:
        print(len(held), os.strerror(ctypes.get_errno()), flush=True)
        break
    held.append(fd)
time.sleep(600)
"""


def _hoard(sandbox, program):
    """Runs `program` in `sandbox` in the background; returns its handle and what it said."""
    sandbox.files.write("/tmp/hoard.py", program)
    handle = sandbox.commands.run("python3 /tmp/hoard.py > /tmp/hoard.out", background=True)
    deadline = time.time() + 60
    while not (said := sandbox.commands.run("cat /tmp/hoard.out 2>/dev/null || true").stdout.strip()):
        assert time.time() < deadline, "the hoarder never ran out"
        time.sleep(0.2)
    count, reason = said.split(" ", 1)
    return handle, int(count), reason


@pytest.fixture(scope="module")
def two_teams(strata):
    """A template each for two teams."""
    teams = []
    for letter in "ab":
        o = opts(strata, f"{letter}{uuid.uuid4().hex[:8]}")
        name = f"counters-{letter}-{uuid.uuid4().hex[:6]}"
        Template.build(Template().from_image("e2bdev/base"), name, api_key=o["api_key"], api_url=o["api_url"])
        teams.append((name, o))
    return teams


def test_one_sandbox_holding_every_terminal_it_can_leaves_others_theirs(two_teams):
    (name_a, opts_a), (name_b, opts_b) = two_teams
    hoarder = Sandbox.create(name_a, timeout=300, **opts_a)
    try:
        hoard, count, reason = _hoard(hoarder, HOARD_PTYS)

        other = Sandbox.create(name_b, timeout=120, **opts_b)
        try:
            term = other.pty.create(PtySize(rows=24, cols=80))
            other.pty.send_stdin(term.pid, b"echo other-has-a-terminal; exit 3\n")
            seen = bytearray()
            for _, _, chunk in term:
                if chunk:
                    seen.extend(chunk)
                if b"other-has-a-terminal\r\n" in seen:
                    break
            assert b"other-has-a-terminal" in seen, bytes(seen)
        finally:
            other.kill()
        # The sandbox's own terminal limit stopped it, not the node's (kernel.pty.max less its
        # reserve, which every sandbox shared).
        assert count <= 256 and "No space left on device" in reason, (count, reason)
        hoard.kill()
    finally:
        hoarder.kill()


def test_one_sandbox_holding_every_inotify_instance_it_can_leaves_others_their_watches(two_teams):
    (name_a, opts_a), (name_b, opts_b) = two_teams
    hoarder = Sandbox.create(name_a, timeout=300, **opts_a)
    try:
        hoard, count, reason = _hoard(hoarder, HOARD_INOTIFY)
        # The sandbox's own pool ran out (fs.inotify.max_user_instances of the user that owns
        # its user namespace), not the node's.
        per_user = int(open("/proc/sys/fs/inotify/max_user_instances").read())
        assert reason == "Too many open files" and 0 < count <= per_user, (count, reason, per_user)

        # The hoarder's own agent is out of instances too: its watch fails, saying why.
        with pytest.raises(Exception, match="inotify"):
            hoarder.files.watch_dir("/tmp")

        other = Sandbox.create(name_b, timeout=120, **opts_b)
        try:
            other.files.make_dir("/tmp/watched")
            watch = other.files.watch_dir("/tmp/watched")
            other.files.write("/tmp/watched/seen.txt", "x")
            deadline = time.time() + 20
            names = []
            while "seen.txt" not in names:
                assert time.time() < deadline, f"no event for the other team's write: {names}"
                names += [e.name for e in watch.get_new_events()]
                time.sleep(0.2)
            watch.stop()
            # A second sandbox of the same team has a pool of its own as well.
            again, again_count, _ = _hoard(other, HOARD_INOTIFY)
            assert again_count > 0
            again.kill()
        finally:
            other.kill()
        hoard.kill()
    finally:
        hoarder.kill()
