//! The ranks under MPI: initialisation (`MPI_THREAD_MULTIPLE` where the
//! library gives it, at least `SERIALIZED`; or the
//! MPI another library of the process initialised), the collectives the
//! jobs use (the ordered sum, gathers, broadcasts, the agreement check),
//! growth onto free slots (`MPI_Comm_spawn`) and abort.
//!
//! Every MPI call goes through [`World::comm`], which holds a lock for
//! the call: the calls of one process never overlap, which is what
//! `MPI_THREAD_SERIALIZED` asks, whichever thread makes them (the
//! command line's main thread; a Python fit's job thread).

use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::point_to_point::{Destination, Source};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

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
    /// communicator of the ranks started and those spawned. Locked for
    /// every MPI call.
    comm: Mutex<SimpleCommunicator>,
    /// A copy of `comm` for [`World::all_arrive`]: its barrier cannot
    /// meet a collective that a rank left behind on `comm`.
    side: Mutex<SimpleCommunicator>,
    /// The lenders' side: `MPI_COMM_WORLD`'s duplicate, which the workers
    /// and the lenders (`outcore lend`) share; `None` when MPI does not
    /// give `MPI_THREAD_MULTIPLE`, or after a growth's spawn.
    lending: std::sync::OnceLock<Lending>,
    /// Lenders the workers spawned (`--lenders`), on the communicator
    /// they share with them.
    spawned: std::sync::OnceLock<Lending>,
    /// The workers' tier, once made (see [`World::remote_tier`]).
    tier: std::sync::OnceLock<std::sync::Arc<crate::remote::RemoteTier>>,
    /// Set once this worker has said goodbye (it says it once).
    left: std::sync::atomic::AtomicBool,
    /// A lender told that a lender died: it ends without `MPI_Finalize`
    /// (see `drop`).
    unfinalised: std::sync::atomic::AtomicBool,
    /// Dropped after the communicators: finalises MPI. `None` when another library
    /// (mpi4py) initialised MPI: it finalises it.
    universe: Option<Universe>,
    rank: AtomicUsize,
    size: AtomicUsize,
    on_node: AtomicUsize,
    /// Spawned by a job that grew: joined it after its start.
    pub joined: bool,
    /// Spawned, and not yet met the growth (`grow::join`).
    pub join_pending: std::sync::atomic::AtomicBool,
}

// SAFETY: MPI is initialised at `MPI_THREAD_SERIALIZED` or above (checked
// in `init`), so any thread may call it as long as no two calls overlap.
// Every MPI call of a `World` is made while `comm`'s lock is held for the
// whole call (the communicator is reached only through it; `side` is
// used under it too), and the counts beside it are atomics. The one
// exception is `abort`'s last resort, `MPI_Abort` beside a call that has
// held the lock for a second (a collective waiting for a rank that is
// gone): it ends the process.
unsafe impl Send for World {}
// SAFETY: as for `Send`: shared references reach MPI only through the
// lock on `comm`.
unsafe impl Sync for World {}

/// Whether `mpirun --enable-recovery` started this process (its processes
/// outlive one that dies).
fn recovery_on() -> bool {
    std::env::var("OMPI_MCA_orte_enable_recovery").is_ok_and(|v| v.trim() == "1")
}

/// What a process is to the others under `mpirun`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Runs the job: its collectives are the workers'.
    Worker,
    /// Runs the job, and lends the memory its work leaves under its cap
    /// to the other workers, giving it back when its work needs it (see
    /// [`Ranks::share`](super::Ranks::share)).
    Sharing,
    /// Lends its memory to the workers (`outcore lend`).
    Lender,
}

impl Role {
    /// Its code in the roles gathered at the start.
    fn code(self) -> u8 {
        match self {
            Role::Worker => 0,
            Role::Lender => 1,
            Role::Sharing => 2,
        }
    }
}

/// The workers and the lenders, on a communicator of their own (used
/// only with `MPI_THREAD_MULTIPLE`, by the tier's threads and the
/// lenders' loops; never for a collective after `init`).
struct Lending {
    comm: SimpleCommunicator,
    /// The lenders' ranks on `comm`.
    lenders: Vec<usize>,
    /// The other workers that lend (`Role::Sharing`), by rank on `comm`.
    peers: Vec<usize>,
    /// The workers there are.
    workers: usize,
    /// This process's.
    role: Role,
    /// A sharing worker's images kept for the others, and the thread
    /// that serves them (see [`World::share`]).
    server: Option<Server>,
}

/// A sharing worker's lending: the images it keeps for the others and
/// the thread that serves the requests, from `init` until the world
/// ends.
struct Server {
    pool: std::sync::Arc<crate::remote::Pool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Lending {
    /// Where this worker's evictions may go: the lenders, then the
    /// other sharing workers (a communicator and a rank each).
    fn targets(&self) -> Vec<(crate::remote::Comm, usize)> {
        let comm = crate::remote::Comm(self.comm.as_raw());
        self.lenders
            .iter()
            .chain(&self.peers)
            .map(|&r| (comm, r))
            .collect()
    }
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
        if !std::thread::panicking() {
            // Before MPI is finalised: the lenders end once every worker
            // has said goodbye.
            let lost = self.leave_lenders() || self.unfinalised.load(Ordering::Relaxed);
            // Without recovery `mpirun` ended every process at the death;
            // a lender only slow (found dead by a timeout) is alive, and
            // finalises as the workers do.
            if lost && recovery_on() {
                // Open MPI 4.1's MPI_Finalize waits for every process of
                // the job, and now and then for a dead lender too, for
                // ever (seen 1 run in 10 under `--enable-recovery`): when
                // a lender died, every process (the workers agreed on it,
                // and told the lenders) ends without it, which `mpirun
                // --enable-recovery` takes.
                std::mem::forget(self.universe.take());
            }
        }
        // Unwinding out of the thread that owns MPI: finalising would
        // wait for ranks that wait for this one. End the job instead.
        if std::thread::panicking() {
            use std::io::Write as _;
            // One write: `mpirun` could put another rank's output
            // inside a line written in pieces.
            let line = format!(
                "outcore: error: rank {} of {}: panicked; ending every rank\n",
                self.rank(),
                self.size()
            );
            let _ = std::io::stderr().write_all(line.as_bytes());
            self.abort(101);
        }
    }
}

/// Splits `world` into the workers and the lenders: the communicator
/// of this process's role, and (with `MPI_THREAD_MULTIPLE`) the one the
/// two share. Collective over `world`, lenders included.
fn split_roles(
    world: &SimpleCommunicator,
    role: Role,
    provided: Threading,
) -> Result<(SimpleCommunicator, Option<Lending>)> {
    use mpi::topology::Color;
    let shared = world.duplicate();
    let mut roles = vec![0u8; world.size() as usize];
    shared.all_gather_into(&role.code(), &mut roles[..]);
    let lends = role == Role::Lender;
    let own = world
        .split_by_color(Color::with_value(i32::from(lends)))
        .ok_or_else(|| Error::Input("internal: MPI gave no communicator for this role".into()))?;
    let of = |code: u8| -> Vec<usize> { (0..roles.len()).filter(|&r| roles[r] == code).collect() };
    let lenders = of(Role::Lender.code());
    let me = shared.rank() as usize;
    let peers = of(Role::Sharing.code())
        .into_iter()
        .filter(|&r| r != me && !lends)
        .collect();
    let workers = roles.len() - lenders.len();
    Ok((
        own,
        lending(shared, (lenders, peers), workers, role, provided)?,
    ))
}

/// The lenders' side on `comm`, where the `lenders` are and `workers`
/// work; `None` (or, for a lender, an error) without
/// `MPI_THREAD_MULTIPLE`.
fn lending(
    comm: SimpleCommunicator,
    (lenders, peers): (Vec<usize>, Vec<usize>),
    workers: usize,
    role: Role,
    provided: Threading,
) -> Result<Option<Lending>> {
    if provided < Threading::Multiple {
        if role == Role::Lender {
            return Err(Error::Input(format!(
                "a lender needs MPI_THREAD_MULTIPLE; this MPI library gives {provided:?}"
            )));
        }
        return Ok(None);
    }
    // A failed message is an error code, never an abort: a lender may die.
    // SAFETY: `comm` is a live communicator; MPI_ERRORS_RETURN is a
    // predefined handler.
    unsafe {
        mpi::ffi::MPI_Comm_set_errhandler(comm.as_raw(), mpi::ffi::RSMPI_ERRORS_RETURN);
    }
    // A sharing worker serves the others from now on (the cap comes
    // later, with its runtime: until then it declines every image).
    let server = (role == Role::Sharing && workers > 1)
        .then(|| serve_others(crate::remote::Comm(comm.as_raw()), workers - 1))
        .transpose()?;
    Ok(Some(Lending {
        comm,
        lenders,
        peers,
        workers,
        role,
        server,
    }))
}

/// Starts a sharing worker's serving thread on `comm`, until the `others`
/// workers have said goodbye or the world ends.
fn serve_others(comm: crate::remote::Comm, others: usize) -> Result<Server> {
    let pool = std::sync::Arc::new(crate::remote::Pool::spare());
    let p = pool.clone();
    let thread = std::thread::Builder::new()
        .name("outcore-lend".into())
        .spawn(move || {
            // Idle, it looks for a request every 2 ms: the job's threads
            // keep the cores.
            let idle = std::time::Duration::from_millis(2);
            let _ = crate::remote::serve(comm, others, &p, idle, None);
        })
        .map_err(|e| Error::Input(format!("could not start the thread that lends memory: {e}")))?;
    Ok(Server {
        pool,
        thread: Mutex::new(Some(thread)),
    })
}

impl World {
    /// Initialises MPI at `MPI_THREAD_MULTIPLE` (at least `SERIALIZED`),
    /// splits the lenders from the workers (see [`Role`]), or, when another
    /// library of this process (mpi4py) initialised it already, takes
    /// its `MPI_COMM_WORLD` (and leaves finalising to it).
    pub fn init(role: Role) -> Result<World> {
        let universe = if mpi::environment::is_initialized() {
            None
        } else {
            // Multiple where the library gives it: the lenders' tier
            // calls MPI from the runtime's threads beside the job's.
            let (u, _) = mpi::initialize_with_threading(Threading::Multiple)
                .ok_or_else(|| Error::Input("MPI was initialised while outcore started".into()))?;
            Some(u)
        };
        let provided = mpi::environment::threading_support();
        if provided < Threading::Serialized {
            return Err(Error::Input(format!(
                "the MPI library provides thread level {provided:?}; outcore needs at least \
                 Serialized (its jobs call MPI from the thread that runs them)"
            )));
        }
        let world = SimpleCommunicator::world();
        // Spawned by a job that grew: the parents merge with us
        // (they first, in their order), then split by node. The
        // spawned ranks have no lenders.
        let (comm, joined, lending) = match (world.parent(), role) {
            // A lender the workers spawned (`--lenders`): it shares their
            // merged communicator, after them.
            (Some(parent), Role::Lender) => {
                let workers = parent.remote_size() as usize;
                let merged = parent.merge(MergeOrder::High);
                let lenders = (workers..merged.size() as usize).collect();
                let l = lending(merged, (lenders, Vec::new()), workers, role, provided)?;
                (world, false, l)
            }
            (Some(parent), _) => (parent.merge(MergeOrder::High), true, None),
            (None, _) => {
                let (workers, lending) = split_roles(&world, role, provided)?;
                // Kept only with someone to lend (or to lend to).
                let any = |l: &Lending| {
                    !l.lenders.is_empty() || !l.peers.is_empty() || l.server.is_some()
                };
                (workers, false, lending.filter(any))
            }
        };
        let on_node = comm.split_shared(0).size() as usize;
        let side = comm.duplicate();
        Ok(World {
            side: Mutex::new(side),
            rank: AtomicUsize::new(comm.rank() as usize),
            size: AtomicUsize::new(comm.size() as usize),
            on_node: AtomicUsize::new(on_node),
            joined,
            join_pending: std::sync::atomic::AtomicBool::new(joined),
            comm: Mutex::new(comm),
            lending: lending.map(std::sync::OnceLock::from).unwrap_or_default(),
            spawned: std::sync::OnceLock::new(),
            tier: std::sync::OnceLock::new(),
            left: std::sync::atomic::AtomicBool::new(false),
            unfinalised: std::sync::atomic::AtomicBool::new(false),
            universe,
        })
    }

    /// The lendings this process takes part in: beside the job, and
    /// spawned.
    fn lendings(&self) -> impl Iterator<Item = &Lending> {
        self.lending.get().into_iter().chain(self.spawned.get())
    }

    /// The tier over the lenders' and the sharing workers' memory, for a
    /// worker: `None` without any (or without `MPI_THREAD_MULTIPLE`).
    pub fn remote_tier(&self) -> Option<std::sync::Arc<crate::remote::RemoteTier>> {
        if let Some(t) = self.tier.get() {
            return Some(t.clone());
        }
        let targets: Vec<_> = self
            .lendings()
            .filter(|l| l.role != Role::Lender)
            .flat_map(Lending::targets)
            .collect();
        if targets.is_empty() {
            return None;
        }
        let tier = self
            .tier
            .get_or_init(|| std::sync::Arc::new(crate::remote::RemoteTier::new(&targets)));
        Some(tier.clone())
    }

    /// Whether this worker found a lender dead.
    fn lost_a_lender(&self) -> bool {
        self.tier.get().is_some_and(|t| t.figures().lost > 0)
    }

    /// The lenders beside the workers (0 on a lender).
    pub fn lenders(&self) -> usize {
        self.lendings()
            .filter(|l| l.role != Role::Lender)
            .map(|l| l.lenders.len())
            .sum()
    }

    /// For a sharing worker: lends what its work leaves under `cap`
    /// (bytes), and returns what it keeps for the others, for its runtime
    /// to take memory back from ([`outcore::Builder::reclaim`]). `None`
    /// for any other process.
    pub fn share(&self, cap: u64) -> Option<std::sync::Arc<dyn outcore::Reclaim>> {
        let s = self.lending.get()?.server.as_ref()?;
        s.pool.set_cap(cap);
        Some(s.pool.clone() as std::sync::Arc<dyn outcore::Reclaim>)
    }

    /// What this process kept for the others: the most bytes at once, and
    /// the bytes it gave back for its own work.
    pub fn kept_for_others(&self) -> (u64, u64) {
        self.lending
            .get()
            .and_then(|l| l.server.as_ref())
            .map_or((0, 0), |s| s.pool.figures())
    }

    /// For a lender: serves the workers until each has said goodbye,
    /// holding at most `budget` bytes.
    pub fn lend(&self, budget: u64) -> Result<crate::remote::Lent> {
        let l = self.lending.get().ok_or_else(|| {
            Error::Input(
                "a lender needs MPI_THREAD_MULTIPLE, which this MPI library does not give".into(),
            )
        })?;
        let die_after = std::env::var("OUTCORE_FAULT_LENDER_DIES_AFTER")
            .ok()
            .and_then(|v| v.parse().ok());
        let comm = crate::remote::Comm(l.comm.as_raw());
        let pool = crate::remote::Pool::fixed(budget);
        let idle = std::time::Duration::from_millis(1);
        let lent = crate::remote::serve(comm, l.workers, &pool, idle, die_after)
            .map_err(|e| Error::Input(format!("lending: {e}")))?;
        self.unfinalised.store(lent.lost, Ordering::Relaxed);
        Ok(lent)
    }

    /// Tells the lenders and the sharing workers this worker is done
    /// (before MPI is finalised: they end once every worker has), once,
    /// then ends its own lending: whether any worker found a lender dead
    /// (then MPI is not finalised, see `drop`). Collective over the
    /// workers, who agree on that first.
    fn leave_lenders(&self) -> bool {
        if !self.lendings().any(|l| l.role != Role::Lender) {
            return false;
        }
        if self.left.swap(true, Ordering::Relaxed) {
            return false;
        }
        let mine = i32::from(self.lost_a_lender());
        let mut any = 0i32;
        self.comm()
            .all_reduce_into(&mine, &mut any, mpi::collective::SystemOperation::max());
        let lost = any > 0;
        // Made here if nothing was evicted: goodbye all the same.
        if let Some(t) = self.remote_tier() {
            t.goodbye(lost);
        }
        // Every worker is done, and its goodbye on its way: this one's
        // serving ends once it has them.
        if let Some(s) = self.lending.get().and_then(|l| l.server.as_ref()) {
            s.pool.stop();
            let thread = s.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(t) = thread {
                let _ = t.join();
            }
        }
        lost
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank.load(Ordering::Relaxed)
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size.load(Ordering::Relaxed)
    }

    /// The ranks on this node.
    pub fn on_node(&self) -> usize {
        self.on_node.load(Ordering::Relaxed)
    }

    /// The communicator, locked for the MPI calls made with it.
    fn comm(&self) -> MutexGuard<'_, SimpleCommunicator> {
        // The lock guards no invariant a panic could break.
        self.comm.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `MPI_UNIVERSE_SIZE`: the slots of the allocation, when the
    /// launcher says.
    pub fn universe_size(&self) -> Option<usize> {
        // Test hook: more slots than the allocation has, to see a
        // spawn fail.
        let claimed = std::env::var("OUTCORE_FAULT_UNIVERSE_SIZE").ok();
        claimed.and_then(|v| v.parse().ok()).or_else(|| {
            // An MPI call: under the lock.
            let _serial = self.comm();
            self.universe.as_ref().and_then(Universe::size)
        })
    }

    /// Spawns `extra` processes running this program with this
    /// process's arguments and merges them in after the ranks there
    /// are: from then on every collective includes them. Collective.
    /// A failed spawn is an error on every rank, not an abort.
    pub fn grow(&self, extra: usize) -> Result<()> {
        let mut comm = self.comm();
        let inter = self.spawn(&comm, extra, None)?;
        let merged = inter.merge(MergeOrder::Low);
        drop(inter);
        let on_node = merged.split_shared(0).size() as usize;
        self.rank.store(merged.rank() as usize, Ordering::Relaxed);
        self.size.store(merged.size() as usize, Ordering::Relaxed);
        self.on_node.store(on_node, Ordering::Relaxed);
        *self.side.lock().unwrap_or_else(|p| p.into_inner()) = merged.duplicate();
        *comm = merged;
        Ok(())
    }

    /// Spawns `n` lenders (`outcore lend --mem-cap cap`, this program)
    /// on free slots: they join the workers on a communicator of their
    /// own, after them, and the workers' collectives stay theirs alone.
    /// Collective over the workers. An error on every rank when the spawn
    /// fails, when lenders are there already (started beside the job),
    /// or without `MPI_THREAD_MULTIPLE`.
    pub fn spawn_lenders(&self, n: usize, cap: &str) -> Result<()> {
        // The tier, once made, is over the lenders of then.
        if self.tier.get().is_some() {
            return Err(Error::Input(
                "lenders are spawned before the job's runtime starts".into(),
            ));
        }
        if self.lendings().any(|l| !l.lenders.is_empty()) {
            return Err(Error::Input(
                "lenders were started beside the job already; spawn none more".into(),
            ));
        }
        let provided = mpi::environment::threading_support();
        if provided < Threading::Multiple {
            return Err(Error::Input(format!(
                "lenders need MPI_THREAD_MULTIPLE; this MPI library gives {provided:?}"
            )));
        }
        let comm = self.comm();
        let workers = comm.size() as usize;
        let inter = self.spawn(&comm, n, Some(cap))?;
        let merged = inter.merge(MergeOrder::Low);
        drop(inter);
        drop(comm);
        let l = lending(
            merged,
            ((workers..workers + n).collect(), Vec::new()),
            workers,
            Role::Worker,
            provided,
        )?
        .ok_or_else(|| Error::Input("internal: no lending after a spawn".into()))?;
        self.spawned
            .set(l)
            .map_err(|_| Error::Input("lenders were spawned already".into()))
    }

    /// `MPI_Comm_spawn` of `extra` copies of this program, under
    /// `MPI_ERRORS_RETURN` (a failure is an error code, not an abort),
    /// its outcome agreed on by every rank.
    fn spawn(
        &self,
        comm: &SimpleCommunicator,
        extra: usize,
        lend: Option<&str>,
    ) -> Result<InterCommunicator> {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let failed = |what: String| Error::Input(format!("could not spawn {extra} ranks: {what}"));
        let this = || {
            std::env::current_exe()
                .map(std::path::PathBuf::into_os_string)
                .map_err(|e| failed(e.to_string()))
        };
        let (exe, args) = match (lend, super::spawn_command()) {
            (Some(cap), _) => (this()?, ["lend", "--mem-cap", cap].map(Into::into).to_vec()),
            (None, Some(given)) => given,
            (None, None) => (this()?, std::env::args_os().skip(1).collect()),
        };
        let prog = CString::new(exe.as_bytes()).map_err(|e| failed(e.to_string()))?;
        let args = args
            .iter()
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
        // SAFETY: `comm` is a live communicator, locked by the caller
        // for the calls made with it;
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
        let ok = i32::from(rc == 0 && (self.rank() != 0 || codes.iter().all(|&c| c == 0)));
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
        let n = self.size();
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
        let n = self.size();
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
        let width = bound(self.rank() + 1) - bound(self.rank());
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

    pub fn all_gather<T>(&self, local: &[T]) -> Result<Vec<T>>
    where
        T: mpi::datatype::Equivalence + Copy + Default,
    {
        let mine = count(local.len(), "all_gather")?;
        let mut counts = vec![0i32; self.size()];
        self.comm().all_gather_into(&mine, &mut counts[..]);
        let total: usize = counts.iter().map(|&c| c as usize).sum();
        count(total, "all_gather")?;
        let d = displacements(&counts)?;
        let mut out = vec![T::default(); total];
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
        if self.rank() != 0 {
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
        if self.rank() != 0 {
            root.gather_into(local);
            return Ok(None);
        }
        let mut all = crate::zeros::<f64>(local.len() * self.size());
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
        let mut all = vec![0u64; values.len() * self.size()];
        self.comm().all_gather_into(values, &mut all[..]);
        all
    }

    /// Rank 0's `bytes` on every rank (their length first).
    pub fn broadcast_bytes(&self, bytes: &mut Vec<u8>) {
        let comm = self.comm();
        let root = comm.process_at_rank(0);
        let mut len = bytes.len() as u64;
        root.broadcast_into(&mut len);
        bytes.resize(len as usize, 0);
        root.broadcast_into(&mut bytes[..]);
    }

    pub fn broadcast_u64(&self, values: &mut [u64]) {
        self.comm().process_at_rank(0).broadcast_into(values);
    }

    /// Whether every rank calls this within `wait` of this rank's call:
    /// a barrier on a communicator of its own, polled. When some rank
    /// does not come, the barrier stays pending (its request forgotten):
    /// the ranks are out of step, and the caller must end them.
    pub fn all_arrive(&self, wait: std::time::Duration) -> bool {
        // Its calls are MPI calls too: under `comm`'s lock (then `side`'s,
        // the order `grow` takes them in).
        let _serial = self.comm();
        let side = self.side.lock().unwrap_or_else(|p| p.into_inner());
        let mut req = side.immediate_barrier();
        let start = std::time::Instant::now();
        loop {
            match req.test() {
                Ok(_) => return true,
                Err(pending) => req = pending,
            }
            if start.elapsed() >= wait {
                // Dropping a pending request panics: it is left to MPI,
                // which the caller ends.
                std::mem::forget(req);
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    pub fn barrier(&self) {
        self.comm().barrier();
    }

    /// Ends every rank. Without waiting for a call under way on another
    /// thread (which may wait for a rank that is gone): `MPI_Abort` is
    /// then made beside it, on `MPI_COMM_WORLD`, the process's last call.
    pub fn abort(&self, code: i32) -> ! {
        for _ in 0..100 {
            if let Ok(comm) = self.comm.try_lock() {
                comm.abort(code)
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        SimpleCommunicator::world().abort(code)
    }
}
