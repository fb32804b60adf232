//! The operator API over real HTTP: bearer-token gate, stream history, global feed and catalog
//! pagination.

use crate::common;

use std::sync::Arc;

use strata::events::{
    Actor, ActorRole, ExpectedVersion, Metadata, NewEvent, StreamId, StreamWrite,
};
use strata::projections::{stream_catalog, ProjectionRunner};
use uuid::Uuid;

const TOKEN: &str = "operator-token-1";

/// The server's base URL, and its data directory (keep it alive while the server runs).
async fn serve(pool: sqlx::PgPool, admin_token: Option<&str>) -> (String, tempfile::TempDir) {
    let data = common::data_dir();
    let api = common::api::serve(pool, data.path(), admin_token, &[]).await;
    (api.base, data)
}

fn write(stream: &str, n: usize) -> StreamWrite {
    StreamWrite::new(
        StreamId::parse(stream).unwrap(),
        ExpectedVersion::Any,
        (0..n)
            .map(|i| NewEvent {
                event_id: Uuid::now_v7(),
                event_type: "Happened.v1".into(),
                data: serde_json::json!({"i": i}),
                metadata: Metadata::new(Actor::new(ActorRole::Worker, "node-7")).with_epoch(3),
            })
            .collect(),
    )
}

async fn get_json(
    client: &reqwest::Client,
    url: &str,
    token: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut req = client.get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(serde_json::Value::Null))
}

#[tokio::test]
async fn the_operator_api_needs_the_token() {
    let db = common::test_db().await;
    let (base, _data) = serve(db.pool.clone(), Some(TOKEN)).await;
    let client = reqwest::Client::new();
    for path in [
        "/admin/events",
        "/admin/streams",
        "/admin/streams/job-1/events",
    ] {
        let url = format!("{base}{path}");
        let (status, body) = get_json(&client, &url, None).await;
        assert_eq!(status, 401, "{path} without a token");
        assert!(body["error"].as_str().unwrap().contains("bearer"));
        assert_eq!(get_json(&client, &url, Some("wrong")).await.0, 401);
        assert_eq!(
            get_json(&client, &url, Some(&format!("{TOKEN}x"))).await.0,
            401
        );
        let resp = client
            .get(&url)
            .header("Authorization", format!("Basic {TOKEN}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 401, "only Bearer is accepted");
        assert_eq!(get_json(&client, &url, Some(TOKEN)).await.0, 200, "{path}");
    }
    // Not under /admin: no token needed.
    assert_eq!(
        client
            .get(format!("{base}/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    // A server without a token keeps the operator API closed.
    let (closed, _closed_data) = serve(db.pool.clone(), None).await;
    let (status, body) = get_json(&client, &format!("{closed}/admin/events"), Some(TOKEN)).await;
    assert_eq!(status, 503);
    assert!(body["error"]
        .as_str()
        .unwrap()
        .contains("STRATA_ADMIN_TOKEN"));
}

#[tokio::test]
async fn history_feed_and_catalog_paginate() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    store.append(vec![write("job-a", 5)]).await.unwrap();
    store.append(vec![write("order-t", 2)]).await.unwrap();
    store.append(vec![write("job-b", 3)]).await.unwrap();
    // The feed horizon is cluster-wide: a transaction of another test on the shared server may
    // hold it for a moment. Page once all ten events are past it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while store
        .read_feed(strata::events::FeedPosition::START, 100)
        .await
        .unwrap()
        .len()
        < 10
    {
        assert!(
            std::time::Instant::now() < deadline,
            "events never passed the horizon"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (base, _data) = serve(db.pool.clone(), Some(TOKEN)).await;
    let client = reqwest::Client::new();

    // One stream, in pages of 2.
    let mut versions = Vec::new();
    let mut from = Some(1u64);
    while let Some(f) = from {
        let (status, page) = get_json(
            &client,
            &format!("{base}/admin/streams/job-a/events?from_version={f}&limit=2"),
            Some(TOKEN),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(page["version"], 5);
        for e in page["events"].as_array().unwrap() {
            assert_eq!(e["stream_id"], "job-a");
            assert_eq!(e["type"], "Happened.v1");
            assert_eq!(e["metadata"]["actor"]["node"], "node-7");
            assert_eq!(e["metadata"]["epoch"], 3);
            versions.push(e["version"].as_u64().unwrap());
        }
        from = page["next"].as_u64();
    }
    assert_eq!(versions, vec![1, 2, 3, 4, 5]);
    let (status, body) = get_json(
        &client,
        &format!("{base}/admin/streams/nocategory/events"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().contains("category"));

    // The global feed, in pages of 3, following `next`.
    let mut seen = Vec::new();
    let mut pages = Vec::new();
    let mut after = String::new();
    loop {
        let (status, page) = get_json(
            &client,
            &format!("{base}/admin/events?after={after}&limit=3"),
            Some(TOKEN),
        )
        .await;
        assert_eq!(status, 200);
        let events = page["events"].as_array().unwrap();
        pages.push((after.clone(), events.len()));
        if events.is_empty() {
            assert_eq!(page["next"].as_str().unwrap(), after, "cursor stays put");
            break;
        }
        for e in events {
            seen.push((
                e["stream_id"].as_str().unwrap().to_string(),
                e["version"].as_u64().unwrap(),
            ));
        }
        assert_eq!(
            page["next"],
            events.last().unwrap()["cursor"],
            "next is the last event's cursor"
        );
        after = page["next"].as_str().unwrap().to_string();
    }
    let expected: Vec<(String, u64)> = (1..=5)
        .map(|v| ("job-a".to_string(), v))
        .chain((1..=2).map(|v| ("order-t".to_string(), v)))
        .chain((1..=3).map(|v| ("job-b".to_string(), v)))
        .collect();
    if seen != expected {
        // Say what the table held and where the horizon stood, so that a failure explains itself.
        let rows: Vec<(String, i64, String, i64)> = sqlx::query_as(
            "SELECT stream_id, version, tx_id::text, position FROM events ORDER BY position",
        )
        .fetch_all(&db.pool)
        .await
        .unwrap();
        let horizon: String =
            sqlx::query_scalar("SELECT pg_snapshot_xmin(pg_current_snapshot())::text")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        panic!(
            "every event once, in commit order: saw {seen:?} in pages {pages:?}; \
             the table holds (stream, version, tx_id, position) {rows:?}; horizon {horizon}"
        );
    }
    let (status, _) = get_json(
        &client,
        &format!("{base}/admin/events?after=nonsense"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, 400);

    // The catalog, after the projection has caught up.
    ProjectionRunner::new(store.clone(), Arc::new(stream_catalog::StreamCatalog))
        .catch_up()
        .await
        .unwrap();
    let (_, page) = get_json(
        &client,
        &format!("{base}/admin/streams?category=job&limit=1"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(page["streams"][0]["stream_id"], "job-a");
    assert_eq!(page["streams"][0]["event_count"], 5);
    let next = page["next"].as_str().unwrap().to_string();
    let (_, page) = get_json(
        &client,
        &format!("{base}/admin/streams?category=job&limit=1&after={next}"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(page["streams"][0]["stream_id"], "job-b");
    assert_eq!(page["streams"][0]["version"], 3);
    let (_, page) = get_json(
        &client,
        &format!("{base}/admin/streams?category=job&limit=1&after=job-b"),
        Some(TOKEN),
    )
    .await;
    assert!(page["streams"].as_array().unwrap().is_empty());
    assert!(page["next"].is_null());
    let (_, all) = get_json(&client, &format!("{base}/admin/streams"), Some(TOKEN)).await;
    assert_eq!(all["streams"].as_array().unwrap().len(), 3);
}

/// Pins through the operator API: shown with the level each value comes from, pinned and
/// unpinned for a team and a template, bad values and unknown scopes refused, each change on
/// the scope's stream under the operator who made it.
#[tokio::test]
async fn settings_are_pinned_and_unpinned_through_the_operator_api() {
    let db = common::test_db().await;
    let data = common::data_dir();
    let api = common::api::serve(
        db.pool.clone(),
        data.path(),
        Some(TOKEN),
        &["--cache-mode", "final"],
    )
    .await;
    let builds = common::build_api::Api {
        store: strata::app::event_store(db.pool.clone()),
        team: strata::domain::ids::TeamId::parse("acme").unwrap(),
    };
    let (web, _) = builds.register("web").await;
    let client = reqwest::Client::new();
    let url = |q: &str| format!("{}/admin/settings?{q}", api.base);
    let send = |req: reqwest::RequestBuilder| async move {
        let resp = req.bearer_auth(TOKEN).send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json::<serde_json::Value>().await.unwrap())
    };

    let (status, _) = get_json(&client, &url("team=acme"), None).await;
    assert_eq!(status, 401);
    let (status, shown) = send(client.get(url("team=acme"))).await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["pins"], serde_json::json!({}));
    assert_eq!(shown["cache_mode"]["value"], "final");
    assert_eq!(
        shown["cache_mode"]["level"],
        "service setting STRATA_CACHE_MODE"
    );
    assert_eq!(
        (
            &shown["sandbox_backend"]["value"],
            &shown["sandbox_backend"]["level"]
        ),
        (
            &serde_json::json!("namespace"),
            &serde_json::json!("default")
        )
    );

    let pin = |q: &'static str, key: &'static str, value: &'static str| {
        client
            .put(url(q))
            .json(&serde_json::json!({"key": key, "value": value, "by": "alice"}))
    };
    let (status, team) = send(pin("team=acme", "cache.mode", "off")).await;
    assert_eq!(status, 200, "{team}");
    assert_eq!(team["scope"], "team acme");
    assert_eq!(team["pins"]["cache.mode"]["value"], "off");
    assert_eq!(
        (&team["cache_mode"]["value"], &team["cache_mode"]["level"]),
        (&serde_json::json!("off"), &serde_json::json!("team pin"))
    );
    for (key, value, says) in [
        ("cache.mode", "fast", "\"fast\""),
        ("cache.speed", "off", "cache.speed"),
    ] {
        let (status, body) = send(pin("team=acme", key, value)).await;
        assert_eq!(status, 400, "{key}={value}: {body}");
        assert!(body["error"].as_str().unwrap().contains(says), "{body}");
    }
    let (status, tpl) = send(client.get(url("team=acme&template=web"))).await;
    assert_eq!(status, 200, "{tpl}");
    assert_eq!(
        tpl["cache_mode"]["level"], "team pin",
        "the team's pin reaches its templates"
    );
    let (status, tpl) = send(pin("team=acme&template=web:latest", "cache.mode", "steps")).await;
    assert_eq!(status, 200, "{tpl}");
    assert_eq!(tpl["scope"], format!("template {web} of team acme"));
    assert_eq!(
        (&tpl["cache_mode"]["value"], &tpl["cache_mode"]["level"]),
        (
            &serde_json::json!("steps"),
            &serde_json::json!("template pin")
        )
    );
    for q in ["team=acme&template=nope", "team=Not%20A%20Team"] {
        let (status, body) = send(client.get(url(q))).await;
        assert_eq!(status, 404, "{q}: {body}");
    }

    let (status, team) = send(
        client
            .delete(format!("{}/admin/settings/cache.mode?team=acme", api.base))
            .json(&serde_json::json!({"by": "bob"})),
    )
    .await;
    assert_eq!(status, 200, "{team}");
    assert_eq!(team["pins"], serde_json::json!({}));
    assert_eq!(team["cache_mode"]["value"], "final");

    // The audit trail: who moved the team, in order.
    let (status, page) = send(client.get(format!(
        "{}/admin/streams/settings-team:acme/events",
        api.base
    )))
    .await;
    assert_eq!(status, 200, "{page}");
    let trail: Vec<(String, String)> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_owned(),
                e["metadata"]["actor"]["node"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        trail,
        [
            ("SettingPinned.v1".to_string(), "alice".to_string()),
            ("SettingUnpinned.v1".to_string(), "bob".to_string()),
        ],
        "{page}"
    );
}
