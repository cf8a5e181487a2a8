//! ctxd JSONL (`crate::export`'s full-fidelity format) read back into a plan: nodes keep their
//! parents (a top-level node whose parent is not the node before it forks), chains their
//! functions, and branches, summaries and pins refer to the nodes by their exported ids.
//!
//! Nothing is repaired: the file is a stored session, so a record that does not fit is an error
//! naming its line and field, and the store's checks refuse what breaks the append rules.

use std::collections::{BTreeMap, HashMap};

use base64::Engine as _;
use serde_json::Value;

use super::{History, Op, json_lines, string_field};
use crate::domain::{
    BranchName, Error, Expose, FunctionResult, FunctionStatus, ImportedOverlay, Ledger,
    MediaSource, NodeContent, Part, ProviderBlock, Role, SummaryKind, ToolCall, WireFormat,
};
use crate::provider::canonical::canonical;

/// Where an exported node went: its op, and whether it is top-level.
struct Placed {
    op: usize,
    top_level: bool,
    function_call: bool,
}

#[derive(Default)]
struct Reader {
    plan: History,
    nodes: HashMap<String, Placed>,
    summaries: HashMap<String, usize>,
    /// The top-level node written last (where `main`, the write cursor, stands).
    cursor: Option<usize>,
    /// Function op → the op of the last node of its chain.
    chain_heads: HashMap<usize, usize>,
}

pub(super) fn parse(text: &str) -> Result<History, Error> {
    let mut r = Reader::default();
    let mut header = false;
    for record in json_lines(text) {
        let (line, at, v) = record?;
        let record = string_field(&v, &at, "ctxd")?;
        if !header {
            if record != "session" {
                return Err(Error::invalid(
                    format!("{at}.ctxd"),
                    "the first record must be the `session` header",
                ));
            }
            match v.get("version").and_then(Value::as_u64) {
                Some(crate::export::VERSION) => {}
                _ => {
                    return Err(Error::invalid(
                        format!("{at}.version"),
                        format!("must be {}", crate::export::VERSION),
                    ));
                }
            }
            r.plan.metadata = metadata(v.get("metadata"), &at)?;
            header = true;
            continue;
        }
        match record {
            "node" => r.node(&v, line, &at)?,
            "branch" => r.branch(&v, line, &at)?,
            "summary" => r.summary(&v, line, &at)?,
            "pin" => {
                let node = r.node_op(&v, &at, "node")?;
                r.plan.ops.push(Op::Pin { node, line });
            }
            other => {
                return Err(Error::invalid(
                    format!("{at}.ctxd"),
                    format!("unknown record {other:?}; expected node, branch, summary or pin"),
                ));
            }
        }
    }
    if !header {
        return Err(Error::invalid("line 1", "no `session` header"));
    }
    Ok(r.plan)
}

impl Reader {
    /// The op of the node whose exported id is `v[field]`, which an earlier line must hold.
    fn node_op(&self, v: &Value, at: &str, field: &str) -> Result<usize, Error> {
        let id = string_field(v, at, field)?;
        self.known(id, &format!("{at}.{field}"))
    }

    fn known(&self, id: &str, at: &str) -> Result<usize, Error> {
        self.nodes
            .get(id)
            .map(|p| p.op)
            .ok_or_else(|| Error::invalid(at, format!("node {id:?} is not on an earlier line")))
    }

    /// An optional id field (`null` or absent: none).
    fn optional<'v>(v: &'v Value, at: &str, field: &str) -> Result<Option<&'v str>, Error> {
        match v.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(Error::invalid(
                format!("{at}.{field}"),
                "must be a string or null",
            )),
        }
    }

    fn node(&mut self, v: &Value, line: usize, at: &str) -> Result<(), Error> {
        let id = string_field(v, at, "id")?;
        if self.nodes.contains_key(id) {
            return Err(Error::invalid(
                format!("{at}.id"),
                format!("node {id:?} appears twice"),
            ));
        }
        let parent = match Self::optional(v, at, "parent")? {
            Some(p) => Some(self.known(p, &format!("{at}.parent"))?),
            None => None,
        };
        let function = match Self::optional(v, at, "function")? {
            Some(f) => {
                let field = format!("{at}.function");
                let placed = self.nodes.get(f).ok_or_else(|| {
                    Error::invalid(&field, format!("node {f:?} is not on an earlier line"))
                })?;
                if !placed.function_call {
                    return Err(Error::invalid(
                        field,
                        format!("node {f:?} is no function_call"),
                    ));
                }
                Some(placed.op)
            }
            None => None,
        };
        let content = content(v, at)?;
        match function {
            Some(f) => {
                // A chain is linear: each node hangs under the last one (the call for the first).
                let head = self.chain_heads.get(&f).copied().unwrap_or(f);
                if parent != Some(head) {
                    return Err(Error::invalid(
                        format!("{at}.parent"),
                        "must be the previous node of its function's chain (or the call)",
                    ));
                }
            }
            None => {
                if let Some(p) = parent
                    && !self.nodes.values().any(|n| n.op == p && n.top_level)
                {
                    return Err(Error::invalid(
                        format!("{at}.parent"),
                        "a top-level node's parent must be top-level",
                    ));
                }
                if parent != self.cursor {
                    self.plan.ops.push(Op::Fork { from: parent, line });
                }
            }
        }
        let function_call = matches!(content, NodeContent::FunctionCall { .. });
        self.plan.ops.push(Op::Node {
            scope: function,
            content,
            line,
        });
        let op = self.plan.ops.len() - 1;
        match function {
            Some(f) => {
                self.chain_heads.insert(f, op);
            }
            None => self.cursor = Some(op),
        }
        self.nodes.insert(
            id.to_owned(),
            Placed {
                op,
                top_level: function.is_none(),
                function_call,
            },
        );
        Ok(())
    }

    fn branch(&mut self, v: &Value, line: usize, at: &str) -> Result<(), Error> {
        let name = BranchName::parse(&format!("{at}.name"), string_field(v, at, "name")?)?;
        let head = match Self::optional(v, at, "head")? {
            Some(h) => {
                let field = format!("{at}.head");
                match self.nodes.get(h) {
                    Some(p) if p.top_level => Some(p.op),
                    Some(_) => {
                        return Err(Error::invalid(field, "a branch points at a top-level node"));
                    }
                    None => {
                        return Err(Error::invalid(
                            field,
                            format!("node {h:?} is not on an earlier line"),
                        ));
                    }
                }
            }
            None => None,
        };
        self.plan.ops.push(Op::Branch { name, head, line });
        Ok(())
    }

    fn summary(&mut self, v: &Value, line: usize, at: &str) -> Result<(), Error> {
        let id = string_field(v, at, "id")?;
        let kind = string_field(v, at, "kind")?;
        let kind = SummaryKind::parse(kind).ok_or_else(|| {
            Error::invalid(
                format!("{at}.kind"),
                format!("unknown kind {kind:?}; expected rolling or segment"),
            )
        })?;
        let ids = |field: &str| -> Result<Vec<&str>, Error> {
            v.get(field)
                .and_then(Value::as_array)
                .ok_or_else(|| Error::invalid(format!("{at}.{field}"), "must be an array"))?
                .iter()
                .enumerate()
                .map(|(k, x)| {
                    x.as_str().ok_or_else(|| {
                        Error::invalid(format!("{at}.{field}[{k}]"), "must be a string")
                    })
                })
                .collect()
        };
        let covers = ids("covers")?
            .into_iter()
            .enumerate()
            .map(|(k, id)| self.known(id, &format!("{at}.covers[{k}]")))
            .collect::<Result<Vec<_>, _>>()?;
        if covers.is_empty() {
            return Err(Error::invalid(format!("{at}.covers"), "is empty"));
        }
        let range = match v.get("range") {
            None | Some(Value::Null) => None,
            Some(Value::Array(pair)) if pair.len() == 2 => {
                let end = |k: usize| {
                    pair[k]
                        .as_str()
                        .ok_or_else(|| {
                            Error::invalid(format!("{at}.range[{k}]"), "must be a string")
                        })
                        .and_then(|id| self.known(id, &format!("{at}.range[{k}]")))
                };
                Some((end(0)?, end(1)?))
            }
            Some(_) => {
                return Err(Error::invalid(
                    format!("{at}.range"),
                    "must be null or two node ids",
                ));
            }
        };
        let rolls_over = ids("rolls_over")?
            .into_iter()
            .enumerate()
            .map(|(k, id)| {
                self.summaries.get(id).copied().ok_or_else(|| {
                    Error::invalid(
                        format!("{at}.rolls_over[{k}]"),
                        format!("summary {id:?} is not on an earlier line"),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ledger: Option<Ledger> = match v.get("ledger") {
            None | Some(Value::Null) => None,
            Some(l) => Some(
                serde_json::from_value(l.clone())
                    .map_err(|e| Error::invalid(format!("{at}.ledger"), e.to_string()))?,
            ),
        };
        let number = |field: &str| -> Result<u32, Error> {
            v.get(field)
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| Error::invalid(format!("{at}.{field}"), "must be a count"))
        };
        let overlay = ImportedOverlay {
            kind,
            covers,
            range,
            text: string_field(v, at, "text")?.to_owned(),
            rolls_over,
            ledger,
            model: string_field(v, at, "model")?.to_owned(),
            base_head: self.node_op(v, at, "base_head")?,
            tokens_before: number("tokens_before")?,
            tokens_after: number("tokens_after")?,
            created_at_ms: v
                .get("created_at_ms")
                .and_then(Value::as_i64)
                .ok_or_else(|| {
                    Error::invalid(format!("{at}.created_at_ms"), "must be an integer")
                })?,
        };
        if self.summaries.contains_key(id) {
            return Err(Error::invalid(
                format!("{at}.id"),
                format!("summary {id:?} appears twice"),
            ));
        }
        self.plan.ops.push(Op::Overlay {
            overlay: Box::new(overlay),
            line,
        });
        self.summaries
            .insert(id.to_owned(), self.plan.ops.len() - 1);
        Ok(())
    }
}

fn metadata(v: Option<&Value>, at: &str) -> Result<BTreeMap<String, String>, Error> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(BTreeMap::new());
    };
    let map = v
        .as_object()
        .ok_or_else(|| Error::invalid(format!("{at}.metadata"), "must be an object"))?;
    map.iter()
        .map(|(k, x)| {
            x.as_str()
                .map(|s| (k.clone(), s.to_owned()))
                .ok_or_else(|| Error::invalid(format!("{at}.metadata.{k}"), "must be a string"))
        })
        .collect()
}

fn content(v: &Value, at: &str) -> Result<NodeContent, Error> {
    let kind = string_field(v, at, "kind")?;
    let owned = |field: &str| string_field(v, at, field).map(str::to_owned);
    Ok(match kind {
        "message" => {
            let role = string_field(v, at, "role")?;
            let role = Role::from_str_opt(role).ok_or_else(|| {
                Error::invalid(format!("{at}.role"), format!("unknown role {role:?}"))
            })?;
            let calls = array(v, at, "tool_calls")?
                .iter()
                .enumerate()
                .map(|(k, c)| {
                    let at = format!("{at}.tool_calls[{k}]");
                    Ok(ToolCall {
                        call_id: string_field(c, &at, "call_id")?.to_owned(),
                        name: string_field(c, &at, "name")?.to_owned(),
                        arguments_json: string_field(c, &at, "arguments_json")?.to_owned(),
                    })
                })
                .collect::<Result<Vec<_>, Error>>()?;
            NodeContent::Message {
                role,
                parts: parts(v, at)?,
                tool_calls: calls,
            }
        }
        "tool_result" => NodeContent::ToolResult {
            call_id: owned("call_id")?,
            name: owned("name")?,
            parts: parts(v, at)?,
            is_error: v
                .get("is_error")
                .and_then(Value::as_bool)
                .ok_or_else(|| Error::invalid(format!("{at}.is_error"), "must be a boolean"))?,
        },
        "function_call" => NodeContent::FunctionCall {
            call_id: owned("call_id")?,
            name: owned("name")?,
            input: owned("input")?,
            expose: match string_field(v, at, "expose")? {
                "io" => Expose::Io,
                "full" => Expose::Full,
                "none" => Expose::None,
                other => {
                    return Err(Error::invalid(
                        format!("{at}.expose"),
                        format!("unknown value {other:?}; expected io, full or none"),
                    ));
                }
            },
        },
        "function_result" => NodeContent::FunctionResult(FunctionResult {
            call_id: owned("call_id")?,
            output: owned("output")?,
            status: match string_field(v, at, "status")? {
                "completed" => FunctionStatus::Completed,
                "error" => FunctionStatus::Error,
                other => {
                    return Err(Error::invalid(
                        format!("{at}.status"),
                        format!("unknown value {other:?}; expected completed or error"),
                    ));
                }
            },
            chain: None,
        }),
        other => {
            return Err(Error::invalid(
                format!("{at}.kind"),
                format!(
                    "unknown kind {other:?}; expected message, tool_result, function_call or function_result"
                ),
            ));
        }
    })
}

fn array<'v>(v: &'v Value, at: &str, field: &str) -> Result<&'v [Value], Error> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(Error::invalid(format!("{at}.{field}"), "must be an array")),
    }
}

fn parts(v: &Value, at: &str) -> Result<Vec<Part>, Error> {
    array(v, at, "parts")?
        .iter()
        .enumerate()
        .map(|(k, p)| {
            let at = format!("{at}.parts[{k}]");
            if let Some(text) = p.get("text") {
                return text
                    .as_str()
                    .map(|t| Part::Text(t.to_owned()))
                    .ok_or_else(|| Error::invalid(format!("{at}.text"), "must be a string"));
            }
            if let Some(block) = p.get("block") {
                return provider_block(block, &format!("{at}.block"));
            }
            let mime_type = string_field(p, &at, "mime_type")?.to_owned();
            let source = match (p.get("data"), p.get("url")) {
                (Some(Value::String(data)), _) => MediaSource::Data(
                    base64::engine::general_purpose::STANDARD
                        .decode(data)
                        .map_err(|e| {
                            Error::invalid(format!("{at}.data"), format!("bad base64: {e}"))
                        })?,
                ),
                (None, Some(Value::String(url))) => MediaSource::Url(url.clone()),
                _ => {
                    return Err(Error::invalid(
                        at,
                        "needs `text`, or `mime_type` with `data` (base64) or `url`",
                    ));
                }
            };
            // Files written before blocks had a form of their own carry them as media.
            if let MediaSource::Data(data) = &source
                && WireFormat::from_mime(&mime_type).is_some()
                && let Some(block) = ProviderBlock::from_media(&mime_type, data.clone())
            {
                return block
                    .map(Part::Block)
                    .ok_or_else(|| Error::invalid(format!("{at}.data"), "must be a JSON block"));
            }
            Ok(Part::Media { mime_type, source })
        })
        .collect()
}

/// A kept provider block: `{format, value}`, its JSON written canonically as when it was kept.
fn provider_block(v: &Value, at: &str) -> Result<Part, Error> {
    let name = string_field(v, at, "format")?;
    let format = WireFormat::from_name(name).ok_or_else(|| {
        Error::invalid(
            format!("{at}.format"),
            format!("unknown format {name:?} (anthropic_messages, chat_completions, responses)"),
        )
    })?;
    match v.get("value") {
        Some(value) if !value.is_null() => Ok(Part::Block(ProviderBlock {
            format,
            json: canonical(value),
            reasoning: match v.get("reasoning") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(Error::invalid(
                        format!("{at}.reasoning"),
                        "must be a boolean",
                    ));
                }
            },
        })),
        _ => Err(Error::invalid(format!("{at}.value"), "is required")),
    }
}
