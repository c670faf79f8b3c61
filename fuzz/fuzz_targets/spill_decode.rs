//! Fuzzes the spill-file decoder. Two shapes of input, chosen by the first
//! byte: a whole file as is (header checks), or a fuzzed payload wrapped in
//! a valid header with correct checksums, so that the bounded bincode and
//! `PodVec` decoding itself is exercised. The properties: never a panic,
//! never an allocation beyond the limits (libFuzzer's -rss_limit_mb catches
//! it), and anything accepted survives its own re-encoding unchanged.
//!
//! ```text
//! cargo +nightly fuzz run spill_decode -- -max_total_time=600 -rss_limit_mb=512
//! ```
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use outcore::fuzzing::{decode_bytes, encode_bytes, fingerprint, FileKey, HEADER_LEN};
use outcore::{Checksum, PodVec};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct Exec {
    data: PodVec<f32>,
    ids: PodVec<u64>,
    tags: Vec<u32>,
    name: String,
    meta: Option<BTreeMap<String, i64>>,
    steps: u64,
}

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else { return };
    let key = FileKey { executor: 7, generation: 3, fingerprint: fingerprint::<Exec>() };
    let file: Vec<u8> = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        // A valid header around the fuzzed payload.
        let template = encode_bytes(key, &()).expect("header");
        let mut f = template[..HEADER_LEN].to_vec();
        f[40..48].copy_from_slice(&(rest.len() as u64).to_le_bytes());
        f[48..56].copy_from_slice(&Checksum::of(rest).to_le_bytes());
        let sum = Checksum::of(&f[0..56]);
        f[56..64].copy_from_slice(&sum.to_le_bytes());
        f.extend_from_slice(rest);
        f
    };
    if let Ok(v) = decode_bytes::<Exec>(&file, key) {
        // Whatever is accepted decodes to a value that survives its own
        // round trip (a map with repeated keys is accepted, as serde maps
        // are, so the bytes themselves need not be canonical).
        // Compared through their encodings: the floats may be NaN.
        let again = encode_bytes(key, &v).expect("re-encode");
        let w = decode_bytes::<Exec>(&again, key).expect("a re-encoded value must decode");
        assert_eq!(encode_bytes(key, &w).expect("re-encode"), again, "decode is not stable under re-encoding");
    }
});
