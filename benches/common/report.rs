//! What several benches print alike: a Markdown table sized to its cells, and the harness family
//! of a trace of `testdata/traces` (by its file name's prefix, as that folder's README lists them).

// Each bench takes what it needs of this module.
#![allow(dead_code)]

/// The harness families of the traces, in the order the tables show them.
pub const FAMILIES: [(&str, &str); 6] = [
    ("cc-", "Claude Code"),
    ("swe-", "SWE-agent"),
    ("mini-", "mini-swe-agent"),
    ("openhands-", "OpenHands"),
    ("codex-", "Codex CLI"),
    // The economy bench's mini-swe-agent sessions reshaped as that harness sends them.
    ("sent-mini-", "mini, as sent"),
];

/// The family of the trace named `name`.
pub fn family(name: &str) -> &'static str {
    FAMILIES
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map_or("other", |(_, family)| family)
}

/// Prints `cells` under `header` as a Markdown table: the first and last columns are text (left
/// aligned), the others numbers (right aligned).
pub fn print_table<const N: usize>(header: [&str; N], cells: &[[String; N]]) {
    let mut widths = header.map(|h| h.chars().count());
    for row in cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let text = |i: usize| i == 0 || i == N - 1;
    let line = |cells: &[String]| {
        let mut out = String::from("|");
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            let pad = " ".repeat(w - cell.chars().count());
            if text(i) {
                out.push_str(&format!(" {cell}{pad} |"));
            } else {
                out.push_str(&format!(" {pad}{cell} |"));
            }
        }
        out
    };
    println!("{}", line(&header.map(String::from)));
    let mut rule = String::from("|");
    for (i, w) in widths.iter().enumerate() {
        if text(i) {
            rule.push_str(&format!("{}|", "-".repeat(w + 2)));
        } else {
            rule.push_str(&format!("{}:|", "-".repeat(w + 1)));
        }
    }
    println!("{rule}");
    for row in cells {
        println!("{}", line(row));
    }
}
