//! Canonical emission: walk the tape without recursion and write RFC 8785 bytes into a sink.

use super::NumberMode;
use super::error::{CanonError, CanonErrorKind as K};
use super::number::{Num, at_most_15_digits, decimal_is_exact, format_finite, literal_is_exact};
use super::pointer::{Exclusions, push_token};
use super::scan::scan_plain;
use super::sink::CanonSink;
use super::tape::{Node, Tag, Tape};

enum Frame {
    Object {
        /// Next position in `members`, and the end of this object's range.
        next: u32,
        end: u32,
        /// Current member's key node (for error pointers).
        cur: u32,
        mask: u64,
        first: bool,
    },
    Array {
        /// Next child node index and the end of the array's subtree.
        next: u32,
        end: u32,
        /// Index of the next element.
        idx: u32,
        mask: u64,
        first: bool,
    },
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Write `s` (unescaped, valid UTF-8) as a JSON string with RFC 8785 minimal escaping. Runs
/// without `"`, `\` or control characters are found eight bytes at a time and copied whole.
#[inline]
pub(crate) fn write_escaped<S: CanonSink + ?Sized>(sink: &mut S, s: &[u8]) {
    sink.write_byte(b'"');
    let mut run = 0;
    loop {
        let i = scan_plain(s, run);
        let Some(&b) = s.get(i) else {
            break;
        };
        sink.write(&s[run..i]);
        write_escaped_byte(sink, b);
        run = i + 1;
    }
    sink.write(&s[run..]);
    sink.write_byte(b'"');
}

/// Write the canonical escape of `b`, one of `"`, `\` or a control character (below 0x20).
#[inline]
pub(crate) fn write_escaped_byte<S: CanonSink + ?Sized>(sink: &mut S, b: u8) {
    let short: &[u8] = match b {
        b'"' => b"\\\"",
        b'\\' => b"\\\\",
        0x08 => b"\\b",
        0x09 => b"\\t",
        0x0A => b"\\n",
        0x0C => b"\\f",
        0x0D => b"\\r",
        _ => b"",
    };
    if short.is_empty() {
        sink.write(&[
            b'\\',
            b'u',
            b'0',
            b'0',
            HEX[usize::from(b >> 4)],
            HEX[usize::from(b & 0xF)],
        ]);
    } else {
        sink.write(short);
    }
}

#[inline(always)]
fn write_string<S: CanonSink + ?Sized>(tape: &Tape<'_>, n: Node, sink: &mut S) {
    if n.tag == Tag::Str {
        // No escapes in the input: the raw bytes hold no `"`, `\` or control character, so the
        // quoted input slice is already canonical.
        sink.write_in(tape.input, n.a as usize - 1, n.b as usize + 2);
    } else {
        write_escaped(sink, tape.str_bytes(n));
    }
}

/// The ES6 text of a number read as [`NumberForm::Float`](super::number::NumberForm::Float)
/// (its literal `lit`), or `None` when the number policy refuses it (precision loss).
#[inline]
pub(crate) fn float_text<'b>(
    num: Option<Num>,
    lit: &[u8],
    numbers: NumberMode,
    buf: &'b mut ryu_js::Buffer,
) -> Option<&'b str> {
    let v = num.map_or(0.0, |x| x.value);
    let s = format_finite(v, buf);
    if numbers == NumberMode::RejectPrecisionLoss {
        let exact = match num.and_then(|x| x.exact()) {
            Some((d, digits)) => decimal_is_exact(&d, digits, lit, v, s),
            None => (v.is_normal() && at_most_15_digits(lit)) || literal_is_exact(lit, s),
        };
        if !exact {
            return None;
        }
    }
    Some(s)
}

struct Emitter<'t, 'a, S: CanonSink + ?Sized> {
    tape: &'t Tape<'a>,
    numbers: NumberMode,
    excl: &'t Exclusions,
    sink: &'t mut S,
    stack: Vec<Frame>,
    buf: ryu_js::Buffer,
}

/// Emit the canonical form of the tape's root value into `sink`.
pub(crate) fn emit<S: CanonSink + ?Sized>(
    tape: &Tape<'_>,
    numbers: NumberMode,
    excl: &Exclusions,
    sink: &mut S,
    scratch: &mut EmitScratch,
) -> Result<(), CanonError> {
    let mut stack = std::mem::take(&mut scratch.0);
    if stack.capacity() == 0 {
        stack = Vec::with_capacity(16);
    }
    stack.clear();
    let mut e = Emitter {
        tape,
        numbers,
        excl,
        sink,
        stack,
        buf: ryu_js::Buffer::new(),
    };
    let result = e.run();
    if e.stack.capacity() <= 1024 {
        e.stack.clear();
        scratch.0 = e.stack;
    }
    result
}

/// The emitter's frame stack, kept between calls by a prepared caller.
#[derive(Default)]
pub(crate) struct EmitScratch(Vec<Frame>);

impl<S: CanonSink + ?Sized> Emitter<'_, '_, S> {
    #[cold]
    fn pointer(&self) -> String {
        let mut out = String::new();
        for f in &self.stack {
            match *f {
                Frame::Object { cur, .. } => {
                    push_token(&mut out, self.tape.str_bytes(self.tape.node(cur)));
                }
                Frame::Array { idx, .. } => {
                    out.push('/');
                    out.push_str(&idx.saturating_sub(1).to_string());
                }
            }
        }
        out
    }

    /// Write a value; containers push a frame and are finished by the main loop.
    #[inline(always)]
    fn value(&mut self, i: u32, mask: u64) -> Result<(), CanonError> {
        let n = self.tape.node(i);
        match n.tag {
            Tag::Null => self.sink.write(b"null"),
            Tag::True => self.sink.write(b"true"),
            Tag::False => self.sink.write(b"false"),
            Tag::Int => {
                if self.tape.literal(n) == b"-0" {
                    self.sink.write_byte(b'0');
                } else {
                    self.sink
                        .write_in(self.tape.input, n.a as usize, n.b as usize);
                }
            }
            Tag::NumText => self.sink.write(self.tape.str_bytes(n)),
            Tag::Float => {
                let num = self.tape.nums.get(n.c as usize).copied();
                let lit = self.tape.literal(n);
                let Some(s) = float_text(num, lit, self.numbers, &mut self.buf) else {
                    return Err(CanonError::new(
                        K::PrecisionLoss,
                        n.a as usize,
                        Some(self.pointer()),
                    ));
                };
                self.sink.write(s.as_bytes());
            }
            Tag::Str | Tag::StrOwned => write_string(self.tape, n, self.sink),
            Tag::Array => {
                self.sink.write_byte(b'[');
                self.stack.push(Frame::Array {
                    next: i + 1,
                    end: n.b,
                    idx: 0,
                    mask,
                    first: true,
                });
            }
            Tag::Object => {
                self.sink.write_byte(b'{');
                self.stack.push(Frame::Object {
                    next: n.a,
                    end: n.a + n.c,
                    cur: u32::MAX,
                    mask,
                    first: true,
                });
            }
        }
        Ok(())
    }

    fn run(&mut self) -> Result<(), CanonError> {
        let root_mask = self.excl.root_mask();
        if let (0, Some((start, end))) = (root_mask, self.tape.root) {
            self.sink
                .write_in(self.tape.input, start as usize, (end - start) as usize);
            return Ok(());
        }
        self.value(0, root_mask)?;
        loop {
            let depth = self.stack.len().saturating_sub(1);
            let Some(top) = self.stack.last_mut() else {
                return Ok(());
            };
            match top {
                Frame::Object {
                    next,
                    end,
                    cur,
                    mask,
                    first,
                } => {
                    if *next >= *end {
                        self.sink.write_byte(b'}');
                        self.stack.pop();
                        continue;
                    }
                    let key = self.tape.members.get(*next as usize).copied().unwrap_or(0);
                    *next += 1;
                    *cur = key;
                    let kn = self.tape.node(key);
                    if *mask == 0 && kn.v {
                        // `"name":value` is canonical as written: copy it, with the separator
                        // when the input has a comma right before it (one copy instead of two
                        // writes), and go on through the following verbatim members here.
                        let tape = self.tape;
                        let mut kn = kn;
                        loop {
                            let mut start = kn.a as usize - 1;
                            if !*first {
                                if tape.input.get(start.wrapping_sub(1)) == Some(&b',') {
                                    start -= 1;
                                } else {
                                    self.sink.write_byte(b',');
                                }
                            }
                            *first = false;
                            self.sink.write_in(tape.input, start, kn.c as usize - start);
                            let Some(&key) = tape.members.get(*next as usize) else {
                                break;
                            };
                            let n = tape.node(key);
                            if *next >= *end || !n.v {
                                break;
                            }
                            *next += 1;
                            *cur = key;
                            kn = n;
                        }
                        continue;
                    }
                    let child_mask = if *mask == 0 {
                        0
                    } else {
                        match self
                            .excl
                            .descend(*mask, depth, Some(self.tape.str_bytes(kn)), 0)
                        {
                            Some(m) => m,
                            None => continue,
                        }
                    };
                    if !*first {
                        self.sink.write_byte(b',');
                    }
                    *first = false;
                    if kn.tag == Tag::Str && self.tape.colon_follows(kn) {
                        // `"name":` is one run of the input.
                        self.sink
                            .write_in(self.tape.input, kn.a as usize - 1, kn.b as usize + 3);
                    } else {
                        write_string(self.tape, kn, self.sink);
                        self.sink.write_byte(b':');
                    }
                    self.value(key + 1, child_mask)?;
                }
                Frame::Array {
                    next,
                    end,
                    idx,
                    mask,
                    first,
                } => {
                    if *next >= *end {
                        self.sink.write_byte(b']');
                        self.stack.pop();
                        continue;
                    }
                    let child = *next;
                    let cn = self.tape.node(child);
                    *next = match cn.tag {
                        Tag::Array | Tag::Object => cn.b,
                        _ => child + 1,
                    };
                    let this = *idx;
                    *idx += 1;
                    if *mask == 0 && cn.v {
                        // A nested array that is canonical as written (with the separator when
                        // the input has a comma right before it).
                        let mut start = cn.a as usize;
                        if !*first {
                            if self.tape.input.get(start.wrapping_sub(1)) == Some(&b',') {
                                start -= 1;
                            } else {
                                self.sink.write_byte(b',');
                            }
                        }
                        *first = false;
                        self.sink
                            .write_in(self.tape.input, start, cn.c as usize - start);
                        continue;
                    }
                    let child_mask = if *mask == 0 {
                        0
                    } else {
                        match self.excl.descend(*mask, depth, None, this) {
                            Some(m) => m,
                            None => continue,
                        }
                    };
                    if !*first {
                        self.sink.write_byte(b',');
                    }
                    *first = false;
                    self.value(child, child_mask)?;
                }
            }
        }
    }
}
