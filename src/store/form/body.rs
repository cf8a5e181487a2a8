//! The stored form of node content: JSON whose content parts refer to blobs by hash.

use serde::{Deserialize, Serialize};

use super::Error;
use crate::domain::{
    ClosedChain, Expose, FunctionResult, FunctionStatus, Hash, MediaSource, NodeContent, NodeId,
    NodeKind, Part, ProviderBlock, Role, ToolCall, WireFormat, blob_hash,
};

#[derive(Serialize, Deserialize)]
#[serde(tag = "k")]
pub(in crate::store) enum Body {
    #[serde(rename = "message")]
    Message {
        role: String,
        parts: Vec<PartRef>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        calls: Vec<CallRow>,
    },
    #[serde(rename = "tool_result")]
    ToolResult {
        call_id: String,
        name: String,
        parts: Vec<PartRef>,
        #[serde(default, skip_serializing_if = "is_false")]
        is_error: bool,
    },
    #[serde(rename = "function_call")]
    FunctionCall {
        call_id: String,
        name: String,
        input: String,
        expose: String,
    },
    #[serde(rename = "function_result")]
    FunctionResult {
        call_id: String,
        output: String,
        status: String,
        function_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chain_head_id: Option<String>,
        chain_hash: String,
    },
}

#[derive(Serialize, Deserialize)]
pub(in crate::store) struct CallRow {
    id: String,
    name: String,
    args: String,
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
pub(in crate::store) enum PartRef {
    /// A text part: `t` is its blob's hash.
    Text { t: String },
    /// A short text part, in the body itself.
    Inline { s: String },
    Media {
        mime: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        blob: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        url: Option<String>,
    },
}

fn is_false(b: &bool) -> bool {
    !b
}

pub(in crate::store) fn kind_code(kind: NodeKind) -> i64 {
    match kind {
        NodeKind::Message => 1,
        NodeKind::ToolResult => 2,
        NodeKind::FunctionCall => 3,
        NodeKind::FunctionResult => 4,
    }
}

/// Texts shorter than this are stored in the node's body rather than as a blob: a blob row
/// and its hash index cost an append two more page writes, and a short text is rarely repeated
/// enough for its dedupe to pay. The body is compressed when that pays, inline texts included.
pub(super) const INLINE_TEXT_BYTES: usize = 1024;

/// Splits content into its stored body and the blobs it refers to.
pub(in crate::store) fn encode<'a>(content: &'a NodeContent) -> (String, Vec<(Hash, &'a [u8])>) {
    let mut blobs = Vec::new();
    let mut parts = |parts: &'a [Part]| -> Vec<PartRef> {
        parts
            .iter()
            .map(|part| match part {
                Part::Text(text) if text.len() < INLINE_TEXT_BYTES => {
                    PartRef::Inline { s: text.clone() }
                }
                Part::Text(text) => {
                    let hash = blob_hash(text.as_bytes());
                    blobs.push((hash, text.as_bytes()));
                    PartRef::Text { t: hash.to_hex() }
                }
                Part::Media { mime_type, source } => match source {
                    MediaSource::Data(data) => {
                        let hash = blob_hash(data);
                        blobs.push((hash, data.as_slice()));
                        PartRef::Media {
                            mime: mime_type.clone(),
                            blob: Some(hash.to_hex()),
                            url: None,
                        }
                    }
                    MediaSource::Url(url) => PartRef::Media {
                        mime: mime_type.clone(),
                        blob: None,
                        url: Some(url.clone()),
                    },
                },
                // Stored as the media part it was before blocks had a type of their own.
                Part::Block(block) => {
                    let hash = blob_hash(block.json.as_bytes());
                    blobs.push((hash, block.json.as_bytes()));
                    PartRef::Media {
                        mime: block.mime().to_owned(),
                        blob: Some(hash.to_hex()),
                        url: None,
                    }
                }
            })
            .collect()
    };
    let body = match content {
        NodeContent::Message {
            role,
            parts: p,
            tool_calls,
        } => Body::Message {
            role: role.as_str().to_owned(),
            parts: parts(p),
            calls: tool_calls
                .iter()
                .map(|c| CallRow {
                    id: c.call_id.clone(),
                    name: c.name.clone(),
                    args: c.arguments_json.clone(),
                })
                .collect(),
        },
        NodeContent::ToolResult {
            call_id,
            name,
            parts: p,
            is_error,
        } => Body::ToolResult {
            call_id: call_id.clone(),
            name: name.clone(),
            parts: parts(p),
            is_error: *is_error,
        },
        NodeContent::FunctionCall {
            call_id,
            name,
            input,
            expose,
        } => Body::FunctionCall {
            call_id: call_id.clone(),
            name: name.clone(),
            input: input.clone(),
            expose: match expose {
                Expose::Io => "io",
                Expose::Full => "full",
                Expose::None => "none",
            }
            .to_owned(),
        },
        NodeContent::FunctionResult(result) => {
            let chain = result
                .chain
                .as_ref()
                .expect("the store fills a function result's chain before encoding it");
            Body::FunctionResult {
                call_id: result.call_id.clone(),
                output: result.output.clone(),
                status: match result.status {
                    FunctionStatus::Completed => "completed",
                    FunctionStatus::Error => "error",
                }
                .to_owned(),
                function_id: chain.function_id.to_string(),
                chain_head_id: chain.head_id.map(|id| id.to_string()),
                chain_hash: chain.head_hash.to_hex(),
            }
        }
    };
    let json = serde_json::to_string(&body).expect("a body always serializes");
    (json, blobs)
}

impl Body {
    pub(in crate::store) fn parse(json: &str) -> Result<Self, Error> {
        serde_json::from_str(json).map_err(|e| Error::Corrupt(format!("node body: {e}")))
    }

    /// The blobs this body refers to.
    pub(in crate::store) fn blob_refs(&self) -> Vec<Hash> {
        let parts = match self {
            Body::Message { parts, .. } | Body::ToolResult { parts, .. } => parts.as_slice(),
            Body::FunctionCall { .. } | Body::FunctionResult { .. } => &[],
        };
        parts
            .iter()
            .filter_map(|p| match p {
                PartRef::Text { t } => Some(t.as_str()),
                PartRef::Inline { .. } => None,
                PartRef::Media { blob, .. } => blob.as_deref(),
            })
            .filter_map(|hex| parse_hash(hex).ok())
            .collect()
    }

    /// Rebuilds the content, taking blob bytes from `blob`.
    pub(in crate::store) fn decode(
        self,
        blob: &dyn Fn(&Hash) -> Option<Vec<u8>>,
    ) -> Result<NodeContent, Error> {
        let fetch = |hex: &str| -> Result<Vec<u8>, Error> {
            let hash = parse_hash(hex)?;
            blob(&hash).ok_or_else(|| Error::Corrupt(format!("missing blob {hex}")))
        };
        let parts = |parts: Vec<PartRef>| -> Result<Vec<Part>, Error> {
            parts
                .into_iter()
                .map(|p| {
                    Ok(match p {
                        PartRef::Text { t } => Part::Text(
                            String::from_utf8(fetch(&t)?)
                                .map_err(|_| Error::Corrupt(format!("blob {t} is not UTF-8")))?,
                        ),
                        PartRef::Inline { s } => Part::Text(s),
                        PartRef::Media {
                            mime,
                            blob: Some(hex),
                            ..
                        } if WireFormat::from_mime(&mime).is_some() => Part::Block(
                            ProviderBlock::stored(&mime, fetch(&hex)?)
                                .flatten()
                                .ok_or_else(|| {
                                    Error::Corrupt(format!("blob {hex} is not a UTF-8 block"))
                                })?,
                        ),
                        PartRef::Media { mime, blob, url } => Part::Media {
                            mime_type: mime,
                            source: match (blob, url) {
                                (Some(hex), _) => MediaSource::Data(fetch(&hex)?),
                                (None, Some(url)) => MediaSource::Url(url),
                                (None, None) => {
                                    return Err(Error::Corrupt("media part without source".into()));
                                }
                            },
                        },
                    })
                })
                .collect()
        };
        Ok(match self {
            Body::Message {
                role,
                parts: p,
                calls,
            } => NodeContent::Message {
                role: Role::from_str_opt(&role)
                    .ok_or_else(|| Error::Corrupt(format!("unknown role {role:?}")))?,
                parts: parts(p)?,
                tool_calls: calls
                    .into_iter()
                    .map(|c| ToolCall {
                        call_id: c.id,
                        name: c.name,
                        arguments_json: c.args,
                    })
                    .collect(),
            },
            Body::ToolResult {
                call_id,
                name,
                parts: p,
                is_error,
            } => NodeContent::ToolResult {
                call_id,
                name,
                parts: parts(p)?,
                is_error,
            },
            Body::FunctionCall {
                call_id,
                name,
                input,
                expose,
            } => NodeContent::FunctionCall {
                call_id,
                name,
                input,
                expose: match expose.as_str() {
                    "io" => Expose::Io,
                    "full" => Expose::Full,
                    "none" => Expose::None,
                    other => return Err(Error::Corrupt(format!("unknown expose {other:?}"))),
                },
            },
            Body::FunctionResult {
                call_id,
                output,
                status,
                function_id,
                chain_head_id,
                chain_hash,
            } => NodeContent::FunctionResult(FunctionResult {
                call_id,
                output,
                status: match status.as_str() {
                    "completed" => FunctionStatus::Completed,
                    "error" => FunctionStatus::Error,
                    other => return Err(Error::Corrupt(format!("unknown status {other:?}"))),
                },
                chain: Some(ClosedChain {
                    function_id: parse_id(&function_id)?,
                    head_id: chain_head_id.as_deref().map(parse_id).transpose()?,
                    head_hash: parse_hash(&chain_hash)?,
                }),
            }),
        })
    }
}

fn parse_hash(hex: &str) -> Result<Hash, Error> {
    blake3::Hash::from_hex(hex)
        .map(|h| Hash(*h.as_bytes()))
        .map_err(|_| Error::Corrupt(format!("bad hash {hex:?}")))
}

fn parse_id(text: &str) -> Result<NodeId, Error> {
    NodeId::parse("stored id", text).map_err(|_| Error::Corrupt(format!("bad node id {text:?}")))
}

#[cfg(test)]
mod tests {
    use crate::domain::{ProviderBlock, WireFormat};

    /// A reasoning block travels and is stored under its own format's reasoning MIME type, so
    /// a Gemini thought read back is still Gemini's, and still reasoning.
    #[test]
    fn reasoning_blocks_keep_their_format_through_the_store() {
        for format in [WireFormat::AnthropicMessages, WireFormat::Gemini] {
            let block = ProviderBlock {
                format,
                json: r#"{"thought":true}"#.to_owned(),
                reasoning: true,
            };
            let stored = ProviderBlock::stored(block.mime(), block.json.clone().into_bytes());
            assert_eq!(stored, Some(Some(block.clone())), "{}", format.name());
            let sent = ProviderBlock::from_media(block.mime(), block.json.clone().into_bytes());
            assert_eq!(sent, Some(Some(block)), "{}", format.name());
        }
    }
}
