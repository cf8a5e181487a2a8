//! What the two SQL engines (`sqlite`, `postgres`) share: sqlx's errors as the store's
//! (`driver`), decoding a row's columns into the store's rows (`decode`), and the seam's reads
//! and writes whose logic is the same on both, written once (`reads`, `writes`) over what each
//! engine supplies: a connection that runs a statement, its own wording where the two differ,
//! and the few reads and writes whose statements are its own (`engine`).

pub(super) mod decode;
pub(super) mod driver;
mod engine;
pub(super) mod reads;
pub(super) mod writes;

pub(in crate::store) use engine::{Arg, Removed, Run, Sql, SqlWrite, ToArg, run_on_sqlx};
pub(in crate::store) use writes::{Tx, insert_nodes, insert_plan_row, node_values};

// The store's own names, as this folder's modules use them (`super::Result`).
use super::{Error, Fault, Result};
