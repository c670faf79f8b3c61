//! `outcore predict`: labels rows with trained centroids or a trained
//! model, streaming the input under the cap.

use std::path::{Path, PathBuf};

use clap::{ArgGroup, Args};
use outcore::{format_bytes, MemoryCap, Stats};
use outcore_jobs::kmeans::{self, Centers, Dataset};
use outcore_jobs::memory::MemoryPool;
use outcore_jobs::npy::{self, NpyWriter};
use outcore_jobs::ranks::Ranks;
use outcore_jobs::train::{self, Model};
use outcore_jobs::{check_outputs, check_room, write_json, Error, Result, Session, Source, Totals};
use serde::Serialize;

use super::progress::Feedback;
use super::{
    file_source, finish_session, named, plural, runtime, start_warnings, warn_dims, Given,
    MemoryArgs, Outputs,
};

/// Flags of `outcore predict`.
#[derive(Args, Debug)]
#[command(group(ArgGroup::new("predictor").required(true).args(["centroids", "model"])))]
pub(super) struct PredictArgs {
    /// Centroids: a k x D .npy (float32 or float64), such as `outcore
    /// kmeans --output`. Each row gets its nearest centre.
    #[arg(long, value_name = "FILE")]
    centroids: Option<PathBuf>,
    /// A model from `outcore train --output`: classes x (D + 1), the
    /// intercept last. Each row gets the class with the largest score.
    #[arg(long, value_name = "FILE")]
    model: Option<PathBuf>,
    /// Rows to label: .npy (2-D float32/float64/float16, C order, either
    /// byte order), .npz, .fvecs, or raw little-endian float32 (with
    /// --dims).
    #[arg(long, value_name = "FILE")]
    input: PathBuf,
    /// The array to read from an --input .npz archive (default: its
    /// first).
    #[arg(long, value_name = "NAME")]
    key: Option<String>,
    /// Columns of a raw input file.
    #[arg(long, value_name = "D")]
    dims: Option<usize>,
    /// Write each row's label (int32 .npy, one per row).
    #[arg(long, value_name = "FILE")]
    labels: PathBuf,
    /// With --centroids: write each row's squared distance to its centre
    /// (float32 .npy, one per row).
    #[arg(long, value_name = "FILE")]
    distances: Option<PathBuf>,
    #[command(flatten)]
    pub(super) mem: MemoryArgs,
}

#[derive(Serialize)]
struct PredictStats<'a> {
    /// "centroids" or "model".
    by: &'a str,
    rows: u64,
    dims: usize,
    /// Centres or classes.
    k: usize,
    partitions: usize,
    #[serde(flatten)]
    totals: Totals,
    mem_cap_bytes: Option<u64>,
    runtime: &'a Stats,
}

/// The rows a task labels at a time.
const TASK_POINTS: usize = 1100;

/// What labels the rows.
enum Predictor {
    Centres(Centers),
    Model(Model),
}

/// What labelling holds whatever the centres and the partitions: the
/// input's read buffer (1 MiB), the labels' write buffer and the runtime's
/// own memory. Measured: a peak of 1.5 MiB with 24 dimensions, 12 centres
/// and partitions of 64 KiB, under any cap.
const BUFFER_BYTES: u64 = 3 << 19;

impl Job {
    /// Refuses, in one line, a cap that cannot hold the buffers, the model
    /// and one task at once (`k`: centres, or two a class for a model's
    /// float64 scores): the run would go over it from the start.
    fn check_cap(&self, cap: Option<u64>, k: usize, part_bytes: u64) -> Result<()> {
        let (fixed, task) = kmeans::predict_memory((k, self.dims), part_bytes, TASK_POINTS);
        let (predictor, held) = match &self.predictor {
            Predictor::Centres(c) => (format!("{} centres", c.k), "the centres"),
            Predictor::Model(m) => (format!("a model of {} classes", m.classes), "the model"),
        };
        let pool = MemoryPool::new(
            cap,
            format!("labelling with {predictor} on {} dimensions", self.dims),
        );
        pool.try_reserve_all(&[
            ("buffers", BUFFER_BYTES),
            (held, fixed),
            ("a task's rows, labels and distances", task),
        ])
        .map(drop)
    }
}

impl Predictor {
    /// Centres or classes.
    fn k(&self) -> usize {
        match self {
            Predictor::Centres(c) => c.k,
            Predictor::Model(m) => m.classes as usize,
        }
    }
}

/// A checked command line: the input and what labels it.
struct Job {
    src: Source,
    rows: u64,
    dims: usize,
    predictor: Predictor,
}

/// Runs `outcore predict`: the flags checked into a job, the rows labelled
/// through a session as they stream in, then the outputs and summary.
pub(super) fn run(a: PredictArgs, given: &Given) -> Result<()> {
    warn_dims(given, Some(&a.input));
    let job = Job::parse(&a)?;
    let data_bytes = job.rows * job.dims as u64 * 4;
    // A model's scores are float64, two centres' worth of bytes a class.
    let k = match &job.predictor {
        Predictor::Centres(c) => c.k,
        Predictor::Model(m) => 2 * m.classes as usize,
    };
    // Partitions as small as 64 KiB, so that small caps hold one.
    let (rt, part_bytes) = runtime(
        &a.mem,
        MemoryCap::Auto,
        (data_bytes, 64 << 10),
        &Ranks::single(),
        |cap, pb, n| kmeans::predict_workers((k, job.dims), pb, TASK_POINTS, cap, n),
    )?;
    let cap = rt.cap();
    job.check_cap(cap, k, part_bytes.min(data_bytes))?;
    let mut session = Session::new(rt);
    if let Some(p) = &a.mem.timeline {
        session.record_timeline(p, "load")?;
    }
    let mut fb = Feedback::new();
    let ds = kmeans::load(&session, &job.src, None, None, part_bytes, |_, _| {})?;
    session.phase("label");
    let rt = session.runtime();
    fb.line(&format!(
        "outcore predict: {} points x {} dims ({}), {}, cap {}, {}",
        job.rows,
        job.dims,
        format_bytes(data_bytes),
        match &job.predictor {
            Predictor::Centres(_) => format!("nearest of {} centres", job.predictor.k()),
            Predictor::Model(_) => format!("model of {} classes", job.predictor.k()),
        },
        rt.cap().map_or("none".into(), format_bytes),
        plural(rt.workers(), "worker")
    ));
    for w in start_warnings(rt) {
        fb.line(&w);
    }
    fb.stage("labelling", job.rows);
    let mut outs = job.label(&a, &session, &ds, &mut fb)?;
    fb.done();
    let s = finish_session(&mut session, &mut outs)?;
    let totals = session.totals(&s);
    if let Some(p) = &a.mem.stats {
        let r = write_json(
            p,
            &PredictStats {
                by: match job.predictor {
                    Predictor::Centres(_) => "centroids",
                    Predictor::Model(_) => "model",
                },
                rows: job.rows,
                dims: job.dims,
                k: job.predictor.k(),
                partitions: ds.parts.len(),
                totals,
                mem_cap_bytes: session.runtime().cap(),
                runtime: &s,
            },
        );
        outs.write("--stats", r)?;
    }
    tell!(
        "done in {:.1}s: {} rows labelled; peak {}{}; evictions {}, loads {}, read {}, written {}",
        totals.wall_seconds,
        job.rows,
        format_bytes(totals.peak_bytes),
        cap.map_or(String::new(), |c| format!(" (cap {})", format_bytes(c))),
        totals.evictions,
        totals.loads,
        format_bytes(totals.bytes_read),
        format_bytes(totals.bytes_written)
    );
    Ok(())
}

impl Job {
    /// The job the flags ask for: the paths checked (no output may
    /// overwrite an input or another output), the input opened, the
    /// centroids or model read and checked against it.
    fn parse(a: &PredictArgs) -> Result<Job> {
        let labels = Some(a.labels.clone());
        let input = Some(a.input.clone());
        let outputs = [
            ("--labels", &labels),
            ("--distances", &a.distances),
            ("--stats", &a.mem.stats),
            ("--timeline", &a.mem.timeline),
        ];
        let inputs = [
            ("--input", &input),
            ("--centroids", &a.centroids),
            ("--model", &a.model),
        ];
        check_outputs(&named(&outputs), &named(&inputs))?;
        if a.distances.is_some() && a.model.is_some() {
            return Err(Error::Input(
                "--distances applies to --centroids, not to --model".into(),
            ));
        }
        let src = file_source(&a.input, a.dims, a.key.as_deref())?;
        let (rows, dims) = src.shape()?;
        // The streamed outputs' sizes are known: checked against the
        // file-size limit and the free space before the work.
        for p in std::iter::once(&a.labels).chain(&a.distances) {
            check_room(p, rows * 4 + 128)?;
        }
        let predictor = match (&a.centroids, &a.model) {
            (Some(p), _) => {
                let (v, k, c) = npy::read_matrix(p)?;
                if c != dims {
                    return Err(Error::Input(format!(
                        "--centroids {}: centres have {c} dimensions, the input has {dims}",
                        p.display()
                    )));
                }
                Predictor::Centres(Centers::new(k, dims, v))
            }
            (None, Some(p)) => Predictor::Model(read_model(p, dims)?),
            (None, None) => {
                return Err(Error::Input("give --centroids or --model".into()));
            }
        };
        Ok(Job {
            src,
            rows,
            dims,
            predictor,
        })
    }

    /// Labels the rows of `ds` and streams the labels (and distances) to
    /// their files; the outputs, `--labels` and `--distances` written.
    fn label(
        &self,
        a: &PredictArgs,
        session: &Session,
        ds: &Dataset,
        fb: &mut Feedback,
    ) -> Result<Outputs> {
        let mut labels = NpyWriter::<i32>::create(&a.labels, &[self.rows])?;
        let mut dists = match &a.distances {
            Some(p) => Some(NpyWriter::<f32>::create(p, &[self.rows])?),
            None => None,
        };
        let mut done = 0u64;
        let mut scratch: Vec<i32> = Vec::new();
        let mut put = |l: &[u32]| -> Result<()> {
            scratch.clear();
            scratch.extend(l.iter().map(|&v| v as i32));
            labels.write(&scratch)?;
            done += l.len() as u64;
            fb.progress(done);
            Ok(())
        };
        let mut outs = Outputs::new(&[
            ("--labels", &Some(a.labels.clone())),
            ("--distances", &a.distances),
            ("--timeline", &a.mem.timeline),
            ("--stats", &a.mem.stats),
        ]);
        // A streamed output that fails mid-run (disk full, file-size
        // limit): the line lists the outputs, none of them written.
        match &self.predictor {
            Predictor::Centres(c) => {
                kmeans::predict(session, ds, c, dists.is_some(), TASK_POINTS, |l, d| {
                    put(l)?;
                    if let Some(w) = dists.as_mut() {
                        w.write(d)?;
                    }
                    Ok(())
                })
            }
            Predictor::Model(m) => train::predict(session, ds, m, put),
        }
        .map_err(|e| outs.failed_writing(e))?;
        outs.write("--labels", labels.finish())?;
        if let Some(w) = dists {
            outs.write("--distances", w.finish())?;
        }
        Ok(outs)
    }
}

/// A model file: `classes x (dims + 1)`, the intercept in the last column.
fn read_model(p: &Path, dims: usize) -> Result<Model> {
    let (w, classes, cols) = npy::read_matrix(p)?;
    if cols != dims + 1 {
        return Err(Error::Input(format!(
            "--model {}: a model for {} features (shape {classes} x {cols}), the input has {dims} columns",
            p.display(),
            cols.saturating_sub(1)
        )));
    }
    Ok(Model {
        classes: classes as u32,
        dims: dims as u32,
        w: w.into(),
    })
}
