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
//! idle executors and retries instead of aborting. **The application
//! installs it**, with one line:
//!
//! ```
//! #[global_allocator]
//! static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
//! # fn main() {}
//! ```
//!
//! A runtime built with a cap refuses to start without it
//! ([`Error::AllocatorNotInstalled`]), rather than run with a cap that does
//! nothing.
//!
//! ## Example
//!
//! ```
//! use outcore::{MemoryCap, PodVec, Runtime};
//! # #[global_allocator]
//! # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
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
//! ## What the crate offers
//!
//! - [`Runtime`] (built with [`Builder`]), [`Handle`], [`Batch`],
//!   [`TaskContext`], [`CycleId`]: executors and tasks.
//! - [`TrapAlloc`] and the usage queries [`current_usage`],
//!   [`peak_usage`], [`reset_peak`], [`thread_net_allocated`],
//!   [`flush_thread`], [`flush_threshold`], [`flush_threshold_for`].
//! - [`MemoryCap`], [`parse_size`], [`format_bytes`]: sizes and caps.
//! - [`EvictionPolicy`]: which executor goes first.
//! - [`PodVec`] ([`Plain`] element types): a vector that spills at memory
//!   speed.
//! - [`Lineage`]: how to rebuild an executor instead of spilling it, and
//!   [`Checksum`], fast enough to check that its source has not changed.
//! - [`remove_spill_on_signal`], [`remove_spill_dirs`]: no spill files
//!   left when SIGINT or SIGTERM ends the process.
//! - [`Stats`], [`State`], [`Error`], [`Result`], [`ExecutorId`].
//!
//! ## Executor states
//!
//! An executor is Resident, Pinned (a task runs on it), Evicting, Evicted,
//! Loading, Poisoned, Damaged or Removed: the diagram is on [`State`].
//!
//! ## Source layout
//!
//! Private modules, one job each, behind the flat API above; each folder's
//! `mod.rs` lists its files.
//!
//! - `alloc/`: [`TrapAlloc`] (its `README.md`: the protocol and why its
//!   orderings suffice);
//! - `runtime/`: [`Runtime`] and its parts, one job a file;
//! - `policy/`: eviction policies behind one trait (`mod.rs`: the
//!   contract);
//! - `executor/`: the slot and its state machine (`README.md`);
//! - `spill/`: the spill-file format and store (`tests.rs`: every
//!   corruption);
//! - `cap.rs`: [`MemoryCap`], sizes, limit detection;
//! - `checksum.rs`: [`Checksum`];
//! - `error.rs`: the one error enum;
//! - `lineage.rs`: [`Lineage`];
//! - `pod.rs`: [`PodVec`], plain numeric vectors that spill at memory speed;
//! - `readahead.rs`: the one read-ahead engine (native AIO), for spill
//!   loads and the jobs' input reads (hidden from the docs: not a stable
//!   API);
//! - `signal.rs`: [`remove_spill_on_signal`];
//! - `size.rs`: the size parser, shared with the shim (`#[path]`);
//! - `stats.rs`: counters and the JSON snapshot;
//! - `units.rs`: [`format_bytes`].

#![deny(missing_docs, missing_debug_implementations)]
// At most 80 lines a function in src/ (the threshold is in clippy.toml);
// examples, benches and tests/ are not held to it.
#![deny(clippy::too_many_lines)]

mod alloc;
mod cap;
mod checksum;
mod error;
mod executor;
mod lineage;
mod pod;
mod policy;
#[doc(hidden)]
pub mod readahead;
mod runtime;
mod signal;
mod size;
mod spill;
mod stats;
mod units;

pub use alloc::{
    current_usage, flush_thread, flush_threshold, flush_threshold_for, peak_usage, reset_peak,
    set_process_name, thread_net_allocated, TrapAlloc,
};
pub use cap::{parse_size, resident_set, MemoryCap};
pub use checksum::Checksum;
pub use error::{Error, ExecutorId, Result};
pub use executor::State;
pub use lineage::Lineage;
pub use pod::{Plain, PodVec};
pub use policy::EvictionPolicy;
pub use runtime::{
    AnyHandle, Batch, Builder, CycleId, Handle, Interrupter, Join, Key, Monitor, ReadHandle,
    Runtime, TaskContext, MAX_WORKERS,
};
pub use signal::{remove_spill_dirs, remove_spill_on_signal};
pub use spill::dir::ScratchDir;
pub use spill::{Reclaim, SpillTier, TierHead, TierKey, TIER_HEAD_LEN};
pub use stats::{Footprint, Stats};
pub use units::format_bytes;

/// The spill-file codec, for the fuzz target (`fuzz/`); not a stable API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::spill::{decode_bytes, encode_bytes, fingerprint, FileKey, HEADER_LEN};
}

/// The crate's own unit tests run with the allocator installed, as an
/// application would (not under Miri, which cannot run jemalloc).
#[cfg(all(test, not(miri)))]
#[global_allocator]
static GLOBAL: TrapAlloc = TrapAlloc::new();

/// The README's examples, run as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The examples of `docs/cli.md`, run as doctests (it has no Rust block
/// today; any it gets is compiled).
#[cfg(doctest)]
#[doc = include_str!("../docs/cli.md")]
pub struct CliDoctests;

/// The examples of `docs/library.md`, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/library.md")]
pub struct LibraryDoctests;

/// The examples of `docs/mpi.md`, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/mpi.md")]
pub struct MpiDoctests;

/// The examples of `docs/shim.md`, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/shim.md")]
pub struct ShimDoctests;

/// The examples of `docs/design.md`, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/design.md")]
pub struct DesignDoctests;

/// The examples of `docs/reliability.md`, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/reliability.md")]
pub struct ReliabilityDoctests;
