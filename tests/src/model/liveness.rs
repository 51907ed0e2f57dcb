//! Liveness, checked as a safety property on every reachable state.
//!
//! stateright's `eventually` is unsound on cycles and knows no fairness, so the model checks
//! liveness the other way round: from **each** reachable state, [`continuation`] plays one fair,
//! fault-free schedule to its end and requires that every client receives a definitive answer
//! (success or replay, mismatch, outcome-unknown) and that every claim ends (no flow left running,
//! no cleanup left pending, and every in-progress record's lease runs out), with the clock moving
//! no more than one lease in all. A state from which that schedule fails is a counterexample of
//! [`L`].
//!
//! The schedule, from the state as it is (whatever crashes, faults, pauses and give-ups led there):
//! no more crashes, store faults or handler failures; clients are patient (core's retry policy with
//! attempts enough; a client that stopped before sends again, and one that had its answer gets it
//! again); every running flow and pending store operation, cleanup and cache fill runs first; a
//! client whose request died with its worker times out; a client sends only when its key has no
//! live lease and, after a retryable answer (409, 5xx), only once the clock has moved (it honours
//! `Retry-After`); the clock moves only when a client waits on it.

use idempo_core::record::RecordState;

use stateright::Model;

use super::{Act, ClientPhase, IdempoModel, Worker, World};

/// L: from every reachable state, a fair, fault-free continuation answers every client and
/// ends every claim, within one lease of waiting.
pub const L: &str = "L a fair, fault-free continuation answers every client and ends every claim";

/// Steps after which a continuation counts as stuck.
const MAX_STEPS: usize = 300;

/// The property's condition.
pub(super) fn holds(m: &IdempoModel, w: &World) -> bool {
    continuation(m, w).is_ok()
}

fn live_lease(w: &World, s: usize) -> bool {
    let now_ms = IdempoModel::clock_ms(w);
    w.store.get(s).and_then(Option::as_ref).is_some_and(|r| {
        matches!(r.state, RecordState::InProgress { lease_until_ms } if lease_until_ms > now_ms)
    })
}

/// Nothing runs, nothing is pending, every client is done, and a record still has a live lease.
fn idle_but_leased(w: &World) -> bool {
    w.workers.iter().all(|x| matches!(x, Worker::Idle))
        && w.cleanups.is_empty()
        && w.clients.iter().all(|c| c.phase == ClientPhase::Done)
        && (0..w.store.len()).any(|s| live_lease(w, s))
}

/// Plays the fair continuation from `start` on `m`'s patient twin; `Ok(steps)` when it ends
/// well, else what went wrong.
///
/// # Errors
/// The reason the continuation fails: stuck, too long, waited longer than a lease, or a claim
/// left running.
pub fn continuation(m: &IdempoModel, start: &World) -> Result<usize, String> {
    let p = m.patient();
    let lease = m.bounds.lease;
    let mut w = start.clone();
    for c in &mut w.clients {
        if c.phase == ClientPhase::Done {
            c.phase = ClientPhase::Ready;
            c.attempts = 0;
        }
    }
    // Clients that got a retryable answer since the clock last moved.
    let mut backing_off = vec![false; w.clients.len()];
    let mut ticks = 0u8;
    let mut actions = Vec::new();
    for step in 0..MAX_STEPS {
        actions.clear();
        p.actions(&w, &mut actions);
        let progress = actions.iter().copied().find(|a| {
            matches!(
                a,
                Act::Store(_)
                    | Act::Execute(_)
                    | Act::Finish(_)
                    | Act::Cleanup(_)
                    | Act::CacheWrite(_)
            )
        });
        let lost = || {
            w.clients
                .iter()
                .enumerate()
                .find_map(|(c, cl)| match cl.phase {
                    ClientPhase::Waiting(t)
                        if !w
                            .workers
                            .iter()
                            .any(|x| matches!(x, Worker::Busy(b) if b.token == t)) =>
                    {
                        u8::try_from(c).ok().map(Act::Timeout)
                    }
                    _ => None,
                })
        };
        let send = || {
            actions.iter().copied().find(|a| match a {
                Act::Send(c) => {
                    !backing_off.get(usize::from(*c)).copied().unwrap_or(true)
                        && !live_lease(&w, usize::from(p.scope_of(*c)))
                }
                _ => false,
            })
        };
        let next = progress.or_else(lost).or_else(send);
        let action = match next {
            Some(a) => a,
            // A client waits for a lease to run out, or nothing runs and a dead owner's lease
            // has yet to (its claim ends when it does).
            None if w.clients.iter().any(|c| c.phase == ClientPhase::Ready)
                || (idle_but_leased(&w)) =>
            {
                if ticks >= lease {
                    return Err(format!(
                        "a client still waits after {ticks} ticks (lease {lease}) at step {step}"
                    ));
                }
                ticks += 1;
                backing_off.iter_mut().for_each(|b| *b = false);
                Act::Tick
            }
            None => {
                let running = w.workers.iter().any(|x| matches!(x, Worker::Busy(_)));
                let stuck_lease = (0..w.store.len()).any(|s| live_lease(&w, s));
                let waiting = w.clients.iter().any(|c| c.phase != ClientPhase::Done);
                return if running || waiting || !w.cleanups.is_empty() || stuck_lease {
                    Err(format!(
                        "ends at step {step} with running={running} waiting={waiting} \
                         cleanups={} live lease={stuck_lease}",
                        w.cleanups.len()
                    ))
                } else {
                    Ok(step)
                };
            }
        };
        let before: Vec<(u8, ClientPhase)> =
            w.clients.iter().map(|c| (c.attempts, c.phase)).collect();
        w = p
            .next_state(&w, action)
            .ok_or_else(|| format!("{action:?} not applicable at step {step}"))?;
        for (c, (attempts, phase)) in before.into_iter().enumerate() {
            let now = w.clients[c];
            if matches!(phase, ClientPhase::Waiting(_))
                && now.phase == ClientPhase::Ready
                && now.attempts == attempts
                && !matches!(action, Act::Timeout(_))
            {
                backing_off[c] = true;
            }
        }
    }
    Err(format!("no end within {MAX_STEPS} steps"))
}
