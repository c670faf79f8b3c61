//! What keeps the example within its cap: the sizes checked against the cap
//! (or the machine's memory) and the spill directory's free space before
//! anything is built. (When spill writes fail and memory grows past the
//! cap, the runtime itself stops the run: `Error::CapLost`.)

use outcore::{format_bytes, MemoryCap, Runtime};

use crate::job::Graph;

/// Bytes per node held in executors: rank, contribution and out-degree in
/// its node block, and its sum.
const NODE_BYTES: u64 = 8 + 8 + 4 + 8;

/// The run's memory, by what holds it.
struct Sizes {
    /// Every executor: edge, node and sum blocks.
    executors: u64,
    /// Outside the executors, at its largest: the out-degrees being
    /// counted while the edge blocks are made (with the block being made),
    /// or the final ranks.
    outside: u64,
    /// One task's executors: an edge block, a node block, a block of sums.
    task: u64,
    /// `--verify`'s computation on plain vectors: every edge as a pair of
    /// indices, the out-degrees, ranks and sums.
    plain: u64,
}

fn sizes(g: &Graph) -> Sizes {
    let b = g.blocks as u64;
    let edge_block = (g.edges * 8).div_ceil(b * b);
    let node_block = g.nodes.div_ceil(b) * NODE_BYTES;
    Sizes {
        executors: g.edges * 8 + g.nodes * NODE_BYTES,
        outside: (g.nodes * 4 + edge_block).max(g.nodes * 8),
        task: edge_block + node_block,
        plain: g.edges * 16 + g.nodes * 20,
    }
}

/// Refuses, in one line, a run that cannot keep its cap (or, without one,
/// fit in memory), or whose spill files cannot fit in the spill directory.
/// The memory outside the executors and one task's executors must fit in
/// three quarters of the cap (the rest is the runtime's and the
/// allocator's).
pub fn check(rt: &Runtime, g: &Graph, verify: bool) -> Result<(), String> {
    let s = sizes(g);
    let outside = if verify {
        s.outside + s.plain
    } else {
        s.outside
    };
    let Some(cap) = rt.cap() else {
        let need = s.executors + outside;
        return match MemoryCap::Auto.resolve() {
            Some(mem) if need > mem => Err(format!(
                "without a cap this run needs {} in memory, more than the {} there is \
                 (leave --mem-cap at auto, or give one)",
                format_bytes(need),
                format_bytes(mem)
            )),
            _ => Ok(()),
        };
    };
    let need = outside + s.task;
    if need > cap / 4 * 3 {
        return Err(format!(
            "a cap of {} is too small: {} of ranks and out-degrees{} outside the executors \
             and {} for one task's executors must fit in three quarters of it \
             (give fewer --nodes, more --blocks or a larger --mem-cap)",
            format_bytes(cap),
            format_bytes(s.outside),
            if verify {
                " and --verify's plain vectors"
            } else {
                ""
            },
            format_bytes(s.task)
        ));
    }
    let spilled = s.executors.saturating_sub(cap / 2);
    match free_space(rt.spill_dir()) {
        Some(free) if free < spilled => Err(format!(
            "the spill directory {} has {} free, and up to {} of executors may be \
             spilled under a cap of {} (free space or choose another with --spill-dir)",
            rt.spill_dir().display(),
            format_bytes(free),
            format_bytes(spilled),
            format_bytes(cap)
        )),
        _ => Ok(()),
    }
}

/// The cap when none is given: `auto` (the machine's or the container's
/// limit, less some headroom), or less when other processes use memory:
/// the memory available now (`MemAvailable`).
pub fn default_cap() -> MemoryCap {
    let auto = MemoryCap::Auto.resolve();
    let available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib << 10)
    });
    match (auto, available) {
        (Some(a), Some(v)) => MemoryCap::Bytes(a.min(v)),
        (Some(a), None) => MemoryCap::Bytes(a),
        _ => MemoryCap::Auto,
    }
}

/// Free bytes for an unprivileged user on the filesystem of `dir`.
fn free_space(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `st` is plain data, written by `statvfs` before it is read.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path; `statvfs` writes only `st`.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}
