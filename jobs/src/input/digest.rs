//! A digest of a fixed sample of an input file: ranks that each read only
//! their own rows compare it to check that they were given the same file
//! (a stale copy on one node), at the cost of reading the sample.
//!
//! Every rank digests the same regions of its copy, chosen from the
//! file's size alone: the whole file up to [`BLOCKS`] blocks of
//! [`BLOCK`] bytes (4 MiB); a larger file's first and last blocks (its
//! header and first rows, its last rows) and [`BLOCKS`] - 2 more spread
//! evenly between them. The size is part of the digest. Two copies whose
//! bytes differ in a sampled block, or whose sizes differ, have different
//! digests; copies that differ only between the sampled blocks do not
//! (docs/mpi.md says why that is the trade).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::direct::checksum;
use crate::error::{Error, Result};

/// Bytes of each block sampled.
const BLOCK: u64 = 64 << 10;

/// Blocks sampled from a larger file (and the size up to which a file is
/// digested whole, in blocks).
const BLOCKS: u64 = 64;

/// The digest of the file at `path`: its size and the checksums of its
/// sampled blocks (see the module's documentation), read through the page
/// cache.
///
/// # Errors
///
/// [`Error::Io`] naming the file when it cannot be opened or read.
pub(crate) fn sample_digest(path: &Path) -> Result<u64> {
    let file = File::open(path).map_err(|e| Error::io(path, "cannot open", e))?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "cannot read its size", e))?
        .len();
    let mut buf = vec![0u8; BLOCK as usize];
    let mut sums = len.to_le_bytes().to_vec();
    for (at, n) in sample(len) {
        file.read_exact_at(&mut buf[..n], at)
            .map_err(|e| Error::io(path, "read failed", e))?;
        sums.extend(checksum(&buf[..n]).to_le_bytes());
    }
    Ok(checksum(&sums))
}

/// The regions `(offset, bytes)` sampled from a file of `len` bytes.
fn sample(len: u64) -> Vec<(u64, usize)> {
    if len <= BLOCK * BLOCKS {
        return (0..len.div_ceil(BLOCK))
            .map(|i| (i * BLOCK, (len - i * BLOCK).min(BLOCK) as usize))
            .collect();
    }
    let span = len - BLOCK;
    (0..BLOCKS)
        .map(|i| (span * i / (BLOCKS - 1), BLOCK as usize))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{sample, sample_digest, BLOCK, BLOCKS};

    #[test]
    fn small_files_are_read_whole_and_large_ones_from_end_to_end() {
        assert!(sample(0).is_empty());
        assert_eq!(sample(10), vec![(0, 10)]);
        let whole = sample(BLOCK * BLOCKS);
        assert_eq!(whole.len() as u64, BLOCKS);
        assert_eq!(
            whole.iter().map(|r| r.1 as u64).sum::<u64>(),
            BLOCK * BLOCKS
        );
        let len = (1 << 30) + 12_345;
        let s = sample(len);
        assert_eq!(s.len() as u64, BLOCKS);
        assert_eq!(s[0].0, 0, "the header");
        assert_eq!(s[s.len() - 1].0 + BLOCK, len, "the last rows");
        for w in s.windows(2) {
            assert!(w[0].0 + BLOCK <= w[1].0, "spread, not overlapping: {w:?}");
        }
    }

    #[test]
    fn a_byte_changed_in_a_sampled_block_changes_the_digest() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.bin");
        let len = BLOCK * BLOCKS * 3 + 7;
        let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(&p, &bytes).unwrap();
        let d = sample_digest(&p).unwrap();
        assert_eq!(
            sample_digest(&p).unwrap(),
            d,
            "the same bytes, the same digest"
        );
        // A byte inside the middle sampled block, then one between blocks.
        let (at, _) = sample(len)[BLOCKS as usize / 2];
        let mut changed = bytes.clone();
        changed[at as usize + 100] ^= 1;
        std::fs::write(&p, &changed).unwrap();
        assert_ne!(sample_digest(&p).unwrap(), d);
        let mut between = bytes.clone();
        between[(at + BLOCK + 10) as usize] ^= 1;
        std::fs::write(&p, &between).unwrap();
        assert_eq!(sample_digest(&p).unwrap(), d, "not sampled");
        // One byte more.
        let mut longer = bytes;
        longer.push(0);
        std::fs::write(&p, &longer).unwrap();
        assert_ne!(sample_digest(&p).unwrap(), d);
    }
}
