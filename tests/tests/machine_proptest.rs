//! Property tests of the key state machine: random sequences of storage primitives, clock
//! advances and decisions, run against core (`idempo_core::machine::{decide, store}`) and
//! against a small reference state machine written here from the storage contract.
//!
//! Checked after every step: the same results and the same record in both; a record's row form
//! round-trips (`Record::to_row`/`from_row`, `StoredResponse::encode`/`decode`); at most one
//! completion per generation instance; a token that lost the record never writes again; and
//! `decide` never answers in-flight for an expired lease.
use std::num::NonZeroU64;

use idempo_core::machine::store::{self, ClaimOutcome};
use idempo_core::machine::{Decision, decide};
use idempo_core::policy::{Config, TakeoverPolicy};
use idempo_core::record::{FencingToken, FingerprintText, Record, RecordState, StoredResponse};
use proptest::prelude::*;

const FPS: [&str; 3] = ["v1:aaaa", "v1:bbbb", "h1:aaaa"];

fn fp(i: u8) -> FingerprintText {
    FingerprintText::new(FPS[usize::from(i) % FPS.len()]).expect("valid fingerprint")
}

fn tok(i: u8) -> FencingToken {
    FencingToken([i; 16])
}

fn response(body: u8) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: vec![body],
    }
}

/// The reference record: the storage contract's columns, nothing else.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RefRecord {
    fp: u8,
    generation: u32,
    token: u8,
    expires_at: u64,
    lease_until: Option<u64>,
    /// `Some(body)` when completed.
    body: Option<u8>,
    unknown: bool,
}

impl RefRecord {
    fn in_progress(&self) -> bool {
        self.lease_until.is_some()
    }

    fn live(&self, now: u64) -> bool {
        self.expires_at > now
    }
}

/// The reference decision (spec/PROTOCOL.md order: expiry, fingerprint, state).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RefDecision {
    Absent,
    Replay(u8),
    InFlight(u64),
    Mismatch,
    TakeOver(u8),
    MarkUnknown(u8),
    OutcomeUnknown,
}

fn ref_decide(r: &RefRecord, fp: u8, now: u64, rerun: bool, hint: u64) -> RefDecision {
    if !r.live(now) {
        return RefDecision::Absent;
    }
    if FPS[usize::from(r.fp) % FPS.len()] != FPS[usize::from(fp) % FPS.len()] {
        return RefDecision::Mismatch;
    }
    if let Some(b) = r.body {
        return RefDecision::Replay(b);
    }
    if r.unknown {
        return RefDecision::OutcomeUnknown;
    }
    match r.lease_until {
        Some(l) if l > now => RefDecision::InFlight((l - now).min(hint)),
        _ if rerun => RefDecision::TakeOver(r.token),
        _ => RefDecision::MarkUnknown(r.token),
    }
}

fn core_to_ref(r: &Record) -> RefRecord {
    let (lease_until, body, unknown) = match &r.state {
        RecordState::InProgress { lease_until_ms } => (Some(*lease_until_ms), None, false),
        RecordState::Completed { response } => (None, response.body.first().copied(), false),
        RecordState::OutcomeUnknown => (None, None, true),
    };
    RefRecord {
        fp: u8::try_from(
            FPS.iter()
                .position(|f| *f == r.fingerprint.as_str())
                .expect("known fingerprint"),
        )
        .expect("small"),
        generation: r.generation,
        token: r.token.0[0],
        expires_at: r.expires_at_ms,
        lease_until,
        body,
        unknown,
    }
}

fn decision_to_ref(d: Decision<'_>) -> RefDecision {
    match d {
        Decision::Absent => RefDecision::Absent,
        Decision::Replay(resp) => RefDecision::Replay(resp.body.first().copied().unwrap_or(0)),
        Decision::InFlight { retry_after_ms } => RefDecision::InFlight(retry_after_ms),
        Decision::Mismatch => RefDecision::Mismatch,
        Decision::TakeOver { seen_token } => RefDecision::TakeOver(seen_token.0[0]),
        Decision::MarkUnknown { seen_token } => RefDecision::MarkUnknown(seen_token.0[0]),
        Decision::OutcomeUnknown => RefDecision::OutcomeUnknown,
    }
}

/// One step of a random history.
#[derive(Clone, Debug)]
enum Op {
    Claim {
        fp: u8,
        token: u8,
        lease: u64,
        ttl: u64,
    },
    Get {
        fp: u8,
        rerun: bool,
    },
    TakeOver {
        seen: u8,
        new: u8,
        lease: u64,
    },
    MarkUnknown {
        seen: u8,
        ttl: u64,
    },
    Complete {
        token: u8,
        body: u8,
        ttl: u64,
    },
    Release {
        token: u8,
    },
    Renew {
        token: u8,
        lease: u64,
    },
    Advance(u64),
    Purge,
}

fn op() -> impl Strategy<Value = Op> {
    let t = 0u8..4;
    prop_oneof![
        (0u8..3, t.clone(), 0u64..4, 1u64..6).prop_map(|(fp, token, lease, ttl)| Op::Claim {
            fp,
            token,
            lease,
            ttl
        }),
        (0u8..3, any::<bool>()).prop_map(|(fp, rerun)| Op::Get { fp, rerun }),
        (t.clone(), t.clone(), 0u64..4).prop_map(|(seen, new, lease)| Op::TakeOver {
            seen,
            new,
            lease
        }),
        (t.clone(), 1u64..6).prop_map(|(seen, ttl)| Op::MarkUnknown { seen, ttl }),
        (t.clone(), any::<u8>(), 1u64..6).prop_map(|(token, body, ttl)| Op::Complete {
            token,
            body,
            ttl
        }),
        t.clone().prop_map(|token| Op::Release { token }),
        (t, 0u64..4).prop_map(|(token, lease)| Op::Renew { token, lease }),
        (0u64..4).prop_map(Op::Advance),
        Just(Op::Purge),
    ]
}

/// Reference and core side by side, plus the history facts the invariants need.
struct Run {
    now: u64,
    core: Option<Record>,
    reference: Option<RefRecord>,
    /// Generation instances begun (records created where the slot was absent or expired).
    instance: u32,
    /// Successful completions in the current instance.
    completions: u32,
    /// Tokens that held the record of the current instance and lost it to a takeover.
    fenced: Vec<u8>,
}

impl Run {
    fn check_round_trip(&self) -> Result<(), TestCaseError> {
        if let Some(r) = &self.core {
            let row = r.to_row().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let back = Record::from_row(row);
            prop_assert_eq!(back.as_ref(), Ok(r));
            if let RecordState::Completed { response } = &r.state {
                let bytes = response
                    .encode()
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let back = StoredResponse::decode(&bytes);
                prop_assert_eq!(back.as_ref(), Ok(response));
            }
            prop_assert!(
                r.lease_until_ms().is_none_or(|l| l <= r.expires_at_ms),
                "lease outlives expiry: {:?}",
                r
            );
        }
        prop_assert_eq!(self.core.as_ref().map(core_to_ref), self.reference.clone());
        Ok(())
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let now = self.now;
        match *op {
            Op::Claim {
                fp: f,
                token,
                lease,
                ttl,
            } => {
                let fresh = self.reference.as_ref().is_none_or(|r| !r.live(now));
                let got = store::claim(&mut self.core, &fp(f), tok(token), lease, ttl, now);
                let expected = if fresh {
                    let generation = self.reference.as_ref().map_or(1, |r| r.generation + 1);
                    self.reference = Some(RefRecord {
                        fp: f,
                        generation,
                        token,
                        expires_at: now + ttl.max(lease),
                        lease_until: Some(now + lease),
                        body: None,
                        unknown: false,
                    });
                    self.instance += 1;
                    self.completions = 0;
                    self.fenced.clear();
                    ClaimOutcome::Claimed { generation }
                } else {
                    let existing = self.core.clone().expect("live record in core");
                    ClaimOutcome::Existing(existing)
                };
                prop_assert_eq!(got, expected);
            }
            Op::Get { fp: f, rerun } => {
                let config = Config {
                    takeover: if rerun {
                        TakeoverPolicy::ReRun
                    } else {
                        TakeoverPolicy::OutcomeUnknown
                    },
                    in_flight_retry_after_ms: NonZeroU64::new(2).expect("non-zero"),
                    ..Config::default()
                };
                if let (Some(c), Some(r)) = (&self.core, &self.reference) {
                    let d = decide(c, &fp(f), now, &config);
                    prop_assert_eq!(decision_to_ref(d), ref_decide(r, f, now, rerun, 2));
                    if let RecordState::InProgress { lease_until_ms } = c.state {
                        if lease_until_ms <= now {
                            prop_assert!(
                                !matches!(d, Decision::InFlight { .. }),
                                "in-flight on an expired lease"
                            );
                        }
                    }
                }
            }
            Op::TakeOver { seen, new, lease } => {
                let got = store::takeover(&mut self.core, tok(seen), tok(new), lease, now);
                let expected = match self.reference.as_mut() {
                    Some(r) if r.in_progress() && r.token == seen && r.lease_until <= Some(now) => {
                        r.token = new;
                        r.lease_until = Some(now + lease);
                        r.expires_at = r.expires_at.max(now + lease);
                        if seen != new {
                            self.fenced.push(seen);
                        }
                        self.fenced.retain(|t| *t != new);
                        Some(r.generation)
                    }
                    _ => None,
                };
                prop_assert_eq!(got, expected);
            }
            Op::MarkUnknown { seen, ttl } => {
                let got = store::mark_unknown(&mut self.core, tok(seen), ttl, now);
                let expected = match self.reference.as_mut() {
                    Some(r) if r.in_progress() && r.token == seen && r.lease_until <= Some(now) => {
                        r.lease_until = None;
                        r.unknown = true;
                        r.expires_at = now + ttl;
                        true
                    }
                    _ => false,
                };
                prop_assert_eq!(got, expected);
            }
            Op::Complete { token, body, ttl } => {
                let got = store::complete(&mut self.core, tok(token), response(body), ttl, now);
                let expected = match self.reference.as_mut() {
                    Some(r) if r.in_progress() && r.token == token => {
                        r.lease_until = None;
                        r.body = Some(body);
                        r.expires_at = now + ttl;
                        true
                    }
                    _ => false,
                };
                prop_assert_eq!(got, expected);
                if got {
                    self.completions += 1;
                    prop_assert!(self.completions <= 1, "two completions in one generation");
                    prop_assert!(!self.fenced.contains(&token), "a fenced token completed");
                }
            }
            Op::Release { token } => {
                let got = store::release(&mut self.core, tok(token));
                let expected = match &self.reference {
                    Some(r) if r.in_progress() && r.token == token => {
                        self.reference = None;
                        true
                    }
                    _ => false,
                };
                prop_assert_eq!(got, expected);
                prop_assert!(
                    !got || !self.fenced.contains(&token),
                    "a fenced token released"
                );
            }
            Op::Renew { token, lease } => {
                let got = store::renew(&mut self.core, tok(token), lease, now);
                let expected = match self.reference.as_mut() {
                    Some(r) if r.in_progress() && r.token == token => {
                        r.lease_until = Some(now + lease);
                        r.expires_at = r.expires_at.max(now + lease);
                        true
                    }
                    _ => false,
                };
                prop_assert_eq!(got, expected);
                prop_assert!(
                    !got || !self.fenced.contains(&token),
                    "a fenced token renewed"
                );
            }
            Op::Advance(ms) => self.now += ms,
            Op::Purge => {
                let due = self.core.as_ref().is_some_and(|r| store::purgeable(r, now));
                prop_assert_eq!(due, self.reference.as_ref().is_some_and(|r| !r.live(now)));
                if due {
                    self.core = None;
                    self.reference = None;
                }
            }
        }
        self.check_round_trip()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    /// Core's primitives and decisions agree with the reference on every random history, and
    /// no history completes one generation twice or lets a fenced token write.
    #[test]
    fn primitives_match_reference(ops in prop::collection::vec(op(), 1..40)) {
        let mut run = Run {
            now: 0,
            core: None,
            reference: None,
            instance: 0,
            completions: 0,
            fenced: Vec::new(),
        };
        for o in &ops {
            run.step(o)?;
        }
        prop_assert!(run.instance as usize <= ops.len());
    }

    /// `decide` on any record: matches the reference, and an expired lease is never 409.
    #[test]
    fn decide_matches_reference(
        state in 0u8..3,
        lease in 0u64..20,
        expires_extra in 0u64..20,
        now in 0u64..40,
        rec_fp in 0u8..3,
        req_fp in 0u8..3,
        body in any::<u8>(),
        rerun in any::<bool>(),
        hint in 1u64..10,
    ) {
        let record = Record {
            fingerprint: fp(rec_fp),
            generation: 1,
            token: tok(7),
            expires_at_ms: lease + expires_extra,
            state: match state {
                0 => RecordState::InProgress { lease_until_ms: lease },
                1 => RecordState::Completed { response: response(body) },
                _ => RecordState::OutcomeUnknown,
            },
        };
        let config = Config {
            takeover: if rerun { TakeoverPolicy::ReRun } else { TakeoverPolicy::OutcomeUnknown },
            in_flight_retry_after_ms: NonZeroU64::new(hint).expect("non-zero"),
            ..Config::default()
        };
        let d = decide(&record, &fp(req_fp), now, &config);
        prop_assert_eq!(decision_to_ref(d), ref_decide(&core_to_ref(&record), req_fp, now, rerun, hint));
        if state == 0 && lease <= now {
            prop_assert!(!matches!(d, Decision::InFlight { .. }), "in-flight on an expired lease");
        }
        if let Decision::InFlight { retry_after_ms } = d {
            prop_assert!(retry_after_ms >= 1);
        }
    }

    /// Any valid stored response survives the versioned encoding.
    #[test]
    fn stored_responses_round_trip(
        status in 100u16..600,
        headers in prop::collection::vec(("[a-z][a-z0-9-]{0,15}", "[ -~\t]{0,30}"), 0..5),
        body in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        let r = StoredResponse { status, headers, body };
        let bytes = r.encode().map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(StoredResponse::decode(&bytes), Ok(r));
    }
}
