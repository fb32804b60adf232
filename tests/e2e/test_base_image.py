"""The built-in `e2bdev/base` carries what users of E2B's default image expect, so the SDK's
package and clone helpers work on it unchanged.

Everything comes from the test's outside world (a network namespace of its own,
conftest.Outside), which the build sandbox reaches through its own network because strata's
allow list names it: `apt_install` from a Debian mirror there (the node's own signed index and
the packages `scripts/setup.sh` downloaded, served under the host name of the mirror the base
image's apt sources name, which the world's DNS answers), the pip wheel, the npm tarball and the git repository from an HTTP server there.
"""

import base64
import hashlib
import io
import json
import os
import subprocess
import tarfile
import zipfile

import pytest
from e2b import Template
from e2b.exceptions import BuildException

from test_sdk_build import exec_in


def wheel(path):
    """A minimal pure-Python wheel of `stratacheck` 1.0."""
    files = {
        "stratacheck/__init__.py": b'VALUE = "wheel-ok"\n',
        "stratacheck-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: stratacheck\nVersion: 1.0\n",
        "stratacheck-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: strata-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("stratacheck-1.0.dist-info/RECORD,,")
    files["stratacheck-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)


def npm_tarball(path):
    """An npm package tarball of `strata-check` 1.0.0."""
    files = {
        "package/package.json": json.dumps({"name": "strata-check", "version": "1.0.0", "main": "index.js"}).encode(),
        "package/index.js": b'module.exports = "npm-ok";\n',
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))


def git_repo(root):
    """A bare repository served over git's dumb HTTP protocol, with one commit."""
    work = root / "work"
    work.mkdir()
    git = lambda *a, cwd=work: subprocess.run(["git", *a], cwd=cwd, check=True, capture_output=True)  # noqa: E731
    git("init", "-q", "-b", "main")
    (work / "README").write_text("cloned-ok\n")
    git("add", "README")
    git("-c", "user.name=strata", "-c", "user.email=strata@localhost", "commit", "-q", "-m", "one")
    git("clone", "-q", "--bare", str(work), str(root / "repo.git"), cwd=root)
    git("update-server-info", cwd=root / "repo.git")


@pytest.fixture
def packages(tmp_path, outside):
    """An HTTP server in the test's outside world serving a wheel, an npm tarball and a git
    repository."""
    root = tmp_path / "served"
    root.mkdir()
    wheel(root / "stratacheck-1.0-py3-none-any.whl")
    npm_tarball(root / "strata-check-1.0.0.tgz")
    git_repo(root)
    port = 8000 + os.getpid() % 1000
    server = outside.popen(
        ["python3", "-m", "http.server", "--bind", outside.ip, "--directory", str(root), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    outside.wait_for(port, server)
    yield f"http://{outside.ip}:{port}"
    server.terminate()
    server.wait(timeout=30)
    outside.procs.remove(server)


TOOLS = (
    "id -un; curl --version | head -n1 | cut -d' ' -f1; git --version | cut -d' ' -f1-2; "
    "sudo -n true && echo sudo-ok; python3 -m pip --version | cut -d' ' -f1; "
    "node -v | cut -c1; npm -v | grep -Eq '^[0-9]+[.]' && echo npm-ok; "
    "test -s /etc/ssl/certs/ca-certificates.crt && echo ca-ok"
)
TOOLS_OUT = "user\ncurl\ngit version\nsudo-ok\npip\nv\nnpm-ok\nca-ok\n"


def test_the_e2b_base_has_the_tools_and_the_sdk_helpers_work_on_it(strata, team, tmp_path, packages):
    team_name, opts = team
    template = (
        Template(file_context_path=str(tmp_path))
        .from_base_image()
        .run_cmd(f"{{ {TOOLS}; }} > /home/user/tools-at-build.txt")
        .apt_install(["tree"])
        .pip_install([f"{packages}/stratacheck-1.0-py3-none-any.whl"])
        .npm_install(["--no-audit", "--no-fund", f"{packages}/strata-check-1.0.0.tgz"])
        .git_clone(f"{packages}/repo.git", "/home/user/repo")
    )
    Template.build(template, "base-tools", **opts)

    assert exec_in(strata, team_name, "base-tools", "cat /home/user/tools-at-build.txt") == TOOLS_OUT
    assert exec_in(strata, team_name, "base-tools", TOOLS) == TOOLS_OUT
    got = exec_in(
        strata,
        team_name,
        "base-tools",
        "tree --version | cut -d' ' -f1; python3 -c 'import stratacheck; print(stratacheck.VALUE)'; "
        "cd /home/user && node -e 'console.log(require(\"strata-check\"))'; "
        "cat /home/user/repo/README; stat -c %U /home/user/repo",
    )
    assert got == "tree\nwheel-ok\nnpm-ok\ncloned-ok\nuser\n", got


def test_a_missing_image_says_how_to_get_one(strata, team, tmp_path):
    _, opts = team
    with pytest.raises(BuildException) as err:
        Template.build(Template(file_context_path=str(tmp_path)).from_image("acme/missing:1"), "no-image", **opts)
    message = str(err.value)
    assert "was not found in its registry" in message and "e2bdev/base" in message, message
    assert "`strata image pull REF` or `strata image import` adds one" in message, message
    assert "acme/missing" in message, message
