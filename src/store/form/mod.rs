//! The stored form of what the store writes, the same for every engine: node rows, ids, hashes
//! and packed lists (`rows`), node content as JSON that refers to blobs (`body`), the zstd codec
//! of blobs and bodies (`codec`), and the clock stamped on rows (`clock`).

pub(super) mod body;
pub(super) mod clock;
pub(super) mod codec;
pub(super) mod rows;

// The store's own names, as this folder's modules use them (`super::Error`).
use super::{Error, Result};
