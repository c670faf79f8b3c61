//! [`Checksum`]: a 64-bit checksum that runs at the speed of memory.

use std::mem::MaybeUninit;

/// Bytes per stripe: eight 64-bit lanes.
const STRIPE: usize = 64;

/// Lane keys.
const KEYS: [u64; 8] = [
    0x9E37_79B1_85EB_CA87,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0x85EB_CA77_C2B2_AE63,
    0x27D4_EB2F_1656_67C5,
    0x94D0_49BB_1331_11EB,
    0xBF58_476D_1CE4_E5B9,
    0xD6E8_FEB8_6659_FD93,
];

/// Multiplier of a stripe's index into its salt.
const SALT: u64 = 0x9E37_79B9_7F4A_7C15;

/// How far ahead of its stripe the vector code asks the CPU for the
/// source's lines. Data that a direct read (DMA) has just written is in
/// memory, not in the cache, and the hardware prefetcher alone leaves the
/// sum waiting on memory: on an AMD EPYC VM (one core reads memory at
/// 15 GB/s there), the sum of 1 GiB not in the cache ran at 9.8-10.7 GB/s
/// without this, 12.0-13.2 GB/s with it (10.8-11.2 at 2 KiB ahead,
/// 12.2-12.8 at 8 KiB).
const FETCH_AHEAD: usize = 4 << 10;

/// A 64-bit checksum of a stream of bytes, fed in pieces of any size.
///
/// The runtime verifies every spill file it loads with it; a
/// [`Lineage`](crate::Lineage) that re-reads a file can use it to check that
/// the bytes are those of the first read. It is a checksum, not a
/// cryptographic hash: it tells data that changed by accident (a damaged
/// or rewritten file, words changed or moved, a length that differs) from
/// the original, and is no defence against deliberate collisions.
///
/// The bytes are taken as eight 64-bit lanes per 64-byte stripe; each
/// lane's word is added to its neighbour's sum, and the product of its two
/// halves (keyed by lane and by the stripe's position) to its own, and
/// the eight sums are folded into one with the length. A changed word
/// changes two lane sums, and stripes that trade places change the
/// products; accidental damage then goes unnoticed with a chance of about
/// 2^-64. Unlike CRC-32 it guarantees nothing for a particular pattern of
/// damage (CRC-32 catches every error confined to 32 bits). With AVX2 it runs at the speed memory delivers the bytes (13-14 GB/s on
/// one core of an AMD EPYC, where CRC-32 runs at 11), and the result is the
/// same on every CPU and however the stream is split.
///
/// ```
/// use outcore::Checksum;
///
/// let data = vec![7u8; 10_000];
/// let mut sum = Checksum::new();
/// sum.update(&data[..123]);
/// sum.update(&data[123..]);
/// assert_eq!(sum.finish(), Checksum::of(&data));
///
/// let mut changed = data.clone();
/// changed[5_000] ^= 1;
/// assert_ne!(Checksum::of(&changed), Checksum::of(&data));
/// ```
#[derive(Clone, Debug)]
pub struct Checksum {
    /// Lane sums.
    acc: [u64; 8],
    /// Whole stripes summed into `acc`.
    stripes: u64,
    /// The stripe in progress: its first `part_len` bytes.
    part: [u8; STRIPE],
    part_len: usize,
}

impl Default for Checksum {
    fn default() -> Self {
        Checksum::new()
    }
}

impl Checksum {
    /// The checksum of no bytes yet.
    pub fn new() -> Checksum {
        Checksum {
            acc: [0; 8],
            stripes: 0,
            part: [0; STRIPE],
            part_len: 0,
        }
    }

    /// The checksum of `bytes`.
    pub fn of(bytes: &[u8]) -> u64 {
        let mut c = Checksum::new();
        c.update(bytes);
        c.finish()
    }

    /// Adds `bytes` to the stream.
    pub fn update(&mut self, bytes: &[u8]) {
        self.feed(bytes, None);
    }

    /// Adds `src` to the stream and copies it to `dst` in the same pass
    /// (one read of `src` instead of two). Where `dst`'s whole 64-byte
    /// stripes of the stream start 32-byte aligned (as they do for an
    /// aligned `dst` when the stream so far is a multiple of 64 bytes
    /// long), the copy's stores bypass the cache, for data that is used
    /// later, not now; they are complete when the call returns.
    ///
    /// # Panics
    ///
    /// If `dst` and `src` differ in length.
    pub fn update_copy(&mut self, src: &[u8], dst: &mut [MaybeUninit<u8>]) {
        assert_eq!(
            src.len(),
            dst.len(),
            "Checksum::update_copy: source and destination lengths differ"
        );
        self.feed(src, Some(dst));
    }

    /// Bytes added so far.
    pub fn len(&self) -> u64 {
        self.stripes * STRIPE as u64 + self.part_len as u64
    }

    /// Whether no byte has been added.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The checksum of the bytes added so far (the stream may go on).
    pub fn finish(&self) -> u64 {
        let mut acc = self.acc;
        if self.part_len > 0 {
            let mut s = [0u8; STRIPE];
            s[..self.part_len].copy_from_slice(&self.part[..self.part_len]);
            stripe_sum(&mut acc, self.stripes, &s);
        }
        acc.iter().fold(self.len(), |h, &a| {
            (h ^ a).wrapping_mul(0x9E37_79B1_85EB_CA87).rotate_left(29)
        })
    }

    fn feed(&mut self, mut src: &[u8], mut dst: Option<&mut [MaybeUninit<u8>]>) {
        if self.part_len > 0 {
            let take = (STRIPE - self.part_len).min(src.len());
            let (head, rest) = src.split_at(take);
            self.part[self.part_len..self.part_len + take].copy_from_slice(head);
            self.part_len += take;
            dst = dst.map(|d| {
                let (out, more) = d.split_at_mut(take);
                copy_out(head, out);
                more
            });
            src = rest;
            if self.part_len < STRIPE {
                return;
            }
            let whole = self.part;
            stripe_sum(&mut self.acc, self.stripes, &whole);
            self.stripes += 1;
            self.part_len = 0;
        }
        let whole = src.len() / STRIPE * STRIPE;
        let (body, tail) = src.split_at(whole);
        let (body_out, tail_out) = match dst {
            Some(d) => {
                let (a, b) = d.split_at_mut(whole);
                (Some(a), Some(b))
            }
            None => (None, None),
        };
        if whole > 0 {
            stripes(&mut self.acc, self.stripes, body, body_out);
            self.stripes += (whole / STRIPE) as u64;
        }
        self.part[..tail.len()].copy_from_slice(tail);
        self.part_len = tail.len();
        if let Some(out) = tail_out {
            copy_out(tail, out);
        }
    }
}

/// Copies `src` into `out` (the same length).
fn copy_out(src: &[u8], out: &mut [MaybeUninit<u8>]) {
    for (o, &b) in out.iter_mut().zip(src) {
        o.write(b);
    }
}

/// Adds whole stripes (`src.len()` is a multiple of [`STRIPE`]), the first
/// of them stripe number `first` of the stream, copying them to `dst`
/// (as long as `src`) when given.
fn stripes(acc: &mut [u64; 8], first: u64, src: &[u8], dst: Option<&mut [MaybeUninit<u8>]>) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        unsafe { stripes_avx2(acc, first, src, dst) };
        return;
    }
    stripes_portable(acc, first, src, dst);
}

/// Adds stripe number `j` (`s`) into the lane sums.
#[inline(always)]
fn stripe_sum(acc: &mut [u64; 8], j: u64, s: &[u8; STRIPE]) {
    let salt = j.wrapping_mul(SALT);
    let mut x = [0u64; 8];
    for (l, w) in x.iter_mut().enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(&s[8 * l..8 * l + 8]);
        *w = u64::from_le_bytes(b);
    }
    for l in 0..8 {
        let k = x[l] ^ KEYS[l] ^ salt;
        acc[l ^ 1] = acc[l ^ 1].wrapping_add(x[l]);
        acc[l] = acc[l].wrapping_add((k & 0xffff_ffff).wrapping_mul(k >> 32));
    }
}

/// [`stripes`] one stripe at a time, on any CPU.
fn stripes_portable(
    acc: &mut [u64; 8],
    first: u64,
    src: &[u8],
    mut dst: Option<&mut [MaybeUninit<u8>]>,
) {
    for (j, s) in src.chunks_exact(STRIPE).enumerate() {
        let mut a = [0u8; STRIPE];
        a.copy_from_slice(s);
        stripe_sum(acc, first + j as u64, &a);
        if let Some(d) = dst.as_deref_mut() {
            copy_out(s, &mut d[STRIPE * j..STRIPE * (j + 1)]);
        }
    }
}

/// What four lanes `x` (keyed by `keys`) of a stripe with `salt` add to
/// the lane sums: each word to its neighbour's (lanes 0<->1, 2<->3), and
/// the product of the two halves of the keyed word to its own. (A macro,
/// for the crate's minimum Rust version, 1.85: there AVX2 intrinsics are
/// unsafe to call even where AVX2 is enabled, and since 1.87 an `unsafe`
/// block around only them is flagged as unneeded.)
#[cfg(target_arch = "x86_64")]
macro_rules! mix {
    ($x:expr, $keys:expr, $salt:expr) => {{
        let x = $x;
        let k = _mm256_xor_si256(_mm256_xor_si256(x, $keys), $salt);
        let neighbour = _mm256_shuffle_epi32(x, 0b01_00_11_10);
        _mm256_add_epi64(neighbour, _mm256_mul_epu32(k, _mm256_srli_epi64(k, 32)))
    }};
}

/// [`stripes`] with AVX2: the same operations on two vectors of four
/// lanes, so the same result. Two stripes per step, into two pairs of
/// sums (added at the end: the lanes' sums do not depend on the order),
/// so that consecutive stripes do not wait on each other.
///
/// # Safety
///
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stripes_avx2(
    acc: &mut [u64; 8],
    first: u64,
    src: &[u8],
    dst: Option<&mut [MaybeUninit<u8>]>,
) {
    use std::arch::x86_64::*;
    let out = dst.map(|d| d[..src.len()].as_mut_ptr().cast::<u8>());
    let stream = out.is_some_and(|p| (p as usize) % 32 == 0);
    let n = src.len() / STRIPE;
    // SAFETY: AVX2 is enabled here (the caller's promise). `KEYS` and
    // `acc` hold 8 u64 (64 bytes) each: unaligned loads and stores. Each
    // `take` is of a stripe `j < n`, within `src` and `out` (which is as
    // long as `src`, does not overlap it, being borrowed mutably, and is
    // 32-byte aligned when `stream`).
    unsafe {
        let keys0 = _mm256_loadu_si256(KEYS.as_ptr().cast());
        let keys1 = _mm256_loadu_si256(KEYS.as_ptr().add(4).cast());
        let mut a0 = _mm256_loadu_si256(acc.as_ptr().cast());
        let mut a1 = _mm256_loadu_si256(acc.as_ptr().add(4).cast());
        let (mut b0, mut b1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        // The salt of stripe `j` is `j * SALT`: stepped by additions.
        let mut salt = _mm256_set1_epi64x(first.wrapping_mul(SALT) as i64);
        let step = _mm256_set1_epi64x(SALT as i64);
        let mut j = 0;
        while j + 2 <= n {
            let x0 = take(src, out, stream, j, 0);
            let x1 = take(src, out, stream, j, 32);
            let y0 = take(src, out, stream, j + 1, 0);
            let y1 = take(src, out, stream, j + 1, 32);
            let next = _mm256_add_epi64(salt, step);
            a0 = _mm256_add_epi64(a0, mix!(x0, keys0, salt));
            a1 = _mm256_add_epi64(a1, mix!(x1, keys1, salt));
            b0 = _mm256_add_epi64(b0, mix!(y0, keys0, next));
            b1 = _mm256_add_epi64(b1, mix!(y1, keys1, next));
            salt = _mm256_add_epi64(next, step);
            j += 2;
        }
        if j < n {
            let x0 = take(src, out, stream, j, 0);
            let x1 = take(src, out, stream, j, 32);
            a0 = _mm256_add_epi64(a0, mix!(x0, keys0, salt));
            a1 = _mm256_add_epi64(a1, mix!(x1, keys1, salt));
        }
        if stream {
            // Streamed stores are weakly ordered: complete them before the
            // bytes are handed to another thread.
            _mm_sfence();
        }
        _mm256_storeu_si256(acc.as_mut_ptr().cast(), _mm256_add_epi64(a0, b0));
        _mm256_storeu_si256(acc.as_mut_ptr().add(4).cast(), _mm256_add_epi64(a1, b1));
    }
}

/// Loads the 32 bytes at `half` (0 or 32) of stripe `j` of `src`, copies
/// them to the same place of `out` if given (streamed if `stream`), and
/// asks for the line [`FETCH_AHEAD`] bytes ahead.
///
/// # Safety
///
/// The CPU must support AVX2; stripe `j` lies within `src`; `out`, if
/// given, holds `src.len()` writable bytes that do not overlap `src`, and
/// is 32-byte aligned if `stream`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn take(
    src: &[u8],
    out: Option<*mut u8>,
    stream: bool,
    j: usize,
    half: usize,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let at = STRIPE * j + half;
    // SAFETY: the prefetch reads nothing the program can observe and
    // cannot fault, and its address is inside `src`. `at + 32 <=
    // src.len()` (stripe `j` lies within `src`): an unaligned load. `o +
    // at .. o + at + 32` is writable and does not overlap `src`; the
    // aligned store is used only when `stream`, and then `o` is 32-byte
    // aligned and `at` a multiple of 32 (all the caller's promises).
    unsafe {
        if half == 0 && at + FETCH_AHEAD < src.len() {
            _mm_prefetch::<_MM_HINT_T0>(src.as_ptr().add(at + FETCH_AHEAD).cast());
        }
        let x = _mm256_loadu_si256(src.as_ptr().add(at).cast());
        if let Some(o) = out {
            if stream {
                _mm256_stream_si256(o.add(at).cast(), x);
            } else {
                _mm256_storeu_si256(o.add(at).cast(), x);
            }
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, seed: u32) -> Vec<u8> {
        (0..n as u32)
            .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    }

    /// The portable code alone, in one piece.
    fn portable(b: &[u8]) -> u64 {
        let mut c = Checksum::new();
        let whole = b.len() / STRIPE * STRIPE;
        stripes_portable(&mut c.acc, 0, &b[..whole], None);
        c.stripes = (whole / STRIPE) as u64;
        c.part[..b.len() - whole].copy_from_slice(&b[whole..]);
        c.part_len = b.len() - whole;
        c.finish()
    }

    fn init(o: &[MaybeUninit<u8>]) -> Vec<u8> {
        // SAFETY: every byte of `o` was written by the copy under test.
        o.iter().map(|b| unsafe { b.assume_init() }).collect()
    }

    #[test]
    fn any_split_of_the_stream_gives_the_portable_codes_sum() {
        let data = bytes(3 * 8192 + 37, 1);
        let want = portable(&data);
        assert_eq!(Checksum::of(&data), want);
        for cuts in [
            vec![1],
            vec![63, 64, 65],
            vec![100, 4096, 4097],
            vec![8192, 16384],
            vec![5, 6, 7, 200, 8000, 20000],
        ] {
            let mut c = Checksum::new();
            let mut copy = vec![MaybeUninit::new(0u8); data.len()];
            let mut from = 0;
            for (i, &to) in cuts.iter().chain([data.len()].iter()).enumerate() {
                if i % 2 == 0 {
                    c.update_copy(&data[from..to], &mut copy[from..to]);
                } else {
                    c.update(&data[from..to]);
                    copy_out(&data[from..to], &mut copy[from..to]);
                }
                from = to;
            }
            assert_eq!(c.len(), data.len() as u64);
            assert_eq!(c.finish(), want, "cuts {cuts:?}");
            assert!(init(&copy) == data, "copy, cuts {cuts:?}");
        }
    }

    #[test]
    fn copies_land_exactly_at_any_alignment() {
        let data = bytes(8192 + 37, 2);
        let want = portable(&data);
        // A 32-byte aligned destination takes streamed stores.
        let mut room = vec![MaybeUninit::new(0u8); data.len() + 96];
        let base = room.as_ptr().align_offset(32);
        for at in [base, base + 1, base + 32, base + 8] {
            let out = &mut room[at..at + data.len()];
            let mut c = Checksum::new();
            c.update_copy(&data, out);
            assert_eq!(c.finish(), want, "at {at}");
            assert!(init(out) == data, "at {at}");
        }
    }

    #[test]
    fn changed_moved_and_cut_bytes_change_the_sum() {
        let data = bytes(8192 + 37, 3);
        let base = Checksum::of(&data);
        // Any one word changed, in any position, tail included.
        for w in 0..data.len().div_ceil(8) {
            let mut b = data.clone();
            b[8 * w] ^= 0x40;
            assert_ne!(Checksum::of(&b), base, "word {w}");
        }
        // Two stripes trading places.
        let mut b = data.clone();
        let (x, y) = b.split_at_mut(64);
        x.swap_with_slice(&mut y[..64]);
        assert_ne!(Checksum::of(&b), base);
        // A byte more or less, and zeros appended.
        assert_ne!(Checksum::of(&data[..data.len() - 1]), base);
        let mut longer = data.clone();
        longer.extend_from_slice(&[0; 27]);
        assert_ne!(Checksum::of(&longer), base);
        // The empty stream.
        assert!(Checksum::new().is_empty());
        assert_ne!(Checksum::of(&[]), Checksum::of(&[0]));
    }
}
