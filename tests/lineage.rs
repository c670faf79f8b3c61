//! Executors with a lineage: built on first use, dropped on eviction while
//! clean, spilled once changed. Capped scenarios run in child processes
//! (the cap is process-wide).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{child_ok, is_child};
use outcore::{Error, Handle, Lineage, MemoryCap, PodVec, Runtime, State};

const TIMEOUT: Duration = Duration::from_secs(300);

/// The value executor `i` holds: `elems` u32 derived from `i`.
fn block(i: u32, elems: usize) -> PodVec<u32> {
    PodVec::from(
        (0..elems as u32)
            .map(|j| j.wrapping_mul(2654435761) ^ i)
            .collect::<Vec<_>>(),
    )
}

fn sum(v: &PodVec<u32>) -> u64 {
    v.iter().map(|&x| u64::from(x)).sum()
}

/// Inserts `n` lazy executors of `elems` u32 each; `calls` counts rebuilds.
fn lazy(rt: &Runtime, n: u32, elems: usize, calls: &Arc<AtomicUsize>) -> Vec<Handle<PodVec<u32>>> {
    (0..n)
        .map(|i| {
            let calls = calls.clone();
            rt.insert_lazy(Some(&format!("block {i}")), elems * 4, move || {
                calls.fetch_add(1, Ordering::Relaxed);
                Ok(block(i, elems))
            })
            .expect("insert")
        })
        .collect()
}

#[test]
fn a_lazy_executor_is_built_on_first_use_only() {
    let rt = Runtime::builder().workers(2).build().expect("runtime");
    let calls = Arc::new(AtomicUsize::new(0));
    let hs = lazy(&rt, 4, 1000, &calls);
    assert!(hs.iter().all(|h| h.state() == State::Evicted));
    assert_eq!(calls.load(Ordering::Relaxed), 0, "built before use");
    for _ in 0..3 {
        let mut b = rt.batch();
        for h in &hs {
            b.read(h, sum);
        }
        let got = b.run().expect("sweep");
        let want: Vec<u64> = (0..4).map(|i| sum(&block(i, 1000))).collect();
        assert_eq!(got, want);
    }
    assert_eq!(
        calls.load(Ordering::Relaxed),
        4,
        "rebuilt without an eviction"
    );
    let s = rt.stats();
    assert_eq!((s.loads, s.rebuilds, s.bytes_read), (4, 4, 0));
}

#[test]
fn evicting_a_clean_executor_with_a_lineage_writes_nothing() {
    let rt = Runtime::builder().workers(1).build().expect("runtime");
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let h = rt
        .insert_with_lineage(Some("eager"), block(7, 5000), move || {
            c.fetch_add(1, Ordering::Relaxed);
            Ok(block(7, 5000))
        })
        .expect("insert");
    assert_eq!(h.state(), State::Resident);
    assert_eq!(rt.evict_all().expect("evict"), 1);
    assert_eq!(h.state(), State::Evicted);
    assert_eq!(rt.read(&h, sum).expect("read"), sum(&block(7, 5000)));
    let s = rt.stats();
    assert_eq!(s.bytes_written, 0, "a clean executor was written");
    assert_eq!((s.clean_evictions, s.rebuilds), (1, 1));
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    assert!(std::fs::read_dir(rt.spill_dir())
        .expect("dir")
        .next()
        .is_none());
}

#[test]
fn a_changed_executor_is_spilled_and_its_change_kept() {
    let rt = Runtime::builder().workers(1).build().expect("runtime");
    let calls = Arc::new(AtomicUsize::new(0));
    let hs = lazy(&rt, 1, 1000, &calls);
    let h = &hs[0];
    rt.write(h, |v: &mut PodVec<u32>| v[0] = 12345)
        .expect("write");
    rt.evict_all().expect("evict");
    assert!(
        rt.stats().bytes_written > 0,
        "a changed executor must be written"
    );
    // Loaded from the spill file, not rebuilt: the change is there.
    assert_eq!(rt.read(h, |v: &PodVec<u32>| v[0]).expect("read"), 12345);
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    // A read task that marks it dirty is spilled too.
    let mut b = rt.batch();
    b.read_with(h, |v: &PodVec<u32>, cx| {
        cx.mark_dirty();
        v[1]
    });
    b.run().expect("read");
    let written = rt.stats().bytes_written;
    rt.evict_all().expect("evict");
    assert!(rt.stats().bytes_written > written);
}

#[test]
fn a_failing_lineage_is_an_error_naming_the_executor() {
    let rt = Runtime::builder().workers(2).build().expect("runtime");
    let good = rt
        .insert_lazy(Some("good"), 64, || Ok(vec![1u8; 64]))
        .expect("insert");
    let bad: Handle<Vec<u8>> = rt
        .insert_lazy(Some("gone"), 64, || {
            Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "input.npy: no such file",
            ))
        })
        .expect("insert");
    let err = rt.read(&bad, |v| v.len()).expect_err("must fail");
    assert!(matches!(err, Error::Rebuild { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("(gone)") && msg.contains("no such file"),
        "{msg}"
    );
    assert_eq!(bad.state(), State::Damaged);
    // The same error again, not a hang; the other executor is fine.
    assert!(matches!(
        rt.read(&bad, |v| v.len()),
        Err(Error::Rebuild { .. })
    ));
    assert_eq!(rt.read(&good, |v| v.len()).expect("good"), 64);
}

#[test]
fn a_panicking_lineage_damages_its_executor_and_nothing_else() {
    let rt = Runtime::builder().workers(2).build().expect("runtime");
    let bad: Handle<Vec<u8>> = rt
        .insert_lazy(Some("bomb"), 64, || panic!("lineage exploded"))
        .expect("insert");
    let good = rt
        .insert_lazy(Some("good"), 64, || Ok(vec![2u8; 64]))
        .expect("insert");
    let mut b = rt.batch();
    b.read(&bad, |v| v.len());
    b.read(&good, |v| v.len());
    let err = b.run().expect_err("must fail");
    assert!(err.to_string().contains("lineage exploded"), "{err}");
    assert_eq!(bad.state(), State::Damaged);
    assert_eq!(rt.read(&good, |v| v.len()).expect("good"), 64);
}

/// 32 executors of 4 MiB under a 40 MiB cap, swept three times: the sweeps
/// evict and rebuild them, and no byte is written to disk.
#[test]
fn capped_sweeps_rebuild_instead_of_spilling() {
    if is_child("capped_sweeps_rebuild_instead_of_spilling") {
        let rt = Runtime::builder()
            .workers(2)
            .mem_cap(MemoryCap::Bytes(40 << 20))
            .build()
            .expect("runtime");
        let calls = Arc::new(AtomicUsize::new(0));
        let elems = 1 << 20;
        let hs = lazy(&rt, 32, elems, &calls);
        rt.hint_cycle(hs.iter().map(|h| h.id()));
        let want: Vec<u64> = (0..32).map(|i| sum(&block(i, elems))).collect();
        for _ in 0..3 {
            let mut b = rt.batch();
            for h in &hs {
                b.read(h, sum);
            }
            assert_eq!(b.run().expect("sweep"), want);
        }
        let s = rt.stats();
        println!("WRITTEN={}", s.bytes_written);
        println!("REBUILDS={}", s.rebuilds);
        println!("EVICTIONS={}", s.evictions);
        println!("PEAK={}", s.peak_bytes);
        return;
    }
    let out = child_ok(
        "capped_sweeps_rebuild_instead_of_spilling",
        None,
        TIMEOUT,
        &[],
    );
    assert_eq!(out.num("WRITTEN"), 0, "{}", out.stdout);
    assert!(out.num("REBUILDS") >= 32 * 2, "{}", out.stdout);
    assert!(out.num("EVICTIONS") > 0, "{}", out.stdout);
    assert!(out.num("PEAK") < 64 << 20, "{}", out.stdout);
}

/// A lineage too costly to repeat builds the executor once; after that the
/// executor is spilled and read back like any other.
#[test]
fn a_one_time_lineage_builds_once_then_spills() {
    struct Generator(Arc<AtomicUsize>);
    impl Lineage<PodVec<u32>> for Generator {
        fn rebuild(&self) -> std::io::Result<PodVec<u32>> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(block(3, 4096))
        }
        fn repeatable(&self) -> bool {
            false
        }
    }
    let rt = Runtime::builder().workers(1).build().expect("runtime");
    let calls = Arc::new(AtomicUsize::new(0));
    let h = rt
        .insert_lazy(Some("generated"), 4096 * 4, Generator(calls.clone()))
        .expect("insert");
    assert_eq!(rt.stats().bytes_written, 0);
    for _ in 0..3 {
        assert_eq!(rt.read(&h, sum).expect("read"), sum(&block(3, 4096)));
        rt.evict_all().expect("evict");
    }
    assert_eq!(calls.load(Ordering::Relaxed), 1, "rebuilt more than once");
    let s = rt.stats();
    assert!(s.bytes_written > 0 && s.bytes_read > 0, "{s:?}");
    assert_eq!((s.rebuilds, s.loads), (1, 3));
}

/// A value inserted with a lineage too costly to repeat was built by the
/// caller: it spills from its first eviction on, and the lineage never
/// runs (it had run once at that eviction's reload).
#[test]
fn a_given_value_with_a_one_time_lineage_spills_at_once() {
    struct Costly(Arc<AtomicUsize>);
    impl Lineage<PodVec<u32>> for Costly {
        fn rebuild(&self) -> std::io::Result<PodVec<u32>> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(block(5, 4096))
        }
        fn repeatable(&self) -> bool {
            false
        }
    }
    let rt = Runtime::builder()
        .workers(1)
        .prefetch(false)
        .build()
        .expect("runtime");
    let calls = Arc::new(AtomicUsize::new(0));
    let h = rt
        .insert_with_lineage(Some("given"), block(5, 4096), Costly(calls.clone()))
        .expect("insert");
    for _ in 0..2 {
        rt.evict_all().expect("evict");
        assert_eq!(rt.read(&h, sum).expect("read"), sum(&block(5, 4096)));
    }
    assert_eq!(calls.load(Ordering::Relaxed), 0, "the lineage ran");
    let s = rt.stats();
    assert!(s.bytes_written > 0, "{s:?}");
    assert_eq!((s.rebuilds, s.loads), (0, 2));
}

/// An executor whose spill write is slow once [`WRITES_ARE_SLOW`] is set
/// (its `Serialize` sleeps), so that making room for a load takes a while.
#[derive(serde::Deserialize)]
#[serde(transparent)]
struct SlowToWrite(PodVec<u32>);

static WRITES_ARE_SLOW: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl serde::Serialize for SlowToWrite {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if WRITES_ARE_SLOW.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(400));
        }
        self.0.serialize(s)
    }
}

/// The two prefetchers both want the one executor that is due next. The
/// one that takes it makes room for it (one slow spill write); the other
/// must not evict a second executor for the same load. (When the
/// prefetchers claimed an executor only after making room for it, both
/// evicted one.)
#[test]
fn two_prefetchers_make_room_once_for_one_load() {
    if is_child("two_prefetchers_make_room_once_for_one_load") {
        const MIB: usize = 1 << 20;
        let cap = 96 * MIB;
        // What `make_room` brings usage down to: the cap less 4 MiB.
        let low = cap - 4 * MIB;
        let rt = Runtime::builder()
            .workers(1)
            .mem_cap(MemoryCap::Bytes(cap as u64))
            .build()
            .expect("runtime");
        let elems = 2 * MIB; // 8 MiB of u32
        let first = rt.insert_named(Some("first"), 0u64).expect("insert");
        let want = sum(&block(0, 2 * elems));
        let usage = || {
            outcore::flush_thread();
            outcore::current_usage()
        };
        // Fill memory to 10-11 MiB under the low watermark: 8 MiB executors
        // needed last (the victims), then 1 MiB ones needed before them.
        // The one due next (16 MiB, inserted after, so that it is not
        // loaded into free memory before) then takes one eviction to fit.
        let mut later = Vec::new();
        while usage() + 8 * MIB <= low - 12 * MIB {
            let i = later.len() as u32;
            let v = SlowToWrite(block(i, elems));
            later.push(
                rt.insert_named(Some(&format!("later {i}")), v)
                    .expect("insert"),
            );
        }
        let mut fill = Vec::new();
        while usage() + MIB <= low - 10 * MIB {
            let i = fill.len() as u32;
            fill.push(
                rt.insert_named(Some(&format!("fill {i}")), block(i, MIB / 4))
                    .expect("insert"),
            );
        }
        let calls = Arc::new(AtomicUsize::new(0));
        let next = lazy(&rt, 1, 2 * elems, &calls).remove(0);
        assert_eq!(rt.stats().evictions, 0, "evicted while filling memory");
        WRITES_ARE_SLOW.store(true, Ordering::Relaxed);
        let mut order = vec![first.id(), next.id()];
        order.extend(fill.iter().map(|h| h.id()));
        order.extend(later.iter().map(|h| h.id()));
        rt.hint_cycle(order);
        let mut b = rt.batch();
        // The only worker stays here until the prefetchers have loaded
        // `next` (or 60 s), so that it does not load it itself.
        let monitor = rt.monitor();
        b.read(&first, move |_: &u64| {
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while monitor.stats().is_some_and(|s| s.prefetches == 0)
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            // Time for a second prefetcher's make_room, if one started.
            std::thread::sleep(Duration::from_millis(500));
            0
        });
        b.read(&next, sum);
        let got = b.run().expect("sweep");
        assert_eq!(got[1], want);
        let s = rt.stats();
        println!("EVICTIONS={}", s.evictions);
        println!("PREFETCHES={}", s.prefetches);
        return;
    }
    let out = child_ok(
        "two_prefetchers_make_room_once_for_one_load",
        None,
        TIMEOUT,
        &[],
    );
    assert_eq!(out.num("PREFETCHES"), 1, "{}", out.stdout);
    assert_eq!(
        out.num("EVICTIONS"),
        1,
        "more than one executor evicted to load one: {}",
        out.stdout
    );
}
