//! ctxd: a persistent session store for LLM agents.
//!
//! Module map (dependencies point one way: `api` → `store`, `render` → `domain`):
//! - [`domain`]: ids, nodes, sessions, pairing rules, canonical hashing, errors. Plain data, no I/O.
//! - [`import`]: session files (neutral JSONL, Claude Code, OpenAI messages) parsed into plans.
//! - [`tokens`]: tokenizers (a 4-characters heuristic and real BPE vocabularies).
//! - [`render`]: the pure engine turning a path into provider-neutral messages under a budget.
//! - [`compact`]: the pure half of summaries: range selection, summary input, the commit rule.
//! - [`store`]: SQLite and PostgreSQL, the only place with SQL.
//! - [`provider`]: one codec per provider wire format (Anthropic Messages, chat completions,
//!   Responses) and the one identity canonicalisation.
//! - [`workflow`]: every use case the doors run, over the state they share, in domain types.
//! - [`proto`]: the gRPC contract (generated code, its JSON form).
//! - [`api`]: the gRPC door.
//! - [`gateway`]: the model gateway, a front door for agents that speak a provider's HTTP API.
//! - [`inspector`]: the web inspector, a read-only JSON API and its pages.
//! - [`summarizer`]: the server's own summarizer over an OpenAI-compatible endpoint.
//! - [`metrics`]: Prometheus metrics and their endpoint.
//! - [`hook`]: the tower layer the server's per-call hooks (metering, framing) share.
//! - [`limits`]: admission: request size, concurrency limit and load shedding, draining.
//! - [`server`]: the assembly: builds the workflows once and serves every door on its listener.
//! - [`tls`]: TLS certificates and keys for the server and the command-line client.
//! - [`cli`]: the command line (`ctxd serve` and the gRPC client commands).

pub mod api;
pub mod auth;
pub mod cli;
pub mod compact;
pub mod domain;
pub mod economy;
pub mod export;
pub mod gateway;
pub mod hook;
pub mod import;
pub mod inspector;
pub mod limits;
pub mod metrics;
pub mod proto;
pub mod provider;
pub mod recall;
pub mod render;
pub mod server;
pub mod store;
pub mod summarizer;
pub mod tls;
pub mod tokens;
pub mod workflow;
