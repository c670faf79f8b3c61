//! The ranks under MPI: initialisation (`MPI_THREAD_FUNNELED`), the
//! collectives the jobs use (the ordered sum, gathers, broadcasts, the
//! agreement check), growth onto free slots (`MPI_Comm_spawn`) and abort.

use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::point_to_point::{Destination, Source};
use std::cell::{Cell, Ref, RefCell};

use mpi::topology::{InterCommunicator, MergeOrder, SimpleCommunicator};
use mpi::traits::{AsRaw, Communicator, CommunicatorCollectives, Root};
use mpi::Threading;

use super::sums::add;
use crate::error::{Error, Result};

/// Values an ordered sum sends through MPI at once, from each vector
/// (8 MiB of f64).
const SUM_PIECE: usize = 1 << 20;

pub(super) struct World {
    /// The ranks: `MPI_COMM_WORLD`'s, or after growth the merged
    /// communicator of the ranks started and those spawned.
    comm: RefCell<SimpleCommunicator>,
    // Dropped after `comm`: finalises MPI.
    universe: Universe,
    // MPI is used from the thread that initialised it only.
    _not_send: std::marker::PhantomData<*const ()>,
    pub rank: Cell<usize>,
    pub size: Cell<usize>,
    pub on_node: Cell<usize>,
    /// Spawned by a job that grew: joined it after its start.
    pub joined: bool,
}

/// MPI counts are C ints.
fn count(n: usize, what: &str) -> Result<i32> {
    i32::try_from(n).map_err(|_| {
        Error::Input(format!(
            "{what}: {n} values in one MPI message, more than MPI's count allows"
        ))
    })
}

/// Offsets of consecutive blocks of `counts` values; an error when
/// they add up to more than a C int.
fn displacements(counts: &[i32]) -> Result<Vec<i32>> {
    let mut at = 0i32;
    let mut out = Vec::with_capacity(counts.len());
    for &c in counts {
        out.push(at);
        at = at.checked_add(c).ok_or_else(|| {
            Error::Input("more values in one MPI collective than MPI's count allows".into())
        })?;
    }
    Ok(out)
}

impl Drop for World {
    fn drop(&mut self) {
        // Unwinding out of the thread that owns MPI: finalising would
        // wait for ranks that wait for this one. End the job instead.
        if std::thread::panicking() {
            use std::io::Write as _;
            // One write: `mpirun` could put another rank's output
            // inside a line written in pieces.
            let line = format!(
                "outcore: error: rank {} of {}: panicked; ending every rank\n",
                self.rank.get(),
                self.size.get()
            );
            let _ = std::io::stderr().write_all(line.as_bytes());
            self.comm().abort(101);
        }
    }
}

impl World {
    pub fn init() -> Result<World> {
        let (universe, provided) = mpi::initialize_with_threading(Threading::Funneled)
            .ok_or_else(|| Error::Input("MPI was already initialised".into()))?;
        if provided < Threading::Funneled {
            return Err(Error::Input(format!(
                "the MPI library provides thread level {provided:?}; outcore's worker threads need at least Funneled"
            )));
        }
        let world = universe.world();
        // Spawned by a job that grew: the parents merge with us
        // (they first, in their order), then split by node.
        let (comm, joined) = match world.parent() {
            Some(parent) => (parent.merge(MergeOrder::High), true),
            None => (world, false),
        };
        let on_node = comm.split_shared(0).size() as usize;
        Ok(World {
            rank: Cell::new(comm.rank() as usize),
            size: Cell::new(comm.size() as usize),
            on_node: Cell::new(on_node),
            joined,
            comm: RefCell::new(comm),
            universe,
            _not_send: std::marker::PhantomData,
        })
    }

    fn comm(&self) -> Ref<'_, SimpleCommunicator> {
        self.comm.borrow()
    }

    /// `MPI_UNIVERSE_SIZE`: the slots of the allocation, when the
    /// launcher says.
    pub fn universe_size(&self) -> Option<usize> {
        // Test hook: more slots than the allocation has, to see a
        // spawn fail.
        let claimed = std::env::var("OUTCORE_FAULT_UNIVERSE_SIZE").ok();
        claimed
            .and_then(|v| v.parse().ok())
            .or_else(|| self.universe.size())
    }

    /// Spawns `extra` processes running this program with this
    /// process's arguments and merges them in after the ranks there
    /// are: from then on every collective includes them. Collective.
    /// A failed spawn is an error on every rank, not an abort.
    pub fn grow(&self, extra: usize) -> Result<()> {
        let inter = self.spawn(extra)?;
        let merged = inter.merge(MergeOrder::Low);
        drop(inter);
        let on_node = merged.split_shared(0).size() as usize;
        self.rank.set(merged.rank() as usize);
        self.size.set(merged.size() as usize);
        self.on_node.set(on_node);
        *self.comm.borrow_mut() = merged;
        Ok(())
    }

    /// `MPI_Comm_spawn` of `extra` copies of this program, under
    /// `MPI_ERRORS_RETURN` (a failure is an error code, not an abort),
    /// its outcome agreed on by every rank.
    fn spawn(&self, extra: usize) -> Result<InterCommunicator> {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let failed = |what: String| Error::Input(format!("could not spawn {extra} ranks: {what}"));
        let exe = std::env::current_exe().map_err(|e| failed(e.to_string()))?;
        let prog = CString::new(exe.as_os_str().as_bytes()).map_err(|e| failed(e.to_string()))?;
        let args = std::env::args_os()
            .skip(1)
            .map(|a| CString::new(a.as_bytes()))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| failed(e.to_string()))?;
        let mut argv: Vec<*mut std::ffi::c_char> = args
            .iter()
            .map(|a| a.as_ptr().cast_mut())
            .chain(std::iter::once(std::ptr::null_mut()))
            .collect();
        let n = count(extra, "spawn")?;
        let mut codes = vec![0i32; extra];
        let comm = self.comm();
        // SAFETY: `comm` is a live communicator this thread owns (MPI
        // is used from the thread that initialised it only);
        // `MPI_ERRORS_RETURN` is a predefined handler.
        unsafe {
            mpi::ffi::MPI_Comm_set_errhandler(comm.as_raw(), mpi::ffi::RSMPI_ERRORS_RETURN);
        }
        // SAFETY: reads a constant handle the MPI shim defines.
        let mut raw = unsafe { mpi::ffi::RSMPI_COMM_NULL };
        // SAFETY: `prog` and every `argv` string live until the call
        // returns; `argv` ends with a null pointer; `codes` holds
        // `extra` ints; `raw` is written by the call. Every rank of
        // `comm` makes the call (collective), root 0's arguments used.
        let rc = unsafe {
            mpi::ffi::MPI_Comm_spawn(
                prog.as_ptr(),
                argv.as_mut_ptr(),
                n,
                mpi::ffi::RSMPI_INFO_NULL,
                0,
                comm.as_raw(),
                &mut raw,
                codes.as_mut_ptr(),
            )
        };
        // The root's error codes are its own: agree on the outcome.
        let ok = i32::from(rc == 0 && (self.rank.get() != 0 || codes.iter().all(|&c| c == 0)));
        let mut all = 0i32;
        comm.all_reduce_into(&ok, &mut all, mpi::collective::SystemOperation::min());
        // SAFETY: reads a constant handle the MPI shim defines.
        let comm_null = unsafe { mpi::ffi::RSMPI_COMM_NULL };
        // A failed spawn may leave `raw` anything (OpenMPI 4 writes a
        // null pointer, not MPI_COMM_NULL): wrapped only on success.
        let inter = (all == 1 && raw != comm_null)
            // SAFETY: every rank's spawn succeeded, so `raw` is the
            // call's new intercommunicator, owned from here on by the
            // value.
            .then(|| unsafe { InterCommunicator::try_from_raw(raw) })
            .flatten();
        inter.ok_or_else(|| {
            failed(format!(
                "MPI_Comm_spawn returned error {rc} (the allocation may have no free slot)"
            ))
        })
    }

    pub fn ordered_sum(&self, local: &[Vec<f64>], len: usize) -> Result<Vec<f64>> {
        let n = self.size.get();
        if n == 1 {
            // The same fold, without copying through MPI.
            let mut acc = crate::zeros::<f64>(len);
            for v in local {
                add(&mut acc, v);
            }
            return Ok(acc);
        }
        // How many vectors each rank adds.
        let mine = count(local.len(), "ordered_sum")?;
        let mut counts = vec![0i32; n];
        self.comm().all_gather_into(&mine, &mut counts[..]);
        // Piece by piece: what goes through MPI at once is a few times
        // a piece, not a few times every vector (model-sized sums
        // are as large as a partition of the data).
        let mut out = crate::zeros::<f64>(len);
        let mut at = 0;
        while at < len {
            let end = (at + SUM_PIECE).min(len);
            self.ordered_sum_piece(local, &counts, at..end, &mut out[at..end])?;
            at = end;
        }
        Ok(out)
    }

    /// [`ordered_sum`](Self::ordered_sum) of the values `range` of the
    /// vectors (every rank's vector counts in `counts`) into `out`.
    fn ordered_sum_piece(
        &self,
        local: &[Vec<f64>],
        counts: &[i32],
        range: std::ops::Range<usize>,
        out: &mut [f64],
    ) -> Result<()> {
        let n = self.size.get();
        let len = range.len();
        let bound = |j: usize| j * len / n;
        // Slice j of every local vector goes to rank j.
        let mut send = Vec::with_capacity(local.len() * len);
        let mut scounts = Vec::with_capacity(n);
        for j in 0..n {
            let (a, b) = (range.start + bound(j), range.start + bound(j + 1));
            for v in local {
                send.extend_from_slice(&v[a..b]);
            }
            scounts.push(count(local.len() * (b - a), "ordered_sum")?);
        }
        let width = bound(self.rank.get() + 1) - bound(self.rank.get());
        let rcounts = counts
            .iter()
            .map(|&m| count(m as usize * width, "ordered_sum"))
            .collect::<Result<Vec<i32>>>()?;
        let total: usize = rcounts.iter().map(|&c| c as usize).sum();
        let mut recv = crate::zeros::<f64>(total);
        {
            let sd = displacements(&scounts)?;
            let rd = displacements(&rcounts)?;
            let s = Partition::new(&send[..], &scounts[..], &sd[..]);
            let mut r = PartitionMut::new(&mut recv[..], &rcounts[..], &rd[..]);
            self.comm().all_to_all_varcount_into(&s, &mut r);
        }
        drop(send);
        // This rank's slice, added in global order: the vectors arrive
        // by source rank, each rank's in its order.
        let mut acc = crate::zeros::<f64>(width);
        if width > 0 {
            for v in recv.chunks_exact(width) {
                add(&mut acc, v);
            }
        }
        drop(recv);
        let widths = (0..n)
            .map(|j| count(bound(j + 1) - bound(j), "ordered_sum"))
            .collect::<Result<Vec<i32>>>()?;
        let wd = displacements(&widths)?;
        let mut r = PartitionMut::new(out, &widths[..], &wd[..]);
        self.comm().all_gather_varcount_into(&acc[..], &mut r);
        Ok(())
    }

    pub fn all_gather(&self, local: &[f32]) -> Result<Vec<f32>> {
        let mine = count(local.len(), "all_gather")?;
        let mut counts = vec![0i32; self.size.get()];
        self.comm().all_gather_into(&mine, &mut counts[..]);
        let total: usize = counts.iter().map(|&c| c as usize).sum();
        count(total, "all_gather")?;
        let d = displacements(&counts)?;
        let mut out = crate::zeros::<f32>(total);
        {
            let mut r = PartitionMut::new(&mut out[..], &counts[..], &d[..]);
            self.comm().all_gather_varcount_into(local, &mut r);
        }
        Ok(out)
    }

    pub fn funnel(
        &self,
        len: u64,
        piece: usize,
        mut read: impl FnMut(&mut [u8]) -> Result<()>,
        mut write: impl FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let lens = self.all_gather_u64(&[len]);
        let mut buf = crate::zeros::<u8>(piece);
        let pieces = |n: u64| {
            (0..n.div_ceil(piece as u64))
                .map(move |i| (n - i * piece as u64).min(piece as u64) as usize)
        };
        let comm = self.comm();
        if self.rank.get() != 0 {
            let root = comm.process_at_rank(0);
            for n in pieces(len) {
                read(&mut buf[..n])?;
                root.send(&buf[..n]);
            }
            return Ok(());
        }
        for (r, &n) in lens.iter().enumerate().skip(1) {
            let from = comm.process_at_rank(r as i32);
            for n in pieces(n) {
                from.receive_into(&mut buf[..n]);
                write(&buf[..n])?;
            }
        }
        Ok(())
    }

    pub fn gather_rows(&self, local: &[f64]) -> Result<Option<Vec<Vec<f64>>>> {
        let comm = self.comm();
        let root = comm.process_at_rank(0);
        if self.rank.get() != 0 {
            root.gather_into(local);
            return Ok(None);
        }
        let mut all = crate::zeros::<f64>(local.len() * self.size.get());
        root.gather_into_root(local, &mut all[..]);
        Ok(Some(
            all.chunks(local.len().max(1))
                .map(<[f64]>::to_vec)
                .collect(),
        ))
    }

    pub fn broadcast(&self, values: &mut [f32]) {
        self.comm().process_at_rank(0).broadcast_into(values);
    }

    pub fn broadcast_from(&self, root: usize, values: &mut [f64]) {
        let root = i32::try_from(root).unwrap_or(0);
        self.comm().process_at_rank(root).broadcast_into(values);
    }

    /// Every rank's `values` (as many on every rank), in rank order.
    pub fn all_gather_u64(&self, values: &[u64]) -> Vec<u64> {
        let mut all = vec![0u64; values.len() * self.size.get()];
        self.comm().all_gather_into(values, &mut all[..]);
        all
    }

    pub fn broadcast_u64(&self, values: &mut [u64]) {
        self.comm().process_at_rank(0).broadcast_into(values);
    }

    pub fn barrier(&self) {
        self.comm().barrier();
    }

    pub fn abort(&self, code: i32) -> ! {
        self.comm().abort(code)
    }
}
