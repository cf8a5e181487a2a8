//! What the two SQL engines (`sqlite`, `postgres`) share: sqlx's errors as the store's
//! (`driver`), and decoding a result row's columns into the store's rows (`decode`).

pub(super) mod decode;
pub(super) mod driver;

// The store's own names, as this folder's modules use them (`super::Result`).
use super::{Error, Fault, Result};
