//! The Redis store's start-up check of its server (`idempo_core::redis_check`,
//! `spec/STORAGE.md` §5.1, §5.3) for `idempo.stores.redis`: the store sends `INFO cluster` and
//! `CONFIG GET`; what is refused, and the message naming the fix, are core's. Each function
//! answers the refusal's message, or `None`; the Python side raises it as `InvalidArgument`.
use idempo_core::options::Host;
use idempo_core::redis_check;
use pyo3::prelude::*;

/// The refusal of a single-node client whose server has `cluster_enabled`, or `None`.
#[pyfunction]
pub(crate) fn redis_cluster_node_refusal(cluster_enabled: bool) -> Option<String> {
    redis_check::check_not_cluster_node(Host::Python, cluster_enabled)
        .err()
        .map(|e| e.to_string())
}

/// The refusal of the `(node, maxmemory-policy)` pairs (`None` policy: not reported), or `None`
/// when every node has `noeviction`.
#[pyfunction]
pub(crate) fn redis_policy_refusal(policies: Vec<(String, Option<String>)>) -> Option<String> {
    redis_check::check_policies(
        Host::Python,
        policies.iter().map(|(n, p)| (n.as_str(), p.as_deref())),
    )
    .err()
    .map(|e| e.to_string())
}

/// The refusal for the error text a `CONFIG GET` answered with, when it means the command itself
/// is refused (unknown command, ACL denial); `None` for any other error (a store error).
#[pyfunction]
pub(crate) fn redis_config_get_refusal(error: &str) -> Option<String> {
    redis_check::config_get_refused(Host::Python, error).map(|e| e.to_string())
}
