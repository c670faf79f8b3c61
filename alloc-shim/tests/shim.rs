//! The shim from the outside: C programs and real tools under LD_PRELOAD,
//! and the trap across languages (outcore executors evicted to satisfy C
//! allocations) in child processes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use outcore::{MemoryCap, PodVec, Runtime};

/// Builds (if needed) and returns the shim library of this profile.
fn shim() -> PathBuf {
    let exe = std::env::current_exe().expect("exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf();
    let so = profile_dir.join("liboutcore_shim.so");
    let mut args = vec!["build", "-p", "outcore-shim"];
    if profile_dir.ends_with("release") {
        args.push("--release");
    }
    let st = Command::new(env!("CARGO"))
        .args(&args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo build");
    assert!(st.success(), "building the shim failed");
    assert!(so.exists(), "{} missing", so.display());
    so
}

fn cc(src: &str, out: &Path) {
    let st = Command::new("cc")
        .args(["-O2", "-pthread", "-o"])
        .arg(out)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(src))
        .status()
        .expect("cc");
    assert!(st.success(), "compiling {src} failed");
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run")
}

#[test]
fn a_million_random_operations_from_several_threads_keep_every_block_intact() {
    let so = shim();
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("stress");
    cc("tests/stress.c", &bin);
    let plain = run(&mut Command::new(&bin));
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stdout)
    );
    let shimmed = run(Command::new(&bin)
        .env("LD_PRELOAD", &so)
        .env("OUTCORE_SHIM_STATS", "1"));
    let out = String::from_utf8_lossy(&shimmed.stdout);
    let err = String::from_utf8_lossy(&shimmed.stderr);
    assert!(shimmed.status.success(), "{out} {err}");
    assert!(out.contains("OK 1000000 ops"), "{out}");
    // The stats line proves the shim was in the path.
    let calls: u64 = err
        .split("calls ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(calls >= 500_000, "shim saw only {calls} calls: {err}");
}

#[test]
fn real_programs_run_unchanged_under_the_shim() {
    let so = shim();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    let text: String = (0..200_000u64)
        .map(|i| format!("{:x}\n", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
        .collect();
    std::fs::write(&input, &text).unwrap();
    let both = |prog: &str, args: &[&str]| {
        let a = run(Command::new(prog).args(args));
        let b = run(Command::new(prog).args(args).env("LD_PRELOAD", &so));
        assert!(a.status.success() && b.status.success(), "{prog} failed");
        assert!(a.stdout == b.stdout, "{prog} output differs under the shim");
        assert!(!a.stdout.is_empty());
        a.stdout
    };
    let sorted = both("sort", &[input.to_str().unwrap()]);
    assert_eq!(sorted.len(), text.len());
    let gz = both("gzip", &["-9", "-c", input.to_str().unwrap()]);
    let gz_path = dir.path().join("in.gz");
    std::fs::write(&gz_path, &gz).unwrap();
    assert_eq!(
        both("gzip", &["-dc", gz_path.to_str().unwrap()]),
        text.as_bytes()
    );
    // Python: numpy when it is installed (CI installs it), a pure-Python
    // allocation workload either way.
    let py = r#"
import json, random
random.seed(7)
d = {str(i): [random.random() for _ in range(20)] for i in range(20000)}
s = json.dumps(d, sort_keys=True)
print(len(s), sum(len(v) for v in json.loads(s).values()))
try:
    import numpy as np
    a = np.arange(2_000_000, dtype=np.float64).reshape(1000, 2000)
    b = (a @ a.T[:, :50]).sum()
    print("numpy", np.__version__, float(b))
except ImportError:
    print("numpy not installed")
"#;
    let out = both("python3", &["-c", py]);
    println!("{}", String::from_utf8_lossy(&out));
}

#[path = "../../tests/common/mod.rs"]
mod common;

use common::{is_child, ChildOutput};

/// Runs this test binary's `test` in a child, with LD_PRELOAD (optional),
/// RLIMIT_AS set before exec, and extra environment variables.
fn child(
    test: &str,
    preload: Option<&Path>,
    rlimit_as: Option<u64>,
    env: &[(&str, &str)],
) -> ChildOutput {
    let preload = preload.map(|p| p.to_string_lossy().into_owned());
    let mut vars: Vec<(&str, &str)> = env.to_vec();
    if let Some(p) = &preload {
        vars.push(("LD_PRELOAD", p));
    }
    common::run_child_with(test, rlimit_as, Duration::from_secs(180), &vars)
}

/// The job of the cross-language tests: executors holding `parts` x 16 MiB,
/// then C allocations of `blocks` x `block` bytes that stay alive, then a
/// check of every executor. Prints `C_MALLOC=ok|failed` and `SUMS=ok`.
fn cross_language_job(cap: MemoryCap, parts: usize, blocks: usize, block: usize) {
    let rt = Runtime::builder().mem_cap(cap).build().unwrap();
    let hs: Vec<_> = (0..parts)
        .map(|i| rt.insert(PodVec::from(vec![i as f32; 4 << 20])).unwrap())
        .collect();
    let mut held = Vec::new();
    let mut ok = true;
    for _ in 0..blocks {
        // SAFETY: plain C malloc; the block is freed below.
        let p = unsafe { libc::malloc(block) } as *mut u8;
        if p.is_null() {
            ok = false;
            break;
        }
        // SAFETY: `p` has `block` writable bytes.
        unsafe { std::ptr::write_bytes(p, 0xab, block) };
        held.push(p);
    }
    println!("C_MALLOC={}", if ok { "ok" } else { "failed" });
    print_sums(&rt, &hs, 4 << 20);
    println!("EVICTIONS={}", rt.stats().trap_evictions);
    for p in held {
        // SAFETY: allocated by malloc above.
        unsafe { libc::free(p.cast()) };
    }
}

/// Checks executor `i` holds `elems` copies of `i` (as the jobs insert
/// them) and prints `SUMS=ok|wrong`.
fn print_sums(rt: &Runtime, hs: &[outcore::Handle<PodVec<f32>>], elems: usize) {
    let mut b = rt.batch();
    for h in hs {
        b.read(h, |v: &PodVec<f32>| {
            v.iter().map(|&x| f64::from(x)).sum::<f64>()
        });
    }
    let sums = b.run().unwrap();
    let good = sums
        .iter()
        .enumerate()
        .all(|(i, &s)| s == i as f64 * elems as f64);
    println!("SUMS={}", if good { "ok" } else { "wrong" });
}

fn value(out: &ChildOutput, key: &str) -> Option<String> {
    out.value(key)
}

const HARD_LIMIT: u64 = 700 << 20;

#[test]
fn hard_limit_c_allocation() {
    if is_child("hard_limit_c_allocation") {
        // 384 MiB of executors, then 320 MiB of C blocks: together over the
        // limit (with start-up), each alone under it.
        cross_language_job(MemoryCap::None, 24, 10, 32 << 20);
    }
}

/// Under RLIMIT_AS, a C allocation fails without the shim; with it, the
/// runtime evicts executors and the allocation succeeds, results intact.
#[test]
fn the_trap_works_across_languages() {
    let so = shim();
    let without = child("hard_limit_c_allocation", None, Some(HARD_LIMIT), &[]);
    assert_eq!(
        value(&without, "C_MALLOC").as_deref(),
        Some("failed"),
        "without the shim the C allocation should fail: {:?}",
        without
    );
    let with = child(
        "hard_limit_c_allocation",
        Some(&so),
        Some(HARD_LIMIT),
        &[("OUTCORE_SHIM_STATS", "1")],
    );
    let err = with.stderr.as_str();
    assert!(with.status.success(), "{err}");
    assert_eq!(value(&with, "C_MALLOC").as_deref(), Some("ok"), "{err}");
    assert_eq!(value(&with, "SUMS").as_deref(), Some("ok"));
    let ev: u64 = value(&with, "EVICTIONS")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(ev > 0, "no executor was evicted for the C allocation");
    assert!(!err.contains("evictions requested 0,"), "{err}");
}

#[test]
fn mem_cap_c_allocation() {
    if is_child("mem_cap_c_allocation") {
        // No soft cap on the Rust side: only the shim's OUTCORE_MEM_CAP on
        // C allocations triggers evictions.
        cross_language_job(MemoryCap::None, 8, 12, 8 << 20);
    }
}

/// C allocations beyond OUTCORE_MEM_CAP make the runtime evict.
#[test]
fn c_allocations_over_the_cap_trigger_eviction() {
    let so = shim();
    let out = child(
        "mem_cap_c_allocation",
        Some(&so),
        None,
        &[("OUTCORE_MEM_CAP", "64MiB"), ("OUTCORE_SHIM_STATS", "1")],
    );
    let err = out.stderr.as_str();
    assert!(out.status.success(), "{err}");
    assert_eq!(value(&out, "C_MALLOC").as_deref(), Some("ok"));
    assert_eq!(value(&out, "SUMS").as_deref(), Some("ok"));
    let ev: u64 = value(&out, "EVICTIONS")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(ev > 0, "no eviction for C allocations over the cap: {err}");
    assert!(err.contains("cap 67108864"), "{err}");
    // Control: the same job without the cap evicts nothing.
    let plain = child("mem_cap_c_allocation", Some(&so), None, &[]);
    assert_eq!(value(&plain, "EVICTIONS").as_deref(), Some("0"));
}

/// The C example builds against outcore.h and runs with and without the
/// shim.
#[test]
fn the_c_example_builds_against_the_header() {
    let so = shim();
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("usage");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let st = Command::new("cc")
        .arg("-I")
        .arg(root.join("include"))
        .arg("-o")
        .arg(&bin)
        .arg(root.join("examples/usage.c"))
        .status()
        .unwrap();
    assert!(st.success());
    let plain = run(&mut Command::new(&bin));
    let out = String::from_utf8_lossy(&plain.stdout);
    assert!(
        out.contains("shim not loaded") && out.contains("no outcore runtime"),
        "{out}"
    );
    let shimmed = run(Command::new(&bin)
        .env("LD_PRELOAD", &so)
        .env("OUTCORE_MEM_CAP", "64MiB"));
    let out = String::from_utf8_lossy(&shimmed.stdout);
    assert!(out.contains("shim loaded: 16"), "{out}");
}

/// Failed allocations return NULL with errno = ENOMEM, in pass-through and
/// in the checking path (stats on).
#[test]
fn failures_set_errno_to_enomem() {
    let so = shim();
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("enomem");
    cc("tests/enomem.c", &bin);
    for stats in ["0", "1"] {
        let out = run(Command::new(&bin)
            .env("LD_PRELOAD", &so)
            .env("OUTCORE_SHIM_STATS", stats));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("ENOMEM OK"),
            "stats={stats}: {text}"
        );
        if stats == "1" {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("failures 3,"), "{err}");
        }
    }
}

#[test]
fn invalid_alignment_child() {
    if is_child("invalid_alignment_child") {
        let rt = Runtime::builder().build().unwrap();
        let hs: Vec<_> = (0..4)
            .map(|i| rt.insert(PodVec::from(vec![i as f32; 1 << 20])).unwrap())
            .collect();
        // SAFETY: plain C calls with invalid alignments; they must fail.
        // black_box keeps the compiler from assuming what an allocation
        // function returns.
        let (p, e1) = unsafe {
            let p = std::hint::black_box(libc::aligned_alloc(std::hint::black_box(3), 64));
            (p, *libc::__errno_location())
        };
        // SAFETY: as above.
        let (q, e2) = unsafe {
            let q = std::hint::black_box(libc::memalign(std::hint::black_box(usize::MAX), 64));
            (q, *libc::__errno_location())
        };
        println!("NULLS={}", p.is_null() && q.is_null());
        println!("EINVAL={}", e1 == libc::EINVAL && e2 == libc::EINVAL);
        println!("EVICTIONS={}", rt.stats().evictions);
        drop(hs);
    }
}

/// An invalid alignment is answered at once with EINVAL: no eviction, no
/// ENOMEM.
#[test]
fn invalid_alignments_fail_with_einval_and_evict_nothing() {
    let so = shim();
    let out = child("invalid_alignment_child", Some(&so), None, &[]);
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(value(&out, "NULLS").as_deref(), Some("true"));
    assert_eq!(
        value(&out, "EINVAL").as_deref(),
        Some("true"),
        "{}",
        out.stdout
    );
    assert_eq!(value(&out, "EVICTIONS").as_deref(), Some("0"));
}

#[test]
fn c_over_the_cap_child() {
    if is_child("c_over_the_cap_child") {
        // C allocations alone over OUTCORE_MEM_CAP (64 MiB) first.
        let held: Vec<*mut u8> = (0..10)
            // SAFETY: plain C malloc; freed below.
            .map(|_| unsafe { libc::malloc(8 << 20) } as *mut u8)
            .collect();
        let rt = Runtime::builder().build().unwrap();
        let hs: Vec<_> = (0..8)
            .map(|i| rt.insert(PodVec::from(vec![i as f32; 1 << 20])).unwrap())
            .collect();
        for _ in 0..10_000 {
            // SAFETY: malloc and free of a small block.
            unsafe { libc::free(std::hint::black_box(libc::malloc(64))) };
        }
        print_sums(&rt, &hs, 1 << 20);
        println!("EVICTIONS={}", rt.stats().evictions);
        for p in held {
            // SAFETY: allocated by malloc above.
            unsafe { libc::free(p.cast()) };
        }
    }
}

/// With the C allocations alone over the cap, evicting executors cannot
/// help: the shim evicts nothing (it used to evict on every malloc).
#[test]
fn c_usage_over_the_cap_evicts_nothing() {
    let so = shim();
    let out = child(
        "c_over_the_cap_child",
        Some(&so),
        None,
        &[("OUTCORE_MEM_CAP", "64MiB"), ("OUTCORE_SHIM_STATS", "1")],
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(value(&out, "SUMS").as_deref(), Some("ok"));
    assert_eq!(
        value(&out, "EVICTIONS").as_deref(),
        Some("0"),
        "{}",
        out.stderr
    );
}

/// Without a runtime, the shim looks the eviction entry point up once, not
/// on every failing allocation.
#[test]
fn a_missing_entry_point_is_looked_up_once() {
    let so = shim();
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("enomem_limit");
    cc("tests/enomem_limit.c", &bin);
    let out = run(Command::new(&bin)
        .env("LD_PRELOAD", &so)
        .env("OUTCORE_SHIM_STATS", "1"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("failures 3,"), "{err}");
    assert!(err.contains("lookups 1,"), "{err}");
}

#[test]
fn hopeless_c_allocation_child() {
    if is_child("hopeless_c_allocation_child") {
        let rt = Runtime::builder().build().unwrap();
        let hs: Vec<_> = (0..4)
            .map(|i| rt.insert(PodVec::from(vec![i as f32; 1 << 20])).unwrap())
            .collect();
        // SAFETY: a plain C malloc of 64 TiB (more than any machine like
        // this one has); it must fail.
        let p = unsafe { std::hint::black_box(libc::malloc(std::hint::black_box(1 << 46))) };
        println!("NULL={}", p.is_null());
        println!("EVICTIONS={}", rt.stats().evictions);
        print_sums(&rt, &hs, 1 << 20);
    }
}

/// A C request larger than the machine (or than RLIMIT_AS) fails at once,
/// as the runtime refuses such a Rust request: it used to evict every
/// executor first.
#[test]
fn a_hopeless_c_allocation_evicts_nothing() {
    let so = shim();
    let out = child("hopeless_c_allocation_child", Some(&so), None, &[]);
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(value(&out, "NULL").as_deref(), Some("true"));
    assert_eq!(
        value(&out, "EVICTIONS").as_deref(),
        Some("0"),
        "{}",
        out.stdout
    );
    assert_eq!(value(&out, "SUMS").as_deref(), Some("ok"));
}

#[test]
fn errno_child() {
    if is_child("errno_child") {
        // SAFETY: plain C calls; errno is thread-local.
        let kept = unsafe {
            *libc::__errno_location() = 1234;
            let p = std::hint::black_box(libc::aligned_alloc(64, 64));
            let q = std::hint::black_box(libc::memalign(64, 64));
            let e = *libc::__errno_location();
            libc::free(p);
            libc::free(q);
            !p.is_null() && !q.is_null() && e == 1234
        };
        println!("ERRNO_KEPT={kept}");
    }
}

/// A successful `aligned_alloc` or `memalign` leaves `errno` as it was
/// (it used to be set to 0, which no C library function does).
#[test]
fn successful_aligned_allocations_leave_errno_alone() {
    let so = shim();
    for stats in ["0", "1"] {
        let out = child(
            "errno_child",
            Some(&so),
            None,
            &[("OUTCORE_SHIM_STATS", stats)],
        );
        assert!(out.status.success(), "{}", out.stderr);
        assert_eq!(
            value(&out, "ERRNO_KEPT").as_deref(),
            Some("true"),
            "stats={stats}"
        );
    }
}

#[test]
fn empty_child() {
    if is_child("empty_child") {
        // SAFETY: a small C allocation, so the shim starts.
        unsafe { libc::free(std::hint::black_box(libc::malloc(64))) };
    }
}

/// `OUTCORE_MEM_CAP` is read as the runtime reads sizes (any case, a
/// space, TB); what is not a size is said on stderr instead of meaning
/// "no cap" silently.
#[test]
fn the_shim_reads_sizes_as_the_runtime_does() {
    let so = shim();
    for (text, bytes) in [
        ("2 MiB", 2u64 << 20),
        ("2MIB", 2 << 20),
        (" 4mib ", 4 << 20),
        ("1TB", 1_000_000_000_000),
        ("1.5G", 3 << 29),
        // The runtime's rounding: the shim parses with the runtime's code
        // (src/size.rs). Its own copy dropped digits past the sixth
        // (1.5 GiB exactly here).
        ("1.50000001G", 1_610_612_747),
        ("none", 0),
        ("0", 0),
    ] {
        if bytes != 0 {
            assert_eq!(outcore::parse_size(text).unwrap(), bytes, "{text}");
        }
        let out = child(
            "empty_child",
            Some(&so),
            None,
            &[("OUTCORE_MEM_CAP", text), ("OUTCORE_SHIM_STATS", "1")],
        );
        assert!(
            out.stderr.contains(&format!("cap {bytes}\n")),
            "{text}: {}",
            out.stderr
        );
        assert!(!out.stderr.contains("not a size"), "{}", out.stderr);
    }
    let out = child(
        "empty_child",
        Some(&so),
        None,
        &[("OUTCORE_MEM_CAP", "lots"), ("OUTCORE_SHIM_STATS", "1")],
    );
    assert!(
        out.stderr
            .contains("outcore-shim: OUTCORE_MEM_CAP='lots' is not a size"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("cap 0\n"), "{}", out.stderr);
}

/// A program that registered an eviction entry point (from a library it
/// will unload) can withdraw it with NULL: it used to be ignored, and the
/// shim called into the unloaded library (a segfault).
#[test]
fn a_registered_entry_point_can_be_withdrawn() {
    let so = shim();
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("withdraw");
    cc("tests/withdraw.c", &bin);
    let out = run(Command::new(&bin).env("LD_PRELOAD", &so));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("AFTER=0"), "{text}");
    assert!(!text.contains("FIRST=0"), "{text}");
}
