//! The compaction workflow over the store: prepare, commit (re-judged while the head moves),
//! cancel, the summaries listing and `Compact` with the server's summarizer (`with_summarizer`),
//! in domain types.
//!
//! `compact` is the pure half (range, input, the commit rule); this module loads and writes
//! through the `Store` around it. The transport (`api`) parses requests into these arguments and
//! converts the outcomes back; nothing here knows prost or tonic.

mod with_summarizer;

use std::collections::HashSet;
use std::sync::Arc;

use super::Error;
use crate::compact::{self, Prepared, SummaryPlan, Verdict};
use crate::domain::{
    self, BranchName, Budget, CompactionEvent, CompactionId, NodeId, PathView, Reason, SessionId,
    Summary, SummaryId, Tenant,
};
use crate::render;
use crate::store::{
    self, Applied, CompactionPlan, PathTarget, PlanState, Scoped, ScopedPlan, Store, now_ms,
};
use crate::summarizer::Summarizer;
use crate::tokens::{TokenCache, Tokenizer, Tokens};

pub use with_summarizer::CompactOutcome;

/// How often a commit re-judges when the branch head moves between verdict and write.
const COMMIT_ATTEMPTS: usize = 3;
/// Commits in a row without a summary, on the same base, before Prepare refuses.
const LOOP_GUARD: usize = 3;

type Result<T, E = Error> = std::result::Result<T, E>;

/// What Prepare and Compact are asked: a branch, a budget and how to summarize it.
pub struct PrepareArgs {
    /// As the request named it; the workflow acts on the session its caller scoped.
    pub session: SessionId,
    pub branch: BranchName,
    pub budget: Budget,
    pub tokenizer: Tokenizer,
    pub retain_turns: usize,
    pub instructions: String,
    pub max_tool_result_chars: usize,
    /// A segment summary's first and last node; `None` for a rolling summary.
    pub segment: Option<(NodeId, NodeId)>,
    /// The host's render policy, when the summary request is to share its cached prefix: the
    /// context as the host renders it, then the instruction. `None`: the range alone.
    pub request_policy: Option<render::Policy>,
}

/// What Prepare answered: nothing to do, or a stored plan and the input to summarize.
pub enum PrepareOutcome {
    NotNeeded {
        tokens_before: u32,
        reason: String,
    },
    Needed {
        plan: Box<CompactionPlan>,
        prepared: Box<SummaryPlan>,
        /// The ledger as the summary will carry it (and a summarizer is shown it).
        evidence: String,
        /// The cache-sharing summary request, when asked for (rolling summaries).
        request: Option<SummaryRequest>,
        /// The stored plan, for the commits and the cancel that may follow.
        scoped: ScopedPlan,
    },
}

/// The cache-sharing summary request, and the tokens of each of its messages as the render
/// counted them.
pub struct SummaryRequest {
    pub messages: Vec<render::Message>,
    pub tokens: Vec<Tokens>,
}

/// How a commit ended: the summary stored, or the reason it was not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitOutcome {
    pub compaction: CompactionId,
    pub reason: Reason,
    pub tokens_before: u32,
    pub tokens_after: u32,
    /// The stored summary; only with [`Reason::Applied`].
    pub summary: Option<SummaryId>,
    pub message: String,
}

impl CommitOutcome {
    pub fn applied(&self) -> bool {
        self.reason == Reason::Applied
    }

    /// The answer to a commit of a plan whose session was deleted while it was open.
    pub fn session_deleted(compaction: CompactionId) -> Self {
        Self {
            compaction,
            reason: Reason::Stale,
            tokens_before: 0,
            tokens_after: 0,
            summary: None,
            message: "the session was deleted while the compaction was open; nothing was written"
                .into(),
        }
    }
}

/// A session's summaries as one branch sees them, and the branch's audit trail.
pub struct SummaryListing {
    pub summaries: Vec<ListedSummary>,
    pub events: Vec<CompactionEvent>,
}

pub struct ListedSummary {
    pub summary: Summary,
    /// Every node it covers is on the branch's path.
    pub applies: bool,
    /// A render of the branch shows it.
    pub active: bool,
}

/// The compaction workflow of one server: its store, the token cache its renders share, and
/// the summarizer `Compact` calls, if one is configured.
#[derive(Clone)]
pub struct Compactions {
    store: Store,
    tokens: Arc<TokenCache>,
    summarizer: Option<Arc<Summarizer>>,
}

impl Compactions {
    pub fn new(store: Store, tokens: Arc<TokenCache>, summarizer: Option<Arc<Summarizer>>) -> Self {
        Self {
            store,
            tokens,
            summarizer,
        }
    }

    /// Lets `tenant` at compaction `id`: its session, scoped; a plan of another tenant's
    /// session answers exactly what an unknown plan does, after the same single lookup.
    pub async fn scope(&self, tenant: &Tenant, id: CompactionId) -> Result<(Scoped, ScopedPlan)> {
        Ok(self.store.scope_compaction(tenant, id).await?)
    }

    /// Measures the branch and, if a summary is needed, stores a plan and returns its input.
    pub async fn prepare(&self, session: Scoped, args: PrepareArgs) -> Result<PrepareOutcome> {
        let path = self
            .store
            .load_path(session, &PathTarget::Branch(args.branch.clone()))
            .await?;
        let Some(head) = path.nodes.last().map(|n| n.id) else {
            return Ok(PrepareOutcome::NotNeeded {
                tokens_before: 0,
                reason: "the branch is empty".to_owned(),
            });
        };
        let failed = self
            .store
            .failed_commits_at(session, &args.branch, head)
            .await?;
        if failed >= LOOP_GUARD {
            return Err(domain::Error::FailedPrecondition(format!(
                "branch: the last {failed} commits on head {head} wrote no summary; append to \
                 the branch before preparing again"
            ))
            .into());
        }
        let cache = Arc::clone(&self.tokens);
        let (budget, retain, chars, tok, segment) = (
            args.budget,
            args.retain_turns,
            args.max_tool_result_chars,
            args.tokenizer,
            args.segment,
        );
        let (request_policy, instructions) = (args.request_policy, args.instructions.clone());
        let (prepared, evidence, request) = tokio::task::spawn_blocking(move || {
            let counter = cache.counter(tok);
            let prepared = match segment {
                Some((from, to)) => {
                    compact::prepare_segment(&path, from, to, budget, chars, &counter)
                }
                None => Ok(compact::prepare(&path, budget, retain, chars, &counter)),
            }?;
            let evidence = match &prepared {
                Prepared::Needed(plan) => plan
                    .ledger
                    .render(render::ledger_cap(budget.history().ok()), &counter),
                Prepared::NotNeeded { .. } => String::new(),
            };
            // The context exactly as the host's Render gives it now, then the instruction.
            let request = match (&prepared, request_policy) {
                (Prepared::Needed(plan), Some(policy)) if segment.is_none() => {
                    let options = render::Options {
                        budget: Some(budget),
                        policy,
                        now_ms: now_ms(),
                        ..render::Options::default()
                    };
                    let context = render::render(&path, &options, &counter);
                    let messages = compact::cache_sharing_request(
                        context.messages,
                        plan,
                        &instructions,
                        &evidence,
                    );
                    let mut tokens = context.tokens;
                    tokens.extend(
                        messages[tokens.len()..]
                            .iter()
                            .map(|m| render::message_tokens(m, &counter)),
                    );
                    Some(SummaryRequest { messages, tokens })
                }
                _ => None,
            };
            Ok::<_, domain::Error>((prepared, evidence, request))
        })
        .await
        .map_err(|_| Error::Task("prepare"))??;
        let prepared = match prepared {
            Prepared::NotNeeded {
                tokens_before,
                reason,
            } => {
                return Ok(PrepareOutcome::NotNeeded {
                    tokens_before,
                    reason,
                });
            }
            Prepared::Needed(plan) => plan,
        };
        let plan = CompactionPlan {
            id: CompactionId::new(),
            session: session.id(),
            branch: args.branch,
            base_head: head,
            kind: prepared.kind,
            rolls_over: prepared.rolls_over.clone(),
            covers: prepared.covers.clone(),
            range: prepared.range,
            ledger: prepared.ledger.clone(),
            budget: args.budget,
            tokenizer: args.tokenizer.name().to_owned(),
            max_tool_result_chars: u32_of(args.max_tool_result_chars),
            retain_turns: u32_of(args.retain_turns),
            instructions: args.instructions,
            tokens_before: prepared.tokens_before,
            state: PlanState::Open,
            created_at_ms: now_ms(),
        };
        let scoped = self.store.save_plan(session, &plan).await?;
        Ok(PrepareOutcome::Needed {
            plan: Box::new(plan),
            prepared,
            evidence,
            request,
            scoped,
        })
    }

    /// Judges `text` against the plan on the branch's current head and stores it if it helps.
    /// With `keep_open`, a rejected plan takes another commit (a host may try a better text).
    pub async fn commit(
        &self,
        session: Scoped,
        scoped: ScopedPlan,
        text: String,
        model: String,
        keep_open: bool,
    ) -> Result<CommitOutcome> {
        let committed = self
            .commit_plan(session, scoped, (text, model), keep_open)
            .await;
        // The session was deleted under the plan (by a caller, or retention): the compaction
        // ends stale, as when its range left the branch.
        if let Err(Error::Store(store::Error::Domain(domain::Error::NotFound { .. }))) = committed
            && self.store.plan_tombstone(scoped.id()).await?.is_some()
        {
            return Ok(CommitOutcome::session_deleted(scoped.id()));
        }
        committed
    }

    /// [`Self::commit`], the summary's text and the model that wrote it.
    async fn commit_plan(
        &self,
        session: Scoped,
        scoped: ScopedPlan,
        (text, model): (String, String),
        keep_open: bool,
    ) -> Result<CommitOutcome> {
        let id = scoped.id();
        let plan = self.store.plan(scoped).await?;
        if plan.session != session.id() {
            return Err(domain::Error::not_found("compaction", id).into());
        }
        if plan.state != PlanState::Open {
            return Err(domain::Error::FailedPrecondition(format!(
                "compaction_id: compaction {id} is {}",
                if plan.state == PlanState::Applied {
                    "already applied"
                } else {
                    "cancelled"
                }
            ))
            .into());
        }
        let tokenizer = Tokenizer::parse(&plan.tokenizer).ok_or(Error::UnknownTokenizer)?;
        let outcome = |reason: Reason,
                       tokens_before: u32,
                       tokens_after: u32,
                       summary: Option<SummaryId>,
                       message: String| CommitOutcome {
            compaction: id,
            reason,
            tokens_before,
            tokens_after,
            summary,
            message,
        };
        // The head may move between the verdict and the write (an append, another commit):
        // the store then refuses the write, and the summary is judged again on the new head.
        for _ in 0..COMMIT_ATTEMPTS {
            let path = branch_path(&self.store, session, &plan.branch).await?;
            let head = path.nodes.last().map(|n| n.id);
            let mut summary = Summary {
                id: SummaryId::new(),
                compaction_id: id,
                kind: plan.kind,
                covers: plan.covers.clone(),
                range: plan.range,
                text: text.clone(),
                rolls_over: plan.rolls_over.clone(),
                ledger: Some(Arc::new(plan.ledger.clone())),
                model: model.clone(),
                base_head: plan.base_head,
                tokens_before: 0,
                tokens_after: 0,
                created_at_ms: now_ms(),
            };
            let cache = Arc::clone(&self.tokens);
            let (budget, chars) = (plan.budget, plan.max_tool_result_chars as usize);
            let judged = summary.clone();
            let verdict = tokio::task::spawn_blocking(move || {
                compact::judge(path, &judged, budget, chars, &cache.counter(tokenizer))
            })
            .await
            .map_err(|_| Error::Task("commit"))?;
            let (r, before, after, message) = match verdict {
                Verdict::Apply { before, after } => {
                    let Some(head) = head else { continue };
                    summary.tokens_before = before;
                    summary.tokens_after = after;
                    match self.store.apply_summary(scoped, &summary, head).await? {
                        Applied::HeadMoved => continue,
                        Applied::Stored => {
                            metrics::counter!("ctxd_summaries_total", "outcome" => "applied")
                                .increment(1);
                            return Ok(outcome(
                                Reason::Applied,
                                before,
                                after,
                                Some(summary.id),
                                format!("{before} → {after} tokens"),
                            ));
                        }
                    }
                }
                Verdict::Empty { before } => (
                    Reason::Empty,
                    before,
                    before,
                    "the summary text is empty".to_owned(),
                ),
                Verdict::NoGain { before, after } => (
                    Reason::NoGain,
                    before,
                    after,
                    format!("the summary would not shrink the context: {before} → {after} tokens"),
                ),
                Verdict::Stale { before } => (
                    Reason::Stale,
                    before,
                    before,
                    "a covered node left the branch, or a summary over its range changed, since \
                     prepare"
                        .to_owned(),
                ),
            };
            self.store
                .reject(scoped, r, (before, after), &message, keep_open)
                .await?;
            metrics::counter!("ctxd_summaries_total", "outcome" => r.as_str()).increment(1);
            return Ok(outcome(r, before, after, None, message));
        }
        Err(domain::Error::Aborted(
            "the branch kept moving while the summary was judged; commit again".to_owned(),
        )
        .into())
    }

    /// Closes an open plan without a summary, `reason` being why.
    pub async fn cancel(&self, id: ScopedPlan, reason: &str) -> Result<()> {
        self.store.cancel(id, reason).await?;
        metrics::counter!("ctxd_summaries_total", "outcome" => "cancelled").increment(1);
        Ok(())
    }

    /// The session's summaries, each marked as applying to `branch` and as shown by its render,
    /// and the branch's compaction events.
    pub async fn summaries(&self, session: Scoped, branch: BranchName) -> Result<SummaryListing> {
        let summaries = self.store.summaries(session).await?;
        let mut path = branch_path(&self.store, session, &branch).await?;
        path.summaries = summaries;
        let on_path = path.node_ids();
        let active: HashSet<SummaryId> = render::active_summaries(&path)
            .iter()
            .map(|s| s.id)
            .collect();
        let events = self.store.events(session, Some(&branch)).await?;
        Ok(SummaryListing {
            summaries: path
                .summaries
                .into_iter()
                .map(|summary| ListedSummary {
                    applies: render::applies(&summary, &on_path),
                    active: active.contains(&summary.id),
                    summary,
                })
                .collect(),
            events,
        })
    }
}

fn u32_of(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Loads a branch's path; a branch that is gone has an empty path.
async fn branch_path(store: &Store, session: Scoped, branch: &BranchName) -> Result<PathView> {
    match store
        .load_path(session, &PathTarget::Branch(branch.clone()))
        .await
    {
        Err(store::Error::Domain(domain::Error::NotFound { what: "branch", .. })) => {
            Ok(PathView::default())
        }
        other => Ok(other?),
    }
}
