//! The domain: ids, sessions, nodes, branches, pairing rules and hashing. Plain data, no I/O.

mod budget;
mod error;
mod hash;
mod history;
mod ids;
mod ledger;
mod node;
mod pairing;
mod prices;
mod session;
mod summary;
mod tenant;
mod usage;

pub use budget::Budget;
pub use error::Error;
pub use hash::{Hash, REFERENCE_CHARS, blob_hash, node_hash, parse_reference};
pub use history::{History, ImportedOverlay, Op, Snapshot};
pub use ids::{BranchName, GatewayCallId, NodeId, SessionId};
pub use ledger::{Command, ErrorLine, FileUse, FunctionUse, Ledger, normalize, paths_in};
pub use node::{
    ClosedChain, Expose, FunctionResult, FunctionStatus, MediaSource, Node, NodeContent, NodeKind,
    Part, PathView, ProviderBlock, Role, ToolCall, WireFormat,
};
pub use pairing::{Admit, ChainTail};
pub use prices::CachePrices;
pub use session::{Branch, Session, SessionFilter, Tombstone};
pub use summary::{
    CompactionEvent, CompactionId, EventKind, Reason, Summary, SummaryId, SummaryKind,
};
pub use tenant::Tenant;
pub use usage::{AskedEdit, GatewayCall, GatewayUsage, PrefixChange, ProviderUsage};

/// A node of `content` on no path, unhashed, at time zero: what unit tests build around.
#[cfg(test)]
pub(crate) fn loose_node(content: NodeContent) -> Node {
    Node {
        id: NodeId::new(),
        parent_id: None,
        function_id: None,
        content,
        created_at_ms: 0,
        hash: Hash([0; 32]),
    }
}
