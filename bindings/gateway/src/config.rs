//! The gateway's configuration: one TOML file, validated at start.
//!
//! Every error names the line and column it comes from (TOML syntax and type errors through
//! `toml`'s spans, semantic errors through [`toml::Spanned`] fields). The per-route options are
//! core's vocabulary ([`ConfigOptions::NAMES`], `spec/OPTIONS.md`) with core's defaults; the
//! route's [`Config`] is built by [`ConfigOptions::build`], never here.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper::Uri;
use idempo_core::fingerprint::{FingerprintConfig, Fingerprinter};
use idempo_core::machine::ScopeRule;
use idempo_core::options;
use idempo_core::policy::{Config, ConfigError, ConfigOptions, TakeoverPolicy};
use serde::Deserialize;
use toml::Spanned;

use crate::jwt::{self, JwtSettings, JwtVerifier};
use crate::route::{RouteTemplate, TemplateError};

/// Default time an upstream has to answer with its response head (and between body chunks).
pub const DEFAULT_UPSTREAM_TIMEOUT_MS: u64 = 30_000;
/// Default time graceful shutdown leaves in-flight requests to finish.
pub const DEFAULT_SHUTDOWN_DEADLINE_MS: u64 = 10_000;
/// Default interval of the purge task.
pub const DEFAULT_PURGE_INTERVAL_MS: u64 = 60_000;

/// One configuration error, with the line and column (1-based) it points at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct ConfigIssue {
    /// The file's name as given.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path given.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file was read but is not a valid configuration; every issue found.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<ConfigIssue>),
}

/// Where the memory, SQLite, PostgreSQL or Redis store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// Core's bounded in-memory store.
    Memory {
        /// Records kept at most (`memory_store.max_entries`).
        max_entries: usize,
        /// Bytes kept at most (`memory_store.max_bytes`).
        max_bytes: usize,
    },
    /// A SQLite file (`spec/STORAGE.md` §7), shareable with the Python and Node stores.
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// `sqlite_store.busy_timeout_ms`.
        busy_timeout_ms: u64,
    },
    /// A PostgreSQL table (`spec/STORAGE.md` §4), shareable with the Python and Node stores.
    Postgres(crate::store::postgres::PostgresOptions),
    /// Redis or a Redis Cluster (`spec/STORAGE.md` §5), shareable with the Python and Node stores.
    Redis(crate::store::redis::RedisOptions),
}

/// One protected route.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// The method, upper case.
    pub method: String,
    /// The path template (the scope's route).
    pub template: RouteTemplate,
    /// The upstream's name.
    pub upstream: String,
    /// The upstream's base URL.
    pub upstream_base: Uri,
    /// Core's per-route policy.
    pub config: Arc<Config>,
    /// The route's prepared fingerprinter (headers, exclusions).
    pub fingerprinter: Arc<Fingerprinter>,
    /// Where the principal comes from.
    pub scope_rule: ScopeRule,
}

/// Where the principal of a protected request comes from (`[principal]`).
#[derive(Debug, Clone)]
pub enum PrincipalSource {
    /// A header set by the trusted auth proxy in front of the gateway (`header = "..."`).
    Header(String),
    /// A claim of a bearer JWT verified with the keys of a JWKS file (`jwt = { ... }`).
    Jwt(Arc<JwtVerifier>),
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// The request header carrying the key (`host.header_name`).
    pub header_name: String,
    /// Where the principal comes from, if anywhere (without it every route is public).
    pub principal: Option<PrincipalSource>,
    /// Time the upstream has for its response head and between body chunks.
    pub upstream_timeout_ms: u64,
    /// Time graceful shutdown leaves in-flight requests.
    pub shutdown_deadline_ms: u64,
    /// Interval of the purge task.
    pub purge_interval_ms: u64,
    /// Records one purge call deletes at most (`purge.batch`).
    pub purge_batch: u64,
    /// The header the downstream key is sent to the upstream in.
    pub downstream_key_header: String,
    /// The store.
    pub store: StoreConfig,
    /// The routes, in file order (the first match wins).
    pub routes: Vec<RouteConfig>,
    /// Where requests that match no route go, unprotected (`fallback_upstream`); `None`: 404.
    pub fallback: Option<Uri>,
    /// A separate address for `/healthz`, `/readyz` and `/metrics` (`operations_listen`); `None`:
    /// they are answered on `listen`, before routing.
    pub operations_listen: Option<SocketAddr>,
}

type Opt<T> = Option<Spanned<T>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Spanned<String>,
    header_name: Opt<String>,
    downstream_key_header: Opt<String>,
    upstream_timeout_ms: Opt<u64>,
    shutdown_deadline_ms: Opt<u64>,
    purge_interval_ms: Opt<u64>,
    purge_batch: Opt<u64>,
    fallback_upstream: Opt<String>,
    operations_listen: Opt<String>,
    store: Spanned<RawStore>,
    principal: Opt<RawPrincipal>,
    #[serde(default)]
    upstreams: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    routes: Vec<Spanned<RawRoute>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    kind: Spanned<String>,
    path: Opt<String>,
    busy_timeout_ms: Opt<u64>,
    max_entries: Opt<u64>,
    max_bytes: Opt<u64>,
    dsn: Opt<String>,
    pool_size: Opt<u64>,
    timeout_ms: Opt<u64>,
    purge_timeout_ms: Opt<u64>,
    schema: Opt<String>,
    create_schema: Opt<bool>,
    url: Opt<String>,
    cluster_nodes: Opt<Vec<String>>,
    prefix: Opt<String>,
    assume_noeviction: Opt<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrincipal {
    header: Opt<String>,
    jwt: Opt<RawJwt>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJwt {
    jwks_file: Opt<String>,
    issuer: Opt<String>,
    audience: Opt<OneOrMany>,
    claim: Opt<String>,
    algorithms: Opt<Vec<Spanned<String>>>,
    leeway_s: Opt<u64>,
    header: Opt<String>,
    reload_s: Opt<u64>,
}

/// A string or a list of strings.
#[derive(Deserialize, Clone)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    method: Spanned<String>,
    path: Spanned<String>,
    upstream: Spanned<String>,
    public: Opt<bool>,
    fingerprint_headers: Opt<Vec<String>>,
    exclude: Opt<Vec<String>>,
    lease_ms: Opt<u64>,
    heartbeat_ms: Opt<u64>,
    takeover: Opt<String>,
    ttl_ms: Opt<u64>,
    key_required: Opt<bool>,
    key_min_len: Opt<u64>,
    key_max_len: Opt<u64>,
    key_strict: Opt<bool>,
    transient_statuses: Opt<Vec<u16>>,
    store_server_errors: Opt<bool>,
    max_stored_body_bytes: Opt<u64>,
    stored_headers: Opt<Vec<String>>,
    redact: Opt<bool>,
    in_flight_retry_after_ms: Opt<u64>,
    unavailable_retry_after_ms: Opt<u64>,
    max_store_rounds: Opt<u64>,
    cleanup_budget_ms: Opt<u64>,
    max_request_body_bytes: Opt<u64>,
    transactional: Opt<bool>,
}

/// Collects issues with their positions in one file.
struct Issues<'a> {
    file: &'a str,
    text: &'a str,
    found: Vec<ConfigIssue>,
}

impl Issues<'_> {
    fn at(&mut self, span: Range<usize>, message: impl Into<String>) {
        let (line, column) = line_column(self.text, span.start);
        self.found.push(ConfigIssue {
            file: self.file.to_owned(),
            line,
            column,
            message: message.into(),
        });
    }
}

/// The 1-based line and column of byte `offset` in `text`.
#[must_use]
pub fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rfind('\n').map_or(before.chars().count(), |nl| {
        before.get(nl + 1..).map_or(0, |s| s.chars().count())
    }) + 1;
    (line, column)
}

fn val<T: Clone>(o: &Opt<T>) -> Option<T> {
    o.as_ref().map(|s| s.get_ref().clone())
}

fn usize_of(o: &Opt<u64>) -> Option<usize> {
    o.as_ref()
        .map(|s| usize::try_from(*s.get_ref()).unwrap_or(usize::MAX))
}

fn span_of<T>(o: &Opt<T>) -> Option<Range<usize>> {
    o.as_ref().map(Spanned::span)
}

impl GatewayConfig {
    /// Reads and validates the file at `path`.
    ///
    /// # Errors
    /// [`LoadError`] when it cannot be read or is not valid.
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&path.display().to_string(), &text).map_err(LoadError::Invalid)
    }

    /// Validates `text`, the contents of the file named `file`. With `[principal] jwt`, this
    /// reads its JWKS file too (an unusable one is an issue at the `jwks_file` line).
    ///
    /// # Errors
    /// Every issue found, each naming its line and column.
    pub fn parse(file: &str, text: &str) -> Result<Self, Vec<ConfigIssue>> {
        let mut issues = Issues {
            file,
            text,
            found: Vec::new(),
        };
        let raw: RawConfig = match toml::from_str(text) {
            Ok(raw) => raw,
            Err(e) => {
                let span = e.span().unwrap_or(0..0);
                issues.at(span, e.message().to_owned());
                return Err(issues.found);
            }
        };
        let built = build(&raw, &mut issues);
        match built {
            Some(cfg) if issues.found.is_empty() => Ok(cfg),
            _ => Err(issues.found),
        }
    }
}

/// A socket address such as `127.0.0.1:8080` (`name` names the key in the issue).
fn address(name: &str, text: &Spanned<String>, issues: &mut Issues<'_>) -> Option<SocketAddr> {
    match text.get_ref().parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(e) => {
            issues.at(
                text.span(),
                format!(
                    "{name}: {:?} is not an address such as \"127.0.0.1:8080\" ({e})",
                    text.get_ref()
                ),
            );
            None
        }
    }
}

fn build(raw: &RawConfig, issues: &mut Issues<'_>) -> Option<GatewayConfig> {
    let listen = address("listen", &raw.listen, issues);
    let operations_listen = raw
        .operations_listen
        .as_ref()
        .map(|a| address("operations_listen", a, issues));
    if let (Some(Some(ops)), Some(main)) = (&operations_listen, &listen) {
        if ops == main && ops.port() != 0 {
            issues.at(
                span_of(&raw.operations_listen).unwrap_or(0..0),
                "operations_listen must differ from listen (leave it out to answer the \
                 operations endpoints on listen)",
            );
        }
    }
    let header_name = val(&raw.header_name).unwrap_or_else(|| options::HEADER_NAME.to_owned());
    if !is_header_name(&header_name) {
        issues.at(
            span_of(&raw.header_name).unwrap_or(0..0),
            format!("header_name: {header_name:?} is not a valid header name"),
        );
    }
    let downstream_key_header =
        val(&raw.downstream_key_header).unwrap_or_else(|| "Idempotency-Key".to_owned());
    if !is_header_name(&downstream_key_header) {
        issues.at(
            span_of(&raw.downstream_key_header).unwrap_or(0..0),
            format!("downstream_key_header: {downstream_key_header:?} is not a valid header name"),
        );
    }
    for (name, o) in [
        ("upstream_timeout_ms", &raw.upstream_timeout_ms),
        ("shutdown_deadline_ms", &raw.shutdown_deadline_ms),
        ("purge_interval_ms", &raw.purge_interval_ms),
        ("purge_batch", &raw.purge_batch),
    ] {
        if let Some(s) = o {
            if *s.get_ref() == 0 {
                issues.at(s.span(), format!("{name} must be positive"));
            }
        }
    }
    let store = build_store(raw.store.get_ref(), issues);
    let principal = build_principal(raw.principal.as_ref(), issues);

    let mut upstreams = BTreeMap::new();
    for (name, url) in &raw.upstreams {
        match parse_base(url.get_ref()) {
            Ok(uri) => {
                upstreams.insert(name.clone(), uri);
            }
            Err(why) => issues.at(url.span(), format!("upstream {name:?}: {why}")),
        }
    }
    if raw.routes.is_empty() {
        issues.at(0..0, "no [[routes]]: the gateway would protect nothing");
    }
    let fallback = match &raw.fallback_upstream {
        None => None,
        Some(name) => {
            let found = upstreams.get(name.get_ref()).cloned();
            if found.is_none() {
                issues.at(
                    name.span(),
                    format!(
                        "fallback_upstream {:?} is not declared in [upstreams]",
                        name.get_ref()
                    ),
                );
            }
            found
        }
    };
    let mut routes: Vec<RouteConfig> = Vec::new();
    for route in &raw.routes {
        if let Some(r) = build_route(route, &upstreams, principal.is_some(), issues) {
            if routes
                .iter()
                .any(|o| o.method == r.method && o.template == r.template)
            {
                issues.at(
                    route.get_ref().path.span(),
                    format!(
                        "route {} {} is declared twice (the first one would always win)",
                        r.method,
                        r.template.as_str()
                    ),
                );
                continue;
            }
            routes.push(r);
        }
    }
    Some(GatewayConfig {
        listen: listen?,
        header_name,
        principal,
        upstream_timeout_ms: val(&raw.upstream_timeout_ms).unwrap_or(DEFAULT_UPSTREAM_TIMEOUT_MS),
        shutdown_deadline_ms: val(&raw.shutdown_deadline_ms)
            .unwrap_or(DEFAULT_SHUTDOWN_DEADLINE_MS),
        purge_interval_ms: val(&raw.purge_interval_ms).unwrap_or(DEFAULT_PURGE_INTERVAL_MS),
        purge_batch: val(&raw.purge_batch).unwrap_or(options::PURGE_BATCH),
        downstream_key_header,
        store: store?,
        routes,
        fallback,
        operations_listen: match operations_listen {
            None => None,
            Some(a) => Some(a?),
        },
    })
}

fn is_header_name(name: &str) -> bool {
    hyper::header::HeaderName::from_bytes(name.as_bytes()).is_ok()
}

fn parse_base(url: &str) -> Result<Uri, String> {
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL ({e})"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "{url:?}: only http:// upstreams are supported (TLS to the upstream is not supported yet)"
        ));
    }
    if uri.authority().is_none() {
        return Err(format!("{url:?} has no host"));
    }
    Ok(uri)
}

fn build_store(raw: &RawStore, issues: &mut Issues<'_>) -> Option<StoreConfig> {
    let kind = raw.kind.get_ref().as_str();
    let not_here = |issues: &mut Issues<'_>, field: &str, o: Option<Range<usize>>| {
        if let Some(span) = o {
            issues.at(
                span,
                format!("store: {field} does not apply to the {kind} store"),
            );
        }
    };
    let redis_fields = |issues: &mut Issues<'_>| {
        not_here(issues, "url", span_of(&raw.url));
        not_here(issues, "cluster_nodes", span_of(&raw.cluster_nodes));
        not_here(issues, "prefix", span_of(&raw.prefix));
        not_here(issues, "assume_noeviction", span_of(&raw.assume_noeviction));
    };
    let pg_fields = |issues: &mut Issues<'_>| {
        not_here(issues, "dsn", span_of(&raw.dsn));
        not_here(issues, "pool_size", span_of(&raw.pool_size));
        not_here(issues, "timeout_ms", span_of(&raw.timeout_ms));
        not_here(issues, "purge_timeout_ms", span_of(&raw.purge_timeout_ms));
        not_here(issues, "schema", span_of(&raw.schema));
        not_here(issues, "create_schema", span_of(&raw.create_schema));
    };
    match kind {
        "memory" => {
            not_here(issues, "path", span_of(&raw.path));
            not_here(issues, "busy_timeout_ms", span_of(&raw.busy_timeout_ms));
            pg_fields(issues);
            redis_fields(issues);
            Some(StoreConfig::Memory {
                max_entries: usize_of(&raw.max_entries)
                    .unwrap_or(idempo_core::machine::memory::DEFAULT_MAX_ENTRIES),
                max_bytes: usize_of(&raw.max_bytes)
                    .unwrap_or(idempo_core::machine::memory::DEFAULT_MAX_BYTES),
            })
        }
        "sqlite" => {
            not_here(issues, "max_entries", span_of(&raw.max_entries));
            not_here(issues, "max_bytes", span_of(&raw.max_bytes));
            pg_fields(issues);
            redis_fields(issues);
            let Some(path) = val(&raw.path) else {
                issues.at(
                    raw.kind.span(),
                    "store: the sqlite store needs a path = \"...\"",
                );
                return None;
            };
            Some(StoreConfig::Sqlite {
                path: PathBuf::from(path),
                busy_timeout_ms: val(&raw.busy_timeout_ms)
                    .unwrap_or(options::SQLITE_BUSY_TIMEOUT_MS),
            })
        }
        "postgres" => {
            redis_fields(issues);
            build_postgres(raw, issues, &not_here)
        }
        "redis" => build_redis(raw, issues, &not_here),
        "cached" => {
            issues.at(
                raw.kind.span(),
                format!(
                    "store: kind {kind:?} is not supported yet by the gateway (use \"postgres\", \"redis\", \"sqlite\" or \"memory\")"
                ),
            );
            None
        }
        other => {
            issues.at(
                raw.kind.span(),
                format!(
                    "store: unknown kind {other:?} (expected \"postgres\", \"redis\", \"sqlite\" or \"memory\")"
                ),
            );
            None
        }
    }
}

/// Reports a store key given to a store kind it does not apply to.
type NotHere<'f> = dyn Fn(&mut Issues<'_>, &str, Option<Range<usize>>) + 'f;

fn build_postgres(
    raw: &RawStore,
    issues: &mut Issues<'_>,
    not_here: &NotHere<'_>,
) -> Option<StoreConfig> {
    use crate::store::postgres::PostgresOptions;
    not_here(issues, "path", span_of(&raw.path));
    not_here(issues, "busy_timeout_ms", span_of(&raw.busy_timeout_ms));
    not_here(issues, "max_entries", span_of(&raw.max_entries));
    not_here(issues, "max_bytes", span_of(&raw.max_bytes));
    let Some(dsn) = raw.dsn.as_ref() else {
        issues.at(
            raw.kind.span(),
            "store: the postgres store needs a dsn = \"postgresql://...\"",
        );
        return None;
    };
    let before = issues.found.len();
    if let Err(e) = <tokio_postgres::Config as std::str::FromStr>::from_str(dsn.get_ref()) {
        issues.at(dsn.span(), format!("store: dsn: {e}"));
    }
    let mut o = PostgresOptions::new(dsn.get_ref().clone());
    let mut positive = |name: &str, v: &Opt<u64>| -> Option<u64> {
        let s = v.as_ref()?;
        if *s.get_ref() == 0 {
            issues.at(s.span(), format!("store: {name} must be at least 1"));
        }
        Some(*s.get_ref())
    };
    if let Some(n) = positive("pool_size", &raw.pool_size) {
        o.pool_size = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if let Some(ms) = positive("timeout_ms", &raw.timeout_ms) {
        o.timeout_ms = ms;
    }
    if let Some(ms) = positive("purge_timeout_ms", &raw.purge_timeout_ms) {
        o.purge_timeout_ms = ms;
    }
    if let Some(schema) = raw.schema.as_ref() {
        let name = schema.get_ref();
        if name.is_empty() || name.contains('\0') {
            issues.at(
                schema.span(),
                "store: schema must be a non-empty name without NUL",
            );
        }
        o.schema = Some(name.clone());
    }
    if let Some(c) = val(&raw.create_schema) {
        o.create_schema = c;
    }
    (issues.found.len() == before).then_some(StoreConfig::Postgres(o))
}

/// A Redis URL the `redis` crate accepts (`redis://host:port/db`, `redis+unix:///path`).
fn check_redis_url(url: &str) -> Result<(), String> {
    if redis::parse_redis_url(url).is_none() {
        return Err(format!(
            "{url:?} is not a Redis URL (expected redis://host:port/db)"
        ));
    }
    redis::IntoConnectionInfo::into_connection_info(url)
        .map(|_| ())
        .map_err(|e| format!("{url:?}: {e}"))
}

fn build_redis(
    raw: &RawStore,
    issues: &mut Issues<'_>,
    not_here: &NotHere<'_>,
) -> Option<StoreConfig> {
    use crate::store::redis::{RedisOptions, RedisTarget};
    not_here(issues, "path", span_of(&raw.path));
    not_here(issues, "busy_timeout_ms", span_of(&raw.busy_timeout_ms));
    not_here(issues, "max_entries", span_of(&raw.max_entries));
    not_here(issues, "max_bytes", span_of(&raw.max_bytes));
    not_here(issues, "dsn", span_of(&raw.dsn));
    not_here(issues, "pool_size", span_of(&raw.pool_size));
    not_here(issues, "purge_timeout_ms", span_of(&raw.purge_timeout_ms));
    not_here(issues, "schema", span_of(&raw.schema));
    not_here(issues, "create_schema", span_of(&raw.create_schema));
    let before = issues.found.len();
    let target = match (raw.url.as_ref(), raw.cluster_nodes.as_ref()) {
        (Some(url), None) => {
            if let Err(e) = check_redis_url(url.get_ref()) {
                issues.at(url.span(), format!("store: url: {e}"));
            }
            RedisTarget::Node(url.get_ref().clone())
        }
        (None, Some(nodes)) => {
            if nodes.get_ref().is_empty() {
                issues.at(
                    nodes.span(),
                    "store: cluster_nodes must list at least one node (\"redis://host:port\")",
                );
            }
            for n in nodes.get_ref() {
                if let Err(e) = check_redis_url(n) {
                    issues.at(nodes.span(), format!("store: cluster_nodes: {e}"));
                }
            }
            RedisTarget::Cluster(nodes.get_ref().clone())
        }
        (Some(_), Some(nodes)) => {
            issues.at(
                nodes.span(),
                "store: the redis store takes url (one server) or cluster_nodes (a Redis Cluster), not both",
            );
            return None;
        }
        (None, None) => {
            issues.at(
                raw.kind.span(),
                "store: the redis store needs url = \"redis://host:port/db\" (one server) or cluster_nodes = [\"redis://host:port\", ...] (a Redis Cluster)",
            );
            return None;
        }
    };
    let mut o = RedisOptions::new(target);
    if let Some(prefix) = raw.prefix.as_ref() {
        if prefix.get_ref().is_empty() {
            issues.at(
                prefix.span(),
                "store: prefix must not be empty (the default is \"idempo:\")",
            );
        }
        o.prefix = prefix.get_ref().clone();
    }
    if let Some(ms) = raw.timeout_ms.as_ref() {
        if *ms.get_ref() == 0 {
            issues.at(ms.span(), "store: timeout_ms must be at least 1");
        }
        o.timeout_ms = *ms.get_ref();
    }
    if let Some(a) = val(&raw.assume_noeviction) {
        o.assume_noeviction = a;
    }
    (issues.found.len() == before).then_some(StoreConfig::Redis(o))
}

fn build_principal(
    raw: Option<&Spanned<RawPrincipal>>,
    issues: &mut Issues<'_>,
) -> Option<PrincipalSource> {
    let raw = raw?;
    let p = raw.get_ref();
    match (&p.header, &p.jwt) {
        (Some(h), Some(_)) => {
            issues.at(
                h.span(),
                "principal: set header or jwt, not both (the principal has one source)",
            );
            None
        }
        (Some(h), None) if is_header_name(h.get_ref()) => {
            Some(PrincipalSource::Header(h.get_ref().clone()))
        }
        (Some(h), None) => {
            issues.at(
                h.span(),
                format!("principal: {:?} is not a valid header name", h.get_ref()),
            );
            None
        }
        (None, Some(j)) => build_jwt(j, issues).map(|v| PrincipalSource::Jwt(Arc::new(v))),
        (None, None) => {
            issues.at(
                raw.span(),
                "principal: set header = \"X-Principal\" (the header your auth proxy sets) or \
                 jwt = { jwks_file = \"...\", issuer = \"...\", audience = \"...\", algorithms = [\"RS256\"] }",
            );
            None
        }
    }
}

/// A required, non-empty string of `[principal] jwt`.
fn jwt_string(
    o: &Opt<String>,
    name: &str,
    whole: Range<usize>,
    issues: &mut Issues<'_>,
) -> Option<String> {
    match o {
        None => {
            issues.at(
                whole,
                format!("principal.jwt: {name} = \"...\" is required"),
            );
            None
        }
        Some(s) if s.get_ref().trim().is_empty() => {
            issues.at(s.span(), format!("principal.jwt: {name} must not be empty"));
            None
        }
        Some(s) => Some(s.get_ref().clone()),
    }
}

fn build_jwt(raw: &Spanned<RawJwt>, issues: &mut Issues<'_>) -> Option<JwtVerifier> {
    let j = raw.get_ref();
    let whole = raw.span();
    let before = issues.found.len();
    let jwks_file = jwt_string(&j.jwks_file, "jwks_file", whole.clone(), issues);
    let issuer = jwt_string(&j.issuer, "issuer", whole.clone(), issues);
    let audience = match &j.audience {
        None => {
            issues.at(
                whole.clone(),
                "principal.jwt: audience = \"...\" (or a list) is required",
            );
            None
        }
        Some(a) => {
            let list = match a.get_ref().clone() {
                OneOrMany::One(s) => vec![s],
                OneOrMany::Many(v) => v,
            };
            if list.is_empty() || list.iter().any(|s| s.trim().is_empty()) {
                issues.at(
                    a.span(),
                    "principal.jwt: audience must be a non-empty string or list of non-empty strings",
                );
            }
            Some(list)
        }
    };
    let claim = match &j.claim {
        None => jwt::DEFAULT_CLAIM.to_owned(),
        Some(c) if c.get_ref().is_empty() => {
            issues.at(c.span(), "principal.jwt: claim must not be empty");
            String::new()
        }
        Some(c) => c.get_ref().clone(),
    };
    let mut algorithms = Vec::new();
    match &j.algorithms {
        None => issues.at(
            whole.clone(),
            "principal.jwt: algorithms = [\"RS256\", ...] is required (the ones your issuer signs with)",
        ),
        Some(list) if list.get_ref().is_empty() => {
            issues.at(list.span(), "principal.jwt: algorithms must not be empty");
        }
        Some(list) => {
            for a in list.get_ref() {
                match jwt::parse_algorithm(a.get_ref()) {
                    Ok(alg) if !algorithms.contains(&alg) => algorithms.push(alg),
                    Ok(_) => {}
                    Err(e) => issues.at(a.span(), format!("principal.jwt: algorithms: {e}")),
                }
            }
        }
    }
    let leeway_s = val(&j.leeway_s).unwrap_or(jwt::DEFAULT_LEEWAY_S);
    if leeway_s > jwt::MAX_LEEWAY_S {
        issues.at(
            span_of(&j.leeway_s).unwrap_or(whole),
            format!(
                "principal.jwt: leeway_s must be at most {} (seconds of clock skew)",
                jwt::MAX_LEEWAY_S
            ),
        );
    }
    let reload_s = val(&j.reload_s).unwrap_or(jwt::DEFAULT_RELOAD_S);
    let header = val(&j.header).unwrap_or_else(|| jwt::DEFAULT_HEADER.to_owned());
    if !is_header_name(&header) {
        issues.at(
            span_of(&j.header).unwrap_or(0..0),
            format!("principal.jwt: header {header:?} is not a valid header name"),
        );
    }
    if issues.found.len() != before {
        return None;
    }
    let settings = JwtSettings {
        jwks_file: PathBuf::from(jwks_file?),
        issuer: issuer?,
        audience: audience?,
        claim,
        algorithms,
        leeway_s,
        header,
        reload_s,
    };
    match JwtVerifier::load(settings) {
        Ok(v) => Some(v),
        Err(e) => {
            issues.at(
                span_of(&j.jwks_file).unwrap_or_else(|| raw.span()),
                format!("principal.jwt.jwks_file: {e}"),
            );
            None
        }
    }
}

fn build_route(
    route: &Spanned<RawRoute>,
    upstreams: &BTreeMap<String, Uri>,
    has_principal: bool,
    issues: &mut Issues<'_>,
) -> Option<RouteConfig> {
    let r = route.get_ref();
    let before = issues.found.len();
    let method = r.method.get_ref().to_ascii_uppercase();
    if hyper::Method::from_bytes(method.as_bytes()).is_err() {
        issues.at(
            r.method.span(),
            format!("method {:?} is not an HTTP method", r.method.get_ref()),
        );
    }
    let template = match RouteTemplate::parse(r.path.get_ref()) {
        Ok(t) => Some(t),
        Err(e) => {
            let TemplateError { message, offset } = e;
            // +1: the span starts at the opening quote.
            let start = r.path.span().start + 1 + offset;
            issues.at(start..start, format!("path: {message}"));
            None
        }
    };
    let upstream_base = upstreams.get(r.upstream.get_ref()).cloned();
    if upstream_base.is_none() {
        issues.at(
            r.upstream.span(),
            format!(
                "upstream {:?} is not declared in [upstreams]",
                r.upstream.get_ref()
            ),
        );
    }
    for (name, o) in [("transactional", &r.transactional), ("redact", &r.redact)] {
        if let Some(s) = o {
            if *s.get_ref() {
                let why = if name == "transactional" {
                    "transactional mode is not offered by the gateway: the upstream's database is not the gateway's"
                } else {
                    "redact needs a host hook, which the gateway does not have"
                };
                issues.at(s.span(), format!("{name}: {why}"));
            }
        }
    }
    let public = val(&r.public).unwrap_or(false);
    let scope_rule = match ScopeRule::new(has_principal && !public, public, false) {
        Ok(rule) => rule,
        Err(e) => {
            issues.at(route.span(), e.to_string());
            ScopeRule::Public
        }
    };
    if !has_principal && !public {
        issues.at(
            r.path.span(),
            "this route has no principal: set [principal] header = \"...\" or jwt = { ... }, or declare the route public = true",
        );
    }
    let takeover = match &r.takeover {
        None => None,
        Some(s) => match s.get_ref().parse::<TakeoverPolicy>() {
            Ok(t) => Some(t),
            Err(e) => {
                issues.at(s.span(), format!("takeover: {e}"));
                None
            }
        },
    };
    let opts = ConfigOptions {
        lease_ms: val(&r.lease_ms),
        heartbeat_ms: val(&r.heartbeat_ms),
        takeover,
        ttl_ms: val(&r.ttl_ms),
        key_required: val(&r.key_required),
        key_min_len: usize_of(&r.key_min_len),
        key_max_len: usize_of(&r.key_max_len),
        key_strict: val(&r.key_strict),
        transient_statuses: val(&r.transient_statuses),
        store_server_errors: val(&r.store_server_errors),
        max_stored_body_bytes: usize_of(&r.max_stored_body_bytes),
        stored_headers: val(&r.stored_headers),
        redact: None,
        in_flight_retry_after_ms: val(&r.in_flight_retry_after_ms),
        unavailable_retry_after_ms: val(&r.unavailable_retry_after_ms),
        max_store_rounds: val(&r.max_store_rounds),
        cleanup_budget_ms: val(&r.cleanup_budget_ms),
        max_request_body_bytes: usize_of(&r.max_request_body_bytes),
        transactional: None,
    };
    let config = match opts.build() {
        Ok(c) => Some(c),
        Err(e) => {
            let span = option_span(r, &e).unwrap_or_else(|| route.span());
            issues.at(span, format!("route {method} {}: {e}", r.path.get_ref()));
            None
        }
    };
    let fp = FingerprintConfig {
        header_names: val(&r.fingerprint_headers).unwrap_or_default(),
        exclude: val(&r.exclude).unwrap_or_default(),
        ..FingerprintConfig::default()
    };
    let fingerprinter = match Fingerprinter::new(&fp) {
        Ok(f) => Some(Arc::new(f)),
        Err(e) => {
            let span = span_of(&r.exclude)
                .or_else(|| span_of(&r.fingerprint_headers))
                .unwrap_or_else(|| route.span());
            issues.at(span, format!("fingerprint: {e}"));
            None
        }
    };
    if issues.found.len() != before {
        return None;
    }
    Some(RouteConfig {
        method,
        template: template?,
        upstream: r.upstream.get_ref().clone(),
        upstream_base: upstream_base?,
        config: Arc::new(config?),
        fingerprinter: fingerprinter?,
        scope_rule,
    })
}

/// The span of the option a [`ConfigError`] is about.
fn option_span(r: &RawRoute, e: &ConfigError) -> Option<Range<usize>> {
    let name = match e {
        ConfigError::LeaseTooShort(_) => "lease_ms",
        ConfigError::BadHeartbeat { .. } => "heartbeat_ms",
        ConfigError::TtlNotAboveLease { .. } => "ttl_ms",
        ConfigError::InvalidHeaderName(_) | ConfigError::ForbiddenHeader(_) => "stored_headers",
        ConfigError::InvalidStatus(_) => "transient_statuses",
        ConfigError::NotPositive(n) => n,
        ConfigError::TooLarge { option, .. } => option,
        ConfigError::Key(_) => "key_max_len",
        _ => return None,
    };
    match name {
        "lease_ms" => span_of(&r.lease_ms),
        "heartbeat_ms" => span_of(&r.heartbeat_ms),
        "ttl_ms" => span_of(&r.ttl_ms).or_else(|| span_of(&r.lease_ms)),
        "stored_headers" => span_of(&r.stored_headers),
        "transient_statuses" => span_of(&r.transient_statuses),
        "in_flight_retry_after_ms" => span_of(&r.in_flight_retry_after_ms),
        "unavailable_retry_after_ms" => span_of(&r.unavailable_retry_after_ms),
        "max_store_rounds" => span_of(&r.max_store_rounds),
        "cleanup_budget_ms" => span_of(&r.cleanup_budget_ms),
        "max_request_body_bytes" => span_of(&r.max_request_body_bytes),
        "max_stored_body_bytes" => span_of(&r.max_stored_body_bytes),
        "key_max_len" => span_of(&r.key_max_len).or_else(|| span_of(&r.key_min_len)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
listen = "127.0.0.1:0"

[store]
kind = "memory"

[principal]
header = "X-Principal"

[upstreams]
payments = "http://127.0.0.1:9000"

[[routes]]
method = "POST"
path = "/payments/{id}"
upstream = "payments"
lease_ms = 5000
"#;

    #[test]
    fn the_example_file_is_valid() {
        let text = include_str!("../gateway.example.toml");
        let c = GatewayConfig::parse("gateway.example.toml", text).expect("valid example");
        assert_eq!(c.routes.len(), 2);
        assert_eq!(c.routes[1].template.as_str(), "/payments/{id}/refunds");
        assert_eq!(c.routes[1].config.takeover, TakeoverPolicy::ReRun);
        assert!(c.fallback.is_some());
    }

    #[test]
    fn a_good_file_takes_core_defaults() {
        let c = GatewayConfig::parse("g.toml", GOOD).expect("valid");
        assert_eq!(c.routes.len(), 1);
        assert_eq!(c.header_name, "Idempotency-Key");
        let r = &c.routes[0];
        assert_eq!(r.config.lease.lease_ms(), 5000);
        assert_eq!(r.config.ttl_ms, Config::default().ttl_ms);
        assert_eq!(
            r.scope_rule,
            ScopeRule::Function {
                empty_is_anonymous: false
            }
        );
    }

    fn one_issue(text: &str) -> ConfigIssue {
        let mut e = GatewayConfig::parse("g.toml", text).expect_err("invalid");
        assert!(!e.is_empty());
        e.remove(0)
    }

    #[test]
    fn operations_listen_is_an_address_of_its_own() {
        let c = GatewayConfig::parse("g.toml", GOOD).expect("valid");
        assert_eq!(c.operations_listen, None);
        let text = GOOD.replace(
            "listen = \"127.0.0.1:0\"",
            "listen = \"127.0.0.1:8080\"\noperations_listen = \"127.0.0.1:9090\"",
        );
        let c = GatewayConfig::parse("g.toml", &text).expect("valid");
        assert_eq!(
            c.operations_listen,
            Some("127.0.0.1:9090".parse().expect("addr"))
        );
        let bad = GOOD.replace(
            "listen = \"127.0.0.1:0\"",
            "listen = \"127.0.0.1:0\"\noperations_listen = \"localhost\"",
        );
        let e = one_issue(&bad);
        assert_eq!((e.line, e.column), (3, 21), "{e}");
        assert!(e.message.contains("operations_listen"), "{e}");
        let same = GOOD.replace(
            "listen = \"127.0.0.1:0\"",
            "listen = \"127.0.0.1:8080\"\noperations_listen = \"127.0.0.1:8080\"",
        );
        let e = one_issue(&same);
        assert_eq!(e.line, 3, "{e}");
        assert!(e.message.contains("must differ"), "{e}");
    }

    #[test]
    fn an_unknown_store_kind_names_its_line() {
        let text = GOOD.replace("kind = \"memory\"", "kind = \"mongo\"");
        let e = one_issue(&text);
        assert_eq!((e.line, e.column), (5, 8), "{e}");
        assert!(e.message.contains("unknown kind"), "{e}");
    }

    #[test]
    fn redis_takes_core_defaults() {
        use crate::store::redis::RedisTarget;
        let text = GOOD.replace(
            "kind = \"memory\"",
            "kind = \"redis\"\nurl = \"redis://127.0.0.1:6379/0\"",
        );
        let c = GatewayConfig::parse("g.toml", &text).expect("valid");
        let StoreConfig::Redis(o) = c.store else {
            panic!("{:?}", c.store)
        };
        assert_eq!(
            o.target,
            RedisTarget::Node("redis://127.0.0.1:6379/0".to_owned())
        );
        assert_eq!(o.prefix, options::REDIS_PREFIX);
        assert_eq!(o.timeout_ms, options::STORE_TIMEOUT_MS);
        assert!(!o.assume_noeviction);
        let text = GOOD.replace(
            "kind = \"memory\"",
            "kind = \"redis\"\ncluster_nodes = [\"redis://a:7000\", \"redis://b:7001\"]\nprefix = \"gw:\"\ntimeout_ms = 300\nassume_noeviction = true",
        );
        let c = GatewayConfig::parse("g.toml", &text).expect("valid");
        let StoreConfig::Redis(o) = c.store else {
            panic!("{:?}", c.store)
        };
        assert_eq!(
            o.target,
            RedisTarget::Cluster(vec!["redis://a:7000".into(), "redis://b:7001".into()])
        );
        assert_eq!((o.prefix.as_str(), o.timeout_ms), ("gw:", 300));
        assert!(o.assume_noeviction);
    }

    #[test]
    fn redis_errors_name_line_and_column() {
        let none = GOOD.replace("kind = \"memory\"", "kind = \"redis\"");
        let e = one_issue(&none);
        assert_eq!((e.line, e.column), (5, 8), "{e}");
        assert!(e.message.contains("needs url"), "{e}");
        let both = GOOD.replace(
            "kind = \"memory\"",
            "kind = \"redis\"\nurl = \"redis://a\"\ncluster_nodes = [\"redis://b\"]",
        );
        let e = one_issue(&both);
        assert_eq!(e.line, 7, "{e}");
        assert!(e.message.contains("not both"), "{e}");
        let bad = GOOD.replace(
            "kind = \"memory\"",
            "kind = \"redis\"\nurl = \"http://a:6379\"",
        );
        let e = one_issue(&bad);
        assert_eq!((e.line, e.column), (6, 7), "{e}");
        assert!(e.message.contains("not a Redis URL"), "{e}");
        let tls = GOOD.replace(
            "kind = \"memory\"",
            "kind = \"redis\"\nurl = \"rediss://a:6379\"",
        );
        let e = one_issue(&tls);
        assert_eq!((e.line, e.column), (6, 7), "{e}");
        assert!(e.message.contains("TLS"), "{e}");
        let empty = GOOD.replace("kind = \"memory\"", "kind = \"redis\"\ncluster_nodes = []");
        let e = one_issue(&empty);
        assert_eq!(e.line, 6, "{e}");
        let zero = GOOD.replace(
            "kind = \"memory\"",
            "kind = \"redis\"\nurl = \"redis://a\"\ntimeout_ms = 0",
        );
        let e = one_issue(&zero);
        assert_eq!((e.line, e.column), (7, 14), "{e}");
        let foreign = GOOD.replace(
            "kind = \"memory\"",
            "kind = \"redis\"\nurl = \"redis://a\"\ndsn = \"host=h\"",
        );
        let e = one_issue(&foreign);
        assert_eq!(e.line, 7, "{e}");
        assert!(e.message.contains("does not apply"), "{e}");
        let pg = GOOD.replace(
            "kind = \"memory\"",
            "kind = \"postgres\"\ndsn = \"host=h\"\nprefix = \"x\"",
        );
        let e = one_issue(&pg);
        assert_eq!(e.line, 7, "{e}");
        assert!(e.message.contains("does not apply"), "{e}");
    }

    #[test]
    fn cached_is_not_supported_yet() {
        let text = GOOD.replace("kind = \"memory\"", "kind = \"cached\"");
        let e = one_issue(&text);
        assert_eq!(e.line, 5);
        assert!(e.message.contains("not supported yet"), "{e}");
    }

    #[test]
    fn postgres_takes_core_defaults() {
        let text = GOOD.replace(
            "kind = \"memory\"",
            "kind = \"postgres\"\ndsn = \"postgresql://u@a:5432,b:5433/db?target_session_attrs=read-write\"",
        );
        let c = GatewayConfig::parse("g.toml", &text).expect("valid");
        let StoreConfig::Postgres(o) = c.store else {
            panic!("{:?}", c.store)
        };
        assert_eq!(o.timeout_ms, options::STORE_TIMEOUT_MS);
        assert_eq!(o.purge_timeout_ms, options::PURGE_TIMEOUT_MS);
        assert_eq!(o.pool_size, crate::store::postgres::DEFAULT_POOL_SIZE);
        assert_eq!(o.schema, None);
        assert!(o.create_schema);
    }

    #[test]
    fn postgres_options_are_read() {
        let text = GOOD.replace(
            "kind = \"memory\"",
            "kind = \"postgres\"\ndsn = \"host=/tmp dbname=x\"\npool_size = 3\ntimeout_ms = 500\npurge_timeout_ms = 900\nschema = \"gw\"\ncreate_schema = false",
        );
        let c = GatewayConfig::parse("g.toml", &text).expect("valid");
        let StoreConfig::Postgres(o) = c.store else {
            panic!("{:?}", c.store)
        };
        assert_eq!(
            (o.pool_size, o.timeout_ms, o.purge_timeout_ms),
            (3, 500, 900)
        );
        assert_eq!(o.schema.as_deref(), Some("gw"));
        assert!(!o.create_schema);
    }

    #[test]
    fn postgres_errors_name_line_and_column() {
        let no_dsn = GOOD.replace("kind = \"memory\"", "kind = \"postgres\"");
        let e = one_issue(&no_dsn);
        assert_eq!((e.line, e.column), (5, 8), "{e}");
        assert!(e.message.contains("needs a dsn"), "{e}");
        let bad = GOOD.replace(
            "kind = \"memory\"",
            "kind = \"postgres\"\ndsn = \"postgresql://h:notaport/db\"",
        );
        let e = one_issue(&bad);
        assert_eq!((e.line, e.column), (6, 7), "{e}");
        assert!(e.message.contains("dsn"), "{e}");
        let zero = GOOD.replace(
            "kind = \"memory\"",
            "kind = \"postgres\"\ndsn = \"host=h\"\ntimeout_ms = 0",
        );
        let e = one_issue(&zero);
        assert_eq!((e.line, e.column), (7, 14), "{e}");
        let foreign = GOOD.replace("kind = \"memory\"", "kind = \"memory\"\nschema = \"x\"");
        let e = one_issue(&foreign);
        assert_eq!(e.line, 6, "{e}");
        assert!(e.message.contains("does not apply"), "{e}");
    }

    #[test]
    fn a_bad_template_names_line_and_column() {
        let text = GOOD.replace("/payments/{id}", "/payments/{id");
        let e = one_issue(&text);
        assert_eq!(e.line, 15, "{e}");
        assert!(e.message.contains("path"), "{e}");
    }

    #[test]
    fn a_syntax_error_names_its_line() {
        let text = GOOD.replace("lease_ms = 5000", "lease_ms = = 5000");
        let e = one_issue(&text);
        assert_eq!(e.line, 17, "{e}");
    }

    #[test]
    fn an_unknown_option_is_refused() {
        let text = GOOD.replace("lease_ms = 5000", "lease_msec = 5000");
        let e = one_issue(&text);
        assert_eq!(e.line, 17, "{e}");
    }

    #[test]
    fn a_core_option_error_points_at_the_option() {
        let text = GOOD.replace("lease_ms = 5000", "lease_ms = 5000\nttl_ms = 10");
        let e = one_issue(&text);
        assert_eq!(e.line, 18, "{e}");
        assert!(e.message.contains("ttl_ms"), "{e}");
    }

    #[test]
    fn a_duplicate_route_names_its_line() {
        let text = format!(
            "{GOOD}\n[[routes]]\nmethod = \"post\"\npath = \"/payments/{{id}}\"\nupstream = \"payments\"\n"
        );
        let e = one_issue(&text);
        assert_eq!(e.line, 21, "{e}");
        assert!(e.message.contains("declared twice"), "{e}");
    }

    #[test]
    fn transactional_is_refused() {
        let text = GOOD.replace("lease_ms = 5000", "transactional = true");
        let e = one_issue(&text);
        assert_eq!(e.line, 17);
        assert!(e.message.contains("not offered"), "{e}");
    }

    fn jwks_fixture() -> String {
        format!(
            "{}/tests/fixtures/jwt/jwks.json",
            env!("CARGO_MANIFEST_DIR")
        )
    }

    /// `GOOD` with `[principal] jwt = { <fields> }` (on line 8).
    fn with_jwt(fields: &str) -> String {
        GOOD.replace("header = \"X-Principal\"", &format!("jwt = {{ {fields} }}"))
    }

    fn jwt_fields() -> String {
        format!(
            "jwks_file = \"{}\", issuer = \"https://auth.test/\", audience = \"api\", algorithms = [\"RS256\", \"ES256\"]",
            jwks_fixture()
        )
    }

    #[test]
    fn a_jwt_principal_loads_its_jwks() {
        let c = GatewayConfig::parse("g.toml", &with_jwt(&jwt_fields())).expect("valid");
        let Some(PrincipalSource::Jwt(v)) = &c.principal else {
            panic!("{:?}", c.principal)
        };
        let s = v.settings();
        assert_eq!(s.claim, "sub");
        assert_eq!(s.header, "authorization");
        assert_eq!(s.leeway_s, jwt::DEFAULT_LEEWAY_S);
        assert_eq!(s.reload_s, jwt::DEFAULT_RELOAD_S);
        assert_eq!(s.audience, vec!["api".to_owned()]);
        assert_eq!(v.key_count(), 2);
        assert_eq!(
            c.routes[0].scope_rule,
            ScopeRule::Function {
                empty_is_anonymous: false
            }
        );
        let list = with_jwt(&format!(
            "{}, audience_x = 1",
            jwt_fields().replace("audience = \"api\"", "audience = [\"a\", \"b\"]")
        ));
        // deny_unknown_fields: an unknown key in the jwt table names its line.
        let e = one_issue(&list);
        assert_eq!(e.line, 8, "{e}");
        let list = with_jwt(&format!(
            "{}, claim = \"tenant\", leeway_s = 5, header = \"X-Token\", reload_s = 0",
            jwt_fields().replace("audience = \"api\"", "audience = [\"a\", \"b\"]")
        ));
        let c = GatewayConfig::parse("g.toml", &list).expect("valid");
        let Some(PrincipalSource::Jwt(v)) = &c.principal else {
            panic!()
        };
        assert_eq!(v.settings().audience, vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(
            (
                v.settings().claim.as_str(),
                v.settings().leeway_s,
                v.settings().header.as_str(),
                v.settings().reload_s
            ),
            ("tenant", 5, "X-Token", 0)
        );
    }

    #[test]
    fn bad_jwt_sections_name_their_line() {
        let f = jwt_fields();
        let cases: Vec<(String, &str)> = vec![
            (f.replace("issuer = \"https://auth.test/\", ", ""), "issuer"),
            (f.replace("audience = \"api\", ", ""), "audience"),
            (
                f.replace(", algorithms = [\"RS256\", \"ES256\"]", ""),
                "algorithms",
            ),
            (f.replace("\"RS256\", \"ES256\"", "\"none\""), "unsigned"),
            (f.replace("\"RS256\", \"ES256\"", "\"HS256\""), "HMAC"),
            (
                f.replace("\"RS256\", \"ES256\"", "\"RS255\""),
                "not a supported",
            ),
            (f.replace("\"RS256\", \"ES256\"", ""), "must not be empty"),
            (
                f.replace("issuer = \"https://auth.test/\"", "issuer = \"\""),
                "issuer must not be empty",
            ),
            (format!("{f}, leeway_s = 100000"), "leeway_s"),
            (format!("{f}, header = \"bad header\""), "header"),
            (format!("{f}, claim = \"\""), "claim"),
            (
                f.replace(&jwks_fixture(), "/nonexistent/jwks.json"),
                "cannot read",
            ),
            // The fixture has P-256 and RSA keys only.
            (
                f.replace("\"RS256\", \"ES256\"", "\"ES384\""),
                "no key that can verify ES384",
            ),
        ];
        for (fields, want) in cases {
            let e = one_issue(&with_jwt(&fields));
            assert_eq!(e.line, 8, "{fields}: {e}");
            assert!(e.message.contains(want), "{fields}: {e}");
        }
        let both = GOOD.replace(
            "header = \"X-Principal\"",
            &format!("header = \"X-Principal\"\njwt = {{ {f} }}"),
        );
        let e = one_issue(&both);
        assert!(e.message.contains("not both"), "{e}");
        let neither = GOOD.replace("header = \"X-Principal\"", "");
        let e = one_issue(&neither);
        assert!(e.message.contains("jwt ="), "{e}");
    }

    #[test]
    fn an_empty_or_broken_jwks_names_the_file() {
        let dir = std::env::temp_dir().join(format!("idempo-gw-cfg-jwks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        for (name, text, want) in [
            ("empty.json", "", "not a JWKS"),
            ("nokeys.json", "{\"keys\": []}", "no signature keys"),
            (
                "oct.json",
                "{\"keys\": [{\"kty\": \"oct\", \"k\": \"c2VjcmV0\"}]}",
                "symmetric",
            ),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write");
            let fields = jwt_fields().replace(&jwks_fixture(), &path.display().to_string());
            let e = one_issue(&with_jwt(&fields));
            assert_eq!(e.line, 8, "{e}");
            assert!(e.message.contains(name) && e.message.contains(want), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_route_without_principal_or_public_is_refused() {
        let text = GOOD.replace("[principal]\nheader = \"X-Principal\"\n", "");
        let e = one_issue(&text);
        assert!(e.message.contains("principal"), "{e}");
        let public = text.replace("lease_ms = 5000", "public = true");
        let c = GatewayConfig::parse("g.toml", &public).expect("public route");
        assert_eq!(c.routes[0].scope_rule, ScopeRule::Public);
    }
}
