//! Memory advice for the fresh blocks reads go into: transparent huge
//! pages ([`huge_pages`]), pages faulted in before the read
//! ([`populate`]), and float32 values viewed as the uninitialised bytes a
//! read fills.

use std::mem::MaybeUninit;

/// Asks for transparent huge pages on the 2 MiB-aligned part of a fresh
/// block (the system's default here is "madvise"): a first read into fresh
/// memory then takes one fault per 2 MiB instead of one per 4 KiB. Advice
/// only: nothing changes where it is refused.
pub(crate) fn huge_pages<T>(v: &mut [MaybeUninit<T>]) {
    const HUGE: usize = 2 << 20;
    let start = (v.as_ptr() as usize).next_multiple_of(HUGE);
    let end = (v.as_ptr() as usize + std::mem::size_of_val(v)) & !(HUGE - 1);
    if end > start {
        // SAFETY: the range lies inside memory this vector owns; advice
        // does not change its contents or validity.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}

/// Faults in the pages of a fresh block before it is read into, where the
/// kernel allows (`MADV_POPULATE_WRITE`, Linux 5.14).
///
/// The first touch of fresh memory costs the kernel a fault and a zeroing
/// per page: measured here, a quarter of the CPU time of reading 4 GiB into
/// memory. Taken in the copy out of the reader's buffers, that cost holds
/// a reader of the file while its queue drains and the other threads wait
/// for it; taken here, before the reader is locked, it overlaps another
/// thread's reads. Pages already present (memory reused after an eviction)
/// are left as they are. Advice only: nothing changes where it is refused.
pub(crate) fn populate<T>(v: &mut [MaybeUninit<T>]) {
    const PAGE: usize = 4096;
    let start = (v.as_ptr() as usize).next_multiple_of(PAGE);
    let end = (v.as_ptr() as usize + std::mem::size_of_val(v)) & !(PAGE - 1);
    if end > start {
        // SAFETY: the range lies inside memory this vector owns and may
        // write; populating maps its pages writable without changing the
        // contents of those already present (fresh ones read as zeros, and
        // the block is uninitialised anyway).
        unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                end - start,
                libc::MADV_POPULATE_WRITE,
            )
        };
    }
}

/// The bytes of float32 values not initialised yet.
pub(super) fn uninit_bytes(v: &mut [MaybeUninit<f32>]) -> &mut [MaybeUninit<u8>] {
    let len = std::mem::size_of_val(v);
    // SAFETY: the same memory viewed as `len` possibly uninitialised bytes
    // (alignment 1), for as long as the borrow of `v`.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<MaybeUninit<u8>>(), len) }
}

/// Whether every page of bytes `pos..pos + len` of `file` is in the page
/// cache now (`mincore` on a mapping of them that is never touched, so
/// mapping them reads nothing and adds nothing to the resident set).
/// `false` where it cannot tell.
fn cached(file: &std::fs::File, pos: u64, len: usize) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: sysconf has no memory effects.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as u64,
        _ => return false,
    };
    let start = pos - pos % page;
    let span = (pos + len as u64 - start) as usize;
    if len == 0 {
        return true;
    }
    let Ok(offset) = libc::off_t::try_from(start) else {
        return false;
    };
    // SAFETY: a fresh shared read-only mapping of the file's pages: it
    // aliases no Rust memory, is never read through, and is unmapped
    // below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            offset,
        )
    };
    if map == libc::MAP_FAILED {
        return false;
    }
    let mut resident = vec![0u8; span.div_ceil(page as usize)];
    // SAFETY: `map` is a mapping of `span` bytes; `resident` has a byte
    // per page of it.
    let ok = unsafe { libc::mincore(map, span, resident.as_mut_ptr()) } == 0;
    // SAFETY: the mapping made above, of `span` bytes, used no more.
    unsafe { libc::munmap(map, span) };
    ok && resident.iter().all(|r| r & 1 == 1)
}

/// Fills `dst` with bytes `pos..` of `file` when they are all in the page
/// cache now, with buffered reads that do not wait for the disk
/// (`preadv2` with `RWF_NOWAIT`; where the kernel or filesystem refuses
/// it, `mincore` then `pread`); `false`, with `dst` partly filled, when
/// some page is not there.
pub(crate) fn read_if_cached(
    file: &std::fs::File,
    pos: u64,
    dst: &mut [MaybeUninit<u8>],
) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let mut done = 0;
    while done < dst.len() {
        let rest = &mut dst[done..];
        let iov = libc::iovec {
            iov_base: rest.as_mut_ptr().cast(),
            iov_len: rest.len(),
        };
        let Ok(at) = libc::off_t::try_from(pos + done as u64) else {
            return Ok(false);
        };
        // SAFETY: `iov` describes `rest`, memory this call borrows
        // mutably; the kernel writes at most `rest.len()` bytes into it,
        // and any bytes are valid `MaybeUninit<u8>`.
        let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, at, libc::RWF_NOWAIT) };
        match n {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n if n > 0 => done += n as usize,
            _ => {
                let e = std::io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(false),
                    Some(libc::EINTR) => continue,
                    Some(libc::EOPNOTSUPP | libc::EINVAL | libc::ENOSYS) => {
                        read_if_mapped(file, pos + done as u64, rest)
                    }
                    _ => Err(e),
                };
            }
        }
    }
    Ok(true)
}

/// [`read_if_cached`] where reads that do not wait are refused: the pages
/// checked with `mincore`, then read.
fn read_if_mapped(
    file: &std::fs::File,
    pos: u64,
    dst: &mut [MaybeUninit<u8>],
) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    if !cached(file, pos, dst.len()) {
        return Ok(false);
    }
    dst.fill(MaybeUninit::new(0));
    // SAFETY: every byte was just initialised; `MaybeUninit<u8>` and `u8`
    // have the same layout.
    let bytes = unsafe { &mut *(dst as *mut [MaybeUninit<u8>] as *mut [u8]) };
    file.read_exact_at(bytes, pos)?;
    Ok(true)
}
