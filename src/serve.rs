//! Serving HTTP until shutdown, with a deadline for what is still open then.
//!
//! axum's graceful shutdown waits for every open connection to finish, and some never do by
//! themselves: a process's output stream whose client stopped reading, a directory watch
//! left open. A stop (Ctrl-C, SIGTERM from systemd) must not wait on a client, so once
//! shutdown is asked for, open requests get [`DRAIN`] to finish and are then dropped.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How long open requests may still run once shutdown is asked for.
pub const DRAIN: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `shutdown`, then for at most `drain` more.
pub async fn serve_until(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: CancellationToken,
    drain: Duration,
) -> std::io::Result<()> {
    let stop = shutdown.clone();
    let graceful =
        axum::serve(listener, router).with_graceful_shutdown(async move { stop.cancelled().await });
    let deadline = async {
        shutdown.cancelled().await;
        tokio::time::sleep(drain).await;
    };
    tokio::select! {
        served = graceful => served,
        () = deadline => {
            tracing::warn!(
                drain_secs = drain.as_secs(),
                "requests still open after the shutdown's drain (streams whose clients stopped \
                 reading, open watches); dropping them"
            );
            Ok(())
        }
    }
}
