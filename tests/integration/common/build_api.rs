//! What the API would append, done through the domain's own decisions: registration, the link
//! request and upload of a COPY archive, and build start. For tests that drive builds without
//! running `strata api`.

use chrono::Utc;
use strata::domain::build;
use strata::domain::build_spec::{Resources, Tag, TemplateBuildStartV2, TemplateName};
use strata::domain::ids::{self, BuildId, FilesHash, IntentId, TeamId, TemplateId};
use strata::events::command::load;
use strata::events::{
    Actor, ActorRole, CommandContext, EventStore, Metadata, StreamId, StreamWrite,
};
use strata::streams::{Build, Files};
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
        let now = Utc::now();
        strata::registration::register_build(
            &self.store,
            &api_context(),
            &strata::registration::RegisterBuild {
                team: self.team.clone(),
                name: TemplateName::parse(name).unwrap(),
                tags: vec![Tag::default_tag()],
                resources: Resources::default(),
                now,
                waiting_deadline,
            },
        )
        .await
        .unwrap()
    }

    /// The link request and the upload PUT for one COPY archive.
    pub async fn upload(
        &self,
        blobs: &dyn BlobStore,
        build: BuildId,
        hash: &FilesHash,
        bytes: &[u8],
    ) {
        let (digest, size) = blobs.put_bytes(bytes).unwrap();
        let blob_digest = ids::Digest::parse(&digest.to_string()).unwrap();
        let scope = ids::Scope::team(&self.team);
        let fstream = stream(ids::stream::files(&scope, hash));
        let bstream = stream(ids::stream::build(&build));
        let now = Utc::now();
        let intent = IntentId::from_uuid(Uuid::new_v4());
        let b = load::<Build>(&self.store, &bstream).await.unwrap();
        let f = load::<Files>(&self.store, &fstream).await.unwrap();
        let (decision, link) = build::upload::reserve_upload(
            &b.state,
            &f.state,
            &build::upload::ReserveUpload {
                build,
                intent,
                hash: hash.clone(),
                now,
                expires_at: now + chrono::Duration::hours(1),
            },
        )
        .unwrap();
        self.append_decision(&bstream, b.expected(), &fstream, f.expected(), &decision)
            .await;
        let b = load::<Build>(&self.store, &bstream).await.unwrap();
        let f = load::<Files>(&self.store, &fstream).await.unwrap();
        let decision = build::upload::complete_upload(
            &b.state,
            &f.state,
            &build::upload::CompleteUpload {
                build,
                intent,
                hash: hash.clone(),
                generation: link.generation,
                blob_digest,
                size,
                now,
            },
        )
        .unwrap();
        self.append_decision(&bstream, b.expected(), &fstream, f.expected(), &decision)
            .await;
    }

    /// The link request alone (the upload never comes): a pending intent expiring at
    /// `expires_at`.
    pub async fn reserve(
        &self,
        build: BuildId,
        hash: &FilesHash,
        expires_at: chrono::DateTime<Utc>,
    ) -> IntentId {
        let scope = ids::Scope::team(&self.team);
        let fstream = stream(ids::stream::files(&scope, hash));
        let bstream = stream(ids::stream::build(&build));
        let intent = IntentId::from_uuid(Uuid::new_v4());
        let b = load::<Build>(&self.store, &bstream).await.unwrap();
        let f = load::<Files>(&self.store, &fstream).await.unwrap();
        let (decision, _) = build::upload::reserve_upload(
            &b.state,
            &f.state,
            &build::upload::ReserveUpload {
                build,
                intent,
                hash: hash.clone(),
                now: Utc::now(),
                expires_at,
            },
        )
        .unwrap();
        self.append_decision(&bstream, b.expected(), &fstream, f.expected(), &decision)
            .await;
        intent
    }

    pub async fn append_decision(
        &self,
        bstream: &StreamId,
        bexp: strata::events::ExpectedVersion,
        fstream: &StreamId,
        fexp: strata::events::ExpectedVersion,
        decision: &build::upload::Decision,
    ) {
        let ctx = api_context();
        self.store
            .append(vec![
                StreamWrite::new(
                    bstream.clone(),
                    bexp,
                    ctx.encode(bstream, &decision.build).unwrap(),
                ),
                StreamWrite::new(
                    fstream.clone(),
                    fexp,
                    ctx.encode(fstream, &decision.files).unwrap(),
                ),
            ])
            .await
            .unwrap();
    }

    /// `POST /v2/templates/{id}/builds/{bid}`: freezes the build; it is queued for a node.
    pub async fn start(&self, build: BuildId, spec: serde_json::Value) {
        self.start_until(build, spec, Utc::now() + chrono::Duration::hours(1))
            .await
    }

    /// [`Self::start`] with the queue deadline given.
    pub async fn start_until(
        &self,
        build: BuildId,
        spec: serde_json::Value,
        queue_deadline: chrono::DateTime<Utc>,
    ) {
        let spec: TemplateBuildStartV2 = serde_json::from_value(spec).unwrap();
        let now = Utc::now();
        strata::events::execute::<Build>(
            &self.store,
            &stream(ids::stream::build(&build)),
            &build::Command::StartBuild {
                spec,
                now,
                queue_deadline,
                attempt: None,
            },
            &api_context(),
        )
        .await
        .unwrap();
    }
}
