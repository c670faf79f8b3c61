//! Eviction: choosing victims, writing or dropping them, making room under
//! the cap, and the entry point the allocation trap calls.
//!
//! Victims are the resident, unpinned executors of the highest rank (see
//! [`crate::policy`]). A clean executor whose spill file is still valid is
//! dropped with no write; a dirty one is written first, outside its slot
//! lock (state `Evicting`), and a failed write puts it back intact (see
//! `writes.rs` for the backoff).
//!
//! With a spill tier ([`SpillTier`]), outside the trap: a clean executor
//! the tier does not hold yet is put there before it is dropped; a dirty
//! one is written to the disk, then put there too. The tier is never the
//! only copy, so it may fail or forget at any time: loads then read the
//! disk or the lineage (`load.rs`).

use std::any::Any;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::registry::Member;
use super::shared::{drop_user_value, panic_message, Shared};
use crate::alloc::{self, linebuf::LineBuf, BypassGuard, Evictor, Freed};
use crate::error::{Error, Result};
use crate::executor::{EvictStep, Slot, SlotGuard, State, FROM_LINEAGE, NONE};
use crate::spill::{SpillTier, ValueFailed};
use crate::stats::Counters;

/// Outcome of one eviction attempt.
pub(crate) enum Evicted {
    /// Memory freed (bytes, as measured).
    Freed(usize),
    /// Not evictable now (pinned, moving, or backing off).
    Skipped,
    /// Its lock is held by another thread (only from the trap, which
    /// try-locks).
    Busy,
    /// The write failed; the executor stayed resident.
    Failed(io::Error),
}

/// The freed pages jemalloc may keep for reuse: what `cap` leaves above
/// the bytes `used`, and no more than `limit` (what the memory and
/// address-space limits allow, see `dirty_budget`).
pub(crate) fn kept_budget(cap: usize, used: usize, limit: usize) -> usize {
    cap.saturating_sub(used).min(limit)
}

/// Without a cap, the freed pages jemalloc may keep, as a share of the
/// bytes in use: 1/64.
pub(crate) const UNCAPPED_KEPT_SHARE: usize = 64;

/// The freed pages an uncapped runtime lets jemalloc keep when `used`
/// bytes are in use (see [`UNCAPPED_KEPT_SHARE`]): at least 4 MiB.
pub(crate) fn uncapped_budget(used: usize) -> usize {
    (used / UNCAPPED_KEPT_SHARE).max(4 << 20)
}

/// The level proactive eviction brings the bytes in use down to: the low
/// watermark less what is resident outside the accounting (`outside`, at
/// most an eighth of the cap), so that the resident set, which `top` and
/// the OOM killer judge, stays under the cap too.
pub(crate) fn target(cap: u64, outside: usize) -> u64 {
    crate::cap::low_watermark(cap).saturating_sub((outside as u64).min(cap / 8))
}

impl Shared {
    /// [`target`] for this runtime's cap and what it last measured outside
    /// the accounting.
    pub(crate) fn eviction_target(&self, cap: u64) -> u64 {
        target(cap, self.outside())
    }

    /// The trap's victim, not in `skip`, when `need` bytes must be freed
    /// now: the highest-ranked executor that frees `need` alone; if none
    /// does, the largest (then the highest-ranked), so that the request is
    /// met in few writes. `Err(())` when the registry is locked by another
    /// thread (the trap only try-locks), or when no executor is evictable
    /// but some are being loaded or evicted by other threads.
    fn pick_trap_victim(&self, need: usize, skip: &[u64]) -> Result<Option<Arc<Slot>>, ()> {
        let pick = |all: &mut dyn Iterator<Item = Member<'_>>| {
            let mut fit: Option<(u64, &Arc<Slot>)> = None;
            let mut largest: Option<(usize, u64, &Arc<Slot>)> = None;
            let mut moving = false;
            for m in all {
                let s = m.slot;
                let state = s.state_hint();
                moving |= matches!(state, State::Loading | State::Evicting);
                if state != State::Resident || skip.contains(&s.id) {
                    continue;
                }
                let r = self.rank(s, m.cycle());
                let size = s.size.load(Ordering::Relaxed);
                if size >= need && fit.is_none_or(|(fr, _)| r > fr) {
                    fit = Some((r, s));
                }
                if largest.is_none_or(|(ls, lr, _)| (size, r) > (ls, lr)) {
                    largest = Some((size, r, s));
                }
            }
            match fit.map(|(_, s)| s).or(largest.map(|(_, _, s)| s)) {
                Some(s) => Ok(Some(s.clone())),
                // Executors on their way in or out will soon be evictable
                // or freed: that is contention too, not exhaustion.
                None if moving => Err(()),
                None => Ok(None),
            }
        };
        // Only a try-lock: the thread that traps may hold the registry.
        self.registry()
            .try_scan(self.lookahead(), pick)
            .unwrap_or(Err(()))
    }

    /// Evicts `slot` if it is resident and idle. `asked`: the application
    /// asked for it ([`Shared::evict_all`]), so a write is tried even while
    /// failed writes hold the others back.
    pub(crate) fn evict_slot(&self, slot: &Slot, trap: bool, asked: bool) -> Evicted {
        // What this eviction frees is not the size of whatever executor
        // this thread is loading or writing to.
        let _scope = alloc::EvictScope::new();
        let g = if trap {
            slot.try_lock()
        } else {
            Some(slot.lock())
        };
        let Some(mut g) = g else {
            return Evicted::Busy;
        };
        let size = slot.size.load(Ordering::Relaxed);
        let to_tier = !trap && self.tier().is_some();
        match g.state.evict_step(g.dirty, g.file_gen != 0) {
            EvictStep::Skip => Evicted::Skipped,
            EvictStep::DropClean if to_tier && g.tier_gen == 0 => self.evict_to_tier(slot, g, size),
            EvictStep::DropClean => {
                let v = g.value.take();
                self.finish_eviction(slot, g, v, trap, true, size);
                Evicted::Freed(size)
            }
            EvictStep::Write => self.write_out(slot, g, trap, asked, size),
        }
    }

    /// Evicts `slot` (locked, `g`), clean and not in the tier yet: its
    /// image goes there (the tier is faster to read back than the disk or
    /// the lineage), then it is dropped as any clean executor.
    fn evict_to_tier(&self, slot: &Slot, mut g: SlotGuard<'_>, size: usize) -> Evicted {
        let Some(v) = g.value.take() else {
            return Evicted::Skipped;
        };
        let gen = if g.file_gen == FROM_LINEAGE {
            g.next_gen += 1;
            g.next_gen - 1
        } else {
            g.file_gen
        };
        slot.set_state(&mut g, State::Evicting);
        drop(g);
        let _bypass = BypassGuard::new();
        let put = self.put_in_tier(slot, &*v, gen, size);
        let mut g = slot.lock();
        if put {
            g.tier_gen = gen;
        }
        self.finish_eviction(slot, g, Some(v), false, true, size);
        Evicted::Freed(size)
    }

    /// Evicts `slot` (locked, `g`), changed since its last copy: writes it
    /// to the disk (and, outside the trap, puts the same copy into the
    /// tier, where loads then read it). A failed write leaves it resident.
    fn write_out(
        &self,
        slot: &Slot,
        mut g: SlotGuard<'_>,
        trap: bool,
        asked: bool,
        size: usize,
    ) -> Evicted {
        let now = self.epoch_ms();
        if !asked
            && !self
                .writes()
                .may_write(now, slot.write_retry_at.load(Ordering::Relaxed))
        {
            return Evicted::Skipped;
        }
        let Some(v) = g.value.take() else {
            return Evicted::Skipped;
        };
        let gen = g.next_gen;
        g.next_gen += 1;
        slot.set_state(&mut g, State::Evicting);
        drop(g);
        let _bypass = BypassGuard::new();
        let path = self.store().path_for(slot.id);
        let result = self.save(slot, &*v, &path, gen);
        let put = !trap && result.is_ok() && self.put_in_tier(slot, &*v, gen, size);
        let mut g = slot.lock();
        match result {
            Ok(written) => {
                self.writes().succeeded();
                g.file_gen = gen;
                g.dirty = false;
                if put {
                    g.tier_gen = gen;
                }
                Counters::add(&self.counters().bytes_written, written);
                self.finish_eviction(slot, g, Some(v), trap, false, size);
                Evicted::Freed(size.max(written as usize))
            }
            Err(e) => {
                g.value = Some(v);
                slot.set_state(&mut g, State::Resident);
                drop(g);
                Counters::add(&self.counters().failed_writes, 1);
                let retry_at = self.writes().failed(
                    self.epoch_ms(),
                    &format!("{}: {e}", path.display()),
                    ValueFailed::is(&e),
                );
                slot.write_retry_at.store(retry_at, Ordering::Relaxed);
                Evicted::Failed(e)
            }
        }
    }

    /// Ends the eviction of `slot` (locked, `g`), whose value `v` has a
    /// copy now: the executor is `Evicted`, the value dropped and the
    /// eviction counted (`clean`: nothing was written to the disk).
    fn finish_eviction(
        &self,
        slot: &Slot,
        mut g: SlotGuard<'_>,
        v: Option<Box<dyn Any + Send>>,
        trap: bool,
        clean: bool,
        size: usize,
    ) {
        let unused = slot.prefetched.swap(false, Ordering::Relaxed);
        slot.set_state(&mut g, State::Evicted);
        self.note_evicted();
        drop(g);
        drop_user_value(v);
        self.count_eviction(trap, clean, unused, size);
    }

    /// Puts `v`, `slot`'s value of about `size` bytes, into the spill
    /// tier as its copy `gen`, when the tier has room: whether it took it.
    /// A failure of the tier (its error or its panic) is counted and said
    /// once; one of the value's own encoding is not the tier's (the
    /// executor keeps the copy it has).
    pub(crate) fn put_in_tier(
        &self,
        slot: &Slot,
        v: &(dyn Any + Send),
        gen: u64,
        size: usize,
    ) -> bool {
        let Some(tier) = self.tier() else {
            return false;
        };
        let len = size as u64;
        let put = catch_unwind(AssertUnwindSafe(|| {
            if tier.room() < len {
                return Ok(None);
            }
            (slot.tier_put)(v, tier, self.ident(), slot.key(gen), len)
        }))
        .unwrap_or_else(|p| {
            Err(io::Error::other(format!(
                "panicked: {}",
                panic_message(&*p)
            )))
        });
        match put {
            Ok(Some(bytes)) => {
                Counters::add(&self.counters().tier_puts, 1);
                Counters::add(&self.counters().tier_bytes_sent, bytes);
                true
            }
            Ok(None) => false,
            Err(e) if ValueFailed::is(&e) => false,
            Err(e) => {
                self.note_tier_failure(tier, slot, &e);
                false
            }
        }
    }

    /// Counts a failure of `tier` met for `slot` (said once, with the
    /// tier's name).
    pub(crate) fn note_tier_failure(&self, tier: &dyn SpillTier, slot: &Slot, e: &io::Error) {
        let name = catch_unwind(AssertUnwindSafe(|| tier.name()))
            .unwrap_or_else(|_| "a spill tier".into());
        self.counters().note_tier_failure(&name, &slot.label, e);
    }

    /// Has the spill tier forget `slot`'s copy `gen` (0: none; it
    /// changed, or is gone); a panic in the tier is caught.
    pub(crate) fn forget_in_tier(&self, slot: &Slot, gen: u64) {
        if let Some(tier) = self.tier().filter(|_| gen != 0) {
            let key = crate::spill::TierKey::of(self.ident(), slot.key(gen));
            let _ = catch_unwind(AssertUnwindSafe(|| tier.remove(key)));
        }
    }

    /// Has the spill tier forget every copy it holds of this runtime's
    /// executors (the runtime is going).
    pub(crate) fn forget_tier_copies(&self) {
        if self.tier().is_none() {
            return;
        }
        for slot in self.registry().snapshot() {
            let gen = std::mem::take(&mut slot.lock().tier_gen);
            self.forget_in_tier(&slot, gen);
        }
    }

    /// Writes `v`, `slot`'s value, to `path` as its copy `gen`: the bytes
    /// written, or why not.
    fn save(&self, slot: &Slot, v: &(dyn Any + Send), path: &Path, gen: u64) -> io::Result<u64> {
        if self.writes().inject_fault() {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "injected fault (OUTCORE_FAULT_WRITE_EVERY)",
            ));
        }
        // The value's `Serialize` is user code, and this may run inside
        // the allocator: a panic is a failed write.
        catch_unwind(AssertUnwindSafe(|| (slot.save)(v, path, slot.key(gen)))).unwrap_or_else(|p| {
            Err(ValueFailed::error(format!(
                "serialization panicked: {}",
                panic_message(&*p)
            )))
        })
    }

    /// Counts the eviction of an executor of `size` bytes in memory
    /// (`unused`: the prefetcher loaded it and no task used it since).
    fn count_eviction(&self, trap: bool, clean: bool, unused: bool, size: usize) {
        let c = self.counters();
        Counters::add(&c.evictions, 1);
        Counters::add(&c.evicted_bytes, size as u64);
        if trap {
            Counters::add(&c.trap_evictions, 1);
        }
        if clean {
            Counters::add(&c.clean_evictions, 1);
        }
        if unused {
            Counters::add(&c.prefetches_unused, 1);
        }
    }

    /// The next victim for `make_room`, not in `skip`, ranked above
    /// `above` when given: the top of the ranked list, checked against its
    /// rank now. The list is rebuilt by one scan when it runs out or after
    /// a quarter as many clock ticks as it held candidates (ranks drift as
    /// the sweep moves on), so a decision costs O(log n) amortised instead
    /// of a scan of the registry per victim. Executors join it as soon as
    /// a task leaves them idle (`note_idle`).
    fn next_victim(&self, above: Option<u64>, skip: &[u64]) -> Option<Arc<Slot>> {
        let mut cache = self.victims().lock();
        let now = self.clock_now();
        let mut rebuilt = false;
        loop {
            if cache.stale(now) {
                if rebuilt && cache.is_empty() {
                    return None;
                }
                self.registry().scan(self.lookahead(), |all| {
                    let resident = all
                        .filter(|m| m.slot.state_hint() == State::Resident)
                        .map(|m| (self.rank(m.slot, m.cycle()), m.slot.clone()));
                    cache.rebuild(now, resident, true);
                });
                rebuilt = true;
                if cache.is_empty() {
                    return None;
                }
            }
            let Some((cached, s)) = cache.pop() else {
                continue;
            };
            if s.state_hint() != State::Resident || skip.contains(&s.id) {
                continue;
            }
            let Some(r) = self.rank_now(&s) else {
                continue;
            };
            if r < cached && cache.peek().is_some_and(|(next, _)| r < next) {
                // Needed sooner than when ranked (a task came up for it):
                // back in the list at its rank now.
                cache.push(r, s);
                continue;
            }
            if above.is_some_and(|a| r <= a) {
                // The best candidates are gone: keep this one for later.
                cache.push(r, s);
                return None;
            }
            return Some(s);
        }
    }

    /// Adds `slot`, just left idle by a task, to the victims at its rank
    /// now. A rank only falls as the sweep nears an executor (picks are
    /// checked for that), but it jumps when a task has used it: the
    /// executor used last in a sweep is needed last. Left out until the
    /// next rebuild, such executors stayed in memory while executors
    /// ranked lower were evicted, and were loaded again later in the
    /// sweep.
    pub(crate) fn note_idle(&self, slot: &Arc<Slot>) {
        let Some(r) = self.rank_now(slot) else {
            return;
        };
        let _bypass = BypassGuard::new();
        let mut cache = self.victims().lock();
        // A stale list is rebuilt from a scan at the next decision anyway.
        if !cache.stale(self.clock_now()) {
            cache.push(r, slot.clone());
        }
    }

    /// After a load has taken its memory (reusing pages the evictions that
    /// made room for it freed): measures what is resident outside the
    /// accounting (for the eviction target) and [`trim`](Self::trim)s
    /// with nothing more to come.
    pub(crate) fn trim_after_load(&self) {
        let measured = self.soft_cap().and_then(|_| crate::cap::resident_set());
        if let Some(rss) = measured {
            let outside = usize::try_from(rss).unwrap_or(usize::MAX);
            let outside = outside
                .saturating_sub(alloc::current_usage())
                .saturating_sub(alloc::kept_pages());
            self.set_outside(outside);
        }
        self.trim(0);
    }

    /// Purges the freed pages jemalloc still keeps when they exceed what
    /// the cap leaves above the bytes in use and `bytes` about to be
    /// allocated (or the budget the memory and address-space limits
    /// allow), or when the process's resident set is within 1/64 of the
    /// cap (what tasks allocate before the next load comes on top). Kept
    /// pages are resident: `top`, a cgroup and the OOM killer count them,
    /// so the cap bounds the bytes in use plus the pages kept. Kept up to
    /// what the memory limit left above the cap, a 256 MiB quickstart
    /// held 516 MiB resident; in a memory cgroup sized just above the cap,
    /// keeping them all pushed the job into swap (77,000 major faults in a
    /// 4 GiB run). Checked after loads, before room is made for an
    /// allocation, and (with a cap) when a prefetcher finds nothing to
    /// do: pages freed
    /// by what is not an executor (a job's model-sized sums, its sample)
    /// and taken again by another thread's arena were kept until the next
    /// load (at k = 1000, 10,000-D, 591 MiB resident under 512 MiB).
    ///
    /// Without a cap, the kept pages are purged when they exceed
    /// [`UNCAPPED_KEPT_SHARE`] of the bytes in use: jemalloc's own decay
    /// keeps them ten seconds, and an uncapped K-means at 10,000-D held
    /// 1.36x its data resident (the initialisation's sample and the
    /// loads' leftovers, freed and kept) for 1.23x in use.
    pub(crate) fn trim(&self, bytes: usize) {
        let kept = alloc::kept_pages();
        if kept == 0 {
            return;
        }
        let used = alloc::current_usage();
        let over = match self.soft_cap() {
            None => kept > uncapped_budget(used),
            Some(cap) => {
                let rss = crate::cap::resident_set();
                let cap_bytes = usize::try_from(cap).unwrap_or(usize::MAX);
                let budget =
                    kept_budget(cap_bytes, used.saturating_add(bytes), self.dirty_budget());
                kept > budget || rss.is_some_and(|rss| rss > cap - cap / 64)
            }
        };
        if over {
            alloc::purge();
        }
    }

    /// Evicts until `bytes` more fit under the eviction target, taking only
    /// victims ranked above `above` when given. Returns whether they fit.
    pub(crate) fn make_room(&self, bytes: usize, above: Option<u64>) -> bool {
        self.trim(bytes);
        let Some(cap) = self.soft_cap() else {
            return true;
        };
        let cap = self.eviction_target(cap);
        let mut skip: Vec<u64> = Vec::new();
        let mut reclaimed = false;
        // No purge afterwards: jemalloc reuses the freed extents for the
        // loads that follow (a load trims what is left: `trim_after_load`).
        // Purging on every proactive eviction made each load fault in
        // zeroed pages again (with TLB shootdowns across the workers). The
        // trap, where memory must go back to the system now, still purges.
        loop {
            let in_flight = self.loading_bytes();
            let want = alloc::current_usage()
                .saturating_add(in_flight)
                .saturating_add(bytes) as u64;
            if want <= cap {
                return true;
            }
            // What the process holds for others goes first, once.
            if !std::mem::replace(&mut reclaimed, true) && self.reclaim(want - cap) > 0 {
                continue;
            }
            let Some(v) = self.next_victim(above, &skip) else {
                return false;
            };
            if !matches!(self.evict_slot(&v, false, false), Evicted::Freed(_)) {
                skip.push(v.id);
            }
        }
    }

    /// Asks the memory held for others (if any) to give back `bytes`:
    /// the bytes it freed (0 when its code panicked), published.
    fn reclaim(&self, bytes: u64) -> u64 {
        let Some(r) = self.reclaimer() else {
            return 0;
        };
        let freed = catch_unwind(AssertUnwindSafe(|| r.reclaim(bytes))).unwrap_or(0);
        if freed > 0 {
            // The frees were this thread's: counted now, not at its next
            // flush.
            alloc::flush_thread();
            Counters::add(&self.counters().reclaimed_bytes, freed);
        }
        freed
    }

    /// Evicts every idle executor now (writing the dirty ones). Returns how
    /// many were evicted, or the first write that failed.
    pub(crate) fn evict_all(&self) -> Result<usize> {
        let slots = self.registry().snapshot();
        let mut n = 0;
        for s in slots {
            match self.evict_slot(&s, false, true) {
                Evicted::Freed(_) => n += 1,
                Evicted::Skipped | Evicted::Busy => {}
                Evicted::Failed(source) => {
                    return Err(Error::SpillWrite {
                        executor: s.label.clone(),
                        file: self.store().path_for(s.id),
                        bytes: s.size.load(Ordering::Relaxed),
                        source,
                    });
                }
            }
        }
        alloc::purge();
        Ok(n)
    }
}

impl Evictor for Shared {
    fn evict_for_trap(&self, bytes: usize) -> Freed {
        let mut freed = 0usize;
        let mut busy = false;
        let mut skip = [NONE; 16];
        let mut nskip = 0;
        for _ in 0..256 {
            if freed >= bytes {
                break;
            }
            let v = match self.pick_trap_victim(bytes - freed, &skip[..nskip]) {
                Ok(Some(v)) => v,
                Ok(None) => break,
                Err(()) => {
                    busy = true;
                    break;
                }
            };
            match self.evict_slot(&v, true, false) {
                Evicted::Freed(n) => freed = freed.saturating_add(n.max(1)),
                other => {
                    busy |= matches!(other, Evicted::Busy);
                    if nskip == skip.len() {
                        break;
                    }
                    skip[nskip] = v.id;
                    nskip += 1;
                }
            }
        }
        Freed { bytes: freed, busy }
    }

    fn pinned(&self) -> usize {
        self.pinned_now()
    }

    fn generation(&self) -> u64 {
        self.generation_now()
    }

    fn cap(&self) -> Option<usize> {
        self.soft_cap()
            .map(|c| usize::try_from(c).unwrap_or(usize::MAX))
    }

    fn describe(&self, out: &mut LineBuf) {
        if self.writes().any_failed() {
            out.push(b"; spill writes are failing (is the spill directory ");
            out.push(self.store().dir().as_os_str().as_bytes());
            out.push(b" full?)");
        }
    }
}
