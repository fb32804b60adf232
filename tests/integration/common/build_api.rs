//! What the API appends, through the same application-layer calls the handlers make:
//! registration, the link request and upload of a COPY archive, and build start. For tests that
//! drive builds without running `strata api`.

use std::sync::Arc;

use chrono::Utc;
use strata::app::upload::{complete_upload, link_upload};
use strata::app::CommandContext;
use strata::domain::build::upload::{CompleteUpload, ReserveUpload};
use strata::domain::build_spec::{Resources, Tag, TemplateBuildStartV2, TemplateName};
use strata::domain::ids::{BuildId, FilesHash, IntentId, TeamId, TemplateId};
use strata::events::{Actor, ActorRole, EventStore, Metadata, StreamId};
use strata::vmm::BlobStore;
use uuid::Uuid;

pub fn stream(name: String) -> StreamId {
    StreamId::parse(name).unwrap()
}

pub fn api_context() -> CommandContext {
    CommandContext::new(Metadata::new(Actor::new(ActorRole::Api, "test-api")))
}

pub struct Api {
    pub store: EventStore,
    pub team: TeamId,
}

impl Api {
    /// `POST /v3/templates`: claims the name (or joins its template) and registers a build.
    pub async fn register(&self, name: &str) -> (TemplateId, BuildId) {
        self.register_until(name, Utc::now() + chrono::Duration::hours(1))
            .await
    }

    /// [`Self::register`] with the waiting deadline given.
    pub async fn register_until(
        &self,
        name: &str,
        waiting_deadline: chrono::DateTime<Utc>,
    ) -> (TemplateId, BuildId) {
        self.register_with(name, waiting_deadline, Resources::default())
            .await
    }

    /// [`Self::register`] with the waiting deadline and the requested resources given.
    pub async fn register_with(
        &self,
        name: &str,
        waiting_deadline: chrono::DateTime<Utc>,
        resources: Resources,
    ) -> (TemplateId, BuildId) {
        let now = Utc::now();
        strata::app::registration::register_build(
            &self.store,
            &api_context(),
            &strata::app::registration::RegisterBuild {
                team: self.team.clone(),
                name: TemplateName::parse(name).unwrap(),
                tags: vec![Tag::default_tag()],
                resources,
                now,
                waiting_deadline,
            },
        )
        .await
        .unwrap()
    }

    /// The link request and the upload PUT for one COPY archive: the bytes are referenced on
    /// their object stream before they are stored, as the upload handler does.
    pub async fn upload(
        &self,
        blobs: &Arc<dyn BlobStore>,
        build: BuildId,
        hash: &FilesHash,
        bytes: &[u8],
    ) {
        let completion = self
            .upload_until_completion(blobs, build, hash, bytes)
            .await;
        complete_upload(&self.store, &api_context(), &completion)
            .await
            .unwrap();
    }

    /// [`Self::upload`] up to its last write: the link is requested and the bytes referenced and
    /// stored; the returned completion is what the PUT appends next.
    pub async fn upload_until_completion(
        &self,
        blobs: &Arc<dyn BlobStore>,
        build: BuildId,
        hash: &FilesHash,
        bytes: &[u8],
    ) -> CompleteUpload {
        strata::app::object::reference(
            &self.store,
            &api_context(),
            &[strata::domain::ids::Digest::of(bytes)],
            "test upload",
        )
        .await
        .unwrap();
        let (digest, size) = blobs.put_bytes(bytes).unwrap();
        let now = Utc::now();
        let intent = IntentId::from_uuid(Uuid::new_v4());
        let link = link_upload(
            &self.store,
            &api_context(),
            blobs,
            &ReserveUpload {
                build,
                intent,
                hash: hash.clone(),
                now,
                expires_at: now + chrono::Duration::hours(1),
            },
        )
        .await
        .unwrap();
        CompleteUpload {
            build,
            intent,
            hash: hash.clone(),
            generation: link.generation,
            blob_digest: digest,
            size,
            now,
            claim: None,
        }
    }

    /// The link request alone (the upload never comes): a pending intent expiring at
    /// `expires_at`.
    pub async fn reserve(
        &self,
        build: BuildId,
        hash: &FilesHash,
        expires_at: chrono::DateTime<Utc>,
    ) -> IntentId {
        let intent = IntentId::from_uuid(Uuid::new_v4());
        // Nothing is uploaded under these hashes, so the link's check of stored bytes never
        // runs: an empty store answers for it.
        let dir = tempfile::tempdir().unwrap();
        let empty: Arc<dyn BlobStore> =
            Arc::new(strata::vmm::LocalBlobStore::open(dir.path().join("blobs")).unwrap());
        link_upload(
            &self.store,
            &api_context(),
            &empty,
            &ReserveUpload {
                build,
                intent,
                hash: hash.clone(),
                now: Utc::now(),
                expires_at,
            },
        )
        .await
        .unwrap();
        intent
    }

    /// `POST /v2/templates/{id}/builds/{bid}`: freezes the build; it is queued for a node.
    pub async fn start(&self, build: BuildId, spec: serde_json::Value) {
        self.start_until(build, spec, Utc::now() + chrono::Duration::hours(1))
            .await
    }

    /// [`Self::start`] with the service's `STRATA_CACHE_MODE` set to `setting`, resolved as
    /// the start handler resolves it.
    pub async fn start_in_mode(&self, build: BuildId, spec: serde_json::Value, setting: &str) {
        let spec: TemplateBuildStartV2 = serde_json::from_value(spec).unwrap();
        let resolved =
            strata::domain::cache_mode::resolve(&strata::domain::cache_mode::ModeSettings {
                service: Some(setting.to_string()),
                ..Default::default()
            });
        strata::app::build::start_build_keyed(
            &self.store,
            &api_context(),
            &build,
            spec,
            None,
            strata::app::build::Resolved {
                cache_mode: Some(resolved),
                ..Default::default()
            },
            Utc::now(),
            Utc::now() + chrono::Duration::hours(1),
        )
        .await
        .unwrap();
    }

    /// [`Self::start`] with the queue deadline given.
    pub async fn start_until(
        &self,
        build: BuildId,
        spec: serde_json::Value,
        queue_deadline: chrono::DateTime<Utc>,
    ) {
        let spec: TemplateBuildStartV2 = serde_json::from_value(spec).unwrap();
        strata::app::build::start_build(
            &self.store,
            &api_context(),
            &build,
            spec,
            Utc::now(),
            queue_deadline,
        )
        .await
        .unwrap();
    }
}
