//! A [`ServerFlow`] that can sit inside a model state.
//!
//! The checker fingerprints states by hashing them, and `ServerFlow` (core) derives only `Clone`
//! and `Debug`. Every field of the flow, its private phase included, appears in its derived
//! `Debug` output, so two flows are equal exactly when their `Debug` texts are. `FlowKey` hashes
//! and compares that text (streamed into the hasher, no allocation when hashing).
use std::fmt::{self, Write as _};
use std::hash::{Hash, Hasher};

use idempo_core::machine::ServerFlow;

/// A server flow with `Hash`/`Eq` defined by its complete `Debug` form.
#[derive(Clone)]
pub struct FlowKey(pub ServerFlow);

struct HashWriter<'a, H: Hasher>(&'a mut H);

impl<H: Hasher> fmt::Write for HashWriter<'_, H> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

impl Hash for FlowKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Writing into a hasher cannot fail; a Debug impl returning an error would only shorten
        // the hashed text, which keeps `Hash` consistent with `Eq` below.
        let _ = write!(HashWriter(state), "{:?}", self.0);
    }
}

impl PartialEq for FlowKey {
    fn eq(&self, other: &Self) -> bool {
        format!("{:?}", self.0) == format!("{:?}", other.0)
    }
}

impl Eq for FlowKey {}

impl fmt::Debug for FlowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The full flow (config included) is long; traces show the part that changes.
        write!(
            f,
            "Flow(token={:02x}, generation={:?}, finished={})",
            self.0.token().0[15],
            self.0.generation(),
            self.0.is_finished()
        )
    }
}
