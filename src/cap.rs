//! [`MemoryCap`]: parsing sizes and detecting the limit the process runs
//! under.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::units::format_bytes;

/// How much memory the runtime may use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MemoryCap {
    /// No soft cap: only a hard limit (`ulimit -v`) triggers evictions.
    #[default]
    None,
    /// A cap in bytes.
    Bytes(u64),
    /// The smallest of the cgroup memory limit (v1 or v2), `RLIMIT_AS` and
    /// physical memory, less headroom for the runtime itself; see
    /// [`MemoryCap::resolve`].
    Auto,
}

impl MemoryCap {
    /// Parses `512MiB`, `2GiB`, `1.5G`, `100M`, `4096` (bytes), `auto` or
    /// `none`.
    ///
    /// Suffixes `K`, `M`, `G`, `T` (with or without `iB`) are powers of
    /// 1024; `KB`, `MB`, `GB`, `TB` are powers of 1000. Case does not matter.
    ///
    /// ```
    /// use outcore::MemoryCap;
    /// assert_eq!(MemoryCap::parse("512MiB").unwrap(), MemoryCap::Bytes(512 << 20));
    /// assert_eq!(MemoryCap::parse("1.5G").unwrap(), MemoryCap::Bytes(3 << 29));
    /// assert_eq!(MemoryCap::parse("none").unwrap(), MemoryCap::None);
    /// assert!(MemoryCap::parse("12XB").is_err());
    /// ```
    pub fn parse(s: &str) -> Result<MemoryCap> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(MemoryCap::Auto),
            "none" | "off" | "unlimited" => Ok(MemoryCap::None),
            _ => {
                let b = parse_size(s)?;
                if b == 0 {
                    return Err(Error::BadSize {
                        input: s.to_string(),
                        reason: "a cap must be more than 0 bytes (use 'none' for no cap)".into(),
                    });
                }
                Ok(MemoryCap::Bytes(b))
            }
        }
    }

    /// The cap in bytes, detecting the limits for [`MemoryCap::Auto`].
    pub fn resolve(&self) -> Option<u64> {
        match self {
            MemoryCap::None => None,
            MemoryCap::Bytes(b) => Some(*b),
            MemoryCap::Auto => Some(auto_cap(&detect_limits())),
        }
    }

    /// The cap in bytes for one of `ranks` processes sharing the node
    /// (MPI ranks on one host, for example): for [`MemoryCap::Auto`], the
    /// node's memory limits (cgroup, physical memory) are divided among
    /// them, each share less its own headroom, while `RLIMIT_AS`, which
    /// every process has whole, is not. A size or `None` is per process,
    /// as given. `ranks` of 0 counts as 1.
    ///
    /// ```
    /// use outcore::MemoryCap;
    /// let one = MemoryCap::Auto.resolve_shared(1).unwrap();
    /// let four = MemoryCap::Auto.resolve_shared(4).unwrap();
    /// assert!(four <= one);
    /// assert_eq!(MemoryCap::Bytes(1 << 30).resolve_shared(4), Some(1 << 30));
    /// ```
    pub fn resolve_shared(&self, ranks: usize) -> Option<u64> {
        match self {
            MemoryCap::Auto => Some(auto_cap_shared(&detect_limits(), ranks)),
            other => other.resolve(),
        }
    }
}

impl FromStr for MemoryCap {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        MemoryCap::parse(s)
    }
}

impl fmt::Display for MemoryCap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryCap::None => f.write_str("none"),
            MemoryCap::Auto => f.write_str("auto"),
            MemoryCap::Bytes(b) => f.write_str(&format_bytes(*b)),
        }
    }
}

/// Parses a byte size such as `2GiB`, `1.5G`, `300MB` or `4096`.
///
/// ```
/// assert_eq!(outcore::parse_size("2GiB").unwrap(), 2 << 30);
/// assert_eq!(outcore::parse_size("300MB").unwrap(), 300_000_000);
/// assert!(outcore::parse_size("-5M").is_err());
/// ```
pub fn parse_size(input: &str) -> Result<u64> {
    crate::size::parse(input).map_err(|e| Error::BadSize {
        input: input.to_string(),
        reason: e.reason().to_string(),
    })
}

/// The limits the process runs under, as far as they can be read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Limits {
    /// cgroup v2 `memory.max` or v1 `memory.limit_in_bytes`, if limited.
    pub(crate) cgroup: Option<u64>,
    /// `RLIMIT_AS` or `RLIMIT_DATA`, the smaller if both are finite
    /// ([`process_limit`]).
    pub(crate) rlimit_as: Option<u64>,
    /// Physical memory (`MemTotal`).
    pub(crate) physical: Option<u64>,
}

/// Reads the cgroup, rlimit and physical memory limits.
pub(crate) fn detect_limits() -> Limits {
    Limits {
        cgroup: cgroup_limit(),
        rlimit_as: process_limit(),
        physical: physical_memory(),
    }
}

/// The cap `auto` chooses for the given limits: memory limits less 5% (at
/// least 64 MiB) for the runtime's code, its threads, allocator slack and
/// the page cache a memory cgroup also charges;
/// `RLIMIT_AS` less 25% (at least 256 MiB), since address space also holds
/// code, stacks and mappings jemalloc keeps. At least 16 MiB.
pub(crate) fn auto_cap(l: &Limits) -> u64 {
    auto_cap_shared(l, 1)
}

/// [`auto_cap`] for one of `ranks` processes on the node: the memory
/// limit divided among them, each share less 5% (at least 64 MiB);
/// `RLIMIT_AS` (per process) as in [`auto_cap`].
pub(crate) fn auto_cap_shared(l: &Limits, ranks: usize) -> u64 {
    let ranks = ranks.max(1) as u64;
    let mem = [l.cgroup, l.physical]
        .into_iter()
        .flatten()
        .min()
        .map(|m| m / ranks)
        .map(|m| m.saturating_sub((m / 20).max(64 << 20)));
    let vm = l
        .rlimit_as
        .map(|v| v.saturating_sub((v / 4).max(256 << 20)));
    [mem, vm]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(u64::MAX)
        .max(16 << 20)
}

/// The level proactive eviction brings usage down to: the cap less 1/32
/// (at least 4 MiB, at most half the cap). The headroom is for the buffers
/// of loads and for what tasks allocate, so that the trap stays the last
/// resort.
pub(crate) fn low_watermark(cap: u64) -> u64 {
    cap.saturating_sub((cap / 32).max(4 << 20).min(cap / 2))
}

/// The most memory the process could ever get, and the machine's memory:
/// `(limit, machine)`, where `machine` is physical memory plus swap (as far
/// as they can be read) and `limit` is `RLIMIT_AS` if finite, else
/// `machine`. A request larger than `limit` cannot be met by evicting
/// anything.
pub(crate) fn hard_limits() -> (usize, usize) {
    let to_usize = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    };
    let machine = match (field("MemTotal:"), field("SwapTotal:")) {
        (Some(m), s) => to_usize(m.saturating_add(s.unwrap_or(0))),
        (None, _) => usize::MAX,
    };
    let limit = process_limit().map_or(machine, |v| to_usize(v).min(machine));
    (limit, machine)
}

/// The limit on what the process maps: `RLIMIT_AS` (`ulimit -v`, all
/// its address space) or `RLIMIT_DATA` (`ulimit -d`, its private writable
/// mappings: the heap, jemalloc's, thread stacks), the smaller when both
/// are finite. Either makes an allocation fail at the limit, which the
/// trap handles alike.
pub(crate) fn process_limit() -> Option<u64> {
    let data = rlimit(libc::RLIMIT_DATA);
    match (rlimit_as(), data) {
        (Some(a), Some(d)) => Some(a.min(d)),
        (a, d) => a.or(d),
    }
}

/// `RLIMIT_AS`, if finite: what the load claims and the headroom, which
/// are address space and no data, count against.
pub(crate) fn rlimit_as() -> Option<u64> {
    rlimit(libc::RLIMIT_AS)
}

/// A resource limit's soft value, if finite (one `getrlimit`: no
/// allocation, safe before `main`).
fn rlimit(resource: libc::__rlimit_resource_t) -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit struct.
    let ok = unsafe { libc::getrlimit(resource, &mut lim) } == 0;
    (ok && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// The process's resident set in bytes (`/proc/self/statm`), as `top`
/// and the OOM killer see it; `None` where it cannot be read. It counts
/// what [`current_usage`](crate::current_usage) does not: memory other
/// allocators hand out (a Python script's arrays), code and stacks, and
/// freed pages the allocator keeps.
pub fn resident_set() -> Option<u64> {
    use std::io::Read;
    let mut buf = [0u8; 128];
    let n = std::fs::File::open("/proc/self/statm")
        .and_then(|mut f| f.read(&mut buf))
        .ok()?;
    let pages: u64 = std::str::from_utf8(&buf[..n])
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096))
}

fn physical_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text)
}

fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn cgroup_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut best: Option<u64> = None;
    let mut take = |v: Option<u64>| {
        if let Some(v) = v {
            best = Some(best.map_or(v, |b| b.min(v)));
        }
    };
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ => continue,
        };
        if controllers.is_empty() {
            take(read_limit(&format!("/sys/fs/cgroup{path}/memory.max")));
            take(read_limit("/sys/fs/cgroup/memory.max"));
        } else if controllers.split(',').any(|c| c == "memory") {
            take(read_limit(&format!(
                "/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"
            )));
            take(read_limit("/sys/fs/cgroup/memory/memory.limit_in_bytes"));
        }
    }
    best
}

/// Reads a cgroup limit file: `max` or a huge number means unlimited.
fn read_limit(path: &str) -> Option<u64> {
    parse_cgroup_value(&std::fs::read_to_string(path).ok()?)
}

fn parse_cgroup_value(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    let v: u64 = t.parse().ok()?;
    // cgroup v1 reports "unlimited" as a page-rounded i64::MAX.
    (v < (1u64 << 60)).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_divides_the_node_memory_among_ranks_but_not_rlimit_as() {
        const G: u64 = 1 << 30;
        const M: u64 = 1 << 20;
        let phys = Limits {
            cgroup: None,
            rlimit_as: None,
            physical: Some(16 * G),
        };
        assert_eq!(auto_cap_shared(&phys, 1), auto_cap(&phys));
        assert_eq!(auto_cap_shared(&phys, 0), auto_cap(&phys));
        // 4 ranks: 4 GiB each, less 5% of that.
        assert_eq!(auto_cap_shared(&phys, 4), 4 * G - (4 * G) / 20);
        // The smaller of cgroup and physical memory is the node's limit.
        let cg = Limits {
            cgroup: Some(8 * G),
            rlimit_as: None,
            physical: Some(64 * G),
        };
        assert_eq!(auto_cap_shared(&cg, 4), 2 * G - (2 * G) / 20);
        // Small shares keep 64 MiB of headroom each.
        assert_eq!(auto_cap_shared(&cg, 32), 256 * M - 64 * M);
        // RLIMIT_AS binds each process whole: not divided.
        let vm = Limits {
            cgroup: None,
            rlimit_as: Some(2 * G),
            physical: Some(64 * G),
        };
        assert_eq!(auto_cap_shared(&vm, 2), 2 * G - 512 * M);
        let vm8 = Limits {
            rlimit_as: Some(8 * G),
            ..vm
        };
        // 16 ranks: the memory share (4 GiB less 5%) binds, not 8 GiB / 16.
        assert_eq!(auto_cap_shared(&vm8, 16), 4 * G - (4 * G) / 20);
        // Never below 16 MiB, however many ranks.
        assert_eq!(auto_cap_shared(&cg, 10_000), 16 * M);
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("512mib").unwrap(), 512 << 20);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 1536 << 20);
        assert_eq!(parse_size("10K").unwrap(), 10240);
        assert_eq!(parse_size("1GB").unwrap(), 1_000_000_000);
        assert_eq!(parse_size(" 7 M ").unwrap(), 7 << 20);
        for bad in ["", "12XB", "-5M", "M", "1.2.3G", "1.5", "abc", "1e99T"] {
            assert!(parse_size(bad).is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn caps_parse() {
        assert_eq!(MemoryCap::parse("auto").unwrap(), MemoryCap::Auto);
        assert_eq!(MemoryCap::parse("NONE").unwrap(), MemoryCap::None);
        assert_eq!(MemoryCap::parse("1GiB").unwrap(), MemoryCap::Bytes(1 << 30));
        assert!(MemoryCap::parse("0").is_err());
        let e = MemoryCap::parse("12XB").unwrap_err().to_string();
        assert!(e.contains("12XB"), "{e}");
    }

    #[test]
    fn auto_takes_the_smallest_limit_less_headroom() {
        let l = Limits {
            cgroup: Some(4 << 30),
            rlimit_as: None,
            physical: Some(24 << 30),
        };
        assert_eq!(auto_cap(&l), (4u64 << 30) - (4u64 << 30) / 20);
        let l = Limits {
            cgroup: None,
            rlimit_as: Some(2 << 30),
            physical: Some(24 << 30),
        };
        assert_eq!(auto_cap(&l), (2u64 << 30) - (512 << 20));
        let l = Limits {
            cgroup: None,
            rlimit_as: None,
            physical: Some(512 << 20),
        };
        assert_eq!(auto_cap(&l), (512 << 20) - (64 << 20));
        assert_eq!(auto_cap(&Limits::default()), u64::MAX);
    }

    #[test]
    fn cgroup_values() {
        assert_eq!(parse_cgroup_value("max\n"), None);
        assert_eq!(parse_cgroup_value("9223372036854771712\n"), None);
        assert_eq!(parse_cgroup_value("1073741824\n"), Some(1 << 30));
        assert_eq!(
            parse_meminfo("MemTotal:  1024 kB\nMemFree: 1 kB\n"),
            Some(1 << 20)
        );
    }
}
