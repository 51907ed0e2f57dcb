//! The sans-IO server flow driven against the reference in-memory store, with interleavings
//! of two requests under one key.
use std::sync::Arc;

use idempo_core::machine::{
    Action, Event, FlowError, HandlerResponse, MissingKey, Outcome, RunHandler, ServerFlow,
    StoreOp, StoreResult, downstream_key, missing_key,
};
use idempo_core::policy::{Config, KeyRequirement, LeasePolicy, TakeoverPolicy};
use idempo_core::record::{FingerprintText, RecordState};
use idempo_core::scope::ScopeId;
use idempo_tests::memstore::MemStore;

fn scope() -> ScopeId {
    ScopeId::from_parts("user-1", "POST", "/payments", "key-0001")
}

fn fp(s: &str) -> FingerprintText {
    FingerprintText::new(s).expect("valid fingerprint")
}

fn cfg(takeover: TakeoverPolicy) -> Arc<Config> {
    Arc::new(Config {
        takeover,
        lease: LeasePolicy::new(5_000, Some(2_000)).expect("valid lease"),
        ..Config::default()
    })
}

fn ok(body: &str) -> HandlerResponse {
    HandlerResponse {
        status: 201,
        headers: vec![
            ("Content-Type".into(), "application/json".into()),
            ("Set-Cookie".into(), "session=secret".into()),
            ("Location".into(), "/payments/1".into()),
        ],
        body: body.as_bytes().to_vec(),
        ..HandlerResponse::new(201, vec![], vec![])
    }
}

/// Runs store actions until the flow asks to run the handler or answers.
fn admit(store: &mut MemStore, flow: &mut ServerFlow, mut action: Action) -> Action {
    loop {
        match action {
            Action::Store(op) => {
                action = flow.handle(store.execute(op)).expect("valid event");
            }
            other => return other,
        }
    }
}

/// Feeds an event and runs the resulting store actions to the end.
fn finish(store: &mut MemStore, flow: &mut ServerFlow, event: Event) -> Action {
    let action = flow.handle(event).expect("valid event");
    admit(store, flow, action)
}

fn start(store: &mut MemStore, c: &Arc<Config>, f: &str, entropy: u8) -> (ServerFlow, Action) {
    let (mut flow, first) = ServerFlow::start(scope(), fp(f), c.clone(), [entropy; 16]);
    let next = admit(store, &mut flow, first);
    (flow, next)
}

fn respond(a: Action) -> (u16, Vec<(String, String)>, Vec<u8>, Outcome) {
    match a {
        Action::Respond { response, outcome } => {
            (response.status, response.headers, response.body, outcome)
        }
        other => panic!("expected a response, got {other:?}"),
    }
}

fn run(a: Action) -> RunHandler {
    match a {
        Action::RunHandler(r) => r,
        other => panic!("expected RunHandler, got {other:?}"),
    }
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

fn problem_type(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).expect("problem JSON");
    v["type"].as_str().expect("type member").to_owned()
}

#[test]
fn new_then_replay_then_mismatch() {
    let c = cfg(TakeoverPolicy::OutcomeUnknown);
    let mut store = MemStore::new(1_000);
    let (mut a, act) = start(&mut store, &c, "v1:aa", 1);
    let r = run(act);
    assert_eq!(r.generation, 1);
    assert_eq!(r.downstream_key, downstream_key(&scope(), &fp("v1:aa"), 1));
    assert_eq!(r.heartbeat_ms, Some(2_000));
    let (status, headers, body, outcome) = respond(finish(
        &mut store,
        &mut a,
        Event::HandlerFinished(ok("one")),
    ));
    assert_eq!((status, outcome), (201, Outcome::Stored));
    assert_eq!(
        header(&headers, "set-cookie"),
        Some("session=secret"),
        "live client gets every header"
    );
    assert_eq!(body, b"one");
    assert!(a.is_finished());
    assert_eq!(a.handle(Event::HeartbeatDue), Err(FlowError::Finished));

    store.advance(10);
    let (_, act) = start(&mut store, &c, "v1:aa", 2);
    let (status, headers, body, outcome) = respond(act);
    assert_eq!((status, outcome), (201, Outcome::Replayed));
    assert_eq!(body, b"one");
    assert_eq!(header(&headers, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&headers, "location"), Some("/payments/1"));
    assert_eq!(header(&headers, "set-cookie"), None, "never stored");

    let (_, act) = start(&mut store, &c, "v1:bb", 3);
    let (status, _, body, outcome) = respond(act);
    assert_eq!((status, outcome), (422, Outcome::Mismatch));
    assert_eq!(problem_type(&body), "urn:idempo:problem:key-reused");
}

#[test]
fn concurrent_duplicate_gets_409_then_replay() {
    let c = cfg(TakeoverPolicy::OutcomeUnknown);
    let mut store = MemStore::new(0);
    let (mut a, act) = start(&mut store, &c, "v1:aa", 1);
    let _ = run(act);
    store.advance(4_700);
    let (_, act) = start(&mut store, &c, "v1:aa", 2);
    let (status, headers, body, outcome) = respond(act);
    assert_eq!((status, outcome), (409, Outcome::InFlight));
    assert_eq!(header(&headers, "retry-after"), Some("1"));
    assert_eq!(problem_type(&body), "urn:idempo:problem:in-flight");
    // a different body under the same key is a mismatch even while in progress
    let (_, act) = start(&mut store, &c, "v1:bb", 3);
    assert_eq!(respond(act).3, Outcome::Mismatch);
    assert_eq!(
        respond(finish(&mut store, &mut a, Event::HandlerFinished(ok("x")))).3,
        Outcome::Stored
    );
    let (_, act) = start(&mut store, &c, "v1:aa", 2);
    assert_eq!(respond(act).3, Outcome::Replayed);
}

#[test]
fn heartbeat_keeps_the_lease_and_detects_loss() {
    let c = cfg(TakeoverPolicy::ReRun);
    let mut store = MemStore::new(0);
    let (mut a, act) = start(&mut store, &c, "v1:aa", 1);
    let _ = run(act);
    for _ in 0..5 {
        store.advance(2_000);
        let act = flow_step(&mut store, &mut a, Event::HeartbeatDue);
        assert_eq!(act, Action::Wait);
    }
    // 10 s in, lease 5 s: still in flight thanks to the heartbeats
    let (_, act) = start(&mut store, &c, "v1:aa", 2);
    assert_eq!(respond(act).3, Outcome::InFlight);
    // a paused worker: the lease lapses, B takes over
    store.advance(5_000);
    let (mut b, act) = start(&mut store, &c, "v1:aa", 2);
    let rb = run(act);
    assert_eq!(rb.generation, 1, "takeover keeps the generation");
    assert_eq!(rb.downstream_key, downstream_key(&scope(), &fp("v1:aa"), 1));
    // A wakes up: its heartbeat fails, it is told, and its completion never lands
    assert_eq!(
        flow_step(&mut store, &mut a, Event::HeartbeatDue),
        Action::LeaseLost
    );
    assert_eq!(a.handle(Event::HeartbeatDue), Ok(Action::Wait));
    let (_, _, _, outcome) = respond(finish(
        &mut store,
        &mut a,
        Event::HandlerFinished(ok("stale")),
    ));
    assert_eq!(outcome, Outcome::LeaseLost);
    let (_, _, _, outcome) = respond(finish(
        &mut store,
        &mut b,
        Event::HandlerFinished(ok("fresh")),
    ));
    assert_eq!(outcome, Outcome::Stored);
    let (_, act) = start(&mut store, &c, "v1:aa", 3);
    let (_, _, body, outcome) = respond(act);
    assert_eq!(
        (body.as_slice(), outcome),
        (&b"fresh"[..], Outcome::Replayed)
    );
}

fn flow_step(store: &mut MemStore, flow: &mut ServerFlow, event: Event) -> Action {
    finish(store, flow, event)
}

#[test]
fn stale_owner_completion_is_rejected_without_heartbeat() {
    let c = cfg(TakeoverPolicy::ReRun);
    let mut store = MemStore::new(0);
    let (mut a, act) = start(&mut store, &c, "v1:aa", 1);
    let _ = run(act);
    store.advance(5_000); // lease_until == now: expired
    let (mut b, act) = start(&mut store, &c, "v1:aa", 2);
    let _ = run(act);
    assert_eq!(
        respond(finish(&mut store, &mut a, Event::HandlerFinished(ok("a")))).3,
        Outcome::LeaseLost
    );
    assert_eq!(
        respond(finish(&mut store, &mut b, Event::HandlerFinished(ok("b")))).3,
        Outcome::Stored
    );
    match &store.peek(&scope()).expect("record").state {
        RecordState::Completed { response } => assert_eq!(response.body, b"b"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn expired_lease_under_outcome_unknown_policy() {
    let c = cfg(TakeoverPolicy::OutcomeUnknown);
    let mut store = MemStore::new(0);
    let (mut a, act) = start(&mut store, &c, "v1:aa", 1);
    let _ = run(act);
    store.advance(6_000);
    let (_, act) = start(&mut store, &c, "v1:aa", 2);
    let (status, _, body, outcome) = respond(act);
    assert_eq!((status, outcome), (500, Outcome::OutcomeUnknown));
    assert_eq!(problem_type(&body), "urn:idempo:problem:outcome-unknown");
    assert_eq!(
        store.peek(&scope()).map(|r| r.state.clone()),
        Some(RecordState::OutcomeUnknown)
    );
    assert_eq!(
        respond(finish(
            &mut store,
            &mut a,
            Event::HandlerFinished(ok("late"))
        ))
        .3,
        Outcome::LeaseLost
    );
    let (_, act) = start(&mut store, &c, "v1:aa", 3);
    assert_eq!(respond(act).3, Outcome::OutcomeUnknown);
    // after the TTL the key is a new operation, generation 2
    store.advance(c.ttl_ms.get());
    let (_, act) = start(&mut store, &c, "v1:aa", 4);
    let r = run(act);
    assert_eq!(r.generation, 2);
    assert_ne!(r.downstream_key, downstream_key(&scope(), &fp("v1:aa"), 1));
}

#[test]
fn server_error_releases_the_key_and_a_retry_runs_again() {
    let c = cfg(TakeoverPolicy::OutcomeUnknown);
    let mut store = MemStore::new(0);
    let (mut a, act) = start(&mut store, &c, "v1:aa", 1);
    let _ = run(act);
    let resp = HandlerResponse {
        status: 500,
        ..ok("boom")
    };
    let (status, _, _, outcome) = respond(finish(&mut store, &mut a, Event::HandlerFinished(resp)));
    assert_eq!((status, outcome), (500, Outcome::NotStored));
    assert!(store.is_empty());
    let (_, act) = start(&mut store, &c, "v1:aa", 2);
    assert_eq!(run(act).generation, 1);
}

#[test]
fn handler_failure_paths() {
    // no side effect: released, a retry runs again
    let c = cfg(TakeoverPolicy::OutcomeUnknown);
    let mut store = MemStore::new(0);
    let (mut a, act) = start(&mut store, &c, "v1:aa", 1);
    let _ = run(act);
    let act = finish(
        &mut store,
        &mut a,
        Event::HandlerFailed {
            maybe_side_effect: false,
        },
    );
    assert_eq!(
        act,
        Action::PropagateError {
            outcome: Outcome::HandlerFailed
        }
    );
    assert!(store.is_empty());

    // maybe a side effect, outcome-unknown policy: terminal at once
    let (mut a, act) = start(&mut store, &c, "v1:aa", 2);
    let _ = run(act);
    let act = finish(
        &mut store,
        &mut a,
        Event::HandlerFailed {
            maybe_side_effect: true,
        },
    );
    assert_eq!(
        act,
        Action::PropagateError {
            outcome: Outcome::HandlerFailed
        }
    );
    assert_eq!(
        store.peek(&scope()).map(|r| r.state.clone()),
        Some(RecordState::OutcomeUnknown)
    );

    // maybe a side effect, re-run policy: the lease is expired, the next retry takes over
    let c = cfg(TakeoverPolicy::ReRun);
    let mut store = MemStore::new(0);
    let (mut a, act) = start(&mut store, &c, "v1:aa", 1);
    let _ = run(act);
    let _ = finish(
        &mut store,
        &mut a,
        Event::HandlerFailed {
            maybe_side_effect: true,
        },
    );
    let (_, act) = start(&mut store, &c, "v1:aa", 2);
    let r = run(act);
    assert_eq!((r.generation, r.token.0), (1, [2; 16]));
}

#[test]
fn store_down_fails_closed() {
    let c = cfg(TakeoverPolicy::OutcomeUnknown);
    let mut store = MemStore::new(0);
    store.down = true;
    let (_, act) = start(&mut store, &c, "v1:aa", 1);
    let (status, headers, body, outcome) = respond(act);
    assert_eq!((status, outcome), (503, Outcome::StoreUnavailable));
    assert_eq!(header(&headers, "retry-after"), Some("1"));
    assert_eq!(problem_type(&body), "urn:idempo:problem:store-unavailable");

    // the store fails while completing: the client still gets the handler's response
    store.down = false;
    let (mut a, act) = start(&mut store, &c, "v1:aa", 1);
    let _ = run(act);
    store.down = true;
    let (status, _, _, outcome) =
        respond(finish(&mut store, &mut a, Event::HandlerFinished(ok("x"))));
    assert_eq!((status, outcome), (201, Outcome::CompletionFailed));
}

#[test]
fn redacted_copy_is_stored_and_replayed() {
    let c = cfg(TakeoverPolicy::OutcomeUnknown);
    let mut store = MemStore::new(0);
    let (mut a, act) = start(&mut store, &c, "v1:aa", 1);
    let _ = run(act);
    let resp = HandlerResponse {
        body_to_store: Some(b"{\"card\":\"****\"}".to_vec()),
        ..ok("{\"card\":\"4242424242424242\"}")
    };
    let (_, _, body, _) = respond(finish(&mut store, &mut a, Event::HandlerFinished(resp)));
    assert_eq!(body, b"{\"card\":\"4242424242424242\"}");
    let (_, act) = start(&mut store, &c, "v1:aa", 2);
    assert_eq!(respond(act).2, b"{\"card\":\"****\"}");
}

#[test]
fn oversized_response_is_not_retained() {
    let c = cfg(TakeoverPolicy::OutcomeUnknown);
    let mut store = MemStore::new(0);
    let (mut a, act) = start(&mut store, &c, "v1:aa", 1);
    let _ = run(act);
    let big = "x".repeat(c.response.max_body_bytes() + 1);
    let (status, _, body, outcome) =
        respond(finish(&mut store, &mut a, Event::HandlerFinished(ok(&big))));
    assert_eq!(
        (status, body.len(), outcome),
        (201, big.len(), Outcome::NotRetained)
    );
    // Under either policy every retry replays the response-not-retained problem.
    for policy in [TakeoverPolicy::OutcomeUnknown, TakeoverPolicy::ReRun] {
        let (_, act) = start(&mut store, &cfg(policy), "v1:aa", 2);
        let (status, _, body, outcome) = respond(act);
        assert_eq!((status, outcome), (500, Outcome::Replayed));
        let problem: serde_json::Value = serde_json::from_slice(&body).expect("problem JSON");
        assert_eq!(problem["type"], "urn:idempo:problem:response-not-retained");
    }
}

#[test]
fn vanishing_record_is_bounded_by_contention() {
    let c = cfg(TakeoverPolicy::ReRun);
    let (mut flow, mut act) = ServerFlow::start(scope(), fp("v1:aa"), c.clone(), [9; 16]);
    // a record whose lease expired keeps being replaced by another worker's takeover
    let mut store = MemStore::new(0);
    let (mut other, o) = ServerFlow::start(scope(), fp("v1:aa"), c.clone(), [1; 16]);
    let _ = run(admit(&mut store, &mut other, o));
    store.advance(5_000);
    let record = store.peek(&scope()).cloned().expect("record");
    let mut rounds = 0;
    loop {
        act = match act {
            Action::Store(StoreOp::Claim { .. }) => flow
                .handle(Event::Store(StoreResult::Existing {
                    record: record.clone(),
                    now_ms: 5_000,
                }))
                .expect("valid"),
            Action::Store(StoreOp::TakeOver { .. }) => flow
                .handle(Event::Store(StoreResult::TookOver(None)))
                .expect("valid"),
            Action::Store(StoreOp::Get { .. }) => flow
                .handle(Event::Store(StoreResult::Got {
                    record: None,
                    now_ms: 5_000,
                }))
                .expect("valid"),
            Action::Respond { response, outcome } => {
                assert_eq!((response.status, outcome), (503, Outcome::Contention));
                break;
            }
            other => panic!("unexpected {other:?}"),
        };
        rounds += 1;
        assert!(rounds < 20, "the loop must be bounded");
    }
    // claim, takeover, get, claim, takeover -> contention (3 reads)
    assert_eq!(rounds, 5);
}

#[test]
fn unexpected_events_are_errors_and_leave_the_flow_unchanged() {
    let c = cfg(TakeoverPolicy::ReRun);
    let (mut flow, first) = ServerFlow::start(scope(), fp("v1:aa"), c, [1; 16]);
    assert!(matches!(first, Action::Store(StoreOp::Claim { .. })));
    let err = flow
        .handle(Event::HandlerFailed {
            maybe_side_effect: false,
        })
        .expect_err("not valid while claiming");
    assert_eq!(
        err,
        FlowError::UnexpectedEvent {
            phase: "claiming",
            event: "handler_failed"
        }
    );
    let act = flow
        .handle(Event::Store(StoreResult::Claimed {
            generation: 1,
            now_ms: 0,
        }))
        .expect("still claiming");
    assert!(matches!(act, Action::RunHandler(_)));
}

#[test]
fn missing_key_per_route() {
    match missing_key(&Config::default()) {
        MissingKey::Reject(r) => {
            assert_eq!(r.status, 400);
            assert_eq!(problem_type(&r.body), "urn:idempo:problem:missing-key");
        }
        MissingKey::RunUnprotected => panic!("required by default"),
    }
    let optional = Config {
        key: KeyRequirement::Optional,
        ..Config::default()
    };
    assert_eq!(missing_key(&optional), MissingKey::RunUnprotected);
}

#[test]
fn downstream_key_separates_bodies_across_a_purge() {
    // A purge restarts the generation at 1: two different bodies under one key must still get
    // different downstream keys, or the second would be answered with the first one's effect.
    let a = downstream_key(&scope(), &fp("v1:aa"), 1);
    let b = downstream_key(&scope(), &fp("v1:bb"), 1);
    assert_ne!(a, b);
    assert_eq!(a, downstream_key(&scope(), &fp("v1:aa"), 1));
    assert_ne!(a, downstream_key(&scope(), &fp("v1:aa"), 2));
}
