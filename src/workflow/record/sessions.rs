//! Which session a request belongs to: the key it names it by (a header, the agent's own
//! session id, or its opening), the session that key opens, and the keys remembered.

use std::collections::{BTreeMap, HashMap};

use super::prefix::{chain_hashes, stored_prefix};
use super::{Unrecorded, store_error};
use crate::domain::{NodeContent, NodeId, SessionId, Tenant};
use crate::provider::conversation::Conversation;
use crate::store::{Scoped, Store};

/// The session key stored in a gateway session's metadata.
pub const KEY_METADATA: &str = "ctxd.gateway.key";

/// How the request names its session: a header, the agent's own session id, or its opening.
pub(super) async fn session_key(
    store: &Store,
    tenant: &Tenant,
    named: Option<&str>,
    conv: &Conversation,
    opening: &str,
) -> Key {
    match named {
        Some(name) => match SessionId::parse("x-ctxd-session", name) {
            Ok(id) if store.scope(tenant, id).await.is_ok() => Key::Session(id),
            _ => Key::Named(name.to_owned()),
        },
        None => match &conv.client_session {
            Some(id) => Key::Named(format!("agent:{id}")),
            None => Key::Named(format!("opening:{opening}")),
        },
    }
}

/// How a request names its session.
pub(super) enum Key {
    Session(SessionId),
    Named(String),
}

pub(super) async fn open(
    store: &Store,
    keys: &SessionKeys,
    tenant: &Tenant,
    key: &Key,
) -> Result<Scoped, Unrecorded> {
    match found(store, keys, tenant, key).await? {
        Found::Open(scoped) => Ok(scoped),
        Found::Unborn { session, name } => born(store, keys, tenant, &name, session).await,
    }
}

/// The session a key names, found without making it.
pub(super) enum Found {
    Open(Scoped),
    /// None yet: the id it will have, once made for `name` ([`born`]).
    Unborn {
        session: Scoped,
        name: String,
    },
}

/// The session `key` names, without making one: a key that names none yet is given the id its
/// session will have (the same for every call of it this process serves until it is made).
pub(super) async fn found(
    store: &Store,
    keys: &SessionKeys,
    tenant: &Tenant,
    key: &Key,
) -> Result<Found, Unrecorded> {
    let name = match key {
        Key::Session(id) => {
            return store
                .scope(tenant, *id)
                .await
                .map(Found::Open)
                .map_err(store_error);
        }
        Key::Named(name) => name,
    };
    // A key names one session for good, unless it is deleted: the cached one is taken after
    // the tenant check (which a deleted session fails).
    let remembered = keys.get(tenant, name);
    if let Some(Remembered::Made(id)) = remembered {
        match store.scope(tenant, id).await {
            Ok(scoped) => return Ok(Found::Open(scoped)),
            Err(_) => keys.forget(tenant, name),
        }
    }
    if let Some(scoped) = find(store, tenant, name).await? {
        keys.remember(tenant, name, Remembered::Made(scoped.id()));
        return Ok(Found::Open(scoped));
    }
    // Named before (a call that never reached its provider): the same id again.
    let session = match remembered {
        Some(Remembered::Unborn(session)) => session,
        _ => {
            let session = store.unborn_session();
            keys.remember(tenant, name, Remembered::Unborn(session));
            session
        }
    };
    Ok(Found::Unborn {
        session,
        name: name.clone(),
    })
}

/// The session made for key `name` with the id `unborn` ([`found`] named it), or the one made
/// for it meanwhile.
pub(super) async fn born(
    store: &Store,
    keys: &SessionKeys,
    tenant: &Tenant,
    name: &str,
    unborn: Scoped,
) -> Result<Scoped, Unrecorded> {
    let metadata = BTreeMap::from([(KEY_METADATA.to_owned(), name.to_owned())]);
    let scoped = store
        .session_for_key_as(
            tenant,
            format!("ctxd-gateway:{name}"),
            metadata,
            Some(unborn),
        )
        .await
        .map_err(store_error)?;
    keys.remember(tenant, name, Remembered::Made(scoped.id()));
    Ok(scoped)
}

/// The session made for key `name`, if there is one.
async fn find(store: &Store, tenant: &Tenant, name: &str) -> Result<Option<Scoped>, Unrecorded> {
    let metadata = BTreeMap::from([(KEY_METADATA.to_owned(), name.to_owned())]);
    store
        .find_session_for_key(tenant, format!("ctxd-gateway:{name}"), &metadata)
        .await
        .map_err(store_error)
}

/// What a key is remembered to name: its session, or the id its session will have.
#[derive(Debug, Clone, Copy)]
pub(super) enum Remembered {
    Made(SessionId),
    Unborn(Scoped),
}

/// The sessions keys named, remembered: a key's session is read once, not on every call.
#[derive(Default)]
pub struct SessionKeys(std::sync::Mutex<HashMap<(Tenant, String), Remembered>>);

/// Keys remembered at most; past it the memory starts over.
const REMEMBERED_KEYS: usize = 10_000;

impl SessionKeys {
    fn get(&self, tenant: &Tenant, key: &str) -> Option<Remembered> {
        let map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(&(tenant.clone(), key.to_owned())).copied()
    }

    fn remember(&self, tenant: &Tenant, key: &str, id: Remembered) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= REMEMBERED_KEYS {
            map.clear();
        }
        map.insert((tenant.clone(), key.to_owned()), id);
    }

    fn forget(&self, tenant: &Tenant, key: &str) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.remove(&(tenant.clone(), key.to_owned()));
    }
}

/// The key of a conversation known only by its opening.
pub fn opening_key(opening: &str) -> String {
    blake3::hash(opening.as_bytes()).to_hex()[..32].to_owned()
}

/// What is stored of `conv`, without writing anything (for `count_tokens`): its session, if it
/// has one, and the longest stored prefix (last index and node).
pub async fn peek(
    store: &Store,
    tenant: &Tenant,
    named: Option<&str>,
    conv: &Conversation,
) -> Option<(Scoped, Option<(usize, NodeId)>)> {
    let contents: Vec<&NodeContent> = conv.items.iter().map(|i| &i.content).collect();
    let hashes = chain_hashes(&contents, None);
    let opening = opening_key(&conv.opening);
    let find = |name: String| async move {
        let metadata = BTreeMap::from([(KEY_METADATA.to_owned(), name.clone())]);
        store
            .find_session_for_key(tenant, format!("ctxd-gateway:{name}"), &metadata)
            .await
            .ok()
            .flatten()
    };
    let name = match named {
        Some(name) => match SessionId::parse("x-ctxd-session", name) {
            Ok(id) => match store.scope(tenant, id).await {
                Ok(scoped) => {
                    let stored = stored_prefix(store, scoped, &hashes).await.ok()?;
                    if stored.is_some() {
                        return Some((scoped, stored));
                    }
                    return find(format!("{id}/{opening}")).await.map(|s| (s, None));
                }
                Err(_) => name.to_owned(),
            },
            Err(_) => name.to_owned(),
        },
        None => match &conv.client_session {
            Some(id) => format!("agent:{id}"),
            None => format!("opening:{opening}"),
        },
    };
    for candidate in [name.clone(), format!("{name}/{opening}")] {
        if let Some(session) = find(candidate).await {
            let stored = stored_prefix(store, session, &hashes).await.ok()?;
            if stored.is_some() {
                return Some((session, stored));
            }
        }
    }
    None
}
