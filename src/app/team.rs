//! A team's API keys: issuing and revoking, on the team stream.
//!
//! Rule and events: `domain/team.rs` (`IssueKey` → `ApiKeyIssued`, `RevokeKey` → `ApiKeyRevoked`);
//! read model: `api_keys` (inline, `projections/api_keys.rs`), which authentication reads.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{CommandContext, Error};
use crate::domain::ids::TeamId;
use crate::domain::team::{self, ApiKey};
use crate::events::command::execute;
use crate::events::EventStore;
use crate::streams::{team_stream, Team};

/// Issues a fresh random key for `team`; the key is returned once and stored only as its hash.
pub async fn issue_key(
    store: &EventStore,
    ctx: &CommandContext,
    team: &TeamId,
    now: DateTime<Utc>,
) -> Result<ApiKey, Error<team::Error>> {
    let key = ApiKey::from_random(rand::random());
    let command = team::Command::IssueKey {
        key_id: Uuid::new_v4(),
        key_sha256: key.sha256_hex(),
        prefix: key.display_prefix(),
        now,
    };
    execute::<Team>(store, &team_stream(team), &command, ctx).await?;
    Ok(key)
}

/// Revokes `key_id` of `team`: requests with it are refused from then on.
pub async fn revoke_key(
    store: &EventStore,
    ctx: &CommandContext,
    team: &TeamId,
    key_id: Uuid,
    now: DateTime<Utc>,
) -> Result<(), Error<team::Error>> {
    let command = team::Command::RevokeKey { key_id, now };
    execute::<Team>(store, &team_stream(team), &command, ctx).await?;
    Ok(())
}
