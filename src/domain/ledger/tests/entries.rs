//! The entries besides files: commands and their exit codes, errors, user requests and
//! sub-agents, each cut to what is kept of it.

use super::*;
use crate::domain::MediaSource;
use crate::domain::ledger::{commands::exit_code, errors::error_line};
use serde_json::json;

#[test]
fn commands_keep_their_first_line_and_exit_code() {
    for (text, want) in [
        ("Exit code 1\nfatal: no upstream", Some(1)),
        ("exit code: 2", Some(2)),
        ("lots\nof\noutput\nexit status 127", Some(127)),
        ("output\n[exit code 1]", Some(1)),
        ("Process exited with code -1", Some(-1)),
        ("Exit code 0", Some(0)),
        ("all good", None),
        // Deep inside the output, "exit code" is the program's own text.
        ("a\nb\nc\nthe exit code 3 means x\nd\ne\nf", None),
        ("exit code: many", None),
    ] {
        assert_eq!(exit_code(text), want, "{text:?}");
    }
    let long = format!("echo {}", "x".repeat(400));
    let l = derive(&[
        call(
            "1",
            "Bash",
            json!({"command": "\n\n  cargo test --lib  \necho done"}),
        ),
        result("1", "Bash", "Exit code 101\nerror: test failed", true),
        call("2", "Bash", json!({"command": "ls"})),
        result("2", "Bash", "a\nb", false),
        call("3", "Bash", json!({ "command": long })),
        call("4", "Bash", json!({"command": "false"})),
        result("4", "Bash", "", true),
    ]);
    assert_eq!(
        l.commands[0],
        Command {
            command: "cargo test --lib".into(),
            exit_code: Some(101),
            is_error: true,
        }
    );
    assert_eq!(l.commands[1].exit_code, None);
    assert!(!l.commands[1].is_error);
    assert_eq!(l.commands[2].command.chars().count(), COMMAND_CHARS);
    assert!(l.commands[2].command.ends_with('…'));
    // No result yet: nothing known.
    assert_eq!(l.commands[2].exit_code, None);
    let text = l.render(None, &Tokenizer::Heuristic);
    assert!(text.contains("\n  cargo test --lib → exit 101\n"), "{text}");
    assert!(text.contains("\n  ls\n"), "{text}");
    assert!(text.contains("\n  false → error\n"), "{text}");
}

#[test]
fn errors_keep_their_first_meaningful_line() {
    for (text, want) in [
        (
            "<tool_use_error>File does not exist.</tool_use_error>",
            "File does not exist.",
        ),
        (
            concat!(
                "Exit code 1\nTraceback (most recent call last):\n  File \"x.py\", line 1\n",
                "    raise ValueError('invalid input')\nValueError: invalid input"
            ),
            "ValueError: invalid input",
        ),
        ("Error:\n\ncould not open file", "could not open file"),
        (
            "Exit code 128\nfatal: not a git repository",
            "fatal: not a git repository",
        ),
        (
            concat!(
                "Exit code 101\n   Compiling ctxd v0.1.0\n",
                "error[E0425]: cannot find value `x` in this scope\n --> src/x.rs:1:1"
            ),
            "error[E0425]: cannot find value `x` in this scope",
        ),
        (
            concat!(
                "Exit code 2\nGetting extensions\nRunning tests\n\n",
                "  1) test mount (AppTest)\n     Assertion with == failed"
            ),
            "Assertion with == failed",
        ),
        ("\n\n  something odd happened  \n", "something odd happened"),
        ("", ""),
    ] {
        assert_eq!(error_line(text), want, "{text:?}");
    }
    assert_eq!(error_line(&"e".repeat(500)).chars().count(), ERROR_CHARS);
    let l = derive(&[
        call("1", "Read", json!({"file_path": "/x"})),
        result(
            "1",
            "Read",
            "<tool_use_error>File does not exist.</tool_use_error>",
            true,
        ),
    ]);
    assert_eq!(
        l.errors,
        [ErrorLine {
            tool: "Read".into(),
            line: "File does not exist.".into(),
        }]
    );
}

#[test]
fn user_requests_are_collapsed_and_bounded() {
    let media = node(NodeContent::Message {
        role: Role::User,
        parts: vec![Part::Media {
            mime_type: "image/png".into(),
            source: MediaSource::Url("https://x.dev/a.png".into()),
        }],
        tool_calls: Vec::new(),
    });
    let system = node(NodeContent::Message {
        role: Role::System,
        parts: vec![Part::Text("you are an agent".into())],
        tool_calls: Vec::new(),
    });
    let assistant = node(NodeContent::Message {
        role: Role::Assistant,
        parts: vec![Part::Text("on it".into())],
        tool_calls: Vec::new(),
    });
    let l = derive(&[
        system,
        user("  fix\n\n the   failing\ttest  "),
        assistant,
        user(&"word ".repeat(100)),
        media,
        user(" \n\t "),
    ]);
    assert_eq!(l.user_requests.len(), 3);
    assert_eq!(l.user_requests[0], "fix the failing test");
    assert_eq!(l.user_requests[1].chars().count(), REQUEST_CHARS);
    assert!(l.user_requests[1].ends_with('…'));
    assert_eq!(l.user_requests[2], "[media]");
}

#[test]
fn functions_pair_calls_with_results() {
    let l = derive(&[
        function_call("f1", "explore", "look at\nthe repo"),
        function_result(
            "f1",
            "\nFound 3 call sites\nin src/",
            FunctionStatus::Completed,
        ),
        function_call("f2", "build", "make it"),
        function_result(
            "f2",
            "Traceback (most recent call last):\nOSError: disk full",
            FunctionStatus::Error,
        ),
        function_call("f3", "pending", "wait"),
        // Claude Code's Task: a tool call, answered by a plain result...
        call(
            "t1",
            "Task",
            json!({"description": "Find callers", "prompt": "Search\nall"}),
        ),
        result("t1", "Task", "Found 2 callers", false),
        // ...or, imported with its transcript, by a function under the same call id.
        call(
            "t2",
            "Task",
            json!({"description": "Review", "prompt": "Review it"}),
        ),
        function_call("t2", "Task", "Review it"),
        function_result("t2", "LGTM", FunctionStatus::Completed),
    ]);
    let f = |name: &str, input: &str, output: &str, is_error: bool| FunctionUse {
        name: name.into(),
        input: input.into(),
        output: output.into(),
        is_error,
    };
    assert_eq!(
        l.functions,
        [
            f("explore", "look at", "Found 3 call sites", false),
            f(
                "build",
                "make it",
                "Traceback (most recent call last):",
                true
            ),
            f("pending", "wait", "", false),
            f("Task", "Find callers", "Found 2 callers", false),
            f("Task", "Review", "LGTM", false),
        ]
    );
    assert_eq!(
        l.errors,
        [ErrorLine {
            tool: "build".into(),
            line: "OSError: disk full".into(),
        }]
    );
    let text = l.render(None, &Tokenizer::Heuristic);
    assert!(
        text.contains("\n  explore: look at → Found 3 call sites\n"),
        "{text}"
    );
    assert!(
        text.contains("\n  build: make it → error: Traceback"),
        "{text}"
    );
    assert!(text.ends_with("\n  Task: Review → LGTM"), "{text}");
}
