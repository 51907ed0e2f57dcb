//! Deep tier of the stateright model: larger configurations, depth-first on two threads.
//!
//! Ignored by default; run with `make model-deep` (one test at a time; the `open_` bound that has
//! never finished is left to `make model-deep-open`). Each run is exhaustive
//! and asserts the same exact guarantee table as the fast tier; state counts are printed and
//! recorded in `spec/MODEL.md`, not pinned.
use idempo_tests::model::harness::{Search, guarantees};
use idempo_tests::model::props::*;
use idempo_tests::model::{Bounds, ClientSpec, EffectMode, IdempoModel};

const ALICE_A: ClientSpec = ClientSpec {
    principal: "alice",
    body: r#"{"amount":100,"to":"acct-1"}"#,
};
const ALICE_B: ClientSpec = ClientSpec {
    principal: "alice",
    body: r#"{"amount":250,"to":"acct-1"}"#,
};
const BOB_A: ClientSpec = ClientSpec {
    principal: "bob",
    body: r#"{"amount":100,"to":"acct-1"}"#,
};

const DEEP: Search = Search::Dfs(2);

fn failures_and_heartbeats() -> Bounds {
    Bounds {
        failures: true,
        heartbeats: true,
        ..Bounds::default()
    }
}

#[test]
#[ignore = "deep tier: make model-deep"]
fn deep_outcome_unknown_with_failures_and_heartbeats() {
    guarantees(
        "deep: outcome-unknown A/B, failures + heartbeats, 1 retry",
        IdempoModel::new(
            EffectMode::UnkeyedOutcomeUnknown,
            &[ALICE_A, ALICE_B],
            failures_and_heartbeats(),
        ),
        DEEP,
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
}

#[test]
#[ignore = "deep tier: make model-deep"]
fn deep_rerun_with_failures_and_heartbeats() {
    guarantees(
        "deep: unkeyed re-run A/B, failures + heartbeats, 1 retry",
        IdempoModel::new(
            EffectMode::UnkeyedReRun,
            &[ALICE_A, ALICE_B],
            failures_and_heartbeats(),
        ),
        DEEP,
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
}

#[test]
#[ignore = "deep tier: make model-deep"]
fn deep_two_scopes_with_crash() {
    guarantees(
        "deep: downstream-keyed alice-A/bob-A, 1 crash",
        IdempoModel::new(
            EffectMode::DownstreamKeyed,
            &[ALICE_A, BOB_A],
            Bounds::default(),
        ),
        DEEP,
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
}

/// Open: this bound has never finished (over 35 minutes on 2 cores, spec/MODEL.md §6), so
/// `make model-deep` skips it (`--skip open_`) and the verb ends; run it on its own with
/// `make model-deep-open`. The bound below it is the three-client one that finishes.
#[test]
#[ignore = "open: make model-deep-open (has not finished)"]
fn open_transactional_three_clients_two_scopes() {
    guarantees(
        "deep: transactional alice-A/alice-B/bob-A, 2 retries, clock 4",
        IdempoModel::new(
            EffectMode::Transactional,
            &[ALICE_A, ALICE_B, BOB_A],
            Bounds {
                retries: 2,
                t_max: 4,
                ..Bounds::default()
            },
        ),
        DEEP,
        &[],
        &[
            W_REPLAY,
            W_MISMATCH,
            W_RERUN_TTL,
            W_EXHAUSTED,
            W_BOTH_SCOPES,
            W_LOCK_WAIT,
        ],
    );
}

/// Three clients on one key (the duplicate and the mismatch racing the first request), within
/// the default bounds: the three-client transactional bound that finishes (the one above, with a
/// second scope, two retries and a longer clock, has not).
#[test]
#[ignore = "deep tier: make model-deep"]
fn deep_transactional_three_clients_one_key() {
    guarantees(
        "deep: transactional alice-A/alice-A/alice-B",
        IdempoModel::new(
            EffectMode::Transactional,
            &[ALICE_A, ALICE_A, ALICE_B],
            Bounds::default(),
        ),
        DEEP,
        &[],
        &[W_REPLAY, W_MISMATCH, W_RERUN_TTL, W_EXHAUSTED, W_LOCK_WAIT],
    );
}

/// The same three clients, each on a worker of its own: all three requests in flight at once.
#[test]
#[ignore = "deep tier: make model-deep"]
fn deep_transactional_three_clients_three_workers() {
    guarantees(
        "deep: transactional alice-A/alice-A/alice-B, 3 workers",
        IdempoModel::new(
            EffectMode::Transactional,
            &[ALICE_A, ALICE_A, ALICE_B],
            Bounds {
                workers: 3,
                ..Bounds::default()
            },
        ),
        DEEP,
        &[],
        &[W_REPLAY, W_MISMATCH, W_RERUN_TTL, W_EXHAUSTED, W_LOCK_WAIT],
    );
}

#[test]
#[ignore = "deep tier: make model-deep"]
fn deep_outcome_unknown_three_clients() {
    guarantees(
        "deep: outcome-unknown alice-A/alice-A/alice-B",
        IdempoModel::new(
            EffectMode::UnkeyedOutcomeUnknown,
            &[ALICE_A, ALICE_A, ALICE_B],
            Bounds::default(),
        ),
        DEEP,
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
}

#[test]
#[ignore = "deep tier: make model-deep"]
fn deep_downstream_keyed_more_retries_and_crashes() {
    guarantees(
        "deep: downstream-keyed A/B, no purge, 2 retries, 2 crashes, clock 4",
        IdempoModel::new(
            EffectMode::DownstreamKeyed,
            &[ALICE_A, ALICE_B],
            Bounds {
                retries: 2,
                t_max: 4,
                max_crashes: 2,
                purge: false,
                ..Bounds::default()
            },
        ),
        DEEP,
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
}

#[test]
#[ignore = "deep tier: make model-deep"]
fn deep_outcome_unknown_two_store_faults_and_a_crash() {
    guarantees(
        "deep: outcome-unknown A/B, 2 store faults, 1 crash",
        IdempoModel::new(
            EffectMode::UnkeyedOutcomeUnknown,
            &[ALICE_A, ALICE_B],
            Bounds {
                store_faults: 2,
                ..Bounds::default()
            },
        ),
        DEEP,
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
}

#[test]
#[ignore = "deep tier: make model-deep"]
fn deep_outcome_unknown_cache_with_a_store_fault_and_a_crash() {
    guarantees(
        "deep: outcome-unknown A/B, cache, 1 store fault, 1 crash",
        IdempoModel::new(
            EffectMode::UnkeyedOutcomeUnknown,
            &[ALICE_A, ALICE_B],
            Bounds {
                store_faults: 1,
                cache: Some(3),
                ..Bounds::default()
            },
        ),
        DEEP,
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
            W_CACHE_HIT,
            W_CACHE_MISMATCH,
        ],
    );
}

#[test]
#[ignore = "deep tier: make model-deep"]
fn deep_transactional_store_faults_failures_and_retries() {
    guarantees(
        "deep: transactional A/B, 2 store faults, handler failures, 2 retries",
        IdempoModel::new(
            EffectMode::Transactional,
            &[ALICE_A, ALICE_B],
            Bounds {
                store_faults: 2,
                retries: 2,
                ..failures_and_heartbeats()
            },
        ),
        DEEP,
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
}

#[test]
#[ignore = "deep tier: make model-deep"]
fn deep_downstream_keyed_store_fault_crash_and_purge() {
    guarantees(
        "deep: downstream-keyed A/B, 1 store fault, 1 crash, purge",
        IdempoModel::new(
            EffectMode::DownstreamKeyed,
            &[ALICE_A, ALICE_B],
            Bounds {
                store_faults: 1,
                ..Bounds::default()
            },
        ),
        DEEP,
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
}
