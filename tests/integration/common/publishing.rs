//! What a node appends on entering Publishing, for tests of what happens after it (promotion
//! reconcilers, lost replies) without a real build.

use strata::domain::build::BuildResult;
use strata::domain::build_spec::Tag;
use strata::domain::ids::{BuildId, Digest, Epoch, SnapshotId, TemplateId};
use strata::domain::promotion::PromotionPlan;
use strata::events::{Actor, ActorRole, CommandContext, EventStore, Metadata};
use uuid::Uuid;

/// The build's `PublishingStarted` and the staged promotion outbox (one append, as the node's
/// attempt in epoch 1 writes it), with a plan of no layers and the default tag.
pub async fn enter_publishing(store: &EventStore, build: BuildId, template: &TemplateId) {
    enter_publishing_with_layers(store, build, template, vec![]).await
}

/// [`enter_publishing`] with a plan of these layers.
pub async fn enter_publishing_with_layers(
    store: &EventStore,
    build: BuildId,
    template: &TemplateId,
    layers: Vec<Digest>,
) {
    let candidate = SnapshotId::from_uuid(Uuid::now_v7());
    let plan = PromotionPlan {
        build,
        epoch: Epoch::FIRST,
        template: template.clone(),
        source: candidate,
        target: candidate,
        build_base_checkpoint: None,
        layers,
        tags: vec![Tag::default_tag()],
    };
    let result = BuildResult {
        candidate,
        build_base_checkpoint: None,
    };
    let node = CommandContext::new(Metadata::new(Actor::new(ActorRole::Worker, "test")));
    strata::app::publish::begin_publishing(store, &node, &result, &plan)
        .await
        .unwrap();
}
