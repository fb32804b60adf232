//! Tests of the build aggregate: scenarios first (one per rule of the failure contract), then
//! property tests over random command sequences.

use chrono::{DateTime, Duration, TimeZone, Utc};
use proptest::prelude::*;
use serde_json::json;
use uuid::Uuid;

use super::status::{reason_of, status_of, BuildStatus};
use super::upload::{
    claim_upload, complete_upload, release_claim, reserve_upload, Claim, ClaimUpload,
    CompleteUpload, Decision, ReserveUpload, UploadError,
};
use super::*;
use crate::domain::build_spec::{Resources, TemplateBuildStartV2};
use crate::domain::files;
use crate::domain::ids::{
    BuildId, Digest, Epoch, FilesHash, Generation, IntentId, NodeId, SnapshotId, TeamId, TemplateId,
};

fn t(secs: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap() + Duration::seconds(secs)
}
fn build_id() -> BuildId {
    BuildId::from_uuid(Uuid::from_u128(0xb))
}
fn intent(n: u128) -> IntentId {
    IntentId::from_uuid(Uuid::from_u128(n))
}
fn hash(c: char) -> FilesHash {
    FilesHash::parse(&c.to_string().repeat(64)).unwrap()
}
fn node(n: &str) -> NodeId {
    NodeId::parse(n).unwrap()
}
fn snapshot(n: u128) -> SnapshotId {
    SnapshotId::from_uuid(Uuid::from_u128(n))
}

fn spec_copying(hashes: &[FilesHash]) -> TemplateBuildStartV2 {
    let mut steps: Vec<_> = hashes
        .iter()
        .map(|h| json!({"type": "COPY", "args": ["app", "/app", "", ""], "filesHash": h.as_str(), "force": false}))
        .collect();
    steps.push(json!({"type": "RUN", "args": ["make"], "force": false}));
    serde_json::from_value(json!({"fromImage": "ubuntu:22.04", "force": false, "steps": steps}))
        .unwrap()
}

/// A build stream and the files streams it touches, applied the way the caller would.
#[derive(Default, Clone)]
struct World {
    build: State,
    files: std::collections::BTreeMap<FilesHash, files::State>,
}

impl World {
    fn registered() -> Self {
        let mut w = World::default();
        w.run(Command::RegisterBuild {
            template: TemplateId::parse("tpl1").unwrap(),
            team: TeamId::parse("team1").unwrap(),
            tags: vec![],
            resources: Resources::default(),
            now: t(0),
            waiting_deadline: t(600),
        })
        .unwrap();
        w
    }
    fn run(&mut self, command: Command) -> Result<Vec<Event>, Error> {
        let events = decide(&self.build, &command)?;
        self.build = events.iter().fold(self.build.clone(), evolve);
        Ok(events)
    }
    fn apply(&mut self, h: &FilesHash, d: &Decision) {
        self.build = d.build.iter().fold(self.build.clone(), evolve);
        let f = self.files.remove(h).unwrap_or_default();
        self.files
            .insert(h.clone(), d.files.iter().fold(f, files::evolve));
    }
    fn link(
        &mut self,
        i: u128,
        h: &FilesHash,
        now: DateTime<Utc>,
    ) -> Result<upload::LinkResponse, UploadError> {
        let f = self.files.get(h).cloned().unwrap_or_default();
        let (d, resp) = reserve_upload(
            &self.build,
            &f,
            true,
            &ReserveUpload {
                build: build_id(),
                intent: intent(i),
                hash: h.clone(),
                now,
                expires_at: now + Duration::seconds(3600),
            },
        )?;
        self.apply(h, &d);
        Ok(resp)
    }
    fn upload(
        &mut self,
        i: u128,
        bytes: &[u8],
        now: DateTime<Utc>,
    ) -> Result<Decision, UploadError> {
        let (h, generation) = self
            .build
            .intents
            .get(&intent(i))
            .map(|x| (x.hash.clone(), x.generation))
            .unwrap_or((hash('0'), Generation(1)));
        let f = self.files.get(&h).cloned().unwrap_or_default();
        let d = complete_upload(
            &self.build,
            &f,
            &CompleteUpload {
                build: build_id(),
                intent: intent(i),
                hash: h.clone(),
                generation,
                blob_digest: Digest::of(bytes),
                size: bytes.len() as u64,
                now,
                claim: None,
            },
        )?;
        self.apply(&h, &d);
        Ok(d)
    }
    fn start(
        &mut self,
        spec: TemplateBuildStartV2,
        now: DateTime<Utc>,
        with_node: bool,
    ) -> Result<Vec<Event>, Error> {
        self.run(Command::StartBuild {
            spec,
            now,
            queue_deadline: now + Duration::seconds(300),
            attempt: with_node.then(|| AttemptGrant {
                node: node("n1"),
                lease_expires_at: now + Duration::seconds(30),
            }),
            present: Default::default(),
            credentials_fingerprint: None,
            cache_mode: None,
            sandbox_backend: None,
        })
    }
}

#[test]
fn happy_path_from_registration_to_ready() {
    let mut w = World::registered();
    assert_eq!(status_of(&w.build), Some(BuildStatus::Waiting));
    let h = hash('a');
    let link = w.link(1, &h, t(1)).unwrap();
    assert!(!link.present);
    assert_eq!(link.generation, Generation(1));
    w.upload(1, b"tar-bytes", t(2)).unwrap();
    assert_eq!(w.build.bindings[&h].generation, Generation(1));
    assert_eq!(
        w.files[&h].present().unwrap().blob_digest,
        Digest::of(b"tar-bytes")
    );

    let events = w
        .start(spec_copying(std::slice::from_ref(&h)), t(3), true)
        .unwrap();
    assert!(matches!(events[0], Event::BuildFrozen { .. }));
    assert!(matches!(
        events[1],
        Event::AttemptAcquired {
            epoch: Epoch(1),
            ..
        }
    ));
    assert_eq!(status_of(&w.build), Some(BuildStatus::Building));
    assert_eq!(
        w.build.binding(&h).unwrap().blob_digest,
        Digest::of(b"tar-bytes")
    );

    w.run(Command::RenewLease {
        epoch: Epoch(1),
        now: t(20),
        lease_expires_at: t(60),
    })
    .unwrap();
    w.run(Command::RecordStepProgress {
        epoch: Epoch(1),
        step: 1,
        outcome: StepOutcome::Checkpointed {
            snapshot: snapshot(1),
        },
        now: t(30),
    })
    .unwrap();
    let result = BuildResult {
        candidate: snapshot(9),
        build_base_checkpoint: Some(snapshot(8)),
    };
    w.run(Command::BeginPublishing {
        epoch: Epoch(1),
        result: result.clone(),
        now: t(40),
    })
    .unwrap();
    assert_eq!(
        status_of(&w.build),
        Some(BuildStatus::Building),
        "publishing is not ready yet"
    );
    let events = w
        .run(Command::MarkReady {
            epoch: Epoch(1),
            now: t(41),
        })
        .unwrap();
    assert!(
        matches!(events.last(), Some(Event::ContextReleased { bindings, .. }) if bindings[&h] == Generation(1))
    );
    assert_eq!(status_of(&w.build), Some(BuildStatus::Ready));
    assert!(
        w.run(Command::MarkReady {
            epoch: Epoch(1),
            now: t(42)
        })
        .unwrap()
        .is_empty(),
        "replay is a no-op"
    );
}

#[test]
fn second_build_sees_present_and_binds_the_published_generation() {
    let mut first = World::registered();
    let h = hash('a');
    first.link(1, &h, t(1)).unwrap();
    first.upload(1, b"v1", t(2)).unwrap();

    let mut second = World::registered();
    second.files = first.files.clone();
    let link = second.link(2, &h, t(3)).unwrap();
    assert!(link.present);
    assert_eq!(
        link.generation,
        Generation(2),
        "a link always reserves a fresh generation"
    );
    assert_eq!(second.build.bindings[&h].blob_digest, Digest::of(b"v1"));
    // A second link for the same hash (the SDK asks once per COPY step) keeps the binding.
    let again = second.link(3, &h, t(4)).unwrap();
    assert!(again.present);
    assert_eq!(second.build.bindings[&h].generation, Generation(1));
}

#[test]
fn force_upload_binds_a_new_generation_to_this_build_only() {
    let h = hash('a');
    let mut other = World::registered();
    other.link(1, &h, t(1)).unwrap();
    other.upload(1, b"old", t(2)).unwrap();

    let mut me = World::registered();
    me.files = other.files.clone();
    assert!(me.link(2, &h, t(3)).unwrap().present);
    me.upload(2, b"new", t(4)).unwrap();
    assert_eq!(me.build.bindings[&h].generation, Generation(2));
    assert_eq!(me.build.bindings[&h].blob_digest, Digest::of(b"new"));
    assert_eq!(
        other.build.bindings[&h].blob_digest,
        Digest::of(b"old"),
        "the other build keeps its pinned generation"
    );
    assert_eq!(me.files[&h].present().unwrap().generation, Generation(2));
}

#[test]
fn upload_replays_are_idempotent_and_conflicts_are_named() {
    let h = hash('a');
    let mut w = World::registered();
    w.link(1, &h, t(1)).unwrap();
    w.upload(1, b"v1", t(2)).unwrap();
    let replay = w.upload(1, b"v1", t(3)).unwrap();
    assert!(replay.build.is_empty() && replay.files.is_empty());
    assert!(matches!(
        w.upload(1, b"other", t(3)),
        Err(UploadError::DigestConflict { .. })
    ));

    // Two links issued before either upload (the JS SDK parallelizes them): the second upload
    // with different bytes would rebind silently, so it is refused; identical bytes complete.
    let mut w = World::registered();
    w.link(1, &h, t(1)).unwrap();
    w.link(2, &h, t(1)).unwrap();
    w.link(3, &h, t(1)).unwrap();
    w.upload(1, b"same", t(2)).unwrap();
    let d = w.upload(2, b"same", t(2)).unwrap();
    assert!(!d
        .build
        .iter()
        .any(|e| matches!(e, Event::ContextBound { .. })));
    assert!(matches!(
        w.upload(3, b"different", t(2)),
        Err(UploadError::BindingChanged { .. })
    ));
    assert_eq!(w.build.bindings[&h].generation, Generation(1));
}

#[test]
fn an_upload_claims_its_intent_before_reading_and_a_second_put_is_refused_until_it_ends() {
    let h = hash('c');
    let mut w = World::registered();
    let link = w.link(1, &h, t(1)).unwrap();
    let (first, second) = (Uuid::from_u128(1), Uuid::from_u128(2));
    let claim = |w: &World, claim: Uuid, now| {
        claim_upload(
            &w.build,
            &ClaimUpload {
                intent: intent(1),
                hash: h.clone(),
                generation: link.generation,
                claim,
                now,
            },
        )
    };
    let (d, got) = claim(&w, first, t(2)).unwrap();
    assert_eq!(got, Claim::Receive);
    assert!(matches!(d.build[..], [Event::UploadClaimed { claim, .. }] if claim == first));
    w.apply(&h, &d);
    // The same upload claiming again writes nothing; another is refused before reading.
    assert_eq!(
        claim(&w, first, t(2)).unwrap(),
        (Decision::default(), Claim::Receive)
    );
    assert_eq!(
        claim(&w, second, t(3)),
        Err(UploadError::UploadInProgress { intent: intent(1) })
    );
    // Nor may another writer complete the intent while it is received.
    let (hh, generation) = (h.clone(), link.generation);
    let completion = |claim| CompleteUpload {
        build: build_id(),
        intent: intent(1),
        hash: hh.clone(),
        generation,
        blob_digest: Digest::of(b"c"),
        size: 1,
        now: t(4),
        claim,
    };
    let f = w.files[&h].clone();
    assert_eq!(
        complete_upload(&w.build, &f, &completion(None)),
        Err(UploadError::UploadInProgress { intent: intent(1) })
    );
    // A failed upload releases its claim (only its own), and the URL may be used again.
    assert_eq!(
        release_claim(&w.build, intent(1), second, "x"),
        Decision::default()
    );
    let released = release_claim(&w.build, intent(1), first, "the body broke off");
    w.apply(&h, &released);
    let (d, _) = claim(&w, second, t(5)).unwrap();
    w.apply(&h, &d);
    let d = complete_upload(&w.build, &f, &completion(Some(second))).unwrap();
    w.apply(&h, &d);
    // After completion a PUT is told which bytes completed it, and claims nothing.
    let (d, got) = claim(&w, Uuid::from_u128(3), t(6)).unwrap();
    assert_eq!(d, Decision::default());
    assert_eq!(
        got,
        Claim::Completed {
            blob_digest: Digest::of(b"c")
        }
    );
    for e in released.build.iter() {
        let v = serde_json::to_value(e).unwrap();
        assert_eq!(v["type"], "UploadClaimReleased.v1");
        assert_eq!(&serde_json::from_value::<Event>(v).unwrap(), e);
    }
}

#[test]
fn a_url_whose_uploads_keep_failing_is_refused_after_a_few() {
    let h = hash('f');
    let mut w = World::registered();
    let link = w.link(1, &h, t(1)).unwrap();
    let claim = |w: &World, n: u128| {
        claim_upload(
            &w.build,
            &ClaimUpload {
                intent: intent(1),
                hash: h.clone(),
                generation: link.generation,
                claim: Uuid::from_u128(n),
                now: t(2),
            },
        )
    };
    for n in 0..upload::MAX_FAILED_UPLOADS as u128 {
        let (d, _) = claim(&w, n).unwrap();
        w.apply(&h, &d);
        let released = release_claim(&w.build, intent(1), Uuid::from_u128(n), "short body");
        w.apply(&h, &released);
    }
    assert_eq!(
        claim(&w, 99),
        Err(UploadError::TooManyFailedUploads {
            intent: intent(1),
            failed: upload::MAX_FAILED_UPLOADS
        })
    );
}

#[test]
fn completion_checks_the_url_against_its_intent() {
    let h = hash('a');
    let mut w = World::registered();
    w.link(1, &h, t(1)).unwrap();
    let f = w.files[&h].clone();
    let mut cmd = CompleteUpload {
        build: build_id(),
        intent: intent(1),
        hash: hash('b'),
        generation: Generation(1),
        blob_digest: Digest::of(b"x"),
        size: 1,
        now: t(2),
        claim: None,
    };
    assert!(matches!(
        complete_upload(&w.build, &f, &cmd),
        Err(UploadError::HashMismatch { .. })
    ));
    cmd.hash = h.clone();
    cmd.generation = Generation(2);
    assert!(matches!(
        complete_upload(&w.build, &f, &cmd),
        Err(UploadError::GenerationMismatch { .. })
    ));
    cmd.intent = intent(9);
    assert!(matches!(
        complete_upload(&w.build, &f, &cmd),
        Err(UploadError::UnknownIntent { .. })
    ));
    assert_eq!(w.build.scope().unwrap().as_str(), "team1");
}

#[test]
fn freeze_rejects_missing_bindings_and_later_uploads() {
    let (a, b) = (hash('a'), hash('b'));
    let mut w = World::registered();
    w.link(1, &a, t(1)).unwrap();
    w.upload(1, b"a", t(2)).unwrap();
    let err = w
        .start(spec_copying(&[a.clone(), b.clone()]), t(3), true)
        .unwrap_err();
    assert_eq!(
        err,
        Error::MissingBinding {
            step: 2,
            hash: b.clone()
        }
    );
    assert!(err.to_string().contains(b.as_str()));

    w.link(2, &b, t(4)).unwrap();
    w.link(3, &a, t(4)).unwrap();
    w.upload(2, b"b", t(5)).unwrap();
    w.start(spec_copying(&[a.clone(), b.clone()]), t(6), false)
        .unwrap();
    assert!(matches!(w.build.phase, Phase::Queued { .. }));
    // E2B reports a started build as building even before a node takes it.
    assert_eq!(status_of(&w.build), Some(BuildStatus::Building));
    assert!(matches!(
        w.upload(3, b"a2", t(7)),
        Err(UploadError::NotWaiting { .. })
    ));
    assert!(matches!(
        w.link(4, &a, t(7)),
        Err(UploadError::NotWaiting { .. })
    ));
    // A replay of a completed upload is still fine while the frozen binding holds its bytes.
    assert!(w.upload(2, b"b", t(7)).is_ok());

    // Same request: idempotent. Different request: conflict.
    assert!(w
        .start(spec_copying(&[a.clone(), b.clone()]), t(8), true)
        .unwrap()
        .is_empty());
    assert!(matches!(
        w.start(spec_copying(&[b.clone(), a.clone()]), t(8), true),
        Err(Error::StartConflict { .. })
    ));

    w.run(Command::AcquireAttempt {
        grant: AttemptGrant {
            node: node("n2"),
            lease_expires_at: t(40),
        },
        now: t(9),
    })
    .unwrap();
    assert!(matches!(
        w.build.phase,
        Phase::Active {
            epoch: Epoch(1),
            ..
        }
    ));
    assert!(matches!(
        w.run(Command::AcquireAttempt {
            grant: AttemptGrant {
                node: node("n3"),
                lease_expires_at: t(40)
            },
            now: t(9)
        }),
        Err(Error::NotQueued { .. })
    ));
}

#[test]
fn registry_credentials_count_in_the_digest_but_never_enter_events() {
    let body = json!({"fromImage": "registry.example.com/team/img:1",
        "fromImageRegistry": {"type": "registry", "username": "u", "password": "hunter2-secret"},
        "force": false, "steps": [{"type": "RUN", "args": ["true"], "force": false}]});
    let spec: TemplateBuildStartV2 = serde_json::from_value(body).unwrap();
    let mut w = World::registered();
    let events = w.start(spec.clone(), t(1), true).unwrap();
    let stored = serde_json::to_string(&events).unwrap();
    assert!(!stored.contains("hunter2-secret"), "{stored}");
    let freeze = w.build.freeze.as_ref().unwrap();
    assert!(freeze.registry_credentials);
    assert_eq!(freeze.request_digest, spec.request_digest());
    assert_ne!(
        spec.request_digest(),
        spec.without_credentials().request_digest()
    );
    assert!(
        w.start(spec, t(2), true).unwrap().is_empty(),
        "a replay with credentials is the same request"
    );
}

/// Issue: the recorded request digest held a plain hash of the registry credentials, which
/// anyone reading events could test password guesses against. With a keyed fingerprint the
/// digest is not the plain one, a retry with the same fingerprint is a replay, and a build
/// frozen with the plain digest before (an upgrade) still recognises its retry.
#[test]
fn credentials_enter_the_recorded_digest_only_keyed() {
    let body = json!({"fromImage": "registry.example.com/team/img:1",
        "fromImageRegistry": {"type": "registry", "username": "u", "password": "hunter2"},
        "force": false, "steps": [{"type": "RUN", "args": ["true"], "force": false}]});
    let spec: TemplateBuildStartV2 = serde_json::from_value(body).unwrap();
    let keyed = Digest::of(b"a keyed fingerprint");
    let start = |w: &mut World, fp: Option<Digest>, at| {
        w.run(Command::StartBuild {
            spec: spec.clone(),
            now: at,
            queue_deadline: at + Duration::seconds(300),
            attempt: None,
            present: Default::default(),
            credentials_fingerprint: fp,
            cache_mode: None,
            sandbox_backend: None,
        })
    };
    let mut w = World::registered();
    start(&mut w, Some(keyed), t(1)).unwrap();
    let recorded = w.build.freeze.as_ref().unwrap().request_digest;
    assert_ne!(recorded, spec.request_digest(), "not the plain digest");
    assert_eq!(recorded, spec.request_digest_with(Some(&keyed)));
    assert!(start(&mut w, Some(keyed), t(2)).unwrap().is_empty());
    assert!(matches!(
        start(&mut w, Some(Digest::of(b"other credentials")), t(3)),
        Err(Error::StartConflict { .. })
    ));
    // Frozen with the plain digest (before keying): the keyed retry is still a replay.
    let mut old = World::registered();
    start(&mut old, None, t(1)).unwrap();
    assert!(start(&mut old, Some(keyed), t(2)).unwrap().is_empty());
}

#[test]
fn lease_expiry_fails_the_build_with_node_lost_and_fences_the_epoch() {
    let mut w = World::registered();
    w.start(spec_copying(&[]), t(1), true).unwrap();
    assert!(matches!(
        w.run(Command::ExpireAttempt { now: t(20) }),
        Err(Error::LeaseStillValid { .. })
    ));
    assert!(matches!(
        w.run(Command::RenewLease {
            epoch: Epoch(1),
            now: t(31),
            lease_expires_at: t(60)
        }),
        Err(Error::LeaseExpired { .. })
    ));
    assert_eq!(check_open_attempt(&w.build, Epoch(1), t(20)), Ok(()));
    assert!(matches!(
        check_open_attempt(&w.build, Epoch(1), t(31)),
        Err(Error::LeaseExpired { .. })
    ));
    assert!(matches!(
        check_open_attempt(&w.build, Epoch(2), t(20)),
        Err(Error::UnknownAttempt { .. })
    ));
    w.run(Command::ExpireAttempt { now: t(31) }).unwrap();
    assert!(matches!(
        check_open_attempt(&w.build, Epoch(1), t(20)),
        Err(Error::Terminal { .. })
    ));
    assert_eq!(status_of(&w.build), Some(BuildStatus::Error));
    let reason = reason_of(&w.build).unwrap();
    assert!(reason.message.contains("n1"));
    assert!(w.build.context_released);
    for late in [
        Command::RenewLease {
            epoch: Epoch(1),
            now: t(32),
            lease_expires_at: t(90),
        },
        Command::BeginPublishing {
            epoch: Epoch(1),
            result: BuildResult {
                candidate: snapshot(1),
                build_base_checkpoint: None,
            },
            now: t(32),
        },
        Command::MarkReady {
            epoch: Epoch(1),
            now: t(32),
        },
        Command::FailBuild {
            epoch: Epoch(1),
            message: "late".into(),
            step: None,
            now: t(32),
        },
    ] {
        assert!(matches!(
            w.run(late),
            Err(Error::Terminal { status: "error" })
        ));
    }
}

#[test]
fn publishing_converges_forward_and_ready_is_never_demoted() {
    let mut w = World::registered();
    w.start(spec_copying(&[]), t(1), true).unwrap();
    let result = BuildResult {
        candidate: snapshot(1),
        build_base_checkpoint: None,
    };
    w.run(Command::BeginPublishing {
        epoch: Epoch(1),
        result: result.clone(),
        now: t(2),
    })
    .unwrap();
    assert!(w
        .run(Command::BeginPublishing {
            epoch: Epoch(1),
            result,
            now: t(3)
        })
        .unwrap()
        .is_empty());
    assert!(matches!(
        w.run(Command::ExpireAttempt { now: t(500) }),
        Err(Error::PublishingConvergesForward { .. })
    ));
    assert!(matches!(
        w.run(Command::RecordStepProgress {
            epoch: Epoch(1),
            step: 1,
            outcome: StepOutcome::Executed,
            now: t(4)
        }),
        Err(Error::AlreadyPublishing { .. })
    ));
    w.run(Command::MarkReady {
        epoch: Epoch(1),
        now: t(501),
    })
    .unwrap();
    assert!(matches!(
        w.run(Command::FailBuild {
            epoch: Epoch(1),
            message: "x".into(),
            step: None,
            now: t(502)
        }),
        Err(Error::Terminal { status: "ready" })
    ));
    assert!(matches!(
        w.run(Command::ExpireWaiting { now: t(9999) }),
        Err(Error::NotWaiting { .. })
    ));
}

#[test]
fn worker_failure_reports_the_step_and_releases_context() {
    let h = hash('c');
    let mut w = World::registered();
    w.link(1, &h, t(1)).unwrap();
    w.link(2, &h, t(1)).unwrap();
    w.upload(1, b"c", t(2)).unwrap();
    w.start(spec_copying(std::slice::from_ref(&h)), t(3), true)
        .unwrap();
    assert!(matches!(
        w.run(Command::FailBuild {
            epoch: Epoch(1),
            message: " ".into(),
            step: None,
            now: t(4)
        }),
        Err(Error::EmptyMessage)
    ));
    assert!(matches!(
        w.run(Command::FailBuild {
            epoch: Epoch(2),
            message: "x".into(),
            step: None,
            now: t(4)
        }),
        Err(Error::UnknownAttempt { .. })
    ));
    let events = w
        .run(Command::FailBuild {
            epoch: Epoch(1),
            message: "exit status 2".into(),
            step: Some(FailedStep::Step(2)),
            now: t(4),
        })
        .unwrap();
    match events.last().unwrap() {
        Event::ContextReleased { bindings, intents } => {
            assert_eq!(bindings[&h], Generation(1));
            assert_eq!(
                intents,
                &vec![intent(2)],
                "the unused intent is released too"
            );
        }
        other => panic!("expected release, got {other:?}"),
    }
    let reason = serde_json::to_value(reason_of(&w.build).unwrap()).unwrap();
    assert_eq!(reason, json!({"message": "exit status 2", "step": "2"}));
}

#[test]
fn waiting_and_intent_deadlines() {
    let h = hash('d');
    let mut w = World::registered();
    w.link(1, &h, t(1)).unwrap();
    assert!(matches!(
        w.run(Command::ExpireIntent {
            intent: intent(1),
            now: t(100)
        }),
        Err(Error::IntentStillValid { .. })
    ));
    w.run(Command::ExpireIntent {
        intent: intent(1),
        now: t(3601),
    })
    .unwrap();
    assert!(matches!(
        w.upload(1, b"late", t(400)),
        Err(UploadError::IntentExpired { .. })
    ));
    assert!(matches!(
        w.run(Command::ExpireWaiting { now: t(599) }),
        Err(Error::DeadlineNotPassed { .. })
    ));
    assert!(matches!(
        w.start(spec_copying(&[]), t(600), true),
        Err(Error::DeadlinePassed { .. })
    ));
    w.run(Command::ExpireWaiting { now: t(600) }).unwrap();
    assert_eq!(status_of(&w.build), Some(BuildStatus::Error));
    assert!(matches!(
        w.link(2, &h, t(601)),
        Err(UploadError::NotWaiting { status: "error" })
    ));
}

#[test]
fn events_round_trip_through_json_with_versioned_types() {
    let mut w = World::registered();
    let h = hash('e');
    w.link(1, &h, t(1)).unwrap();
    let d = w.upload(1, b"e", t(2)).unwrap();
    let mut events = d.build.clone();
    events.extend(w.start(spec_copying(&[h]), t(3), true).unwrap());
    events.extend(w.run(Command::ExpireAttempt { now: t(100) }).unwrap());
    for e in &events {
        let v = serde_json::to_value(e).unwrap();
        assert!(v["type"].as_str().unwrap().ends_with(".v1"), "{v}");
        assert_eq!(&serde_json::from_value::<Event>(v).unwrap(), e);
    }
    // Replaying the stream rebuilds the same phase.
    let mut all = vec![];
    let mut w2 = World::registered();
    all.extend(
        decide(
            &State::default(),
            &Command::RegisterBuild {
                template: TemplateId::parse("tpl1").unwrap(),
                team: TeamId::parse("team1").unwrap(),
                tags: vec![],
                resources: Resources::default(),
                now: t(0),
                waiting_deadline: t(600),
            },
        )
        .unwrap(),
    );
    w2.build = replay(all.iter().chain(events.iter()));
    assert_eq!(w2.build.phase, w.build.phase);
}

// ---------------------------------------------------------------------------------------------
// Property tests
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Link {
        intent: u8,
        hash: u8,
    },
    Upload {
        intent: u8,
        content: u8,
    },
    Start {
        hashes: u8,
        with_node: bool,
        variant: u8,
    },
    Acquire,
    Renew {
        epoch: u8,
        extend: u8,
    },
    Progress {
        epoch: u8,
        step: u8,
    },
    Publish {
        epoch: u8,
    },
    Ready {
        epoch: u8,
    },
    Fail {
        epoch: u8,
    },
    ExpireAttempt,
    ExpireWaiting,
    ExpireIntent {
        intent: u8,
    },
    Tick {
        secs: u8,
    },
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..4, 0u8..2).prop_map(|(intent, hash)| Op::Link { intent, hash }),
        (0u8..4, 0u8..2).prop_map(|(intent, content)| Op::Upload { intent, content }),
        (0u8..3, any::<bool>(), 0u8..2).prop_map(|(hashes, with_node, variant)| Op::Start {
            hashes,
            with_node,
            variant
        }),
        Just(Op::Acquire),
        (0u8..3, 1u8..60).prop_map(|(epoch, extend)| Op::Renew { epoch, extend }),
        (0u8..3, 0u8..4).prop_map(|(epoch, step)| Op::Progress { epoch, step }),
        (0u8..3).prop_map(|epoch| Op::Publish { epoch }),
        (0u8..3).prop_map(|epoch| Op::Ready { epoch }),
        (0u8..3).prop_map(|epoch| Op::Fail { epoch }),
        Just(Op::ExpireAttempt),
        Just(Op::ExpireWaiting),
        (0u8..4).prop_map(|intent| Op::ExpireIntent { intent }),
        (1u8..120).prop_map(|secs| Op::Tick { secs }),
    ]
}

fn hashes_for(n: u8) -> Vec<FilesHash> {
    [hash('a'), hash('b')]
        .into_iter()
        .take(n as usize)
        .collect()
}

fn open_epoch(state: &State) -> Option<Epoch> {
    match state.phase {
        Phase::Active { epoch, .. } | Phase::Publishing { epoch, .. } => Some(epoch),
        _ => None,
    }
}

/// Runs one op; returns the single-stream command it used (if any) and whether it was accepted.
fn step(w: &mut World, now: &mut i64, op: &Op) -> (Option<Command>, bool) {
    let at = t(*now);
    let cmd = match op {
        Op::Tick { secs } => {
            *now += *secs as i64;
            return (None, true);
        }
        Op::Link { intent: i, hash: h } => {
            return (
                None,
                w.link(*i as u128 + 1, &hashes_for(2)[*h as usize], at)
                    .is_ok(),
            )
        }
        Op::Upload { intent: i, content } => {
            return (None, w.upload(*i as u128 + 1, &[*content], at).is_ok())
        }
        Op::Start {
            hashes,
            with_node,
            variant,
        } => {
            let mut spec = spec_copying(&hashes_for(*hashes));
            spec.force = *variant == 1;
            Command::StartBuild {
                spec,
                now: at,
                queue_deadline: at + Duration::seconds(200),
                attempt: with_node.then(|| AttemptGrant {
                    node: node("n1"),
                    lease_expires_at: at + Duration::seconds(30),
                }),
                present: Default::default(),
                credentials_fingerprint: None,
                cache_mode: None,
                sandbox_backend: None,
            }
        }
        Op::Acquire => Command::AcquireAttempt {
            grant: AttemptGrant {
                node: node("n2"),
                lease_expires_at: at + Duration::seconds(30),
            },
            now: at,
        },
        Op::Renew { epoch, extend } => Command::RenewLease {
            epoch: Epoch(*epoch as u64),
            now: at,
            lease_expires_at: at + Duration::seconds(*extend as i64),
        },
        Op::Progress { epoch, step } => Command::RecordStepProgress {
            epoch: Epoch(*epoch as u64),
            step: *step as u32,
            outcome: StepOutcome::Executed,
            now: at,
        },
        Op::Publish { epoch } => Command::BeginPublishing {
            epoch: Epoch(*epoch as u64),
            result: BuildResult {
                candidate: snapshot(1),
                build_base_checkpoint: None,
            },
            now: at,
        },
        Op::Ready { epoch } => Command::MarkReady {
            epoch: Epoch(*epoch as u64),
            now: at,
        },
        Op::Fail { epoch } => Command::FailBuild {
            epoch: Epoch(*epoch as u64),
            message: "failed".into(),
            step: None,
            now: at,
        },
        Op::ExpireAttempt => Command::ExpireAttempt { now: at },
        Op::ExpireWaiting => Command::ExpireWaiting { now: at },
        Op::ExpireIntent { intent: i } => Command::ExpireIntent {
            intent: intent(*i as u128 + 1),
            now: at,
        },
    };
    let ok = w.run(cmd.clone()).is_ok();
    (Some(cmd), ok)
}

fn command_epoch(cmd: &Command) -> Option<Epoch> {
    match cmd {
        Command::RenewLease { epoch, .. }
        | Command::RecordStepProgress { epoch, .. }
        | Command::BeginPublishing { epoch, .. }
        | Command::MarkReady { epoch, .. }
        | Command::FailBuild { epoch, .. } => Some(*epoch),
        _ => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Terminal states never change; stale epochs never change state; frozen bindings never move;
    /// live bindings move only through a completed upload whose intent saw the old binding.
    #[test]
    fn lifecycle_invariants_hold_for_any_command_sequence(ops in proptest::collection::vec(arb_op(), 1..60)) {
        let mut w = World::registered();
        let mut now = 1i64;
        for op in &ops {
            let before = w.build.clone();
            let (cmd, accepted) = step(&mut w, &mut now, op);

            if before.phase.is_terminal() {
                prop_assert_eq!(&w.build.phase, &before.phase, "terminal phase changed by {:?}", op);
            }
            if let Some(cmd) = &cmd {
                if let Some(epoch) = command_epoch(cmd) {
                    if open_epoch(&before) != Some(epoch) {
                        prop_assert!(!accepted || decide(&before, cmd).map(|e| e.is_empty()).unwrap_or(false),
                            "stale epoch {} accepted with effect in {:?}", epoch, before.phase);
                        prop_assert_eq!(&w.build, &before);
                    }
                }
            }
            if let (Some(f0), Some(f1)) = (&before.freeze, &w.build.freeze) {
                prop_assert_eq!(&f0.bindings, &f1.bindings, "frozen bindings moved");
            }
            for (h, old) in &before.bindings {
                match w.build.bindings.get(h) {
                    Some(new) if new != old => {
                        let justified = w.build.intents.values().any(|i| {
                            &i.hash == h && i.generation == new.generation && i.expected_binding == Some(old.generation)
                        });
                        prop_assert!(justified, "binding of {} moved from {:?} to {:?} without an upload that expected it", h, old, new);
                    }
                    None => prop_assert!(w.build.context_released || w.build.freeze.is_some(), "binding dropped before release"),
                    _ => {}
                }
            }
            if before.phase == Phase::Unregistered {
                prop_assert_eq!(&w.build, &before);
            }
        }
    }

    /// What `decide` emits, `evolve` records: re-deciding an accepted idempotent command on the
    /// evolved state emits nothing more.
    #[test]
    fn evolve_records_what_decide_promised(ops in proptest::collection::vec(arb_op(), 1..60)) {
        let mut w = World::registered();
        let mut now = 1i64;
        for op in &ops {
            let (cmd, accepted) = step(&mut w, &mut now, op);
            if let (Some(cmd), true) = (cmd, accepted) {
                let idempotent = matches!(cmd,
                    Command::StartBuild { .. } | Command::BeginPublishing { .. } | Command::MarkReady { .. } | Command::RecordStepProgress { .. });
                if idempotent {
                    prop_assert_eq!(decide(&w.build, &cmd), Ok(vec![]), "{:?} not idempotent", cmd);
                }
                match cmd {
                    Command::MarkReady { epoch, .. } => prop_assert_eq!(&w.build.phase, &Phase::Ready { epoch }),
                    Command::BeginPublishing { epoch, .. } => {
                        let publishing = matches!(w.build.phase, Phase::Publishing { epoch: e, .. } if e == epoch);
                        prop_assert!(publishing, "not publishing after BeginPublishing");
                    }
                    Command::FailBuild { .. } | Command::ExpireAttempt { .. } | Command::ExpireWaiting { .. } => {
                        let failed = matches!(w.build.phase, Phase::Error { .. });
                        prop_assert!(failed, "not failed");
                        prop_assert!(w.build.context_released);
                        prop_assert!(w.build.bindings.is_empty());
                        prop_assert!(!w.build.intents.values().any(|i| i.state == IntentState::Pending));
                    }
                    Command::StartBuild { .. } => prop_assert!(w.build.freeze.is_some()),
                    _ => {}
                }
            }
        }
    }
}

#[test]
fn the_base_image_is_pinned_once_per_build() {
    let mut w = World::registered();
    w.start(spec_copying(&[]), t(1), true).unwrap();
    let pin = |epoch: Epoch, digest: Digest, now| Command::PinBaseImage {
        epoch,
        reference: "docker.io/library/debian:stable".into(),
        digest,
        now,
    };
    let first = Digest::of(b"index");
    let events = w.run(pin(Epoch::FIRST, first, t(2))).unwrap();
    assert!(matches!(&events[..], [Event::BaseImageResolved { digest, .. }] if *digest == first));
    assert_eq!(w.build.base_pin.as_ref().map(|p| p.digest), Some(first));
    assert!(
        w.run(pin(Epoch::FIRST, first, t(3))).unwrap().is_empty(),
        "recording the same pin again changes nothing"
    );
    assert!(matches!(
        w.run(pin(Epoch::FIRST, Digest::of(b"moved"), t(3))),
        Err(Error::BasePinConflict { pinned }) if pinned == first
    ));
    assert!(
        w.run(pin(Epoch(7), first, t(3))).is_err(),
        "only the open attempt pins"
    );
}

#[test]
fn a_cached_prefix_is_recorded_in_one_decision_as_each_step_would_be() {
    let (a, b) = (hash('a'), hash('b'));
    let mut w = World::registered();
    w.link(1, &a, t(1)).unwrap();
    w.upload(1, b"a", t(2)).unwrap();
    w.link(2, &b, t(1)).unwrap();
    w.upload(2, b"b", t(2)).unwrap();
    w.start(spec_copying(&[a, b]), t(3), true).unwrap();
    let cached = |upto, snapshot| Command::RecordStepsCached {
        epoch: Epoch(1),
        upto,
        snapshot,
        now: t(4),
    };
    assert!(w.run(cached(0, snapshot(1))).unwrap().is_empty());
    let events = w.run(cached(2, snapshot(1))).unwrap();
    let steps: Vec<u32> = events
        .iter()
        .map(|e| match e {
            Event::StepCompleted {
                step,
                outcome: StepOutcome::Cached { snapshot: s },
                ..
            } if *s == snapshot(1) => *step,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(steps, [1, 2]);
    assert_eq!(w.build.progress.len(), 2);
    assert!(
        w.run(cached(2, snapshot(1))).unwrap().is_empty(),
        "recording the same prefix again changes nothing"
    );
    assert!(matches!(
        w.run(cached(2, snapshot(2))),
        Err(Error::StepConflict { step: 1 })
    ));
    assert!(matches!(
        w.run(cached(4, snapshot(1))),
        Err(Error::StepOutOfRange { step: 4, steps: 3 })
    ));
    assert_eq!(
        w.build.progress.len(),
        2,
        "a refused prefix records nothing"
    );
    let stale = Command::RecordStepsCached {
        epoch: Epoch(9),
        upto: 3,
        snapshot: snapshot(1),
        now: t(4),
    };
    assert!(w.run(stale).is_err(), "only the open attempt records");
}

#[test]
fn the_cache_mode_is_recorded_with_the_freeze_and_kept_by_a_replayed_start() {
    use crate::domain::cache_mode::{resolve, CacheMode, Level, ModeSettings};
    let mut w = World::registered();
    let resolved = resolve(&ModeSettings {
        team: Some("final".into()),
        service: Some("off".into()),
        ..Default::default()
    });
    let start = |mode| Command::StartBuild {
        spec: spec_copying(&[]),
        now: t(1),
        queue_deadline: t(300),
        attempt: None,
        present: Default::default(),
        credentials_fingerprint: None,
        cache_mode: mode,
        sandbox_backend: None,
    };
    assert_eq!(
        w.build.cache_mode(),
        CacheMode::Steps,
        "before any: the default"
    );
    let events = w.run(start(Some(resolved.clone()))).unwrap();
    assert!(matches!(
        &events[..],
        [Event::BuildFrozen { .. }, Event::CacheModeResolved { resolved: r }] if *r == resolved
    ));
    assert_eq!(w.build.cache_mode(), CacheMode::Final);
    assert_eq!(w.build.cache_mode.as_ref().unwrap().level, Level::Team);
    // The same start again (a lost reply) decides nothing, whatever the settings say now.
    let again = resolve(&ModeSettings::default());
    assert!(w.run(start(Some(again))).unwrap().is_empty());
    assert_eq!(w.build.cache_mode(), CacheMode::Final);
    let json = serde_json::to_value(&events[1]).unwrap();
    assert_eq!(json["type"], "CacheModeResolved.v1");
    let back: Event = serde_json::from_value(json).unwrap();
    assert_eq!(back, events[1]);
}

#[test]
fn the_sandbox_backend_is_recorded_after_the_cache_mode_with_the_freeze() {
    use crate::domain::backend_name::{self, BackendName};
    use crate::domain::cache_mode::{resolve, ModeSettings};
    use crate::domain::setting_levels::{Level, LevelValues};
    let mut w = World::registered();
    let backend = backend_name::resolve(&LevelValues {
        team: Some("namespace".into()),
        ..Default::default()
    });
    let events = w
        .run(Command::StartBuild {
            spec: spec_copying(&[]),
            now: t(1),
            queue_deadline: t(300),
            attempt: None,
            present: Default::default(),
            credentials_fingerprint: None,
            cache_mode: Some(resolve(&ModeSettings::default())),
            sandbox_backend: Some(backend.clone()),
        })
        .unwrap();
    assert!(matches!(
        &events[..],
        [
            Event::BuildFrozen { .. },
            Event::CacheModeResolved { .. },
            Event::SandboxBackendResolved { resolved }
        ] if *resolved == backend
    ));
    let kept = w.build.sandbox_backend.as_ref().unwrap();
    assert_eq!(
        (kept.backend, kept.level),
        (BackendName::Namespace, Level::Team)
    );
    let json = serde_json::to_value(&events[2]).unwrap();
    assert_eq!(json["type"], "SandboxBackendResolved.v1");
    assert_eq!(serde_json::from_value::<Event>(json).unwrap(), events[2]);
}
