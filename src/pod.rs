//! [`PodVec`]: a vector of plain numbers that spills at memory speed.
//!
//! A `Vec<f32>` goes through serde element by element; `PodVec<f32>`
//! serializes its contents as raw little-endian byte chunks of 1 MiB, and
//! loads them into one exact-size allocation (no doubling growth, so loading
//! a 256 MiB array never needs 512 MiB).

use std::cell::{Cell, RefCell};
use std::fmt;
use std::io::Read;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

mod sealed {
    pub trait Sealed {}
}

/// Plain numeric types: no padding, no pointers, every bit pattern valid.
/// Implemented for the primitive integer and float types only.
pub trait Plain: sealed::Sealed + Copy + Default + Send + Sync + 'static {}

macro_rules! plain {
    ($($t:ty)*) => {$(
        impl sealed::Sealed for $t {}
        impl Plain for $t {}
    )*};
}
plain!(u8 u16 u32 u64 i8 i16 i32 i64 f32 f64);

/// Bytes per chunk in the serialized form.
const CHUNK: usize = 1 << 20;

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
    /// A sequence: the element count (u64), then the data as byte chunks of
    /// at most 1 MiB. Multi-byte numbers are stored in the machine's byte
    /// order (spill files never leave the machine).
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let bytes = self.bytes();
        let chunks = bytes.len().div_ceil(CHUNK);
        let mut seq = s.serialize_seq(Some(1 + chunks))?;
        seq.serialize_element(&(self.0.len() as u64))?;
        for c in bytes.chunks(CHUNK) {
            seq.serialize_element(&BytesRef(c))?;
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
    static RAW: Cell<Option<*const RefCell<dyn Read>>> = const { Cell::new(None) };
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
    prev: Option<*const RefCell<dyn Read>>,
}

impl RawReader {
    /// Installs `r` for the calling thread until the guard drops. The guard
    /// must not outlive `r` (the spill loader keeps both in one scope).
    pub(crate) fn install<'a>(r: &'a RefCell<dyn Read + 'a>) -> RawReader {
        let ptr: *const RefCell<dyn Read + 'a> = r;
        // SAFETY: erasing the lifetime only (same pointer, same layout); the
        // guard is dropped before `r` goes out of scope (see
        // `spill::read_from`), and the pointer is only dereferenced while
        // the guard lives.
        let ptr: *const RefCell<dyn Read> = unsafe {
            std::mem::transmute::<*const RefCell<dyn Read + 'a>, *const RefCell<dyn Read>>(ptr)
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

/// Reads `n` plain elements straight from the installed raw reader, or
/// `None` when there is none.
fn read_raw<T: Plain>(n: usize) -> Option<std::io::Result<Vec<T>>> {
    let ptr = RAW.with(Cell::get)?;
    // SAFETY: the pointer was installed by `RawReader::install` from a live
    // reference whose guard is still alive (we are inside its decode call).
    let cell = unsafe { &*ptr };
    let Ok(mut r) = cell.try_borrow_mut() else {
        return Some(Err(std::io::Error::other("PodVec: reader busy")));
    };
    // A zeroed allocation: large ones come as fresh zero pages from the
    // allocator, so this costs no extra pass over memory.
    let mut v = vec![T::default(); n];
    let total = std::mem::size_of_val(v.as_slice());
    // SAFETY:
    // - the slice covers exactly the vector's `n` initialised elements;
    // - any bytes written into it form valid `T: Plain` values;
    // - the vector is not otherwise borrowed while the slice lives.
    let bytes = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), total) };
    for chunk in bytes.chunks_mut(CHUNK) {
        let mut len = [0u8; 8];
        if let Err(e) = r.read_exact(&mut len) {
            return Some(Err(e));
        }
        if u64::from_le_bytes(len) != chunk.len() as u64 {
            return Some(Err(std::io::Error::other("PodVec: chunk length mismatch")));
        }
        if let Err(e) = r.read_exact(chunk) {
            return Some(Err(e));
        }
    }
    Some(Ok(v))
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
        let elem = std::mem::size_of::<T>() as u64;
        let total = n
            .checked_mul(elem)
            .filter(|&t| t <= BUDGET.with(Cell::get) && t <= isize::MAX as u64)
            .ok_or_else(|| {
                de::Error::custom(format!(
                    "PodVec: element count {n} exceeds the data available"
                ))
            })?;
        let total = total as usize;
        // The sequence must hold exactly the chunks the count implies.
        let chunks = total.div_ceil(CHUNK);
        if seq.size_hint().is_some_and(|h| h != chunks) {
            return Err(de::Error::custom(
                "PodVec: chunk count does not match the element count",
            ));
        }
        if let Some(raw) = read_raw::<T>(n as usize) {
            return raw
                .map(PodVec)
                .map_err(|e| de::Error::custom(format!("PodVec: {e}")));
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
        // One chunk: the sequence holds 2 elements (count + chunk).
        assert_eq!(u64::from_le_bytes(bytes[0..8].try_into().unwrap()), 2);
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
