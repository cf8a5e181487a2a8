//! Integration tests of ctxd: a real server on 127.0.0.1:0 over a real database, one fresh
//! SQLite file (or, with `CTXD_TEST_DATABASE_URL`, PostgreSQL schema) per test (see
//! `helpers::spawn_app`); one suite for both backends.

mod agents;
mod append_stream;
mod auth;
mod backup;
mod binary;
mod branches;
mod budget;
mod cas;
#[path = "../common/chat_http.rs"]
mod chat_http;
mod concurrency;
mod continuation;
mod crash;
mod daemon;
mod deadlines;
mod evidence;
mod export;
mod fake_cache;
#[path = "../common/fake_provider.rs"]
mod fake_provider;
mod fake_rules;
mod faults;
mod functions;
mod gateway;
mod gateway_claude_code;
mod gateway_clients;
mod gateway_codex;
mod gateway_fidelity;
mod gateway_gemini;
mod gateway_ledger;
mod gateway_replicas;
mod gateway_thinking;
mod golden;
mod held;
mod helpers;
mod idempotency;
mod import;
mod inspector;
mod lifecycle;
mod limits;
mod pairing;
mod pins;
#[path = "../common/provider_rules.rs"]
mod provider_rules;
#[path = "../common/raw_codec.rs"]
mod raw_codec;
mod recall;
mod render;
mod replicas;
mod restart;
mod roundtrip;
mod segments;
mod sessions;
mod shutdown;
mod summaries;
mod summarizer;
mod tenants;
mod traces;
mod validation;
mod watch;
