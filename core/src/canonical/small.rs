//! The fast path for plain documents (up to 1 MiB): one recursive pass, no tape.
//!
//! Most request bodies are objects written by `JSON.stringify` or `json.dumps`: member names
//! without escapes, strings mostly without escapes, integers and short decimals that are already
//! in canonical form. For those, the canonical form is the input's own tokens, rearranged:
//! members sorted by name, whitespace dropped. This pass writes exactly that. Numbers are read
//! with the full parser's own number reader (`read_number`, `float_text`) and string escapes,
//! in values and member names, with its escape reader (`read_escape`, then the emitter's
//! `write_escaped`), so a number or a string that needs rewriting is written as it would be in
//! place; names are ordered with the same UTF-16 order (`keys.rs`). Anything else it does not
//! handle (a duplicate name, a limit reached, a syntax error) makes it
//! give up, with no output, and the full parser ([`super::parse`]) runs instead and gives the
//! result or the precise error. So the fast path never decides an error and never accepts what
//! the full parser refuses: a differential test and a fuzz target check that it agrees with the
//! full path.
//!
//! Output is assembled in one buffer: every container writes its canonical text where it
//! started, so an array copies its elements in place; an object first reads its members
//! (nested containers land in the buffer), then sorts them, writes itself after them and
//! moves that text down over them.

use super::emit::{float_text, write_escaped, write_escaped_byte};
use super::escape::{decode_escape, read_escape, utf8};
use super::keys::{cmp_utf16, key_prefix, utf16_sortable};
use super::number::{NumberForm, digit_run, read_number};
use super::scan::{scan_plain, valid_utf8};
use super::{CanonOptions, CanonSink, NumberMode};

/// Inputs up to this size try the fast path (its buffer is twice the input while it runs).
pub(crate) const SMALL_INPUT: usize = 1024 * 1024;

/// Containers nested deeper than this are left to the full parser (it is iterative; this pass
/// recurses and must bound its stack).
const MAX_NESTING: usize = 48;

/// Where a value's (or a member's) canonical text is: a run of the input or text already in
/// the output buffer.
#[derive(Clone, Copy)]
enum Text {
    Input(u32, u32),
    Buffer(u32, u32),
    /// The root object, read and sorted: its members are `members`, written out at the end
    /// straight to the sink (no assembly in the buffer).
    RootObject,
}

#[derive(Clone, Copy)]
struct Member {
    /// The first eight bytes of the (unescaped) name, big-endian, zero-padded: orders ASCII
    /// names (others once remapped by [`utf16_sortable`], when their object is sorted).
    prefix: u64,
    /// The name's content range: in the input, or (an escaped name) its unescaped bytes in
    /// `names`.
    name: (u32, u32),
    /// An escaped name: its canonical text (quotes included) in the buffer. `(0, 0)` for a name
    /// without escapes, whose canonical text is its input text.
    escaped: (u32, u32),
    /// `"name":value` as one input run (no whitespace inside, value a token), else the value.
    text: Text,
    /// Whether `text` is the whole member or only its value.
    whole: bool,
    /// Its position in the object's input order (set when the object is sorted).
    index: u32,
}

/// A member name as read: its prefix (not yet remapped), its content range (in the input, or
/// in `names` when escaped) and the range of its canonical text in the buffer (`(0, 0)` when it
/// has no escapes).
type NameRead = (u64, (u32, u32), (u32, u32));

/// Working memory kept between calls.
#[derive(Default)]
pub(crate) struct SmallScratch {
    buf: Vec<u8>,
    members: Vec<Member>,
    numbers: NumberScratch,
    shapes: Vec<Shape>,
    reorder: Vec<Member>,
    names: Vec<u8>,
}

/// Where numbers that are not a prefix of their literal, and decoded strings, are written.
#[derive(Default)]
struct NumberScratch {
    strbuf: Vec<u8>,
    ryu: ryu_js::Buffer,
}

/// Member and name vectors larger than this are freed after use rather than kept.
const KEEP_BYTES: usize = 256 * 1024;

/// An output buffer larger than [`KEEP_BYTES`] is kept for the next call only while inputs
/// need at least this share of it (1/4): a run of large bodies pays for zeroing its buffer
/// once, not per body, and a large body followed by smaller ones does not pin its memory.
const KEEP_SHARE: usize = 4;

/// Room past twice the input (tiny inputs whose numbers print longer than written).
const SLACK: usize = 32;

impl SmallScratch {
    /// Write the canonical form of `input` to `sink` when the fast path applies (see the
    /// module docs); `false` (nothing written) when the full parser must run.
    pub(crate) fn canonicalize<S: CanonSink + ?Sized>(
        &mut self,
        input: &[u8],
        opts: &CanonOptions,
        sink: &mut S,
    ) -> bool {
        if input.len() > SMALL_INPUT || input.len() > opts.limits.max_input_bytes {
            return false;
        }
        let ascii = input.is_ascii();
        if !ascii && !valid_utf8(input) {
            return false;
        }
        // A container's canonical text is at most as long as its input text (unless a number
        // prints longer than written, e.g. `1e20`), and is written once after its children's
        // text: twice the input is room enough. Every write is checked: out of room, the pass
        // gives up.
        let room = 2 * input.len() + SLACK;
        if self.buf.len() > KEEP_BYTES && room * KEEP_SHARE < self.buf.len() {
            self.buf = Vec::new();
        }
        if self.buf.len() < room {
            self.buf.resize(room, 0);
        }
        self.members.clear();
        self.names.clear();
        for shape in &mut self.shapes {
            // Ranges of an earlier input mean nothing here.
            shape.names.clear();
            shape.perm.clear();
        }
        let mut pass = Pass {
            input,
            pos: 0,
            opts,
            ascii,
            buf: &mut self.buf,
            n: 0,
            members: &mut self.members,
            numbers: &mut self.numbers,
            shapes: &mut self.shapes,
            reorder: &mut self.reorder,
            names: &mut self.names,
            arrays: 0,
        };
        pass.skip_ws();
        let done = match pass.value(0) {
            Some(text) => {
                pass.skip_ws();
                (pass.pos == input.len()).then_some(text)
            }
            None => None,
        };
        let ok = match done {
            Some(Text::Input(a, b)) => {
                sink.write(&input[a as usize..b as usize]);
                true
            }
            Some(Text::Buffer(a, b)) => {
                sink.write(&self.buf[a as usize..b as usize]);
                true
            }
            Some(Text::RootObject) => {
                write_members(input, &self.buf, &self.members, sink);
                true
            }
            None => false,
        };
        if self.members.capacity() > KEEP_BYTES / 16 {
            self.members = Vec::new();
            self.reorder = Vec::new();
            self.shapes = Vec::new();
        }
        if self.names.capacity() > KEEP_BYTES {
            self.names = Vec::new();
        }
        ok
    }
}

/// Write a sorted object's members to `sink` as `{"name":value,...}`.
fn write_members<S: CanonSink + ?Sized>(
    input: &[u8],
    buf: &[u8],
    members: &[Member],
    sink: &mut S,
) {
    sink.write_byte(b'{');
    for (i, m) in members.iter().enumerate() {
        if i > 0 {
            sink.write_byte(b',');
        }
        if m.escaped.1 != 0 {
            sink.write(&buf[m.escaped.0 as usize..m.escaped.1 as usize]);
            sink.write_byte(b':');
        } else if !m.whole {
            sink.write_in(
                input,
                m.name.0 as usize - 1,
                (m.name.1 - m.name.0) as usize + 2,
            );
            sink.write_byte(b':');
        }
        match m.text {
            Text::Input(a, b) => sink.write_in(input, a as usize, (b - a) as usize),
            Text::Buffer(a, b) => sink.write(&buf[a as usize..b as usize]),
            Text::RootObject => {}
        }
    }
    sink.write_byte(b'}');
}

/// The output area as a sink (for the emitter's string escaping); `full` once a write did not
/// fit.
struct BufSink<'b> {
    buf: &'b mut [u8],
    n: usize,
    full: bool,
}

impl CanonSink for BufSink<'_> {
    fn write(&mut self, bytes: &[u8]) {
        match self.buf.get_mut(self.n..self.n + bytes.len()) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                self.n += bytes.len();
            }
            None => self.full = true,
        }
    }
}

struct Pass<'a, 's> {
    input: &'a [u8],
    pos: usize,
    opts: &'s CanonOptions,
    /// Every member name is ASCII (names order by their bytes): the whole input is, and no
    /// escaped name decoded to anything else.
    ascii: bool,
    /// Output area (sized once); `n` bytes are written.
    buf: &'s mut [u8],
    n: usize,
    members: &'s mut Vec<Member>,
    numbers: &'s mut NumberScratch,
    /// Per depth, the last sorted object's shape.
    shapes: &'s mut Vec<Shape>,
    /// Room for reordering members by a kept shape.
    reorder: &'s mut Vec<Member>,
    /// The unescaped bytes of escaped member names.
    names: &'s mut Vec<u8>,
    /// Arrays open around the current value (objects in arrays keep their shapes).
    arrays: usize,
}

impl Pass<'_, '_> {
    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    #[inline(always)]
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.input.get(self.pos) {
            self.pos += 1;
        }
    }

    /// Append one byte (`None` when out of room: the caller gives up).
    #[inline(always)]
    fn put(&mut self, b: u8) -> Option<()> {
        *self.buf.get_mut(self.n)? = b;
        self.n += 1;
        Some(())
    }

    /// Append `input[a..b]`. Runs up to 16 bytes (most tokens) are copied as two overlapping
    /// words, or byte by byte below four: no call, and nothing written past the run (a block
    /// copy that wrote past it made later reads of the buffer slow in some memory layouts).
    #[inline(always)]
    fn copy_input(&mut self, a: usize, b: usize) -> Option<()> {
        let len = b - a;
        let n = self.n;
        let dst = self.buf.get_mut(n..n + len)?;
        let src = self.input.get(a..b)?;
        match len {
            8..=16 => {
                dst[..8].copy_from_slice(&src[..8]);
                dst[len - 8..].copy_from_slice(&src[len - 8..]);
            }
            4..=7 => {
                dst[..4].copy_from_slice(&src[..4]);
                dst[len - 4..].copy_from_slice(&src[len - 4..]);
            }
            0..=3 => {
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = *s;
                }
            }
            _ => dst.copy_from_slice(src),
        }
        self.n = n + len;
        Some(())
    }

    #[inline(always)]
    fn copy_text(&mut self, text: Text) -> Option<()> {
        match text {
            Text::RootObject => None,
            Text::Input(a, b) => self.copy_input(a as usize, b as usize),
            Text::Buffer(a, b) => {
                let (a, b) = (a as usize, b as usize);
                let n = self.n;
                if n + (b - a) > self.buf.len() || b > n {
                    return None;
                }
                self.buf.copy_within(a..b, n);
                self.n = n + (b - a);
                Some(())
            }
        }
    }

    /// A value at `pos` (whitespace skipped), inside `depth` open containers.
    #[inline(always)]
    fn value(&mut self, depth: usize) -> Option<Text> {
        match self.peek()? {
            b'"' => {
                let start = self.pos;
                let end = scan_plain(self.input, start + 1);
                if self.input.get(end) != Some(&b'"') {
                    return self.escaped_string(end);
                }
                self.pos = end + 1;
                Some(Text::Input(start as u32, self.pos as u32))
            }
            b'-' | b'0'..=b'9' => self.number(),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            _ => None,
        }
    }

    /// A string value at `pos` whose first special byte is at `first` (a backslash, if it is
    /// one this pass reads), written into the buffer in canonical form in one pass: the runs
    /// between escapes as they are (they hold no `"`, `\\` or control character), each escape
    /// decoded with the full parser's escape reader and written as the character, or as its
    /// canonical escape when it decodes to `"`, `\\` or a control character. This is the
    /// emitter's `write_escaped` of the decoded string. A control character or a bad escape:
    /// `None`.
    #[inline(never)]
    fn escaped_string(&mut self, first: usize) -> Option<Text> {
        let start = self.n;
        self.write_unescaped(first)?;
        Some(Text::Buffer(start as u32, self.n as u32))
    }

    /// [`Pass::escaped_string`]'s work: writes the string's canonical text into the buffer at
    /// `n` and moves `pos` past it. Returns whether any escape decoded to a character that is
    /// escaped again (`"`, `\\` or a control character): when none did, the text between the
    /// quotes is the decoded string itself.
    #[inline(always)]
    fn write_unescaped(&mut self, first: usize) -> Option<bool> {
        let input = self.input;
        let buf = &mut *self.buf;
        let start = self.n;
        let mut again = false;
        *buf.get_mut(start)? = b'"';
        let mut n = start + 1;
        let mut run = self.pos + 1;
        let mut at = first;
        loop {
            match input.get(at)? {
                b'"' => break,
                b'\\' => {
                    if at > run {
                        let plain = input.get(run..at)?;
                        buf.get_mut(n..n + plain.len())?.copy_from_slice(plain);
                        n += plain.len();
                    }
                    // Escapes often come in runs (text written with every non-ASCII character
                    // escaped): the next one is decoded at once, without a scan in between.
                    loop {
                        let (cp, next) = decode_escape(input, at).ok()?;
                        run = next;
                        if cp < 0x20 || cp == u32::from(b'"') || cp == u32::from(b'\\') {
                            again = true;
                            let mut out = BufSink {
                                buf,
                                n,
                                full: false,
                            };
                            write_escaped_byte(&mut out, cp as u8);
                            if out.full {
                                return None;
                            }
                            n = out.n;
                        } else {
                            // All four bytes when there is room (nothing past `n` is live), so
                            // the copy has a fixed length.
                            let (bytes, len) = utf8(cp);
                            match buf.get_mut(n..n + 4) {
                                Some(dst) => dst.copy_from_slice(&bytes),
                                None => buf.get_mut(n..n + len)?.copy_from_slice(bytes.get(..len)?),
                            }
                            n += len;
                        }
                        if input.get(run) != Some(&b'\\') {
                            break;
                        }
                        at = run;
                    }
                    at = scan_plain(input, run);
                }
                _ => return None,
            }
        }
        let plain = input.get(run..at)?;
        buf.get_mut(n..n + plain.len())?.copy_from_slice(plain);
        n += plain.len();
        *buf.get_mut(n)? = b'"';
        self.pos = at + 1;
        self.n = n + 1;
        Some(again)
    }

    /// A member name at `pos` (its opening quote) whose first special byte is at `first`: when
    /// it is a backslash, the name's canonical text is written into the buffer as a string
    /// value's is ([`Pass::write_unescaped`]) and, unless an escape decoded to a character that
    /// is escaped again, the text between its quotes is copied into `names` as the decoded name
    /// (where it is ordered and compared); otherwise the name is decoded apart with the full
    /// parser's escape reader and written with the emitter's escaping. Returns the name's prefix
    /// (not yet remapped), its range in `names` and its text's range in the buffer; a control
    /// character or a bad escape: `None`.
    #[inline(never)]
    fn escaped_name(&mut self, first: usize) -> Option<NameRead> {
        let (pos, text_at) = (self.pos, self.n);
        if !self.write_unescaped(first)? {
            // The canonical text between its quotes is the decoded name: keep a copy of it.
            let names = &mut *self.names;
            let start = names.len();
            let name = self.buf.get(text_at + 1..self.n - 1)?;
            names.extend_from_slice(name);
            self.ascii &= name.is_ascii();
            return Some((
                key_prefix(name),
                (start as u32, names.len() as u32),
                (text_at as u32, self.n as u32),
            ));
        }
        // A name holding `"`, `\\` or a control character: decoded apart, then written.
        self.pos = pos;
        self.n = text_at;
        let input = self.input;
        let names = &mut *self.names;
        let start = names.len();
        let mut run = self.pos + 1;
        let mut at = first;
        loop {
            match input.get(at)? {
                b'"' => break,
                b'\\' => {
                    names.extend_from_slice(input.get(run..at)?);
                    run = read_escape(input, at, names).ok()?;
                    at = scan_plain(input, run);
                }
                _ => return None,
            }
        }
        names.extend_from_slice(input.get(run..at)?);
        self.pos = at + 1;
        let name = names.get(start..)?;
        self.ascii &= name.is_ascii();
        let text_at = self.n;
        let mut out = BufSink {
            buf: self.buf,
            n: text_at,
            full: false,
        };
        write_escaped(&mut out, name);
        if out.full {
            return None;
        }
        self.n = out.n;
        Some((
            key_prefix(name),
            (start as u32, names.len() as u32),
            (text_at as u32, self.n as u32),
        ))
    }

    fn literal(&mut self, word: &'static [u8]) -> Option<Text> {
        let start = self.pos;
        if !self.input.get(start..)?.starts_with(word) {
            return None;
        }
        self.pos += word.len();
        Some(Text::Input(start as u32, self.pos as u32))
    }

    /// A number, read as the full parser reads it: its canonical text is a prefix of the
    /// literal (most numbers), or written into the buffer here.
    #[inline(always)]
    fn number(&mut self) -> Option<Text> {
        let input = self.input;
        let start = self.pos;
        // The common case, decided here: an integer of at most 15 digits (not `-0`, no
        // leading zero) is exact and prints as itself.
        let int_start = start + usize::from(input.get(start) == Some(&b'-'));
        if let Some(b'1'..=b'9') = input.get(int_start) {
            let end = int_start + 1 + digit_run(input, int_start + 1);
            if end - int_start <= 15 && !matches!(input.get(end), Some(b'.' | b'e' | b'E')) {
                self.pos = end;
                return Some(Text::Input(start as u32, end as u32));
            }
        }
        let strbuf = &mut self.numbers.strbuf;
        strbuf.clear();
        let (end, form) = read_number(
            input,
            start,
            self.opts.numbers == NumberMode::RejectPrecisionLoss,
            strbuf,
        )
        .ok()?;
        self.pos = end;
        let text: &[u8] = match form {
            NumberForm::Prefix(len) => {
                let prefix = input.get(start..start + len)?;
                if prefix != b"-0" {
                    return Some(Text::Input(start as u32, (start + len) as u32));
                }
                b"0"
            }
            NumberForm::Text(a, b) => strbuf.get(a..b)?,
            NumberForm::Float(num) => float_text(
                Some(num),
                input.get(start..end)?,
                self.opts.numbers,
                &mut self.numbers.ryu,
            )?
            .as_bytes(),
        };
        let at = self.n;
        self.buf.get_mut(at..at + text.len())?.copy_from_slice(text);
        self.n = at + text.len();
        Some(Text::Buffer(at as u32, self.n as u32))
    }

    /// Put `members[base..]` (one object's, in input order) into canonical order: as the last
    /// object at this depth was when its names were the same, else by sorting (and refusing
    /// duplicate names: `None`).
    fn order_members(&mut self, base: usize, depth: usize) -> Option<()> {
        let input = self.input;
        let names: &[u8] = self.names;
        let name = |(a, b): (u32, u32), escaped: bool| {
            let from = if escaped { names } else { input };
            from.get(a as usize..b as usize).unwrap_or(&[])
        };
        let members = &mut self.members[base..];
        if self.arrays > 0
            && let Some(shape) = self.shapes.get(depth)
            && shape.names.len() == members.len()
            && shape
                .names
                .iter()
                .zip(members.iter())
                .all(|(&(p, (a, b), escaped), m)| {
                    p == m.prefix
                        && (b - a == m.name.1 - m.name.0)
                        && (b - a <= 8 || name((a, b), escaped) == member_name(m, &name))
                })
        {
            // The same names in the same order: the same permutation, and no duplicates.
            self.reorder.clear();
            self.reorder.extend_from_slice(members);
            for (slot, &from) in members.iter_mut().zip(&shape.perm) {
                *slot = *self.reorder.get(from as usize)?;
            }
            return Some(());
        }
        let names_of = |m: &Member| member_name(m, &name);
        let ascii = self.ascii || members.iter().all(|m| names_of(m).is_ascii());
        if self.arrays == 0 {
            // Outside arrays shapes rarely repeat: sort only.
            sort_members(members, ascii, &names_of);
            return no_duplicates(members, &names_of);
        }
        for (i, m) in members.iter_mut().enumerate() {
            m.index = i as u32;
        }
        if depth >= self.shapes.len() {
            self.shapes.resize_with(depth + 1, Shape::default);
        }
        let shape = &mut self.shapes[depth];
        shape.names.clear();
        shape
            .names
            .extend(members.iter().map(|m| (m.prefix, m.name, m.escaped.1 != 0)));
        sort_members(members, ascii, &names_of);
        shape.perm.clear();
        if no_duplicates(members, &names_of).is_none() {
            // The full parser reports it; this shape is not kept.
            shape.names.clear();
            return None;
        }
        shape.perm.extend(members.iter().map(|m| m.index));
        Some(())
    }

    fn array(&mut self, depth: usize) -> Option<Text> {
        if depth > MAX_NESTING || depth > self.opts.limits.max_depth {
            return None;
        }
        let at = self.n;
        self.put(b'[')?;
        self.pos += 1;
        self.skip_ws();
        if self.peek()? == b']' {
            self.pos += 1;
            self.put(b']')?;
            return Some(Text::Buffer(at as u32, self.n as u32));
        }
        let mut count = 0usize;
        loop {
            count += 1;
            if count > self.opts.limits.max_members {
                return None;
            }
            self.arrays += 1;
            let element = self.value(depth);
            self.arrays -= 1;
            match element? {
                Text::Input(a, b) => self.copy_input(a as usize, b as usize)?,
                // A nested container wrote itself in place, right after the elements so far.
                Text::Buffer(..) => {}
                Text::RootObject => return None,
            }
            self.skip_ws();
            match self.peek()? {
                b',' => {
                    self.pos += 1;
                    self.skip_ws();
                    self.put(b',')?;
                }
                b']' => {
                    self.pos += 1;
                    self.put(b']')?;
                    return Some(Text::Buffer(at as u32, self.n as u32));
                }
                _ => return None,
            }
        }
    }

    fn object(&mut self, depth: usize) -> Option<Text> {
        if depth > MAX_NESTING || depth > self.opts.limits.max_depth {
            return None;
        }
        let at = self.n;
        self.pos += 1;
        self.skip_ws();
        if self.peek()? == b'}' {
            self.pos += 1;
            self.put(b'{')?;
            self.put(b'}')?;
            return Some(Text::Buffer(at as u32, self.n as u32));
        }
        let input = self.input;
        let base = self.members.len();
        loop {
            if self.members.len() - base >= self.opts.limits.max_members {
                return None;
            }
            let quote = self.pos;
            if self.peek()? != b'"' {
                return None;
            }
            let end = scan_plain(input, quote + 1);
            let (prefix, name, escaped) = if input.get(end) == Some(&b'"') {
                let mut head = [0u8; 8];
                match input.get(quote + 1..quote + 9) {
                    Some(w) => head.copy_from_slice(w),
                    None => {
                        for (h, &b) in head.iter_mut().zip(&input[quote + 1..]) {
                            *h = b;
                        }
                    }
                }
                // Bytes of the word past the name (its closing quote on) do not belong to it.
                let len = end - quote - 1;
                let prefix = match len {
                    0 => 0,
                    1..=7 => u64::from_be_bytes(head) & !(u64::MAX >> (8 * len)),
                    _ => u64::from_be_bytes(head),
                };
                self.pos = end + 1;
                (prefix, ((quote + 1) as u32, end as u32), (0, 0))
            } else {
                self.escaped_name(end)?
            };
            let tight = escaped.1 == 0 && self.peek() == Some(b':');
            if !tight {
                self.skip_ws();
                if self.peek()? != b':' {
                    return None;
                }
            }
            self.pos += 1;
            let value_at = self.pos;
            self.skip_ws();
            let tight = tight && self.pos == value_at;
            let value = self.value(depth)?;
            let (text, whole) = match value {
                Text::Input(_, b) if tight => (Text::Input(quote as u32, b), true),
                other => (other, false),
            };
            self.members.push(Member {
                prefix,
                name,
                escaped,
                text,
                whole,
                index: 0,
            });
            self.skip_ws();
            match self.peek()? {
                b',' => {
                    self.pos += 1;
                    self.skip_ws();
                }
                b'}' => {
                    self.pos += 1;
                    break;
                }
                _ => return None,
            }
        }
        self.order_members(base, depth)?;
        if depth == 1 {
            return Some(Text::RootObject);
        }
        // Write the object after its nested containers' text, then move it down over them.
        let end = self.n;
        self.put(b'{')?;
        for i in base..self.members.len() {
            let m = self.members[i];
            if m.escaped.1 != 0 {
                self.copy_text(Text::Buffer(m.escaped.0, m.escaped.1))?;
                self.put(b':')?;
            } else if !m.whole {
                let (a, b) = m.name;
                self.copy_input(a as usize - 1, b as usize + 1)?;
                self.put(b':')?;
            }
            self.copy_text(m.text)?;
            self.put(b',')?;
        }
        *self.buf.get_mut(self.n - 1)? = b'}';
        self.members.truncate(base);
        let len = self.n - end;
        if end != at {
            self.buf.copy_within(end..self.n, at);
            self.n = at + len;
        }
        Some(Text::Buffer(at as u32, self.n as u32))
    }
}

/// The member names (in input order) of the last object sorted at one depth, and the order
/// that sorted them: objects in arrays mostly repeat their shape.
#[derive(Default)]
struct Shape {
    /// Prefix, range and whether it is escaped (the range is then in `names`), of each name.
    names: Vec<(u64, (u32, u32), bool)>,
    /// `perm[i]`: the input position of the i-th member in canonical order.
    perm: Vec<u32>,
}

/// The unescaped bytes of a member's name, through `name` (range, escaped).
#[inline(always)]
fn member_name<'i>(m: &Member, name: &impl Fn((u32, u32), bool) -> &'i [u8]) -> &'i [u8] {
    name(m.name, m.escaped.1 != 0)
}

/// `None` when two adjacent members of a sorted object have the same name (the full parser
/// then reports it).
fn no_duplicates<'i>(members: &[Member], name: &impl Fn(&Member) -> &'i [u8]) -> Option<()> {
    let dup = members
        .windows(2)
        .any(|w| w[0].prefix == w[1].prefix && name(&w[0]) == name(&w[1]));
    (!dup).then_some(())
}

/// Sort an object's members into canonical (UTF-16) name order: ASCII names by prefix, then
/// bytes; others by prefix, then as UTF-16. Small objects by insertion.
fn sort_members<'i>(members: &mut [Member], ascii: bool, name: &impl Fn(&Member) -> &'i [u8]) {
    // Prefixes are remapped to UTF-16 order (a bijection: equal names keep equal prefixes for
    // the duplicate check): the names themselves are compared only on a tie (the same first
    // eight bytes), and as UTF-16 only when some name is not ASCII.
    if !ascii {
        for m in members.iter_mut() {
            m.prefix = utf16_sortable(m.prefix);
        }
    }
    let less = |x: &Member, y: &Member| {
        x.prefix < y.prefix
            || (x.prefix == y.prefix
                && if ascii {
                    name(x) < name(y)
                } else {
                    cmp_utf16(name(x), name(y)) == std::cmp::Ordering::Less
                })
    };
    if members.len() <= 16 {
        for i in 1..members.len() {
            let cur = members[i];
            let mut j = i;
            while j > 0 && less(&cur, &members[j - 1]) {
                members[j] = members[j - 1];
                j -= 1;
            }
            members[j] = cur;
        }
    } else {
        members.sort_unstable_by(|x, y| {
            if less(x, y) {
                std::cmp::Ordering::Less
            } else if less(y, x) {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::{
        CanonError, CanonOptions, Exclusions, Limits, NumberMode, Scratch, canonicalize_full,
    };

    /// The full parser's answer (never the fast path).
    fn canonicalize_with(input: &[u8], opts: &CanonOptions) -> Result<Vec<u8>, CanonError> {
        let mut out = Vec::new();
        canonicalize_full(
            input,
            opts,
            &Exclusions::none(),
            &mut out,
            &mut Scratch::default(),
        )?;
        Ok(out)
    }

    fn fast(input: &[u8]) -> Option<Vec<u8>> {
        let mut s = SmallScratch::default();
        let mut out = Vec::new();
        s.canonicalize(input, &CanonOptions::default(), &mut out)
            .then_some(out)
    }

    #[test]
    fn plain_documents_take_the_fast_path() {
        for (input, want) in [
            (
                &br#"{"b":1,"a":[1,2,{"d":true,"c":null}],"c":"x"}"#[..],
                &br#"{"a":[1,2,{"c":null,"d":true}],"b":1,"c":"x"}"#[..],
            ),
            (
                br#" { "amount" : 1000 , "ratio": 0.10, "n": -2.50, "z": 0.0 } "#,
                br#"{"amount":1000,"n":-2.5,"ratio":0.1,"z":0}"#,
            ),
            (
                br#"[ "a" , "b", [], {}, [[1]] ]"#,
                br#"["a","b",[],{},[[1]]]"#,
            ),
            (
                "{\"\u{e9}\":1,\"z\":2,\"\u{1F600}\":3,\"\u{FF61}\":4}".as_bytes(),
                "{\"z\":2,\"\u{e9}\":1,\"\u{1F600}\":3,\"\u{FF61}\":4}".as_bytes(),
            ),
            (b"\"s\"", b"\"s\""),
            (b"12", b"12"),
            // Numbers the full parser formats, in place.
            (b"[1e3, -0]", b"[1000,0]"),
            (b"[-0.0, 0.0000001]", b"[0,1e-7]"),
            (b"[12345678901234567, 1E+2]", b"[12345678901234568,100]"),
            (br#"{"b":1.5e1,"a":-0}"#, br#"{"a":0,"b":15}"#),
            (b"-0", b"0"),
            // Escapes in string values are decoded and written canonically.
            (
                br#"{"b":"\n\u00e9\/","a":"\ud83d\ude00 \u001f\""}"#,
                "{\"a\":\"\u{1F600} \\u001f\\\"\",\"b\":\"\\n\u{e9}/\"}".as_bytes(),
            ),
            (br#"["x\\y", "\t"]"#, br#"["x\\y","\t"]"#),
            // Escaped member names are decoded, ordered as UTF-16 and written canonically.
            (br#"{"a\u0062":1}"#, br#"{"ab":1}"#),
            (
                br#"{"\u0062":1,"a":[{"\"":2}]}"#,
                br#"{"a":[{"\"":2}],"b":1}"#,
            ),
            (
                br#"{"\uff61":1,"\ud83d\ude00":2,"z\n":3}"#,
                "{\"z\\n\":3,\"\u{1F600}\":2,\"\u{FF61}\":1}".as_bytes(),
            ),
            (
                br#"[{"\u00e9":1,"e":2},{"\u00e9":3,"e":4}]"#,
                "[{\"e\":2,\"\u{e9}\":1},{\"e\":4,\"\u{e9}\":3}]".as_bytes(),
            ),
        ] {
            assert_eq!(
                fast(input).as_deref(),
                Some(want),
                "{}",
                String::from_utf8_lossy(input)
            );
            assert_eq!(
                canonicalize_with(input, &CanonOptions::default()).expect("valid"),
                want
            );
        }
    }

    #[test]
    fn anything_else_is_left_to_the_full_parser() {
        for input in [
            &br#"{"a":1,"a":2}"#[..],
            br#"{"a":"\ud83d"}"#,
            b"[\"a\tb\"]",
            br#"["\x"]"#,
            br#"{"a":1,"\u0061":2}"#,
            r#"{"\u00e9":1,"é":2}"#.as_bytes(),
            br#"{"\ud83d":1}"#,
            b"{\"a\tb\":1}",
            b"[1,]",
            b"{\"a\":1,}",
            b"[1 2]",
            b"01",
            b"1.",
            b"[tru]",
            b"{} x",
            b"\xEF\xBB\xBF{}",
            b"[\"\xFF\"]",
            b"",
            b"[",
        ] {
            assert_eq!(fast(input), None, "{}", String::from_utf8_lossy(input));
        }
        let deep = format!(
            "{}{}",
            "[".repeat(MAX_NESTING + 1),
            "]".repeat(MAX_NESTING + 1)
        );
        assert_eq!(fast(deep.as_bytes()), None);
        let strict = CanonOptions {
            numbers: NumberMode::RejectPrecisionLoss,
            ..CanonOptions::default()
        };
        assert!(canonicalize_with(b"12345678901234567", &strict).is_err());
        // Numbers that print longer than written may not fit the buffer: the full parser
        // then answers (the same bytes).
        let long = format!("[{}]", vec!["1e20"; 64].join(","));
        let want = format!("[{}]", vec!["100000000000000000000"; 64].join(","));
        assert_eq!(
            canonicalize_with(long.as_bytes(), &strict).expect("valid"),
            want.as_bytes()
        );
        assert_eq!(fast(long.as_bytes()), None);
        let mut s = SmallScratch::default();
        for input in [
            &b"12345678901234567"[..],
            b"[1,12345678901234567]",
            b"1e400",
            b"[1e]",
        ] {
            assert!(
                !s.canonicalize(input, &strict, &mut Vec::new()),
                "{}",
                String::from_utf8_lossy(input)
            );
        }
    }

    /// Objects of one shape in a row reuse the order found for the first; anything that differs
    /// (order, a long name with the same first eight bytes and length, count, a duplicate) is
    /// sorted afresh, and shapes of an earlier input are never used.
    #[test]
    fn repeated_shapes_match_the_full_parser() {
        let docs: [&[u8]; 6] = [
            br#"[{"b":1,"a":2,"c":3},{"b":4,"a":5,"c":6},{"b":7,"a":8,"c":9}]"#,
            br#"[{"b":1,"a":2},{"a":3,"b":4},{"b":5,"a":6}]"#,
            br#"[{"longname_b":1,"longname_a":2},{"longname_a":3,"longname_c":4}]"#,
            br#"[{"x":1,"y":2},{"x":1,"y":2,"a":0},{"y":2,"x":1}]"#,
            br#"{"k":[{"q":1,"p":2}],"j":{"q":3,"p":4},"i":[{"q":5,"p":6}]}"#,
            br#"[{"b":1,"a":2},{"b":3,"b":4}]"#,
        ];
        let mut scratch = SmallScratch::default();
        for _ in 0..2 {
            for doc in docs {
                let mut out = Vec::new();
                let took = scratch.canonicalize(doc, &CanonOptions::default(), &mut out);
                let full = canonicalize_with(doc, &CanonOptions::default());
                match full {
                    Ok(want) => {
                        assert!(took, "{}", String::from_utf8_lossy(doc));
                        assert_eq!(out, want, "{}", String::from_utf8_lossy(doc));
                    }
                    Err(_) => assert!(!took, "{}", String::from_utf8_lossy(doc)),
                }
            }
        }
    }

    #[test]
    fn limits_send_documents_to_the_full_parser() {
        let mut s = SmallScratch::default();
        let tight = CanonOptions {
            limits: Limits {
                max_depth: 2,
                max_members: 2,
                ..Limits::default()
            },
            ..CanonOptions::default()
        };
        for input in [&b"[[[1]]]"[..], b"[1,2,3]", br#"{"a":1,"b":2,"c":3}"#] {
            assert!(
                !s.canonicalize(input, &tight, &mut Vec::new()),
                "{}",
                String::from_utf8_lossy(input)
            );
        }
        assert!(s.canonicalize(b"[[1,2]]", &tight, &mut Vec::new()));
    }

    /// Pieces of JSON text, plain and not, for the differential test.
    /// Member names, adversarial for the order and the duplicate check: escaped spellings of
    /// other names (duplicates once decoded), supplementary characters against U+E000-U+FFFF
    /// (UTF-16 order differs from byte order) in the first eight bytes and after them (the
    /// prefixes tie), escaped control characters, and escapes the full parser refuses.
    const NAMES: [&str; 37] = [
        "\"\\ud83d\\ude00\"",
        "\"\\uff61\"",
        "\"\\u00e9\"",
        "\"\\u0041\"",
        "\"prefix12\u{1F600}\"",
        "\"prefix12\u{E000}\"",
        "\"prefix12\\uE000x\"",
        "\"prefix12\\ud83d\\ude01\"",
        "\"prefix12\\uD83D\\uDE00\"",
        "\"\u{E000}\"",
        "\"\u{FFFF}\"",
        "\"\u{10FFFF}\"",
        "\"\\uFFFF\"",
        "\"\\udbff\\udfff\"",
        "\"\\n\"",
        "\"\\u000a\"",
        "\"\\u0000\"",
        "\"\\\\\"",
        "\"\\/\"",
        "\"\\udc00\"",
        "\"a\\u0062\"",
        "\"ab\"",
        "\"a\"",
        "\"b\"",
        "\"amount\"",
        "\"amount_x\"",
        "\"amount_y\"",
        "\"\"",
        "\"A\"",
        "\"\u{e9}\"",
        "\"\u{1F600}\"",
        "\"\u{FF61}\"",
        "\"a\\u0062\"",
        "\"a\\\"\"",
        "\"longer name 1\"",
        "\"longer name 2\"",
        "\"\\uZZZZ\"",
    ];
    const SCALARS: [&str; 36] = [
        "0",
        "-0",
        "1",
        "-1",
        "12",
        "1001",
        "0.1",
        "-2.50",
        "0.0",
        "-0.0",
        "1.0",
        "100.010",
        "0.000001",
        "0.0000001",
        "123456789012345",
        "1234567890123456",
        "9007199254740993",
        "1e3",
        "1E-7",
        "01",
        "1.",
        "-",
        "true",
        "false",
        "null",
        "\"x\"",
        "\"\"",
        "\"a b \u{e9}\"",
        "\"tab\\t\"",
        "\"\\u00e9\\n\\\"q\\/\"",
        "\"\\ud83d\\ude00\"",
        "\"\\ud83d\"",
        "\"\\u0000\\u001F\"",
        "\"\u{1F600}\"",
        // Escapes that decode to characters written escaped again, and to ones written raw.
        "\"a\\u0022b\\u005c\\u001f\\u001F\\u0008\\u000d\\u007f\\u2028\\ud800\\udc00\u{E000}z\"",
        "\"\\uDBFF\\uDFFF\\u00e9\\/\\b\\f\\r\\t\u{10FFFF}\\uffff\\u0000\"",
    ];
    const SPACE: [&str; 5] = ["", "", "", " ", "\n\t "];

    /// A random document: scalars from `SCALARS`, containers with random whitespace, now and
    /// then a trailing comma or a missing colon.
    fn doc(g: &mut impl FnMut(usize) -> usize, depth: usize, out: &mut String) {
        let kind = if depth > 3 { 0 } else { g(4) };
        if kind < 2 {
            out.push_str(SCALARS[g(SCALARS.len())]);
            return;
        }
        let object = kind == 3;
        out.push(if object { '{' } else { '[' });
        let n = g(if object { 6 } else { 5 });
        for i in 0..n {
            if i > 0 {
                out.push(',');
            }
            out.push_str(SPACE[g(SPACE.len())]);
            if object {
                out.push_str(NAMES[g(NAMES.len())]);
                out.push_str(SPACE[g(SPACE.len())]);
                if g(60) != 0 {
                    out.push(':');
                }
                out.push_str(SPACE[g(SPACE.len())]);
            }
            doc(g, depth + 1, out);
            out.push_str(SPACE[g(SPACE.len())]);
        }
        if !object && g(40) == 0 {
            out.push(',');
        }
        out.push(if object { '}' } else { ']' });
    }

    /// Runs twenty generated documents from `seed` (every other one mutated: a byte changed,
    /// inserted or removed) through the fast path in both number modes, checking each answer
    /// against the full parser; returns how many answers there were.
    fn agree(seed: u64) -> Result<usize, String> {
        let mut state = seed | 1;
        let mut g = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let mut taken = 0;
        // One scratch for all: what a call leaves in it must not matter.
        let mut scratch = SmallScratch::default();
        for round in 0..20 {
            let mut text = String::new();
            doc(&mut g, 0, &mut text);
            let mut bytes = text.into_bytes();
            if round % 2 == 1 && !bytes.is_empty() {
                let at = g(bytes.len());
                let set = b"\"{}[],:-.0e \\\x80\xff";
                let byte = set[g(set.len())];
                match g(3) {
                    0 => bytes[at] = byte,
                    1 => bytes.insert(at, byte),
                    _ => {
                        bytes.remove(at);
                    }
                }
            }
            for numbers in [NumberMode::Rfc, NumberMode::RejectPrecisionLoss] {
                let opts = CanonOptions {
                    numbers,
                    ..CanonOptions::default()
                };
                let mut out = Vec::new();
                if !scratch.canonicalize(&bytes, &opts, &mut out) {
                    continue;
                }
                taken += 1;
                let full = canonicalize_with(&bytes, &opts);
                if full.as_ref().ok() != Some(&out) {
                    return Err(format!(
                        "{numbers:?} {}: fast {:?}, full {:?}",
                        String::from_utf8_lossy(&bytes),
                        String::from_utf8_lossy(&out),
                        full.map(|f| String::from_utf8_lossy(&f).into_owned())
                    ));
                }
            }
        }
        Ok(taken)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]
        /// Whenever the fast path answers, the full parser gives the same bytes.
        #[test]
        fn fast_path_agrees_with_the_full_parser(seed in proptest::prelude::any::<u64>()) {
            if let Err(e) = agree(seed) {
                proptest::prop_assert!(false, "{}", e);
            }
        }
    }

    /// Over fixed seeds the fast path answers for many of the generated documents (the
    /// agreement test above is not vacuous).
    #[test]
    fn fast_path_answers_often() {
        let taken: usize = (1..=300).map(|seed| agree(seed).expect("agrees")).sum();
        // About 4,600 of the 12,000 checks (300 seeds, 20 documents, 2 number modes).
        assert!(taken >= 1_500, "only {taken} of 12000 answered");
    }
}
