//! `strata up` on its embedded default: creates and starts a local Postgres in the data
//! directory, serves the API, and stops everything it started on SIGTERM.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn up_starts_embedded_postgres_serves_and_stops_cleanly() {
    let data = common::data_dir();
    let api_port = free_port();
    let pg_port = free_port();
    let mut child = Command::new(common::strata_bin())
        .arg("up")
        .env("STRATA_GC_SCHEDULE", "off")
        .env_remove("DATABASE_URL")
        .env("STRATA_DATA_DIR", data.path())
        .env("STRATA_LISTEN", format!("127.0.0.1:{api_port}"))
        .env("STRATA_EMBEDDED_PG_PORT", pg_port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn strata up");

    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    let health = loop {
        if let Ok(resp) = client
            .get(format!("http://127.0.0.1:{api_port}/health"))
            .send()
            .await
        {
            break resp;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "strata up exited before serving"
        );
        assert!(
            Instant::now() < deadline,
            "strata up did not serve within 90 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(health.status(), 200);
    assert!(
        data.path().join("postgres/data/PG_VERSION").exists(),
        "the cluster lives in the data directory"
    );
    // Only on its socket in the 0700 cluster directory: nothing listens on TCP, so no build
    // step (and no other host account) can log in.
    let socket = data.path().join(format!("postgres/.s.PGSQL.{pg_port}"));
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_ok());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", pg_port)).is_err(),
        "the embedded Postgres listens on loopback TCP"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(data.path().join("postgres"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "the socket's directory is private");

    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "strata up did not exit on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "strata up exited with {status}");
    assert!(
        std::os::unix::net::UnixStream::connect(&socket).is_err(),
        "the embedded Postgres was left running"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", api_port)).is_err(),
        "the API was left listening"
    );
}
