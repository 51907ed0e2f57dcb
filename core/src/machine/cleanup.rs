//! The detached cleanup of a claim or takeover whose answer was lost (`spec/PROTOCOL.md` §7.4):
//! a token-fenced store operation a host runs in the background after answering, with its
//! retry schedule.
use super::io::{Event, StoreOp, StoreResult};
use crate::policy::Config;

/// First delay between cleanup attempts; doubled after each attempt up to
/// [`Cleanup::max_delay_ms`].
/// [`Cleanup::max_delay_ms`].
pub const CLEANUP_FIRST_DELAY_MS: u64 = 100;
/// Largest delay between cleanup attempts at any lease (at a lease shorter than 4 s the cap is
/// half the lease, see [`Cleanup::max_delay_ms`]).
pub const CLEANUP_MAX_DELAY_MS: u64 = 2_000;

/// Undoing a claim or takeover whose answer was lost (`spec/PROTOCOL.md` §7.4).
///
/// When the flow's claim or takeover ends in [`Event::StoreFailed`], the flow answers 503
/// `store-unavailable` and the handler never runs under its token. The statement may still have
/// been applied (the store received it and ran it later, e.g. a PostgreSQL server that was
/// stopped and resumed): the record would then hold the flow's token in progress until the lease
/// ends, answering 409 and then `outcome-unknown` for a handler that never ran. The cleanup's
/// [`op`](Cleanup::op) undoes that, fenced by the flow's token so it can never touch a record
/// anyone else owns:
///
/// - after a claim, [`StoreOp::Release`] (deletes the record only where it is in progress and
///   holds this token);
/// - after a takeover, [`StoreOp::Renew`] with `lease_ms` 0 (expires the lease at once and keeps
///   the record and its generation, as it was before the takeover, so the next request takes
///   over again with the same downstream key).
///
/// How hosts run it: in the background, after the response has been sent, never blocking the
/// request and never raising into it. Run [`op`](Cleanup::op), then feed its result (or
/// [`Event::StoreFailed`]) to [`next`](Cleanup::next) with the attempt number (0 first) and the
/// milliseconds elapsed since the first attempt started (host monotonic clock): it answers
/// [`CleanupStep::RetryAfter`] (sleep, then run the op again) or [`CleanupStep::Done`]. An
/// attempt that did not apply is retried too: the lost statement may be applied only later (it
/// can reach the store after the first cleanup attempt, e.g. once a frozen server resumes).
/// Attempts stop once the next one would start after [`budget_ms`](Cleanup::budget_ms): the
/// larger of the route's [`Config::cleanup_budget_ms`]
/// (default 30 s) and the lease, so the cleanup outlives a store that stays frozen for longer
/// than a short lease. The delay between attempts is capped at
/// [`max_delay_ms`](Cleanup::max_delay_ms) (at most half the lease), so a lost write that lands
/// while the cleanup still runs is undone before its lease ends and the record never reaches
/// `outcome-unknown` for a handler that never ran. Store errors during cleanup are logged at
/// most, never surfaced.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cleanup {
    op: StoreOp,
    budget_ms: u64,
    max_delay_ms: u64,
}

/// What a host does after a cleanup attempt (see [`Cleanup::next`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum CleanupStep {
    /// Wait this many milliseconds, then run [`Cleanup::op`] again.
    RetryAfter(u64),
    /// Stop: the cleanup applied, or the retry budget is spent.
    Done,
}

impl Cleanup {
    /// The token-fenced store operation to run (a [`StoreOp::Release`] or a
    /// [`StoreOp::Renew`] with `lease_ms` 0).
    #[must_use]
    pub fn op(&self) -> &StoreOp {
        &self.op
    }

    /// How long, in milliseconds from the first attempt, retries continue: the larger of the
    /// route's [`Config::cleanup_budget_ms`] and its
    /// lease.
    #[must_use]
    pub fn budget_ms(&self) -> u64 {
        self.budget_ms
    }

    /// The largest delay between two attempts: [`CLEANUP_MAX_DELAY_MS`], or half the lease when
    /// that is shorter (at least 1 ms).
    #[must_use]
    pub fn max_delay_ms(&self) -> u64 {
        self.max_delay_ms
    }

    /// The cleanup of a lost write of a flow under `config`: `op` with the route's budget and
    /// delay cap.
    pub(super) fn new(op: StoreOp, config: &Config) -> Self {
        let lease_ms = config.lease.lease_ms();
        Self {
            op,
            budget_ms: lease_ms.max(config.cleanup_budget_ms.get()),
            max_delay_ms: CLEANUP_MAX_DELAY_MS.min((lease_ms / 2).max(1)),
        }
    }

    /// The step after attempt number `attempt` (0 for the first) ended with `result`
    /// ([`Event::Store`] with the op's result, or [`Event::StoreFailed`]), `elapsed_ms` after the
    /// first attempt started. Applied means done; anything else is retried with a doubling delay
    /// ([`CLEANUP_FIRST_DELAY_MS`] up to [`max_delay_ms`](Cleanup::max_delay_ms)) while the next
    /// attempt would start within [`budget_ms`](Cleanup::budget_ms).
    pub fn next(&self, attempt: u32, elapsed_ms: u64, result: &Event) -> CleanupStep {
        let applied = matches!(
            result,
            Event::Store(StoreResult::Released(true) | StoreResult::Renewed(true))
        );
        if applied {
            return CleanupStep::Done;
        }
        let delay = CLEANUP_FIRST_DELAY_MS
            .checked_shl(attempt.min(32))
            .unwrap_or(self.max_delay_ms)
            .min(self.max_delay_ms);
        if elapsed_ms.saturating_add(delay) <= self.budget_ms {
            CleanupStep::RetryAfter(delay)
        } else {
            CleanupStep::Done
        }
    }
}
