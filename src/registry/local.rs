//! A CNCF distribution registry (Debian's `docker-registry`) on loopback, open or behind an
//! htpasswd file, and pushing to it with `skopeo`: what `strata bench pull` and the registry
//! tests pull from. Install both with `scripts/setup.sh`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum LocalRegistryError {
    #[error("{what} failed: {detail}; install docker-registry, skopeo and apache2-utils (scripts/setup.sh)")]
    Tool { what: String, detail: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub struct LocalRegistry {
    child: Child,
    /// `127.0.0.1:<port>`
    pub addr: String,
    dir: PathBuf,
    /// Username and password of the htpasswd-protected instance.
    pub credentials: Option<(String, String)>,
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn run(cmd: &mut Command, what: &str) -> Result<Vec<u8>, LocalRegistryError> {
    let out = cmd.output().map_err(|e| LocalRegistryError::Tool {
        what: what.into(),
        detail: e.to_string(),
    })?;
    if !out.status.success() {
        return Err(LocalRegistryError::Tool {
            what: what.into(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(out.stdout)
}

impl LocalRegistry {
    /// Starts a registry storing into `dir`; with `credentials`, every request needs them.
    pub fn start(
        dir: &Path,
        credentials: Option<(&str, &str)>,
    ) -> Result<LocalRegistry, LocalRegistryError> {
        std::fs::create_dir_all(dir)?;
        let port = free_port()?;
        let addr = format!("127.0.0.1:{port}");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            dir.join("storage").display()
        );
        if let Some((user, password)) = credentials {
            let line = run(
                Command::new("htpasswd").args(["-Bbn", user, password]),
                "htpasswd",
            )?;
            std::fs::write(dir.join("htpasswd"), line)?;
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: strata-test\n    path: {}\n",
                dir.join("htpasswd").display()
            ));
        }
        std::fs::write(dir.join("config.yml"), config)?;
        let log = std::fs::File::create(dir.join("registry.log"))?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| LocalRegistryError::Tool {
                what: "starting docker-registry".into(),
                detail: e.to_string(),
            })?;
        let mut registry = LocalRegistry {
            child,
            addr,
            dir: dir.to_owned(),
            credentials: credentials.map(|(u, p)| (u.to_owned(), p.to_owned())),
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::net::TcpStream::connect(&registry.addr).is_err() {
            if Instant::now() > deadline || registry.child.try_wait()?.is_some() {
                let log = std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default();
                return Err(LocalRegistryError::Tool {
                    what: "starting docker-registry".into(),
                    detail: log,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(registry)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Pushes `oci:<layout>:<name>` to `<addr>/<dest>`; `all` pushes every platform of an index.
    pub fn push(
        &self,
        layout: &Path,
        name: &str,
        dest: &str,
        all: bool,
    ) -> Result<(), LocalRegistryError> {
        let mut cmd = Command::new("skopeo");
        // Digests are preserved: the pushed manifest is byte for byte the layout's (skopeo
        // would otherwise gzip uncompressed layers and rewrite the manifest).
        cmd.args([
            "copy",
            "--quiet",
            "--preserve-digests",
            "--dest-tls-verify=false",
        ]);
        if all {
            cmd.arg("--all");
        }
        if let Some((u, p)) = &self.credentials {
            cmd.arg(format!("--dest-creds={u}:{p}"));
        }
        cmd.arg(format!("oci:{}:{name}", layout.display()))
            .arg(format!("docker://{}/{dest}", self.addr));
        run(&mut cmd, "skopeo copy (push)").map(drop)
    }
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
