//! Idempotent function calls (core's `machine::call`), for `ts/functions.ts`.
//!
//! Translation only: core fixes a call's scope and fingerprint framing, what to feed the flow
//! for a result or a raised error, and what the flow's end means for the caller.
use idempo_core::machine::call::{
    self, CallAnswer as CoreAnswer, CallError, ErrorDisposition, outcome_named,
};
use idempo_core::machine::{Event, HttpResponse};
use napi::Env;
use napi::bindgen_prelude::Buffer;
use napi_derive::napi;

use crate::error::{Fail, code};

fn call_fail(e: &CallError) -> Fail {
    Fail::new(code::INVALID_ARGUMENT, e.to_string()).reason(e.code())
}

fn core_call(env: &Env, name: &str) -> napi::Result<call::Call> {
    call::Call::new(name).map_err(|e| call_fail(&e).throw(env))
}

/// The request parts a call's payload is fingerprinted as (`spec/PROTOCOL.md` §13).
#[napi(object)]
pub struct CallFraming {
    /// Always `"CALL"`.
    pub method: String,
    /// The function's name.
    pub route: String,
    /// `"application/json"`.
    pub content_type: String,
}

/// The framing of calls of function `name`.
#[napi(catch_unwind)]
pub fn call_framing(env: Env, name: String) -> napi::Result<CallFraming> {
    let c = core_call(&env, &name)?;
    let p = c.parts(b"");
    Ok(CallFraming {
        method: p.method.to_owned(),
        route: p.route.to_owned(),
        content_type: p.content_type.unwrap_or("application/json").to_owned(),
    })
}

/// The 32-byte record scope of `key` for `principal` (`""`: none) in function `name`.
#[napi(catch_unwind)]
pub fn call_scope(env: Env, name: String, principal: String, key: String) -> napi::Result<Buffer> {
    let scope = core_call(&env, &name)?
        .scope(&principal, &key)
        .map_err(|e| call_fail(&e).throw(&env))?;
    Ok(Buffer::from(scope.as_bytes().to_vec()))
}

/// What to feed the flow when a function returned or raised.
#[napi(object)]
pub struct CallFeed {
    /// `"finished"` (feed `handlerFinished(status, headers, body)`) or `"failed"` (feed
    /// `handlerFailed(maybeSideEffect)`).
    pub kind: String,
    /// Status (`"finished"`).
    pub status: Option<u32>,
    /// Headers (`"finished"`).
    pub headers: Option<Vec<Vec<String>>>,
    /// Body (`"finished"`).
    pub body: Option<Buffer>,
    /// Whether it may have acted (`"failed"`).
    pub maybe_side_effect: Option<bool>,
}

fn feed(event: Event) -> CallFeed {
    match event {
        Event::HandlerFinished(r) => CallFeed {
            kind: "finished".to_owned(),
            status: Some(u32::from(r.status)),
            headers: Some(r.headers.into_iter().map(|(n, v)| vec![n, v]).collect()),
            body: Some(Buffer::from(r.body)),
            maybe_side_effect: None,
        },
        Event::HandlerFailed { maybe_side_effect } => CallFeed {
            kind: "failed".to_owned(),
            status: None,
            headers: None,
            body: None,
            maybe_side_effect: Some(maybe_side_effect),
        },
        _ => CallFeed {
            kind: "failed".to_owned(),
            status: None,
            headers: None,
            body: None,
            maybe_side_effect: Some(true),
        },
    }
}

/// The feed for a result `body` encoded by `serializer`.
#[napi(catch_unwind)]
pub fn call_returned(env: Env, serializer: String, body: Buffer) -> napi::Result<CallFeed> {
    call::returned(&serializer, body.to_vec())
        .map(feed)
        .map_err(|e| call_fail(&e).throw(&env))
}

/// The feed for an error raised under `disposition` (`"store"`, `"release"`, `"unknown"`);
/// `body` is the encoded error (stored under `"store"`).
#[napi(catch_unwind)]
pub fn call_raised(env: Env, disposition: String, body: Buffer) -> napi::Result<CallFeed> {
    let Some(d) = ErrorDisposition::named(&disposition) else {
        return Err(Fail::new(
            code::INVALID_ARGUMENT,
            format!(
                "error disposition {disposition:?} must be \"store\", \"release\" or \"unknown\""
            ),
        )
        .reason("bad_disposition")
        .throw(&env));
    };
    Ok(feed(call::raised(d, body.to_vec())))
}

/// What the caller of a function gets.
#[napi(object)]
pub struct CallAnswerData {
    /// `"returned"`, `"stored_error"`, `"propagate"`, `"not_retained"`, `"in_flight"`,
    /// `"mismatch"`, `"outcome_unknown"`, `"unavailable"` or `"foreign"`.
    pub kind: String,
    /// The serializer that encoded the result (`"returned"`).
    pub serializer: Option<String>,
    /// The encoded result or error.
    pub body: Option<Buffer>,
    /// True when read from the record (the function did not run in this call).
    pub replayed: bool,
    /// Milliseconds to wait (`"in_flight"`, `"unavailable"`).
    pub retry_after_ms: Option<f64>,
    /// The record's status (`"foreign"`).
    pub status: Option<u32>,
}

/// The answer of a finished flow: its `outcome` and, unless it propagates, its response.
#[napi(catch_unwind)]
pub fn call_answer(
    env: Env,
    outcome: String,
    status: Option<u32>,
    headers: Option<Vec<Vec<String>>>,
    body: Option<Buffer>,
) -> napi::Result<CallAnswerData> {
    let Some(o) = outcome_named(&outcome) else {
        return Err(Fail::new(
            code::INVALID_ARGUMENT,
            format!("unknown outcome {outcome:?}"),
        )
        .throw(&env));
    };
    let answer = match status {
        None => CoreAnswer::Propagate,
        Some(s) => CoreAnswer::of_response(
            &HttpResponse {
                status: u16::try_from(s).unwrap_or(0),
                headers: headers
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|p| match p.as_slice() {
                        [n, v] => Some((n.clone(), v.clone())),
                        _ => None,
                    })
                    .collect(),
                body: body.map(|b| b.to_vec()).unwrap_or_default(),
            },
            o,
        ),
    };
    let flat = answer.into_flat();
    #[allow(clippy::cast_precision_loss)] // a Retry-After in ms is far below 2^53
    let out = CallAnswerData {
        kind: flat.kind.to_owned(),
        serializer: flat.serializer,
        body: flat.body.map(Buffer::from),
        replayed: flat.replayed,
        retry_after_ms: flat.retry_after_ms.map(|ms| ms as f64),
        status: flat.status.map(u32::from),
    };
    Ok(out)
}

/// Core's bounded, jittered pause before poll `attempt` of a call in flight (null: give up).
#[napi(catch_unwind)]
#[must_use]
pub fn call_wait_delay(
    attempt: u32,
    retry_after_ms: f64,
    elapsed_ms: f64,
    budget_ms: f64,
    jitter: u32,
) -> Option<f64> {
    let ms = |v: f64| {
        if v.is_finite() && v > 0.0 {
            v as u64
        } else {
            0
        }
    };
    call::wait_delay(
        attempt,
        ms(retry_after_ms),
        ms(elapsed_ms),
        ms(budget_ms),
        u16::try_from(jitter.min(u32::from(u16::MAX))).unwrap_or(u16::MAX),
    )
    .map(|d| d as f64)
}
