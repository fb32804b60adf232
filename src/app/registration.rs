//! Registering a build (`POST /v3/templates`) as one transaction over three streams: the
//! team-scoped name claim, the template, and the new build. The API, the benchmarks and the
//! tests all register through [`register_build`], so the claim race (two first registrations
//! of one name) is decided in one place.
//!
//! Rule: [`template::register_build`] and the build's `RegisterBuild`; events: `NameClaimed`,
//! `TemplateRegistered`/`BuildAppended`, `BuildRegistered`; read models: `templates` and `builds`
//! (inline).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::build;
use crate::domain::build_spec::{Resources, Tag, TemplateName};
use crate::domain::ids::{BuildId, TeamId, TemplateId};
use crate::domain::template;
use crate::events::command::{execute_writes_admitted, load, CommandContext};
use crate::events::{CommandError, EventStore, ExpectedVersion};
use crate::streams::{
    build_stream, template_name_stream, template_stream, Template, TemplateName as NameClaim,
};

/// What a registration is asked to do.
#[derive(Debug, Clone)]
pub struct RegisterBuild {
    pub team: TeamId,
    pub name: TemplateName,
    pub tags: Vec<Tag>,
    pub resources: Resources,
    pub now: DateTime<Utc>,
    /// Until when the build waits for its uploads and start.
    pub waiting_deadline: DateTime<Utc>,
}

impl RegisterBuild {
    /// A build of `name` under the `default` tag with the default resources, as a request that
    /// names neither registers it, waiting `wait` from `now` for its uploads and start.
    pub fn new(
        team: TeamId,
        name: TemplateName,
        now: DateTime<Utc>,
        wait: chrono::Duration,
    ) -> Self {
        RegisterBuild {
            team,
            name,
            tags: vec![Tag::default_tag()],
            resources: Resources::default(),
            now,
            waiting_deadline: now + wait,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error(transparent)]
    Template(template::Error),
    #[error(transparent)]
    Build(build::Error),
}

/// Registers a new build of `cmd.name` in `cmd.team`: joins the template that holds the name,
/// or claims the name for a fresh template; deciding again if another registration won a race.
pub async fn register_build(
    store: &EventStore,
    ctx: &CommandContext,
    cmd: &RegisterBuild,
) -> Result<(TemplateId, BuildId), CommandError<RegisterError>> {
    let build_id = BuildId::from_uuid(Uuid::new_v4());
    let candidate = new_template_id();
    let name_stream = template_name_stream(&cmd.team, &cmd.name.name);
    let (candidate_ref, name_ref) = (&candidate, &name_stream);
    let admission = ctx.admission.as_ref();
    let (_, chosen) = execute_writes_admitted(store, 16, admission, move || async move {
        let names = load::<NameClaim>(store, name_ref)
            .await
            .map_err(CommandError::into_other)?;
        let holder = names
            .state
            .holder
            .clone()
            .unwrap_or_else(|| candidate_ref.clone());
        let tpl_stream = template_stream(&holder);
        let tpl = load::<Template>(store, &tpl_stream)
            .await
            .map_err(CommandError::into_other)?;
        let registration = template::register_build(
            &names.state,
            &tpl.state,
            &cmd.team,
            &cmd.name,
            candidate_ref,
            build_id,
            &cmd.tags,
            cmd.now,
        )
        .map_err(|e| CommandError::Rejected(RegisterError::Template(e)))?;
        let build_events = build::decide(
            &build::State::default(),
            &build::Command::RegisterBuild {
                template: registration.template.clone(),
                team: cmd.team.clone(),
                tags: cmd.tags.clone(),
                resources: cmd.resources,
                now: cmd.now,
                waiting_deadline: cmd.waiting_deadline,
            },
        )
        .map_err(|e| CommandError::Rejected(RegisterError::Build(e)))?;
        let b_stream = build_stream(&build_id);
        let writes = vec![
            ctx.write(name_ref, names.expected(), &registration.name_events)?,
            ctx.write(&tpl_stream, tpl.expected(), &registration.template_events)?,
            ctx.write(&b_stream, ExpectedVersion::NoStream, &build_events)?,
        ];
        Ok((writes, registration.template))
    })
    .await?;
    Ok((chosen, build_id))
}

/// A short random template id, like E2B's: 20 lowercase letters and digits.
fn new_template_id() -> TemplateId {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    let id: String = (0..20)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect();
    TemplateId::parse(&id).expect("the alphabet is valid for template ids")
}
