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

/// Where this rank's labels go.
pub(super) enum LabelsOut {
    /// Rank 0: the output file; its scratch for the conversion to int32.
    File(NpyWriter<i32>, Vec<i32>),
    /// Another rank: an unnamed temporary file in this directory, and
    /// the bytes written.
    Kept(BufWriter<File>, PathBuf, u64),
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
    /// Starts the labels of `rows` rows in all: the output at `path` on
    /// rank 0, a temporary file on the others.
    pub(super) fn create(session: &Session, path: &Path, rows: u64) -> Result<LabelsOut> {
        if session.is_root() {
            return Ok(LabelsOut::File(
                NpyWriter::create(path, &[rows])?,
                Vec::new(),
            ));
        }
        let dir = session.runtime().spill_dir();
        let f = tempfile::tempfile_in(dir).map_err(io(dir, "cannot write in"))?;
        Ok(LabelsOut::Kept(
            BufWriter::with_capacity(PIECE, f),
            dir.to_path_buf(),
            0,
        ))
    }

    /// The next labels of this rank's rows, in row order.
    pub(super) fn write(&mut self, labels: &[u32]) -> Result<()> {
        match self {
            LabelsOut::File(w, scratch) => {
                scratch.clear();
                scratch.extend(labels.iter().map(|&l| l as i32));
                w.write(scratch)
            }
            LabelsOut::Kept(f, dir, n) => {
                for &l in labels {
                    f.write_all(&(l as i32).to_le_bytes())
                        .map_err(io(dir, "cannot write in"))?;
                }
                *n += 4 * labels.len() as u64;
                Ok(())
            }
        }
    }

    /// Brings the other ranks' labels into rank 0's file, in rank order,
    /// and moves it into place. Collective.
    pub(super) fn finish(self, ranks: &Ranks) -> Result<()> {
        match self {
            LabelsOut::File(mut w, _) => {
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
            LabelsOut::Kept(f, dir, n) => {
                let mut f = f
                    .into_inner()
                    .map_err(|e| io(&dir, "cannot write in")(e.into_error()))?;
                f.seek(SeekFrom::Start(0))
                    .map_err(io(&dir, "cannot read in"))?;
                ranks.funnel(
                    n,
                    PIECE,
                    |buf| f.read_exact(buf).map_err(io(&dir, "cannot read in")),
                    |_| Ok(()),
                )
            }
        }
    }
}
