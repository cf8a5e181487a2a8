//! DeleteSession, BackupDatabase and CollectGarbage: the RPCs that end a session's life or
//! look after the whole store.

use tonic::{Request, Status};

use super::pb;
use super::service::{ContextStoreService, Reply};

impl ContextStoreService {
    pub(super) async fn delete(
        &self,
        _request: Request<pb::DeleteSessionRequest>,
    ) -> Reply<pb::DeleteSessionResponse> {
        Err(Status::unimplemented("DeleteSession is not built yet"))
    }

    pub(super) async fn backup(
        &self,
        _request: Request<pb::BackupDatabaseRequest>,
    ) -> Reply<pb::BackupDatabaseResponse> {
        Err(Status::unimplemented("BackupDatabase is not built yet"))
    }

    pub(super) async fn collect(
        &self,
        _request: Request<pb::CollectGarbageRequest>,
    ) -> Reply<pb::CollectGarbageResponse> {
        Err(Status::unimplemented("CollectGarbage is not built yet"))
    }
}
