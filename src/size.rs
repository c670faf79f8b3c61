//! Byte sizes as people write them: `512MiB`, `2G`, `1.5GiB`, `300MB`,
//! `1TB`, `4096`, `2 MiB`, any case, spaces around.
//!
//! One parser for the runtime ([`crate::parse_size`], `MemoryCap::parse`)
//! and the `LD_PRELOAD` shim (`OUTCORE_MEM_CAP`), which includes this file
//! with `#[path]` (it has no link-time dependency on outcore). So it uses
//! `core` only, allocates nothing and never panics: the shim parses inside
//! the first `malloc`.

/// Why a size does not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SizeError {
    Empty,
    NoNumber,
    NotANumber,
    UnknownUnit,
    TooLarge,
    FractionalBytes,
}

impl SizeError {
    /// The reason, as the runtime's error message gives it.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            SizeError::Empty => "empty",
            SizeError::NoNumber => "expected a number, like 512MiB, 2GiB, 1.5G or 4096",
            SizeError::NotANumber => "not a number",
            SizeError::UnknownUnit => {
                "unknown unit (use B, K/KiB, M/MiB, G/GiB, T/TiB, KB, MB, GB, TB)"
            }
            SizeError::TooLarge => "too large",
            SizeError::FractionalBytes => "a byte count must be a whole number",
        }
    }
}

/// The units, any case, and their sizes in bytes.
const UNITS: [(&str, f64); 14] = [
    ("", 1.0),
    ("b", 1.0),
    ("k", 1024.0),
    ("kib", 1024.0),
    ("m", 1024.0 * 1024.0),
    ("mib", 1024.0 * 1024.0),
    ("g", 1024.0 * 1024.0 * 1024.0),
    ("gib", 1024.0 * 1024.0 * 1024.0),
    ("t", 1024.0 * 1024.0 * 1024.0 * 1024.0),
    ("tib", 1024.0 * 1024.0 * 1024.0 * 1024.0),
    ("kb", 1e3),
    ("mb", 1e6),
    ("gb", 1e9),
    ("tb", 1e12),
];

/// Parses a byte size (rounded to a whole byte).
pub(crate) fn parse(input: &str) -> Result<u64, SizeError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(SizeError::Empty);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(SizeError::NoNumber);
    }
    let value: f64 = num.parse().map_err(|_| SizeError::NotANumber)?;
    let unit = unit.trim();
    let Some(&(_, mult)) = UNITS.iter().find(|(u, _)| u.eq_ignore_ascii_case(unit)) else {
        return Err(SizeError::UnknownUnit);
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(SizeError::TooLarge);
    }
    if bytes.fract() != 0.0 && mult == 1.0 {
        return Err(SizeError::FractionalBytes);
    }
    Ok(bytes.round() as u64)
}
