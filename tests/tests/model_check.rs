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
use idempo_tests::model::liveness::L;
use idempo_tests::model::props::*;
use idempo_tests::model::{Bounds, ClientSpec, EffectMode, IdempoModel, Variant};

fn guarantees(label: &str, model: IdempoModel, failing: &[&str], reached: &[&str]) -> usize {
    harness::guarantees(label, model, Search::Bfs, failing, reached).unique
}

use harness::mutation;

/// Asserts pinned unique-state counts, all of a test's configurations at once (measured, pinned).
///
/// `IDEMPO_MODEL_NO_PINS=1` skips them, so that only the properties and witnesses judge: the
/// model-only mutation pass (`make mutants-model`) runs that way, since a changed state count
/// says a mutant changed something, not that a guarantee broke.
fn pinned(pins: &[(usize, usize)]) {
    if std::env::var_os("IDEMPO_MODEL_NO_PINS").is_some() {
        eprintln!("IDEMPO_MODEL_NO_PINS: state counts not checked: {pins:?}");
        return;
    }
    assert!(
        pins.iter().all(|(got, pin)| got == pin),
        "unique state counts (measured, pinned): {pins:?}"
    );
}

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

fn aa(mode: EffectMode, bounds: Bounds) -> IdempoModel {
    IdempoModel::new(mode, &[ALICE_A, ALICE_A], bounds)
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
    let mut pins = Vec::new();
    let unique = guarantees(
        "transactional A/B",
        ab(EffectMode::Transactional, Bounds::default()).with_liveness(),
        &[],
        &[W_REPLAY, W_MISMATCH, W_RERUN_TTL, W_EXHAUSTED, W_LOCK_WAIT],
    );
    pins.push((unique, 74_736));
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
    pins.push((unique, 70_750));
    pinned(&pins);
}

#[test]
fn downstream_keyed_without_purge() {
    let unique = guarantees(
        "downstream-keyed A/B, no purge",
        ab(EffectMode::DownstreamKeyed, no_purge()),
        &[C1, P8E],
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
    pinned(&[(unique, 309_154)]);
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
        &[C1, P8E],
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
    pinned(&[(unique, 641_604)]);
}

#[test]
fn unkeyed_rerun_executes_twice() {
    let unique = guarantees(
        "unkeyed re-run A/B",
        ab(EffectMode::UnkeyedReRun, Bounds::default()),
        &[C1, C1O, P1, P5A, P8E],
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
    pinned(&[(unique, 795_218)]);
}

#[test]
fn unkeyed_outcome_unknown_runs_at_most_once() {
    let unique = guarantees(
        "unkeyed outcome-unknown A/B",
        ab(EffectMode::UnkeyedOutcomeUnknown, Bounds::default()),
        &[C1, P8E],
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
    pinned(&[(unique, 378_000)]);
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
        &[C1, P8E],
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
    pinned(&[(unique, 888_864)]);
}

#[test]
fn handler_failures_and_heartbeats() {
    let mut pins = Vec::new();
    let unique = guarantees(
        "outcome-unknown A/B, failures + heartbeats",
        ab(EffectMode::UnkeyedOutcomeUnknown, failures()).with_liveness(),
        &[P8E],
        &[W_MISMATCH, W_STALE_REJECTED, W_RERUN_TTL, W_EXHAUSTED],
    );
    pins.push((unique, 46_790));
    let unique = guarantees(
        "re-run A/B, failures + heartbeats",
        ab(EffectMode::UnkeyedReRun, failures()).with_liveness(),
        &[P8E],
        &[W_MISMATCH, W_STALE_REJECTED, W_RERUN_TTL, W_EXHAUSTED],
    );
    pins.push((unique, 39_386));
    let unique = guarantees(
        "transactional A/B, failures + heartbeats",
        ab(EffectMode::Transactional, failures()).with_liveness(),
        &[],
        &[W_MISMATCH, W_RERUN_TTL, W_EXHAUSTED, W_LOCK_WAIT],
    );
    pins.push((unique, 3_212));
    pinned(&pins);
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
        &[P2, P4, C2],
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
    let mut pins = Vec::new();
    let unique = guarantees(
        "outcome-unknown A/B, 1 store fault",
        ab(EffectMode::UnkeyedOutcomeUnknown, store_faults()),
        &[C1, P8E],
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
    pins.push((unique, 712_960));
    // The host that ignores core's cleanup (before it existed): the same guarantees, minus the
    // cleanup witness, in exactly the state space measured before the cleanup was modelled.
    let unique = guarantees(
        "outcome-unknown A/B, 1 store fault, host ignores the cleanup",
        ab(EffectMode::UnkeyedOutcomeUnknown, store_faults()).with_variant(Variant::NoCleanup),
        &[C1, P8E],
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
    pins.push((unique, 393_128));
    let unique = guarantees(
        "downstream-keyed A/B, 1 store fault, no purge",
        ab(
            EffectMode::DownstreamKeyed,
            Bounds {
                purge: false,
                ..store_faults()
            },
        ),
        &[C1, P8E],
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
    pins.push((unique, 620_654));
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
    pins.push((unique, 177_622));
    pinned(&pins);
}

#[test]
fn cache_in_front_replays_only_the_live_generation() {
    let mut pins = Vec::new();
    let unique = guarantees(
        "outcome-unknown A/B, cache",
        ab(EffectMode::UnkeyedOutcomeUnknown, cached()),
        &[C1, P8E],
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
    pins.push((unique, 249_592));
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
    pins.push((unique, 265_220));
    pinned(&pins);
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

/// Two clients sending the same body: a duplicate arrives while the first request's handler
/// runs and heartbeats (renewals meet a same-body duplicate's read, takeover or mark), with
/// handler failures; the liveness property on every state.
#[test]
fn heartbeats_meet_a_same_body_duplicate() {
    let mut pins = Vec::new();
    let unique = guarantees(
        "outcome-unknown A/A, failures + heartbeats, liveness",
        aa(EffectMode::UnkeyedOutcomeUnknown, failures()).with_liveness(),
        &[C1, P8E],
        &[
            W_REPLAY,
            W_IN_FLIGHT,
            W_OUTCOME_UNKNOWN,
            W_STALE_REJECTED,
            W_RERUN_TTL,
            W_EXHAUSTED,
        ],
    );
    pins.push((unique, 90_442));
    let unique = guarantees(
        "re-run A/A, failures + heartbeats, liveness",
        aa(EffectMode::UnkeyedReRun, failures()).with_liveness(),
        &[C1, C1O, P1, P5A, P8E],
        &[
            W_REPLAY,
            W_IN_FLIGHT,
            W_TAKEOVER,
            W_STALE_REJECTED,
            W_RERUN_TTL,
            W_EXHAUSTED,
        ],
    );
    pins.push((unique, 135_852));
    pinned(&pins);
}

/// A lease (3 ticks) longer than the TTL (2 ticks): a claim's record lives as long as its lease
/// (`expires_at = now + max(ttl, lease)`), a completion keeps the TTL; clock to 4; liveness on.
/// An expired lease is then always an expired record: no takeover or mark-unknown is reachable,
/// the next attempt claims a new generation (`spec/MODEL.md` §4.4; the re-run mode explores the
/// very same 348,993 states and fails the same properties, so it is not repeated here).
#[test]
fn lease_longer_than_ttl() {
    let mut pins = Vec::new();
    let long = Bounds {
        lease: 3,
        ttl: 2,
        t_max: 4,
        ..Bounds::default()
    };
    let unique = guarantees(
        "outcome-unknown A/B, lease 3 > TTL 2, liveness",
        ab(EffectMode::UnkeyedOutcomeUnknown, long).with_liveness(),
        &[C1, P8E],
        &[
            W_REPLAY,
            W_IN_FLIGHT,
            W_MISMATCH,
            W_STALE_REJECTED,
            W_RERUN_TTL,
            W_EXHAUSTED,
        ],
    );
    pins.push((unique, 348_993));
    let unique = guarantees(
        "transactional A/B, lease 3 > TTL 2, liveness",
        ab(EffectMode::Transactional, long).with_liveness(),
        &[],
        &[W_REPLAY, W_MISMATCH, W_RERUN_TTL, W_EXHAUSTED, W_LOCK_WAIT],
    );
    pins.push((unique, 154_897));
    pinned(&pins);
}

/// Core's abandon (after a handler that may have acted failed) done as a release: a retry of the
/// same request runs it again at once. P1 counts per generation instance and a release starts a
/// new one, so P1 holds; the contract's C1 (per request, within the retention window) fails.
#[test]
fn mutation_abandon_as_release_runs_a_request_twice() {
    let model =
        aa(EffectMode::UnkeyedOutcomeUnknown, failures()).with_variant(Variant::AbandonReleases);
    guarantees(
        "abandon done as a release",
        model.clone(),
        &[C1, C1O, C1R, C4, P8E],
        &[
            W_REPLAY,
            W_IN_FLIGHT,
            W_OUTCOME_UNKNOWN,
            W_STALE_REJECTED,
            W_RERUN_TTL,
            W_EXHAUSTED,
        ],
    );
    assert_eq!(
        mutation("abandon done as a release", model, &[C1, C1O, C1R]),
        8
    );
}

/// A takeover that renews the lease but keeps the old token: the record's token is the paused
/// owner's, so P8 (which compares with the record) sees nothing; C3 compares with the latest
/// token granted.
#[test]
fn mutation_takeover_keeping_the_token_breaks_fencing() {
    let depth = mutation(
        "takeover keeps the old token",
        aa(EffectMode::UnkeyedReRun, Bounds::default()).with_variant(Variant::TakeoverKeepsToken),
        &[C3],
    );
    assert_eq!(depth, 9);
}

#[test]
fn mutation_renew_without_token_is_a_write_without_its_precondition() {
    let depth = mutation(
        "renew without token check",
        aa(EffectMode::UnkeyedReRun, failures()).with_variant(Variant::RenewWithoutToken),
        &[C4, C3],
    );
    assert_eq!(depth, 8);
}

#[test]
fn mutation_execute_before_admission_runs_a_mismatch() {
    let depth = mutation(
        "side effect before the store is consulted",
        ab(EffectMode::UnkeyedOutcomeUnknown, Bounds::default())
            .with_variant(Variant::ExecuteBeforeAdmission),
        &[P3],
    );
    assert_eq!(depth, 4);
}

#[test]
fn mutation_unconditional_complete_overwrites_a_completed_response() {
    let depth = mutation(
        "complete without any condition",
        aa(EffectMode::UnkeyedReRun, Bounds::default())
            .with_variant(Variant::CompleteUnconditional),
        &[P5],
    );
    assert_eq!(depth, 12);
}

#[test]
fn mutation_scope_of_the_first_client_crosses_scopes() {
    let depth = mutation(
        "scope built from the first client's principal",
        IdempoModel::new(
            EffectMode::DownstreamKeyed,
            &[ALICE_A, BOB_A],
            Bounds {
                max_crashes: 0,
                ..Bounds::default()
            },
        )
        .with_variant(Variant::ScopeOfFirstClient),
        &[P6],
    );
    assert_eq!(depth, 2);
}

/// An adapter that reads `lease_until` from `expires_at`: an expired lease looks live, a
/// duplicate gets 409 where it should take over or mark (P7, P7x), and a retrying client waits
/// longer than a lease (L).
#[test]
fn mutation_lease_read_as_expiry_answers_409_and_keeps_clients_waiting() {
    let depth = mutation(
        "lease read from expires_at",
        aa(EffectMode::UnkeyedOutcomeUnknown, Bounds::default())
            .with_variant(Variant::LeaseReadAsExpiry)
            .with_liveness(),
        &[P7, P7X, L],
    );
    assert_eq!(depth, 5);
}

#[test]
fn mutation_completion_answer_misreported_is_refused_by_the_flow() {
    let depth = mutation(
        "completion answered with the wrong result type",
        ab(EffectMode::UnkeyedOutcomeUnknown, Bounds::default())
            .with_variant(Variant::ResultMisreported),
        &[F],
    );
    assert_eq!(depth, 5);
}
