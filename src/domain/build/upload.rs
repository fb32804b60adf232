//! The two transitions that span a build and the `files-{scope}:{hash}` stream of one archive name.
//!
//! Layout: [`ReserveUpload`] / [`reserve_upload`] (the link response), [`ClaimUpload`] /
//! [`claim_upload`] and [`release_claim`] (an upload receiving its body), [`CompleteUpload`] /
//! [`complete_upload`] (the upload's 2xx), their shared [`UploadError`], and [`Decision`], the
//! events per stream that the caller appends in one transaction, each stream at the version it
//! read.
//!
//! Receiving (issue: a signed URL replayed until it expired stored up to its ceiling each
//! time): before a byte of a body is read, the upload claims the intent. A PUT to a URL whose
//! intent another upload is receiving is refused at once; one to a URL whose upload completed
//! is told the digest it completed with, and the API hashes the body without storing it to
//! answer the replay. A claim ends with the completion, or is released when the upload fails;
//! if the API process dies mid-body, the URL stays claimed and the client asks for a new link.
//!
//! Link time (`GET /templates/{id}/files/{hash}`): every response reserves an intent with a fresh
//! generation, also when present, because `forceUpload` PUTs to the URL of that same response.
//! Binding is create-if-absent: a build that already has a binding keeps it (never rebound by a
//! link); a build without one is bound to the latest published generation (`present: true`);
//! with nothing published, `present: false`.
//!
//! Upload completion is the RFC's CAS: intent Pending ∧ build Waiting ∧ binding = the binding the
//! intent observed -> intent Completed, binding = the intent's generation, and the generation is
//! published on the files stream. Replays with the same digest succeed while the build's binding
//! (live or frozen) still holds those bytes; a different digest, or a replay after the binding
//! moved, is a conflict.

use chrono::{DateTime, Utc};

use super::decide::status_word;
use super::{Binding, BindingSource, Event, IntentState, Phase, State};
use crate::domain::files;
use crate::domain::ids::{BuildId, Digest, FilesHash, Generation, IntentId};

/// The events of one cross-stream decision, per stream. Empty lists mean "nothing to write"; the
/// caller still checks both streams' versions (a guard) so the decision was made on fresh state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    pub build: Vec<Event>,
    pub files: Vec<files::Event>,
}

/// A link request for `hash` on `build`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReserveUpload {
    pub build: BuildId,
    /// Chosen by the caller (and reused when it retries), so a retry is idempotent.
    pub intent: IntentId,
    pub hash: FilesHash,
    pub now: DateTime<Utc>,
    /// When the grant lapses unused: the URL's expiry plus the longest upload we accept.
    pub expires_at: DateTime<Utc>,
}

/// What the link response says.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkResponse {
    pub present: bool,
    pub intent: IntentId,
    /// The generation to sign into the upload URL.
    pub generation: Generation,
}

/// Failed uploads one URL takes before it is refused: a client retrying a broken upload gets a
/// few tries, and a client that fails on purpose cannot grow the build's stream without bound
/// (each failure appends a claim and its release).
pub const MAX_FAILED_UPLOADS: u32 = 3;

/// An upload to `intent`'s URL is about to read its body, as `claim`.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimUpload {
    pub intent: IntentId,
    /// The filesHash and generation the signed URL names; both must be the intent's.
    pub hash: FilesHash,
    pub generation: Generation,
    pub claim: uuid::Uuid,
    pub now: DateTime<Utc>,
}

/// What a PUT to the URL may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Receive and store the body, then complete with this claim.
    Receive,
    /// The intent already completed with these bytes: only a body with this digest is a replay
    /// (answered without storing anything); any other conflicts.
    Completed { blob_digest: Digest },
}

/// The upload body of `intent` has been stored as an immutable blob with this digest and size.
#[derive(Clone, Debug, PartialEq)]
pub struct CompleteUpload {
    pub build: BuildId,
    pub intent: IntentId,
    /// The filesHash and generation the signed URL names; both must be the intent's.
    pub hash: FilesHash,
    pub generation: Generation,
    pub blob_digest: Digest,
    pub size: u64,
    pub now: DateTime<Utc>,
    /// The claim the upload received its body under ([`claim_upload`]); `None` for a writer
    /// that never claims (accepted only while no other upload receives the intent).
    pub claim: Option<uuid::Uuid>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UploadError {
    #[error("build is not registered; register it with POST /v3/templates first")]
    NotRegistered,
    #[error("the build is {status}: uploads and links are accepted only before the build starts; register a new build")]
    NotWaiting { status: &'static str },
    #[error("the build's waiting deadline {deadline} has passed; register a new build")]
    DeadlinePassed { deadline: DateTime<Utc> },
    #[error("upload intent {intent} is unknown to this build; request a new upload link")]
    UnknownIntent { intent: IntentId },
    #[error("the URL names generation {url} but intent {intent} reserved {reserved}; request a new upload link")]
    GenerationMismatch {
        intent: IntentId,
        url: Generation,
        reserved: Generation,
    },
    #[error("the URL names filesHash {url} but intent {intent} was issued for {reserved}; request a new upload link")]
    HashMismatch {
        intent: IntentId,
        url: FilesHash,
        reserved: FilesHash,
    },
    #[error("upload intent {intent} expired; request a new upload link")]
    IntentExpired { intent: IntentId },
    #[error("another upload to this link (intent {intent}) is being received now; wait for it to finish, or request a new upload link")]
    UploadInProgress { intent: IntentId },
    #[error("{failed} uploads to this link (intent {intent}) ended without completing; request a new upload link")]
    TooManyFailedUploads { intent: IntentId, failed: u32 },
    #[error("upload intent {intent} already completed with {completed}; a different body ({attempted}) cannot replace it")]
    DigestConflict {
        intent: IntentId,
        completed: Digest,
        attempted: Digest,
    },
    #[error("filesHash {hash} of this build was rebound since this link was issued (expected generation {expected:?}, now {current:?}); request a new upload link")]
    BindingChanged {
        hash: FilesHash,
        expected: Option<Generation>,
        current: Option<Generation>,
    },
    #[error("the upload was already recorded, but the build no longer uses those bytes for filesHash {hash}; request a new upload link")]
    ReplayAfterRebind { hash: FilesHash },
    #[error("the bytes of {digest} are being deleted by garbage collection; upload them again through a new link")]
    ContentDeleting { digest: Digest },
    #[error(transparent)]
    Files(#[from] files::Error),
}

/// Decides a link response over the build and the files stream of `cmd.hash`.
/// `present_stored` says whether the bytes of the name's latest generation are still stored:
/// no garbage-collection pass is deleting or has deleted them, and the blob store holds them
/// intact (read and checked against their digest). Only then is the name present, so the SDK
/// may skip its upload.
pub fn reserve_upload(
    build: &State,
    files_state: &files::State,
    present_stored: bool,
    cmd: &ReserveUpload,
) -> Result<(Decision, LinkResponse), UploadError> {
    if build.registration.is_none() {
        return Err(UploadError::NotRegistered);
    }
    // A retried link request with the same intent gets the same answer and writes nothing.
    if let Some(existing) = build.intents.get(&cmd.intent) {
        return Ok((
            Decision::default(),
            LinkResponse {
                present: build.binding(&existing.hash).is_some(),
                intent: cmd.intent,
                generation: existing.generation,
            },
        ));
    }
    waiting(build, cmd.now)?;

    let mut decision = Decision::default();
    let files_events = files::decide(
        files_state,
        &files::Command::ReserveGeneration {
            build: cmd.build,
            intent: cmd.intent,
        },
    )?;
    let generation = files_events
        .iter()
        .find_map(|e| match e {
            files::Event::GenerationReserved { generation, .. }
            | files::Event::GenerationPublished { generation, .. } => Some(*generation),
            files::Event::GenerationRetired { .. } => None,
        })
        .or_else(|| files_state.reservations.get(&cmd.intent).copied())
        .unwrap_or_default();
    decision.files = files_events;

    let mut bound = build.bindings.get(&cmd.hash).copied();
    if bound.is_none() {
        if let Some(published) = files_state.present().filter(|_| present_stored) {
            let binding = Binding {
                generation: published.generation,
                blob_digest: published.blob_digest,
                size: published.size,
            };
            decision.build.push(Event::ContextBound {
                hash: cmd.hash.clone(),
                binding,
                source: BindingSource::Present,
            });
            bound = Some(binding);
        }
    }
    decision.build.push(Event::UploadReserved {
        intent: cmd.intent,
        hash: cmd.hash.clone(),
        generation,
        expected_binding: bound.map(|b| b.generation),
        expires_at: cmd.expires_at,
    });
    Ok((
        decision,
        LinkResponse {
            present: bound.is_some(),
            intent: cmd.intent,
            generation,
        },
    ))
}

/// Decides whether a PUT to `cmd.intent`'s URL may read its body: claims the intent when it
/// is pending and nobody receives it.
pub fn claim_upload(build: &State, cmd: &ClaimUpload) -> Result<(Decision, Claim), UploadError> {
    let intent = matching_intent(build, cmd.intent, &cmd.hash, cmd.generation)?;
    // A build that started takes no upload, not even a replay.
    waiting(build, cmd.now)?;
    match &intent.state {
        IntentState::Completed { blob_digest } => {
            return Ok((
                Decision::default(),
                Claim::Completed {
                    blob_digest: *blob_digest,
                },
            ))
        }
        IntentState::Expired => return Err(UploadError::IntentExpired { intent: cmd.intent }),
        IntentState::Pending => {}
    }
    match intent.receiving {
        Some(claim) if claim == cmd.claim => Ok((Decision::default(), Claim::Receive)),
        Some(_) => Err(UploadError::UploadInProgress { intent: cmd.intent }),
        None if intent.failed_uploads >= MAX_FAILED_UPLOADS => {
            Err(UploadError::TooManyFailedUploads {
                intent: cmd.intent,
                failed: intent.failed_uploads,
            })
        }
        None => Ok((
            Decision {
                build: vec![Event::UploadClaimed {
                    intent: cmd.intent,
                    claim: cmd.claim,
                    claimed_at: cmd.now,
                }],
                files: Vec::new(),
            },
            Claim::Receive,
        )),
    }
}

/// Releases `claim` on `intent` after an upload that did not complete; nothing to do when the
/// claim is no longer held (completed, released, or the build moved on).
pub fn release_claim(build: &State, intent: IntentId, claim: uuid::Uuid, reason: &str) -> Decision {
    match build.intents.get(&intent) {
        Some(i) if i.receiving == Some(claim) => Decision {
            build: vec![Event::UploadClaimReleased {
                intent,
                claim,
                reason: reason.to_owned(),
            }],
            files: Vec::new(),
        },
        _ => Decision::default(),
    }
}

/// The intent a signed URL names, if it is this build's with the URL's hash and generation.
fn matching_intent<'a>(
    build: &'a State,
    id: IntentId,
    hash: &FilesHash,
    generation: Generation,
) -> Result<&'a super::Intent, UploadError> {
    if build.registration.is_none() {
        return Err(UploadError::NotRegistered);
    }
    let intent = build
        .intents
        .get(&id)
        .ok_or(UploadError::UnknownIntent { intent: id })?;
    if intent.hash != *hash {
        return Err(UploadError::HashMismatch {
            intent: id,
            url: hash.clone(),
            reserved: intent.hash.clone(),
        });
    }
    if intent.generation != generation {
        return Err(UploadError::GenerationMismatch {
            intent: id,
            url: generation,
            reserved: intent.generation,
        });
    }
    Ok(intent)
}

/// Decides an upload completion over the build and the files stream of the intent's hash.
pub fn complete_upload(
    build: &State,
    files_state: &files::State,
    cmd: &CompleteUpload,
) -> Result<Decision, UploadError> {
    let intent = matching_intent(build, cmd.intent, &cmd.hash, cmd.generation)?;
    match &intent.state {
        IntentState::Completed { blob_digest } if *blob_digest != cmd.blob_digest => {
            return Err(UploadError::DigestConflict {
                intent: cmd.intent,
                completed: *blob_digest,
                attempted: cmd.blob_digest,
            })
        }
        IntentState::Completed { .. } => {
            // A replay: fine only while the build still reads these bytes for this hash.
            return match build.binding(&intent.hash) {
                Some(b) if b.blob_digest == cmd.blob_digest => Ok(Decision::default()),
                _ => Err(UploadError::ReplayAfterRebind {
                    hash: intent.hash.clone(),
                }),
            };
        }
        IntentState::Expired => return Err(UploadError::IntentExpired { intent: cmd.intent }),
        IntentState::Pending => {}
    }
    waiting(build, cmd.now)?;
    if intent.receiving.is_some() && intent.receiving != cmd.claim {
        return Err(UploadError::UploadInProgress { intent: cmd.intent });
    }

    let current = build.bindings.get(&intent.hash).copied();
    let rebind = current.map(|b| b.generation) == intent.expected_binding;
    if !rebind && current.map(|b| b.blob_digest) != Some(cmd.blob_digest) {
        return Err(UploadError::BindingChanged {
            hash: intent.hash.clone(),
            expected: intent.expected_binding,
            current: current.map(|b| b.generation),
        });
    }
    // Identical bytes under a binding that moved (parallel links for one hash, as the JS SDK
    // sends them) complete the intent without rebinding: the build already reads these bytes.
    let files_events = files::decide(
        files_state,
        &files::Command::PublishGeneration {
            generation: intent.generation,
            blob_digest: cmd.blob_digest,
            size: cmd.size,
            build: cmd.build,
            intent: cmd.intent,
        },
    )?;
    let mut events = vec![Event::UploadCompleted {
        intent: cmd.intent,
        blob_digest: cmd.blob_digest,
        size: cmd.size,
        completed_at: cmd.now,
    }];
    if rebind {
        events.push(Event::ContextBound {
            hash: intent.hash.clone(),
            binding: Binding {
                generation: intent.generation,
                blob_digest: cmd.blob_digest,
                size: cmd.size,
            },
            source: BindingSource::Upload { intent: cmd.intent },
        });
    }
    Ok(Decision {
        build: events,
        files: files_events,
    })
}

fn waiting(build: &State, now: DateTime<Utc>) -> Result<(), UploadError> {
    match &build.phase {
        Phase::Waiting { deadline } if now >= *deadline => Err(UploadError::DeadlinePassed {
            deadline: *deadline,
        }),
        Phase::Waiting { .. } => Ok(()),
        other => Err(UploadError::NotWaiting {
            status: status_word(other),
        }),
    }
}
