//! The Redis and Redis Cluster store: core's Lua scripts (`idempo_core::recipes::REDIS_*`,
//! `spec/STORAGE.md` §5) on the `redis` crate, as the Python and Node Redis stores run them, so a
//! gateway and a Python or Node service can share one Redis.
//!
//! - A record is one hash under core's [`recipes::redis_key`] (`<prefix><64-hex scope key>`,
//!   default prefix `idempo:`), read back with core's [`RecordRow::from_redis_hash`]. Every script
//!   touches that one key, so a record lives in one Cluster slot.
//! - Scripts run by `EVALSHA` with a `SCRIPT LOAD` and retry on `NOSCRIPT` (`redis::Script`); the
//!   clock override (the last `ARGV`) is `''` in production.
//! - A single node is a `ConnectionManager` (it reconnects by itself); a cluster is the crate's
//!   async cluster connection seeded by `cluster_nodes` (it follows `MOVED` and failovers).
//! - Each primitive is bounded by `timeout_ms`; a timeout, a refused or dropped connection or any
//!   Redis error is a [`StoreError`], so core answers 503 and nothing is forwarded.
//! - At open the store refuses a single-node URL that points at a cluster node, and a server (every
//!   primary of a cluster) whose `maxmemory-policy` is not `noeviction` (an evicted claim is a
//!   double execution), unless `assume_noeviction` (where `CONFIG` is disabled).
//! - On a cluster the check runs again whenever the set of primaries changes (a failover, a
//!   resharding that added a node), as the Python and Node stores do: [`RedisStore::watch`] asks a
//!   node for `CLUSTER SLOTS` every [`TOPOLOGY_POLL`]. Until the new primaries are checked, and
//!   while one of them may evict, every primitive fails with the refusal (503, nothing forwarded).
//! - `purge_expired` deletes nothing and counts zero: Redis drops each hash by itself one minute
//!   after its expiry (`spec/STORAGE.md` §5.1).
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use idempo_core::machine::memory::PurgeCounts;
use idempo_core::machine::{StoreOp, StoreResult};
use idempo_core::options::Host;
use idempo_core::recipes;
use idempo_core::record::{Record, RecordRow};
use idempo_core::redis_check;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Script, Value};

use super::{Clock, StoreError, bounded};

/// How often [`RedisStore::watch`] asks a cluster node for the set of primaries.
pub const TOPOLOGY_POLL: Duration = Duration::from_secs(1);

/// Where the Redis store's records live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (`redis://host:port/db`).
    Node(String),
    /// A Redis Cluster, seeded by these nodes (`redis://host:port` each).
    Cluster(Vec<String>),
}

/// How the Redis store connects and bounds its commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// The server or the cluster.
    pub target: RedisTarget,
    /// `redis_store.prefix`: the prefix of every key written.
    pub prefix: String,
    /// How long one primitive may take, reconnecting included.
    pub timeout_ms: u64,
    /// `redis_store.assume_noeviction`: skip the start-up check of `maxmemory-policy`.
    pub assume_noeviction: bool,
}

impl RedisOptions {
    /// Options for `target` with core's defaults.
    #[must_use]
    pub fn new(target: RedisTarget) -> Self {
        Self {
            target,
            prefix: idempo_core::options::REDIS_PREFIX.to_owned(),
            timeout_ms: idempo_core::options::STORE_TIMEOUT_MS,
            assume_noeviction: false,
        }
    }
}

/// Core's scripts, each with its SHA1 for `EVALSHA`.
struct Scripts {
    claim: Script,
    get: Script,
    takeover: Script,
    mark_unknown: Script,
    complete: Script,
    release: Script,
    renew: Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            claim: Script::new(recipes::REDIS_CLAIM),
            get: Script::new(recipes::REDIS_GET),
            takeover: Script::new(recipes::REDIS_TAKEOVER),
            mark_unknown: Script::new(recipes::REDIS_MARK_UNKNOWN),
            complete: Script::new(recipes::REDIS_COMPLETE),
            release: Script::new(recipes::REDIS_RELEASE),
            renew: Script::new(recipes::REDIS_RENEW),
        }
    }
}

/// A connection to a single server or to a cluster (both cheap to clone, shared by all requests).
#[derive(Clone)]
enum Conn {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

struct Inner {
    conn: Conn,
    scripts: Scripts,
    prefix: Vec<u8>,
    timeout: Duration,
    clock: Clock,
    assume_noeviction: bool,
    /// The cluster's primaries as last checked, and why primitives are refused now (a primary
    /// that may evict, or a new set of primaries not checked yet).
    topology: RwLock<Topology>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Topology {
    /// `host:port` of every primary the last successful check covered, sorted.
    checked: Vec<String>,
    /// Set while the primaries as they are now have not passed the check.
    refused: Option<String>,
}

/// What one [`RedisStore::recheck`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recheck {
    /// Nothing to watch: a single server, or `assume_noeviction`.
    NotWatched,
    /// The same primaries as at the last check, which passed.
    Unchanged,
    /// The primaries changed (or a refusal ended) and every one has `noeviction`.
    Checked {
        /// `host:port` of each primary.
        primaries: Vec<String>,
    },
    /// A primary may evict records: primitives are refused until it is fixed.
    Refused {
        /// `host:port` of each primary.
        primaries: Vec<String>,
        /// Core's refusal, naming the node, its policy and the fix.
        why: String,
    },
}

/// A Redis or Redis Cluster store running core's scripts.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.inner.conn {
            Conn::Node(_) => "node",
            Conn::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore")
            .field("kind", &kind)
            .field("prefix", &String::from_utf8_lossy(&self.inner.prefix))
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

/// One argument of a script.
enum Arg<'a> {
    Bytes(&'a [u8]),
    Text(&'a str),
    Ms(u64),
}

async fn invoke<C: ConnectionLike>(
    c: &mut C,
    script: &Script,
    key: &[u8],
    args: &[Arg<'_>],
    now: &str,
) -> Result<Value, redis::RedisError> {
    let mut inv = script.key(key);
    for a in args {
        match a {
            Arg::Bytes(b) => inv.arg(*b),
            Arg::Text(t) => inv.arg(*t),
            Arg::Ms(ms) => inv.arg(ms.to_string()),
        };
    }
    inv.arg(now);
    inv.invoke_async(c).await
}

impl RedisStore {
    /// Connects (within `timeout_ms`), then checks the server: a single-node URL must not point
    /// at a cluster node, and `maxmemory-policy` must be `noeviction` on the server or on every
    /// primary of the cluster (unless `assume_noeviction`).
    ///
    /// # Errors
    /// [`StoreError::Config`] for a URL the crate refuses or a server that fails a check (the
    /// message names the fix); [`StoreError::Redis`] or [`StoreError::Timeout`] when the server
    /// does not answer.
    pub async fn open(options: &RedisOptions, clock: Clock) -> Result<Self, StoreError> {
        let timeout = Duration::from_millis(options.timeout_ms.max(1));
        let conn = bounded(timeout, "connect", connect(&options.target, timeout)).await?;
        let store = Self {
            inner: Arc::new(Inner {
                conn,
                scripts: Scripts::new(),
                prefix: options.prefix.as_bytes().to_vec(),
                timeout,
                clock,
                assume_noeviction: options.assume_noeviction,
                topology: RwLock::new(Topology::default()),
            }),
        };
        bounded(
            timeout,
            "check",
            store.check_server(options.assume_noeviction),
        )
        .await?;
        Ok(store)
    }

    /// The start-up checks of the server (or of every cluster primary).
    async fn check_server(&self, assume_noeviction: bool) -> Result<(), StoreError> {
        match &self.inner.conn {
            Conn::Node(c) => {
                let mut c = c.clone();
                let info: Result<Vec<u8>, _> =
                    redis::cmd("INFO").arg("cluster").query_async(&mut c).await;
                // INFO may be disabled: then there is nothing to learn from it.
                if let Ok(info) = info {
                    let cluster = redis_check::info_says_cluster(&String::from_utf8_lossy(&info));
                    redis_check::check_not_cluster_node(Host::Gateway, cluster)
                        .map_err(|e| StoreError::Config(e.to_string()))?;
                }
                if !assume_noeviction {
                    let policy = policy_of(
                        redis::cmd("CONFIG")
                            .arg("GET")
                            .arg("maxmemory-policy")
                            .query_async(&mut c)
                            .await,
                    )?;
                    refuse_policies(&[("the server".to_owned(), policy)])?;
                }
                Ok(())
            }
            Conn::Cluster(c) => {
                if assume_noeviction {
                    return Ok(());
                }
                let mut c = c.clone();
                let primaries = cluster_primaries(&mut c).await?;
                check_cluster_policies(&mut c, &primaries).await?;
                self.set_topology(Topology {
                    checked: names(&primaries),
                    refused: None,
                });
                Ok(())
            }
        }
    }

    fn set_topology(&self, t: Topology) {
        *self
            .inner
            .topology
            .write()
            .unwrap_or_else(PoisonError::into_inner) = t;
    }

    fn topology(&self) -> Topology {
        self.inner
            .topology
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Why primitives are refused now, if they are.
    #[must_use]
    pub fn refusal(&self) -> Option<String> {
        self.inner
            .topology
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .refused
            .clone()
    }

    /// On a cluster (without `assume_noeviction`): reads the set of primaries and, when it is
    /// not the set the last successful check covered (or primitives are refused now), checks
    /// every primary's `maxmemory-policy` again. A primary that may evict, or a new set whose
    /// check could not run, refuses every primitive until a later check passes.
    ///
    /// # Errors
    /// [`StoreError`] when the primaries cannot be read or checked (the store's state is then as
    /// described above).
    pub async fn recheck(&self) -> Result<Recheck, StoreError> {
        let Conn::Cluster(c) = &self.inner.conn else {
            return Ok(Recheck::NotWatched);
        };
        if self.inner.assume_noeviction {
            return Ok(Recheck::NotWatched);
        }
        let mut c = c.clone();
        let timeout = self.inner.timeout;
        let primaries = bounded(timeout, "check", cluster_primaries(&mut c)).await?;
        let now = names(&primaries);
        let before = self.topology();
        if before.refused.is_none() && before.checked == now {
            return Ok(Recheck::Unchanged);
        }
        match bounded(timeout, "check", check_cluster_policies(&mut c, &primaries)).await {
            Ok(()) => {
                self.set_topology(Topology {
                    checked: now.clone(),
                    refused: None,
                });
                Ok(Recheck::Checked { primaries: now })
            }
            Err(StoreError::Config(why)) => {
                self.set_topology(Topology {
                    checked: before.checked,
                    refused: Some(why.clone()),
                });
                Ok(Recheck::Refused {
                    primaries: now,
                    why,
                })
            }
            Err(e) => {
                self.set_topology(Topology {
                    checked: before.checked,
                    refused: Some(format!(
                        "the Redis Cluster's primaries changed ({}) and their maxmemory-policy \
                         could not be checked yet: {e}",
                        now.join(", ")
                    )),
                });
                Err(e)
            }
        }
    }

    /// On a cluster (without `assume_noeviction`): a task that runs [`RedisStore::recheck`]
    /// every [`TOPOLOGY_POLL`] and logs each change, until aborted. `None` otherwise.
    #[must_use]
    pub fn watch(&self) -> Option<tokio::task::JoinHandle<()>> {
        if !matches!(self.inner.conn, Conn::Cluster(_)) || self.inner.assume_noeviction {
            return None;
        }
        let store = self.clone();
        Some(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(TOPOLOGY_POLL);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            loop {
                ticker.tick().await;
                match store.recheck().await {
                    Ok(Recheck::NotWatched | Recheck::Unchanged) => failing = false,
                    Ok(Recheck::Checked { primaries }) => {
                        failing = false;
                        crate::log::info(
                            "Redis Cluster primaries checked: noeviction on every primary",
                            &[("primaries", serde_json::json!(primaries))],
                        );
                    }
                    Ok(Recheck::Refused { primaries, why }) => {
                        if !failing {
                            crate::log::error(
                                "a Redis Cluster primary may evict records: every request is \
                                 refused (503) until it is fixed",
                                &[
                                    ("primaries", serde_json::json!(primaries)),
                                    ("error", serde_json::json!(why)),
                                ],
                            );
                        }
                        failing = true;
                    }
                    Err(e) => {
                        if !failing {
                            crate::log::warn(
                                "cannot read the Redis Cluster's primaries",
                                &[("error", serde_json::json!(e.to_string()))],
                            );
                        }
                        failing = true;
                    }
                }
            }
        }))
    }

    fn key(&self, scope: &idempo_core::scope::ScopeId) -> Vec<u8> {
        recipes::redis_key(&self.inner.prefix, scope.as_bytes())
    }

    async fn eval(
        &self,
        script: &Script,
        key: &[u8],
        args: &[Arg<'_>],
    ) -> Result<Value, StoreError> {
        let now = self
            .inner
            .clock
            .override_ms()
            .map(|t| t.to_string())
            .unwrap_or_default();
        let reply = match &self.inner.conn {
            Conn::Node(c) => invoke(&mut c.clone(), script, key, args, &now).await,
            Conn::Cluster(c) => invoke(&mut c.clone(), script, key, args, &now).await,
        };
        Ok(reply?)
    }

    /// Runs one primitive (one script on the record's key) within `timeout_ms`.
    ///
    /// # Errors
    /// [`StoreError`] for any Redis failure, timeout or invalid reply.
    pub async fn run(&self, op: StoreOp) -> Result<StoreResult, StoreError> {
        if let Some(why) = self.refusal() {
            return Err(StoreError::Config(why));
        }
        let name = op.name();
        bounded(self.inner.timeout, name, self.run_unbounded(op)).await
    }

    async fn run_unbounded(&self, op: StoreOp) -> Result<StoreResult, StoreError> {
        let s = &self.inner.scripts;
        match op {
            StoreOp::Claim {
                scope,
                fingerprint,
                token,
                lease_ms,
                ttl_ms,
            } => {
                let args = [
                    Arg::Text(fingerprint.as_str()),
                    Arg::Bytes(token.as_bytes()),
                    Arg::Ms(lease_ms),
                    Arg::Ms(ttl_ms),
                ];
                claim_reply(&self.eval(&s.claim, &self.key(&scope), &args).await?)
            }
            StoreOp::Get { scope } => {
                let reply = self.eval(&s.get, &self.key(&scope), &[]).await?;
                let [now, flat] = items::<2>(&reply, "get")?;
                Ok(StoreResult::Got {
                    record: record_of(flat)?,
                    now_ms: u64_of(now)?,
                })
            }
            StoreOp::TakeOver {
                scope,
                seen_token,
                new_token,
                lease_ms,
            } => {
                let args = [
                    Arg::Bytes(seen_token.as_bytes()),
                    Arg::Bytes(new_token.as_bytes()),
                    Arg::Ms(lease_ms),
                ];
                let reply = self.eval(&s.takeover, &self.key(&scope), &args).await?;
                Ok(StoreResult::TookOver(match reply {
                    Value::Nil | Value::Boolean(false) => None,
                    v => Some(u32_of(&v)?),
                }))
            }
            StoreOp::MarkUnknown {
                scope,
                seen_token,
                ttl_ms,
            } => {
                let args = [Arg::Bytes(seen_token.as_bytes()), Arg::Ms(ttl_ms)];
                let reply = self.eval(&s.mark_unknown, &self.key(&scope), &args).await?;
                Ok(StoreResult::MarkedUnknown(applied(&reply)?))
            }
            StoreOp::Complete {
                scope,
                token,
                response,
                ttl_ms,
            } => {
                let args = [
                    Arg::Bytes(token.as_bytes()),
                    Arg::Bytes(&response),
                    Arg::Ms(ttl_ms),
                ];
                let reply = self.eval(&s.complete, &self.key(&scope), &args).await?;
                Ok(StoreResult::Completed(applied(&reply)?))
            }
            StoreOp::Release { scope, token } => {
                let args = [Arg::Bytes(token.as_bytes())];
                let reply = self.eval(&s.release, &self.key(&scope), &args).await?;
                Ok(StoreResult::Released(applied(&reply)?))
            }
            StoreOp::Renew {
                scope,
                token,
                lease_ms,
            } => {
                let args = [Arg::Bytes(token.as_bytes()), Arg::Ms(lease_ms)];
                let reply = self.eval(&s.renew, &self.key(&scope), &args).await?;
                Ok(StoreResult::Renewed(applied(&reply)?))
            }
            StoreOp::Commit { .. } => Err(StoreError::Unsupported("COMMIT")),
        }
    }

    /// Primitive 8: nothing to do (`spec/STORAGE.md` §5.1: each hash expires by itself one minute
    /// after the record's expiry), so it deletes nothing and counts zero.
    ///
    /// # Errors
    /// None today; the signature is the other stores'.
    pub async fn purge_expired(&self, _batch: u64) -> Result<PurgeCounts, StoreError> {
        Ok(PurgeCounts::default())
    }

    /// `PING` (readiness: the server, or a node of the cluster, answers) within `timeout_ms`.
    ///
    /// # Errors
    /// [`StoreError`] when it does not.
    pub async fn ping(&self) -> Result<(), StoreError> {
        if let Some(why) = self.refusal() {
            return Err(StoreError::Config(why));
        }
        bounded(self.inner.timeout, "ping", async {
            let ping = redis::cmd("PING");
            let _: Value = match &self.inner.conn {
                Conn::Node(c) => ping.query_async(&mut c.clone()).await?,
                Conn::Cluster(c) => ping.query_async(&mut c.clone()).await?,
            };
            Ok(())
        })
        .await
    }
}

/// Opens the connection (a manager for one server, the cluster connection for a cluster).
async fn connect(target: &RedisTarget, timeout: Duration) -> Result<Conn, StoreError> {
    match target {
        RedisTarget::Node(url) => {
            let client = redis::Client::open(url.as_str())
                .map_err(|e| StoreError::Config(format!("url: {e}")))?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(timeout)
                .set_response_timeout(timeout)
                .set_number_of_retries(2)
                .set_max_delay(200);
            Ok(Conn::Node(
                ConnectionManager::new_with_config(client, config).await?,
            ))
        }
        RedisTarget::Cluster(nodes) => {
            let client = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .build()
                .map_err(|e| StoreError::Config(format!("cluster_nodes: {e}")))?;
            Ok(Conn::Cluster(client.get_async_connection().await?))
        }
    }
}

fn corrupt(what: &str, v: &Value) -> StoreError {
    StoreError::Corrupt(format!("unexpected Redis reply to {what}: {v:?}"))
}

/// The `N` items of an array reply.
fn items<'a, const N: usize>(v: &'a Value, what: &str) -> Result<&'a [Value; N], StoreError> {
    match v {
        Value::Array(items) => items.as_slice().try_into().map_err(|_| corrupt(what, v)),
        _ => Err(corrupt(what, v)),
    }
}

/// A Lua number (`Int`) or a decimal string (`int()` in the scripts).
fn int_of(v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(n) => Ok(*n),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| corrupt("a number", v)),
        Value::SimpleString(t) => t.parse().map_err(|_| corrupt("a number", v)),
        _ => Err(corrupt("a number", v)),
    }
}

fn u64_of(v: &Value) -> Result<u64, StoreError> {
    u64::try_from(int_of(v)?).map_err(|_| corrupt("a time", v))
}

fn u32_of(v: &Value) -> Result<u32, StoreError> {
    u32::try_from(int_of(v)?).map_err(|_| corrupt("a generation", v))
}

/// A write script's `1` (applied) or `0`.
fn applied(v: &Value) -> Result<bool, StoreError> {
    match int_of(v)? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(corrupt("a write", v)),
    }
}

/// The record of an `HGETALL` reply (flat field/value list), by core's decoding; none when empty.
fn record_of(flat: &Value) -> Result<Option<Record>, StoreError> {
    let Value::Array(items) = flat else {
        return Err(corrupt("HGETALL", flat));
    };
    if items.len() % 2 != 0 {
        return Err(corrupt("HGETALL", flat));
    }
    let mut pairs = Vec::with_capacity(items.len() / 2);
    for pair in items.chunks_exact(2) {
        match pair {
            [Value::BulkString(k), Value::BulkString(v)] => {
                pairs.push((k.as_slice(), v.as_slice()))
            }
            _ => return Err(corrupt("HGETALL", flat)),
        }
    }
    let Some(row) =
        RecordRow::from_redis_hash(pairs).map_err(|e| StoreError::Corrupt(e.to_string()))?
    else {
        return Ok(None);
    };
    Record::from_row(row)
        .map(Some)
        .map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// The claim's `{1, now, generation}` or `{0, now, HGETALL}`.
fn claim_reply(reply: &Value) -> Result<StoreResult, StoreError> {
    let [flag, now, rest] = items::<3>(reply, "claim")?;
    let now_ms = u64_of(now)?;
    if applied(flag)? {
        return Ok(StoreResult::Claimed {
            generation: u32_of(rest)?,
            now_ms,
        });
    }
    match record_of(rest)? {
        Some(record) => Ok(StoreResult::Existing { record, now_ms }),
        None => Err(StoreError::Corrupt(
            "claim found a record but HGETALL was empty".to_owned(),
        )),
    }
}

/// `maxmemory-policy` from a `CONFIG GET` reply (a `[name, value]` array or a map); a refused
/// command is the configuration error that names the fix.
fn policy_of(reply: Result<Value, redis::RedisError>) -> Result<Option<String>, StoreError> {
    let reply = match reply {
        Ok(v) => v,
        Err(e) => {
            let mut text = e.to_string();
            if e.code() == Some("NOPERM") && !text.contains("NOPERM") {
                text = format!("NOPERM {text}");
            }
            if let Some(refusal) = redis_check::config_get_refused(Host::Gateway, &text) {
                return Err(StoreError::Config(refusal.to_string()));
            }
            return Err(StoreError::Redis(e));
        }
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    Ok(match &reply {
        Value::Array(items) => items
            .chunks_exact(2)
            .find(|p| text(&p[0]).as_deref() == Some("maxmemory-policy"))
            .and_then(|p| text(&p[1])),
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| text(k).as_deref() == Some("maxmemory-policy"))
            .and_then(|(_, v)| text(v)),
        _ => None,
    })
}

/// Refuses any node whose policy is not `noeviction` (core's `redis_check`, `spec/STORAGE.md`
/// §5.1).
fn refuse_policies(policies: &[(String, Option<String>)]) -> Result<(), StoreError> {
    redis_check::check_policies(
        Host::Gateway,
        policies.iter().map(|(n, p)| (n.as_str(), p.as_deref())),
    )
    .map_err(|e| StoreError::Config(e.to_string()))
}

/// The primaries of the cluster, as one of its nodes sees them (`CLUSTER SLOTS`), sorted.
async fn cluster_primaries(c: &mut ClusterConnection) -> Result<Vec<(String, u16)>, StoreError> {
    let slots = c
        .route_command(
            &redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await?;
    let mut list = primaries(&slots)?;
    list.sort();
    Ok(list)
}

/// Core's check of every primary's `maxmemory-policy`.
async fn check_cluster_policies(
    c: &mut ClusterConnection,
    primaries: &[(String, u16)],
) -> Result<(), StoreError> {
    let mut policies = Vec::new();
    for (host, port) in primaries {
        let reply = c
            .route_command(
                &redis::cmd("CONFIG")
                    .arg("GET")
                    .arg(redis_check::POLICY_PARAMETER)
                    .clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                }),
            )
            .await;
        policies.push((format!("{host}:{port}"), policy_of(reply)?));
    }
    refuse_policies(&policies)
}

fn names(primaries: &[(String, u16)]) -> Vec<String> {
    primaries.iter().map(|(h, p)| format!("{h}:{p}")).collect()
}

/// The primaries (`host`, `port`) of a `CLUSTER SLOTS` reply, without duplicates.
fn primaries(slots: &Value) -> Result<Vec<(String, u16)>, StoreError> {
    let Value::Array(ranges) = slots else {
        return Err(corrupt("CLUSTER SLOTS", slots));
    };
    let mut out: Vec<(String, u16)> = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            return Err(corrupt("CLUSTER SLOTS", slots));
        };
        let Some(Value::Array(node)) = fields.get(2) else {
            return Err(corrupt("CLUSTER SLOTS", slots));
        };
        let (Some(host), Some(port)) = (node.first(), node.get(1)) else {
            return Err(corrupt("CLUSTER SLOTS", slots));
        };
        let host = match host {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::SimpleString(s) => s.clone(),
            _ => return Err(corrupt("CLUSTER SLOTS", slots)),
        };
        let port = u16::try_from(int_of(port)?).map_err(|_| corrupt("CLUSTER SLOTS", slots))?;
        if !out.iter().any(|(h, p)| *h == host && *p == port) {
            out.push((host, port));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &[u8]) -> Value {
        Value::BulkString(s.to_vec())
    }

    #[test]
    fn a_claim_reply_decodes() {
        let won = Value::Array(vec![Value::Int(1), bulk(b"1700000000000"), bulk(b"2")]);
        assert_eq!(
            claim_reply(&won).ok(),
            Some(StoreResult::Claimed {
                generation: 2,
                now_ms: 1_700_000_000_000
            })
        );
        let empty = Value::Array(vec![Value::Int(0), bulk(b"5"), Value::Array(vec![])]);
        assert!(matches!(claim_reply(&empty), Err(StoreError::Corrupt(_))));
        assert!(matches!(
            claim_reply(&Value::Int(1)),
            Err(StoreError::Corrupt(_))
        ));
    }

    #[test]
    fn policies_other_than_noeviction_are_refused() {
        let reply = Value::Array(vec![bulk(b"maxmemory-policy"), bulk(b"allkeys-lru")]);
        let policy = policy_of(Ok(reply)).ok().flatten();
        assert_eq!(policy.as_deref(), Some("allkeys-lru"));
        let r = refuse_policies(&[("the server".to_owned(), policy)]);
        let Err(StoreError::Config(m)) = r else {
            panic!("{r:?}")
        };
        assert!(m.contains("the server has 'allkeys-lru'"), "{m}");
        assert!(refuse_policies(&[("n".to_owned(), Some("noeviction".to_owned()))]).is_ok());
    }

    #[test]
    fn cluster_slots_name_each_primary_once() {
        let node =
            |port: i64| Value::Array(vec![bulk(b"127.0.0.1"), Value::Int(port), bulk(b"id")]);
        let slots = Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(5), node(7000), node(7003)]),
            Value::Array(vec![Value::Int(6), Value::Int(9), node(7001)]),
            Value::Array(vec![Value::Int(10), Value::Int(12), node(7000)]),
        ]);
        assert_eq!(
            primaries(&slots).ok(),
            Some(vec![
                ("127.0.0.1".to_owned(), 7000),
                ("127.0.0.1".to_owned(), 7001)
            ])
        );
    }

    #[test]
    fn a_bad_url_is_a_config_error() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        let Ok(rt) = rt else { return };
        let r = rt.block_on(RedisStore::open(
            &RedisOptions::new(RedisTarget::Node("http://nope".to_owned())),
            Clock::System,
        ));
        assert!(matches!(r, Err(StoreError::Config(_))), "{r:?}");
    }
}
