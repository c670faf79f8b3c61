//! Quickstart: executors holding `--data` bytes in total under a smaller
//! `--mem-cap`, swept several times with read-only and updating tasks.
//!
//! ```text
//! cargo run --release --example quickstart -- --mem-cap 256MiB --data 1GiB
//! ```
//!
//! Every result is checked against a recomputation; the last line of output
//! is the runtime's stats as one JSON object.

use std::process::ExitCode;
use std::time::Instant;

use outcore::{parse_size, EvictionPolicy, MemoryCap, PodVec, Runtime, MAX_WORKERS};

/// outcore's allocator, installed by the program (one line).
#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();

struct Args {
    cap: MemoryCap,
    data: u64,
    part: u64,
    policy: EvictionPolicy,
    workers: Option<usize>,
    spill_dir: Option<String>,
    sweeps: String,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        cap: MemoryCap::Bytes(256 << 20),
        data: 1 << 30,
        part: 16 << 20,
        policy: EvictionPolicy::Priority,
        workers: None,
        spill_dir: None,
        sweeps: "rwrwr".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--mem-cap" => {
                a.cap = MemoryCap::parse(&val()?).map_err(|e| format!("--mem-cap: {e}"))?
            }
            "--data" => a.data = parse_size(&val()?).map_err(|e| format!("--data: {e}"))?,
            "--part" => a.part = parse_size(&val()?).map_err(|e| format!("--part: {e}"))?,
            "--policy" => {
                a.policy = val()?
                    .parse()
                    .map_err(|e: outcore::Error| format!("--policy: {e}"))?
            }
            "--workers" => {
                let v = val()?;
                match v.parse::<usize>() {
                    Ok(n) if (1..=MAX_WORKERS).contains(&n) => a.workers = Some(n),
                    _ => {
                        return Err(format!(
                            "--workers takes a whole number from 1 to {MAX_WORKERS}, not '{v}'"
                        ))
                    }
                }
            }
            "--spill-dir" => a.spill_dir = Some(val()?),
            "--sweeps" => {
                a.sweeps = val()?;
                if a.sweeps.is_empty() || !a.sweeps.chars().all(|c| c == 'r' || c == 'w') {
                    return Err(
                        "--sweeps takes a string of 'r' (read) and 'w' (write), like rwrwr".into(),
                    );
                }
            }
            "-h" | "--help" => {
                println!(
                    "usage: quickstart [--mem-cap SIZE|auto|none] [--data SIZE] [--part SIZE] \
                     [--policy priority|lru] [--workers N] [--spill-dir DIR] [--sweeps rwrwr]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument '{other}' (try --help)")),
        }
    }
    if a.part < 4 || a.data < a.part {
        return Err("--data must be at least --part, and --part at least 4 bytes".into());
    }
    Ok(a)
}

/// The initial value of element `j` of executor `i`.
fn initial(i: usize, j: usize) -> f32 {
    ((i * 31 + j * 7) % 1000) as f32 * 0.25
}

/// The update a write sweep applies to every element.
fn update(x: f32) -> f32 {
    x * 0.5 + 1.0
}

fn sum(v: &[f32]) -> f64 {
    v.iter().map(|&x| f64::from(x)).sum()
}

fn run(a: Args) -> Result<(), String> {
    let mut b = Runtime::builder().mem_cap(a.cap).policy(a.policy);
    if let Some(w) = a.workers {
        b = b.workers(w);
    }
    if let Some(d) = &a.spill_dir {
        b = b.spill_dir(d);
    }
    let rt = b.build().map_err(|e| e.to_string())?;
    let parts = (a.data / a.part) as usize;
    let elems = (a.part / 4) as usize;
    eprintln!(
        "quickstart: {parts} executors of {} ({} total) under cap {}, policy {:?}, {} workers",
        outcore::format_bytes(a.part),
        outcore::format_bytes(parts as u64 * a.part),
        a.cap,
        a.policy,
        rt.workers()
    );
    let t0 = Instant::now();
    let mut handles = Vec::with_capacity(parts);
    for i in 0..parts {
        let v: Vec<f32> = (0..elems).map(|j| initial(i, j)).collect();
        handles.push(rt.insert(PodVec::from(v)).map_err(|e| e.to_string())?);
    }
    rt.hint_cycle(handles.iter().map(|h| h.id()));
    eprintln!("  built in {:.2}s", t0.elapsed().as_secs_f64());

    let mut writes = 0usize;
    for (k, kind) in a.sweeps.chars().enumerate() {
        let t = Instant::now();
        let mut batch = rt.batch();
        for h in &handles {
            if kind == 'w' {
                batch.write(h, |v: &mut PodVec<f32>| {
                    for x in v.iter_mut() {
                        *x = update(*x);
                    }
                    sum(v)
                });
            } else {
                batch.read(h, |v: &PodVec<f32>| sum(v));
            }
        }
        let sums = batch.run().map_err(|e| e.to_string())?;
        if kind == 'w' {
            writes += 1;
        }
        // Check every executor against a recomputation.
        for (i, got) in sums.iter().enumerate() {
            let want: f64 = (0..elems)
                .map(|j| {
                    let mut x = initial(i, j);
                    for _ in 0..writes {
                        x = update(x);
                    }
                    f64::from(x)
                })
                .sum();
            if *got != want {
                return Err(format!(
                    "sweep {k}: executor {i} sums to {got}, expected {want}"
                ));
            }
        }
        let s = rt.stats();
        eprintln!(
            "  sweep {k} ({}): {:.2}s, evictions {} (clean {}), loads {}, written {}, read {}",
            if kind == 'w' { "write" } else { "read" },
            t.elapsed().as_secs_f64(),
            s.evictions,
            s.clean_evictions,
            s.loads,
            outcore::format_bytes(s.bytes_written),
            outcore::format_bytes(s.bytes_read)
        );
    }
    let s = rt.stats();
    eprintln!(
        "  all {} sweeps correct in {:.2}s; peak accounted {}",
        a.sweeps.len(),
        t0.elapsed().as_secs_f64(),
        outcore::format_bytes(s.peak_bytes)
    );
    // What the runtime found wrong in the way it was used, once each.
    for w in &s.warnings {
        eprintln!("quickstart: warning: {w}");
    }
    println!("{}", s.to_json());
    Ok(())
}

fn main() -> ExitCode {
    // Ctrl-C or SIGTERM removes the spill files before the process ends.
    outcore::remove_spill_on_signal();
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("quickstart: error: {e}");
            return ExitCode::from(2);
        }
    };
    match run(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quickstart: error: {e}");
            ExitCode::FAILURE
        }
    }
}
