//! `strata history STREAM`: a stream's audit history as a table, read straight from Postgres.

use anyhow::Context;
use clap::Args;
use strata::config::StorageArgs;
use strata::events::{EventStore, RecordedEvent, StreamId};

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Stream id, e.g. `build-0191c0de…` or `template-abc`.
    stream: String,
    /// First version to show.
    #[arg(long, default_value_t = 1)]
    from_version: u64,
    /// Most events to show.
    #[arg(long, default_value_t = 1000)]
    limit: u32,
    /// Print the raw events as JSON, one per line.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    storage: StorageArgs,
}

pub async fn run(args: HistoryArgs) -> anyhow::Result<()> {
    let stream = StreamId::parse(&args.stream)?;
    let pool = super::connect_database(&args.storage).await?;
    let store = EventStore::new(pool);
    let events = store
        .read_stream(&stream, args.from_version.max(1), args.limit)
        .await
        .with_context(|| format!("reading stream {stream}"))?;
    if args.json {
        for event in &events {
            println!("{}", serde_json::to_string(event)?);
        }
        return Ok(());
    }
    if events.is_empty() {
        let version = store.stream_version(&stream).await?;
        if version == 0 {
            anyhow::bail!("stream {stream} has no events (check the id with GET /admin/streams)");
        }
        println!(
            "stream {stream} is at version {version}; no events from version {}",
            args.from_version
        );
        return Ok(());
    }
    print!("{}", render_table(&events));
    Ok(())
}

/// Columns: position, version, time, type, actor, epoch, data (shortened).
fn render_table(events: &[RecordedEvent]) -> String {
    let header = [
        "POSITION",
        "VERSION",
        "TIME (UTC)",
        "TYPE",
        "ACTOR",
        "EPOCH",
        "DATA",
    ];
    let rows: Vec<[String; 7]> = events
        .iter()
        .map(|e| {
            [
                e.position.to_string(),
                e.version.to_string(),
                e.recorded_at.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
                e.event_type.clone(),
                format!(
                    "{}/{}",
                    e.metadata.actor.role.as_str(),
                    e.metadata.actor.node
                ),
                e.metadata
                    .epoch
                    .map_or_else(|| "-".to_string(), |n| n.to_string()),
                shorten(&e.data.to_string(), 60),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i + 1 == cells.len() {
                    c.clone()
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        out.push_str(padded.join("  ").trim_end());
        out.push('\n');
    };
    line(&header.map(String::from));
    for row in &rows {
        line(row);
    }
    out
}

fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut short: String = s.chars().take(max - 1).collect();
        short.push('…');
        short
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata::events::{Actor, ActorRole, Metadata};

    #[test]
    fn renders_aligned_columns_and_shortens_data() {
        let event = RecordedEvent {
            position: 12,
            stream_id: StreamId::parse("build-1").unwrap(),
            version: 3,
            event_id: uuid::Uuid::nil(),
            event_type: "AttemptAcquired.v1".into(),
            data: serde_json::json!({"note": "x".repeat(100)}),
            metadata: Metadata::new(Actor::new(ActorRole::Worker, "node-a")).with_epoch(2),
            recorded_at: "2026-01-02T03:04:05.678Z".parse().unwrap(),
            tx_id: 900,
        };
        let table = render_table(&[event]);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("POSITION  VERSION  TIME (UTC)"));
        assert!(lines[1].starts_with(
            "12        3        2026-01-02 03:04:05.678  AttemptAcquired.v1  worker/node-a  2"
        ));
        assert!(lines[1].ends_with('…'));
    }
}
