//! The strict, iterative JSON parser: input bytes to a flat [`Tape`].
//!
//! One pass over the input, without recursion (depth is bounded by [`Limits::max_depth`] and by
//! memory, never by the call stack), builds a `Vec<Node>`; strings without escapes are borrowed
//! (a range of the input), others are unescaped once into one shared buffer. Each object's member
//! names are sorted when the object closes ([`super::keys`]); duplicates are then adjacent. This
//! is the reference path: the small-document fast path ([`super::small`]) gives up to it on
//! anything it does not handle.

use std::cmp::Ordering;

use super::error::{CanonError, CanonErrorKind as K};
use super::escape::read_escape;
use super::keys::{
    borrowed_prefix, cmp_keys, first_duplicate, key_prefix, sort_keys, utf16_sortable,
};
use super::number::{Num, NumberForm, read_number};
use super::pointer::push_token;
use super::scan::{
    char_at, scan_plain, scan_string, skip_ws, special_bytes, utf8_error_kind, valid_utf8,
};
use super::tape::{Node, Tag, Tape};
use super::{Limits, NumberMode};

/// Member names of an object (in input order) and the permutation that sorts them.
#[derive(Default)]
struct Shape {
    keys: Vec<(u64, u32, u32)>,
    perm: Vec<u32>,
    /// The names were already in canonical order.
    sorted: bool,
}

struct Frame {
    node: u32,
    is_obj: bool,
    /// Some enclosing container is an array: this object's shape probably repeats.
    in_arr: bool,
    /// Objects: where this object's key indices start in `pending`.
    pending_start: u32,
    /// Objects: members so far. Arrays: elements started so far.
    count: u32,
    /// Objects: the key node of the member being read, or `NO_KEY`.
    key: u32,
    /// Whitespace count when the container opened (objects: when the current member began).
    ws_open: u32,
    ws_key: u32,
    /// Every child so far is verbatim.
    all: bool,
}

const NO_KEY: u32 = u32::MAX;

pub(crate) struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
    limits: Limits,
    tape: Tape<'a>,
    stack: Vec<Frame>,
    /// Keys of the open objects: (8-byte big-endian prefix, key node, name length in bytes).
    pending: Vec<(u64, u32, u32)>,
    /// Per depth, the member names of the last object closed there and their sort permutation.
    shapes: Vec<Shape>,
    /// How many runs of whitespace were skipped so far (wrapping): unchanged across a value
    /// means the value's input text has no whitespace.
    ws: u32,
    /// The whole input is valid UTF-8 (checked once up front), so strings need no UTF-8 check.
    /// When it is not, strings are checked one by one so the first error is reported in order.
    utf8_ok: bool,
    /// [`NumberMode::RejectPrecisionLoss`]: float literals keep their exact decimal value.
    strict: bool,
}

/// The parser's and the tape's vectors, kept between calls so that a prepared caller (the
/// fingerprinter) allocates nothing per call once they have grown. Always left empty.
#[derive(Default)]
pub(crate) struct ParseScratch {
    nodes: Vec<Node>,
    members: Vec<u32>,
    strbuf: Vec<u8>,
    nums: Vec<Num>,
    stack: Vec<Frame>,
    pending: Vec<(u64, u32, u32)>,
    shapes: Vec<Shape>,
}

/// Vectors holding more nodes than this are freed after use rather than kept (a large body
/// must not pin its memory in a long-lived fingerprinter).
const KEEP_NODES: usize = 1 << 14;

impl ParseScratch {
    /// Take back the vectors of a tape (emptied; too large ones are dropped).
    pub(crate) fn recycle(&mut self, tape: Tape<'_>) {
        fn keep<T>(slot: &mut Vec<T>, mut v: Vec<T>, max: usize) {
            if v.capacity() <= max {
                v.clear();
                *slot = v;
            }
        }
        keep(&mut self.nodes, tape.nodes, KEEP_NODES);
        keep(&mut self.members, tape.members, KEEP_NODES);
        keep(&mut self.strbuf, tape.strbuf, KEEP_NODES * 4);
        keep(&mut self.nums, tape.nums, KEEP_NODES);
    }
}

/// Parse and fully validate `input` into a tape, using (and refilling) `scratch`'s vectors. The
/// tape's vectors go back with [`ParseScratch::recycle`].
pub(crate) fn parse_with<'a>(
    input: &'a [u8],
    limits: &Limits,
    numbers: NumberMode,
    scratch: &mut ParseScratch,
) -> Result<Tape<'a>, CanonError> {
    let max = limits.max_input_bytes.min(u32::MAX as usize - 1);
    if input.len() > max {
        return Err(CanonError::new(
            K::InputTooLarge {
                limit: limits.max_input_bytes,
            },
            max,
            None,
        ));
    }
    if input.starts_with(&[0xEF, 0xBB, 0xBF]) {
        return Err(CanonError::new(K::ByteOrderMark, 0, None));
    }
    let est = input.len() / 5 + 4;
    fn take<T>(v: &mut Vec<T>, n: usize) -> Vec<T> {
        let mut v = std::mem::take(v);
        if v.capacity() == 0 {
            return Vec::with_capacity(n);
        }
        v.clear();
        v.reserve(n);
        v
    }
    let mut shapes = std::mem::take(&mut scratch.shapes);
    for shape in &mut shapes {
        // Node ids of a previous input mean nothing here: an empty permutation never matches.
        shape.keys.clear();
        shape.perm.clear();
    }
    let mut p = Parser {
        input,
        pos: 0,
        limits: *limits,
        tape: Tape {
            input,
            nodes: take(&mut scratch.nodes, est),
            members: take(&mut scratch.members, est / 2),
            strbuf: take(&mut scratch.strbuf, 0),
            nums: take(&mut scratch.nums, 0),
            root: None,
        },
        stack: take(&mut scratch.stack, 16),
        pending: take(&mut scratch.pending, 32),
        shapes,
        ws: 0,
        utf8_ok: valid_utf8(input),
        strict: numbers == NumberMode::RejectPrecisionLoss,
    };
    let result = p.run();
    p.stack.clear();
    p.pending.clear();
    scratch.stack = p.stack;
    scratch.pending = p.pending;
    if p.shapes.len() <= 64 {
        scratch.shapes = p.shapes;
    }
    match result {
        Ok(()) => Ok(p.tape),
        Err(e) => {
            scratch.recycle(p.tape);
            Err(e)
        }
    }
}

impl<'a> Parser<'a> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    /// Skip whitespace at `pos`; returns the byte found there (the next token's first byte).
    #[inline(always)]
    fn peek_ws(&mut self) -> Option<u8> {
        let b = self.input.get(self.pos).copied();
        match b {
            Some(b' ' | b'\n' | b'\r' | b'\t') => self.skip_ws_run(),
            _ => b,
        }
    }

    /// Skip a run of whitespace starting at `pos` (which holds whitespace); returns the byte
    /// after it.
    fn skip_ws_run(&mut self) -> Option<u8> {
        self.ws = self.ws.wrapping_add(1);
        self.pos += 1;
        while let Some(&b) = self.input.get(self.pos) {
            if b == b' ' || b == b'\n' || b == b'\r' || b == b'\t' {
                self.pos += 1;
            } else {
                return Some(b);
            }
        }
        None
    }

    #[inline]
    fn push(&mut self, tag: Tag, a: u32, b: u32, c: u32) -> u32 {
        let i = self.tape.nodes.len() as u32;
        self.tape.nodes.push(Node {
            tag,
            v: false,
            a,
            b,
            c,
        });
        i
    }

    /// JSON pointer of the place being read: each open container contributes its current child.
    #[cold]
    fn pointer(&self, frames: usize) -> String {
        let mut out = String::new();
        for f in self.stack.iter().take(frames) {
            if f.is_obj {
                if f.key == NO_KEY {
                    break;
                }
                let k = self.tape.node(f.key);
                push_token(&mut out, self.tape.str_bytes(k));
            } else {
                if f.count == 0 {
                    break;
                }
                out.push('/');
                out.push_str(&(f.count - 1).to_string());
            }
        }
        out
    }

    #[cold]
    fn err(&self, kind: K, offset: usize) -> CanonError {
        CanonError::new(kind, offset, Some(self.pointer(self.stack.len())))
    }

    /// Error located at the innermost open container (not at one of its children).
    #[cold]
    fn err_container(&self, kind: K, offset: usize) -> CanonError {
        let frames = self.stack.len().saturating_sub(1);
        CanonError::new(kind, offset, Some(self.pointer(frames)))
    }

    /// Error for an unexpected byte at `pos`; `context` is the code used when nothing more
    /// specific applies.
    #[cold]
    fn unexpected(&self, at_value: bool, trailing: bool) -> CanonError {
        let i = self.pos;
        let input = self.input;
        let Some(&b) = input.get(i) else {
            return self.err(K::UnexpectedEnd, i);
        };
        let kind = match b {
            b'/' if matches!(input.get(i + 1), Some(b'/' | b'*')) => K::Comment,
            0x0B | 0x0C => K::InvalidWhitespace,
            b'+' | b'.' if at_value => K::InvalidNumber,
            b'N' if at_value && input[i..].starts_with(b"NaN") => K::NonFiniteNumber,
            b'I' if at_value && input[i..].starts_with(b"Infinity") => K::NonFiniteNumber,
            0x80..=0xFF => match char_at(input, i) {
                None => utf8_error_kind(input, i),
                Some(c) if c.is_whitespace() || c == '\u{FEFF}' => K::InvalidWhitespace,
                Some(_) if trailing => K::TrailingData,
                Some(_) => K::UnexpectedCharacter { byte: b },
            },
            _ if trailing => K::TrailingData,
            _ => K::UnexpectedCharacter { byte: b },
        };
        if trailing {
            CanonError::new(kind, i, None)
        } else {
            self.err(kind, i)
        }
    }

    fn run(&mut self) -> Result<(), CanonError> {
        let _ = self.peek_ws();
        let (root_start, root_ws) = (self.pos, self.ws);
        'value: loop {
            let Some(b) = self.peek_ws() else {
                return Err(self.err(K::UnexpectedEnd, self.pos));
            };
            // Whether the value just read is verbatim (its canonical form is its input text).
            let mut verbatim = match b {
                b'{' | b'[' => {
                    if self.stack.len() >= self.limits.max_depth {
                        return Err(self.err(
                            K::DepthLimit {
                                limit: self.limits.max_depth,
                            },
                            self.pos,
                        ));
                    }
                    if b == b'[' && self.input.get(skip_ws(self.input, self.pos + 1)) == Some(&b'"')
                    {
                        match self.string_array() {
                            Some(v) => v,
                            None => continue 'value,
                        }
                    } else {
                        let is_obj = b == b'{';
                        let node = if is_obj {
                            self.push(Tag::Object, 0, 0, 0)
                        } else {
                            self.push(Tag::Array, self.pos as u32, 0, 0)
                        };
                        let in_arr = self.stack.last().is_some_and(|p| !p.is_obj || p.in_arr);
                        self.stack.push(Frame {
                            node,
                            is_obj,
                            in_arr,
                            pending_start: self.pending.len() as u32,
                            count: 0,
                            key: NO_KEY,
                            ws_open: self.ws,
                            ws_key: self.ws,
                            all: true,
                        });
                        self.pos += 1;
                        let next = self.peek_ws();
                        if is_obj {
                            if next == Some(b'}') {
                                self.pos += 1;
                                self.close_object()?
                            } else {
                                self.member_key(next)?;
                                continue 'value;
                            }
                        } else if next == Some(b']') {
                            self.pos += 1;
                            self.close_array()
                        } else {
                            if let Some(f) = self.stack.last_mut() {
                                f.count = 1;
                            }
                            continue 'value;
                        }
                    }
                }
                b'"' => {
                    if let Some((a, len)) = self.simple_string() {
                        self.push(Tag::Str, a, len, 0);
                        true
                    } else {
                        let (tag, a, len, c) = self.string()?;
                        self.push(tag, a, len, c);
                        tag == Tag::Str
                    }
                }
                b'-' | b'0'..=b'9' => self.number()?,
                b't' => self.literal(b"true", Tag::True)?,
                b'f' => self.literal(b"false", Tag::False)?,
                b'n' => self.literal(b"null", Tag::Null)?,
                _ => return Err(self.unexpected(true, false)),
            };
            // A value is complete: continue the enclosing containers.
            loop {
                let pos = self.pos as u32;
                let ws = self.ws;
                let Some(top) = self.stack.last_mut() else {
                    if verbatim && ws == root_ws {
                        self.tape.root = Some((root_start as u32, pos));
                    }
                    if self.peek_ws().is_some() {
                        return Err(self.unexpected(false, true));
                    }
                    return Ok(());
                };
                if top.is_obj {
                    // `"name":value` without whitespace, value verbatim: one run.
                    verbatim &= ws == top.ws_key;
                    if verbatim {
                        match self.tape.nodes.get_mut(top.key as usize) {
                            Some(k) if k.tag == Tag::Str => {
                                k.v = true;
                                k.c = pos;
                            }
                            _ => verbatim = false,
                        }
                    }
                }
                top.all &= verbatim;
                let is_obj = top.is_obj;
                match self.peek_ws() {
                    Some(b',') => {
                        let comma = self.pos;
                        self.pos += 1;
                        let next = self.peek_ws();
                        if is_obj {
                            // The frame still names the previous member: `member_key` resets it
                            // on every path that can fail before naming the new one.
                            if next == Some(b'}') {
                                return Err(self.err_container(K::TrailingComma, comma));
                            }
                            self.member_key(next)?;
                        } else {
                            if next == Some(b']') {
                                return Err(self.err_container(K::TrailingComma, comma));
                            }
                            if let Some(f) = self.stack.last_mut() {
                                f.count += 1;
                            }
                        }
                        continue 'value;
                    }
                    Some(b'}') if is_obj => {
                        self.pos += 1;
                        verbatim = match self.close_repeated() {
                            Some(v) => v,
                            None => self.close_object()?,
                        };
                    }
                    Some(b']') if !is_obj => {
                        self.pos += 1;
                        verbatim = self.close_array();
                    }
                    _ => return Err(self.unexpected(false, false)),
                }
            }
        }
    }

    /// Fast path for an array whose `[` at `pos` is followed by `"` (after any whitespace): reads elements
    /// that are strings without escapes (needing no UTF-8 check), separated by commas (with
    /// or without whitespace), without the generic per-element continuation. When the array closes this way it is
    /// verbatim and no frame is pushed: returns `Some(true)`. Otherwise the array's frame is
    /// pushed in exactly the state the generic loop would have reached: `Some(true)` when an
    /// element was just completed (the caller continues the container), `None` when `pos` is at
    /// the start of an element not read yet (the caller reads it as a value).
    #[inline]
    fn string_array(&mut self) -> Option<bool> {
        let input = self.input;
        let open = self.pos;
        let ws_open = self.ws;
        let node = self.push(Tag::Array, open as u32, 0, 0);
        // Whitespace (as `json.dumps` and pretty printers write it) is skipped here too; each
        // skipped run counts in `ws` as `peek_ws` would count it, so the array is verbatim
        // exactly when none was skipped.
        let first = skip_ws(input, open + 1);
        self.ws = self.ws.wrapping_add(u32::from(first != open + 1));
        self.pos = first;
        let mut count = 0u32;
        let completed = loop {
            let Some((a, len)) = self.simple_string() else {
                break false;
            };
            self.push(Tag::Str, a, len, 0);
            count += 1;
            let sep = skip_ws(input, self.pos);
            match input.get(sep) {
                Some(b',') => {
                    let next = skip_ws(input, sep + 1);
                    if input.get(next) != Some(&b'"') {
                        // A trailing comma or another kind of element: the generic loop
                        // reads from the separator on (and reports errors as it would).
                        break true;
                    }
                    let runs = u32::from(sep != self.pos) + u32::from(next != sep + 1);
                    self.ws = self.ws.wrapping_add(runs);
                    self.pos = next;
                }
                Some(b']') => {
                    self.ws = self.ws.wrapping_add(u32::from(sep != self.pos));
                    self.pos = sep + 1;
                    let verbatim = self.ws == ws_open;
                    let end = self.tape.nodes.len() as u32;
                    let pos = self.pos as u32;
                    if let Some(n) = self.tape.nodes.get_mut(node as usize) {
                        n.b = end;
                        n.v = verbatim;
                        n.c = pos;
                    }
                    return Some(verbatim);
                }
                _ => break true,
            }
        };
        let in_arr = self.stack.last().is_some_and(|p| !p.is_obj || p.in_arr);
        self.stack.push(Frame {
            node,
            is_obj: false,
            in_arr,
            pending_start: self.pending.len() as u32,
            count: count + u32::from(!completed),
            key: NO_KEY,
            ws_open,
            ws_key: self.ws,
            all: true,
        });
        completed.then_some(true)
    }

    /// Read `"name"` and `:` of an object member (`first` is the byte at `pos`); the value
    /// follows.
    #[inline(always)]
    fn member_key(&mut self, first: Option<u8>) -> Result<(), CanonError> {
        if first != Some(b'"') {
            self.forget_key();
            return Err(self.unexpected(false, false));
        }
        let ws = self.ws;
        let (key, prefix, len) = if let Some((a, len, prefix)) = self.short_key() {
            let key = self.push(Tag::Str, a, len, 0);
            (key, prefix, len)
        } else if let Some((a, len)) = self.simple_string() {
            let key = self.push(Tag::Str, a, len, 0);
            (
                key,
                borrowed_prefix(self.input, a as usize, len as usize),
                len,
            )
        } else {
            self.forget_key();
            let (tag, a, len, c) = self.string()?;
            let key = self.push(tag, a, len, c);
            let prefix = if tag == Tag::Str {
                borrowed_prefix(self.input, a as usize, len as usize)
            } else {
                key_prefix(self.tape.str_bytes(self.tape.node(key)))
            };
            (key, prefix, len)
        };
        self.pending.push((utf16_sortable(prefix), key, len));
        let limit = self.limits.max_members;
        let Some(f) = self.stack.last_mut() else {
            return Err(self.err(K::UnexpectedEnd, self.pos));
        };
        f.count += 1;
        f.key = key;
        f.ws_key = ws;
        if f.count as usize > limit {
            let off = self.tape.str_offset(self.tape.node(key));
            return Err(self.err(K::TooManyMembers { limit }, off));
        }
        if self.peek() == Some(b':') {
            self.pos += 1;
            return Ok(());
        }
        if self.peek_ws() != Some(b':') {
            return Err(self.unexpected(false, false));
        }
        self.pos += 1;
        Ok(())
    }

    /// The innermost object has no current member name (for error pointers while a name is
    /// read).
    #[cold]
    fn forget_key(&mut self) {
        if let Some(f) = self.stack.last_mut() {
            f.key = NO_KEY;
        }
    }

    /// Close the innermost array (its `]` was read); returns whether it is verbatim.
    fn close_array(&mut self) -> bool {
        let Some(f) = self.stack.pop() else {
            return false;
        };
        let end = self.tape.nodes.len() as u32;
        let verbatim = f.all && f.ws_open == self.ws;
        if let Some(n) = self.tape.nodes.get_mut(f.node as usize) {
            n.b = end;
            n.v = verbatim;
            n.c = self.pos as u32;
        }
        verbatim
    }

    /// Common case of [`Parser::close_object`], kept small so it can sit in the main loop: an
    /// object inside an array with the same member names, in the same order, as the previous
    /// object closed at its depth reuses that object's sort permutation (its names were already
    /// checked for duplicates). Returns what `close_object` would, or `None` (nothing changed)
    /// when the case does not apply.
    #[inline(always)]
    fn close_repeated(&mut self) -> Option<bool> {
        let f = self.stack.last()?;
        if !f.in_arr {
            return None;
        }
        let start = f.pending_start as usize;
        let shape = self.shapes.get(self.stack.len() - 1)?;
        let keys = self.pending.get(start..)?;
        if keys.len() < 2 || shape.perm.len() != keys.len() || shape.keys.len() != keys.len() {
            return None;
        }
        let tape = &self.tape;
        for (a, b) in shape.keys.iter().zip(keys) {
            // Equal prefixes and equal lengths up to 8 bytes: equal names.
            if a.0 != b.0
                || a.2 != b.2
                || (a.2 > 8 && tape.str_bytes(tape.node(a.1)) != tape.str_bytes(tape.node(b.1)))
            {
                return None;
            }
        }
        let tight = f.all && f.ws_open == self.ws;
        let node = f.node;
        let count = keys.len() as u32;
        let mstart = self.tape.members.len() as u32;
        self.tape.members.extend(
            shape
                .perm
                .iter()
                .map(|&p| keys.get(p as usize).map_or(0, |k| k.1)),
        );
        let sorted = shape.sorted;
        self.pending.truncate(start);
        let end = self.tape.nodes.len() as u32;
        if let Some(n) = self.tape.nodes.get_mut(node as usize) {
            n.a = mstart;
            n.b = end;
            n.c = count;
        }
        self.stack.pop();
        Some(tight && sorted)
    }

    /// Close the innermost object (its `}` was read): sort and check its member names; returns
    /// whether it is verbatim (members verbatim and already in order, no whitespace).
    fn close_object(&mut self) -> Result<bool, CanonError> {
        let Some(f) = self.stack.last() else {
            return Ok(false);
        };
        let tight = f.all && f.ws_open == self.ws;
        let start = f.pending_start as usize;
        let node = f.node;
        let depth = self.stack.len() - 1;
        let tape = &mut self.tape;
        let mstart = tape.members.len() as u32;
        let keys = &mut self.pending[start..];
        let count = keys.len() as u32;
        // Objects inside arrays often repeat one shape (arrays of records, and the objects
        // nested in them): those use the per-depth shape cache. Others are sorted directly.
        let in_array = f.in_arr;
        let sorted;
        if keys.len() < 2 {
            sorted = true;
            tape.members.extend(keys.iter().map(|&(_, k, _)| k));
        } else if !in_array {
            let t: &Tape<'_> = tape;
            sorted = keys
                .windows(2)
                .all(|w| cmp_keys(t, &w[0], &w[1]) == Ordering::Less);
            if !sorted {
                sort_keys(t, keys);
            }
            if let Some((off, kb)) = first_duplicate(t, keys) {
                let mut ptr = self.pointer(self.stack.len() - 1);
                push_token(&mut ptr, &kb);
                return Err(CanonError::new(K::DuplicateMember, off, Some(ptr)));
            }
            tape.members.extend(keys.iter().map(|&(_, k, _)| k));
        } else {
            if self.shapes.len() <= depth {
                self.shapes.resize_with(depth + 1, Shape::default);
            }
            let shape = &mut self.shapes[depth];
            let same = shape.perm.len() == keys.len()
                && shape.keys.iter().zip(keys.iter()).all(|(a, b)| {
                    if a.0 != b.0 {
                        return false;
                    }
                    // Equal prefixes and equal lengths up to 8 bytes: equal names.
                    (a.2 == b.2 && a.2 <= 8)
                        || tape.str_bytes(tape.node(a.1)) == tape.str_bytes(tape.node(b.1))
                });
            if same {
                // Same member names in the same order as the previous object at this depth
                // (typical of arrays of records): reuse its sort permutation. Its names were
                // already checked for duplicates.
                let keys: &[(u64, u32, u32)] = keys;
                tape.members.extend(
                    shape
                        .perm
                        .iter()
                        .map(|&p| keys.get(p as usize).map_or(0, |k| k.1)),
                );
                sorted = shape.sorted;
            } else {
                shape.keys.clear();
                shape.keys.extend_from_slice(keys);
                let t: &Tape<'_> = tape;
                sorted = keys
                    .windows(2)
                    .all(|w| cmp_keys(t, &w[0], &w[1]) == Ordering::Less);
                shape.sorted = sorted;
                if !sorted {
                    sort_keys(t, keys);
                }
                if let Some((off, kb)) = first_duplicate(t, keys) {
                    shape.perm.clear();
                    let mut ptr = self.pointer(self.stack.len() - 1);
                    push_token(&mut ptr, &kb);
                    return Err(CanonError::new(K::DuplicateMember, off, Some(ptr)));
                }
                // Node ids grow in input order, so an id's original position is its rank.
                shape.perm.clear();
                for &(_, id, _) in keys.iter() {
                    let pos = shape.keys.partition_point(|&(_, k, _)| k < id);
                    shape.perm.push(pos as u32);
                }
                tape.members.extend(keys.iter().map(|&(_, k, _)| k));
            }
        }
        self.pending.truncate(start);
        let end = self.tape.nodes.len() as u32;
        if let Some(n) = self.tape.nodes.get_mut(node as usize) {
            n.a = mstart;
            n.b = end;
            n.c = count;
        }
        self.stack.pop();
        Ok(tight && sorted)
    }

    /// Read `true`, `false` or `null` (always verbatim).
    #[inline]
    fn literal(&mut self, word: &[u8], tag: Tag) -> Result<bool, CanonError> {
        if self.input[self.pos..].starts_with(word) {
            self.pos += word.len();
            self.push(tag, 0, 0, 0);
            Ok(true)
        } else {
            Err(self.err(K::InvalidLiteral, self.pos))
        }
    }

    /// Read a number literal; returns whether it is verbatim (printed exactly as written).
    fn number(&mut self) -> Result<bool, CanonError> {
        let start = self.pos;
        let (end, form) = match read_number(self.input, start, self.strict, &mut self.tape.strbuf) {
            Ok(read) => read,
            Err((kind, offset)) => return Err(self.err(kind, offset)),
        };
        self.pos = end;
        Ok(match form {
            NumberForm::Prefix(len) => {
                self.push(Tag::Int, start as u32, len as u32, 0);
                // `-0` prints as `0`; other literals are verbatim unless zeros were trimmed.
                len == end - start && &self.input[start..end] != b"-0"
            }
            NumberForm::Text(a, b) => {
                self.push(Tag::NumText, a as u32, (b - a) as u32, start as u32);
                false
            }
            NumberForm::Float(num) => {
                let idx = self.tape.nums.len() as u32;
                if self.tape.nums.capacity() == 0 {
                    self.tape.nums.reserve((self.input.len() - end) / 16 + 8);
                }
                self.tape.nums.push(num);
                self.push(Tag::Float, start as u32, (end - start) as u32, idx);
                false
            }
        })
    }

    /// Fast path for a member name of at most 7 bytes without escapes at `pos` (which holds
    /// `"`), when the input is valid UTF-8: one 8-byte load gives both its end and its sort
    /// prefix. Returns its content start, length and prefix (as [`borrowed_prefix`] computes it)
    /// and moves past it, exactly as [`Parser::simple_string`] would; `None` (nothing consumed)
    /// otherwise.
    #[inline(always)]
    fn short_key(&mut self) -> Option<(u32, u32, u64)> {
        if !self.utf8_ok {
            return None;
        }
        let start = self.pos + 1;
        let chunk = self.input.get(start..start + 8)?;
        let mut w8 = [0u8; 8];
        w8.copy_from_slice(chunk);
        let w = u64::from_le_bytes(w8);
        let m = special_bytes(w);
        if m == 0 {
            return None;
        }
        // The lowest flagged byte is exact; it ends the name only if it is a quote.
        let k = (m.trailing_zeros() / 8) as usize;
        if w8[k] != b'"' {
            return None;
        }
        self.pos = start + k + 1;
        let prefix = w.swap_bytes() & !u64::MAX.checked_shr(8 * k as u32).unwrap_or(0);
        Some((start as u32, k as u32, prefix))
    }

    /// Fast path for a string at `pos` (which holds `"`) without escapes whose bytes need no
    /// UTF-8 check: returns its content start and length and moves past it. `None` (nothing
    /// consumed) sends the caller to [`Parser::string`].
    #[inline(always)]
    fn simple_string(&mut self) -> Option<(u32, u32)> {
        let start = self.pos + 1;
        let j = if self.utf8_ok {
            scan_plain(self.input, start)
        } else {
            match scan_string(self.input, start) {
                (_, true) => return None,
                (j, false) => j,
            }
        };
        if self.input.get(j) != Some(&b'"') {
            return None;
        }
        self.pos = j + 1;
        Some((start as u32, (j - start) as u32))
    }

    /// Read a string at `pos` (which holds `"`). Returns the node fields.
    #[inline(never)]
    fn string(&mut self) -> Result<(Tag, u32, u32, u32), CanonError> {
        let input = self.input;
        let quote = self.pos;
        let start = quote + 1;
        let mut i = start;
        let mut owned: Option<usize> = None;
        let mut high = false;
        let end = loop {
            let (j, h) = scan_string(input, i);
            high |= h;
            match input.get(j) {
                None => return Err(self.err(K::UnexpectedEnd, j)),
                Some(b'"') => {
                    if owned.is_some() {
                        self.tape.strbuf.extend_from_slice(&input[i..j]);
                    }
                    break j;
                }
                Some(b'\\') => {
                    if owned.is_none() {
                        owned = Some(self.tape.strbuf.len());
                    }
                    self.tape.strbuf.extend_from_slice(&input[i..j]);
                    i = self.escape(j)?;
                }
                Some(&c) => return Err(self.err(K::ControlCharacter { byte: c }, j)),
            }
        };
        if high && !self.utf8_ok {
            if let Err(e) = std::str::from_utf8(&input[start..end]) {
                let at = start + e.valid_up_to();
                return Err(self.err(utf8_error_kind(input, at), at));
            }
        }
        self.pos = end + 1;
        Ok(match owned {
            None => (Tag::Str, start as u32, (end - start) as u32, 0),
            Some(s) => (
                Tag::StrOwned,
                s as u32,
                (self.tape.strbuf.len() - s) as u32,
                quote as u32,
            ),
        })
    }

    /// Decode the escape starting at `j` (a backslash) into `strbuf`; returns the index after it.
    fn escape(&mut self, j: usize) -> Result<usize, CanonError> {
        read_escape(self.input, j, &mut self.tape.strbuf).map_err(|(kind, at)| self.err(kind, at))
    }
}

#[cfg(test)]
mod tests {
    /// String arrays written with whitespace take the fast path and end as the generic path
    /// would: the same canonical text, the same error (kind, offset, pointer) at the same place.
    #[test]
    fn spaced_string_arrays() {
        use crate::canonical::canonicalize;
        for (doc, want) in [
            (r#"["a", "b"]"#, r#"["a","b"]"#),
            (r#"[ "a" , "b" ]"#, r#"["a","b"]"#),
            ("[\n  \"a\",\n  \"b\"\n]", r#"["a","b"]"#),
            (
                r#"{"k": ["Zoë", "東京"], "a": ["x","y"]}"#,
                r#"{"a":["x","y"],"k":["Zoë","東京"]}"#,
            ),
            (r#"["a", 1, "b", null]"#, r#"["a",1,"b",null]"#),
            (r#"["a", "\u0041", "b"]"#, r#"["a","A","b"]"#),
            (r#"[["a", "b"], ["c"]]"#, r#"[["a","b"],["c"]]"#),
            (r#"["a","b"]"#, r#"["a","b"]"#),
        ] {
            let out = canonicalize(doc.as_bytes()).expect(doc);
            assert_eq!(String::from_utf8_lossy(&out), want, "{doc}");
        }
        for (doc, code, offset) in [
            (r#"["a", ]"#, "trailing_comma", 4),
            (r#"["a",  "b" "c"]"#, "unexpected_character", 11),
            (r#"["a", "b"#, "unexpected_end", 8),
            ("[\"a\", \"\u{1}\"]", "control_character", 7),
        ] {
            let err = canonicalize(doc.as_bytes()).expect_err(doc);
            assert_eq!((err.code(), err.offset), (code, offset), "{doc}: {err}");
        }
    }
}
