//! The machine's fused multiply-add peak, measured: what the distance
//! kernel's rate is compared with (issue 55's "75% of the FMA peak").
//!
//! Each thread runs twelve independent chains of vector FMAs held in
//! registers (enough to cover the FMA latency on both FMA ports), with
//! 512-bit vectors where the CPU has AVX-512F and 256-bit vectors where it
//! has AVX2 and FMA, for about half a second; the rate counts two
//! operations per lane and FMA. Run on one thread and on every core:
//!
//! ```text
//! cargo bench -p outcore-jobs --bench fma_peak [-- --seconds 0.5]
//! ```
//!
//! The last line is JSON (`{"isa": ..., "threads": ..., "gflops": ...}`
//! per run, and `peak`, the best rate on every core), for scripts such as
//! `benches/inmemory.py --peak`.

use std::time::{Duration, Instant};

/// Independent FMA chains per thread.
const CHAINS: usize = 12;

/// Iterations between two looks at the clock.
const BATCH: u64 = 1 << 16;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{BATCH, CHAINS};

    /// `BATCH` rounds of `CHAINS` 512-bit FMAs; a value that depends on
    /// all of them (so none is optimised away).
    ///
    /// # Safety
    ///
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn round512(seed: f32) -> f32 {
        let a = _mm512_set1_ps(1.000_001);
        let b = _mm512_set1_ps(-0.000_001);
        let mut acc = [_mm512_set1_ps(seed); CHAINS];
        for _ in 0..BATCH {
            for v in acc.iter_mut() {
                *v = _mm512_fmadd_ps(*v, a, b);
            }
        }
        let sum = acc
            .iter()
            .fold(_mm512_setzero_ps(), |s, v| _mm512_add_ps(s, *v));
        _mm512_reduce_add_ps(sum)
    }

    /// As [`round512`] with 256-bit vectors.
    ///
    /// # Safety
    ///
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn round256(seed: f32) -> f32 {
        let a = _mm256_set1_ps(1.000_001);
        let b = _mm256_set1_ps(-0.000_001);
        let mut acc = [_mm256_set1_ps(seed); CHAINS];
        for _ in 0..BATCH {
            for v in acc.iter_mut() {
                *v = _mm256_fmadd_ps(*v, a, b);
            }
        }
        let sum = acc
            .iter()
            .fold(_mm256_setzero_ps(), |s, v| _mm256_add_ps(s, *v));
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds the eight floats the unaligned store
        // writes.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
        lanes.iter().sum()
    }
}

/// An instruction set the loop can run, and the lanes of its vectors.
#[derive(Clone, Copy)]
enum Isa {
    Avx512,
    Avx2,
}

impl Isa {
    fn available() -> Vec<Isa> {
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                v.push(Isa::Avx512);
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                v.push(Isa::Avx2);
            }
        }
        v
    }

    fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
        }
    }

    fn lanes(self) -> u64 {
        match self {
            Isa::Avx512 => 16,
            Isa::Avx2 => 8,
        }
    }

    /// One batch of rounds.
    fn round(self, seed: f32) -> f32 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `available` listed this instruction set only after
        // checking that the CPU has it.
        unsafe {
            match self {
                Isa::Avx512 => x86::round512(seed),
                Isa::Avx2 => x86::round256(seed),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            seed
        }
    }
}

/// GFLOP/s of `threads` threads running `isa`'s loop for `secs`.
fn rate(isa: Isa, threads: usize, secs: f64) -> f64 {
    let span = Duration::from_secs_f64(secs);
    let batches: u64 = std::thread::scope(|s| {
        let runs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let start = Instant::now();
                    let (mut n, mut x) = (0u64, t as f32);
                    while start.elapsed() < span {
                        x = isa.round(x);
                        n += 1;
                    }
                    std::hint::black_box(x);
                    (n, start.elapsed().as_secs_f64())
                })
            })
            .collect();
        runs.into_iter()
            .map(|r| {
                let (n, took) = r.join().unwrap_or((0, secs));
                // Scaled to the span, so a thread that overran counts at
                // its own rate.
                (n as f64 * secs / took) as u64
            })
            .sum()
    });
    let flops = batches as f64 * (BATCH * CHAINS as u64 * isa.lanes() * 2) as f64;
    flops / secs / 1e9
}

fn main() {
    let mut secs = 0.5;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--seconds") {
        secs = args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(secs);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut runs = Vec::new();
    let mut peak = 0f64;
    for isa in Isa::available() {
        for threads in [1, cores] {
            let g = rate(isa, threads, secs);
            println!("{:7} {threads} thread(s): {g:8.1} GFLOP/s", isa.name());
            if threads == cores {
                peak = peak.max(g);
            }
            runs.push(format!(
                r#"{{"isa": "{}", "threads": {threads}, "gflops": {g:.1}}}"#,
                isa.name()
            ));
        }
    }
    println!(r#"{{"runs": [{}], "peak": {peak:.1}}}"#, runs.join(", "));
}
