//! The bars of the picture: cells of block characters, scaled to the budget or the total.

/// Cells of a bar; with the label and the numbers a line stays under 80 columns.
pub(super) const WIDTH: usize = 40;
const EIGHTHS: [char; 8] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'];

/// `n` of `scale` in eighth-block precision; a non-zero value shows at least a sliver.
pub(super) fn bar(n: u32, scale: u32) -> String {
    let eighths = (u64::from(n) * (WIDTH as u64) * 8).div_ceil(u64::from(scale));
    let eighths = usize::try_from(eighths).unwrap_or(WIDTH * 8).min(WIDTH * 8);
    let mut s = "█".repeat(eighths / 8);
    if eighths % 8 > 0 {
        s.push(EIGHTHS[eighths % 8]);
    }
    s
}

fn cells(n: u32, scale: u32) -> usize {
    let c = (u64::from(n) * WIDTH as u64 + u64::from(scale) / 2) / u64::from(scale);
    usize::try_from(c).unwrap_or(WIDTH).min(WIDTH)
}

/// The total: `█` within the budget, `▓` past it, `░` for the free space left.
pub(super) fn total_bar(total: u32, budget: Option<u32>, scale: u32) -> String {
    let used = cells(total, scale);
    let Some(budget) = budget else {
        return "█".repeat(used);
    };
    let limit = cells(budget, scale);
    (0..used.max(limit))
        .map(|i| match (i < used, i < limit) {
            (true, true) => '█',
            (true, false) => '▓',
            _ => '░',
        })
        .collect()
}

/// A rule up to the budget, ending in `┤`.
pub(super) fn budget_line(budget: u32, scale: u32) -> String {
    let at = cells(budget, scale).max(1);
    format!("{}┤", "─".repeat(at - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_budget() {
        assert_eq!(bar(0, 100), "");
        assert_eq!(bar(100, 100).chars().count(), WIDTH);
        assert_eq!(bar(50, 100), "█".repeat(WIDTH / 2));
        assert_eq!(bar(1, 1_000_000), "▏");
    }
}
