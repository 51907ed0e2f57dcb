//! Fuzz the decision function and the storage primitives against a small reference written
//! independently from `spec/PROTOCOL.md` §5 and `spec/STORAGE.md` §3: the input is a script of
//! operations on one key (claim, get + decide, takeover, mark_unknown, complete, release, renew,
//! time steps, purge) with fingerprints, tokens and durations drawn from the bytes (including 0
//! and values that saturate). After every operation the core slot must equal the reference slot,
//! every result must agree, the record must satisfy the storage invariants and round-trip through
//! its row form, and `decide` must give the reference decision.
#![no_main]

use idempo_core::machine::{Decision, decide, store};
use idempo_core::policy::{Config, TakeoverPolicy};
use idempo_core::record::{FencingToken, FingerprintText, Record, RecordState, StoredResponse};
use libfuzzer_sys::fuzz_target;

/// The reference record: plain fields, small ids for fingerprints, tokens and responses.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Ref {
    fp: u8,
    state: u8,
    token: u8,
    generation: u32,
    lease_until: Option<u64>,
    expires_at: u64,
    response: Option<u8>,
}

#[derive(Debug, PartialEq, Eq)]
enum RefDecision {
    Absent,
    Replay(u8),
    InFlight(u64),
    Mismatch,
    TakeOver(u8),
    MarkUnknown(u8),
    OutcomeUnknown,
}

const MAX_GEN: u32 = 2_147_483_647;

fn fp(id: u8) -> FingerprintText {
    FingerprintText::new(format!("v1:{id:02x}")).expect("valid fingerprint")
}

fn tok(id: u8) -> FencingToken {
    FencingToken([id; 16])
}

fn resp(id: u8) -> StoredResponse {
    StoredResponse {
        status: 200 + u16::from(id % 4),
        headers: vec![("content-type".into(), "application/json".into())],
        body: vec![id],
    }
}

fn to_ref(r: &Record) -> Ref {
    let (state, lease_until, response) = match &r.state {
        RecordState::InProgress { lease_until_ms } => (1, Some(*lease_until_ms), None),
        RecordState::Completed { response } => (2, None, Some(response.body[0])),
        RecordState::OutcomeUnknown => (3, None, None),
    };
    let fp_id = u8::from_str_radix(&r.fingerprint.as_str()[3..], 16).expect("our fingerprint");
    Ref {
        fp: fp_id,
        state,
        token: r.token.0[0],
        generation: r.generation,
        lease_until,
        expires_at: r.expires_at_ms,
        response,
    }
}

fn ref_decide(r: &Ref, fp: u8, now: u64, rerun: bool, hint: u64) -> RefDecision {
    if r.expires_at <= now {
        return RefDecision::Absent;
    }
    if r.fp != fp {
        return RefDecision::Mismatch;
    }
    match r.state {
        2 => RefDecision::Replay(r.response.expect("completed has a response")),
        3 => RefDecision::OutcomeUnknown,
        _ => {
            let lease = r.lease_until.expect("in progress has a lease");
            if lease > now {
                RefDecision::InFlight((lease - now).min(hint))
            } else if rerun {
                RefDecision::TakeOver(r.token)
            } else {
                RefDecision::MarkUnknown(r.token)
            }
        }
    }
}

fn core_decision(d: Decision<'_>) -> RefDecision {
    match d {
        Decision::Absent => RefDecision::Absent,
        Decision::Replay(s) => RefDecision::Replay(s.body[0]),
        Decision::InFlight { retry_after_ms } => RefDecision::InFlight(retry_after_ms),
        Decision::Mismatch => RefDecision::Mismatch,
        Decision::TakeOver { seen_token } => RefDecision::TakeOver(seen_token.0[0]),
        Decision::MarkUnknown { seen_token } => RefDecision::MarkUnknown(seen_token.0[0]),
        Decision::OutcomeUnknown => RefDecision::OutcomeUnknown,
    }
}

/// A duration from one byte: mostly small, sometimes 0 or large enough to saturate.
fn dur(b: u8) -> u64 {
    match b {
        0 => 0,
        255 => u64::MAX,
        254 => u64::MAX / 2,
        _ => u64::from(b) * 37,
    }
}

fn owned_live(r: &Option<Ref>, token: u8) -> bool {
    matches!(r, Some(x) if x.state == 1 && x.token == token)
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, script)) = data.split_first() else {
        return;
    };
    let rerun = flags & 1 == 1;
    let config = Config {
        takeover: if rerun {
            TakeoverPolicy::ReRun
        } else {
            TakeoverPolicy::OutcomeUnknown
        },
        ..Config::default()
    };
    let hint = config.in_flight_retry_after_ms.get();
    let mut now: u64 = if flags & 2 == 2 {
        u64::MAX - 5000
    } else {
        1_700_000_000_000
    };
    let mut slot: Option<Record> = None;
    let mut model: Option<Ref> = None;
    for op in script.chunks_exact(4) {
        let (a, b, c) = (op[1], op[2], op[3]);
        match op[0] % 9 {
            0 => {
                let (f, t, lease, ttl) = (a % 4, b % 8, dur(c), dur(c.rotate_left(3)));
                let got = store::claim(&mut slot, &fp(f), tok(t), lease, ttl, now);
                let live = model.as_ref().is_some_and(|r| r.expires_at > now);
                if live {
                    assert!(
                        matches!(got, store::ClaimOutcome::Existing(ref e) if Some(to_ref(e)) == model)
                    );
                } else {
                    let generation = model
                        .as_ref()
                        .map_or(1, |r| r.generation.saturating_add(1).min(MAX_GEN));
                    assert_eq!(got, store::ClaimOutcome::Claimed { generation });
                    model = Some(Ref {
                        fp: f,
                        state: 1,
                        token: t,
                        generation,
                        lease_until: Some(now.saturating_add(lease)),
                        expires_at: now.saturating_add(ttl.max(lease)),
                        response: None,
                    });
                }
            }
            1 => {
                let f = a % 4;
                if let (Some(r), Some(m)) = (slot.as_ref(), model.as_ref()) {
                    assert_eq!(
                        core_decision(decide(r, &fp(f), now, &config)),
                        ref_decide(m, f, now, rerun, hint)
                    );
                }
            }
            2 => {
                let (seen, new, lease) = (a % 8, b % 8, dur(c));
                let got = store::takeover(&mut slot, tok(seen), tok(new), lease, now);
                let applies = owned_live(&model, seen)
                    && model
                        .as_ref()
                        .and_then(|r| r.lease_until)
                        .is_some_and(|l| l <= now);
                if applies {
                    let m = model.as_mut().expect("present");
                    let until = now.saturating_add(lease);
                    m.token = new;
                    m.lease_until = Some(until);
                    m.expires_at = m.expires_at.max(until);
                    assert_eq!(got, Some(m.generation));
                } else {
                    assert_eq!(got, None);
                }
            }
            3 => {
                let (seen, ttl) = (a % 8, dur(b));
                let got = store::mark_unknown(&mut slot, tok(seen), ttl, now);
                let applies = owned_live(&model, seen)
                    && model
                        .as_ref()
                        .and_then(|r| r.lease_until)
                        .is_some_and(|l| l <= now);
                if applies {
                    let m = model.as_mut().expect("present");
                    m.state = 3;
                    m.lease_until = None;
                    m.expires_at = now.saturating_add(ttl);
                }
                assert_eq!(got, applies);
            }
            4 => {
                let (mine, r, ttl) = (a % 8, b, dur(c));
                let got = store::complete(&mut slot, tok(mine), resp(r), ttl, now);
                let applies = owned_live(&model, mine);
                if applies {
                    let m = model.as_mut().expect("present");
                    m.state = 2;
                    m.lease_until = None;
                    m.response = Some(r);
                    m.expires_at = now.saturating_add(ttl);
                }
                assert_eq!(got, applies);
            }
            5 => {
                let mine = a % 8;
                let applies = owned_live(&model, mine);
                assert_eq!(store::release(&mut slot, tok(mine)), applies);
                if applies {
                    model = None;
                }
            }
            6 => {
                let (mine, lease) = (a % 8, dur(b));
                let applies = owned_live(&model, mine);
                assert_eq!(store::renew(&mut slot, tok(mine), lease, now), applies);
                if applies {
                    let m = model.as_mut().expect("present");
                    let until = now.saturating_add(lease);
                    m.lease_until = Some(until);
                    m.expires_at = m.expires_at.max(until);
                }
            }
            7 => now = now.saturating_add(u64::from(u16::from_be_bytes([a, b]))),
            _ => {
                let due = slot.as_ref().is_some_and(|r| store::purgeable(r, now));
                assert_eq!(due, model.as_ref().is_some_and(|r| r.expires_at <= now));
                if due {
                    slot = None;
                    model = None;
                }
            }
        }
        assert_eq!(
            slot.as_ref().map(to_ref),
            model,
            "core slot equals the reference"
        );
        if let Some(r) = &slot {
            if let Some(lease) = r.lease_until_ms() {
                assert!(
                    lease <= r.expires_at_ms,
                    "a live claim never expires under its owner"
                );
            }
            // Rows hold BIGINT times: exact below i64::MAX, saturated above (`to_row`).
            let row = r.to_row().expect("encodes");
            let back = Record::from_row(row).expect("valid row");
            let fits = |t: u64| i64::try_from(t).is_ok();
            if fits(r.expires_at_ms) && r.lease_until_ms().is_none_or(fits) {
                assert_eq!(&back, r, "row round trip");
            } else {
                assert_eq!(back.expires_at_ms, r.expires_at_ms.min(i64::MAX as u64));
                assert_eq!(back.generation, r.generation);
            }
        }
    }
});
