//! The model gateway in front of the real OpenAI Codex CLI (`codex exec`), which speaks the
//! Responses API (`POST /v1/responses`, always streamed, the whole history resent each call,
//! `prompt_cache_key` naming its thread): Codex runs as a child process whose model provider is
//! an in-process server's gateway, forwarding to the scripted fake provider
//! (`tests/common/fake_provider.rs`). The fake scripts Codex's shell tool, `exec_command`
//! (`{"cmd": ".."}`); Codex runs the command itself, in a temp dir, and sends its output back.
//! Each test checks that Codex did what was scripted (the file it wrote, the answer it printed),
//! that the ctxd session holds the conversation (the call, its output, the answer), and what
//! went upstream. With its provider named `OpenAI` Codex behaves as with OpenAI's own API: it
//! resends its items with its bookkeeping, and compacts remotely (a `compaction_trigger` item,
//! answered with one `compaction` item); tests run it so, through a resume and a compaction.
//! Two more tests need no Codex: Responses Lite's `additional_tools` item through the gateway,
//! and the fake's own Responses API.
//!
//! Codex is found at `target/agents/node_modules/.bin/codex` (`.ci/run` installs the pinned
//! `@openai/codex`); `CTXD_TEST_CODEX` names another. Without it the tests skip with a message,
//! unless `CTXD_GATEWAY_CLIENTS=required` (CI sets it): then they fail naming what is missing.
//! Codex runs with a temp `HOME` and `CODEX_HOME` whose `config.toml` names the gateway as its
//! only provider and turns off what would reach beyond it (update checks, analytics, plugins,
//! apps); every child process is killed, with its process group, at [`CHILD_LIMIT`].

use std::path::{Path, PathBuf};
use std::process::Command;

use ctxd::api::pb;
use serde_json::{Value, json};

use crate::agents::{Ran, gateway_app, model_calls, paths, run_bounded};
use crate::fake_provider::{FakeProvider, Recorded, Reply, parse_sse, responses_of_sse, tokens_of};
use crate::helpers::TestApp;

/// The model Codex is configured with: a slug it has no metadata for (it warns and uses its
/// fallback, whose shell tool is `exec_command`).
const MODEL: &str = "gpt-5-codex";

/// The environment variable Codex reads the provider's key from (`env_key`).
const KEY_VAR: &str = "CTXD_TEST_CODEX_KEY";

/// Codex's shell tool.
const SHELL: &str = "exec_command";

const CALL_ID: &str = "call_ctxd_exec_1";
const ANSWER: &str = "Wrote out.txt.";

/// `codex exec` through the gateway: the fake scripts an `exec_command` call that writes a file,
/// then the answer. Codex runs the command, sends its output back, prints the answer.
#[tokio::test]
async fn codex_exec_runs_a_shell_call_through_the_gateway() {
    let Some(codex) = codex() else { return };
    let fake = FakeProvider::start().await;
    let (mut app, gateway) = gateway_app(&fake).await;
    let dirs = CodexDirs::new(&gateway);
    let marker = format!("ctxd-codex-{}", uuid::Uuid::now_v7().simple());
    let shell_command = format!("echo {marker} > out.txt");
    fake.script_all([
        Reply::tool_use_id(CALL_ID, SHELL, json!({"cmd": shell_command})),
        Reply::text(ANSWER),
    ]);

    let prompt = format!("Write {marker} into out.txt.");
    let ran = run_bounded("codex exec", dirs.exec(&codex, &[&prompt])).await;
    let upstream = paths(&fake);
    assert!(
        ran.status.success() && ran.stdout.trim() == ANSWER,
        "codex exec printed the scripted answer {ANSWER:?}\nstatus: {}\nstdout: {}\nstderr: {}\n\
         upstream requests: {upstream}",
        ran.status,
        ran.stdout,
        ran.stderr
    );
    let written = std::fs::read_to_string(dirs.work.join("out.txt")).unwrap_or_else(|e| {
        panic!(
            "Codex ran the scripted command, which wrote out.txt ({e})\nstderr: {}",
            ran.stderr
        )
    });
    assert_eq!(written, format!("{marker}\n"), "what the command wrote");

    // Upstream: exactly the two model calls, streamed, Codex's key, thread and tools forwarded;
    // the second resends the first's items as they went, then the call and its output.
    let calls = model_calls(&fake, "/v1/responses");
    assert_eq!(calls.len(), 2, "model calls upstream: {upstream}");
    let thread = assert_codex_call(&calls[0]);
    assert_eq!(
        assert_codex_call(&calls[1]),
        thread,
        "both calls name one thread"
    );
    let (first, second) = (calls[0].input(), calls[1].input());
    assert!(
        first.iter().any(|item| item_text(item) == prompt),
        "the prompt went upstream as a message item: {first:#?}"
    );
    assert!(
        second.len() >= first.len() + 2 && second[..first.len()] == first[..],
        "the second upstream input starts with the first's items, unchanged\nfirst: {first:#?}\n\
         second: {second:#?}"
    );
    let (call, output) = call_and_output(&second, CALL_ID).unwrap_or_else(|| {
        panic!("the second upstream input has {CALL_ID}'s call and then its output: {second:#?}")
    });
    assert_eq!(call["name"], SHELL, "{call}");
    assert_eq!(
        arguments(&call),
        json!({"cmd": shell_command}),
        "the call's arguments upstream"
    );
    let output_text = output["output"].as_str().unwrap_or_default();
    assert!(
        output_text.contains("Process exited with code 0"),
        "Codex's report of the command went upstream as the call's output: {output}"
    );

    // ctxd: one session for the run, on one branch, holding the prompt, then the call, its
    // output and the answer, each once and in that order.
    let session = crate::agents::only_session(&mut app, "one Codex thread").await;
    let branch = only_branch(&mut app, &session).await;
    let all = log_lines(&mut app, &session, &branch).await;
    let prompt_at = all
        .iter()
        .position(|l| *l == format!("user: {prompt}"))
        .unwrap_or_else(|| panic!("the prompt is recorded: {all:#?}"));
    assert!(
        all.len() >= prompt_at + 4,
        "the call, its output and the answer follow the prompt: {all:#?}"
    );
    let tail = &all[all.len() - 3..];
    assert_eq!(
        tail[0],
        format!(
            "assistant: -> {CALL_ID} {SHELL} {}",
            json!({"cmd": shell_command})
        ),
        "the call is recorded after the prompt: {all:#?}"
    );
    assert!(
        tail[1].starts_with(&format!("tool[{CALL_ID} {SHELL}]: "))
            && tail[1].contains("Process exited with code 0"),
        "the command's output is recorded after the call: {all:#?}"
    );
    assert_eq!(
        tail[2],
        format!("assistant: {ANSWER}"),
        "the answer is the head: {all:#?}"
    );
    for line in [&all[prompt_at], &tail[0], &tail[2]] {
        let times = all.iter().filter(|l| *l == line).count();
        assert_eq!(times, 1, "recorded once: {line}\n{all:#?}");
    }
}

/// A second `codex exec` resuming the first's thread (`exec resume --last`) continues the same
/// ctxd session on the same branch: the first run's reasoning (with its encrypted content), call,
/// output and answer come back from Codex reformatted (its own field order, `content: null` on
/// the reasoning) and must be recognised as what was recorded.
#[tokio::test]
async fn codex_exec_resume_continues_the_session() {
    let Some(codex) = codex() else { return };
    let fake = FakeProvider::start().await;
    let (mut app, gateway) = gateway_app(&fake).await;
    let dirs = CodexDirs::new(&gateway);
    let shell_command = "echo first > out.txt";
    let summary = "The file must be written first.";
    let encrypted = "gAAAA-ctxd-encrypted-reasoning";
    let second_answer = "Nothing else to do.";
    fake.script_all([
        Reply::thinking(
            summary,
            encrypted,
            Reply::tool_use_id(CALL_ID, SHELL, json!({"cmd": shell_command})),
        ),
        Reply::text(ANSWER),
        Reply::text(second_answer),
    ]);

    let first_prompt = "Write first into out.txt.";
    let ran = run_bounded("codex exec", dirs.exec(&codex, &[first_prompt])).await;
    assert!(
        ran.status.success() && ran.stdout.trim() == ANSWER,
        "the first codex exec printed {ANSWER:?}\nstatus: {}\nstdout: {}\nstderr: {}\n\
         upstream requests: {}",
        ran.status,
        ran.stdout,
        ran.stderr,
        paths(&fake)
    );
    assert_eq!(
        std::fs::read_to_string(dirs.work.join("out.txt")).ok(),
        Some("first\n".to_owned()),
        "the scripted command ran"
    );
    let second_prompt = "Anything else?";
    let ran = run_bounded(
        "codex exec resume",
        dirs.exec(&codex, &["resume", "--last", second_prompt]),
    )
    .await;
    assert!(
        ran.status.success() && ran.stdout.trim() == second_answer,
        "codex exec resume printed {second_answer:?}\nstatus: {}\nstdout: {}\nstderr: {}\n\
         upstream requests: {}",
        ran.status,
        ran.stdout,
        ran.stderr,
        paths(&fake)
    );

    // Upstream: three calls on one thread, each input starting with the one before it; the
    // reasoning went back with its encrypted content, before the call it led to.
    let calls = model_calls(&fake, "/v1/responses");
    assert_eq!(calls.len(), 3, "model calls upstream: {}", paths(&fake));
    let thread = assert_codex_call(&calls[0]);
    for call in &calls[1..] {
        assert_eq!(assert_codex_call(call), thread, "one thread");
    }
    let inputs: Vec<Vec<Value>> = calls.iter().map(Recorded::input).collect();
    for pair in inputs.windows(2) {
        assert!(
            pair[1].len() > pair[0].len() && pair[1][..pair[0].len()] == pair[0][..],
            "each upstream input starts with the previous one, unchanged\nbefore: {:#?}\n\
             after: {:#?}",
            pair[0],
            pair[1]
        );
    }
    let second = &inputs[1];
    let reasoning_at = second
        .iter()
        .position(|item| item["type"] == "reasoning")
        .unwrap_or_else(|| panic!("the reasoning went back upstream: {second:#?}"));
    assert_eq!(
        second[reasoning_at]["encrypted_content"], encrypted,
        "with its encrypted content: {:#}",
        second[reasoning_at]
    );
    assert_eq!(
        second.get(reasoning_at + 1).map(|item| &item["call_id"]),
        Some(&json!(CALL_ID)),
        "the call follows its reasoning: {second:#?}"
    );
    let third = &inputs[2];
    let answered = third
        .iter()
        .position(|item| item["role"] == "assistant" && item_text(item) == ANSWER)
        .unwrap_or_else(|| panic!("the first run's answer went upstream again: {third:#?}"));
    assert!(
        third[answered + 1..]
            .iter()
            .any(|item| item["role"] == "user" && item_text(item) == second_prompt),
        "the new prompt follows the answer: {third:#?}"
    );

    // ctxd: one session and one branch for both runs, ending with the whole exchange.
    let session = crate::agents::only_session(&mut app, "one Codex thread").await;
    let branch = only_branch(&mut app, &session).await;
    let all = log_lines(&mut app, &session, &branch).await;
    let expected = vec![
        format!("user: {first_prompt}"),
        format!(
            "assistant: (reasoning: {summary}) -> {CALL_ID} {SHELL} {}",
            json!({"cmd": shell_command})
        ),
        format!("tool[{CALL_ID} {SHELL}]: "),
        format!("assistant: {ANSWER}"),
        format!("user: {second_prompt}"),
        format!("assistant: {second_answer}"),
    ];
    let start = all
        .iter()
        .position(|l| *l == expected[0])
        .unwrap_or_else(|| panic!("the first prompt is recorded: {all:#?}"));
    let got: Vec<&str> = all[start..]
        .iter()
        .filter(|l| !l.starts_with("system: ") && !l.starts_with("developer: "))
        // Codex's context messages (`<environment_context>`...), should a resume add one.
        .filter(|l| !l.starts_with("user: <") || expected.contains(l))
        .map(String::as_str)
        .collect();
    assert_eq!(
        got.len(),
        expected.len(),
        "the session from the first prompt on, Codex's own context messages left out: {all:#?}"
    );
    for (line, want) in got.iter().zip(&expected) {
        assert!(
            line.starts_with(want.as_str()),
            "{line:?} should start with {want:?}\n{all:#?}"
        );
    }
}

/// The answer with the call is cut off after the call's `response.output_item.done`, before
/// `response.completed`: Codex runs the call it already has, reconnects, and its next request
/// holds the call and its output. The gateway records no half answer, and the session still
/// ends with the call, its output and the answer, on one branch.
#[tokio::test]
async fn codex_exec_keeps_a_call_whose_stream_was_cut() {
    let Some(codex) = codex() else { return };
    let fake = FakeProvider::start().await;
    let (mut app, gateway) = gateway_app(&fake).await;
    let dirs = CodexDirs::new(&gateway);
    let shell_command = "echo cut > out.txt";
    // `response.created`, `.in_progress`, `.output_item.added`, three argument deltas,
    // `.function_call_arguments.done`, `.output_item.done`: 8 events, then the cut.
    fake.script_all([
        Reply::tool_use_id(CALL_ID, SHELL, json!({"cmd": shell_command})).cut_after(8),
        Reply::text(ANSWER),
    ]);

    let prompt = "Write cut into out.txt.";
    let ran = run_bounded("codex exec", dirs.exec(&codex, &[prompt])).await;
    let upstream = paths(&fake);
    assert!(
        ran.status.success() && ran.stdout.trim() == ANSWER,
        "codex exec printed {ANSWER:?}\nstatus: {}\nstdout: {}\nstderr: {}\nupstream requests: \
         {upstream}",
        ran.status,
        ran.stdout,
        ran.stderr
    );
    assert_eq!(
        std::fs::read_to_string(dirs.work.join("out.txt")).ok(),
        Some("cut\n".to_owned()),
        "Codex ran the call of the cut stream"
    );
    let calls = model_calls(&fake, "/v1/responses");
    let last = calls.last().expect("model calls upstream").input();
    assert!(
        call_and_output(&last, CALL_ID).is_some(),
        "the last upstream input has the call and its output: {last:#?}"
    );

    let session = crate::agents::only_session(&mut app, "one Codex thread").await;
    let branch = only_branch(&mut app, &session).await;
    let all = log_lines(&mut app, &session, &branch).await;
    let tail = &all[all.len().saturating_sub(4)..];
    assert!(
        tail.len() == 4
            && tail[0] == format!("user: {prompt}")
            && tail[1]
                == format!(
                    "assistant: -> {CALL_ID} {SHELL} {}",
                    json!({"cmd": shell_command})
                )
            && tail[2].starts_with(&format!("tool[{CALL_ID} {SHELL}]: "))
            && tail[3] == format!("assistant: {ANSWER}"),
        "the session ends with the prompt, the call, its output and the answer: {all:#?}"
    );
}

/// Codex with its provider named `OpenAI` (as when a user points its OpenAI provider at the
/// gateway) resends the items of its earlier answers with a member the answer did not have
/// (`internal_chat_message_metadata_passthrough`, naming its turn), and its messages with their
/// ids. A run of tool calls and its resume, five model calls, must still be one session on one
/// branch, every message one node: the gateway once saw a changed history on every call,
/// forked a `gw-…` branch for each and stored every answer twice.
#[tokio::test]
async fn codex_named_openai_resends_its_answers_onto_one_branch() {
    let Some(codex) = codex() else { return };
    let fake = FakeProvider::start().await;
    let (mut app, gateway) = gateway_app(&fake).await;
    let dirs = CodexDirs::named(&gateway, "OpenAI");
    let summary = "One command per file.";
    let (wrote, more) = ("Wrote one.txt and two.txt.", "Wrote three.txt.");
    fake.script_all([
        Reply::thinking(
            summary,
            "gAAAA-ctxd-openai-reasoning",
            Reply::tool_use_id("call_one", SHELL, json!({"cmd": "echo one > one.txt"})),
        ),
        Reply::tool_use_id("call_two", SHELL, json!({"cmd": "echo two > two.txt"})),
        Reply::text(wrote),
        Reply::tool_use_id(
            "call_three",
            SHELL,
            json!({"cmd": "echo three > three.txt"}),
        ),
        Reply::text(more),
    ]);

    let first = "Write one.txt and two.txt.";
    let ran = run_bounded("codex exec", dirs.exec(&codex, &[first])).await;
    assert_printed(&ran, wrote, &fake);
    let second = "Now write three.txt.";
    let ran = run_bounded(
        "codex exec resume",
        dirs.exec(&codex, &["resume", "--last", second]),
    )
    .await;
    assert_printed(&ran, more, &fake);
    for name in ["one", "two", "three"] {
        assert_eq!(
            std::fs::read_to_string(dirs.work.join(format!("{name}.txt"))).ok(),
            Some(format!("{name}\n")),
            "the scripted command wrote {name}.txt"
        );
    }

    // Upstream: five calls on one thread, each input the one before it and what is new; the
    // answers came back with Codex's bookkeeping (the case at hand).
    let calls = model_calls(&fake, "/v1/responses");
    assert_eq!(calls.len(), 5, "model calls upstream: {}", paths(&fake));
    let thread = assert_codex_call(&calls[0]);
    for call in &calls[1..] {
        assert_eq!(assert_codex_call(call), thread, "one thread");
    }
    let inputs: Vec<Vec<Value>> = calls.iter().map(Recorded::input).collect();
    assert_each_input_extends_the_last(&inputs);
    // (The answers' reasoning and messages go upstream as Codex resent them.)
    let marked = inputs[1..].iter().flatten().any(|item| {
        (item["type"] == "reasoning" || item["role"] == "assistant")
            && item
                .get("internal_chat_message_metadata_passthrough")
                .is_some()
    });
    assert!(
        marked,
        "Codex, its provider named OpenAI, resends an answer's items with its bookkeeping added \
         (else this test no longer shows the case): {inputs:#?}"
    );

    // ctxd: one session, one branch, each message once and nothing stored beside it.
    let session = crate::agents::only_session(&mut app, "one Codex thread").await;
    let branch = only_branch(&mut app, &session).await;
    let all = log_lines(&mut app, &session, &branch).await;
    assert_conversation(
        &all,
        &[
            format!("user: {first}"),
            format!(
                "assistant: (reasoning: {summary}) -> call_one {SHELL} {}",
                json!({"cmd": "echo one > one.txt"})
            ),
            format!("tool[call_one {SHELL}]: "),
            format!(
                "assistant: -> call_two {SHELL} {}",
                json!({"cmd": "echo two > two.txt"})
            ),
            format!("tool[call_two {SHELL}]: "),
            format!("assistant: {wrote}"),
            format!("user: {second}"),
            format!(
                "assistant: -> call_three {SHELL} {}",
                json!({"cmd": "echo three > three.txt"})
            ),
            format!("tool[call_three {SHELL}]: "),
            format!("assistant: {more}"),
        ],
    );
    assert_eq!(
        usize::try_from(app.node_count().await).ok(),
        Some(all.len()),
        "every node stored is on the one branch: no answer stored twice\n{all:#?}"
    );
}

/// Codex compacts remotely (its provider named `OpenAI`, `model_auto_compact_token_limit`
/// passed mid-turn): it sends its history with a `compaction_trigger` item, takes the one
/// `compaction` item of the answer (sent only in `response.output_item.done`), and goes on
/// from a window of its context, its prompts and that item. Through the gateway: the trigger
/// goes upstream as Codex sent it and is recorded, the compaction item reaches Codex intact
/// (it sends it back as it was), Codex finishes, and it is all one session.
///
/// `CTXD_WRITE_CODEX_CORPUS=1` also writes the request bodies the fake received, scrubbed,
/// to `testdata/gateway/corpus/codex-0.171/` (see the README there).
#[tokio::test]
async fn codex_remote_compaction_passes_through_the_gateway() {
    let Some(codex) = codex() else { return };
    // The corpus is what Codex sent, so its requests are forwarded as they came.
    let corpus = std::env::var("CTXD_WRITE_CODEX_CORPUS").is_ok_and(|v| v == "1");
    let mut run = compacting_run(&codex, corpus).await;
    let calls = model_calls(&run.fake, "/v1/responses");
    if corpus {
        write_corpus(&calls, &run.dirs);
    }
    let inputs: Vec<Vec<Value>> = calls.iter().map(Recorded::input).collect();
    let trigger = json!({"type": "compaction_trigger"});
    let asked: Vec<usize> = (0..inputs.len())
        .filter(|&i| inputs[i].contains(&trigger))
        .collect();
    assert_eq!(
        asked,
        vec![COMPACTION_CALL],
        "one request asked for a compaction, the one after the long call's output: {}",
        paths(&run.fake)
    );
    // The request asking for it: the history so far, then the trigger, as Codex sent it.
    let asking = &inputs[COMPACTION_CALL];
    assert_eq!(
        asking.last(),
        Some(&trigger),
        "the trigger is last: {asking:#?}"
    );
    assert_each_input_extends_the_last(&inputs[..=COMPACTION_CALL]);
    assert!(
        call_and_output(asking, "call_two").is_some(),
        "the trigger follows the call that passed the limit, and its output: {asking:#?}"
    );
    // The window after it: Codex took the compaction item whole and sends it back as it was,
    // in place of the calls it replaced.
    let window = &inputs[COMPACTION_CALL + 1];
    let compactions: Vec<&Value> = window
        .iter()
        .filter(|item| item["type"] == "compaction")
        .collect();
    assert_eq!(
        compactions,
        vec![&compaction_item()],
        "Codex goes on from the compaction item, intact: {window:#?}"
    );
    assert!(
        call_and_output(window, "call_one").is_none(),
        "the compacted window holds none of the calls before it: {window:#?}"
    );

    // ctxd: one session; the trigger recorded as Codex sent it, the compaction after it.
    let session = crate::agents::only_session(&mut run.app, "one Codex thread").await;
    let mut found = Vec::new();
    for branch in run.app.branches(&session).await {
        let nodes = ordered_log(&mut run.app, &session, &branch.name).await;
        for pair in nodes.windows(2) {
            if kept_items(&pair[0]) == vec![trigger.clone()] {
                found.push((branch.name.clone(), kept_items(&pair[1])));
            }
        }
    }
    assert!(!found.is_empty(), "the trigger is recorded");
    for (branch, answer) in &found {
        assert_eq!(
            answer,
            &vec![json!({"type": "compaction", "encrypted_content": COMPACTED})],
            "on {branch}, the trigger's answer, the compaction item (its id left out), follows it"
        );
    }
}

/// After a remote compaction Codex goes on from a window that opens with its context and
/// prompts, then the compaction item, then what follows: the session goes on on the branch
/// that holds the trigger and its answer, the window laid after that answer (it is the context
/// the model reads from then on) over an overlay that hides the history it replaced, and no
/// answer stored twice.
#[tokio::test]
async fn codex_remote_compaction_continues_on_one_branch() {
    let Some(codex) = codex() else { return };
    let mut run = compacting_run(&codex, false).await;
    let session = crate::agents::only_session(&mut run.app, "one Codex thread").await;
    let branch = only_branch(&mut run.app, &session).await;
    let all = log_lines(&mut run.app, &session, &branch).await;
    assert_conversation(
        &all,
        &[
            format!("user: {FIRST_PROMPT}"),
            format!(
                "assistant: (reasoning: {FIRST_SUMMARY}) -> call_one {SHELL} {}",
                json!({"cmd": "echo one > one.txt"})
            ),
            format!("tool[call_one {SHELL}]: "),
            format!("assistant: {FIRST_ANSWER}"),
            format!("user: {SECOND_PROMPT}"),
            format!(
                "assistant: (reasoning: {SECOND_SUMMARY}) -> call_two {SHELL} {}",
                json!({"cmd": "echo two > two.txt"})
            ),
            format!("tool[call_two {SHELL}]: "),
            "assistant: (compaction_trigger)".to_owned(),
            "assistant: (compaction)".to_owned(),
            // The window: the prompts Codex kept, then its compaction item.
            format!("user: {FIRST_PROMPT}"),
            format!("user: {SECOND_PROMPT}"),
            "assistant: (compaction)".to_owned(),
            format!("assistant: {SECOND_ANSWER}"),
        ],
    );
    let summaries = run.app.list_summaries(&session, &branch).await;
    assert_eq!(
        summaries
            .summaries
            .iter()
            .map(|s| s.model.as_str())
            .collect::<Vec<_>>(),
        ["agent:window:codex"],
        "the history the window replaced is under one overlay"
    );
    assert_eq!(
        usize::try_from(run.app.node_count().await).ok(),
        Some(all.len()),
        "every node stored is on the one branch\n{all:#?}"
    );
}

/// Responses Lite sends a client's tools as an `additional_tools` input item, with no
/// top-level `tools`. The gateway forwards the item as it came and records it as a node of its
/// own, and the history resent with the answer and the call's output stays on its branch,
/// nothing stored twice. (Plain HTTP: no Codex needed.)
#[tokio::test]
async fn gateway_passes_and_records_additional_tools() {
    let mut gw = crate::gateway::start().await;
    let tools = json!({"type": "additional_tools", "tools": [
        {"type": "function", "name": "lookup", "description": "Looks a word up.", "strict": false,
         "parameters": {"type": "object", "properties": {"word": {"type": "string"}},
                        "required": ["word"], "additionalProperties": false}}]});
    let developer = json!({"type": "message", "role": "developer",
        "content": [{"type": "input_text", "text": "Answer in one word."}]});
    let prompt = json!({"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "What is a gateway?"}]});
    let body = |input: &[Value]| {
        json!({"model": MODEL, "stream": true, "store": false, "input": input,
               "prompt_cache_key": "ctxd-lite-thread"})
        .to_string()
        .into_bytes()
    };
    let headers = [("authorization", "Bearer sk-test")];
    gw.fake.script_all([
        Reply::tool_use_id("call_lookup", "lookup", json!({"word": "gateway"})),
        Reply::text("Door."),
    ]);

    let mut input = vec![developer, tools.clone(), prompt];
    let first = gw.post("/v1/responses", &headers, body(&input)).await.ok();
    let (_, answer) = responses_of_sse(&first.body).expect("a whole streamed answer");
    input.extend(answer);
    input.push(
        json!({"type": "function_call_output", "call_id": "call_lookup",
                      "output": "a door in a wall"}),
    );
    let second = gw.post("/v1/responses", &headers, body(&input)).await.ok();

    for call in gw.upstream("/v1/responses") {
        assert!(
            call.body.get("tools").is_none(),
            "no tools were added: {:#}",
            call.body
        );
        let sent = call.input();
        assert_eq!(
            sent.get(1),
            Some(&tools),
            "the item went upstream as it came, where it stood: {sent:#?}"
        );
    }
    let (session, branch) = (second.session(), second.branch());
    assert_eq!(
        (first.session(), first.branch()),
        (session.clone(), branch.clone())
    );
    gw.answered(&session, &branch, 6).await;
    let nodes = ordered_log(&mut gw.app, &session, &branch).await;
    let lines: Vec<String> = nodes.iter().map(describe).collect();
    assert_eq!(
        lines,
        [
            "developer: Answer in one word.".to_owned(),
            "assistant: (additional_tools)".to_owned(),
            "user: What is a gateway?".to_owned(),
            format!(
                "assistant: -> call_lookup lookup {}",
                json!({"word": "gateway"})
            ),
            "tool[call_lookup lookup]: a door in a wall".to_owned(),
            "assistant: Door.".to_owned(),
        ],
        "the tools are a node of their own, in their place"
    );
    assert_eq!(kept_items(&nodes[1]), vec![tools], "recorded whole");
    assert_eq!(
        usize::try_from(gw.app.node_count().await).ok(),
        Some(nodes.len()),
        "nothing stored twice, nothing off the branch"
    );
}

/// The fake provider's Responses API, as the tests above rely on it (no Codex needed): a
/// streamed answer's events and the items they carry, the same answer whole, the imitated
/// prefix cache, and a stream that fails.
#[tokio::test]
async fn fake_provider_speaks_the_responses_api() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder().build().expect("an HTTP client");
    let fake = FakeProvider::start().await;
    let url = format!("{}/v1/responses", fake.url());
    // Long enough to be cached: OpenAI caches prefixes of 1,024 tokens and more.
    let input = json!([{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "hi ".repeat(1500)}]}]);
    let body = |stream: bool| json!({"model": MODEL, "input": input, "stream": stream});
    fake.script_all([
        Reply::thinking(
            "hmm",
            "enc",
            Reply::tool_use_id(CALL_ID, SHELL, json!({"cmd": "true"})),
        ),
        Reply::text(ANSWER),
        Reply::responses_failed("server_error", "boom"),
    ]);

    let streamed = http
        .post(&url)
        .json(&body(true))
        .send()
        .await
        .expect("send");
    assert_eq!(
        streamed.headers()["content-type"],
        "text/event-stream",
        "a stream"
    );
    let bytes = streamed.bytes().await.expect("the stream");
    let events: Vec<Value> = parse_sse(&bytes)
        .iter()
        .map(|e| {
            let data: Value = serde_json::from_str(&e.data).expect("JSON data");
            assert_eq!(data["type"], e.event.as_str(), "event: names the type");
            data
        })
        .collect();
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        types.first().copied(),
        Some("response.created"),
        "{types:?}"
    );
    assert_eq!(
        types.last().copied(),
        Some("response.completed"),
        "{types:?}"
    );
    assert_eq!(
        types
            .iter()
            .filter(|t| **t == "response.output_item.done")
            .count(),
        2,
        "{types:?}"
    );
    for (n, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], n, "{event}");
    }
    let (response, items) = responses_of_sse(&bytes).expect("a whole response");
    assert_eq!(response["status"], "completed");
    assert_eq!(response["output"], json!(items), "done items = the output");
    assert_eq!(
        items,
        vec![
            json!({"type": "reasoning", "id": "rs_fake_1_0", "summary": [
                {"type": "summary_text", "text": "hmm"}], "encrypted_content": "enc"}),
            json!({"type": "function_call", "id": "fc_fake_1_1", "call_id": CALL_ID,
                "name": SHELL, "arguments": "{\"cmd\":\"true\"}", "status": "completed"}),
        ]
    );
    let prompt = tokens_of(&input[0]);
    assert_eq!(response["usage"]["input_tokens"], prompt);
    assert_eq!(
        response["usage"]["input_tokens_details"]["cached_tokens"],
        0
    );

    // The same input again, not streamed: the whole response, its prompt read from the cache.
    let whole: Value = http
        .post(&url)
        .json(&body(false))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("a JSON response");
    assert_eq!(whole["status"], "completed");
    assert_eq!(
        whole["output"],
        json!([{"type": "message", "id": "msg_fake_2_0", "status": "completed",
            "role": "assistant", "content": [
                {"type": "output_text", "text": ANSWER, "annotations": []}]}])
    );
    assert_eq!(
        whole["usage"]["input_tokens_details"]["cached_tokens"],
        prompt / 128 * 128,
        "in steps of 128 tokens"
    );
    assert_eq!(
        fake.last_request().input(),
        input.as_array().cloned().unwrap()
    );

    let failed = http
        .post(&url)
        .json(&body(true))
        .send()
        .await
        .expect("send");
    assert_eq!(failed.status(), 200, "a failure after the stream began");
    let bytes = failed.bytes().await.expect("the stream");
    let (response, items) = responses_of_sse(&bytes).expect("a terminal event");
    assert_eq!(response["status"], "failed");
    assert_eq!(
        response["error"],
        json!({"code": "server_error", "message": "boom"})
    );
    assert!(items.is_empty());
}

// ---------------------------------------------------------------- Codex

/// A temp dir for one test's Codex runs: `work` (its cwd), `home`, and `codex_home` with the
/// config naming the gateway.
struct CodexDirs {
    /// The temp dir the others are in (removed when dropped).
    root: tempfile::TempDir,
    work: PathBuf,
    home: PathBuf,
    codex_home: PathBuf,
    gateway: String,
    provider_name: String,
    /// Lines added to the provider's table.
    provider_extra: String,
}

impl CodexDirs {
    fn new(gateway: &str) -> Self {
        Self::named(gateway, "ctxd gateway")
    }

    /// Dirs whose config names the gateway's provider `provider_name`. Codex treats a provider
    /// named `OpenAI` as OpenAI's own (as when a user points its built-in provider at the
    /// gateway): it resends its items with its own bookkeeping, and compacts remotely.
    fn named(gateway: &str, provider_name: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let work = dir.path().join("work");
        let home = dir.path().join("home");
        let codex_home = dir.path().join("codex-home");
        for d in [&work, &home, &codex_home] {
            std::fs::create_dir_all(d).expect("a temp dir");
        }
        let dirs = Self {
            root: dir,
            work,
            home,
            codex_home,
            gateway: gateway.to_owned(),
            provider_name: provider_name.to_owned(),
            provider_extra: String::new(),
        };
        dirs.configure("");
        dirs
    }

    /// Compacts once the context passes `tokens` (Codex's `model_auto_compact_token_limit`),
    /// from the next run on.
    fn compact_past(&self, tokens: u64) {
        self.configure(&format!("model_auto_compact_token_limit = {tokens}\n"));
    }

    /// Has every request forwarded as Codex sent it (`x-ctxd-policy: passthrough`, which Codex
    /// sends as one of its provider's `http_headers`); the gateway still records them.
    fn forward_as_sent(&mut self) {
        self.provider_extra = "http_headers = { \"x-ctxd-policy\" = \"passthrough\" }\n".into();
        self.configure("");
    }

    /// Writes `config.toml`, with `top` among its top-level keys.
    fn configure(&self, top: &str) {
        let (gateway, name, extra) = (&self.gateway, &self.provider_name, &self.provider_extra);
        let config = format!(
            r#"model = "{MODEL}"
model_provider = "ctxd"
check_for_update_on_startup = false
{top}
[model_providers.ctxd]
name = "{name}"
base_url = "{gateway}/v1"
wire_api = "responses"
env_key = "{KEY_VAR}"
{extra}
[analytics]
enabled = false

[features]
plugins = false
remote_plugin = false
apps = false
"#
        );
        std::fs::write(self.codex_home.join("config.toml"), config).expect("write config.toml");
    }

    /// `codex exec` with `args` after its flags, run in `work` with nothing but this dir's
    /// environment (no approvals, no sandbox: the test's temp dir is the only workspace).
    fn exec(&self, codex: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(codex);
        command
            .args([
                "exec",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                "--color",
                "never",
            ])
            .args(args)
            .current_dir(&self.work)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &self.home)
            .env("CODEX_HOME", &self.codex_home)
            .env("TERM", "dumb")
            .env(KEY_VAR, "sk-test");
        command
    }
}

/// Checks what every Codex call upstream carries; its thread (`prompt_cache_key`).
fn assert_codex_call(call: &Recorded) -> String {
    assert_eq!(
        call.header("authorization"),
        Some("Bearer sk-test"),
        "Codex's key forwarded"
    );
    assert_eq!(call.body["model"], MODEL);
    assert_eq!(call.body["stream"], true, "Codex streams");
    assert_eq!(call.body["store"], false, "{}", call.body["store"]);
    let thread = call.body["prompt_cache_key"]
        .as_str()
        .unwrap_or_else(|| panic!("prompt_cache_key forwarded: {:#}", call.body))
        .to_owned();
    assert_eq!(
        call.header("session-id"),
        Some(thread.as_str()),
        "Codex's session-id header forwarded, naming the thread"
    );
    let tools: Vec<&str> = call.body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        tools.contains(&SHELL),
        "Codex's tools forwarded, {SHELL} among them: {tools:?}"
    );
    assert!(
        call.body["include"]
            .as_array()
            .is_some_and(|i| i.contains(&json!("reasoning.encrypted_content"))),
        "include forwarded: {}",
        call.body["include"]
    );
    crate::agents::assert_ctxd_headers_stripped(call);
    thread
}

/// The `function_call` item with `call_id` and the `function_call_output` right after it.
fn call_and_output(items: &[Value], call_id: &str) -> Option<(Value, Value)> {
    let at = items
        .iter()
        .position(|i| i["type"] == "function_call" && i["call_id"] == call_id)?;
    let output = items.get(at + 1)?;
    (output["type"] == "function_call_output" && output["call_id"] == call_id)
        .then(|| (items[at].clone(), output.clone()))
}

/// A function call item's arguments, parsed.
fn arguments(call: &Value) -> Value {
    serde_json::from_str(call["arguments"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("the call's arguments are JSON ({e}): {call}"))
}

/// The text of a message item: its string content, or its text parts joined.
fn item_text(item: &Value) -> String {
    match &item["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// Codex, or `None` (the test skips) when it is missing and not required.
fn codex() -> Option<PathBuf> {
    crate::agents::installed("Codex", "codex", "CTXD_TEST_CODEX", "@openai/codex")
}

// ---------------------------------------------------------------- a remote compaction

const FIRST_PROMPT: &str = "Write one.txt.";
const FIRST_SUMMARY: &str = "One command.";
const FIRST_ANSWER: &str = "Wrote one.txt.";
const SECOND_PROMPT: &str = "Now write two.txt.";
const SECOND_SUMMARY: &str = "Thought long.";
const SECOND_ANSWER: &str = "Wrote two.txt.";

/// Tokens beyond the first run's last call at which Codex compacts: more than a prompt adds,
/// less than [`long_reasoning`].
const COMPACTION_MARGIN: u64 = 2_000;

/// The index of the model call that asks for the compaction (see [`compacting_run`]).
const COMPACTION_CALL: usize = 3;

/// The compaction's opaque content.
const COMPACTED: &str = "gAAAA-ctxd-compacted-window";

/// What a run through a remote compaction leaves.
struct CompactingRun {
    app: TestApp,
    fake: FakeProvider,
    dirs: CodexDirs,
}

/// Codex, its provider named `OpenAI`, through the gateway: `codex exec` runs a call and
/// answers (calls 0 and 1); then, with Codex set to compact [`COMPACTION_MARGIN`] tokens past
/// that, `exec resume` is answered [`long_reasoning`] and a call (2), whose usage passes the
/// limit; having run the call, Codex asks for a compaction (3), answered with
/// [`compaction_item`], and goes on from the compacted window to its answer (4). Both runs
/// must end printing their answers. `as_sent`: see [`CodexDirs::forward_as_sent`].
async fn compacting_run(codex: &Path, as_sent: bool) -> CompactingRun {
    let fake = FakeProvider::start().await;
    let (app, gateway) = gateway_app(&fake).await;
    let mut dirs = CodexDirs::named(&gateway, "OpenAI");
    if as_sent {
        dirs.forward_as_sent();
    }
    fake.script_all([
        Reply::thinking(
            FIRST_SUMMARY,
            "gAAAA-ctxd-compaction-reasoning",
            Reply::tool_use_id("call_one", SHELL, json!({"cmd": "echo one > one.txt"})),
        ),
        Reply::text(FIRST_ANSWER),
    ]);
    let ran = run_bounded("codex exec", dirs.exec(codex, &[FIRST_PROMPT])).await;
    assert_printed(&ran, FIRST_ANSWER, &fake);

    // Codex compacts when the usage its last call reported (and what it added since) passes
    // the limit; the fake counts Codex's own instructions, so the limit is set from what it
    // counted.
    let calls = model_calls(&fake, "/v1/responses");
    let counted = calls
        .last()
        .and_then(|c| c.usage["total_tokens"].as_u64())
        .unwrap_or_else(|| panic!("the fake reported usage: {}", paths(&fake)));
    dirs.compact_past(counted + COMPACTION_MARGIN);
    fake.script_all([
        Reply::thinking(
            SECOND_SUMMARY,
            long_reasoning(),
            Reply::tool_use_id("call_two", SHELL, json!({"cmd": "echo two > two.txt"})),
        ),
        compaction_reply(),
        Reply::text(SECOND_ANSWER),
    ]);
    let ran = run_bounded(
        "codex exec resume",
        dirs.exec(codex, &["resume", "--last", SECOND_PROMPT]),
    )
    .await;
    assert_printed(&ran, SECOND_ANSWER, &fake);
    assert_eq!(
        fake.pending(),
        0,
        "every scripted answer was asked for: {}",
        paths(&fake)
    );
    assert_eq!(
        std::fs::read_to_string(dirs.work.join("two.txt")).ok(),
        Some("two\n".to_owned()),
        "the call before the compaction ran"
    );
    CompactingRun { app, fake, dirs }
}

/// Encrypted reasoning of 24,000 characters: some 6,000 output tokens as the fake counts them,
/// past [`COMPACTION_MARGIN`]. (Codex prints no encrypted reasoning, where a long command
/// output would fill its log.)
fn long_reasoning() -> String {
    format!("gAAAA-ctxd-long-{}", "x".repeat(24_000))
}

/// The compaction item the fake answers a `compaction_trigger` with.
fn compaction_item() -> Value {
    json!({"type": "compaction", "id": "cmp_ctxd_1", "encrypted_content": COMPACTED})
}

/// The answer to a compaction request: a stream whose one output item is
/// [`compaction_item`], sent only in `response.output_item.done` (the completed response's
/// `output` is empty), as Codex must accept. The fake's answers are built of text, calls and
/// reasoning, so this one is its raw body: a scripted "error" answer, whose status and body
/// are sent as they are, with the content type of a stream.
fn compaction_reply() -> Reply {
    let item = compaction_item();
    let mut added = item.clone();
    if let Some(fields) = added.as_object_mut() {
        fields.remove("encrypted_content");
    }
    let response = json!({"id": "resp_ctxd_compaction", "object": "response",
        "status": "in_progress", "model": MODEL, "output": []});
    let mut completed = response.clone();
    completed["status"] = json!("completed");
    completed["usage"] = json!({"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 100, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 1100});
    let events = [
        json!({"type": "response.created", "response": response}),
        json!({"type": "response.in_progress", "response": response}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": added}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        json!({"type": "response.completed", "response": completed}),
    ];
    let body: String = events
        .into_iter()
        .enumerate()
        .map(|(n, mut event)| {
            event["sequence_number"] = json!(n);
            let name = event["type"].as_str().unwrap_or_default().to_owned();
            format!("event: {name}\ndata: {event}\n\n")
        })
        .collect();
    Reply::error(200, body).header("content-type", "text/event-stream")
}

/// Writes the bodies of `calls` as `testdata/gateway/corpus/codex-0.171/NN.json`, byte for
/// byte but for the run's temp paths, which become `{{WORK}}`, `{{CODEX_HOME}}`, `{{HOME}}`
/// and `{{TMP}}`.
fn write_corpus(calls: &[Recorded], dirs: &CodexDirs) {
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/gateway/corpus/codex-0.171");
    std::fs::create_dir_all(&out).expect("the corpus dir");
    let root = dirs.root.path();
    let scrub = [
        (dirs.work.as_path(), "{{WORK}}"),
        (dirs.codex_home.as_path(), "{{CODEX_HOME}}"),
        (dirs.home.as_path(), "{{HOME}}"),
        (root, "{{TMP}}"),
    ];
    for (n, call) in calls.iter().enumerate() {
        let mut body = String::from_utf8(call.raw.to_vec()).expect("a UTF-8 body");
        for (path, placeholder) in scrub {
            body = body.replace(&path.display().to_string(), placeholder);
        }
        serde_json::from_str::<Value>(&body).expect("the scrubbed body is JSON");
        std::fs::write(out.join(format!("{n:02}.json")), body).expect("write a corpus body");
    }
}

// ---------------------------------------------------------------- checks

/// Codex exited 0 printing `answer`.
#[track_caller]
fn assert_printed(ran: &Ran, answer: &str, fake: &FakeProvider) {
    assert!(
        ran.status.success() && ran.stdout.trim() == answer,
        "codex printed {answer:?}\nstatus: {}\nstdout: {}\nstderr: {}\nupstream requests: {}",
        ran.status,
        ran.stdout,
        ran.stderr,
        paths(fake)
    );
}

/// Each upstream input starts with the one before it, unchanged, and adds to it.
#[track_caller]
fn assert_each_input_extends_the_last(inputs: &[Vec<Value>]) {
    for pair in inputs.windows(2) {
        assert!(
            pair[1].len() > pair[0].len() && pair[1][..pair[0].len()] == pair[0][..],
            "each upstream input starts with the previous one, unchanged\nbefore: {:#?}\n\
             after: {:#?}",
            pair[0],
            pair[1]
        );
    }
}

/// The branch's lines `all`, from the first of `expected` on and Codex's own context
/// messages (`system:`, `developer:`, `user: <…`) left out, are `expected`, each line starting
/// with its expected one.
#[track_caller]
fn assert_conversation(all: &[String], expected: &[String]) {
    let start = all
        .iter()
        .position(|l| *l == expected[0])
        .unwrap_or_else(|| panic!("{:?} is recorded: {all:#?}", expected[0]));
    let got: Vec<&String> = all[start..]
        .iter()
        .filter(|l| !l.starts_with("system: ") && !l.starts_with("developer: "))
        .filter(|l| !l.starts_with("user: <"))
        .collect();
    let matches = got.len() == expected.len()
        && got
            .iter()
            .zip(expected)
            .all(|(line, want)| line.starts_with(want.as_str()));
    assert!(
        matches,
        "the conversation, each message once and in order\nexpected: {expected:#?}\n\
         branch: {all:#?}"
    );
}

/// `branch` of `session`, oldest first.
async fn ordered_log(app: &mut TestApp, session: &str, branch: &str) -> Vec<pb::Node> {
    let mut nodes = app.log(session, branch).await;
    nodes.reverse();
    nodes
}

/// The Responses items a node keeps whole, fields parts left out.
fn kept_items(node: &pb::Node) -> Vec<Value> {
    use pb::node_input::Kind;
    let parts = match node.content.as_ref().and_then(|c| c.kind.as_ref()) {
        Some(Kind::Message(m)) => &m.parts,
        Some(Kind::ToolResult(r)) => &r.parts,
        _ => return Vec::new(),
    };
    parts
        .iter()
        .filter_map(|p| match &p.part {
            Some(pb::content_part::Part::Media(m)) => match &m.source {
                Some(pb::media::Source::Data(data)) => serde_json::from_slice::<Value>(data).ok(),
                _ => None,
            },
            _ => None,
        })
        .filter(|item| item["type"] != "ctxd_item_fields")
        .collect()
}

// ---------------------------------------------------------------- the gateway under test

/// The only branch of `session` with nodes (a linear conversation forks nothing); else fails
/// showing each branch's nodes.
pub(crate) async fn only_branch(app: &mut TestApp, session: &str) -> String {
    let names: Vec<String> = app
        .branches(session)
        .await
        .into_iter()
        .filter(|b| !b.head_id.is_empty())
        .map(|b| b.name)
        .collect();
    if names.len() != 1 {
        let mut shown = String::new();
        for name in &names {
            let lines = log_lines(app, session, name).await;
            shown.push_str(&format!("\n{name}: {lines:#?}"));
        }
        panic!(
            "one branch with nodes, not {}: {names:?}{shown}",
            names.len()
        );
    }
    names[0].clone()
}

/// `branch` of `session`, oldest first, one line per node (see [`describe`]).
async fn log_lines(app: &mut TestApp, session: &str, branch: &str) -> Vec<String> {
    let mut nodes = app.log(session, branch).await;
    nodes.reverse();
    nodes.iter().map(describe).collect()
}

/// A node as one line: `user: text`, `assistant: text -> id name {args}`,
/// `tool[id name]: text` (system and developer text cut at 100 characters). A kept Responses item shows as its text (a message), as
/// `(reasoning: summary)`, or as `(type)`; the fields ctxd keeps of an item are left out.
pub(crate) fn describe(node: &pb::Node) -> String {
    use pb::node_input::Kind;
    match node.content.as_ref().and_then(|c| c.kind.as_ref()) {
        Some(Kind::Message(m)) => {
            let role = match pb::Role::try_from(m.role) {
                Ok(pb::Role::System) => "system",
                Ok(pb::Role::Developer) => "developer",
                Ok(pb::Role::User) => "user",
                Ok(pb::Role::Assistant) => "assistant",
                _ => "other",
            };
            let mut line = format!("{role}:");
            let mut text = parts_text(&m.parts);
            if matches!(role, "system" | "developer") && text.chars().count() > 100 {
                // Codex's instructions run to many kilobytes: their start names them.
                text = text.chars().take(100).chain("…".chars()).collect();
            }
            if !text.is_empty() {
                line = format!("{line} {text}");
            }
            for call in &m.tool_calls {
                let args = serde_json::from_str::<Value>(&call.arguments_json)
                    .map(|v| v.to_string())
                    .unwrap_or_else(|_| call.arguments_json.clone());
                line = format!("{line} -> {} {} {args}", call.call_id, call.name);
            }
            line
        }
        Some(Kind::ToolResult(r)) => {
            let error = if r.is_error { " error" } else { "" };
            format!(
                "tool[{} {}{error}]: {}",
                r.call_id,
                r.name,
                parts_text(&r.parts)
            )
        }
        Some(other) => format!("{other:?}"),
        None => "<no content>".into(),
    }
}

/// Parts as text, joined by `|` (see [`describe`]).
fn parts_text(parts: &[pb::ContentPart]) -> String {
    use pb::content_part::Part;
    parts
        .iter()
        .filter_map(|p| match &p.part {
            Some(Part::Text(t)) => Some(t.clone()),
            Some(Part::Media(m)) => match &m.source {
                Some(pb::media::Source::Data(data)) => {
                    match serde_json::from_slice::<Value>(data) {
                        Ok(item) if item["type"] == "ctxd_item_fields" => None,
                        Ok(item) if item["type"] == "message" => Some(item_text(&item)),
                        Ok(item) if item["type"] == "reasoning" => Some(format!(
                            "(reasoning: {})",
                            item["summary"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter_map(|s| s["text"].as_str())
                                .collect::<Vec<_>>()
                                .join(" ")
                        )),
                        Ok(item) if item["type"].is_string() => {
                            Some(format!("({})", item["type"].as_str().unwrap_or_default()))
                        }
                        _ => Some(format!("<{}>", m.mime_type)),
                    }
                }
                _ => Some(format!("<{}>", m.mime_type)),
            },
            None => Some("<empty part>".into()),
        })
        .collect::<Vec<_>>()
        .join("|")
}
