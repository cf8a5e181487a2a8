//! Rendering of plain paths: roles, tool results, targets and token counts.

use ctxd::api::pb;
use tonic::Code;

use crate::helpers::*;

#[tokio::test]
async fn tool_results_render_as_tool_messages() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let appended = app
        .append(
            &s,
            vec![
                system("Be brief."),
                user("What time is it, and what is in /tmp?"),
                assistant_calls(
                    "Checking.",
                    vec![
                        call("t1", "clock", "{}"),
                        call("t2", "list_dir", r#"{"path":"/tmp"}"#),
                    ],
                ),
                // Answered out of order: any unanswered call of the latest assistant message.
                tool_error("t2", "permission denied"),
                tool_result("t1", "12:00"),
                assistant("It is noon; /tmp is not readable."),
            ],
        )
        .await;
    let ids = &appended.node_ids;

    let r = app.render_branch(&s, "main").await;
    assert_eq!(
        transcript(&r.messages),
        vec![
            "system: Be brief.",
            "user: What time is it, and what is in /tmp?",
            "assistant: Checking. -> t1,t2",
            "tool[t2]: permission denied",
            "tool[t1]: 12:00",
            "assistant: It is noon; /tmp is not readable.",
        ]
    );
    let calls = &r.messages[2].tool_calls;
    assert_eq!(calls[1], call("t2", "list_dir", r#"{"path":"/tmp"}"#));

    let denied = &r.messages[3];
    assert_eq!(denied.role, pb::Role::Tool as i32);
    assert_eq!(denied.tool_call_id, "t2");
    assert_eq!(denied.name, "list_dir", "name filled from the call");
    assert!(denied.is_error);
    assert_eq!(denied.node_ids, vec![ids[3].clone()]);
    let clock = &r.messages[4];
    assert_eq!(clock.name, "clock");
    assert!(!clock.is_error);

    for (m, id) in r.messages.iter().zip([&ids[0], &ids[1], &ids[2]]) {
        assert_eq!(&m.node_ids, &vec![id.clone()]);
        assert_eq!(m.function_id, "");
    }
    assert_eq!(r.head_id, appended.head_id);
    assert_eq!(r.head_hash, appended.head_hash);
}

#[tokio::test]
async fn render_targets_default_branch_and_node() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;

    let empty = app
        .render(pb::RenderRequest {
            session_id: s.clone(),
            ..Default::default()
        })
        .await;
    assert!(empty.messages.is_empty());
    assert_eq!(empty.head_id, "");
    assert_eq!(empty.total_tokens, 0);

    let ids = app
        .append(&s, vec![user("one"), assistant("two"), user("three")])
        .await
        .node_ids;

    // No target: main.
    let default = app
        .render(pb::RenderRequest {
            session_id: s.clone(),
            ..Default::default()
        })
        .await;
    assert_eq!(
        transcript(&default.messages),
        vec!["user: one", "assistant: two", "user: three"]
    );
    assert_eq!(default.head_id, ids[2]);

    // A node: the path ending there.
    let at_node = app
        .render(render_req(&s, Target::NodeId(ids[1].clone())))
        .await;
    assert_eq!(
        transcript(&at_node.messages),
        vec!["user: one", "assistant: two"]
    );
    assert_eq!(at_node.head_id, ids[1]);
    let node = app.get_nodes(&s, &ids[1..2]).await.remove(0);
    assert_eq!(at_node.head_hash, node.hash);
}

#[tokio::test]
async fn token_counts_add_up_for_every_tokenizer() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    app.append(
        &s,
        vec![
            system("You are a helpful assistant that answers in one sentence."),
            user("Explain content-addressed storage to me, please. 日本語も少し。"),
            assistant_calls(
                "Let me look it up.",
                vec![call("c1", "search", r#"{"q":"cas"}"#)],
            ),
            tool_result("c1", "Content-addressed storage keys data by its hash."),
            assistant("It stores data under the hash of its bytes, so copies are kept once."),
        ],
    )
    .await;

    let mut totals = Vec::new();
    for tokenizer in ["", "heuristic", "o200k_base", "cl100k_base"] {
        let r = app
            .render(pb::RenderRequest {
                tokenizer: tokenizer.into(),
                ..render_req(&s, Target::Branch("main".into()))
            })
            .await;
        assert_eq!(r.messages.len(), 5, "tokenizer {tokenizer:?}");
        let sum: u32 = r.messages.iter().map(|m| m.tokens).sum();
        assert!(r.total_tokens > 0, "tokenizer {tokenizer:?}");
        assert_eq!(
            r.total_tokens, sum,
            "total = sum of messages, tokenizer {tokenizer:?}"
        );
        for m in &r.messages {
            assert!(
                m.tokens > 0,
                "every message costs tokens ({tokenizer:?}): {m:?}"
            );
        }
        totals.push(r.total_tokens);
    }
    assert_eq!(
        totals[0], totals[1],
        "the default tokenizer is the heuristic"
    );
}

/// A provider document that cannot carry a media part where it stands says which: the
/// response names each part sent as `[<mime> attachment]` text, and `strict_format` refuses the
/// render naming the node instead.
#[tokio::test]
async fn a_format_that_cannot_carry_a_part_names_its_node() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let ids = app
        .append(
            &s,
            vec![
                message(
                    pb::Role::User,
                    vec![
                        text("what is in these?"),
                        media_data("image/png", vec![1, 2, 3]),
                        media_data("application/pdf", vec![4, 5]),
                        media_data("application/zip", vec![6]),
                    ],
                    vec![],
                ),
                assistant("a picture, a document and an archive"),
            ],
        )
        .await
        .node_ids;
    let request = |format: pb::Format, strict: bool| pb::RenderRequest {
        format: format as i32,
        strict_format: strict,
        ..render_req(&s, Target::Branch("main".into()))
    };
    let parts = |r: &pb::RenderResponse| -> Vec<(String, u32, String)> {
        r.uncarried
            .iter()
            .map(|u| (u.node_id.clone(), u.part_index, u.mime_type.clone()))
            .collect()
    };

    // OpenAI user messages take images only; Anthropic's take images and PDFs.
    let openai = app.render(request(pb::Format::OpenaiChat, false)).await;
    assert_eq!(
        parts(&openai),
        [
            (ids[0].clone(), 2, "application/pdf".to_owned()),
            (ids[0].clone(), 3, "application/zip".to_owned())
        ]
    );
    assert!(
        openai
            .messages_json
            .contains("[application/zip attachment]")
    );
    let anthropic = app
        .render(request(pb::Format::AnthropicMessages, false))
        .await;
    assert_eq!(
        parts(&anthropic),
        [(ids[0].clone(), 3, "application/zip".to_owned())]
    );
    let neutral = app.render(request(pb::Format::Neutral, true)).await;
    assert!(
        neutral.uncarried.is_empty(),
        "the neutral messages carry everything"
    );

    let strict = app
        .try_render(request(pb::Format::AnthropicMessages, true))
        .await;
    assert_status(strict, Code::InvalidArgument, "strict_format");
    let strict = app
        .try_render(request(pb::Format::OpenaiChat, true))
        .await
        .expect_err("refused");
    assert!(
        strict
            .message()
            .contains(&format!("node {} part 2 (application/pdf)", ids[0]))
            && strict.message().contains("FORMAT_OPENAI_CHAT")
            && strict.message().contains("nor 1 more part"),
        "{}",
        strict.message()
    );
}
