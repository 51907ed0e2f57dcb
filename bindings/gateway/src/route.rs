//! Route templates: `/payments/{id}/capture`, the same form as the bindings' route templates
//! (Starlette, Express, Fastify). The template, never the concrete path, is the scope's route
//! (`spec/KEYS.md` §2); matching a request path to a template is the gateway's routing.

/// A parsed path template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTemplate {
    text: String,
    segments: Vec<Segment>,
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
        Ok(Self {
            text: text.to_owned(),
            segments,
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
