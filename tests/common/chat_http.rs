//! The HTTP/1.1 side of the fake chat-completions endpoints the tests point the summarizer at:
//! reading one request off a connection, the body of a completion, writing an answer.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A request larger than this is refused (the connection dropped).
const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

/// Reads one request (its head, and as many body bytes as `content-length` announces) from
/// `stream` and returns head and body; `buf` keeps what was read past it, for the next request
/// on the connection. `None` when the peer closes first or the request is too large.
pub async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut chunk = vec![0u8; 64 * 1024];
    let mut head_end = None;
    let mut want = None;
    // Each round reads at least one byte, and the request is capped in size.
    for _ in 0..MAX_REQUEST_BYTES {
        if head_end.is_none() {
            head_end = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4);
        }
        if let Some(end) = head_end {
            let length = *want.get_or_insert_with(|| {
                String::from_utf8_lossy(&buf[..end])
                    .lines()
                    .filter_map(|l| l.split_once(':'))
                    .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, v)| v.trim().parse::<usize>().ok())
                    .unwrap_or(0)
            });
            if buf.len() >= end + length {
                let rest = buf.split_off(end + length);
                let mut head = std::mem::replace(buf, rest);
                let body = head.split_off(end);
                return Some((head, body));
            }
        }
        if buf.len() > MAX_REQUEST_BYTES {
            return None;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    None
}

/// A 200 chat completion whose assistant message is `content`, as JSON.
pub fn completion(content: &str) -> String {
    serde_json::json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": "stop",
        }],
    })
    .to_string()
}

/// Writes a JSON answer with `status`; with `close`, says so and shuts the connection.
pub async fn respond(
    stream: &mut TcpStream,
    status: u16,
    body: &str,
    close: bool,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{}\r\n",
        if status < 400 { "OK" } else { "Error" },
        body.len(),
        if close { "connection: close\r\n" } else { "" },
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.flush().await?;
    if close {
        stream.shutdown().await?;
    }
    Ok(())
}
