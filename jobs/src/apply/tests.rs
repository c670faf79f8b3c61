use super::*;

/// Rows in memory, for the tests.
struct Mem<T> {
    x: Vec<T>,
    cols: usize,
    /// Whether some rows are "on the disk": not read by `read_now`.
    cold: bool,
}

impl<T: Real> Rows<T> for Mem<T> {
    fn rows(&self) -> u64 {
        (self.x.len() / self.cols) as u64
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn read(&self, first: u64, n: usize, out: &mut Vec<T>) -> Result<()> {
        let s = first as usize * self.cols;
        out.clear();
        out.extend_from_slice(&self.x[s..s + n * self.cols]);
        Ok(())
    }
    fn read_now(&self, first: u64, n: usize, out: &mut Vec<T>) -> Result<bool> {
        if self.cold && (first / 64) % 3 == 2 {
            out.clear();
            return Ok(false);
        }
        self.read(first, n, out).map(|()| true)
    }
}

/// Each row's nearest centre and squared distance to it.
fn nearest<T: Real>(rows: &dyn Rows<T>, centers: &[T], plan: Plan) -> Result<(Vec<i32>, Vec<T>)> {
    let n = rows.rows() as usize;
    let (mut labels, mut d2) = (vec![-1i32; n], vec![T::ZERO; n]);
    let task = Task::Nearest {
        centers,
        labels: &mut labels,
        d2: &mut d2,
    };
    apply(rows, task, plan)?;
    Ok((labels, d2))
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

fn naive_d2(x: &[f64], c: &[f64], d: usize) -> Vec<Vec<f64>> {
    x.chunks(d)
        .map(|r| {
            c.chunks(d)
                .map(|q| r.iter().zip(q).map(|(a, b)| (a - b) * (a - b)).sum())
                .collect()
        })
        .collect()
}

#[test]
fn nearest_distances_and_affine_match_a_plain_loop_for_any_plan() {
    let (n, d, k) = (1001, 7, 5);
    let x = values(n * d, 1);
    let c = values(k * d, 2);
    let want = naive_d2(&x, &c, d);
    let rows = Mem {
        x: x.clone(),
        cols: d,
        cold: false,
    };
    for plan in [
        Plan {
            workers: 1,
            block_rows: 1,
        },
        Plan {
            workers: 3,
            block_rows: 64,
        },
        Plan::new(2, (n as u64, d, k), 8, None),
    ] {
        let (labels, d2) = nearest(&rows, &c, plan).unwrap();
        let mut dist = vec![0f64; n * k];
        apply(
            &rows,
            Task::Distances {
                centers: &c,
                out: &mut dist,
            },
            plan,
        )
        .unwrap();
        for i in 0..n {
            let (arg, min) =
                want[i].iter().enumerate().fold(
                    (0, f64::MAX),
                    |a, (j, v)| if *v < a.1 { (j, *v) } else { a },
                );
            assert_eq!(labels[i] as usize, arg, "row {i}");
            assert!((d2[i] - min).abs() < 1e-12, "row {i}");
            for j in 0..k {
                assert!(
                    (dist[i * k + j] - want[i][j].sqrt()).abs() < 1e-7,
                    "row {i} centre {j}"
                );
            }
        }
        let bias = [0.5, -1.0];
        let w = values(2 * d, 3);
        let mut out = vec![0f64; n * 2];
        apply(
            &rows,
            Task::Affine {
                weights: &w,
                bias: &bias,
                out: &mut out,
            },
            plan,
        )
        .unwrap();
        for i in 0..n {
            for o in 0..2 {
                let v: f64 = (0..d).map(|j| x[i * d + j] * w[o * d + j]).sum::<f64>() + bias[o];
                assert!((out[i * 2 + o] - v).abs() < 1e-12);
            }
        }
    }
}

#[test]
fn ties_go_to_the_lowest_centre_in_f32() {
    let rows = Mem {
        x: vec![0f32, 0.0, 2.0, 2.0],
        cols: 2,
        cold: false,
    };
    let c = [1f32, 1.0, 1.0, 1.0, 5.0, 5.0];
    let (labels, d2) = nearest(&rows, &c, Plan::new(2, (2, 2, 3), 4, None)).unwrap();
    assert_eq!(labels, [0, 0]);
    assert_eq!(d2, [2.0, 2.0]);
}

#[test]
fn a_value_not_finite_is_named_by_its_row_and_column() {
    let mut x = values(300 * 3, 4);
    x[250 * 3 + 2] = f64::INFINITY;
    x[120 * 3 + 1] = f64::NAN;
    let rows = Mem {
        x,
        cols: 3,
        cold: false,
    };
    let c = values(6, 5);
    for workers in [1, 2, 4] {
        let plan = Plan {
            workers,
            block_rows: 16,
        };
        match nearest(&rows, &c, plan) {
            Err(Error::NotFinite {
                row: 120,
                col: 1,
                nan: true,
                path: None,
            }) => {}
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn wrong_sizes_are_errors_not_panics() {
    let rows = Mem {
        x: vec![0f64; 8],
        cols: 2,
        cold: false,
    };
    let (mut labels, mut d2) = (vec![0i32; 3], vec![0f64; 4]);
    let plan = Plan::new(1, (4, 2, 1), 8, None);
    assert!(apply(
        &rows,
        Task::Nearest {
            centers: &[0.0, 0.0],
            labels: &mut labels,
            d2: &mut d2
        },
        plan
    )
    .is_err());
    let mut out = vec![0f64; 4];
    assert!(apply(
        &rows,
        Task::Affine {
            weights: &[1.0],
            bias: &[0.0],
            out: &mut out
        },
        plan
    )
    .is_err());
}

#[test]
fn file_rows_are_read_in_blocks_from_a_npy() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.npy");
    let x: Vec<f32> = values(5000 * 4, 6).iter().map(|v| *v as f32).collect();
    crate::npy::write_array(&p, &[5000, 4], &x).unwrap();
    let src = crate::Source::from_path(&p, None).unwrap();
    let rows = FileRows::new(BlockReader::open(&src).unwrap(), 4);
    let c: Vec<f32> = values(12, 7).iter().map(|v| *v as f32).collect();
    let mut out = vec![0f32; 5000 * 3];
    apply(
        &rows,
        Task::Distances {
            centers: &c,
            out: &mut out,
        },
        Plan {
            workers: 2,
            block_rows: 333,
        },
    )
    .unwrap();
    let x64: Vec<f64> = x.iter().map(|v| *v as f64).collect();
    let c64: Vec<f64> = c.iter().map(|v| *v as f64).collect();
    for (i, r) in naive_d2(&x64, &c64, 4).iter().enumerate() {
        for j in 0..3 {
            assert!((out[i * 3 + j] as f64 - r[j].sqrt()).abs() < 1e-4);
        }
    }
}

#[test]
fn a_plan_holds_blocks_within_the_budget() {
    let p = Plan::new(2, (1 << 20, 1000, 10), 4, Some(1 << 20));
    assert!(p.block_rows * 1011 * 4 <= 1 << 19);
    let small = Plan::new(4, (10, 3, 2), 8, None);
    assert_eq!(small.block_rows, 3);
}

#[test]
fn cached_reads_give_the_direct_reads_values_and_only_for_float32() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.npy");
    let x: Vec<f32> = values(3000 * 5, 8).iter().map(|v| *v as f32).collect();
    crate::npy::write_array(&p, &[3000, 5], &x).unwrap();
    let reader = BlockReader::open(&crate::Source::from_path(&p, None).unwrap()).unwrap();
    // Just written: its pages are in the page cache.
    let mut cached = vec![1.0; 3];
    assert!(
        reader.read_cached(1000, 777, &mut cached).unwrap(),
        "in the page cache"
    );
    assert_eq!(cached, reader.read(1000, 777).unwrap());
    assert_eq!(cached, &x[1000 * 5..1777 * 5]);
    assert!(
        !reader.read_cached(2900, 200, &mut cached).unwrap(),
        "past the end"
    );
    let q = dir.path().join("x64.npy");
    let x64: Vec<f64> = values(100 * 5, 9);
    crate::npy::write_array(&q, &[100, 5], &x64).unwrap();
    let wide = BlockReader::open(&crate::Source::from_path(&q, None).unwrap()).unwrap();
    assert!(
        !wide.read_cached(0, 100, &mut cached).unwrap(),
        "float64 is converted, not copied"
    );
}

/// Blocks whose pieces are partly in memory give the results of blocks
/// read at once, for nearest (f64, and f32 by the fit's kernel) and
/// affine maps.
#[test]
fn blocks_read_partly_from_memory_give_the_same_results() {
    let (n, d, k) = (1000, 512, 5);
    let x = values(n * d, 3);
    let c = values(k * d, 4);
    let plan = Plan {
        workers: 2,
        block_rows: 400,
    };
    let x32: Vec<f32> = x.iter().map(|v| *v as f32).collect();
    let c32: Vec<f32> = c.iter().map(|v| *v as f32).collect();
    let label = |cold: bool| {
        let rows = Mem {
            x: x.clone(),
            cols: d,
            cold,
        };
        let rows32 = Mem {
            x: x32.clone(),
            cols: d,
            cold,
        };
        let (mut l32, mut d32) = (vec![0i32; n], vec![0f32; n]);
        let task = Task::Nearest {
            centers: &c32,
            labels: &mut l32,
            d2: &mut d32,
        };
        apply(&rows32, task, plan).unwrap();
        let mut out = vec![0f64; n * k];
        let task = Task::Affine {
            weights: &c,
            bias: &[1.0; 5],
            out: &mut out,
        };
        apply(&rows, task, plan).unwrap();
        (nearest(&rows, &c, plan).unwrap(), (l32, d32), out)
    };
    let (warm, cold) = (label(false), label(true));
    assert!(warm == cold);
    let want = naive_d2(&x, &c, d);
    for (i, w) in want.iter().enumerate() {
        let arg = (0..k).fold(0, |a, j| if w[j] < w[a] { j } else { a });
        assert_eq!(warm.0 .0[i] as usize, arg, "f64 row {i}");
        assert_eq!(warm.1 .0[i] as usize, arg, "f32 row {i}");
        assert!(
            (f64::from(warm.1 .1[i]) - w[arg]).abs() <= 1e-3 * w[arg],
            "f32 row {i}"
        );
    }
}
