//! What the model gateway asks of the store: a top-level node by its hash (to find the stored
//! prefix of a resent history), and the record of each call it forwarded, read back added up
//! or call by call (the ledger).

use std::collections::BTreeMap;

use super::{Result, Scoped, Store};
use crate::domain::{GatewayCall, GatewayCallId, GatewayUsage, Hash, NodeId, SessionId, Tenant};
use crate::store::append::idempotency::CreationKey;
use crate::store::backend::SavedConversation;
use crate::store::now_ms;

impl Store {
    /// The session of `tenant` made for `key` with `metadata`, made now if there is none. The
    /// common case, a session that exists, is one read, not a write transaction.
    pub async fn session_for_key(
        &self,
        tenant: &Tenant,
        key: String,
        metadata: BTreeMap<String, String>,
    ) -> Result<Scoped> {
        self.session_for_key_as(tenant, key, metadata, None).await
    }

    /// A session id no session has yet: the one a call names before its session is made
    /// ([`Store::session_for_key_as`]), so a call that goes no further leaves no session behind.
    pub fn unborn_session(&self) -> Scoped {
        Scoped::trusted(SessionId::new())
    }

    /// [`Store::session_for_key`], a session made with the id `unborn` named before (see
    /// [`Store::unborn_session`]); a session the key found meanwhile is the one returned.
    pub async fn session_for_key_as(
        &self,
        tenant: &Tenant,
        key: String,
        metadata: BTreeMap<String, String>,
        unborn: Option<Scoped>,
    ) -> Result<Scoped> {
        let Some(creation) = CreationKey::session(key, &metadata) else {
            return Err(
                crate::domain::Error::invalid("x-ctxd-session", "must not be empty").into(),
            );
        };
        let found =
            super::sessions::keyed_session(&mut *self.read().await?, tenant, Some(&creation))
                .await?;
        let id: SessionId = match found {
            Some(id) => id,
            None => {
                let id = unborn.map_or_else(SessionId::new, Scoped::id);
                self.create_session_as(id, tenant, metadata, Some(&creation))
                    .await?
                    .id
            }
        };
        Ok(Scoped::trusted(id))
    }

    /// The node of `session` with hash `hash`, if one is stored. A node's hash covers its whole
    /// history and its enclosing function, so equal hashes are equal paths from the root.
    pub async fn node_by_hash(&self, session: Scoped, hash: &Hash) -> Result<Option<NodeId>> {
        self.read().await?.node_by_hash(session.id(), hash).await
    }

    /// The session of `tenant` made for `key` with `metadata`, if there is one; never makes one.
    pub async fn find_session_for_key(
        &self,
        tenant: &Tenant,
        key: String,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Option<Scoped>> {
        let Some(creation) = CreationKey::session(key, metadata) else {
            return Ok(None);
        };
        let found =
            super::sessions::keyed_session(&mut *self.read().await?, tenant, Some(&creation))
                .await?;
        Ok(found.map(Scoped::trusted))
    }

    /// Records one forwarded call of `session`.
    pub async fn record_gateway_call(&self, session: Scoped, call: &GatewayCall) -> Result<()> {
        let session = session.id();
        let mut tx = self.begin_write().await?;
        tx.ensure_session(session).await?;
        tx.insert_gateway_call(session, call).await?;
        tx.commit().await
    }

    /// What the gateway left for the next call of `session`'s conversation (`scope`: a
    /// sub-agent's function, or `None` for the session's own), written by any replica.
    pub async fn gateway_conversation(
        &self,
        session: Scoped,
        scope: Option<NodeId>,
    ) -> Result<Option<String>> {
        let scope = scope.as_ref().map_or(&[][..], |id| &id.as_bytes()[..]);
        self.read()
            .await?
            .gateway_conversation(session.id(), scope)
            .await
    }

    /// Replaces what the gateway keeps for the next call of `session`'s conversation `scope`.
    pub async fn save_gateway_conversation(
        &self,
        session: Scoped,
        scope: Option<NodeId>,
        state: &str,
    ) -> Result<()> {
        let scope = scope.as_ref().map_or(&[][..], |id| &id.as_bytes()[..]);
        let mut tx = self.begin_write().await?;
        let saved = SavedConversation {
            session: session.id(),
            scope,
            state,
            now: now_ms(),
        };
        tx.save_gateway_conversation(&saved).await?;
        tx.commit().await
    }

    /// The gateway's calls of `session`, added up (zero for a session it never served).
    pub async fn gateway_usage(&self, session: Scoped) -> Result<GatewayUsage> {
        self.read().await?.gateway_usage(session.id()).await
    }

    /// One page of the gateway's calls of `session` in the order they were recorded (newest
    /// last): up to `page_size` calls after call `after` (from the first without it), and the
    /// call the next page starts after, when there are more.
    pub async fn gateway_calls(
        &self,
        session: Scoped,
        page_size: u32,
        after: Option<GatewayCallId>,
    ) -> Result<(Vec<GatewayCall>, Option<GatewayCallId>)> {
        // A call id is a UUID v7, so it sorts by the time the call was recorded and is the
        // cursor; one extra row tells whether a next page exists.
        let mut rows = self
            .read()
            .await?
            .gateway_calls(session.id(), after, page_size.saturating_add(1))
            .await?;
        let more = rows.len() > page_size as usize;
        rows.truncate(page_size as usize);
        let next = if more {
            rows.last().map(|(id, _)| *id)
        } else {
            None
        };
        Ok((rows.into_iter().map(|(_, call)| call).collect(), next))
    }
}
