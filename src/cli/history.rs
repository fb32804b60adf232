//! `strata history STREAM`: a stream's audit history as a table, read straight from Postgres.
//! `strata history build ID`: a build's whole timeline: its `build-{id}` stream and the
//! promotion outbox of every attempt (`promotion-{id}:{epoch}`), merged in commit order, with
//! the stream of each event.

use anyhow::Context;
use clap::Args;
use strata::config::StorageArgs;
use strata::events::{RecordedEvent, StreamId};

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Stream id, e.g. `build-0191c0de…` or `template-abc`; or `build` followed by a build id
    /// for the build's whole timeline (its stream and its promotion streams).
    stream: String,
    /// With `build`: the build id (a UUID).
    id: Option<String>,
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
    if let Some(id) = &args.id {
        if args.stream != "build" {
            anyhow::bail!(
                "unexpected argument {id:?}: only `strata history build <build id>` takes a second argument"
            );
        }
        let build = uuid::Uuid::parse_str(id)
            .with_context(|| format!("{id:?} is not a build id (a UUID)"))?;
        return build_timeline(&args, build).await;
    }
    let stream = StreamId::parse(&args.stream)?;
    let pool = super::connect_database(&args.storage).await?;
    let store = strata::app::event_store(pool);
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
    print!("{}", render_table(&events, false));
    Ok(())
}

/// The build stream and its promotion streams, merged by position.
async fn build_timeline(args: &HistoryArgs, build: uuid::Uuid) -> anyhow::Result<()> {
    let pool = super::connect_database(&args.storage).await?;
    let mut streams = vec![format!("build-{build}")];
    let store = strata::app::event_store(pool);
    let promotions = store
        .streams_with_prefix(&format!("promotion-{build}:"))
        .await
        .context("listing the build's promotion streams")?;
    streams.extend(promotions);
    let mut events = Vec::new();
    for name in &streams {
        let stream = StreamId::parse(name)?;
        events.extend(
            store
                .read_stream_all(&stream)
                .await
                .with_context(|| format!("reading stream {stream}"))?,
        );
    }
    if events.is_empty() {
        anyhow::bail!("build {build} has no events (check the id: `strata history build <uuid>`)");
    }
    events.sort_by_key(|e| e.position);
    let events: Vec<RecordedEvent> = events
        .into_iter()
        .filter(|e| e.version >= args.from_version)
        .take(args.limit as usize)
        .collect();
    if args.json {
        for event in &events {
            println!("{}", serde_json::to_string(event)?);
        }
        return Ok(());
    }
    print!("{}", render_table(&events, true));
    Ok(())
}

/// Columns: position, [stream,] version, time, type, actor, epoch, data (shortened).
fn render_table(events: &[RecordedEvent], with_stream: bool) -> String {
    let mut header = vec!["POSITION"];
    if with_stream {
        header.push("STREAM");
    }
    header.extend(["VERSION", "TIME (UTC)", "TYPE", "ACTOR", "EPOCH", "DATA"]);
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            let mut row = vec![e.position.to_string()];
            if with_stream {
                row.push(e.stream_id.to_string());
            }
            row.extend([
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
                shorten(&e.data.to_string(), if with_stream { 100 } else { 60 }),
            ]);
            row
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths.iter().copied())
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
    line(&header.iter().map(|h| h.to_string()).collect::<Vec<_>>());
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
        let table = render_table(&[event], false);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("POSITION  VERSION  TIME (UTC)"));
        assert!(lines[1].starts_with(
            "12        3        2026-01-02 03:04:05.678  AttemptAcquired.v1  worker/node-a  2"
        ));
        assert!(lines[1].ends_with('…'));
    }
}
