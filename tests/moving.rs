//! Moving executors between runtimes as bytes (`Handle::into_bytes`,
//! `Runtime::insert_bytes`), and the signal a scheduler reads to decide
//! whether the data fits (`Runtime::footprint`, `Stats::evicted_bytes`,
//! `Stats::loaded_bytes`).

mod common;

use outcore::{Error, Handle, MemoryCap, PodVec, Runtime, State};
use serde::{Deserialize, Serialize};

const MIB: usize = 1 << 20;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Block {
    first: u64,
    values: PodVec<f32>,
    names: Vec<String>,
}

fn block(first: u64, n: usize) -> Block {
    Block {
        first,
        values: PodVec::from(
            (0..n)
                .map(|i| (first as usize + i) as f32 * 0.5)
                .collect::<Vec<_>>(),
        ),
        names: vec![format!("block {first}"), "x".repeat(first as usize % 7)],
    }
}

fn capped(cap: &str) -> Runtime {
    Runtime::builder()
        .mem_cap(MemoryCap::parse(cap).unwrap())
        .workers(1)
        .prefetch(false)
        .build()
        .unwrap()
}

#[test]
fn a_moved_executor_has_the_same_value_and_leaves_its_source() {
    let a = Runtime::builder().workers(1).build().unwrap();
    let b = Runtime::builder().workers(1).build().unwrap();
    let keep = a.insert(block(0, 1000)).unwrap();
    let h = a.insert(block(7, 300_000)).unwrap();
    assert_eq!(a.footprint().executors, 2);
    let bytes = h.into_bytes().unwrap();
    assert_eq!(a.footprint().executors, 1, "the moved executor left a");
    let moved = b.insert_bytes::<Block>(Some("moved"), &bytes).unwrap();
    assert_eq!(b.footprint().executors, 1);
    assert_eq!(b.read(&moved, Clone::clone).unwrap(), block(7, 300_000));
    assert_eq!(a.read(&keep, |v| v.first).unwrap(), 0);
    // Moved again, back: the same bytes.
    let again = moved.into_bytes().unwrap();
    assert_eq!(again, bytes);
}

#[test]
fn an_evicted_executor_moves_from_its_spill_file() {
    let a = capped("64MiB");
    let b = capped("64MiB");
    let hs: Vec<_> = (0..4).map(|i| a.insert(block(i, MIB)).unwrap()).collect();
    a.evict_all().unwrap();
    let states: Vec<_> = hs.iter().map(Handle::state).collect();
    assert!(states.iter().all(|s| *s == State::Evicted), "{states:?}");
    let f = a.footprint();
    assert_eq!((f.executors, f.resident), (4, 0));
    assert!(f.evicted_bytes >= 4 * 4 * MIB as u64, "{f:?}");
    assert_eq!(f.total_bytes(), f.evicted_bytes);
    let spill = a.spill_dir().to_path_buf();
    let files = || std::fs::read_dir(&spill).unwrap().count();
    assert_eq!(files(), 4);
    let mut moved = Vec::new();
    for h in hs {
        let bytes = h.into_bytes().unwrap();
        moved.push(b.insert_bytes::<Block>(None, &bytes).unwrap());
    }
    assert_eq!(files(), 0, "the moved executors' spill files are gone");
    assert_eq!(a.footprint().executors, 0);
    for (i, h) in moved.iter().enumerate() {
        assert_eq!(b.read(h, Clone::clone).unwrap(), block(i as u64, MIB));
    }
}

#[test]
fn bytes_that_are_not_an_executor_of_the_type_are_refused() {
    let a = Runtime::builder().workers(1).build().unwrap();
    let bytes = a.insert(block(3, 5000)).unwrap().into_bytes().unwrap();
    let refused = |b: &[u8]| match a.insert_bytes::<Block>(Some("block 3"), b) {
        Err(e @ Error::BadBytes { .. }) => e.to_string(),
        other => panic!("{other:?}"),
    };
    let e = refused(&bytes[..bytes.len() - 1]);
    assert!(e.starts_with("block 3: the "), "{e}");
    refused(&bytes[..10]);
    let mut flipped = bytes.clone();
    let at = flipped.len() - 3;
    flipped[at] ^= 1;
    refused(&flipped);
    match a.insert_bytes::<Vec<u8>>(None, &bytes) {
        Err(Error::BadBytes { reason, .. }) => assert!(reason.contains("type"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(a.footprint().executors, 0, "nothing was registered");
}

#[test]
fn evicted_and_loaded_bytes_count_the_executors_sizes() {
    let rt = capped("64MiB");
    let hs: Vec<_> = (0..3).map(|i| rt.insert(block(i, MIB)).unwrap()).collect();
    let sizes: u64 = hs.iter().map(|h| h.size() as u64).sum();
    let before = rt.stats();
    rt.evict_all().unwrap();
    let evicted = rt.stats();
    assert_eq!(evicted.evicted_bytes - before.evicted_bytes, sizes);
    for h in &hs {
        rt.read(h, |v| v.first).unwrap();
    }
    let loaded = rt.stats();
    assert_eq!(loaded.loads - evicted.loads, 3);
    // Sizes are measured again as they load.
    let sizes: u64 = hs.iter().map(|h| h.size() as u64).sum();
    assert_eq!(loaded.loaded_bytes - evicted.loaded_bytes, sizes);
    let f = rt.footprint();
    assert_eq!((f.resident, f.evicted_bytes), (3, 0));
    assert_eq!(f.resident_bytes, sizes);
}
