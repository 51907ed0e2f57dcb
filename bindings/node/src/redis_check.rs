//! The Redis store's start-up check of its server (`idempo_core::redis_check`,
//! `spec/STORAGE.md` §5.1, §5.3) for the TypeScript `RedisStore`: the store sends `INFO cluster`
//! and `CONFIG GET`; what is refused, and the message naming the fix, are core's. Each function
//! answers the refusal's message, or `null`; TypeScript throws it as a `ConfigError`.
use idempo_core::options::Host;
use idempo_core::redis_check;
use napi_derive::napi;

/// The refusal of a single-node client whose server's `INFO cluster` text says
/// `cluster_enabled:1`, or `null`.
#[napi(catch_unwind)]
#[must_use]
pub fn redis_cluster_node_refusal(info: String) -> Option<String> {
    redis_check::check_not_cluster_node(Host::Node, redis_check::info_says_cluster(&info))
        .err()
        .map(|e| e.to_string())
}

/// One node's `maxmemory-policy` as `CONFIG GET` reported it (`policy` null: not reported).
#[napi(object)]
pub struct RedisNodePolicy {
    /// The node (`host:port`, or `the server`).
    pub node: String,
    /// Its `maxmemory-policy`.
    pub policy: Option<String>,
}

/// The refusal of the nodes' policies, or `null` when every node has `noeviction`.
#[napi(catch_unwind)]
#[must_use]
pub fn redis_policy_refusal(policies: Vec<RedisNodePolicy>) -> Option<String> {
    redis_check::check_policies(
        Host::Node,
        policies
            .iter()
            .map(|p| (p.node.as_str(), p.policy.as_deref())),
    )
    .err()
    .map(|e| e.to_string())
}

/// The refusal for the error text a `CONFIG GET` answered with, when it means the command itself
/// is refused (unknown command, ACL denial); `null` for any other error (a store error).
#[napi(catch_unwind)]
#[must_use]
pub fn redis_config_get_refusal(error: String) -> Option<String> {
    redis_check::config_get_refused(Host::Node, &error).map(|e| e.to_string())
}
