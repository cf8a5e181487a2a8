//! The fake provider's Gemini API: a module of `fake_provider.rs` (which routes to it and
//! includes it with `#[path]`), so whatever includes the fake gets both. Google's Generative
//! Language API as the Gemini CLI and the SDKs call it:
//!
//! - `POST /v1beta/models/{model}:generateContent` answers one `GenerateContentResponse` (JSON);
//!   `:streamGenerateContent?alt=sse` answers the same response in chunks, each
//!   `data: <GenerateContentResponse>\r\n\r\n` as Google frames them (without `alt=sse`, a JSON
//!   array of the chunks, as Google streams then); `:countTokens` answers
//!   `{"totalTokens": n, "promptTokensDetails": [...]}` for `contents` (or a
//!   `generateContentRequest`), takes no reply and touches no cache. `/v1/models/...` is served
//!   alike. Any other method or path under them answers 404 in Google's shape.
//! - The key: `x-goog-api-key` or the `key` query parameter, any non-empty value. Without one:
//!   403 `PERMISSION_DENIED`, the message Google gives a caller without a key.
//! - Errors are Google's: `{"error": {"code": <status>, "message": ..., "status": <CODE>}}`.
//!
//! Checked before anything else (a refusal takes no reply and touches no cache), each a 400
//! `INVALID_ARGUMENT` with the message Google gives:
//! - `contents` is a non-empty array; each content's `role` is absent, `user` or `model`, and its
//!   `parts` a non-empty array;
//! - calls and their responses pair: a content with `functionResponse` parts follows a `model`
//!   content with `functionCall` parts, as many responses as calls ([`PAIRING_COUNT`]); a
//!   `model` content with calls follows a `user` content (a prompt or function responses);
//! - Gemini 3 and later ([`validates_signatures`]: `gemini-3*`, `gemini-4*`..., not the
//!   `-image` models): in the current turn (the contents after the last `user` content that
//!   holds anything but `functionResponse` parts), the first `functionCall` part of each `model`
//!   content must carry a `thoughtSignature` (else [`missing_signature`], which names the call
//!   and its content's 1-based position), and every signature on a call there must be the one
//!   the fake issued for that call (same model, name and arguments, compared canonically) or
//!   one of Google's documented dummy values ([`DUMMY_SIGNATURES`]); any other is
//!   [`CORRUPTED_SIGNATURE`]. Calls of earlier turns are not checked (Google validates only
//!   the current turn). These refusals count in [`FakeProvider::refusals`].
//!
//! Answers, from the scripted [`Reply`] (taken from the same queue as the other APIs):
//! - parts: text is `{"text": ..}`; a tool call `{"functionCall": {"name", "args"}}`, with
//!   `"id"` only when scripted with one (Google's API gives none; the CLI makes its own); a
//!   thinking block a thought part `{"text": .., "thought": true}` (its scripted signature
//!   replaced). A thinking model ([`thinks`]: Gemini 2.5 and later, unless
//!   `thinkingConfig.thinkingBudget` is 0) thinks [`THINKING_TEXT`] when the reply has no
//!   thinking of its own; thought parts are sent only when the request's
//!   `generationConfig.thinkingConfig.includeThoughts` is true, and counted either way;
//! - signatures (thinking models): every thought part, the first `functionCall` part (parallel
//!   calls: the others get none, as Google's), and with no call the last part carry a
//!   `thoughtSignature`: base64 of `ctxd-fake-gemini` and a 128-bit FNV-1a hash of the model,
//!   the request's contents, the part and its index. The fake keeps the ones it gave calls
//!   ([`FakeProvider::gemini_signatures`]) to check them when they come back;
//! - `candidates: [{"content": {"role": "model", "parts": [...]}, "finishReason": "STOP",
//!   "index": 0}]` (the finish reason a scripted [`Reply::stop_reason`]), `usageMetadata`,
//!   `modelVersion` (the model), `responseId` (`fake-gemini-<n>`). Streamed: one chunk per
//!   thought part, per call and per piece of text (up to three pieces, the signature on the
//!   last); the last chunk carries the finish reason and the whole usage, the others
//!   `promptTokenCount` (and `cachedContentTokenCount`) only. [`Reply::cut_after`] counts
//!   chunks;
//! - `usageMetadata`: `promptTokenCount` (every prompt token, the cached included),
//!   `cachedContentTokenCount` (absent when 0, as Google leaves zeros out), `candidatesTokenCount`
//!   (the parts but thoughts, at least 1), `thoughtsTokenCount` (absent when 0),
//!   `totalTokenCount` (their sum), `promptTokensDetails` and `cacheTokensDetails` (`TEXT`).
//!
//! Implicit caching, on the fake's clock ([`ImplicitCache`]): the prompt is a sequence of units
//! (`tools`, `toolConfig`, `systemInstruction` when present, then each content), scoped by the
//! model and the key; cached = tokens of the longest run of leading units whose prefix has a
//! live entry, 0 when that is under the model's minimum ([`min_cached`]: 2,048 tokens for
//! Gemini 2.5, 4,096 for Gemini 3 and later, none cached before 2.5); no rounding. An answered
//! request writes or refreshes an entry for every prefix of its units, live
//! [`GEMINI_CACHE_LIFE`] (Google documents no lifetime for implicit caching: the fake keeps the
//! shortest the other APIs have). Reads are priced at [`gemini_read_price`]: 0.25× on Gemini
//! 2.x, 0.1× on Gemini 3, 0.05× on Gemini 4 (Google's published cached-input prices over
//! input prices); nothing is charged for writes. Tokens are counted as for the other APIs.

use super::*;

/// The values Google documents for a signature a client could not keep (a call it made up, a
/// history from elsewhere): they pass validation.
pub const DUMMY_SIGNATURES: [&str; 2] = [
    "skip_thought_signature_validator",
    "context_engineering_is_the_way_to_go",
];

/// A signature on a call of the current turn that the model did not give that call.
pub const CORRUPTED_SIGNATURE: &str = "Corrupted thought signature.";

/// Responses and calls that do not pair.
pub const PAIRING_COUNT: &str = "Please ensure that the number of function response parts is \
     equal to the number of function call parts of the function call turn.";
pub const PAIRING_RESPONSE: &str =
    "Please ensure that function response turn comes immediately after a function call turn.";
pub const PAIRING_CALL: &str = "Please ensure that function call turn comes immediately after a \
     user turn or after a function response turn.";

/// What Google answers a request without a key (403 `PERMISSION_DENIED`).
pub const NO_KEY: &str = "Method doesn't allow unregistered callers (callers without established \
     identity). Please use API Key or other form of API consumer identity to call this API.";

/// How long an implicit cache entry lives after its last write or read.
pub const GEMINI_CACHE_LIFE: Duration = FIVE_MINUTES;

/// What a signature the fake makes starts with, before base64.
const SIGNATURE_TAG: &[u8; 16] = b"ctxd-fake-gemini";

/// The message of a refusal for the first call of a model content of the current turn without
/// a signature: Google's, `position` the content's 1-based place in `contents`.
pub fn missing_signature(name: &str, position: usize) -> String {
    format!(
        "Function call is missing a thought_signature in functionCall parts. This is required \
         for tools to work correctly, and missing thought_signature may lead to degraded model \
         performance. Additional data, function call `default_api:{name}`, position {position}. \
         Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures for more \
         details."
    )
}

// ---------------------------------------------------------------- models

/// The (major, minor) version of a `gemini-M[.m]-...` model (lower-cased, a `provider/` or
/// `models/` prefix stripped); `None` for any other name.
pub fn gemini_version(model: &str) -> Option<(u32, u32)> {
    let name = model_name(model);
    let rest = name.strip_prefix("gemini-")?;
    let version = rest.split('-').next()?;
    let (major, minor) = version.split_once('.').unwrap_or((version, "0"));
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Whether `model` refuses a call of the current turn without its signature (Gemini 3 and
/// later, but the image models).
pub fn validates_signatures(model: &str) -> bool {
    gemini_version(model).is_some_and(|(major, _)| major >= 3) && !model.contains("-image")
}

/// Whether `model` thinks (Gemini 2.5 and later).
pub fn thinks(model: &str) -> bool {
    gemini_version(model).is_some_and(|v| v >= (2, 5))
}

/// The shortest prefix `model` reads from its implicit cache; `None`: it caches nothing.
pub fn min_cached(model: &str) -> Option<u64> {
    match gemini_version(model)? {
        v if v < (2, 5) => None,
        (2, _) => Some(2048),
        _ => Some(4096),
    }
}

/// A cached token's price relative to an uncached one on `model`.
pub fn gemini_read_price(model: &str) -> f64 {
    match gemini_version(model) {
        Some((major, _)) if major <= 2 => 0.25,
        Some((major, _)) if major >= 4 => 0.05,
        _ => DEFAULT_READ_PRICE,
    }
}

// ---------------------------------------------------------------- the cache

/// The units of a Gemini request body, in prompt order: `tools`, `toolConfig` and
/// `systemInstruction` (one unit each, when present), then each content; scoped by the model
/// and the key.
pub fn gemini_units(body: &Value, model: &str, key: &str) -> Vec<Unit> {
    let mut chain = Chain::new(&json!(["gemini", model_name(model), key]));
    for field in ["tools", "toolConfig", "systemInstruction"] {
        if !body[field].is_null() {
            chain.push(Some(field), &body[field], None);
        }
    }
    for content in body["contents"].as_array().into_iter().flatten() {
        chain.push(None, content, None);
    }
    chain.units
}

/// Google's implicit cache, as the module's docs state it.
#[derive(Clone, Debug, Default)]
pub struct ImplicitCache {
    entries: Entries,
}

impl ImplicitCache {
    /// What a request of `units` ([`gemini_units`]) on `model` costs at `now`; `answered`: it
    /// was answered, so every prefix of it is written or refreshed.
    pub fn price(&mut self, now: Duration, units: &[Unit], model: &str, answered: bool) -> Bill {
        let total: u64 = units.iter().map(|u| u.tokens).sum();
        let matched: u64 = units
            .iter()
            .take_while(|u| self.entries.live(u.prefix, now))
            .map(|u| u.tokens)
            .sum();
        let read = match min_cached(model) {
            Some(min) if matched >= min => matched,
            _ => 0,
        };
        if answered && min_cached(model).is_some() {
            for u in units {
                self.entries.write(u.prefix, now, GEMINI_CACHE_LIFE);
            }
        }
        Bill {
            input: total - read,
            read,
            read_price: gemini_read_price(model),
            ..Bill::default()
        }
    }

    pub fn forget_expired(&mut self, now: Duration) {
        self.entries.forget_expired(now);
    }
}

// ---------------------------------------------------------------- state

/// A signature the fake gave a call.
#[derive(Clone, Debug)]
struct Issued {
    model: String,
    name: String,
    /// The arguments, canonical.
    args: String,
}

/// What the fake keeps of its Gemini answers.
#[derive(Clone, Debug, Default)]
pub(super) struct State {
    pub(super) cache: ImplicitCache,
    issued: HashMap<String, Issued>,
    /// (call name, signature), in the order given.
    pub(super) calls: Vec<(String, String)>,
}

// ---------------------------------------------------------------- routes

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Generate,
    Stream,
    Count,
}

/// A path of the Gemini API: `/v1beta/models/{model}:{method}` or `/v1/models/...`; the model
/// and the method, `None` for a path of neither version that is not under them.
pub(super) fn route(path: &str) -> Option<(String, Option<&str>)> {
    let rest = path
        .strip_prefix("/v1beta/")
        .or_else(|| path.strip_prefix("/v1/models/").map(|_| &path[4..]))?;
    let Some(call) = rest.strip_prefix("models/") else {
        return Some((String::new(), None));
    };
    Some(match call.rsplit_once(':') {
        Some((model, method)) => (model.to_owned(), Some(method)),
        None => (call.to_owned(), None),
    })
}

/// The key a request carries: `x-goog-api-key`, else the `key` query parameter.
pub fn gemini_key(headers: &HeaderMap, query: Option<&str>) -> Option<String> {
    let header = headers
        .get("x-goog-api-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty());
    if let Some(key) = header {
        return Some(key.to_owned());
    }
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("key="))
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
}

/// A Google error body.
pub fn google_error(code: u16, status: &str, message: &str) -> Value {
    json!({"error": {"code": code, "message": message, "status": status}})
}

fn answer_error(
    shared: &Shared,
    record: Recorded,
    code: u16,
    status: &str,
    message: &str,
) -> Response {
    let body = google_error(code, status, message).to_string();
    finish(shared, record, code, body)
}

/// Answers a request to a Gemini path ([`route`]).
pub(super) async fn handle(
    shared: &Shared,
    record: Recorded,
    model: String,
    method: Option<&str>,
) -> Response {
    let method = match method {
        Some("generateContent") => Some(Call::Generate),
        Some("streamGenerateContent") => Some(Call::Stream),
        Some("countTokens") => Some(Call::Count),
        _ => None,
    };
    let (Some(method), true) = (method, record.method == Method::POST) else {
        let message = format!(
            "models/{model} is not found for API version v1beta, or is not supported for {} {}.",
            record.method, record.path
        );
        return answer_error(shared, record, 404, "NOT_FOUND", &message);
    };
    let Some(key) = gemini_key(&record.headers, record.query.as_deref()) else {
        return answer_error(shared, record, 403, "PERMISSION_DENIED", NO_KEY);
    };
    if method == Call::Count {
        let body = match record.body.get("generateContentRequest") {
            Some(inner) => inner.clone(),
            None => record.body.clone(),
        };
        if let Err(message) = check_contents(&body) {
            return answer_error(shared, record, 400, "INVALID_ARGUMENT", &message);
        }
        let tokens: u64 = gemini_units(&body, &model, &key)
            .iter()
            .map(|u| u.tokens)
            .sum();
        let answer = json!({"totalTokens": tokens,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": tokens}]});
        return finish(shared, record, 200, answer.to_string());
    }
    if let Err(message) = check_contents(&record.body) {
        return answer_error(shared, record, 400, "INVALID_ARGUMENT", &message);
    }
    let checked = {
        let inner = lock(shared);
        check_signatures(&record.body, &model, &inner.gemini.issued)
    };
    if let Err(message) = checked {
        lock(shared).refusals += 1;
        return answer_error(shared, record, 400, "INVALID_ARGUMENT", &message);
    }
    answer(shared, record, model, key, method == Call::Stream).await
}

// ---------------------------------------------------------------- checks

fn parts_of(content: &Value) -> &[Value] {
    content["parts"].as_array().map_or(&[][..], Vec::as_slice)
}

fn is_user(content: &Value) -> bool {
    matches!(content["role"].as_str(), None | Some("user"))
}

fn count_parts(content: &Value, kind: &str) -> usize {
    parts_of(content)
        .iter()
        .filter(|p| p.get(kind).is_some())
        .count()
}

/// The structure Google requires of `contents` (see the module's docs).
fn check_contents(body: &Value) -> Result<(), String> {
    let contents = match body["contents"].as_array() {
        Some(contents) if !contents.is_empty() => contents,
        _ => {
            return Err("* GenerateContentRequest.contents: contents is not specified\n".into());
        }
    };
    for (i, content) in contents.iter().enumerate() {
        if !matches!(content["role"].as_str(), None | Some("user" | "model")) {
            return Err("Please use a valid role: user, model.".into());
        }
        if parts_of(content).is_empty() {
            return Err(format!(
                "* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty.\n"
            ));
        }
        let before = i.checked_sub(1).map(|j| &contents[j]);
        let responses = count_parts(content, "functionResponse");
        if responses > 0 {
            let calls = before
                .filter(|b| b["role"] == "model")
                .map_or(0, |b| count_parts(b, "functionCall"));
            if calls == 0 {
                return Err(PAIRING_RESPONSE.into());
            }
            if calls != responses {
                return Err(PAIRING_COUNT.into());
            }
        }
        if content["role"] == "model"
            && count_parts(content, "functionCall") > 0
            && !before.is_some_and(is_user)
        {
            return Err(PAIRING_CALL.into());
        }
    }
    Ok(())
}

/// Gemini 3's rule for the calls of the current turn (see the module's docs).
fn check_signatures(
    body: &Value,
    model: &str,
    issued: &HashMap<String, Issued>,
) -> Result<(), String> {
    if !validates_signatures(model) {
        return Ok(());
    }
    let contents = body["contents"].as_array().map_or(&[][..], Vec::as_slice);
    let prompt = |c: &Value| {
        is_user(c)
            && parts_of(c)
                .iter()
                .any(|p| p.get("functionResponse").is_none())
    };
    let start = contents.iter().rposition(prompt).map_or(0, |i| i + 1);
    for (i, content) in contents.iter().enumerate().skip(start) {
        if content["role"] != "model" {
            continue;
        }
        let mut first = true;
        for part in parts_of(content) {
            let Some(call) = part.get("functionCall") else {
                continue;
            };
            let name = call["name"].as_str().unwrap_or_default();
            match part["thoughtSignature"].as_str().filter(|s| !s.is_empty()) {
                None if first => return Err(missing_signature(name, i + 1)),
                None => {}
                Some(dummy) if DUMMY_SIGNATURES.contains(&dummy) => {}
                Some(signature) => {
                    let ours = issued.get(signature).is_some_and(|given| {
                        given.model == model_name(model)
                            && given.name == name
                            && given.args == canonical_string(&call["args"])
                    });
                    if !ours {
                        return Err(CORRUPTED_SIGNATURE.into());
                    }
                }
            }
            first = false;
        }
    }
    Ok(())
}

fn canonical_string(value: &Value) -> String {
    let mut s = String::new();
    canonical(value, &mut s);
    s
}

// ---------------------------------------------------------------- answers

/// Takes a reply and answers it as Gemini.
async fn answer(
    shared: &Shared,
    mut record: Recorded,
    model: String,
    key: String,
    stream: bool,
) -> Response {
    let (reply, bill, id) = {
        let mut inner = lock(shared);
        let reply = match inner.queue.pop_front() {
            Some(reply) => reply,
            None => inner.default.clone(),
        };
        let answered = matches!(reply.kind, Kind::Answer(_));
        let units = gemini_units(&record.body, &model, &key);
        let now = inner.now;
        let bill = inner.gemini.cache.price(now, &units, &model, answered);
        inner.next_id += 1;
        (reply, bill, inner.next_id)
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let blocks = match &reply.kind {
        Kind::Answer(blocks) => blocks.clone(),
        Kind::Error { status, body } => {
            let response = finish(shared, record, *status, body.clone());
            return with_headers(response, &reply.headers);
        }
        Kind::Failed { message, .. } => {
            let response = answer_error(shared, record, 500, "INTERNAL", message);
            return with_headers(response, &reply.headers);
        }
    };
    let (parts, thoughts) = {
        let mut inner = lock(shared);
        build_parts(&record.body, &model, &blocks, &mut inner.gemini)
    };
    let candidates = parts
        .iter()
        .filter(|p| p["thought"] != true)
        .map(|p| match p.get("functionCall") {
            Some(call) => tokens_of(call),
            None => text_tokens(p["text"].as_str().unwrap_or_default()),
        })
        .sum::<u64>()
        .max(1);
    let usage = usage_metadata(&bill, candidates, thoughts);
    let finish_reason = reply.stop_reason.clone().unwrap_or_else(|| "STOP".into());
    let response_id = format!("fake-gemini-{id}");
    let sse = record
        .query
        .as_deref()
        .is_some_and(|q| q.split('&').any(|p| p == "alt=sse"));
    let events = if stream {
        let chunks = stream_chunks(&parts, &usage, &bill, &finish_reason, &model, &response_id);
        if sse {
            chunks
                .iter()
                .map(|c| format!("data: {c}\r\n\r\n").into_bytes())
                .collect()
        } else {
            let n = chunks.len();
            chunks
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let open = if i == 0 { "[" } else { ",\r\n" };
                    let close = if i + 1 == n { "]" } else { "" };
                    format!("{open}{c}{close}").into_bytes()
                })
                .collect()
        }
    } else {
        let whole = json!({
            "candidates": [{"content": {"parts": parts, "role": "model"},
                            "finishReason": finish_reason, "index": 0}],
            "usageMetadata": usage,
            "modelVersion": model,
            "responseId": response_id,
        });
        vec![whole.to_string().into_bytes()]
    };
    record.usage = usage;
    record.bill = Some(bill);
    let streamed = stream && sse;
    let response = send(shared, record, events, stream, &reply);
    let mut response = with_headers(response, &reply.headers);
    let content_type = if streamed {
        "text/event-stream"
    } else {
        "application/json"
    };
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn usage_metadata(bill: &Bill, candidates: u64, thoughts: u64) -> Value {
    let prompt = bill.prompt();
    let mut usage = json!({
        "promptTokenCount": prompt,
        "candidatesTokenCount": candidates,
        "totalTokenCount": prompt + candidates + thoughts,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
    });
    if bill.read > 0 {
        usage["cachedContentTokenCount"] = json!(bill.read);
        usage["cacheTokensDetails"] = json!([{"modality": "TEXT", "tokenCount": bill.read}]);
    }
    if thoughts > 0 {
        usage["thoughtsTokenCount"] = json!(thoughts);
    }
    usage
}

/// The parts of the answer to `body` and its thoughts' tokens (see the module's docs);
/// signatures given to calls are kept in `state`.
fn build_parts(
    body: &Value,
    model: &str,
    blocks: &[Block],
    state: &mut State,
) -> (Vec<Value>, u64) {
    let thinking = &body["generationConfig"]["thinkingConfig"];
    let shown = thinking["includeThoughts"] == true;
    let thinker = thinks(model) && thinking["thinkingBudget"] != 0;
    let scripted = blocks
        .iter()
        .any(|b| matches!(b, Block::Thinking { .. } | Block::RedactedThinking(_)));
    let mut thoughts = 0;
    let mut parts = Vec::new();
    if thinker && !scripted {
        thoughts += text_tokens(THINKING_TEXT);
        if shown {
            parts.push(json!({"text": THINKING_TEXT, "thought": true}));
        }
    }
    for block in blocks {
        match block {
            Block::Text(text) => parts.push(json!({"text": text})),
            Block::ToolUse { id, name, input } => {
                let mut call = json!({"name": name, "args": input});
                if !id.is_empty() {
                    call["id"] = json!(id);
                }
                parts.push(json!({"functionCall": call}));
            }
            Block::Thinking { thinking, .. } => {
                thoughts += text_tokens(thinking);
                if shown {
                    parts.push(json!({"text": thinking, "thought": true}));
                }
            }
            Block::RedactedThinking(_) => {
                if shown {
                    parts.push(json!({"text": "", "thought": true}));
                }
            }
        }
    }
    if parts.is_empty() {
        parts.push(json!({"text": ""}));
    }
    if !thinker {
        return (parts, thoughts);
    }
    let name = model_name(model);
    let sign = |index: usize, part: &Value| {
        let h =
            PrefixHash(FNV_OFFSET).record("gemini", &json!([name, body["contents"], index, part]));
        let mut bytes = SIGNATURE_TAG.to_vec();
        bytes.extend_from_slice(&h.0.to_be_bytes());
        base64(&bytes)
    };
    let first_call = parts.iter().position(|p| p.get("functionCall").is_some());
    let last = parts.len() - 1;
    for (index, part) in parts.iter_mut().enumerate() {
        let thought = part["thought"] == true;
        let signed =
            thought || first_call == Some(index) || (first_call.is_none() && index == last);
        if !signed {
            continue;
        }
        let signature = sign(index, &*part);
        if let Some(call) = part.get("functionCall") {
            let call_name = call["name"].as_str().unwrap_or_default().to_owned();
            state.issued.insert(
                signature.clone(),
                Issued {
                    model: name.clone(),
                    name: call_name.clone(),
                    args: canonical_string(&call["args"]),
                },
            );
            state.calls.push((call_name, signature.clone()));
        }
        part["thoughtSignature"] = json!(signature);
    }
    (parts, thoughts)
}

/// The chunks of a streamed answer (see the module's docs).
fn stream_chunks(
    parts: &[Value],
    usage: &Value,
    bill: &Bill,
    finish_reason: &str,
    model: &str,
    response_id: &str,
) -> Vec<Value> {
    let mut pieces: Vec<Value> = Vec::new();
    for part in parts {
        match part["text"].as_str() {
            Some(text) if part["thought"] != true => {
                let split = super::pieces(text);
                let n = split.len();
                for (i, piece) in split.into_iter().enumerate() {
                    let mut p = json!({"text": piece});
                    if i + 1 == n
                        && let Some(signature) = part.get("thoughtSignature")
                    {
                        p["thoughtSignature"] = signature.clone();
                    }
                    pieces.push(p);
                }
            }
            _ => pieces.push(part.clone()),
        }
    }
    let mut partial = json!({"promptTokenCount": bill.prompt(), "totalTokenCount": bill.prompt()});
    if bill.read > 0 {
        partial["cachedContentTokenCount"] = json!(bill.read);
    }
    let n = pieces.len();
    pieces
        .into_iter()
        .enumerate()
        .map(|(i, part)| {
            let last = i + 1 == n;
            let mut candidate = json!({"content": {"parts": [part], "role": "model"}, "index": 0});
            if last {
                candidate["finishReason"] = json!(finish_reason);
            }
            json!({
                "candidates": [candidate],
                "usageMetadata": if last { usage.clone() } else { partial.clone() },
                "modelVersion": model,
                "responseId": response_id,
            })
        })
        .collect()
}

/// Standard base64, padded.
fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

// ---------------------------------------------------------------- reading answers

/// The `GenerateContentResponse` a Gemini SSE body builds, as the non-streamed JSON would be:
/// the chunks' parts, consecutive text pieces of one kind (thought or not) joined, each part
/// keeping the signature one of its pieces carried; the last chunk's finish reason and usage.
/// `None` unless the last chunk has a finish reason.
pub fn gemini_of_sse(body: &[u8]) -> Option<Value> {
    let mut parts: Vec<Value> = Vec::new();
    let mut last = Value::Null;
    for event in parse_sse(body) {
        let Ok(chunk) = serde_json::from_str::<Value>(&event.data) else {
            continue;
        };
        let candidate = &chunk["candidates"][0];
        for part in parts_of(&candidate["content"]) {
            let joins = |before: &Value| {
                before["text"].is_string()
                    && part["text"].is_string()
                    && before["thought"] == part["thought"]
                    && before.get("thoughtSignature").is_none()
            };
            match parts.last_mut() {
                Some(before) if joins(before) => {
                    let text = format!(
                        "{}{}",
                        before["text"].as_str().unwrap_or_default(),
                        part["text"].as_str().unwrap_or_default()
                    );
                    before["text"] = json!(text);
                    if let Some(signature) = part.get("thoughtSignature") {
                        before["thoughtSignature"] = signature.clone();
                    }
                }
                _ => parts.push(part.clone()),
            }
        }
        last = chunk;
    }
    let finish = last["candidates"][0]["finishReason"].clone();
    if !finish.is_string() {
        return None;
    }
    let mut whole = last;
    whole["candidates"][0]["content"]["parts"] = Value::Array(parts);
    whole["candidates"][0]["finishReason"] = finish;
    Some(whole)
}
