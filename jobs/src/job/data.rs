//! A job's rows in executors: [`Columns`], one per block of whole tasks,
//! loaded through the input layer as this rank's share of the shards;
//! targets from a file (loaded alike, block for block) or made from the
//! rows (synthetic data).

use std::path::Path;

use outcore::PodVec;
use serde::{Deserialize, Serialize};

use super::{Layout, Rows, Shape};
use crate::error::{Error, Result};
use crate::input::{mix, Loader, Partitioned, Source};
use crate::ranks::{Ranks, Shards};
use crate::session::Session;

/// A block of consecutive rows of one input: the rows, or their targets.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Columns {
    /// Global index of the first row.
    pub first_row: u64,
    /// Rows held.
    pub rows: u32,
    /// Columns.
    pub cols: u32,
    /// Elements of `data` before the first row's values (a block read in
    /// place starts at its page).
    pub skip: u32,
    /// Row-major `rows x cols` values, from `data[skip]` on.
    pub data: PodVec<f32>,
    /// One sample weight per row; empty when there are none.
    pub weights: PodVec<f32>,
}

impl Columns {
    /// The row-major values.
    pub fn values(&self) -> &[f32] {
        &self.data[self.skip as usize..]
    }
}

/// Where a supervised job's targets come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Targets {
    /// None: an unsupervised job.
    None,
    /// A 1-D (one target) or 2-D float `.npy` file, a row per data row.
    File(Source),
    /// Made from each row (synthetic data): target `t` of row `x` is
    /// `sum_j b_tj x_j + c_t + noise * e`, with `b_tj` and `c_t` in
    /// `[-1, 1]` and `e` in `[-1, 1]` derived from `seed`, `t`, `j` and
    /// the row's index.
    Synthetic {
        /// Target columns.
        count: usize,
        /// The noise's amplitude.
        noise: f32,
        /// Seed.
        seed: u64,
    },
    /// Made from each row (synthetic data): one column, the class
    /// `argmax_t s_t(x)` of `classes` noisy linear functions as in
    /// [`Targets::Synthetic`] (noise 0.5).
    SyntheticClasses {
        /// Classes.
        classes: usize,
        /// Seed.
        seed: u64,
    },
}

/// A job's input: rows, targets, sample weights.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    /// The rows.
    pub source: &'a Source,
    /// Their targets.
    pub targets: Targets,
    /// A 1-D float `.npy` of one sample weight per row (finite, >= 0).
    pub weights: Option<&'a Path>,
}

impl<'a> Input<'a> {
    /// Rows with no targets or weights.
    pub fn rows(source: &'a Source) -> Input<'a> {
        Input {
            source,
            targets: Targets::None,
            weights: None,
        }
    }

    /// Rows with `count` synthetic targets of noise `noise` (seeded with
    /// the data's seed, or 0).
    pub fn synthetic_targets(source: &'a Source, count: usize, noise: f32) -> Input<'a> {
        let seed = match source {
            Source::Synthetic { seed, .. } => *seed,
            _ => 0,
        };
        Input {
            source,
            targets: Targets::Synthetic { count, noise, seed },
            weights: None,
        }
    }
}

/// A job's loaded rows: this rank's share of the shards.
#[derive(Debug)]
pub struct Data {
    /// The rows, one executor per block of whole tasks.
    pub x: Partitioned<Columns>,
    /// The targets from a file, block for block with `x`.
    pub y: Option<Partitioned<Columns>>,
    /// Synthetic targets, made by the tasks.
    pub(super) synthetic: Option<Made>,
    /// The whole data's shape.
    pub shape: Shape,
    /// How the rows are cut into tasks and shards.
    pub layout: Layout,
    /// The shards of the tasks.
    pub(super) shards: Shards,
}

impl Data {
    /// This rank's shards.
    pub(super) fn local_shards(&self, ranks: &Ranks) -> std::ops::Range<usize> {
        self.shards.of_rank(ranks.rank(), ranks.size())
    }
}

/// Targets made from the rows ([`Targets::Synthetic`],
/// [`Targets::SyntheticClasses`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Made {
    /// Linear functions.
    count: usize,
    noise: f32,
    seed: u64,
    /// One column, the largest function's index.
    classes: bool,
}

impl Made {
    fn of(t: &Targets) -> Option<Made> {
        match *t {
            Targets::Synthetic { count, noise, seed } => Some(Made {
                count,
                noise,
                seed,
                classes: false,
            }),
            Targets::SyntheticClasses { classes, seed } => Some(Made {
                count: classes,
                noise: 0.5,
                seed,
                classes: true,
            }),
            _ => None,
        }
    }

    /// Target columns.
    fn columns(self) -> usize {
        if self.classes {
            1
        } else {
            self.count
        }
    }

    /// The targets of the rows `xs` (`dims` columns, the first being
    /// row `first`), row-major.
    fn make(self, xs: &[f32], dims: usize, first: u64) -> Vec<f32> {
        let mut out = Vec::with_capacity(xs.len() / dims.max(1) * self.columns());
        let unit = |h: u64| (h >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0;
        for (i, row) in xs.chunks_exact(dims.max(1)).enumerate() {
            let mut best = (0usize, f32::NEG_INFINITY);
            for t in 0..self.count {
                let tseed = mix(self.seed ^ 0x7a43_11e5, t as u64);
                let mut s = unit(mix(tseed, u64::MAX));
                for (j, v) in row.iter().enumerate() {
                    s += unit(mix(tseed, j as u64)) * v;
                }
                s += self.noise * unit(mix(tseed ^ 0x5eed, first + i as u64));
                if self.classes {
                    if s > best.1 {
                        best = (t, s);
                    }
                } else {
                    out.push(s);
                }
            }
            if self.classes {
                out.push(best.0 as f32);
            }
        }
        out
    }
}

/// Calls `f` with the rows `first..first + n` of the partition `x`, their
/// targets from `y` or made by `made`, and their weights.
pub(super) fn with_rows<R>(
    x: &Columns,
    y: Option<&Columns>,
    made: Option<Made>,
    (first, n): (usize, usize),
    f: impl FnOnce(&Rows<'_>) -> R,
) -> R {
    let dims = x.cols as usize;
    let xs = &x.values()[first * dims..(first + n) * dims];
    let g = x.first_row + first as u64;
    let made_ys: Vec<f32>;
    let (targets, ys): (usize, &[f32]) = match (y, made) {
        (Some(y), _) => {
            let t = y.cols as usize;
            (t, &y.values()[first * t..(first + n) * t])
        }
        (None, Some(m)) => {
            made_ys = m.make(xs, dims, g);
            (m.columns(), &made_ys)
        }
        _ => (0, &[]),
    };
    let w = if x.weights.is_empty() {
        &[][..]
    } else {
        &x.weights[first..first + n]
    };
    f(&Rows {
        first: g,
        dims,
        x: xs,
        targets,
        y: ys,
        w,
    })
}

/// Loads `input` for a job cut as `layout`: this rank's share of the
/// shards, in executors of about `part_bytes` (whole tasks), declared as
/// the sweep order. Collective: the ranks check they read the same data
/// and settings. `progress` is called with the rows loaded and the total.
pub fn load(
    session: &Session,
    input: &Input<'_>,
    layout: Layout,
    part_bytes: u64,
    mut progress: impl FnMut(u64, u64),
) -> Result<Data> {
    if layout.task_rows == 0 || layout.shards == 0 {
        return Err(Error::Input(
            "a job needs at least 1 row per task and 1 shard".into(),
        ));
    }
    let ranks = session.ranks();
    let (rows, dims) = input.source.shape()?;
    let targets = match &input.targets {
        Targets::None => 0,
        Targets::File(s) => target_columns(s, rows)?,
        t => Made::of(t).map_or(0, Made::columns),
    };
    agree(ranks, input, (rows, dims, targets), layout)?;
    let tasks = rows.div_ceil(layout.task_rows);
    let shards = Shards::new(tasks, layout.shards);
    if shards.count() < ranks.size() {
        return Err(Error::Input(format!(
            "{} processes, but the data makes only {} shards ({} tasks of {} rows, {} shards asked): at least one shard per process is needed",
            ranks.size(),
            shards.count(),
            tasks,
            layout.task_rows,
            layout.shards
        )));
    }
    let row_bytes = 4 * (dims + targets) as u64 + if input.weights.is_some() { 4 } else { 0 };
    let per = (part_bytes / row_bytes.max(1) / layout.task_rows).max(1) * layout.task_rows;
    let mine = shards.tasks_of_rank(ranks.rank(), ranks.size());
    let segment = [(
        (mine.start * layout.task_rows).min(rows),
        (mine.end * layout.task_rows).min(rows),
        per,
    )];
    let rt = session.runtime();
    let x = columns(rt, input.source, input.weights, &segment, "rows")?;
    session.add_reads(x.input_reads());
    let y = match &input.targets {
        Targets::File(s) => {
            let y = columns(rt, s, None, &segment, "targets")?;
            session.add_reads(y.input_reads());
            // A task reads a block of rows and its targets: one sweep.
            rt.hint_cycle(
                x.parts
                    .iter()
                    .zip(&y.parts)
                    .flat_map(|(a, b)| [a.id(), b.id()]),
            );
            Some(y)
        }
        _ => None,
    };
    progress(rows, rows);
    let synthetic = Made::of(&input.targets);
    Ok(Data {
        x,
        y,
        synthetic,
        shape: Shape {
            rows,
            dims,
            targets,
            weighted: input.weights.is_some(),
        },
        layout,
        shards,
    })
}

/// The target columns of the file `s`, which must have `rows` rows.
fn target_columns(s: &Source, rows: u64) -> Result<usize> {
    let (n, cols) = s.shape()?;
    if n != rows {
        let name = s
            .file()
            .map_or("the targets".into(), |p| p.display().to_string());
        return Err(Error::Input(format!(
            "{name}: {n} targets for {rows} rows of data"
        )));
    }
    Ok(cols)
}

/// The ranks check that they read the same files with the same settings.
fn agree(
    ranks: &Ranks,
    input: &Input<'_>,
    (rows, dims, targets): (u64, usize, usize),
    layout: Layout,
) -> Result<()> {
    if ranks.size() < 2 {
        return Ok(());
    }
    let target_file = match &input.targets {
        Targets::File(s) => s.file(),
        _ => None,
    };
    let files = crate::input::digests(ranks, &[input.source.file(), target_file, input.weights])?;
    let mut names = vec![
        "the rows",
        "the dimensions",
        "the targets",
        "the layout (a hash)",
    ];
    let mut values = vec![
        rows,
        dims as u64,
        targets as u64,
        // A targets file is compared by its digest below, not its name
        // (each rank may read a copy of its own).
        crate::ranks::hash_of(&(layout, target_file.is_none().then_some(&input.targets))),
    ];
    names.extend(files.iter().map(|(n, _)| n.as_str()));
    values.extend(files.iter().map(|&(_, d)| d));
    ranks.agree(&names, &values)
}

/// `src`'s rows of `segment` as [`Columns`] executors built when first
/// needed, named `"{name} {index}"`.
fn columns(
    rt: &outcore::Runtime,
    src: &Source,
    weights: Option<&Path>,
    segment: &[(u64, u64, u64)],
    name: &str,
) -> Result<Partitioned<Columns>> {
    let dims = src.shape()?.1 as u64;
    let loader = Loader {
        source: src,
        labels: None,
        weights,
        // Read whole (a compressed member), it is cut by bytes: as many
        // rows as the segment's blocks.
        part_bytes: segment.first().map_or(1, |s| s.2) * 4 * dims,
        name,
        segments: Some(segment),
    };
    let bytes_per_row = 4 * dims + if weights.is_some() { 4 } else { 0 };
    loader.load_lazy(
        rt,
        bytes_per_row,
        |b| Columns {
            first_row: b.first,
            rows: ((b.x.len() - b.skip) / b.dims.max(1)) as u32,
            cols: b.dims as u32,
            skip: b.skip as u32,
            data: PodVec::from(b.x),
            weights: PodVec::from(b.w),
        },
        |_, _| {},
    )
}
