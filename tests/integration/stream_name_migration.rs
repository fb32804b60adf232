//! Migration 0005 (ADR 0009) against data written under the old stream names: every multi-part
//! name is moved to the `:`-joined encoding, a name claim stream that two teams shared under
//! `templatename-{team}-{name}` is split into each team's own, events keep their ids, payloads
//! and feed positions, and the stream catalog follows.

use crate::common;

use std::sync::Arc;

use strata::domain::ids::{TeamId, TemplateId};
use strata::domain::template::{Event as TemplateEvent, NameEvent};
use strata::events::command::load;
use strata::events::{
    Actor, ActorRole, DomainEvent, EventStore, ExpectedVersion, Metadata, NewEvent, StreamId,
    StreamWrite,
};
use strata::projections::{stream_catalog, ProjectionRunner};
use strata::streams::{template_name_stream, TemplateName};
use uuid::Uuid;

fn metadata() -> Metadata {
    Metadata::new(Actor::new(ActorRole::Api, "old-node"))
}

async fn append_old<E: DomainEvent>(store: &EventStore, stream: &str, events: &[E]) {
    let stream = StreamId::parse(stream).unwrap();
    let events: Vec<NewEvent> = events
        .iter()
        .map(|e| e.encode(Uuid::new_v4(), metadata()).unwrap())
        .collect();
    store
        .append(vec![StreamWrite::new(stream, ExpectedVersion::Any, events)])
        .await
        .unwrap();
}

fn registered(team: &str, name: &str) -> TemplateEvent {
    TemplateEvent::TemplateRegistered {
        team: TeamId::parse(team).unwrap(),
        name: name.into(),
        registered_at: chrono::Utc::now(),
    }
}

#[tokio::test]
async fn old_stream_names_are_moved_to_the_unambiguous_encoding() {
    let db = common::test_db_at_migration(4).await;
    let store = strata::app::event_store(db.pool.clone());
    let t1 = TemplateId::parse("tplcorp").unwrap();
    let t2 = TemplateId::parse("tplacme").unwrap();
    append_old(&store, "template-tplcorp", &[registered("acme-corp", "x")]).await;
    append_old(&store, "template-tplacme", &[registered("acme", "corp-x")]).await;
    // acme-corp claimed `x`, deleted its template (releasing the name), then acme claimed
    // `corp-x`: under the old names, one stream.
    append_old(
        &store,
        "templatename-acme-corp-x",
        &[
            NameEvent::NameClaimed {
                template: t1.clone(),
            },
            NameEvent::NameReleased {
                template: t1.clone(),
            },
            NameEvent::NameClaimed {
                template: t2.clone(),
            },
        ],
    )
    .await;
    let hash = "91fcd38c8d8bb7ffb7b2ae7d3c741880d0183bf2f36d1f60c727fedc44066c93";
    let build = "f161152a-580a-4ee8-9038-73dd65665234";
    let others = [
        (
            format!("files-acme-corp-{hash}"),
            format!("files-acme-corp:{hash}"),
        ),
        (
            format!("cachekey-acme-{hash}"),
            format!("cachekey-acme:{hash}"),
        ),
        (
            format!("promotion-{build}-12"),
            format!("promotion-{build}:12"),
        ),
    ];
    for (old, _) in &others {
        append_old(&store, old, &[registered("acme", "filler")]).await;
    }
    let runner = ProjectionRunner::new(store.clone(), Arc::new(stream_catalog::StreamCatalog));
    runner.catch_up().await.unwrap();
    let before: Vec<(i64, Uuid, serde_json::Value)> =
        sqlx::query_as("SELECT position, event_id, data FROM events ORDER BY position")
            .fetch_all(&db.pool)
            .await
            .unwrap();

    strata::db::migrate(&db.pool).await.unwrap();

    let after: Vec<(i64, Uuid, serde_json::Value)> =
        sqlx::query_as("SELECT position, event_id, data FROM events ORDER BY position")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        before, after,
        "events keep their positions, ids and payloads"
    );

    let corp = load::<TemplateName>(
        &store,
        &template_name_stream(&TeamId::parse("acme-corp").unwrap(), "x"),
    )
    .await
    .unwrap();
    assert_eq!((corp.version, corp.state.holder), (2, None));
    let acme = load::<TemplateName>(
        &store,
        &template_name_stream(&TeamId::parse("acme").unwrap(), "corp-x"),
    )
    .await
    .unwrap();
    assert_eq!((acme.version, acme.state.holder), (1, Some(t2)));

    let streams: Vec<(String, i64)> =
        sqlx::query_as("SELECT stream_id, version FROM streams ORDER BY stream_id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let mut expected: Vec<(String, i64)> = vec![
        ("template-tplacme".into(), 1),
        ("template-tplcorp".into(), 1),
        ("templatename-acme-corp:x".into(), 2),
        ("templatename-acme:corp-x".into(), 1),
    ];
    expected.extend(others.iter().map(|(_, new)| (new.clone(), 1)));
    expected.sort();
    assert_eq!(streams, expected);

    let catalog: Vec<(String, String, i64, i64)> = sqlx::query_as(
        "SELECT stream_id, category, version, event_count FROM stream_catalog ORDER BY stream_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let expected_catalog: Vec<(String, String, i64, i64)> = expected
        .iter()
        .map(|(id, v)| (id.clone(), id.split('-').next().unwrap().into(), *v, *v))
        .collect();
    assert_eq!(catalog, expected_catalog);
    // The projection goes on from its checkpoint without counting a moved event twice.
    assert_eq!(runner.catch_up().await.unwrap(), 0);
}
