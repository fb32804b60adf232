"""The stock Python SDK with no `sandbox_url`, as E2B users run it: it reaches a sandbox's envd
at `https://49983-<id>.<domain>` (port 443) and its ports at `https://<port>-<id>.<domain>`.

strata serves the API over TLS for `*.<domain>` (STRATA_SANDBOX_TLS_LISTEN, _CERT, _KEY) with a
certificate made here by a test CA the client trusts through `SSL_CERT_FILE`. The names resolve
through `/etc/hosts` in a mount namespace of the client's own, in which the client itself adds
its sandbox's names once it knows the id (hosts files have no wildcards); nothing of the
machine's own resolver changes.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import uuid

import pytest

from conftest import ROOT, Strata, copy_node_images

DOMAIN = "strata.test"
TLS_IP = "127.0.0.43"

CLIENT = r'''
import json, os, ssl, sys, time
import httpx
from e2b import Sandbox, Template

api_key, api_url, hosts, ip = sys.argv[1:5]
name = "tls-" + os.urandom(3).hex()
Template.build(Template().from_image("e2bdev/base"), name, api_key=api_key, api_url=api_url)
sbx = Sandbox.create(name, timeout=120, api_key=api_key, api_url=api_url)
with open(hosts, "a") as f:
    f.write(f"{ip} {sbx.get_host(49983)} {sbx.get_host(8080)}\n")
out = {"id": sbx.sandbox_id, "envd_url": sbx.envd_api_url}
try:
    out["echo"] = sbx.commands.run("echo over-tls").stdout
    sbx.files.write("/tmp/www/index.html", "served-over-tls\n")
    out["read"] = sbx.files.read("/tmp/www/index.html")
    sbx.commands.run("python3 -m http.server 8080 --directory /tmp/www", background=True)
    trust = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    served = None
    for _ in range(100):
        try:
            r = httpx.get(f"https://{sbx.get_host(8080)}/", verify=trust, timeout=10)
            if r.status_code == 200:
                served = r.text
                break
        except httpx.HTTPError as e:
            served = repr(e)
        time.sleep(0.2)
    out["served"] = served
    # Signed file URLs name the sandbox's envd host: usable from curl or a browser as they are.
    out["download"] = httpx.get(sbx.download_url("/tmp/www/index.html"), verify=trust, timeout=10).text
    up = httpx.post(sbx.upload_url("/tmp/www/uploaded.txt"), files={"file": ("x", b"up-over-tls")}, verify=trust, timeout=10)
    out["upload"] = [up.status_code, sbx.files.read("/tmp/www/uploaded.txt")]
    try:
        system = ssl.create_default_context(cafile="/etc/ssl/certs/ca-certificates.crt")
        httpx.get(f"https://{sbx.get_host(8080)}/", verify=system, timeout=10)
        out["untrusted"] = "accepted"
    except httpx.HTTPError as e:
        out["untrusted"] = type(e).__name__
finally:
    sbx.kill()
print(json.dumps(out))
'''


def make_certificates(d: pathlib.Path):
    """A CA, and a certificate it signed for `*.DOMAIN` (and DOMAIN): (ca, cert, key)."""
    run = lambda *a: subprocess.run(a, check=True, capture_output=True, cwd=d)
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", "/CN=strata test CA", "-keyout", "ca.key", "-out", "ca.pem")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=*.{DOMAIN}",
        "-keyout", "host.key", "-out", "host.csr")
    (d / "san.ext").write_text(f"subjectAltName=DNS:*.{DOMAIN},DNS:{DOMAIN}\n")
    run("openssl", "x509", "-req", "-in", "host.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "host.pem")
    return d / "ca.pem", d / "host.pem", d / "host.key"


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory, registries):
    with socket.socket() as probe:
        # As the server binds it: a connection of an earlier run in TIME_WAIT does not count.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((TLS_IP, 443))
        except OSError as e:
            pytest.fail(f"{TLS_IP}:443 is taken ({e}); the TLS test needs it")
    certs = tmp_path_factory.mktemp("tls")
    ca, cert, key = make_certificates(certs)
    data_dir = tmp_path_factory.mktemp("strata-tls")
    copy_node_images(data_dir)
    server = Strata(data_dir)
    server.env["STRATA_REGISTRY_MIRRORS"] = f"docker.io=http://{registries.open.addr}"
    server.env["STRATA_SANDBOX_DOMAIN"] = DOMAIN
    server.env["STRATA_SANDBOX_TLS_LISTEN"] = f"{TLS_IP}:443"
    server.env["STRATA_SANDBOX_TLS_CERT"] = str(cert)
    server.env["STRATA_SANDBOX_TLS_KEY"] = str(key)
    server.start()
    yield server, ca
    server.stop()


def test_the_sdk_without_a_sandbox_url_reaches_envd_and_ports_over_tls(tls_server, tmp_path):
    server, ca = tls_server
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env["SSL_CERT_FILE"] = str(ca)
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts),
         str(ROOT / ".venv" / "bin" / "python"), str(script), server.key("tls"), server.url, str(hosts), TLS_IP],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, f"client failed ({out.returncode}):\n{out.stdout}\n{out.stderr[-4000:]}"
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["envd_url"] == f"https://49983-{got['id']}.{DOMAIN}", got
    assert got["echo"] == "over-tls\n", got
    assert got["read"] == "served-over-tls\n", got
    assert got["served"] == "served-over-tls\n", got
    assert got["download"] == "served-over-tls\n", got
    assert got["upload"] == [200, "up-over-tls"], got
    # The machine's own trust store (not SSL_CERT_FILE) does not know the test CA: the
    # certificate is what is checked.
    assert got["untrusted"] == "ConnectError", got
