//! Server-sent events read incrementally from a byte stream, as the upstream sends them.

/// One event: its `event:` name (empty when none) and its `data:` lines joined by newlines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub name: String,
    pub data: String,
}

/// Splits bytes into events as they arrive; the bytes themselves are relayed elsewhere.
#[derive(Debug, Default)]
pub struct Parser {
    buf: Vec<u8>,
}

impl Parser {
    /// Takes the next bytes and returns the events they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Event> {
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some((end, skip)) = boundary(&self.buf) {
            let raw: Vec<u8> = self.buf.drain(..end + skip).take(end).collect();
            if let Some(event) = parse(&String::from_utf8_lossy(&raw)) {
                events.push(event);
            }
        }
        events
    }
}

/// The first blank line: where an event ends and how many bytes the separator takes.
fn boundary(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|p| (p, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| (p, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

fn parse(raw: &str) -> Option<Event> {
    let mut name = String::new();
    let mut data: Vec<&str> = Vec::new();
    for line in raw.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            name = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    (!data.is_empty() || !name.is_empty()).then(|| Event {
        name,
        data: data.join("\n"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks() {
        let mut p = Parser::default();
        assert!(p.feed(b"event: a\ndata: {\"x\"").is_empty());
        let got = p.feed(b":1}\n\ndata: [DONE]\r\n\r\n");
        assert_eq!(
            got,
            vec![
                Event {
                    name: "a".into(),
                    data: "{\"x\":1}".into()
                },
                Event {
                    name: String::new(),
                    data: "[DONE]".into()
                },
            ]
        );
    }
}
