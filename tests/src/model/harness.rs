//! Running the model in tests: exhaustive exploration with an exact guarantee table, and
//! mutation runs that stop at the expected counterexample.
use std::collections::BTreeSet;
use std::io::Write as _;
use std::time::Instant;

use stateright::{Checker, Expectation, HasDiscoveries, Model};

use super::IdempoModel;

/// How to explore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Search {
    /// Breadth-first on one thread (shortest traces, the fast tier).
    Bfs,
    /// Depth-first on this many threads (less memory, the deep tier).
    Dfs(usize),
}

/// What an exhaustive run measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Measured {
    /// States generated (with repeats).
    pub states: usize,
    /// Unique states.
    pub unique: usize,
    /// Deepest path explored.
    pub max_depth: usize,
}

/// Explores `model` exhaustively and asserts the exact guarantee table: the safety properties
/// in `failing` have counterexamples and no other does; the witnesses in `reached` are reached
/// and no other is. Prints the figures and the counterexample lengths.
///
/// # Panics
/// When the table differs (this is a test helper).
pub fn guarantees(
    label: &str,
    model: IdempoModel,
    search: Search,
    failing: &[&str],
    reached: &[&str],
) -> Measured {
    let start = Instant::now();
    let builder = if fail_fast() {
        // Stop at the first counterexample the table does not expect: the run fails anyway.
        let unexpected: BTreeSet<&'static str> = model
            .properties()
            .into_iter()
            .filter(|p| p.expectation == Expectation::Always && !failing.contains(&p.name))
            .map(|p| p.name)
            .collect();
        model
            .checker()
            .finish_when(HasDiscoveries::AnyOf(unexpected))
    } else {
        model.checker()
    };
    match search {
        Search::Bfs => table(label, &builder.spawn_bfs().join(), start, failing, reached),
        Search::Dfs(threads) => table(
            label,
            &builder.threads(threads).spawn_dfs().join(),
            start,
            failing,
            reached,
        ),
    }
}

fn table<C: Checker<IdempoModel>>(
    label: &str,
    checker: &C,
    start: Instant,
    failing: &[&str],
    reached: &[&str],
) -> Measured {
    assert!(checker.is_done(), "{label}: exploration incomplete");
    let measured = Measured {
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        max_depth: checker.max_depth(),
    };
    println!(
        "{label}: {} states, {} unique, max depth {}, {:.2?}",
        measured.states,
        measured.unique,
        measured.max_depth,
        start.elapsed()
    );
    let found: BTreeSet<&str> = checker.discoveries().keys().copied().collect();
    let mut problems = Vec::new();
    let (safety, witnesses): (Vec<_>, Vec<_>) = checker
        .model()
        .properties()
        .into_iter()
        .partition(|p| p.expectation == Expectation::Always);
    for p in safety {
        if let Some(path) = checker.discovery(p.name) {
            println!(
                "  counterexample {:?} ({} steps)",
                p.name,
                path.into_actions().len()
            );
        }
        match (found.contains(p.name), failing.contains(&p.name)) {
            (true, false) => problems.push(format!("unexpected counterexample for {:?}", p.name)),
            (false, true) => problems.push(format!("no counterexample for {:?}", p.name)),
            _ => {}
        }
    }
    for p in witnesses {
        match (found.contains(p.name), reached.contains(&p.name)) {
            (true, false) => problems.push(format!("witness {:?} unexpectedly reached", p.name)),
            (false, true) => problems.push(format!("witness {:?} not reached", p.name)),
            _ => {}
        }
    }
    if fail_fast() && !problems.is_empty() {
        // One broken table decides the run: end the whole test process now instead of waiting
        // for the other configurations, which is what makes a mutation pass finish.
        // Written to the process's stderr directly: the test harness's capture would be lost.
        let _ = writeln!(
            std::io::stderr(),
            "{label}: {problems:#?}\nIDEMPO_MODEL_FAIL_FAST: exiting at the first broken guarantee table"
        );
        std::process::exit(101);
    }
    assert!(problems.is_empty(), "{label}: {problems:#?}");
    measured
}

/// Whether `IDEMPO_MODEL_FAIL_FAST` is set (the model-only mutation pass, `make mutants-model`):
/// each exploration stops at the first counterexample its table does not expect, and the first
/// broken table ends the test process with a failure. The verdict is the same as a full run's
/// (a table with an unexpected counterexample fails either way); only the time differs. A run
/// whose tables all hold explores everything, as without it.
#[must_use]
pub fn fail_fast() -> bool {
    std::env::var_os("IDEMPO_MODEL_FAIL_FAST").is_some()
}

/// Explores breadth-first until every property in `expected` has a counterexample; returns the
/// longest of their shortest trace lengths (steps from the initial state).
///
/// stateright's breadth-first checker records the last violating state it processed before it
/// stopped, often a descendant of the first one (monitor bits persist), so the path it reports is
/// not the shortest. The first failing state on that path bounds the length; a depth-bounded
/// exhaustive search below that bound ([`shortest`]) gives the exact minimum.
///
/// # Panics
/// When a counterexample is missing.
pub fn mutation(label: &str, model: IdempoModel, expected: &[&'static str]) -> usize {
    let start = Instant::now();
    let checker = model
        .clone()
        .checker()
        .finish_when(HasDiscoveries::AllOf(expected.iter().copied().collect()))
        .spawn_bfs()
        .join();
    let mut depth = 0;
    for name in expected {
        let path = checker.assert_any_discovery(name);
        let bound = first_failure(&model, name, path.into_states());
        let steps = shortest(&model, name, bound);
        println!("{label}: shortest counterexample for {name:?} in {steps} steps");
        depth = depth.max(steps);
    }
    println!(
        "{label}: {} unique states explored, {:.2?}",
        checker.unique_state_count(),
        start.elapsed()
    );
    depth
}

/// Steps to the first state of `states` (a path from the initial state) where the safety
/// property `name` fails.
///
/// # Panics
/// When `name` is not a safety property or holds along the whole path.
#[must_use]
pub fn first_failure(model: &IdempoModel, name: &str, states: Vec<super::World>) -> usize {
    let property = model
        .properties()
        .into_iter()
        .filter(|p| p.expectation == Expectation::Always)
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("{name:?} is not a safety property"));
    states
        .iter()
        .position(|s| !(property.condition)(model, s))
        .unwrap_or_else(|| panic!("{name:?} holds along its counterexample"))
}

/// The length of the shortest counterexample for `name`, known to be at most `bound`: the
/// smallest depth at which an exhaustive search bounded to that depth finds one.
///
/// # Panics
/// When no counterexample of at most `bound` steps exists.
#[must_use]
pub fn shortest(model: &IdempoModel, name: &'static str, bound: usize) -> usize {
    for steps in 0..=bound {
        // The initial state has depth 1; states at the target depth are not checked.
        let checker = model
            .clone()
            .checker()
            .target_max_depth(steps + 2)
            .finish_when(HasDiscoveries::AnyOf(std::iter::once(name).collect()))
            .spawn_bfs()
            .join();
        if checker.discovery(name).is_some() {
            return steps;
        }
    }
    panic!("no counterexample for {name:?} within {bound} steps")
}
