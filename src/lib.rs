//! # outcore
//!
//! Run memory-hungry iterative jobs (mini-batch K-means, model training,
//! parallel scientific codes) under a memory cap, without crashing and
//! without thrashing.
//!
//! A job's state lives in **executors**: values that each hold a part of the
//! data or model. Tasks run on executors through a worker pool. When memory
//! runs short, outcore writes idle executors to disk and loads them back
//! when their turn comes, following the dispatch plan: the executor needed
//! last goes first, and the next ones are loaded ahead of time.
//!
//! ```text
//!   your job ── tasks ──► Runtime ── worker pool (one thread per core)
//!                           │ pins executors while tasks run
//!                           ▼
//!                  executor registry ◄── eviction queue (dispatch order)
//!                           │                     ▲
//!                           ▼                     │ "over the cap" /
//!                  spill store (files)        TrapAlloc (global allocator,
//!                                              jemalloc + accounting + trap)
//! ```
//!
//! The allocator is the safety net: an allocation anywhere in the process
//! (inside a task, in the job's own code) that would take usage over the
//! soft cap, or that fails under a hard limit such as `ulimit -v`, evicts
//! idle executors and retries instead of aborting.
//!
//! ## Example
//!
//! ```
//! use outcore::{MemoryCap, PodVec, Runtime};
//!
//! let rt = Runtime::builder()
//!     .mem_cap(MemoryCap::parse("64MiB")?)
//!     .build()?;
//!
//! // Eight executors of 16 MiB each: twice the cap.
//! let parts: Vec<_> = (0..8)
//!     .map(|i| rt.insert(PodVec::from(vec![i as f32; 4 << 20])))
//!     .collect::<Result<_, _>>()?;
//!
//! // One read-only sweep: results come back in submission order.
//! let mut batch = rt.batch();
//! for p in &parts {
//!     batch.read(p, |v: &PodVec<f32>| v.iter().map(|x| *x as f64).sum::<f64>());
//! }
//! let sums = batch.run()?;
//! assert_eq!(sums[3], 3.0 * (4 << 20) as f64);
//! assert!(rt.stats().evictions > 0);
//! # Ok::<(), outcore::Error>(())
//! ```
//!
//! ## Modules
//!
//! - [`alloc`]: `TrapAlloc`, accounting, the trap and the reserve; the C
//!   entry points for the `LD_PRELOAD` shim ([`alloc::ffi`]).
//! - [`executor`]: the executor state machine.
//! - [`evict`]: eviction policies.
//! - [`spill`]: the spill file format.
//! - [`cap`]: `MemoryCap` and limit detection.
//! - [`stats`]: counters and the JSON snapshot.
//! - [`kmeans`]: the memory-capped K-means job (`outcore kmeans`).
//! - [`train`]: logistic regression with model state in executors
//!   (`outcore train`).
//! - [`npy`]: streaming `.npy` reading and writing.

pub mod alloc;
pub mod cap;
mod error;
pub mod evict;
pub mod executor;
pub mod kmeans;
pub mod npy;
mod pod;
mod runtime;
pub mod spill;
pub mod stats;
pub mod train;

pub use alloc::{
    current_usage, flush_thread, flush_threshold, peak_usage, reset_peak, thread_net_allocated, TrapAlloc,
};
pub use cap::{format_bytes, parse_size, MemoryCap};
pub use error::{Error, ExecutorId, Result};
pub use evict::EvictionPolicy;
pub use executor::State;
pub use pod::{Plain, PodVec};
pub use runtime::{Batch, Builder, Handle, Runtime};
pub use stats::Stats;

/// The README's example, run as a doctest so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(feature = "global-allocator")]
#[global_allocator]
static GLOBAL: TrapAlloc = TrapAlloc::new();
