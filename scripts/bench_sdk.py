"""Times one-step template builds through the stock E2B Python SDK against a running strata.

Run by `strata bench sdk` (which issues the key and reads the server-side timings from the
build's events); usable alone with E2B_API_KEY set:

    .venv/bin/python scripts/bench_sdk.py --url http://127.0.0.1:3000 --runs 5

Prints one JSON object per build on stdout: the build id and the seconds the client spent in
each SDK call (register, upload link, upload, start, the wait for the end, and the status
polls' HTTP time inside that wait). Each build RUNs a fresh command, so no step is cached;
with --unchanged every build RUNs the same one after a first build that is not timed, so each
timed build is an unchanged rebuild answered from the cache.
"""

import argparse
import json
import os
import time
import uuid

import e2b.template_sync.build_api as build_api
import e2b.template_sync.main as template_main
from e2b import Template

timings: dict = {}
calls: dict = {}


def timed(module, name: str, key: str) -> None:
    """Wraps `module.name` so every call adds its wall time to timings[key]."""
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            timings[key] = timings.get(key, 0.0) + time.perf_counter() - start
            calls[key] = calls.get(key, 0) + 1

    setattr(module, name, wrapper)


# The build loop calls these through the names it imported; the status poll is called from
# inside wait_for_build_finish, through build_api's own global.
timed(template_main, "request_build", "register")
timed(template_main, "get_file_upload_link", "link")
timed(template_main, "upload_file", "upload")
timed(template_main, "trigger_build", "start")
timed(template_main, "wait_for_build_finish", "wait")
timed(build_api, "get_build_status", "poll_http")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default=os.environ.get("E2B_API_URL", "http://127.0.0.1:3000"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--image", default="busybox")
    parser.add_argument("--unchanged", action="store_true")
    args = parser.parse_args()
    key = os.environ["E2B_API_KEY"]

    shared = uuid.uuid4().hex
    if args.unchanged:
        warm = Template().from_image(args.image).run_cmd(f"echo {shared} > /tmp/bench-mark")
        Template.build(warm, "bench-sdk", api_key=key, api_url=args.url)
    for _ in range(args.runs):
        timings.clear()
        calls.clear()
        nonce = shared if args.unchanged else uuid.uuid4().hex
        template = Template().from_image(args.image).run_cmd(f"echo {nonce} > /tmp/bench-mark")
        start = time.perf_counter()
        info = Template.build(template, "bench-sdk", api_key=key, api_url=args.url)
        total = time.perf_counter() - start
        print(
            json.dumps(
                {
                    "build_id": info.build_id,
                    "total": total,
                    **{k: timings.get(k, 0.0) for k in ("register", "link", "upload", "start", "wait", "poll_http")},
                    "polls": calls.get("poll_http", 0),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
