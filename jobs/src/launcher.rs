//! What an MPI launcher tells a process before `MPI_Init`, for the checks
//! made before MPI starts (the address-space limit): the processes cannot
//! talk to each other yet, so each decides from what it can see whether
//! its line would only repeat rank 0's.

use std::path::Path;

/// The number of ranks, as the launcher says before `MPI_Init`.
pub(crate) fn size() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .and_then(|n| n.parse().ok())
}

/// Whether this process's limit in the `/proc/<pid>/limits` row `row`
/// (its soft value: `Max address space` for `ulimit -v`) is its
/// launcher's, and so every rank's, rank 0's included: `ulimit -v`
/// set before `mpirun`, or by the batch system for the job. The launcher
/// is the nearest ancestor that is not part of this rank (whose
/// environment has no MPI rank: `mpirun`, `orted`, a step daemon); a
/// wrapper script between them (`sh -c 'ulimit -v ...; exec outcore'`)
/// is part of the rank, and a limit it set is this rank's own. `false`
/// when it cannot be told (`/proc` unreadable): then the rank speaks.
pub(crate) fn limit_inherited(row: &str) -> bool {
    let Some(mine) = soft_limit(Path::new("/proc/self"), row) else {
        return false;
    };
    let mut pid = parent(Path::new("/proc/self"));
    // A few wrappers at most; a loop in /proc cannot happen, but bounded.
    for _ in 0..32 {
        let Some(p) = pid else { return false };
        let dir = Path::new("/proc").join(p.to_string());
        if !has_rank(&dir) {
            return soft_limit(&dir, row) == Some(mine);
        }
        pid = parent(&dir);
    }
    false
}

/// The soft limit in the row `row` of the process at `dir`
/// (`/proc/<pid>`), as written in its `limits` (`unlimited` or bytes).
fn soft_limit(dir: &Path, row: &str) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("limits")).ok()?;
    let line = text.lines().find_map(|l| l.strip_prefix(row))?;
    line.split_whitespace().next().map(str::to_string)
}

/// The parent process of the process at `dir`.
fn parent(dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(dir.join("status")).ok()?;
    let ppid = text.lines().find_map(|l| l.strip_prefix("PPid:"))?;
    ppid.trim().parse().ok().filter(|&p| p > 0)
}

/// Whether the process at `dir` runs as an MPI rank (its environment has
/// the rank its launcher gave it); `false` when it cannot be read.
fn has_rank(dir: &Path) -> bool {
    let Ok(env) = std::fs::read(dir.join("environ")) else {
        return false;
    };
    env.split(|&b| b == 0).any(|v| {
        ["OMPI_COMM_WORLD_RANK=", "PMI_RANK=", "PMIX_RANK="]
            .iter()
            .any(|k| v.starts_with(k.as_bytes()))
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_reads_its_own_limit_and_parent() {
        let me = std::path::Path::new("/proc/self");
        assert!(super::soft_limit(me, "Max address space").is_some());
        assert!(super::soft_limit(me, "Max data size").is_some());
        assert!(super::parent(me).is_some());
    }
}
