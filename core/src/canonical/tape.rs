//! The tape: the full parser's output, a flat arena of nodes the emitter walks without recursion.

use super::number::Num;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tag {
    Null,
    True,
    False,
    /// A number whose canonical form is `input[a..a + b]` (a prefix of its literal; `-0` is
    /// written `0`): integers of at most 15 digits, and plain decimals of at most 15 significant
    /// digits at or above 1e-6, which are exact and print as themselves minus trailing zeros.
    Int,
    /// Other number. `a` = start, `b` = length, `c` = index into `nums`.
    Float,
    /// A number of at most 15 significant digits well inside the normal range, whose canonical
    /// form was written from its digits: `strbuf[a..a + b]` (exact, no precision check needed).
    /// `c` = start of the literal.
    NumText,
    /// String without escapes. `a` = first content byte, `b` = length in the input.
    Str,
    /// Unescaped string. `a` = start, `b` = length in `strbuf`, `c` = offset of the opening quote.
    StrOwned,
    /// Array. `a` = offset of `[`, `b` = index of the node after the array's subtree.
    Array,
    /// Object. `a` = first index in `members`, `b` = index after the subtree, `c` = member count.
    Object,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Node {
    pub(crate) tag: Tag,
    /// Verbatim: the canonical form is a run of the input. On a member's key node (`Str`):
    /// `"name":value` is `input[a - 1..c]`. On an `Array`: the array is `input[a..c]`.
    pub(crate) v: bool,
    pub(crate) a: u32,
    pub(crate) b: u32,
    pub(crate) c: u32,
}

/// The parsed document: a flat arena the emitter walks without recursion.
pub(crate) struct Tape<'a> {
    pub(crate) input: &'a [u8],
    pub(crate) nodes: Vec<Node>,
    /// Per object, its member key node indices in canonical (UTF-16) order; value = key + 1.
    pub(crate) members: Vec<u32>,
    pub(crate) strbuf: Vec<u8>,
    pub(crate) nums: Vec<Num>,
    /// When the root value's canonical form is a run of the input: that run's start and end.
    pub(crate) root: Option<(u32, u32)>,
}

impl Tape<'_> {
    /// The unescaped bytes of a string node.
    #[inline]
    pub(crate) fn str_bytes(&self, n: Node) -> &[u8] {
        let (a, b) = (n.a as usize, n.b as usize);
        match n.tag {
            Tag::StrOwned | Tag::NumText => self.strbuf.get(a..a + b).unwrap_or(&[]),
            _ => self.input.get(a..a + b).unwrap_or(&[]),
        }
    }

    /// The literal text of a number node.
    #[inline]
    pub(crate) fn literal(&self, n: Node) -> &[u8] {
        let (a, b) = (n.a as usize, n.b as usize);
        self.input.get(a..a + b).unwrap_or(&[])
    }

    /// Byte offset where a string node starts (its opening quote).
    pub(crate) fn str_offset(&self, n: Node) -> usize {
        match n.tag {
            Tag::StrOwned => n.c as usize,
            _ => (n.a as usize).saturating_sub(1),
        }
    }

    /// Node `i`; indices come from the parser itself, so they are always in range.
    #[inline]
    pub(crate) fn node(&self, i: u32) -> Node {
        self.nodes[i as usize]
    }

    /// True when a borrowed member name is followed directly by `:` in the input, so that
    /// `"name":` is one run of input bytes.
    #[inline]
    pub(crate) fn colon_follows(&self, n: Node) -> bool {
        self.input.get((n.a + n.b) as usize + 1) == Some(&b':')
    }
}
