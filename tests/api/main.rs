//! Integration tests of ctxd: a real server on 127.0.0.1:0 over a real SQLite file,
//! one fresh temp dir per test (see `helpers::spawn_app`).

mod auth;
mod binary;
mod branches;
mod budget;
mod concurrency;
mod functions;
mod golden;
mod helpers;
mod idempotency;
mod import;
mod pairing;
#[path = "../common/provider_rules.rs"]
mod provider_rules;
mod render;
mod restart;
mod roundtrip;
mod sessions;
mod summaries;
mod summarizer;
mod traces;
mod validation;
