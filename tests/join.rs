//! Tasks over several executors: what they see, their order, the plan,
//! the errors, poisoning, and no deadlock whatever the order tasks name
//! their executors in (a stress test in a child with a watchdog).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{child_ok, is_child};
use outcore::{Error, MemoryCap, PodVec, Runtime, State};

#[test]
fn a_task_sees_and_updates_each_executor_it_names() {
    let rt = Runtime::builder().workers(2).build().unwrap();
    let x = rt.insert(vec![1.0f64, 2.0, 3.0]).unwrap();
    let w = rt.insert(vec![2.0f64, 2.0, 2.0]).unwrap();
    let y = rt.insert(Vec::<f64>::new()).unwrap();
    let n = rt.insert(0u32).unwrap();
    let (kx, kw, ky, kn) = (x.key(), w.key(), y.key(), n.key());
    let mut b = rt.batch();
    b.task(&[&x, &w], &[&y, &n], move |j| {
        let (x, w) = (j.read(kx), j.read(kw));
        let y = j.write(ky);
        y.extend(x.iter().zip(w).map(|(a, b)| a * b));
        *j.write(kn) += 1;
        y.len()
    });
    assert_eq!(b.run().unwrap(), vec![3]);
    // The written executors were changed, and their changes survive an
    // eviction; the read ones are clean (dropped without a write).
    let written = rt.stats().bytes_written;
    rt.evict_all().unwrap();
    assert_eq!(
        rt.read(&y, |v: &Vec<f64>| v.clone()).unwrap(),
        vec![2.0, 4.0, 6.0]
    );
    assert_eq!(rt.read(&n, |v: &u32| *v).unwrap(), 1);
    assert_eq!(rt.read(&x, |v: &Vec<f64>| v[2]).unwrap(), 3.0);
    assert!(rt.stats().bytes_written > written);
}

#[test]
fn the_typed_forms_read_two_and_read_one_write_another() {
    let rt = Runtime::builder().build().unwrap();
    let a = rt.insert(vec![1u64, 2, 3]).unwrap();
    let b = rt.insert(vec![10u64, 20, 30]).unwrap();
    let sum = rt.insert(0u64).unwrap();
    let mut batch = rt.batch();
    batch.read2(&a, &b, |a: &Vec<u64>, b: &Vec<u64>| {
        a.iter().zip(b).map(|(x, y)| x * y).sum::<u64>()
    });
    batch.read2(&a, &a, |a: &Vec<u64>, again: &Vec<u64>| {
        a.len() as u64 + again.len() as u64
    });
    batch.read_write(&b, &sum, |b: &Vec<u64>, s: &mut u64| {
        *s += b.iter().sum::<u64>();
        *s
    });
    assert_eq!(batch.run().unwrap(), vec![140, 6, 60]);
}

#[test]
fn tasks_on_an_executor_run_in_submission_order_whatever_else_they_name() {
    // Each task appends its index to the log it writes; the others read
    // one of several data blocks or write one of several counters, in
    // every order of ids.
    let rt = Runtime::builder().workers(2).build().unwrap();
    let log = rt.insert(Vec::<usize>::new()).unwrap();
    let blocks: Vec<_> = (0..4u64)
        .map(|i| rt.insert(vec![i; 1000]).unwrap())
        .collect();
    let kl = log.key();
    let mut b = rt.batch();
    for i in 0..200usize {
        let h = &blocks[i % 4];
        let kh = h.key();
        if i % 3 == 0 {
            b.task(&[], &[h, &log], move |j| {
                j.write(kh)[0] += 1;
                j.write(kl).push(i);
            });
        } else {
            b.task(&[h], &[&log], move |j| {
                let _ = j.read(kh)[0];
                j.write(kl).push(i);
            });
        }
    }
    b.run().unwrap();
    let seen = rt.read(&log, |l: &Vec<usize>| l.clone()).unwrap();
    assert_eq!(seen, (0..200).collect::<Vec<_>>());
}

#[test]
fn reads_of_one_executor_run_side_by_side_and_in_order_with_its_writes() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let rt = Runtime::builder().workers(2).build().unwrap();
    let model = rt.insert(vec![0u64; 4]).unwrap();
    let blocks: Vec<_> = (0..2u64).map(|i| rt.insert(i).unwrap()).collect();
    let km = model.key();
    // Two tasks reading the model: each waits (up to 10 s) to see the
    // other inside; held one at a time, neither would.
    let inside = Arc::new(AtomicUsize::new(0));
    let mut b = rt.batch();
    for h in &blocks {
        let (inside, kh) = (inside.clone(), h.key());
        b.task(&[&model], &[h], move |j| {
            let _ = j.read(km);
            inside.fetch_add(1, Ordering::SeqCst);
            let start = std::time::Instant::now();
            while inside.load(Ordering::SeqCst) < 2 && start.elapsed() < Duration::from_secs(10) {
                std::thread::yield_now();
            }
            *j.write(kh) += 1;
            inside.load(Ordering::SeqCst)
        });
    }
    assert_eq!(b.run().unwrap(), vec![2, 2]);
    // Writes and reads of one executor keep their order: each read sees
    // exactly the writes submitted before it.
    let log = rt.insert(Vec::<usize>::new()).unwrap();
    let kl = log.key();
    let mut b = rt.batch();
    let mut writes = 0;
    let mut expected = Vec::new();
    for i in 0..120usize {
        let h = &blocks[i % 2];
        let kh = h.key();
        if i % 4 == 0 {
            writes += 1;
            expected.push(writes);
            b.task(&[h], &[&log], move |j| {
                let _ = j.read(kh);
                let log = j.write(kl);
                log.push(i);
                log.len()
            });
        } else {
            expected.push(writes);
            b.task(&[&log, h], &[], move |j| {
                let _ = j.read(kh);
                j.read(kl).len()
            });
        }
    }
    assert_eq!(b.run().unwrap(), expected);
}

/// Two tasks on one executor: each waits (up to `wait`) to see the other
/// inside; the fewest tasks either saw inside when it finished waiting.
fn side_by_side(shared: bool, wait: Duration) -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let rt = Runtime::builder().workers(2).build().unwrap();
    let rows = rt.insert(vec![1u64; 1000]).unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let mut b = rt.batch();
    for _ in 0..2 {
        let inside = inside.clone();
        let task = move |v: &Vec<u64>| {
            inside.fetch_add(1, Ordering::SeqCst);
            let start = std::time::Instant::now();
            while inside.load(Ordering::SeqCst) < 2 && start.elapsed() < wait {
                std::thread::yield_now();
            }
            inside.load(Ordering::SeqCst) * v[0] as usize
        };
        if shared {
            b.read_shared(&rows, task);
        } else {
            b.read(&rows, task);
        }
    }
    b.run().unwrap().into_iter().min().unwrap_or(0)
}

#[test]
fn shared_reads_of_one_executor_run_side_by_side_plain_reads_alone() {
    // Each saw the other inside: both ran at once (held one at a time,
    // the first would wait its 10 s and see itself alone).
    assert_eq!(side_by_side(true, Duration::from_secs(10)), 2);
    // `read` takes the executor alone: the first never sees the second.
    assert_eq!(side_by_side(false, Duration::from_millis(200)), 1);
    let rt = Runtime::builder().workers(2).build().unwrap();
    let h = rt.insert(5u32).unwrap();
    let mut b = rt.batch();
    b.read(&h, |v: &u32| *v).read_shared(&h, |v: &u32| *v + 1);
    assert_eq!(b.run().unwrap(), vec![5, 6]);
}

#[test]
fn executors_that_cannot_fit_together_are_an_error_naming_them() {
    let rt = Runtime::builder()
        .mem_cap(MemoryCap::Bytes(8 << 20))
        .build()
        .unwrap();
    let a = rt.insert(PodVec::from(vec![1u8; 5 << 20])).unwrap();
    let b = rt.insert(PodVec::from(vec![2u8; 5 << 20])).unwrap();
    let mut batch = rt.batch();
    batch.read2(&a, &b, |_: &PodVec<u8>, _: &PodVec<u8>| ());
    batch.read(&a, |v: &PodVec<u8>| {
        assert_eq!(v[0], 1);
    });
    let r = batch.run_each();
    match &r[0] {
        Err(e @ Error::TooLargeTogether { executors, cap }) => {
            assert_eq!(executors.len(), 2);
            assert_eq!(*cap, 8 << 20);
            let msg = e.to_string();
            assert!(msg.contains(&format!("executor #{}", a.id())), "{msg}");
            assert!(msg.contains(&format!("executor #{}", b.id())), "{msg}");
            assert!(msg.contains("8.0 MiB"), "{msg}");
        }
        other => panic!("expected TooLargeTogether, got {other:?}"),
    }
    // The rest of the batch ran.
    assert!(r[1].is_ok(), "{:?}", r[1]);
}

#[test]
fn a_panic_poisons_the_executors_written_not_those_read() {
    let rt = Runtime::builder().build().unwrap();
    let data = rt.insert(vec![1u32; 10]).unwrap();
    let model = rt.insert(vec![0u32; 10]).unwrap();
    let (kd, km) = (data.key(), model.key());
    let mut b = rt.batch();
    b.task(&[&data], &[&model], move |j| {
        let _ = j.read(kd);
        j.write(km)[0] = 7;
        panic!("half-way");
    });
    let err = b.run().unwrap_err();
    assert!(matches!(err, Error::TaskPanicked { .. }), "{err}");
    assert_eq!(model.state(), State::Poisoned);
    assert!(matches!(
        rt.read(&model, |m: &Vec<u32>| m[0]),
        Err(Error::Poisoned { .. })
    ));
    assert_eq!(rt.read(&data, |d: &Vec<u32>| d[0]).unwrap(), 1);
}

#[test]
fn misuse_in_a_task_fails_the_task_only() {
    let rt = Runtime::builder().build().unwrap();
    let a = rt.insert(1u32).unwrap();
    let other = rt.insert(2u32).unwrap();
    let (ka, ko) = (a.key(), other.key());
    let mut b = rt.batch();
    // An executor the task did not name, a write of one it reads, a key
    // of another runtime (whose executor has the same id, and another
    // type), and the same executor read and written.
    b.task(&[&a], &[], move |j| *j.read(ko));
    b.task(&[&a], &[], move |j| *j.write(ka));
    b.task(&[&a], &[], move |j| {
        j.read(outcore_key_as::<u64>(ka)).to_string().len() as u32
    });
    b.read_write(&a, &a, |x: &u32, y: &mut u32| *x + *y);
    for r in b.run_each() {
        assert!(matches!(r, Err(Error::TaskPanicked { .. })), "{r:?}");
    }
    // Nothing was poisoned: none of these tasks wrote.
    assert_eq!(rt.read(&a, |v: &u32| *v).unwrap(), 1);
    assert_eq!(a.state(), State::Resident);
}

/// A key of another type with the id of `k`, of another runtime (keys are
/// made from handles only: a second runtime hands out the same ids in the
/// same order).
fn outcore_key_as<T>(k: outcore::Key<u32>) -> outcore::Key<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned + Send + Default + 'static,
{
    let rt = Runtime::builder().build().unwrap();
    loop {
        let h = rt.insert(T::default()).unwrap();
        if h.id() >= k.id() {
            assert_eq!(h.id(), k.id(), "ids are handed out in order");
            return h.key();
        }
    }
}

#[test]
fn a_task_naming_the_executor_its_caller_holds_is_reentrant() {
    let rt = Arc::new(Runtime::builder().workers(2).build().unwrap());
    let a = Arc::new(rt.insert(1u32).unwrap());
    let b = Arc::new(rt.insert(2u32).unwrap());
    let (rt2, a2, b2) = (rt.clone(), a.clone(), b.clone());
    // A task on `b` runs a batch with a task over `a` and `b`: `b` is
    // held by the task that waits for it.
    let inner = rt
        .write(&b, move |_: &mut u32| {
            let mut inner = rt2.batch();
            inner.read2(&a2, &b2, |x: &u32, y: &u32| x + y);
            inner.read2(&a2, &a2, |x: &u32, y: &u32| x + y);
            inner.run_each()
        })
        .unwrap();
    assert!(
        matches!(inner[0], Err(Error::Reentrant { .. })),
        "{:?}",
        inner[0]
    );
    assert_eq!(inner[1].as_ref().ok(), Some(&2));
}

#[test]
fn the_prefetcher_loads_every_executor_of_a_task_ahead_of_it() {
    // In a child: the cap counts the whole process's memory.
    let test = "the_prefetcher_loads_every_executor_of_a_task_ahead_of_it";
    if !is_child(test) {
        child_ok(test, None, Duration::from_secs(120), &[]);
        return;
    }
    // 24 data blocks of 1 MiB, all evicted, each met with the one model
    // block; tasks that compute for a while leave the prefetcher time to
    // load the next blocks: few loads are on demand.
    let rt = Runtime::builder()
        .mem_cap(MemoryCap::Bytes(12 << 20))
        .workers(1)
        .build()
        .unwrap();
    let blocks: Vec<_> = (0..24u32)
        .map(|i| rt.insert(PodVec::from(vec![i; 1 << 18])).unwrap())
        .collect();
    let model = rt.insert(vec![0u64; 16]).unwrap();
    rt.evict_all().unwrap();
    let before = rt.stats();
    let km = model.key();
    let mut b = rt.batch();
    for h in &blocks {
        let kh = h.key();
        b.task(&[h], &[&model], move |j| {
            std::thread::sleep(Duration::from_millis(20));
            let first = j.read(kh)[0];
            j.write(km)[0] += u64::from(first);
        });
    }
    b.run().unwrap();
    let s = rt.stats();
    let loads = s.loads - before.loads;
    let demand = s.demand_loads - before.demand_loads;
    let prefetched = s.prefetches - before.prefetches;
    println!("LOADS={loads} DEMAND={demand} PREFETCHED={prefetched}");
    // The first task's executors wait for their loads; the prefetcher
    // loads the next ones while a task computes (1 demand load here; 5-6
    // when the plan kept one executor per task).
    assert!(
        demand <= 3,
        "demand loads {demand} of {loads}: {}",
        s.to_json()
    );
    assert!(prefetched >= 18, "prefetches {prefetched}: {}", s.to_json());
    assert_eq!(
        rt.read(&model, |m: &Vec<u64>| m[0]).unwrap(),
        (0..24).sum::<u64>()
    );
}

#[test]
fn nested_reads_are_counted_once() {
    let rt = Arc::new(Runtime::builder().workers(2).build().unwrap());
    let a = rt.insert(1u32).unwrap();
    let b = Arc::new(rt.insert(2u32).unwrap());
    let before = rt.stats().tasks;
    let (rt2, b2) = (rt.clone(), b.clone());
    let mut batch = rt.batch();
    for _ in 0..10 {
        let (rt2, b2) = (rt2.clone(), b2.clone());
        batch.read(&a, move |x: &u32| x + rt2.read(&b2, |y: &u32| *y).unwrap());
    }
    assert_eq!(batch.run().unwrap(), vec![3; 10]);
    // Ten tasks and ten nested reads.
    assert_eq!(rt.stats().tasks - before, 20);
    drop((rt2, b2));
}

// ---------------------------------------------------------------------------
// No deadlock, no lost update: random read and write sets over a few
// executors, in every order of ids, under a cap that keeps only some of
// them in memory, from several threads' batches at once.
// ---------------------------------------------------------------------------

const STRESS_EXECUTORS: usize = 6;
const STRESS_TASKS: usize = 300;

/// A deterministic draw.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^ (z >> 29)
}

fn join_stress() {
    let rt = Arc::new(
        Runtime::builder()
            .mem_cap(MemoryCap::Bytes(6 << 20))
            .workers(2)
            .build()
            .unwrap(),
    );
    // Each executor: 1 MiB of data and a count of the writes it saw.
    let hs: Vec<_> = (0..STRESS_EXECUTORS)
        .map(|_| rt.insert((PodVec::from(vec![0u8; 1 << 20]), 0u64)).unwrap())
        .collect();
    let mut expected = [0u64; STRESS_EXECUTORS];
    std::thread::scope(|s| {
        let mut threads = Vec::new();
        for t in 0..2u64 {
            let (rt, hs) = (&rt, &hs);
            threads.push(s.spawn(move || {
                let mut writes = vec![0u64; STRESS_EXECUTORS];
                let mut b = rt.batch();
                for i in 0..STRESS_TASKS as u64 {
                    let z = mix(t * 1_000_003 + i);
                    // Up to three executors, in a random order, each read
                    // or written.
                    let n = 1 + (z % 3) as usize;
                    let (mut reads, mut ws) = (Vec::new(), Vec::new());
                    let mut keys = Vec::new();
                    for k in 0..n {
                        let e = (mix(z + k as u64) % STRESS_EXECUTORS as u64) as usize;
                        let write = mix(z ^ (k as u64 + 7)) % 2 == 0;
                        if write {
                            ws.push(&hs[e]);
                        } else {
                            reads.push(&hs[e]);
                        }
                        keys.push((hs[e].key(), write));
                    }
                    // The executors the task writes (each once).
                    let mut written: Vec<usize> = Vec::new();
                    for (k, w) in &keys {
                        let e = hs.iter().position(|h| h.key() == *k).unwrap();
                        if *w && !written.contains(&e) {
                            written.push(e);
                            writes[e] += 1;
                        }
                    }
                    let reads: Vec<&dyn outcore::ReadHandle> = reads
                        .into_iter()
                        .map(|h| h as &dyn outcore::ReadHandle)
                        .collect();
                    let ws: Vec<&dyn outcore::AnyHandle> = ws
                        .into_iter()
                        .map(|h| h as &dyn outcore::AnyHandle)
                        .collect();
                    let wkeys: Vec<_> = written.iter().map(|&e| hs[e].key()).collect();
                    let rkeys: Vec<_> = keys.iter().map(|(k, _)| *k).collect();
                    b.task(&reads, &ws, move |j| {
                        for k in &rkeys {
                            if !wkeys.contains(k) {
                                let _ = j.read(*k).0[0];
                            }
                        }
                        for k in &wkeys {
                            let v = j.write(*k);
                            v.0[(v.1 % 4096) as usize] ^= 1;
                            v.1 += 1;
                        }
                    });
                }
                b.run().unwrap();
                writes
            }));
        }
        for t in threads {
            for (e, w) in t.join().unwrap().into_iter().enumerate() {
                expected[e] += w;
            }
        }
    });
    let mut lost = 0;
    for (e, h) in hs.iter().enumerate() {
        let seen = rt.read(h, |v: &(PodVec<u8>, u64)| v.1).unwrap();
        if seen != expected[e] {
            lost += 1;
            println!("executor {e}: {seen} writes, {} expected", expected[e]);
        }
    }
    let s = rt.stats();
    println!("LOST={lost}");
    println!("EVICTIONS={}", s.evictions);
    println!("TASKS={}", s.tasks);
}

#[test]
fn random_read_and_write_sets_never_deadlock_or_lose_an_update() {
    if is_child("random_read_and_write_sets_never_deadlock_or_lose_an_update") {
        return join_stress();
    }
    let out = child_ok(
        "random_read_and_write_sets_never_deadlock_or_lose_an_update",
        None,
        Duration::from_secs(120),
        &[],
    );
    assert_eq!(out.num("LOST"), 0, "{}", out.stdout);
    assert!(
        out.num("EVICTIONS") > 0,
        "the cap never bit: {}",
        out.stdout
    );
    assert_eq!(
        out.num("TASKS"),
        2 * STRESS_TASKS as u64 + STRESS_EXECUTORS as u64
    );
}

/// Waits up to `secs` for `ok`, polling.
fn wait_for(secs: u64, ok: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !ok() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

#[test]
fn a_cycle_of_steps_moves_a_shared_executor_to_its_next_step() {
    let rt = Runtime::builder().workers(1).build().unwrap();
    let model = rt.insert(vec![0u64; 8]).unwrap();
    let data: Vec<_> = (0..3)
        .map(|i| rt.insert(vec![i as u64; 8]).unwrap())
        .collect();
    let cycle = rt.hint_cycle_steps(data.iter().map(|d| [d.id(), model.id()]));
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d.cycle_position(), Some((cycle, i as u64)));
    }
    for (i, d) in data.iter().enumerate() {
        assert_eq!(model.cycle_position(), Some((cycle, i as u64)));
        let mut b = rt.batch::<u64>();
        b.read2(d, &model, |d: &Vec<u64>, m: &Vec<u64>| d[0] + m[0]);
        b.run().unwrap();
        // Once the sweep has passed its step, the model is needed at the
        // next one (the first again after the last).
        let next = (i as u64 + 1) % 3;
        assert_eq!(model.cycle_position(), Some((cycle, next)));
    }
    // The same executor named twice by one plain cycle is at both places.
    let c2 = rt.hint_cycle([data[0].id(), data[1].id(), data[0].id()]);
    assert_eq!(data[0].cycle_position(), Some((c2, 0)));
    rt.read(&data[0], |v: &Vec<u64>| v[0]).unwrap();
    assert_eq!(data[0].cycle_position(), Some((c2, 2)));
}

#[test]
fn a_cycle_of_steps_prefetches_every_executor_of_the_next_step() {
    let rt = Runtime::builder().workers(1).build().unwrap();
    let models: Vec<_> = (0..2)
        .map(|i| rt.insert(vec![i as u64; 4096]).unwrap())
        .collect();
    let data: Vec<_> = (0..4)
        .map(|i| rt.insert(vec![i as u64; 4096]).unwrap())
        .collect();
    // Step i joins data block i with model block i % 2.
    rt.hint_cycle_steps(
        data.iter()
            .enumerate()
            .map(|(i, d)| [d.id(), models[i % 2].id()]),
    );
    rt.evict_all().unwrap();
    let resident = |h: &outcore::Handle<Vec<u64>>| h.state() == State::Resident;
    let go = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = std::thread::scope(|s| {
        let go2 = go.clone();
        let run = s.spawn(|| {
            // The only worker stays in step 0 until the test has looked
            // (or 30 s), so that only the prefetcher can load step 1.
            let go = go2;
            let mut b = rt.batch::<u64>();
            b.read2(&data[0], &models[0], move |d: &Vec<u64>, m: &Vec<u64>| {
                wait_for(30, || go.load(std::sync::atomic::Ordering::Relaxed));
                d[0] + m[0]
            });
            b.run()
        });
        let seen = wait_for(30, || resident(&data[1]) && resident(&models[1]));
        go.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(run.join().unwrap().unwrap(), vec![0]);
        seen
    });
    assert!(
        seen,
        "step 1 not prefetched together: data {:?}, model {:?}",
        data[1].state(),
        models[1].state()
    );
}

// ---------------------------------------------------------------------------
// Issue 52, item 9: keys, sizes, removal and the cap, as an embedder meets
// them.
// ---------------------------------------------------------------------------

#[test]
fn a_key_of_another_runtime_is_refused_even_with_the_same_id() {
    let one = Runtime::builder().workers(1).build().unwrap();
    let two = Runtime::builder().workers(1).build().unwrap();
    let mine = one.insert(vec![1u32; 4]).unwrap();
    // The other runtime's first executor of the same type: the same id.
    let theirs = loop {
        let h = two.insert(vec![2u32; 4]).unwrap();
        if h.id() >= mine.id() {
            break h;
        }
    };
    assert_eq!(theirs.id(), mine.id());
    assert_ne!(theirs.key(), mine.key());
    let foreign = theirs.key();
    let mut b = one.batch();
    b.task(&[&mine], &[], move |j| j.read(foreign)[0]);
    let r = b.run();
    match r {
        Err(Error::TaskPanicked { message, .. }) => {
            assert!(message.contains("another runtime"), "{message}");
        }
        other => panic!("a foreign key read this runtime's executor: {other:?}"),
    }
    // A write through it fails the task too (and, as any panic in a task
    // that writes, poisons what it writes).
    let scratch = one.insert(vec![0u32; 4]).unwrap();
    let mut b = one.batch();
    b.task(&[], &[&scratch], move |j| j.write(foreign)[0] = 9);
    assert!(matches!(b.run(), Err(Error::TaskPanicked { .. })));
    assert_eq!(one.read(&mine, |v: &Vec<u32>| v[0]).unwrap(), 1);
    assert_eq!(two.read(&theirs, |v: &Vec<u32>| v[0]).unwrap(), 2);
}

#[test]
fn a_joins_result_is_not_counted_toward_the_executor_it_writes() {
    let test = "a_joins_result_is_not_counted_toward_the_executor_it_writes";
    if !is_child(test) {
        child_ok(test, None, Duration::from_secs(120), &[]);
        return;
    }
    let rt = Runtime::builder()
        .mem_cap(MemoryCap::Bytes(96 << 20))
        .workers(1)
        .build()
        .unwrap();
    let data = rt.insert(PodVec::from(vec![1u8; 32 << 20])).unwrap();
    let model = rt.insert(PodVec::from(vec![0u8; 1 << 20])).unwrap();
    let before = model.size();
    // A join that writes the model and returns 40 MiB.
    let mut b = rt.batch();
    b.read_write(&data, &model, |d: &PodVec<u8>, m: &mut PodVec<u8>| {
        m[0] = d[0];
        vec![7u8; 40 << 20]
    });
    let out = b.run().unwrap();
    assert_eq!(out[0].len(), 40 << 20);
    drop(out);
    println!("MODEL_BEFORE={before} MODEL_AFTER={}", model.size());
    assert!(
        model.size() < 2 << 20,
        "the 1 MiB model reports {} bytes after a join returned 40 MiB",
        model.size()
    );
    // The two fit together under the cap: the next join runs.
    let mut b = rt.batch();
    b.read_write(&data, &model, |d: &PodVec<u8>, m: &mut PodVec<u8>| {
        m[1] = d[1];
    });
    b.run().unwrap();
    assert_eq!(rt.read(&model, |m: &PodVec<u8>| m[1]).unwrap(), 1);
}

#[test]
fn every_executor_a_join_writes_is_measured_again() {
    let rt = Runtime::builder().workers(1).build().unwrap();
    let data = rt.insert(vec![3u8; 16]).unwrap();
    let grows = rt.insert(PodVec::from(vec![0u8; 1 << 20])).unwrap();
    let shrinks = rt.insert(PodVec::from(vec![0u8; 8 << 20])).unwrap();
    let small = rt.insert(PodVec::from(vec![0u8; 1 << 20])).unwrap();
    let (kd, kg, ks, km) = (data.key(), grows.key(), shrinks.key(), small.key());
    let mut b = rt.batch();
    // One written executor grows by 30 MiB, another shrinks by 8 MiB, a
    // third is written and stays as it was.
    b.task(&[&data], &[&grows, &shrinks, &small], move |j| {
        let fill = j.read(kd)[0];
        *j.write(kg) = PodVec::from(vec![fill; 31 << 20]);
        *j.write(ks) = PodVec::from(vec![fill; 16]);
        j.write(km)[0] = fill;
    });
    b.run().unwrap();
    let (g, s, m) = (grows.size(), shrinks.size(), small.size());
    println!("grown {g}, shrunk {s}, same {m}");
    assert!((31 << 20..32 << 20).contains(&g), "grown to 31 MiB: {g}");
    assert!(s < 4096, "shrunk to 16 bytes: {s}");
    assert!((1 << 20..2 << 20).contains(&m), "kept 1 MiB: {m}");
    // The footprint adds up the sizes as measured (in memory or not: a
    // capped test alongside may evict them).
    let f = rt.footprint();
    assert_eq!(
        f.resident_bytes + f.evicted_bytes,
        (g + s + m + data.size()) as u64
    );
}

/// A join over `a` and `b` (the first read, the second written), noting
/// while it runs the bytes the running joins hold together in `now`, and
/// their highest in `peak`.
fn noted_join(
    batch: &mut outcore::Batch<'_, ()>,
    a: &outcore::Handle<PodVec<u8>>,
    b: &outcore::Handle<PodVec<u8>>,
    now: &Arc<std::sync::atomic::AtomicUsize>,
    peak: &Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::Ordering::SeqCst;
    let (now, peak) = (now.clone(), peak.clone());
    batch.read_write(a, b, move |x: &PodVec<u8>, y: &mut PodVec<u8>| {
        let bytes = x.len() + y.len();
        let held = now.fetch_add(bytes, SeqCst) + bytes;
        peak.fetch_max(held, SeqCst);
        // Long enough for the other worker to start a join meanwhile.
        std::thread::sleep(Duration::from_millis(3));
        y[0] = y[0].wrapping_add(x[0]);
        now.fetch_sub(bytes, SeqCst);
    });
}

#[test]
fn joins_running_side_by_side_stay_under_the_cap_together() {
    let test = "joins_running_side_by_side_stay_under_the_cap_together";
    if !is_child(test) {
        let out = child_ok(test, None, Duration::from_secs(120), &[]);
        assert!(out.num("PEAK") <= out.num("CAP"), "{}", out.stdout);
        return;
    }
    use std::sync::atomic::AtomicUsize;
    const CAP: u64 = 5 << 20;
    // Eight executors of 1.5 MiB; joins over pairs (3 MiB): one fits
    // under the 5 MiB cap, two do not.
    let rt = Runtime::builder()
        .mem_cap(MemoryCap::Bytes(CAP))
        .workers(2)
        .build()
        .unwrap();
    let hs: Vec<_> = (0..8u8)
        .map(|i| rt.insert(PodVec::from(vec![i; 3 << 19])).unwrap())
        .collect();
    let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut b = rt.batch();
    for round in 0..10 {
        for p in 0..4 {
            let (x, y) = if round % 2 == 0 {
                (2 * p, 2 * p + 1)
            } else {
                (2 * p + 1, 2 * p)
            };
            noted_join(&mut b, &hs[x], &hs[y], &now, &peak);
        }
    }
    b.run().unwrap();
    let peak = peak.load(std::sync::atomic::Ordering::SeqCst);
    println!("PEAK={peak} CAP={CAP}");
    // Every join added its first block into its second, ten times.
    let total: u32 = hs
        .iter()
        .map(|h| u32::from(rt.read(h, |v: &PodVec<u8>| v[0]).unwrap()))
        .sum();
    assert!(total > 0);
}

#[test]
fn a_read_queued_behind_the_last_handles_drop_does_not_start() {
    let test = "a_read_queued_behind_the_last_handles_drop_does_not_start";
    if !is_child(test) {
        child_ok(test, None, Duration::from_secs(60), &[]);
        return;
    }
    use std::sync::mpsc;
    let rt = Runtime::builder().workers(2).build().unwrap();
    let x = rt.insert(vec![1u32; 8]).unwrap();
    let y = rt.insert(vec![2u32; 8]).unwrap();
    let z = rt.insert(vec![3u32; 8]).unwrap();
    // A join reads `x` and `y`, and holds them until told.
    let (started_tx, started) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let go_rx = std::sync::Mutex::new(go_rx);
    let mut first = rt.batch();
    first.read2(&x, &y, move |a: &Vec<u32>, b: &Vec<u32>| {
        started_tx.send(()).unwrap();
        let _ = go_rx.lock().unwrap().recv();
        a[0] + b[0]
    });
    // Queued before the drop, run after it: a read of `x` beside the one
    // in progress, and a task that wants `x` alone.
    let mut shared = rt.batch();
    shared.read2(&x, &z, |a: &Vec<u32>, c: &Vec<u32>| a[0] + c[0]);
    let mut alone = rt.batch();
    alone.read(&x, |a: &Vec<u32>| a[0]);
    let executors = rt.footprint().executors;
    let (r, r_alone) = std::thread::scope(|s| {
        let holder = s.spawn(move || first.run());
        started.recv().unwrap();
        let dropper = s.spawn(move || drop(x));
        // The drop has begun once `x` left the registry; it then waits
        // for the read in progress.
        while rt.footprint().executors == executors {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        let r = shared.run();
        go.send(()).unwrap();
        let r_alone = alone.run();
        dropper.join().unwrap();
        assert_eq!(holder.join().unwrap().unwrap(), vec![3]);
        (r, r_alone)
    });
    for r in [r.map(|v| v[0]), r_alone.map(|v| v[0])] {
        match r {
            Err(e @ Error::UnknownExecutor { removed: true, .. }) => {
                assert!(e.to_string().contains("was removed"), "{e}");
            }
            other => panic!("a task on an executor being dropped ran: {other:?}"),
        }
    }
}

#[test]
fn a_removed_executors_queued_task_says_it_was_removed() {
    let rt = Runtime::builder().workers(1).build().unwrap();
    let h = rt.insert_named(Some("A"), 1u32).unwrap();
    let label = format!("executor #{} (A)", h.id());
    let mut b = rt.batch();
    b.read(&h, |v: &u32| *v);
    drop(h);
    match b.run() {
        Err(e @ Error::UnknownExecutor { removed: true, .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&label) && msg.contains("was removed"), "{msg}");
            assert!(!msg.contains("does not belong"), "{msg}");
        }
        other => panic!("expected UnknownExecutor (removed), got {other:?}"),
    }
}
