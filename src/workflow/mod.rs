//! The middle floor: every use case the doors run, in domain types, over the state they share.
//! Built once by the assembly (`server::serve_with`) and handed to each door, which parses its
//! transport's request, calls a use case here and presents the outcome (mapping [`Error`] once:
//! a gRPC status, a provider-shaped HTTP error, inspector JSON, a CLI exit code).
//!
//! - `render`: load a path and render it.
//! - `savings`: what a render policy saved over a session's model calls, replayed.
//! - `import`: a session file parsed off the I/O threads and written whole.
//! - `compaction`: prepare, commit (re-judged while the head moves), summaries, `Compact`.
//! - `record`: a model call's messages recorded (session, stored prefix, branch or fork,
//!   sub-agent functions, agents' compacted conversations), and `locate` without writing.
//! - `retention`: idle sessions deleted in the background.

pub mod compaction;
pub mod import;
pub mod record;
pub mod render;
pub mod retention;
pub mod savings;

use std::sync::Arc;

use crate::domain;
use crate::provider::models::ModelTable;
use crate::store::{self, Store};
use crate::summarizer::Summarizer;
use crate::tokens::TokenCache;

pub use compaction::Compactions;
pub use savings::SavingsReport;

/// Why a use case failed, whichever door asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store's and the domain's errors (`store::Error::Domain` for a bad input, naming its
    /// field).
    #[error(transparent)]
    Store(#[from] store::Error),
    /// A stored plan names a tokenizer this build does not know.
    #[error("a stored plan names an unknown tokenizer")]
    UnknownTokenizer,
    /// A blocking task (a render, a replay, a parse) did not finish (it panicked, logged where
    /// it happened); the name is the step's.
    #[error("{0} failed")]
    Task(&'static str),
}

impl From<domain::Error> for Error {
    fn from(error: domain::Error) -> Self {
        Self::Store(store::Error::Domain(error))
    }
}

/// What every door shares: the store, the token counts of every render, the compaction
/// workflow (with the server's summarizer, if any) and the sessions the gateway's keys named.
#[derive(Clone)]
pub struct Workflows {
    pub store: Store,
    pub tokens: Arc<TokenCache>,
    pub compactions: Arc<Compactions>,
    pub session_keys: Arc<record::SessionKeys>,
    /// The model table: windows, cache prices and reasoning rules by model.
    pub models: Arc<ModelTable>,
}

impl Workflows {
    pub fn new(store: Store, summarizer: Option<Summarizer>) -> Self {
        let tokens = Arc::new(TokenCache::default());
        let compactions = Arc::new(Compactions::new(
            store.clone(),
            Arc::clone(&tokens),
            summarizer.map(Arc::new),
        ));
        Self {
            store,
            tokens,
            compactions,
            session_keys: Arc::default(),
            models: Arc::default(),
        }
    }
}
