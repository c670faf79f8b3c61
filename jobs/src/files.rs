//! Files in and out: opening an input with its length (and telling its
//! format), and writing an output atomically.
//!
//! Every output (`.npy` arrays, the JSON statistics) goes through
//! [`AtomicFile`]: the bytes are written to a temporary file in the
//! target's directory, which is renamed over the target only once it is
//! complete. A run that fails or is interrupted leaves no file that looks
//! valid, and no temporary file either.
//!
//! On Linux the temporary file is made with `O_TMPFILE`: it has no name
//! while it is written, so the kernel frees it whatever ends the process,
//! a SIGKILL or an abort included. On commit it is synced, linked under a
//! hidden name (`.outcore-partial-*.tmp`, through `/proc/self/fd`) and at
//! once renamed over the target; only that instant has a name to leave.
//! Where `O_TMPFILE` is refused (a filesystem or kernel without it, no
//! `/proc`) the temporary file is named from the start: it is removed
//! when dropped, and when a signal ends the run the command line's
//! handler removes those registered here with [`remove_partial_outputs`];
//! a SIGKILL leaves it.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Serialize;
use tempfile::NamedTempFile;

use crate::error::{Error, Result};

/// Opens an input file: the file and its length in bytes.
pub(crate) fn open_input(path: &Path) -> Result<(File, u64)> {
    if path.is_dir() {
        return Err(Error::Input(format!("{}: is a directory", path.display())));
    }
    let file = File::open(path).map_err(|e| Error::io(path, "cannot open", e))?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "cannot read its size", e))?
        .len();
    Ok((file, len))
}

/// An output file written in full or not at all.
///
/// Bytes go to a temporary file next to the target (same directory, so the
/// final rename stays on one filesystem), created with mode 0666 less the
/// umask, as other tools' outputs are, and without a name where the
/// system allows (see the module's documentation); [`AtomicFile::commit`]
/// syncs it and renames it over the target. Dropped without a commit, the
/// temporary file is gone and the target is untouched. A symlink to a regular
/// file is followed: the file it points to is replaced, the link stays.
///
/// Two targets are written in place instead: `-` (standard output) and an
/// existing file that is not a regular file (a FIFO, a terminal,
/// `/dev/null`, `/dev/stdout`), which a rename would replace.
#[derive(Debug)]
pub(crate) struct AtomicFile {
    out: Sink,
    path: PathBuf,
    /// A named temporary file's entry in [`PARTIAL`], dropped after `out`
    /// (so after the file is removed or renamed).
    _partial: Option<Partial>,
}

/// The named temporary files of the outputs being written, for
/// [`remove_partial_outputs`]; `closed` once it has run. Its lock also
/// covers naming an unnamed one on commit, so a signal's cleanup comes
/// before (the output is refused) or after (it is complete).
static PARTIAL: Mutex<(Vec<PathBuf>, bool)> = Mutex::new((Vec::new(), false));

/// A temporary file listed in [`PARTIAL`] while it lives.
#[derive(Debug)]
struct Partial(PathBuf);

impl Drop for Partial {
    fn drop(&mut self) {
        if let Ok(mut p) = PARTIAL.lock() {
            if let Some(i) = p.0.iter().position(|q| *q == self.0) {
                p.0.swap_remove(i);
            }
        }
    }
}

/// Removes the temporary files of the outputs being written, and makes
/// any later output fail to start: for a signal handler's thread, before
/// the process exits (destructors do not run then). An output complete
/// and renamed into place stays.
pub fn remove_partial_outputs() {
    let mut p = match PARTIAL.lock() {
        Ok(p) => p,
        Err(e) => e.into_inner(),
    };
    for f in p.0.drain(..) {
        let _ = std::fs::remove_file(f);
    }
    p.1 = true;
}

#[derive(Debug)]
enum Sink {
    /// A temporary file without a name in this directory, named and
    /// renamed over the target on commit.
    Unnamed(BufWriter<File>, PathBuf),
    /// A named temporary file, renamed over the target on commit.
    Temp(BufWriter<NamedTempFile>),
    /// An existing non-regular file, written in place.
    InPlace(BufWriter<File>),
    /// Standard output (`-`).
    Stdout(BufWriter<std::io::Stdout>),
}

/// Where an output goes.
enum Target {
    Stdout,
    InPlace,
    /// A regular file (new or replaced) at this path.
    Replace(PathBuf),
}

fn target(path: &Path) -> Result<Target> {
    if path.as_os_str() == "-" {
        return Ok(Target::Stdout);
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(Error::Output {
            path: path.to_path_buf(),
            reason: "is a directory".into(),
        }),
        Ok(m) if !m.is_file() => Ok(Target::InPlace),
        // A regular file, maybe behind a symlink: replace the file.
        Ok(_) => Ok(Target::Replace(
            std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
        )),
        Err(_) => Ok(Target::Replace(path.to_path_buf())),
    }
}

impl AtomicFile {
    /// Starts writing `path`. Fails when `path` is a directory or its
    /// directory cannot hold a new file. Opening a FIFO waits for its
    /// reader, as a shell redirection does.
    pub(crate) fn create(path: &Path) -> Result<AtomicFile> {
        let mut partial = None;
        let out = match target(path)? {
            Target::Stdout => Sink::Stdout(BufWriter::with_capacity(1 << 16, std::io::stdout())),
            Target::InPlace => {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(|e| Error::io(path, "cannot write", e))?;
                Sink::InPlace(BufWriter::with_capacity(1 << 20, f))
            }
            Target::Replace(real) => match temp_next_to(&real, path)? {
                Temp::Unnamed(f, dir) => Sink::Unnamed(BufWriter::with_capacity(1 << 20, f), dir),
                Temp::Named(tmp, p) => {
                    partial = Some(p);
                    Sink::Temp(BufWriter::with_capacity(1 << 20, tmp))
                }
            },
        };
        Ok(AtomicFile {
            out,
            path: path.to_path_buf(),
            _partial: partial,
        })
    }

    /// The file being written.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends bytes.
    pub(crate) fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        let r = match &mut self.out {
            Sink::Unnamed(w, _) => w.write_all(bytes),
            Sink::Temp(w) => w.write_all(bytes),
            Sink::InPlace(w) => w.write_all(bytes),
            Sink::Stdout(w) => w.write_all(bytes),
        };
        r.map_err(|e| Error::io(&self.path, "cannot write", e))
    }

    /// Flushes the bytes out: syncs and renames a temporary file over the
    /// target.
    pub(crate) fn commit(self) -> Result<()> {
        let path = self.path;
        let err = |e| Error::io(&path, "cannot write", e);
        match self.out {
            Sink::Unnamed(w, dir) => {
                let f = w.into_inner().map_err(|e| err(e.into_error()))?;
                f.sync_all().map_err(err)?;
                let list = match PARTIAL.lock() {
                    Ok(p) => p,
                    Err(e) => e.into_inner(),
                };
                if list.1 {
                    return Err(interrupted(&path));
                }
                name_over(&f, &dir, &target_path(&path)).map_err(err)?;
            }
            Sink::Temp(w) => {
                let tmp = w.into_inner().map_err(|e| err(e.into_error()))?;
                tmp.as_file().sync_all().map_err(err)?;
                // Onto the file a symlink points to, next to which the
                // temporary file was made.
                tmp.persist(target_path(&path)).map_err(|e| err(e.error))?;
            }
            Sink::InPlace(mut w) => w.flush().map_err(err)?,
            Sink::Stdout(mut w) => w.flush().map_err(err)?,
        }
        Ok(())
    }
}

/// The regular file a target path names (through a symlink), or the path.
fn target_path(path: &Path) -> PathBuf {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
        _ => path.to_path_buf(),
    }
}

/// The error of an output started or committed after a signal's cleanup.
fn interrupted(shown: &Path) -> Error {
    Error::Output {
        path: shown.to_path_buf(),
        reason: "not written: the run was interrupted".into(),
    }
}

/// A temporary file in a target's directory.
enum Temp {
    /// Without a name (`O_TMPFILE`), and the directory to name it in.
    Unnamed(File, PathBuf),
    /// Named, and its entry in [`PARTIAL`].
    Named(NamedTempFile, Partial),
}

/// A temporary file, mode 0666 less the umask (the kernel applies it), in
/// the directory of `real`: without a name where the system allows, else
/// named and listed in [`PARTIAL`]. Errors name `shown`. Made under
/// [`PARTIAL`]'s lock, so a signal's cleanup either sees it or comes
/// first and makes this fail.
fn temp_next_to(real: &Path, shown: &Path) -> Result<Temp> {
    use std::os::unix::fs::PermissionsExt;
    let dir = match real.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut list = match PARTIAL.lock() {
        Ok(p) => p,
        Err(e) => e.into_inner(),
    };
    if list.1 {
        return Err(interrupted(shown));
    }
    if let Some(f) = unnamed_in(dir) {
        return Ok(Temp::Unnamed(f, dir.to_path_buf()));
    }
    // Any failure of `O_TMPFILE` falls back here: where it is not
    // supported, this works; where the directory cannot take a file, this
    // fails with the reason.
    let tmp = tempfile::Builder::new()
        .prefix(".outcore-partial-")
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(dir)
        .map_err(|e| Error::io(shown, "cannot write", plain(e)))?;
    list.0.push(tmp.path().to_path_buf());
    let entry = Partial(tmp.path().to_path_buf());
    Ok(Temp::Named(tmp, entry))
}

#[cfg(test)]
thread_local! {
    /// Set by a test to take the named fallback, as where `O_TMPFILE` is
    /// refused.
    static NO_TMPFILE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A new file without a name in `dir`, mode 0666 less the umask, that
/// [`name_over`] can name; `None` where the filesystem, the kernel or a
/// missing `/proc` do not allow it, or `dir` cannot take a file.
#[cfg(target_os = "linux")]
fn unnamed_in(dir: &Path) -> Option<File> {
    use std::os::fd::FromRawFd;
    #[cfg(test)]
    if NO_TMPFILE.with(|n| n.get()) {
        return None;
    }
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    let flags = libc::O_TMPFILE | libc::O_WRONLY | libc::O_CLOEXEC;
    // SAFETY: `c` is a NUL-terminated path that outlives the call; the
    // mode is passed as the variadic argument `open` reads with O_TMPFILE.
    let fd = unsafe { libc::open(c.as_ptr(), flags, 0o666 as libc::c_uint) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened and is owned by nothing else; the
    // `File` closes it.
    let f = unsafe { File::from_raw_fd(fd) };
    // Naming it on commit goes through /proc (a link with AT_EMPTY_PATH
    // would need CAP_DAC_READ_SEARCH).
    std::fs::metadata(proc_fd(&f)).ok()?;
    Some(f)
}

#[cfg(not(target_os = "linux"))]
fn unnamed_in(_dir: &Path) -> Option<File> {
    None
}

/// The `/proc` path of an open file's descriptor.
fn proc_fd(f: &File) -> PathBuf {
    use std::os::fd::AsRawFd;
    PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

/// Gives the unnamed file `f` of `dir` the name `to`, replacing what is
/// there: `linkat` cannot replace a file, so it is linked under a new
/// hidden name in `dir` and at once renamed over `to` (the link is
/// removed if that fails).
fn name_over(f: &File, dir: &Path, to: &Path) -> std::io::Result<()> {
    let from = std::ffi::CString::new(proc_fd(f).into_os_string().into_encoded_bytes())?;
    let linked = tempfile::Builder::new()
        .prefix(".outcore-partial-")
        .suffix(".tmp")
        .make_in(dir, |name| {
            let c = std::ffi::CString::new(name.as_os_str().as_encoded_bytes())?;
            // SAFETY: both paths are NUL-terminated and outlive the call.
            let r = unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    from.as_ptr(),
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            };
            if r != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
        .map_err(plain)?;
    linked.persist(to).map_err(|e| e.error)?;
    Ok(())
}

/// A `tempfile` error without the temporary file's name that `tempfile`
/// adds (`... at path "/dir/.outcore-partial-XXXX.tmp"`): the message
/// names the output instead.
fn plain(e: std::io::Error) -> std::io::Error {
    let text = e.to_string();
    match text.find(" at path ") {
        Some(at) => std::io::Error::new(e.kind(), text[..at].to_string()),
        None => e,
    }
}

/// What a path names, to tell when two paths are one file.
#[derive(PartialEq, Eq)]
enum Identity {
    /// `-`.
    Stdout,
    /// An existing regular file (through symlinks).
    File(u64, u64),
    /// A file to be made: its directory's real path, and its name.
    New(PathBuf),
    /// A device, a FIFO, or a path that cannot be resolved: written in
    /// place and shared freely (`/dev/null` twice is fine).
    Other,
}

fn identity(path: &Path) -> Identity {
    use std::os::unix::fs::MetadataExt;
    if path.as_os_str() == "-" {
        return Identity::Stdout;
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Identity::File(m.dev(), m.ino()),
        Ok(_) => Identity::Other,
        Err(_) => {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            match (std::fs::canonicalize(dir), path.file_name()) {
                (Ok(d), Some(name)) => Identity::New(d.join(name)),
                _ => Identity::Other,
            }
        }
    }
}

/// Checks a command's outputs before any work is done: each can be
/// written ([`check_writable`]), no two name the same file (standard
/// output included), and none is one of the files the run reads, which
/// writing it would destroy. Each path comes with the flag that gave it,
/// for the message.
pub fn check_outputs(outputs: &[(&str, &Path)], inputs: &[(&str, &Path)]) -> Result<()> {
    for (_, p) in outputs {
        check_writable(p)?;
    }
    for (i, &(flag, p)) in outputs.iter().enumerate() {
        let id = identity(p);
        if id == Identity::Other {
            continue;
        }
        if let Some((other, _)) = outputs[..i].iter().find(|(_, q)| identity(q) == id) {
            let what = if id == Identity::Stdout {
                "standard output".to_string()
            } else {
                p.display().to_string()
            };
            return Err(Error::Input(format!(
                "{other} and {flag} both write {what}: give each output a file of its own"
            )));
        }
        if let Some((input, _)) = inputs.iter().find(|(_, q)| identity(q) == id) {
            return Err(Error::Input(format!(
                "{flag} {} is the {input} file, which the run reads: writing it would destroy it",
                p.display()
            )));
        }
    }
    Ok(())
}

/// Checks that `path` can be written (it is not a directory, and its
/// directory takes a new file; `-` and existing non-regular files are
/// written in place) before any work is done. Nothing is left behind, and
/// a FIFO is not opened.
pub fn check_writable(path: &Path) -> Result<()> {
    match target(path)? {
        Target::Stdout => check_stdout_open(path),
        Target::InPlace => {
            let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
                Error::Output {
                    path: path.to_path_buf(),
                    reason: "the path holds a NUL byte".into(),
                }
            })?;
            // SAFETY: `c` is a NUL-terminated path that outlives the call.
            if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
                return Err(Error::io(
                    path,
                    "cannot write",
                    std::io::Error::last_os_error(),
                ));
            }
            Ok(())
        }
        // Without a name where the system allows: nothing to leave.
        Target::Replace(real) => {
            temp_next_to(&real, path)?;
            check_final_name(&real, path)
        }
    }
}

/// Standard output must be open for writing when an output goes to it.
/// A closed one (`>&-`) is reopened on `/dev/null`, read-write, by the
/// standard library before `main`, so `--stats -` lost the statistics
/// and exited 0: that descriptor is told from a shell's `> /dev/null`
/// (write-only) by its access mode.
fn check_stdout_open(shown: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: F_GETFL only reads the descriptor's flags; no memory is
    // passed.
    let flags = unsafe { libc::fcntl(libc::STDOUT_FILENO, libc::F_GETFL) };
    let null = || {
        let rdev = |p: &str| std::fs::metadata(p).map(|m| m.rdev()).ok();
        rdev("/proc/self/fd/1").is_some_and(|r| Some(r) == rdev("/dev/null"))
    };
    let mode = flags & libc::O_ACCMODE;
    if flags == -1 || mode == libc::O_RDONLY || (mode == libc::O_RDWR && null()) {
        return Err(Error::Output {
            path: shown.to_path_buf(),
            reason: "standard output is closed".into(),
        });
    }
    Ok(())
}

/// Checks what the temporary file does not: that `real`'s own name can
/// hold the output. A new name is created and removed again (a name over
/// the filesystem's limit is refused here, not after the run); an
/// existing file must not be immutable or append-only (`chattr +i`,
/// `+a`), which no rename can replace. Errors name `shown`.
fn check_final_name(real: &Path, shown: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(real)
    {
        Ok(f) => {
            drop(f);
            std::fs::remove_file(real).map_err(|e| Error::io(shown, "cannot write", e))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            // Opened to read its flags only; a file that cannot be opened
            // is replaced by its name, as before.
            let Ok(f) = File::open(real) else {
                return Ok(());
            };
            let mut flags: libc::c_long = 0;
            // SAFETY: `f` is an open descriptor for the call, and
            // FS_IOC_GETFLAGS writes one long to `flags`, which outlives it.
            let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) };
            // FS_IMMUTABLE_FL, FS_APPEND_FL (linux/fs.h).
            let (immutable, append) = (0x10, 0x20);
            let what = if r != 0 {
                return Ok(());
            } else if flags & immutable != 0 {
                "immutable (chattr +i)"
            } else if flags & append != 0 {
                "append-only (chattr +a)"
            } else {
                return Ok(());
            };
            Err(Error::Output {
                path: shown.to_path_buf(),
                reason: format!("cannot write: the file is {what}, so it cannot be replaced"),
            })
        }
        Err(e) => Err(Error::io(shown, "cannot write", e)),
    }
}

/// Checks that `bytes` more fit on the filesystem that is to hold `path`
/// (a regular file, new or replaced; `-`, devices and FIFOs are not
/// checked), before any of them is written: a run that cannot finish its
/// output is refused at once instead of filling the disk. The space free
/// to an unprivileged user counts, and so does the file-size limit
/// (`ulimit -f`), past which a write fails part-way.
pub fn check_room(path: &Path, bytes: u64) -> Result<()> {
    let Target::Replace(real) = target(path)? else {
        return Ok(());
    };
    let too_large = |what: String| Error::Output {
        path: path.to_path_buf(),
        reason: format!("{} to write, but {what}", large_size(bytes)),
    };
    if let Some(free) = free_space(&real).filter(|&f| bytes > f) {
        return Err(too_large(format!(
            "its filesystem has {} free",
            large_size(free)
        )));
    }
    match file_size_limit() {
        Some(limit) if bytes > limit => Err(too_large(format!(
            "the file-size limit (ulimit -f {}) is {}",
            limit / 1024,
            large_size(limit)
        ))),
        _ => Ok(()),
    }
}

/// The space free to an unprivileged user on the filesystem that is to
/// hold `real`, when it can be read.
fn free_space(real: &Path) -> Option<u64> {
    let dir = match real.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs is plain data, valid when zeroed.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a writable struct,
    // both live for the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// The file-size limit (`ulimit -f`, `RLIMIT_FSIZE`) in bytes, when
/// finite.
pub fn file_size_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit struct.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim) } == 0;
    (ok && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// Checks that a file of `bytes` (`what`: an output's path, or the spill
/// files) can be written under the file-size limit (`ulimit -f`): past
/// it a write fails part-way (a spill write keeps its executor in
/// memory, over the cap; an output fails after the whole run).
pub fn check_file_size(what: &str, bytes: u64) -> Result<()> {
    match file_size_limit() {
        Some(limit) if bytes > limit => Err(Error::Input(format!(
            "{what} would reach {}, more than the file-size limit (ulimit -f {}) of {}",
            large_size(bytes),
            limit / 1024,
            large_size(limit)
        ))),
        _ => Ok(()),
    }
}

/// A size as `format_bytes` writes it, in TiB from 1 TiB on.
fn large_size(bytes: u64) -> String {
    if bytes >= 1 << 40 {
        format!("{:.1} TiB", bytes as f64 / (1u64 << 40) as f64)
    } else {
        outcore::format_bytes(bytes)
    }
}

/// Writes `bytes` to `path` as the other outputs are: through a
/// temporary file renamed into place (mode 0666 less the umask), `-` to
/// standard output, an existing device or FIFO in place.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = AtomicFile::create(path)?;
    f.write_all(bytes)?;
    f.commit()
}

/// Writes `value` as pretty JSON to `path`, atomically (as
/// [`write_file`]).
pub fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| Error::Output {
        path: path.to_path_buf(),
        reason: format!("cannot encode as JSON: {e}"),
    })?;
    let mut f = AtomicFile::create(path)?;
    f.write_all(text.as_bytes())?;
    f.commit()
}

/// The format a file's name gives (`npy`, `npz`, `fvecs`), or, for a
/// regular file under any other name, the format its first bytes show
/// (NumPy's magic string, a zip archive's): a `.npy` file renamed is not
/// read as raw floats (its header taken for rows). Anything else is raw.
pub(crate) fn format_of(path: &Path) -> String {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    if matches!(ext.as_str(), "npy" | "npz" | "fvecs") {
        return ext;
    }
    match sniff(path) {
        Some(kind) => kind.to_string(),
        None => ext,
    }
}

/// `npy` or `npz` from a regular file's first bytes, if they say so.
fn sniff(path: &Path) -> Option<&'static str> {
    use std::io::Read;
    if !std::fs::metadata(path).ok()?.is_file() {
        return None;
    }
    let mut head = [0u8; 6];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    if &head == b"\x93NUMPY" {
        Some("npy")
    } else if head.starts_with(b"PK\x03\x04") {
        Some("npz")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_uncommitted_file_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        let mut f = AtomicFile::create(&p).unwrap();
        f.write_all(b"{}").unwrap();
        drop(f);
        assert!(!p.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_committed_file_replaces_the_target() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        std::fs::write(&p, "old").unwrap();
        write_json(&p, &[1, 2]).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "[\n  1,\n  2\n]");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn the_file_has_no_name_until_committed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        std::fs::write(&p, "old").unwrap();
        let mut f = AtomicFile::create(&p).unwrap();
        f.write_all(b"new").unwrap();
        assert!(matches!(f.out, Sink::Unnamed(..)), "{f:?}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        f.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn without_o_tmpfile_a_named_file_is_used() {
        NO_TMPFILE.with(|n| n.set(true));
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.json");
        std::fs::write(&real, "old").unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let mut f = AtomicFile::create(&link).unwrap();
        f.write_all(b"new").unwrap();
        assert!(matches!(f.out, Sink::Temp(..)), "{f:?}");
        let names = |d: &Path| -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        let during = names(dir.path());
        assert_eq!(during.len(), 3, "{during:?}");
        assert!(during[0].starts_with(".outcore-partial-"), "{during:?}");
        f.commit().unwrap();
        assert_eq!(names(dir.path()), ["link.json", "real.json"]);
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "new");
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        let mut f = AtomicFile::create(&real).unwrap();
        f.write_all(b"lost").unwrap();
        drop(f);
        assert_eq!(names(dir.path()), ["link.json", "real.json"]);
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "new");
        NO_TMPFILE.with(|n| n.set(false));
    }

    #[test]
    fn outputs_may_not_be_inputs_or_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.npy");
        std::fs::write(&input, b"data").unwrap();
        let link = dir.path().join("link.npy");
        std::os::unix::fs::symlink(&input, &link).unwrap();
        let out = dir.path().join("out.npy");
        let same_out = dir.path().join(".").join("out.npy");
        let ins = [("--input", input.as_path())];
        // An output that is the input, by name or through a symlink.
        for p in [&input, &link] {
            let e = check_outputs(&[("--output", p)], &ins)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("--output") && e.contains("is the --input file"),
                "{e}"
            );
        }
        assert_eq!(std::fs::read(&input).unwrap(), b"data");
        // Two outputs naming one new file, or both standard output.
        let e = check_outputs(&[("--output", &out), ("--labels", &same_out)], &ins)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--output and --labels both write"), "{e}");
        let e = check_outputs(
            &[("--stats", Path::new("-")), ("--labels", Path::new("-"))],
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("both write standard output"), "{e}");
        // Distinct files, and a device shared by two outputs, are fine.
        let labels = dir.path().join("labels.npy");
        check_outputs(&[("--output", &out), ("--labels", &labels)], &ins).unwrap();
        let null = Path::new("/dev/null");
        check_outputs(&[("--output", null), ("--labels", null)], &ins).unwrap();
        assert!(!out.exists() && !labels.exists());
    }

    #[test]
    fn a_missing_directory_is_named_without_the_temporary_file() {
        let e = check_writable(Path::new("/nonexistent-dir/x.npy"))
            .unwrap_err()
            .to_string();
        assert!(
            !e.contains("outcore-partial") && !e.contains("at path"),
            "{e}"
        );
        assert!(
            e.starts_with("/nonexistent-dir/x.npy: cannot write: "),
            "{e}"
        );
    }

    #[test]
    fn check_writable_names_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let e = check_writable(dir.path()).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        let e = check_writable(Path::new("/nonexistent-dir/x.npy"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent-dir/x.npy"), "{e}");
        assert!(check_writable(&dir.path().join("ok.npy")).is_ok());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
