"""What one sandbox's clients can make the node hold (issue 46), tried through the stock SDK: the
processes the API started and still runs, the streams open on them, and the output held for
streams whose clients do not read. Each is a budget per sandbox; past it the request is refused
saying which, and output nobody reads is not buffered for them.
"""

import time
import uuid

import pytest
from e2b import Sandbox, Template

from test_sdk_sandbox import opts

# As src/envd/budget.rs says.
MAX_PROCESSES = 256
MAX_STREAMS = 128


@pytest.fixture(scope="module")
def template(strata):
    o = opts(strata, f"budget{uuid.uuid4().hex[:8]}")
    name = f"budget-{uuid.uuid4().hex[:6]}"
    Template.build(Template().from_image("e2bdev/base"), name, api_key=o["api_key"], api_url=o["api_url"])
    return name, o


def _rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_output_no_client_reads_costs_the_node_a_bounded_amount(strata, template):
    name, o = template
    sbx = Sandbox.create(name, timeout=300, **o)
    try:
        before = _rss_bytes(strata.proc.pid)
        # Background commands whose handles are never read: their streams stay open and their
        # clients take nothing. Each writes far more than it may hold.
        handles = [
            sbx.commands.run("yes 0123456789abcdef0123456789abcdef | head -c 40000000", background=True)
            for _ in range(24)
        ]
        # Long enough for every command to write its output (at pipe speed, well under a
        # second each) and for the server to have taken all it would.
        time.sleep(10)
        grown = _rss_bytes(strata.proc.pid) - before
        print(f"the server grew by {grown >> 20} MiB")
        # Measured here, release binaries run alternately: 211 and 204 MiB before the budget (an
        # 8 MiB ring per process), 45 and 43 MiB after (the queues are 3 MiB of it; the rest is
        # the allocator's arenas after 24 busy pumps and the connections' buffers). The bound
        # sits between, with room for a noisier machine.
        assert grown < 96 << 20, f"the server grew by {grown >> 20} MiB for output nobody read"
        for h in handles:
            h.kill()
    finally:
        sbx.kill()


def test_streams_and_processes_per_sandbox_are_capped_and_freed(template):
    name, o = template
    sbx = Sandbox.create(name, timeout=300, **o)
    try:
        # Open streams: every background start holds one until its client lets go.
        held = [sbx.commands.run("sleep 600", background=True) for _ in range(MAX_STREAMS)]
        with pytest.raises(Exception, match=f"{MAX_STREAMS} open streams"):
            sbx.commands.run("sleep 600", background=True)
        held.pop().disconnect()
        deadline = time.time() + 10
        while True:
            try:
                held.append(sbx.commands.run("sleep 600", background=True))
                break
            except Exception:
                # The server notices a closed stream when its client's connection goes.
                assert time.time() < deadline, "a disconnected stream was not given back"
                time.sleep(0.2)
        for h in held:
            h.disconnect()

        # Running processes: their streams closed, they run on and still count.
        started = len(sbx.commands.list())
        assert started == MAX_STREAMS + 1, started
        while started < MAX_PROCESSES:
            sbx.commands.run("sleep 600", background=True).disconnect()
            started += 1
        with pytest.raises(Exception, match=f"{MAX_PROCESSES} processes"):
            sbx.commands.run("sleep 600", background=True)
        # One ends: there is room again.
        sbx.commands.kill(held[0].pid)
        deadline = time.time() + 10
        while True:
            try:
                sbx.commands.run("echo room", background=False)
                break
            except Exception:
                assert time.time() < deadline, "an ended process still counted"
                time.sleep(0.2)
    finally:
        sbx.kill()
