//! The store step: one pending store operation executed atomically on the model's store with
//! core's primitives, or failed (not applied, or applied with its answer lost); the host's
//! background cleanup; and the mutated primitives of the store variants.
use super::{
    Busy, EffectMode, Fault, IdempoModel, PendingCleanup, Tx, Variant, Worker, World, body_of,
    contract, props, token_bytes,
};
use idempo_core::machine::store::{self, ClaimOutcome};
use idempo_core::machine::{Event, StoreOp, StoreResult};
use idempo_core::record::{FencingToken, Record, RecordState, StoredResponse};
use idempo_core::scope::ScopeId;

pub(super) fn op_scope(op: &StoreOp) -> &ScopeId {
    match op {
        StoreOp::Claim { scope, .. }
        | StoreOp::Get { scope }
        | StoreOp::TakeOver { scope, .. }
        | StoreOp::MarkUnknown { scope, .. }
        | StoreOp::Complete { scope, .. }
        | StoreOp::Release { scope, .. }
        | StoreOp::Renew { scope, .. }
        | StoreOp::Commit { scope } => scope,
    }
}

/// Runs `f` on a copy of the slot whose token is replaced by `as_token`, then puts the original
/// token back: a primitive with its token comparison removed.
pub(super) fn without_token_check(
    slot: &mut Option<Record>,
    as_token: FencingToken,
    f: impl FnOnce(&mut Option<Record>) -> bool,
) -> bool {
    let original = slot.as_ref().map(|r| r.token);
    if let Some(r) = slot.as_mut() {
        r.token = as_token;
    }
    let ok = f(slot);
    if let (Some(r), Some(t)) = (slot.as_mut(), original) {
        r.token = t;
    }
    ok
}

impl IdempoModel {
    pub(super) fn with_requester_fp(&self, record: Record, client: u8) -> Record {
        if self.variant == Variant::LeaseReadAsExpiry
            && let RecordState::InProgress { .. } = record.state
        {
            return Record {
                state: RecordState::InProgress {
                    lease_until_ms: record.expires_at_ms,
                },
                ..record
            };
        }
        if self.variant == Variant::NoFingerprintCheck {
            Record {
                fingerprint: self.fingerprints[usize::from(self.fp_of(client))].clone(),
                ..record
            }
        } else {
            record
        }
    }

    /// Whether a lost answer differs from a plain failure for this pending operation: a read
    /// changes nothing, and inside an open transaction (or for the claim that opens one) the
    /// broken connection rolls everything back, except for the `COMMIT` itself (the completion,
    /// when the host commits with it).
    pub(super) fn lost_differs(&self, b: &Busy, op: &StoreOp) -> bool {
        match op {
            StoreOp::Get { .. } => false,
            StoreOp::Commit { .. } => true,
            StoreOp::Complete { .. } => b.tx.is_none() || !self.config.transactional,
            StoreOp::Claim { .. } => self.mode != EffectMode::Transactional,
            _ => b.tx.is_none(),
        }
    }

    /// Executes the pending store operation of busy worker `b` atomically, or fails it.
    pub(super) fn store_step(&self, w: &mut World, mut b: Box<Busy>, fault: Fault) {
        let Some(op) = b.pending.take() else {
            w.workers.push(Worker::Busy(b));
            return;
        };
        let Some(si) = self.scopes.iter().position(|s| s == op_scope(&op)) else {
            // The flow addressed a scope no client has: isolation is broken.
            w.ghost.violated |= props::Check::Scopes.bit();
            w.workers.push(Worker::Idle);
            return;
        };
        let s = u8::try_from(si).unwrap_or(u8::MAX);
        if s != self.scope_of(b.client) {
            w.ghost.violated |= props::Check::Scopes.bit();
        }
        let now_ms = Self::now_ms(w);
        let admission = matches!(
            op,
            StoreOp::Claim { .. }
                | StoreOp::Get { .. }
                | StoreOp::TakeOver { .. }
                | StoreOp::MarkUnknown { .. }
        );
        if fault != Fault::None {
            w.faults += 1;
            b.admission_fault |= admission;
        }
        if fault == Fault::Failed {
            // Nothing applied; an open transaction is aborted by the error.
            if let Some(tx) = b.tx.take() {
                Self::rollback(w, si, &tx);
            }
            let event = match op {
                StoreOp::Claim { .. } if self.variant == Variant::FaultAssumedApplied => {
                    Event::Store(StoreResult::Claimed {
                        generation: 1,
                        now_ms,
                    })
                }
                _ => Event::StoreFailed,
            };
            self.feed(w, b, event, None);
            return;
        }
        let pre = w.store[si].clone();
        let orphan = pre
            .as_ref()
            .is_some_and(|r| w.ghost.orphan != 0 && r.token.0 == token_bytes(w.ghost.orphan));
        let mut read_epoch = None;
        let op_seen = op.clone();
        let result = match op {
            StoreOp::Claim {
                fingerprint,
                token,
                lease_ms,
                ttl_ms,
                ..
            } => {
                let outcome = if self.variant == Variant::CheckThenInsert {
                    match b.read.take() {
                        None => {
                            // Step one: read only; the insert comes later.
                            b.read = Some(pre);
                            b.pending = Some(StoreOp::Claim {
                                scope: self.scopes[si],
                                fingerprint,
                                token,
                                lease_ms,
                                ttl_ms,
                            });
                            w.workers.push(Worker::Busy(b));
                            return;
                        }
                        Some(mut seen) => {
                            // Step two: decide on the stale read, write blindly.
                            let out = store::claim(
                                &mut seen,
                                &fingerprint,
                                token,
                                lease_ms,
                                ttl_ms,
                                now_ms,
                            );
                            if matches!(out, ClaimOutcome::Claimed { .. }) {
                                w.store[si] = seen;
                            }
                            out
                        }
                    }
                } else {
                    store::claim(
                        &mut w.store[si],
                        &fingerprint,
                        token,
                        lease_ms,
                        ttl_ms,
                        now_ms,
                    )
                };
                match outcome {
                    ClaimOutcome::Claimed { generation } => {
                        let fresh = pre.as_ref().is_none_or(|r| r.is_expired(now_ms));
                        if orphan {
                            w.ghost.seen |= props::Seen::OrphanResolved.bit();
                        }
                        if self.mode == EffectMode::Transactional {
                            b.tx = Some(Tx {
                                pre: pre.clone(),
                                pre_epoch: w.ghost.epoch[si],
                                pre_granted: w.ghost.granted[si],
                            });
                        }
                        contract::on_grant(w, si, b.token);
                        if fresh {
                            w.ghost.epoch[si] = w.ghost.epoch[si].saturating_add(1);
                        }
                        b.epoch = w.ghost.epoch[si];
                        StoreResult::Claimed { generation, now_ms }
                    }
                    ClaimOutcome::Existing(record) => {
                        read_epoch = Some(w.ghost.epoch[si]);
                        StoreResult::Existing {
                            record: self.with_requester_fp(record, b.client),
                            now_ms,
                        }
                    }
                }
            }
            StoreOp::Get { .. } => {
                read_epoch = Some(w.ghost.epoch[si]);
                StoreResult::Got {
                    record: pre.clone().map(|r| self.with_requester_fp(r, b.client)),
                    now_ms,
                }
            }
            StoreOp::TakeOver {
                seen_token,
                new_token,
                lease_ms,
                ..
            } => {
                let got =
                    store::takeover(&mut w.store[si], seen_token, new_token, lease_ms, now_ms);
                if got.is_some() && self.variant == Variant::TakeoverKeepsToken {
                    // The takeover renews the lease but leaves the old token in place.
                    if let Some(r) = w.store[si].as_mut() {
                        r.token = seen_token;
                    }
                }
                if got.is_some() {
                    contract::on_grant(w, si, new_token.0[15]);
                    b.epoch = w.ghost.epoch[si];
                    b.took_over = true;
                    if orphan {
                        w.ghost.seen |= props::Seen::OrphanResolved.bit();
                    }
                }
                StoreResult::TookOver(got)
            }
            StoreOp::MarkUnknown {
                seen_token, ttl_ms, ..
            } => {
                let ok = store::mark_unknown(&mut w.store[si], seen_token, ttl_ms, now_ms);
                if ok && orphan {
                    w.ghost.seen |= props::Seen::OrphanResolved.bit();
                }
                StoreResult::MarkedUnknown(ok)
            }
            StoreOp::Complete {
                token,
                response,
                ttl_ms,
                ..
            } => {
                let Ok(stored) = StoredResponse::decode(&response) else {
                    // The flow's own encoding did not decode: a core bug.
                    w.ghost.violated |= props::Check::Flow.bit();
                    self.feed(w, b, Event::StoreFailed, None);
                    return;
                };
                let body = body_of(&stored.body);
                let ok = if self.variant == Variant::CompleteWithoutToken {
                    without_token_check(&mut w.store[si], token, |slot| {
                        store::complete(slot, token, stored, ttl_ms, now_ms)
                    })
                } else if self.variant == Variant::CompleteUnconditional {
                    // An `UPDATE … SET state = completed WHERE scope_key = $1`: no token, no
                    // state in the condition.
                    if let Some(r) = w.store[si].as_mut() {
                        r.token = token;
                        r.state = RecordState::InProgress {
                            lease_until_ms: now_ms,
                        };
                    }
                    store::complete(&mut w.store[si], token, stored, ttl_ms, now_ms)
                } else {
                    store::complete(&mut w.store[si], token, stored, ttl_ms, now_ms)
                };
                if ok {
                    props::check_owner_write(w, &pre, token);
                    contract::check_fenced(w, si, token);
                    if let Some(body) = body {
                        let e = w.ghost.epoch[si];
                        w.ghost.completed.entry((s, e)).or_insert(body);
                        if b.tx.is_some() && self.config.transactional {
                            b.stored = Some(body);
                        } else {
                            contract::on_stored(self, w, b.client, body);
                        }
                    }
                    if !self.config.transactional && b.tx.take().is_some() {
                        // A host that commits with the completion (core not told: the
                        // flag-off mutation): the business writes take effect now.
                        self.record_effect(w, &b, true);
                    }
                } else {
                    w.ghost.seen |= props::Seen::StaleCompletionRejected.bit();
                }
                StoreResult::Completed(ok)
            }
            StoreOp::Release { token, .. } => {
                let ok = if self.variant == Variant::ReleaseWithoutToken {
                    without_token_check(&mut w.store[si], token, |slot| store::release(slot, token))
                } else {
                    store::release(&mut w.store[si], token)
                };
                if ok {
                    props::check_owner_write(w, &pre, token);
                    contract::check_fenced(w, si, token);
                    if let Some(tx) = b.tx.take() {
                        // Transactional release is the rollback.
                        Self::rollback(w, si, &tx);
                    }
                }
                StoreResult::Released(ok)
            }
            StoreOp::Renew {
                token, lease_ms, ..
            } => {
                let ok = if self.variant == Variant::AbandonReleases && lease_ms == 0 {
                    // The flow's abandon (renew with 0 ms: hand the execution to the
                    // takeover policy) done as a release: the key is free at once.
                    store::release(&mut w.store[si], token)
                } else if self.variant == Variant::RenewWithoutToken {
                    without_token_check(&mut w.store[si], token, |slot| {
                        store::renew(slot, token, lease_ms, now_ms)
                    })
                } else {
                    store::renew(&mut w.store[si], token, lease_ms, now_ms)
                };
                if ok {
                    props::check_owner_write(w, &pre, token);
                    contract::check_fenced(w, si, token);
                }
                StoreResult::Renewed(ok)
            }
            StoreOp::Commit { .. } => {
                // `COMMIT`: the record as written in the transaction and the business writes
                // take effect together.
                if b.tx.take().is_some() {
                    self.record_effect(w, &b, true);
                }
                if let Some(body) = b.stored.take() {
                    contract::on_stored(self, w, b.client, body);
                }
                StoreResult::Committed
            }
        };
        let applied = matches!(
            result,
            StoreResult::Claimed { .. }
                | StoreResult::TookOver(Some(_))
                | StoreResult::MarkedUnknown(true)
                | StoreResult::Completed(true)
                | StoreResult::Released(true)
                | StoreResult::Renewed(true)
        );
        let post = w.store[si].clone();
        // A transactional release is the rollback: the slot is the one before the claim.
        let shaped =
            !(self.mode == EffectMode::Transactional && matches!(op_seen, StoreOp::Release { .. }));
        contract::check_write(w, Some(&op_seen), &pre, &post, applied, shaped);
        if self.variant == Variant::ResultMisreported
            && let StoreResult::Completed(_) = result
        {
            // A store adapter that maps the completion's answer to the wrong result type.
            let wrong = StoreResult::Got {
                record: None,
                now_ms,
            };
            self.feed(w, b, Event::Store(wrong), read_epoch);
            return;
        }
        if fault == Fault::Lost {
            // Applied, answer lost. The host cannot tell this from a failure: a `COMMIT` that
            // went through stays committed (the host does not know it), any other open
            // transaction is aborted by the broken connection.
            if let Some(tx) = b.tx.take() {
                Self::rollback(w, si, &tx);
            }
            if matches!(
                result,
                StoreResult::Claimed { .. } | StoreResult::TookOver(Some(_))
            ) && self.mode != EffectMode::Transactional
            {
                w.ghost.orphan = b.token;
            }
            self.feed(w, b, Event::StoreFailed, None);
            return;
        }
        if matches!(
            result,
            StoreResult::Claimed { .. } | StoreResult::TookOver(Some(_))
        ) {
            b.admitted = true;
        }
        self.feed(w, b, Event::Store(result), read_epoch);
    }
    /// Runs the host's background cleanup `c` once, atomically: a token-fenced release (after a
    /// lost claim) or renew with 0 ms (after a lost takeover).
    pub(super) fn cleanup_step(&self, w: &mut World, c: &PendingCleanup) {
        let Some(si) = self.scopes.iter().position(|s| s == op_scope(&c.op)) else {
            w.ghost.violated |= props::Check::Scopes.bit();
            return;
        };
        if u8::try_from(si).ok() != Some(self.scope_of(c.client)) {
            w.ghost.violated |= props::Check::Scopes.bit();
        }
        let now_ms = Self::now_ms(w);
        let pre = w.store[si].clone();
        let orphan = pre
            .as_ref()
            .is_some_and(|r| w.ghost.orphan != 0 && r.token.0 == token_bytes(w.ghost.orphan));
        let (token, ok) = match &c.op {
            StoreOp::Release { token, .. } => (*token, store::release(&mut w.store[si], *token)),
            StoreOp::Renew {
                token, lease_ms, ..
            } => (
                *token,
                store::renew(&mut w.store[si], *token, *lease_ms, now_ms),
            ),
            _ => {
                // Core only hands out a release or a renew.
                w.ghost.violated |= props::Check::Flow.bit();
                return;
            }
        };
        let post = w.store[si].clone();
        contract::check_write(w, Some(&c.op), &pre, &post, ok, true);
        if ok {
            props::check_owner_write(w, &pre, token);
            contract::check_fenced(w, si, token);
            if orphan {
                w.ghost.seen |=
                    props::Seen::OrphanResolved.bit() | props::Seen::OrphanCleaned.bit();
            }
        }
    }
}
