use super::*;
use crate::domain::build::{Binding, BuildResult, Phase, Registration};
use crate::domain::build_spec::{Resources, StepContext, Tag};
use crate::domain::cache_entry::{Entry, ParentEdge, CACHE_FORMAT_VERSION};
use crate::domain::cache_key::HASHING_VERSION;
use crate::domain::ids::{Epoch, Generation, TeamId};
use crate::domain::snapshot::Purpose;
use chrono::{Duration, TimeZone};
use uuid::Uuid;

fn t(h: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap() + Duration::hours(h)
}
fn d(n: u8) -> Digest {
    Digest::of(&[n])
}
fn snap(n: u128) -> SnapshotId {
    SnapshotId::from_uuid(Uuid::from_u128(n))
}
fn bid(n: u128) -> BuildId {
    BuildId::from_uuid(Uuid::from_u128(1000 + n))
}
fn tpl(name: &str) -> TemplateId {
    TemplateId::parse(name).unwrap()
}
fn team() -> TeamId {
    TeamId::parse("acme").unwrap()
}

struct World {
    inv: Inventory,
}

impl World {
    fn new() -> World {
        World {
            inv: Inventory::default(),
        }
    }
    fn snapshot(&mut self, id: u128, build: u128, layers: &[u8]) {
        self.inv.snapshots.insert(
            snap(id),
            SnapshotRecord {
                purpose: Purpose::Template,
                layers: layers.iter().map(|n| d(*n)).collect(),
                base_image_digest: None,
                context: StepContext::after_default_user(),
                start_cmd: None,
                ready_cmd: None,
                build: bid(build),
                epoch: Epoch::FIRST,
            },
        );
    }
    fn build(&mut self, n: u128, template: &str, phase: Phase, result: Option<u128>) {
        let state = build::State {
            registration: Some(Registration {
                template: tpl(template),
                team: team(),
                tags: vec![],
                resources: Resources::default(),
                registered_at: t(n as i64),
            }),
            phase,
            result: result.map(|s| BuildResult {
                candidate: snap(s),
                build_base_checkpoint: None,
            }),
            ..Default::default()
        };
        self.inv.builds.insert(bid(n), state);
    }
    fn template(&mut self, name: &str, tags: &[(&str, u128)], deleted: bool) {
        let state = template::State {
            team: Some(team()),
            tags: tags
                .iter()
                .map(|(tag, b)| (Tag::parse(tag).unwrap(), bid(*b)))
                .collect(),
            deleted,
            ..Default::default()
        };
        self.inv.templates.insert(tpl(name), state);
    }
    fn final_entry(&mut self, key: u8, snapshot: u128, build: u128) {
        let entry = Entry {
            target: Target::FinalResult {
                candidate: snap(snapshot),
                build_base_checkpoint: None,
            },
            parent: ParentEdge::Root {
                base_key: CacheKey(d(200)),
            },
            hashing_version: HASHING_VERSION,
            cache_format_version: CACHE_FORMAT_VERSION,
            build: bid(build),
            epoch: Epoch::FIRST,
        };
        self.inv.cache_keys.push(CacheKeyState {
            scope: Scope::team(&team()),
            key: CacheKey(d(100 + key)),
            state: cache_entry::State {
                entry: Some(entry),
                pointer_generation: 1,
                retired: false,
            },
        });
    }
    fn classify(&self, stored: &[u8]) -> BTreeMap<u8, Classified> {
        let stored: Vec<Stored> = stored
            .iter()
            .map(|n| Stored {
                digest: d(*n),
                size: 10,
                written_at: t(0),
            })
            .collect();
        let out = classify(
            &self.inv,
            &stored,
            Keep {
                finals_per_template: 1,
            },
            t(100),
        );
        out.into_iter()
            .map(|c| {
                let n = (0..=255u8).find(|n| d(*n) == c.stored.digest).unwrap();
                (n, c)
            })
            .collect()
    }
}

fn ready() -> Phase {
    Phase::Ready {
        epoch: Epoch::FIRST,
    }
}

#[test]
fn a_tagged_result_and_every_layer_below_it_are_rooted_and_a_superseded_one_is_not() {
    let mut w = World::new();
    // Layer 1 is the shared base; 2 is the old build's own layer, 3 the new one's.
    w.snapshot(10, 1, &[1, 2]);
    w.snapshot(11, 2, &[1, 3]);
    w.build(1, "web", ready(), Some(10));
    w.build(2, "web", ready(), Some(11));
    w.template("web", &[("default", 2)], false);
    let c = w.classify(&[1, 2, 3, 4]);
    assert!(matches!(
        &c[&1].standing,
        Standing::Rooted(Root::TemplateResult { build, .. }) if *build == bid(2)
    ));
    assert!(matches!(c[&3].standing, Standing::Rooted(_)));
    assert_eq!(
        c[&2].standing,
        Standing::Candidate(Tier::SupersededCheckpoint)
    );
    assert_eq!(c[&4].standing, Standing::Candidate(Tier::Orphan));
    assert_eq!(c[&4].referenced_by, None);
}

#[test]
fn deleting_a_template_makes_its_results_garbage() {
    let mut w = World::new();
    w.snapshot(10, 1, &[1, 2]);
    w.build(1, "web", ready(), Some(10));
    w.template("web", &[("default", 1)], true);
    let c = w.classify(&[1, 2]);
    assert_eq!(c[&1].standing, Standing::Candidate(Tier::Orphan));
    assert_eq!(c[&2].standing, Standing::Candidate(Tier::Orphan));
}

#[test]
fn an_in_flight_build_roots_its_bindings_checkpoints_and_resumed_stack() {
    let mut w = World::new();
    w.snapshot(20, 9, &[5, 6]);
    w.snapshot(21, 7, &[5, 6, 7]);
    w.build(
        7,
        "api",
        Phase::Active {
            epoch: Epoch::FIRST,
            node: crate::domain::ids::NodeId::parse("n1").unwrap(),
            lease_expires_at: t(101),
        },
        None,
    );
    let b = w.inv.builds.get_mut(&bid(7)).unwrap();
    b.progress
        .insert(1, StepOutcome::Cached { snapshot: snap(20) });
    b.progress
        .insert(2, StepOutcome::Checkpointed { snapshot: snap(21) });
    b.bindings.insert(
        crate::domain::ids::FilesHash::parse(&"a".repeat(64)).unwrap(),
        Binding {
            generation: Generation(1),
            blob_digest: d(8),
            size: 3,
        },
    );
    let c = w.classify(&[5, 6, 7, 8]);
    for n in [5, 6, 7, 8] {
        assert_eq!(
            c[&n].standing,
            Standing::Rooted(Root::InFlightBuild { build: bid(7) }),
            "object {n}"
        );
    }
    // A snapshot it recorded but has not referenced yet (its candidate before Publishing).
    w.snapshot(22, 7, &[5, 9]);
    assert_eq!(
        w.classify(&[9])[&9].standing,
        Standing::Rooted(Root::InFlightBuild { build: bid(7) })
    );
    // Once it ends, nothing of it is rooted any more.
    w.inv.builds.get_mut(&bid(7)).unwrap().phase = Phase::Error {
        epoch: None,
        reason: build::FailureReason {
            kind: build::FailureKind::NodeLost,
            message: "gone".into(),
            step: None,
        },
    };
    let c = w.classify(&[5, 6, 7, 8, 9]);
    assert!(c
        .values()
        .all(|c| c.standing == Standing::Candidate(Tier::Orphan)));
}

#[test]
fn cached_final_results_keep_the_newest_per_template_and_name_their_entries() {
    let mut w = World::new();
    w.snapshot(30, 1, &[1]);
    w.snapshot(31, 2, &[2]);
    w.build(1, "web", ready(), Some(30));
    w.build(2, "web", ready(), Some(31));
    w.template("web", &[], false);
    w.final_entry(1, 30, 1);
    w.final_entry(2, 31, 2);
    let c = w.classify(&[1, 2]);
    assert_eq!(c[&2].standing, Standing::Candidate(Tier::FinalResult));
    assert_eq!(
        c[&1].standing,
        Standing::Candidate(Tier::SurplusFinalResult)
    );
    assert_eq!(c[&1].entries.len(), 1);
    assert_eq!(c[&1].entries[0].1, CacheKey(d(101)));
    assert_eq!(c[&1].entries[0].2, 1);
    // A retired entry holds nothing.
    w.inv.cache_keys[0].state.retired = true;
    let c = w.classify(&[1]);
    assert_eq!(
        c[&1].standing,
        Standing::Candidate(Tier::SupersededCheckpoint)
    );
    assert!(c[&1].entries.is_empty());
}

#[test]
fn a_lease_roots_an_object_until_it_lapses_and_use_moves_last_used() {
    let mut w = World::new();
    let state = [
        object::Event::Registered {
            generation: 1,
            by: "w".into(),
            at: t(50),
        },
        object::Event::Leased {
            holder: "build b@1".into(),
            until: t(150),
            at: t(60),
        },
    ]
    .iter()
    .fold(object::State::default(), object::evolve);
    w.inv.objects.insert(d(1), state.clone());
    let c = w.classify(&[1]);
    assert!(matches!(
        c[&1].standing,
        Standing::Rooted(Root::Leased { .. })
    ));
    assert_eq!(c[&1].last_used, t(60));
    let mut lapsed = state;
    lapsed.leases.clear();
    w.inv.objects.insert(d(1), lapsed);
    assert_eq!(
        w.classify(&[1])[&1].standing,
        Standing::Candidate(Tier::Orphan)
    );
}

#[test]
fn a_present_upload_is_an_upload_tier_candidate_and_only_live_objects_are_usable() {
    let mut w = World::new();
    let files = [files::Event::GenerationPublished {
        generation: Generation(1),
        blob_digest: d(9),
        size: 3,
        build: bid(1),
        intent: crate::domain::ids::IntentId::from_uuid(Uuid::from_u128(5)),
    }]
    .iter()
    .fold(files::State::default(), files::evolve);
    w.inv.files.push(files);
    assert_eq!(
        w.classify(&[9])[&9].standing,
        Standing::Candidate(Tier::Upload)
    );
    assert!(usable(None));
    let deleting = object::State {
        lifecycle: Lifecycle::Deleting,
        ..Default::default()
    };
    assert!(!usable(Some(&deleting)));
}

#[test]
fn an_entry_whose_layer_left_the_store_is_broken_and_others_are_not() {
    let mut w = World::new();
    w.snapshot(30, 1, &[1, 2]);
    w.snapshot(31, 2, &[1, 3]);
    w.build(1, "web", ready(), Some(30));
    w.build(2, "web", ready(), Some(31));
    w.final_entry(1, 30, 1);
    w.final_entry(2, 31, 2);
    let stored: BTreeSet<Digest> = [d(1), d(3)].into_iter().collect();
    let broken = broken_entries(&w.inv, &stored);
    assert_eq!(broken.len(), 1);
    assert_eq!(broken[0].1, CacheKey(d(101)));
    assert_eq!(broken[0].3, d(2));
}

#[test]
fn a_live_sandbox_roots_its_stack_even_when_its_template_is_deleted_and_an_ended_one_does_not() {
    use crate::domain::sandbox::{EndReason, Phase as SandboxPhase, SandboxRequest, State};
    let mut w = World::new();
    w.snapshot(10, 1, &[1, 2]);
    w.build(1, "web", ready(), Some(10));
    w.template("web", &[("default", 1)], true);
    let request = SandboxRequest {
        team: team(),
        template: tpl("web"),
        alias: "web".into(),
        build: bid(1),
        snapshot: snap(10),
        timeout_secs: 60,
        metadata: BTreeMap::new(),
        env_vars: BTreeMap::new(),
        allow_internet: true,
        cpu_count: 1,
        memory_mb: 512,
        envd_token: "t".into(),
        traffic_token: None,
        auto_pause: false,
        backend: None,
    };
    let sandbox = |n: u8, phase: SandboxPhase, paused: Option<&[u8]>| {
        let id = SandboxId::parse(&format!("isbx{n}")).unwrap();
        let state = State {
            phase,
            request: Some(request.clone()),
            paused_layers: paused.map(|p| p.iter().map(|n| d(*n)).collect()),
            ..State::default()
        };
        (id, state)
    };
    // A running one boots on the template's snapshot; a paused one on the stack it stored
    // (the template's layers and its own); an ended one's stored layer is garbage.
    w.inv.sandboxes.extend([
        sandbox(1, SandboxPhase::Running, None),
        sandbox(2, SandboxPhase::Paused, Some(&[1, 2, 3])),
        sandbox(3, SandboxPhase::Ended(EndReason::Killed), Some(&[1, 2, 4])),
    ]);
    let c = w.classify(&[1, 2, 3, 4]);
    for n in [1, 2, 3] {
        assert!(
            matches!(&c[&n].standing, Standing::Rooted(Root::Sandbox { .. })),
            "layer {n}: {:?}",
            c[&n].standing
        );
    }
    assert!(matches!(
        &c[&3].standing,
        Standing::Rooted(Root::Sandbox { sandbox }) if sandbox.as_str() == "isbx2"
    ));
    assert_eq!(c[&4].standing, Standing::Candidate(Tier::Orphan));
}
