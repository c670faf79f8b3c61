//! Tests of the spill-file format: round trips, and detection of every kind
//! of damage (truncation, extension, bit flips, foreign / stale / mistyped
//! files, forged headers and forged length prefixes).

use super::*;

use std::collections::{BTreeSet, HashMap};
use std::fmt::{Debug, Display};
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::PodVec;

mod direct;
mod forged;
mod random;

/// Bytes per chunk of the `PodVec` encoding (`pod::CHUNK`).
const CHUNK: usize = 1 << 20;

/// An ordinary serde type exercising the usual containers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Sample {
    name: String,
    weights: Vec<f32>,
    ids: Vec<u64>,
    index: HashMap<String, u32>,
    note: Option<String>,
    missing: Option<u64>,
    count: u32,
    flag: bool,
}

fn sample(n: usize) -> Sample {
    Sample {
        name: format!("sample with {n} weights: ünïcødé ✓"),
        weights: (0..n).map(|i| (i as f32 * 0.37).sin()).collect(),
        ids: (0..n as u64 / 2)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect(),
        index: (0..n.min(40))
            .map(|i| (format!("key-{i}"), i as u32 * 7))
            .collect(),
        note: Some("a note".to_string()),
        missing: None,
        count: n as u32,
        flag: true,
    }
}

fn empty_sample() -> Sample {
    Sample {
        name: String::new(),
        weights: Vec::new(),
        ids: Vec::new(),
        index: HashMap::new(),
        note: None,
        missing: Some(u64::MAX),
        count: 0,
        flag: false,
    }
}

/// A struct mixing ordinary fields with a `PodVec` (the raw-reader hook must
/// hand the reader back to bincode at the right position).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Mixed {
    label: String,
    data: PodVec<f32>,
    more: PodVec<f64>,
    tail: Vec<u64>,
}

fn mixed(n: usize) -> Mixed {
    Mixed {
        label: "mixed".to_string(),
        data: PodVec::from((0..n).map(|i| i as f32 - 0.5).collect::<Vec<_>>()),
        more: PodVec::from((0..n / 3).map(|i| (i as f64).cos()).collect::<Vec<_>>()),
        tail: vec![1, 2, 3, u64::MAX],
    }
}

fn pod_f32(n: usize) -> PodVec<f32> {
    PodVec::from((0..n).map(|i| (i as f32 * 0.001).sin()).collect::<Vec<_>>())
}

fn pod_f64(n: usize) -> PodVec<f64> {
    PodVec::from(
        (0..n)
            .map(|i| (i as f64 * 0.01).cos() * 1e6)
            .collect::<Vec<_>>(),
    )
}

fn key<T: 'static>(executor: u64, generation: u64) -> FileKey {
    FileKey {
        executor,
        generation,
        fingerprint: fingerprint::<T>(),
    }
}

/// The payload as the spill writer lays it out.
fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    encode_payload(value).unwrap().0
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// Recomputes the header checksum (bytes 56..64 over 0..56).
fn fix_header_sum(b: &mut [u8]) {
    let sum = Checksum::of(&b[0..56]);
    b[56..64].copy_from_slice(&sum.to_le_bytes());
}

/// Recomputes the payload checksum (bytes 48..56) and then the header's.
fn fix_sums(b: &mut [u8]) {
    let sum = Checksum::of(&b[HEADER_LEN..]);
    b[48..56].copy_from_slice(&sum.to_le_bytes());
    fix_header_sum(b);
}

/// Writes `value` to `dir/name` and returns the path and the file's bytes,
/// after checking that the untouched file reads back equal (so the damage
/// tests below cannot pass for an unrelated reason).
fn write_checked<T>(dir: &Path, name: &str, k: FileKey, value: &T) -> (PathBuf, Vec<u8>)
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let path = dir.join(name);
    let len = write_file(&path, k, value).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(len, bytes.len() as u64);
    let (back, read_len) = read_file::<T>(&path, k).unwrap();
    assert_eq!(read_len, len);
    assert!(back == *value, "untouched file must read back equal");
    (path, bytes)
}

/// Reads `path`, which must be damaged: fails the test if `read_file`
/// panics or succeeds. Returns the error message.
fn expect_err<T>(path: &Path, k: FileKey, original: &T, what: &dyn Display) -> String
where
    T: DeserializeOwned + PartialEq + Debug,
{
    match catch_unwind(AssertUnwindSafe(|| read_file::<T>(path, k))) {
        Err(_) => panic!("{what}: read_file panicked"),
        Ok(Ok((v, _))) => panic!(
            "{what}: damaged file was accepted (value equal to the original: {})",
            v == *original
        ),
        Ok(Err(e)) => e.to_string(),
    }
}

fn assert_mentions(err: &str, words: &[&str], what: &dyn Display) {
    for w in words {
        assert!(
            err.contains(w),
            "{what}: error {err:?} should mention {w:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------

/// Writes, checks the file layout byte by byte, and reads back.
fn roundtrip<T>(value: &T) -> T
where
    T: Serialize + DeserializeOwned + PartialEq + Debug + 'static,
{
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rt.spill");
    let k = FileKey {
        executor: 42,
        generation: 7,
        fingerprint: fingerprint::<T>(),
    };
    let written = write_file(&path, k, value).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let payload = encode(value);

    // Lengths: returned, on disk, header + payload.
    assert_eq!(written, bytes.len() as u64);
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        written,
        "returned length is the file length"
    );
    assert_eq!(bytes.len(), HEADER_LEN + payload.len());

    // Header fields.
    assert_eq!(bytes[0..8], MAGIC);
    assert_eq!(u32_at(&bytes, 8), VERSION);
    assert_eq!(u32_at(&bytes, 12), 0, "flags");
    assert_eq!(u64_at(&bytes, 16), k.executor);
    assert_eq!(u64_at(&bytes, 24), k.generation);
    assert_eq!(u64_at(&bytes, 32), k.fingerprint);
    assert_eq!(u64_at(&bytes, 40), payload.len() as u64);
    assert_eq!(u64_at(&bytes, 48), Checksum::of(&payload));
    assert_eq!(u64_at(&bytes, 56), Checksum::of(&bytes[0..56]));
    // Payload: the bincode encoding, streamed unchanged.
    assert!(bytes[HEADER_LEN..] == payload[..], "payload differs");

    // Private file.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "spill files are private");

    let (back, read_len) = read_file::<T>(&path, k).unwrap();
    assert_eq!(read_len, written, "read returns the file length");
    assert!(back == *value, "value read back differs");
    back
}

#[test]
fn roundtrip_ordinary_types() {
    roundtrip(&sample(300));
    roundtrip(&sample(1));
    roundtrip(&empty_sample());
    roundtrip(&String::from("just a string"));
    roundtrip(&vec![1.5f32, -2.25, 0.0, f32::MAX, f32::MIN_POSITIVE]);
    roundtrip(&(0..10_000u64).collect::<Vec<_>>());
    roundtrip(&Some(vec![String::new(), "x".to_string()]));
    roundtrip(&None::<u32>);
    roundtrip(&0u8);
    // A zero-length payload.
    roundtrip(&());
}

#[test]
fn roundtrip_pod_vec() {
    let sizes_f32 = [
        0,
        1,
        3,
        CHUNK / 4 - 1,
        CHUNK / 4, // exactly one chunk
        CHUNK / 4 + 1,
        300_000, // two chunks (1.2 MB)
        700_000, // three chunks (2.8 MB)
    ];
    for n in sizes_f32 {
        let v = pod_f32(n);
        let back = roundtrip(&v);
        assert_eq!(back.len(), n);
        assert_eq!(back.capacity(), n, "loaded into one exact allocation");
    }
    for n in [0, 1, CHUNK / 8, CHUNK / 8 + 1, 400_000] {
        let v = pod_f64(n);
        let back = roundtrip(&v);
        assert_eq!(back.len(), n);
        assert_eq!(back.capacity(), n, "loaded into one exact allocation");
    }
    // Bit patterns survive exactly (no float normalisation).
    let odd = PodVec::from(vec![
        -0.0f64,
        f64::MIN_POSITIVE / 2.0,
        f64::INFINITY,
        -1e300,
    ]);
    let back = roundtrip(&odd);
    let bits = |v: &PodVec<f64>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&back), bits(&odd));
}

#[test]
fn roundtrip_mixed_struct() {
    roundtrip(&mixed(0));
    roundtrip(&mixed(10));
    // Both PodVecs span several chunks, and fields follow them.
    roundtrip(&mixed(600_000));
}

#[test]
fn pod_vec_payload_layout() {
    for n in [0usize, 5, CHUNK / 4 - 1, CHUNK / 4, 300_000, 700_000] {
        let v = pod_f32(n);
        let data = n * 4;
        // Outside spill files: no padding, 1 MiB chunks.
        let p = bincode::serde::encode_to_vec(&v, bincode_config()).unwrap();
        let chunks = data.div_ceil(CHUNK);
        assert_eq!(u64_at(&p, 0), 2 + chunks as u64, "seq length, n = {n}");
        assert_eq!(u64_at(&p, 8), n as u64, "element count, n = {n}");
        assert_eq!(u64_at(&p, 16), 0, "no padding, n = {n}");
        assert_eq!(p.len(), 24 + chunks * 8 + data, "n = {n}");
        if chunks > 0 {
            assert_eq!(u64_at(&p, 24), data.min(CHUNK) as u64, "first chunk length");
        }
        // In a spill file: from 1 MiB on, one chunk whose bytes start on a
        // 4 KiB boundary of the file.
        let p = encode(&v);
        let large = data >= CHUNK;
        let chunks = if large { 1 } else { chunks };
        assert_eq!(
            u64_at(&p, 0),
            2 + chunks as u64,
            "spill seq length, n = {n}"
        );
        assert_eq!(u64_at(&p, 8), n as u64, "spill element count, n = {n}");
        let pad = u64_at(&p, 16) as usize;
        assert!(pad < 4096 && p[24..24 + pad].iter().all(|&b| b == 0));
        assert_eq!(pad == 0, !large || (HEADER_LEN + 32) % 4096 == 0, "n = {n}");
        if large {
            assert_eq!(u64_at(&p, 24 + pad), data as u64, "one chunk, n = {n}");
            assert_eq!((HEADER_LEN + 32 + pad) % 4096, 0, "data on a page, n = {n}");
        }
        assert_eq!(p.len(), 24 + pad + chunks * 8 + data, "n = {n}");
    }
    // Both vectors of a struct are placed, whatever precedes them.
    let m = mixed(600_000);
    let p = encode(&m);
    let label = 8 + m.label.len();
    let pad = u64_at(&p, label + 16) as usize;
    assert_eq!((HEADER_LEN + label + 32 + pad) % 4096, 0);
    let more_at = label + 32 + pad + 600_000 * 4;
    let pad2 = u64_at(&p, more_at + 16) as usize;
    assert_eq!((HEADER_LEN + more_at + 32 + pad2) % 4096, 0);
}

#[test]
fn rewrite_replaces_a_larger_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.spill");
    let big = pod_f32(100_000);
    let small = pod_f32(10);
    write_file(&path, key::<PodVec<f32>>(1, 1), &big).unwrap();
    let len = write_file(&path, key::<PodVec<f32>>(1, 2), &small).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        len,
        "file truncated"
    );
    let (back, _) = read_file::<PodVec<f32>>(&path, key::<PodVec<f32>>(1, 2)).unwrap();
    assert_eq!(back, small);
}

#[test]
fn write_into_missing_directory_fails() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-dir").join("x.spill");
    let err = write_file(&path, key::<u32>(1, 1), &5u32)
        .unwrap_err()
        .to_string();
    assert!(err.contains("create"), "{err}");
}

// ---------------------------------------------------------------------------
// Length damage
// ---------------------------------------------------------------------------

fn check_truncations<T>(value: &T)
where
    T: Serialize + DeserializeOwned + PartialEq + Debug + 'static,
{
    let dir = tempfile::tempdir().unwrap();
    let k = key::<T>(3, 1);
    let (path, bytes) = write_checked(dir.path(), "t.spill", k, value);
    let n = bytes.len();
    assert!(n > HEADER_LEN + 1, "test needs a non-trivial payload");
    let mut lens = vec![
        0,
        1,
        8,
        HEADER_LEN / 2,
        HEADER_LEN - 1,
        HEADER_LEN,
        HEADER_LEN + 1,
        HEADER_LEN + (n - HEADER_LEN) / 2,
        n - 2,
        n - 1,
    ];
    lens.dedup();
    for len in lens {
        std::fs::write(&path, &bytes[..len]).unwrap();
        let what = format!("truncated to {len} of {n} bytes");
        let err = expect_err(&path, k, value, &what);
        if len < HEADER_LEN {
            assert_mentions(&err, &["truncated"], &what);
        } else {
            assert_mentions(&err, &["length mismatch"], &what);
        }
    }
}

#[test]
fn truncation_is_detected() {
    check_truncations(&sample(100));
    check_truncations(&pod_f32(300_000));
    check_truncations(&pod_f64(5));
    check_truncations(&mixed(1000));
}

#[test]
fn appended_bytes_are_detected() {
    let dir = tempfile::tempdir().unwrap();
    let v = pod_f32(1000);
    let k = key::<PodVec<f32>>(1, 1);
    let (path, bytes) = write_checked(dir.path(), "a.spill", k, &v);
    for extra in [
        &[0u8][..],
        &[0xff],
        &[0; 8],
        &bytes[HEADER_LEN..HEADER_LEN + 32],
    ] {
        let mut b = bytes.clone();
        b.extend_from_slice(extra);
        std::fs::write(&path, &b).unwrap();
        let what = format!("{} byte(s) appended", extra.len());
        let err = expect_err(&path, k, &v, &what);
        assert_mentions(&err, &["length mismatch"], &what);
    }

    let s = sample(50);
    let ks = key::<Sample>(1, 1);
    let (path, mut b) = write_checked(dir.path(), "s.spill", ks, &s);
    b.push(0);
    std::fs::write(&path, &b).unwrap();
    expect_err(&path, ks, &s, &"byte appended to a struct file");
}

fn check_counted_trailing_byte<T>(value: &T)
where
    T: Serialize + DeserializeOwned + PartialEq + Debug + 'static,
{
    // A byte appended *and* counted in the header (both checksums recomputed):
    // only the "every byte consumed" check can catch it.
    let dir = tempfile::tempdir().unwrap();
    let k = key::<T>(1, 1);
    let (path, mut b) = write_checked(dir.path(), "t.spill", k, value);
    b.push(0x5a);
    let plen = (b.len() - HEADER_LEN) as u64;
    b[40..48].copy_from_slice(&plen.to_le_bytes());
    fix_sums(&mut b);
    std::fs::write(&path, &b).unwrap();
    let what = std::any::type_name::<T>();
    let err = expect_err(&path, k, value, &what);
    assert_mentions(&err, &["trailing"], &what);
}

#[test]
fn trailing_bytes_covered_by_the_header_are_detected() {
    check_counted_trailing_byte(&pod_f32(1000));
    check_counted_trailing_byte(&pod_f64(0));
    check_counted_trailing_byte(&sample(20));
    check_counted_trailing_byte(&mixed(100));
}

/// Rewrites the payload length field (header checksum recomputed, so only the
/// length check can catch it) with each claim and expects a length error.
fn check_length_claims(claims: &[u64]) {
    let dir = tempfile::tempdir().unwrap();
    let v = pod_f64(1000);
    let k = key::<PodVec<f64>>(9, 4);
    let (path, bytes) = write_checked(dir.path(), "h.spill", k, &v);
    let real = (bytes.len() - HEADER_LEN) as u64;
    for &claim in claims {
        assert_ne!(claim, real);
        let mut b = bytes.clone();
        b[40..48].copy_from_slice(&claim.to_le_bytes());
        fix_header_sum(&mut b);
        std::fs::write(&path, &b).unwrap();
        let what = format!("payload length claimed as {claim}");
        let err = expect_err(&path, k, &v, &what);
        assert_mentions(&err, &["length mismatch"], &what);
    }
}

#[test]
fn huge_payload_length_in_header_is_rejected() {
    let real = 16 + 8 + 8000; // PodVec<f64> of 1000 elements
    check_length_claims(&[
        1 << 40,
        1 << 62,
        u64::MAX - HEADER_LEN as u64, // the largest claim that fits with the header
        real + 1,
        real - 1,
        0,
    ]);
}

#[test]
fn payload_length_near_u64_max_is_rejected_without_overflow() {
    // `HEADER_LEN + payload_len` does not fit in a u64 for these claims: the
    // check must not overflow (a panic in debug builds).
    check_length_claims(&[u64::MAX, u64::MAX - HEADER_LEN as u64 + 1]);
}

// ---------------------------------------------------------------------------
// Bit flips
// ---------------------------------------------------------------------------

/// Flips `mask` at each position of `positions` in place (restoring the byte
/// afterwards) and checks that every flip is rejected. `check` sees the
/// position and the error message.
fn check_flips<T>(
    path: &Path,
    k: FileKey,
    original: &T,
    bytes: &[u8],
    positions: impl IntoIterator<Item = (usize, u8)>,
    check: impl Fn(usize, &str),
) -> usize
where
    T: DeserializeOwned + PartialEq + Debug,
{
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let mut count = 0;
    for (pos, mask) in positions {
        assert_ne!(mask, 0);
        file.write_all_at(&[bytes[pos] ^ mask], pos as u64).unwrap();
        let what = format!("byte {pos} of {} xor {mask:#04x}", bytes.len());
        let err = expect_err(path, k, original, &what);
        check(pos, &err);
        file.write_all_at(&[bytes[pos]], pos as u64).unwrap();
        count += 1;
    }
    // Restored: the file is valid again (the flips above were the only
    // damage).
    let (back, _) = read_file::<T>(path, k).unwrap();
    assert!(back == *original);
    count
}

/// Every bit of every header byte.
fn header_flips() -> impl Iterator<Item = (usize, u8)> {
    (0..HEADER_LEN).flat_map(|pos| (0..8).map(move |bit| (pos, 1u8 << bit)))
}

fn check_header_message(pos: usize, err: &str) {
    let what = format!("header byte {pos}");
    if pos < 8 {
        assert_mentions(err, &["magic"], &what);
    } else {
        assert_mentions(err, &["header checksum"], &what);
    }
}

#[test]
fn header_bit_flips_are_detected() {
    let dir = tempfile::tempdir().unwrap();

    let s = sample(64);
    let ks = key::<Sample>(5, 3);
    let (path, bytes) = write_checked(dir.path(), "s.spill", ks, &s);
    let n = check_flips(&path, ks, &s, &bytes, header_flips(), check_header_message);
    assert_eq!(n, HEADER_LEN * 8);

    let v = pod_f32(300_000);
    let kv = key::<PodVec<f32>>(6, 1);
    let (path, bytes) = write_checked(dir.path(), "v.spill", kv, &v);
    check_flips(&path, kv, &v, &bytes, header_flips(), check_header_message);

    let e = PodVec::<f64>::new();
    let ke = key::<PodVec<f64>>(7, 1);
    let (path, bytes) = write_checked(dir.path(), "e.spill", ke, &e);
    check_flips(&path, ke, &e, &bytes, header_flips(), check_header_message);
}

#[test]
fn payload_bit_flips_in_a_struct_are_detected() {
    // Every payload byte, cycling through the bits.
    let dir = tempfile::tempdir().unwrap();
    let s = sample(64);
    let k = key::<Sample>(5, 3);
    let (path, bytes) = write_checked(dir.path(), "s.spill", k, &s);
    let positions: Vec<_> = (HEADER_LEN..bytes.len())
        .map(|p| (p, 1u8 << (p % 8)))
        .collect();
    assert!(positions.len() > 500);
    check_flips(&path, k, &s, &bytes, positions, |_, _| {});

    // Every bit of the first bytes (length prefixes of `name`, the start of
    // the string, ...), and full-byte inversions everywhere.
    let first: Vec<_> = (HEADER_LEN..HEADER_LEN + 24)
        .flat_map(|p| (0..8).map(move |b| (p, 1u8 << b)))
        .collect();
    check_flips(&path, k, &s, &bytes, first, |_, _| {});
    let inverted: Vec<_> = (HEADER_LEN..bytes.len()).map(|p| (p, 0xff)).collect();
    check_flips(&path, k, &s, &bytes, inverted, |_, _| {});
}

/// Payload positions worth flipping in a `PodVec` file: all the framing
/// (sequence length, element count, chunk lengths), the chunk boundaries,
/// the ends, and an even spread in between.
fn pod_positions(file_len: usize) -> Vec<(usize, u8)> {
    let payload = file_len - HEADER_LEN;
    let mut set = BTreeSet::new();
    for p in 0..48.min(payload) {
        set.insert(p);
    }
    // Second, third, ... chunk length prefixes and their neighbours.
    let mut boundary = 24 + CHUNK;
    while boundary + 8 < payload {
        for p in boundary.saturating_sub(4)..(boundary + 12).min(payload) {
            set.insert(p);
        }
        boundary += CHUNK + 8;
    }
    for p in payload.saturating_sub(16)..payload {
        set.insert(p);
    }
    for i in 0..64 {
        set.insert(i * payload / 64);
    }
    set.into_iter()
        .enumerate()
        .map(|(i, p)| (HEADER_LEN + p, 1u8 << (i % 8)))
        .collect()
}

#[test]
fn payload_bit_flips_in_a_pod_vec_are_detected() {
    let dir = tempfile::tempdir().unwrap();

    // Two chunks of f32.
    let v = pod_f32(300_000);
    let k = key::<PodVec<f32>>(2, 2);
    let (path, bytes) = write_checked(dir.path(), "v.spill", k, &v);
    let pos = pod_positions(bytes.len());
    assert!(pos.len() > 100);
    check_flips(&path, k, &v, &bytes, pos, |_, _| {});

    // Three chunks of f64, the last one partial.
    let w = pod_f64(300_000);
    let kw = key::<PodVec<f64>>(2, 3);
    let (path, bytes) = write_checked(dir.path(), "w.spill", kw, &w);
    check_flips(&path, kw, &w, &bytes, pod_positions(bytes.len()), |_, _| {});

    // Small ones: every bit of every payload byte.
    for (name, n) in [("empty", 0usize), ("one", 1), ("few", 7)] {
        let v = pod_f32(n);
        let k = key::<PodVec<f32>>(4, 1);
        let (path, bytes) = write_checked(dir.path(), name, k, &v);
        let all: Vec<_> = (HEADER_LEN..bytes.len())
            .flat_map(|p| (0..8).map(move |b| (p, 1u8 << b)))
            .collect();
        check_flips(&path, k, &v, &bytes, all, |_, _| {});
    }
}

#[test]
fn payload_bit_flips_in_a_mixed_struct_are_detected() {
    let dir = tempfile::tempdir().unwrap();
    let m = mixed(2000);
    let k = key::<Mixed>(8, 8);
    let (path, bytes) = write_checked(dir.path(), "m.spill", k, &m);
    let positions: Vec<_> = (HEADER_LEN..bytes.len())
        .step_by(7)
        .chain(bytes.len() - 40..bytes.len())
        .map(|p| (p, 1u8 << (p % 8)))
        .collect();
    check_flips(&path, k, &m, &bytes, positions, |_, _| {});
}

// ---------------------------------------------------------------------------
// Foreign, stale, mistyped and missing files
// ---------------------------------------------------------------------------

#[test]
fn another_executors_file_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let v = pod_f32(100);
    let k7 = key::<PodVec<f32>>(7, 1);
    let k8 = key::<PodVec<f32>>(8, 1);
    let (mine, _) = write_checked(dir.path(), "exec-7", k7, &v);
    let (theirs, _) = write_checked(dir.path(), "exec-8", k8, &pod_f32(100));
    std::fs::copy(&theirs, &mine).unwrap();
    let err = expect_err(&mine, k7, &v, &"file of executor 8");
    assert_mentions(&err, &["executor", "#8", "#7"], &"foreign file");
}

#[test]
fn stale_generation_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.spill");
    let old = sample(10);
    let new = sample(11);
    write_file(&path, key::<Sample>(1, 1), &old).unwrap();
    let stale = std::fs::read(&path).unwrap();

    // Generation 1 on disk, 2 expected.
    let err = expect_err(&path, key::<Sample>(1, 2), &old, &"generation 1 read as 2");
    assert_mentions(&err, &["stale", "generation 1", "2 expected"], &"stale");

    // A newer write, then the old file put back in its place.
    write_file(&path, key::<Sample>(1, 2), &new).unwrap();
    assert_eq!(
        read_file::<Sample>(&path, key::<Sample>(1, 2)).unwrap().0,
        new
    );
    std::fs::write(&path, &stale).unwrap();
    let err = expect_err(&path, key::<Sample>(1, 2), &new, &"old file restored");
    assert_mentions(&err, &["stale"], &"old file restored");

    // A generation from the future is no better.
    write_file(&path, key::<Sample>(1, 3), &new).unwrap();
    let err = expect_err(&path, key::<Sample>(1, 2), &new, &"generation 3 read as 2");
    assert_mentions(&err, &["stale"], &"newer generation");
}

#[test]
fn wrong_type_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.spill");
    let v = pod_f32(256);
    write_file(&path, key::<PodVec<f32>>(1, 1), &v).unwrap();

    let what = "PodVec<f32> read as PodVec<f64>";
    let err = expect_err(&path, key::<PodVec<f64>>(1, 1), &pod_f64(128), &what);
    assert_mentions(&err, &["different type"], &what);

    let what = "PodVec<f32> read as Vec<f32>";
    let err = expect_err(&path, key::<Vec<f32>>(1, 1), &v.0, &what);
    assert_mentions(&err, &["different type"], &what);

    let s = sample(3);
    write_file(&path, key::<Sample>(1, 1), &s).unwrap();
    let what = "Sample read as Mixed";
    let err = expect_err(&path, key::<Mixed>(1, 1), &mixed(1), &what);
    assert_mentions(&err, &["different type"], &what);
}

#[test]
fn deleted_file_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let k = key::<Sample>(1, 1);
    let s = sample(5);
    let (path, _) = write_checked(dir.path(), "d.spill", k, &s);
    std::fs::remove_file(&path).unwrap();
    let err = expect_err(&path, k, &s, &"deleted file");
    assert_mentions(&err, &["open"], &"deleted file");
}

#[test]
fn bad_magic_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let k = key::<PodVec<f32>>(1, 1);
    let v = pod_f32(10);
    let (path, bytes) = write_checked(dir.path(), "m.spill", k, &v);
    for (i, bad) in [
        *b"OUTCORE1",
        *b"outcore\0",
        [0; 8],
        *b"\x7fELF\x02\x01\x01\0",
    ]
    .into_iter()
    .enumerate()
    {
        let mut b = bytes.clone();
        b[0..8].copy_from_slice(&bad);
        fix_header_sum(&mut b);
        std::fs::write(&path, &b).unwrap();
        let what = format!("magic #{i}");
        let err = expect_err(&path, k, &v, &what);
        assert_mentions(&err, &["bad magic"], &what);
    }
    // Not a spill file at all.
    std::fs::write(&path, vec![b'x'; 4096]).unwrap();
    let err = expect_err(&path, k, &v, &"text file");
    assert_mentions(&err, &["magic"], &"text file");
}

#[test]
fn bad_version_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let k = key::<Sample>(1, 1);
    let s = sample(10);
    let (path, bytes) = write_checked(dir.path(), "v.spill", k, &s);
    for version in [0u32, VERSION + 1, u32::MAX] {
        let mut b = bytes.clone();
        b[8..12].copy_from_slice(&version.to_le_bytes());
        fix_header_sum(&mut b);
        std::fs::write(&path, &b).unwrap();
        let what = format!("version {version}");
        let err = expect_err(&path, k, &s, &what);
        assert_mentions(&err, &["version", &version.to_string()], &what);
    }
}

/// A file an older outcore wrote carries its own header layout, so its
/// checksum does not match this version's: it is reported by its version,
/// not only as a damaged header.
#[test]
fn older_version_is_reported_by_version() {
    let dir = tempfile::tempdir().unwrap();
    let k = key::<Sample>(1, 1);
    let s = sample(10);
    let (path, bytes) = write_checked(dir.path(), "old.spill", k, &s);
    for version in 1..VERSION {
        let mut b = bytes.clone();
        b[8..12].copy_from_slice(&version.to_le_bytes());
        // An older header: the checksum is not where this version keeps it.
        b[56..64].fill(0xA5);
        std::fs::write(&path, &b).unwrap();
        let what = format!("older version {version}");
        let err = expect_err(&path, k, &s, &what);
        assert_mentions(&err, &["version", &version.to_string(), "older"], &what);
    }
}

#[test]
fn unknown_flags_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let k = key::<Sample>(1, 1);
    let s = sample(10);
    let (path, bytes) = write_checked(dir.path(), "f.spill", k, &s);
    for flags in [1u32, 0x8000_0000] {
        let mut b = bytes.clone();
        b[12..16].copy_from_slice(&flags.to_le_bytes());
        fix_header_sum(&mut b);
        std::fs::write(&path, &b).unwrap();
        let what = format!("flags {flags:#x}");
        let err = expect_err(&path, k, &s, &what);
        assert_mentions(&err, &["flags", &format!("{flags:#x}")], &what);
    }
}
