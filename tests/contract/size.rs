//! Contract tests about size: a `Serialize` that copies its data, and an
//! executor larger than the cap.

use super::*;

/// An executor whose `Serialize` builds a temporary copy of its data (as
/// some hand-written ones do), and whose `Deserialize` reads it back.
#[derive(Debug, Clone, PartialEq)]
struct Copying {
    data: Vec<u64>,
}

impl Serialize for Copying {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let bytes: Vec<u8> = self.data.iter().flat_map(|x| x.to_le_bytes()).collect();
        s.serialize_bytes(&bytes)
    }
}

impl<'de> Deserialize<'de> for Copying {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Copying, D::Error> {
        let b: serde_bytes_like::Bytes = Deserialize::deserialize(d)?;
        Ok(Copying {
            data: b
                .0
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
        })
    }
}

/// Reads a byte string (bincode's `serialize_bytes`) into a vector.
mod serde_bytes_like {
    pub struct Bytes(pub Vec<u8>);

    impl<'de> serde::Deserialize<'de> for Bytes {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Bytes;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("bytes")
                }
                fn visit_bytes<E>(self, v: &[u8]) -> Result<Bytes, E> {
                    Ok(Bytes(v.to_vec()))
                }
                fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Bytes, E> {
                    Ok(Bytes(v))
                }
            }
            d.deserialize_byte_buf(V)
        }
    }
}

/// A soft cap under an address-space limit, with executors whose
/// `Serialize` allocates a copy of their data while the trap evicts them:
/// the copy found no room in the address space and the process aborted.
/// The C library's per-thread arenas took 64 MiB each of it (at 600 MiB),
/// and the pages jemalloc kept for reuse under the cap were budgeted
/// against physical memory only (at 450 MiB).
#[test]
fn a_copying_serialize_under_a_soft_cap_and_a_hard_limit() {
    const T: &str = "size::a_copying_serialize_under_a_soft_cap_and_a_hard_limit";
    if is_child(T) {
        let rt = Runtime::builder()
            .mem_cap(MemoryCap::Bytes(256 << 20))
            .build()
            .unwrap();
        let hs: Vec<_> = (0..16)
            .map(|i| {
                rt.insert(Copying {
                    data: vec![i as u64; 4 << 20],
                })
                .unwrap()
            })
            .collect();
        for sweep in 0..3u64 {
            let mut b = rt.batch();
            for h in &hs {
                b.write(h, |v: &mut Copying| {
                    for x in v.data.iter_mut() {
                        *x += 1;
                    }
                    v.data[0]
                });
            }
            let r = b.run().unwrap();
            for (i, x) in r.iter().enumerate() {
                assert_eq!(*x, i as u64 + sweep + 1);
            }
        }
        println!("DONE=1");
        return;
    }
    let out = common::child_ok(T, Some(450 << 20), Duration::from_secs(240), &[]);
    assert_eq!(out.value("DONE").as_deref(), Some("1"), "{}", out.stderr);
}

/// An executor larger than the cap is served (it is needed in memory to
/// run a task on it) but not quietly: each time it comes into memory, or
/// a task grows one past the cap, counts in `oversized`, and the first
/// leaves one warning naming it, its size and the cap. Before, only
/// `peak_bytes` showed it (`overshoots`, `refusals` and `soft_traps`
/// stayed 0).
#[test]
fn an_executor_larger_than_the_cap_is_counted_and_warned_about() {
    const T: &str = "size::an_executor_larger_than_the_cap_is_counted_and_warned_about";
    if is_child(T) {
        let rt = Runtime::builder()
            .mem_cap(MemoryCap::Bytes(32 << 20))
            .workers(1)
            .prefetch(false)
            .build()
            .unwrap();
        let small = rt.insert(PodVec::from(vec![1u8; 4 << 20])).unwrap();
        rt.read(&small, |v: &PodVec<u8>| v.len()).unwrap();
        println!("SMALL={}", rt.stats().oversized);
        let big = rt
            .insert_named(Some("big"), PodVec::from(vec![2u8; 48 << 20]))
            .unwrap();
        println!("INSERTED={}", rt.stats().oversized);
        let n = rt.read(&big, |v: &PodVec<u8>| v.len()).unwrap();
        println!("LEN={n}");
        println!("READ={}", rt.stats().oversized);
        drop(big);
        // A task grows the small one past the cap.
        rt.write(&small, |v: &mut PodVec<u8>| v.resize(40 << 20, 3))
            .unwrap();
        let s = rt.stats();
        println!("GROWN={}", s.oversized);
        println!("PEAK_OVER={}", s.peak_bytes > 32 << 20);
        println!("WARNINGS={}", s.warnings.len());
        for w in &s.warnings {
            println!("WARNING={}", w.replace(' ', "_"));
        }
        println!("JSON_HAS={}", s.to_json().contains("\"oversized\":3"));
        return;
    }
    let out = ok(T);
    assert_eq!(out.num("SMALL"), 0);
    assert_eq!(out.num("INSERTED"), 1, "{}", out.stdout);
    assert_eq!(out.num("LEN"), 48 << 20);
    assert_eq!(out.num("READ"), 2, "the read loaded it again");
    assert_eq!(out.num("GROWN"), 3);
    assert_eq!(out.value("PEAK_OVER").as_deref(), Some("true"));
    assert_eq!(out.num("WARNINGS"), 1, "said once: {}", out.stdout);
    let w = out.value("WARNING").unwrap().replace('_', " ");
    assert!(
        w.contains("executor #2 (big)") && w.contains("48.0 MiB") && w.contains("32.0 MiB"),
        "{w}"
    );
    assert_eq!(out.value("JSON_HAS").as_deref(), Some("true"));
}
