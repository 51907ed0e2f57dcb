//! A small hand-written command-line parser: long options (`--name value`, `--name=value`),
//! boolean flags, repeatable options, positionals and `--` to end options.
//!
//! Arguments are `OsString`s: a value that is not UTF-8 is never a panic. Options and the values
//! that must be text (method, route, numbers) are required to be UTF-8; positionals that may be
//! raw bytes (a key value, a file name) stay `OsString`.
use std::ffi::{OsStr, OsString};

/// A usage error: the message explains it; the caller adds a pointer to `--help`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UsageError(pub String);

/// What a command accepts.
pub(crate) struct Spec {
    /// Options that take a value, e.g. `"method"` for `--method M`.
    pub valued: &'static [&'static str],
    /// Boolean flags, e.g. `"strict"`.
    pub flags: &'static [&'static str],
    /// Most positionals accepted.
    pub max_positionals: usize,
}

/// Parsed arguments of one command.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    /// `(name, value)` for valued options, in command-line order (repeatable ones appear often).
    pub values: Vec<(&'static str, String)>,
    /// Flags that were given.
    pub flags: Vec<&'static str>,
    /// Positionals in order.
    pub positionals: Vec<OsString>,
    /// `-h` / `--help` was given.
    pub help: bool,
}

impl Parsed {
    /// The last value of a valued option.
    pub(crate) fn value(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a repeatable option, in order.
    pub(crate) fn all(&self, name: &str) -> Vec<&str> {
        self.values
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// Whether a flag was given.
    pub(crate) fn flag(&self, name: &str) -> bool {
        self.flags.contains(&name)
    }

    /// A required valued option.
    pub(crate) fn required(&self, name: &str) -> Result<&str, UsageError> {
        self.value(name)
            .ok_or_else(|| UsageError(format!("--{name} is required")))
    }

    /// A valued option read as an unsigned number.
    pub(crate) fn number(&self, name: &str) -> Result<Option<usize>, UsageError> {
        self.value(name)
            .map(|v| {
                v.parse::<usize>().map_err(|_| {
                    UsageError(format!("--{name} needs a non-negative integer, got {v:?}"))
                })
            })
            .transpose()
    }
}

/// Parses `args` (without the program and command names) against `spec`.
pub(crate) fn parse(args: &[OsString], spec: &Spec) -> Result<Parsed, UsageError> {
    let mut out = Parsed::default();
    let mut i = 0;
    let mut only_positionals = false;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        let t = match arg.to_str() {
            Some(t) if !only_positionals && t.starts_with('-') && t.len() > 1 => t,
            _ => {
                out.positionals.push(arg.clone());
                continue;
            }
        };
        if t == "--" {
            only_positionals = true;
            continue;
        }
        if t == "-h" || t == "--help" {
            out.help = true;
            continue;
        }
        let Some(body) = t.strip_prefix("--") else {
            return Err(UsageError(format!("unknown option {}", shown(arg))));
        };
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (body, None),
        };
        if let Some(&flag) = spec.flags.iter().find(|f| **f == name) {
            if inline.is_some() {
                return Err(UsageError(format!("--{flag} takes no value")));
            }
            out.flags.push(flag);
        } else if let Some(&opt) = spec.valued.iter().find(|f| **f == name) {
            let value = match inline {
                Some(v) => v,
                None => {
                    let next = args
                        .get(i)
                        .ok_or_else(|| UsageError(format!("--{opt} needs a value")))?;
                    i += 1;
                    next.to_str()
                        .map(str::to_owned)
                        .ok_or_else(|| UsageError(format!("the value of --{opt} is not UTF-8")))?
                }
            };
            out.values.push((opt, value));
        } else {
            return Err(UsageError(format!("unknown option {}", shown(arg))));
        }
    }
    if out.positionals.len() > spec.max_positionals && !out.help {
        return Err(UsageError(format!(
            "too many arguments (at most {} expected): {}",
            spec.max_positionals,
            shown(&out.positionals[spec.max_positionals])
        )));
    }
    Ok(out)
}

/// An argument shown in a message: escaped, never raw.
pub(crate) fn shown(arg: &OsStr) -> String {
    format!("{:?}", arg.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: Spec = Spec {
        valued: &["method", "header"],
        flags: &["strict"],
        max_positionals: 1,
    };

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn options_flags_positionals() {
        let p = parse(
            &os(&[
                "--method",
                "POST",
                "--header=a:b",
                "--header",
                "c:d",
                "--strict",
                "f.json",
            ]),
            &SPEC,
        )
        .expect("parses");
        assert_eq!(p.value("method"), Some("POST"));
        assert_eq!(p.all("header"), vec!["a:b", "c:d"]);
        assert!(p.flag("strict"));
        assert_eq!(p.positionals, os(&["f.json"]));
        let p = parse(&os(&["--", "--strict"]), &SPEC).expect("parses");
        assert_eq!(p.positionals, os(&["--strict"]));
        assert!(parse(&os(&["-"]), &SPEC).expect("stdin dash").positionals == os(&["-"]));
    }

    #[test]
    fn usage_errors() {
        assert!(parse(&os(&["--nope"]), &SPEC).is_err());
        assert!(parse(&os(&["-x"]), &SPEC).is_err());
        assert!(parse(&os(&["--method"]), &SPEC).is_err());
        assert!(parse(&os(&["--strict=1"]), &SPEC).is_err());
        assert!(parse(&os(&["a", "b"]), &SPEC).is_err());
        assert!(
            parse(&os(&["--help", "a", "b"]), &SPEC)
                .expect("help wins")
                .help
        );
    }
}
