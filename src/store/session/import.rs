//! Writing an imported history (`domain::History`) as a new session, in one transaction, through
//! the same checks as an append.
//!
//! Top-level nodes are appended to `main`, which serves as the write cursor: a `Fork` moves it
//! to an earlier node, and the `Branch` ops, if any, set the real branches at the end.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::sessions::Begun;
use super::{Error, Result, Scoped, Store, compaction};
use crate::domain::{
    self, BranchName, CompactionId, NodeContent, NodeId, Session, SessionId, Summary, SummaryId,
    Tenant,
};
use crate::store::append::batch;
use crate::store::append::idempotency::CreationKey;
use crate::store::append::request::AppendTarget;
use crate::store::backend::{BranchAt, NewSession, WriteTx};
use crate::store::form::clock::now_ms;

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
        let new = NewSession {
            id: session,
            tenant,
            now,
            metadata: &metadata,
            key,
        };
        let mut tx = match self.begin_session(&new).await? {
            Begun::New(tx) => tx,
            Begun::Existing(session) => return Ok(session),
        };
        write_plan(&mut *tx, session, plan, now).await?;
        tx.commit().await?;
        self.owners.remember(session, tenant);
        self.get_session(Scoped::trusted(session)).await
    }
}

/// What each op wrote: a node's id, an overlay's summary id.
#[derive(Clone, Copy)]
enum Written {
    Nothing,
    Node(NodeId),
    Summary(SummaryId),
}

async fn write_plan(
    tx: &mut dyn WriteTx,
    session: SessionId,
    plan: &domain::History,
    now: i64,
) -> Result<()> {
    let ops = &plan.ops;
    let main = BranchName::main();
    let mut writes = batch::Batch::standalone(now);
    let mut written: Vec<Written> = vec![Written::Nothing; ops.len()];
    let mut top_level: Vec<NodeId> = Vec::new();
    let mut branches: Vec<(&BranchName, Option<usize>, usize)> = Vec::new();
    let node_of = |written: &[Written], op: usize, field: String| match written.get(op) {
        Some(Written::Node(id)) => Ok(*id),
        _ => Err(Error::from(domain::Error::invalid(
            field,
            "names no node written before it",
        ))),
    };
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
                        domain::Op::Node { content, line, .. } => Some((content.clone(), *line)),
                        _ => None,
                    })
                    .unzip();
                let target = match scope {
                    None => AppendTarget::Branch(main.clone()),
                    Some(op) => match written.get(*op) {
                        Some(Written::Node(id)) => AppendTarget::Function(*id),
                        _ => {
                            return Err(Error::Corrupt(
                                "an import plan opens a function after its chain".into(),
                            ));
                        }
                    },
                };
                let nodes = writes
                    .write(tx, session, &target, &mut contents, &|k| {
                        format!("line {}", lines[k])
                    })
                    .await?;
                for (k, (id, _)) in nodes.iter().enumerate() {
                    written[i + k] = Written::Node(*id);
                    if scope.is_none() {
                        top_level.push(*id);
                    }
                }
                i = run_end;
                continue;
            }
            domain::Op::Summary { text, line } => {
                let Some(&base) = top_level.last() else {
                    return Err(domain::Error::invalid(
                        format!("line {line}"),
                        "a compact summary before any message",
                    )
                    .into());
                };
                compaction::insert_imported_summary(tx, session, &top_level, text, base, now)
                    .await?;
            }
            domain::Op::Fork { from, line } => {
                let head = match from {
                    Some(op) => Some(node_of(&written, *op, format!("line {line}.parent"))?),
                    None => None,
                };
                let branch = BranchAt {
                    session,
                    name: &main,
                    head,
                    now,
                };
                tx.set_branch_head(&branch).await?;
                // The batch's view of `main` is the head it left; read it afresh.
                writes
                    .seen
                    .remove(&(session, AppendTarget::Branch(main.clone())));
            }
            domain::Op::Overlay { overlay, line } => {
                let at = |field: &str| format!("line {line}.{field}");
                let covers = overlay
                    .covers
                    .iter()
                    .map(|&op| node_of(&written, op, at("covers")))
                    .collect::<Result<Vec<_>>>()?;
                let range = match overlay.range {
                    Some((from, to)) => Some((
                        node_of(&written, from, at("range"))?,
                        node_of(&written, to, at("range"))?,
                    )),
                    None => None,
                };
                let rolls_over = overlay
                    .rolls_over
                    .iter()
                    .map(|&op| match written.get(op) {
                        Some(Written::Summary(id)) => Ok(*id),
                        _ => Err(Error::from(domain::Error::invalid(
                            at("rolls_over"),
                            "names no summary before it",
                        ))),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let summary = Summary {
                    id: SummaryId::new(),
                    compaction_id: CompactionId::new(),
                    kind: overlay.kind,
                    covers,
                    range,
                    text: overlay.text.clone(),
                    rolls_over,
                    ledger: overlay.ledger.clone().map(Arc::new),
                    model: overlay.model.clone(),
                    base_head: node_of(&written, overlay.base_head, at("base_head"))?,
                    tokens_before: overlay.tokens_before,
                    tokens_after: overlay.tokens_after,
                    created_at_ms: overlay.created_at_ms,
                };
                compaction::insert_applied_summary(tx, session, &summary, now).await?;
                written[i] = Written::Summary(summary.id);
            }
            domain::Op::Pin { node, line } => {
                let id = node_of(&written, *node, format!("line {line}.node"))?;
                tx.insert_pin(session, (id, true), now).await?;
            }
            domain::Op::Branch { name, head, line } => branches.push((name, *head, *line)),
        }
        i += 1;
    }
    if branches.is_empty() {
        return Ok(());
    }
    // The plan names every branch: `main` was only the cursor unless it is among them.
    if !branches.iter().any(|(name, _, _)| **name == main) {
        tx.delete_branch(session, &main).await?;
    }
    for (name, head, line) in branches {
        let head = match head {
            Some(op) => Some(node_of(&written, op, format!("line {line}.head"))?),
            None => None,
        };
        let branch = BranchAt {
            session,
            name,
            head,
            now,
        };
        if *name == main {
            tx.set_branch_head(&branch).await?;
        } else if !tx.insert_branch(&branch).await? {
            return Err(domain::Error::invalid(
                format!("line {line}.name"),
                format!("branch {name:?} appears twice"),
            )
            .into());
        }
    }
    Ok(())
}
