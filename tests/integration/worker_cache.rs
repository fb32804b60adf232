//! The step cache end to end: builds registered, uploaded and started as the API does, a worker
//! in-process on real sandboxes, and the results booted and compared byte for byte with a cold
//! build. See docs/adr/0008-step-cache.md.

use crate::common;

use std::collections::BTreeMap;

use chrono::Utc;
use common::sandbox::{backend, manifest, node_dir, sh};
use serde_json::json;
use strata::domain::build::{self, Phase, StepOutcome};
use strata::domain::build_spec::Resources;
use strata::domain::cache_entry::{self, EntryKind};
use strata::domain::cache_key::CacheKey;
use strata::domain::ids::{self, BuildId, FilesHash, SnapshotId};
use strata::events::command::load;
use strata::events::{Actor, ActorRole, Metadata, StreamWrite};
use strata::streams::{Build, CacheEntry};
use uuid::Uuid;
// ---------------------------------------------------------------------------------------------
// What the API appends (through common::build_api, as the handlers do)
// ---------------------------------------------------------------------------------------------

use common::build_api::{api_context, stream};
use common::worker_fixture::*;

fn run(cmd: &str) -> serde_json::Value {
    step("RUN", &[cmd])
}

impl Fixture {
    async fn messages(&self, build: BuildId) -> Vec<String> {
        self.logs(build).await.into_iter().map(|l| l.2).collect()
    }

    /// Retires an entry, as repair or GC does.
    async fn retire(&self, key: &CacheKey, state: &cache_entry::State) {
        let scope = ids::Scope::team(&self.api.team);
        strata::events::execute::<CacheEntry>(
            &self.store,
            &stream(ids::stream::cache_key(&scope, &key.0)),
            &cache_entry::Command::Retire {
                expected_generation: state.pointer_generation,
                reason: "test: make the lookup resume from a shallower checkpoint".into(),
                now: Utc::now(),
            },
            &api_context(),
        )
        .await
        .unwrap();
    }
}

/// Step number of every checkpoint entry, from the build that wrote it; and the final key.
fn entry_steps(
    entries: &BTreeMap<CacheKey, cache_entry::State>,
    progress: &BTreeMap<u32, StepOutcome>,
) -> (BTreeMap<u32, CacheKey>, Option<CacheKey>) {
    let by_snapshot: BTreeMap<SnapshotId, u32> = progress
        .iter()
        .filter_map(|(n, o)| match o {
            StepOutcome::Checkpointed { snapshot } => Some((*snapshot, *n)),
            _ => None,
        })
        .collect();
    let mut steps = BTreeMap::new();
    let mut fin = None;
    for (key, state) in entries {
        let (entry, _) = state.live().expect("a live entry");
        match entry.target.kind() {
            EntryKind::FinalResult => fin = Some(*key),
            EntryKind::Checkpoint => {
                steps.insert(by_snapshot[&entry.target.snapshot()], *key);
            }
        }
    }
    (steps, fin)
}

/// What an outside observer sees of a result: the filesystem manifest and the final context.
async fn observe(fx: &Fixture, name: &str) -> (String, strata::domain::build_spec::StepContext) {
    let result = fx.result(name).await;
    let mut sb = boot_on(&result.record.layers).await;
    let m = manifest(&mut sb).await;
    sb.destroy().await.unwrap();
    (m, result.record.context)
}

fn executed_steps(state: &build::State) -> Vec<u32> {
    state
        .progress
        .iter()
        .filter(|(_, o)| !matches!(o, StepOutcome::Cached { .. }))
        .map(|(n, _)| *n)
        .collect()
}

fn has_line(lines: &[String], needle: &str) -> bool {
    lines.iter().any(|l| l.contains(needle))
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// Cold-miss/resume equivalence (RFC §Execution model): every step kind, resumed from every
/// checkpoint, gives the same filesystem (paths, modes, owners, sizes, content hashes, symlink
/// targets) and the same command contexts (each RUN writes its user, workdir, env and hostname
/// into the filesystem) as the cold build.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resuming_from_every_checkpoint_builds_exactly_what_a_cold_build_builds() {
    let mut fx = Fixture::new(settings()).await;
    let app = files_hash("app");
    let single = files_hash("single");
    let files = [
        (&app, gzip(&app_tar())),
        (&single, single_file_tar("single.txt", b"single\n")),
    ];
    let recipe = json!({
        "fromImage": "busybox",
        "force": false,
        "steps": [
            step("ENV", &["A", "/opt/app", "B", "$A/bin"]),
            step("WORKDIR", &["/opt/app"]),
            copy("app", "./app", "", "", &app),
            copy("single.txt", "/etc/single.txt", "root", "0600", &single),
            step("USER", &["builder"]),
            step("RUN", &["(id -un; pwd; env | sort; hostname) > ctx1.txt", "root"]),
            run("(id -un; pwd; env | sort; hostname) > /tmp/ctx2.txt; mkdir -p ~/data && ln -s /opt/app/app/config.txt ~/data/cfg && chmod 0750 ~/data"),
            step("ENV", &["C", "$B:late"]),
            step("WORKDIR", &["sub"]),
            step("USER", &["late"]),
        ],
    });
    let (cold, state) = fx.build("equiv", &files, recipe.clone()).await;
    assert_ready(&state);
    assert!(executed_steps(&state).len() == 10, "{:?}", state.progress);
    let cold_lines = fx.messages(cold).await;
    assert!(has_line(&cold_lines, "[cache] final result: cache miss"));
    let (cold_fs, cold_ctx) = observe(&fx, "equiv").await;
    assert!(
        cold_fs.contains("/opt/app/ctx1.txt|file|644|0:0|"),
        "{cold_fs}"
    );
    assert!(
        cold_fs.contains("/home/builder/data/cfg|link|"),
        "{cold_fs}"
    );
    assert_eq!(cold_ctx.user, "late");
    assert_eq!(cold_ctx.env["C"], "/opt/app/bin:late");

    // Build identity inside the sandbox is neutral: no build or template id in what steps saw.
    let result = fx.result("equiv").await;
    let mut sb = boot_on(&result.record.layers).await;
    let seen = sh(&mut sb, "cat /opt/app/ctx1.txt /tmp/ctx2.txt").await;
    sb.destroy().await.unwrap();
    assert!(seen.starts_with("root\n/opt/app\n"), "{seen}");
    assert!(seen.contains("\nsandbox\n"), "{seen}");
    for id in [cold.to_string(), result.template.to_string()] {
        assert!(!seen.contains(&id), "{id} leaked into the sandbox: {seen}");
    }

    let entries = fx
        .entries_when(|e| entry_steps(e, &state.progress).1.is_some())
        .await;
    let (keys, final_key) = entry_steps(&entries, &state.progress);
    assert_eq!(
        keys.keys().copied().collect::<Vec<_>>(),
        [2, 3, 4, 6, 7, 9],
        "a checkpoint entry per mutating step"
    );
    let final_key = final_key.expect("a final entry");
    for (&k, _) in keys.iter().rev() {
        // Leave checkpoint k the deepest valid entry.
        let entries = fx.entries().await;
        fx.retire(&final_key, &entries[&final_key]).await;
        for (&deeper, key) in keys.range(k + 1..) {
            let _ = deeper;
            fx.retire(key, &entries[key]).await;
        }
        let (resumed, state) = fx.build("equiv", &files, recipe.clone()).await;
        assert_ready(&state);
        let lines = fx.messages(resumed).await;
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("[cache] step {k}/10 "))
                    && l.ends_with(": cache hit")),
            "resuming from {k}: {lines:#?}"
        );
        let expected: Vec<u32> = (k + 1..=10).collect();
        assert_eq!(executed_steps(&state), expected, "resumed from {k}");
        let (fs, ctx) = observe(&fx, "equiv").await;
        assert_eq!(ctx, cold_ctx, "context after resuming from {k}");
        if fs != cold_fs {
            let a: Vec<&str> = cold_fs.lines().collect();
            let b: Vec<&str> = fs.lines().collect();
            let only_cold: Vec<_> = a.iter().filter(|l| !b.contains(l)).collect();
            let only_resumed: Vec<_> = b.iter().filter(|l| !a.contains(l)).collect();
            panic!("resuming from {k} differs: cold only {only_cold:#?}, resumed only {only_resumed:#?}");
        }
    }
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rebuilds_reuse_exactly_the_unchanged_prefix_and_force_reruns_everything() {
    let mut fx = Fixture::new(settings()).await;
    let v1 = files_hash("v1");
    let v2 = files_hash("v2");
    let nonce = Uuid::new_v4();
    let recipe = |hash: &FilesHash, last: &str, force: bool| {
        json!({
            "fromImage": "busybox",
            "force": force,
            "steps": [
                run(&format!("echo {nonce} > /tmp/first")),
                copy("a.txt", "/tmp/", "", "", hash),
                run("cat /tmp/a.txt > /tmp/out"),
                run(last),
            ],
        })
    };
    let f1 = [(&v1, single_file_tar("a.txt", b"one\n"))];
    let (b1, s1) = fx
        .build("prefix", &f1, recipe(&v1, "echo last1 > /tmp/last", false))
        .await;
    assert_ready(&s1);
    assert_eq!(executed_steps(&s1), [1, 2, 3, 4]);
    let first = fx.result("prefix").await;

    // Unchanged: the final entry hits; no step runs, the result is the same stack.
    let (b2, s2) = fx
        .build("prefix", &f1, recipe(&v1, "echo last1 > /tmp/last", false))
        .await;
    assert_ready(&s2);
    assert_eq!(executed_steps(&s2), Vec::<u32>::new(), "{:?}", s2.progress);
    let lines = fx.messages(b2).await;
    assert!(
        has_line(&lines, "[cache] final result: cache hit"),
        "{lines:#?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("[4/4] RUN") || l.starts_with("[1/4] RUN")),
        "{lines:#?}"
    );
    assert!(
        has_line(&lines, "[4/4] CACHED RUN echo last1"),
        "{lines:#?}"
    );
    let second = fx.result("prefix").await;
    assert_eq!(second.build, b2);
    assert_eq!(second.record.layers, first.record.layers);
    assert_ne!(b1, b2);

    // The last RUN changed: only it runs.
    let (b3, s3) = fx
        .build("prefix", &f1, recipe(&v1, "echo last2 > /tmp/last", false))
        .await;
    assert_ready(&s3);
    assert_eq!(executed_steps(&s3), [4]);
    let lines = fx.messages(b3).await;
    assert!(
        has_line(&lines, "[cache] final result: cache miss"),
        "{lines:#?}"
    );
    assert!(
        has_line(
            &lines,
            "[cache] step 4/4 RUN echo last2 > /tmp/last: cache miss"
        ),
        "{lines:#?}"
    );
    assert!(
        has_line(
            &lines,
            "[cache] step 3/4 RUN cat /tmp/a.txt > /tmp/out: cache hit"
        ),
        "{lines:#?}"
    );
    let mut sb = boot_on(&fx.result("prefix").await.record.layers).await;
    assert_eq!(sh(&mut sb, "cat /tmp/out /tmp/last").await, "one\nlast2\n");
    sb.destroy().await.unwrap();

    // One file changed: from that COPY on.
    let f2 = [(&v2, single_file_tar("a.txt", b"two\n"))];
    let (_, s4) = fx
        .build("prefix", &f2, recipe(&v2, "echo last2 > /tmp/last", false))
        .await;
    assert_ready(&s4);
    assert_eq!(executed_steps(&s4), [2, 3, 4]);
    let mut sb = boot_on(&fx.result("prefix").await.record.layers).await;
    assert_eq!(
        sh(&mut sb, "cat /tmp/first /tmp/out").await,
        format!("{nonce}\ntwo\n")
    );
    sb.destroy().await.unwrap();

    // skip_cache (build-level force): every step runs, nothing is read.
    let (b5, s5) = fx
        .build("prefix", &f1, recipe(&v1, "echo last1 > /tmp/last", true))
        .await;
    assert_ready(&s5);
    assert_eq!(executed_steps(&s5), [1, 2, 3, 4]);
    let lines = fx.messages(b5).await;
    assert!(has_line(&lines, "[cache] force from step 1"), "{lines:#?}");
    assert!(!has_line(&lines, "cache hit"), "{lines:#?}");
    // ... and its results replaced the entries (generation 2), so the next build hits them.
    let (b6, s6) = fx
        .build("prefix", &f1, recipe(&v1, "echo last1 > /tmp/last", false))
        .await;
    assert_ready(&s6);
    assert_eq!(executed_steps(&s6), Vec::<u32>::new());
    let hit = fx.result("prefix").await;
    let forced = load::<Build>(&fx.store, &stream(ids::stream::build(&b5)))
        .await
        .unwrap()
        .state;
    assert_eq!(hit.build, b6);
    let forced_layers = match forced.progress[&4] {
        StepOutcome::Checkpointed { snapshot } => {
            strata::events::command::load::<strata::streams::Snapshot>(
                &fx.store,
                &stream(ids::stream::snapshot(&snapshot)),
            )
            .await
            .unwrap()
            .state
            .record
            .unwrap()
            .layers
        }
        ref o => panic!("{o:?}"),
    };
    assert_eq!(
        hit.record.layers, forced_layers,
        "the forced result replaced the entry"
    );
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_checkpoint_whose_layer_was_deleted_is_unapplied_a_miss_and_repaired() {
    let mut fx = Fixture::new(settings()).await;
    let nonce = Uuid::new_v4();
    let recipe = json!({
        "fromImage": "busybox",
        "force": false,
        "steps": [
            run(&format!("echo {nonce} > /tmp/1")),
            run(&format!("echo {nonce} > /tmp/2")),
            run(&format!("echo {nonce} > /tmp/3")),
        ],
    });
    let (_, s1) = fx.build("deleted", &[], recipe.clone()).await;
    assert_ready(&s1);
    let StepOutcome::Checkpointed { snapshot } = s1.progress[&3] else {
        panic!("{:?}", s1.progress)
    };
    let record =
        load::<strata::streams::Snapshot>(&fx.store, &stream(ids::stream::snapshot(&snapshot)))
            .await
            .unwrap()
            .state
            .record
            .unwrap();
    let top = record.layers.last().unwrap();
    let path = node_dir().join("blobs/sha256").join(top.hex());
    std::fs::remove_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let before = fx.entries().await;

    let (b2, s2) = fx.build("deleted", &[], recipe.clone()).await;
    assert_ready(&s2);
    assert_eq!(
        executed_steps(&s2),
        [3],
        "resumed from step 2, re-ran step 3"
    );
    let lines = fx.messages(b2).await;
    assert!(
        has_line(&lines, "[cache] final result: cache unapplied"),
        "{lines:#?}"
    );
    assert!(has_line(&lines, "[cache] step 3/3 "), "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("[cache] step 3/3 ") && l.contains("cache unapplied")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("[cache] step 2/3 ") && l.ends_with("cache hit")),
        "{lines:#?}"
    );
    // Repaired: step 3 and the final entry moved to a new generation with the new snapshot.
    let mut progress = s1.progress.clone();
    progress.extend(
        s2.progress
            .iter()
            .filter(|(_, o)| matches!(o, StepOutcome::Checkpointed { .. }))
            .map(|(n, o)| (*n, o.clone())),
    );
    let after = fx
        .entries_when(|e| {
            entry_steps(e, &progress)
                .1
                .is_some_and(|fin| e[&fin].pointer_generation == 2)
        })
        .await;
    let (keys, fin) = entry_steps(&after, &progress);
    assert_eq!(
        after[&keys[&3]].pointer_generation,
        before[&keys[&3]].pointer_generation + 1
    );
    let fin = fin.unwrap();
    assert_eq!(after[&fin].pointer_generation, 2);
    let (b3, s3) = fx.build("deleted", &[], recipe).await;
    assert_ready(&s3);
    assert_eq!(executed_steps(&s3), Vec::<u32>::new());
    assert!(has_line(
        &fx.messages(b3).await,
        "[cache] final result: cache hit"
    ));
    fx.stop().await;
}

/// After a host crash a checkpoint's blob can be torn under its digest name, with its extracted
/// tree lost. A probe that only checked presence took it as a hit, and every identical build
/// then failed at `base`. It must be unapplied (repaired), the build resumes below it and
/// succeeds, and the torn blob no longer stands under its digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_torn_checkpoint_blob_is_unapplied_and_the_build_succeeds() {
    let mut fx = Fixture::new(settings()).await;
    let nonce = Uuid::new_v4();
    let steps = vec![
        run(&format!("echo {nonce} > /tmp/1")),
        run(&format!("echo {nonce} > /tmp/2")),
        run(&format!("echo {nonce} > /tmp/3")),
    ];
    let (_, s1) = fx
        .build(
            "torn",
            &[],
            json!({"fromImage": "busybox", "force": false, "steps": steps.clone()}),
        )
        .await;
    assert_ready(&s1);
    let StepOutcome::Checkpointed { snapshot } = s1.progress[&3] else {
        panic!("{:?}", s1.progress)
    };
    let record =
        load::<strata::streams::Snapshot>(&fx.store, &stream(ids::stream::snapshot(&snapshot)))
            .await
            .unwrap()
            .state
            .record
            .unwrap();
    let top = record.layers.last().unwrap();
    // Torn in place, same size; the extracted tree is gone with it.
    let blob = node_dir().join("blobs/sha256").join(top.hex());
    let mut bytes = std::fs::read(&blob).unwrap();
    let at = bytes.len() - 2048;
    bytes[at] ^= 0x10;
    std::fs::write(&blob, &bytes).unwrap();
    let tree = node_dir().join("layers").join(top.hex());
    std::fs::remove_dir_all(&tree).unwrap();
    let _ = std::fs::remove_file(node_dir().join(format!("layers/{}.complete", top.hex())));

    // The same steps and one more: the lookup goes through the checkpoints.
    let mut longer = steps;
    longer.push(run(&format!("cat /tmp/1 /tmp/2 /tmp/3 > /tmp/all-{nonce}")));
    let (b2, s2) = fx
        .build(
            "torn",
            &[],
            json!({"fromImage": "busybox", "force": false, "steps": longer}),
        )
        .await;
    let lines = fx.messages(b2).await;
    assert_ready(&s2);
    assert_eq!(
        executed_steps(&s2),
        [3, 4],
        "resumed from step 2: {lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("[cache] step 3/4 ") && l.contains("cache unapplied")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("[cache] step 2/4 ") && l.ends_with("cache hit")),
        "{lines:#?}"
    );
    let blob_now = std::fs::read(&blob).ok();
    assert!(
        blob_now.is_none_or(|b| ids::Digest::of(&b) == *top),
        "the torn blob still stands under its digest"
    );
    let mut sb = boot_on(&fx.result("torn").await.record.layers).await;
    assert_eq!(
        sh(&mut sb, &format!("cat /tmp/all-{nonce}")).await,
        format!("{nonce}\n{nonce}\n{nonce}\n")
    );
    sb.destroy().await.unwrap();
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forced_early_step_breaks_the_lineage_of_stale_later_entries() {
    let mut fx = Fixture::new(settings()).await;
    let nonce = Uuid::new_v4();
    let steps = |force_first: bool, all: bool| {
        let mut s = vec![
            json!({"type": "RUN", "args": [format!("echo {nonce} > /tmp/a")], "force": force_first}),
        ];
        if all {
            s.push(run("echo b > /tmp/b"));
            s.push(run("echo c > /tmp/c"));
        }
        json!({"fromImage": "busybox", "force": false, "steps": s})
    };
    let (_, s1) = fx.build("lineage", &[], steps(false, true)).await;
    assert_ready(&s1);
    // Forcing step 1 alone replaces its entry by CAS.
    let (b2, s2) = fx.build("lineage", &[], steps(true, false)).await;
    assert_ready(&s2);
    assert_eq!(executed_steps(&s2), [1]);
    assert!(has_line(
        &fx.messages(b2).await,
        "[cache] force from step 1"
    ));
    // The old steps 2 and 3 and the final result were built on the replaced entry: misses.
    let (b3, s3) = fx.build("lineage", &[], steps(false, true)).await;
    assert_ready(&s3);
    assert_eq!(executed_steps(&s3), [2, 3], "{:?}", s3.progress);
    let lines = fx.messages(b3).await;
    for probe in [
        "[cache] final result: cache miss (invalid entry: ",
        "[cache] step 3/3 ",
        "[cache] step 2/3 ",
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(probe) && l.contains("lineage broken")),
            "{probe}: {lines:#?}"
        );
    }
    assert!(lines
        .iter()
        .any(|l| l.starts_with("[cache] step 1/3 ") && l.ends_with("cache hit")));
    // The rebuild repaired them.
    let (b4, s4) = fx.build("lineage", &[], steps(false, true)).await;
    assert_ready(&s4);
    assert_eq!(executed_steps(&s4), Vec::<u32>::new());
    assert!(has_line(
        &fx.messages(b4).await,
        "[cache] final result: cache hit"
    ));
    fx.stop().await;
}

/// Found in review: the read that follows a checkpoint entry's publication fails (a connection
/// dropped between the append and the reload: produced with the store's fault hook
/// `fail_next_read_after`, since nothing outside can place a drop exactly there). Before, the
/// writer shrugged it off (`.ok()?`) and went on without advancing its parent, so step 2's entry
/// named the base as its parent instead of step 1, and the lookup accepted that. A later forced
/// step 1 then replaced step 1's entry without breaking step 2's or the final result's lineage,
/// and an unforced build was served the final result made on the old step 1. Now the writer stops
/// at the failed read, and an entry must name the nearest checkpoint below it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_read_after_a_cache_write_cannot_keep_a_stale_result_servable_after_force() {
    let mut fx = Fixture::new(settings()).await;
    let nonce = Uuid::new_v4();
    let recipe = |force_first: bool, second: &str| {
        json!({"fromImage": "busybox", "force": false, "steps": [
            {"type": "RUN", "args": [format!("echo {nonce} $(cat /proc/sys/kernel/random/uuid) > /tmp/a")], "force": force_first},
            run(second),
        ]})
    };
    fx.store.fail_next_read_after("CacheEntryPublished.v1");
    let (_, s1) = fx
        .build("stale-after-force", &[], recipe(false, "cp /tmp/a /tmp/b"))
        .await;
    assert_ready(&s1);
    assert_eq!(executed_steps(&s1), [1, 2]);
    assert_eq!(fx.store.failed_reads_pending(), 0, "the armed read failed");

    // Step 1 forced (with another step 2): its entry is replaced by compare-and-set.
    let (_, s2) = fx
        .build(
            "stale-after-force",
            &[],
            recipe(true, "echo other > /tmp/c"),
        )
        .await;
    assert_ready(&s2);
    assert_eq!(executed_steps(&s2), [1, 2]);
    let forced = fx.result("stale-after-force").await;
    let mut sb = boot_on(&forced.record.layers).await;
    let forced_a = sh(&mut sb, "cat /tmp/a").await;
    sb.destroy().await.unwrap();

    // The first recipe again: step 1 resumes from the forced entry and step 2 runs on it; the
    // first build's step 2 and final result were made on the replaced step 1.
    let (b3, s3) = fx
        .build("stale-after-force", &[], recipe(false, "cp /tmp/a /tmp/b"))
        .await;
    assert_ready(&s3);
    assert_eq!(executed_steps(&s3), [2], "{:#?}", fx.messages(b3).await);
    let result = fx.result("stale-after-force").await;
    let mut sb = boot_on(&result.record.layers).await;
    assert_eq!(
        sh(&mut sb, "cat /tmp/a /tmp/b").await,
        format!("{forced_a}{forced_a}"),
        "the result is built on the forced step 1, and its step 2 copied that one"
    );
    sb.destroy().await.unwrap();
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_identical_builds_at_once_execute_each_step_once() {
    let mut s = settings();
    s.max_builds = 16;
    let mut fx = Fixture::new(s).await;
    let nonce = Uuid::new_v4();
    let recipe = json!({
        "fromImage": "busybox",
        "force": false,
        "steps": [run(&format!("echo {nonce} > /tmp/a; sleep 1")), run("echo b > /tmp/b")],
    });
    let mut builds = Vec::new();
    for i in 0..16 {
        let (_, b) = fx.api.register(&format!("flight{i}")).await;
        builds.push(b);
    }
    for b in &builds {
        fx.api.start(*b, recipe.clone()).await;
    }
    let mut executed = 0;
    let mut results = Vec::new();
    for (i, b) in builds.iter().enumerate() {
        let state = fx.wait_terminal(*b).await;
        assert_ready(&state);
        if !executed_steps(&state).is_empty() {
            assert_eq!(executed_steps(&state), [1, 2]);
            executed += 1;
        }
        results.push(fx.result(&format!("flight{i}")).await);
    }
    assert_eq!(
        executed, 1,
        "one leader executes, fifteen builds reuse its result"
    );
    assert!(results
        .iter()
        .all(|r| r.record.layers == results[0].record.layers));
    assert_eq!(
        results
            .iter()
            .map(|r| r.build)
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        16,
        "each build promotes its own result"
    );
    fx.stop().await;
}

/// Two builds that share a first step and then differ (the stages of one Dockerfile) both run
/// that step at once; one loses the race for its entry. A step that writes the same bytes on the
/// same parent seals the same layer, so the loser builds its later entries on the winner's:
/// rebuilt unchanged, each comes from the cache with the stack it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_build_that_loses_a_shared_step_s_race_with_the_same_layers_still_caches_its_later_steps()
{
    let mut s = settings();
    s.max_builds = 2;
    let mut fx = Fixture::new(s).await;
    let nonce = Uuid::new_v4();
    // The shared step is slow so that both builds run it; it writes only what it was asked to
    // (a fixed mtime), so both seal the same layer.
    let shared = step(
        "RUN",
        &[
            &format!(
                "sleep 1; mkdir -p /shared && echo {nonce} > /shared/n && touch -d @0 /shared/n /shared /"
            ),
            "root",
        ],
    );
    let recipe = |own: &str| {
        json!({"fromImage": "busybox", "force": false,
               "steps": [shared.clone(), step("RUN", &[&format!("echo {own} > /{own}; date +%N > /{own}.t"), "root"])]})
    };
    let (names, mut builds) = (["race-a", "race-b"], Vec::new());
    for name in names {
        builds.push(fx.api.register(name).await.1);
    }
    for (b, name) in builds.iter().zip(names) {
        fx.api.start(*b, recipe(name)).await;
    }
    let mut lost = 0;
    let mut first = Vec::new();
    for (b, name) in builds.iter().zip(names) {
        assert_ready(&fx.wait_terminal(*b).await);
        assert_eq!(
            executed_steps(&fx.state(*b).await),
            [1, 2],
            "{name} ran both steps"
        );
        let logs = fx.logs(*b).await;
        lost += logs
            .iter()
            .filter(|(_, _, m, _)| m.contains("published this step first with the same layers"))
            .count();
        assert!(
            !logs.iter().any(|(_, _, m, _)| m.contains("not publishing")),
            "{name} kept publishing: {logs:?}"
        );
        first.push(fx.result(name).await.record.layers);
    }
    assert_eq!(lost, 1, "exactly one build lost the shared step's race");
    for ((name, layers), _) in names.iter().zip(&first).zip(&builds) {
        let (_, again) = fx.build(name, &[], recipe(name)).await;
        assert_ready(&again);
        assert!(
            executed_steps(&again).is_empty(),
            "{name} rebuilt from the cache"
        );
        assert_eq!(
            &fx.result(name).await.record.layers,
            layers,
            "{name}'s stack is unchanged"
        );
    }
    fx.stop().await;
}

/// A read of the index that fails is not a verdict on any entry: the build bypasses the cache,
/// runs every step, and writes nothing to it. The fault: an event this node cannot decode on the
/// final key's stream (what a newer strata could have written during a rolling upgrade), appended
/// through the event store because there is no other way to make one read fail alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_index_read_failure_bypasses_the_cache_and_writes_nothing() {
    let mut fx = Fixture::new(settings()).await;
    let nonce = Uuid::new_v4();
    let recipe = json!({
        "fromImage": "busybox",
        "force": false,
        "steps": [run(&format!("echo {nonce} > /tmp/a")), run("echo b > /tmp/b")],
    });
    let (_, s1) = fx.build("transient", &[], recipe.clone()).await;
    assert_ready(&s1);
    let entries = fx
        .entries_when(|e| entry_steps(e, &s1.progress).1.is_some())
        .await;
    let (_, final_key) = entry_steps(&entries, &s1.progress);
    let scope = ids::Scope::team(&fx.api.team);
    let fstream = stream(ids::stream::cache_key(&scope, &final_key.unwrap().0));
    let head = load::<CacheEntry>(&fx.store, &fstream)
        .await
        .unwrap()
        .version;
    fx.store
        .append(vec![StreamWrite::new(
            fstream.clone(),
            strata::events::ExpectedVersion::Exact(head),
            vec![strata::events::NewEvent {
                event_id: Uuid::new_v4(),
                event_type: "CacheEntryFromTheFuture.v9".into(),
                data: json!({}),
                metadata: Metadata::new(Actor::new(ActorRole::Api, "test")),
            }],
        )])
        .await
        .unwrap();
    let versions = || async {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT stream_id, version FROM streams WHERE stream_id LIKE 'cachekey-%' ORDER BY 1",
        )
        .fetch_all(&fx.db.pool)
        .await
        .unwrap();
        rows
    };
    let before = versions().await;

    let (b2, s2) = fx.build("transient", &[], recipe).await;
    assert_ready(&s2);
    assert_eq!(
        executed_steps(&s2),
        [1, 2],
        "no cache read: everything runs"
    );
    let lines = fx.messages(b2).await;
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("[cache] reading the cache index failed")
                && l.contains("building without the cache")),
        "{lines:#?}"
    );
    assert!(
        !has_line(&lines, "cache hit") && !has_line(&lines, "cache miss"),
        "{lines:#?}"
    );
    assert_eq!(versions().await, before, "nothing was written to the index");
    fx.stop().await;
}

/// The per-build checkpoint budget (RFC §Depth budget), with the overlay limit lowered so a
/// small recipe reaches it: past the budget, steps run without checkpoints and the build still
/// completes with every change; a base that cannot take the mandatory captures fails at `base`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_the_depth_budget_steps_run_without_checkpoints_and_the_build_completes() {
    let base_depth = common::sandbox::busybox(&backend()).await.len();
    let mut s = settings();
    // The base, the final seal, and room for two checkpoints.
    s.depth.overlay_max = base_depth + 1 + 2;
    let mut fx = Fixture::new(s).await;
    let nonce = Uuid::new_v4();
    let recipe = |last: &str| {
        json!({
            "fromImage": "busybox",
            "force": false,
            "steps": [
                run(&format!("echo {nonce} > /tmp/1")),
                run("echo 2 > /tmp/2"),
                run("echo 3 > /tmp/3"),
                run(last),
            ],
        })
    };
    let (b1, s1) = fx.build("depth", &[], recipe("echo 4 > /tmp/4")).await;
    assert_ready(&s1);
    let checkpointed: Vec<u32> = s1
        .progress
        .iter()
        .filter(|(_, o)| matches!(o, StepOutcome::Checkpointed { .. }))
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(checkpointed, [1, 2], "{:?}", s1.progress);
    assert_eq!(s1.progress[&3], StepOutcome::Executed);
    assert_eq!(s1.progress[&4], StepOutcome::Executed);
    assert!(has_line(&fx.messages(b1).await, "[depth] the stack has"));
    let result = fx.result("depth").await;
    assert_eq!(
        result.record.layers.len(),
        base_depth + 3,
        "two checkpoints and the final seal"
    );
    let mut sb = boot_on(&result.record.layers).await;
    assert_eq!(
        sh(&mut sb, "cat /tmp/1 /tmp/2 /tmp/3 /tmp/4").await,
        format!("{nonce}\n2\n3\n4\n")
    );
    sb.destroy().await.unwrap();

    // The next build resumes from the deepest checkpoint there is (step 2).
    let (b2, s2) = fx.build("depth", &[], recipe("echo four > /tmp/4")).await;
    assert_ready(&s2);
    assert_eq!(executed_steps(&s2), [3, 4]);
    assert!(fx
        .messages(b2)
        .await
        .iter()
        .any(|l| l.starts_with("[cache] step 2/4 ") && l.ends_with("cache hit")));
    fx.stop().await;

    // No room for the mandatory capture: the build fails at base and says what to do.
    let mut s = settings();
    s.depth.overlay_max = base_depth;
    let mut fx = Fixture::new(s).await;
    let (_, state) = fx.build("too-deep", &[], recipe("echo 4 > /tmp/4")).await;
    match &state.phase {
        Phase::Error { reason, .. } => {
            assert_eq!(reason.step, Some(build::FailedStep::Base));
            assert!(
                reason.message.contains("compact the base"),
                "{}",
                reason.message
            );
        }
        other => panic!("expected an error at base, got {other:?}"),
    }
    fx.stop().await;
}

/// `fromTemplate` keys follow the parent's content: an unchanged rebuild of the parent (a new
/// result snapshot over the same layers) keeps the derived template's entries; a changed parent
/// makes the derived build run all its steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn derived_templates_reuse_their_cache_across_unchanged_parent_rebuilds() {
    let mut fx = Fixture::new(settings()).await;
    let nonce = Uuid::new_v4();
    let parent = |v: &str| {
        json!({"fromImage": "busybox", "force": false,
               "steps": [run(&format!("echo {nonce}-{v} > /tmp/parent"))]})
    };
    let derived = json!({"fromTemplate": "parent", "force": false,
                         "steps": [run("cat /tmp/parent > /tmp/derived")]});
    assert_ready(&fx.build("parent", &[], parent("v1")).await.1);
    let (_, d1) = fx.build("derived", &[], derived.clone()).await;
    assert_ready(&d1);
    assert_eq!(executed_steps(&d1), [1]);

    let (p2, s) = fx.build("parent", &[], parent("v1")).await;
    assert_ready(&s);
    assert_eq!(executed_steps(&s), Vec::<u32>::new());
    assert_eq!(fx.result("parent").await.build, p2, "a new result snapshot");
    let (d2, s) = fx.build("derived", &[], derived.clone()).await;
    assert_ready(&s);
    assert_eq!(executed_steps(&s), Vec::<u32>::new());
    assert!(has_line(
        &fx.messages(d2).await,
        "[cache] final result: cache hit"
    ));

    assert_ready(&fx.build("parent", &[], parent("v2")).await.1);
    let (_, s) = fx.build("derived", &[], derived).await;
    assert_ready(&s);
    assert_eq!(executed_steps(&s), [1]);
    let mut sb = boot_on(&fx.result("derived").await.record.layers).await;
    assert_eq!(
        sh(&mut sb, "cat /tmp/derived").await,
        format!("{nonce}-v2\n")
    );
    sb.destroy().await.unwrap();
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_build_naming_the_default_resources_shares_the_cache_of_one_naming_none() {
    let mut fx = Fixture::new(settings()).await;
    let nonce = Uuid::new_v4();
    let spec = json!({
        "fromImage": "busybox",
        "force": false,
        "steps": [run(&format!("echo {nonce} > /tmp/n"))],
    });
    let deadline = chrono::Utc::now() + chrono::Duration::hours(1);
    let run_with = |resources: Resources| {
        let (api, spec) = (&fx.api, spec.clone());
        async move {
            let (_, build) = api.register_with("resources", deadline, resources).await;
            api.start(build, spec).await;
            build
        }
    };
    let none = run_with(Resources::default()).await;
    assert_ready(&fx.wait_terminal(none).await);

    // The SDK's defaults spelled out: the sandbox runs alike, so the final entry hits.
    let defaults = Resources {
        cpu_count: Some(Resources::DEFAULT_CPU_COUNT),
        memory_mb: Some(Resources::DEFAULT_MEMORY_MB),
        min_free_disk_mb: None,
    };
    let named = run_with(defaults).await;
    let state = fx.wait_terminal(named).await;
    assert_ready(&state);
    assert_eq!(executed_steps(&state), Vec::<u32>::new());
    assert!(has_line(
        &fx.messages(named).await,
        "[cache] final result: cache hit"
    ));

    // Another CPU count is another launch configuration: a miss, the step runs.
    let four = run_with(Resources {
        cpu_count: Some(4),
        ..defaults
    })
    .await;
    let state = fx.wait_terminal(four).await;
    assert_ready(&state);
    assert_eq!(executed_steps(&state), [1]);
    fx.stop().await;
}
