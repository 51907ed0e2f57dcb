//! The Redis store's start-up check of its server (`spec/STORAGE.md` §5.1, §5.3), as decisions:
//! the host sends `INFO cluster` and `CONFIG GET maxmemory-policy` (to every primary of a
//! cluster) and hands the answers here; what is refused, and the words that name the fix, are
//! written once for every host (Python, Node, the gateway).
//!
//! - A single-node client pointed at a Redis Cluster node is refused: most keys answer `MOVED`.
//! - Every node must report `maxmemory-policy noeviction`: any other policy may evict a live
//!   record, and an evicted claim is a double execution.
//! - A `CONFIG GET` refused by the server (`CONFIG` disabled or renamed, as on some managed
//!   services, or denied to the user by an ACL) is a configuration error naming the way out
//!   (check the policy by hand and set `assume_noeviction`); any other error is the store's
//!   (unavailable), not a verdict.

use thiserror::Error;

use crate::options::Host;

/// The parameter the check reads with `CONFIG GET`.
pub const POLICY_PARAMETER: &str = "maxmemory-policy";
/// The one eviction policy under which no record is ever evicted.
pub const REQUIRED_POLICY: &str = "noeviction";
/// The option that skips the policy check (where `CONFIG` is disabled: check it by hand).
pub const ASSUME_NOEVICTION: &str = "assume_noeviction";
/// The Python-only option that accepts an evicting server (documented as unsafe).
pub const ALLOW_EVICTION: &str = "allow_eviction";

/// Why a Redis server is refused at start. Each message names the fix in the host's spelling.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ServerRefusal {
    /// A single-node client was pointed at a Redis Cluster node.
    #[error(
        "this Redis server is a Redis Cluster node: a single-node client gets MOVED for most keys; {fix}"
    )]
    ClusterNode {
        /// How to connect as a cluster client, in the host's words.
        fix: String,
    },
    /// At least one node's `maxmemory-policy` may evict records.
    #[error(
        "Redis maxmemory-policy must be 'noeviction' on every node ({nodes}): an evicted claim is a double execution; {fix}"
    )]
    Evicting {
        /// Each offending node with its policy (`host:port has 'allkeys-lru'`).
        nodes: String,
        /// The fix: the server's setting, and the host's unsafe escape where it has one.
        fix: String,
    },
    /// The server refused `CONFIG GET` itself (unknown command, or an ACL denial).
    #[error(
        "Redis refused CONFIG GET maxmemory-policy ({reason}): CONFIG is disabled, renamed or not permitted for this user (as on some managed services), so idempo cannot check that claims are never evicted (an evicted claim is a double execution). Check that maxmemory-policy is 'noeviction' yourself and {fix}, or grant +config|get"
    )]
    ConfigRefused {
        /// The server's error text.
        reason: String,
        /// How to skip the check, in the host's spelling.
        fix: String,
    },
}

/// Refuses a single-node client whose server reports `cluster_enabled:1` in `INFO cluster`.
///
/// # Errors
/// [`ServerRefusal::ClusterNode`] when `cluster_enabled`.
pub fn check_not_cluster_node(host: Host, cluster_enabled: bool) -> Result<(), ServerRefusal> {
    if !cluster_enabled {
        return Ok(());
    }
    let fix = match host {
        Host::Python => "pass cluster=True with the URL, or a redis.cluster.RedisCluster client",
        Host::Node => "pass `cluster: true` with the url, or an ioredis Cluster client",
        Host::Gateway => "list the nodes in [store] cluster_nodes = [...] instead of url",
    };
    Err(ServerRefusal::ClusterNode {
        fix: fix.to_owned(),
    })
}

/// `cluster_enabled` from the text of `INFO cluster` (`cluster_enabled:1` on its own line).
#[must_use]
pub fn info_says_cluster(info: &str) -> bool {
    info.lines().any(|line| line.trim() == "cluster_enabled:1")
}

/// Checks each node's `maxmemory-policy` (`None`: the node did not report one, refused too).
/// `node` names the node in the refusal (`127.0.0.1:6379`, or `the server`).
///
/// # Errors
/// [`ServerRefusal::Evicting`] naming every node whose policy is not `noeviction`.
pub fn check_policies<'a, I>(host: Host, policies: I) -> Result<(), ServerRefusal>
where
    I: IntoIterator<Item = (&'a str, Option<&'a str>)>,
{
    let mut wrong: Vec<(&str, Option<&str>)> = policies
        .into_iter()
        .filter(|(_, policy)| *policy != Some(REQUIRED_POLICY))
        .collect();
    if wrong.is_empty() {
        return Ok(());
    }
    wrong.sort_unstable();
    let nodes = wrong
        .iter()
        .map(|(node, policy)| match policy {
            Some(p) => format!("{node} has '{p}'"),
            None => format!("{node} reports none"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let fix = match host {
        Host::Python => format!(
            "set maxmemory-policy noeviction on the server (CONFIG SET and redis.conf), or pass \
             {} (unsafe)",
            host.switch_on(ALLOW_EVICTION)
        ),
        Host::Node | Host::Gateway => format!(
            "set maxmemory-policy noeviction on the server (CONFIG SET and redis.conf), or set \
             {} only if eviction is ruled out otherwise",
            host.switch_on(ASSUME_NOEVICTION)
        ),
    };
    Err(ServerRefusal::Evicting { nodes, fix })
}

/// The refusal for an error `CONFIG GET` answered with, when that error means the command itself
/// is refused (`unknown command`, `NOPERM`); `None` for any other error, which the host reports
/// as the store being unavailable.
#[must_use]
pub fn config_get_refused(host: Host, error: &str) -> Option<ServerRefusal> {
    let refused =
        error.contains("NOPERM") || error.to_ascii_lowercase().contains("unknown command");
    refused.then(|| ServerRefusal::ConfigRefused {
        reason: error.trim().to_owned(),
        fix: format!("set {}", host.switch_on(ASSUME_NOEVICTION)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_noeviction_passes_and_every_offender_is_named() {
        assert_eq!(
            check_policies(Host::Node, [("a:1", Some("noeviction"))]),
            Ok(())
        );
        let err = check_policies(
            Host::Node,
            [
                ("b:2", Some("allkeys-lru")),
                ("a:1", Some("noeviction")),
                ("c:3", None),
            ],
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("b:2 has 'allkeys-lru', c:3 reports none"),
            "{text}"
        );
        assert!(!text.contains("a:1"), "{text}");
        let py = check_policies(Host::Python, [("the server", Some("volatile-lru"))]).unwrap_err();
        assert!(py.to_string().contains("allow_eviction=True"), "{py}");
        let gw = check_policies(Host::Gateway, [("the server", Some("allkeys-lru"))]).unwrap_err();
        assert!(gw.to_string().contains("assume_noeviction = true"), "{gw}");
    }

    #[test]
    fn a_refused_config_get_names_the_option_in_the_host_s_spelling() {
        let text = "NOPERM User x has no permissions to run the 'config|get' command";
        for (host, spelled) in [
            (Host::Python, "assume_noeviction=True"),
            (Host::Node, "assumeNoeviction: true"),
            (Host::Gateway, "assume_noeviction = true"),
        ] {
            let err = config_get_refused(host, text).expect("refused");
            let msg = err.to_string();
            assert!(msg.contains(spelled) && msg.contains("NOPERM"), "{msg}");
        }
        assert!(config_get_refused(Host::Node, "ERR unknown command 'CONFIG'").is_some());
        assert!(config_get_refused(Host::Node, "LOADING Redis is loading").is_none());
    }

    #[test]
    fn a_cluster_node_is_refused_for_a_single_node_client() {
        assert!(info_says_cluster("# Cluster\r\ncluster_enabled:1\r\n"));
        assert!(!info_says_cluster("# Cluster\r\ncluster_enabled:0\r\n"));
        assert_eq!(check_not_cluster_node(Host::Gateway, false), Ok(()));
        let err = check_not_cluster_node(Host::Gateway, true).unwrap_err();
        assert!(err.to_string().contains("cluster_nodes"), "{err}");
    }
}
