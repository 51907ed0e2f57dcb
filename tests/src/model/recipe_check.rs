//! The shipped SQLite and Redis recipes under the model.
//!
//! [`RecipeCheck`] explores exactly the states of an [`IdempoModel`] (it delegates every
//! transition) and checks one property on each: every store step that can happen next (each
//! busy flow's pending operation, each pending host cleanup, the purge of each slot) gives the
//! same answer and leaves the same record when run by the shipped SQLite recipe (on SQLite) and
//! Redis script (on Lua 5.1), as core's primitive on the same slot at the same time
//! (`crate::recipes`). A recipe that differs from core anywhere the model can reach is a
//! counterexample; [`RecipeCheck::disagreement`] names it.
use std::cell::RefCell;
use std::collections::HashSet;

use idempo_core::machine::StoreOp;
use idempo_core::record::Record;
use stateright::{Model, Property};

use super::{Act, IdempoModel, Worker, World};
use crate::recipes::redis::{RedisRecipes, RedisTexts};
use crate::recipes::sqlite::{SqliteRecipes, SqliteTexts};
use crate::recipes::{Step, check_step};

/// R: the shipped recipes agree with core's primitives on every reachable step.
pub const R: &str = "R the shipped SQL and Lua recipes agree with core's primitives";

/// An [`IdempoModel`] whose only property is [`R`], run with these recipe texts.
pub struct RecipeCheck {
    /// The model whose states are explored.
    pub inner: IdempoModel,
    /// The SQLite texts (the shipped ones unless a test plants a mutation).
    pub sqlite: SqliteTexts,
    /// The Redis script bodies.
    pub redis: RedisTexts,
}

type Seen = HashSet<(Option<Record>, Option<StoreOp>, u64)>;

struct Backends {
    texts: (SqliteTexts, RedisTexts),
    sqlite: SqliteRecipes,
    redis: RedisRecipes,
    checked: Seen,
}

thread_local! {
    static BACKENDS: RefCell<Option<Backends>> = const { RefCell::new(None) };
}

impl RecipeCheck {
    /// The shipped recipes over `inner`'s states.
    #[must_use]
    pub fn shipped(inner: IdempoModel) -> Self {
        Self {
            inner,
            sqlite: SqliteTexts::default(),
            redis: RedisTexts::default(),
        }
    }

    /// The store steps that can be taken next in `w`: (slot, step) pairs.
    fn steps<'a>(&self, w: &'a World) -> Vec<(usize, Option<&'a StoreOp>)> {
        let mut out = Vec::new();
        for worker in &w.workers {
            if let Worker::Busy(b) = worker {
                if let Some(op) = b
                    .pending
                    .as_ref()
                    .filter(|op| !matches!(op, StoreOp::Commit { .. }))
                {
                    if let Some(i) = self.inner.slot_of(op) {
                        out.push((i, Some(op)));
                    }
                }
            }
        }
        for c in &w.cleanups {
            if let Some(i) = self.inner.slot_of(&c.op) {
                out.push((i, Some(&c.op)));
            }
        }
        if self.inner.bounds.purge {
            for (i, slot) in w.store.iter().enumerate() {
                if slot.is_some() {
                    out.push((i, None));
                }
            }
        }
        out
    }

    /// The first step of `w` on which a recipe disagrees with core, described; `None` when all
    /// agree. Steps already checked on this thread (same slot, operation and time) are skipped.
    #[must_use]
    pub fn disagreement(&self, w: &World) -> Option<String> {
        BACKENDS.with(|cell| {
            let mut cell = cell.borrow_mut();
            let texts = (self.sqlite.clone(), self.redis.clone());
            if cell.as_ref().is_none_or(|b| b.texts != texts) {
                let sqlite = match SqliteRecipes::new(self.sqlite.clone()) {
                    Ok(s) => s,
                    Err(e) => return Some(format!("SQLite: {e}")),
                };
                let redis = match RedisRecipes::new(self.redis.clone()) {
                    Ok(r) => r,
                    Err(e) => return Some(format!("Lua: {e}")),
                };
                *cell = Some(Backends {
                    texts,
                    sqlite,
                    redis,
                    checked: HashSet::new(),
                });
            }
            let b = cell.as_mut()?;
            let now = IdempoModel::clock_ms(w);
            for (i, op) in self.steps(w) {
                let slot = &w.store[i];
                let key = (slot.clone(), op.cloned(), now);
                if b.checked.contains(&key) {
                    continue;
                }
                let step = op.map_or(Step::Purge, Step::Op);
                if let Err(e) = check_step(&mut b.sqlite, &mut b.redis, slot, step, now) {
                    return Some(e);
                }
                b.checked.insert(key);
            }
            None
        })
    }
}

impl Model for RecipeCheck {
    type State = World;
    type Action = Act;

    fn init_states(&self) -> Vec<World> {
        self.inner.init_states()
    }

    fn actions(&self, w: &World, actions: &mut Vec<Act>) {
        self.inner.actions(w, actions);
    }

    fn next_state(&self, w: &World, a: Act) -> Option<World> {
        self.inner.next_state(w, a)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![Property::always(R, |m: &Self, w: &World| {
            m.disagreement(w).is_none()
        })]
    }

    fn within_boundary(&self, w: &World) -> bool {
        self.inner.within_boundary(w)
    }
}
