//! Random damage to spill files, and fingerprints.

use super::*;

// ---------------------------------------------------------------------------
// Random damage
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Damage {
    /// XOR each (position, non-zero mask); positions index into the file.
    Xor(Vec<(prop::sample::Index, u8)>),
    /// Keep only this many bytes (strictly fewer than the file has).
    Truncate(prop::sample::Index),
    /// Append these bytes.
    Append(Vec<u8>),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        3 => prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..8)
            .prop_map(Damage::Xor),
        1 => any::<prop::sample::Index>().prop_map(Damage::Truncate),
        1 => prop::collection::vec(any::<u8>(), 1..16).prop_map(Damage::Append),
    ]
}

/// Applies `d` to `bytes`; returns whether the result is certainly invalid
/// by length alone.
fn apply(d: &Damage, bytes: &mut Vec<u8>) -> bool {
    match d {
        Damage::Xor(flips) => {
            let n = bytes.len();
            for (i, mask) in flips {
                bytes[i.index(n)] ^= mask;
            }
            false
        }
        Damage::Truncate(i) => {
            let keep = i.index(bytes.len());
            bytes.truncate(keep);
            true
        }
        Damage::Append(extra) => {
            bytes.extend_from_slice(extra);
            true
        }
    }
}

fn damaged_read<T>(value: &T, d: &Damage) -> std::result::Result<(), TestCaseError>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug + 'static,
{
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.spill");
    let k = key::<T>(11, 5);
    write_file(&path, k, value).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let original = bytes.clone();
    let by_length = apply(d, &mut bytes);
    std::fs::write(&path, &bytes).unwrap();
    // A panic inside read_file fails the case (proptest catches it).
    match read_file::<T>(&path, k) {
        Ok((back, len)) => {
            prop_assert!(!by_length, "length damage accepted");
            prop_assert_eq!(&back, value, "damaged file read back a different value");
            prop_assert_eq!(len, bytes.len() as u64);
            // Only possible if the XORs cancelled out.
            prop_assert_eq!(&bytes, &original);
        }
        Err(e) => prop_assert!(!e.to_string().is_empty()),
    }
    Ok(())
}

fn sample_strategy() -> impl Strategy<Value = Sample> {
    (
        "[a-zA-Z0-9 ]{0,24}",
        prop::collection::vec(-1e6f32..1e6, 0..200),
        prop::collection::vec(any::<u64>(), 0..100),
        prop::collection::hash_map("[a-z]{1,8}", any::<u32>(), 0..12),
        prop::option::of("\\PC{0,12}"),
        any::<Option<u64>>(),
        any::<u32>(),
        any::<bool>(),
    )
        .prop_map(
            |(name, weights, ids, index, note, missing, count, flag)| Sample {
                name,
                weights,
                ids,
                index,
                note,
                missing,
                count,
                flag,
            },
        )
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 200,
        // Do not write regression files into the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_damage_to_a_pod_vec_never_yields_another_value(
        data in prop::collection::vec(-1e9f32..1e9, 0..1024),
        d in damage(),
    ) {
        damaged_read(&PodVec::from(data), &d)?;
    }

    #[test]
    fn random_damage_to_a_pod_vec_f64_never_yields_another_value(
        data in prop::collection::vec(-1e9f64..1e9, 0..512),
        d in damage(),
    ) {
        damaged_read(&PodVec::from(data), &d)?;
    }

    #[test]
    fn random_damage_to_a_struct_never_yields_another_value(
        s in sample_strategy(),
        d in damage(),
    ) {
        damaged_read(&s, &d)?;
    }
}

// ---------------------------------------------------------------------------
// Fingerprints
// ---------------------------------------------------------------------------

#[test]
fn fingerprints_differ_between_types() {
    let prints = [
        ("u32", fingerprint::<u32>()),
        ("i32", fingerprint::<i32>()),
        ("f32", fingerprint::<f32>()),
        ("u64", fingerprint::<u64>()),
        ("f64", fingerprint::<f64>()),
        ("()", fingerprint::<()>()),
        ("String", fingerprint::<String>()),
        ("Vec<f32>", fingerprint::<Vec<f32>>()),
        ("Vec<f64>", fingerprint::<Vec<f64>>()),
        ("PodVec<f32>", fingerprint::<PodVec<f32>>()),
        ("PodVec<f64>", fingerprint::<PodVec<f64>>()),
        ("PodVec<u32>", fingerprint::<PodVec<u32>>()),
        ("Sample", fingerprint::<Sample>()),
        ("Mixed", fingerprint::<Mixed>()),
        ("Option<Sample>", fingerprint::<Option<Sample>>()),
        (
            "HashMap<String, u32>",
            fingerprint::<HashMap<String, u32>>(),
        ),
    ];
    for (i, (a, fa)) in prints.iter().enumerate() {
        for (b, fb) in &prints[i + 1..] {
            assert_ne!(fa, fb, "fingerprint of {a} equals that of {b}");
        }
    }
}

#[test]
fn fingerprints_are_stable() {
    fn all() -> [u64; 4] {
        [
            fingerprint::<Sample>(),
            fingerprint::<PodVec<f32>>(),
            fingerprint::<PodVec<f64>>(),
            fingerprint::<Vec<u64>>(),
        ]
    }
    let here = all();
    assert_eq!(here, all());
    let there = std::thread::spawn(all).join().unwrap();
    assert_eq!(here, there, "same fingerprints on another thread");
    // The FNV-1a definition: over the type name, then the size (u64 LE).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let name = std::any::type_name::<PodVec<f32>>();
    for b in name.bytes().chain(24u64.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    assert_eq!(
        std::mem::size_of::<PodVec<f32>>(),
        24,
        "test assumes a 64-bit Vec"
    );
    assert_eq!(fingerprint::<PodVec<f32>>(), h);
}

/// Pages of `path` in the page cache (mincore over a read-only mapping).
fn cached_pages(path: &Path) -> usize {
    use std::os::unix::io::AsRawFd;
    let f = File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let page = 4096;
    let pages = len.div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: a private read-only mapping of a file we keep open; unmapped
    // before returning, and only its residency is queried.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        assert_eq!(libc::mincore(p, len, vec.as_mut_ptr()), 0);
        libc::munmap(p, len);
    }
    vec.iter().filter(|&&b| b & 1 == 1).count()
}

/// Loading a spill file leaves none of it in the page cache (under a
/// memory cgroup those pages would count against the job's limit); a
/// plain read of the same file does leave it cached, which shows the
/// measurement can see cached pages.
#[test]
fn loads_leave_nothing_in_the_page_cache() {
    // Disk-backed, not tmpfs (whose pages cannot be dropped).
    let dir = tempfile::tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/target")).unwrap();
    let path = dir.path().join("e.spill");
    let v = PodVec((0..(4 << 20) / 4).map(|i| i as f32).collect::<Vec<f32>>());
    write_file(&path, key::<PodVec<f32>>(1, 1), &v).unwrap();
    File::open(&path).unwrap().sync_all().unwrap();
    let _ = std::fs::read(&path).unwrap();
    let before = cached_pages(&path);
    assert!(before > 0, "a plain read left nothing cached");
    let (back, _) = read_file::<PodVec<f32>>(&path, key::<PodVec<f32>>(1, 1)).unwrap();
    assert_eq!(back, v);
    let after = cached_pages(&path);
    assert!(
        after * 10 < before,
        "{after} of {before} pages still cached after the load"
    );
}
