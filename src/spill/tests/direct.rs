//! Spill files written and read with direct I/O.

use super::*;

// ---------------------------------------------------------------------------
// Direct I/O
// ---------------------------------------------------------------------------

/// Writes `v` into `dir` and reads it back, returning what the load read
/// directly.
fn direct_roundtrip<T>(dir: &Path, v: &T) -> Loaded
where
    T: Serialize + DeserializeOwned + PartialEq + Debug + 'static,
{
    let path = dir.join("d.spill");
    let k = key::<T>(3, 1);
    write_file(&path, k, v).unwrap();
    let (back, loaded) = read_file_counted::<T>(&path, k).unwrap();
    assert!(back == *v, "direct load changed the value");
    assert_eq!(loaded.bytes, std::fs::metadata(&path).unwrap().len());
    loaded
}

#[test]
fn large_pod_vecs_load_with_direct_io() {
    // The cargo target directory: a disk filesystem, as spill directories
    // are by default (the system temporary directory may be tmpfs).
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(&base).unwrap();
    // Whole pages of it are read directly; the last partial page and
    // everything around it go through the buffered reader.
    for n in [CHUNK / 4, CHUNK / 4 + 1, 3_000_001, 5 << 20] {
        let loaded = direct_roundtrip(dir.path(), &pod_f32(n));
        let data = (n * 4) as u64;
        assert_eq!(loaded.direct_bytes, data / 4096 * 4096, "n = {n}");
    }
    // Two vectors in a struct, both direct; the fields after them are read
    // where the direct reads left the buffered reader.
    let loaded = direct_roundtrip(dir.path(), &mixed(600_000));
    assert_eq!(
        loaded.direct_bytes,
        (2_400_000 / 4096 + 1_600_000 / 4096) * 4096
    );
    // Small vectors are not worth it.
    assert_eq!(direct_roundtrip(dir.path(), &pod_f32(1000)).direct_bytes, 0);
}

/// Bytes this thread has had read from storage (`/proc/thread-self/io`),
/// or `None` where the kernel does not count them.
fn storage_reads() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/thread-self/io").ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("read_bytes: "))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn a_direct_load_reads_each_byte_from_storage_once() {
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(&base).unwrap();
    let Some(before) = storage_reads() else {
        eprintln!("skipped: /proc/thread-self/io is not available");
        return;
    };
    // A 1 MiB executor, a struct of two vectors and small fields, and a
    // large value that is not a `PodVec` behind a `PodVec`.
    let big_tail = Mixed {
        tail: (0..400_000).collect(),
        ..mixed(300_000)
    };
    let (mut read, mut bytes, mut direct) = (0, 0, 0);
    let mut check = |what: &str, l: Loaded| {
        let now = storage_reads().unwrap() - before;
        assert!(
            now - read <= l.bytes + (64 << 10),
            "{what}: {} bytes from storage for a {}-byte file",
            now - read,
            l.bytes
        );
        (read, bytes, direct) = (now, bytes + l.bytes, direct + l.direct_bytes);
    };
    check("1 MiB", direct_roundtrip(dir.path(), &pod_f32(CHUNK / 4)));
    check("mixed", direct_roundtrip(dir.path(), &mixed(600_000)));
    check("big tail", direct_roundtrip(dir.path(), &big_tail));
    assert!(read >= direct, "storage reads are not counted here");
    // Read through the page cache, the first small read of each file made
    // the kernel read ahead 256 KiB that the direct reads then read again.
    assert!(
        read <= bytes + 3 * (16 << 10),
        "{read} bytes from storage for {bytes} bytes of files"
    );
}

/// A plain struct of the user's (see [`crate::Plain`]).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq)]
struct Edge {
    src: u32,
    dst: u32,
    weight: f32,
    hops: [u16; 2],
}

// SAFETY: `repr(C)`, 16 bytes of `Plain` fields with no padding; any bit
// pattern is valid.
unsafe impl crate::Plain for Edge {}

#[test]
fn plain_structs_and_arrays_load_with_direct_io() {
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(&base).unwrap();
    assert_eq!(std::mem::size_of::<Edge>(), 16);
    let n = 300_001u32;
    let edges: PodVec<Edge> = (0..n)
        .map(|i| Edge {
            src: i,
            dst: i.wrapping_mul(7919) % n,
            weight: i as f32 * 0.5,
            hops: [i as u16, 3],
        })
        .collect::<Vec<_>>()
        .into();
    let loaded = direct_roundtrip(dir.path(), &edges);
    assert_eq!(loaded.direct_bytes, u64::from(n) * 16 / 4096 * 4096);
    let points: PodVec<[f32; 3]> = (0..200_000)
        .map(|i| [i as f32, 1.0, -1.0])
        .collect::<Vec<_>>()
        .into();
    let loaded = direct_roundtrip(dir.path(), &points);
    assert_eq!(loaded.direct_bytes, 2_400_000 / 4096 * 4096);
}

#[test]
fn a_filesystem_without_direct_io_loads_buffered() {
    // tmpfs refuses O_DIRECT on older kernels and accepts it on newer ones:
    // the value must come back either way.
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    direct_roundtrip(dir.path(), &pod_f32(3_000_001));
    direct_roundtrip(dir.path(), &mixed(600_000));
}

#[test]
fn damage_in_directly_read_bytes_is_detected() {
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(&base).unwrap();
    let v = pod_f32(3_000_000);
    let k = key::<PodVec<f32>>(1, 1);
    let (path, bytes) = write_checked(dir.path(), "x.spill", k, &v);
    // A flipped bit in the middle of the directly read region, and one in
    // its last page.
    for at in [bytes.len() / 2, bytes.len() - 5000] {
        let mut b = bytes.clone();
        b[at] ^= 0x10;
        std::fs::write(&path, &b).unwrap();
        let err = expect_err(&path, k, &v, &format!("flip at {at}"));
        assert_mentions(&err, &["checksum"], &format!("flip at {at}"));
    }
    // Cut inside the directly read region.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    f.set_len(bytes.len() as u64 / 2).unwrap();
    expect_err(&path, k, &v, &"cut in half");
}

/// A page-aligned buffer of `len` bytes, for direct reads.
struct PageBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl PageBuf {
    fn new(len: usize) -> PageBuf {
        let layout = std::alloc::Layout::from_size_align(len.max(4096), 4096).unwrap();
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        PageBuf { ptr, layout }
    }

    fn bytes(&self, len: usize) -> &[u8] {
        // SAFETY: `len` is within the allocation, which is initialised.
        unsafe { std::slice::from_raw_parts(self.ptr, len) }
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Native AIO reads ranges of every shape back exactly, checksummed in
/// file order: a page, less than a piece, more pieces than fit in flight
/// at once, from offsets other than 0; and a range past the end of the
/// file is not taken for read (the caller then reads it with `pread`,
/// which reports the truncation).
#[test]
fn native_aio_reads_ranges_back_exactly() {
    const PAGE: usize = 4096;
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(&base).unwrap();
    let path = dir.path().join("aio.bin");
    let piece = AIO_PIECE;
    let size = 20 * piece + 3 * PAGE;
    let data: Vec<u8> = (0..size as u64)
        .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57) as u8)
        .collect();
    std::fs::write(&path, &data).unwrap();
    let Ok(file) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
    else {
        return; // no direct I/O on this filesystem
    };
    for (pos, len) in [
        (0, PAGE),
        (PAGE, piece - PAGE),
        (0, piece),
        (2 * PAGE, 17 * piece + PAGE),
        (0, size),
    ] {
        let buf = PageBuf::new(len);
        let mut got = Checksum::new();
        got.update(b"earlier bytes of the stream");
        let mut want = got.clone();
        assert!(
            // SAFETY: `buf` holds `len` writable bytes that nothing else uses.
            unsafe { read_aio(&file, pos as u64, buf.ptr, len, &mut got) },
            "native AIO did not read {len} bytes at {pos}"
        );
        assert!(
            buf.bytes(len) == &data[pos..pos + len],
            "{len} bytes at {pos}"
        );
        want.update(&data[pos..pos + len]);
        assert_eq!(got.finish(), want.finish(), "{len} bytes at {pos}");
    }
    // Past the end: the last piece comes back short, and the read is given
    // up (nothing in flight any more); the whole load then reports it.
    let len = size + 5 * PAGE;
    let buf = PageBuf::new(len);
    // SAFETY: as above.
    let r = unsafe { read_aio(&file, 0, buf.ptr, len, &mut Checksum::new()) };
    assert!(!r, "a read past the end succeeded");
    // SAFETY: as above.
    let e = unsafe { read_pieces(&file, 0, buf.ptr, len, &mut Checksum::new()) }
        .expect_err("pread past the end");
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    // The thread's context is still good after a failed read.
    let buf = PageBuf::new(piece);
    // SAFETY: as above.
    assert!(unsafe { read_aio(&file, 0, buf.ptr, piece, &mut Checksum::new()) });
    assert!(buf.bytes(piece) == &data[..piece]);
}

/// The default spill parent: `TMPDIR` when set and not empty; else `/tmp`,
/// unless it is in memory and `/var/tmp` is on a disk.
#[test]
fn the_default_spill_parent_avoids_a_tmp_in_memory() {
    use std::ffi::OsString;
    use std::path::{Path, PathBuf};
    let pick = |tmpdir: Option<&str>, tmp_in_ram: bool, var_tmp_on_disk: bool| {
        super::temp_dir_from(
            tmpdir.map(OsString::from),
            |p: &Path| p == Path::new("/var/tmp") && var_tmp_on_disk,
            |p: &Path| p == Path::new("/tmp") && tmp_in_ram,
        )
    };
    assert_eq!(
        pick(Some("/scratch"), true, true),
        PathBuf::from("/scratch")
    );
    assert_eq!(pick(None, false, true), PathBuf::from("/tmp"));
    assert_eq!(pick(Some(""), true, true), PathBuf::from("/var/tmp"));
    assert_eq!(pick(None, true, true), PathBuf::from("/var/tmp"));
    assert_eq!(pick(None, true, false), PathBuf::from("/tmp"));
    if Path::new("/dev/shm").is_dir() {
        assert_eq!(super::in_memory(Path::new("/dev/shm")), Some(true));
    }
    assert_eq!(super::in_memory(Path::new("/proc/self/no-such-dir")), None);
}
