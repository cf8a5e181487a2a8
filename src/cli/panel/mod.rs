//! `ctxd context`: where the tokens go, as a picture that reads at 80 columns.
//!
//! One bar per category of the report's breakdown, scaled to the history budget (or to the total
//! when it is larger, or when there is no budget), the total against the budget line, the free
//! space, the pinned nodes' share (pins are never reduced), and what each tier of the engine
//! did. For a session the model gateway recorded, what it forwarded in all and its ledger: a
//! line per call, marking the calls whose cache read fell short of what was kept.

mod bars;
mod gateway;
mod picture;

pub use gateway::{LEDGER_NEWEST, gateway, ledger};
pub use picture::picture;
