//! `strata build`: a Dockerfile and its context to a template, over a strata server's HTTP API
//! (local or remote), the way `docker build -t name .` is typed.
//!
//! Everything that can be refused is refused before the first request: the Dockerfile is parsed
//! and planned (`domain::dockerfile`), every COPY's files are selected and hashed exactly as the
//! SDK selects and hashes them (`build_context`). Then the SDK's calls, in the SDK's order:
//! register, one upload link per COPY (uploading only what the server lacks), start, and the
//! status log followed to its end.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use serde_json::{json, Value};
use strata::build_context::{
    files_hash, load_ignore_file, select_files, validate_source, write_archive,
};
use strata::domain::dockerfile::{self, BuildPlan, PlanOptions, StagePlan, StepKind};

use super::build_client::{BuildClient, Registered};

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The build context: the directory COPY sources are relative to, and where .dockerignore
    /// is read.
    context: PathBuf,
    /// The Dockerfile (default: CONTEXT/Dockerfile).
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
    /// The template's name, optionally with a tag (NAME:TAG). Repeat to add tags to the same
    /// name. Default: the context directory's name.
    #[arg(short = 't', long = "tag")]
    tags: Vec<String>,
    /// Sets an ARG the Dockerfile declares (K=V). Repeatable.
    #[arg(long = "build-arg", value_parser = parse_build_arg)]
    build_args: Vec<(String, String)>,
    /// The stage to build (FROM … AS STAGE); default the last.
    #[arg(long)]
    target: Option<String>,
    /// Run every step again instead of resuming from the cache.
    #[arg(long)]
    no_cache: bool,
    /// vCPUs for the template's sandboxes.
    #[arg(long)]
    cpu: Option<u32>,
    /// Memory for the template's sandboxes, in MiB.
    #[arg(long)]
    memory_mb: Option<u32>,
    /// `plain`: every log line; `quiet`: only the template id on success; `auto` is `plain`.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    progress: ProgressMode,
    /// The strata server (else E2B_API_URL, as the SDK reads it, else http://127.0.0.1:3000).
    #[arg(long, env = "STRATA_URL")]
    url: Option<String>,
    /// A team's API key (`strata keys create`).
    #[arg(long, env = "E2B_API_KEY", hide_env_values = true)]
    api_key: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ProgressMode {
    Auto,
    Plain,
    Quiet,
}

fn parse_build_arg(text: &str) -> Result<(String, String), String> {
    let (k, v) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not K=V"))?;
    if k.is_empty() {
        return Err(format!("{text:?} names no ARG"));
    }
    Ok((k.to_string(), v.to_string()))
}

/// A planned COPY with the hash of what it selects.
struct CopyStep {
    index: usize,
    src: String,
    hash: String,
}

pub async fn run(args: BuildArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let quiet = args.progress == ProgressMode::Quiet;
    let context = args.context.as_path();
    if !context.is_dir() {
        bail!("the build context {} is not a directory", context.display());
    }
    let dockerfile_path = args
        .file
        .clone()
        .unwrap_or_else(|| context.join("Dockerfile"));
    let text = std::fs::read_to_string(&dockerfile_path)
        .with_context(|| format!("reading {}", dockerfile_path.display()))?;
    let (name, tags) = template_name(&args.tags, context)?;
    let plans = plan_dockerfile(&text, &args, context)
        .map_err(|e| anyhow::anyhow!("{}: {e}", dockerfile_path.display()))?;
    for warning in plans.iter().flat_map(|p| &p.plan.warnings) {
        eprintln!("warning: {warning}");
    }
    let ignore_file = ignore_file_for(&dockerfile_path, context);
    let mut builds = Vec::new();
    for (position, stage) in plans.iter().enumerate() {
        let last = position + 1 == plans.len();
        builds.push(StageBuild {
            stage,
            copies: hash_copies(context, &ignore_file, &stage.plan)?,
            template: if last {
                name.clone()
            } else {
                stage_template(&name, stage)
            },
            tags: if last { tags.clone() } else { Vec::new() },
            label: (plans.len() > 1 && !last).then(|| format!("[{}] ", stage_label(stage))),
        });
    }
    let templates: BTreeMap<usize, String> = builds
        .iter()
        .map(|b| (b.stage.index, b.template.clone()))
        .collect();

    let url = args
        .url
        .clone()
        .or_else(|| std::env::var("E2B_API_URL").ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "http://127.0.0.1:3000".to_string());
    let client = BuildClient::new(&url, &args.api_key)?;
    let shared = Shared {
        client: &client,
        context,
        dockerfile: &dockerfile_path,
        ignore_file: &ignore_file,
        templates: &templates,
        args: &args,
        quiet,
    };
    // Stages that need nothing from each other build at once; a stage starts once every stage
    // it builds on or copies from is ready.
    let mut done: Vec<usize> = Vec::new();
    let mut final_id = None;
    while done.len() < builds.len() {
        let ready: Vec<&StageBuild> = builds
            .iter()
            .filter(|b| !done.contains(&b.stage.index))
            .filter(|b| needs(&b.stage.plan).iter().all(|n| done.contains(n)))
            .collect();
        if ready.is_empty() {
            bail!(
                "the stages of {} wait on each other",
                dockerfile_path.display()
            );
        }
        let registered =
            futures::future::try_join_all(ready.iter().map(|b| shared.build(b))).await?;
        done.extend(ready.iter().map(|b| b.stage.index));
        if done.len() == builds.len() {
            final_id = registered.last().map(|r| r.template_id.clone());
        }
    }
    let target = &plans.last().expect("a plan per target").plan;
    let final_id = final_id.expect("the target built");
    if quiet {
        println!("{final_id}");
        return Ok(());
    }
    for recorded in &target.recorded {
        println!(
            "note: {} {} (line {}) is recorded, not applied",
            recorded.instruction,
            recorded.values.join(" "),
            recorded.line
        );
    }
    println!(
        "built {name} (template {final_id}) in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One stage's build: its plan, its hashed COPYs, and the template it becomes.
struct StageBuild<'a> {
    stage: &'a StagePlan,
    copies: Vec<CopyStep>,
    template: String,
    tags: Vec<String>,
    /// `[build] ` before each line of a stage other than the target, when there are several.
    label: Option<String>,
}

/// What every stage's build shares.
struct Shared<'a> {
    client: &'a BuildClient,
    context: &'a Path,
    dockerfile: &'a Path,
    ignore_file: &'a Path,
    /// Each stage's template, by stage index.
    templates: &'a BTreeMap<usize, String>,
    args: &'a BuildArgs,
    quiet: bool,
}

impl Shared<'_> {
    /// Registers, uploads what the server lacks, starts and follows one stage's build.
    async fn build(&self, build: &StageBuild<'_>) -> anyhow::Result<Registered> {
        let (client, context, plan) = (self.client, self.context, &build.stage.plan);
        let label = build.label.as_deref().unwrap_or("");
        let say = |line: &str| {
            if !self.quiet {
                println!("{label}{line}");
            }
        };
        let registered = client
            .register(
                &build.template,
                &build.tags,
                self.args.cpu,
                self.args.memory_mb,
            )
            .await?;
        let base = match plan.from_stage {
            Some(stage) => &self.templates[&stage],
            None => &plan.from_image,
        };
        say(&format!(
            "building {} (template {}, build {}) from {base}",
            build.template, registered.template_id, registered.build_id
        ));
        for copy in &build.copies {
            let link = client
                .upload_link(&registered.template_id, &copy.hash)
                .await?;
            if link.present {
                continue;
            }
            let files = select_files(
                context,
                &copy.src,
                &load_ignore_file(context, self.ignore_file, &[])?,
            )?;
            let archive = tempfile::NamedTempFile::new().context("creating a temporary archive")?;
            let bytes = {
                let (context, out) = (context.to_path_buf(), archive.reopen()?);
                tokio::task::spawn_blocking(move || write_archive(&context, &files, out)).await??
            };
            say(&format!(
                "uploading {} ({})",
                copy.src,
                strata::metrics::storage::human_bytes(bytes)
            ));
            client.upload(&link, archive.path()).await?;
        }
        let spec = start_request(plan, &build.copies, self.templates, self.args.no_cache);
        client.start(&registered, spec).await?;
        let failure = follow(client, &registered, plan, label, self.quiet).await?;
        if let Some((message, step)) = failure {
            bail!(
                "{label}{}",
                failure_text(plan, self.dockerfile, &message, step.as_deref())
            );
        }
        Ok(registered)
    }
}

/// The stages a stage's build waits for: the one it builds on and those it copies from.
fn needs(plan: &BuildPlan) -> Vec<usize> {
    plan.from_stage
        .into_iter()
        .chain(plan.steps.iter().filter_map(|s| match s.kind {
            StepKind::CopyFrom { stage, .. } => Some(stage),
            _ => None,
        }))
        .collect()
}

fn stage_label(stage: &StagePlan) -> String {
    stage
        .name
        .clone()
        .unwrap_or_else(|| format!("stage {}", stage.index))
}

/// `app:v1`'s stage `build` is the template `app.stage-build`: built and cached as its own
/// template, in the same team, so a later build of the same Dockerfile finds it unchanged.
fn stage_template(name: &str, stage: &StagePlan) -> String {
    let base = name.split_once(':').map_or(name, |(n, _)| n);
    let stage_name = stage
        .name
        .clone()
        .unwrap_or_else(|| stage.index.to_string());
    format!("{base}.stage-{stage_name}")
}

fn plan_dockerfile(
    text: &str,
    args: &BuildArgs,
    context: &Path,
) -> Result<Vec<StagePlan>, dockerfile::DockerfileError> {
    let file = dockerfile::parse(text)?;
    let options = PlanOptions {
        build_args: args.build_args.iter().cloned().collect::<BTreeMap<_, _>>(),
        target: args.target.clone(),
        // A walk of the whole context, needed only to place a `--chown`'s new directories.
        context_directories: if file.has_chown() {
            context_directories(context)
        } else {
            Default::default()
        },
    };
    dockerfile::plan(&file, &options)
}

/// Every directory under the context, relative (`app`, `app/lib`); links are not followed.
fn context_directories(context: &Path) -> std::collections::BTreeSet<String> {
    let mut found = std::collections::BTreeSet::new();
    let mut pending = vec![context.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                let path = entry.path();
                if let Some(relative) = path.strip_prefix(context).ok().and_then(|p| p.to_str()) {
                    found.insert(relative.to_string());
                }
                pending.push(path);
            }
        }
    }
    found
}

/// `-t a:1 -t a:2` is template `a:1` with the extra tag `2`. strata names one template per
/// build, so every `-t` must share the name.
fn template_name(tags: &[String], context: &Path) -> anyhow::Result<(String, Vec<String>)> {
    let Some(first) = tags.first() else {
        let dir = std::fs::canonicalize(context)?;
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .map(|n| n.to_ascii_lowercase())
            .context("the context directory has no name to use: give one with -t NAME")?;
        return Ok((name, Vec::new()));
    };
    let base = |t: &str| {
        t.split_once(':')
            .map_or(t.to_string(), |(n, _)| n.to_string())
    };
    let name = base(first);
    let mut extra = Vec::new();
    for tag in &tags[1..] {
        if base(tag) != name {
            bail!("-t {tag}: every -t must name the same template as the first ({name}); build once per name");
        }
        match tag.split_once(':') {
            Some((_, t)) => extra.push(t.to_string()),
            None => extra.push("default".into()),
        }
    }
    Ok((first.clone(), extra))
}

/// BuildKit's rule: `<Dockerfile>.dockerignore` beside the Dockerfile, when there is one, takes
/// the place of the context's `.dockerignore` (so two Dockerfiles can share a context).
fn ignore_file_for(dockerfile: &Path, context: &Path) -> PathBuf {
    let mut name = dockerfile.file_name().unwrap_or_default().to_os_string();
    name.push(".dockerignore");
    let beside = dockerfile.with_file_name(name);
    if beside.is_file() {
        beside
    } else {
        context.join(".dockerignore")
    }
}

/// Selects and hashes every COPY's files, as the SDK does before its first request.
fn hash_copies(
    context: &Path,
    ignore_file: &Path,
    plan: &BuildPlan,
) -> anyhow::Result<Vec<CopyStep>> {
    let ignore = load_ignore_file(context, ignore_file, &[])?;
    let mut copies = Vec::new();
    for (index, step) in plan.steps.iter().enumerate() {
        if let StepKind::Copy { src, dest, .. } = &step.kind {
            let line = step.line.unwrap_or_default();
            validate_source(src).with_context(|| format!("Dockerfile line {line}"))?;
            let hash = files_hash(context, src, dest, &ignore)
                .with_context(|| format!("Dockerfile line {line}"))?;
            copies.push(CopyStep {
                index,
                src: src.clone(),
                hash,
            });
        }
    }
    Ok(copies)
}

/// The start request's body (PROTOCOL.md §1.4).
fn start_request(
    plan: &BuildPlan,
    copies: &[CopyStep],
    templates: &BTreeMap<usize, String>,
    force: bool,
) -> Value {
    let steps: Vec<Value> = plan
        .steps
        .iter()
        .enumerate()
        .map(|(index, step)| {
            let (kind, args): (&str, Vec<String>) = match &step.kind {
                StepKind::Run { command, user } => (
                    "RUN",
                    std::iter::once(command.clone())
                        .chain(user.clone())
                        .collect(),
                ),
                StepKind::Copy {
                    src,
                    dest,
                    chown,
                    chmod,
                } => (
                    "COPY",
                    vec![src.clone(), dest.clone(), chown.clone(), chmod.clone()],
                ),
                StepKind::Env(pairs) => (
                    "ENV",
                    pairs
                        .iter()
                        .flat_map(|(k, v)| [k.clone(), v.clone()])
                        .collect(),
                ),
                StepKind::Workdir(path) => ("WORKDIR", vec![path.clone()]),
                StepKind::User(user) => ("USER", vec![user.clone()]),
                // strata's extension of the start request (ADR 0029).
                StepKind::CopyFrom {
                    stage,
                    src,
                    dest,
                    chown,
                    chmod,
                } => (
                    "COPY_FROM",
                    vec![
                        templates[stage].clone(),
                        src.clone(),
                        dest.clone(),
                        chown.clone(),
                        chmod.clone(),
                    ],
                ),
            };
            let mut value = json!({ "type": kind, "args": args, "force": force });
            if let Some(copy) = copies.iter().find(|c| c.index == index) {
                value["filesHash"] = json!(copy.hash);
            }
            value
        })
        .collect();
    let mut body = match plan.from_stage {
        Some(stage) => json!({ "fromTemplate": templates[&stage], "force": force, "steps": steps }),
        None => json!({ "fromImage": plan.from_image, "force": force, "steps": steps }),
    };
    if let Some(start) = &plan.start_cmd {
        body["startCmd"] = json!(start);
    }
    if let Some(ready) = &plan.ready_cmd {
        body["readyCmd"] = json!(ready);
    }
    body
}

/// Follows the log to the end (draining after the terminal status, as the SDK does); returns
/// the failure's reason and step when the build failed.
async fn follow(
    client: &BuildClient,
    registered: &Registered,
    plan: &BuildPlan,
    label: &str,
    quiet: bool,
) -> anyhow::Result<Option<(String, Option<String>)>> {
    let mut offset = 0;
    let mut clock = StepClock::default();
    let mut show = |entries: &[crate::cli::build_client::LogEntry]| {
        if quiet {
            return;
        }
        for entry in entries {
            if let Some(done) = clock.observe(plan, entry) {
                println!("{label}{done}");
            }
            println!(
                "{label}{}",
                display_line(plan, &entry.message, entry.step.as_deref())
            );
        }
    };
    loop {
        let page = client.status(registered, offset).await?;
        offset += page.entries.len();
        show(&page.entries);
        match page.status.as_str() {
            "ready" | "error" => {
                let mut last = page.entries.len();
                while last > 0 {
                    let more = client.status(registered, offset).await?;
                    offset += more.entries.len();
                    last = more.entries.len();
                    show(&more.entries);
                }
                return Ok((page.status == "error").then(|| {
                    page.reason
                        .unwrap_or_else(|| ("the build failed".to_string(), None))
                }));
            }
            _ if page.entries.is_empty() => {
                // The server holds a status request until there is news; one that answers at
                // once with nothing new is polled at the SDK's pace.
                tokio::time::sleep(std::time::Duration::from_millis(200)).await
            }
            _ => {}
        }
    }
}

/// Times each executed step on the server's clock, from its `[n/N]` header to the first entry
/// of anything else, and says `[n/N] DONE 1.25 s` as Docker's plain progress does. A CACHED
/// step took no time and gets no line.
#[derive(Default)]
struct StepClock {
    open: Option<(String, chrono::DateTime<chrono::Utc>)>,
}

impl StepClock {
    fn observe(
        &mut self,
        plan: &BuildPlan,
        entry: &crate::cli::build_client::LogEntry,
    ) -> Option<String> {
        let at = entry.timestamp?;
        let header = entry.step.as_deref().filter(|step| {
            step.parse::<usize>().is_ok()
                && entry
                    .message
                    .starts_with(&format!("[{step}/{}] ", plan.steps.len()))
        });
        let same_step = matches!(
            (&self.open, entry.step.as_deref()),
            (Some((open, _)), Some(step)) if open == step
        );
        if same_step && header.is_none() {
            return None;
        }
        let done = self.open.take().map(|(step, started)| {
            let seconds = (at - started).num_milliseconds().max(0) as f64 / 1000.0;
            format!("[{step}/{}] DONE {seconds:.2} s", plan.steps.len())
        });
        if let Some(step) = header {
            let cached = entry.message.contains("] CACHED ");
            if !cached {
                self.open = Some((step.to_string(), at));
            }
        }
        done
    }
}

/// The server's `[n/N] RUN <args>` header shows the step as sent (ARGs exported, heredocs
/// inlined); the user wrote the Dockerfile's line, so that is what is shown.
fn display_line(plan: &BuildPlan, message: &str, step: Option<&str>) -> String {
    let Some(step) = step.and_then(|s| s.parse::<usize>().ok()) else {
        return message.to_string();
    };
    let Some(planned) = plan.steps.get(step.wrapping_sub(1)) else {
        return message.to_string();
    };
    let prefix = format!("[{step}/{}] ", plan.steps.len());
    match message.strip_prefix(&prefix) {
        Some(rest) if rest.starts_with("CACHED ") => format!("{prefix}CACHED {}", planned.summary),
        Some(_) => format!("{prefix}{}", planned.summary),
        None => message.to_string(),
    }
}

/// `Dockerfile:7: RUN make: <the server's reason>`.
fn failure_text(plan: &BuildPlan, path: &Path, message: &str, step: Option<&str>) -> String {
    let located = step
        .and_then(|s| s.parse::<usize>().ok())
        .and_then(|n| plan.steps.get(n.wrapping_sub(1)));
    match (located, step) {
        (Some(planned), _) => match planned.line {
            Some(line) => format!(
                "{}:{line}: {} failed: {message}",
                path.display(),
                planned.summary
            ),
            None => format!("{} failed: {message}", planned.summary),
        },
        (None, Some("base")) => format!("FROM {} failed: {message}", plan.from_image),
        (None, Some("finalize")) => format!(
            "the start command ({}) or ready command ({}) failed: {message}",
            plan.start_cmd.as_deref().unwrap_or("none"),
            plan.ready_cmd.as_deref().unwrap_or("none")
        ),
        _ => format!("the build failed: {message}"),
    }
}
