"""A file name is never an instruction to the node (issue: one file name emptied the layer cache).

OCI layers spell a deletion as a file named `.wh.<name>`. Tried as a hostile tenant would,
through the stock Python SDK: team A runs a sandbox on its template while team B makes files
whose names are whiteouts of `..`, `.` or nothing, or opaque markers, in a build step, and pulls
an image whose layer holds such entries. B gets a refusal naming the path; the node's layer
cache and A's running sandbox are untouched.
"""

import uuid

import pytest
from e2b import Sandbox, Template

from conftest import Layout, tar_of
from test_sdk_sandbox import opts


def layer_cache(strata):
    return {p.name for p in (strata.data_dir / "layers").iterdir()}


@pytest.fixture(scope="module")
def bystander(strata):
    """Team A's sandbox, running on a template whose layers the node extracted."""
    o = opts(strata, f"a{uuid.uuid4().hex[:8]}")
    name = f"bystander-{uuid.uuid4().hex[:6]}"
    nonce = uuid.uuid4().hex
    Template.build(
        Template().from_image("e2bdev/base").run_cmd(f"echo {nonce} > /home/user/mine.txt"),
        name,
        api_key=o["api_key"],
        api_url=o["api_url"],
    )
    sbx = Sandbox.create(name, timeout=600, **o)
    yield sbx, nonce
    sbx.kill()


def assert_untouched(strata, bystander, cache_before):
    sbx, nonce = bystander
    after = layer_cache(strata)
    assert cache_before <= after, f"layer cache entries removed: {sorted(cache_before - after)}"
    r = sbx.commands.run("cat /home/user/mine.txt && ls /usr/bin | wc -l")
    first, count = r.stdout.split()
    assert first == nonce and int(count) > 100, r.stdout


@pytest.mark.parametrize(
    "path",
    [
        "/.wh...",  # a whiteout of `..`: the directory holding the layer's tree
        "/x/.wh...",
        "/.wh..",  # of `.`
        "/.wh.",  # of nothing
        "/.wh..wh..opq",  # an opaque marker, made as a file
        "/etc/.wh.passwd",  # would delete /etc/passwd wherever the layer is extracted
    ],
)
def test_a_whiteout_name_in_a_step_is_refused_naming_it(strata, bystander, path):
    cache_before = layer_cache(strata)
    o = opts(strata, f"b{uuid.uuid4().hex[:8]}")
    parent = path.rsplit("/", 1)[0] or "/"
    tpl = Template().from_image("e2bdev/base").run_cmd(
        f"mkdir -p '{parent}' && touch '{path}' && echo {uuid.uuid4().hex}", user="root"
    )
    with pytest.raises(Exception) as err:
        Template.build(tpl, f"whiteout-{uuid.uuid4().hex[:6]}", api_key=o["api_key"], api_url=o["api_url"])
    assert_untouched(strata, bystander, cache_before)
    message = str(err.value)
    assert f"{path}: a file name beginning with \".wh.\" is reserved" in message, message


@pytest.mark.parametrize("entry", [".wh...", "usr/.wh...", ".wh..", ".wh.", "etc/.wh..wh.plnk"])
def test_a_pulled_layer_with_a_whiteout_of_no_file_is_refused(strata, bystander, registries, tmp_path, entry):
    cache_before = layer_cache(strata)
    o = opts(strata, f"b{uuid.uuid4().hex[:8]}")
    layout = Layout(tmp_path / "layout")
    layout.image(
        [registries.busybox_tar, tar_of({"etc/marker": uuid.uuid4().hex, entry: ""})],
        ["PATH=/usr/bin:/bin"],
        "img",
    )
    dest = f"hostile/whiteout:{uuid.uuid4().hex[:6]}"
    registries.open.push(layout, "img", dest)
    with pytest.raises(Exception) as err:
        Template.build(
            Template().from_image(f"{registries.open.addr}/{dest}").run_cmd("true"),
            f"pulled-{uuid.uuid4().hex[:6]}",
            api_key=o["api_key"],
            api_url=o["api_url"],
        )
    assert_untouched(strata, bystander, cache_before)
    message = str(err.value)
    assert entry in message and "whiteout" in message, message
