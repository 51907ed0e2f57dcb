//! The sans-IO server flow (quinn-proto style): events in, plain-data actions out.
//!
//! One [`ServerFlow`] handles one request that carries a valid key. The host:
//!
//! 1. computes the [`ScopeId`] and the request fingerprint, draws 16 bytes of entropy, and calls
//!    [`ServerFlow::start`], which returns the first [`Action`];
//! 2. executes each action and feeds the result back with [`ServerFlow::handle`]:
//!    - [`Action::Store`]: run the [`StoreOp`] atomically, feed [`Event::Store`] with the matching
//!      [`StoreResult`], or [`Event::StoreFailed`] on any store error;
//!    - [`Action::RunHandler`]: run the handler; while it runs, feed [`Event::HeartbeatDue`] every
//!      [`RunHandler::heartbeat_ms`] (and execute the renew it returns); when it ends feed
//!      [`Event::HandlerFinished`] or [`Event::HandlerFailed`];
//!    - [`Action::Wait`]: nothing to do, keep waiting for the handler;
//!    - [`Action::LeaseLost`]: another request took the key over; the host MAY cancel the handler
//!      and keeps waiting for its end as usual;
//!    - [`Action::Respond`]: send the response; the flow is finished;
//!    - [`Action::PropagateError`]: re-raise the handler's error (or render the framework's error
//!      page); the flow is finished.
//! 3. once the flow is finished, asks [`ServerFlow::cleanup`]: when it returns a [`Cleanup`], the
//!    claim (or takeover) the flow sent may have been applied although its answer was lost; the
//!    host runs the cleanup in the background after sending the response (see [`Cleanup`]).
//!
//! Events are fed one at a time: after a store action the next event is its result.
//!
//! **Transactional mode** ([`Config::transactional`]): the host runs every store operation of the
//! flow and the handler's writes in one database transaction. [`StoreOp::Release`] is then the
//! `ROLLBACK`, and [`StoreOp::Commit`] the `COMMIT`; the flow asks for no heartbeat, releases on
//! any handler error, and sends the handler's response only after [`StoreResult::Committed`] (or,
//! for a status that is not stored, after the rollback). A completion or `COMMIT` that fails or
//! does not apply is answered 503 `store-unavailable` ([`Outcome::NotCommitted`]). The host rolls
//! back whatever a store failure left open when it closes the transaction.
//!
//! **One token per flow.** The entropy given to `start` is the fencing token for the claim and,
//! if needed, for a takeover. It is written to the store at most once: once a claim or takeover
//! succeeds the flow owns the record and never claims again. An attempt answered
//! [`Event::StoreFailed`] may still have been applied (a statement sent to a hung server runs when
//! the server resumes): the record then holds this flow's token with no handler behind it, which
//! is what [`ServerFlow::cleanup`] undoes. So a flow needs exactly 16 fresh random bytes.
use std::sync::Arc;

use thiserror::Error;

use super::capture::not_retained_response;
use super::cleanup::Cleanup;
use super::io::{
    Action, Event, HandlerResponse, HttpResponse, Outcome, RunHandler, StoreOp, StoreResult,
    downstream_key, replay_owned,
};
use super::problem::{ProblemKind, problem_response};
use super::{Decision, decide};
use crate::policy::{Config, StoreVerdict, TakeoverPolicy};
use crate::record::{FencingToken, FingerprintText, Record, RecordState, StoredResponse};
use crate::scope::ScopeId;

/// The `detail` of the 503 answered when a transactional handler's writes did not commit.
const NOT_COMMITTED_DETAIL: &str = "The request's transaction did not commit, so nothing it did \
    was recorded. Retry with the same key: it replays the response if the commit did happen.";

/// A host fed an event the flow cannot accept in its current phase (a binding bug).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FlowError {
    /// The event does not fit the phase; the flow is unchanged.
    #[error("event {event} is not valid while the flow is {phase}")]
    UnexpectedEvent {
        /// The flow's phase.
        phase: &'static str,
        /// The event fed.
        event: &'static str,
    },
    /// The flow already answered.
    #[error("the flow is finished")]
    Finished,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Finish {
    Respond(HttpResponse, Outcome),
    Propagate,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    Claiming,
    Reading,
    TakingOver,
    MarkingUnknown,
    Running {
        renewing: bool,
        lease_lost: bool,
    },
    /// Completing; the outcome once it applied (`Stored`, or `NotRetained` for the problem).
    Completing(HttpResponse, Outcome),
    Releasing(Finish),
    Expiring(Finish),
    Abandoning(Finish),
    /// Transactional mode: committing; `ok` once committed, `failed` on a store failure.
    Committing {
        ok: Finish,
        failed: Finish,
    },
    Finished,
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Self::Claiming => "claiming",
            Self::Reading => "reading",
            Self::TakingOver => "taking_over",
            Self::MarkingUnknown => "marking_unknown",
            Self::Running { renewing: true, .. } => "running_renewing",
            Self::Running { .. } => "running",
            Self::Completing(..) => "completing",
            Self::Releasing(_) => "releasing",
            Self::Expiring(_) => "expiring",
            Self::Abandoning(_) => "abandoning",
            Self::Committing { .. } => "committing",
            Self::Finished => "finished",
        }
    }
}

fn event_name(e: &Event) -> &'static str {
    match e {
        Event::Store(StoreResult::Claimed { .. }) => "claimed",
        Event::Store(StoreResult::Existing { .. }) => "existing",
        Event::Store(StoreResult::Got { .. }) => "got",
        Event::Store(StoreResult::TookOver(_)) => "took_over",
        Event::Store(StoreResult::MarkedUnknown(_)) => "marked_unknown",
        Event::Store(StoreResult::Completed(_)) => "completed",
        Event::Store(StoreResult::Released(_)) => "released",
        Event::Store(StoreResult::Renewed(_)) => "renewed",
        Event::Store(StoreResult::Committed) => "committed",
        Event::Store(StoreResult::Locked { .. }) => "locked",
        Event::StoreFailed => "store_failed",
        Event::HandlerFinished(_) => "handler_finished",
        Event::HandlerFailed { .. } => "handler_failed",
        Event::HeartbeatDue => "heartbeat_due",
    }
}

/// What a stage of [`ServerFlow::handle`] returns: the next action, or `None` when the event
/// does not fit the phase (the stage has put the phase back; see [`ServerFlow::reject`]).
type Step = Option<Action>;

/// The server flow for one request with a valid key (see the module docs).
#[derive(Clone, Debug)]
pub struct ServerFlow {
    scope: ScopeId,
    fingerprint: FingerprintText,
    config: Arc<Config>,
    token: FencingToken,
    generation: Option<u32>,
    reads: u8,
    phase: Phase,
    cleanup: Option<Cleanup>,
}

impl ServerFlow {
    /// Starts the flow: the first action is always [`StoreOp::Claim`].
    ///
    /// `entropy` must be 16 fresh random bytes from the host (the fencing token).
    pub fn start(
        scope: ScopeId,
        fingerprint: FingerprintText,
        config: Arc<Config>,
        entropy: [u8; 16],
    ) -> (Self, Action) {
        let mut flow = Self {
            scope,
            fingerprint,
            config,
            token: FencingToken(entropy),
            generation: None,
            reads: 0,
            phase: Phase::Claiming,
            cleanup: None,
        };
        let first = flow.claim();
        (flow, first)
    }

    /// This flow's fencing token.
    #[must_use]
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The generation this flow owns, once it has claimed or taken over the record.
    #[must_use]
    pub fn generation(&self) -> Option<u32> {
        self.generation
    }

    /// True once the flow has answered.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Finished
    }

    /// The background cleanup the host runs after answering, if any (see [`Cleanup`]).
    ///
    /// `Some` only once the flow has finished with [`Outcome::StoreUnavailable`] because its claim
    /// or takeover ended in [`Event::StoreFailed`], and never in transactional mode (closing the
    /// failed transaction rolls the claim back). `None` otherwise: every other path either
    /// wrote nothing with this flow's token or settled the record itself.
    #[must_use]
    pub fn cleanup(&self) -> Option<&Cleanup> {
        self.cleanup.as_ref()
    }

    /// Feeds one event and returns the next action. A rejected event leaves the flow unchanged.
    ///
    /// The phase picks the stage (admission, the running handler, then settling in the route's
    /// mode: autocommit or transactional, both ending in the steps they share); within each
    /// stage the arms are disjoint, so their order carries no meaning.
    pub fn handle(&mut self, event: Event) -> Result<Action, FlowError> {
        let rejected = FlowError::UnexpectedEvent {
            phase: self.phase.name(),
            event: event_name(&event),
        };
        let phase = std::mem::replace(&mut self.phase, Phase::Finished);
        let step = match phase {
            Phase::Finished => return Err(FlowError::Finished),
            Phase::Claiming | Phase::Reading | Phase::TakingOver | Phase::MarkingUnknown => {
                self.on_admission(phase, event)
            }
            Phase::Running { .. } => self.on_running(phase, event),
            Phase::Completing(..)
            | Phase::Releasing(_)
            | Phase::Expiring(_)
            | Phase::Abandoning(_)
            | Phase::Committing { .. } => {
                if self.config.transactional {
                    self.on_settling_transactional(phase, event)
                } else {
                    self.on_settling_autocommit(phase, event)
                }
            }
        };
        step.ok_or(rejected)
    }

    /// A stage's answer to an event that does not fit `phase`: the flow keeps `phase`.
    fn reject(&mut self, phase: Phase) -> Step {
        self.phase = phase;
        None
    }

    /// Admission: claim, read, takeover, mark-unknown.
    fn on_admission(&mut self, phase: Phase, event: Event) -> Step {
        match (phase, event) {
            (Phase::Claiming, Event::Store(StoreResult::Claimed { generation, .. }))
            | (Phase::TakingOver, Event::Store(StoreResult::TookOver(Some(generation)))) => {
                Some(self.run(generation))
            }
            (Phase::Claiming, Event::Store(StoreResult::Existing { record, now_ms }))
            | (
                Phase::Reading,
                Event::Store(StoreResult::Got {
                    record: Some(record),
                    now_ms,
                }),
            ) => Some(self.on_record(record, now_ms)),
            (Phase::Reading, Event::Store(StoreResult::Got { record: None, .. })) => {
                Some(self.claim())
            }
            (Phase::Claiming | Phase::Reading, Event::Store(StoreResult::Locked { .. })) => {
                // Another request's uncommitted claim holds the row: it is in flight. Nothing
                // was written, so there is nothing to clean up.
                Some(self.problem(
                    ProblemKind::InFlight,
                    Some(self.config.in_flight_retry_after_ms.get()),
                    Outcome::InFlight,
                ))
            }
            (Phase::TakingOver, Event::Store(StoreResult::TookOver(None)))
            | (Phase::MarkingUnknown, Event::Store(StoreResult::MarkedUnknown(false))) => {
                Some(self.get())
            }
            (Phase::MarkingUnknown, Event::Store(StoreResult::MarkedUnknown(true))) => {
                let fin = Self::problem_finish(
                    ProblemKind::OutcomeUnknown,
                    None,
                    Outcome::OutcomeUnknown,
                );
                Some(if self.config.transactional {
                    // The mark was written in the transaction: keep it. The answer is the same
                    // whether or not the commit succeeds (a later request marks again).
                    self.commit(fin.clone(), fin)
                } else {
                    self.finish(fin)
                })
            }
            (phase, Event::StoreFailed) => {
                self.cleanup = self.lost_write_cleanup(&phase);
                Some(self.problem(
                    ProblemKind::StoreUnavailable,
                    Some(self.config.unavailable_retry_after_ms.get()),
                    Outcome::StoreUnavailable,
                ))
            }
            (phase, _) => self.reject(phase),
        }
    }

    /// The handler runs: heartbeats (never in transactional mode) and the handler's end.
    fn on_running(&mut self, phase: Phase, event: Event) -> Step {
        let Phase::Running {
            renewing,
            lease_lost,
        } = phase
        else {
            return self.reject(phase);
        };
        match (renewing, event) {
            (false, Event::HeartbeatDue) if !self.config.transactional => {
                if lease_lost {
                    self.phase = Phase::Running {
                        renewing: false,
                        lease_lost,
                    };
                    Some(Action::Wait)
                } else {
                    self.phase = Phase::Running {
                        renewing: true,
                        lease_lost,
                    };
                    Some(Action::Store(StoreOp::Renew {
                        scope: self.scope,
                        token: self.token,
                        lease_ms: self.config.lease.lease_ms(),
                    }))
                }
            }
            (true, Event::Store(StoreResult::Renewed(ok))) => {
                self.phase = Phase::Running {
                    renewing: false,
                    lease_lost: !ok,
                };
                Some(if ok { Action::Wait } else { Action::LeaseLost })
            }
            (true, Event::StoreFailed) => {
                self.phase = Phase::Running {
                    renewing: false,
                    lease_lost,
                };
                Some(Action::Wait)
            }
            (false, Event::HandlerFinished(response)) => {
                Some(self.on_finished(response, lease_lost))
            }
            (false, Event::HandlerFailed { maybe_side_effect }) => Some(if lease_lost {
                self.finish(Finish::Propagate)
            } else if self.config.transactional {
                // Its writes roll back with the claim: whatever it did, nothing happened.
                self.release(Finish::Propagate)
            } else if maybe_side_effect {
                self.abandon(Finish::Propagate)
            } else {
                self.release(Finish::Propagate)
            }),
            (renewing, _) => self.reject(Phase::Running {
                renewing,
                lease_lost,
            }),
        }
    }

    /// After the handler, outside a transaction: the completion's answer and a failed release.
    fn on_settling_autocommit(&mut self, phase: Phase, event: Event) -> Step {
        match (phase, event) {
            (Phase::Completing(response, outcome), Event::Store(StoreResult::Completed(ok))) => {
                let outcome = if ok { outcome } else { Outcome::LeaseLost };
                Some(self.finish(Finish::Respond(response, outcome)))
            }
            (Phase::Completing(response, _), Event::StoreFailed) => {
                Some(self.finish(Finish::Respond(response, Outcome::CompletionFailed)))
            }
            (Phase::Releasing(fin), Event::StoreFailed) => Some(self.finish(fin)),
            (phase, event) => self.on_settling_shared(phase, event),
        }
    }

    /// After the handler, transactional mode: nothing is answered before the `COMMIT` (or the
    /// rollback) says what happened (`spec/PROTOCOL.md` §7.6).
    fn on_settling_transactional(&mut self, phase: Phase, event: Event) -> Step {
        match (phase, event) {
            (Phase::Completing(response, outcome), Event::Store(StoreResult::Completed(true))) => {
                let failed = self.not_committed();
                Some(self.commit(Finish::Respond(response, outcome), failed))
            }
            (Phase::Completing(..), Event::Store(StoreResult::Completed(false))) => {
                // The record is not ours: roll back, never commit the handler's writes.
                let fin = self.not_committed();
                Some(self.release(fin))
            }
            (Phase::Completing(..), Event::StoreFailed) => {
                let fin = self.not_committed();
                Some(self.finish(fin))
            }
            (Phase::Releasing(_), Event::StoreFailed) => {
                // The rollback after the handler failed (e.g. the server went away during the
                // handler's own SQL): nothing committed, so the answer is the store's 503 with
                // Retry-After, never the handler's error or its uncommitted response (§7.6).
                let fin = self.not_committed();
                Some(self.finish(fin))
            }
            (Phase::Committing { ok, .. }, Event::Store(StoreResult::Committed)) => {
                Some(self.finish(ok))
            }
            (Phase::Committing { failed, .. }, Event::StoreFailed) => Some(self.finish(failed)),
            (phase, event) => self.on_settling_shared(phase, event),
        }
    }

    /// After the handler, the same in both modes: a release, an expiry or an abandon answered.
    fn on_settling_shared(&mut self, phase: Phase, event: Event) -> Step {
        match (phase, event) {
            (Phase::Releasing(fin), Event::Store(StoreResult::Released(_)))
            | (
                Phase::Expiring(fin),
                Event::Store(StoreResult::Renewed(false)) | Event::StoreFailed,
            )
            | (
                Phase::Abandoning(fin),
                Event::Store(StoreResult::MarkedUnknown(_)) | Event::StoreFailed,
            ) => Some(self.finish(fin)),
            (Phase::Expiring(fin), Event::Store(StoreResult::Renewed(true))) => {
                match self.config.takeover {
                    TakeoverPolicy::OutcomeUnknown => {
                        self.phase = Phase::Abandoning(fin);
                        Some(self.mark_own_unknown())
                    }
                    TakeoverPolicy::ReRun => Some(self.finish(fin)),
                }
            }
            (phase, _) => self.reject(phase),
        }
    }

    fn claim(&mut self) -> Action {
        if self.reads >= self.config.max_store_rounds.get() {
            return self.contention();
        }
        self.reads += 1;
        self.phase = Phase::Claiming;
        Action::Store(StoreOp::Claim {
            scope: self.scope,
            fingerprint: self.fingerprint.clone(),
            token: self.token,
            lease_ms: self.config.lease.lease_ms(),
            ttl_ms: self.config.ttl_ms.get(),
        })
    }

    /// The cleanup for a store failure in `phase`: only a claim or a takeover writes this
    /// flow's token, and only outside a transaction can it outlive the flow.
    fn lost_write_cleanup(&self, phase: &Phase) -> Option<Cleanup> {
        if self.config.transactional {
            return None;
        }
        let op = match phase {
            Phase::Claiming => StoreOp::Release {
                scope: self.scope,
                token: self.token,
            },
            Phase::TakingOver => StoreOp::Renew {
                scope: self.scope,
                token: self.token,
                lease_ms: 0,
            },
            _ => return None,
        };
        Some(Cleanup::new(op, &self.config))
    }

    fn get(&mut self) -> Action {
        if self.reads >= self.config.max_store_rounds.get() {
            return self.contention();
        }
        self.reads += 1;
        self.phase = Phase::Reading;
        Action::Store(StoreOp::Get { scope: self.scope })
    }

    fn contention(&mut self) -> Action {
        self.problem(
            ProblemKind::Contention,
            Some(self.config.unavailable_retry_after_ms.get()),
            Outcome::Contention,
        )
    }

    fn problem(
        &mut self,
        kind: ProblemKind,
        retry_after_ms: Option<u64>,
        outcome: Outcome,
    ) -> Action {
        self.finish(Self::problem_finish(kind, retry_after_ms, outcome))
    }

    fn problem_finish(kind: ProblemKind, retry_after_ms: Option<u64>, outcome: Outcome) -> Finish {
        Finish::Respond(problem_response(kind, None, None, retry_after_ms), outcome)
    }

    /// Transactional mode: the 503 answered when the handler's transaction did not commit.
    fn not_committed(&self) -> Finish {
        Finish::Respond(
            problem_response(
                ProblemKind::StoreUnavailable,
                Some(NOT_COMMITTED_DETAIL),
                None,
                Some(self.config.unavailable_retry_after_ms.get()),
            ),
            Outcome::NotCommitted,
        )
    }

    /// Transactional mode: `COMMIT`, then `ok`, or `failed` on a store failure.
    fn commit(&mut self, ok: Finish, failed: Finish) -> Action {
        self.phase = Phase::Committing { ok, failed };
        Action::Store(StoreOp::Commit { scope: self.scope })
    }

    /// Marks the own (expired) record outcome-unknown.
    fn mark_own_unknown(&self) -> Action {
        Action::Store(StoreOp::MarkUnknown {
            scope: self.scope,
            seen_token: self.token,
            ttl_ms: self.config.ttl_ms.get(),
        })
    }

    fn finish(&mut self, fin: Finish) -> Action {
        self.phase = Phase::Finished;
        match fin {
            Finish::Respond(response, outcome) => Action::Respond { response, outcome },
            Finish::Propagate => Action::PropagateError {
                outcome: Outcome::HandlerFailed,
            },
        }
    }

    fn run(&mut self, generation: u32) -> Action {
        self.generation = Some(generation);
        self.phase = Phase::Running {
            renewing: false,
            lease_lost: false,
        };
        Action::RunHandler(RunHandler {
            token: self.token,
            generation,
            downstream_key: downstream_key(&self.scope, &self.fingerprint, generation),
            // An uncommitted claim is invisible to other requests: no lease to keep alive.
            heartbeat_ms: if self.config.transactional {
                None
            } else {
                self.config.lease.heartbeat_ms()
            },
        })
    }

    fn on_record(&mut self, record: Record, now_ms: u64) -> Action {
        match decide(&record, &self.fingerprint, now_ms, &self.config) {
            Decision::Absent => self.claim(),
            Decision::Replay(_) => match record.state {
                RecordState::Completed { response } => {
                    self.finish(Finish::Respond(replay_owned(response), Outcome::Replayed))
                }
                // decide only answers Replay for a completed record
                _ => self.problem(ProblemKind::OutcomeUnknown, None, Outcome::OutcomeUnknown),
            },
            Decision::InFlight { retry_after_ms } => self.problem(
                ProblemKind::InFlight,
                Some(retry_after_ms),
                Outcome::InFlight,
            ),
            Decision::Mismatch => self.problem(ProblemKind::Mismatch, None, Outcome::Mismatch),
            Decision::OutcomeUnknown => {
                self.problem(ProblemKind::OutcomeUnknown, None, Outcome::OutcomeUnknown)
            }
            Decision::TakeOver { seen_token } => {
                self.phase = Phase::TakingOver;
                Action::Store(StoreOp::TakeOver {
                    scope: self.scope,
                    seen_token,
                    new_token: self.token,
                    lease_ms: self.config.lease.lease_ms(),
                })
            }
            Decision::MarkUnknown { seen_token } => {
                self.phase = Phase::MarkingUnknown;
                Action::Store(StoreOp::MarkUnknown {
                    scope: self.scope,
                    seen_token,
                    ttl_ms: self.config.ttl_ms.get(),
                })
            }
        }
    }

    fn on_finished(&mut self, response: HandlerResponse, lease_lost: bool) -> Action {
        if lease_lost {
            return self.finish(Finish::Respond(response.into_http(), Outcome::LeaseLost));
        }
        let policy = &self.config.response;
        let stored_len = response
            .body_to_store
            .as_ref()
            .map_or(response.body.len(), Vec::len);
        let verdict = if response.body_truncated && policy.stores(response.status, response.origin)
        {
            StoreVerdict::TooLarge
        } else {
            policy.verdict_from(response.status, response.origin, stored_len)
        };
        let encoded = match verdict {
            StoreVerdict::Release => {
                return self.release(Finish::Respond(response.into_http(), Outcome::NotStored));
            }
            StoreVerdict::TooLarge => None,
            StoreVerdict::Store => StoredResponse {
                status: response.status,
                headers: response
                    .headers
                    .iter()
                    .filter(|(n, _)| policy.stores_header(n))
                    .map(|(n, v)| (n.to_ascii_lowercase(), v.clone()))
                    .collect(),
                body: response
                    .body_to_store
                    .clone()
                    .unwrap_or_else(|| response.body.clone()),
            }
            .encode()
            .ok(),
        };
        let (bytes, outcome) = match encoded {
            Some(bytes) => (bytes, Outcome::Stored),
            // Too large or not encodable: the request ran and its client gets the response;
            // retries replay the response-not-retained problem (§7.5).
            None => match not_retained_response().encode() {
                Ok(bytes) => (bytes, Outcome::NotRetained),
                // The problem record always encodes; if it ever did not, fall back to the
                // takeover policy rather than leave the key in flight.
                Err(_) if self.config.transactional => {
                    let fin = self.not_committed();
                    return self.release(fin);
                }
                Err(_) => {
                    return self
                        .abandon(Finish::Respond(response.into_http(), Outcome::NotRetained));
                }
            },
        };
        self.phase = Phase::Completing(response.into_http(), outcome);
        Action::Store(StoreOp::Complete {
            scope: self.scope,
            token: self.token,
            response: bytes,
            ttl_ms: self.config.ttl_ms.get(),
        })
    }

    fn release(&mut self, fin: Finish) -> Action {
        self.phase = Phase::Releasing(fin);
        Action::Store(StoreOp::Release {
            scope: self.scope,
            token: self.token,
        })
    }

    /// Hands an execution whose outcome cannot be recorded to the takeover policy: expire the own
    /// lease at once (renew with 0 ms), then, under the outcome-unknown policy, mark the record.
    fn abandon(&mut self, fin: Finish) -> Action {
        self.phase = Phase::Expiring(fin);
        Action::Store(StoreOp::Renew {
            scope: self.scope,
            token: self.token,
            lease_ms: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    //! Exhaustive exploration of the flow's event tree (every store answer, failure and handler
    //! end, for both takeover policies) checking the transactional-mode guarantees of
    //! `spec/PROTOCOL.md` §7.6 at every leaf.
    use super::*;
    use crate::machine::{CLEANUP_MAX_DELAY_MS, CleanupStep};
    use crate::policy::{HeaderAllowlist, Redaction, ResponseOrigin, ResponsePolicy};

    const MINE: FencingToken = FencingToken([7; 16]);
    const OTHER: FencingToken = FencingToken([9; 16]);
    const NOW: u64 = 1_000_000;

    fn fp(c: char) -> FingerprintText {
        FingerprintText::new(format!("v1:{}", c.to_string().repeat(64))).expect("valid")
    }

    fn config(transactional: bool, takeover: TakeoverPolicy) -> Arc<Config> {
        let response = ResponsePolicy::new(
            &[429],
            false,
            8,
            HeaderAllowlist::default(),
            Redaction::None,
        )
        .expect("valid policy");
        Arc::new(Config {
            takeover,
            response,
            transactional,
            ..Config::default()
        })
    }

    fn records() -> Vec<Record> {
        let base = Record {
            fingerprint: fp('a'),
            generation: 2,
            token: OTHER,
            expires_at_ms: NOW + 50_000,
            state: RecordState::InProgress {
                lease_until_ms: NOW - 1,
            },
        };
        let live = Record {
            state: RecordState::InProgress {
                lease_until_ms: NOW + 5,
            },
            ..base.clone()
        };
        let done = Record {
            state: RecordState::Completed {
                response: StoredResponse {
                    status: 201,
                    headers: vec![],
                    body: b"ok".to_vec(),
                },
            },
            ..base.clone()
        };
        let unknown = Record {
            state: RecordState::OutcomeUnknown,
            ..base.clone()
        };
        let other = Record {
            fingerprint: fp('b'),
            ..base.clone()
        };
        let expired = Record {
            expires_at_ms: NOW,
            ..base.clone()
        };
        vec![base, live, done, unknown, other, expired]
    }

    fn handler(status: u16, body: &[u8]) -> Event {
        Event::HandlerFinished(HandlerResponse::new(status, vec![], body.to_vec()))
    }

    /// The events a host may feed after `action`.
    fn answers(action: &Action) -> Vec<Event> {
        let store = |results: Vec<StoreResult>| {
            let mut out: Vec<Event> = results.into_iter().map(Event::Store).collect();
            out.push(Event::StoreFailed);
            out
        };
        match action {
            Action::Store(StoreOp::Claim { .. }) => {
                let mut r = vec![StoreResult::Claimed {
                    generation: 1,
                    now_ms: NOW,
                }];
                r.extend(records().into_iter().map(|record| StoreResult::Existing {
                    record,
                    now_ms: NOW,
                }));
                r.push(StoreResult::Locked { now_ms: NOW });
                store(r)
            }
            Action::Store(StoreOp::Get { .. }) => {
                let mut r = vec![StoreResult::Got {
                    record: None,
                    now_ms: NOW,
                }];
                r.extend(records().into_iter().map(|record| StoreResult::Got {
                    record: Some(record),
                    now_ms: NOW,
                }));
                r.push(StoreResult::Locked { now_ms: NOW });
                store(r)
            }
            Action::Store(StoreOp::TakeOver { .. }) => store(vec![
                StoreResult::TookOver(Some(2)),
                StoreResult::TookOver(None),
            ]),
            Action::Store(StoreOp::MarkUnknown { .. }) => store(vec![
                StoreResult::MarkedUnknown(true),
                StoreResult::MarkedUnknown(false),
            ]),
            Action::Store(StoreOp::Complete { .. }) => store(vec![
                StoreResult::Completed(true),
                StoreResult::Completed(false),
            ]),
            Action::Store(StoreOp::Release { .. }) => store(vec![
                StoreResult::Released(true),
                StoreResult::Released(false),
            ]),
            Action::Store(StoreOp::Renew { .. }) => store(vec![
                StoreResult::Renewed(true),
                StoreResult::Renewed(false),
            ]),
            Action::Store(StoreOp::Commit { .. }) => store(vec![StoreResult::Committed]),
            Action::RunHandler(_) | Action::Wait | Action::LeaseLost => vec![
                Event::HeartbeatDue,
                handler(201, b"small"),
                handler(201, b"far too large"),
                handler(500, b"boom"),
                Event::HandlerFinished(HandlerResponse {
                    body_truncated: true,
                    ..HandlerResponse::new(201, vec![], b"far".to_vec())
                }),
                Event::HandlerFinished(HandlerResponse {
                    origin: ResponseOrigin::Framework,
                    ..HandlerResponse::new(422, vec![], b"{}".to_vec())
                }),
                Event::HandlerFailed {
                    maybe_side_effect: true,
                },
                Event::HandlerFailed {
                    maybe_side_effect: false,
                },
            ],
            Action::Respond { .. } | Action::PropagateError { .. } => vec![],
        }
    }

    /// One path: the actions returned and the events fed, in order.
    #[derive(Clone, Default)]
    struct Trace {
        steps: Vec<(Event, Action)>,
        ran: bool,
    }

    impl Trace {
        fn last_op(&self) -> Option<&StoreOp> {
            self.steps.iter().rev().find_map(|(_, a)| match a {
                Action::Store(op) => Some(op),
                _ => None,
            })
        }
    }

    fn is_503_not_committed(response: &HttpResponse, outcome: Outcome) -> bool {
        outcome == Outcome::NotCommitted
            && response.status == 503
            && response
                .headers
                .iter()
                .any(|(n, v)| n == "retry-after" && v == "1")
    }

    /// Checks a finished transactional path.
    fn check_tx_leaf(first: &Action, t: &Trace, end: &Action) {
        let (last_event, _) = t.steps.last().expect("a leaf follows an event");
        let before_end = t.steps[..t.steps.len() - 1]
            .last()
            .map_or(first, |(_, a)| a);
        match end {
            Action::Respond { response, outcome } if t.ran => match outcome {
                Outcome::Stored | Outcome::NotRetained => {
                    assert_eq!(last_event, &Event::Store(StoreResult::Committed));
                    assert!(matches!(before_end, Action::Store(StoreOp::Commit { .. })));
                    assert_ne!(response.status, 503);
                }
                Outcome::NotStored => {
                    assert!(matches!(t.last_op(), Some(StoreOp::Release { .. })));
                    // The only not-stored answers fed: a 500, and a framework's 422.
                    assert!(matches!(response.status, 500 | 422), "{}", response.status);
                }
                _ => assert!(is_503_not_committed(response, *outcome), "{outcome:?}"),
            },
            Action::PropagateError { .. } => {
                assert!(matches!(t.last_op(), Some(StoreOp::Release { .. })));
            }
            Action::Respond { outcome, .. } => assert!(!outcome.handler_ran()),
            other => panic!("not a leaf: {other:?}"),
        }
        // A commit only follows a write that applied.
        let mut prev: Option<&Event> = None;
        for (event, action) in &t.steps {
            if matches!(action, Action::Store(StoreOp::Commit { .. })) {
                assert!(
                    matches!(
                        event,
                        Event::Store(
                            StoreResult::Completed(true) | StoreResult::MarkedUnknown(true)
                        )
                    ),
                    "commit after {event:?} (before: {prev:?})"
                );
            }
            prev = Some(event);
        }
    }

    /// Checks the cleanup of a finished path: present exactly when the last store op was a claim
    /// or takeover that failed outside a transaction, and then a token-fenced undo of it.
    fn check_cleanup_leaf(flow: &ServerFlow, last: &Action, t: &Trace, end: &Action) {
        let (last_event, _) = t.steps.last().expect("a leaf follows an event");
        let failed = *last_event == Event::StoreFailed;
        let expected = match last {
            Action::Store(StoreOp::Claim { scope, token, .. })
                if failed && !flow.config.transactional =>
            {
                Some(StoreOp::Release {
                    scope: *scope,
                    token: *token,
                })
            }
            Action::Store(StoreOp::TakeOver {
                scope, new_token, ..
            }) if failed && !flow.config.transactional => Some(StoreOp::Renew {
                scope: *scope,
                token: *new_token,
                lease_ms: 0,
            }),
            _ => None,
        };
        assert_eq!(flow.cleanup().map(Cleanup::op), expected.as_ref());
        if let Some(cleanup) = flow.cleanup() {
            let lease = flow.config.lease.lease_ms();
            assert_eq!(
                cleanup.budget_ms(),
                lease.max(flow.config.cleanup_budget_ms.get())
            );
            assert_eq!(cleanup.max_delay_ms(), CLEANUP_MAX_DELAY_MS.min(lease / 2));
            assert!(matches!(
                end,
                Action::Respond {
                    outcome: Outcome::StoreUnavailable,
                    response,
                } if response.status == 503
            ));
            assert!(!t.ran, "a cleanup never follows a handler run");
        }
    }

    #[test]
    fn cleanup_retries_with_a_doubling_capped_delay_within_the_budget() {
        let (mut flow, _) = ServerFlow::start(
            ScopeId::from_bytes([3; 32]),
            fp('a'),
            config(false, TakeoverPolicy::OutcomeUnknown),
            MINE.0,
        );
        assert_eq!(flow.cleanup(), None);
        let end = flow.handle(Event::StoreFailed).expect("accepted");
        assert!(matches!(
            end,
            Action::Respond {
                outcome: Outcome::StoreUnavailable,
                ..
            }
        ));
        let cleanup = flow
            .cleanup()
            .expect("a failed claim leaves a cleanup")
            .clone();
        let budget = cleanup.budget_ms();
        assert_eq!(budget, 30_000);
        let applied = Event::Store(StoreResult::Released(true));
        let missed = Event::Store(StoreResult::Released(false));
        assert_eq!(cleanup.next(0, 0, &applied), CleanupStep::Done);
        assert_eq!(
            cleanup.next(0, 0, &Event::StoreFailed),
            CleanupStep::RetryAfter(100)
        );
        assert_eq!(cleanup.next(1, 150, &missed), CleanupStep::RetryAfter(200));
        assert_eq!(
            cleanup.next(4, 2_000, &missed),
            CleanupStep::RetryAfter(1_600)
        );
        assert_eq!(
            cleanup.next(5, 4_000, &missed),
            CleanupStep::RetryAfter(2_000)
        );
        assert_eq!(
            cleanup.next(u32::MAX, 4_000, &Event::StoreFailed),
            CleanupStep::RetryAfter(2_000)
        );
        assert_eq!(
            cleanup.next(20, budget - 2_000, &missed),
            CleanupStep::RetryAfter(2_000)
        );
        assert_eq!(cleanup.next(20, budget - 1_999, &missed), CleanupStep::Done);
        assert_eq!(cleanup.next(20, u64::MAX, &missed), CleanupStep::Done);
        // Whatever the answers, the attempts are bounded by the budget.
        let (mut attempt, mut elapsed) = (0_u32, 0_u64);
        while let CleanupStep::RetryAfter(delay) = cleanup.next(attempt, elapsed, &missed) {
            elapsed += delay;
            attempt += 1;
        }
        assert!(elapsed <= budget);
        assert_eq!(attempt, 18);
        // A finished flow keeps its cleanup; events after the end change nothing.
        assert_eq!(flow.handle(Event::StoreFailed), Err(FlowError::Finished));
        assert_eq!(flow.cleanup(), Some(&cleanup));
    }

    /// The cleanup left by a claim that failed under a route with this lease and cleanup budget.
    fn lost_claim_cleanup(lease_ms: u64, cleanup_budget_ms: u64) -> Cleanup {
        let config = Arc::new(Config {
            lease: crate::policy::LeasePolicy::new(lease_ms, None).expect("valid lease"),
            cleanup_budget_ms: std::num::NonZeroU64::new(cleanup_budget_ms).expect("positive"),
            ..Config::default()
        });
        let (mut flow, _) =
            ServerFlow::start(ScopeId::from_bytes([4; 32]), fp('a'), config, MINE.0);
        let end = flow.handle(Event::StoreFailed).expect("accepted");
        assert!(matches!(
            end,
            Action::Respond {
                outcome: Outcome::StoreUnavailable,
                ..
            }
        ));
        flow.cleanup()
            .expect("a failed claim leaves a cleanup")
            .clone()
    }

    /// The attempt start times (ms after the first) of a cleanup whose every attempt misses.
    fn attempt_times(cleanup: &Cleanup) -> Vec<u64> {
        let missed = Event::Store(StoreResult::Released(false));
        let (mut attempt, mut elapsed, mut times) = (0_u32, 0_u64, vec![0_u64]);
        while let CleanupStep::RetryAfter(delay) = cleanup.next(attempt, elapsed, &missed) {
            elapsed += delay;
            attempt += 1;
            times.push(elapsed);
        }
        times
    }

    #[test]
    fn cleanup_budget_is_the_route_setting_or_the_lease_whichever_is_longer() {
        let default_budget = crate::policy::DEFAULT_CLEANUP_BUDGET_MS;
        assert_eq!(Config::default().cleanup_budget_ms.get(), default_budget);
        // A short lease keeps the default budget: a store frozen for longer than the lease can
        // still apply the lost claim while the cleanup runs.
        assert_eq!(
            lost_claim_cleanup(1_000, default_budget).budget_ms(),
            30_000
        );
        assert_eq!(lost_claim_cleanup(1_000, 3_000).budget_ms(), 3_000);
        // A lease longer than the setting extends the budget to the lease.
        assert_eq!(lost_claim_cleanup(60_000, 5_000).budget_ms(), 60_000);
        assert_eq!(lost_claim_cleanup(30_000, 1).budget_ms(), 30_000);
        // The attempts stop within the budget, and the last starts less than a delay before it.
        for (lease, budget) in [(1_000, 30_000), (1_000, 3_000), (5_000, 12_345)] {
            let cleanup = lost_claim_cleanup(lease, budget);
            let times = attempt_times(&cleanup);
            let last = *times.last().expect("one attempt at least");
            assert!(last <= budget, "lease {lease} budget {budget}: {last}");
            assert!(
                last + cleanup.max_delay_ms() > budget,
                "lease {lease} budget {budget}: stopped early at {last}"
            );
        }
        // Same rule for the cleanup after a lost takeover.
        let config = Arc::new(Config {
            lease: crate::policy::LeasePolicy::new(1_000, None).expect("valid lease"),
            takeover: TakeoverPolicy::ReRun,
            ..Config::default()
        });
        let (mut flow, _) =
            ServerFlow::start(ScopeId::from_bytes([5; 32]), fp('a'), config, MINE.0);
        let expired = Record {
            fingerprint: fp('a'),
            generation: 1,
            token: OTHER,
            expires_at_ms: NOW + 50_000,
            state: RecordState::InProgress {
                lease_until_ms: NOW - 1,
            },
        };
        let action = flow
            .handle(Event::Store(StoreResult::Existing {
                record: expired,
                now_ms: NOW,
            }))
            .expect("accepted");
        assert!(matches!(action, Action::Store(StoreOp::TakeOver { .. })));
        let _ = flow.handle(Event::StoreFailed).expect("accepted");
        let cleanup = flow.cleanup().expect("a failed takeover leaves a cleanup");
        assert!(matches!(cleanup.op(), StoreOp::Renew { lease_ms: 0, .. }));
        assert_eq!(cleanup.budget_ms(), 30_000);
        assert_eq!(cleanup.max_delay_ms(), 500);
    }

    #[test]
    fn cleanup_delay_is_capped_at_half_a_short_lease() {
        for (lease, cap) in [
            (1_000, 500),
            (1_001, 500),
            (3_000, 1_500),
            (4_000, 2_000),
            (30_000, 2_000),
            (86_400_000, 2_000),
        ] {
            let cleanup = lost_claim_cleanup(lease, 30_000);
            assert_eq!(cleanup.max_delay_ms(), cap, "lease {lease}");
            assert!(cap <= CLEANUP_MAX_DELAY_MS);
        }
        let cleanup = lost_claim_cleanup(1_000, 30_000);
        let missed = Event::Store(StoreResult::Released(false));
        let delays: Vec<_> = (0..6)
            .map(|attempt| cleanup.next(attempt, 0, &missed))
            .collect();
        assert_eq!(
            delays,
            [100, 200, 400, 500, 500, 500].map(CleanupStep::RetryAfter)
        );
        assert_eq!(
            cleanup.next(u32::MAX, 0, &Event::StoreFailed),
            CleanupStep::RetryAfter(500)
        );
        // A lost claim that lands at any moment t within the budget holds its lease until
        // t + lease; some attempt starts in (t, t + lease / 2], so it is released before its
        // lease ends (never outcome-unknown without a run).
        let times = attempt_times(&cleanup);
        assert!(times.windows(2).all(|w| w[1] - w[0] <= 500), "{times:?}");
        for t in 0..30_000 - 500 {
            assert!(
                times.iter().any(|&a| a > t && a <= t + 500),
                "claim landing at {t} ms is not released before its lease ends"
            );
        }
    }

    /// Depth-first over every path; returns the number of leaves.
    fn explore(flow: &ServerFlow, first: &Action, action: &Action, trace: &Trace) -> usize {
        let transactional = flow.config.transactional;
        if let Action::RunHandler(run) = action {
            assert_eq!(run.heartbeat_ms.is_none(), transactional);
        }
        if !transactional {
            assert!(!matches!(action, Action::Store(StoreOp::Commit { .. })));
        }
        let mut leaves = 0;
        let beats = trace
            .steps
            .iter()
            .filter(|(e, _)| *e == Event::HeartbeatDue)
            .count();
        for event in answers(action) {
            if event == Event::HeartbeatDue && beats >= 2 {
                // Heartbeats repeat forever in the non-transactional flow; two show the cycle.
                continue;
            }
            let mut next = flow.clone();
            let Ok(got) = next.handle(event.clone()) else {
                // Refused: only a heartbeat, and only in transactional mode.
                assert_eq!(event, Event::HeartbeatDue);
                assert!(transactional);
                continue;
            };
            let mut t = trace.clone();
            t.ran |= matches!(action, Action::RunHandler(_));
            t.steps.push((event, got.clone()));
            if next.is_finished() {
                if transactional {
                    check_tx_leaf(first, &t, &got);
                }
                check_cleanup_leaf(&next, action, &t, &got);
                leaves += 1;
            } else {
                leaves += explore(&next, first, &got, &t);
            }
        }
        leaves
    }

    #[test]
    fn every_transactional_path_keeps_the_commit_rules() {
        for transactional in [true, false] {
            for takeover in [TakeoverPolicy::ReRun, TakeoverPolicy::OutcomeUnknown] {
                let (flow, first) = ServerFlow::start(
                    ScopeId::from_bytes([3; 32]),
                    fp('a'),
                    config(transactional, takeover),
                    MINE.0,
                );
                let leaves = explore(&flow, &first, &first, &Trace::default());
                assert!(leaves > 100, "{leaves} leaves");
            }
        }
    }

    #[test]
    fn a_too_large_response_commits_the_not_retained_problem_under_either_policy() {
        let problem = not_retained_response().encode().expect("encodes");
        for transactional in [true, false] {
            for takeover in [TakeoverPolicy::ReRun, TakeoverPolicy::OutcomeUnknown] {
                for truncated in [false, true] {
                    let (mut flow, _) = ServerFlow::start(
                        ScopeId::from_bytes([3; 32]),
                        fp('a'),
                        config(transactional, takeover),
                        MINE.0,
                    );
                    let feed = |flow: &mut ServerFlow, e: Event| flow.handle(e).expect("accepted");
                    assert!(matches!(
                        feed(
                            &mut flow,
                            Event::Store(StoreResult::Claimed {
                                generation: 1,
                                now_ms: NOW
                            })
                        ),
                        Action::RunHandler(_)
                    ));
                    // Too large by length, or a small prefix the host stopped recording.
                    let mut response = HandlerResponse::new(201, vec![], b"far too large".to_vec());
                    if truncated {
                        response.body = b"far".to_vec();
                        response.body_truncated = true;
                    }
                    let action = feed(&mut flow, Event::HandlerFinished(response));
                    assert!(
                        matches!(
                            &action,
                            Action::Store(StoreOp::Complete { response, token, .. })
                                if *response == problem && *token == MINE
                        ),
                        "{action:?}"
                    );
                    let mut end = feed(&mut flow, Event::Store(StoreResult::Completed(true)));
                    if transactional {
                        assert!(matches!(end, Action::Store(StoreOp::Commit { .. })));
                        end = feed(&mut flow, Event::Store(StoreResult::Committed));
                    }
                    let want: &[u8] = if truncated { b"far" } else { b"far too large" };
                    assert!(matches!(
                        end,
                        Action::Respond { ref response, outcome: Outcome::NotRetained }
                            if response.body == want && response.status == 201
                    ));
                }
            }
        }
    }

    #[test]
    fn a_framework_rejection_is_released_whatever_its_status() {
        for status in [201, 400, 422] {
            let (mut flow, _) = ServerFlow::start(
                ScopeId::from_bytes([3; 32]),
                fp('a'),
                config(false, TakeoverPolicy::OutcomeUnknown),
                MINE.0,
            );
            let _ = flow
                .handle(Event::Store(StoreResult::Claimed {
                    generation: 1,
                    now_ms: NOW,
                }))
                .expect("accepted");
            let mut response = HandlerResponse::new(status, vec![], b"{}".to_vec());
            response.origin = ResponseOrigin::Framework;
            assert!(matches!(
                flow.handle(Event::HandlerFinished(response)),
                Ok(Action::Store(StoreOp::Release { .. }))
            ));
        }
    }

    #[test]
    fn a_lock_wait_is_in_flight_and_leaves_no_cleanup() {
        for transactional in [true, false] {
            let (mut flow, _) = ServerFlow::start(
                ScopeId::from_bytes([3; 32]),
                fp('a'),
                config(transactional, TakeoverPolicy::OutcomeUnknown),
                MINE.0,
            );
            let end = flow
                .handle(Event::Store(StoreResult::Locked { now_ms: NOW }))
                .expect("accepted");
            assert!(matches!(
                end,
                Action::Respond { ref response, outcome: Outcome::InFlight }
                    if response.status == 409
                        && response.headers.iter().any(|(n, v)| n == "retry-after" && v == "1")
            ));
            assert_eq!(flow.cleanup(), None);
        }
    }

    fn started() -> ServerFlow {
        ServerFlow::start(
            ScopeId::from_bytes([3; 32]),
            fp('a'),
            config(false, TakeoverPolicy::OutcomeUnknown),
            MINE.0,
        )
        .0
    }

    fn claimed(generation: u32) -> Event {
        Event::Store(StoreResult::Claimed {
            generation,
            now_ms: NOW,
        })
    }

    #[test]
    fn the_generation_is_the_one_claimed() {
        let mut flow = started();
        assert_eq!(flow.generation(), None, "nothing owned before the claim");
        assert!(matches!(
            flow.handle(claimed(5)),
            Ok(Action::RunHandler(RunHandler { generation: 5, .. }))
        ));
        assert_eq!(flow.generation(), Some(5));
    }

    /// `handle` documents that a rejected event leaves the flow unchanged: the error names the
    /// phase and the event, and the event that fits is still accepted afterwards.
    #[test]
    fn a_rejected_event_leaves_the_flow_where_it_was() {
        let mut flow = started();
        assert_eq!(
            flow.handle(handler(201, b"early")),
            Err(FlowError::UnexpectedEvent {
                phase: "claiming",
                event: "handler_finished",
            })
        );
        assert!(!flow.is_finished());
        assert!(matches!(flow.handle(claimed(1)), Ok(Action::RunHandler(_))));
        assert_eq!(
            flow.handle(Event::Store(StoreResult::Renewed(true))),
            Err(FlowError::UnexpectedEvent {
                phase: "running",
                event: "renewed",
            })
        );
        assert!(matches!(
            flow.handle(handler(201, b"small")),
            Ok(Action::Store(StoreOp::Complete { .. }))
        ));
    }

    /// A heartbeat the store renewed keeps the flow the owner: the handler's answer is
    /// completed; one the store refused (a takeover) loses the lease, and nothing is completed.
    #[test]
    fn a_renewed_lease_completes_and_a_refused_one_does_not() {
        for renewed in [true, false] {
            let mut flow = started();
            let _ = flow.handle(claimed(1)).expect("accepted");
            assert!(matches!(
                flow.handle(Event::HeartbeatDue),
                Ok(Action::Store(StoreOp::Renew { .. }))
            ));
            assert_eq!(
                flow.handle(Event::HeartbeatDue),
                Err(FlowError::UnexpectedEvent {
                    phase: "running_renewing",
                    event: "heartbeat_due",
                })
            );
            let after = flow
                .handle(Event::Store(StoreResult::Renewed(renewed)))
                .expect("accepted");
            let end = flow.handle(handler(201, b"small")).expect("accepted");
            if renewed {
                assert_eq!(after, Action::Wait);
                assert!(
                    matches!(end, Action::Store(StoreOp::Complete { .. })),
                    "{end:?}"
                );
            } else {
                assert_eq!(after, Action::LeaseLost);
                assert!(
                    matches!(
                        end,
                        Action::Respond {
                            outcome: Outcome::LeaseLost,
                            ..
                        }
                    ),
                    "{end:?}"
                );
            }
        }
    }

    #[test]
    fn a_completed_record_of_the_same_request_is_replayed() {
        let done = records()
            .into_iter()
            .find(|r| matches!(r.state, RecordState::Completed { .. }))
            .expect("a completed record");
        let mut flow = started();
        let end = flow
            .handle(Event::Store(StoreResult::Existing {
                record: done,
                now_ms: NOW,
            }))
            .expect("accepted");
        let Action::Respond {
            response,
            outcome: Outcome::Replayed,
        } = end
        else {
            panic!("not a replay: {end:?}");
        };
        assert_eq!(response.status, 201);
        assert_eq!(response.body, b"ok");
        assert!(
            response
                .headers
                .iter()
                .any(|(n, v)| n.eq_ignore_ascii_case("idempotent-replayed") && v == "true"),
            "{response:?}"
        );
        assert!(flow.is_finished());
        assert_eq!(flow.handle(handler(201, b"x")), Err(FlowError::Finished));
    }
}
