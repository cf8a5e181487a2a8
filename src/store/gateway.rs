//! What the model gateway asks of the store: a top-level node by its hash (to find the stored
//! prefix of a resent history), and the record of each call it forwarded.

use std::collections::BTreeMap;

use super::idempotency::CreationKey;
use super::{Result, Scoped, Store};
use crate::domain::{GatewayCall, GatewayUsage, Hash, NodeId, SessionId, Tenant};

impl Store {
    /// The session of `tenant` made for `key` with `metadata`, made now if there is none. The
    /// common case, a session that exists, is one read, not a write transaction.
    pub async fn session_for_key(
        &self,
        tenant: &Tenant,
        key: String,
        metadata: BTreeMap<String, String>,
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
                self.create_session(tenant, metadata, Some(&creation))
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

    /// The gateway's calls of `session`, added up (zero for a session it never served).
    pub async fn gateway_usage(&self, session: Scoped) -> Result<GatewayUsage> {
        self.read().await?.gateway_usage(session.id()).await
    }
}
