//! Ledgers of recorded traces: every path kept, and one trace's ledger checked entry by entry.

use super::*;
use std::collections::HashSet;

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
