//! The flow's store operations run on the memory store inside the same native call
//! (`ServerFlow.startInMemory`, `ServerFlow.handlerFinishedInMemory`): a translation shortcut,
//! not a decision. Core's flow asks for the primitive, core's memory store executes it and the
//! result goes back into the flow, exactly as the JS host loop would do with `MemoryStore` (one
//! synchronous call per primitive), minus the crossings into the addon and the objects between.
//!
//! Only the primitives of the common paths run here (claim, complete, release). Any other one,
//! and a primitive the store refuses (full, over quota: `MemoryError`), is handed back to the
//! host untouched, which runs it through its `MemoryStore` object as before (the refusal then
//! reaches the host's error handling and events; the store changed nothing).
use idempo_core::machine::memory::{MemoryStore, Partition};
use idempo_core::machine::{StoreOp, StoreResult};

/// Runs `op` on `store` at `now_ms`: core's store result, or `None` when the host must run it.
pub(crate) fn run(
    store: &mut MemoryStore,
    op: &StoreOp,
    now_ms: u64,
    partition: Option<Partition>,
) -> Option<StoreResult> {
    match op {
        StoreOp::Claim { .. } | StoreOp::Complete { .. } | StoreOp::Release { .. } => {
            store.run(op, partition, now_ms).ok()
        }
        _ => None,
    }
}
