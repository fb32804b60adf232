//! Serving the API over TLS for `*.<domain>`, as E2B's edge does: the SDK reaches a sandbox's
//! envd at `https://49983-<id>.<domain>` (port 443, no port in the URL) when it is given no
//! `sandbox_url`, and a browser reaches a sandbox's port at `https://<port>-<id>.<domain>`.
//!
//! The operator gives a certificate (chain) and key for `*.<domain>` in PEM files; the
//! listener serves the same router as the plain one (host routing picks the sandbox), over
//! HTTP/1.1 with upgrades. Like [`crate::serve::serve_until`], a stop gives open connections
//! a drain and then drops them.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// Longest a client may take to finish its TLS handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// A certificate or key that cannot serve, with what to fix.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("reading the certificate chain {path}: {message}; give a PEM file of the certificate for *.<domain> and its intermediates (STRATA_SANDBOX_TLS_CERT)")]
    Certificate { path: String, message: String },
    #[error("reading the private key {path}: {message}; give the certificate's key as a PEM file (STRATA_SANDBOX_TLS_KEY)")]
    Key { path: String, message: String },
    #[error("the certificate and key do not make a TLS server: {0}")]
    Config(#[from] rustls::Error),
}

/// An acceptor for the certificate chain in `cert` and the key in `key` (PEM), offering
/// HTTP/1.1 only (ALPN).
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsSetupError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| TlsSetupError::Certificate {
            path: cert.display().to_string(),
            message: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsSetupError::Certificate {
            path: cert.display().to_string(),
            message: "no certificate in it".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsSetupError::Key {
        path: key.display().to_string(),
        message: e.to_string(),
    })?;
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves `router` over TLS on `listener` until `shutdown`, then for at most `drain` more.
pub async fn serve_tls_until(
    listener: tokio::net::TcpListener,
    acceptor: TlsAcceptor,
    router: axum::Router,
    shutdown: CancellationToken,
    drain: Duration,
) -> std::io::Result<()> {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a TLS connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let _ = stream.set_nodelay(true);
        let (acceptor, router, stop) = (acceptor.clone(), router.clone(), shutdown.clone());
        connections.spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "a TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "a TLS handshake took too long");
                    return;
                }
            };
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), TowerToHyperService::new(router))
                .with_upgrades();
            tokio::pin!(connection);
            tokio::select! {
                served = connection.as_mut() => {
                    if let Err(e) = served {
                        tracing::debug!(%peer, error = %e, "a TLS connection ended with an error");
                    }
                }
                () = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    if tokio::time::timeout(drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        tracing::warn!(
            drain_secs = drain.as_secs(),
            "TLS connections still open after the shutdown's drain; dropping them"
        );
        connections.abort_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_certificate_or_key_says_which_setting_to_fix() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let missing = dir.path().join("missing.pem");
        let err = acceptor(&missing, &empty)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains("STRATA_SANDBOX_TLS_CERT") && err.contains("missing.pem"),
            "{err}"
        );
        let err = acceptor(&empty, &empty).err().expect("refused").to_string();
        assert!(err.contains("no certificate in it"), "{err}");
    }
}
