//! Byte counts for people.

/// Formats bytes for people: `512.0 MiB`, `1.50 GiB`, `123 B`.
///
/// ```
/// assert_eq!(outcore::format_bytes(512 << 20), "512.0 MiB");
/// ```
pub fn format_bytes(b: u64) -> String {
    const K: f64 = 1024.0;
    let f = b as f64;
    if f < K {
        format!("{b} B")
    } else if f < K * K {
        format!("{:.1} KiB", f / K)
    } else if f < K * K * K {
        format!("{:.1} MiB", f / (K * K))
    } else {
        format!("{:.2} GiB", f / (K * K * K))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(format_bytes(100), "100 B");
        assert_eq!(format_bytes(512 << 20), "512.0 MiB");
        assert_eq!(format_bytes(3 << 29), "1.50 GiB");
    }
}
