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
