//! Writing an imported history (`domain::History`) as a new session, in one transaction, through
//! the same checks as an append.

use std::collections::BTreeMap;

use super::append::AppendTarget;
use super::clock::now_ms;
use super::idempotency::CreationKey;
use super::sessions::{keyed_session, start_session};
use super::{Error, Result, Scoped, Store, batch, compaction};
use crate::domain::{self, BranchName, NodeContent, NodeId, Session, SessionId, Tenant};

impl Store {
    /// Creates a session holding an imported plan, in one transaction: a plan the rules refuse
    /// anywhere leaves nothing behind.
    pub async fn import(
        &self,
        tenant: &Tenant,
        metadata: BTreeMap<String, String>,
        plan: &domain::History,
        key: Option<&CreationKey>,
    ) -> Result<Session> {
        let session = SessionId::new();
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        if let Some(existing) = keyed_session(&mut *tx, tenant, key).await? {
            tx.rollback().await?;
            // Keys are per tenant: the session a key names is the caller's.
            return self.get_session(Scoped::trusted(existing)).await;
        }
        if !start_session(&mut *tx, session, tenant, now, &metadata, key).await? {
            tx.rollback().await?;
            return self.keyed_after_race(tenant, key).await;
        }
        let ops = &plan.ops;
        let mut writes = batch::Batch::standalone(now);
        let mut ids: Vec<Option<NodeId>> = vec![None; ops.len()];
        let mut top_level: Vec<NodeId> = Vec::new();
        let mut i = 0;
        while i < ops.len() {
            match &ops[i] {
                domain::Op::Node { scope, .. } => {
                    // One write per run of nodes in the same chain.
                    let run_end = (i..ops.len())
                        .find(|&j| !matches!(&ops[j], domain::Op::Node { scope: s, .. } if s == scope))
                        .unwrap_or(ops.len());
                    let (mut contents, lines): (Vec<NodeContent>, Vec<usize>) = ops[i..run_end]
                        .iter()
                        .filter_map(|op| match op {
                            domain::Op::Node { content, line, .. } => {
                                Some((content.clone(), *line))
                            }
                            domain::Op::Summary { .. } => None,
                        })
                        .unzip();
                    let target = match scope {
                        None => AppendTarget::Branch(BranchName::main()),
                        Some(op) => AppendTarget::Function(ids[*op].ok_or_else(|| {
                            Error::Corrupt("an import plan opens a function after its chain".into())
                        })?),
                    };
                    let written = writes
                        .write(&mut *tx, session, &target, &mut contents, &|k| {
                            format!("line {}", lines[k])
                        })
                        .await?;
                    for (k, (id, _)) in written.iter().enumerate() {
                        ids[i + k] = Some(*id);
                        if scope.is_none() {
                            top_level.push(*id);
                        }
                    }
                    i = run_end;
                }
                domain::Op::Summary { text, line } => {
                    let Some(&base) = top_level.last() else {
                        return Err(domain::Error::invalid(
                            format!("line {line}"),
                            "a compact summary before any message",
                        )
                        .into());
                    };
                    compaction::insert_imported_summary(
                        &mut *tx, session, &top_level, text, base, now,
                    )
                    .await?;
                    i += 1;
                }
            }
        }
        tx.commit().await?;
        self.owners.remember(session, tenant);
        self.get_session(Scoped::trusted(session)).await
    }
}
