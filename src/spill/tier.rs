//! Spill tiers: places for evicted executors' images besides the spill
//! directory, such as another process's spare memory.
//!
//! A tier stores the same image a spill file holds (the checked header,
//! then the bincode payload), so a load from a tier makes every check a
//! load from disk makes: the executor, the generation, the type's
//! fingerprint, the lengths, the checksums and the bounded decode. A tier
//! that fails, or hands back other bytes, costs a read from the disk or
//! a rebuild from the lineage, never a wrong value.

use std::io::{self, Read, Seek, SeekFrom, Write};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{encode_payload_into, read_from, FileKey, Header, HEADER_LEN};

/// What names an executor's image in a [`SpillTier`]: the runtime, the
/// executor's id and the generation of the copy (a new one whenever the
/// value changed). Keys are unique within a process, so one tier may
/// serve several runtimes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TierKey {
    /// The runtime's identity, unique in the process (never reused).
    pub runtime: u64,
    /// The executor's id (as [`Handle::id`](crate::Handle::id) gives it).
    pub executor: u64,
    /// The copy's generation.
    pub generation: u64,
}

/// The first [`TIER_HEAD_LEN`] bytes of an image, which its writer knows
/// only once the rest is written (they hold its length and checksum).
pub type TierHead = [u8; TIER_HEAD_LEN];

/// The length of a [`TierHead`].
pub const TIER_HEAD_LEN: usize = HEADER_LEN;

/// A place for evicted executors besides the spill directory, installed
/// with [`Builder::spill_tier`](crate::Builder::spill_tier): another
/// rank's spare memory, say, where the interconnect is faster than the
/// disk.
///
/// The runtime uses a tier for the evictions it makes to make room (for
/// a load, a prefetch or [`Runtime::evict_all`](crate::Runtime::evict_all)),
/// never inside the allocation trap: there, the disk stays the only
/// place. What the tier holds is never the only copy of a value: an
/// executor changed since its last write goes to the disk first, and one
/// whose copy is its [`Lineage`](crate::Lineage) can be rebuilt. So a tier
/// may forget an image at any time (to give its memory back), and fail
/// any call: the load then reads the disk or rebuilds, and the runtime
/// notes it in [`Stats::tier_fallbacks`](crate::Stats::tier_fallbacks)
/// and, once, in [`Stats::warnings`](crate::Stats::warnings).
///
/// Calls come from the runtime's worker and prefetch threads, several at
/// a time, never with a runtime lock held.
///
/// A tier in the same process's memory, as a sketch:
///
/// ```
/// use std::collections::HashMap;
/// use std::io::{self, Read, Write};
/// use std::sync::{Arc, Mutex};
/// use outcore::{Runtime, SpillTier, TierHead, TierKey};
/// # #[global_allocator]
/// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
///
/// #[derive(Default)]
/// struct Beside(Mutex<HashMap<TierKey, Vec<u8>>>);
///
/// impl SpillTier for Beside {
///     fn name(&self) -> String {
///         "memory beside".into()
///     }
///     fn room(&self) -> u64 {
///         64 << 20
///     }
///     fn put(
///         &self,
///         key: TierKey,
///         _len: u64,
///         write: &mut dyn FnMut(&mut dyn Write) -> io::Result<TierHead>,
///     ) -> io::Result<bool> {
///         let mut body = Vec::new();
///         let head = write(&mut body)?;
///         let image = [&head[..], &body[..]].concat();
///         self.0.lock().unwrap().insert(key, image);
///         Ok(true)
///     }
///     fn get(
///         &self,
///         key: TierKey,
///         read: &mut dyn FnMut(&mut dyn Read, u64) -> io::Result<()>,
///     ) -> io::Result<()> {
///         let image = self.0.lock().unwrap().get(&key).cloned();
///         let image = image.ok_or_else(|| io::Error::other("not held"))?;
///         read(&mut &image[..], image.len() as u64)
///     }
///     fn remove(&self, key: TierKey) {
///         self.0.lock().unwrap().remove(&key);
///     }
/// }
///
/// let tier = Arc::new(Beside::default());
/// let rt = Runtime::builder().spill_tier(tier.clone()).build()?;
/// let h = rt.insert(vec![7u8; 1 << 20])?;
/// rt.evict_all()?;
/// assert_eq!(tier.0.lock().unwrap().len(), 1);
/// assert_eq!(rt.read(&h, |v: &Vec<u8>| v[0])?, 7);
/// assert_eq!(rt.stats().tier_bytes_loaded, rt.stats().tier_bytes_sent);
/// # Ok::<(), outcore::Error>(())
/// ```
pub trait SpillTier: Send + Sync + 'static {
    /// What it is, for [`Stats::warnings`](crate::Stats::warnings): "rank
    /// 3's memory".
    fn name(&self) -> String;

    /// The bytes it would take now (0: none). Asked before each
    /// [`put`](SpillTier::put); a put may still decline.
    fn room(&self) -> u64;

    /// Stores an image under `key`. `write` writes the image's body into
    /// the writer it is given, in pieces of up to 1 MiB as the value is
    /// encoded (about `len` bytes in all), and returns its head: the
    /// image is the head, then the body. `Ok(false)`: declined (no room),
    /// nothing kept. On an error from `write`, nothing is kept and the
    /// error is returned.
    fn put(
        &self,
        key: TierKey,
        len: u64,
        write: &mut dyn FnMut(&mut dyn Write) -> io::Result<TierHead>,
    ) -> io::Result<bool>;

    /// Hands the image stored under `key` to `read`, with its length in
    /// bytes: a reader of the head, then the body. An error when it is
    /// not held: [`NotFound`](io::ErrorKind::NotFound) when it was
    /// forgotten (counted in
    /// [`Stats::tier_fallbacks`](crate::Stats::tier_fallbacks), without a
    /// warning), another kind when the tier failed (gone, broken).
    fn get(
        &self,
        key: TierKey,
        read: &mut dyn FnMut(&mut dyn Read, u64) -> io::Result<()>,
    ) -> io::Result<()>;

    /// Forgets `key`: the executor changed, or is gone. Never fails (a
    /// key it does not hold is no error).
    fn remove(&self, key: TierKey);
}

/// Memory the process holds for others that it gives back before the
/// runtime evicts its own executors, installed with
/// [`Builder::reclaim`](crate::Builder::reclaim): the images a rank keeps
/// for other ranks (the other side of a [`SpillTier`]), a cache.
///
/// The runtime calls [`reclaim`](Reclaim::reclaim) when it must make
/// room (for a load, a prefetch or an inserted executor) and what is in
/// use would go over its eviction target: first this, then its own
/// victims. Never from inside the allocation trap, never with a runtime
/// lock held; a panic is caught and counts as nothing freed.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use outcore::{MemoryCap, Reclaim, Runtime, State};
/// # #[global_allocator]
/// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
///
/// /// A cache of buffers, emptied first when the runtime needs room.
/// #[derive(Default)]
/// struct Cache(Mutex<Vec<Vec<u8>>>);
///
/// impl Reclaim for Cache {
///     fn reclaim(&self, bytes: u64) -> u64 {
///         let mut held = self.0.lock().unwrap();
///         let mut freed = 0;
///         while freed < bytes {
///             let Some(b) = held.pop() else { break };
///             freed += b.capacity() as u64;
///         }
///         freed
///     }
/// }
///
/// let cache = Arc::new(Cache::default());
/// cache.0.lock().unwrap().push(vec![1u8; 48 << 20]);
/// let rt = Runtime::builder()
///     .mem_cap(MemoryCap::parse("64MiB")?)
///     .reclaim(cache.clone())
///     .build()?;
/// let a = rt.insert(vec![2u8; 8 << 20])?;
/// // Room for 16 MiB more: the cache goes, not `a`.
/// assert!(rt.make_room(16 << 20));
/// let _b = rt.insert(vec![3u8; 16 << 20])?;
/// assert!(cache.0.lock().unwrap().is_empty());
/// assert_eq!((a.state(), rt.stats().evictions), (State::Resident, 0));
/// assert!(rt.stats().reclaimed_bytes >= 48 << 20);
/// # Ok::<(), outcore::Error>(())
/// ```
pub trait Reclaim: Send + Sync + 'static {
    /// Frees at least `bytes` where it holds that much (all it holds
    /// where not), and returns the bytes freed.
    fn reclaim(&self, bytes: u64) -> u64;
}

impl TierKey {
    /// The key of runtime `runtime`'s copy `k`.
    pub(crate) fn of(runtime: u64, k: FileKey) -> TierKey {
        TierKey {
            runtime,
            executor: k.executor,
            generation: k.generation,
        }
    }
}

/// Encodes `value` as the image `key` names into `tier`: the image's
/// length, or `None` when the tier declined it. An error from the value's
/// encoding or from the tier is returned as it is.
pub(crate) fn put_value<T: Serialize>(
    tier: &dyn SpillTier,
    runtime: u64,
    key: FileKey,
    len: u64,
    value: &T,
) -> io::Result<Option<u64>> {
    let mut written = 0u64;
    let mut write = |w: &mut dyn Write| -> io::Result<TierHead> {
        let tee = encode_payload_into(Pieces::new(w), value).map_err(|e| match e {
            bincode::error::EncodeError::Io { inner, .. } => inner,
            other => super::ValueFailed::error(format!("encode: {other}")),
        })?;
        let header = Header {
            key,
            payload_len: tee.sum.len(),
            payload_sum: tee.sum.finish(),
        };
        let mut pieces = tee.inner;
        pieces.flush()?;
        written = HEADER_LEN as u64 + header.payload_len;
        Ok(header.encode())
    };
    let kept = tier.put(TierKey::of(runtime, key), len, &mut write)?;
    Ok(kept.then_some(written))
}

/// Reads the image `key` names from `tier` and decodes it, with every
/// check of a spill file's load: the value and the image's length.
pub(crate) fn get_value<T: DeserializeOwned>(
    tier: &dyn SpillTier,
    runtime: u64,
    key: FileKey,
) -> io::Result<(T, u64)> {
    let mut got: Option<(T, u64)> = None;
    let mut read = |r: &mut dyn Read, len: u64| -> io::Result<()> {
        let reader = io::BufReader::with_capacity(super::READ_BUF, Forward(r));
        let (v, _) = read_from(reader, len, key, None)
            .map_err(|m| io::Error::new(io::ErrorKind::InvalidData, m))?;
        got = Some((v, len));
        Ok(())
    };
    tier.get(TierKey::of(runtime, key), &mut read)?;
    got.ok_or_else(|| io::Error::other("the tier handed back no image"))
}

/// A writer that gathers small writes into pieces of [`PIECE`] bytes
/// before passing them on (a tier that sends each write as a message
/// would otherwise send the encoder's 8-byte length prefixes one by one).
struct Pieces<'w> {
    inner: &'w mut dyn Write,
    buf: Vec<u8>,
}

/// The size of the pieces a tier is given.
const PIECE: usize = 1 << 20;

impl<'w> Pieces<'w> {
    fn new(inner: &'w mut dyn Write) -> Pieces<'w> {
        Pieces {
            inner,
            buf: Vec::new(),
        }
    }
}

impl Write for Pieces<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if self.buf.is_empty() && b.len() >= PIECE {
            // A large slice (a vector's bytes) goes as it is.
            return self.inner.write(b);
        }
        if self.buf.len() + b.len() > PIECE {
            self.flush_buf()?;
            if b.len() >= PIECE {
                return self.inner.write(b);
            }
        }
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(PIECE);
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_buf()?;
        self.inner.flush()
    }
}

impl Pieces<'_> {
    fn flush_buf(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.inner.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }
}

/// A reader the decoder may ask to seek: a tier's image is read from
/// start to end (seeking is only asked for with direct I/O, which a
/// tier's load does not use), so a seek is an error.
struct Forward<'r>(&'r mut dyn Read);

impl Read for Forward<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Seek for Forward<'_> {
    fn seek(&mut self, _: SeekFrom) -> io::Result<u64> {
        Err(io::Error::other("a tier's image is read in order"))
    }
}
