//! `X-API-KEY` authentication: the key names a team, and the team scopes everything the
//! request may see or change.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use crate::api::error::ApiError;
use crate::api::AppState;
use crate::domain::ids::TeamId;
use crate::domain::team::ApiKey;

/// The authenticated team of a request.
#[derive(Debug, Clone)]
pub struct Team(pub TeamId);

impl FromRequestParts<AppState> for Team {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let presented = parts
            .headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                ApiError::unauthorized(
                    "missing X-API-KEY header; set E2B_API_KEY to a key from `strata keys create`",
                )
            })?;
        let invalid = || {
            ApiError::unauthorized(
                "invalid API key; create one with `strata keys create --team NAME`",
            )
        };
        let key = ApiKey::parse(presented).ok_or_else(invalid)?;
        let team =
            crate::projections::api_keys::team_of_key(&state.pool, &key.sha256_hex()).await?;
        let team = team.ok_or_else(invalid)?;
        let team =
            TeamId::parse(&team).map_err(|e| ApiError::internal("reading the key's team", &e))?;
        tracing::Span::current().record("team", team.as_str());
        Ok(Team(team))
    }
}
