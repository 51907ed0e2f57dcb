//! Route templates: `/payments/{id}/capture`, the same form as the bindings' route templates
//! (Starlette, Express, Fastify). The template, never the concrete path, is the scope's route
//! (`spec/KEYS.md` §2); matching a request path to a template is the gateway's routing.
//!
//! A path matches a template exactly ([`RouteTemplate::matches`]) or as a **variant**
//! ([`RouteTemplate::matches_variant`], exact matches included): the same path once the differences that servers commonly
//! ignore when they route are taken away (letter case, a trailing or doubled slash, `.` and `..`
//! segments, `;` parameters, percent-encoded letters, digits and `-._~`). The gateway protects a
//! variant as its route: the upstream behind it (Express ignores case and a trailing slash by
//! default, nginx merges slashes, servlet containers drop `;` parameters) may well run the same
//! handler for it, and forwarding it unprotected would let a retry on `/payments/` charge twice.

/// A parsed path template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTemplate {
    text: String,
    segments: Vec<Segment>,
    /// The segments in the loose form a variant is compared in.
    loose: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param,
}

/// A template that cannot be parsed, with the byte offset of the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (at byte {offset})")]
pub struct TemplateError {
    /// What is wrong.
    pub message: String,
    /// Byte offset in the template.
    pub offset: usize,
}

fn err(message: impl Into<String>, offset: usize) -> TemplateError {
    TemplateError {
        message: message.into(),
        offset,
    }
}

impl RouteTemplate {
    /// Parses `text`: it starts with `/`; each segment is literal or one whole `{name}`
    /// parameter (`name`: ASCII letters, digits, `_`).
    ///
    /// # Errors
    /// [`TemplateError`] naming the offending byte.
    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        if !text.starts_with('/') {
            return Err(err("a path template starts with '/'", 0));
        }
        let mut segments = Vec::new();
        let mut offset = 1;
        let mut names: Vec<&str> = Vec::new();
        for seg in text.get(1..).unwrap_or("").split('/') {
            if let Some(inner) = seg.strip_prefix('{') {
                let Some(name) = inner.strip_suffix('}') else {
                    return Err(err(
                        "a parameter is one whole segment, written {name}",
                        offset,
                    ));
                };
                if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                {
                    return Err(err(
                        format!("parameter name {name:?} must be letters, digits or '_'"),
                        offset,
                    ));
                }
                if names.contains(&name) {
                    return Err(err(format!("parameter {name:?} appears twice"), offset));
                }
                names.push(name);
                segments.push(Segment::Param);
            } else if let Some(at) = seg.find(['{', '}', '?', '#', '*']) {
                return Err(err(
                    format!("unexpected {:?} in a literal segment", &seg[at..=at]),
                    offset + at,
                ));
            } else {
                segments.push(Segment::Literal(seg.to_owned()));
            }
            offset += seg.len() + 1;
        }
        // A template whose own loose form has another shape (`/a//b`, `/a/./b`, `/a/`) matches
        // no variant, only its exact paths.
        let folded = loose_segments(text);
        let loose = if folded.len() == segments.len() {
            folded
                .into_iter()
                .zip(&segments)
                .map(|(l, s)| match s {
                    Segment::Param => Segment::Param,
                    Segment::Literal(_) => Segment::Literal(l),
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(Self {
            text: text.to_owned(),
            segments,
            loose,
        })
    }

    /// The template text (the scope's route and the metrics' `route` label).
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// True when `path` (no query) matches: same number of segments, literals equal, each
    /// parameter a non-empty segment.
    #[must_use]
    pub fn matches(&self, path: &str) -> bool {
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let parts: Vec<&str> = rest.split('/').collect();
        parts.len() == self.segments.len()
            && parts.iter().zip(&self.segments).all(|(p, s)| match s {
                Segment::Literal(l) => p == l,
                Segment::Param => !p.is_empty(),
            })
    }

    /// True when `path` (no query) matches exactly or is a variant of this template: it
    /// matches once both are in the loose form (ASCII lower case; `;` parameters dropped from
    /// each segment; `%XX` of an unreserved character decoded; empty and `.` segments dropped;
    /// `..` removes the segment before it).
    #[must_use]
    pub fn matches_variant(&self, path: &str) -> bool {
        if self.matches(path) {
            return true;
        }
        if self.loose.is_empty() || !path.starts_with('/') {
            return false;
        }
        let parts = loose_segments(path);
        parts.len() == self.loose.len()
            && parts.iter().zip(&self.loose).all(|(p, s)| match s {
                Segment::Literal(l) => p == l,
                Segment::Param => !p.is_empty(),
            })
    }
}

/// The segments of `path` in the loose form of [`RouteTemplate::matches_variant`].
fn loose_segments(path: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for seg in path.split('/') {
        let seg = seg.split(';').next().unwrap_or("");
        let seg = decode_unreserved(seg).to_ascii_lowercase();
        match seg.as_str() {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            _ => out.push(seg),
        }
    }
    out
}

/// `%XX` sequences that encode an unreserved character (RFC 3986 §2.3: letters, digits, `-`, `.`,
/// `_`, `~`) decoded; everything else as it is (so `%2F` stays inside its segment).
fn decode_unreserved(seg: &str) -> String {
    let mut out = String::with_capacity(seg.len());
    let mut rest = seg;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let decoded = rest
            .get(at + 1..at + 3)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .filter(|c| c.is_ascii_alphanumeric() || b"-._~".contains(c));
        match decoded {
            Some(c) => {
                out.push(char::from(c));
                rest = &rest[at + 3..];
            }
            None => {
                out.push('%');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_match_whole_segments() {
        let t = RouteTemplate::parse("/accounts/{account}/payments").expect("valid");
        assert!(t.matches("/accounts/a1/payments"));
        assert!(!t.matches("/accounts//payments"));
        assert!(!t.matches("/accounts/a1/payments/x"));
        assert!(!t.matches("/accounts/a1"));
        let root = RouteTemplate::parse("/payments").expect("valid");
        assert!(root.matches("/payments"));
        assert!(!root.matches("/payments/"));
    }

    #[test]
    fn variants_are_what_servers_route_alike() {
        let t = RouteTemplate::parse("/accounts/{account}/payments").expect("valid");
        for v in [
            "/accounts/a1/payments/",
            "/Accounts/A1/PAYMENTS",
            "//accounts/a1//payments",
            "/accounts/a1/./payments",
            "/accounts/a1/x/../payments",
            "/accounts/a1/payments;jsessionid=1",
            "/accounts;v=2/a1/payments",
            "/accounts/a1/p%61yments",
            "/accounts/a1/P%41YMENTS/",
            "/accounts/%2e/a1/payments",
        ] {
            assert!(t.matches_variant(v), "{v}");
            assert!(!t.matches(v), "{v}");
        }
        // The exact path counts too; other paths do not.
        assert!(t.matches_variant("/accounts/a1/payments"));
        for other in [
            "/accounts/a1",
            "/accounts/a1/payments/x",
            "/accounts//payments",
            "/accounts/a1/pay%2Fments",
            "/accounts/a1/refunds",
            "accounts/a1/payments",
            "/accounts/a1/payments/..",
            "/accounts/a1/paym%",
            "/accounts/a1/paym%zz",
        ] {
            assert!(!t.matches_variant(other), "{other}");
        }
        // Multi-byte text and stray percent signs do not trip the decoding.
        assert_eq!(decode_unreserved("%E2%82%ACé%4a%"), "%E2%82%ACéJ%");
        // A template whose own loose form has another shape matches only exactly.
        let odd = RouteTemplate::parse("/a//b").expect("valid");
        assert!(odd.matches_variant("/a//b"));
        assert!(!odd.matches_variant("/a/b"));
    }

    #[test]
    fn bad_templates_name_the_byte() {
        assert_eq!(
            RouteTemplate::parse("payments").map_err(|e| e.offset),
            Err(0)
        );
        assert_eq!(RouteTemplate::parse("/p/{id").map_err(|e| e.offset), Err(3));
        assert_eq!(
            RouteTemplate::parse("/p/a{id}").map_err(|e| e.offset),
            Err(4)
        );
        assert!(RouteTemplate::parse("/p/{id}/{id}").is_err());
    }
}
