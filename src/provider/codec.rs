//! The one interface every wire format implements (`Codec`), the one answer assembly they share
//! (`Answer` over a format's `Events`), and the table of codecs the gateway routes by path.
//!
//! A codec reads a request into the `Conversation` the gateway records, writes rendered
//! messages as the entries of the member that holds the conversation, reads its provider's
//! answer (streamed events or a whole body, usage included) and shapes an error as its provider
//! does. Nothing above `provider` names a format's fields: a door holds a `&'static dyn Codec`.

use serde_json::Value;

use super::answer::Relayed;
use super::conversation::{Conversation, Refusal};
use crate::domain::{NodeContent, ProviderBlock, ProviderUsage, WireFormat};
use crate::render::Message;

/// Which of the gateway's upstreams a format's requests go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upstream {
    Anthropic,
    OpenAi,
    Google,
}

impl Upstream {
    /// The provider's own API, the base URL (without a version) its calls go to by default.
    pub const fn default_url(self) -> &'static str {
        match self {
            Self::Anthropic => "https://api.anthropic.com",
            Self::OpenAi => "https://api.openai.com",
            Self::Google => "https://generativelanguage.googleapis.com",
        }
    }
}

/// What a request to one of a codec's paths asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A model call: recorded, rendered, forwarded, its answer appended.
    Generate,
    /// A count of the request's tokens: answered for what the gateway would forward.
    Count,
    /// Anything else the provider serves at that path: forwarded as sent.
    Other,
}

/// Why the gateway answers a request itself, in words every provider has one for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The request is not one of the endpoint's (400).
    Invalid,
    /// ctxd's key is missing or wrong (401).
    Unauthenticated,
    /// A path the gateway does not serve (404).
    NotFound,
    /// The body is over the gateway's limit (413).
    TooLarge,
    /// The upstream could not be reached or its answer not relayed (502).
    Upstream,
    /// The server is at its limit of calls at once (429).
    Busy,
    /// The server is shutting down and takes no new calls (503).
    Unavailable,
}

/// A request as a codec reads it: the path it came to (a Gemini path names the model and
/// whether the answer streams) and its parsed body.
pub struct Request<'a> {
    pub path: &'a str,
    pub body: Value,
    /// The request's headers with a text value, names lowercase, in order.
    pub headers: &'a [(&'a str, &'a str)],
}

impl Request<'_> {
    /// Every value of header `name`, each comma-separated list split.
    pub fn values<'h>(&'h self, name: &'h str) -> impl Iterator<Item = &'h str> + 'h {
        self.headers
            .iter()
            .filter(move |(n, _)| *n == name)
            .flat_map(|(_, v)| v.split(','))
            .map(str::trim)
    }
}

/// What names a wire format at the gateway.
#[derive(Debug)]
pub struct Spec {
    /// The name metrics and logs use (`anthropic`, `openai`, `responses`, `gemini`).
    pub name: &'static str,
    pub upstream: Upstream,
    /// The gateway's routes for this format, as axum paths.
    pub routes: &'static [&'static str],
    /// The body member that holds the conversation, which the render replaces.
    pub field: &'static str,
}

/// Reads a request that resends an earlier one of its conversation: the same path and headers,
/// every member beside [`Codec::field`] byte-identical, and that member's first `from` entries
/// byte-identical to those `previous` was read from (`previous`: what [`Codec::read`] or this
/// reader gave for it; its headers' say is in it). Only the other entries (`tail`) are read; the
/// result is what [`Codec::read`] gives for the whole request. `None`: read it whole (a tail
/// the reader does not take).
pub type ReadResent = fn(
    previous: &Conversation,
    from: usize,
    tail: Vec<Value>,
) -> Option<Result<Conversation, Refusal>>;

/// One provider wire format.
pub trait Codec: Sync + Send {
    fn spec(&self) -> &'static Spec;

    fn name(&self) -> &'static str {
        self.spec().name
    }

    fn upstream(&self) -> Upstream {
        self.spec().upstream
    }

    fn routes(&self) -> &'static [&'static str] {
        self.spec().routes
    }

    fn field(&self) -> &'static str {
        self.spec().field
    }

    /// Whether a request to a path none of the routes serve is this provider's, by its path
    /// and the headers it has (OpenAI's upstream takes what no codec claims).
    fn claims(&self, _path: &str, _has_header: &dyn Fn(&str) -> bool) -> bool {
        false
    }

    /// Whether the provider serves `path` at all; another is answered 404.
    fn serves(&self, path: &str) -> bool {
        path.starts_with("/v1/")
    }

    /// What a request to `path` (one of [`Codec::routes`]) asks for: a model call, unless the
    /// format serves more than that.
    fn action(&self, _path: &str) -> Action {
        Action::Generate
    }

    /// Reads a request, taking its texts rather than copying them where it can.
    fn read(&self, request: Request<'_>) -> Result<Conversation, Refusal>;

    /// How the format reads a request that resends an earlier one, when it can ([`ReadResent`]);
    /// `None`: its requests are read whole, and none is remembered for it.
    fn read_resent(&self) -> Option<ReadResent> {
        None
    }

    /// Rendered messages as the entries of [`Codec::field`], valid under the format's pairing
    /// rules, and which messages each entry holds.
    fn document(&self, messages: &[Message]) -> (Vec<Value>, Vec<Vec<usize>>);

    /// Whether a kept block stands for one part of its entry only, so a document whose bulk is
    /// left out for its shape may stand a short text in for it (not a block that holds the
    /// entry's own fields, which the document reads).
    fn hollow_block(&self, _block: &ProviderBlock) -> bool {
        false
    }

    /// The header (name, value) a request needs beside `headers` for the provider's own edit
    /// that `beta` names, if the client's own do not carry it.
    fn edit_header(
        &self,
        _beta: &'static str,
        _headers: &[(&str, &str)],
    ) -> Option<(&'static str, &'static str)> {
        None
    }

    /// The format marks cache breakpoints on its entries (Anthropic's `cache_control`), which
    /// the forwarded conversation keeps on the content they marked.
    fn cache_markers(&self) -> bool {
        false
    }

    /// The provider applies context edits that ctxd can ask for, so a step of a model that
    /// binds its thinking goes as the provider's edit.
    fn provider_edits(&self) -> bool {
        false
    }

    /// A tool the model may call, declared as the format's `tools` take it: its name, what it
    /// does and the JSON schema of its arguments.
    fn tool(&self, name: &str, description: &str, parameters: Value) -> Value;

    /// The assembly of an answer as it is relayed.
    fn answer(&self, stream: bool) -> Answer;

    /// An error body in the provider's shape; `param` names the field at fault.
    fn error(&self, failure: Failure, message: &str, param: Option<&str>) -> Value;
}

/// What an answer's reading has found so far, beside the format's own state.
#[derive(Debug, Default)]
pub struct Progress {
    pub usage: ProviderUsage,
    /// A streamed answer's terminal event has arrived.
    pub stopped: bool,
    /// The answer is not one ctxd appends (an error event, an unknown delta, too many parts).
    pub failed: bool,
}

/// What a format reads of its answer.
pub trait Events: Send {
    /// One streamed event: its SSE name and its data, read as JSON where it is.
    fn event(&mut self, name: &str, data: Option<&Value>, progress: &mut Progress);

    /// A whole streamed answer's node (`Some(None)` for an answer with nothing to append);
    /// `None` when what streamed is not an answer ctxd records.
    fn streamed(self: Box<Self>) -> Option<Option<NodeContent>>;

    /// A whole body's node and usage, the same way.
    fn body(&self, body: &Value, usage: &mut ProviderUsage) -> Option<Option<NodeContent>>;
}

/// An answer assembled from what the upstream sends as it is relayed.
pub struct Answer {
    relayed: Relayed,
    events: Box<dyn Events>,
    progress: Progress,
}

impl Answer {
    pub fn new(stream: bool, events: Box<dyn Events>) -> Self {
        Self {
            relayed: Relayed::new(stream),
            events,
            progress: Progress::default(),
        }
    }

    /// A streamed answer's terminal event has arrived (never for a whole body).
    pub fn complete(&self) -> bool {
        self.relayed.stream() && (self.progress.stopped || self.progress.failed)
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        for (event, data) in self.relayed.feed(bytes) {
            self.events
                .event(&event.name, data.as_ref(), &mut self.progress);
        }
    }

    /// The assistant node to append and the usage, once the answer is whole; `None` for an
    /// answer cut short, failed, or not one ctxd records.
    pub fn finish(self) -> Option<(Option<NodeContent>, ProviderUsage)> {
        let Answer {
            relayed,
            events,
            mut progress,
        } = self;
        if relayed.stream() {
            if !progress.stopped || progress.failed {
                return None;
            }
            return Some((events.streamed()?, progress.usage));
        }
        let body = relayed.body()?;
        let node = events.body(&body, &mut progress.usage)?;
        Some((node, progress.usage))
    }
}

/// Every format the gateway serves.
pub fn codecs() -> [&'static dyn Codec; 4] {
    WireFormat::ALL.map(codec)
}

/// The codec of `format`.
pub fn codec(format: WireFormat) -> &'static dyn Codec {
    match format {
        WireFormat::AnthropicMessages => &super::anthropic::Messages,
        WireFormat::ChatCompletions => &super::chat::Completions,
        WireFormat::Responses => &super::responses::Responses,
        WireFormat::Gemini => &super::gemini::Gemini,
    }
}

/// ctxd's recall tool (`crate::recall`) as `format`'s `tools` declare it: one definition, the
/// same argument schema in every format.
pub fn recall_tool(format: WireFormat) -> Value {
    let parameters = serde_json::json!({
        "type": "object",
        "properties": {
            "reference": {
                "type": "string",
                "description": "The 12-character reference after `recall` in a placeholder."
            }
        },
        "required": ["reference"],
        "additionalProperties": false
    });
    let recall = (crate::recall::TOOL_NAME, crate::recall::TOOL_DESCRIPTION);
    codec(format).tool(recall.0, recall.1, parameters)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_declares_the_recall_tool_alike() {
        let anthropic = recall_tool(WireFormat::AnthropicMessages);
        let openai = recall_tool(WireFormat::ChatCompletions);
        let responses = recall_tool(WireFormat::Responses);
        let gemini = recall_tool(WireFormat::Gemini);
        let schema = &anthropic["input_schema"];
        assert_eq!(schema["required"], serde_json::json!(["reference"]));
        assert_eq!(&openai["function"]["parameters"], schema);
        assert_eq!(&responses["parameters"], schema);
        assert_eq!(&gemini["functionDeclarations"][0]["parameters"], schema);
        assert_eq!(responses["name"], crate::recall::TOOL_NAME);
        assert_eq!(
            gemini["functionDeclarations"][0]["name"],
            crate::recall::TOOL_NAME
        );
    }
}
