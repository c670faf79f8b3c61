//! # outcore-jobs
//!
//! Iterative jobs built on the [`outcore`] runtime, whose data and model
//! state live in executors that the runtime spills to disk under a memory
//! cap, and the `outcore` command line that runs them.
//!
//! ```text
//!   Source (synthetic blobs, .npy, .npz, .fvecs, raw)     Labels (supervised)
//!        │                                                   │
//!        ▼                                                   ▼
//!   input layer: row readers ─► one executor per block of rows, sweep order
//!        │                      declared to the runtime (hint_cycle)
//!        ├──► kmeans: Partition executors, read-only sweeps (mini-batch, Lloyd)
//!        └──► train:  Shard executors, L-BFGS passes (or local SGD + averaging)
//!                        │
//!                        ▼
//!   outputs (.npy arrays, JSON statistics), written atomically
//! ```
//!
//! Results do not depend on the cap: every reduction runs in a fixed order,
//! so a job gives the same answer, bit for bit, however much of its data
//! was spilled.
//!
//! The application installs outcore's allocator; this crate does not:
//!
//! ```
//! use outcore::{MemoryCap, Runtime};
//! use outcore_jobs::kmeans::{self, Config};
//! use outcore_jobs::{Session, Source};
//! # #[global_allocator]
//! # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
//!
//! let session = Session::new(
//!     Runtime::builder()
//!         .mem_cap(MemoryCap::parse("64MiB")?)
//!         .build()?,
//! );
//! let cfg = Config {
//!     k: 8,
//!     ..Config::default()
//! };
//! // 4 MiB of 16-dimensional points around 8 blobs, in partitions of
//! // about 256 KiB cut for `cfg`'s tasks.
//! let src = Source::synthetic(4 << 20, 16, 8, 1);
//! let ds = kmeans::load(&session, &src, None, Some(&cfg), 256 << 10, |_, _| {})?;
//! let out = kmeans::run(&session, &ds, &cfg, |_| {})?;
//! assert_eq!(out.centers.values.len(), 8 * 16);
//! # Ok::<(), outcore_jobs::Error>(())
//! ```
//!
//! ## What the crate offers
//!
//! - [`kmeans`]: memory-capped K-means (`outcore kmeans`).
//! - [`train`]: logistic regression with model state in executors
//!   (`outcore train`).
//! - [`job`]: the job interface: an algorithm declares its passes of sums
//!   ([`job::Algorithm`]) or its row-by-row updates ([`job::Online`]);
//!   the drivers ([`job::fit`], [`job::fit_online`]) own the input, the
//!   order of every sum, the budget, the statistics and MPI. On it:
//!   [`linear`] (linear and ridge regression, `outcore linear`), [`pca`]
//!   (`outcore pca`) and [`sgd`] (SGD classifiers and regressors,
//!   `outcore sgd`).
//! - [`Source`], [`Labels`], [`Partitioned`]: the input layer both jobs
//!   load through.
//! - [`timeline`]: a CSV of memory and traffic sampled while a job runs
//!   (`--timeline`), and its reader.
//! - [`ranks`]: the jobs on MPI ranks (the `mpi` feature) with results
//!   that do not depend on the number of ranks ([`ranks::Ranks::ordered_sum`]).
//! - [`npy`]: `.npy` arrays in and out; [`write_json`] and
//!   [`check_writable`] for the other outputs.
//! - [`Session`]: what every job shares (the runtime, ranks, phases,
//!   totals); [`Workers`]: how many worker threads a cap holds.
//! - [`apply`]: a fitted model applied to new rows in one streamed pass
//!   (nearest centre, distances, `X W^T + b`);
//! - [`Error`], [`Result`].
//!
//! ## Source layout
//!
//! - `lib.rs` (this file): the public API;
//! - `session.rs`: the session, what every job shares (runtime, ranks,
//!   phases, totals);
//! - `input/`: the input layer both jobs share (its `mod.rs` lists its
//!   files);
//! - `kmeans/`, `train/`: the jobs (each `mod.rs` lists its files);
//! - `job/`: the job interface, its drivers and float64 linear algebra;
//!   `linear/`, `pca/`, `sgd/`: the algorithms on it;
//! - `memory.rs`: a job's working memory reserved by name against the
//!   cap;
//! - `ranks/`: MPI ranks (feature `mpi`): `Shards`, `Ranks::ordered_sum`;
//! - `apply.rs`: a fitted model applied to rows from a file or memory;
//! - `par.rs`: work spread over a few scoped threads;
//! - `npy/`: `.npy`/`.npz` reading (npyz headers, zip archives), `.npy`
//!   writing;
//! - `files.rs`: files written whole or not at all; opening inputs;
//! - `workers.rs`: how many worker threads a cap holds ([`Workers`]);
//! - `timeline.rs`: `--timeline`, the sampler thread and the CSV reader;
//! - `error.rs`: the one error enum of the jobs;
//! - `main.rs` and `cli/`: the `outcore` binary (it installs `TrapAlloc`)
//!   and its command line: shared flags, one file per subcommand, the
//!   progress lines and the interruption handler;
//! - `../assets/`: the font `outcore plot` embeds (a DejaVu Sans subset,
//!   its license).

#![deny(missing_docs, missing_debug_implementations)]
// At most 80 lines a function, here and in the command line (main.rs);
// the threshold is in clippy.toml.
#![deny(clippy::too_many_lines)]

pub mod apply;
mod error;
mod files;
pub mod grow;
mod input;
pub mod job;
pub mod kmeans;
pub mod linear;
pub mod memory;
pub mod npy;
mod par;
pub mod pca;
pub mod ranks;
#[cfg(feature = "mpi")]
pub mod remote;
mod session;
pub mod sgd;
pub mod timeline;
pub mod train;
mod workers;

pub use error::{Error, Result};
pub use files::{
    check_file_size, check_outputs, check_room, check_writable, remove_partial_outputs, write_file,
    write_json,
};
pub use input::{BlockReader, InputReads, Labels, Partitioned, Source};
pub use session::{ProcessTotals, Report, RunFigures, Session, SessionFigures, Totals};
pub use workers::{partition_bytes, Workers, THREAD_BYTES};

/// Runs `batch` and hands each task's result to `each` in submission order
/// as it comes (see [`outcore::Batch::run_in_order`]). Every task runs; the
/// first error, a task's or `each`'s, is returned, and `each` is not called
/// after it.
pub(crate) fn fold_in_order<R: Send + 'static>(
    batch: outcore::Batch<'_, R>,
    mut each: impl FnMut(usize, R) -> Result<()>,
) -> Result<()> {
    let mut outcome: Result<()> = Ok(());
    batch.run_in_order(|i, r| {
        if outcome.is_ok() {
            outcome = r.map_err(Error::from).and_then(|v| each(i, v));
        }
    });
    outcome
}

/// A zeroed vector, its zeros written by the program.
///
/// `vec![0.0; n]` asks the allocator for zeroed memory. For sizes from
/// 16 KiB on, jemalloc gets it by handing back a recycled extent after
/// `madvise(MADV_DONTNEED)`, which flushes the extent from every core's
/// TLB (an interrupt to each core running a worker) and leaves pages that
/// fault in again, zeroed by the kernel, at their first touch (or map the
/// shared zero page first and fault again at the first write). Per task,
/// that cost 12% of K-means' time once, and 2-3% where only the kernel's
/// scratch tiles and the combine's sums still did it. Writing the zeros
/// here reuses the memory as it is: a `memset`, no system call.
pub(crate) fn zeros<T: Copy + Default>(n: usize) -> Vec<T> {
    let mut v = Vec::with_capacity(n);
    v.resize(n, T::default());
    v
}

/// The unit tests run with the allocator installed, as an application
/// would.
#[cfg(test)]
#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
