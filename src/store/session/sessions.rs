//! Sessions: creating (with a creation key, so a retry finds the session it made), listing and
//! reading them.

use std::collections::BTreeMap;

use super::{Result, Scoped, Store};
use crate::domain::{self, Branch, BranchName, Session, SessionFilter, SessionId, Tenant};
use crate::store::append::idempotency::CreationKey;
use crate::store::backend::{NewSession, Reads, SessionPage, SessionRow, WriteTx};
use crate::store::form::clock::now_ms;

impl Store {
    /// A new session of `tenant`, with branch `main` and no head; with a `key` already used
    /// for the same request, the session that request created.
    pub async fn create_session(
        &self,
        tenant: &Tenant,
        metadata: BTreeMap<String, String>,
        key: Option<&CreationKey>,
    ) -> Result<Session> {
        self.create_session_as(SessionId::new(), tenant, metadata, key)
            .await
    }

    /// [`Store::create_session`] with the id `id` (a fresh one, minted by the caller).
    pub(super) async fn create_session_as(
        &self,
        id: SessionId,
        tenant: &Tenant,
        metadata: BTreeMap<String, String>,
        key: Option<&CreationKey>,
    ) -> Result<Session> {
        let now = now_ms();
        let new = NewSession {
            id,
            tenant,
            now,
            metadata: &metadata,
            key,
        };
        let tx = match self.begin_session(&new).await? {
            Begun::New(tx) => tx,
            Begun::Existing(session) => return Ok(session),
        };
        tx.commit().await?;
        self.owners.remember(id, tenant);
        Ok(Session {
            id,
            created_at_ms: now,
            metadata,
            compaction_count: 0,
            node_count: 0,
            branches: vec![Branch {
                name: BranchName::main(),
                head: None,
                updated_at_ms: now,
            }],
        })
    }

    /// The tenant `id` belongs to; `None` for an unknown session.
    pub async fn session_tenant(&self, id: SessionId) -> Result<Option<Tenant>> {
        self.read().await?.session_tenant(id).await
    }

    pub async fn get_session(&self, id: Scoped) -> Result<Session> {
        let id = id.id();
        let mut conn = self.read().await?;
        let row = conn
            .session(id)
            .await?
            .ok_or_else(|| domain::Error::not_found("session", id))?;
        with_branches(&mut *conn, row).await
    }

    /// Sessions newest first, starting after `after`; also returns the cursor of the next page.
    pub async fn list_sessions(
        &self,
        tenant: &Tenant,
        page_size: u32,
        after: Option<SessionId>,
        filter: &SessionFilter,
    ) -> Result<(Vec<Session>, Option<SessionId>)> {
        let mut conn = self.read().await?;
        // A UUID v7 sorts by creation time, so the id is the cursor. One extra row tells
        // whether a next page exists.
        let page = SessionPage {
            tenant,
            after,
            limit: page_size.saturating_add(1),
            filter,
        };
        let rows = conn.sessions(&page).await?;
        let more = rows.len() > page_size as usize;
        let mut sessions = Vec::with_capacity(rows.len());
        for row in rows.into_iter().take(page_size as usize) {
            sessions.push(with_branches(&mut *conn, row).await?);
        }
        let next = more.then(|| sessions.last().map(|s| s.id)).flatten();
        Ok((sessions, next))
    }
}

/// The session an earlier call with `key` created; a key used for a different request is
/// refused.
pub(super) async fn keyed_session(
    tx: &mut dyn Reads,
    tenant: &Tenant,
    key: Option<&CreationKey>,
) -> Result<Option<SessionId>> {
    let Some(key) = key else { return Ok(None) };
    let Some((request, session)) = tx.session_key(tenant, &key.key).await? else {
        return Ok(None);
    };
    if request != key.request {
        return Err(domain::Error::FailedPrecondition(format!(
            "idempotency_key: {:?} was used for a different request",
            key.key
        ))
        .into());
    }
    Ok(Some(session))
}

/// How the write that creates a session began.
pub(super) enum Begun {
    /// The new session's rows are written in this transaction, for the caller to complete.
    New(Box<dyn WriteTx>),
    /// A request with the same key made this session before.
    Existing(Session),
}

impl Store {
    /// Begins the write that creates session `new`, its rows written; with a creation key
    /// already used for the same request, answers the session that request made instead.
    pub(super) async fn begin_session(&self, new: &NewSession<'_>) -> Result<Begun> {
        let (tenant, key) = (new.tenant, new.key);
        let mut tx = self.begin_write().await?;
        if let Some(existing) = keyed_session(&mut *tx, tenant, key).await? {
            tx.rollback().await?;
            // Keys are per tenant: the session a key names is the caller's.
            let session = self.get_session(Scoped::trusted(existing)).await?;
            return Ok(Begun::Existing(session));
        }
        // The session, its empty `main` branch, and its creation key.
        tx.insert_session(new).await?;
        if let Some(key) = key
            && !tx.insert_session_key(new, key).await?
        {
            // A concurrent creation took the key first: read what it made.
            tx.rollback().await?;
            return Ok(Begun::Existing(
                self.keyed_after_race(tenant, Some(key)).await?,
            ));
        }
        Ok(Begun::New(tx))
    }

    /// The session a concurrent creation made with `key`, which it committed before ours
    /// (another replica on the same database).
    async fn keyed_after_race(
        &self,
        tenant: &Tenant,
        key: Option<&CreationKey>,
    ) -> Result<Session> {
        let existing = keyed_session(&mut *self.read().await?, tenant, key).await?;
        let existing = existing.ok_or_else(|| {
            crate::store::Error::Corrupt("a creation key vanished after a conflict".into())
        })?;
        self.get_session(Scoped::trusted(existing)).await
    }
}

async fn with_branches(conn: &mut dyn Reads, row: SessionRow) -> Result<Session> {
    Ok(Session {
        id: row.id,
        created_at_ms: row.created_at_ms,
        metadata: row.metadata,
        compaction_count: row.compaction_count,
        branches: conn.branches(row.id).await?,
        node_count: conn.node_count(row.id).await?,
    })
}
