//! `outcore kmeans --labels`: the labels streamed into their `.npy` file
//! as the final pass makes them, on one process or on MPI ranks, never
//! held whole.
//!
//! Rank 0 writes the file (atomically, as every output: see
//! `outcore_jobs::npy::NpyWriter`), its own rows' labels as they come. The
//! rows of the other ranks come after rank 0's, in rank order, so each of
//! them keeps its labels in an unnamed temporary file in its spill
//! directory (gone whatever ends the process) and, once the run is done,
//! sends them to rank 0 a piece at a time, rank after rank
//! ([`Ranks::funnel`]). The file needs no filesystem shared by the ranks.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use outcore_jobs::npy::NpyWriter;
use outcore_jobs::ranks::Ranks;
use outcore_jobs::{Error, Result, Session};

/// Bytes in flight between a rank and rank 0 at the end, and buffered on
/// the way to a rank's temporary file.
const PIECE: usize = 64 << 10;

/// Where this rank's labels go, started at the first labels (nothing is
/// held during the epochs).
pub(super) struct LabelsOut {
    /// The output (rank 0 writes it) and its rows in all.
    path: PathBuf,
    rows: u64,
    root: bool,
    /// The spill directory, for the temporary file of the other ranks.
    spill: PathBuf,
    sink: Option<Sink>,
    /// Labels written so far by this rank.
    written: u64,
    /// The labels as int32.
    scratch: Vec<i32>,
}

enum Sink {
    /// Rank 0: the output file.
    File(NpyWriter<i32>),
    /// Another rank: an unnamed temporary file in the spill directory.
    Kept(BufWriter<File>),
}

/// An I/O error on the temporary file of directory `dir`.
fn io<'a>(dir: &'a Path, action: &'static str) -> impl Fn(std::io::Error) -> Error + 'a {
    move |source| Error::Io {
        path: dir.to_path_buf(),
        action,
        source,
    }
}

impl LabelsOut {
    /// The labels of `rows` rows in all: the output at `path` on rank 0,
    /// a temporary file on the others.
    pub(super) fn new(session: &Session, path: &Path, rows: u64) -> LabelsOut {
        LabelsOut {
            path: path.to_path_buf(),
            rows,
            root: session.is_root(),
            spill: session.runtime().spill_dir().to_path_buf(),
            sink: None,
            written: 0,
            scratch: Vec::new(),
        }
    }

    /// Where the labels go, started at the first call.
    fn sink(&mut self) -> Result<&mut Sink> {
        if self.sink.is_none() {
            self.sink = Some(if self.root {
                Sink::File(NpyWriter::create(&self.path, &[self.rows])?)
            } else {
                let f = tempfile::tempfile_in(&self.spill)
                    .map_err(io(&self.spill, "cannot write in"))?;
                Sink::Kept(BufWriter::with_capacity(PIECE, f))
            });
        }
        self.sink
            .as_mut()
            .ok_or_else(|| Error::Input("no labels' sink".into()))
    }

    /// The next labels of this rank's rows, in row order.
    pub(super) fn write(&mut self, labels: &[u32]) -> Result<()> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.extend(labels.iter().map(|&l| l as i32));
        let spill = self.spill.clone();
        let r = match self.sink()? {
            Sink::File(w) => w.write(&scratch),
            Sink::Kept(f) => scratch
                .iter()
                .try_for_each(|l| f.write_all(&l.to_le_bytes()))
                .map_err(io(&spill, "cannot write in")),
        };
        self.written += labels.len() as u64;
        self.scratch = scratch;
        r
    }

    /// Brings the other ranks' labels into rank 0's file, in rank order,
    /// and moves it into place. Collective.
    pub(super) fn finish(mut self, ranks: &Ranks) -> Result<()> {
        let (n, spill) = (4 * self.written, self.spill.clone());
        // Started even without rows of this rank's.
        self.sink()?;
        match self.sink.take() {
            Some(Sink::File(mut w)) => {
                let mut scratch = Vec::with_capacity(PIECE / 4);
                ranks.funnel(
                    0,
                    PIECE,
                    |_| Ok(()),
                    |bytes| {
                        scratch.clear();
                        scratch.extend(
                            bytes
                                .chunks_exact(4)
                                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                        );
                        w.write(&scratch)
                    },
                )?;
                w.finish()
            }
            Some(Sink::Kept(mut f)) => {
                f.flush().map_err(io(&spill, "cannot write in"))?;
                let f = f.get_mut();
                f.seek(SeekFrom::Start(0))
                    .map_err(io(&spill, "cannot read in"))?;
                ranks.funnel(
                    n,
                    PIECE,
                    |buf| f.read_exact(buf).map_err(io(&spill, "cannot read in")),
                    |_| Ok(()),
                )
            }
            None => Err(Error::Input("the labels were not started".into())),
        }
    }
}
