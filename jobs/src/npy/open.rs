//! Opening an array for reading: a `.npy` file, or a member of a `.npz`
//! archive (its CRC checked as it is read), and the length check of its
//! data against its header.

use super::*;

/// A reader of an array's data, from its first byte on.
pub(super) struct Stream(pub(super) Box<dyn Read + Send>);

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stream")
    }
}

/// An array opened for reading: a `.npy` file or a member of a `.npz`
/// archive.
#[derive(Debug)]
pub(super) struct Array {
    /// The file (the archive, for a member).
    pub(super) file: PathBuf,
    /// The array in messages: the file, or `archive.npz[name]`.
    pub(super) label: PathBuf,
    /// The data, from its first byte.
    pub(super) stream: Stream,
    pub(super) header: Header,
    /// Bytes the array's `.npy` image holds (header and data).
    pub(super) total: u64,
    /// Where the data starts in the file, when it is stored as is (a
    /// `.npy` file, an uncompressed `.npz` member): it can then be read at
    /// any position.
    pub(super) at: Option<u64>,
    /// For an uncompressed `.npz` member, its CRC-32 and where it lies, to
    /// check the blocks read by position against.
    pub(super) member: Option<MemberCrc>,
}

/// A stored (uncompressed) `.npz` member's CRC-32 as its archive records
/// it, and where the member's bytes (its `.npy` image) lie in the file.
/// Read in order, a member is checked as its last byte is read
/// ([`CrcRead`]); read by position in blocks, when the blocks have covered
/// all of it (`input::region`).
#[derive(Clone, Debug)]
pub(crate) struct MemberCrc {
    /// The member in messages (`archive.npz[name]`).
    pub(crate) label: PathBuf,
    /// The CRC-32 recorded in the archive.
    pub(crate) expected: u32,
    /// Offset of the member's first byte in the file.
    pub(crate) start: u64,
    /// The member's length in bytes.
    pub(crate) len: u64,
}

/// The error of a member whose bytes do not give the CRC-32 its archive
/// records (the message does not name it; the caller does).
pub(crate) fn crc_mismatch(expected: u32, got: u32) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!(
            "bad CRC-32 (the archive records {expected:08x}, the member's bytes give {got:08x}): the archive is corrupt"
        ),
    )
}

/// A `.npz` member's bytes read in order, checked against the CRC-32 its
/// archive records when the last of its `left` bytes is read: a mismatch
/// fails that read.
pub(super) struct CrcRead {
    pub(super) inner: Box<dyn Read + Send>,
    pub(super) crc: flate2::Crc,
    pub(super) left: u64,
    pub(super) expected: u32,
}

impl Read for CrcRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let want = self.left.min(buf.len() as u64) as usize;
        if want == 0 {
            return Ok(0);
        }
        let n = self.inner.read(&mut buf[..want])?;
        self.crc.update(&buf[..n]);
        self.left -= n as u64;
        if self.left == 0 && self.crc.sum() != self.expected {
            return Err(crc_mismatch(self.expected, self.crc.sum()));
        }
        Ok(n)
    }
}

/// Whether `path` names a `.npz` archive (by its name, or by its first
/// bytes under another name).
pub(super) fn is_npz(path: &Path) -> bool {
    crate::files::format_of(path) == "npz"
}

/// Opens the array at `path`: a `.npy` file, or the member `key` of a
/// `.npz` archive (`key` or `key.npy`; by default its only or first
/// array).
pub(super) fn open_array(path: &Path, key: Option<&str>) -> Result<Array> {
    if is_npz(path) {
        return open_member(path, key);
    }
    let (file, total) = open_input(path)?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let header = read_header(path, &mut reader)?;
    Ok(Array {
        file: path.to_path_buf(),
        label: path.to_path_buf(),
        at: Some(header.data_offset),
        stream: Stream(Box::new(reader)),
        header,
        total,
        member: None,
    })
}

/// The index of the member named `key` (with or without `.npy`) among
/// an archive's `names`; the first without a key.
pub(super) fn member_index(path: &Path, names: &[String], key: Option<&str>) -> Result<usize> {
    match key {
        None if names.is_empty() => Err(bad(path, "the archive holds no array")),
        None => Ok(0),
        Some(k) => names
            .iter()
            .position(|n| n == k || n.strip_suffix(".npy") == Some(k))
            .ok_or_else(|| {
                let all: Vec<&str> = names
                    .iter()
                    .map(|n| n.strip_suffix(".npy").unwrap_or(n))
                    .collect();
                bad(
                    path,
                    format!("no array named '{k}' (it holds: {})", all.join(", ")),
                )
            }),
    }
}

pub(super) fn open_member(path: &Path, key: Option<&str>) -> Result<Array> {
    let (file, _) = open_input(path)?;
    let mut zip = zip::ZipArchive::new(BufReader::new(file))
        .map_err(|e| bad(path, format!("not a readable .npz archive ({e})")))?;
    let mut names = Vec::with_capacity(zip.len());
    for i in 0..zip.len() {
        let m = zip
            .by_index_raw(i)
            .map_err(|e| bad(path, format!("unreadable archive member {i} ({e})")))?;
        names.push(m.name().map(|n| n.into_owned()).unwrap_or_default());
    }
    let index = member_index(path, &names, key)?;
    let shown = names[index].strip_suffix(".npy").unwrap_or(&names[index]);
    let label = PathBuf::from(format!("{}[{shown}]", path.display()));
    let m = zip
        .by_index_raw(index)
        .map_err(|e| bad(&label, format!("unreadable archive member ({e})")))?;
    let start = m
        .data_start()
        .ok_or_else(|| bad(&label, "unreadable archive member"))?;
    let (method, packed, total, crc) = (m.compression(), m.compressed_size(), m.size(), m.crc32());
    drop(m);
    let (mut file, _) = open_input(path)?;
    file.seek(SeekFrom::Start(start))
        .map_err(|e| Error::io(path, "cannot seek", e))?;
    let body = BufReader::with_capacity(1 << 20, file).take(packed);
    let (stream, stored): (Box<dyn Read + Send>, bool) = match method {
        zip::CompressionMethod::Stored => (Box::new(body), true),
        zip::CompressionMethod::Deflated => {
            (Box::new(flate2::read::DeflateDecoder::new(body)), false)
        }
        other => {
            return Err(bad(
                &label,
                format!("compressed with {other:?}; outcore reads stored or deflated members (np.savez, np.savez_compressed)"),
            ))
        }
    };
    // The member's bytes, checked against its CRC-32 as they are read.
    let mut stream: Box<dyn Read + Send> = Box::new(CrcRead {
        inner: stream,
        crc: flate2::Crc::new(),
        left: total,
        expected: crc,
    });
    let header = read_header(&label, &mut stream)?;
    Ok(Array {
        file: path.to_path_buf(),
        at: stored.then_some(start + header.data_offset),
        member: stored.then(|| MemberCrc {
            label: label.clone(),
            expected: crc,
            start,
            len: total,
        }),
        label,
        stream: Stream(stream),
        header,
        total,
    })
}

/// Checks that an array of `total` bytes holds the `elems` elements its
/// header promises (`None`: a count that overflowed).
pub(super) fn check_length(path: &Path, total: u64, h: &Header, elems: Option<u64>) -> Result<()> {
    let need = elems
        .and_then(|n| n.checked_mul(h.stored.size() as u64))
        .and_then(|n| n.checked_add(h.data_offset))
        .ok_or_else(|| bad(path, "shape too large"))?;
    if total < need {
        return Err(bad(
            path,
            format!("truncated: {total} bytes, the header promises {need}"),
        ));
    }
    Ok(())
}
