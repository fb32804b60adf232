//! The operator page `/ui` after real builds: its admin-token gate over HTTP, its read-only
//! pages, and the pages rendered by a real headless Chromium (Debian's `chromium`), which
//! loads the builds list and a build's timeline; a screenshot is kept under
//! `target/tmp/ui/` as an artifact.

use crate::common;

use common::worker_fixture::*;
use serde_json::json;
use strata::domain::build::Phase;
use strata::domain::ids::BuildId;

use common::chromium::{chromium, screenshot, TOKEN};
const SECRET: &str = "ui-test-upload-secret-0123456789abcdef0123";

async fn build(fx: &Fixture, name: &str, spec: serde_json::Value) -> BuildId {
    let (_, build) = fx.api.register(name).await;
    fx.api.start(build, spec).await;
    fx.wait_terminal(build).await;
    build
}

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// The builds table of the list page (the page also shows the latest events of every stream).
fn builds_table(page: &str) -> &str {
    let from = page.find("<table id=\"builds\">").expect("a builds table");
    let to = from + page[from..].find("</table>").unwrap();
    &page[from..to]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_operator_page_is_gated_reads_builds_and_renders_in_chromium() {
    let mut fx = Fixture::new(settings()).await;
    let api = common::api::serve(
        fx.db.pool.clone(),
        &common::sandbox::node_dir(),
        Some(TOKEN),
        &["--upload-secret", SECRET],
    )
    .await;
    let ok = build(
        &fx,
        "ui-app",
        json!({"fromImage": "busybox", "force": false, "steps": [
            step("ENV", &["GREETING", "hello"]),
            step("RUN", &["echo $GREETING from the page > greeting.txt; cat greeting.txt"]),
            step("RUN", &["echo second step"]),
        ]}),
    )
    .await;
    let failed = build(
        &fx,
        "ui-broken",
        json!({"fromImage": "busybox", "force": false, "steps": [
            step("RUN", &["echo about to fail; exit 7"]),
        ]}),
    )
    .await;
    assert!(matches!(fx.state(ok).await.phase, Phase::Ready { .. }));
    assert!(matches!(fx.state(failed).await.phase, Phase::Error { .. }));

    // The gate: 401 without a token or with a wrong one, the page with the right one.
    let http = no_redirects();
    let ui = format!("{}/ui", api.base);
    let resp = http.get(&ui).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let text = resp.text().await.unwrap();
    assert!(text.contains("action=\"/ui/login\""), "{text}");
    assert!(!text.contains(&ok.to_string()));
    let resp = http.get(&ui).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let resp = http.get(format!("{ui}?token=wrong")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    for path in [
        "/ui/templates",
        "/ui/storage",
        "/ui/teams",
        "/ui/sandboxes",
        &format!("/ui/builds/{ok}"),
        &format!("/ui/builds/{ok}/why.json"),
    ] {
        let resp = http
            .get(format!("{}{path}", api.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{path}");
    }
    let page = http.get(&ui).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(page.status().as_u16(), 200);
    let page = page.text().await.unwrap();
    assert!(page.contains(&ok.to_string()) && page.contains(&failed.to_string()));
    // Below the list, the store's latest events: a full feed of 20 rows (two builds appended
    // more), build streams linked to their page, each event with the role that appended it.
    let feed = &page[page.find("<table id=\"feed\">").expect("the latest events")..];
    assert_eq!(feed.matches("<tr><td>").count(), 20, "{feed}");
    assert!(
        feed.contains(&format!(
            "<a href=\"/ui/builds/{failed}\">build-{failed}</a>"
        )),
        "{feed}"
    );
    assert!(feed.contains("<td>worker/"), "{feed}");

    // A token in a page's address is refused: only the login request takes one.
    let resp = http
        .get(format!("{ui}/builds/{ok}?token={TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    assert!(resp.headers().get("set-cookie").is_none());
    // The login link: redirected to the page asked for (never off /ui), with a session cookie
    // that is a random signed id with an expiry, not the token.
    let resp = http
        .get(format!("{ui}/login?token={TOKEN}&next=/ui/builds/{ok}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 303);
    assert_eq!(
        resp.headers()["location"],
        format!("/ui/builds/{ok}").as_str()
    );
    let cookie = resp.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly")
            && cookie.contains("SameSite=Strict")
            && cookie.contains("Max-Age=43200")
            && !cookie.contains("Secure"),
        "plain HTTP here, so not Secure: {cookie}"
    );
    assert!(!cookie.contains(TOKEN), "{cookie}");
    let session = cookie.split(';').next().unwrap().to_owned();
    let resp = http
        .get(format!("{ui}/builds/{ok}"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let resp = http
        .get(format!(
            "{ui}/login?token={TOKEN}&next=https://elsewhere.example/"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["location"], "/ui");
    // A forged or altered session is no session.
    let (value, _) = session.split_once('.').unwrap();
    let forged = format!("{value}.00.00");
    let resp = http
        .get(format!("{ui}/builds/{ok}"))
        .header("cookie", &forged)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    // The login form: a wrong token is refused; the right one opens a new session.
    let resp = http
        .post(format!("{ui}/login"))
        .form(&[("token", "nope")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let resp = http
        .post(format!("{ui}/login"))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 303);
    let second = resp.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    assert_ne!(second, session, "every sign-in is a session of its own");
    let resp = http
        .get(format!("{ui}/templates"))
        .header("cookie", &second)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);

    // Filters.
    let errors = http
        .get(format!("{ui}?phase=error"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let errors = builds_table(&errors);
    assert!(errors.contains(&failed.to_string()) && !errors.contains(&ok.to_string()));
    let by_name = http
        .get(format!("{ui}?template=ui-app"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let by_name = builds_table(&by_name);
    assert!(by_name.contains(&ok.to_string()) && !by_name.contains(&failed.to_string()));

    // The page's why is the CLI's why.
    let why: serde_json::Value = http
        .get(format!("{ui}/builds/{failed}/why.json"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let direct = strata::inspect::why_build(&fx.store, failed).await.unwrap();
    assert_eq!(why, serde_json::to_value(&direct).unwrap());
    assert_eq!(why["failure"]["exit_code"], 7);

    let templates = http
        .get(format!("{ui}/templates"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(templates.contains("ui-app") && templates.contains("ui-broken"));
    assert!(
        templates.contains(&format!("default → <a href=\"/ui/builds/{ok}\">")),
        "{templates}"
    );
    // Each template's builds counted by phase.
    assert!(
        templates.contains("<span class=\"ready\">ready</span> 1")
            && templates.contains("<span class=\"error\">error</span> 1"),
        "{templates}"
    );
    let storage = http
        .get(format!("{ui}/storage"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(storage.contains("<td>blobs</td>") && storage.contains("<td>layers</td>"));

    // A real browser: the list loads, the timeline shows every step.
    let list = chromium(&format!("{ui}/login?token={TOKEN}&next=/ui"), "--dump-dom").await;
    assert!(list.contains("<table id=\"builds\">"), "{list}");
    assert!(list.contains(&ok.to_string()) && list.contains(&failed.to_string()));
    let dom = chromium(
        &format!("{ui}/login?token={TOKEN}&next=/ui/builds/{ok}"),
        "--dump-dom",
    )
    .await;
    assert!(dom.contains("<table id=\"steps\">"), "{dom}");
    assert_eq!(dom.matches("<tr class=\"step\">").count(), 3, "{dom}");
    assert!(dom.contains("ENV GREETING hello"));
    assert!(dom.contains("RUN echo $GREETING from the page &gt; greeting.txt; cat greeting.txt"));
    assert!(
        dom.contains("hello from the page"),
        "the RUN's log excerpt: {dom}"
    );
    assert!(dom.contains("checkpointed"));
    // Each checkpoint's size, from the blob store, in the table and on the bar's hover.
    assert!(
        sized_checkpoint_titles(&dom) >= 1,
        "a checkpoint's size on hover: {dom}"
    );
    assert!(dom.contains("<table id=\"attempts\">"));
    // The waterfall: one bar per phase and per step, each step's outcome as the events say.
    assert!(dom.contains("<svg id=\"waterfall\""), "{dom}");
    assert_eq!(dom.matches("data-kind=\"step\"").count(), 3, "{dom}");
    assert_eq!(dom.matches("data-kind=\"phase\"").count(), 4, "{dom}");
    for stage in ["base", "finalize"] {
        assert!(
            dom.contains(&format!("data-kind=\"stage\" data-name=\"{stage}\"")),
            "{stage}: {dom}"
        );
    }
    let outcomes = fx.state(ok).await.progress;
    assert_eq!(outcomes.len(), 3);
    for (step, outcome) in &outcomes {
        let name = match outcome {
            strata::domain::build::StepOutcome::Executed => "executed",
            strata::domain::build::StepOutcome::Checkpointed { .. } => "checkpointed",
            strata::domain::build::StepOutcome::Cached { .. } => "cached",
        };
        assert!(
            dom.contains(&format!(
                "data-kind=\"step\" data-name=\"{step}\" data-outcome=\"{name}\""
            )),
            "step {step} as {name}: {dom}"
        );
    }
    let failed_dom = chromium(
        &format!("{ui}/login?token={TOKEN}&next=/ui/builds/{failed}"),
        "--dump-dom",
    )
    .await;
    assert!(failed_dom.contains("exit code <b>7</b>"), "{failed_dom}");
    assert!(failed_dom.contains("about to fail"));
    assert!(
        failed_dom.contains("data-kind=\"step\" data-name=\"1\" data-outcome=\"failed\""),
        "the failed step is marked: {failed_dom}"
    );
    let unauthenticated = chromium(&ui, "--dump-dom").await;
    assert!(unauthenticated.contains("Sign in with the admin token"));
    assert!(!unauthenticated.contains(&ok.to_string()));

    screenshot(&api.base, &format!("/ui/builds/{ok}"), "build-timeline.png").await;
    fx.stop().await;
}

/// Follows a list page's "older" links from `first`, returning each page's row ids.
async fn pages(http: &reqwest::Client, base: &str, first: &str, row: &str) -> Vec<Vec<String>> {
    let mut out = vec![];
    let mut next = Some(first.to_owned());
    while let Some(path) = next.take() {
        let resp = http
            .get(format!("{base}{path}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200, "{path}");
        let page = resp.text().await.unwrap();
        out.push(
            page.split(row)
                .skip(1)
                .map(|r| r[..36].to_owned())
                .collect(),
        );
        next = page
            .split("<a id=\"older\" href=\"")
            .nth(1)
            .map(|rest| rest[..rest.find('"').unwrap()].replace("&amp;", "&"));
        assert!(out.len() <= 10, "the older links never end");
    }
    out
}

#[tokio::test]
async fn long_lists_are_paged_newest_first_by_an_older_link() {
    let db = common::test_db().await;
    let data = common::data_dir();
    let api = common::api::serve(db.pool.clone(), data.path(), Some(TOKEN), &[]).await;
    let builds = common::build_api::Api {
        store: strata::app::event_store(db.pool.clone()),
        team: strata::domain::ids::TeamId::parse("team-paged").unwrap(),
    };
    let mut registered = vec![];
    for name in ["paged-a", "paged-b", "paged-c", "paged-a", "paged-b"] {
        registered.push(builds.register(name).await.1.to_string());
    }
    let http = no_redirects();

    let seen = pages(
        &http,
        &api.base,
        "/ui?limit=2",
        "<tr class=\"build\"><td><a href=\"/ui/builds/",
    )
    .await;
    assert_eq!(seen.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
    let newest_first: Vec<String> = registered.iter().rev().cloned().collect();
    assert_eq!(seen.concat(), newest_first);
    // Filters carry over to the older pages.
    let seen = pages(
        &http,
        &api.base,
        "/ui?template=paged-a&limit=1",
        "<tr class=\"build\"><td><a href=\"/ui/builds/",
    )
    .await;
    assert_eq!(
        seen.concat(),
        [registered[3].clone(), registered[0].clone()]
    );

    let seen = pages(
        &http,
        &api.base,
        "/ui/templates?limit=2",
        "<tr><td><a href=\"/ui?template=",
    )
    .await;
    assert_eq!(seen.iter().map(Vec::len).collect::<Vec<_>>(), [2, 1]);

    for bad in [
        "/ui?limit=0",
        "/ui?before=yesterday",
        "/ui/templates?limit=100000",
    ] {
        let resp = http
            .get(format!("{}{bad}", api.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{bad}");
    }
}

/// The limits every team is held to, on `/ui/teams` and `/metrics`, with the team at one
/// marked: an operator sees why a team's registrations answer 429. `/metrics` here sits
/// behind STRATA_METRICS_TOKEN.
#[tokio::test]
async fn the_teams_page_and_metrics_show_the_limits_and_the_team_at_one() {
    let db = common::test_db().await;
    let data = common::data_dir();
    let api = common::api::serve(
        db.pool.clone(),
        data.path(),
        Some(TOKEN),
        &[
            "--upload-secret",
            SECRET,
            "--team-max-queued-builds",
            "2",
            "--team-max-running-builds",
            "none",
            "--metrics-token",
            "scrape-token",
        ],
    )
    .await;
    let acme = common::http_build::SdkClient::new(&api.base, &db.url, "acme").await;
    acme.register("one").await;
    acme.register("two").await;
    let globex = common::http_build::SdkClient::new(&api.base, &db.url, "globex").await;
    globex.register("theirs").await;

    // A pin, then one unpinned: only what is in force is listed, with who pinned it.
    let store = strata::app::event_store(db.pool.clone());
    let ctx = || {
        strata::app::CommandContext::new(strata::events::Metadata::new(strata::events::Actor::new(
            strata::events::ActorRole::Cli,
            "ops-alice",
        )))
    };
    let acme = strata::domain::settings::SettingsScope::Team(
        strata::domain::ids::TeamId::parse("acme").unwrap(),
    );
    let globex_scope = strata::domain::settings::SettingsScope::Team(
        strata::domain::ids::TeamId::parse("globex").unwrap(),
    );
    let now = chrono::Utc::now();
    for (scope, value) in [(&acme, "final"), (&globex_scope, "off")] {
        strata::app::settings::pin(&store, &ctx(), scope, "cache.mode", value, now)
            .await
            .unwrap();
    }
    strata::app::settings::unpin(&store, &ctx(), &globex_scope, "cache.mode", now)
        .await
        .unwrap();

    let http = no_redirects();
    let page = http
        .get(format!("{}/ui/teams", api.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status().as_u16(), 200);
    let page = page.text().await.unwrap();
    let limits = &page[page.find("<table id=\"limits\">").unwrap()..];
    assert!(
        limits.contains("<td><code>STRATA_TEAM_MAX_QUEUED_BUILDS</code></td><td>2</td>")
            && limits.contains("<td><code>STRATA_TEAM_MAX_RUNNING_BUILDS</code></td><td>none</td>")
            && limits.contains("<td><code>STRATA_BUILD_MAX_STEPS</code></td><td>500</td>")
            && limits
                .contains("<td><code>STRATA_TEAM_MAX_STORED_UPLOADS</code></td><td>50.0 GiB</td>"),
        "{limits}"
    );
    let teams = &page[page.find("<table id=\"teams\">").unwrap()..];
    assert!(
        teams.contains("<tr><td>acme</td><td>0</td><td><span class=\"error\">2 of 2 (at the limit)</span></td>"),
        "{teams}"
    );
    assert!(
        teams.contains("<tr><td>globex</td><td>0</td><td>1 of 2</td>"),
        "{teams}"
    );
    assert!(
        teams.contains("<td>0.0 B of 50.0 GiB</td></tr>"),
        "no upload yet, against the default limit: {teams}"
    );
    let pins = &page[page.find("<table id=\"pins\">").unwrap()..];
    let pins = &pins[..pins.find("</table>").unwrap()];
    assert_eq!(pins.matches("<tr><td>").count(), 1, "{pins}");
    assert!(
        pins.contains("<tr><td>team acme</td><td><code>cache.mode</code></td><td>final</td>")
            && pins.contains("<td>cli/ops-alice</td>"),
        "{pins}"
    );

    // With STRATA_METRICS_TOKEN set, a scrape without it (or with another) is refused.
    let url = format!("{}/metrics", api.base);
    for auth in [None, Some("Bearer wrong"), Some("scrape-token")] {
        let mut req = http.get(&url);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{auth:?}");
    }
    let text = http
        .get(&url)
        .bearer_auth("scrape-token")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let metrics = common::http_build::parse_metrics(&text);
    assert_eq!(
        metrics["strata_team_limit{setting=\"STRATA_TEAM_MAX_QUEUED_BUILDS\"}"],
        2.0
    );
    assert_eq!(
        metrics["strata_team_limit{setting=\"STRATA_BUILD_MAX_STEPS\"}"],
        500.0
    );
    assert_eq!(
        metrics["strata_team_limit{setting=\"STRATA_TEAM_MAX_STORED_UPLOADS\"}"],
        (50u64 << 30) as f64,
        "the stored-uploads limit is reported in bytes"
    );
    assert!(
        !metrics.contains_key("strata_team_limit{setting=\"STRATA_TEAM_MAX_RUNNING_BUILDS\"}"),
        "a limit of none is not reported"
    );
}

/// How many bars' hover titles name a checkpoint with its size (`…, checkpoint <id> (1.5 KiB)`).
fn sized_checkpoint_titles(page: &str) -> usize {
    page.split("<title>")
        .filter_map(|t| t.split_once("</title>").map(|(t, _)| t))
        .filter(|t| t.contains(", checkpoint ") && t.ends_with("B)"))
        .count()
}

/// The `data-` attributes of every `<tag ` element in `svg`, in order.
fn elements(svg: &str, tag: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    svg.split(&format!("<{tag} "))
        .skip(1)
        .map(|el| {
            let el = &el[..el.find('>').unwrap()];
            el.split("\" ")
                .filter_map(|kv| kv.split_once("=\""))
                .map(|(k, v)| {
                    (
                        k.trim().to_owned(),
                        v.trim_end_matches(['"', '/']).to_owned(),
                    )
                })
                .collect()
        })
        .collect()
}

/// The SVG with id `id` on `page`.
fn svg<'a>(page: &'a str, id: &str) -> &'a str {
    let from = page
        .find(&format!("<svg id=\"{id}\""))
        .unwrap_or_else(|| panic!("no chart {id}: {page}"));
    &page[from..from + page[from..].find("</svg>").unwrap()]
}

/// Sum of `data-value` of the `tag` elements of `series`, by bucket.
fn by_bucket(svg: &str, tag: &str, series: &str) -> std::collections::BTreeMap<u32, f64> {
    elements(svg, tag)
        .into_iter()
        .filter(|e| e.get("data-series").map(String::as_str) == Some(series))
        .map(|e| {
            (
                e["data-bucket"].parse().unwrap(),
                e["data-value"].parse().unwrap(),
            )
        })
        .collect()
}

/// The overview's charts after real builds (one rebuilt from the cache, one failed) and a real
/// GC pass: every bar and point is what the read models and the streams say, the table beside
/// each chart has the same numbers, and Chromium renders it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_overview_charts_draw_what_the_builds_and_gc_passes_recorded() {
    let node = common::sandbox::private_node(&["busybox"]);
    let mut fx = Fixture::on_node(node.path()).await;
    let api = common::api::serve(fx.db.pool.clone(), node.path(), Some(TOKEN), &[]).await;
    let spec = json!({"fromImage": "busybox", "force": false, "steps": [
        step("RUN", &["echo one > one.txt"]),
        step("RUN", &["echo two > two.txt"]),
    ]});
    let first = build(&fx, "chart-app", spec.clone()).await;
    let again = build(&fx, "chart-app", spec).await;
    let failed = build(
        &fx,
        "chart-broken",
        json!({"fromImage": "busybox", "force": false, "steps": [step("RUN", &["exit 3"])]}),
    )
    .await;
    // A cached prefix, then a failing step: the waterfall's build.
    let mixed = build(
        &fx,
        "chart-app",
        json!({"fromImage": "busybox", "force": false, "steps": [
            step("RUN", &["echo one > one.txt"]),
            step("RUN", &["echo two > two.txt"]),
            step("RUN", &["sleep 0.3; exit 4"]),
        ]}),
    )
    .await;
    let builds = [first, again, failed, mixed];
    let mut env = strata::reconcilers::ReconcileEnv {
        store: fx.store.clone(),
        node: "chart-gc".into(),
        blobs: fx.blobs.clone(),
        gc: Default::default(),
        catalog: Some(node.path().to_path_buf()),
    };
    // A budget the store is within (so the pass deletes nothing) but not far below: a dry run
    // sizes it, and records nothing.
    let dry = strata::reconcilers::gc::PassOptions {
        dry_run: true,
        ..Default::default()
    };
    let sized = strata::reconcilers::gc::pass(&env, &env.gc, &dry)
        .await
        .unwrap();
    let budget = sized.total_before * 4 / 3;
    env.gc.budget = Some(budget);
    let report = strata::reconcilers::gc::pass(&env, &env.gc, &Default::default())
        .await
        .unwrap();

    let http = no_redirects();
    let page = common::chromium::page(&api.base, "/ui").await;
    let window = strata::projections::activity::Window::ending_at(
        strata::streams::database_now(&fx.db.pool).await.unwrap(),
        chrono::Duration::hours(1),
        60,
    );
    let bucket = |at: chrono::DateTime<chrono::Utc>| {
        ((at - window.from).num_milliseconds() / window.width.num_milliseconds()) as u32
    };
    // What the streams say, bucketed as the page does.
    let mut ready = std::collections::BTreeMap::<u32, f64>::new();
    let mut errors = std::collections::BTreeMap::<u32, f64>::new();
    let mut started = std::collections::BTreeMap::<u32, f64>::new();
    let mut steps = std::collections::BTreeMap::<u32, (f64, f64)>::new();
    let mut waits = std::collections::BTreeMap::<u32, Vec<f64>>::new();
    for b in builds {
        let (queued, acquired, finished): (
            chrono::DateTime<chrono::Utc>,
            chrono::DateTime<chrono::Utc>,
            chrono::DateTime<chrono::Utc>,
        ) = sqlx::query_as(
            "SELECT queued_at, acquired_at, finished_at FROM builds WHERE build_id = $1",
        )
        .bind(b.as_uuid())
        .fetch_one(&fx.db.pool)
        .await
        .unwrap();
        let state = fx.state(b).await;
        let into = if matches!(state.phase, Phase::Ready { .. }) {
            &mut ready
        } else {
            &mut errors
        };
        *into.entry(bucket(finished)).or_default() += 1.0;
        *started.entry(bucket(queued)).or_default() += 1.0;
        let cached = state
            .progress
            .values()
            .filter(|o| matches!(o, strata::domain::build::StepOutcome::Cached { .. }))
            .count() as f64;
        let s = steps.entry(bucket(finished)).or_default();
        s.0 += cached;
        s.1 += state.progress.len() as f64;
        waits
            .entry(bucket(acquired))
            .or_default()
            .push((acquired - queued).num_milliseconds() as f64 / 1000.0);
    }
    assert!(
        steps.values().any(|(cached, _)| *cached > 0.0),
        "the rebuild came from the cache: {steps:?}"
    );

    let chart = svg(&page, "chart-builds");
    assert_eq!(by_bucket(chart, "rect", "ready"), ready, "{chart}");
    assert_eq!(by_bucket(chart, "rect", "failed"), errors, "{chart}");
    assert_eq!(by_bucket(chart, "circle", "started"), started, "{chart}");
    let chart = svg(&page, "chart-cache");
    let expected: std::collections::BTreeMap<u32, f64> = steps
        .iter()
        .filter(|(_, (_, all))| *all > 0.0)
        .map(|(b, (cached, all))| (*b, cached / all))
        .collect();
    let drawn = by_bucket(chart, "rect", "cached");
    assert_eq!(
        drawn.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (b, ratio) in &expected {
        assert!(
            (drawn[b] - ratio).abs() < 1e-9,
            "bucket {b}: {drawn:?} against {expected:?}"
        );
    }
    let chart = svg(&page, "chart-queue-wait");
    let p50 = by_bucket(chart, "circle", "p50");
    assert_eq!(
        p50.keys().collect::<Vec<_>>(),
        waits.keys().collect::<Vec<_>>()
    );
    for (b, w) in &waits {
        let (lo, hi) = w
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), v| (l.min(*v), h.max(*v)));
        assert!(
            lo - 0.001 <= p50[b] && p50[b] <= hi + 0.001,
            "{p50:?} against {waits:?}"
        );
    }
    // The store as the pass measured it, each class a bar in the pass's bucket, the budget a
    // line, the pass a marker.
    let passes: i64 = sqlx::query_scalar("SELECT count(*) FROM gc_passes")
        .fetch_one(&fx.db.pool)
        .await
        .unwrap();
    assert_eq!(passes, 1, "a dry run records no pass");
    let pass_bucket: u32 = {
        let started: chrono::DateTime<chrono::Utc> =
            sqlx::query_scalar("SELECT started_at FROM gc_passes WHERE pass_id = $1")
                .bind(&report.pass)
                .fetch_one(&fx.db.pool)
                .await
                .unwrap();
        bucket(started)
    };
    let chart = svg(&page, "chart-storage");
    for (class, usage) in report.usage.iter().filter(|(_, u)| u.bytes > 0) {
        assert_eq!(
            by_bucket(chart, "rect", class).get(&pass_bucket),
            Some(&(usage.bytes as f64)),
            "{class}: {chart}"
        );
    }
    assert!(report.usage["rooted"].bytes > 0, "{:?}", report.usage);
    let limit = elements(chart, "line")
        .into_iter()
        .find(|l| l.get("class").map(String::as_str) == Some("chart-limit"))
        .expect("the budget line");
    assert_eq!(limit["data-value"], budget.to_string());
    let markers: Vec<_> = elements(chart, "line")
        .into_iter()
        .filter(|l| l.get("class").map(String::as_str) == Some("chart-marker"))
        .collect();
    assert_eq!(markers.len(), 1, "{chart}");
    assert_eq!(markers[0]["data-bucket"], pass_bucket.to_string());
    // Beside each chart, its numbers.
    let table = &page[page.find("<table id=\"chart-builds-numbers\">").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    assert_eq!(
        table.matches("<tr data-bucket=").count(),
        ready
            .keys()
            .chain(errors.keys())
            .chain(started.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        "{table}"
    );
    assert!(page.contains(&format!(
        "{} builds started, {} ready, {} failed",
        builds.len(),
        ready.values().sum::<f64>(),
        errors.values().sum::<f64>()
    )));

    for (over, status) in [("7d", 200), ("24h", 200), ("yesterday", 400)] {
        let resp = http
            .get(format!("{}/ui?over={over}", api.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), status, "{over}");
        if status == 200 {
            let text = resp.text().await.unwrap();
            assert!(text.contains("data-buckets=\"60\""), "{over}");
        }
    }

    let dom = chromium(
        &format!("{}/ui/login?token={TOKEN}&next=/ui", api.base),
        "--dump-dom",
    )
    .await;
    for id in [
        "chart-builds",
        "chart-queue-wait",
        "chart-cache",
        "chart-storage",
    ] {
        assert!(dom.contains(&format!("<svg id=\"{id}\"")), "{id}: {dom}");
    }
    screenshot(&api.base, "/ui", "overview.png").await;

    // The waterfall of the build with a cached prefix and a failed step: one bar per step with
    // the outcome its events recorded, each as wide as its duration within a pixel.
    let page = common::chromium::page(&api.base, &format!("/ui/builds/{mixed}")).await;
    let waterfall = svg(&page, "waterfall");
    let total: f64 = waterfall
        .split("data-seconds=\"")
        .nth(1)
        .and_then(|r| r[..r.find('"').unwrap()].parse().ok())
        .expect("the axis's seconds");
    let steps: Vec<_> = elements(waterfall, "rect")
        .into_iter()
        .filter(|r| r["data-kind"] == "step")
        .collect();
    let outcomes: Vec<(&str, &str)> = steps
        .iter()
        .map(|r| (r["data-name"].as_str(), r["data-outcome"].as_str()))
        .collect();
    assert_eq!(
        outcomes,
        [("1", "cached"), ("2", "cached"), ("3", "failed")],
        "{waterfall}"
    );
    let state = fx.state(mixed).await;
    assert!(matches!(state.phase, Phase::Error { .. }));
    for r in &steps {
        let seconds: f64 = r["data-seconds"].parse().unwrap();
        let width: f64 = r["width"].parse().unwrap();
        let expected = strata::api::ui::waterfall::AXIS_WIDTH * seconds / total;
        assert!(
            (width - expected).abs() <= 1.0 || (expected < 1.0 && width <= 1.0 + 1e-9),
            "step {}: {width} px for {seconds} s of {total} s",
            r["data-name"]
        );
    }
    let failed_bar: f64 = steps[2]["data-seconds"].parse().unwrap();
    assert!(
        failed_bar >= 0.3,
        "the failed step ran its sleep: {failed_bar} s"
    );

    // A cached prefix, a step its node was lost in, and the reconciler that closed the attempt:
    // the step is drawn failed up to the build's end, the reconciler's action a marker.
    let lost = fx
        .start_build(
            "chart-app",
            &[],
            json!({"fromImage": "busybox", "force": false, "steps": [
                step("RUN", &["echo one > one.txt"]),
                step("RUN", &["echo two > two.txt"]),
                step("RUN", &["sleep 60"]),
            ]}),
        )
        .await;
    for _ in 0..600 {
        let logs = fx.logs(lost).await;
        if logs.iter().any(|l| l.2.starts_with("[3/3] RUN sleep 60")) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    fx.stop().await;
    let mut closed = false;
    for _ in 0..200 {
        if strata::reconcilers::attempt_expiry::pass(&env)
            .await
            .unwrap()
            .applied
            == 1
        {
            closed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(closed, "the reconciler never closed the attempt");
    let page = common::chromium::page(&api.base, &format!("/ui/builds/{lost}")).await;
    let waterfall = svg(&page, "waterfall");
    let outcomes: Vec<(String, String)> = elements(waterfall, "rect")
        .into_iter()
        .filter(|r| r["data-kind"] == "step")
        .map(|r| (r["data-name"].clone(), r["data-outcome"].clone()))
        .collect();
    assert_eq!(
        outcomes,
        [("1", "cached"), ("2", "cached"), ("3", "failed")].map(|(a, b)| (a.into(), b.into())),
        "{waterfall}"
    );
    assert!(
        waterfall.contains("<title>AttemptExpired.v1 by reconciler/chart-gc</title>"),
        "the reconciler's action is a marker: {waterfall}"
    );
    screenshot(&api.base, &format!("/ui/builds/{lost}"), "waterfall.png").await;
}

/// `strata bench ui` runs end to end on a small store (in a schema of the test's database) and
/// prints a row per size and span with the charts' time beside its floor's.
#[tokio::test]
async fn bench_ui_prints_the_charts_cost_beside_its_floor() {
    let db = common::test_db().await;
    let out = tokio::process::Command::new(common::strata_bin())
        .args(["bench", "ui", "--builds", "100,300", "--runs", "1"])
        .env("DATABASE_URL", &db.url)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = stdout.lines().filter(|l| l.contains('×')).collect();
    assert_eq!(rows.len(), 6, "{stdout}");
    for (row, (size, over)) in rows.iter().zip([
        ("100", "1h"),
        ("100", "24h"),
        ("100", "7d"),
        ("300", "1h"),
        ("300", "24h"),
        ("300", "7d"),
    ]) {
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!((cols[0], cols[1]), (size, over), "{row}");
    }
    // The bench's schema is gone with it.
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.schemata WHERE schema_name LIKE 'strata_bench_%'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(left, 0);
}
