//! The API served in-process on 127.0.0.1:0, with settings parsed exactly as the binary parses
//! them.

use std::path::Path;

use clap::Parser;
use strata::api::{router, AppState};
use strata::config::{ServeArgs, TeamLimitArgs};

#[derive(Parser)]
struct Settings {
    #[command(flatten)]
    serve: ServeArgs,
    #[command(flatten)]
    team_limits: TeamLimitArgs,
    /// As `STRATA_METRICS_TOKEN` (a storage flag of the binary, not a serve one).
    #[arg(long)]
    metrics_token: Option<String>,
    #[command(flatten)]
    disk: strata::config::SandboxDiskArgs,
}

/// A running API and the state it serves with.
pub struct TestApi {
    pub base: String,
    pub state: AppState,
}

/// Serves the API on a free port. `extra` are more `strata api` flags (e.g. `--upload-url-ttl-secs`).
pub async fn serve(
    pool: sqlx::PgPool,
    data_dir: &Path,
    admin_token: Option<&str>,
    extra: &[&str],
) -> TestApi {
    let mut args = vec!["strata", "--listen", "127.0.0.1:0"];
    if let Some(token) = admin_token {
        args.extend(["--admin-token", token]);
    }
    args.extend(extra);
    let settings = Settings::parse_from(args);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut serve = settings.serve;
    serve.public_url = Some(format!("http://{addr}"));
    let state = AppState::new(pool, &serve, "test-node".into(), data_dir)
        .expect("API state")
        .with_team_limits(settings.team_limits.limits())
        .with_metrics_token(settings.metrics_token.as_deref())
        .with_disk_ceiling(settings.disk.build_disk_max.0);
    let app = router(state.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    TestApi {
        base: format!("http://{addr}"),
        state,
    }
}
