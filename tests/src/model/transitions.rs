//! The [`Model`] impl: the initial state, the enabled actions and the transition of each.
use super::{
    Act, Busy, Client, ClientPhase, EffectMode, Fault, FlowKey, Ghost, IdempoModel, Variant,
    Worker, World, contract, liveness, op_scope, props, token_bytes,
};
use idempo_core::machine::store::{self};
use idempo_core::machine::{Event, HandlerResponse, ServerFlow, StoreOp, StoreResult};
use idempo_core::retry::AttemptOutcome;
use stateright::{Model, Property};
use std::sync::Arc;

impl Model for IdempoModel {
    type State = World;
    type Action = Act;

    fn init_states(&self) -> Vec<World> {
        vec![World {
            now: 0,
            store: vec![None; self.scopes.len()],
            workers: vec![Worker::Idle; usize::from(self.bounds.workers)],
            clients: vec![
                Client {
                    attempts: 0,
                    phase: ClientPhase::Ready,
                };
                self.clients.len()
            ],
            next_token: 1,
            crashes: 0,
            faults: 0,
            cache: if self.bounds.cache.is_some() {
                vec![None; self.scopes.len()]
            } else {
                Vec::new()
            },
            filling: if self.bounds.cache.is_some() {
                vec![None; self.scopes.len()]
            } else {
                Vec::new()
            },
            cleanups: Vec::new(),
            ghost: Ghost {
                epoch: vec![0; self.scopes.len()],
                granted: vec![0; self.scopes.len()],
                ..Ghost::default()
            },
        }]
    }

    fn actions(&self, w: &World, actions: &mut Vec<Act>) {
        let idle = w.workers.iter().any(|x| matches!(x, Worker::Idle));
        for (c, client) in w.clients.iter().enumerate() {
            let c = u8::try_from(c).unwrap_or(u8::MAX);
            match client.phase {
                ClientPhase::Ready if idle => actions.push(Act::Send(c)),
                ClientPhase::Waiting(_) => actions.push(Act::Timeout(c)),
                _ => {}
            }
        }
        for x in &w.workers {
            let Worker::Busy(b) = x else { continue };
            match &b.pending {
                Some(op) => {
                    let s = self.scope_of(b.client);
                    let blocked = self.mode == EffectMode::Transactional
                        && self
                            .scopes
                            .get(usize::from(s))
                            .is_some_and(|sc| sc == op_scope(op))
                        && Self::locked_by_other(w, s, b.token, self);
                    if !blocked {
                        actions.push(Act::Store(b.token));
                        if w.faults < self.bounds.store_faults {
                            actions.push(Act::StoreFail(b.token));
                            if self.lost_differs(b, op) {
                                actions.push(Act::StoreLost(b.token));
                            }
                        }
                    } else if matches!(op, StoreOp::Claim { .. }) {
                        // The duplicate's claim waits on the row lock; it may time out.
                        actions.push(Act::LockWait(b.token));
                    }
                }
                None => {
                    if let Some(h) = &b.handler {
                        let transactional = self.mode == EffectMode::Transactional;
                        if h.executed.is_none() && !transactional {
                            actions.push(Act::Execute(b.token));
                        }
                        if h.executed.is_some() || transactional {
                            actions.push(Act::Finish(b.token));
                        }
                        if self.bounds.failures {
                            actions.push(Act::Fail(b.token));
                        }
                        if h.heartbeat {
                            actions.push(Act::Heartbeat(b.token));
                        }
                    }
                }
            }
            if w.crashes < self.bounds.max_crashes {
                actions.push(Act::Crash(b.token));
            }
        }
        for c in &w.cleanups {
            actions.push(Act::Cleanup(c.token));
        }
        if w.now < self.bounds.t_max {
            actions.push(Act::Tick);
        }
        for s in 0..w.cache.len() {
            let si = u8::try_from(s).unwrap_or(u8::MAX);
            if self.cache_fillable(w, s) {
                actions.push(Act::CacheRead(si));
            }
            if w.filling[s].is_some() {
                actions.push(Act::CacheWrite(si));
            }
        }
        if self.bounds.purge {
            for (s, slot) in w.store.iter().enumerate() {
                let locked = w.workers.iter().any(|x| {
                    matches!(x, Worker::Busy(b) if b.tx.is_some() && usize::from(self.scope_of(b.client)) == s)
                });
                // The purge job may visit any record; core's `purgeable` decides whether it
                // goes, and C4 judges that decision against the contract (expired: deleted;
                // live: kept). A visit that keeps the record leaves the state as it was.
                if !locked && slot.is_some() {
                    actions.push(Act::Purge(u8::try_from(s).unwrap_or(u8::MAX)));
                }
            }
        }
    }

    fn next_state(&self, last: &World, action: Act) -> Option<World> {
        let mut w = last.clone();
        match action {
            Act::Send(c) => {
                let idle = w.workers.iter().position(|x| matches!(x, Worker::Idle))?;
                w.workers.remove(idle);
                let token = w.next_token;
                w.next_token = w.next_token.checked_add(1)?;
                let client = &mut w.clients[usize::from(c)];
                client.attempts += 1;
                client.phase = ClientPhase::Waiting(token);
                if self.cache_answers(&mut w, c, token) {
                    w.workers.push(Worker::Idle);
                    contract::after_step(self, &mut w);
                    Self::canonical(&mut w);
                    return Some(w);
                }
                let s = usize::from(self.scope_of(c));
                // The host builds the scope from the authenticated principal (under the
                // mutation, from the first client's, as if it were cached across requests).
                let scope = if self.variant == Variant::ScopeOfFirstClient {
                    self.scopes[0]
                } else {
                    self.scopes[s]
                };
                let (flow, first) = ServerFlow::start(
                    scope,
                    self.fingerprints[usize::from(self.fp_of(c))].clone(),
                    Arc::clone(&self.config),
                    token_bytes(token),
                );
                let b = Box::new(Busy {
                    token,
                    client: c,
                    flow: FlowKey(flow),
                    pending: None,
                    handler: None,
                    epoch: 0,
                    took_over: false,
                    tx: None,
                    read: None,
                    admitted: false,
                    admission_fault: false,
                    lock_waited: false,
                    stored: None,
                });
                if self.variant == Variant::ExecuteBeforeAdmission {
                    // The side effect runs before the store is consulted.
                    self.record_effect(&mut w, &b, false);
                }
                self.apply(&mut w, b, first, None);
            }
            Act::Timeout(c) => {
                let mut seen = w.ghost.seen;
                self.client_decides(
                    &mut w.clients[usize::from(c)],
                    &AttemptOutcome::Timeout,
                    &mut seen,
                );
                w.ghost.seen = seen;
            }
            Act::Store(t)
            | Act::Execute(t)
            | Act::Finish(t)
            | Act::Fail(t)
            | Act::Heartbeat(t)
            | Act::Crash(t)
            | Act::StoreFail(t)
            | Act::StoreLost(t) => {
                let i = Self::busy_index(&w, t)?;
                let Worker::Busy(b) = w.workers.remove(i) else {
                    return None;
                };
                match action {
                    Act::Store(_) => self.store_step(&mut w, b, Fault::None),
                    Act::StoreFail(_) => self.store_step(&mut w, b, Fault::Failed),
                    Act::StoreLost(_) => self.store_step(&mut w, b, Fault::Lost),
                    Act::Execute(_) => self.execute(&mut w, b),
                    Act::Finish(_) => {
                        let body = b
                            .handler
                            .as_ref()
                            .and_then(|h| h.executed)
                            .unwrap_or((b.token, b.client));
                        let response = HandlerResponse {
                            status: 201,
                            headers: vec![("content-type".into(), "application/json".into())],
                            body: vec![body.0, body.1],
                            ..HandlerResponse::new(201, vec![], vec![])
                        };
                        self.feed(&mut w, b, Event::HandlerFinished(response), None);
                    }
                    Act::Fail(_) => {
                        let maybe_side_effect = self.mode != EffectMode::Transactional
                            && b.handler.as_ref().is_some_and(|h| h.executed.is_some());
                        self.feed(&mut w, b, Event::HandlerFailed { maybe_side_effect }, None);
                    }
                    Act::Heartbeat(_) => self.feed(&mut w, b, Event::HeartbeatDue, None),
                    _ => {
                        self.close_tx(&mut w, &b);
                        w.crashes += 1;
                        w.workers.push(Worker::Idle);
                    }
                }
            }
            Act::Tick => {
                w.now += 1;
                // Redis drops an entry at its deadline.
                let now_ms = Self::now_ms(&w);
                for entry in &mut w.cache {
                    if entry.as_ref().is_some_and(|e| e.record.is_expired(now_ms)) {
                        *entry = None;
                    }
                }
            }
            Act::Purge(s) => {
                let now_ms = Self::now_ms(&w);
                let slot = &mut w.store[usize::from(s)];
                let pre = slot.clone();
                let purged = pre.as_ref().is_some_and(|r| store::purgeable(r, now_ms));
                if purged {
                    *slot = None;
                }
                let post = w.store[usize::from(s)].clone();
                contract::check_write(&mut w, None, &pre, &post, purged, true);
            }
            Act::CacheRead(s) => self.cache_read(&mut w, usize::from(s)),
            Act::CacheWrite(s) => self.cache_write(&mut w, usize::from(s)),
            Act::Cleanup(t) => {
                let i = w.cleanups.iter().position(|c| c.token == t)?;
                let c = w.cleanups.remove(i);
                self.cleanup_step(&mut w, &c);
            }
            Act::LockWait(t) => {
                let i = Self::busy_index(&w, t)?;
                let Worker::Busy(mut b) = w.workers.remove(i) else {
                    return None;
                };
                b.pending = None;
                b.lock_waited = true;
                let now_ms = Self::now_ms(&w);
                // What the store adapter reports for a lock wait past its timeout: core's own
                // result (answered 409 in-flight), or under the mutation a claim that "worked".
                let event = if self.variant == Variant::LockWaitAssumedClaimed {
                    Event::Store(StoreResult::Claimed {
                        generation: 1,
                        now_ms,
                    })
                } else {
                    Event::Store(StoreResult::Locked { now_ms })
                };
                self.feed(&mut w, b, event, None);
            }
        }
        contract::after_step(self, &mut w);
        Self::canonical(&mut w);
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut all = props::all();
        if self.checks_liveness() {
            all.push(Property::always(liveness::L, liveness::holds));
        }
        all
    }
}
