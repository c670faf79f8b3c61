//! Forged length prefixes inside a spill file's payload.

use super::*;

// ---------------------------------------------------------------------------
// Forged length prefixes inside the payload (checksums recomputed, so the decoder
// itself must refuse them without trying to allocate what they claim)
// ---------------------------------------------------------------------------

/// Overwrites 8 payload bytes at `offset` with `value`, recomputes both
/// checksums, writes the file and returns the error.
fn forge<T>(
    path: &Path,
    bytes: &[u8],
    k: FileKey,
    original: &T,
    offset: usize,
    value: u64,
) -> String
where
    T: DeserializeOwned + PartialEq + Debug,
{
    let mut b = bytes.to_vec();
    let at = HEADER_LEN + offset;
    b[at..at + 8].copy_from_slice(&value.to_le_bytes());
    fix_sums(&mut b);
    std::fs::write(path, &b).unwrap();
    expect_err(
        path,
        k,
        original,
        &format!("payload offset {offset} forged to {value}"),
    )
}

#[test]
fn forged_pod_vec_element_count_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let v = pod_f32(1000);
    let k = key::<PodVec<f32>>(1, 1);
    let (path, bytes) = write_checked(dir.path(), "c.spill", k, &v);
    assert_eq!(u64_at(&bytes, HEADER_LEN + 8), 1000);

    // Far beyond the data: refused before any allocation (a terabyte
    // allocation attempt would abort the test process).
    for huge in [
        1u64 << 40,
        1 << 61,
        (1 << 62) + 1,
        u64::MAX / 4 + 1,
        u64::MAX,
    ] {
        let err = forge(&path, &bytes, k, &v, 8, huge);
        assert_mentions(&err, &["element count"], &format!("count {huge}"));
    }
    // Within the payload budget, but not what the chunks hold.
    for n in [1001u64, 1006, 999, 1, 0] {
        forge(&path, &bytes, k, &v, 8, n);
    }
    // f64 as well.
    let w = pod_f64(3000);
    let kw = key::<PodVec<f64>>(1, 1);
    let (path, bytes) = write_checked(dir.path(), "d.spill", kw, &w);
    for huge in [1u64 << 40, u64::MAX / 8 + 1, u64::MAX] {
        let err = forge(&path, &bytes, kw, &w, 8, huge);
        assert_mentions(&err, &["element count"], &format!("f64 count {huge}"));
    }
    forge(&path, &bytes, kw, &w, 8, 3001);
}

#[test]
fn forged_pod_vec_chunk_and_sequence_lengths_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let v = pod_f32(300_000);
    let k = key::<PodVec<f32>>(1, 1);
    let (path, bytes) = write_checked(dir.path(), "c.spill", k, &v);
    // The padding's length (offset 16), then the one chunk's length.
    let pad = u64_at(&bytes, HEADER_LEN + 16);
    assert!(pad > 0 && pad < 4096);
    for claim in [u64::MAX, 1 << 40, 4096] {
        let err = forge(&path, &bytes, k, &v, 16, claim);
        assert_mentions(&err, &["padding"], &format!("padding = {claim}"));
    }
    for claim in [0, pad - 1, pad + 1] {
        forge(&path, &bytes, k, &v, 16, claim);
    }
    let chunk_at = 24 + pad as usize;
    for claim in [u64::MAX, 1 << 40, 1_200_001, CHUNK as u64, 0, 1] {
        let err = forge(&path, &bytes, k, &v, chunk_at, claim);
        assert_mentions(&err, &["chunk length"], &format!("chunk = {claim}"));
    }
    // Sequence length (checksums recomputed): the raw-reader path does not rely
    // on it beyond the first element, so the decoder may accept it; whatever
    // happens, no other value may come back and nothing may panic.
    for claim in [u64::MAX, 1 << 40, 0] {
        let mut b = bytes.clone();
        b[HEADER_LEN..HEADER_LEN + 8].copy_from_slice(&claim.to_le_bytes());
        fix_sums(&mut b);
        std::fs::write(&path, &b).unwrap();
        if let Ok((back, _)) = read_file::<PodVec<f32>>(&path, k) {
            assert_eq!(back, v, "forged sequence length {claim} changed the value");
        }
    }
}

#[test]
fn forged_length_prefixes_in_a_struct_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let s = sample(200);
    let k = key::<Sample>(1, 1);
    let (path, bytes) = write_checked(dir.path(), "s.spill", k, &s);
    let name_len = s.name.len();
    assert_eq!(u64_at(&bytes, HEADER_LEN), name_len as u64);
    // `name` length, then `weights` length.
    let weights_at = 8 + name_len;
    assert_eq!(u64_at(&bytes, HEADER_LEN + weights_at), 200);
    for offset in [0, weights_at] {
        for claim in [u64::MAX, 1 << 40, 1 << 20, bytes.len() as u64] {
            forge(&path, &bytes, k, &s, offset, claim);
        }
    }
}
