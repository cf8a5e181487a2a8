//! Which tool calls read or write which files, and which are commands: one test per tool
//! style, and the paths they name normalised.

use super::*;
use serde_json::json;

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
