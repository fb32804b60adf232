"""The step cache through the unmodified E2B Python SDK: what runs again, what is uploaded again.

Each lookup is reported in the build log (`[cache] final result: cache hit`, `[cache] step
n/N ...: cache miss`, `... cache unapplied ...`); executed steps log `[n/N] <TYPE> ...`, reused
ones `[n/N] CACHED <TYPE> ...`. Uploads are counted on the team's `files-…` streams through the
operator API.
"""

import json
import re
import urllib.request
import uuid

from e2b import Template

STEP = re.compile(r"^\[(\d+)/(\d+)\] (CACHED )?(RUN|COPY|ENV|WORKDIR|USER) ")


def admin(strata, path):
    req = urllib.request.Request(strata.url + path, headers={"Authorization": "Bearer e2e-admin"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def uploads(strata, team_name):
    """Generations published on the team's files streams (one per upload that landed)."""
    streams = [
        s["stream_id"]
        for s in admin(strata, "/admin/streams?category=files&limit=1000")["streams"]
        if s["stream_id"].startswith(f"files-{team_name}:")
    ]
    return sum(
        1
        for s in streams
        for e in admin(strata, f"/admin/streams/{s}/events?limit=1000")["events"]
        if e["type"] == "GenerationPublished.v1"
    )


def build(tpl, name, opts, **kw):
    logs = []
    info = Template.build(tpl, name, on_build_logs=logs.append, **opts, **kw)
    messages = [entry.message for entry in logs]
    executed, cached = [], []
    for m in messages:
        found = STEP.match(m)
        if found:
            (cached if found.group(3) else executed).append(int(found.group(1)))
    return info, messages, executed, cached


def recipe(ctx, last="echo last-v1 > /home/user/last"):
    return (
        Template(file_context_path=str(ctx))
        .from_image("busybox")
        .set_envs({"MODE": "cached"})
        .run_cmd("echo first > /home/user/first")
        .copy("app/config.txt", "/home/user/config.txt")
        .run_cmd("cat /home/user/config.txt > /home/user/derived")
        .run_cmd(last)
    )


def test_rebuilds_run_only_what_changed_and_upload_nothing_unchanged(strata, team, context_dir):
    team_name, opts = team
    _, _, executed, cached = build(recipe(context_dir), "cache", opts)
    assert executed == [1, 2, 3, 4, 5] and cached == []
    uploaded = uploads(strata, team_name)
    assert uploaded == 1

    # Unchanged: no step executes, nothing is uploaded, the final result is reused.
    _, messages, executed, cached = build(recipe(context_dir), "cache", opts)
    assert executed == [], messages
    assert cached == [1, 2, 3, 4, 5], messages
    assert "[cache] final result: cache hit" in messages, messages
    assert uploads(strata, team_name) == uploaded

    # The last RUN changed: only it runs.
    _, messages, executed, cached = build(recipe(context_dir, "echo last-v2 > /home/user/last"), "cache", opts)
    assert executed == [5], messages
    assert any(m.startswith("[cache] step 4/5 RUN") and m.endswith("cache hit") for m in messages), messages

    # One file changed: from its COPY on; the new bytes are uploaded once.
    (context_dir / "app" / "config.txt").write_text("config-v2\n")
    _, messages, executed, _ = build(recipe(context_dir, "echo last-v2 > /home/user/last"), "cache", opts)
    assert executed == [3, 4, 5], messages
    assert any(m.startswith("[cache] step 2/5 RUN") and m.endswith("cache hit") for m in messages), messages
    assert uploads(strata, team_name) == uploaded + 1
    out = strata.cli("template", "exec", "--team", team_name, "cache", "--", "/bin/sh", "-c",
                     "cat /home/user/derived /home/user/last").stdout
    assert out == "config-v2\nlast-v2\n"

    # skip_cache: everything runs again.
    _, messages, executed, cached = build(recipe(context_dir, "echo last-v2 > /home/user/last"), "cache", opts, skip_cache=True)
    assert executed == [1, 2, 3, 4, 5] and cached == [], messages
    assert not any("cache hit" in m for m in messages), messages


def test_a_checkpoint_whose_layer_blob_is_gone_is_unapplied_and_the_build_succeeds(strata, team, context_dir):
    team_name, opts = team
    nonce = uuid.uuid4().hex
    tpl = (
        Template(file_context_path=str(context_dir))
        .from_image("busybox")
        .run_cmd(f"echo {nonce} > /home/user/one")
        .run_cmd(f"echo {nonce} > /home/user/two")
    )
    info, _, executed, _ = build(tpl, "unapplied", opts)
    assert executed == [1, 2]
    events = admin(strata, f"/admin/streams/build-{info.build_id}/events?limit=1000")["events"]
    last = [e for e in events if e["type"] == "StepCompleted.v1" and e["data"]["step"] == 2][0]
    snapshot = last["data"]["outcome"]["snapshot"]
    record = [
        e for e in admin(strata, f"/admin/streams/snapshot-{snapshot}/events")["events"]
        if e["type"] == "SnapshotRecorded.v1"
    ][0]["data"]["record"]
    top = record["layers"][-1].split(":", 1)[1]
    (strata.data_dir / "blobs" / "sha256" / top).unlink()

    _, messages, executed, cached = build(tpl, "unapplied", opts)
    assert any(m.startswith("[cache] final result: cache unapplied") for m in messages), messages
    assert any(m.startswith("[cache] step 2/2 ") and "cache unapplied" in m for m in messages), messages
    assert any(m.startswith("[cache] step 1/2 ") and m.endswith("cache hit") for m in messages), messages
    assert executed == [2] and cached == [1], messages
    out = strata.cli("template", "exec", "--team", team_name, "unapplied", "--", "/bin/sh", "-c",
                     "cat /home/user/one /home/user/two").stdout
    assert out == f"{nonce}\n{nonce}\n"


def pin(strata, team_name, value):
    """Pins (or, with None, unpins) the team's cache mode through the operator API."""
    url = f"{strata.url}/admin/settings"
    if value is None:
        url, method, body = f"{url}/cache.mode?team={team_name}", "DELETE", b"{}"
    else:
        url, method = f"{url}?team={team_name}", "PUT"
        body = json.dumps({"key": "cache.mode", "value": value, "by": "e2e-operator"}).encode()
    req = urllib.request.Request(url, data=body, method=method, headers={
        "Authorization": "Bearer e2e-admin", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def test_a_team_pin_moves_its_builds_between_modes_and_a_running_build_keeps_its_own(strata, team, context_dir):
    import threading

    team_name, opts = team
    nonce = uuid.uuid4().hex

    def tpl(last="echo last-v1 > /home/user/last", sleep=0):
        t = (
            Template(file_context_path=str(context_dir))
            .from_image("busybox")
            .run_cmd(f"echo {nonce} > /home/user/first")
            .copy("app/config.txt", "/home/user/config.txt")
        )
        if sleep:
            t = t.run_cmd(f"sleep {sleep}")
        return t.run_cmd(last)

    # Off: an unchanged rebuild runs every step, and nothing is written to the cache.
    assert pin(strata, team_name, "off")["cache_mode"]["level"] == "team pin"
    build(tpl(), "pinned", opts)
    _, messages, executed, cached = build(tpl(), "pinned", opts)
    assert "[cache] mode off (team pin)" in messages, messages
    assert executed == [1, 2, 3] and cached == [], messages

    # Final: the first build finds nothing (off wrote no entry) and runs every step; the
    # unchanged rebuild is a final hit; a changed last step runs every step.
    pin(strata, team_name, "final")
    _, messages, executed, _ = build(tpl(), "pinned", opts)
    assert executed == [1, 2, 3], messages
    assert "[cache] final result: cache hit" not in messages, messages
    _, messages, executed, cached = build(tpl(), "pinned", opts)
    assert "[cache] mode final (team pin)" in messages, messages
    assert "[cache] final result: cache hit" in messages, messages
    assert executed == [] and cached == [1, 2, 3], messages
    _, messages, executed, _ = build(tpl("echo last-v2 > /home/user/last"), "pinned", opts)
    assert executed == [1, 2, 3], messages

    # A pin moved while a build runs does not move that build: it resolved `final` at start
    # and publishes its final result although the team is `off` by the time it ends.
    started = threading.Event()
    running = {}

    def slow():
        logs = []

        def on_log(entry):
            logs.append(entry.message)
            if entry.message.startswith("[3/4] RUN sleep"):
                started.set()

        Template.build(tpl(sleep=3), "slow", on_build_logs=on_log, **opts)
        running["messages"] = logs

    worker = threading.Thread(target=slow)
    worker.start()
    assert started.wait(120), "the slow build never reached its sleep"
    pin(strata, team_name, "off")
    worker.join(180)
    assert "[cache] mode final (team pin)" in running["messages"], running["messages"]
    pin(strata, team_name, "final")
    _, messages, executed, _ = build(tpl(sleep=3), "slow", opts)
    assert executed == [] and "[cache] final result: cache hit" in messages, messages

    # Unpinned: the service's setting (here none, so the default) applies again.
    assert pin(strata, team_name, None)["pins"] == {}
    _, messages, _, _ = build(tpl(), "pinned", opts)
    assert "[cache] mode steps (default)" in messages, messages
