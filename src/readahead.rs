
#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    const PAGE: usize = crate::alloc::PAGE;

    /// Page-aligned zeroed memory.
    struct Pages(Vec<u8>, usize);

    impl Pages {
        fn new(len: usize) -> Pages {
            let v = vec![0u8; len + PAGE];
            let skip = v.as_ptr().align_offset(PAGE);
            Pages(v, skip)
        }
        fn ptr(&mut self, at: usize) -> *mut u8 {
            self.0[self.1 + at..].as_mut_ptr()
        }
        fn bytes(&self, at: usize, len: usize) -> &[u8] {
            &self.0[self.1 + at..self.1 + at + len]
        }
    }

    /// A file of `len` bytes, opened with `O_DIRECT` (`None` where the
    /// filesystem refuses it), and its bytes.
    fn file(len: usize) -> Option<(tempfile::TempDir, File, Vec<u8>)> {
        let base = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
        std::fs::create_dir_all(&base).unwrap();
        let dir = tempfile::tempdir_in(&base).unwrap();
        let path = dir.path().join("readahead.bin");
        let data: Vec<u8> = (0..len as u64)
            .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .ok()?;
        Some((dir, f, data))
    }

    /// Scattered page reads submitted together, more than fit in the
    /// window, each into the buffer of its place in the window: every one
    /// is handed over in order with its own bytes in that buffer.
    #[test]
    fn scattered_reads_together_land_in_order_in_their_places() {
        let Some((_dir, f, data)) = file(300 * PAGE) else {
            return;
        };
        let starts: Vec<usize> = (0..100).map(|i| (i * 37 % 299) * PAGE).collect();
        let window = 8;
        let mut bufs = Pages::new(window * PAGE);
        let base = bufs.ptr(0);
        let mut seen = Vec::new();
        let request = |i: usize| Request {
            pos: starts[i] as u64,
            dst: base.wrapping_add(i % window * PAGE),
            len: PAGE,
            need: PAGE,
        };
        let landed = |i: usize| {
            // SAFETY: the place's buffer, which the kernel is done with.
            let got = unsafe { std::slice::from_raw_parts(base.add(i % window * PAGE), PAGE) };
            assert!(got == &data[starts[i]..starts[i] + PAGE], "record {i}");
            seen.push(i);
        };
        // SAFETY: each place's buffer is ours and free until its read is
        // handed over.
        let ok = unsafe { read(&f, starts.len(), window, Submit::Together, request, landed) };
        assert!(ok, "the engine did not read");
        assert_eq!(seen, (0..starts.len()).collect::<Vec<_>>());
    }

    /// A read of whole pages past a file that ends inside its last page is
    /// done once the bytes it needs are in; one that needs bytes past the
    /// end is not taken for read. A panic in `landed` leaves the thread
    /// able to read again.
    #[test]
    fn reads_end_where_the_file_does_and_survive_a_panic() {
        let len = 5 * PAGE + 100;
        let Some((_dir, f, data)) = file(len) else {
            return;
        };
        let mut buf = Pages::new(8 * PAGE);
        let dst = buf.ptr(0);
        let req = |need: usize| {
            move |i: usize| Request {
                pos: (i * 2 * PAGE) as u64,
                dst: dst.wrapping_add(i * 2 * PAGE),
                len: 2 * PAGE,
                need: need.min(len - i * 2 * PAGE),
            }
        };
        // SAFETY: `buf` holds the 6 pages the requests name, ours alone.
        assert!(unsafe { read(&f, 3, 4, Submit::Each, req(2 * PAGE), |_| {}) });
        assert!(buf.bytes(0, len) == &data[..]);
        // SAFETY: as above.
        assert!(!unsafe { read(&f, 3, 4, Submit::Each, |i| req(2 * PAGE)(i), |_| {}) }
            || false);
        let past = |i: usize| Request {
            need: 2 * PAGE,
            ..req(2 * PAGE)(i)
        };
        // SAFETY: as above.
        assert!(!unsafe { read(&f, 3, 4, Submit::Each, past, |_| {}) });
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: as above.
            unsafe { read(&f, 3, 1, Submit::Each, req(2 * PAGE), |_| panic!("landed")) }
        }));
        assert!(r.is_err());
        // SAFETY: as above.
        assert!(unsafe { read(&f, 3, 4, Submit::Each, req(2 * PAGE), |_| {}) });
    }
}
