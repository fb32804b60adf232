//! The SDK's sandbox control plane (SANDBOX-PROTOCOL.md §2): create, info, list, kill,
//! timeout, pause, connect (which resumes a paused sandbox). Team-scoped: another team's
//! sandbox is 404, as a missing one.
//!
//! Create and resume record the request, then wait (on the read model) until a node appended
//! `Running`: the SDK's next call may be a command, with no readiness poll in between, so 201
//! means the agent answers. Pause waits until the node stored the filesystem: 204 means a
//! resume finds it. strata pauses the filesystem only (E2B's `mode="filesystem"`); a call that
//! asks to keep memory is refused and says so.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::auth::Team;
use super::{api_metadata, command_error};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::app::{self, CommandContext};
use crate::domain::sandbox::{self, SandboxId, SandboxRequest, DEFAULT_TIMEOUT_SECS};
use crate::events::command::load;
use crate::projections::sandboxes::SandboxRow;
use crate::streams::{build_stream, Build};
use crate::worker::template_lookup::{self, Checkpoint, LookupError};

/// E2B's answer is a constant; the SDK requires the key and uses it for nothing.
const CLIENT_ID: &str = "strata";
const MAX_PAGE: usize = 100;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<i64>,
    auto_pause: Option<bool>,
    auto_pause_memory: Option<bool>,
    auto_resume: Option<AutoResume>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    #[serde(default)]
    network: Option<NetworkBody>,
}

/// The create call's `network`: strata honours `allowPublicTraffic`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetworkBody {
    allow_public_traffic: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct AutoResume {
    #[serde(default)]
    enabled: bool,
}

/// What strata keeps of a paused sandbox, for every refusal of more.
const FILESYSTEM_ONLY: &str = "strata pauses a sandbox's filesystem only (mode=\"filesystem\"): \
     its files are kept, its memory and processes are not, and the template's start command runs \
     again on resume";

fn timeout_secs(raw: Option<i64>) -> Result<u32, ApiError> {
    let secs = raw.unwrap_or(i64::from(DEFAULT_TIMEOUT_SECS));
    u32::try_from(secs)
        .ok()
        .and_then(|s| sandbox::check_timeout(s).ok())
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "timeout must be between 1 and {} seconds, got {secs}",
                sandbox::MAX_TIMEOUT_SECS
            ))
        })
}

fn json_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        body
    };
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid: {e}")))
}

fn random_token() -> String {
    hex::encode(rand::random::<[u8; 24]>())
}

fn sandbox_error(e: sandbox::Error) -> ApiError {
    match e {
        sandbox::Error::NotFound | sandbox::Error::Ended(_) => {
            ApiError::not_found("sandbox not found")
        }
        sandbox::Error::BadTimeout(_) => ApiError::bad_request(e.to_string()),
        sandbox::Error::AlreadyPaused => ApiError::conflict(format!("sandbox {e}")),
        other => ApiError::conflict(other.to_string()),
    }
}

/// A failed create the SDK must not send again (it retries 5xx-ish answers by default).
fn no_retry(error: ApiError) -> Response {
    let mut response = error.into_response();
    response
        .headers_mut()
        .insert("should-retry", HeaderValue::from_static("false"));
    response
}

pub async fn create(
    State(state): State<AppState>,
    Team(team): Team,
    body: bytes::Bytes,
) -> Response {
    let started = std::time::Instant::now();
    match create_sandbox(&state, team, &body).await {
        Ok(response) => {
            crate::metrics::sandbox_create("running", started.elapsed());
            response
        }
        Err(e) => {
            let outcome = if e.status.is_server_error() {
                "failed"
            } else {
                "refused"
            };
            crate::metrics::sandbox_create(outcome, started.elapsed());
            no_retry(e)
        }
    }
}

async fn create_sandbox(
    state: &AppState,
    team: crate::domain::ids::TeamId,
    body: &[u8],
) -> Result<Response, ApiError> {
    let new: NewSandbox = json_body(body)?;
    let auto_pause = new.auto_pause == Some(true);
    if auto_pause && new.auto_pause_memory == Some(true) {
        return Err(ApiError::bad_request(format!(
            "{FILESYSTEM_ONLY}; create it with on_timeout={{\"action\": \"pause\", \"mode\": \"filesystem\"}}"
        )));
    }
    if new.auto_resume.is_some_and(|a| a.enabled) {
        return Err(ApiError::bad_request(
            "resuming a paused sandbox on its first request (auto_resume) is not supported by \
             this strata version; resume it with Sandbox.connect",
        ));
    }
    let timeout_secs = timeout_secs(new.timeout)?;
    let found =
        template_lookup::resolve(&state.events, &team, &new.template_id, Checkpoint::Result)
            .await
            .map_err(|e| match e {
                LookupError::NotFound(m) => ApiError::not_found(m),
                LookupError::Worker(w) => ApiError::internal("looking up the template", &w),
            })?;
    let build = load::<Build>(&state.events, &build_stream(&found.build))
        .await
        .map_err(|e| command_error(e, |e| ApiError::internal("reading the build", &e)))?
        .state;
    let resources = build.registration.map(|r| r.resources).unwrap_or_default();
    let backend = app::settings::PinsInForce::read(&state.events, &team, Some(&found.template))
        .await
        .map_err(|e| ApiError::internal("reading the settings pins", &e))?
        .sandbox_backend(state.protocol.sandbox_backend.as_deref());
    let id = SandboxId::from_random(rand::random());
    let request = SandboxRequest {
        team,
        template: found.template.clone(),
        alias: new.template_id.clone(),
        build: found.build,
        snapshot: found.snapshot,
        timeout_secs,
        metadata: new.metadata.unwrap_or_default(),
        env_vars: new.env_vars.unwrap_or_default(),
        allow_internet: new.allow_internet_access.unwrap_or(true),
        cpu_count: resources.effective_cpu_count(),
        memory_mb: resources.effective_memory_mb(),
        envd_token: random_token(),
        traffic_token: (new.network.and_then(|n| n.allow_public_traffic) == Some(false))
            .then(random_token),
        auto_pause,
        backend: Some(backend),
    };
    let ctx = CommandContext::new(api_metadata(state));
    app::sandbox::request(&state.events, &ctx, &id, request, Utc::now())
        .await
        .map_err(|e| command_error(e, sandbox_error))?;
    let row = wait_until_started(state, &id).await?;
    Ok((StatusCode::CREATED, Json(sandbox_json(state, &row))).into_response())
}

/// Reads the row until `settled` answers for it (`None`: keep waiting), at most `limit`;
/// `Err(None)` when the limit passed or the row is gone. Woken by the notifications naming the
/// sandbox's stream (the watch is taken before the first read, so no write is missed); while
/// this process cannot listen, it polls.
async fn wait_on_row<T>(
    state: &AppState,
    id: &SandboxId,
    limit: Duration,
    settled: impl Fn(&SandboxRow) -> Option<Result<T, ApiError>>,
) -> Result<T, Option<ApiError>> {
    /// A read even without news: a notification lost with a reconnect costs at most this.
    const UNNOTIFIED: Duration = Duration::from_millis(250);
    let deadline = tokio::time::Instant::now() + limit;
    let mut watch = state
        .stream_news
        .watch_stream(crate::streams::sandbox_stream(id).as_str().to_owned());
    let mut pause = Duration::from_millis(2);
    loop {
        let row = crate::projections::sandboxes::get(&state.pool, id.as_str())
            .await
            .map_err(|e| Some(ApiError::from(e)))?
            .ok_or(None)?;
        if let Some(answer) = settled(&row) {
            return answer.map_err(Some);
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(None);
        }
        match watch.as_mut() {
            Some(news) => {
                tokio::select! {
                    _ = news.news() => {}
                    _ = tokio::time::sleep(UNNOTIFIED.min(deadline - now)) => {}
                }
            }
            None => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(25));
            }
        }
    }
}

/// Waits until a node ran the sandbox (or ended it, or a resume went back to paused); gives
/// up after `STRATA_SANDBOX_START_TIMEOUT_SECS`, failing the start so no node runs it later (a
/// resume that gave up leaves the sandbox paused, its files kept).
async fn wait_until_started(state: &AppState, id: &SandboxId) -> Result<SandboxRow, ApiError> {
    let limit = state.protocol.sandbox_start_timeout;
    let waited = wait_on_row(state, id, limit, |row| match row.state.as_str() {
        "running" => Some(Ok(row.clone())),
        "ended" => Some(Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "sandbox {id} failed to start: {}",
                row.end_detail
                    .as_deref()
                    .unwrap_or("it ended before it ran")
            ),
        ))),
        // A resume that did not get as far as running; the SDK may connect again.
        "paused" => Some(Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "sandbox {id} did not resume ({}); it is still paused with its files; connect \
                 again",
                row.resume_detail
                    .as_deref()
                    .unwrap_or("its node gave it up")
            ),
        ))),
        _ => None,
    })
    .await;
    match waited {
        Ok(row) => Ok(row),
        Err(Some(e)) => Err(e),
        Err(None) => {
            let ctx = CommandContext::new(api_metadata(state));
            let reason = format!(
                "no node started it within {} s (STRATA_SANDBOX_START_TIMEOUT_SECS); is a \
                 `strata worker` running with STRATA_MAX_SANDBOXES above 0?",
                limit.as_secs()
            );
            let _ = app::sandbox::fail(&state.events, &ctx, id, None, &reason, Utc::now()).await;
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("sandbox {id}: {reason}"),
            ))
        }
    }
}

/// How long a pause call waits for the node to store the filesystem before it answers 503
/// (under the SDK's 60 s request timeout; the pause goes on, and a retry waits for it again).
const PAUSE_WAIT: Duration = Duration::from_secs(50);

/// Waits until the sandbox is paused (its files stored).
async fn wait_until_paused(state: &AppState, id: &SandboxId) -> Result<(), ApiError> {
    let waited = wait_on_row(state, id, PAUSE_WAIT, |row| match row.state.as_str() {
        "paused" => Some(Ok(())),
        "ended" => Some(Err(match row.end_reason() {
            Some(sandbox::EndReason::Failed) => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "sandbox {id} failed while pausing: {}",
                    row.end_detail.as_deref().unwrap_or("no reason recorded")
                ),
            ),
            _ => ApiError::not_found(format!(
                "sandbox {id} ended ({}) before it was paused",
                row.end_reason.as_deref().unwrap_or("ended")
            )),
        })),
        _ => None,
    })
    .await;
    match waited {
        Ok(()) => Ok(()),
        Err(Some(e)) => Err(e),
        Err(None) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "sandbox {id} is still pausing after {} s; the pause goes on, ask again",
                PAUSE_WAIT.as_secs()
            ),
        )),
    }
}

fn sandbox_json(state: &AppState, row: &SandboxRow) -> serde_json::Value {
    serde_json::json!({
        "templateID": row.template_id,
        "sandboxID": row.sandbox_id,
        "clientID": CLIENT_ID,
        "envdVersion": crate::envd::ENVD_VERSION,
        "envdAccessToken": row.envd_token,
        "trafficAccessToken": row.traffic_token,
        "domain": state.protocol.sandbox_domain,
        "alias": row.alias,
    })
}

fn iso(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn listed_json(state: &AppState, row: &SandboxRow) -> serde_json::Value {
    let started = row.started_at.unwrap_or(row.requested_at);
    let end = row
        .end_at
        .unwrap_or(started + chrono::Duration::seconds(i64::from(row.timeout_secs)));
    serde_json::json!({
        "templateID": row.template_id,
        "alias": row.alias,
        "sandboxID": row.sandbox_id,
        "clientID": CLIENT_ID,
        "startedAt": iso(started),
        "endAt": iso(end),
        "cpuCount": row.cpu_count,
        "memoryMB": row.memory_mb,
        "diskSizeMB": state.protocol.ceilings.disk_mb.unwrap_or(0),
        "metadata": row.metadata.0,
        "state": if row.is_paused() { "paused" } else { "running" },
        "envdVersion": crate::envd::ENVD_VERSION,
    })
}

fn detail_json(state: &AppState, row: &SandboxRow) -> serde_json::Value {
    let mut v = listed_json(state, row);
    let extra = serde_json::json!({
        "domain": state.protocol.sandbox_domain,
        "envdAccessToken": row.envd_token,
        "trafficAccessToken": row.traffic_token,
        "allowInternetAccess": row.allow_internet,
        "lifecycle": {
            "onTimeout": if row.auto_pause { "pause" } else { "kill" },
            "autoResume": false,
        },
        "pauseMode": "filesystem",
    });
    if let (Some(v), serde_json::Value::Object(extra)) = (v.as_object_mut(), extra) {
        v.extend(extra);
    }
    v
}

/// The team's live sandbox `raw`, or 404 (another team's is as missing as an unknown one).
async fn live_of_team(
    state: &AppState,
    team: &crate::domain::ids::TeamId,
    raw: &str,
) -> Result<(SandboxId, SandboxRow), ApiError> {
    let missing = || ApiError::not_found(format!("sandbox {raw} not found"));
    let id = SandboxId::parse(raw).map_err(|_| missing())?;
    let row = crate::projections::sandboxes::get(&state.pool, id.as_str())
        .await?
        .filter(|r| r.team_id == team.as_str() && r.state != "ended")
        .ok_or_else(missing)?;
    Ok((id, row))
}

pub async fn info(
    State(state): State<AppState>,
    Team(team): Team,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (_, row) = live_of_team(&state, &team, &id).await?;
    Ok(Json(detail_json(&state, &row)))
}

pub async fn kill(
    State(state): State<AppState>,
    Team(team): Team,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let (id, _) = live_of_team(&state, &team, &id).await?;
    let ctx = CommandContext::new(api_metadata(&state));
    app::sandbox::kill(&state.events, &ctx, &id, Utc::now())
        .await
        .map_err(|e| command_error(e, sandbox_error))?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
struct TimeoutBody {
    timeout: Option<i64>,
}

pub async fn set_timeout(
    State(state): State<AppState>,
    Team(team): Team,
    Path(id): Path<String>,
    body: bytes::Bytes,
) -> Result<StatusCode, ApiError> {
    let body: TimeoutBody = json_body(&body)?;
    let secs = timeout_secs(Some(body.timeout.ok_or_else(|| {
        ApiError::bad_request("the body needs {\"timeout\": <seconds>}")
    })?))?;
    let (id, _) = live_of_team(&state, &team, &id).await?;
    let ctx = CommandContext::new(api_metadata(&state));
    app::sandbox::set_timeout(&state.events, &ctx, &id, secs, Utc::now())
        .await
        .map_err(|e| command_error(e, sandbox_error))?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
struct ConnectBody {
    timeout: Option<i64>,
    /// `false` from `on_resume="reboot"`; `true` asks for memory strata does not keep.
    memory: Option<bool>,
}

/// `Sandbox.connect`: a running sandbox answers 200 and lives at least `timeout` more seconds;
/// a paused one is resumed (201), on whichever node places it, to live `timeout` seconds.
pub async fn connect(
    State(state): State<AppState>,
    Team(team): Team,
    Path(id): Path<String>,
    body: bytes::Bytes,
) -> Result<Response, ApiError> {
    let body: ConnectBody = json_body(&body)?;
    if body.memory == Some(true) {
        return Err(ApiError::bad_request(format!(
            "{FILESYSTEM_ONLY}; connect without asking for memory"
        )));
    }
    let secs = timeout_secs(body.timeout)?;
    let (id, row) = live_of_team(&state, &team, &id).await?;
    let ctx = CommandContext::new(api_metadata(&state));
    if row.state == "pausing" {
        // Resumed once the pause under way has stored the files.
        wait_until_paused(&state, &id).await?;
    }
    if row.is_paused() {
        let resumed = app::sandbox::resume(&state.events, &ctx, &id, secs, Utc::now()).await;
        match resumed {
            Ok(_) => {
                let row = wait_until_started(&state, &id).await?;
                return Ok((StatusCode::CREATED, Json(sandbox_json(&state, &row))).into_response());
            }
            // Another caller resumed it first: wait for that resume, as a running one.
            Err(app::Error::Rejected(sandbox::Error::NotPaused)) => {}
            Err(e) => return Err(command_error(e, sandbox_error)),
        }
    }
    app::sandbox::extend(&state.events, &ctx, &id, secs, Utc::now())
        .await
        .map_err(|e| command_error(e, sandbox_error))?;
    let row = wait_until_started(&state, &id).await?;
    Ok((StatusCode::OK, Json(sandbox_json(&state, &row))).into_response())
}

/// `requireHealthyGuest` is accepted and needs nothing: a filesystem pause always asks the
/// node, which holds the sandbox, to seal it.
#[derive(Debug, Deserialize)]
struct PauseBody {
    memory: Option<bool>,
}

/// `sandbox.pause()`: 204 once the node stored the sandbox's filesystem and stopped it; 409
/// when it is already paused (the SDK answers `False`).
pub async fn pause(
    State(state): State<AppState>,
    Team(team): Team,
    Path(id): Path<String>,
    body: bytes::Bytes,
) -> Result<StatusCode, ApiError> {
    let body: PauseBody = json_body(&body)?;
    if body.memory == Some(true) {
        return Err(ApiError::bad_request(format!(
            "{FILESYSTEM_ONLY}; pause it with mode=\"filesystem\""
        )));
    }
    let (id, _) = live_of_team(&state, &team, &id).await?;
    let ctx = CommandContext::new(api_metadata(&state));
    app::sandbox::pause(&state.events, &ctx, &id, Utc::now())
        .await
        .map_err(|e| command_error(e, sandbox_error))?;
    wait_until_paused(&state, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize)]
pub struct MetricsQuery {
    /// Unix seconds; the SDK sends them only when its caller gives them.
    start: Option<i64>,
    end: Option<i64>,
}

/// `GET /sandboxes/{id}/metrics`: one sample of what the sandbox uses now, taken by its node
/// (E2B keeps a series; strata answers the present), `[]` when it runs nowhere now (paused)
/// or when `start`..`end` leaves out the present.
pub async fn metrics(
    State(state): State<AppState>,
    Team(team): Team,
    Path(id): Path<String>,
    Query(range): Query<MetricsQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (_, row) = live_of_team(&state, &team, &id).await?;
    let now = Utc::now().timestamp();
    if range.start.is_some_and(|s| s > now) || range.end.is_some_and(|e| e < now) {
        return Ok(Json(serde_json::json!([])));
    }
    let Some(m) = crate::api::sandbox_proxy::agent_metrics(&row).await else {
        return Ok(Json(serde_json::json!([])));
    };
    let at = chrono::DateTime::from_timestamp(m.ts, 0).unwrap_or_else(Utc::now);
    Ok(Json(serde_json::json!([{
        "timestamp": at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "timestampUnix": m.ts,
        "cpuCount": m.cpu_count.ceil().max(1.0) as u32,
        "cpuUsedPct": m.cpu_used_pct,
        "memUsed": m.mem_used,
        "memTotal": m.mem_total,
        "memCache": m.mem_cache,
        "diskUsed": m.disk_used,
        "diskTotal": m.disk_total,
    }])))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    limit: Option<usize>,
    next_token: Option<String>,
}

/// Percent-decoding of one URL component (`+` stays `+`, as Go's `PathUnescape`).
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The SDK's metadata filter, after the query's own decoding: unescape the whole, split on
/// `&` and `=`, unescape each key and value (E2B's `parseFilters`).
pub fn parse_metadata_filter(raw: &str) -> BTreeMap<String, String> {
    unescape(raw)
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            Some((unescape(k), unescape(v)))
        })
        .collect()
}

fn cursor_of(row: &SandboxRow) -> String {
    format!("{}_{}", row.requested_at.timestamp_micros(), row.sandbox_id)
}

fn parse_cursor(token: &str) -> Result<(DateTime<Utc>, String), ApiError> {
    let bad = || ApiError::bad_request("nextToken is not one this server handed out");
    let (micros, id) = token.split_once('_').ok_or_else(bad)?;
    let at = DateTime::from_timestamp_micros(micros.parse().map_err(|_| bad())?).ok_or_else(bad)?;
    Ok((at, id.to_owned()))
}

pub async fn list(
    State(state): State<AppState>,
    Team(team): Team,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let wants = |name: &str| {
        q.state
            .as_deref()
            .is_none_or(|s| s.split(',').any(|s| s.trim() == name))
    };
    let wanted = crate::projections::sandboxes::Wanted {
        running: wants("running"),
        paused: wants("paused"),
    };
    let limit = q.limit.unwrap_or(MAX_PAGE).clamp(1, MAX_PAGE);
    let filter = q
        .metadata
        .as_deref()
        .map(parse_metadata_filter)
        .unwrap_or_default();
    let after = q
        .next_token
        .as_deref()
        .filter(|t| !t.is_empty())
        .map(parse_cursor)
        .transpose()?;
    let mut rows = if wanted.running || wanted.paused {
        crate::projections::sandboxes::list_live(
            &state.pool,
            team.as_str(),
            wanted,
            &filter,
            after,
            limit as i64 + 1,
        )
        .await?
    } else {
        Vec::new()
    };
    let more = rows.len() > limit;
    rows.truncate(limit);
    let body: Vec<_> = rows.iter().map(|r| listed_json(&state, r)).collect();
    let mut response = Json(body).into_response();
    if more {
        if let Some(last) = rows.last() {
            if let Ok(v) = HeaderValue::from_str(&cursor_of(last)) {
                response.headers_mut().insert("x-next-token", v);
            }
        }
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdks_triple_encoded_metadata_filter_decodes_to_its_pairs() {
        // SANDBOX-PROTOCOL.md §2.3: {"a b": "c&d=e/f"} after the query's own decoding.
        let parsed = parse_metadata_filter("a%2520b%3Dc%2526d%253De%2Ff");
        assert_eq!(
            parsed,
            BTreeMap::from([("a b".to_owned(), "c&d=e/f".to_owned())])
        );
        let two = parse_metadata_filter("owner%3Dalice%26env%3Dprod");
        assert_eq!(two.len(), 2);
        assert_eq!(two["env"], "prod");
    }

    #[test]
    fn cursors_round_trip_and_foreign_ones_are_refused() {
        let at = DateTime::from_timestamp_micros(1_800_000_000_123_456).unwrap();
        let (back, id) = parse_cursor(&format!("{}_{}", at.timestamp_micros(), "iabc")).unwrap();
        assert_eq!((back, id.as_str()), (at, "iabc"));
        assert!(parse_cursor("garbage").is_err());
    }
}
