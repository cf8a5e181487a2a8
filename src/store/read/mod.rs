//! Reading: nodes, logs and a render's path with the read cache (`reads`), the branch starts
//! renders remember (`states`), the signal a committed write sends (`changes`), watching a
//! session (`watch`), a node by its reference (`recall`), and a whole session for export
//! (`export`).

pub(super) mod changes;
pub(super) mod export;
pub(super) mod reads;
pub(super) mod recall;
pub(super) mod states;
pub(super) mod watch;

// The store's own names, as this folder's modules use them (`super::Result`).
use super::{Error, Result, Scoped, Store};
