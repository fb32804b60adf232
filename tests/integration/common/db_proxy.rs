//! A TCP proxy in front of the test database's Unix socket that the test can cut: once cut it
//! holds every byte it reads and passes none, so the client's queries neither succeed nor fail,
//! as across a network partition (unlike [`super::process::Outage`], where they fail at once).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub struct DbProxy {
    /// The database's URL through the proxy.
    pub url: String,
    cut: Arc<AtomicBool>,
}

impl DbProxy {
    /// A proxy for `db_url` (`postgres://USER@localhost/DB?host=DIR&port=N`).
    pub async fn start(db_url: &str) -> DbProxy {
        let (base, query) = db_url.split_once('?').expect("a socket URL");
        let param = |k: &str| {
            query
                .split('&')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
                .unwrap_or_else(|| panic!("{k} in {db_url}"))
                .to_string()
        };
        let socket = format!("{}/.s.PGSQL.{}", param("host"), param("port"));
        let (user_host, database) = base
            .trim_start_matches("postgres://")
            .split_once('/')
            .unwrap();
        let user = user_host.split('@').next().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "postgres://{user}@{}/{database}",
            listener.local_addr().unwrap()
        );
        let cut = Arc::new(AtomicBool::new(false));
        let flag = cut.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::UnixStream::connect(&socket).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pass(cr, sw, flag.clone()));
                tokio::spawn(pass(sr, cw, flag.clone()));
            }
        });
        DbProxy { url, cut }
    }

    /// From now on nothing passes either way.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

async fn pass(
    mut from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
    cut: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while cut.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
