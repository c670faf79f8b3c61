//! The CRC-32 check of an uncompressed `.npz` member read in blocks: the
//! check attached to a [`Region`] ([`Region::check_member`]), the chain
//! that combines the CRC-32s of the blocks' first reads in row order, and
//! the comparison with the archive's CRC-32 once the chain covers the
//! member.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{Mutex, OnceLock};

use super::Region;

/// The CRC-32 check of an uncompressed `.npz` member read in blocks: the
/// CRC-32 of each block's first read is kept, and combined in row order
/// from row 0 on as the blocks arrive (reads of other block sizes, such
/// as a pass in smaller tasks, are kept aside); when the chain reaches
/// the last row, it is completed with the bytes after the data and
/// compared with the archive's. Later reads are checked against each
/// block's first-read checksum.
#[derive(Debug)]
pub(super) struct MemberCheck {
    crc: crate::npy::MemberCrc,
    rows: u64,
    /// CRC-32 of the member's bytes after the data (normally none).
    tail: flate2::Crc,
    chain: Mutex<Chain>,
    /// The error, once the check failed: every later read fails with it
    /// (a failed build may be tried again, and its block's first read is
    /// done).
    failed: OnceLock<String>,
}

/// The blocks combined so far, and those waiting for the chain to reach
/// them.
#[derive(Debug)]
struct Chain {
    /// CRC-32 of the member's bytes up to row `next` (its `.npy` header
    /// first).
    crc: flate2::Crc,
    next: u64,
    /// Blocks past `next` by first row: rows and CRC-32 (the longer of
    /// two with the same first row).
    waiting: BTreeMap<u64, (u64, flate2::Crc)>,
}

impl MemberCheck {
    /// Records the CRC-32 of rows `first..first + n`; when the chain
    /// covers the member, compares its CRC-32 with the archive's.
    pub(super) fn record(&self, first: u64, n: u64, crc: flate2::Crc) -> io::Result<()> {
        self.check()?;
        let mut c = match self.chain.lock() {
            Ok(c) => c,
            Err(e) => e.into_inner(),
        };
        if first < c.next || c.next >= self.rows {
            return Ok(());
        }
        if c.waiting.get(&first).is_none_or(|(m, _)| *m < n) {
            c.waiting.insert(first, (n, crc));
        }
        let chain = &mut *c;
        while let Some((n, block)) = chain.waiting.remove(&chain.next) {
            chain.crc.combine(&block);
            chain.next += n;
        }
        // Blocks the chain went past are of no use.
        let next = chain.next;
        chain.waiting.retain(|&f, _| f > next);
        if chain.next < self.rows {
            return Ok(());
        }
        chain.crc.combine(&self.tail);
        if chain.crc.sum() != self.crc.expected {
            let e = crate::npy::crc_mismatch(self.crc.expected, chain.crc.sum());
            let _ = self
                .failed
                .set(format!("{}: {e}", self.crc.label.display()));
            return self.check();
        }
        Ok(())
    }

    /// The error of a failed check, if it failed.
    pub(super) fn check(&self) -> io::Result<()> {
        match self.failed.get() {
            Some(msg) => Err(io::Error::new(io::ErrorKind::InvalidData, msg.clone())),
            None => Ok(()),
        }
    }
}

impl Region {
    /// Checks the blocks read against the CRC-32 of `member`, the
    /// uncompressed `.npz` member whose `rows` rows this region reads
    /// (when every row is read; a share of them is not checked).
    pub(crate) fn check_member(
        mut self,
        member: &crate::npy::MemberCrc,
        rows: u64,
    ) -> io::Result<Region> {
        let data_end = self.offset + rows * self.record() as u64;
        let end = member.start + member.len;
        let crc_of = |from: u64, to: u64| -> io::Result<flate2::Crc> {
            let mut crc = flate2::Crc::new();
            let mut buf = vec![0u8; (to.saturating_sub(from)).min(1 << 20) as usize];
            let mut at = from;
            while at < to {
                let n = (to - at).min(buf.len() as u64) as usize;
                self.plain.read_exact_at(&mut buf[..n], at)?;
                crc.update(&buf[..n]);
                at += n as u64;
            }
            Ok(crc)
        };
        let head = crc_of(member.start, self.offset)?;
        let tail = crc_of(data_end, end)?;
        self.member = Some(MemberCheck {
            crc: member.clone(),
            rows,
            tail,
            chain: Mutex::new(Chain {
                crc: head,
                next: 0,
                waiting: BTreeMap::new(),
            }),
            failed: OnceLock::new(),
        });
        Ok(self)
    }
}
