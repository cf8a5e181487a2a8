//! The PostgreSQL backend's fault classifier: what a failed statement means for the caller, by
//! its SQLSTATE.

use crate::store::Fault;

/// The fault a PostgreSQL error code stands for.
pub(crate) fn classify(code: &str) -> Fault {
    match code {
        // disk_full, and the other insufficient resources.
        "53100" => Fault::Full,
        c if c.starts_with("53") => Fault::Unavailable,
        // deadlock_detected, serialization_failure: the transaction was rolled back for a
        // concurrent one.
        "40P01" | "40001" => Fault::Conflict,
        // unique_violation: a concurrent writer (another replica) stored the same key first,
        // e.g. an append's retry racing its original; checked again, the stored one answers.
        "23505" => Fault::Conflict,
        // ctxd_append_at_once found a head moved on by a concurrent writer (migration 0007):
        // nothing was written, and the batch is checked again.
        "CTXHM" => Fault::Conflict,
        // lock_not_available.
        "55P03" => Fault::Busy,
        // connection exceptions, admin or crash shutdown, cannot connect now, read-only.
        c if c.starts_with("08") => Fault::Unavailable,
        "57P01" | "57P02" | "57P03" | "25006" => Fault::Unavailable,
        // data_corrupted, index_corrupted.
        "XX001" | "XX002" => Fault::Corrupt,
        _ => Fault::Internal,
    }
}
