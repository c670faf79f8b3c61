//! Shared helpers for the integration tests: running a test body in a child
//! process (with its own allocator state, cap and `RLIMIT_AS`), and a small
//! deterministic job whose result can be compared across runs.

#![allow(dead_code)]

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use outcore::{PodVec, Runtime, TrapAlloc};
use serde::{Deserialize, Serialize};

/// Every test binary that includes this module runs with outcore's
/// allocator installed, as an application would.
#[global_allocator]
static GLOBAL: TrapAlloc = TrapAlloc::new();

const CHILD_VAR: &str = "OUTCORE_TEST_CHILD";

/// True in the child process started by [`run_child`] for `test`.
pub fn is_child(test: &str) -> bool {
    std::env::var(CHILD_VAR).is_ok_and(|v| v == test)
}

/// What a child process did.
#[derive(Debug)]
pub struct ChildOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl ChildOutput {
    /// The number in a `KEY=value` line the child printed (panics when
    /// there is none).
    pub fn num(&self, key: &str) -> u64 {
        self.value(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {}", self.stdout))
    }

    /// The value of a `KEY=value` line the child printed.
    pub fn value(&self, key: &str) -> Option<String> {
        let prefix = format!("{key}=");
        // libtest prints "test name ... " without a newline before the
        // child's first line, so look at whitespace-separated tokens.
        self.stdout
            .split_whitespace()
            .find_map(|t| t.strip_prefix(&prefix).map(str::to_string))
    }
}

/// Runs `test` in a child process (see [`run_child_with`]) and panics,
/// showing its output, unless it succeeded.
pub fn child_ok(
    test: &str,
    rlimit_as: Option<u64>,
    timeout: Duration,
    env: &[(&str, &str)],
) -> ChildOutput {
    let out = run_child_with(test, rlimit_as, timeout, env);
    assert!(
        out.status.success(),
        "{test} failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    out
}

/// Runs test `test` of the current test binary in a child process, with
/// `RLIMIT_AS` set to `rlimit_as` bytes (before exec, so the allocator
/// starts under it). Kills the child and panics if it runs longer than
/// `timeout`: a hang is a failure.
pub fn run_child(test: &str, rlimit_as: Option<u64>, timeout: Duration) -> ChildOutput {
    run_child_with(test, rlimit_as, timeout, &[])
}

/// [`run_child`] with extra environment variables (such as `LD_PRELOAD`).
pub fn run_child_with(
    test: &str,
    rlimit_as: Option<u64>,
    timeout: Duration,
    env: &[(&str, &str)],
) -> ChildOutput {
    let exe = std::env::current_exe().expect("current exe");
    // The child's temporary directory (its default spill directory): a
    // child that aborts on purpose cannot remove its spill directory, and
    // this one goes when the parent returns.
    let tmp = tempfile::tempdir().expect("temporary directory");
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, test)
        .env("RUST_BACKTRACE", "0")
        .env("TMPDIR", tmp.path())
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(limit) = rlimit_as {
        // SAFETY: the closure only calls setrlimit, which is
        // async-signal-safe, between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().expect("spawn child");
    let mut out_pipe = child.stdout.take().expect("stdout");
    let mut err_pipe = child.stderr.take().expect("stderr");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out_pipe.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = err_t.join().unwrap_or_default();
            panic!("child {test} hung for {timeout:?} and was killed; stderr:\n{stderr}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    ChildOutput {
        status,
        stdout: out_t.join().unwrap_or_default(),
        stderr: err_t.join().unwrap_or_default(),
    }
}

/// Address space the process maps now (`VmSize`), in bytes.
pub fn vm_size() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmSize:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// One executor of the test job: bulk data plus ordinary serde fields.
#[derive(Serialize, Deserialize, Clone, PartialEq, Debug)]
pub struct Part {
    pub index: u64,
    pub data: PodVec<f32>,
    pub tags: Vec<u64>,
    pub name: String,
    pub updates: u32,
}

impl Part {
    pub fn new(index: u64, elems: usize) -> Part {
        let data: Vec<f32> = (0..elems)
            .map(|j| ((index as usize * 131 + j * 17) % 1009) as f32 * 0.125)
            .collect();
        Part {
            index,
            data: PodVec::from(data),
            tags: (0..64).map(|k| index * 1000 + k).collect(),
            name: format!("part-{index}"),
            updates: 0,
        }
    }

    /// A checksum of everything in the part (bit-exact).
    pub fn checksum(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |x: u64| {
            h ^= x;
            h = h.wrapping_mul(0x0100_0000_01b3);
        };
        mix(self.index);
        for x in self.data.iter() {
            mix(u64::from(x.to_bits()));
        }
        for t in &self.tags {
            mix(*t);
        }
        for b in self.name.bytes() {
            mix(u64::from(b));
        }
        mix(u64::from(self.updates));
        h
    }

    pub fn update(&mut self) {
        for x in self.data.iter_mut() {
            *x = *x * 0.75 + 0.5;
        }
        self.updates += 1;
        self.tags.push(self.updates as u64);
    }
}

/// Runs the test job: `parts` executors of `part_bytes` each, swept with
/// the pattern in `sweeps` ('r' reads, 'w' updates). Returns a digest of
/// every task result in order.
pub fn run_job(rt: &Runtime, parts: usize, part_bytes: usize, sweeps: &str) -> u64 {
    run_job_with(rt, parts, part_bytes, sweeps, false)
}

/// [`run_job`], with every executor evicted before each sweep when
/// `evict_each` (`Runtime::evict_all`: every sweep loads them all).
pub fn run_job_with(
    rt: &Runtime,
    parts: usize,
    part_bytes: usize,
    sweeps: &str,
    evict_each: bool,
) -> u64 {
    let elems = part_bytes / 4;
    let handles: Vec<_> = (0..parts)
        .map(|i| rt.insert(Part::new(i as u64, elems)).expect("insert"))
        .collect();
    rt.hint_cycle(handles.iter().map(|h| h.id()));
    let mut digest: u64 = 0;
    for kind in sweeps.chars() {
        if evict_each {
            rt.evict_all().expect("evict");
        }
        let mut b = rt.batch();
        for h in &handles {
            if kind == 'w' {
                b.write(h, |p: &mut Part| {
                    p.update();
                    p.checksum()
                });
            } else {
                b.read(h, |p: &Part| p.checksum());
            }
        }
        for r in b.run().expect("batch") {
            digest = digest.rotate_left(7) ^ r;
        }
    }
    digest
}
