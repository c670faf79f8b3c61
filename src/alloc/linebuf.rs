//! A fixed-size line buffer for messages written from inside an allocator:
//! no allocation, no panic. Shared by the trap's diagnostic and the
//! LD_PRELOAD shim's stats line (included there by path).

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
