//! Content addressing: blob hashes and node hashes over a canonical, length-prefixed encoding.
//!
//! The encoding is defined here, not by a storage format, so every backend computes the same
//! hashes: equal histories have equal head hashes, like git commit ids.

use std::fmt;

use super::{Expose, FunctionStatus, MediaSource, NodeContent, Part, Role};

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hash(pub [u8; 32]);

/// Hexadecimal characters of a node's reference: 48 bits, unique among any session's nodes in
/// practice, and short enough to name in every placeholder.
pub const REFERENCE_CHARS: usize = 12;

impl Hash {
    pub fn to_hex(&self) -> String {
        blake3::Hash::from_bytes(self.0).to_hex().to_string()
    }

    /// The short reference a render's placeholders name this node by, for `Recall`: the first
    /// [`REFERENCE_CHARS`] hexadecimal characters of the hash.
    pub fn reference(&self) -> String {
        let mut hex = self.to_hex();
        hex.truncate(REFERENCE_CHARS);
        hex
    }
}

/// The hash prefix a reference names, or `None` when it is not [`REFERENCE_CHARS`] lowercase or
/// uppercase hexadecimal characters.
pub fn parse_reference(reference: &str) -> Option<[u8; REFERENCE_CHARS / 2]> {
    let bytes = reference.as_bytes();
    if bytes.len() != REFERENCE_CHARS {
        return None;
    }
    let mut out = [0u8; REFERENCE_CHARS / 2];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = u8::try_from(hi * 16 + lo).ok()?;
    }
    Some(out)
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash({})", self.to_hex())
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// The key of a content blob.
pub fn blob_hash(bytes: &[u8]) -> Hash {
    Hash(*blake3::hash(bytes).as_bytes())
}

/// BLAKE3 over the parent's hash, the enclosing function's hash and the canonical content.
/// Ids and times are not content: they never enter the hash.
pub fn node_hash(parent: Option<&Hash>, function: Option<&Hash>, content: &NodeContent) -> Hash {
    let mut h = Canonical(blake3::Hasher::new());
    h.bytes(b"ctxd/node/v1");
    h.opt_hash(parent);
    h.opt_hash(function);
    match content {
        NodeContent::Message {
            role,
            parts,
            tool_calls,
        } => {
            h.tag(1);
            h.tag(match role {
                Role::System => 1,
                Role::Developer => 2,
                Role::User => 3,
                Role::Assistant => 4,
            });
            h.parts(parts);
            h.len(tool_calls.len());
            for call in tool_calls {
                h.str(&call.call_id);
                h.str(&call.name);
                h.str(&call.arguments_json);
            }
        }
        NodeContent::ToolResult {
            call_id,
            name,
            parts,
            is_error,
        } => {
            h.tag(2);
            h.str(call_id);
            h.str(name);
            h.parts(parts);
            h.tag(u8::from(*is_error));
        }
        NodeContent::FunctionCall {
            call_id,
            name,
            input,
            expose,
        } => {
            h.tag(3);
            h.str(call_id);
            h.str(name);
            h.str(input);
            h.tag(match expose {
                Expose::Io => 1,
                Expose::Full => 2,
                Expose::None => 3,
            });
        }
        NodeContent::FunctionResult(result) => {
            h.tag(4);
            h.str(&result.call_id);
            h.str(&result.output);
            h.tag(match result.status {
                FunctionStatus::Completed => 1,
                FunctionStatus::Error => 2,
            });
            h.opt_hash(result.chain.as_ref().map(|c| &c.head_hash));
        }
    }
    Hash(*h.0.finalize().as_bytes())
}

struct Canonical(blake3::Hasher);

impl Canonical {
    fn tag(&mut self, tag: u8) {
        self.0.update(&[tag]);
    }

    fn len(&mut self, len: usize) {
        self.0.update(&(len as u64).to_le_bytes());
    }

    fn bytes(&mut self, bytes: &[u8]) {
        self.len(bytes.len());
        self.0.update(bytes);
    }

    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }

    fn opt_hash(&mut self, hash: Option<&Hash>) {
        match hash {
            Some(hash) => {
                self.tag(1);
                self.0.update(&hash.0);
            }
            None => self.tag(0),
        }
    }

    fn parts(&mut self, parts: &[Part]) {
        // The model's reasoning is not what a message says (`ProviderBlock::reasoning`).
        let said = |p: &&Part| !matches!(p, Part::Block(b) if b.reasoning);
        self.len(parts.iter().filter(said).count());
        for part in parts.iter().filter(said) {
            match part {
                Part::Text(text) => {
                    self.tag(1);
                    self.0.update(&blob_hash(text.as_bytes()).0);
                }
                Part::Media { mime_type, source } => {
                    self.tag(2);
                    self.str(mime_type);
                    match source {
                        MediaSource::Data(data) => {
                            self.tag(1);
                            self.0.update(&blob_hash(data).0);
                        }
                        MediaSource::Url(url) => {
                            self.tag(2);
                            self.str(url);
                        }
                    }
                }
                // Hashed as the media part it was stored as before it had a type of its own,
                // so those sessions keep their identities.
                Part::Block(block) => {
                    self.tag(2);
                    self.str(block.mime());
                    self.tag(1);
                    self.0.update(&blob_hash(block.json.as_bytes()).0);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> NodeContent {
        NodeContent::Message {
            role: Role::User,
            parts: vec![Part::Text(text.to_owned())],
            tool_calls: vec![],
        }
    }

    #[test]
    fn hash_covers_parent_and_content() {
        let a = node_hash(None, None, &user("hi"));
        assert_eq!(a, node_hash(None, None, &user("hi")));
        assert_ne!(a, node_hash(None, None, &user("hi!")));
        assert_ne!(a, node_hash(Some(&a), None, &user("hi")));
        assert_ne!(a, node_hash(None, Some(&a), &user("hi")));
    }

    #[test]
    fn length_prefixes_keep_fields_apart() {
        let split = |a: &str, b: &str| NodeContent::ToolResult {
            call_id: a.to_owned(),
            name: b.to_owned(),
            parts: vec![],
            is_error: false,
        };
        assert_ne!(
            node_hash(None, None, &split("ab", "c")),
            node_hash(None, None, &split("a", "bc"))
        );
    }
}
