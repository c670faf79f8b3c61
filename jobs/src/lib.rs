//! # outcore-jobs
//!
//! The jobs built on the [`outcore`] runtime, and the `outcore` command
//! line (`src/main.rs`, `src/cli.rs`):
//!
//! - [`input`]: the input layer every job shares: sources (synthetic
//!   Gaussian blobs, `.npy`, `.fvecs`, raw float32), row readers, and
//!   streaming rows into partition executors with their sweep order
//!   declared;
//! - [`output`]: files written whole or not at all (a temporary file
//!   renamed into place);
//! - [`npy`]: `.npy` reading and writing;
//! - [`kmeans`]: memory-capped K-means (mini-batch and Lloyd);
//! - [`train`]: multinomial logistic regression with the model state in
//!   executors.
//!
//! The library leaves the global allocator to the program: the `outcore`
//! binary, the tests and the examples install
//! [`outcore::TrapAlloc`].

#![deny(missing_docs)]

mod error;
pub mod input;
pub mod kmeans;
pub mod npy;
pub mod output;
pub mod train;

pub use error::{Error, Result};

/// The unit tests run with outcore's allocator installed, as the binary
/// does.
#[cfg(test)]
#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
