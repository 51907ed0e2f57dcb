//! A stateright model of idempo's key state machine that runs the shipped core.
//!
//! [`IdempoModel`] is a plain [`stateright::Model`]. Its transitions call `idempo_core` itself:
//! every request is a real [`ServerFlow`](idempo_core::machine::ServerFlow) (so `decide`, the
//! flow's phases, the response policy and the response encoding are the shipped code), and every
//! store operation the flow asks for is executed with the pure primitives of [`idempo_core::machine::store`] on the model's store.
//! The model owns only what the host owns: the store (one slot per scope), a logical clock, the
//! schedule (which worker or client moves next), a token counter fed to the flow as entropy, and
//! ghost variables that turn history into state for the properties (see [`props`]).
//!
//! A [`Variant`] other than [`Variant::Correct`] wraps one core call (or one host step) and
//! mutates its effect, to show that the properties catch the bug class (see `spec/MODEL.md`).
//!
//! Properties: [`props`] (P1–P10, F, in the implementation's terms, and the witnesses),
//! [`contract`] (C1–C4, on the history of requests, effects and writes) and [`liveness`] (L, a
//! fair continuation from every state, for configurations built [`IdempoModel::with_liveness`]).
//! Files: `config.rs` (mode, variant, clients, bounds), `world.rs` (the state and actions),
//! `host.rs` (the host step), `cache_sim.rs` (the cache), `store_step.rs` (store operations with
//! faults, cleanups, the store mutations), `transitions.rs` (the `Model` impl).
//!
//! Optional parts: store faults ([`Bounds::store_faults`]: a store operation fails, or applies
//! and its answer is lost, and the flow is fed
//! [`Event::StoreFailed`](idempo_core::machine::Event::StoreFailed)) and a cache in front of the
//! store ([`Bounds::cache`]: copies of completed records that serve replays, `spec/STORAGE.md`
//! §9).
use std::sync::Arc;

use idempo_core::fingerprint::{FingerprintConfig, RequestParts, fingerprint};
use idempo_core::machine::StoreOp;
use idempo_core::policy::{Config, LeasePolicy};
use idempo_core::record::FingerprintText;
use idempo_core::retry::{RetryConfig, RetryPolicy};
use idempo_core::scope::ScopeId;

mod cache_sim;
mod config;
pub mod contract;
mod flowkey;
pub mod harness;
mod host;
pub mod liveness;
mod mutated;
pub mod props;
pub mod recipe_check;
mod store_step;
mod transitions;
mod world;

pub use config::{Bounds, ClientSpec, EffectMode, Variant};
pub use flowkey::FlowKey;
use store_step::op_scope;
pub use world::{
    Act, Body, Busy, Cached, Client, ClientPhase, Effect, Fault, Fill, Ghost, Handler,
    PendingCleanup, Tx, Worker, World,
};
use world::{body_of, token_bytes};

/// Milliseconds per model clock tick (the core's shortest accepted lease is 1 s).
pub const TICK_MS: u64 = 1_000;

/// The raw `Idempotency-Key` every client sends.
pub const RAW_KEY: &str = "order-key-0001";
/// Method and route of the modelled endpoint.
const METHOD: &str = "POST";
const ROUTE: &str = "/orders";

/// The model: configuration plus everything derived from it once (scopes, fingerprints, the
/// route's core [`Config`], the client retry policy).
#[derive(Clone, Debug)]
pub struct IdempoModel {
    /// Effect mode (and with it the takeover policy).
    pub mode: EffectMode,
    /// Mutation, if any.
    pub variant: Variant,
    /// Bounds.
    pub bounds: Bounds,
    /// The clients.
    pub clients: Vec<ClientSpec>,
    scopes: Vec<ScopeId>,
    client_scope: Vec<u8>,
    fingerprints: Vec<FingerprintText>,
    client_fp: Vec<u8>,
    config: Arc<Config>,
    retry: RetryPolicy,
    /// With the liveness property on: the patient twin its continuations run on.
    patient: Option<Arc<IdempoModel>>,
}

impl IdempoModel {
    /// A model of `clients` under one raw key, in `mode`, with `bounds`, running the shipped core.
    ///
    /// # Panics
    /// When the bounds give an invalid core policy (lease shorter than 1 s, TTL 0), or more than
    /// 250 clients/attempts: a test configuration error.
    #[must_use]
    pub fn new(mode: EffectMode, clients: &[ClientSpec], bounds: Bounds) -> Self {
        let lease_ms = u64::from(bounds.lease) * TICK_MS;
        let lease = LeasePolicy::new(
            lease_ms,
            if bounds.heartbeats {
                Some(lease_ms / 2)
            } else {
                None
            },
        )
        .expect("model lease is a valid core lease");
        let config = Config {
            lease,
            takeover: mode.takeover(),
            ttl_ms: std::num::NonZeroU64::new(u64::from(bounds.ttl) * TICK_MS)
                .expect("model TTL is positive"),
            transactional: mode == EffectMode::Transactional,
            ..Config::default()
        };
        let mut scopes = Vec::new();
        let mut fingerprints: Vec<FingerprintText> = Vec::new();
        let mut client_scope = Vec::new();
        let mut client_fp = Vec::new();
        for c in clients {
            let scope = ScopeId::from_parts(c.principal, METHOD, ROUTE, RAW_KEY);
            let si = scopes.iter().position(|s| *s == scope).unwrap_or_else(|| {
                scopes.push(scope);
                scopes.len() - 1
            });
            let fp = fingerprint(
                &RequestParts::json(METHOD, ROUTE, c.body.as_bytes()),
                &FingerprintConfig::default(),
            )
            .expect("model bodies are valid JSON");
            let fp = FingerprintText::new(fp.to_string()).expect("core fingerprints are valid");
            let fi = fingerprints
                .iter()
                .position(|f| *f == fp)
                .unwrap_or_else(|| {
                    fingerprints.push(fp);
                    fingerprints.len() - 1
                });
            client_scope.push(u8::try_from(si).expect("few scopes"));
            client_fp.push(u8::try_from(fi).expect("few fingerprints"));
        }
        let retry = RetryPolicy::new(RetryConfig {
            max_attempts: 1 + u32::from(bounds.retries),
            ..RetryConfig::default()
        })
        .expect("valid retry policy");
        Self {
            mode,
            variant: Variant::Correct,
            bounds,
            clients: clients.to_vec(),
            scopes,
            client_scope,
            fingerprints,
            client_fp,
            config: Arc::new(config),
            retry,
            patient: None,
        }
    }

    /// The same model with a mutation applied.
    #[must_use]
    pub fn with_variant(mut self, variant: Variant) -> Self {
        self.variant = variant;
        if variant == Variant::TransactionalFlagOff {
            Arc::make_mut(&mut self.config).transactional = false;
        }
        self
    }

    /// The same model with the liveness property [`liveness::L`] checked on every state (costly:
    /// one continuation per state; for small configurations).
    #[must_use]
    pub fn with_liveness(mut self) -> Self {
        self.patient = None;
        self.patient = Some(Arc::new(self.patient_twin()));
        self
    }

    /// Whether [`liveness::L`] is among the properties.
    #[must_use]
    pub fn checks_liveness(&self) -> bool {
        self.patient.is_some()
    }

    fn patient_twin(&self) -> Self {
        let mut p = self.clone();
        p.patient = None;
        p.retry = RetryPolicy::new(RetryConfig {
            max_attempts: 250,
            ..RetryConfig::default()
        })
        .expect("valid retry policy");
        p.bounds.max_crashes = 0;
        p.bounds.store_faults = 0;
        p.bounds.failures = false;
        p
    }

    /// The twin the liveness continuations run on: the same model, core and mutation, with
    /// patient clients (attempts enough) and no crashes, store faults or handler failures.
    #[must_use]
    pub fn patient(&self) -> Arc<Self> {
        self.patient
            .clone()
            .unwrap_or_else(|| Arc::new(self.patient_twin()))
    }

    /// Number of distinct scopes among the clients.
    #[must_use]
    pub fn scope_count(&self) -> usize {
        self.scopes.len()
    }

    /// Scope index of client `c`.
    #[must_use]
    pub fn scope_of(&self, c: u8) -> u8 {
        self.client_scope[usize::from(c)]
    }

    /// Fingerprint index of client `c`.
    #[must_use]
    pub fn fp_of(&self, c: u8) -> u8 {
        self.client_fp[usize::from(c)]
    }

    /// The fingerprint client `c` sends.
    #[must_use]
    pub fn fingerprint_of(&self, c: u8) -> Option<&FingerprintText> {
        self.client_fp
            .get(usize::from(c))
            .and_then(|f| self.fingerprints.get(usize::from(*f)))
    }

    /// The index of a fingerprint some client sends.
    #[must_use]
    pub fn fingerprint_index(&self, fp: &FingerprintText) -> Option<u8> {
        self.fingerprints
            .iter()
            .position(|f| f == fp)
            .and_then(|i| u8::try_from(i).ok())
    }

    /// True when clients `a` and `b` send the same request in the same scope.
    #[must_use]
    pub fn same_request(&self, a: u8, b: u8) -> bool {
        self.scope_of(a) == self.scope_of(b) && self.fp_of(a) == self.fp_of(b)
    }

    fn now_ms(w: &World) -> u64 {
        u64::from(w.now) * TICK_MS
    }

    /// The store's clock (unix ms) in a state.
    #[must_use]
    pub fn clock_ms(w: &World) -> u64 {
        Self::now_ms(w)
    }

    /// The slot (index into [`World::store`]) a store operation addresses; `None` for a scope no
    /// client has.
    #[must_use]
    pub fn slot_of(&self, op: &StoreOp) -> Option<usize> {
        self.scopes.iter().position(|s| s == op_scope(op))
    }

    fn busy_index(w: &World, token: u8) -> Option<usize> {
        w.workers
            .iter()
            .position(|x| matches!(x, Worker::Busy(b) if b.token == token))
    }

    fn locked_by_other(w: &World, scope: u8, me: u8, model: &Self) -> bool {
        w.workers.iter().any(|x| match x {
            Worker::Busy(b) => b.token != me && b.tx.is_some() && model.scope_of(b.client) == scope,
            Worker::Idle => false,
        })
    }

    fn canonical(w: &mut World) {
        w.workers.sort_by_key(|x| match x {
            Worker::Idle => (0u8, 0u8),
            Worker::Busy(b) => (1, b.token),
        });
    }
}
