//! The training loop with model state in executors: shards holding data and
//! a model replica each, local SGD as write tasks, averaging into a global
//! model executor, held-out accuracy per round.
//!
//! ```text
//! cargo run --release --example train_loop
//! ```

use outcore::{format_bytes, MemoryCap, Runtime};
use outcore_jobs::train::{self, Event, Solver, TrainConfig};
use outcore_jobs::{Labels, Session, Source};

#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();

fn main() -> Result<(), outcore_jobs::Error> {
    let session = Session::new(
        Runtime::builder()
            .mem_cap(MemoryCap::parse("96MiB")?)
            .build()?,
    );
    let rt = session.runtime();
    let (dims, classes, seed) = (64, 8, 7);
    // 256 MiB of labelled points: eight Gaussian blobs, one per class.
    let src = Source::synthetic(256 << 20, dims, classes, seed);
    let labels = Labels::Blobs;
    let cfg = TrainConfig {
        solver: Solver::Sgd,
        rounds: 4,
        ..TrainConfig::default()
    };
    // Shards of 8 MiB: 32 of them under a 96 MiB cap.
    let job = train::load(
        &session,
        &src,
        train::Targets {
            labels: &labels,
            weights: None,
            classes: Some(classes),
        },
        8 << 20,
        &cfg,
        |_, _| {},
    )?;
    println!(
        "{} rows in {} shards; global model in its own executor",
        job.rows,
        job.shards.len()
    );
    let out = train::train(&session, &job, &cfg, |ev| {
        let Event::Round(r) = ev else { return };
        let s = rt.stats();
        println!(
            "round {}: {:.2}s, held-out accuracy {:.2}%, written so far {} (dirty replicas), read {}",
            r.index + 1,
            r.seconds,
            r.accuracy * 100.0,
            format_bytes(s.bytes_written),
            format_bytes(s.bytes_read)
        );
    })?;
    println!(
        "model: {} x {} weights",
        out.model.classes,
        out.model.dims + 1
    );
    Ok(())
}
