//! The training and fitting jobs on MPI ranks: the same bytes for any
//! number of processes.

use super::*;

#[test]
fn training_is_the_same_on_any_number_of_ranks() {
    if !have_mpirun() {
        return;
    }
    same_bytes_for_every_count(
        &[
            "train",
            "--synthetic",
            "6MiB",
            "--dims",
            "32",
            "--classes",
            "4",
            "--max-iter",
            "4",
            "--tol",
            "0",
            "--mem-cap",
            "2MiB",
            "--partitions",
            "24",
            "--output",
            "m.npy",
        ],
        &["m.npy"],
        &[
            "objective",
            "loss",
            "grad_max",
            "iterations.0.loss",
            "iterations.2.grad_max",
        ],
    );
}

#[test]
fn local_sgd_is_the_same_on_any_number_of_ranks() {
    if !have_mpirun() {
        return;
    }
    // The ranks hold runs of the one process's 8 shard executors (of 3
    // tasks each: not the L-BFGS split).
    same_bytes_for_every_count(
        &[
            "train",
            "--solver",
            "sgd",
            "--synthetic",
            "6MiB",
            "--dims",
            "32",
            "--classes",
            "4",
            "--rounds",
            "2",
            "--mem-cap",
            "2MiB",
            "--partitions",
            "6",
            "--output",
            "m.npy",
        ],
        &["m.npy"],
        &["accuracy", "final_accuracy"],
    );
}

/// The jobs of the job interface: a ridge regression with sample
/// weights and a PCA, from files, under a cap that evicts on every rank.
#[test]
fn linear_and_pca_are_the_same_on_any_number_of_ranks() {
    if !have_mpirun() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let x = gen(data.path(), "12MiB", 24);
    let rows = (12 << 20) / (24 * 4);
    let w = weights(data.path(), rows);
    let y = data.path().join("y.npy");
    let ybytes = (rows * 8).to_string();
    let (code, err) = watched(
        data.path(),
        120,
        &[
            BIN,
            "gen",
            "--synthetic",
            &ybytes,
            "--dims",
            "2",
            "--seed",
            "5",
            "--output",
            y.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let common = [
        "--input",
        x.to_str().unwrap(),
        "--mem-cap",
        "2MiB",
        "--partitions",
        "48",
    ];
    let mut linear = vec!["linear", "--targets", y.to_str().unwrap()];
    linear.extend(["--sample-weight", w.to_str().unwrap(), "--alpha", "0.5"]);
    linear.extend(common);
    linear.extend(["--output", "m.npy"]);
    same_bytes_for_every_count(&linear, &["m.npy"], &["intercept", "coef"]);
    let mut pca = vec!["pca", "--n-components", "5", "--output", "c.npy"];
    pca.extend(common);
    same_bytes_for_every_count(
        &pca,
        &["c.npy"],
        &["explained_variance", "mean", "noise_variance"],
    );
}

/// SGD on the online driver: the model handed from rank to rank at each
/// shard, the held-out score summed across ranks (early stopping's).
#[test]
fn sgd_is_the_same_on_any_number_of_ranks() {
    if !have_mpirun() {
        return;
    }
    same_bytes_for_every_count(
        &[
            "sgd",
            "--synthetic",
            "12MiB",
            "--dims",
            "24",
            "--classes",
            "3",
            "--loss",
            "log_loss",
            "--max-iter",
            "3",
            "--tol",
            "none",
            "--early-stopping",
            "--average",
            "500",
            "--mem-cap",
            "2MiB",
            "--partitions",
            "48",
            "--output",
            "m.npy",
        ],
        &["m.npy"],
        &["t", "intercept"],
    );
}
