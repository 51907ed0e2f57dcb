//! Contract-level properties: what a user can check from outside, on the history of requests,
//! effects and store writes, with no reference to fencing tokens' values or to the model's
//! generation instances.
//!
//! - **C1** at most one effect per request (scope and fingerprint) within its retention window,
//!   whatever releases, expiries, takeovers or purges happen in between. A request's window opens
//!   at its effect and lasts until the `expires_at` of the request's record as last written (a
//!   renewal, completion or mark-unknown moves it; a release does not end it early). **C1o**
//!   and **C1r** are the documented exceptions, as separate properties: C1o leaves out effects
//!   made by a flow that no longer held the key (a paused owner acting late: every
//!   external-effect mode), C1r also a takeover's re-run (the unkeyed re-run mode).
//! - **C2** a replay's body is the last response stored (committed) for the same request.
//! - **C3** fencing is monotonic against the latest token ever granted for the key: a
//!   token-fenced write (complete, renew, release) succeeds only with the token of the latest
//!   claim or takeover the store applied for that key, whatever the record holds now.
//! - **C4** every conditional write (claim, takeover, renew, complete, release, mark-unknown,
//!   purge) applies exactly when its precondition, written here from `spec/STORAGE.md` and not
//!   taken from core, holds (never without it, always with it: a write the store executed with
//!   its precondition holding must report success), and leaves the record its contract says.
//!
//! "A mismatch never executes" is P3 (already stated on the history: no effect for a request
//! answered 422).
use idempo_core::machine::StoreOp;
use idempo_core::record::{FencingToken, Record, RecordState};

use super::{Body, IdempoModel, World, props, token_bytes};

/// C1: at most one effect per (scope, request) within its retention window.
pub const C1: &str = "C1 at most one effect per request within its retention window";
/// C1o: C1, effects of a flow that no longer held the key (a late owner) apart.
pub const C1O: &str = "C1o at most one effect per request within its window, late owners apart";
/// C1r: C1o, a takeover's re-run apart too.
pub const C1R: &str =
    "C1r at most one effect per request within its window, late owners and takeover re-runs apart";
/// C2: a replay is the last response stored for the same request.
pub const C2: &str = "C2 a replay is the last response stored for the same request";
/// C3: fencing against the latest token ever granted for the key.
pub const C3: &str = "C3 a fenced write carries the latest token granted for the key";
/// C4: conditional writes apply exactly when their precondition holds (only then, and always then).
pub const C4: &str = "C4 every conditional write applies exactly when its precondition holds";

/// An effect of `client`'s request in `scope` happened at `now_ms`; `owner`: the executing flow
/// held the key; `took_over`: it had taken an expired lease over. Checks C1, C1o, C1r against
/// the open windows, then opens this effect's window.
pub(super) fn on_effect(
    m: &IdempoModel,
    w: &mut World,
    client: u8,
    owner: bool,
    took_over: bool,
    now_ms: u64,
) {
    let (s, f) = (m.scope_of(client), m.fp_of(client));
    let open = |o: bool| w.ghost.windows.contains_key(&(s, f, o));
    if open(true) || open(false) {
        w.ghost.violated |= props::Check::Once.bit();
    }
    if owner && open(true) {
        w.ghost.violated |= props::Check::OnceOwners.bit();
        if !took_over {
            w.ghost.violated |= props::Check::OnceReRun.bit();
        }
    }
    let until = match &w.store[usize::from(s)] {
        Some(r) if m.fingerprint_of(client) == Some(&r.fingerprint) => r.expires_at_ms,
        _ => now_ms,
    };
    let e = w.ghost.windows.entry((s, f, owner)).or_insert(until);
    *e = (*e).max(until);
}

/// After every transition: an open window follows the `expires_at` of the record of its request
/// in its slot (the latest write sets it: a completion may shorten a claim's retention when the
/// lease is longer than the TTL); with no such record it keeps its last value (a release does not
/// shorten it); windows whose time has come close.
pub(super) fn after_step(m: &IdempoModel, w: &mut World) {
    if w.ghost.windows.is_empty() {
        return;
    }
    let now_ms = IdempoModel::clock_ms(w);
    let store = &w.store;
    w.ghost.windows.retain(|&(s, f, _), until| {
        if let Some(r) = store.get(usize::from(s)).and_then(Option::as_ref)
            && m.fingerprint_index(&r.fingerprint) == Some(f)
        {
            *until = r.expires_at_ms;
        }
        now_ms < *until
    });
}

/// The store applied a claim or takeover of `token` on slot `s`.
pub(super) fn on_grant(w: &mut World, s: usize, token: u8) {
    if let Some(g) = w.ghost.granted.get_mut(s) {
        *g = token;
    }
}

/// C2 at a replay of `body` to `client`.
pub(super) fn check_replay(m: &IdempoModel, w: &mut World, client: u8, body: Option<Body>) {
    let key = (m.scope_of(client), m.fp_of(client));
    if body.is_none() || w.ghost.stored.get(&key).copied() != body {
        w.ghost.violated |= props::Check::ReplayStored.bit();
    }
}

/// A response `body` of `client`'s request was stored (committed).
pub(super) fn on_stored(m: &IdempoModel, w: &mut World, client: u8, body: Body) {
    w.ghost
        .stored
        .insert((m.scope_of(client), m.fp_of(client)), body);
}

/// C3 at a successful token-fenced write with `token` on slot `s`.
pub(super) fn check_fenced(w: &mut World, s: usize, token: FencingToken) {
    let latest = w.ghost.granted.get(s).copied().unwrap_or(0);
    if latest == 0 || FencingToken(token_bytes(latest)) != token {
        w.ghost.violated |= props::Check::Fencing.bit();
    }
}

fn in_progress_with(r: &Record, token: FencingToken) -> Option<u64> {
    match r.state {
        RecordState::InProgress { lease_until_ms } if r.token == token => Some(lease_until_ms),
        _ => None,
    }
}

/// The contract of one conditional write (`spec/STORAGE.md` §3): whether it may apply to `pre`
/// at `now_ms`, and whether `post` is what it must leave when it did. `op` `None` is the purge.
fn contract(
    op: Option<&StoreOp>,
    pre: &Option<Record>,
    post: &Option<Record>,
    now_ms: u64,
) -> (bool, bool) {
    let live = |r: &Record| now_ms < r.expires_at_ms;
    match op {
        None => (pre.as_ref().is_some_and(|r| !live(r)), post.is_none()),
        Some(StoreOp::Claim { token, .. }) => (
            pre.as_ref().is_none_or(|r| !live(r)),
            post.as_ref()
                .is_some_and(|r| in_progress_with(r, *token).is_some()),
        ),
        Some(StoreOp::TakeOver {
            seen_token,
            new_token,
            ..
        }) => (
            pre.as_ref()
                .and_then(|r| in_progress_with(r, *seen_token))
                .is_some_and(|until| until <= now_ms),
            post.as_ref()
                .is_some_and(|r| in_progress_with(r, *new_token).is_some()),
        ),
        Some(StoreOp::MarkUnknown { seen_token, .. }) => (
            pre.as_ref()
                .and_then(|r| in_progress_with(r, *seen_token))
                .is_some_and(|until| until <= now_ms),
            post.as_ref()
                .is_some_and(|r| matches!(r.state, RecordState::OutcomeUnknown)),
        ),
        Some(StoreOp::Complete { token, .. }) => (
            pre.as_ref()
                .is_some_and(|r| in_progress_with(r, *token).is_some()),
            post.as_ref()
                .is_some_and(|r| matches!(r.state, RecordState::Completed { .. })),
        ),
        Some(StoreOp::Renew { token, .. }) => (
            pre.as_ref()
                .is_some_and(|r| in_progress_with(r, *token).is_some()),
            post.as_ref()
                .is_some_and(|r| in_progress_with(r, *token).is_some()),
        ),
        Some(StoreOp::Release { token, .. }) => (
            pre.as_ref()
                .is_some_and(|r| in_progress_with(r, *token).is_some()),
            post.is_none(),
        ),
        Some(StoreOp::Get { .. } | StoreOp::Commit { .. }) => (true, true),
    }
}

/// C4 after a store step: `op` (`None`: the purge) took slot `pre` to `post` at `now_ms`, and
/// reported `ok`. A write that changed the slot or reported success must have had its
/// precondition, and one whose precondition held must report success; one that reported
/// success must leave what its contract says (`check_post`:
/// false where the model itself replaces the slot afterwards, a transactional rollback).
pub(super) fn check_write(
    w: &mut World,
    op: Option<&StoreOp>,
    pre: &Option<Record>,
    post: &Option<Record>,
    ok: bool,
    check_post: bool,
) {
    let now_ms = IdempoModel::clock_ms(w);
    let (may, shape) = contract(op, pre, post, now_ms);
    let changed = pre != post;
    // The converse: a conditional write the store executed with its precondition holding must
    // apply (a primitive that refuses a valid write, e.g. a renew that always answers false,
    // strands its owner; a purge that keeps an expired record never frees it). Reads and
    // `COMMIT` are not conditional writes.
    let conditional = matches!(
        op,
        None | Some(
            StoreOp::Claim { .. }
                | StoreOp::TakeOver { .. }
                | StoreOp::MarkUnknown { .. }
                | StoreOp::Complete { .. }
                | StoreOp::Renew { .. }
                | StoreOp::Release { .. }
        )
    );
    if ((ok || changed) && !may) || (ok && check_post && !shape) || (conditional && may && !ok) {
        w.ghost.violated |= props::Check::Conditional.bit();
    }
}
