//! The library's training entry point fits with the solver its
//! `TrainConfig` names: a library caller gets the model, bit for bit, that
//! `outcore train --solver ...` writes for the same data and settings.

mod bin_common;

use std::path::Path;

use outcore::{MemoryCap, Runtime};
use outcore_jobs::train::{self, Solver, TrainConfig};
use outcore_jobs::{npy, Labels, Session, Source};

#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();

const DIMS: usize = 8;
const CLASSES: usize = 3;
const PARTITIONS: u64 = 4;

/// The model the `outcore` binary writes with `--solver solver` on 1 MiB
/// of synthetic blobs in 4 partitions, as the bytes of its .npy file.
fn cli_model(dir: &Path, solver: &str) -> Vec<u8> {
    let out = dir.join(format!("cli-{solver}.npy"));
    let (code, err) = bin_common::outcore_cli(&[
        "train",
        "--solver",
        solver,
        "--synthetic",
        "1MiB",
        "--dims",
        "8",
        "--classes",
        "3",
        "--rounds",
        "2",
        "--max-iter",
        "5",
        "--partitions",
        "4",
        "--workers",
        "2",
        "--mem-cap",
        "none",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    std::fs::read(out).unwrap()
}

/// What a library caller gets with `solver` and the binary's settings:
/// the model's .npy bytes, and whether the result is L-BFGS's (iterations
/// and a stop reason) or local SGD's (rounds).
fn library_model(dir: &Path, solver: Solver) -> (Vec<u8>, bool, bool) {
    let session = Session::new(
        Runtime::builder()
            .workers(2)
            .mem_cap(MemoryCap::None)
            .build()
            .unwrap(),
    );
    let src = Source::synthetic(1 << 20, DIMS, CLASSES, 42);
    let cfg = TrainConfig {
        solver,
        rounds: 2,
        max_iter: 5,
        ..TrainConfig::default()
    };
    // The binary's shard size: the data (4 bytes a value and a label) in
    // --partitions parts, rounded to whole tasks.
    let (rows, dims) = src.shape().unwrap();
    let part = (rows * (4 * dims as u64 + 4)).div_ceil(PARTITIONS);
    let shard_bytes = train::aligned_shard_bytes(part, dims);
    let job = train::load(
        &session,
        &src,
        train::Targets {
            labels: &Labels::Blobs,
            weights: None,
            classes: Some(CLASSES),
        },
        shard_bytes,
        &cfg,
        |_, _| {},
    )
    .unwrap();
    let out = train::train(&session, &job, &cfg, |_| {}).unwrap();
    let lbfgs = out.stop.is_some() && !out.iterations.is_empty();
    let sgd = out.rounds.len() == 2;
    let p = dir.join("lib.npy");
    let shape = [CLASSES as u64, DIMS as u64 + 1];
    npy::write_array(&p, &shape, &out.model.w).unwrap();
    (std::fs::read(p).unwrap(), lbfgs, sgd)
}

#[test]
fn a_library_caller_gets_the_solver_its_config_names() {
    let dir = tempfile::tempdir().unwrap();
    for (solver, flag) in [(Solver::Lbfgs, "lbfgs"), (Solver::Sgd, "sgd")] {
        let (lib, lbfgs, sgd) = library_model(dir.path(), solver);
        assert_eq!(
            (lbfgs, sgd),
            (solver == Solver::Lbfgs, solver == Solver::Sgd),
            "{solver:?}: the result is not that solver's"
        );
        assert!(
            lib == cli_model(dir.path(), flag),
            "{solver:?}: the model differs from `outcore train --solver {flag}`'s"
        );
    }
}
