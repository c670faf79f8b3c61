//! A fixed-size line buffer for messages written from inside an allocator:
//! no allocation, no panic. Shared by the trap's diagnostic and the
//! LD_PRELOAD shim's stats line (included there by path).

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// The process's name in the diagnostic lines (see [`set_process_name`]):
/// its bytes, then its length, published last.
static NAME: [AtomicU8; 64] = [const { AtomicU8::new(0) }; 64];
static NAME_LEN: AtomicUsize = AtomicUsize::new(0);

/// Names this process in the lines the allocator writes when memory runs
/// out (`outcore: rank 2 of 4: out of memory: ...`), for a program that
/// runs as one of several processes, such as an MPI rank. At most 64
/// bytes are kept. Call it once, early; an empty name removes it.
///
/// ```
/// outcore::set_process_name("rank 2 of 4");
/// ```
pub fn set_process_name(name: &str) {
    let b = name.as_bytes();
    let n = b.len().min(NAME.len());
    NAME_LEN.store(0, Ordering::Release);
    for (slot, &byte) in NAME.iter().zip(&b[..n]) {
        slot.store(byte, Ordering::Relaxed);
    }
    NAME_LEN.store(n, Ordering::Release);
}

/// Bytes and decimal numbers appended to a stack buffer; excess is dropped.
#[derive(Clone)]
pub(crate) struct LineBuf {
    bytes: [u8; 512],
    len: usize,
}

impl LineBuf {
    pub(crate) fn new() -> Self {
        LineBuf {
            bytes: [0; 512],
            len: 0,
        }
    }

    /// Appends bytes (truncating at the end of the buffer).
    pub(crate) fn push(&mut self, s: &[u8]) {
        for &b in s {
            if self.len < self.bytes.len() {
                self.bytes[self.len] = b;
                self.len += 1;
            }
        }
    }

    /// Appends `n` in decimal.
    pub(crate) fn num(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let mut tmp = [0u8; 20];
        let k = digits.len() - i;
        tmp[..k].copy_from_slice(&digits[i..]);
        self.push(&tmp[..k]);
    }

    /// Starts a diagnostic line: `outcore: `, then the process's name and
    /// `: ` when one was set with [`set_process_name`].
    pub(crate) fn prefix(&mut self) {
        self.push(b"outcore: ");
        let n = NAME_LEN.load(Ordering::Acquire);
        if n > 0 {
            for b in NAME.iter().take(n) {
                self.push(&[b.load(Ordering::Relaxed)]);
            }
            self.push(b": ");
        }
    }

    /// The text so far.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// Writes the text to stderr with one `write(2)` call.
    pub(crate) fn write_stderr(&self) {
        // SAFETY: writing an initialised buffer to fd 2.
        unsafe {
            libc::write(2, self.bytes.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LineBuf;

    #[test]
    fn formats_numbers() {
        let mut b = LineBuf::new();
        b.push(b"x=");
        b.num(0);
        b.push(b",");
        b.num(18_446_744_073_709_551_615);
        assert_eq!(b.as_bytes(), b"x=0,18446744073709551615");
    }
}
