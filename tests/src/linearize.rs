//! A linearizability checker for concurrent histories of the store primitives on one record key.
//!
//! A store is correct under concurrency when every history its clients observe is
//! *linearizable* against core's primitives (`idempo_core::machine::store`): there is one order
//! of the operations, consistent with real time (an operation that returned before another was
//! invoked comes first), in which running core's primitive for each, at the `now` the client
//! passed, gives exactly the answer the client got. Single-client vectors cannot show this; the
//! PostgreSQL suite (`tests/tests/recipes_postgres.rs`) records histories of several clients
//! against a real server and checks each one here.
//!
//! The search is the Wing and Gong algorithm with Lowe's memoisation ("Testing for
//! linearisability", 2017): depth first over the operations that may come next (invoked before
//! every pending operation returned), applying core's primitive and pruning a branch whose answer
//! differs, with a cache of (operations placed, record) already shown to fail. One key is one
//! object; linearizability is local, so histories over several keys are checked key by key.
//!
//! One primitive is not a function of the record: a purge may pass over an expired record (it
//! deletes *at most* its batch and never waits on a row another statement holds), so a purge
//! that deleted nothing is accepted where core's primitive would delete, and the record stays.
use std::collections::HashSet;

use idempo_core::machine::StoreOp;
use idempo_core::record::Record;

use crate::recipes::{Applied, Step, core_step};

/// One step a client ran: a flow's store operation, or the purge of expired records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// A [`StoreOp`] (never `Commit`).
    Op(StoreOp),
    /// Primitive 8 over the key's table (the history's one key).
    Purge,
}

impl Call {
    /// The step in the recipe harness's terms.
    #[must_use]
    pub fn step(&self) -> Step<'_> {
        match self {
            Call::Op(op) => Step::Op(op),
            Call::Purge => Step::Purge,
        }
    }

    /// The primitive's name, for reports.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Call::Op(op) => op.name(),
            Call::Purge => "purge",
        }
    }
}

/// One completed operation of a history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Which client ran it (reports only).
    pub client: usize,
    /// What it ran.
    pub call: Call,
    /// The `now` it passed to the recipe (unix ms).
    pub now_ms: u64,
    /// What the store answered, in core's terms.
    pub answer: Applied,
    /// When it was invoked, on the history's one logical clock (before the request was sent).
    pub invoked: u64,
    /// When it returned, on the same clock (after the answer arrived); `> invoked`.
    pub returned: u64,
}

/// A history with no valid order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The longest prefix of a valid order the search found (indices into the history).
    pub prefix: Vec<usize>,
    /// The record after that prefix.
    pub record: Option<Record>,
    /// For each operation that could come next after the prefix: its index and core's answer
    /// there (which differs from what the store answered).
    pub refused: Vec<(usize, Applied)>,
}

impl Violation {
    /// A readable account of the violation against `history`.
    #[must_use]
    pub fn explain(&self, history: &[Entry]) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "not linearizable against core's primitives; longest valid prefix ({} of {} operations):",
            self.prefix.len(),
            history.len()
        );
        for &i in &self.prefix {
            let e = &history[i];
            let _ = writeln!(
                out,
                "  #{i} client {} {} at now={} [{}..{}] -> {:?}",
                e.client,
                e.call.name(),
                e.now_ms,
                e.invoked,
                e.returned,
                e.answer
            );
        }
        let _ = writeln!(out, "record after it: {:?}", self.record);
        for (i, want) in &self.refused {
            let e = &history[*i];
            let _ = writeln!(
                out,
                "  next #{i} client {} {:?} at now={} [{}..{}]: store answered {:?}, core answers {:?}",
                e.client, e.call, e.now_ms, e.invoked, e.returned, e.answer, want
            );
        }
        out
    }
}

/// What [`check`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// One valid order (indices into the history).
    Linearizable(Vec<usize>),
    /// No valid order exists.
    Violation(Box<Violation>),
}

/// Checks that `history` (one key, starting from `initial`) is linearizable against core's
/// primitives.
///
/// # Errors
/// A message when an operation cannot be run by core (a `Commit`, an undecodable response).
pub fn check(history: &[Entry], initial: Option<Record>) -> Result<Verdict, String> {
    let n = history.len();
    let mut search = Search {
        history,
        placed: vec![false; n],
        order: Vec::with_capacity(n),
        failed: HashSet::new(),
        best: Violation {
            prefix: Vec::new(),
            record: initial.clone(),
            refused: Vec::new(),
        },
    };
    if search.place(&initial)? {
        Ok(Verdict::Linearizable(search.order))
    } else {
        Ok(Verdict::Violation(Box::new(search.best)))
    }
}

/// A purge that deleted nothing where core's primitive would delete the expired record: allowed,
/// the record stays. `spec/STORAGE.md` §3 item 8: a batch deletes *at most* its rows and never
/// waits on a live claim, so PostgreSQL's `FOR UPDATE SKIP LOCKED` passes over a row another
/// statement holds at that moment (a claim reading it `FOR SHARE`, say); an expired record counts
/// as absent to every primitive, so leaving it changes no other answer.
fn skipped_purge(e: &Entry, core: &Applied) -> bool {
    matches!(
        (&e.call, &e.answer, core),
        (Call::Purge, Applied::Purge(None), Applied::Purge(Some(_)))
    )
}

struct Search<'h> {
    history: &'h [Entry],
    placed: Vec<bool>,
    order: Vec<usize>,
    /// (placed set, record) pairs from which no valid completion exists.
    failed: HashSet<(Vec<bool>, Option<Record>)>,
    best: Violation,
}

impl Search<'_> {
    /// Places the remaining operations after `record`; true when an order was found.
    fn place(&mut self, record: &Option<Record>) -> Result<bool, String> {
        if self.order.len() == self.history.len() {
            return Ok(true);
        }
        if self.failed.contains(&(self.placed.clone(), record.clone())) {
            return Ok(false);
        }
        // An operation may come next only when no pending operation returned before it began.
        let horizon = self
            .history
            .iter()
            .zip(&self.placed)
            .filter(|(_, placed)| !**placed)
            .map(|(e, _)| e.returned)
            .min()
            .unwrap_or(u64::MAX);
        let mut refused = Vec::new();
        for i in 0..self.history.len() {
            let e = &self.history[i];
            if self.placed[i] || e.invoked > horizon {
                continue;
            }
            let (answer, mut after) = core_step(record, e.call.step(), e.now_ms)?;
            if answer != e.answer {
                if !skipped_purge(e, &answer) {
                    refused.push((i, answer));
                    continue;
                }
                // The purge left the expired record for a later batch.
                after = record.clone();
            }
            self.placed[i] = true;
            self.order.push(i);
            if self.place(&after)? {
                return Ok(true);
            }
            self.order.pop();
            self.placed[i] = false;
        }
        if self.order.len() >= self.best.prefix.len() && !refused.is_empty() {
            self.best = Violation {
                prefix: self.order.clone(),
                record: record.clone(),
                refused,
            };
        }
        self.failed.insert((self.placed.clone(), record.clone()));
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idempo_core::machine::store::ClaimOutcome;
    use idempo_core::record::{FencingToken, FingerprintText};
    use idempo_core::scope::ScopeId;

    fn claim(token: u8) -> Call {
        Call::Op(StoreOp::Claim {
            scope: ScopeId::from_bytes([1; 32]),
            fingerprint: FingerprintText::new("fp").unwrap(),
            token: FencingToken([token; 16]),
            lease_ms: 10,
            ttl_ms: 100,
        })
    }

    fn entry(client: usize, call: Call, answer: Applied, invoked: u64, returned: u64) -> Entry {
        Entry {
            client,
            call,
            now_ms: 1_000 + invoked,
            answer,
            invoked,
            returned,
        }
    }

    fn claimed() -> Applied {
        Applied::Claim(ClaimOutcome::Claimed { generation: 1 })
    }

    fn existing_after(token: u8, invoked: u64) -> Applied {
        let mut slot = None;
        let _ = idempo_core::machine::store::claim(
            &mut slot,
            &FingerprintText::new("fp").unwrap(),
            FencingToken([token; 16]),
            10,
            100,
            1_000 + invoked,
        );
        Applied::Claim(ClaimOutcome::Existing(slot.unwrap()))
    }

    #[test]
    fn two_overlapping_claims_that_both_won_are_refused() {
        let h = [
            entry(0, claim(1), claimed(), 0, 3),
            entry(1, claim(2), claimed(), 1, 2),
        ];
        let Verdict::Violation(v) = check(&h, None).unwrap() else {
            panic!("accepted")
        };
        assert_eq!(v.prefix.len(), 1);
        assert_eq!(v.refused.len(), 1);
        assert!(v.explain(&h).contains("not linearizable"));
    }

    #[test]
    fn overlapping_claims_linearize_in_either_order() {
        // Client 1 was invoked later but its claim won: valid, since the two overlap.
        let h = [
            entry(0, claim(1), existing_after(2, 1), 0, 3),
            entry(1, claim(2), claimed(), 1, 2),
        ];
        assert_eq!(check(&h, None).unwrap(), Verdict::Linearizable(vec![1, 0]));
    }

    fn purge(answer: Option<i64>, invoked: u64, returned: u64) -> Entry {
        Entry {
            client: 1,
            call: Call::Purge,
            now_ms: 1_000 + invoked,
            answer: Applied::Purge(answer),
            invoked,
            returned,
        }
    }

    #[test]
    fn a_purge_may_pass_over_an_expired_record_but_never_take_a_live_one() {
        // Claimed at 1000 (lease 10, TTL 100: expires at 1100).
        let first = entry(0, claim(1), claimed(), 0, 1);
        let skipped = [first.clone(), purge(None, 200, 201)];
        assert!(matches!(
            check(&skipped, None).unwrap(),
            Verdict::Linearizable(_)
        ));
        let taken = [first.clone(), purge(Some(1), 200, 201)];
        assert!(matches!(
            check(&taken, None).unwrap(),
            Verdict::Linearizable(_)
        ));
        let live = [first, purge(Some(1), 50, 51)];
        assert!(matches!(check(&live, None).unwrap(), Verdict::Violation(_)));
    }

    #[test]
    fn real_time_order_is_respected() {
        // The same answers, but client 0's claim returned before client 1's began: it must come
        // first, and then it would have won.
        let h = [
            entry(0, claim(1), existing_after(2, 2), 0, 1),
            entry(1, claim(2), claimed(), 2, 3),
        ];
        assert!(matches!(check(&h, None).unwrap(), Verdict::Violation(_)));
    }
}
