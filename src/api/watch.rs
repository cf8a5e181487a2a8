//! Watch: a session or one branch followed as it changes, resumable by cursor.

use std::pin::Pin;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::pb;
use super::service::{ContextStoreService, Reply};

pub type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

impl ContextStoreService {
    pub(super) async fn follow(&self, _request: Request<pb::WatchRequest>) -> Reply<WatchStream> {
        Err::<Response<WatchStream>, _>(Status::unimplemented("Watch is not built yet"))
    }
}
