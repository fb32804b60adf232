//! Each sandbox has its own network (ADR 0022): the public internet and the operator's
//! exceptions, never the node, its private networks or other sandboxes. The "outside" hosts
//! here are network namespaces the test makes (`common::outside`), on private addresses, so a
//! sandbox reaches them only through `STRATA_SANDBOX_EGRESS_ALLOW`; nothing leaves the machine.

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::time::Duration;

use crate::common;

use common::outside::{serve_http, Outside};
use common::sandbox::*;
use strata::domain::egress_policy::{EgressMode, EgressPolicy};
use strata::vmm::{BootSpec, ExecRequest, Network, NetworkConfig, Sandbox};

fn config(allow: &str) -> NetworkConfig {
    let mut c = NetworkConfig::default();
    c.policy.allow = EgressPolicy::parse_allow(allow).unwrap();
    c
}

fn networked(layers: Vec<strata::domain::ids::Digest>) -> BootSpec {
    let mut s = BootSpec::new(layers);
    s.limits.network = Network::Egress;
    s
}

/// The body `url` (`http://IP:PORT/`) served, or `None` when no connection was made in two
/// seconds. busybox's own `nc`, as its `wget` crashes in the static build's name lookup.
async fn fetch(sb: &mut Box<dyn Sandbox>, url: &str) -> Option<String> {
    let target = url.trim_start_matches("http://").trim_end_matches('/');
    let (host, port) = target.rsplit_once(':').expect("http://IP:PORT/");
    let cmd = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {host} {port}");
    let out = exec(sb, ExecRequest::shell(&cmd)).await;
    let body = out
        .stdout
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.trim_end().to_string());
    if body.is_none() {
        eprintln!("{cmd}: {:?} {}", out.outcome, out.stderr.trim());
    }
    body
}

/// The sandbox's IPv4 address on `eth0`.
async fn address(sb: &mut Box<dyn Sandbox>) -> Ipv4Addr {
    let out = sh(sb, "ip -4 -o addr show eth0").await;
    let inet = out
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .unwrap_or_else(|| panic!("no address in {out}"));
    inet.split('/').next().unwrap().parse().unwrap()
}

/// A service of the node's, answering "host-service" on every host address (loopback, the
/// host's own, each sandbox link's host end); its port.
fn node_service() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    serve_http(listener, "host-service");
    port
}

/// The sandbox's default gateway: its link's host end, an address of the node.
async fn gateway(sb: &mut Box<dyn Sandbox>) -> String {
    sh(sb, "ip route | awk '/default/ {print $3}'")
        .await
        .trim()
        .to_string()
}

/// The host's own address on its first real interface (not loopback, not a test's link).
fn host_address() -> Ipv4Addr {
    strata::host_interfaces::addresses()
        .into_iter()
        .find_map(|(name, ip)| match ip {
            IpAddr::V4(v4)
                if !v4.is_loopback() && !name.starts_with("sbx") && !name.starts_with("sto") =>
            {
                Some(v4)
            }
            _ => None,
        })
        .expect("the host has an IPv4 address")
}

#[tokio::test]
async fn an_outside_host_is_reached_only_when_its_range_is_allowed() {
    let world = Outside::new();
    let served = world.http("outside-ok");
    let url = format!("http://{served}/");

    let closed = backend();
    let mut sb = boot(&closed, networked(busybox(&closed).await)).await;
    assert_eq!(
        fetch(&mut sb, &url).await,
        None,
        "10.252/16 is private: denied by default"
    );
    sb.destroy().await.unwrap();

    let other_port = backend_with_network(config(&format!("{}:{}", world.ip, served.port() + 1)));
    let mut sb = boot(&other_port, networked(busybox(&other_port).await)).await;
    assert_eq!(
        fetch(&mut sb, &url).await,
        None,
        "only the listed port opens"
    );
    sb.destroy().await.unwrap();

    let open = backend_with_network(config(&format!(
        "10.252.0.0/16, {}:{}",
        world.ip,
        served.port()
    )));
    let mut sb = boot(&open, networked(busybox(&open).await)).await;
    assert_eq!(fetch(&mut sb, &url).await.as_deref(), Some("outside-ok"));
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn no_service_of_the_node_is_reachable_unless_its_address_is_listed() {
    let port = node_service();
    let host = host_address();

    // An allow list that names other ranges opens nothing of the node's.
    let backend = backend_with_network(config("10.252.0.0/16, 192.168.0.0/16"));
    let mut sb = boot(&backend, networked(busybox(&backend).await)).await;
    let gateway = gateway(&mut sb).await;
    for target in [
        host.to_string(),
        gateway.clone(),
        "127.0.0.1".to_string(),
        "169.254.169.254".to_string(),
    ] {
        assert_eq!(
            fetch(&mut sb, &format!("http://{target}:{port}/")).await,
            None,
            "{target} is the node's"
        );
    }
    // The test database listens on no TCP port and its socket is not in the sandbox.
    sh(&mut sb, "! ls /tmp/strata-test-pg 2>/dev/null").await;
    sb.destroy().await.unwrap();

    // Listing the host's address opens that port, and only it.
    let listed = backend_with_network(config(&format!("{host}/32:{port}")));
    let mut sb = boot(&listed, networked(busybox(&listed).await)).await;
    assert_eq!(
        fetch(&mut sb, &format!("http://{host}:{port}/"))
            .await
            .as_deref(),
        Some("host-service")
    );
    sb.destroy().await.unwrap();
}

/// An operator who opens a whole range (here every address) for builds does not open the node
/// with it: its services answer on its own address and on each link's host end, and only an
/// exception naming that one address opens it (above).
#[tokio::test]
async fn a_range_that_holds_the_nodes_addresses_does_not_open_the_node() {
    let port = node_service();
    let host = host_address();
    let world = Outside::new();
    let served = world.http("outside-ok");

    let backend = backend_with_network(config("0.0.0.0/0"));
    let mut sb = boot(&backend, networked(busybox(&backend).await)).await;
    assert_eq!(
        fetch(&mut sb, &format!("http://{served}/"))
            .await
            .as_deref(),
        Some("outside-ok"),
        "the range is open"
    );
    let gateway = gateway(&mut sb).await;
    for target in [host.to_string(), gateway.clone(), world.host_ip.to_string()] {
        assert_eq!(
            fetch(&mut sb, &format!("http://{target}:{port}/")).await,
            None,
            "{target} is the node's, inside the allowed range"
        );
    }
    sb.destroy().await.unwrap();
}

/// One sandbox cannot fill the host's connection-tracking table, which every sandbox and the
/// host's own connections share: past its cap a new connection is refused at once, the other
/// sandboxes' are not, and the count falls as its connections end.
#[tokio::test]
async fn a_sandbox_holds_no_more_connections_than_its_cap() {
    let world = Outside::new();
    let served = world.http("outside-ok");
    let holding = world.holding();
    let mut c = config("10.252.0.0/16");
    c.policy.max_connections = 4;
    let backend = backend_with_network(c);
    let base = busybox(&backend).await;
    let mut a = boot(&backend, networked(base.clone())).await;
    let mut b = boot(&backend, networked(base)).await;
    let (host, port) = (holding.ip(), holding.port());
    let try_one = format!(
        "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {} {} 2>&1 | tail -n 1",
        served.ip(),
        served.port()
    );
    let hoard = format!(
        "for i in 1 2 3 4; do ( (sleep 30 | nc {host} {port}) >/dev/null 2>&1 &) ; done; sleep 1; \
         start=$(date +%s); echo \"fifth: $({try_one})\"; echo \"took: $(( $(date +%s) - start ))\"; \
         sleep 3; killall nc; sleep 1; echo \"after: $({try_one})\""
    );
    let (hoarded, from_b) = tokio::join!(sh(&mut a, &hoard), async {
        tokio::time::sleep(Duration::from_millis(2000)).await;
        fetch(&mut b, &format!("http://{served}/")).await
    });
    assert!(
        hoarded.contains("fifth: nc: can't connect to remote host")
            && hoarded.contains("No route to host"),
        "the fifth connection is refused: {hoarded}"
    );
    assert!(
        hoarded.contains("took: 0") || hoarded.contains("took: 1"),
        "refused at once, not timed out: {hoarded}"
    );
    assert!(
        hoarded.contains("after: outside-ok"),
        "connections that ended no longer count: {hoarded}"
    );
    assert_eq!(
        from_b.as_deref(),
        Some("outside-ok"),
        "another sandbox's count is its own"
    );
    a.destroy().await.unwrap();
    b.destroy().await.unwrap();
}

/// The table is the host's and something else may flush it (an operator's `nft flush
/// ruleset`, a firewall manager's reload): with it gone a sandbox reaches the node and its
/// private networks. The node installs it again within moments, whole.
#[tokio::test]
async fn the_node_restores_its_firewall_when_something_else_removes_it() {
    use strata::vmm::namespace::firewall_keeper::KEEP_EVERY;
    let port = node_service();
    let world = Outside::new();
    let served = world.http("outside-ok");
    let network = config("10.252.0.0/16");
    let policy = network.policy.clone();
    let backend = backend_with_network(network);
    let mut sb = boot(&backend, networked(busybox(&backend).await)).await;
    let gateway = gateway(&mut sb).await;

    let nft = |args: &str| {
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("nft {args}")])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let restored_within = |what: &str, check: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + KEEP_EVERY * 5;
        while std::time::Instant::now() < deadline {
            if check() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("{what}: not restored within {:?}", KEEP_EVERY * 5);
    };

    // The whole table, as `nft flush ruleset` takes it.
    assert!(nft("delete table inet strata").0);
    restored_within("the deleted table", &|| nft("list table inet strata").0);
    assert_eq!(
        fetch(&mut sb, &format!("http://{gateway}:{port}/")).await,
        None
    );
    assert_eq!(
        fetch(&mut sb, &format!("http://{served}/"))
            .await
            .as_deref(),
        Some("outside-ok"),
        "the allow list and NAT are back too"
    );

    // One rule: the drop of the node's own addresses in this policy's chain.
    let chain = format!("policy_{:08x}", policy.fingerprint());
    let (_, listed) = nft(&format!("-a list chain inet strata {chain}"));
    let handle = listed
        .lines()
        .find(|l| l.contains("fib daddr type local drop"))
        .and_then(|l| l.rsplit_once("# handle "))
        .map(|(_, h)| h.trim().to_string())
        .unwrap_or_else(|| panic!("no local drop in:\n{listed}"));
    assert!(nft(&format!("delete rule inet strata {chain} handle {handle}")).0);
    restored_within("the deleted rule", &|| {
        nft(&format!("list chain inet strata {chain}"))
            .1
            .contains("fib daddr type local drop")
    });
    assert_eq!(
        fetch(&mut sb, &format!("http://{gateway}:{port}/")).await,
        None
    );
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn a_sandbox_sees_only_its_own_interfaces_and_its_root_cannot_change_them() {
    let backend = backend();
    let catalog = strata::vmm::image::ImageCatalog::open(&node_dir()).unwrap();
    let base = catalog
        .get("e2bdev/base")
        .expect("e2bdev/base in the test node (scripts/setup.sh builds it)");
    let mut s = networked(base.digests());
    s.context.env = base.config.env.clone();
    let mut sb = boot(&backend, s).await;

    let names = sh(
        &mut sb,
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort",
    )
    .await;
    assert_eq!(names, "eth0\nlo\n");
    for (what, cmd) in [
        ("taking its link down", "ip link set eth0 down"),
        ("adding an address", "ip addr add 10.9.9.9/32 dev eth0"),
        ("changing its routes", "ip route add 10.9.0.0/16 dev eth0"),
        (
            "a packet socket",
            "python3 -c 'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)'",
        ),
        (
            "a raw IP socket",
            "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'",
        ),
    ] {
        let out = exec(&mut sb, ExecRequest::shell(cmd)).await;
        assert!(
            !out.outcome.success(),
            "{what} must be refused: {}",
            out.stdout
        );
    }
    assert_eq!(
        names,
        sh(
            &mut sb,
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort"
        )
        .await
    );

    // A port root binds is the sandbox's, not the host's.
    sh(
        &mut sb,
        "mkdir -p /tmp/www && echo in-sandbox > /tmp/www/index.html && python3 -m http.server -d /tmp/www 8719 >/dev/null 2>&1 </dev/null & \
         for i in $(seq 50); do curl -sf -o /dev/null http://127.0.0.1:8719/ && exit 0; sleep 0.1; done; exit 1",
    )
    .await;
    let host_side = std::net::TcpStream::connect_timeout(
        &"127.0.0.1:8719".parse().unwrap(),
        Duration::from_secs(2),
    );
    assert!(
        host_side.is_err(),
        "the sandbox's port 8719 is not the host's"
    );
    sb.destroy().await.unwrap();
}

/// Serves `body` on port 8080 of the sandbox for `secs` seconds (a command's processes end
/// with it), answering itself once first so the server is known to be up.
fn serving(body: &str, secs: u32) -> String {
    format!(
        "mkdir -p /tmp/www && echo {body} > /tmp/www/index.html && httpd -p 8080 -h /tmp/www && \
         printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 127.0.0.1 8080 | tail -n 1 && sleep {secs}"
    )
}

#[tokio::test]
async fn two_sandboxes_cannot_reach_each_other_even_when_their_subnet_is_allowed() {
    let backend = backend_with_network(config(NetworkConfig::DEFAULT_SUBNET));
    let base = busybox(&backend).await;
    let mut a = boot(&backend, networked(base.clone())).await;
    let mut b = boot(&backend, networked(base)).await;
    let a_ip = address(&mut a).await;
    let b_ip = address(&mut b).await;
    assert_ne!(a_ip, b_ip);
    let url = format!("http://{a_ip}:8080/");
    let serve = serving("from-a", 4);
    let (served, from_b) = tokio::join!(sh(&mut a, &serve), async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        fetch(&mut b, &url).await
    });
    assert_eq!(served, "from-a\n", "a serves");
    assert_eq!(from_b, None);
    a.destroy().await.unwrap();
    b.destroy().await.unwrap();
}

#[tokio::test]
async fn dns_goes_to_the_nodes_resolver_and_nowhere_else_private() {
    let world = Outside::new();
    world.dns("outside.test", Ipv4Addr::new(203, 0, 113, 7));
    let mut c = NetworkConfig::default();
    c.policy.dns = vec![world.ip];
    let backend = backend_with_network(c);
    let mut sb = boot(&backend, networked(busybox(&backend).await)).await;

    let resolv = sh(&mut sb, "cat /etc/resolv.conf").await;
    assert!(
        resolv.contains(&format!("nameserver {}", world.ip)),
        "{resolv}"
    );
    let answer = sh(&mut sb, "nslookup outside.test").await;
    assert!(answer.contains("203.0.113.7"), "{answer}");
    // Port 53 of the resolver is open; nothing else of it.
    let served = world.http("outside-ok");
    assert_eq!(fetch(&mut sb, &format!("http://{served}/")).await, None);
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn egress_none_leaves_only_loopback() {
    let world = Outside::new();
    let served = world.http("outside-ok");
    let mut c = config("10.252.0.0/16");
    c.policy.mode = EgressMode::None;
    let backend = backend_with_network(c);
    let mut sb = boot(&backend, networked(busybox(&backend).await)).await;
    let names = sh(
        &mut sb,
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
    )
    .await;
    assert_eq!(names, "lo\n");
    assert_eq!(fetch(&mut sb, &format!("http://{served}/")).await, None);
    // Loopback works inside.
    assert_eq!(sh(&mut sb, &serving("lo", 0)).await, "lo\n");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn a_sandbox_keeps_its_network_across_checkpoints_and_its_link_goes_with_it() {
    let world = Outside::new();
    let served = world.http("outside-ok");
    let backend = backend_with_network(config("10.252.0.0/16"));
    let mut sb = boot(&backend, networked(busybox(&backend).await)).await;
    let before = address(&mut sb).await;
    let link = link_of(before);
    assert!(strata::vmm::namespace::netlink::index_of(&link).is_ok());

    sh(&mut sb, "echo layer > /made").await;
    sb.checkpoint().await.unwrap().expect("a layer");
    assert_eq!(
        address(&mut sb).await,
        before,
        "the same namespace after a checkpoint"
    );
    assert_eq!(
        fetch(&mut sb, &format!("http://{served}/"))
            .await
            .as_deref(),
        Some("outside-ok")
    );

    let id = sb.id().to_string();
    sb.destroy().await.unwrap();
    // Deleted off the destroy's path, within moments.
    let mut gone = false;
    for _ in 0..50 {
        gone = strata::vmm::namespace::netlink::index_of(&link).is_err();
        if gone {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "{link} outlived its sandbox");
    assert_no_trace(&id);
}

/// The host end of the link whose sandbox end is `sandbox_ip`: slot `n` is the `n`th /30.
fn link_of(sandbox_ip: Ipv4Addr) -> String {
    let subnet: strata::domain::egress_policy::Ipv4Net =
        NetworkConfig::DEFAULT_SUBNET.parse().unwrap();
    let slot = (u32::from(sandbox_ip) - u32::from(subnet.addr())) / 4;
    format!("sbx{slot}")
}

/// Through a real build: with `STRATA_SANDBOX_EGRESS=none` a step has no network, and the
/// failure says so; with the default policy and the outside world allowed, a step fetches
/// from it.
#[tokio::test]
async fn a_build_step_follows_the_nodes_egress_setting() {
    use common::worker_fixture::{settings, step, Fixture};
    use serde_json::json;
    use strata::domain::build::Phase;

    let world = Outside::new();
    let served = world.http("outside-ok");
    let fetch_step = format!(
        "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {} {} > /tmp/fetched",
        served.ip(),
        served.port()
    );
    let spec = json!({
        "fromImage": "busybox",
        "force": true,
        "steps": [step("RUN", &[&fetch_step]), step("RUN", &["grep -q outside-ok /tmp/fetched"])],
    });

    let mut offline = settings();
    offline.sandbox_network = config("10.252.0.0/16");
    offline.sandbox_network.policy.mode = EgressMode::None;
    let mut fx = Fixture::new(offline).await;
    let (_, state) = fx.build("offline", &[], spec.clone()).await;
    let Phase::Error { reason, .. } = &state.phase else {
        panic!(
            "a step reached the outside with egress none: {:?}",
            state.phase
        )
    };
    assert!(
        reason.message.starts_with("RUN failed with exit code 1")
            && reason.message.contains("Network is unreachable")
            && reason.message.contains("STRATA_SANDBOX_EGRESS=none"),
        "{}",
        reason.message
    );
    fx.stop().await;

    let mut online = settings();
    online.sandbox_network = config("10.252.0.0/16");
    let mut fx = Fixture::new(online).await;
    let (_, state) = fx.build("online", &[], spec).await;
    common::worker_fixture::assert_ready(&state);
    fx.stop().await;
}
