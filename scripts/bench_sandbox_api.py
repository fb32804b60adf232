"""Times launched sandboxes through the stock E2B Python SDK against a running strata.

Run by `strata bench sandbox-api` (which issues the key and times the `strata template exec`
baseline); usable alone with E2B_API_KEY set:

    .venv/bin/python scripts/bench_sandbox_api.py --url http://127.0.0.1:3000 --runs 50

Builds (once, untimed) a template on --image, then per run: `Sandbox.create`, the first
`commands.run("true")`, `kill`; with --pause, between the first run and the kill, a 1 MiB file
write (untimed), `pause`, `Sandbox.connect` (the resume) and the first command after. Prints the template's name on the first line, then one JSON
object per run with the seconds each call took.

With --serve, it then launches one more sandbox serving a small page with busybox `httpd` on
port 8080 and prints `{"serve": {"id", "host", "marker"}}` (the marker is in the server's
command line, so the bench finds its process, and with it the sandbox's network namespace,
on the host); it kills that sandbox when its standard input closes.
"""

import argparse
import json
import time
import uuid

from e2b import Sandbox, Template


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:3000")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--image", default="busybox")
    parser.add_argument("--pause", action="store_true")
    parser.add_argument("--serve", action="store_true")
    args = parser.parse_args()
    name = f"bench-launch-{uuid.uuid4().hex[:8]}"
    Template.build(Template().from_image(args.image).run_cmd("true"), name, api_url=args.url)
    print(name, flush=True)
    opts = {"api_url": args.url, "sandbox_url": args.url}
    for _ in range(max(1, args.runs)):
        t0 = time.perf_counter()
        sbx = Sandbox.create(name, **opts)
        t1 = time.perf_counter()
        sbx.commands.run("true")
        t2 = time.perf_counter()
        timed = {"create": t1 - t0, "first_run": t2 - t1}
        if args.pause:
            sbx.files.write("/tmp/payload", b"x" * (1 << 20))
            p0 = time.perf_counter()
            assert sbx.pause() is True
            p1 = time.perf_counter()
            sbx = Sandbox.connect(sbx.sandbox_id, **opts)
            p2 = time.perf_counter()
            sbx.commands.run("true")
            p3 = time.perf_counter()
            timed.update({"pause": p1 - p0, "resume": p2 - p1, "resumed_run": p3 - p2})
        t2 = time.perf_counter()
        sbx.kill()
        t3 = time.perf_counter()
        timed["kill"] = t3 - t2
        print(json.dumps(timed), flush=True)
    if args.serve:
        serve(name, opts)


def serve(name, opts) -> None:
    import sys

    marker = f"/tmp/www-{uuid.uuid4().hex[:8]}"
    sbx = Sandbox.create(name, timeout=3600, **opts)
    try:
        sbx.commands.run(f"mkdir -p {marker} && echo bench-page > {marker}/index.html")
        sbx.commands.run(f"httpd -f -p 8080 -h {marker}", background=True)
        print(json.dumps({"serve": {"id": sbx.sandbox_id, "host": sbx.get_host(8080), "marker": marker}}), flush=True)
        sys.stdin.read()
    finally:
        sbx.kill()


if __name__ == "__main__":
    main()
