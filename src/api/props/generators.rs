//! The requests the properties try: ids, names and enums in and out of range, node inputs of
//! every kind, budgets and policies near their edges.

use proptest::prelude::*;

use crate::proto::pb;

/// Text for id fields: real UUIDs (in every form `Uuid` accepts), near misses, junk.
pub(super) fn id_text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => any::<[u8; 16]>().prop_map(|b| uuid::Uuid::from_bytes(b).to_string()),
        1 => any::<[u8; 16]>().prop_map(|b| uuid::Uuid::from_bytes(b).simple().to_string()),
        1 => any::<[u8; 16]>().prop_map(|b| uuid::Uuid::from_bytes(b).to_string().to_uppercase()),
        1 => Just(String::new()),
        1 => "[0-9a-f-]{0,40}",
        1 => "\\PC{0,12}",
    ]
}

/// An optional id field: empty (absent) half the time.
pub(super) fn maybe_id() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), id_text()]
}

pub(super) fn branch_text() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => Just(String::new()),
        2 => "[a-z0-9_./-]{1,12}",
        1 => "[a-zA-Z0-9_./ ~^:é-]{0,20}",
        1 => "[a-z]{120,140}",
        1 => "\\PC{0,8}",
    ]
}

pub(super) fn text() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "\\PC{0,16}", "[a-z ]{0,8}"]
}

/// An enum value: the known ones and past them.
pub(super) fn enum_value(known: i32) -> impl Strategy<Value = i32> {
    prop_oneof![4 => 0..=known, 1 => any::<i32>()]
}

fn part() -> impl Strategy<Value = pb::ContentPart> {
    use pb::content_part::Part;
    use pb::media::Source;
    let source = prop_oneof![
        Just(None),
        proptest::collection::vec(any::<u8>(), 0..8).prop_map(|d| Some(Source::Data(d))),
        text().prop_map(|u| Some(Source::Url(u))),
    ];
    let part = prop_oneof![
        1 => Just(None),
        4 => text().prop_map(|t| Some(Part::Text(t))),
        2 => (text(), source).prop_map(|(mime_type, source)| {
            Some(Part::Media(pb::Media { mime_type, source }))
        }),
    ];
    part.prop_map(|part| pb::ContentPart { part })
}

fn parts() -> impl Strategy<Value = Vec<pb::ContentPart>> {
    proptest::collection::vec(part(), 0..3)
}

fn call_id() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "c[0-2]", text()]
}

fn node_input() -> impl Strategy<Value = pb::NodeInput> {
    use pb::node_input::Kind;
    let call = (
        call_id(),
        text(),
        prop_oneof!["\\{\\}", "\\[1\\]", "\\PC{0,6}"],
    )
        .prop_map(|(call_id, name, arguments_json)| pb::ToolCall {
            call_id,
            name,
            arguments_json,
        });
    let kind = prop_oneof![
        1 => Just(None),
        3 => (enum_value(5), parts(), proptest::collection::vec(call, 0..3)).prop_map(
            |(role, parts, tool_calls)| Some(Kind::Message(pb::Message { role, parts, tool_calls }))
        ),
        2 => (call_id(), text(), parts(), any::<bool>()).prop_map(
            |(call_id, name, parts, is_error)| {
                Some(Kind::ToolResult(pb::ToolResult { call_id, name, parts, is_error }))
            }
        ),
        2 => (call_id(), text(), text(), enum_value(3)).prop_map(
            |(call_id, name, input, expose)| {
                Some(Kind::FunctionCall(pb::FunctionCall { call_id, name, input, expose }))
            }
        ),
        2 => (call_id(), text(), enum_value(2), prop_oneof![4 => Just(String::new()), 1 => id_text()])
            .prop_map(|(call_id, output, status, function_id)| {
                Some(Kind::FunctionResult(pb::FunctionResult {
                    call_id,
                    output,
                    status,
                    function_id,
                    chain_head_id: String::new(),
                }))
            }),
    ];
    kind.prop_map(|kind| pb::NodeInput {
        kind,
        pinned: false,
    })
}

prop_compose! {
    pub(super) fn append()(
        session_id in id_text(),
        branch in branch_text(),
        function_id in prop_oneof![3 => Just(String::new()), 1 => id_text()],
        expected_head_id in proptest::option::of(maybe_id()),
        idempotency_key in text(),
        nodes in proptest::collection::vec(node_input(), 0..4),
    ) -> pb::AppendRequest {
        pb::AppendRequest {
            session_id,
            branch,
            function_id,
            expected_head_id,
            idempotency_key,
            nodes,
        }
    }
}

/// A token count near the edges of what a budget can hold.
fn tokens() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), 0u32..5_000, Just(u32::MAX), any::<u32>()]
}

pub(super) fn budget() -> impl Strategy<Value = Option<pb::Budget>> {
    proptest::option::of(some_budget())
}

prop_compose! {
    fn some_budget()(
        context_window in prop_oneof![0u32..200_000, any::<u32>()],
        output_reserve in tokens(),
        system_tokens in tokens(),
        tools_tokens in tokens(),
        schema_tokens in tokens(),
    ) -> pb::Budget {
        pb::Budget {
            context_window,
            output_reserve,
            system_tokens,
            tools_tokens,
            schema_tokens,
        }
    }
}

pub(super) fn policy() -> impl Strategy<Value = Option<pb::RenderPolicy>> {
    let value = || prop_oneof![Just(0u32), 1u32..100, any::<u32>()];
    let mode = prop_oneof![Just(0i32), Just(1), Just(2), any::<i32>()];
    proptest::option::of(
        (
            (value(), value(), value(), value()),
            (
                value(),
                value(),
                proptest::option::of(any::<bool>()),
                any::<bool>(),
            ),
            (
                mode,
                value(),
                proptest::option::of(value()),
                proptest::option::of(value()),
            ),
        )
            .prop_map(
                |(
                    (chars, first, every, keep),
                    (idle, retain, snip, reactive),
                    (microcompact, recent, clear_at_least, input_chars),
                )| pb::RenderPolicy {
                    payback_odds: keep,
                    max_tool_result_chars: chars,
                    microcompact_first: first,
                    microcompact_every: every,
                    microcompact_keep: keep,
                    idle_minutes: idle,
                    retain_turns: retain,
                    snip,
                    reactive,
                    microcompact,
                    recent_tool_result_chars: recent,
                    clear_at_least_tokens: clear_at_least,
                    max_tool_input_chars: input_chars,
                    max_assistant_text_chars: input_chars,
                    recent_assistant_text_chars: None,
                    cache_read_price: None,
                    cache_write_price: None,
                    reasoning: 0,
                    recent_tool_input_chars: None,
                },
            ),
    )
}

pub(super) fn tokenizer_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("heuristic".to_owned()),
        Just("o200k_base".to_owned()),
        Just("cl100k_base".to_owned()),
        text(),
    ]
}

fn render_target() -> impl Strategy<Value = Option<pb::render_request::Target>> {
    use pb::render_request::Target;
    prop_oneof![
        Just(None),
        branch_text().prop_map(|b| Some(Target::Branch(b))),
        maybe_id().prop_map(|n| Some(Target::NodeId(n))),
        maybe_id().prop_map(|f| Some(Target::FunctionId(f))),
    ]
}

prop_compose! {
    pub(super) fn render()(
        session_id in id_text(),
        target in render_target(),
        tokenizer in tokenizer_name(),
        callers in enum_value(2),
        budget in budget(),
        policy in policy(),
        (now_unix_ms, last_call_unix_ms) in (any::<i64>(), any::<i64>()),
        (format, strict_format) in (enum_value(3), any::<bool>()),
    ) -> pb::RenderRequest {
        pb::RenderRequest {
            session_id,
            target,
            tokenizer,
            callers,
            budget,
            policy,
            now_unix_ms,
            format,
            strict_format,
            last_call_unix_ms,
            model: String::new(),
        }
    }
}
