"""A sandbox's own ports, served as E2B serves them: `sandbox.get_host(port)` is
`<port>-<id>.<domain>`, and a request whose `Host` is that name reaches the port inside that
sandbox, through the API's port and the node running it (issue 47, host routing).

The stock Python SDK launches and drives the sandbox; the requests to its ports are what a
browser or curl sends: plain HTTP/1.1 to the API's address with the sandbox's host name (no
DNS or TLS here; `domain` is the API's own host, STRATA_SANDBOX_DOMAIN's default).
"""

import hashlib
import json
import socket
import subprocess
import time
import urllib.parse
import uuid

import pytest
import httpx
from e2b import Sandbox, Template

# A server for the sandbox: answers a request with its request line and Host, and a request
# asking `Upgrade: echo` with 101, then echoes every byte (a WebSocket's shape without a
# WebSocket library in the image).
SERVER = r'''
import socket, threading
def handle(c):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = c.recv(4096)
        if not chunk:
            return
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    if b"upgrade: echo" in head.lower():
        c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n" + rest)
        while True:
            b = c.recv(4096)
            if not b:
                break
            c.sendall(b)
    else:
        host = [l for l in lines if l.lower().startswith(b"host:")][0]
        body = lines[0] + b" | " + host
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    c.close()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080))
s.listen(64)
while True:
    c, _ = s.accept()
    threading.Thread(target=handle, args=(c,), daemon=True).start()
'''


def opts(strata, team):
    return {"api_key": strata.key(team), "api_url": strata.url, "sandbox_url": strata.url}


@pytest.fixture(scope="module")
def serving(strata):
    """A running sandbox serving on 8080 (all addresses) and, with python's http.server, on
    8081 bound to its loopback only, and a 4 MiB file to download."""
    team = f"ports{uuid.uuid4().hex[:8]}"
    o = opts(strata, team)
    name = f"ports-{uuid.uuid4().hex[:6]}"
    Template.build(Template().from_image("e2bdev/base").run_cmd("mkdir -p /tmp/www"), name,
                   api_key=o["api_key"], api_url=o["api_url"])
    sbx = Sandbox.create(name, timeout=300, **o)
    sbx.files.write("/tmp/server.py", SERVER)
    sbx.commands.run("head -c 4194304 /dev/urandom > /tmp/www/blob", user="root")
    sbx.commands.run("python3 /tmp/server.py", background=True, user="root")
    sbx.commands.run("python3 -m http.server 8081 --bind 127.0.0.1 --directory /tmp/www", background=True)
    blob = hashlib.sha256(sbx.files.read("/tmp/www/blob", format="bytes")).hexdigest()
    yield {"sbx": sbx, "strata": strata, "blob": blob, "opts": o}
    sbx.kill()


def agent_address(strata):
    """The node agent's address: the server's one listening TCP socket that is not the API's."""
    listening = subprocess.run(["ss", "-ltnpH"], check=True, capture_output=True, text=True).stdout
    api_port = urllib.parse.urlsplit(strata.url).port
    mine = [line.split()[3] for line in listening.splitlines() if f"pid={strata.proc.pid}," in line]
    others = [a for a in mine if not a.endswith(f":{api_port}")]
    assert len(others) == 1, f"expected the agent's one socket beside the API's: {mine}"
    return others[0]


def get(strata, host, path="/", **kwargs):
    return httpx.get(strata.url + path, headers={"Host": host, **kwargs.pop("headers", {})}, timeout=30, **kwargs)


def wait_for(strata, host, path="/"):
    deadline = time.monotonic() + 30
    while True:
        r = get(strata, host, path)
        if r.status_code == 200 or time.monotonic() > deadline:
            return r
        time.sleep(0.2)


def test_a_port_is_served_at_its_host_with_the_host_the_caller_named(serving):
    strata, sbx = serving["strata"], serving["sbx"]
    host = sbx.get_host(8080)
    assert host == f"8080-{sbx.sandbox_id}.127.0.0.1", host
    r = wait_for(strata, host, "/hello?x=1")
    assert r.status_code == 200, r.text
    assert r.text == f"GET /hello?x=1 HTTP/1.1 | host: {host}", r.text


def test_a_server_on_the_sandboxs_loopback_is_reached_and_bodies_stream_whole(serving):
    strata, sbx = serving["strata"], serving["sbx"]
    r = wait_for(strata, sbx.get_host(8081), "/blob")
    assert r.status_code == 200, r.text[:200]
    assert hashlib.sha256(r.content).hexdigest() == serving["blob"]


def test_an_upgraded_connection_is_relayed_both_ways(serving):
    strata, sbx = serving["strata"], serving["sbx"]
    host = sbx.get_host(8080)
    wait_for(strata, host)
    api = urllib.parse.urlsplit(strata.url)
    with socket.create_connection((api.hostname, api.port), timeout=10) as s:
        s.sendall(f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            assert chunk, f"closed after {head!r}"
            head += chunk
        assert head.startswith(b"HTTP/1.1 101"), head
        for word in [b"ping-1", b"x" * 70000, b"ping-3"]:
            s.sendall(word)
            got = b""
            while len(got) < len(word):
                chunk = s.recv(65536)
                assert chunk, "the relay closed the upgraded connection"
                got += chunk
            assert got == word


def test_unknown_sandboxes_and_closed_ports_answer_as_e2bs_edge_does(serving):
    strata, sbx = serving["strata"], serving["sbx"]
    r = get(strata, "8080-nosuchsandbox0.127.0.0.1")
    assert r.status_code == 502
    assert "was not found" in r.json()["message"]
    r = get(strata, sbx.get_host(8099))
    assert r.status_code == 502
    assert "port is not open" in r.json()["message"], r.text
    assert r.json()["sandboxId"] == sbx.sandbox_id
    # A host that is not a sandbox's is the API's own.
    assert get(strata, "127.0.0.1", "/health").status_code == 200


def test_envd_is_reached_by_host_and_still_asks_for_the_sandboxs_token(serving):
    strata, sbx = serving["strata"], serving["sbx"]
    host = sbx.get_host(49983)
    assert get(strata, host, "/health").status_code in (200, 204)
    listing = httpx.post(
        strata.url + "/process.Process/List",
        headers={"Host": host, "Content-Type": "application/json"},
        content="{}",
        timeout=30,
    )
    assert listing.status_code == 401, listing.text
    token = sbx._envd_access_token
    listing = httpx.post(
        strata.url + "/process.Process/List",
        headers={"Host": host, "Content-Type": "application/json", "X-Access-Token": token},
        content="{}",
        timeout=30,
    )
    assert listing.status_code == 200, listing.text
    assert "processes" in json.loads(listing.text)


def test_a_killed_sandboxs_ports_are_gone(strata, serving):
    o = serving["opts"]
    sbx = Sandbox.create(serving["sbx"].get_info().template_id, timeout=120, **o)
    sbx.files.write("/tmp/server.py", SERVER)
    sbx.commands.run("python3 /tmp/server.py", background=True, user="root")
    host = sbx.get_host(8080)
    assert wait_for(strata, host).status_code == 200
    sbx.kill()
    r = get(strata, host)
    assert r.status_code == 502 and "was not found" in r.json()["message"], r.text


def test_a_port_request_reaches_only_the_named_sandboxs_own_loopback(strata, serving):
    """Hostile: the relay connects inside the named sandbox's network namespace, never the
    node's and never another sandbox's. A service on the node's loopback and the first
    sandbox's server on 8080 stay out of reach through a second sandbox's host names."""
    node = socket.socket()
    node.bind(("127.0.0.1", 0))
    node.listen(8)
    node_port = node.getsockname()[1]
    accepted = []

    def answer():
        while True:
            try:
                c, _ = node.accept()
            except OSError:
                return
            accepted.append(c)
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: close\r\n\r\nnode-secret")
            c.close()

    import threading
    threading.Thread(target=answer, daemon=True).start()
    other = Sandbox.create(serving["sbx"].get_info().template_id, timeout=120, **serving["opts"])
    try:
        wait_for(strata, serving["sbx"].get_host(8080))
        for host in [other.get_host(node_port), other.get_host(8080), serving["sbx"].get_host(node_port)]:
            r = get(strata, host)
            assert r.status_code == 502, (host, r.text)
            assert "port is not open" in r.json()["message"], r.text
            assert "node-secret" not in r.text
        assert not accepted, "the node's own service was reached through a sandbox's host name"
    finally:
        other.kill()
        node.close()


def test_a_sandbox_without_public_traffic_serves_its_ports_only_with_its_traffic_token(strata, serving):
    """E2B's `allowPublicTraffic: false`: create answers a traffic token, and a request for a
    port is refused (403) unless it carries it in `e2b-traffic-access-token`. A public
    sandbox has no token and asks for none."""
    assert serving["sbx"].traffic_access_token is None
    o = serving["opts"]
    sbx = Sandbox.create(
        serving["sbx"].get_info().template_id, timeout=120, network={"allow_public_traffic": False}, **o
    )
    try:
        token = sbx.traffic_access_token
        assert token, "create answers a traffic token"
        sbx.files.write("/tmp/server.py", SERVER)
        sbx.commands.run("python3 /tmp/server.py", background=True, user="root")
        host = sbx.get_host(8080)
        with_token = {"e2b-traffic-access-token": token}
        deadline = time.monotonic() + 30
        while get(strata, host, headers=with_token).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        r = get(strata, host, "/private", headers=with_token)
        assert r.status_code == 200 and r.text.startswith("GET /private HTTP/1.1"), r.text
        for headers in [{}, {"e2b-traffic-access-token": token + "x"}, {"e2b-traffic-access-token": ""}]:
            r = get(strata, host, headers=headers)
            assert r.status_code == 403, (headers, r.text)
            assert "e2b-traffic-access-token" in r.json()["message"], r.text
        # Hostile: straight to the node's agent, past the API's check, the token is still asked.
        agent = agent_address(strata)
        direct = {"e2b-sandbox-id": sbx.sandbox_id, "e2b-sandbox-port": "8080"}
        r = httpx.get(f"http://{agent}/", headers=direct, timeout=30)
        assert r.status_code == 403, r.text
        r = httpx.get(f"http://{agent}/", headers={**direct, **with_token}, timeout=30)
        assert r.status_code == 200, r.text
        # envd is the SDK's, with its own token: unchanged.
        assert sbx.commands.run("echo envd").stdout == "envd\n"
    finally:
        sbx.kill()
