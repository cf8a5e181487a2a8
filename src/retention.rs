//! The retention policy (`serve --retain-idle-days`): sessions idle past a limit are deleted in
//! the background, in bounded batches, each counted and logged.

use std::time::Duration;

use crate::api::lifecycle;
use crate::store::{Store, now_ms};

/// Deletes sessions no branch of which moved for `idle`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub idle: Duration,
    /// How often the policy looks for idle sessions (and once at start).
    pub every: Duration,
    /// Sessions deleted per batch at most; a full batch is followed by another at once.
    pub batch: u32,
}

impl Retention {
    pub fn idle_days(days: u32) -> Self {
        Self {
            idle: Duration::from_secs(u64::from(days) * 24 * 3600),
            every: Duration::from_secs(3600),
            batch: 100,
        }
    }
}

/// Runs the policy until dropped (the server aborts it when it stops).
pub async fn run(store: Store, policy: Retention) {
    let mut ticks = tokio::time::interval(policy.every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if let Err(error) = sweep(&store, policy).await {
            tracing::warn!(%error, "retention: a batch failed; the next run tries again");
        }
        // Kept fresh for the metrics whether or not anything was deleted.
        if let Err(error) = lifecycle::measure(&store).await {
            tracing::debug!(%error, "could not measure the store");
        }
    }
}

/// Deletes idle sessions batch by batch until a batch comes back short.
async fn sweep(store: &Store, policy: Retention) -> Result<(), crate::store::Error> {
    let idle_ms = i64::try_from(policy.idle.as_millis()).unwrap_or(i64::MAX);
    let since = now_ms().saturating_sub(idle_ms);
    loop {
        let idle = store.idle_sessions(since, policy.batch).await?;
        if idle.is_empty() {
            return Ok(());
        }
        let (mut sessions, mut nodes) = (0_u64, 0_u64);
        for (session, tenant) in &idle {
            // Idleness is checked again in the deleting transaction: a session appended to
            // since it was found stays.
            if let Some(deletion) = store.delete_idle_session(tenant, *session, since).await? {
                lifecycle::deleted("retention", &deletion);
                sessions += 1;
                nodes += deletion.tombstone.nodes;
            }
        }
        metrics::counter!("ctxd_retention_batches_total").increment(1);
        tracing::info!(
            sessions,
            nodes,
            idle_days = policy.idle.as_secs_f64() / 86_400.0,
            "retention: deleted idle sessions"
        );
        if idle.len() < policy.batch as usize {
            return Ok(());
        }
        tokio::task::yield_now().await;
    }
}
