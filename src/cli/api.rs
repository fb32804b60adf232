use anyhow::Context;
use clap::Args;
use strata::api::AppState;
use strata::config::{NodeArgs, ServeArgs, StorageArgs};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct ApiArgs {
    #[command(flatten)]
    storage: StorageArgs,
    #[command(flatten)]
    serve: ServeArgs,
    #[command(flatten)]
    node: NodeArgs,
}

pub async fn run(args: ApiArgs) -> anyhow::Result<()> {
    let pool = super::connect_database(&args.storage).await?;
    strata::db::migrate(&pool)
        .await
        .context("applying migrations")?;
    let state = AppState::new(
        pool,
        &args.serve,
        args.node.node_id(),
        &args.storage.data_dir,
    )
    .context("preparing the API")?
    .with_team_limits(args.storage.team_limits.limits())
    .with_metrics_token(args.storage.metrics_token.as_deref())
    .with_disk_ceiling(args.storage.sandbox_disk.build_disk_max.0)
    .with_blobs(
        strata::vmm::open_blob_store(args.storage.blob_url.as_deref(), &args.storage.data_dir)
            .context("opening the blob store (STRATA_BLOB_URL)")?,
    );
    let shutdown = CancellationToken::new();
    let server = serve(&args.serve, state, shutdown.clone()).await?;
    super::shutdown_signal().await;
    shutdown.cancel();
    server.await.context("API server task")??;
    Ok(())
}

/// Binds the API's address (and, when configured, its TLS address for `*.<domain>`) and serves
/// until `shutdown` is cancelled.
pub async fn serve(
    settings: &ServeArgs,
    state: AppState,
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<()>>> {
    let listen = settings.listen;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding the API to {listen}"))?;
    tracing::info!(address = %listener.local_addr()?, "API listening");
    let tls = match (
        settings.sandbox_tls_listen,
        &settings.sandbox_tls_cert,
        &settings.sandbox_tls_key,
    ) {
        (Some(address), Some(cert), Some(key)) => {
            let acceptor = strata::serve_tls::acceptor(cert, key)?;
            let listener = tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| {
                    format!(
                        "binding the API's TLS listener to {address} (STRATA_SANDBOX_TLS_LISTEN)"
                    )
                })?;
            tracing::info!(address = %listener.local_addr()?, domain = %state.protocol.sandbox_domain, "API listening over TLS for sandbox hosts");
            Some((listener, acceptor))
        }
        _ => None,
    };
    let router = strata::api::router(state);
    Ok(tokio::spawn(async move {
        let plain = strata::serve::serve_until(
            listener,
            router.clone(),
            shutdown.clone(),
            strata::serve::DRAIN,
        );
        let secure = async {
            match tls {
                Some((listener, acceptor)) => {
                    strata::serve_tls::serve_tls_until(
                        listener,
                        acceptor,
                        router,
                        shutdown,
                        strata::serve::DRAIN,
                    )
                    .await
                }
                None => Ok(()),
            }
        };
        tokio::try_join!(plain, secure)
            .map(|_| ())
            .context("serving the API")
    }))
}
