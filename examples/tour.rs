//! A tour of the API: one session with a user message, an assistant tool call, its result, an
//! answer, and a render. Run a server first (`cargo run --release -- serve`), then
//! `cargo run --example tour` (or `cargo run --example tour -- http://HOST:PORT`).

use ctxd::api::pb::{
    self, AppendRequest, ContentPart, CreateSessionRequest, NodeInput, RenderRequest, Role,
    ToolCall, content_part::Part, context_store_client::ContextStoreClient, node_input::Kind,
};

fn text(s: &str) -> ContentPart {
    ContentPart {
        part: Some(Part::Text(s.to_owned())),
    }
}

fn message(role: Role, s: &str, tool_calls: Vec<ToolCall>) -> NodeInput {
    NodeInput {
        kind: Some(Kind::Message(pb::Message {
            role: role.into(),
            parts: if s.is_empty() { vec![] } else { vec![text(s)] },
            tool_calls,
        })),
        pinned: false,
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:50051".to_owned());
    let mut client = ContextStoreClient::connect(server).await?;

    let session = client
        .create_session(CreateSessionRequest {
            metadata: [("agent".to_owned(), "tour".to_owned())].into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    println!("session {}", session.session_id);

    // One request, one atomic append: the user asks, the assistant calls a tool, the tool
    // answers, the assistant replies.
    let appended = client
        .append(AppendRequest {
            session_id: session.session_id.clone(),
            nodes: vec![
                message(Role::User, "What is in README.md?", vec![]),
                message(
                    Role::Assistant,
                    "Let me read it.",
                    vec![ToolCall {
                        call_id: "call_1".into(),
                        name: "read_file".into(),
                        arguments_json: r#"{"path": "README.md"}"#.into(),
                    }],
                ),
                NodeInput {
                    kind: Some(Kind::ToolResult(pb::ToolResult {
                        call_id: "call_1".into(),
                        parts: vec![text("# ctxd\nA persistent session store for LLM agents.")],
                        ..Default::default()
                    })),
                    pinned: false,
                },
                message(
                    Role::Assistant,
                    "It describes ctxd, a session store.",
                    vec![],
                ),
            ],
            ..Default::default()
        })
        .await?
        .into_inner();
    println!(
        "appended {} nodes, head {}",
        appended.node_ids.len(),
        appended.head_id
    );

    let rendered = client
        .render(RenderRequest {
            session_id: session.session_id,
            tokenizer: "o200k_base".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    for m in &rendered.messages {
        let role = Role::try_from(m.role)
            .unwrap_or(Role::Unspecified)
            .as_str_name();
        let body: Vec<String> = m
            .parts
            .iter()
            .filter_map(|p| match &p.part {
                Some(Part::Text(t)) => Some(t.replace('\n', " ")),
                _ => None,
            })
            .chain(
                m.tool_calls
                    .iter()
                    .map(|c| format!("-> {}({})", c.name, c.arguments_json)),
            )
            .collect();
        println!("{role:>14} [{:>3} tokens] {}", m.tokens, body.join(" "));
    }
    println!(
        "total {} tokens ({})",
        rendered.total_tokens, rendered.tokenizer
    );
    Ok(())
}
