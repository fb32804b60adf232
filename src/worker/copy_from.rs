//! COPY_FROM, strata's step for a multi-stage Dockerfile's `COPY --from=<stage>`: the files come
//! out of another template of the team on the node, never through the client (ADR 0029).
//!
//! Each source is resolved once per attempt, before the cache is consulted, to the stack it
//! copies out of (the template's build base: its steps' filesystem, before finalization), and
//! keyed by that stack's content, as a `fromTemplate` base is. At the step, a sandbox boots on
//! the source with no network, the agent inside it archives the path (so every path and symlink
//! resolves in the source's own root), and the archive is copied in with COPY's semantics.

use std::collections::BTreeMap;

use tokio::io::AsyncWriteExt;

use super::attempt::Attempt;
use super::error::WorkerError;
use super::executor::StepFailure;
use super::layer_hold::{self, Held};
use super::template_lookup::{self, Checkpoint, LookupError};
use crate::domain::build::FailedStep;
use crate::domain::build_spec::Step;
use crate::domain::cache_key::{stack_identity, BaseIdentity};
use crate::domain::ids::{Digest, TeamId};
use crate::events::EventStore;
use crate::vmm::process::{AgentEnd, FsRequest};
use crate::vmm::{BootSpec, Limits, Network, SandboxBackend};

/// The stack one COPY_FROM template names.
#[derive(Debug, Clone)]
pub struct CopySource {
    /// The source's Ready build whose stack is read: named in the build log.
    pub build: crate::domain::ids::BuildId,
    pub layers: Vec<Digest>,
    /// The stack's content identity: what the step's cache key takes.
    pub identity: Digest,
}

/// Every COPY_FROM source of `steps`, by template reference. A source that does not resolve
/// fails the build at the first step naming it.
pub async fn resolve_all(
    store: &EventStore,
    team: &TeamId,
    steps: &[Step],
) -> Result<Result<BTreeMap<String, CopySource>, StepFailure>, WorkerError> {
    let mut sources = BTreeMap::new();
    for (i, step) in steps.iter().enumerate() {
        let Step::CopyFrom { template, .. } = step else {
            continue;
        };
        if sources.contains_key(template) {
            continue;
        }
        let found =
            match template_lookup::resolve(store, team, template, Checkpoint::BuildBase).await {
                Ok(found) => found,
                Err(LookupError::NotFound(m)) => {
                    return Ok(Err(StepFailure {
                        step: FailedStep::Step(i as u32 + 1),
                        message: format!("COPY_FROM {template}: {m}"),
                    }))
                }
                Err(LookupError::Worker(e)) => return Err(e),
            };
        let BaseIdentity::Stack { digest } =
            stack_identity(&found.record.layers, &found.record.context)
        else {
            unreachable!("stack_identity returns a stack")
        };
        sources.insert(
            template.clone(),
            CopySource {
                build: found.build,
                layers: found.record.layers.clone(),
                identity: digest,
            },
        );
    }
    Ok(Ok(sources))
}

/// The content identities [`crate::domain::cache_key::key_chain_with_sources`] takes.
pub fn identities(sources: &BTreeMap<String, CopySource>) -> BTreeMap<String, Digest> {
    sources
        .iter()
        .map(|(t, s)| (t.clone(), s.identity))
        .collect()
}

/// What a COPY --from step reads: `path` in the template `template` resolved to `source`.
pub struct From<'a> {
    pub template: &'a str,
    pub source: &'a CopySource,
    pub path: &'a str,
}

/// Archives `from` into a temporary file under `tmp_dir`, at most `max_bytes`, in a sandbox
/// under `limits` (the build's: the source's tree is a tenant's, however trusted the agent
/// that reads it) with no network. `Err` is the step's failure reason.
pub async fn archive(
    backend: &dyn SandboxBackend,
    attempt: &Attempt,
    from: From<'_>,
    limits: Limits,
    tmp_dir: &std::path::Path,
    max_bytes: u64,
) -> Result<Result<tempfile::NamedTempFile, String>, WorkerError> {
    let From {
        template,
        source,
        path,
    } = from;
    if let Held::Refused(e) = layer_hold::lease(attempt, &source.layers, &[]).await? {
        return Ok(Err(format!(
            "a layer of template {template} is being deleted ({e}); build {template} again"
        )));
    }
    let mut spec = BootSpec::new(source.layers.clone());
    spec.limits = Limits {
        network: Network::None,
        ..limits
    };
    let sandbox = match backend.boot(spec).await {
        Ok(s) => s,
        Err(e) => {
            return Ok(Err(format!(
                "booting a sandbox on template {template}: {e}"
            )))
        }
    };
    let request = FsRequest::Archive {
        path: path.to_owned(),
    };
    let copied = match sandbox.file_op(request, Some("root".into())) {
        Ok(io) => read_archive(io, tmp_dir, max_bytes).await,
        Err(e) => Err(format!("starting the archive: {e}")),
    };
    if let Err(e) = sandbox.destroy().await {
        tracing::warn!(error = %e, "destroying the COPY_FROM source sandbox failed");
    }
    Ok(copied.map_err(|m| format!("{path} in template {template}: {m}")))
}

async fn read_archive(
    io: crate::vmm::process::AgentIo,
    tmp_dir: &std::path::Path,
    max_bytes: u64,
) -> Result<tempfile::NamedTempFile, String> {
    std::fs::create_dir_all(tmp_dir).map_err(|e| format!("creating {}: {e}", tmp_dir.display()))?;
    let file = tempfile::NamedTempFile::new_in(tmp_dir)
        .map_err(|e| format!("creating a temporary file: {e}"))?;
    let crate::vmm::process::AgentIo {
        stdin,
        stdout,
        mut status,
        ..
    } = io;
    drop(stdin);
    let mut out = tokio::fs::File::from_std(
        file.reopen()
            .map_err(|e| format!("opening a temporary file: {e}"))?,
    );
    let mut limited = tokio::io::AsyncReadExt::take(stdout, max_bytes + 1);
    let written = tokio::io::copy(&mut limited, &mut out)
        .await
        .map_err(|e| format!("reading the archive: {e}"))?;
    out.flush()
        .await
        .map_err(|e| format!("writing a temporary file: {e}"))?;
    if written > max_bytes {
        return Err(format!(
            "it is larger than {max_bytes} bytes, the most a build may write (STRATA_BUILD_DISK_MAX)"
        ));
    }
    match status.ended().await {
        AgentEnd::Exited(0) => Ok(file),
        end => Err(match end.fs_error() {
            Some(e) => e.message,
            None => format!("the archive ended with {end:?}"),
        }),
    }
}
