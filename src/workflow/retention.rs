//! The retention policy (`serve --retain-idle-days`, and a tenant's own `retain=` in the keys
//! file): sessions idle past their tenant's limit are deleted in the background, in bounded
//! batches, each counted and logged.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::auth::{ApiKeys, TenantRetention};
use crate::domain::Tenant;
use crate::store::{self, Deletion, Store, Tenants, now_ms};

/// Deletes sessions no branch of which moved for their tenant's idle limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// The limit of every tenant without one of its own; `None`: their sessions are kept.
    pub idle: Option<Duration>,
    /// Tenants with their own limit (`None`: never deleted for idleness).
    pub tenants: BTreeMap<Tenant, Option<Duration>>,
    /// How often the policy looks for idle sessions (and once at start).
    pub every: Duration,
    /// Sessions deleted per batch at most; a full batch is followed by another at once.
    pub batch: u32,
}

impl Default for Retention {
    /// Deletes nothing until a limit is set; looks hourly, 100 sessions a batch.
    fn default() -> Self {
        Self {
            idle: None,
            tenants: BTreeMap::new(),
            every: Duration::from_secs(3600),
            batch: 100,
        }
    }
}

impl Retention {
    pub fn idle_days(days: u32) -> Self {
        Self {
            idle: Some(days_long(days)),
            ..Self::default()
        }
    }

    /// This policy with the tenants' own limits from the keys file; `None` when it deletes
    /// nothing at all.
    pub fn with_keys(mut self, keys: Option<&ApiKeys>) -> Option<Self> {
        if let Some(keys) = keys {
            for (tenant, retain) in keys.retention() {
                let idle = match retain {
                    TenantRetention::IdleDays(days) => Some(days_long(*days)),
                    TenantRetention::Never => None,
                };
                self.tenants.insert(tenant.clone(), idle);
            }
        }
        (self.idle.is_some() || self.tenants.values().any(Option::is_some)).then_some(self)
    }
}

fn days_long(days: u32) -> Duration {
    Duration::from_secs(u64::from(days) * 24 * 3600)
}

/// Runs the policy until dropped (the server aborts it when it stops).
pub async fn run(store: Store, policy: Retention) {
    let mut ticks = tokio::time::interval(policy.every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let own: Vec<Tenant> = policy.tenants.keys().cloned().collect();
    loop {
        ticks.tick().await;
        let mut limits: Vec<(Tenants<'_>, Duration)> = policy
            .tenants
            .iter()
            .filter_map(|(tenant, idle)| Some((Tenants::Only(tenant), (*idle)?)))
            .collect();
        if let Some(idle) = policy.idle {
            limits.push((Tenants::Except(&own), idle));
        }
        for (tenants, idle) in limits {
            if let Err(error) = sweep(&store, tenants, idle, policy.batch).await {
                tracing::warn!(%error, "retention: a batch failed; the next run tries again");
            }
        }
        // Kept fresh for the metrics whether or not anything was deleted.
        if let Err(error) = measure(&store).await {
            tracing::debug!(%error, "could not measure the store");
        }
    }
}

/// Deletes the sessions of `tenants` idle for `idle`, batch by batch, until a batch comes back
/// short.
async fn sweep(
    store: &Store,
    tenants: Tenants<'_>,
    idle: Duration,
    batch: u32,
) -> Result<(), crate::store::Error> {
    let idle_ms = i64::try_from(idle.as_millis()).unwrap_or(i64::MAX);
    let since = now_ms().saturating_sub(idle_ms);
    loop {
        let found = store.idle_sessions(since, batch, tenants).await?;
        if found.is_empty() {
            return Ok(());
        }
        let (mut sessions, mut nodes) = (0_u64, 0_u64);
        for (session, tenant) in &found {
            // Idleness is checked again in the deleting transaction: a session appended to
            // since it was found stays.
            if let Some(deletion) = store.delete_idle_session(tenant, *session, since).await? {
                deleted("retention", &deletion);
                sessions += 1;
                nodes += deletion.tombstone.nodes;
            }
        }
        metrics::counter!("ctxd_retention_batches_total").increment(1);
        tracing::info!(
            sessions,
            nodes,
            idle_days = idle.as_secs_f64() / 86_400.0,
            tenant = match tenants {
                Tenants::Only(tenant) => tenant.as_str(),
                Tenants::Except(_) => "(default)",
            },
            "retention: deleted idle sessions"
        );
        if found.len() < batch as usize {
            return Ok(());
        }
        tokio::task::yield_now().await;
    }
}

/// Counts a deletion in the metrics and the log; `by` is `request` or `retention`.
pub fn deleted(by: &'static str, deletion: &Deletion) {
    let t = &deletion.tombstone;
    metrics::counter!("ctxd_deleted_sessions_total", "by" => by).increment(1);
    metrics::counter!("ctxd_deleted_nodes_total").increment(t.nodes);
    metrics::counter!("ctxd_reclaimed_blob_bytes_total").increment(deletion.blob_bytes);
    tracing::info!(
        session = %t.session,
        by,
        nodes = t.nodes,
        blobs = deletion.blobs,
        blob_bytes = deletion.blob_bytes,
        "deleted a session"
    );
}

/// Counts the sessions and measures the database for the gauges; returns the counts.
pub async fn measure(store: &Store) -> Result<(u64, u64), store::Error> {
    let (sessions, tombstones) = store.session_counts().await?;
    let footprint = store.footprint().await?;
    #[allow(clippy::cast_precision_loss)] // a gauge is a float
    {
        metrics::gauge!("ctxd_sessions").set(sessions as f64);
        metrics::gauge!("ctxd_database_bytes").set(footprint.bytes as f64);
        metrics::gauge!("ctxd_database_free_bytes").set(footprint.free_bytes as f64);
    }
    Ok((sessions, tombstones))
}
