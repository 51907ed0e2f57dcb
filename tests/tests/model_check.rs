//! Fast tier of the stateright model (`tests/src/model`): every effect mode's guarantee table,
//! two scopes under one raw key, handler failures and heartbeats, store faults (P9), a cache in
//! front of the store (P10), and the mutation variants.
//!
//! Each correct configuration is explored exhaustively (breadth-first, one thread) and the test
//! asserts exactly which safety properties have counterexamples and which witnesses are reached,
//! plus the pinned number of unique states. Each mutation must produce a counterexample for the
//! property it breaks, of the pinned shortest length. Measured figures and the deep tier:
//! `spec/MODEL.md`.
use idempo_tests::model::harness::{self, Search};
use idempo_tests::model::props::*;
use idempo_tests::model::{Bounds, ClientSpec, EffectMode, IdempoModel, Variant};

fn guarantees(label: &str, model: IdempoModel, failing: &[&str], reached: &[&str]) -> usize {
    harness::guarantees(label, model, Search::Bfs, failing, reached).unique
}

use harness::mutation;

/// Alice sends body A.
pub const ALICE_A: ClientSpec = ClientSpec {
    principal: "alice",
    body: r#"{"amount":100,"to":"acct-1"}"#,
};
/// Alice sends body B under the same key (a different request).
pub const ALICE_B: ClientSpec = ClientSpec {
    principal: "alice",
    body: r#"{"amount":250,"to":"acct-1"}"#,
};
/// Bob sends body A under the same raw key: another scope.
pub const BOB_A: ClientSpec = ClientSpec {
    principal: "bob",
    body: r#"{"amount":100,"to":"acct-1"}"#,
};

fn ab(mode: EffectMode, bounds: Bounds) -> IdempoModel {
    IdempoModel::new(mode, &[ALICE_A, ALICE_B], bounds)
}

fn no_purge() -> Bounds {
    Bounds {
        purge: false,
        ..Bounds::default()
    }
}

/// Handlers fail (with or without a side effect) and heartbeat; one attempt per client.
fn failures() -> Bounds {
    Bounds {
        retries: 0,
        failures: true,
        heartbeats: true,
        ..Bounds::default()
    }
}

#[test]
fn transactional_holds_everything() {
    let unique = guarantees(
        "transactional A/B",
        ab(EffectMode::Transactional, Bounds::default()),
        &[],
        &[W_REPLAY, W_MISMATCH, W_RERUN_TTL, W_EXHAUSTED, W_LOCK_WAIT],
    );
    assert_eq!(unique, 74_736);
    let unique = guarantees(
        "transactional A/A",
        IdempoModel::new(
            EffectMode::Transactional,
            &[ALICE_A, ALICE_A],
            Bounds::default(),
        ),
        &[],
        &[W_REPLAY, W_RERUN_TTL, W_EXHAUSTED, W_LOCK_WAIT],
    );
    assert_eq!(unique, 70_750);
}

#[test]
fn downstream_keyed_without_purge() {
    let unique = guarantees(
        "downstream-keyed A/B, no purge",
        ab(EffectMode::DownstreamKeyed, no_purge()),
        &[P8E],
        &[
            W_REPLAY,
            W_IN_FLIGHT,
            W_MISMATCH,
            W_TAKEOVER,
            W_STALE_REJECTED,
            W_RERUN_TTL,
            W_EXHAUSTED,
        ],
    );
    assert_eq!(unique, 281_736);
}

/// Regression for the model's finding (`spec/MODEL.md` §4): the downstream key used to be derived
/// from (scope, generation) alone, the generation restarts at 1 when a purged key is claimed again,
/// and another body under the same key then reused the old downstream key (P2 and P4 broke). With
/// the fingerprint in the key, purging changes nothing but the paused-owner window (P8e).
#[test]
fn downstream_keyed_with_purge() {
    let unique = guarantees(
        "downstream-keyed A/B, purge",
        ab(EffectMode::DownstreamKeyed, Bounds::default()),
        &[P8E],
        &[
            W_REPLAY,
            W_IN_FLIGHT,
            W_MISMATCH,
            W_TAKEOVER,
            W_STALE_REJECTED,
            W_RERUN_TTL,
            W_EXHAUSTED,
        ],
    );
    assert_eq!(unique, 578_558);
}

#[test]
fn unkeyed_rerun_executes_twice() {
    let unique = guarantees(
        "unkeyed re-run A/B",
        ab(EffectMode::UnkeyedReRun, Bounds::default()),
        &[P1, P5A, P8E],
        &[
            W_REPLAY,
            W_IN_FLIGHT,
            W_MISMATCH,
            W_TAKEOVER,
            W_STALE_REJECTED,
            W_RERUN_TTL,
            W_EXHAUSTED,
        ],
    );
    assert_eq!(unique, 621_448);
}

#[test]
fn unkeyed_outcome_unknown_runs_at_most_once() {
    let unique = guarantees(
        "unkeyed outcome-unknown A/B",
        ab(EffectMode::UnkeyedOutcomeUnknown, Bounds::default()),
        &[P8E],
        &[
            W_REPLAY,
            W_IN_FLIGHT,
            W_MISMATCH,
            W_OUTCOME_UNKNOWN,
            W_STALE_REJECTED,
            W_RERUN_TTL,
            W_EXHAUSTED,
        ],
    );
    assert_eq!(unique, 354_218);
}

#[test]
fn two_scopes_sharing_a_raw_key_stay_apart() {
    let unique = guarantees(
        "downstream-keyed alice-A/bob-A, no crash",
        IdempoModel::new(
            EffectMode::DownstreamKeyed,
            &[ALICE_A, BOB_A],
            Bounds {
                max_crashes: 0,
                ..Bounds::default()
            },
        ),
        &[P8E],
        &[
            W_REPLAY,
            W_IN_FLIGHT,
            W_TAKEOVER,
            W_STALE_REJECTED,
            W_RERUN_TTL,
            W_EXHAUSTED,
            W_BOTH_SCOPES,
        ],
    );
    assert_eq!(unique, 723_620);
}

#[test]
fn handler_failures_and_heartbeats() {
    let unique = guarantees(
        "outcome-unknown A/B, failures + heartbeats",
        ab(EffectMode::UnkeyedOutcomeUnknown, failures()),
        &[P8E],
        &[W_MISMATCH, W_STALE_REJECTED, W_RERUN_TTL, W_EXHAUSTED],
    );
    assert_eq!(unique, 45_848);
    let unique = guarantees(
        "re-run A/B, failures + heartbeats",
        ab(EffectMode::UnkeyedReRun, failures()),
        &[P8E],
        &[W_MISMATCH, W_STALE_REJECTED, W_RERUN_TTL, W_EXHAUSTED],
    );
    assert_eq!(unique, 38_662);
    let unique = guarantees(
        "transactional A/B, failures + heartbeats",
        ab(EffectMode::Transactional, failures()),
        &[],
        &[W_MISMATCH, W_RERUN_TTL, W_EXHAUSTED, W_LOCK_WAIT],
    );
    assert_eq!(unique, 3_212);
}

#[test]
fn mutation_check_then_insert_double_executes() {
    let depth = mutation(
        "check-then-insert",
        ab(EffectMode::UnkeyedOutcomeUnknown, Bounds::default())
            .with_variant(Variant::CheckThenInsert),
        &[P1],
    );
    assert_eq!(depth, 8);
}

#[test]
fn mutation_complete_without_token_lets_a_stale_owner_write() {
    let depth = mutation(
        "complete without token check",
        ab(EffectMode::UnkeyedOutcomeUnknown, Bounds::default())
            .with_variant(Variant::CompleteWithoutToken),
        &[P8],
    );
    assert_eq!(depth, 9);
}

#[test]
fn mutation_release_without_token_lets_a_stale_owner_delete() {
    let depth = mutation(
        "release without token check",
        ab(EffectMode::UnkeyedOutcomeUnknown, failures())
            .with_variant(Variant::ReleaseWithoutToken),
        &[P8],
    );
    assert_eq!(depth, 8);
}

#[test]
fn mutation_no_fingerprint_check_replays_another_body() {
    let depth = mutation(
        "no fingerprint check",
        ab(EffectMode::UnkeyedOutcomeUnknown, Bounds::default())
            .with_variant(Variant::NoFingerprintCheck),
        &[P2, P4],
    );
    assert_eq!(depth, 7);
}

#[test]
fn mutation_takeover_rerun_with_unkeyed_effect_double_executes() {
    let depth = mutation(
        "takeover re-run, unkeyed effect",
        ab(EffectMode::UnkeyedReRun, Bounds::default()),
        &[P1],
    );
    assert_eq!(depth, 9);
}

/// One store fault per run (not applied, or applied with the answer lost), no crash: a record
/// left by a lost claim or takeover is resolved by its lease, like a crash.
fn store_faults() -> Bounds {
    Bounds {
        store_faults: 1,
        max_crashes: 0,
        ..Bounds::default()
    }
}

/// A cache in front of the store whose TTL (3 ticks) is longer than the records' (2 ticks), no
/// crash. A fill reads the authority and writes the cache in two steps (time may pass between).
fn cached() -> Bounds {
    Bounds {
        cache: Some(3),
        max_crashes: 0,
        ..Bounds::default()
    }
}

#[test]
fn store_faults_fail_closed() {
    let unique = guarantees(
        "outcome-unknown A/B, 1 store fault",
        ab(EffectMode::UnkeyedOutcomeUnknown, store_faults()),
        &[P8E],
        &[
            W_REPLAY,
            W_IN_FLIGHT,
            W_MISMATCH,
            W_OUTCOME_UNKNOWN,
            W_STALE_REJECTED,
            W_RERUN_TTL,
            W_EXHAUSTED,
            W_STORE_UNAVAILABLE,
            W_ORPHAN_RESOLVED,
            W_ORPHAN_CLEANED,
        ],
    );
    assert_eq!(unique, 666_386);
    // The host that ignores core's cleanup (before it existed): the same guarantees, minus the
    // cleanup witness, in exactly the state space measured before the cleanup was modelled.
    let unique = guarantees(
        "outcome-unknown A/B, 1 store fault, host ignores the cleanup",
        ab(EffectMode::UnkeyedOutcomeUnknown, store_faults()).with_variant(Variant::NoCleanup),
        &[P8E],
        &[
            W_REPLAY,
            W_IN_FLIGHT,
            W_MISMATCH,
            W_OUTCOME_UNKNOWN,
            W_STALE_REJECTED,
            W_RERUN_TTL,
            W_EXHAUSTED,
            W_STORE_UNAVAILABLE,
            W_ORPHAN_RESOLVED,
        ],
    );
    assert_eq!(unique, 368_522);
    let unique = guarantees(
        "downstream-keyed A/B, 1 store fault, no purge",
        ab(
            EffectMode::DownstreamKeyed,
            Bounds {
                purge: false,
                ..store_faults()
            },
        ),
        &[P8E],
        &[
            W_REPLAY,
            W_IN_FLIGHT,
            W_MISMATCH,
            W_TAKEOVER,
            W_STALE_REJECTED,
            W_RERUN_TTL,
            W_EXHAUSTED,
            W_STORE_UNAVAILABLE,
            W_ORPHAN_RESOLVED,
            W_ORPHAN_CLEANED,
        ],
    );
    assert_eq!(unique, 567_792);
    let unique = guarantees(
        "transactional A/B, 1 store fault, 1 crash",
        ab(
            EffectMode::Transactional,
            Bounds {
                store_faults: 1,
                ..Bounds::default()
            },
        ),
        &[],
        &[
            W_REPLAY,
            W_MISMATCH,
            W_RERUN_TTL,
            W_EXHAUSTED,
            W_STORE_UNAVAILABLE,
            W_LOCK_WAIT,
        ],
    );
    assert_eq!(unique, 177_622);
}

#[test]
fn cache_in_front_replays_only_the_live_generation() {
    let unique = guarantees(
        "outcome-unknown A/B, cache",
        ab(EffectMode::UnkeyedOutcomeUnknown, cached()),
        &[P8E],
        &[
            W_REPLAY,
            W_IN_FLIGHT,
            W_MISMATCH,
            W_OUTCOME_UNKNOWN,
            W_STALE_REJECTED,
            W_RERUN_TTL,
            W_EXHAUSTED,
            W_CACHE_HIT,
            W_CACHE_MISMATCH,
        ],
    );
    assert_eq!(unique, 234_342);
    let unique = guarantees(
        "transactional A/B, cache, 1 crash",
        ab(
            EffectMode::Transactional,
            Bounds {
                cache: Some(3),
                ..Bounds::default()
            },
        ),
        &[],
        &[
            W_REPLAY,
            W_MISMATCH,
            W_RERUN_TTL,
            W_EXHAUSTED,
            W_CACHE_HIT,
            W_CACHE_MISMATCH,
            W_LOCK_WAIT,
        ],
    );
    assert_eq!(unique, 265_220);
}

/// A lock wait past the timeout taken for a successful claim (what a host that invents a result
/// for the timeout risks): the duplicate starts the handler without a confirmed claim, beside the
/// transaction that holds the row. Core's `StoreResult::Locked` answers 409 instead
/// (`spec/PROTOCOL.md` §7.6).
#[test]
fn mutation_lock_wait_assumed_claimed_runs_without_a_claim() {
    let depth = mutation(
        "lock wait taken as a claim",
        ab(EffectMode::Transactional, Bounds::default())
            .with_variant(Variant::LockWaitAssumedClaimed),
        &[P9],
    );
    assert_eq!(depth, 4);
}

#[test]
fn mutation_fault_assumed_applied_fails_open() {
    let depth = mutation(
        "store fault taken as an applied claim",
        ab(EffectMode::UnkeyedOutcomeUnknown, store_faults())
            .with_variant(Variant::FaultAssumedApplied),
        &[P9],
    );
    assert_eq!(depth, 2);
}

#[test]
fn mutation_transactional_flag_off_answers_an_uncommitted_success() {
    let depth = mutation(
        "transactional host, Config::transactional off",
        ab(EffectMode::Transactional, store_faults()).with_variant(Variant::TransactionalFlagOff),
        &[P4],
    );
    assert_eq!(depth, 4);
}

#[test]
fn mutation_cache_ttl_unbounded_replays_a_dead_generation() {
    let depth = mutation(
        "cache TTL not bounded by expires_at",
        ab(EffectMode::UnkeyedOutcomeUnknown, cached()).with_variant(Variant::CacheTtlUnbounded),
        &[P10],
    );
    assert_eq!(depth, 11);
}

#[test]
fn mutation_cache_fill_delay_ignored_outlives_the_record() {
    let depth = mutation(
        "cache fill PX not reduced by the fill's delay",
        ab(EffectMode::UnkeyedOutcomeUnknown, cached())
            .with_variant(Variant::CacheFillDelayIgnored),
        &[P10],
    );
    assert_eq!(depth, 11);
}

#[test]
fn mutation_cache_without_decide_replays_another_body() {
    let depth = mutation(
        "cache hit without decide",
        ab(EffectMode::UnkeyedOutcomeUnknown, cached()).with_variant(Variant::CacheSkipsDecide),
        &[P2, P4],
    );
    assert_eq!(depth, 8);
}
