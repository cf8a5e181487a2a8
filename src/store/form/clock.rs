//! The clock the store stamps on what it writes (`now_ms`).

use std::time::{SystemTime, UNIX_EPOCH};

/// The wall clock in Unix milliseconds: what the store stamps on what it writes, and what a
/// render's `now` defaults to. The engine never calls it.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
