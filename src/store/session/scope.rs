//! Tenant scoping as a type: a session id the store's methods accept only once it was checked
//! against the caller's tenant, so no handler (and no future backend) can forget the check.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{Result, Store};
use crate::domain::{self, CompactionId, SessionId, Tenant};

/// A session id checked against a tenant. Only [`Store::scope`], [`Store::scope_compaction`]
/// and the store itself (for a session it just created or found by a checked key) make one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scoped(SessionId);

impl Scoped {
    pub fn id(self) -> SessionId {
        self.0
    }

    /// For the store's own use: a session it created for the caller, or read back by a key
    /// scoped to the caller's tenant.
    pub(in crate::store) fn trusted(id: SessionId) -> Self {
        Self(id)
    }
}

impl std::fmt::Display for Scoped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A compaction plan of a scoped session: only [`Store::scope_compaction`] and
/// [`Store::save_plan`] make one, so the plan methods cannot be reached with an unchecked id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScopedPlan(SessionId, CompactionId);

impl ScopedPlan {
    pub fn id(self) -> CompactionId {
        self.1
    }

    /// The session the plan belongs to.
    pub fn session(self) -> SessionId {
        self.0
    }

    /// For the store's own use: a plan it just saved for a scoped session.
    pub(super) fn trusted(session: SessionId, id: CompactionId) -> Self {
        Self(session, id)
    }
}

/// Sessions whose tenant is known: a session's tenant never changes, and a deleted session is
/// forgotten.
#[derive(Default)]
pub(in crate::store) struct Owners(Mutex<HashMap<SessionId, Tenant>>);

/// Owners remembered at most; past that the map starts over.
const OWNERS_CACHED: usize = 1_000_000;

impl Owners {
    pub(super) fn remember(&self, session: SessionId, tenant: &Tenant) {
        let mut owners = self.0.lock().expect("owners lock");
        if owners.len() >= OWNERS_CACHED {
            owners.clear();
        }
        owners.insert(session, tenant.clone());
    }

    /// A deleted session's owner is no longer known.
    pub(super) fn forget(&self, session: SessionId) {
        self.0.lock().expect("owners lock").remove(&session);
    }

    fn knows(&self, session: SessionId, tenant: &Tenant) -> bool {
        self.0.lock().expect("owners lock").get(&session) == Some(tenant)
    }
}

pub(in crate::store) type SharedOwners = Arc<Owners>;

impl Store {
    /// Lets `tenant` at `session`, or answers exactly what an unknown session answers.
    ///
    /// Only the caller's own sessions are answered from memory: another tenant's session costs
    /// the same database lookup as an unknown id, so neither the answer nor its timing tells
    /// whether the id exists.
    pub async fn scope(&self, tenant: &Tenant, session: SessionId) -> Result<Scoped> {
        if self.owners.knows(session, tenant) {
            return Ok(Scoped(session));
        }
        match self.session_tenant(session).await? {
            Some(owner) if &owner == tenant => {
                self.owners.remember(session, tenant);
                Ok(Scoped(session))
            }
            _ => Err(domain::Error::not_found("session", session).into()),
        }
    }

    /// Compaction `id` and its session, scoped to `tenant`: a plan of another tenant's session
    /// answers exactly what an unknown plan does, after the same single lookup.
    pub async fn scope_compaction(
        &self,
        tenant: &Tenant,
        id: CompactionId,
    ) -> Result<(Scoped, ScopedPlan)> {
        match self.compaction_owner(id).await? {
            Some((session, owner)) if &owner == tenant => {
                Ok((Scoped(session), ScopedPlan(session, id)))
            }
            _ => Err(domain::Error::not_found("compaction", id).into()),
        }
    }
}
