//! The host and store options' defaults, read-only from core (`idempo_core::options`).
use idempo_core::options::{OPTIONS, OptionDefault, camel_case};
use napi_derive::napi;

/// One option's default: exactly one of `number`, `flag`, `text`, `list` is set, or none (unset).
#[napi(object)]
pub struct OptionDefaultEntry {
    /// `host`, `memory_store`, `sqlite_store`, `postgres_store`, `redis_store`, `cached_store`, `purge`.
    pub owner: String,
    /// The option's name in camelCase (`timeoutMs`).
    pub name: String,
    /// A duration (ms) or a count.
    pub number: Option<f64>,
    /// A switch.
    pub flag: Option<bool>,
    /// A text.
    pub text: Option<String>,
    /// A list of texts.
    pub list: Option<Vec<String>>,
}

/// Every host and store option's default (`spec/OPTIONS.md`), in the reference table's order.
#[napi]
#[must_use]
#[allow(clippy::cast_precision_loss)] // defaults are far below 2^53
pub fn option_defaults() -> Vec<OptionDefaultEntry> {
    OPTIONS
        .iter()
        .map(|o| {
            let mut e = OptionDefaultEntry {
                owner: o.owner.to_owned(),
                name: camel_case(o.name),
                number: None,
                flag: None,
                text: None,
                list: None,
            };
            match o.default {
                OptionDefault::Ms(v) | OptionDefault::Count(v) => e.number = Some(v as f64),
                OptionDefault::Bool(b) => e.flag = Some(b),
                OptionDefault::Text(t) => e.text = Some(t.to_owned()),
                OptionDefault::List(l) => {
                    e.list = Some(l.iter().map(|s| (*s).to_owned()).collect())
                }
                OptionDefault::Unset => {}
            }
            e
        })
        .collect()
}
