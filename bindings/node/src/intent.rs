//! Client intents (`idempo_core::intent`, `spec/KEYS.md` §3.6): core decides, the JS client
//! stores records and sends.
use idempo_core::intent::{self, PendingIntent};
use napi::Env;
use napi_derive::napi;

use crate::error::{Fail, code};
use crate::fingerprint::fingerprint_fail;
use crate::num::to_u64;

/// The pending record of one intent.
#[napi(object)]
pub struct PendingIntentInput {
    /// The key text.
    pub key: String,
    /// The fingerprint text of the request the key was minted for.
    pub fingerprint: String,
    /// Creation time in unix ms.
    pub created_ms: f64,
}

/// The fingerprint binding a client request to its intent's key (core's v1 fingerprint of the
/// method, the target URL, the `Content-Type` and the body).
#[napi(catch_unwind)]
pub fn intent_request_fingerprint(
    env: Env,
    method: String,
    target: String,
    content_type: Option<String>,
    body: &[u8],
) -> napi::Result<String> {
    intent::request_fingerprint(&method, &target, content_type.as_deref(), body)
        .map(|f| f.to_string())
        .map_err(|e| fingerprint_fail(&e).throw(&env))
}

/// What to do with a send under an intent: `"mint"`, `"reuse"`,
/// `"intent_changed_while_pending"` or `"intent_key_differs_from_pending"`.
#[napi(catch_unwind)]
pub fn intent_decide_send(
    env: Env,
    pending: Option<PendingIntentInput>,
    request_fingerprint: String,
    explicit_key: Option<String>,
) -> napi::Result<String> {
    let pending = match pending {
        Some(p) => Some(PendingIntent {
            key: p.key,
            fingerprint: p.fingerprint,
            created_ms: to_u64(p.created_ms, "createdMs").map_err(|f| f.throw(&env))?,
        }),
        None => None,
    };
    intent::decide_send(
        pending.as_ref(),
        &request_fingerprint,
        explicit_key.as_deref(),
    )
    .map(|d| d.code().to_owned())
    .map_err(|e| {
        Fail::new(code::INVALID_ARGUMENT, e.to_string())
            .reason(e.code())
            .throw(&env)
    })
}
