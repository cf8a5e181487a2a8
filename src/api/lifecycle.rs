//! DeleteSession, BackupDatabase and CollectGarbage: the RPCs that end a session's life or
//! look after the whole store.

use std::path::PathBuf;
use std::time::Instant;

use tonic::{Request, Response, Status};

use super::parse::session_id;
use super::pb;
use super::service::{ContextStoreService, Reply, tenant_of};
use super::{domain_status, status};
use crate::auth::Admin;
use crate::domain::{Error, Tombstone};
use crate::store;
use crate::workflow::retention::{deleted, measure};

impl ContextStoreService {
    pub(super) async fn delete(
        &self,
        request: Request<pb::DeleteSessionRequest>,
    ) -> Reply<pb::DeleteSessionResponse> {
        let tenant = tenant_of(&request);
        let session = session_id(&request.get_ref().session_id)?;
        let deletion = self
            .store
            .delete_session(&tenant, session, tenant.as_str())
            .await
            .map_err(status)?;
        if !deletion.already_deleted {
            deleted("request", &deletion);
        }
        Ok(Response::new(pb::DeleteSessionResponse {
            tombstone: Some(tombstone(deletion.tombstone)),
            already_deleted: deletion.already_deleted,
        }))
    }

    pub(super) async fn backup(
        &self,
        request: Request<pb::BackupDatabaseRequest>,
    ) -> Reply<pb::BackupDatabaseResponse> {
        admin(&request, "BackupDatabase")?;
        let to = request.into_inner().to;
        if to.is_empty() {
            return Err(domain_status(Error::invalid("to", "is empty")));
        }
        let path = PathBuf::from(&to);
        // The server's working directory is nobody's business: the caller names the place.
        if !path.is_absolute() {
            return Err(domain_status(Error::invalid(
                "to",
                "must be an absolute path on the server's machine",
            )));
        }
        if path.exists() {
            return Err(Status::already_exists(format!(
                "to: {to} exists: a backup writes a new file"
            )));
        }
        if !path.parent().is_some_and(std::path::Path::is_dir) {
            return Err(Status::failed_precondition(format!(
                "to: the directory of {to} does not exist on the server's machine"
            )));
        }
        let started = Instant::now();
        let bytes = self.store.backup_to(&path).await.map_err(backup_status)?;
        tracing::info!(to = %path.display(), bytes, "backed up the database");
        Ok(Response::new(pb::BackupDatabaseResponse {
            path: to,
            bytes,
            took_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
        }))
    }

    pub(super) async fn collect(
        &self,
        request: Request<pb::CollectGarbageRequest>,
    ) -> Reply<pb::CollectGarbageResponse> {
        admin(&request, "CollectGarbage")?;
        let before = self.store.footprint().await.map_err(status)?;
        self.store.release_free_space().await.map_err(status)?;
        let (sessions, tombstones) = measure(&self.store).await.map_err(status)?;
        let after = self.store.footprint().await.map_err(status)?;
        tracing::info!(
            released = before.bytes.saturating_sub(after.bytes),
            bytes = after.bytes,
            free = after.free_bytes,
            "collected garbage"
        );
        Ok(Response::new(pb::CollectGarbageResponse {
            sessions,
            tombstones,
            database_bytes: after.bytes,
            free_bytes: after.free_bytes,
            released_bytes: before.bytes.saturating_sub(after.bytes),
        }))
    }
}

/// Refuses a store-wide RPC to a caller whose key is not an admin key.
fn admin<T>(request: &Request<T>, rpc: &str) -> Result<(), Status> {
    if request.extensions().get::<Admin>().is_some() {
        return Ok(());
    }
    Err(Status::permission_denied(format!(
        "{rpc} needs an admin key (a line `tenant key admin` in the keys file)"
    )))
}

/// A backup's failure: what the caller can act on is said as such.
fn backup_status(error: store::Error) -> Status {
    match error {
        store::Error::Database {
            fault: store::Fault::Full,
            detail,
        } => {
            tracing::warn!(%detail, "backup failed");
            Status::resource_exhausted(format!("to: {detail}"))
        }
        store::Error::Unusable { problem, .. } => {
            Status::failed_precondition(format!("to: {problem}"))
        }
        other => status(other),
    }
}

pub(super) fn tombstone(t: Tombstone) -> pb::Tombstone {
    pb::Tombstone {
        session_id: t.session.to_string(),
        deleted_by: t.deleted_by,
        deleted_at_unix_ms: t.deleted_at_ms,
        nodes: t.nodes,
        branches: t.branches,
        summaries: t.summaries,
    }
}
