//! The host step: what a host does with the actions a core flow returns (store operations to
//! run, a handler to start, an answer to deliver), the handler's side effect, the client's
//! reaction to an answer (core's retry policy), and transactional rollback.
use super::{
    Body, Busy, Client, ClientPhase, Effect, EffectMode, Handler, IdempoModel, PendingCleanup, Tx,
    Variant, Worker, World, body_of, contract, props, token_bytes,
};
use idempo_core::machine::problem::ProblemKind;
use idempo_core::machine::{Action, Event, HttpResponse, Outcome};
use idempo_core::record::{FencingToken, RecordState};
use idempo_core::retry::{AttemptOutcome, RetryDecision};

/// True for core's 503 `store-unavailable` problem with a `Retry-After` header.
pub(super) fn is_store_unavailable(response: &HttpResponse) -> bool {
    let kind = ProblemKind::StoreUnavailable;
    let type_uri = kind.type_uri();
    response.status == kind.status()
        && response
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("retry-after"))
        && response
            .body
            .windows(type_uri.len())
            .any(|w| w == type_uri.as_bytes())
}

/// Who receives an answer, and what the properties need to know about the request.
#[derive(Clone, Copy, Debug)]
pub(super) struct Who {
    pub(super) client: u8,
    pub(super) token: u8,
    pub(super) epoch: u8,
    pub(super) ran_handler: bool,
    pub(super) took_over: bool,
    pub(super) admission_fault: bool,
    pub(super) lock_waited: bool,
}

impl Who {
    fn flow(b: &Busy) -> Self {
        Self {
            client: b.client,
            token: b.token,
            epoch: b.epoch,
            ran_handler: b.handler.is_some(),
            took_over: b.took_over,
            admission_fault: b.admission_fault,
            lock_waited: b.lock_waited,
        }
    }
}

impl IdempoModel {
    pub(super) fn client_decides(
        &self,
        client: &mut Client,
        outcome: &AttemptOutcome,
        seen: &mut u32,
    ) {
        match self
            .retry
            .decide(u32::from(client.attempts), 0, outcome, 0.0)
        {
            Ok(RetryDecision::Retry { .. }) => client.phase = ClientPhase::Ready,
            Ok(RetryDecision::Stop { reason }) => {
                if reason == idempo_core::retry::StopReason::AttemptsExhausted {
                    *seen |= props::Seen::RetriesExhausted.bit();
                }
                client.phase = ClientPhase::Done;
            }
            Err(_) => client.phase = ClientPhase::Done,
        }
    }

    /// Applies the action a flow returned; `b` is put back unless the flow finished.
    pub(super) fn apply(
        &self,
        w: &mut World,
        mut b: Box<Busy>,
        action: Action,
        read_epoch: Option<u8>,
    ) {
        match action {
            Action::Store(op) => {
                b.pending = Some(op);
                w.workers.push(Worker::Busy(b));
            }
            Action::RunHandler(run) => {
                if run.token.0 != token_bytes(b.token) {
                    w.ghost.violated |= props::Check::Flow.bit();
                }
                if !b.admitted {
                    // P9: the handler may only start once the store confirmed the claim or
                    // takeover to this flow.
                    w.ghost.violated |= props::Check::FailClosed.bit();
                }
                b.pending = None;
                b.handler = Some(Handler {
                    downstream_key: run.downstream_key,
                    executed: None,
                    heartbeat: run.heartbeat_ms.is_some(),
                });
                w.workers.push(Worker::Busy(b));
            }
            Action::Wait | Action::LeaseLost => {
                b.pending = None;
                w.workers.push(Worker::Busy(b));
            }
            Action::Respond { response, outcome } => {
                self.deliver(w, &Who::flow(&b), &response, outcome, read_epoch);
                self.close_tx(w, &b);
                if self.variant != Variant::NoCleanup
                    && let Some(c) = b.flow.0.cleanup()
                {
                    let at = w.cleanups.partition_point(|x| x.token < b.token);
                    w.cleanups.insert(
                        at,
                        PendingCleanup {
                            token: b.token,
                            client: b.client,
                            op: c.op().clone(),
                        },
                    );
                }
                w.workers.push(Worker::Idle);
            }
            Action::PropagateError { outcome } => {
                let response = HttpResponse {
                    status: 500,
                    headers: Vec::new(),
                    body: Vec::new(),
                };
                self.deliver(w, &Who::flow(&b), &response, outcome, read_epoch);
                self.close_tx(w, &b);
                w.workers.push(Worker::Idle);
            }
        }
    }

    /// A flow ended with its transaction still open: roll back.
    pub(super) fn close_tx(&self, w: &mut World, b: &Busy) {
        if let Some(tx) = &b.tx {
            Self::rollback(w, usize::from(self.scope_of(b.client)), tx);
        }
    }

    pub(super) fn rollback(w: &mut World, s: usize, tx: &Tx) {
        w.store[s] = tx.pre.clone();
        // A completion written in the rolled-back transaction never happened.
        let scope = u8::try_from(s).unwrap_or(u8::MAX);
        w.ghost
            .completed
            .retain(|&(cs, e), _| cs != scope || e <= tx.pre_epoch);
        w.ghost.epoch[s] = tx.pre_epoch;
        w.ghost.granted[s] = tx.pre_granted;
    }

    /// The request answered its client: record what the properties need, then let the client
    /// react.
    pub(super) fn deliver(
        &self,
        w: &mut World,
        who: &Who,
        response: &HttpResponse,
        outcome: Outcome,
        read_epoch: Option<u8>,
    ) {
        let s = self.scope_of(who.client);
        let obs = props::Answer {
            client: who.client,
            token: who.token,
            scope: s,
            status: response.status,
            outcome,
            body: body_of(&response.body),
            replay_header: response
                .headers
                .iter()
                .any(|(n, v)| n == idempo_core::machine::REPLAYED_HEADER && v == "true"),
            store_unavailable: is_store_unavailable(response),
            epoch: if outcome == Outcome::Replayed {
                read_epoch.unwrap_or(0)
            } else {
                who.epoch
            },
            ran_handler: who.ran_handler,
            took_over: who.took_over,
            admission_fault: who.admission_fault,
            lock_waited: who.lock_waited,
            record: w.store[usize::from(s)].clone(),
            now_ms: Self::now_ms(w),
        };
        props::check_answer(self, w, &obs);
        if outcome == Outcome::Replayed {
            contract::check_replay(self, w, who.client, obs.body);
        }
        let client = &mut w.clients[usize::from(who.client)];
        if client.phase == ClientPhase::Waiting(who.token) {
            // The client classifies the answer with core, as every binding's client does: an
            // outcome-unknown problem stops it at once.
            let content_type = response
                .headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
                .map(|(_, v)| v.as_str());
            let attempt =
                AttemptOutcome::from_response(response.status, None, content_type, &response.body);
            let mut seen = w.ghost.seen;
            self.client_decides(client, &attempt, &mut seen);
            w.ghost.seen = seen;
        }
    }

    pub(super) fn feed(
        &self,
        w: &mut World,
        mut b: Box<Busy>,
        event: Event,
        read_epoch: Option<u8>,
    ) {
        match b.flow.0.handle(event) {
            Ok(action) => self.apply(w, b, action, read_epoch),
            Err(_) => {
                // The host fed an event the flow refused: a flow (or model) bug. Drop the request.
                w.ghost.violated |= props::Check::Flow.bit();
                b.pending = None;
                self.close_tx(w, &b);
                w.workers.push(Worker::Idle);
            }
        }
    }

    pub(super) fn record_effect(&self, w: &mut World, b: &Busy, owner: bool) {
        let e = Effect {
            scope: self.scope_of(b.client),
            epoch: b.epoch,
            token: b.token,
            client: b.client,
            owner,
            took_over: b.took_over,
        };
        contract::on_effect(self, w, b.client, owner, b.took_over, Self::now_ms(w));
        if b.epoch >= 2 {
            w.ghost.seen |= props::Seen::RerunAfterTtl.bit();
        }
        let at = w.ghost.effects.partition_point(|x| *x < e);
        w.ghost.effects.insert(at, e);
    }

    pub(super) fn is_owner(&self, w: &World, b: &Busy) -> bool {
        let mine = FencingToken(token_bytes(b.token));
        matches!(
            &w.store[usize::from(self.scope_of(b.client))],
            Some(r) if r.token == mine && matches!(r.state, RecordState::InProgress { .. })
        )
    }

    pub(super) fn execute(&self, w: &mut World, mut b: Box<Busy>) {
        let owner = self.is_owner(w, &b);
        let Some(handler) = b.handler.as_mut() else {
            w.workers.push(Worker::Busy(b));
            return;
        };
        let own: Body = (b.token, b.client);
        let result = match self.mode {
            EffectMode::DownstreamKeyed => match w.ghost.downstream.get(&handler.downstream_key) {
                Some(earlier) => Some(*earlier),
                None => {
                    w.ghost
                        .downstream
                        .insert(handler.downstream_key.clone(), own);
                    None
                }
            },
            _ => None,
        };
        handler.executed = Some(result.unwrap_or(own));
        if result.is_none() {
            self.record_effect(w, &b, owner);
        }
        w.workers.push(Worker::Busy(b));
    }
}
