//! Writing `.npy` files: the header, whole arrays ([`write_array`]) and
//! arrays written a block at a time ([`NpyWriter`]), atomically.

use super::*;

/// Elements that can be written to `.npy`.
pub trait Element: Copy {
    /// The dtype written.
    const DTYPE: Dtype;
    /// Little-endian bytes.
    fn put(self, out: &mut Vec<u8>);
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

impl Element for f64 {
    const DTYPE: Dtype = Dtype::F64;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

impl Element for i32 {
    const DTYPE: Dtype = Dtype::I32;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

impl Element for i64 {
    const DTYPE: Dtype = Dtype::I64;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

/// The 10-byte preamble plus header text for `shape`, padded to a multiple
/// of 64 bytes as numpy does.
pub(super) fn header_bytes(dtype: Dtype, shape: &[u64]) -> Vec<u8> {
    let shape_s = match shape {
        [n] => format!("({n},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut text = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape_s}, }}",
        dtype.descr()
    );
    let total = 10 + text.len() + 1;
    text.push_str(&" ".repeat(total.next_multiple_of(64) - total));
    text.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(text.len() as u16).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    out
}

/// Writes a `.npy` array piece by piece, for outputs too large to hold
/// (such as one label per row of a large input). The file is written
/// atomically: until [`NpyWriter::finish`] it is a temporary file next to
/// the target, removed if the writer is dropped, so a failed or
/// interrupted write never leaves a file that looks valid.
#[derive(Debug)]
pub struct NpyWriter<T: Element> {
    pub(super) out: AtomicFile,
    pub(super) expect: u64,
    pub(super) written: u64,
    pub(super) scratch: Vec<u8>,
    pub(super) _t: std::marker::PhantomData<T>,
}

impl<T: Element> NpyWriter<T> {
    /// Starts writing an array of `shape` to `path`.
    pub fn create(path: &Path, shape: &[u64]) -> Result<NpyWriter<T>> {
        let mut out = AtomicFile::create(path)?;
        out.write_all(&header_bytes(T::DTYPE, shape))?;
        Ok(NpyWriter {
            out,
            expect: shape.iter().product(),
            written: 0,
            scratch: Vec::new(),
            _t: std::marker::PhantomData,
        })
    }

    /// Appends elements.
    pub fn write(&mut self, items: &[T]) -> Result<()> {
        self.scratch.clear();
        for &x in items {
            x.put(&mut self.scratch);
        }
        self.out.write_all(&self.scratch)?;
        self.written += items.len() as u64;
        Ok(())
    }

    /// Checks every element was written and moves the file into place.
    pub fn finish(self) -> Result<()> {
        if self.written != self.expect {
            return Err(Error::Output {
                path: self.out.path().to_path_buf(),
                reason: format!(
                    "cannot write: wrote {} elements, expected {}",
                    self.written, self.expect
                ),
            });
        }
        self.out.commit()
    }
}

/// Writes a whole array.
pub fn write_array<T: Element>(path: &Path, shape: &[u64], data: &[T]) -> Result<()> {
    let mut w = NpyWriter::<T>::create(path, shape)?;
    w.write(data)?;
    w.finish()
}
