//! `strata gc` and `strata storage`: one garbage-collection pass on demand (or its plan, with
//! `--dry-run`), and the blob store's usage by class.

use anyhow::Context;
use clap::Args;
use strata::config::{GcArgs, NodeArgs, StorageArgs};
use strata::metrics::storage::human_bytes;
use strata::reconcilers::gc::{self, PassOptions, Report, Usage};

/// Where GC looks and by which rules: shared by `strata gc` and `strata storage`.
#[derive(Debug, Args)]
struct Target {
    #[command(flatten)]
    storage: StorageArgs,
    #[command(flatten)]
    node: NodeArgs,
    #[command(flatten)]
    gc: GcArgs,
}

impl Target {
    async fn environment(&self) -> anyhow::Result<strata::reconcilers::ReconcileEnv> {
        let pool = super::connect_database(&self.storage).await?;
        super::reconcile::environment(pool, self.node.node_id(), &self.storage, &self.gc)
    }
}

#[derive(Debug, Args)]
pub struct GcCliArgs {
    #[command(flatten)]
    target: Target,
    /// Print what would be deleted and why, by tier, with sizes; delete nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct StorageCliArgs {
    #[command(flatten)]
    target: Target,
    /// Print the usage as JSON.
    #[arg(long)]
    json: bool,
}

pub async fn run_gc(args: GcCliArgs) -> anyhow::Result<()> {
    let env = args.target.environment().await?;
    let options = PassOptions {
        dry_run: args.dry_run,
        ..PassOptions::default()
    };
    let report = gc::pass(&env, &env.gc, &options)
        .await
        .context("the GC pass failed; nothing more was deleted")?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report_json(&report, args.dry_run))?
        );
    } else {
        print!("{}", report_text(&report, args.dry_run));
    }
    Ok(())
}

pub async fn run_storage(args: StorageCliArgs) -> anyhow::Result<()> {
    let env = args.target.environment().await?;
    let usage = gc::usage(&env, &env.gc)
        .await
        .context("reading the blob store and its references")?;
    let node_layers = strata::metrics::storage::usage(&args.target.storage.data_dir)
        .into_iter()
        .find(|u| u.kind == "layers")
        .map_or(0, |u| u.bytes);
    if args.json {
        let classes: serde_json::Map<String, serde_json::Value> = usage
            .iter()
            .map(|(k, u)| {
                (
                    k.clone(),
                    serde_json::json!({"objects": u.objects, "bytes": u.bytes}),
                )
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "store": env.blobs.describe(),
                "budget": env.gc.budget,
                "classes": classes,
                "node": {"id": args.target.node.node_id(), "layer_cache_bytes": node_layers},
            }))?
        );
        return Ok(());
    }
    println!("blob store {}", env.blobs.describe());
    print!("{}", usage_table(&usage, env.gc.budget));
    println!(
        "node {}: extracted layers {}",
        args.target.node.node_id(),
        human_bytes(node_layers)
    );
    Ok(())
}

fn usage_table(usage: &std::collections::BTreeMap<String, Usage>, budget: Option<u64>) -> String {
    let mut out = format!("{:<24} {:>9} {:>12}\n", "CLASS", "OBJECTS", "SIZE");
    let mut total = Usage::default();
    for (class, u) in usage {
        out += &format!(
            "{:<24} {:>9} {:>12}\n",
            class,
            u.objects,
            human_bytes(u.bytes)
        );
        total.objects += u.objects;
        total.bytes += u.bytes;
    }
    out += &format!(
        "{:<24} {:>9} {:>12}\n",
        "total",
        total.objects,
        human_bytes(total.bytes)
    );
    if let Some(b) = budget {
        out += &format!(
            "budget {} ({:.0}% used)\n",
            human_bytes(b),
            100.0 * total.bytes as f64 / b.max(1) as f64
        );
    }
    out
}

fn report_text(report: &Report, dry_run: bool) -> String {
    let mut out = format!(
        "GC pass {}{}\n",
        report.pass,
        if dry_run {
            " (dry run: nothing deleted)"
        } else {
            ""
        }
    );
    out += &usage_table(&report.usage, None);
    if report.planned.is_empty() {
        out += "nothing to delete\n";
    } else {
        out += &format!("{:<22} {:>10}  {:<71} WHY\n", "TIER", "SIZE", "OBJECT");
        for p in &report.planned {
            out += &format!(
                "{:<22} {:>10}  {:<71} {}{}\n",
                p.tier.name(),
                human_bytes(p.size),
                p.digest.to_string(),
                p.why,
                p.last_referenced_by
                    .as_deref()
                    .map(|r| format!(" (last referenced by {r})"))
                    .unwrap_or_default()
            );
        }
    }
    let planned: u64 = report.planned.iter().map(|p| p.size).sum();
    out += &format!(
        "store {} before; plan frees {} ({} objects){}\n",
        human_bytes(report.total_before),
        human_bytes(planned),
        report.planned.len(),
        if report.over_budget_by > 0 {
            format!(
                "; still over budget by {}",
                human_bytes(report.over_budget_by)
            )
        } else {
            String::new()
        }
    );
    if !dry_run {
        out += &format!(
            "deleted {} objects ({}); kept {}; removed {} stale temporary files and {} quarantined blobs\n",
            report.deleted.len(),
            human_bytes(report.deleted_bytes()),
            report.kept.len(),
            report.temporary_removed,
            report.quarantine_removed
        );
        for (digest, why) in &report.kept {
            out += &format!("  kept {digest}: {why}\n");
        }
    }
    out
}

fn report_json(report: &Report, dry_run: bool) -> serde_json::Value {
    let planned = |p: &gc::Planned| {
        serde_json::json!({
            "digest": p.digest.to_string(),
            "size": p.size,
            "tier": p.tier.name(),
            "why": p.why,
            "last_referenced_by": p.last_referenced_by,
        })
    };
    serde_json::json!({
        "pass": report.pass,
        "dry_run": dry_run,
        "total_before": report.total_before,
        "total_after_plan": report.total_after_plan,
        "over_budget_by": report.over_budget_by,
        "usage": report.usage.iter().map(|(k, u)| (k.clone(), serde_json::json!({"objects": u.objects, "bytes": u.bytes}))).collect::<serde_json::Map<_, _>>(),
        "planned": report.planned.iter().map(planned).collect::<Vec<_>>(),
        "deleted": report.deleted.iter().map(planned).collect::<Vec<_>>(),
        "kept": report.kept.iter().map(|(d, why)| serde_json::json!({"digest": d.to_string(), "why": why})).collect::<Vec<_>>(),
        "temporary_removed": report.temporary_removed,
        "quarantine_removed": report.quarantine_removed,
    })
}
