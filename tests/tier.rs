//! A spill tier (`Builder::spill_tier`): evictions go there before the
//! disk, loads read it first, and a tier that fails, forgets or hands
//! back damaged bytes costs a disk read or a rebuild, never a wrong value.
//! Capped runs are in child processes (the cap is process-wide).

mod common;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{child_ok, is_child, run_job, run_job_with, Part};
use outcore::{MemoryCap, PodVec, Reclaim, Runtime, SpillTier, TierHead, TierKey};

const TIMEOUT: Duration = Duration::from_secs(300);

/// What the test tier does wrong, if anything.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    None,
    /// Forgets every image right after storing it (a lender that shed it
    /// or died): every get fails.
    Forgets,
    /// Hands back the image with one byte of the body changed.
    Damages,
    /// Panics in `get`.
    PanicsOnGet,
    /// Panics in `put`.
    PanicsOnPut,
    /// Keeps what it is asked to forget (a lender that has not heard yet).
    KeepsRemoved,
}

/// A tier keeping images in files of its own directory: off the heap, so
/// what it holds does not count against the cap (as another rank's
/// memory would not).
struct FileTier {
    dir: tempfile::TempDir,
    held: Mutex<HashMap<TierKey, u64>>,
    room: AtomicU64,
    fault: Mutex<Fault>,
    puts: AtomicU64,
    gets: AtomicU64,
    /// Set to fail the test when a put stores an image whose head does
    /// not say the key's executor and generation.
    bad_head: AtomicBool,
}

impl FileTier {
    fn new(room: u64, fault: Fault) -> Arc<FileTier> {
        Arc::new(FileTier {
            dir: tempfile::tempdir().expect("tier directory"),
            held: Mutex::new(HashMap::new()),
            room: AtomicU64::new(room),
            fault: Mutex::new(fault),
            puts: AtomicU64::new(0),
            gets: AtomicU64::new(0),
            bad_head: AtomicBool::new(false),
        })
    }

    fn path(&self, key: TierKey) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}-{}", key.executor, key.generation))
    }

    fn fault(&self) -> Fault {
        *self.fault.lock().unwrap()
    }

    /// The keys it holds.
    fn held(&self) -> Vec<TierKey> {
        let mut k: Vec<_> = self.held.lock().unwrap().keys().copied().collect();
        k.sort();
        k
    }

    fn held_bytes(&self) -> u64 {
        self.held.lock().unwrap().values().sum()
    }
}

impl SpillTier for FileTier {
    fn name(&self) -> String {
        "the test tier".into()
    }

    fn room(&self) -> u64 {
        self.room
            .load(Ordering::Relaxed)
            .saturating_sub(self.held_bytes())
    }

    fn put(
        &self,
        key: TierKey,
        _len: u64,
        write: &mut dyn FnMut(&mut dyn Write) -> io::Result<TierHead>,
    ) -> io::Result<bool> {
        if self.fault() == Fault::PanicsOnPut {
            panic!("the test tier panics in put");
        }
        let path = self.path(key);
        let body_path = self
            .dir
            .path()
            .join(format!("body-{}-{}", key.executor, key.generation));
        let mut body = std::fs::File::create(&body_path)?;
        let head = write(&mut body)?;
        drop(body);
        let generation = u64::from_le_bytes(head[24..32].try_into().unwrap());
        let executor = u64::from_le_bytes(head[16..24].try_into().unwrap());
        if (executor, generation) != (key.executor, key.generation) {
            self.bad_head.store(true, Ordering::Relaxed);
        }
        let body = std::fs::read(&body_path)?;
        std::fs::remove_file(&body_path)?;
        let mut image = head.to_vec();
        image.extend_from_slice(&body);
        std::fs::write(&path, &image)?;
        self.puts.fetch_add(1, Ordering::Relaxed);
        if self.fault() == Fault::Forgets {
            std::fs::remove_file(&path)?;
        } else {
            self.held.lock().unwrap().insert(key, image.len() as u64);
        }
        Ok(true)
    }

    fn get(
        &self,
        key: TierKey,
        read: &mut dyn FnMut(&mut dyn Read, u64) -> io::Result<()>,
    ) -> io::Result<()> {
        self.gets.fetch_add(1, Ordering::Relaxed);
        if self.fault() == Fault::PanicsOnGet {
            panic!("the test tier panics in get");
        }
        let mut image = std::fs::read(self.path(key))?;
        if self.fault() == Fault::Damages {
            let last = image.len() - 1;
            image[last] ^= 0x40;
        }
        read(&mut &image[..], image.len() as u64)
    }

    fn remove(&self, key: TierKey) {
        if self.fault() == Fault::KeepsRemoved {
            return;
        }
        self.held.lock().unwrap().remove(&key);
        let _ = std::fs::remove_file(self.path(key));
    }
}

// The tier's puts and gets write and read files while other threads
// allocate: one test body at a time per process is enough, the files are
// the tier's own.
fn runtime(tier: &Arc<FileTier>, cap: Option<u64>) -> Runtime {
    let mut b = Runtime::builder().workers(2).spill_tier(tier.clone());
    if let Some(c) = cap {
        b = b.mem_cap(MemoryCap::Bytes(c));
    }
    b.build().expect("runtime")
}

#[test]
fn evicted_executors_come_back_from_the_tier() {
    let tier = FileTier::new(1 << 30, Fault::None);
    let rt = runtime(&tier, None);
    let hs: Vec<_> = (0..4)
        .map(|i| rt.insert(Part::new(i, 1 << 18)).expect("insert"))
        .collect();
    assert_eq!(rt.evict_all().expect("evict"), 4);
    // Dirty: each went to the disk, then to the tier.
    let s = rt.stats();
    assert_eq!(s.tier_puts, 4);
    assert_eq!(s.tier_bytes_sent, s.bytes_written);
    assert_eq!(tier.held().len(), 4);
    assert!(!tier.bad_head.load(Ordering::Relaxed));
    for (i, h) in hs.iter().enumerate() {
        let c = rt.write(h, |p: &mut Part| p.checksum()).expect("run");
        assert_eq!(c, Part::new(i as u64, 1 << 18).checksum());
    }
    let s = rt.stats();
    assert_eq!((s.tier_loads, s.tier_fallbacks), (4, 0));
    assert_eq!(s.tier_bytes_loaded, s.tier_bytes_sent);
    assert_eq!(s.bytes_read, 0, "read from the disk");
    // `write` takes the value to change it: the tier's copies are stale
    // and gone.
    assert!(tier.held().is_empty(), "{:?}", tier.held());
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
}

#[test]
fn a_clean_executor_is_put_once_and_its_copy_stays() {
    let tier = FileTier::new(1 << 30, Fault::None);
    let rt = runtime(&tier, None);
    let h = rt.insert(Part::new(7, 1 << 16)).expect("insert");
    let want = Part::new(7, 1 << 16).checksum();
    for _ in 0..3 {
        rt.evict_all().expect("evict");
        let mut b = rt.batch();
        b.read(&h, |p: &Part| p.checksum());
        assert_eq!(b.run().expect("read"), vec![want]);
    }
    let s = rt.stats();
    // Written once (dirty), put once; then dropped clean twice, its copies
    // on the disk and in the tier still valid.
    assert_eq!((s.tier_puts, s.tier_loads, s.clean_evictions), (1, 3, 2));
    assert_eq!(tier.held().len(), 1);
    drop(h);
    assert!(
        tier.held().is_empty(),
        "a removed executor stays in the tier"
    );
}

/// A tier's copy is of the value as it was: once a task changed it, the
/// copy is never read again, even when the tier still holds it and the
/// next eviction did not reach the tier.
#[test]
fn a_changed_executor_never_comes_back_stale() {
    let tier = FileTier::new(1 << 30, Fault::KeepsRemoved);
    let rt = runtime(&tier, None);
    let h = rt.insert(Part::new(3, 1 << 16)).expect("insert");
    rt.evict_all().expect("evict");
    assert_eq!(rt.stats().tier_puts, 1);
    let first = rt.stats().bytes_written;
    rt.write(&h, |p: &mut Part| p.update()).expect("update");
    // No room left: the changed value goes to the disk only.
    tier.room.store(0, Ordering::Relaxed);
    rt.evict_all().expect("evict");
    let mut want = Part::new(3, 1 << 16);
    want.update();
    assert_eq!(
        rt.read(&h, |p: &Part| p.checksum()).expect("read"),
        want.checksum()
    );
    let s = rt.stats();
    assert_eq!(
        (s.tier_puts, s.tier_loads, s.tier_fallbacks),
        (1, 1, 0),
        "{s:?}"
    );
    assert_eq!(
        s.bytes_read,
        s.bytes_written - first,
        "the second copy not read from the disk"
    );
}

#[test]
fn a_lineage_executor_goes_to_the_tier_instead_of_being_rebuilt() {
    let tier = FileTier::new(1 << 30, Fault::None);
    let rt = runtime(&tier, None);
    let builds = Arc::new(AtomicU64::new(0));
    let b2 = builds.clone();
    let lineage = move || -> io::Result<PodVec<u32>> {
        b2.fetch_add(1, Ordering::Relaxed);
        Ok(PodVec::from((0..1u32 << 18).collect::<Vec<_>>()))
    };
    let h = rt
        .insert_with_lineage(
            None,
            PodVec::from((0..1u32 << 18).collect::<Vec<_>>()),
            lineage,
        )
        .expect("insert");
    let sum = |v: &PodVec<u32>| v.iter().map(|&x| u64::from(x)).sum::<u64>();
    let want: u64 = (0..1u64 << 18).sum();
    for _ in 0..3 {
        rt.evict_all().expect("evict");
        let mut b = rt.batch();
        b.read(&h, sum);
        assert_eq!(b.run().expect("read"), vec![want]);
    }
    let s = rt.stats();
    assert_eq!(
        builds.load(Ordering::Relaxed),
        0,
        "rebuilt while the tier held it"
    );
    assert_eq!((s.tier_puts, s.tier_loads, s.bytes_written), (1, 3, 0));
    // The tier forgets: the next load rebuilds, without a warning (a tier
    // may forget any image to give its memory back).
    *tier.fault.lock().unwrap() = Fault::Forgets;
    for k in tier.held() {
        tier.remove(k);
    }
    rt.evict_all().expect("evict");
    let mut b = rt.batch();
    b.read(&h, sum);
    assert_eq!(b.run().expect("read"), vec![want]);
    let s = rt.stats();
    assert_eq!(builds.load(Ordering::Relaxed), 1);
    assert_eq!(s.tier_fallbacks, 1);
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
}

/// Every fault, on a job with writes and reads: the same digest as
/// without a tier, each fault counted.
#[test]
fn a_failing_tier_never_changes_a_result() {
    let plain = Runtime::builder().workers(2).build().expect("runtime");
    let want = {
        let d = run_job(&plain, 6, 1 << 18, "rwrwr");
        drop(plain);
        d
    };
    for fault in [
        Fault::Forgets,
        Fault::Damages,
        Fault::PanicsOnGet,
        Fault::PanicsOnPut,
    ] {
        let tier = FileTier::new(1 << 30, fault);
        let rt = runtime(&tier, None);
        let got = run_job_with(&rt, 6, 1 << 18, "rwrwr", true);
        assert_eq!(got, want, "{fault:?}");
        let s = rt.stats();
        assert!(s.tier_fallbacks > 0, "{fault:?}: no failure counted");
        // A forgotten image is no failure: counted, not said.
        let said = usize::from(fault != Fault::Forgets);
        assert_eq!(s.warnings.len(), said, "{fault:?}: {:?}", s.warnings);
        if said == 1 {
            assert!(s.warnings[0].contains("the test tier"), "{}", s.warnings[0]);
        }
        if fault != Fault::PanicsOnPut {
            assert!(
                tier.gets.load(Ordering::Relaxed) > 0,
                "{fault:?}: never read"
            );
        }
        drop(rt);
        assert!(tier.held().is_empty(), "{fault:?}: {:?}", tier.held());
    }
}

#[test]
fn the_same_digest_evicting_with_and_without_a_tier() {
    let plain = Runtime::builder().workers(2).build().expect("runtime");
    let want = run_job_with(&plain, 6, 1 << 18, "rwrwr", true);
    drop(plain);
    let tier = FileTier::new(1 << 30, Fault::None);
    let rt = runtime(&tier, None);
    assert_eq!(run_job_with(&rt, 6, 1 << 18, "rwrwr", true), want);
    let s = rt.stats();
    assert!(s.tier_loads > 0 && s.tier_fallbacks == 0, "{s:?}");
    drop(rt);
    assert!(
        tier.held().is_empty(),
        "left in the tier: {:?}",
        tier.held()
    );
}

#[test]
fn a_full_tier_leaves_evictions_to_the_disk() {
    // Room for about two of the six images.
    let tier = FileTier::new(600 << 10, Fault::None);
    let rt = runtime(&tier, None);
    let hs: Vec<_> = (0..6)
        .map(|i| rt.insert(Part::new(i, 1 << 16)).expect("insert"))
        .collect();
    rt.evict_all().expect("evict");
    let s = rt.stats();
    assert_eq!(s.tier_puts, 2, "{s:?}");
    assert!(tier.held_bytes() <= 600 << 10);
    let mut b = rt.batch();
    for h in &hs {
        b.read(h, |p: &Part| p.checksum());
    }
    let want: Vec<u64> = (0..6).map(|i| Part::new(i, 1 << 16).checksum()).collect();
    assert_eq!(b.run().expect("read"), want);
    let s = rt.stats();
    assert_eq!((s.tier_loads, s.tier_fallbacks), (2, 0));
}

/// Under a cap, with the prefetcher and proactive evictions: the job's
/// digest is the uncapped one, and most loads come from the tier.
#[test]
fn capped_sweeps_load_from_the_tier() {
    if is_child("capped_sweeps_load_from_the_tier") {
        let tier = FileTier::new(1 << 30, Fault::None);
        let rt = runtime(&tier, Some(48 << 20));
        let got = run_job(&rt, 24, 4 << 20, "rwrrwr");
        let s = rt.stats();
        println!("DIGEST={got}");
        println!("TIER_LOADS={}", s.tier_loads);
        println!("LOADS={}", s.loads);
        println!("FALLBACKS={}", s.tier_fallbacks);
        drop(rt);
        println!("LEFT={}", tier.held().len());
        return;
    }
    let plain = Runtime::builder().workers(2).build().expect("runtime");
    let want = run_job(&plain, 24, 4 << 20, "rwrrwr");
    drop(plain);
    let out = child_ok("capped_sweeps_load_from_the_tier", None, TIMEOUT, &[]);
    assert_eq!(out.num("DIGEST"), want, "{}", out.stdout);
    assert_eq!(out.num("FALLBACKS"), 0);
    assert_eq!(out.num("LEFT"), 0, "left in the tier");
    let (tier_loads, loads) = (out.num("TIER_LOADS"), out.num("LOADS"));
    assert!(loads > 24, "the cap never bit: {}", out.stdout);
    // Reads of executors evicted clean come from the tier; a write's
    // eviction goes to both, so nearly every load can.
    assert!(
        tier_loads * 2 > loads,
        "{tier_loads} of {loads} loads from the tier"
    );
}

/// Memory held for others: buffers given back on demand, or a hook that
/// panics.
struct Held {
    buffers: Mutex<Vec<Vec<u8>>>,
    panics: bool,
    asked: AtomicU64,
}

impl Reclaim for Held {
    fn reclaim(&self, bytes: u64) -> u64 {
        self.asked.fetch_add(1, Ordering::Relaxed);
        assert!(!self.panics, "the test's reclaim panics");
        let mut held = self.buffers.lock().unwrap();
        let mut freed = 0;
        while freed < bytes {
            let Some(b) = held.pop() else { break };
            freed += b.capacity() as u64;
        }
        freed
    }
}

/// Under a cap, memory held for others goes before the job's own
/// executors; a hook that panics costs evictions, not the job.
#[test]
fn memory_held_for_others_is_given_back_first() {
    if is_child("memory_held_for_others_is_given_back_first") {
        let panics = std::env::var("HELD_PANICS").is_ok();
        // 64 MiB held in 1 MiB buffers (touched: resident), under 96 MiB.
        let held = Arc::new(Held {
            buffers: Mutex::new((0..64).map(|i| vec![i as u8; 1 << 20]).collect()),
            panics,
            asked: AtomicU64::new(0),
        });
        let rt = Runtime::builder()
            .workers(2)
            .mem_cap(MemoryCap::Bytes(96 << 20))
            .reclaim(held.clone())
            .build()
            .expect("runtime");
        // Ten executors of 4 MiB: 40 MiB of the job's own beside 64 held;
        // room made for each before it is built.
        let hs: Vec<_> = (0..10)
            .map(|i| {
                rt.make_room(5 << 20);
                rt.insert(Part::new(i, 1 << 20)).expect("insert")
            })
            .collect();
        let mut b = rt.batch();
        for h in &hs {
            b.read(h, |p: &Part| p.checksum());
        }
        let sums = b.run().expect("read");
        let want: Vec<u64> = (0..10).map(|i| Part::new(i, 1 << 20).checksum()).collect();
        assert_eq!(sums, want);
        let s = rt.stats();
        println!("EVICTIONS={}", s.evictions);
        println!("RECLAIMED={}", s.reclaimed_bytes);
        println!("ASKED={}", held.asked.load(Ordering::Relaxed));
        println!("LEFT={}", held.buffers.lock().unwrap().len());
        return;
    }
    let out = child_ok(
        "memory_held_for_others_is_given_back_first",
        None,
        TIMEOUT,
        &[],
    );
    assert!(out.num("ASKED") > 0, "{}", out.stdout);
    assert!(out.num("LEFT") < 64, "nothing given back: {}", out.stdout);
    assert!(out.num("RECLAIMED") >= 1 << 20, "{}", out.stdout);
    assert_eq!(out.num("EVICTIONS"), 0, "{}", out.stdout);
    let out = child_ok(
        "memory_held_for_others_is_given_back_first",
        None,
        TIMEOUT,
        &[("HELD_PANICS", "1")],
    );
    assert!(out.num("ASKED") > 0, "{}", out.stdout);
    assert_eq!((out.num("RECLAIMED"), out.num("LEFT")), (0, 64));
    assert!(out.num("EVICTIONS") > 0, "{}", out.stdout);
}
