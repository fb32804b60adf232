//! The E2B build protocol's API half over real HTTP and a real Postgres: registration, upload
//! links, signed uploads, build start and status, tenancy, and every bad input the issue lists.
//! Builds here are not executed (no worker runs); `tests/e2e` drives whole builds
//! with the stock SDKs.

use crate::common;

use std::io::{Read, Write};
use std::time::Duration;

use common::http_build::{tar_gz, SdkClient};
use serde_json::{json, Value};
use strata::domain::team::ApiKey;

/// Issues a key for `team` through the same command `strata keys create` runs.
async fn key_for(db: &common::TestDb, team: &str) -> String {
    let key = common::http_build::key_for(&db.url, team).await;
    assert!(ApiKey::parse(&key).is_some(), "{key}");
    key
}

/// The protocol's calls, each asserting the response shape the SDK relies on.
impl SdkClient {
    async fn link(&self, template: &str, hash: &str) -> (bool, String) {
        let (status, body) = self
            .call(
                reqwest::Method::GET,
                &format!("/templates/{template}/files/{hash}"),
                None,
            )
            .await;
        assert_eq!(status, 201, "{body}");
        assert!(body["present"].is_boolean());
        (
            body["present"].as_bool().unwrap(),
            body["url"].as_str().unwrap().to_string(),
        )
    }
    async fn put(&self, url: &str, body: Vec<u8>) -> (u16, Value) {
        let resp = self.http.put(url).body(body).send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }
    async fn start(&self, template: &str, build: &str, hash: &str) -> (u16, Value) {
        self.call(
            reqwest::Method::POST,
            &format!("/v2/templates/{template}/builds/{build}"),
            Some(json!({
                "fromImage": "busybox",
                "force": false,
                "steps": [{"type": "COPY", "args": ["app", "/app", "", ""], "filesHash": hash, "force": false}],
            })),
        )
        .await
    }
    async fn status(&self, template: &str, build: &str, offset: u32) -> Value {
        let (status, body) = self
            .call(
                reqwest::Method::GET,
                &format!(
                    "/templates/{template}/builds/{build}/status?logsOffset={offset}&limit=100"
                ),
                None,
            )
            .await;
        assert_eq!(status, 200, "{body}");
        body
    }
}

const HASH_A: &str = "91fcd38c8d8bb7ffb7b2ae7d3c741880d0183bf2f36d1f60c727fedc44066c93";
const HASH_B: &str = "0000000000000000000000000000000000000000000000000000000000000001";

async fn setup(extra: &[&str]) -> (common::TestDb, tempfile::TempDir, common::api::TestApi) {
    let db = common::test_db().await;
    let data = common::data_dir();
    let api = common::api::serve(db.pool.clone(), data.path(), None, extra).await;
    (db, data, api)
}

fn client(api: &common::api::TestApi, key: String) -> SdkClient {
    SdkClient {
        http: reqwest::Client::new(),
        base: api.base.clone(),
        key,
        traceparent: None,
    }
}

#[tokio::test]
async fn registration_upload_start_and_status_follow_the_protocol() {
    let (db, _data, api) = setup(&[]).await;
    let c = client(&api, key_for(&db, "acme").await);

    let (template, build) = c.register("web:v1").await;
    let (same_template, second_build) = c.register("web").await;
    assert_eq!(
        template, same_template,
        "the same name is the same template"
    );
    assert_ne!(build, second_build, "every registration is a new build");
    uuid::Uuid::parse_str(&build).expect("build ids are UUIDs");

    // The newest waiting build takes the link; nothing is present yet.
    let (present, url) = c.link(&template, HASH_A).await;
    assert!(!present);
    let archive = tar_gz(&[("app/a.txt", b"hello")]);
    let (status, body) = c.put(&url, archive.clone()).await;
    assert_eq!(status, 200, "{body}");
    // A replay of the same bytes is idempotent.
    assert_eq!(c.put(&url, archive.clone()).await.0, 200);
    // Different bytes on the same URL conflict.
    let (status, body) = c.put(&url, tar_gz(&[("app/a.txt", b"other")])).await;
    assert_eq!(status, 409, "{body}");

    let status = c.status(&template, &second_build, 0).await;
    assert_eq!(status["status"], "waiting");
    assert_eq!(status["logEntries"], json!([]));
    assert_eq!(status["logs"], json!([]));

    // Start freezes; a PUT after the freeze is 409 and changes nothing.
    let (code, body) = c.start(&template, &second_build, HASH_A).await;
    assert_eq!(code, 202, "{body}");
    let (status, body) = c.put(&url, archive.clone()).await;
    assert_eq!(status, 409, "{body}");
    // Starting again with the same request is idempotent; with another, a conflict.
    assert_eq!(c.start(&template, &second_build, HASH_A).await.0, 202);
    // Started and queued (no node runs here): E2B answers `building` from the start on.
    let status = c.status(&template, &second_build, 0).await;
    assert_eq!(status["status"], "building", "{status}");
    let (code, body) = c.start(&template, &second_build, HASH_B).await;
    assert_eq!(code, 409, "{body}");

    // A new build of the same team sees the content as present and still gets a URL.
    let (_, third) = c.register("web").await;
    let (present, url) = c.link(&template, HASH_A).await;
    assert!(present);
    assert!(url.starts_with(&api.base));
    let (code, body) = c.start(&template, &third, HASH_A).await;
    assert_eq!(code, 202, "{body}");
    let (phase,): (String,) = sqlx::query_as("SELECT phase FROM builds WHERE build_id = $1::uuid")
        .bind(&third)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(phase, "queued");
}

#[tokio::test]
async fn keys_are_required_and_teams_are_isolated() {
    let (db, _data, api) = setup(&[]).await;
    let a = client(&api, key_for(&db, "team-a").await);
    let b = client(&api, key_for(&db, "team-b").await);

    for key in [
        "",
        "e2b_0000000000000000000000000000000000000000",
        "not-a-key",
    ] {
        let anon = client(&api, key.to_string());
        let (status, body) = anon
            .call(
                reqwest::Method::POST,
                "/v3/templates",
                Some(json!({"name": "x"})),
            )
            .await;
        assert_eq!(status, 401, "{key:?}: {body}");
        assert_eq!(body["code"], 401);
        assert!(body["message"].as_str().unwrap().contains("key"));
    }

    let (template, build) = a.register("shared-name").await;
    let (present, url_a) = a.link(&template, HASH_A).await;
    assert!(!present);
    assert_eq!(
        a.put(&url_a, tar_gz(&[("app/x", b"a's bytes")])).await.0,
        200
    );

    // B cannot see, bind to, start or poll A's template.
    for (method, path) in [
        (
            reqwest::Method::GET,
            format!("/templates/{template}/files/{HASH_A}"),
        ),
        (
            reqwest::Method::GET,
            format!("/templates/{template}/builds/{build}/status"),
        ),
        (reqwest::Method::GET, format!("/templates/{template}")),
        (
            reqwest::Method::GET,
            "/templates/aliases/shared-name".to_string(),
        ),
    ] {
        let (status, body) = b.call(method, &path, None).await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    assert_eq!(b.start(&template, &build, HASH_A).await.0, 404);

    // The same name in team B is a different template, and A's upload is not present for B.
    let (b_template, _) = b.register("shared-name").await;
    assert_ne!(b_template, template);
    let (present, _) = b.link(&b_template, HASH_A).await;
    assert!(!present, "uploads are scoped per team");
    let (status, list) = b.call(reqwest::Method::GET, "/templates", None).await;
    assert_eq!(status, 200);
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["templateID"], b_template.as_str());
}

#[tokio::test]
async fn tampered_expired_and_oversize_uploads_are_refused_without_a_trace() {
    let (db, data, api) = setup(&["--upload-max-bytes", "4096"]).await;
    let c = client(&api, key_for(&db, "acme").await);
    let (template, build) = c.register("bad-input").await;
    let (_, url) = c.link(&template, HASH_A).await;
    let archive = tar_gz(&[("app/a.txt", b"hello")]);

    // Altered: each signed field, and the signature itself.
    for (from, to) in [
        ("max=4096", "max=9999"),
        ("team=acme", "team=evil"),
        ("&sig=", "&sig=A"),
    ] {
        let altered = url.replacen(from, to, 1);
        assert_ne!(altered, url);
        let (status, body) = c.put(&altered, archive.clone()).await;
        assert_eq!(status, 403, "{from}->{to}: {body}");
    }
    let swapped = url.replacen(HASH_A, HASH_B, 1);
    assert_eq!(c.put(&swapped, archive.clone()).await.0, 403);

    // Oversize: refused from the declared length, before reading.
    let (status, body) = c.put(&url, vec![0u8; 5000]).await;
    assert_eq!(status, 413, "{body}");

    // A client that declares 100 bytes, sends 10 and hangs up. The server either answers 400
    // or sees the connection go; either way nothing of the body may remain.
    let short = raw_put(&url, 100, b"only ten b");
    assert!(
        short.is_empty() || short.starts_with("HTTP/1.1 400"),
        "{short}"
    );

    // Nothing was bound, completed or left behind.
    let staging = data.path().join("blobs/tmp");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::fs::read_dir(&staging).unwrap().count() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a temporary object remains"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        std::fs::read_dir(data.path().join("blobs/sha256"))
            .unwrap()
            .count(),
        0
    );
    let completed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM events WHERE stream_id = $1 AND type IN ('UploadCompleted.v1', 'ContextBound.v1')",
    )
    .bind(format!("build-{build}"))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(completed, 0);

    // The unbound hash fails the start with 400 naming it.
    let (code, body) = c.start(&template, &build, HASH_B).await;
    assert_eq!(code, 400, "{body}");
    assert!(body["message"].as_str().unwrap().contains(HASH_B), "{body}");

    // Expired: a server whose URLs live 0 seconds.
    let expired_api = common::api::serve(
        db.pool.clone(),
        data.path(),
        None,
        &["--upload-url-ttl-secs", "0"],
    )
    .await;
    let e = client(&expired_api, c.key.clone());
    let (_, url) = e.link(&template, HASH_A).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, body) = e.put(&url, archive).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("expired"),
        "{body}"
    );
}

/// Sends a PUT whose body is shorter than its declared length, then half-closes.
fn raw_put(url: &str, declared: usize, body: &[u8]) -> String {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    write!(
        stream,
        "PUT /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {declared}\r\n\r\n"
    )
    .unwrap();
    stream.write_all(body).unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
}

#[tokio::test]
async fn concurrent_identical_uploads_store_the_content_once() {
    let (db, data, api) = setup(&[]).await;
    let c = client(&api, key_for(&db, "acme").await);
    let archive = tar_gz(&[("app/big.bin", &vec![7u8; 200_000])]);
    let mut urls = Vec::new();
    for i in 0..8 {
        let (template, _) = c.register(&format!("same-{i}")).await;
        urls.push(c.link(&template, HASH_A).await.1);
    }
    let uploads = urls.iter().map(|url| c.put(url, archive.clone()));
    for (status, body) in futures::future::join_all(uploads).await {
        assert_eq!(status, 200, "{body}");
    }
    let stored: Vec<_> = std::fs::read_dir(data.path().join("blobs/sha256"))
        .unwrap()
        .collect();
    assert_eq!(stored.len(), 1, "one blob for one content");
}

/// A host crash can leave a blob torn under its digest name. An upload of the same bytes must
/// replace it, not "succeed" against it (RFC: a digest-mismatched object is absent and
/// repairable, never permanently present).
#[tokio::test]
async fn a_re_upload_of_the_same_bytes_repairs_a_torn_blob() {
    let (db, data, api) = setup(&[]).await;
    let archive = tar_gz(&[("app/big.bin", &vec![9u8; 300_000])]);
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&archive));
    let blob = data.path().join("blobs/sha256").join(&digest);
    let intact = || {
        std::fs::read(&blob)
            .is_ok_and(|b| hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&b)) == digest)
    };
    for (team, tear) in [("acme", "truncated"), ("globex", "bit-flipped")] {
        let c = client(&api, key_for(&db, team).await);
        let (template, _) = c.register("torn").await;
        let (_, url) = c.link(&template, HASH_A).await;
        assert_eq!(c.put(&url, archive.clone()).await.0, 200);
        assert!(intact());
        let mut bytes = std::fs::read(&blob).unwrap();
        match tear {
            "truncated" => bytes.truncate(bytes.len() / 2),
            _ => bytes[40] ^= 0x20,
        }
        std::fs::write(&blob, bytes).unwrap();
        assert!(!intact());
        // The SDK's retry: the same bytes on the same URL.
        let (status, body) = c.put(&url, archive.clone()).await;
        assert_eq!(status, 200, "{body}");
        assert!(intact(), "{tear}: the re-upload repaired the blob");
    }
}

#[tokio::test]
async fn status_pages_logs_by_offset_and_level() {
    let (db, _data, api) = setup(&[]).await;
    let c = client(&api, key_for(&db, "acme").await);
    let (template, build) = c.register("logs").await;
    for (seq, level) in ["info", "debug", "error", "info", "warn"]
        .iter()
        .enumerate()
    {
        sqlx::query(
            "INSERT INTO build_logs (build_id, seq, logged_at, level, message, step) VALUES ($1::uuid, $2, now(), $3, $4, '1')",
        )
        .bind(&build)
        .bind(seq as i64)
        .bind(level)
        .bind(format!("line {seq}"))
        .execute(&db.pool)
        .await
        .unwrap();
    }
    let page = c.status(&template, &build, 3).await;
    let messages: Vec<&str> = page["logEntries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    assert_eq!(messages, ["line 3", "line 4"]);
    assert_eq!(page["logEntries"][0]["step"], "1");
    assert_eq!(
        c.status(&template, &build, 5).await["logEntries"],
        json!([])
    );
    assert_eq!(
        c.status(&template, &build, 500).await["logEntries"],
        json!([])
    );
    let (_, warn_up) = c
        .call(
            reqwest::Method::GET,
            &format!("/templates/{template}/builds/{build}/status?logsOffset=0&level=warn"),
            None,
        )
        .await;
    let levels: Vec<&str> = warn_up["logEntries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["level"].as_str().unwrap())
        .collect();
    assert_eq!(levels, ["error", "warn"]);
}

#[tokio::test]
async fn a_revoked_key_is_refused_and_the_teams_other_keys_still_work() {
    let (db, _data, api) = setup(&[]).await;
    let first = key_for(&db, "acme").await;
    let second = key_for(&db, "acme").await;
    let strata = |args: &[&str]| {
        std::process::Command::new(common::strata_bin())
            .args(args)
            .env("DATABASE_URL", &db.url)
            .output()
            .unwrap()
    };
    let listed = strata(&["keys", "list", "--team", "acme"]);
    assert!(listed.status.success());
    let listed = String::from_utf8(listed.stdout).unwrap();
    let rows: Vec<&str> = listed.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{listed}");
    assert!(
        !listed.contains(&first[4..]),
        "listing never shows a key: {listed}"
    );
    // The first key issued is the first row; revoke it.
    let key_id = rows[0].split_whitespace().next().unwrap();
    assert!(
        rows[0].contains(&first[..10]),
        "the row shows the key's prefix: {}",
        rows[0]
    );
    let revoked = strata(&["keys", "revoke", "--team", "acme", key_id]);
    assert!(
        revoked.status.success(),
        "{}",
        String::from_utf8_lossy(&revoked.stderr)
    );

    let (status, body) = client(&api, first)
        .call(reqwest::Method::GET, "/templates", None)
        .await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = client(&api, second)
        .call(reqwest::Method::GET, "/templates", None)
        .await;
    assert_eq!(status, 200, "{body}");
    // Revoking a key of another team is refused and changes nothing.
    key_for(&db, "other").await;
    let wrong = strata(&["keys", "revoke", "--team", "other", key_id]);
    assert!(!wrong.status.success());
}

/// Points `tags` of `template` at its latest build, as promotion does when a build becomes
/// Ready (no worker runs in this file), through the template's own command.
async fn assign_tags_directly(
    api: &common::api::TestApi,
    template: &str,
    build: &str,
    tags: &[&str],
) {
    use strata::app::CommandContext;
    use strata::domain::build_spec::Tag;
    use strata::domain::ids::{BuildId, TemplateId};
    use strata::events::{Actor, ActorRole, Metadata};
    strata::app::template::assign_tags(
        &api.state.events,
        &CommandContext::new(Metadata::new(Actor::new(ActorRole::Api, "test"))),
        &TemplateId::parse(template).unwrap(),
        BuildId::parse(build).unwrap(),
        tags.iter().map(|t| Tag::parse(t).unwrap()).collect(),
        chrono::Utc::now(),
    )
    .await
    .unwrap();
}

/// Issue 9, item 1: `templatename-{team}-{name}` made team `acme-corp`'s `x` and team `acme`'s
/// `corp-x` one stream. Team `acme` then saw acme-corp's template id through the alias check,
/// could not register `corp-x` (squatted, and the 400 "belongs to another team" told it the
/// name existed elsewhere), and in the other order squatted acme-corp's `x`.
#[tokio::test]
async fn names_of_teams_with_dashes_do_not_collide() {
    let (db, _data, api) = setup(&[]).await;
    let acme = client(&api, key_for(&db, "acme").await);
    let acme_corp = client(&api, key_for(&db, "acme-corp").await);

    let (corp_x, _) = acme_corp.register("x").await;
    let (status, body) = acme
        .call(reqwest::Method::GET, "/templates/aliases/corp-x", None)
        .await;
    assert_eq!(
        status, 404,
        "acme must not see acme-corp's template: {body}"
    );
    assert!(!body.to_string().contains(&corp_x), "{body}");

    // Registering the name answers exactly as for a name nobody has: no oracle, no squatting.
    let (acme_corp_x, _) = acme.register("corp-x").await;
    assert_ne!(acme_corp_x, corp_x);
    let (status, body) = acme
        .call(reqwest::Method::GET, "/templates/aliases/corp-x", None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["templateID"], acme_corp_x.as_str());
    let (status, body) = acme_corp
        .call(reqwest::Method::GET, "/templates/aliases/x", None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["templateID"], corp_x.as_str());

    // The other order: acme takes `corp-y` first; acme-corp's `y` is still its own.
    let (acme_corp_y, _) = acme.register("corp-y").await;
    let (corp_y, _) = acme_corp.register("y").await;
    assert_ne!(corp_y, acme_corp_y);

    // The name paths of GET and DELETE resolve in the caller's team only.
    let (status, body) = acme.call(reqwest::Method::GET, "/templates/x", None).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = acme
        .call(
            reqwest::Method::DELETE,
            &format!("/templates/{corp_x}"),
            None,
        )
        .await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = acme_corp
        .call(reqwest::Method::GET, "/templates/x", None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["templateID"], corp_x.as_str());
}

/// Issue 9, item 1: `DELETE /templates/tags` resolved the name through the shared stream and
/// removed tags of the other team's template without checking its owner.
#[tokio::test]
async fn another_teams_tags_cannot_be_removed_or_moved() {
    let (db, _data, api) = setup(&[]).await;
    let acme = client(&api, key_for(&db, "acme").await);
    let acme_corp = client(&api, key_for(&db, "acme-corp").await);
    let (corp_x, build) = acme_corp.register("x").await;
    assign_tags_directly(&api, &corp_x, &build, &["default", "v1"]).await;

    let (status, body) = acme
        .call(
            reqwest::Method::DELETE,
            "/templates/tags",
            Some(json!({"name": "corp-x", "tags": ["v1"]})),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = acme
        .call(
            reqwest::Method::POST,
            "/templates/tags",
            Some(json!({"target": "corp-x:default", "tags": ["mine"]})),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    let (status, tags) = acme_corp
        .call(
            reqwest::Method::GET,
            &format!("/templates/{corp_x}/tags"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{tags}");
    let names: Vec<&str> = tags
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tag"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["default", "v1"], "acme-corp's tags are untouched");
}

/// Issue 9, item 5: a `DELETE` retried after its reply was lost must succeed, not 404. The lost
/// reply is the first request's; the retry is the same request again.
#[tokio::test]
async fn retried_deletes_succeed() {
    let (db, _data, api) = setup(&[]).await;
    let a = client(&api, key_for(&db, "team-a").await);
    let b = client(&api, key_for(&db, "team-b").await);
    let (template, build) = a.register("web").await;
    assign_tags_directly(&api, &template, &build, &["v1"]).await;

    let remove = json!({"name": "web", "tags": ["v1"]});
    for _ in 0..2 {
        let (status, body) = a
            .call(
                reqwest::Method::DELETE,
                "/templates/tags",
                Some(remove.clone()),
            )
            .await;
        assert_eq!(status, 204, "{body}");
    }
    let (status, body) = a
        .call(
            reqwest::Method::DELETE,
            "/templates/tags",
            Some(json!({"name": "web", "tags": ["never-assigned"]})),
        )
        .await;
    assert_eq!(
        status, 404,
        "a tag the template never had is still unknown: {body}"
    );

    // Another team's delete of it is 404, before and after.
    let path = format!("/templates/{template}");
    assert_eq!(b.call(reqwest::Method::DELETE, &path, None).await.0, 404);
    for _ in 0..2 {
        let (status, body) = a.call(reqwest::Method::DELETE, &path, None).await;
        assert_eq!(status, 204, "{body}");
    }
    assert_eq!(b.call(reqwest::Method::DELETE, &path, None).await.0, 404);
    let (status, body) = a.call(reqwest::Method::GET, &path, None).await;
    assert_eq!(status, 404, "a deleted template is gone: {body}");
    let (status, _) = a
        .call(reqwest::Method::DELETE, "/templates/never-existed", None)
        .await;
    assert_eq!(status, 404);
}

/// Issue 9, item 8: the API judged upload-link expiry and the waiting deadline by its local
/// clock, the reconcilers by the database's. The local clock is skewed with
/// `strata::clock::skew_local_clock`, a fault hook that shifts it for this whole process (nextest
/// runs each test in its own process); it stands for a second API node whose clock drifted
/// between issuing the link and taking the upload.
#[tokio::test]
async fn a_skewed_local_clock_does_not_change_expiry_decisions() {
    let (db, data, api) = setup(&[]).await;
    let a = client(&api, key_for(&db, "team-a").await);

    // Ahead: the local clock says the link and the waiting deadline have passed; they have not.
    let (template, build) = a.register("clock-ahead").await;
    let (_, url) = a.link(&template, HASH_A).await;
    strata::clock::skew_local_clock(chrono::Duration::hours(3));
    let (status, body) = a.put(&url, tar_gz(&[("app/x", b"x")])).await;
    assert_eq!(status, 200, "a live link is accepted: {body}");
    let (status, body) = a.start(&template, &build, HASH_A).await;
    assert_eq!(
        status, 202,
        "a build inside its waiting deadline starts: {body}"
    );

    // Behind: the link has expired by the database's clock; the local clock says it has not.
    strata::clock::skew_local_clock(chrono::Duration::zero());
    let short = common::api::serve(
        db.pool.clone(),
        data.path(),
        None,
        &["--upload-url-ttl-secs", "1"],
    )
    .await;
    let b = client(&short, a.key.clone());
    let (template, _) = b.register("clock-behind").await;
    let (_, url) = b.link(&template, HASH_B).await;
    strata::clock::skew_local_clock(-chrono::Duration::hours(3));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (status, body) = b.put(&url, tar_gz(&[("app/y", b"y")])).await;
    assert_eq!(status, 403, "an expired link is refused: {body}");
}

/// Found in review: two clients build one template name at once. The link call names only the
/// template, so client A's link and upload land on client B's build, the newest one waiting.
/// Before, A's start then failed with 400 `MissingBinding`: A's build never linked the hash. E2B
/// scopes files per template and both builds succeed; now a hash a build never linked is bound
/// at the freeze to the scope's latest present generation, and both starts are accepted with
/// the same bytes.
#[tokio::test]
async fn two_concurrent_builds_of_one_template_both_start_with_the_uploaded_context() {
    let (db, _data, api) = setup(&[]).await;
    let c = client(&api, key_for(&db, "acme").await);
    let (template, build_a) = c.register("concurrent").await;
    let (same, build_b) = c.register("concurrent").await;
    assert_eq!(template, same);

    // A's link and upload: bound to B, the newest waiting build.
    let (present, url) = c.link(&template, HASH_A).await;
    assert!(!present);
    let (status, body) = c.put(&url, tar_gz(&[("app/a.txt", b"hello")])).await;
    assert_eq!(status, 200, "{body}");
    // B's link finds the content present.
    assert!(c.link(&template, HASH_A).await.0);

    let (code, body) = c.start(&template, &build_a, HASH_A).await;
    assert_eq!(code, 202, "A's start: {body}");
    let (code, body) = c.start(&template, &build_b, HASH_A).await;
    assert_eq!(code, 202, "B's start: {body}");

    let store = strata::app::event_store(db.pool.clone());
    let mut frozen = Vec::new();
    for build in [&build_a, &build_b] {
        let build = strata::domain::ids::BuildId::parse(build).unwrap();
        let state = strata::events::command::load::<strata::streams::Build>(
            &store,
            &common::build_api::stream(strata::domain::ids::stream::build(&build)),
        )
        .await
        .unwrap()
        .state;
        let freeze = state.freeze.expect("frozen");
        let hash = strata::domain::ids::FilesHash::parse(HASH_A).unwrap();
        frozen.push(freeze.bindings[&hash].blob_digest);
    }
    assert_eq!(frozen[0], frozen[1], "both builds copy the uploaded bytes");
}

/// Issue: a build could ask for 64 CPUs and 1 TiB and was queued for a node that never comes.
/// Over the service's ceilings, registration answers 400 naming the ceiling and its setting, and
/// registers nothing.
#[tokio::test]
async fn resources_over_the_ceilings_are_refused_at_registration() {
    let (db, _data, api) = setup(&[
        "--build-cpu-max",
        "4",
        "--build-memory-max-mb",
        "2048",
        "--build-disk-max",
        "1GiB",
    ])
    .await;
    let c = client(&api, key_for(&db, "acme").await);
    for (body, field, ceiling) in [
        (
            json!({"name": "big", "cpuCount": 64}),
            "cpuCount 64",
            "at most 4 (STRATA_BUILD_CPU_MAX)",
        ),
        (
            json!({"name": "big", "memoryMB": 1 << 20}),
            "memoryMB 1048576",
            "at most 2048 (STRATA_BUILD_MEMORY_MAX)",
        ),
        (
            json!({"name": "big", "minFreeDiskMb": 2048}),
            "minFreeDiskMb 2048",
            "at most 1024 (STRATA_BUILD_DISK_MAX)",
        ),
    ] {
        let (status, reply) = c
            .call(reqwest::Method::POST, "/v3/templates", Some(body))
            .await;
        assert_eq!(status, 400, "{reply}");
        assert_eq!(reply["code"], 400);
        let message = reply["message"].as_str().unwrap();
        assert!(
            message.contains(field) && message.contains(ceiling),
            "{message}"
        );
    }
    let (status, listed) = c.call(reqwest::Method::GET, "/templates", None).await;
    assert_eq!(status, 200);
    assert_eq!(
        listed,
        json!([]),
        "a refused registration registers nothing"
    );
    // At the ceilings, and with E2B's defaults, a build registers.
    let (status, reply) = c
        .call(
            reqwest::Method::POST,
            "/v3/templates",
            Some(json!({"name": "fits", "cpuCount": 4, "memoryMB": 2048})),
        )
        .await;
    assert_eq!(status, 202, "{reply}");
    c.register("defaults").await;
}

/// A distinct valid filesHash per `n`.
fn hash_n(n: usize) -> String {
    format!("{n:064x}")
}

/// Issue: builds per team were unlimited, and a check made before the append lets a whole
/// burst through. Twenty registrations at once against a limit of five: exactly five register
/// (the limit is counted inside each registration's transaction), the rest answer 429 naming
/// the limit, and another team still registers.
#[tokio::test]
async fn a_burst_of_registrations_stops_exactly_at_the_teams_queued_limit() {
    let (db, _data, api) = setup(&["--team-max-queued-builds", "5"]).await;
    let key = key_for(&db, "acme").await;
    let calls = (0..20).map(|i| {
        let c = client(&api, key.clone());
        async move {
            c.call(
                reqwest::Method::POST,
                "/v3/templates",
                Some(json!({"name": format!("burst-{}", i % 4)})),
            )
            .await
        }
    });
    let replies = futures::future::join_all(calls).await;
    let admitted = replies.iter().filter(|(s, _)| *s == 202).count();
    assert_eq!(admitted, 5, "{replies:?}");
    for (status, reply) in replies.iter().filter(|(s, _)| *s != 202) {
        assert_eq!(*status, 429, "{reply}");
        assert_eq!(reply["code"], 429);
        let message = reply["message"].as_str().unwrap();
        assert!(
            message.contains("team acme already has 5 builds waiting or queued")
                && message.contains("STRATA_TEAM_MAX_QUEUED_BUILDS"),
            "{message}"
        );
    }
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM builds WHERE team_id = 'acme'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(stored, 5, "a refused registration stores nothing");
    let other = client(&api, key_for(&db, "globex").await);
    other.register("theirs").await;
}

/// Upload links of one team's waiting builds stop at the limit (429, nothing reserved), also
/// when asked for at once; using a link frees its place.
#[tokio::test]
async fn upload_links_stop_at_the_teams_pending_limit_and_a_used_link_frees_its_place() {
    let (db, _data, api) = setup(&["--team-max-pending-uploads", "3"]).await;
    let c = client(&api, key_for(&db, "acme").await);
    let (template, _) = c.register("links").await;
    let calls = (0..8).map(|i| {
        let c = client(&api, c.key.clone());
        let template = template.clone();
        async move {
            c.call(
                reqwest::Method::GET,
                &format!("/templates/{template}/files/{}", hash_n(i)),
                None,
            )
            .await
        }
    });
    let replies = futures::future::join_all(calls).await;
    let linked: Vec<&Value> = replies
        .iter()
        .filter(|(s, _)| *s == 201)
        .map(|(_, b)| b)
        .collect();
    assert_eq!(linked.len(), 3, "{replies:?}");
    for (status, reply) in replies.iter().filter(|(s, _)| *s != 201) {
        assert_eq!(*status, 429, "{reply}");
        assert!(
            reply["message"]
                .as_str()
                .unwrap()
                .contains("STRATA_TEAM_MAX_PENDING_UPLOADS"),
            "{reply}"
        );
    }
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM upload_intents")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(pending, 3, "a refused link reserves nothing");

    // The fourth link is refused until one is used; an upload to one of them completes its
    // intent, and then a link is handed out again.
    let (status, reply) = c
        .call(
            reqwest::Method::GET,
            &format!("/templates/{template}/files/{HASH_A}"),
            None,
        )
        .await;
    assert_eq!(status, 429, "{reply}");
    let url = linked[0]["url"].as_str().unwrap();
    let (status, reply) = c.put(url, tar_gz(&[("app/a.txt", b"hello")])).await;
    assert!((200..300).contains(&status), "{status} {reply}");
    let (present, _) = c.link(&template, HASH_A).await;
    assert!(!present);
}

/// A start with more steps than one build may have is refused with a 400 naming the limit;
/// at the limit it starts.
#[tokio::test]
async fn a_start_with_more_steps_than_the_limit_is_refused() {
    let (db, _data, api) = setup(&["--build-max-steps", "2"]).await;
    let c = client(&api, key_for(&db, "acme").await);
    let (template, build) = c.register("steps").await;
    let run = json!({"type": "RUN", "args": ["true"], "force": false});
    let (status, reply) = c
        .call(
            reqwest::Method::POST,
            &format!("/v2/templates/{template}/builds/{build}"),
            Some(json!({"fromImage": "busybox", "force": false, "steps": [run, run, run]})),
        )
        .await;
    assert_eq!(status, 400, "{reply}");
    let message = reply["message"].as_str().unwrap();
    assert!(
        message.contains("3 steps, more than the 2") && message.contains("STRATA_BUILD_MAX_STEPS"),
        "{message}"
    );
    let (status, reply) = c
        .call(
            reqwest::Method::POST,
            &format!("/v2/templates/{template}/builds/{build}"),
            Some(json!({"fromImage": "busybox", "force": false, "steps": [run, run]})),
        )
        .await;
    assert_eq!(status, 202, "{reply}");
}

/// A PUT whose body the test feeds by hand: `declared` bytes announced, what is sent through
/// the returned sender. Answers with (status, Retry-After, body).
type BodySender = futures::channel::mpsc::UnboundedSender<Result<Vec<u8>, std::io::Error>>;

fn put_by_hand(
    url: &str,
    declared: usize,
) -> (
    BodySender,
    tokio::task::JoinHandle<(u16, Option<String>, Value)>,
) {
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Vec<u8>, std::io::Error>>();
    let request = reqwest::Client::new()
        .put(url)
        .header(reqwest::header::CONTENT_LENGTH, declared)
        .body(reqwest::Body::wrap_stream(rx));
    let answer = tokio::spawn(async move {
        match request.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let retry = resp
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .map(|v| v.to_str().unwrap().to_owned());
                let text = resp.text().await.unwrap_or_default();
                (
                    status,
                    retry,
                    serde_json::from_str(&text).unwrap_or(Value::String(text)),
                )
            }
            // The server answered and closed before the body ended.
            Err(e) => (0, None, Value::String(e.to_string())),
        }
    });
    (tx, answer)
}

/// Waits (bounded) until `n` uploads have claimed their intents.
async fn wait_for_claims(db: &common::TestDb, n: i64) {
    let claimed = async {
        loop {
            let got: i64 =
                sqlx::query_scalar("SELECT count(*) FROM events WHERE type = 'UploadClaimed.v1'")
                    .fetch_one(&db.pool)
                    .await
                    .unwrap();
            if got >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), claimed)
        .await
        .expect("the upload claims its intent");
}

fn stored_blobs(data: &std::path::Path) -> usize {
    std::fs::read_dir(data.join("blobs/sha256"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Issue: a signed URL could be replayed until it expired, each replay storing up to its
/// ceiling before the final compare-and-set answered 409. Now a PUT to a URL whose upload
/// completed is hashed and stored nowhere: the same bytes answer 200 (a replay), others 409,
/// and the blob store holds only the first upload's bytes.
#[tokio::test]
async fn a_replayed_upload_url_stores_nothing() {
    let (db, data, api) = setup(&[]).await;
    let c = client(&api, key_for(&db, "acme").await);
    let (template, _) = c.register("replayed").await;
    let (_, url) = c.link(&template, HASH_A).await;
    let archive = tar_gz(&[("app/a.txt", b"hello")]);
    assert_eq!(c.put(&url, archive.clone()).await.0, 200);
    assert_eq!(stored_blobs(data.path()), 1);
    for _ in 0..3 {
        assert_eq!(c.put(&url, archive.clone()).await.0, 200, "a replay");
        let (status, body) = c.put(&url, tar_gz(&[("app/a.txt", b"different")])).await;
        assert_eq!(status, 409, "{body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("already completed"),
            "{body}"
        );
    }
    assert_eq!(stored_blobs(data.path()), 1, "replays stored nothing");
    let tmp = || {
        std::fs::read_dir(data.path().join("blobs/tmp"))
            .unwrap()
            .count()
    };
    assert_eq!(tmp(), 0, "nothing staged either");
    // With the stored bytes torn, a PUT may repair them, but other bytes are still refused
    // and never published.
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&archive));
    let blob = data.path().join("blobs/sha256").join(&digest);
    std::fs::write(&blob, b"torn").unwrap();
    let other = tar_gz(&[("app/a.txt", b"other bytes")]);
    let (status, body) = c.put(&url, other.clone()).await;
    assert_eq!(status, 409, "{body}");
    let other_digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&other));
    assert!(!data.path().join("blobs/sha256").join(other_digest).exists());
    assert_eq!(tmp(), 0);
}

/// While one PUT is receiving a URL's body, another PUT to the same URL is refused at once
/// (409, before a byte of it is read); the first then completes.
#[tokio::test]
async fn a_second_put_to_a_url_being_received_is_refused_at_once() {
    let (db, data, api) = setup(&[]).await;
    let c = client(&api, key_for(&db, "acme").await);
    let (template, _) = c.register("racing").await;
    let (_, url) = c.link(&template, HASH_A).await;
    let archive = tar_gz(&[("app/a.txt", b"hello")]);
    let (tx, first) = put_by_hand(&url, archive.len());
    tx.unbounded_send(Ok(archive[..10].to_vec())).unwrap();
    wait_for_claims(&db, 1).await;
    let (status, body) = c.put(&url, archive.clone()).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("is being received now"),
        "{body}"
    );
    tx.unbounded_send(Ok(archive[10..].to_vec())).unwrap();
    drop(tx);
    let (status, _, body) = first.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(stored_blobs(data.path()), 1);
}

/// A client that stops sending is cut off after STRATA_UPLOAD_IDLE_TIMEOUT_SECS with a 408,
/// its claim is released, and the same URL then takes the whole archive.
#[tokio::test]
async fn an_upload_that_stalls_is_cut_off_and_its_url_can_be_used_again() {
    let (db, data, api) = setup(&["--upload-idle-timeout-secs", "1"]).await;
    let c = client(&api, key_for(&db, "acme").await);
    let (template, _) = c.register("stalled").await;
    let (_, url) = c.link(&template, HASH_A).await;
    let archive = tar_gz(&[("app/a.txt", b"hello")]);
    let (tx, stalled) = put_by_hand(&url, archive.len());
    tx.unbounded_send(Ok(archive[..10].to_vec())).unwrap();
    let (status, _, body) = tokio::time::timeout(Duration::from_secs(20), stalled)
        .await
        .expect("the stalled upload is answered")
        .unwrap();
    assert_eq!(status, 408, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("STRATA_UPLOAD_IDLE_TIMEOUT_SECS"),
        "{body}"
    );
    assert_eq!(stored_blobs(data.path()), 0);
    drop(tx);
    let (status, body) = c.put(&url, archive).await;
    assert_eq!(status, 200, "{body}");
}

/// Past STRATA_UPLOAD_MAX_CONCURRENT uploads at once, one more answers 503 with Retry-After
/// before its body is read; once a slot frees, uploads go through again.
#[tokio::test]
async fn uploads_past_the_concurrent_limit_answer_503_with_retry_after() {
    let (db, _data, api) = setup(&["--upload-max-concurrent", "1"]).await;
    let c = client(&api, key_for(&db, "acme").await);
    let (template, _) = c.register("busy").await;
    let (_, first_url) = c.link(&template, HASH_A).await;
    let (_, second_url) = c.link(&template, HASH_B).await;
    let archive = tar_gz(&[("app/a.txt", b"hello")]);
    let (tx, first) = put_by_hand(&first_url, archive.len());
    tx.unbounded_send(Ok(archive[..10].to_vec())).unwrap();
    // The slot is taken before the claim: once the claim is stored, the slot is held.
    wait_for_claims(&db, 1).await;
    let (status, retry, body) = {
        let (tx2, answer) = put_by_hand(&second_url, archive.len());
        tx2.unbounded_send(Ok(archive.clone())).unwrap();
        drop(tx2);
        answer.await.unwrap()
    };
    assert_eq!(status, 503, "{body}");
    assert_eq!(retry.as_deref(), Some("5"));
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("STRATA_UPLOAD_MAX_CONCURRENT"),
        "{body}"
    );
    tx.unbounded_send(Ok(archive[10..].to_vec())).unwrap();
    drop(tx);
    assert_eq!(first.await.unwrap().0, 200);
    assert_eq!(c.put(&second_url, archive).await.0, 200);
}

/// Sends a PUT to `url` that announces `declared` bytes, sends `body` (shorter), and closes
/// its side of the connection: a client that goes away mid-body.
async fn put_and_vanish(url: &str, declared: usize, body: &[u8]) {
    use tokio::io::AsyncWriteExt;
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let mut tcp = tokio::net::TcpStream::connect(host).await.unwrap();
    let head = format!("PUT {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {declared}\r\n\r\n");
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body).await.unwrap();
    tcp.shutdown().await.unwrap();
    // Read whatever answer comes, until the server closes.
    let mut sink = Vec::new();
    let _ = tokio::io::AsyncReadExt::read_to_end(&mut tcp, &mut sink).await;
}

async fn claim_releases(db: &common::TestDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM events WHERE type = 'UploadClaimReleased.v1'")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// A client that goes away mid-body leaves no claim behind (the URL takes the next PUT), and
/// since each failed upload appends a claim and its release to the build's stream, a URL takes
/// three failed uploads: the fourth PUT is refused (409, its body unread) until the client asks
/// for a new link, so a client failing on purpose cannot grow the stream without end.
#[tokio::test]
async fn a_url_whose_uploads_keep_failing_is_refused_after_three() {
    let (db, _data, api) = setup(&[]).await;
    let c = client(&api, key_for(&db, "acme").await);
    let (template, _) = c.register("failing-uploads").await;
    let (_, url) = c.link(&template, HASH_A).await;
    let archive = tar_gz(&[("app/a.txt", b"hello")]);
    for n in 1..=3 {
        put_and_vanish(&url, archive.len(), &archive[..archive.len() / 2]).await;
        let released = async {
            while claim_releases(&db).await < n {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), released)
            .await
            .expect("the vanished upload's claim is released");
    }
    let (status, body) = c.put(&url, archive.clone()).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("3 uploads to this link"),
        "{body}"
    );
    assert_eq!(claim_releases(&db).await, 3);
    // A new link takes the upload.
    let (_, fresh) = c.link(&template, HASH_A).await;
    assert_eq!(c.put(&fresh, archive).await.0, 200);
}

#[tokio::test]
async fn the_start_records_the_services_cache_mode_and_an_unknown_one_is_skipped() {
    use strata::domain::cache_mode::{CacheMode, Level};
    for (setting, mode, level, skipped) in [
        ("final", CacheMode::Final, Level::Service, 0),
        ("fast", CacheMode::Steps, Level::Default, 1),
    ] {
        let (db, _data, api) = setup(&["--cache-mode", setting]).await;
        let c = client(&api, key_for(&db, "acme").await);
        let (template, build) = c.register("moded").await;
        let (_, url) = c.link(&template, HASH_A).await;
        assert_eq!(c.put(&url, tar_gz(&[("app/a.txt", b"hi")])).await.0, 200);
        let (code, body) = c.start(&template, &build, HASH_A).await;
        assert_eq!(code, 202, "{body}");
        let id = strata::domain::ids::BuildId::parse(&build).unwrap();
        let store = strata::app::event_store(db.pool.clone());
        let state = strata::events::command::load::<strata::streams::Build>(
            &store,
            &strata::streams::build_stream(&id),
        )
        .await
        .unwrap()
        .state;
        let resolved = state.cache_mode.expect("recorded at start");
        assert_eq!((resolved.mode, resolved.level), (mode, level), "{setting}");
        assert_eq!(resolved.skipped.len(), skipped, "{setting}: {resolved:?}");
    }
}

#[tokio::test]
async fn pins_move_a_team_and_a_template_between_modes_over_the_service_setting() {
    use strata::domain::cache_mode::{CacheMode, Level};
    use strata::domain::settings::{SettingsScope, CACHE_MODE};
    let (db, _data, api) = setup(&["--cache-mode", "final"]).await;
    let c = client(&api, key_for(&db, "acme").await);
    let store = strata::app::event_store(db.pool.clone());
    // One context per command: a context's id makes a retry of the same command a replay.
    let ctx = || {
        strata::app::CommandContext::new(strata::events::Metadata::new(strata::events::Actor::new(
            strata::events::ActorRole::Cli,
            "operator",
        )))
    };
    let team = strata::domain::ids::TeamId::parse("acme").unwrap();
    let started = |name: &'static str| {
        let c = &c;
        let store = &store;
        async move {
            let (template, build) = c.register(name).await;
            let (_, url) = c.link(&template, HASH_A).await;
            c.put(&url, tar_gz(&[("app/a.txt", b"hi")])).await;
            let (code, body) = c.start(&template, &build, HASH_A).await;
            assert_eq!(code, 202, "{body}");
            let id = strata::domain::ids::BuildId::parse(&build).unwrap();
            let state = strata::events::command::load::<strata::streams::Build>(
                store,
                &strata::streams::build_stream(&id),
            )
            .await
            .unwrap()
            .state;
            let r = state.cache_mode.unwrap();
            (
                (r.mode, r.level),
                strata::domain::ids::TemplateId::parse(&template).unwrap(),
                id,
            )
        }
    };
    // `strata why` names the pin a build's mode came from: who pinned it, where and when.
    let why_mode = |build| {
        let store = &store;
        async move {
            strata::inspect::why_build(store, build)
                .await
                .unwrap()
                .cache
                .expect("the cache section")
                .mode
                .expect("the mode")
        }
    };
    let (mode, web, _) = started("web").await;
    assert_eq!(mode, (CacheMode::Final, Level::Service));

    let now = chrono::Utc::now();
    let team_scope = SettingsScope::Team(team.clone());
    strata::app::settings::pin(&store, &ctx(), &team_scope, CACHE_MODE, "off", now)
        .await
        .unwrap();
    assert_eq!(started("web").await.0, (CacheMode::Off, Level::Team));
    // Back to the step cache for this team, while the service says final.
    strata::app::settings::pin(&store, &ctx(), &team_scope, CACHE_MODE, "steps", now)
        .await
        .unwrap();
    let (mode, _, steps_build) = started("web").await;
    assert_eq!(mode, (CacheMode::Steps, Level::Team));
    let steps_why = why_mode(steps_build).await;
    assert!(
        steps_why.starts_with("steps, pinned for team acme by cli/operator at "),
        "{steps_why}"
    );
    // One template over its team.
    let web_id = web.clone();
    let web_scope = SettingsScope::Template(team.clone(), web);
    strata::app::settings::pin(&store, &ctx(), &web_scope, CACHE_MODE, "final", now)
        .await
        .unwrap();
    let (mode, _, build) = started("web").await;
    assert_eq!(mode, (CacheMode::Final, Level::Template));
    let why = why_mode(build).await;
    assert!(
        why.starts_with(&format!(
            "final, pinned for template {web_id} of team acme by cli/operator at "
        )),
        "{why}"
    );
    assert_eq!(started("api").await.0, (CacheMode::Steps, Level::Team));
    // Unpinned, each falls back a level.
    strata::app::settings::unpin(&store, &ctx(), &web_scope, CACHE_MODE, now)
        .await
        .unwrap();
    strata::app::settings::unpin(&store, &ctx(), &team_scope, CACHE_MODE, now)
        .await
        .unwrap();
    let (mode, _, build) = started("web").await;
    assert_eq!(mode, (CacheMode::Final, Level::Service));
    assert_eq!(
        why_mode(build).await,
        "final (service setting STRATA_CACHE_MODE)"
    );
    // The sandbox backend resolves over the same levels: a team pin of the one backend, an
    // unknown value skipped.
    strata::app::settings::pin(
        &store,
        &ctx(),
        &team_scope,
        strata::domain::settings::SANDBOX_BACKEND,
        "Namespace",
        now,
    )
    .await
    .unwrap();
    let (_, _, build) = started("web").await;
    let state = strata::events::command::load::<strata::streams::Build>(
        &store,
        &strata::streams::build_stream(&build),
    )
    .await
    .unwrap()
    .state;
    let backend = state.sandbox_backend.expect("recorded at start");
    assert_eq!(
        (backend.backend.as_str(), backend.level),
        ("namespace", Level::Team)
    );
    let err = strata::app::settings::pin(
        &store,
        &ctx(),
        &team_scope,
        strata::domain::settings::SANDBOX_BACKEND,
        "firecracker",
        now,
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("\"firecracker\" is not a sandbox backend"),
        "{err}"
    );
    strata::app::settings::unpin(
        &store,
        &ctx(),
        &team_scope,
        strata::domain::settings::SANDBOX_BACKEND,
        now,
    )
    .await
    .unwrap();
    // What the team's stream recorded after a build resolved does not change its answer.
    assert_eq!(why_mode(steps_build).await, steps_why);
    // A bad pin is refused and changes nothing.
    let err = strata::app::settings::pin(&store, &ctx(), &team_scope, CACHE_MODE, "fast", now)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("\"fast\""), "{err}");
    assert!(strata::app::settings::read(&store, &team_scope)
        .await
        .unwrap()
        .pins
        .is_empty());
    // The audit trail: who pinned what, in order, on the team's settings stream.
    let events = store
        .read_stream_all(&strata::streams::settings_stream(&team_scope))
        .await
        .unwrap();
    let trail: Vec<(String, String)> = events
        .iter()
        .map(|e| (e.event_type.clone(), e.metadata.actor.node.clone()))
        .collect();
    assert_eq!(
        trail,
        [
            ("SettingPinned.v1".to_string(), "operator".to_string()),
            ("SettingPinned.v1".to_string(), "operator".to_string()),
            ("SettingUnpinned.v1".to_string(), "operator".to_string()),
            ("SettingPinned.v1".to_string(), "operator".to_string()),
            ("SettingUnpinned.v1".to_string(), "operator".to_string()),
        ]
    );
}

/// A tar.gz of one file of `len` pseudo-random bytes from `seed`: gzip cannot shrink it, so the
/// archive's size is about `len`.
fn incompressible_archive(seed: u64, len: usize) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut data = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut data);
    tar_gz(&[("app/blob.bin", &data)])
}

async fn stored_uploads(db: &common::TestDb, team: &str) -> u64 {
    strata::projections::stored_uploads::team_bytes(
        &db.pool,
        &strata::domain::ids::TeamId::parse(team).unwrap(),
    )
    .await
    .unwrap()
}

/// `STRATA_TEAM_MAX_STORED_UPLOADS`: an upload that cannot fit beside what the team's uploads
/// already take is refused with a 413 naming the limit before a byte of it is stored; its
/// URL is released; another team is not held to the first team's bytes.
#[tokio::test]
async fn an_upload_past_the_teams_stored_limit_is_refused_before_a_byte_is_stored() {
    let (db, data, api) = setup(&["--team-max-stored-uploads", "1MiB"]).await;
    let acme = client(&api, key_for(&db, "acme").await);
    let (template, _) = acme.register("stored-limit").await;
    let first = incompressible_archive(1, 600 << 10);
    let (_, url) = acme.link(&template, HASH_A).await;
    assert_eq!(acme.put(&url, first.clone()).await.0, 200);
    assert_eq!(stored_uploads(&db, "acme").await, first.len() as u64);
    assert_eq!(stored_blobs(data.path()), 1);

    let second = incompressible_archive(2, 600 << 10);
    let (_, url) = acme.link(&template, HASH_B).await;
    let (status, body) = acme.put(&url, second.clone()).await;
    assert_eq!(status, 413, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.starts_with("team acme stores 600.")
            && message.contains("would pass its limit of 1.0 MiB (STRATA_TEAM_MAX_STORED_UPLOADS)"),
        "{message}"
    );
    assert_eq!(
        stored_blobs(data.path()),
        1,
        "the refused upload stored nothing"
    );
    assert_eq!(stored_uploads(&db, "acme").await, first.len() as u64);
    assert_eq!(
        claim_releases(&db).await,
        1,
        "the refused upload's URL was released"
    );

    // The same bytes under another team count against that team alone.
    let other = client(&api, key_for(&db, "other").await);
    let (template, _) = other.register("stored-limit").await;
    let (_, url) = other.link(&template, HASH_B).await;
    assert_eq!(other.put(&url, second).await.0, 200);
    assert_eq!(stored_uploads(&db, "acme").await, first.len() as u64);
}

/// Two uploads that each fit the team's stored-uploads limit alone, but not together: both
/// pass the check against `Content-Length` (each is being received while the other is), and the
/// completion's append counts the team's stored bytes in its own transaction, so exactly one
/// commits and the other answers 413.
#[tokio::test]
async fn two_uploads_that_fit_alone_but_not_together_cannot_both_commit() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (db, data, api) = setup(&["--team-max-stored-uploads", "1MiB"]).await;
    let acme = client(&api, key_for(&db, "acme").await);
    let (template, _) = acme.register("stored-race").await;
    let mut started = Vec::new();
    for (seed, hash) in [(1, HASH_A), (2, HASH_B)] {
        let archive = incompressible_archive(seed, 600 << 10);
        let (_, url) = acme.link(&template, hash).await;
        let rest = url.strip_prefix("http://").unwrap();
        let (host, path) = rest.split_at(rest.find('/').unwrap());
        let mut tcp = tokio::net::TcpStream::connect(host).await.unwrap();
        let head = format!(
            "PUT {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            archive.len()
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        tcp.write_all(&archive[..archive.len() / 2]).await.unwrap();
        started.push((tcp, archive));
    }
    // Both are being stored (each was checked against the limit before its staging file was
    // made) before either body ends.
    let staging = data.path().join("blobs/tmp");
    let receiving = async {
        while std::fs::read_dir(&staging).map_or(0, |d| d.count()) < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), receiving)
        .await
        .expect("both uploads are being received");
    let finished = started.into_iter().map(|(mut tcp, archive)| async move {
        tcp.write_all(&archive[archive.len() / 2..]).await.unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await.unwrap();
        answer
    });
    let answers = futures::future::join_all(finished).await;
    let statuses: Vec<&str> = answers
        .iter()
        .map(|a| a.split(' ').nth(1).unwrap_or(""))
        .collect();
    let mut sorted = statuses.clone();
    sorted.sort();
    assert_eq!(sorted, ["200", "413"], "{answers:?}");
    let refused = answers.iter().find(|a| a.contains(" 413 ")).unwrap();
    assert!(
        refused.contains("already has 1.0 MiB of uploads stored")
            && refused.contains("STRATA_TEAM_MAX_STORED_UPLOADS"),
        "{refused}"
    );
    let stored = stored_uploads(&db, "acme").await;
    assert!(stored > 600 << 10 && stored <= 1 << 20, "{stored}");
}
