"""A template build with a COPY through the unmodified E2B JS SDK (pinned in tests/e2e/js).

The JS SDK differs from Python where a server can trip: it validates the key format, sends no
`limit` on status polls, forwards no upload headers, hashes differently and names directories
in the tar with a trailing `/`. The result is checked inside a sandbox on the template.
"""

import json
import pathlib
import shutil
import subprocess

from test_sdk_build import exec_in

JS_DIR = pathlib.Path(__file__).resolve().parent / "js"


def test_the_js_sdk_builds_a_template_with_a_copy(strata, team, context_dir):
    assert shutil.which("node"), "node is required (scripts/setup.sh installs it)"
    assert (JS_DIR / "node_modules" / "e2b").is_dir(), "run scripts/setup.sh (npm ci in tests/e2e/js)"
    team_name, opts = team
    out = subprocess.run(
        ["node", str(JS_DIR / "build_copy.mjs"), str(context_dir), "js-copy"],
        env={**strata.env, "E2B_API_KEY": opts["api_key"], "E2B_API_URL": opts["api_url"]},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"node failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["templateId"] and info["buildId"] and info["logs"] > 0, info

    got = exec_in(
        strata,
        team_name,
        "js-copy",
        "cat /tmp/copied.txt; stat -c '%a %U' /opt/js/app/bin/run.sh; readlink /opt/js/app/link.txt; "
        "cat /opt/js/app/nested/deep/data.txt; test ! -e /opt/js/app/secret.env && echo ignored",
    )
    assert got.split("\n")[:5] == ["config-v1", "755 user", "config.txt", "deep data", "ignored"], got
