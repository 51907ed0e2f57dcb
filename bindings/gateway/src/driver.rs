//! The flow driver: runs core's [`ServerFlow`] for one admitted request. Core asks for store
//! operations, "run the handler" (here: the upstream exchange, with the downstream key in a
//! header), heartbeats while it runs, and says what to answer; the driver executes each action
//! and feeds the result back, then runs core's [`Cleanup`] in the background when the flow
//! leaves one. It decides nothing itself.
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response};
use idempo_core::machine::problem::{ProblemKind, problem_response};
use idempo_core::machine::{
    Action, Admitted, Cleanup, CleanupStep, Event, FlowError, Outcome, ServerFlow, StoreOp,
    StoreResult,
};
use serde_json::json;
use tokio::sync::oneshot;

use crate::body::{BoxBody, to_hyper};
use crate::config::RouteConfig;
use crate::exchange::{ExchangeEnd, UpstreamFailure, exchange};
use crate::log;
use crate::proxy::Shared;

/// One store primitive, timed and counted; a failure is [`Event::StoreFailed`].
async fn run_op(shared: &Shared, route: &str, admitted: &Admitted, op: StoreOp) -> Event {
    let name = op.name();
    let partition = Some(admitted.partition);
    let started = Instant::now();
    let result = shared.store.run(op, partition).await;
    shared
        .metrics
        .store_latency(name, started.elapsed().as_secs_f64());
    match result {
        Ok(r) => Event::Store(r),
        Err(e) => {
            shared.metrics.store_error(route, name);
            log::warn(
                "store primitive failed",
                &[
                    ("route", json!(route)),
                    ("op", json!(name)),
                    ("error", json!(e.to_string())),
                ],
            );
            Event::StoreFailed
        }
    }
}

/// Executes store actions until the flow asks for something else.
async fn settle(
    shared: &Shared,
    route: &str,
    admitted: &Admitted,
    flow: &mut ServerFlow,
    mut action: Action,
) -> Result<Action, FlowError> {
    loop {
        let Action::Store(op) = action else {
            return Ok(action);
        };
        let takeover = matches!(op, StoreOp::TakeOver { .. });
        let event = run_op(shared, route, admitted, op).await;
        if takeover && matches!(event, Event::Store(StoreResult::TookOver(Some(_)))) {
            shared.metrics.takeover(route);
        }
        action = flow.handle(event)?;
    }
}

/// The gateway's error page when the upstream gave no whole response and core says to
/// re-raise (`PropagateError`): 504 after a timeout, else 502. Not an idempo problem: core has
/// recorded what the failure means for the key (released, or outcome-unknown per its takeover
/// policy), and retries get core's answer.
fn upstream_error(failure: Option<UpstreamFailure>) -> Response<BoxBody> {
    let (status, title) = match failure {
        Some(UpstreamFailure::Timeout) => (504, "Gateway Timeout"),
        _ => (502, "Bad Gateway"),
    };
    let detail = match failure {
        Some(UpstreamFailure::Connect) => "The upstream service could not be reached.",
        Some(UpstreamFailure::Timeout) => "The upstream service did not answer in time.",
        _ => "The upstream service's connection failed before its response was complete.",
    };
    let body = json!({"type": "about:blank", "title": title, "status": status, "detail": detail});
    to_hyper(idempo_core::machine::HttpResponse {
        status,
        headers: vec![(
            "content-type".to_owned(),
            idempo_core::machine::problem::PROBLEM_CONTENT_TYPE.to_owned(),
        )],
        body: body.to_string().into_bytes(),
    })
}

fn unavailable(route: &RouteConfig) -> Response<BoxBody> {
    to_hyper(problem_response(
        ProblemKind::StoreUnavailable,
        None,
        None,
        Some(route.config.unavailable_retry_after_ms.get()),
    ))
}

/// The upstream exchange with the client's response sender it hands back.
type ExchangeFuture = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = (ExchangeEnd, Option<oneshot::Sender<Response<BoxBody>>>)>
            + Send,
    >,
>;

/// 16 bytes for a fencing token from this thread's ChaCha20 generator, seeded once per thread
/// from the operating system's generator (`getrandom`): tokens stay unpredictable without a
/// system call per request.
fn token_entropy() -> Result<[u8; 16], getrandom::Error> {
    use rand_chacha::rand_core::{RngCore as _, SeedableRng as _};
    thread_local! {
        static RNG: std::cell::RefCell<Option<rand_chacha::ChaCha20Rng>> =
            const { std::cell::RefCell::new(None) };
    }
    RNG.with(|cell| {
        let mut rng = cell.borrow_mut();
        if rng.is_none() {
            let mut seed = [0u8; 32];
            getrandom::fill(&mut seed)?;
            *rng = Some(rand_chacha::ChaCha20Rng::from_seed(seed));
        }
        let mut out = [0u8; 16];
        if let Some(r) = rng.as_mut() {
            r.fill_bytes(&mut out);
        }
        Ok(out)
    })
}

async fn tick(t: &mut Option<tokio::time::Interval>) {
    match t {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending::<()>().await,
    }
}

/// Runs the whole flow of one admitted request and sends its response to `respond` (as soon as
/// it is known: a streamed upstream response goes out while it is recorded). Runs to its end
/// even when the client went away, so the record is always settled.
pub async fn run_flow(
    shared: Arc<Shared>,
    route: Arc<RouteConfig>,
    admitted: Admitted,
    mut upstream: Request<BoxBody>,
    respond: oneshot::Sender<Response<BoxBody>>,
) {
    let _guard = shared.inflight.enter();
    let template = route.template.as_str().to_owned();
    let started = Instant::now();
    let mut head = Some(respond);
    let send = |head: &mut Option<oneshot::Sender<Response<BoxBody>>>, r: Response<BoxBody>| {
        if let Some(h) = head.take() {
            let _ = h.send(r);
        }
    };
    let Ok(entropy) = token_entropy() else {
        log::error(
            "no entropy for a fencing token",
            &[("route", json!(template))],
        );
        shared
            .metrics
            .request(&template, Outcome::StoreUnavailable.as_str());
        send(&mut head, unavailable(&route));
        return;
    };
    let (mut flow, first) = ServerFlow::start(
        admitted.scope,
        admitted.fingerprint.clone(),
        route.config.clone(),
        entropy,
    );
    let bug = |e: FlowError| {
        log::error(
            "flow rejected an event (a gateway bug)",
            &[("route", json!(template)), ("error", json!(e.to_string()))],
        );
    };
    let action = match settle(&shared, &template, &admitted, &mut flow, first).await {
        Ok(a) => a,
        Err(e) => {
            bug(e);
            send(&mut head, unavailable(&route));
            return;
        }
    };
    let run = match action {
        Action::RunHandler(run) => run,
        Action::Respond { response, outcome } => {
            finish(&shared, &template, &admitted, outcome, started, None);
            send(&mut head, to_hyper(response));
            spawn_cleanup(&shared, &template, &admitted, flow.cleanup());
            return;
        }
        other => {
            log::error(
                "unexpected action before the handler (a gateway bug)",
                &[
                    ("route", json!(template)),
                    ("action", json!(format!("{other:?}"))),
                ],
            );
            send(&mut head, unavailable(&route));
            return;
        }
    };
    if let (Ok(name), Ok(value)) = (
        HeaderName::from_bytes(shared.cfg.downstream_key_header.as_bytes()),
        HeaderValue::from_str(run.downstream_key.as_str()),
    ) {
        upstream.headers_mut().insert(name, value);
    }
    let timeout = Duration::from_millis(shared.cfg.upstream_timeout_ms);
    let mut lease_lost = false;
    let end = {
        let client = shared.client.clone();
        let config = route.config.clone();
        let mut sender = head.take();
        let mut ex: ExchangeFuture = Box::pin(async move {
            let end = exchange(&client, upstream, &config, timeout, &mut sender).await;
            (end, sender)
        });
        let every = run.heartbeat_ms.map(|ms| Duration::from_millis(ms.max(1)));
        // Most upstreams answer before the first heartbeat is due: then the exchange runs on
        // this task and no timer task or channel is made. Past that point it moves to a task of
        // its own, so a slow renewal never pauses the stream.
        let first_beat = match every {
            None => Some((&mut ex).await),
            Some(every) => tokio::select! {
                got = &mut ex => Some(got),
                () = tokio::time::sleep(every) => None,
            },
        };
        match first_beat {
            Some((end, sender)) => {
                head = sender;
                end
            }
            None => {
                let (end_tx, end_rx) = oneshot::channel();
                tokio::spawn(async move {
                    let _ = end_tx.send(ex.await);
                });
                tokio::pin!(end_rx);
                let mut ticker = every.map(|every| {
                    // The first heartbeat is due now; the next ones every interval.
                    let mut i = tokio::time::interval(every);
                    // A renewal that took long is followed by the next one a whole interval
                    // later.
                    i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    i
                });
                loop {
                    tokio::select! {
                        got = &mut end_rx => match got {
                            Ok((end, sender)) => {
                                head = sender;
                                break end;
                            }
                            // The exchange task is gone (it cannot panic on input): the upstream
                            // may have acted, and the client's response is lost with it.
                            Err(_) => break ExchangeEnd::Failed {
                                failure: UpstreamFailure::Broken,
                                streamed: true,
                            },
                        },
                        () = tick(&mut ticker) => {
                            let step = match flow.handle(Event::HeartbeatDue) {
                                Ok(a) => settle(&shared, &template, &admitted, &mut flow, a).await,
                                Err(e) => Err(e),
                            };
                            match step {
                                Ok(Action::LeaseLost) => lease_lost = true,
                                Ok(_) => {}
                                Err(e) => bug(e),
                            }
                        }
                    }
                }
            }
        }
    };
    let (event, streamed, failure, hold) = match end {
        ExchangeEnd::Finished {
            response,
            streamed,
            hold,
        } => (Event::HandlerFinished(response), streamed, None, hold),
        ExchangeEnd::Failed { failure, streamed } => (
            Event::HandlerFailed {
                maybe_side_effect: failure.maybe_side_effect(),
            },
            streamed,
            Some(failure),
            None,
        ),
    };
    let action = match flow.handle(event) {
        Ok(a) => settle(&shared, &template, &admitted, &mut flow, a).await,
        Err(e) => Err(e),
    };
    let outcome = match action {
        Ok(Action::Respond { response, outcome }) => {
            if !streamed {
                send(&mut head, to_hyper(response));
            }
            outcome
        }
        Ok(Action::PropagateError { outcome }) => {
            if !streamed {
                send(&mut head, upstream_error(failure));
            }
            outcome
        }
        Ok(other) => {
            log::error(
                "unexpected action after the handler (a gateway bug)",
                &[
                    ("route", json!(template)),
                    ("action", json!(format!("{other:?}"))),
                ],
            );
            send(&mut head, upstream_error(failure));
            Outcome::CompletionFailed
        }
        Err(e) => {
            bug(e);
            send(&mut head, upstream_error(failure));
            Outcome::CompletionFailed
        }
    };
    finish(&shared, &template, &admitted, outcome, started, failure);
    // The flow has settled the record: now the streamed body may end.
    if let Some(hold) = hold {
        hold.release().await;
    }
    if lease_lost || outcome == Outcome::LeaseLost {
        shared.metrics.lease_lost(&template);
    }
    spawn_cleanup(&shared, &template, &admitted, flow.cleanup());
}

fn finish(
    shared: &Shared,
    route: &str,
    admitted: &Admitted,
    outcome: Outcome,
    started: Instant,
    failure: Option<UpstreamFailure>,
) {
    shared.metrics.request(route, outcome.as_str());
    let mut fields = vec![
        ("route", json!(route)),
        ("outcome", json!(outcome.as_str())),
        ("scope", json!(admitted.scope.log_id())),
        ("ms", json!(started.elapsed().as_millis())),
    ];
    if let Some(f) = failure {
        fields.push(("upstream_failure", json!(f.as_str())));
    }
    log::info("request", &fields);
}

/// Runs core's cleanup of a lost claim or takeover in the background (never blocking or
/// failing the request).
fn spawn_cleanup(
    shared: &Arc<Shared>,
    route: &str,
    admitted: &Admitted,
    cleanup: Option<&Cleanup>,
) {
    let Some(cleanup) = cleanup.cloned() else {
        return;
    };
    let shared = shared.clone();
    let route = route.to_owned();
    let admitted = admitted.clone();
    tokio::spawn(async move {
        let _guard = shared.inflight.enter();
        let first = Instant::now();
        let mut attempt: u32 = 0;
        loop {
            let event = run_op(&shared, &route, &admitted, cleanup.op().clone()).await;
            let elapsed = u64::try_from(first.elapsed().as_millis()).unwrap_or(u64::MAX);
            match cleanup.next(attempt, elapsed, &event) {
                CleanupStep::Done => break,
                CleanupStep::RetryAfter(ms) => {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
            }
            attempt = attempt.saturating_add(1);
        }
    });
}
