//! Tests of ledger derivation and its text form: one per tool style and rule, so long, and
//! kept apart from the code they test.

use super::commands::exit_code;
use super::errors::error_line;
use super::text::LEVELS;
use super::*;
use crate::domain::{Expose, FunctionResult, Hash, MediaSource, NodeId};
use crate::domain::{FunctionStatus, NodeContent, Part, Role, ToolCall};
use crate::tokens::Tokenizer;
use crate::tokens::Tokens;
use proptest::prelude::*;
use serde_json::Value;
use serde_json::json;
use std::collections::BTreeSet;
use std::collections::HashSet;

fn node(content: NodeContent) -> Node {
    Node {
        id: NodeId::new(),
        parent_id: None,
        function_id: None,
        content,
        created_at_ms: 0,
        hash: Hash([0; 32]),
    }
}

fn user(text: &str) -> Node {
    node(NodeContent::Message {
        role: Role::User,
        parts: vec![Part::Text(text.to_owned())],
        tool_calls: Vec::new(),
    })
}

fn call(id: &str, name: &str, args: Value) -> Node {
    call_raw(id, name, &args.to_string())
}

fn call_raw(id: &str, name: &str, arguments_json: &str) -> Node {
    node(NodeContent::Message {
        role: Role::Assistant,
        parts: Vec::new(),
        tool_calls: vec![ToolCall {
            call_id: id.to_owned(),
            name: name.to_owned(),
            arguments_json: arguments_json.to_owned(),
        }],
    })
}

fn result(id: &str, name: &str, text: &str, is_error: bool) -> Node {
    node(NodeContent::ToolResult {
        call_id: id.to_owned(),
        name: name.to_owned(),
        parts: vec![Part::Text(text.to_owned())],
        is_error,
    })
}

fn function_call(id: &str, name: &str, input: &str) -> Node {
    node(NodeContent::FunctionCall {
        call_id: id.to_owned(),
        name: name.to_owned(),
        input: input.to_owned(),
        expose: Expose::Io,
    })
}

fn function_result(id: &str, output: &str, status: FunctionStatus) -> Node {
    node(NodeContent::FunctionResult(FunctionResult {
        call_id: id.to_owned(),
        output: output.to_owned(),
        status,
        chain: None,
    }))
}

fn derive(nodes: &[Node]) -> Ledger {
    Ledger::derive(nodes)
}

fn paths(files: &[FileUse]) -> Vec<&str> {
    files.iter().map(|f| f.path.as_str()).collect()
}

fn commands(ledger: &Ledger) -> Vec<&str> {
    ledger.commands.iter().map(|c| c.command.as_str()).collect()
}

fn use_of<'a>(files: &'a [FileUse], path: &str) -> &'a FileUse {
    files
        .iter()
        .find(|f| f.path == path)
        .unwrap_or_else(|| panic!("{path} not in {files:?}"))
}

fn round_trips(ledger: &Ledger, cap: Option<Tokens>) -> bool {
    let text = ledger.render(cap, &Tokenizer::Heuristic);
    let got: BTreeSet<String> = paths_in(&text).into_iter().collect();
    let want: BTreeSet<String> = ledger.paths().into_iter().map(str::to_owned).collect();
    got == want
}

#[test]
fn claude_code_tools_are_classified() {
    let l = derive(&[
        call(
            "1",
            "Read",
            json!({"file_path": "/r/src/a.rs", "limit": 20}),
        ),
        result("1", "Read", "1\tfn main() {}", false),
        call("2", "Read", json!({"file_path": "/r/src/a.rs"})),
        call(
            "3",
            "Write",
            json!({"file_path": "/r/new.rs", "content": "x"}),
        ),
        result(
            "3",
            "Write",
            "File created successfully at: /r/new.rs",
            false,
        ),
        call(
            "4",
            "Edit",
            json!({"file_path": "/r/src/a.rs", "old_string": "a", "new_string": "b"}),
        ),
        result(
            "4",
            "Edit",
            "The file /r/src/a.rs has been updated. Here's the result of running `cat -n`",
            false,
        ),
        call(
            "5",
            "MultiEdit",
            json!({"file_path": "/r/b.rs", "edits": [{"old_string": "a", "new_string": "b"}]}),
        ),
        call(
            "6",
            "NotebookEdit",
            json!({"notebook_path": "/r/n.ipynb", "new_source": "x"}),
        ),
        call("7", "Glob", json!({"pattern": "**/*.rs", "path": "/r/src"})),
        call(
            "8",
            "Grep",
            json!({"pattern": "fn main", "path": "/r", "glob": "*.rs"}),
        ),
        call("9", "Glob", json!({"pattern": "*.md"})),
        call(
            "10",
            "TodoWrite",
            json!({"todos": [{"content": "x", "status": "pending"}]}),
        ),
        call(
            "11",
            "WebFetch",
            json!({"url": "https://x.dev/a", "prompt": "read it"}),
        ),
        call(
            "12",
            "Bash",
            json!({"command": "cargo test", "description": "run tests"}),
        ),
        call("13", "TaskOutput", json!({"task_id": "b1", "block": true})),
    ]);
    assert_eq!(paths(&l.files_read), ["/r/src/a.rs", "/r/src", "/r"]);
    assert_eq!(use_of(&l.files_read, "/r/src/a.rs").count, 2);
    assert_eq!(
        paths(&l.files_modified),
        ["/r/new.rs", "/r/src/a.rs", "/r/b.rs", "/r/n.ipynb"]
    );
    // The result naming the file it wrote is the same use, not a second one.
    assert_eq!(use_of(&l.files_modified, "/r/new.rs").count, 1);
    assert_eq!(use_of(&l.files_modified, "/r/src/a.rs").tools, ["Edit"]);
    assert_eq!(commands(&l), ["cargo test"]);
    assert!(l.functions.is_empty() && l.errors.is_empty());
}

#[test]
fn editor_tools_classify_by_their_command() {
    let editor = |id: &str, command: &str, path: &str| {
        call(
            id,
            "str_replace_editor",
            json!({"command": command, "path": path, "old_str": "a", "new_str": "b"}),
        )
    };
    let l = derive(&[
        editor("1", "view", "/testbed"),
        editor("2", "view", "/testbed/astropy/io/fits/card.py"),
        editor("3", "create", "/testbed/repro.py"),
        editor("4", "str_replace", "/testbed/astropy/io/fits/card.py"),
        editor("5", "insert", "/testbed/astropy/io/fits/header.py"),
        editor("6", "undo_edit", "/testbed/astropy/io/fits/header.py"),
    ]);
    assert_eq!(
        paths(&l.files_read),
        ["/testbed", "/testbed/astropy/io/fits/card.py"]
    );
    assert_eq!(
        paths(&l.files_modified),
        [
            "/testbed/repro.py",
            "/testbed/astropy/io/fits/card.py",
            "/testbed/astropy/io/fits/header.py"
        ]
    );
    assert_eq!(
        use_of(&l.files_modified, "/testbed/astropy/io/fits/header.py").count,
        2
    );
    // An editor's `command` is not a shell command.
    assert!(l.commands.is_empty());
}

#[test]
fn swe_agent_file_commands_and_function_calls() {
    let l = derive(&[
        // Thought/action format: everything goes through `bash`.
        call("1", "bash", json!({"command": "create reproduce_bug.py\n"})),
        result(
            "1",
            "bash",
            "[File: /repo/reproduce_bug.py (1 lines total)]\n1:",
            false,
        ),
        call(
            "2",
            "bash",
            json!({"command": "edit 1:1\nimport numpy\nend_of_edit\n"}),
        ),
        result(
            "2",
            "bash",
            "[File: /repo/reproduce_bug.py (18 lines total)]\n1:import numpy",
            false,
        ),
        call("3", "bash", json!({"command": "open pkg/handler.py 293\n"})),
        call("4", "bash", json!({"command": "python reproduce_bug.py\n"})),
        call(
            "5",
            "bash",
            json!({"command": "find_file \"handler.py\"\n"}),
        ),
        // Native function calling.
        call("6", "open", json!({"path": "setup.py", "line_number": 3})),
        call("7", "create", json!({"filename": "repro.py"})),
        result(
            "7",
            "create",
            concat!(
                "[File: repro.py (1 lines total)]\n1:\n",
                "(Open file: /testbed/repro.py)\n(Current directory: /testbed)\nbash-$"
            ),
            false,
        ),
        call("8", "insert", json!({"text": "import x\n"})),
        result(
            "8",
            "insert",
            "[File: /testbed/repro.py (10 lines total)]\n1:\n2:import x",
            false,
        ),
        call("9", "edit", json!({"search": "a", "replace": "b"})),
        result(
            "9",
            "edit",
            concat!(
                "Text replaced. Please review the changes.\n",
                "(Open file: /testbed/src/fields.py)\n(Current directory: /testbed)\nbash-$"
            ),
            false,
        ),
        call(
            "10",
            "find_file",
            json!({"file_name": "fields.py", "dir": "src"}),
        ),
    ]);
    // Without a result to place them, relative paths stay as named.
    assert_eq!(paths(&l.files_read), ["pkg/handler.py", "setup.py", "src"]);
    // With one, they take the absolute form the result shows, so a file edited by
    // another call that knows only the absolute path is one entry.
    assert_eq!(
        paths(&l.files_modified),
        [
            "/repo/reproduce_bug.py",
            "/testbed/repro.py",
            "/testbed/src/fields.py"
        ]
    );
    assert_eq!(use_of(&l.files_modified, "/repo/reproduce_bug.py").count, 2);
    // Two calls on one relative path, both placed by their results: one absolute entry.
    let banner = "[File: /r/a.py (3 lines total)]\n1:x";
    let twice = derive(&[
        node(NodeContent::Message {
            role: Role::Assistant,
            parts: Vec::new(),
            tool_calls: ["1", "2"]
                .map(|id| ToolCall {
                    call_id: id.into(),
                    name: "open".into(),
                    arguments_json: json!({"path": "a.py"}).to_string(),
                })
                .to_vec(),
        }),
        result("1", "open", banner, false),
        result("2", "open", banner, false),
    ]);
    assert_eq!(
        twice.files_read,
        [FileUse {
            path: "/r/a.py".into(),
            tools: vec!["open".into()],
            count: 2,
        }]
    );
    assert_eq!(
        use_of(&l.files_modified, "/testbed/repro.py").tools,
        ["create", "insert"]
    );
    // File commands are files, not commands; the rest are commands.
    assert_eq!(
        commands(&l),
        ["python reproduce_bug.py", "find_file \"handler.py\""]
    );
}

#[test]
fn patches_and_generic_tool_names() {
    let patch = concat!(
        "*** Begin Patch\n*** Update File: src/a.rs\n@@\n-x\n+y\n",
        "*** Add File: src/b.rs\n+z\n*** Delete File: old.rs\n*** End Patch"
    );
    let heredoc = "apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: c.rs\n*** End Patch\nEOF";
    let l = derive(&[
        call("1", "apply_patch", json!({ "input": patch })),
        call("2", "shell", json!({"command": ["bash", "-lc", heredoc]})),
        call(
            "3",
            "mcp__filesystem__read_file",
            json!({"path": "docs/x.md"}),
        ),
        call(
            "4",
            "mcp__filesystem__write_file",
            json!({"path": "docs/y.md"}),
        ),
        call("5", "delete_file", json!({"target_file": "tmp.txt"})),
        call(
            "6",
            "rename_file",
            json!({"old_path": "a.txt", "new_path": "b.txt"}),
        ),
        call("7", "view_files", json!({"paths": ["v1.rs", "v2.rs"]})),
        call("8", "run_terminal_cmd", json!({"command": "ls -la\n"})),
        call("9", "local_shell", json!(["ls", "-la"])),
        call("10", "exec_command", json!({"cmd": "make"})),
        call("11", "list_dir", json!({"path": "src", "pattern": "*.rs"})),
    ]);
    assert_eq!(
        paths(&l.files_modified),
        [
            "src/a.rs",
            "src/b.rs",
            "old.rs",
            "c.rs",
            "docs/y.md",
            "tmp.txt",
            "b.txt",
            "a.txt"
        ]
    );
    assert_eq!(paths(&l.files_read), ["docs/x.md", "v1.rs", "v2.rs", "src"]);
    assert_eq!(
        commands(&l),
        ["apply_patch <<'EOF'", "ls -la", "ls -la", "make"]
    );
}

#[test]
fn results_that_name_a_written_file() {
    let l = derive(&[
        call("1", "custom_tool", json!({})),
        result(
            "1",
            "custom_tool",
            "File created successfully at: /x/y.py",
            false,
        ),
        call("2", "other", json!({"q": 1})),
        result("2", "other", "The file ./x//z.py has been edited.", false),
        // A result whose call is before the range still counts, under its own name.
        result("0", "Write", "The file /x/w.py has been updated.", false),
        // A file "mentioned" in a result that does not say it wrote it is no evidence.
        call("3", "Bash", json!({"command": "cat /x/q.py"})),
        result(
            "3",
            "Bash",
            "The file /x/q.py has been around for years",
            false,
        ),
    ]);
    assert_eq!(paths(&l.files_modified), ["/x/y.py", "x/z.py", "/x/w.py"]);
    assert_eq!(use_of(&l.files_modified, "/x/y.py").tools, ["custom_tool"]);
    assert_eq!(use_of(&l.files_modified, "/x/w.py").tools, ["Write"]);
    assert!(l.files_read.is_empty());
}

#[test]
fn paths_are_normalised_and_deduplicated() {
    for (raw, want) in [
        ("src/a.rs", Some("src/a.rs")),
        ("  ./src//a.rs ", Some("src/a.rs")),
        ("src/b/../a.rs", Some("src/a.rs")),
        ("src/a.rs/", Some("src/a.rs")),
        ("/../etc/./passwd", Some("/etc/passwd")),
        ("../x", Some("../x")),
        ("a/../../b", Some("../b")),
        ("./", Some(".")),
        ("/", Some("/")),
        ("~/notes.md", Some("~/notes.md")),
        ("", None),
        ("   ", None),
        ("a\nb", None),
        ("https://x.dev/a", None),
    ] {
        assert_eq!(normalize(raw).as_deref(), want, "{raw:?}");
    }
    let l = derive(&[
        call("1", "Read", json!({"file_path": "./src//a.rs"})),
        call("2", "Read", json!({"file_path": "src/b/../a.rs"})),
        call("3", "view", json!({"path": " src/a.rs/ "})),
        call("4", "Read", json!({"file_path": "src/a.rs"})),
    ]);
    assert_eq!(
        l.files_read,
        [FileUse {
            path: "src/a.rs".into(),
            tools: vec!["Read".into(), "view".into()],
            count: 4,
        }]
    );
}

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

fn mixed_session() -> Vec<Node> {
    vec![
        user("fix the failing test in card.py"),
        call(
            "1",
            "Read",
            json!({"file_path": "/t/astropy/io/fits/card.py"}),
        ),
        result("1", "Read", "...", false),
        call(
            "2",
            "Edit",
            json!({"file_path": "/t/astropy/io/fits/card.py"}),
        ),
        result(
            "2",
            "Edit",
            "The file /t/astropy/io/fits/card.py has been updated.",
            false,
        ),
        call("3", "Bash", json!({"command": "pytest -x"})),
        result("3", "Bash", "Exit code 1\nE   AssertionError: 1 != 2", true),
        function_call("4", "explore", "where is Card used"),
        function_result("4", "in header.py", FunctionStatus::Completed),
        user("now run the whole suite"),
        call("5", "Bash", json!({"command": "pytest"})),
        result("5", "Bash", "ok", false),
        call(
            "6",
            "Grep",
            json!({"pattern": "Card", "path": "/t/astropy"}),
        ),
        call(
            "7",
            "Read",
            json!({"file_path": "/t/astropy/io/fits/card.py"}),
        ),
    ]
}

#[test]
fn derivation_is_deterministic_and_round_trips_as_json() {
    let nodes = mixed_session();
    let l = derive(&nodes);
    assert_eq!(l, derive(&nodes));
    assert_eq!(
        l.render(None, &Tokenizer::Heuristic),
        derive(&nodes).render(None, &Tokenizer::Heuristic)
    );
    let json = serde_json::to_string(&l).unwrap();
    assert_eq!(serde_json::from_str::<Ledger>(&json).unwrap(), l);
    // Empty categories are left out, and an empty object is an empty ledger.
    assert_eq!(serde_json::to_string(&Ledger::default()).unwrap(), "{}");
    assert_eq!(
        serde_json::from_str::<Ledger>("{}").unwrap(),
        Ledger::default()
    );
    assert!(Ledger::default().is_empty());
    assert_eq!(Ledger::default().render(Some(0), &Tokenizer::Heuristic), "");
    assert!(!l.is_empty());
}

#[test]
fn merge_appends_the_newer_evidence() {
    let nodes = mixed_session();
    // A boundary with no call on one side and its result on the other.
    let (a, b) = nodes.split_at(9);
    let mut merged = derive(a);
    merged.merge(derive(b));
    assert_eq!(merged, derive(&nodes));
    let card = use_of(&merged.files_read, "/t/astropy/io/fits/card.py");
    assert_eq!(card.count, 2);
    // A relative path whose call has no result keeps its place.
    let nodes = [
        call("r1", "open", json!({"path": "rel.py"})),
        call("r2", "Read", json!({"file_path": "/abs.py"})),
    ];
    let mut merged = derive(&nodes[..1]);
    merged.merge(derive(&nodes[1..]));
    assert_eq!(merged, derive(&nodes));
    assert_eq!(paths(&merged.files_read), ["rel.py", "/abs.py"]);
    // Tools are unioned in first-use order.
    let mut older = Ledger {
        files_read: vec![FileUse {
            path: "x".into(),
            tools: vec!["Read".into()],
            count: 1,
        }],
        ..Ledger::default()
    };
    older.merge(Ledger {
        files_read: vec![
            FileUse {
                path: "y".into(),
                tools: vec!["Grep".into()],
                count: 1,
            },
            FileUse {
                path: "x".into(),
                tools: vec!["view".into(), "Read".into()],
                count: 3,
            },
        ],
        user_requests: vec!["go".into()],
        ..Ledger::default()
    });
    assert_eq!(
        older.files_read,
        [
            FileUse {
                path: "x".into(),
                tools: vec!["Read".into(), "view".into()],
                count: 4,
            },
            FileUse {
                path: "y".into(),
                tools: vec!["Grep".into()],
                count: 1,
            },
        ]
    );
    assert_eq!(older.user_requests, ["go"]);
}

#[test]
fn odd_arguments_never_panic() {
    let nodes: Vec<Node> = [
        "null",
        "[1, 2]",
        "\"ls\"",
        "42",
        "{\"path\": 3}",
        "{\"command\": {}}",
        "{\"paths\": [1, null, \"ok.rs\"]}",
        "not json",
    ]
    .iter()
    .enumerate()
    .flat_map(|(i, args)| {
        let id = i.to_string();
        [
            call_raw(&id, "Bash", args),
            call_raw(&id, "Read", args),
            call_raw(&id, "", args),
            result(&id, "", "", true),
        ]
    })
    .collect();
    let l = derive(&nodes);
    assert_eq!(paths(&l.files_read), ["ok.rs"]);
    assert_eq!(commands(&l), ["ls"]);
}

#[test]
fn categories_are_capped_with_a_count_of_the_rest() {
    let mut nodes = Vec::new();
    for i in 0..20 {
        nodes.push(call(
            &i.to_string(),
            "Bash",
            json!({"command": format!("cmd {i}")}),
        ));
    }
    for i in 0..9 {
        let id = format!("e{i}");
        nodes.push(call(&id, "Read", json!({"file_path": format!("f{i}")})));
        nodes.push(result(&id, "Read", &format!("error: bad {i}"), true));
    }
    let text = derive(&nodes).render(None, &Tokenizer::Heuristic);
    let mut want = vec![
        "Commands (20, 12 shown):",
        "  cmd 0",
        "  cmd 1",
        "  +8 more",
    ];
    let newest: Vec<String> = (10..20).map(|i| format!("  cmd {i}")).collect();
    want.extend(newest.iter().map(String::as_str));
    want.push("Errors (9, 8 shown):");
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("Commands"))
        .unwrap();
    assert_eq!(lines[at..at + want.len()], want[..], "{text}");
    let errors: Vec<&str> = lines[lines.len() - 9..].to_vec();
    let mut want = vec!["  Read: error: bad 0", "  Read: error: bad 1", "  +1 more"];
    let newest: Vec<String> = (3..9).map(|i| format!("  Read: error: bad {i}")).collect();
    want.extend(newest.iter().map(String::as_str));
    assert_eq!(errors, want, "{text}");
}

/// A ledger with something in every category and more than every cap.
fn big_ledger() -> Ledger {
    let mut nodes = Vec::new();
    for i in 0..15 {
        let id = format!("c{i}");
        nodes.push(call(
            &id,
            "Bash",
            json!({"command": format!("cargo test step_{i}")}),
        ));
        nodes.push(result(&id, "Bash", "Exit code 1\nerror: it failed", true));
        nodes.push(call(
            &format!("e{i}"),
            "Edit",
            json!({"file_path": format!("/work/repo/src/mod_{}/file_{i}.rs", i % 3)}),
        ));
        nodes.push(user(&format!(
            "request {i}: {}",
            "please do it well ".repeat(12)
        )));
        nodes.push(function_call(&format!("f{i}"), "explore", "look"));
    }
    derive(&nodes)
}

#[test]
fn a_small_cap_degrades_in_order_and_keeps_every_path() {
    let l = big_ledger();
    let counter = Tokenizer::Heuristic;
    let texts: Vec<String> = LEVELS.iter().map(|level| l.render_at(level)).collect();
    let tokens: Vec<Tokens> = texts.iter().map(|t| counter.count(t)).collect();
    for pair in tokens.windows(2) {
        assert!(pair[0] >= pair[1], "{tokens:?}");
    }
    // Each cap gets the first level that fits.
    for (i, &t) in tokens.iter().enumerate() {
        let first = tokens.iter().position(|&u| u <= t).unwrap();
        assert_eq!(l.render(Some(t), &counter), texts[first], "level {i}");
    }
    // Categories first: commands, errors and sub-agents go to their counts, while file
    // annotations and full user requests stay.
    let counts_only = &texts[4];
    assert!(
        counts_only.contains("Commands (15, none shown)\n"),
        "{counts_only}"
    );
    assert!(counts_only.contains("Errors (15, none shown)\n"));
    assert!(counts_only.contains("Sub-agents (15, none shown)"));
    assert!(counts_only.contains(" (Edit)"));
    assert!(counts_only.contains(&"please do it well ".repeat(12).trim_end().to_owned()));
    // Then the annotations go.
    assert!(!texts[5].contains("(Edit"));
    assert!(texts[5].contains(&"please do it well ".repeat(12).trim_end().to_owned()));
    // Then user requests shorten, and at last only their count is left.
    assert!(
        texts[8].contains("\"request 0: please do it well please do …\""),
        "{}",
        texts[8]
    );
    assert!(texts[11].contains("User requests (15, none shown)"));
    // Nothing fits zero tokens: the smallest form, every path still there.
    let smallest = l.render(Some(0), &counter);
    assert_eq!(smallest, texts[LEVELS.len() - 1]);
    assert_eq!(
        smallest,
        "[Evidence kept from the summarized range]\n\
         Files modified (15):\n  \
         /work/repo/src/{mod_0/{file_0.rs, file_12.rs, file_3.rs, file_6.rs, file_9.rs}, \
         mod_1/{file_1.rs, file_10.rs, file_13.rs, file_4.rs, file_7.rs}, \
         mod_2/{file_11.rs, file_14.rs, file_2.rs, file_5.rs, file_8.rs}}\n\
         Commands (15, none shown)\n\
         Errors (15, none shown)\n\
         User requests (15, none shown)\n\
         Sub-agents (15, none shown)"
    );
    for cap in [None, Some(0), Some(50), Some(200), Some(10_000)] {
        assert!(round_trips(&l, cap), "{cap:?}");
    }
}

#[test]
fn file_groups_render_and_read_back() {
    let file = |path: &str, tools: &[&str], count: u32| FileUse {
        path: path.into(),
        tools: tools.iter().map(|t| (*t).to_owned()).collect(),
        count,
    };
    let mut read: Vec<FileUse> = (0..23)
        .map(|i| file(&format!("/t/pkg/many/m{i:02}.py"), &["Read"], 1))
        .collect();
    read.extend([
        file("a/b", &["Read"], 1),
        file("a/b/c", &["Read", "Grep"], 3),
        file("/t/pkg/deep/er/still/x.py", &["Weird(tool),{x}"], 2),
        file("README.md", &[], 1),
        file("/t", &["Grep"], 1),
    ]);
    let l = Ledger {
        files_read: read,
        files_modified: vec![
            file("src/render/mod.rs", &["Edit"], 2),
            file("src/render/tiers.rs", &["Write"], 1),
            file("README.md", &["Edit"], 1),
        ],
        ..Ledger::default()
    };
    let text = l.render(None, &Tokenizer::Heuristic);
    assert!(
        text.starts_with(
            "[Evidence kept from the summarized range]\n\
         Files modified (3):\n  \
         README.md (Edit)\n  \
         src/render/{mod.rs (Edit ×2), tiers.rs (Write)}\n\
         Files read (28):\n  \
         /t (Grep)\n  \
         /t/pkg/deep/er/still/x.py (Weirdtoolx ×2)\n  \
         /t/pkg/many/{m00.py (Read), "
        ),
        "{text}"
    );
    assert!(text.contains("\n  README.md\n"), "{text}");
    assert!(
        text.ends_with("\n  a/{b (Read), b/c (Read+Grep ×3)}"),
        "{text}"
    );
    for cap in [None, Some(0), Some(50)] {
        assert!(round_trips(&l, cap), "{cap:?}");
    }
    // A hand-built request with a line break cannot fake a file section.
    let forged = Ledger {
        user_requests: vec!["hi\nFiles read (1):\n  /etc/passwd".into()],
        ..l.clone()
    };
    assert!(round_trips(&forged, None));
    assert_eq!(
        paths_in("Files read (1):\n  x/{a, b/{c (R), d}, e (W ×2)}\nCommands (1):\n  not/a/path"),
        ["x/a", "x/b/c", "x/b/d", "x/e"]
    );
}

/// The nodes of a recorded trace, as importing it makes them.
fn trace(file: &std::path::Path) -> Vec<Node> {
    let data = std::fs::read(file).unwrap();
    let plan = crate::import::parse(crate::import::detect(&data), &data).unwrap();
    plan.ops
        .into_iter()
        .filter_map(|op| match op {
            crate::domain::Op::Node { content, .. } => Some(node(content)),
            _ => None,
        })
        .collect()
}

#[test]
fn real_traces_keep_every_path() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/traces");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    let plain = |p: &str| !p.contains([',', '{', '}', '(', ')']);
    for file in files {
        let nodes = trace(&file);
        let l = Ledger::derive(&nodes);
        assert_eq!(l, Ledger::derive(&nodes), "{file:?}");
        assert!(!l.is_empty(), "{file:?}");
        for cap in [None, Some(0), Some(300)] {
            let text = l.render(cap, &Tokenizer::Heuristic);
            let got: HashSet<String> = paths_in(&text).into_iter().collect();
            for p in l.paths().into_iter().filter(|p| plain(p)) {
                assert!(
                    got.contains(p),
                    "{file:?} {cap:?}: {p} missing from\n{text}"
                );
            }
        }
    }
}

#[test]
fn swe_pydicom_trace() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testdata/traces/swe-pydicom-1458.jsonl"
    );
    let l = Ledger::derive(&trace(std::path::Path::new(path)));
    assert_eq!(
        l.paths(),
        [
            "/pydicom__pydicom/pydicom/pixel_data_handlers/numpy_handler.py",
            "/pydicom__pydicom/reproduce_bug.py",
        ]
    );
    assert_eq!(
        commands(&l),
        [
            "python reproduce_bug.py",
            "find_file \"numpy_handler.py\"",
            "python reproduce_bug.py",
            "rm reproduce_bug.py",
            "submit"
        ]
    );
    // The demonstration preamble and the issue.
    assert_eq!(l.user_requests.len(), 2);
    if std::env::var_os("LEDGER_PRINT").is_some() {
        println!("{}", l.render(None, &Tokenizer::Heuristic));
    }
}

fn path_set() -> impl Strategy<Value = BTreeSet<String>> {
    let segment = "[a-z0-9_.-]{1,6}";
    let path = (any::<bool>(), prop::collection::vec(segment, 1..5))
        .prop_map(|(abs, segs)| format!("{}{}", if abs { "/" } else { "" }, segs.join("/")));
    prop::collection::btree_set(path, 0..40)
}

proptest! {
    #[test]
    fn rendered_paths_read_back_under_any_cap(
        read in path_set(),
        modified in path_set(),
        tools in prop::collection::vec("[A-Za-z(){},× ]{0,8}", 0..3),
        count in 1u32..5,
        commands in 0usize..20,
        cap in prop::option::of(0u32..400),
    ) {
        let uses = |set: &BTreeSet<String>| -> Vec<FileUse> {
            set.iter()
                .map(|p| FileUse { path: p.clone(), tools: tools.clone(), count })
                .collect()
        };
        let l = Ledger {
            files_read: uses(&read),
            files_modified: uses(&modified),
            commands: (0..commands)
                .map(|i| Command {
                    command: format!("run {i}"),
                    exit_code: None,
                    is_error: false,
                })
                .collect(),
            user_requests: vec!["a/b, c/{d}".into()],
            ..Ledger::default()
        };
        let text = l.render(cap, &Tokenizer::Heuristic);
        let got: BTreeSet<String> = paths_in(&text).into_iter().collect();
        let want: BTreeSet<String> = l.paths().into_iter().map(str::to_owned).collect();
        prop_assert_eq!(got, want, "{}", text);
    }

    #[test]
    fn any_tool_call_derives_without_panic(
        name in "[A-Za-z_]{0,12}",
        args in prop_oneof![
            Just(json!(null)),
            "[a-z/ .]{0,12}".prop_map(|s| json!(s)),
            ("[a-z_]{1,10}", "[a-z/ .\n*:]{0,20}").prop_map(|(k, v)| json!({ k: v })),
            ("[a-z_]{1,10}", prop::collection::vec("[a-z/.]{0,8}", 0..3))
                .prop_map(|(k, v)| json!({ k: v })),
        ],
        text in "[a-zA-Z0-9 :/\n<>\\[\\]()-]{0,80}",
        is_error in any::<bool>(),
    ) {
        let nodes = [call("1", &name, args), result("1", &name, &text, is_error)];
        let l = derive(&nodes);
        prop_assert_eq!(&l, &derive(&nodes));
        let odd = l.paths().iter().any(|p| p.contains([',', '{', '}', '(', ')']));
        let ok = odd || round_trips(&l, Some(0));
        prop_assert!(ok);
    }
}
