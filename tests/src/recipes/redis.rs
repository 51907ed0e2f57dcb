//! The Redis scripts (`spec/STORAGE.md` §5) on a real Lua 5.1 interpreter (mlua, vendored), with
//! `redis.call` implementing the commands the scripts use (`HMGET`, `HGETALL`, `HSET`, `HDEL`,
//! `DEL`, `PEXPIRE`, `TIME`) over one in-memory hash, and Redis's conversions between Lua and
//! replies (`nil` bulk as `false`, numbers truncated to integers, tables as arrays).
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use idempo_core::machine::StoreOp;
use idempo_core::machine::store::ClaimOutcome;
use idempo_core::recipes;
use idempo_core::record::{Record, RecordRow};
use mlua::{Lua, MultiValue, Value, Variadic};

use super::{Applied, Outcome, Step};

/// The script bodies a [`RedisRecipes`] runs: the shipped ones, or a mutation of one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisTexts {
    /// [`recipes::REDIS_CLAIM`].
    pub claim: String,
    /// [`recipes::REDIS_GET`].
    pub get: String,
    /// [`recipes::REDIS_TAKEOVER`].
    pub takeover: String,
    /// [`recipes::REDIS_MARK_UNKNOWN`].
    pub mark_unknown: String,
    /// [`recipes::REDIS_COMPLETE`].
    pub complete: String,
    /// [`recipes::REDIS_RELEASE`].
    pub release: String,
    /// [`recipes::REDIS_RENEW`].
    pub renew: String,
    /// [`recipes::REDIS_PURGE_ONE`].
    pub purge: String,
}

impl Default for RedisTexts {
    fn default() -> Self {
        Self {
            claim: recipes::REDIS_CLAIM.into(),
            get: recipes::REDIS_GET.into(),
            takeover: recipes::REDIS_TAKEOVER.into(),
            mark_unknown: recipes::REDIS_MARK_UNKNOWN.into(),
            complete: recipes::REDIS_COMPLETE.into(),
            release: recipes::REDIS_RELEASE.into(),
            renew: recipes::REDIS_RENEW.into(),
            purge: recipes::REDIS_PURGE_ONE.into(),
        }
    }
}

/// The one key's hash and its `PEXPIRE` (ms from the script's `now`).
#[derive(Default)]
struct Key {
    hash: BTreeMap<Vec<u8>, Vec<u8>>,
    pexpire: Option<i64>,
}

/// A Lua interpreter whose `redis.call` works on one key.
pub struct RedisRecipes {
    lua: Lua,
    key: Rc<RefCell<Key>>,
    texts: RedisTexts,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn bytes(v: &Value) -> Result<Vec<u8>, mlua::Error> {
    match v {
        Value::String(s) => Ok(s.as_bytes().to_vec()),
        Value::Integer(i) => Ok(i.to_string().into_bytes()),
        Value::Number(n) => Ok(format!("{n}").into_bytes()),
        other => Err(mlua::Error::runtime(format!(
            "redis.call argument must be a string or number, got {}",
            other.type_name()
        ))),
    }
}

impl RedisRecipes {
    /// An interpreter with `redis.call` installed.
    ///
    /// # Errors
    /// When Lua cannot be set up.
    pub fn new(texts: RedisTexts) -> Result<Self, String> {
        let lua = Lua::new();
        let key = Rc::new(RefCell::new(Key::default()));
        let k = Rc::clone(&key);
        let call = lua
            .create_function(move |lua, args: Variadic<Value>| {
                let cmd = String::from_utf8_lossy(&bytes(args.first().unwrap_or(&Value::Nil))?)
                    .to_ascii_uppercase();
                let rest: Vec<Vec<u8>> =
                    args.iter().skip(2).map(bytes).collect::<Result<_, _>>()?;
                let mut key = k.borrow_mut();
                match cmd.as_str() {
                    "TIME" => Err(mlua::Error::runtime(
                        "TIME: the model always passes the clock override",
                    )),
                    "HMGET" => {
                        let t = lua.create_table()?;
                        for (i, f) in rest.iter().enumerate() {
                            match key.hash.get(f) {
                                Some(v) => t.raw_set(i + 1, lua.create_string(v)?)?,
                                None => t.raw_set(i + 1, false)?,
                            }
                        }
                        Ok(Value::Table(t))
                    }
                    "HGETALL" => {
                        let t = lua.create_table()?;
                        for (i, (f, v)) in key.hash.iter().enumerate() {
                            t.raw_set(2 * i + 1, lua.create_string(f)?)?;
                            t.raw_set(2 * i + 2, lua.create_string(v)?)?;
                        }
                        Ok(Value::Table(t))
                    }
                    "HSET" => {
                        if rest.is_empty() || rest.len() % 2 != 0 {
                            return Err(mlua::Error::runtime("HSET: wrong number of arguments"));
                        }
                        let mut added = 0;
                        for pair in rest.chunks(2) {
                            if key.hash.insert(pair[0].clone(), pair[1].clone()).is_none() {
                                added += 1;
                            }
                        }
                        Ok(Value::Integer(added))
                    }
                    "HDEL" => {
                        let n = rest
                            .iter()
                            .filter(|f| key.hash.remove(*f).is_some())
                            .count();
                        if key.hash.is_empty() {
                            key.pexpire = None;
                        }
                        Ok(Value::Integer(i64::try_from(n).unwrap_or(i64::MAX)))
                    }
                    "DEL" => {
                        let had = !key.hash.is_empty();
                        key.hash.clear();
                        key.pexpire = None;
                        Ok(Value::Integer(i64::from(had)))
                    }
                    "PEXPIRE" => {
                        if key.hash.is_empty() {
                            return Ok(Value::Integer(0));
                        }
                        let ms = String::from_utf8_lossy(rest.first().map_or(&[][..], |v| v))
                            .parse::<i64>()
                            .map_err(|_| {
                                mlua::Error::runtime("PEXPIRE: value is not an integer")
                            })?;
                        key.pexpire = Some(ms);
                        Ok(Value::Integer(1))
                    }
                    other => Err(mlua::Error::runtime(format!(
                        "redis.call: {other} is not emulated"
                    ))),
                }
            })
            .map_err(err)?;
        let redis = lua.create_table().map_err(err)?;
        redis.set("call", call).map_err(err)?;
        lua.globals().set("redis", redis).map_err(err)?;
        Ok(Self { lua, key, texts })
    }

    fn load(&self, slot: &Option<Record>) -> Result<(), String> {
        let mut key = self.key.borrow_mut();
        key.hash.clear();
        key.pexpire = None;
        if let Some(r) = slot {
            let row = r.to_row().map_err(err)?;
            let mut put = |f: &str, v: Vec<u8>| {
                key.hash.insert(f.as_bytes().to_vec(), v);
            };
            put("fingerprint", row.fingerprint.into_bytes());
            put("state", row.state.to_string().into_bytes());
            put("token", row.token);
            put("generation", row.generation.to_string().into_bytes());
            if let Some(l) = row.lease_until_ms {
                put("lease_until", l.to_string().into_bytes());
            }
            put("expires_at", row.expires_at_ms.to_string().into_bytes());
            if let Some(resp) = row.response {
                put("response", resp);
            }
        }
        Ok(())
    }

    /// The slot the hash holds, and a check of the §5.1 expiry rule: a written record's hash
    /// lives until `expires_at + 60 s`.
    fn read(&self, now_ms: u64, written: bool) -> Result<Option<Record>, String> {
        let key = self.key.borrow();
        if key.hash.is_empty() {
            return Ok(None);
        }
        let text = |f: &str| -> Result<String, String> {
            key.hash
                .get(f.as_bytes())
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .ok_or_else(|| format!("hash lacks field {f}"))
        };
        let int = |f: &str| -> Result<i64, String> {
            text(f)?.parse::<i64>().map_err(|e| format!("{f}: {e}"))
        };
        let row = RecordRow {
            fingerprint: text("fingerprint")?,
            state: int("state")?,
            token: key
                .hash
                .get(&b"token"[..])
                .cloned()
                .ok_or("hash lacks field token")?,
            generation: int("generation")?,
            lease_until_ms: key
                .hash
                .contains_key(&b"lease_until"[..])
                .then(|| int("lease_until"))
                .transpose()?,
            expires_at_ms: int("expires_at")?,
            response: key.hash.get(&b"response"[..]).cloned(),
        };
        if key.hash.len() > 7 {
            return Err(format!("hash holds unknown fields: {:?}", key.hash.keys()));
        }
        if written {
            let now = i64::try_from(now_ms).map_err(err)?;
            let want =
                row.expires_at_ms - now + i64::try_from(recipes::REDIS_GRACE_MS).map_err(err)?;
            if key.pexpire != Some(want) {
                return Err(format!(
                    "PEXPIRE {:?} after a write, expected {want} (expires_at + grace)",
                    key.pexpire
                ));
            }
        }
        Record::from_row(row).map(Some).map_err(err)
    }

    fn run(&self, body: &str, argv: &[&[u8]]) -> Result<Value, String> {
        let keys = self.lua.create_table().map_err(err)?;
        keys.raw_set(1, "idempo:scope").map_err(err)?;
        let args = self.lua.create_table().map_err(err)?;
        for (i, a) in argv.iter().enumerate() {
            args.raw_set(i + 1, self.lua.create_string(a).map_err(err)?)
                .map_err(err)?;
        }
        self.lua.globals().set("KEYS", keys).map_err(err)?;
        self.lua.globals().set("ARGV", args).map_err(err)?;
        let out: MultiValue = self.lua.load(body).eval().map_err(err)?;
        Ok(out.into_iter().next().unwrap_or(Value::Nil))
    }

    /// Runs `step` from `slot` at `now_ms`: its answer (converted as Redis converts a script's
    /// return value) and the slot after it.
    ///
    /// # Errors
    /// Lua errors, replies of the wrong shape, hashes that do not form a record, `Commit`.
    pub fn step(
        &mut self,
        slot: &Option<Record>,
        step: Step<'_>,
        now_ms: u64,
    ) -> Result<Outcome, String> {
        self.load(slot)?;
        let now = now_ms.to_string();
        let now_b = now.as_bytes();
        let before = self.key.borrow().hash.clone();
        let applied = match step {
            Step::Purge => {
                let v = self.run(&self.texts.purge, &[now_b])?;
                match integer(&v)? {
                    0 => Applied::Purge(None),
                    s => Applied::Purge(Some(s)),
                }
            }
            Step::Op(op) => match op {
                StoreOp::Claim {
                    fingerprint,
                    token,
                    lease_ms,
                    ttl_ms,
                    ..
                } => {
                    let v = self.run(
                        &self.texts.claim,
                        &[
                            fingerprint.as_str().as_bytes(),
                            &token.0,
                            lease_ms.to_string().as_bytes(),
                            ttl_ms.to_string().as_bytes(),
                            now_b,
                        ],
                    )?;
                    let Value::Table(t) = v else {
                        return Err(format!("claim returned {v:?}"));
                    };
                    let flag: Value = t.raw_get(1).map_err(err)?;
                    let at: Value = t.raw_get(2).map_err(err)?;
                    if integer(&at)? != i64::try_from(now_ms).map_err(err)? {
                        return Err(format!("claim returned now {at:?}, expected {now}"));
                    }
                    match integer(&flag)? {
                        1 => {
                            let g: Value = t.raw_get(3).map_err(err)?;
                            Applied::Claim(ClaimOutcome::Claimed {
                                generation: u32::try_from(integer(&g)?).map_err(err)?,
                            })
                        }
                        0 => {
                            // The reply carries HGETALL of the live record; it must be the slot.
                            let existing = self.read(now_ms, false)?;
                            let Some(r) = existing else {
                                return Err("claim refused without a record".into());
                            };
                            let Value::Table(all) = t.raw_get::<Value>(3).map_err(err)? else {
                                return Err("claim's third element is not HGETALL".into());
                            };
                            if all.raw_len() != 2 * before.len() {
                                return Err("claim's HGETALL is not the whole hash".into());
                            }
                            Applied::Claim(ClaimOutcome::Existing(r))
                        }
                        other => return Err(format!("claim flag {other}")),
                    }
                }
                StoreOp::Get { .. } => {
                    let v = self.run(&self.texts.get, &[now_b])?;
                    let Value::Table(t) = v else {
                        return Err(format!("get returned {v:?}"));
                    };
                    let at: Value = t.raw_get(1).map_err(err)?;
                    if integer(&at)? != i64::try_from(now_ms).map_err(err)? {
                        return Err(format!("get returned now {at:?}"));
                    }
                    Applied::Get(self.read(now_ms, false)?)
                }
                StoreOp::TakeOver {
                    seen_token,
                    new_token,
                    lease_ms,
                    ..
                } => {
                    let v = self.run(
                        &self.texts.takeover,
                        &[
                            &seen_token.0,
                            &new_token.0,
                            lease_ms.to_string().as_bytes(),
                            now_b,
                        ],
                    )?;
                    match v {
                        Value::Boolean(false) | Value::Nil => Applied::TakeOver(None),
                        other => {
                            Applied::TakeOver(Some(u32::try_from(integer(&other)?).map_err(err)?))
                        }
                    }
                }
                StoreOp::MarkUnknown {
                    seen_token, ttl_ms, ..
                } => {
                    let v = self.run(
                        &self.texts.mark_unknown,
                        &[&seen_token.0, ttl_ms.to_string().as_bytes(), now_b],
                    )?;
                    Applied::Applied(flag(&v)?)
                }
                StoreOp::Complete {
                    token,
                    response,
                    ttl_ms,
                    ..
                } => {
                    let v = self.run(
                        &self.texts.complete,
                        &[&token.0, response, ttl_ms.to_string().as_bytes(), now_b],
                    )?;
                    Applied::Applied(flag(&v)?)
                }
                StoreOp::Release { token, .. } => {
                    let v = self.run(&self.texts.release, &[&token.0, now_b])?;
                    Applied::Applied(flag(&v)?)
                }
                StoreOp::Renew {
                    token, lease_ms, ..
                } => {
                    let v = self.run(
                        &self.texts.renew,
                        &[&token.0, lease_ms.to_string().as_bytes(), now_b],
                    )?;
                    Applied::Applied(flag(&v)?)
                }
                StoreOp::Commit { .. } => return Err("COMMIT is not a store recipe".into()),
            },
        };
        let written = {
            let key = self.key.borrow();
            key.hash != before && !key.hash.is_empty()
        };
        Ok((applied, self.read(now_ms, written)?))
    }
}

/// A reply as Redis converts a Lua value to an integer reply (numbers truncated; strings as the
/// bindings parse them).
fn integer(v: &Value) -> Result<i64, String> {
    match v {
        Value::Integer(i) => Ok(*i),
        #[allow(clippy::cast_possible_truncation)]
        Value::Number(n) => Ok(n.trunc() as i64),
        Value::String(s) => String::from_utf8_lossy(&s.as_bytes())
            .parse::<i64>()
            .map_err(err),
        other => Err(format!("expected an integer reply, got {other:?}")),
    }
}

fn flag(v: &Value) -> Result<bool, String> {
    match integer(v)? {
        0 => Ok(false),
        1 => Ok(true),
        n => Err(format!("expected 0 or 1, got {n}")),
    }
}
