//! Where canonical bytes go: a `Vec<u8>`, or a hasher through a small stack buffer.

use sha2::digest::Update;

/// A destination for canonical bytes. Writing cannot fail (core does no IO).
pub trait CanonSink {
    /// Append `bytes`.
    fn write(&mut self, bytes: &[u8]);

    /// Append one byte.
    #[inline]
    fn write_byte(&mut self, byte: u8) {
        self.write(&[byte]);
    }

    /// Append `src[start..start + len]`. Implementations may read (never write) bytes of `src`
    /// past that range, which lets a buffered sink copy short runs in fixed-size blocks.
    #[inline]
    fn write_in(&mut self, src: &[u8], start: usize, len: usize) {
        self.write(src.get(start..start + len).unwrap_or(&[]));
    }
}

impl CanonSink for Vec<u8> {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    #[inline]
    fn write_byte(&mut self, byte: u8) {
        self.push(byte);
    }

    #[inline]
    fn write_in(&mut self, src: &[u8], start: usize, len: usize) {
        const BLOCK: usize = 32;
        if len <= BLOCK {
            if let Some(block) = src.get(start..).and_then(<[u8]>::first_chunk::<BLOCK>) {
                // A fixed-size copy (inlined, no memcpy call), then only `len` bytes are kept.
                let keep = self.len() + len;
                self.extend_from_slice(block);
                self.truncate(keep);
                return;
            }
        }
        self.extend_from_slice(src.get(start..start + len).unwrap_or(&[]));
    }
}

/// Size of [`DigestSink`]'s stack buffer.
pub const DIGEST_SINK_BUFFER: usize = 4096;

/// Feeds canonical bytes into a hasher (`sha2::Sha256`, `hmac::Hmac<Sha256>`, ...) through a
/// 4 KiB buffer, so the canonical text is never materialized and the hasher sees large updates.
///
/// Call [`DigestSink::finish`] to flush the buffer and get the hasher back.
pub struct DigestSink<D: Update>(BufSink<D, DIGEST_SINK_BUFFER>);

impl<D: Update> DigestSink<D> {
    /// Wrap `digest`; bytes written go into it after whatever it already absorbed.
    #[must_use]
    pub fn new(digest: D) -> Self {
        Self(BufSink::new(digest))
    }

    /// Number of bytes written through this sink so far.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.0.total()
    }

    /// Flush the buffer and return the hasher and the number of bytes written through the sink.
    #[must_use]
    pub fn finish(self) -> (D, u64) {
        self.0.finish()
    }
}

impl<D: Update> CanonSink for DigestSink<D> {
    #[inline(always)]
    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }

    #[inline(always)]
    fn write_in(&mut self, src: &[u8], start: usize, len: usize) {
        self.0.write_in(src, start, len);
    }

    #[inline(always)]
    fn write_byte(&mut self, byte: u8) {
        self.0.write_byte(byte);
    }
}

/// The buffered hasher sink behind [`DigestSink`], with an `N`-byte stack buffer. Small bodies
/// use a small buffer: the buffer is zeroed on creation, which costs as much as hashing a tiny
/// body.
pub(crate) struct BufSink<D: Update, const N: usize> {
    digest: D,
    buf: [u8; N],
    len: usize,
    /// Bytes already handed to the digest. The running total is `flushed + len`: keeping no
    /// separate per-write counter leaves one store per write (a second counter updated next to
    /// `len` made the compiler merge both into a 16-byte load that could not be forwarded from
    /// the two 8-byte stores of the previous write, a stall on every small write).
    flushed: u64,
}

impl<D: Update, const N: usize> BufSink<D, N> {
    /// Wrap `digest`.
    pub(crate) fn new(digest: D) -> Self {
        Self {
            digest,
            buf: [0; N],
            len: 0,
            flushed: 0,
        }
    }

    /// Number of bytes written so far.
    pub(crate) fn total(&self) -> u64 {
        self.flushed + self.len as u64
    }

    /// Flush the buffer and return the hasher and the number of bytes written.
    pub(crate) fn finish(mut self) -> (D, u64) {
        let total = self.total();
        self.digest.update(&self.buf[..self.len]);
        (self.digest, total)
    }
}

impl<D: Update, const N: usize> CanonSink for BufSink<D, N> {
    #[inline(always)]
    fn write(&mut self, bytes: &[u8]) {
        let room = N - self.len;
        if bytes.len() <= room {
            self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
            self.len += bytes.len();
            return;
        }
        self.digest.update(&self.buf[..self.len]);
        self.flushed += self.len as u64;
        self.len = 0;
        if bytes.len() >= N {
            self.digest.update(bytes);
            self.flushed += bytes.len() as u64;
        } else {
            self.buf[..bytes.len()].copy_from_slice(bytes);
            self.len = bytes.len();
        }
    }

    #[inline(always)]
    fn write_in(&mut self, src: &[u8], start: usize, len: usize) {
        const BLOCK: usize = 32;
        if len <= BLOCK && self.len + BLOCK <= N {
            if let Some(block) = src.get(start..start + BLOCK) {
                // Fixed-size copy (no memcpy call); only `len` bytes are kept.
                self.buf[self.len..self.len + BLOCK].copy_from_slice(block);
                self.len += len;
                return;
            }
        }
        self.write(src.get(start..start + len).unwrap_or(&[]));
    }

    #[inline(always)]
    fn write_byte(&mut self, byte: u8) {
        if self.len == N {
            self.digest.update(&self.buf);
            self.flushed += N as u64;
            self.len = 0;
        }
        self.buf[self.len] = byte;
        self.len += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn buffered_equals_direct() {
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut sink = DigestSink::new(Sha256::new());
        let mut i = 0;
        let mut step = 1;
        while i < data.len() {
            let end = (i + step).min(data.len());
            if step == 1 {
                sink.write_byte(data[i]);
            } else if step % 2 == 0 {
                sink.write_in(&data, i, end - i);
            } else {
                sink.write(&data[i..end]);
            }
            i = end;
            step = step * 3 % 5001 + 1;
        }
        let (h, n) = sink.finish();
        assert_eq!(n, data.len() as u64);
        assert_eq!(h.finalize(), Sha256::digest(&data));
    }

    #[test]
    fn small_buffer_equals_direct() {
        let data: Vec<u8> = (0..3_000u32).map(|i| (i * 13 % 251) as u8).collect();
        let mut sink = BufSink::<_, 64>::new(Sha256::new());
        let mut i = 0;
        let mut step = 1;
        while i < data.len() {
            let end = (i + step).min(data.len());
            match step % 3 {
                0 => sink.write(&data[i..end]),
                1 => sink.write_in(&data, i, end - i),
                _ => data[i..end].iter().for_each(|&b| sink.write_byte(b)),
            }
            i = end;
            step = step * 7 % 101 + 1;
        }
        let (h, n) = sink.finish();
        assert_eq!(n, data.len() as u64);
        assert_eq!(h.finalize(), Sha256::digest(&data));
    }
}
