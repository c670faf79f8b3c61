//! [`PodVec`]: a vector of plain numbers that spills at memory speed.
//!
//! A `Vec<f32>` goes through serde element by element; `PodVec<f32>`
//! serializes its contents as raw byte chunks, and loads them into one
//! exact-size allocation (no doubling growth, so loading a 256 MiB array
//! never needs 512 MiB).
//!
//! In a spill file a large `PodVec`'s bytes are one chunk that starts on a
//! 4 KiB boundary of the file, and the allocator starts large blocks on a
//! page: the spill loader reads them from the disk straight into the
//! vector's memory with direct I/O (no page cache, no copy, no zeroing).

use std::cell::{Cell, RefCell};
use std::fmt;
use std::io::Read;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Plain data: a [`PodVec`] of it is saved and loaded as its bytes.
/// Implemented for the primitive integers and floats and for arrays of
/// them; implement it for a struct of your own as bytemuck's `Pod` is:
///
/// ```
/// use outcore::{Plain, PodVec};
///
/// /// An edge of a graph: two node ids.
/// #[repr(C)]
/// #[derive(Clone, Copy, Default, Debug, PartialEq)]
/// struct Edge {
///     src: u32,
///     dst: u32,
/// }
/// // SAFETY: `repr(C)`, two `u32` fields and no padding (8 bytes, the sum
/// // of the fields); any bit pattern is a valid `Edge`.
/// unsafe impl Plain for Edge {}
///
/// let edges = PodVec::from(vec![Edge { src: 0, dst: 1 }, Edge { src: 1, dst: 0 }]);
/// assert_eq!(edges[1].src, 1);
/// ```
///
/// # Safety
///
/// The bytes of a `T` are read as they are in memory and written back into
/// a `T` from a spill file, so `T` must:
///
/// - be `#[repr(C)]` or `#[repr(transparent)]` (a struct) or an array, all
///   of whose fields are `Plain`;
/// - have no padding: its size is the sum of its fields' sizes (a `u8`
///   beside a `u32` leaves three padding bytes: add the bytes as a field);
/// - accept every bit pattern as a valid value: no `bool`, `char`, enum,
///   reference, pointer, `NonZero*` or niche-carrying field;
/// - not be zero-sized.
pub unsafe trait Plain: Copy + Default + Send + Sync + 'static {}

macro_rules! plain {
    ($($t:ty)*) => {$(
        // SAFETY: primitive numbers: no padding, every bit pattern valid,
        // not zero-sized.
        unsafe impl Plain for $t {}
    )*};
}
plain!(u8 u16 u32 u64 i8 i16 i32 i64 f32 f64);

// SAFETY: an array has no padding between its elements, which are `Plain`;
// a zero-length array is refused where a `PodVec` uses its size (see
// `elem_size`).
unsafe impl<T: Plain, const N: usize> Plain for [T; N] where [T; N]: Default {}

/// The size of a `T`, refused at compile time when it is zero.
const fn elem_size<T: Plain>() -> usize {
    let n = std::mem::size_of::<T>();
    assert!(n > 0, "a Plain type must not be zero-sized");
    n
}

/// Bytes per chunk in the serialized form outside spill files.
const CHUNK: usize = 1 << 20;

/// From this many bytes on, a `PodVec`'s bytes are placed on a page of the
/// spill file and loaded with direct I/O.
pub(crate) const DIRECT_FROM: usize = 1 << 20;

/// Alignment of a large `PodVec`'s bytes in a spill file.
const FILE_ALIGN: u64 = crate::alloc::PAGE as u64;

/// Zeros for the padding element.
static PAD: [u8; FILE_ALIGN as usize] = [0; FILE_ALIGN as usize];

/// A `Vec<T>` of plain numbers with a bulk serde path.
///
/// ```
/// use outcore::PodVec;
/// let mut v = PodVec::from(vec![1.0f32, 2.0, 3.0]);
/// v.push(4.0);
/// assert_eq!(v.iter().sum::<f32>(), 10.0);
/// ```
#[derive(Clone, Default, PartialEq)]
pub struct PodVec<T: Plain>(pub Vec<T>);

impl<T: Plain> PodVec<T> {
    /// An empty vector.
    pub fn new() -> Self {
        PodVec(Vec::new())
    }

    /// The inner `Vec`.
    pub fn into_inner(self) -> Vec<T> {
        self.0
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY:
        // - `T: Plain` types have no padding, so every byte is initialised;
        // - the slice covers exactly the vector's initialised elements;
        // - u8 has alignment 1, and the borrow keeps the vector alive.
        unsafe {
            std::slice::from_raw_parts(
                self.0.as_ptr().cast::<u8>(),
                std::mem::size_of_val(self.0.as_slice()),
            )
        }
    }
}

impl<T: Plain> From<Vec<T>> for PodVec<T> {
    fn from(v: Vec<T>) -> Self {
        PodVec(v)
    }
}

impl<T: Plain> Deref for PodVec<T> {
    type Target = Vec<T>;
    fn deref(&self) -> &Vec<T> {
        &self.0
    }
}

impl<T: Plain> DerefMut for PodVec<T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        &mut self.0
    }
}

impl<T: Plain + fmt::Debug> fmt::Debug for PodVec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: Plain> Serialize for PodVec<T> {
    /// A sequence: the element count (u64), a padding byte string, then the
    /// data as byte strings. Multi-byte numbers are stored in the machine's
    /// byte order (spill files never leave the machine).
    ///
    /// Written to a spill file, a vector of 1 MiB or more is one byte
    /// string, padded so that its bytes start on a 4 KiB boundary of the
    /// file; elsewhere the padding is empty and the data comes in 1 MiB
    /// chunks.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let _ = const { elem_size::<T>() };
        let bytes = self.bytes();
        let aligned = bytes.len() >= DIRECT_FROM && write_pos().is_some();
        let chunks = if aligned {
            1
        } else {
            bytes.len().div_ceil(CHUNK)
        };
        let mut seq = s.serialize_seq(Some(2 + chunks))?;
        seq.serialize_element(&(self.0.len() as u64))?;
        // The padding and the data's byte string each start with a u64
        // length: pad so that the data's first byte lands on the boundary.
        let pad = match write_pos() {
            Some(pos) if aligned => ((FILE_ALIGN - (pos + 16) % FILE_ALIGN) % FILE_ALIGN) as usize,
            _ => 0,
        };
        seq.serialize_element(&BytesRef(&PAD[..pad]))?;
        if aligned {
            seq.serialize_element(&BytesRef(bytes))?;
        } else {
            for c in bytes.chunks(CHUNK) {
                seq.serialize_element(&BytesRef(c))?;
            }
        }
        seq.end()
    }
}

/// Serializes a byte slice with `serialize_bytes`.
struct BytesRef<'a>(&'a [u8]);

impl Serialize for BytesRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

thread_local! {
    /// Upper bound on the bytes a [`PodVec`] being decoded on this thread may
    /// claim (set by the spill loader to the payload length).
    static BUDGET: Cell<u64> = const { Cell::new(u64::MAX) };
    /// The spill loader's reader, shared with the bincode decoder, so a
    /// `PodVec` can read its chunks straight into place (see [`RawReader`]).
    static RAW: Cell<Option<*const RefCell<dyn RawRead>>> = const { Cell::new(None) };
    /// While the spill writer encodes on this thread: the file offset the
    /// next byte goes to.
    static WRITE_POS: Cell<Option<u64>> = const { Cell::new(None) };
}

/// The file offset of the next byte the spill writer writes on this thread,
/// if it is writing.
fn write_pos() -> Option<u64> {
    WRITE_POS.with(Cell::get)
}

/// Tells [`PodVec`] where in the spill file its bytes land, for the
/// lifetime of the guard.
pub(crate) struct WritePos(Option<u64>);

impl WritePos {
    /// The encoder's next byte goes to file offset `start`.
    pub(crate) fn install(start: u64) -> WritePos {
        WritePos(WRITE_POS.with(|c| c.replace(Some(start))))
    }

    /// `n` more bytes went to the file.
    pub(crate) fn advance(n: u64) {
        WRITE_POS.with(|c| {
            if let Some(p) = c.get() {
                c.set(Some(p + n));
            }
        });
    }
}

impl Drop for WritePos {
    fn drop(&mut self) {
        WRITE_POS.with(|c| c.set(self.0));
    }
}

/// The spill loader's reader, as [`PodVec`] sees it.
pub(crate) trait RawRead: Read {
    /// Reads a prefix of the next `len` bytes of the stream straight into
    /// `dst`, bypassing buffers (direct I/O), and returns how many bytes it
    /// read: 0 when it cannot (no direct descriptor, `dst` or the file
    /// position not on a page boundary, a filesystem that refuses direct
    /// I/O). The caller reads the rest with [`Read`].
    ///
    /// # Safety
    ///
    /// `dst` is valid for writes of `len` bytes, and nothing else reads or
    /// writes that memory during the call.
    unsafe fn read_direct(&mut self, _dst: *mut u8, _len: usize) -> std::io::Result<usize> {
        Ok(0)
    }
}

/// Lets [`PodVec`] read its byte chunks directly from the spill file while
/// bincode decodes the rest of the value.
///
/// This is sound because bincode's `IoReader` does not buffer: the position
/// of the shared reader is exactly where bincode stopped, and the chunk
/// framing (a `u64` little-endian length, then the bytes) is what bincode
/// writes for `serialize_bytes` with the spill store's fixed-int
/// configuration. Both the decoder and the hook reach the reader through the
/// same `RefCell`, never at the same time.
pub(crate) struct RawReader {
    prev: Option<*const RefCell<dyn RawRead>>,
}

impl RawReader {
    /// Installs `r` for the calling thread until the guard drops. The guard
    /// must not outlive `r` (the spill loader keeps both in one scope).
    pub(crate) fn install<'a>(r: &'a RefCell<dyn RawRead + 'a>) -> RawReader {
        let ptr: *const RefCell<dyn RawRead + 'a> = r;
        // SAFETY: erasing the lifetime only (same pointer, same layout); the
        // guard is dropped before `r` goes out of scope (see
        // `spill::read_from`), and the pointer is only dereferenced while
        // the guard lives.
        let ptr: *const RefCell<dyn RawRead> = unsafe {
            std::mem::transmute::<*const RefCell<dyn RawRead + 'a>, *const RefCell<dyn RawRead>>(
                ptr,
            )
        };
        RawReader {
            prev: RAW.with(|c| c.replace(Some(ptr))),
        }
    }
}

impl Drop for RawReader {
    fn drop(&mut self) {
        RAW.with(|c| c.set(self.prev));
    }
}

/// Asks for transparent huge pages over the whole 2 MiB pages of
/// `base..base + len`: memory the process has not touched yet faults in
/// 2 MiB at a time instead of 4 KiB (on a virtual machine, each first touch
/// of a small page is costly). Advice only.
fn huge_pages(base: *mut u8, len: usize) {
    const HUGE: usize = 2 << 20;
    let start = (base as usize).next_multiple_of(HUGE);
    let end = (base as usize + len) & !(HUGE - 1);
    if end > start {
        // SAFETY: the range lies inside the allocation the caller owns;
        // advice changes neither its contents nor its validity.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}

/// Reads one byte string's `u64` length prefix.
fn read_len(r: &mut dyn RawRead) -> std::io::Result<u64> {
    let mut len = [0u8; 8];
    r.read_exact(&mut len)?;
    Ok(u64::from_le_bytes(len))
}

/// Reads the padding element and the `chunks` data chunks of `n` plain
/// elements straight from the installed raw reader, or `None` when there
/// is none.
fn read_raw<T: Plain>(n: usize, chunks: usize) -> Option<std::io::Result<Vec<T>>> {
    let ptr = RAW.with(Cell::get)?;
    // SAFETY: the pointer was installed by `RawReader::install` from a live
    // reference whose guard is still alive (we are inside its decode call).
    let cell = unsafe { &*ptr };
    let Ok(mut r) = cell.try_borrow_mut() else {
        return Some(Err(std::io::Error::other("PodVec: reader busy")));
    };
    Some(read_raw_from(&mut *r, n, chunks))
}

fn read_raw_from<T: Plain>(
    r: &mut dyn RawRead,
    n: usize,
    chunks: usize,
) -> std::io::Result<Vec<T>> {
    let bad = |m: &str| std::io::Error::other(m.to_string());
    let pad = read_len(r)?;
    if pad >= FILE_ALIGN {
        return Err(bad("padding longer than a page"));
    }
    let mut skip = [0u8; FILE_ALIGN as usize];
    r.read_exact(&mut skip[..pad as usize])?;
    // Uninitialised: every byte is written below before the length is set,
    // by the kernel (direct I/O) or by zeroing then reading.
    let mut v: Vec<T> = Vec::with_capacity(n);
    let total = n * std::mem::size_of::<T>();
    let base = v.as_mut_ptr().cast::<u8>();
    huge_pages(base, total);
    let mut filled = 0usize;
    for i in 0..chunks {
        let want = if i + 1 == chunks {
            total - filled
        } else {
            CHUNK.min(total - filled)
        };
        if read_len(r)? != want as u64 {
            return Err(bad("chunk length mismatch"));
        }
        // SAFETY: `filled + want <= total`, the vector's capacity in bytes,
        // and the vector is not otherwise borrowed.
        let dst = unsafe { base.add(filled) };
        let direct = if want >= DIRECT_FROM {
            // SAFETY: `dst` is valid for `want` bytes (above) and only this
            // call touches them.
            unsafe { r.read_direct(dst, want)? }
        } else {
            0
        };
        let rest = want - direct;
        // SAFETY: the last `rest` bytes of the chunk lie in the capacity;
        // they are zeroed first, so the slice is initialised, and any bytes
        // read into it form valid `T: Plain` values.
        let tail = unsafe {
            let p = dst.add(direct);
            std::ptr::write_bytes(p, 0, rest);
            std::slice::from_raw_parts_mut(p, rest)
        };
        r.read_exact(tail)?;
        filled += want;
    }
    if filled != total {
        return Err(bad("data ends early"));
    }
    // SAFETY: all `total` bytes of the first `n` elements were written
    // above, and any bit pattern is a valid `T: Plain`.
    unsafe { v.set_len(n) };
    Ok(v)
}

/// Sets this thread's decode budget for the lifetime of the guard.
pub(crate) struct DecodeBudget(u64);

impl DecodeBudget {
    pub(crate) fn set(bytes: u64) -> DecodeBudget {
        DecodeBudget(BUDGET.with(|b| b.replace(bytes)))
    }
}

impl Drop for DecodeBudget {
    fn drop(&mut self) {
        BUDGET.with(|b| b.set(self.0));
    }
}

impl<'de, T: Plain> Deserialize<'de> for PodVec<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_seq(PodVisitor(PhantomData))
    }
}

struct PodVisitor<T>(PhantomData<T>);

impl<'de, T: Plain> Visitor<'de> for PodVisitor<T> {
    type Value = PodVec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a PodVec: an element count then byte chunks")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let n: u64 = seq
            .next_element()?
            .ok_or_else(|| de::Error::custom("PodVec: missing element count"))?;
        let elem = const { elem_size::<T>() } as u64;
        let total = n
            .checked_mul(elem)
            .filter(|&t| t <= BUDGET.with(Cell::get) && t <= isize::MAX as u64)
            .ok_or_else(|| {
                de::Error::custom(format!(
                    "PodVec: element count {n} exceeds the data available"
                ))
            })?;
        let total = total as usize;
        // What is left: the padding, then either one chunk of everything
        // (spill files) or chunks of 1 MiB.
        let chunks = match seq.size_hint() {
            Some(h) if h >= 1 && (h - 1 == total.div_ceil(CHUNK) || (h == 2 && total > 0)) => h - 1,
            _ => {
                return Err(de::Error::custom(
                    "PodVec: chunk count does not match the element count",
                ))
            }
        };
        if let Some(raw) = read_raw::<T>(n as usize, chunks) {
            return raw
                .map(PodVec)
                .map_err(|e| de::Error::custom(format!("PodVec: {e}")));
        }
        match seq.next_element_seed(Padding)? {
            Some(()) => {}
            None => return Err(de::Error::custom("PodVec: missing padding")),
        }
        let mut v: Vec<T> = Vec::with_capacity(n as usize);
        let mut filled = 0usize;
        while filled < total {
            let dst = ChunkInto {
                vec: &mut v,
                filled,
            };
            match seq.next_element_seed(dst)? {
                Some(got) => filled += got,
                None => return Err(de::Error::custom("PodVec: data ends early")),
            }
            if filled > total {
                return Err(de::Error::custom(
                    "PodVec: more data than the element count",
                ));
            }
        }
        // SAFETY:
        // - capacity is `n` elements, reserved above;
        // - `filled == total == n * size_of::<T>()` bytes were copied into
        //   the buffer by `ChunkInto`, so all `n` elements are initialised;
        // - any bit pattern is a valid `T: Plain`.
        unsafe { v.set_len(n as usize) };
        Ok(PodVec(v))
    }
}

/// The padding element: bytes that are skipped.
struct Padding;

impl<'de> DeserializeSeed<'de> for Padding {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_bytes(self)
    }
}

impl<'de> Visitor<'de> for Padding {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("padding bytes")
    }

    fn visit_bytes<E: de::Error>(self, b: &[u8]) -> Result<(), E> {
        if b.len() as u64 >= FILE_ALIGN {
            return Err(E::custom("PodVec: padding longer than a page"));
        }
        Ok(())
    }

    fn visit_byte_buf<E: de::Error>(self, b: Vec<u8>) -> Result<(), E> {
        self.visit_bytes(&b)
    }
}

/// Copies one byte chunk into the spare capacity of the vector.
struct ChunkInto<'a, T> {
    vec: &'a mut Vec<T>,
    filled: usize,
}

impl<'de, T: Plain> DeserializeSeed<'de> for ChunkInto<'_, T> {
    type Value = usize;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        d.deserialize_byte_buf(self)
    }
}

impl<'de, T: Plain> Visitor<'de> for ChunkInto<'_, T> {
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a byte chunk")
    }

    fn visit_bytes<E: de::Error>(self, b: &[u8]) -> Result<usize, E> {
        let cap_bytes = self.vec.capacity() * std::mem::size_of::<T>();
        if self.filled + b.len() > cap_bytes {
            return Err(E::custom("PodVec: more data than the element count"));
        }
        // SAFETY:
        // - the destination range `filled..filled + b.len()` lies within the
        //   vector's allocation (checked against its capacity above);
        // - source and destination are distinct allocations;
        // - writing bytes into spare capacity of a `Plain` vector is sound.
        unsafe {
            let dst = self.vec.as_mut_ptr().cast::<u8>().add(self.filled);
            std::ptr::copy_nonoverlapping(b.as_ptr(), dst, b.len());
        }
        Ok(b.len())
    }

    fn visit_byte_buf<E: de::Error>(self, b: Vec<u8>) -> Result<usize, E> {
        self.visit_bytes(&b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip<T: Plain + PartialEq + fmt::Debug>(v: Vec<T>) {
        let p = PodVec(v);
        let cfg = crate::spill::bincode_config();
        let bytes = bincode::serde::encode_to_vec(&p, cfg).unwrap();
        let (q, used): (PodVec<T>, usize) = bincode::serde::decode_from_slice(&bytes, cfg).unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(p.0, q.0);
        assert_eq!(q.capacity(), q.len(), "loaded with one exact allocation");
    }

    #[test]
    fn roundtrips() {
        // Smaller under Miri (still more than one 1 MiB chunk for u8).
        let big = if cfg!(miri) { (1 << 20) + 3 } else { 3_000_001 };
        roundtrip::<f32>(vec![]);
        roundtrip::<f32>((0..10).map(|i| i as f32 * 0.5).collect());
        roundtrip::<f64>((0..big / 8).map(|i| (i as f64).sin()).collect());
        roundtrip::<u8>((0..big).map(|i| i as u8).collect());
        roundtrip::<i64>(vec![i64::MIN, -1, 0, i64::MAX]);
    }

    #[test]
    fn rejects_a_sequence_length_that_disagrees_with_the_count() {
        let p = PodVec(vec![1.0f32; 1000]);
        let cfg = crate::spill::bincode_config();
        let mut bytes = bincode::serde::encode_to_vec(&p, cfg).unwrap();
        // One chunk: the sequence holds 3 elements (count, padding, chunk).
        assert_eq!(u64::from_le_bytes(bytes[0..8].try_into().unwrap()), 3);
        bytes[0..8].copy_from_slice(&5u64.to_le_bytes());
        let r: Result<(PodVec<f32>, usize), _> = bincode::serde::decode_from_slice(&bytes, cfg);
        assert!(r.is_err());
    }

    #[test]
    fn rejects_a_count_beyond_the_budget() {
        let p = PodVec(vec![1.0f32; 1000]);
        let cfg = crate::spill::bincode_config();
        let mut bytes = bincode::serde::encode_to_vec(&p, cfg).unwrap();
        // The element count follows the u64 sequence length.
        bytes[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let _b = DecodeBudget::set(bytes.len() as u64);
        let r: Result<(PodVec<f32>, usize), _> = bincode::serde::decode_from_slice(&bytes, cfg);
        assert!(r.is_err());
    }
}
