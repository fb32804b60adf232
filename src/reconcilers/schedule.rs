//! When passes run: a cron expression (six fields, seconds first, as the `cron` crate reads
//! them), evaluated in UTC. A pass that overruns its tick starts the next one right away rather
//! than queueing missed ticks.
//!
//! There is no NOTIFY wake-up: every reconciler here acts on time passing (a lease, a deadline,
//! an expiry), not on an event arriving, so an event would only wake it to find nothing due.

use std::str::FromStr;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::{ReconcileEnv, ReconcileError, Reconciler};

/// Every second: a lease or deadline is acted on within about a second of passing.
pub const DEFAULT_SCHEDULE: &str = "* * * * * *";

/// A parsed cron schedule.
#[derive(Clone, Debug)]
pub struct Schedule {
    expression: String,
    schedule: cron::Schedule,
}

impl Schedule {
    pub fn parse(expression: &str) -> Result<Schedule, ReconcileError> {
        let schedule =
            cron::Schedule::from_str(expression).map_err(|e| ReconcileError::Schedule {
                expression: expression.to_owned(),
                message: e.to_string(),
            })?;
        if schedule.upcoming(Utc).next().is_none() {
            return Err(ReconcileError::Schedule {
                expression: expression.to_owned(),
                message: "it never fires again".into(),
            });
        }
        Ok(Schedule {
            expression: expression.to_owned(),
            schedule,
        })
    }

    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// Time until the next tick (zero if it is due).
    fn until_next(&self) -> Option<std::time::Duration> {
        let next = self.schedule.upcoming(Utc).next()?;
        Some(
            (next - crate::clock::local_now())
                .to_std()
                .unwrap_or_default(),
        )
    }
}

impl Default for Schedule {
    fn default() -> Self {
        Schedule::parse(DEFAULT_SCHEDULE).expect("the default schedule is valid")
    }
}

/// Runs `reconciler` on `schedule` until `shutdown`. A failing pass is logged and retried at the
/// next tick.
pub async fn run_scheduled(
    reconciler: Reconciler,
    env: ReconcileEnv,
    schedule: Schedule,
    shutdown: CancellationToken,
) {
    tracing::info!(%reconciler, schedule = schedule.expression(), node = %env.node, "reconciler started");
    loop {
        match reconciler.pass(&env).await {
            Ok(pass) if pass.applied > 0 || pass.failed > 0 => {
                tracing::info!(%reconciler, ?pass, "pass")
            }
            Ok(pass) => tracing::trace!(%reconciler, ?pass, "pass"),
            // Deletes nothing, ever, until an operator acts: say so loudly on every pass.
            Err(e @ ReconcileError::NotOwner { .. }) => {
                tracing::error!(%reconciler, error = %e, "pass refused")
            }
            Err(e) => {
                tracing::warn!(%reconciler, error = %e, "pass failed; retrying at the next tick")
            }
        }
        let Some(wait) = schedule.until_next() else {
            tracing::warn!(%reconciler, "the schedule has no further ticks; stopping");
            return;
        };
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
    }
    tracing::info!(%reconciler, "reconciler stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_six_field_expressions_and_rejects_garbage() {
        assert!(Schedule::parse("*/2 * * * * *").is_ok());
        assert!(Schedule::parse(DEFAULT_SCHEDULE).is_ok());
        let err = Schedule::parse("every second").unwrap_err().to_string();
        assert!(err.contains("every second"), "{err}");
        assert!(err.contains("six fields"), "{err}");
        assert!(Schedule::parse("0 0 0 1 1 * 2001").is_err());
    }

    #[test]
    fn the_next_tick_of_every_second_is_at_most_a_second_away() {
        let wait = Schedule::default().until_next().unwrap();
        assert!(wait <= std::time::Duration::from_secs(1));
    }
}
