//! ExportSession: a session streamed out at one consistent head, as ctxd JSONL or one branch in
//! a provider's format.

use std::pin::Pin;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::pb;
use super::service::{ContextStoreService, Reply};

pub type ExportStream = Pin<Box<dyn Stream<Item = Result<pb::ExportChunk, Status>> + Send>>;

impl ContextStoreService {
    pub(super) async fn export(
        &self,
        _request: Request<pb::ExportSessionRequest>,
    ) -> Reply<ExportStream> {
        Err::<Response<ExportStream>, _>(Status::unimplemented("ExportSession is not built yet"))
    }
}
