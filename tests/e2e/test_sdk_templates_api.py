"""Template listings and tags through the unmodified SDKs: every response parses with the SDKs'
own generated models (Python `from_dict`, the JS client's schema types), and every value is
strata's own (the build's resources, status, build ID, names, timestamps).
"""

import datetime
import json
import pathlib
import subprocess

import pytest
from e2b import Template
from e2b.api.client.api.templates import get_templates, get_templates_template_id
from e2b.api.client.api.tags import get_templates_template_id_tags
from e2b.api.client.models import Template as TemplateModel
from e2b.api.client.models import TemplateTag, TemplateWithBuilds
from e2b.api.client_sync import get_api_client
from e2b.connection_config import ConnectionConfig
from e2b.exceptions import BuildException

JS_DIR = pathlib.Path(__file__).resolve().parent / "js"

# Required fields of the upstream schemas (e2b-dev/infra spec/openapi.yml) with their JSON
# types; the SDK's `from_dict` checks presence but not types.
TEMPLATE_FIELDS = {
    "templateID": str, "buildID": str, "cpuCount": int, "memoryMB": int, "diskSizeMB": int,
    "public": bool, "createdAt": str, "updatedAt": str, "createdBy": (dict, type(None)),
    "lastSpawnedAt": (str, type(None)), "spawnCount": int, "buildCount": int,
    "envdVersion": str, "aliases": list, "names": list, "buildStatus": str,
}
# `TemplateWithBuilds`; the Python SDK's generated model of it also requires all of `Template`.
TEMPLATE_WITH_BUILDS_FIELDS = {**TEMPLATE_FIELDS, "builds": list}
BUILD_FIELDS = {
    "buildID": str, "status": str, "createdAt": str, "updatedAt": str, "cpuCount": int,
    "memoryMB": int,
}
STATUSES = {"building", "waiting", "ready", "error"}


def assert_fields(obj, fields, what):
    for key, kind in fields.items():
        assert key in obj, f"{what}: {key} missing in {obj}"
        assert isinstance(obj[key], kind) and not (kind is int and isinstance(obj[key], bool)), (
            f"{what}: {key} = {obj[key]!r} is not {kind}"
        )


def when(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def client(opts):
    return get_api_client(ConnectionConfig(api_key=opts["api_key"], api_url=opts["api_url"]))


def raw_json(response):
    assert response.status_code == 200, (response.status_code, response.content)
    return json.loads(response.content)


def busybox(ctx, cmd):
    return Template(file_context_path=str(ctx)).from_image("busybox").run_cmd(cmd)


@pytest.fixture
def built(strata, team, context_dir):
    """Two templates: `api-sized` built with its own CPU and memory, then a failed rebuild of
    it; `api-plain` with the server defaults, tagged `default` and `v2`."""
    _, opts = team
    started = datetime.datetime.now(datetime.timezone.utc)
    sized = Template.build(
        busybox(context_dir, "echo sized > /tmp/sized"), "api-sized", cpu_count=1, memory_mb=768, **opts
    )
    with pytest.raises(BuildException):
        Template.build(busybox(context_dir, "exit 3"), "api-sized", **opts)
    plain = Template.build(
        busybox(context_dir, "echo plain > /tmp/plain"), "api-plain", tags=["default", "v2"], **opts
    )
    return started, sized, plain


def test_get_tags_takes_a_template_name_or_id(strata, team, built):
    team_name, opts = team
    _, sized, plain = built
    for ref in ("api-plain", plain.template_id, "api-plain:v2"):
        tags = Template.get_tags(ref, **opts)
        assert sorted((t.tag, t.build_id) for t in tags) == [
            ("default", plain.build_id), ("v2", plain.build_id)
        ], ref
    assert [(t.tag, t.build_id) for t in Template.get_tags("api-sized", **opts)] == [
        ("default", sized.build_id)
    ]
    # Parsed by the generated model as well as by the SDK's wrapper.
    for tag in raw_json(get_templates_template_id_tags.sync_detailed("api-plain", client=client(opts))):
        TemplateTag.from_dict(tag)

    # Another team's name or ID is unknown, never visible.
    other = {"api_key": strata.key(f"{team_name}-other"), "api_url": strata.url}
    for ref in ("api-plain", plain.template_id):
        with pytest.raises(Exception, match="404"):
            Template.get_tags(ref, **other)
    with pytest.raises(Exception, match="404"):
        Template.get_tags("no-such-template", **opts)


def test_template_listings_answer_every_schema_field_with_the_builds_own_values(strata, team, built):
    _, opts = team
    started, sized, plain = built
    api = client(opts)
    now = datetime.datetime.now(datetime.timezone.utc)

    listing = raw_json(get_templates.sync_detailed(client=api))
    parsed = [TemplateModel.from_dict(t) for t in listing]
    assert [t.template_id for t in parsed] == [sized.template_id, plain.template_id]
    by_id = {t["templateID"]: t for t in listing}
    for t in listing:
        assert_fields(t, TEMPLATE_FIELDS, "Template")
        assert started <= when(t["createdAt"]) <= when(t["updatedAt"]) <= now
        assert (t["public"], t["createdBy"], t["lastSpawnedAt"], t["spawnCount"]) == (False, None, None, 0)

    s = by_id[sized.template_id]
    # The failed rebuild is the newest build; the template still serves the sized one.
    assert (s["buildID"], s["buildStatus"], s["buildCount"]) == (sized.build_id, "error", 2)
    assert (s["cpuCount"], s["memoryMB"]) == (1, 768)
    assert s["names"] == s["aliases"] == ["api-sized"]

    p = by_id[plain.template_id]
    assert (p["buildID"], p["buildStatus"], p["buildCount"]) == (plain.build_id, "ready", 1)
    assert (p["cpuCount"], p["memoryMB"]) == (2, 1024)
    assert p["names"] == ["api-plain"]

    detail = raw_json(get_templates_template_id.sync_detailed(sized.template_id, client=api))
    TemplateWithBuilds.from_dict(detail)
    assert_fields(detail, TEMPLATE_WITH_BUILDS_FIELDS, "TemplateWithBuilds")
    assert {k: v for k, v in detail.items() if k != "builds"} == s
    builds = detail["builds"]
    for b in builds:
        assert_fields(b, BUILD_FIELDS, "TemplateBuild")
        assert b["status"] in STATUSES
        assert started <= when(b["createdAt"]) <= when(b["updatedAt"]) <= now
        assert when(b["createdAt"]) <= when(b["finishedAt"]) <= now
    # Newest first: the failed default-resources rebuild, then the sized build.
    assert [(b["status"], b["cpuCount"], b["memoryMB"]) for b in builds] == [
        ("error", 2, 1024), ("ready", 1, 768)
    ]
    assert builds[1]["buildID"] == sized.build_id
    assert when(builds[0]["createdAt"]) > when(builds[1]["finishedAt"])


def test_the_js_client_parses_listings_and_tags_by_name(strata, team, built):
    _, opts = team
    _, sized, plain = built
    out = subprocess.run(
        ["node", str(JS_DIR / "templates_api.mjs"), "api-plain", sized.template_id],
        env={**strata.env, "E2B_API_KEY": opts["api_key"], "E2B_API_URL": opts["api_url"]},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, f"node failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    got = json.loads(out.stdout.strip().splitlines()[-1])
    tags = lambda key: sorted((t["tag"], t["buildId"]) for t in got[key])  # noqa: E731
    assert tags("tagsByName") == [("default", plain.build_id), ("v2", plain.build_id)]
    assert tags("tagsById") == [("default", sized.build_id)]
    assert [t["templateID"] for t in got["list"]] == [sized.template_id, plain.template_id]
    assert [b["cpuCount"] for b in got["template"]["builds"]] == [2, 1]
