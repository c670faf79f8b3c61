//! A fitted model applied to new rows (`predict`, `transform`, `score`,
//! `decision_function`, `predict_proba`): one pass of
//! [`outcore_jobs::apply`] over a file (read in blocks, never mapped) or
//! over a numpy array in memory (read where it is: no temporary file, no
//! runtime to start), on the estimator's workers, with the GIL released.
//! The results are written into arrays the caller made for them.
//!
//! Arrays are taken through numpy's `__array_interface__`: C-contiguous,
//! aligned, of `float32` or `float64` (`int32` labels).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use outcore_jobs::apply::{self, FileRows, Plan, Real, Rows, Task};
use outcore_jobs::{BlockReader, Source};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::run::Settings;

/// An array's memory, as numpy describes it.
struct Array {
    addr: usize,
    shape: Vec<usize>,
    /// `"<f4"`, `"<f8"`, `"<i4"`.
    typestr: String,
    readonly: bool,
}

impl Array {
    /// `obj`'s memory: it must be C-contiguous and aligned.
    fn of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Array> {
        let ai = obj.getattr("__array_interface__")?;
        let ai = ai.cast::<PyDict>()?;
        let item = |k: &str| {
            ai.get_item(k)?.ok_or_else(|| {
                PyTypeError::new_err(format!("{what}: no '{k}' in its array interface"))
            })
        };
        let (addr, readonly): (usize, bool) = item("data")?.extract()?;
        let shape: Vec<usize> = item("shape")?.extract()?;
        let typestr: String = item("typestr")?.extract()?;
        let contiguous = ai.get_item("strides")?.is_none_or(|s| s.is_none());
        let elem = match typestr.as_str() {
            "<f4" | "<i4" => 4,
            "<f8" => 8,
            t => {
                return Err(PyTypeError::new_err(format!(
                    "{what}: dtype {t} (float32 or float64 is needed)"
                )))
            }
        };
        if !contiguous || addr % elem != 0 {
            return Err(PyValueError::new_err(format!(
                "{what}: a C-contiguous, aligned array is needed"
            )));
        }
        Ok(Array {
            addr,
            shape,
            typestr,
            readonly,
        })
    }

    fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Its values, copied (`T` matching its dtype).
    fn to_vec<T: Element>(&self, what: &str) -> PyResult<Vec<T>> {
        self.check::<T>(what)?;
        let mut v = Vec::new();
        // SAFETY: `check` made sure the memory holds `len` aligned values
        // of `T`; the caller holds the array (so it stays allocated).
        unsafe { T::copy(self.addr, 0, self.len(), &mut v) };
        Ok(v)
    }

    /// The array as a slice to write, for an array the caller has just
    /// made for this call's results (no one else holds it).
    ///
    /// # Safety
    /// No other reference to the array's memory may be used while the
    /// slice lives, and the array must outlive it.
    unsafe fn out<T: Element>(&mut self, what: &str) -> PyResult<&mut [T]> {
        self.check::<T>(what)?;
        if self.readonly {
            return Err(PyValueError::new_err(format!(
                "{what}: the array is read-only"
            )));
        }
        if self.len() == 0 {
            return Ok(&mut []);
        }
        // SAFETY: aligned, `len` values of `T` (checked), exclusive and
        // alive (the caller's promise).
        Ok(unsafe { std::slice::from_raw_parts_mut(self.addr as *mut T, self.len()) })
    }

    fn check<T: Element>(&self, what: &str) -> PyResult<()> {
        if self.typestr != T::TYPESTR {
            return Err(PyTypeError::new_err(format!(
                "{what}: dtype {} where {} is needed",
                self.typestr,
                T::TYPESTR
            )));
        }
        Ok(())
    }
}

/// The element types arrays are read as.
trait Element: Copy + Send + Sync + 'static {
    const TYPESTR: &'static str;
    /// `x` rounded to this type.
    fn of_f64(x: f64) -> Self;
    /// Value `i` of the array at `addr`.
    ///
    /// # Safety
    /// `addr` must point at more than `i` aligned values of `Self` that
    /// stay allocated during the call.
    unsafe fn load(addr: usize, i: usize) -> Self;
    /// Appends values `first..first + n` of the array at `addr`.
    ///
    /// # Safety
    /// As [`load`](Element::load), for every value appended.
    unsafe fn copy(addr: usize, first: usize, n: usize, out: &mut Vec<Self>) {
        // SAFETY: the caller's promise.
        unsafe { extend_converted(out, addr, first..first + n, |v: Self| v) }
    }
}

// The values are read with relaxed atomic loads: another Python thread
// may write the array while numpy's GIL is released, and the loads then
// give some value, never a torn read the compiler assumed away.
macro_rules! element {
    ($t:ty, $atomic:ty, $bits:ty, $s:literal, $from:expr) => {
        impl Element for $t {
            const TYPESTR: &'static str = $s;
            fn of_f64(x: f64) -> $t {
                x as $t
            }
            unsafe fn load(addr: usize, i: usize) -> $t {
                // SAFETY: in bounds and aligned (the caller's promise);
                // the atomic type has the size and alignment of `$t`.
                let a = unsafe { <$atomic>::from_ptr((addr as *mut $bits).add(i)) };
                $from(a.load(Ordering::Relaxed))
            }
        }
    };
}

element!(f32, AtomicU32, u32, "<f4", f32::from_bits);
element!(f64, AtomicU64, u64, "<f8", f64::from_bits);
element!(i32, AtomicU32, u32, "<i4", |b: u32| b as i32);

/// Appends values `range` of the array of `S` at `addr` to `out`, each
/// converted by `to` as it is loaded (no copy in between).
///
/// # Safety
/// As [`Element::load`], for every value of `range`.
unsafe fn extend_converted<S: Element, T>(
    out: &mut Vec<T>,
    addr: usize,
    range: std::ops::Range<usize>,
    to: impl Fn(S) -> T,
) {
    out.reserve(range.len());
    for i in range {
        // SAFETY: the caller's promise.
        out.push(to(unsafe { S::load(addr, i) }));
    }
}

/// Rows of a numpy array in memory, of `float32` or `float64` (`wide`),
/// converted to the pass's precision as they are read.
struct MemRows {
    addr: usize,
    rows: usize,
    cols: usize,
    wide: bool,
}

impl<T: Real + Element> Rows<T> for MemRows {
    fn rows(&self) -> u64 {
        self.rows as u64
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn read(&self, first: u64, n: usize, out: &mut Vec<T>) -> outcore_jobs::Result<()> {
        out.clear();
        let (first, n) = (first as usize * self.cols, n * self.cols);
        let range = first..first + n;
        // SAFETY: `apply` reads rows below `rows`; the array (checked to
        // hold `rows x cols` aligned values of its dtype) is held by the
        // caller for the whole pass.
        unsafe {
            if self.wide {
                extend_converted(out, self.addr, range, T::of_f64);
            } else {
                extend_converted(out, self.addr, range, T::of_f32);
            }
        }
        Ok(())
    }
    fn read_now(&self, first: u64, n: usize, out: &mut Vec<T>) -> outcore_jobs::Result<bool> {
        // In memory: always there.
        self.read(first, n, out).map(|()| true)
    }
}

/// Rows whose reads fail once `stop` is set (the caller's signal).
struct Stoppable<'a, T> {
    rows: &'a dyn Rows<T>,
    stop: &'a AtomicBool,
}

impl<T> Rows<T> for Stoppable<'_, T> {
    fn rows(&self) -> u64 {
        self.rows.rows()
    }
    fn cols(&self) -> usize {
        self.rows.cols()
    }
    fn read(&self, first: u64, n: usize, out: &mut Vec<T>) -> outcore_jobs::Result<()> {
        self.go_on()?;
        self.rows.read(first, n, out)
    }
    fn read_now(&self, first: u64, n: usize, out: &mut Vec<T>) -> outcore_jobs::Result<bool> {
        self.go_on()?;
        self.rows.read_now(first, n, out)
    }
}

impl<T> Stoppable<'_, T> {
    /// An error once the caller's signal is set.
    fn go_on(&self) -> outcore_jobs::Result<()> {
        if self.stop.load(Ordering::Relaxed) {
            return Err(outcore_jobs::Error::Input("interrupted".into()));
        }
        Ok(())
    }
}

/// What a pass is asked to do, as the estimators name it.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct Job<'py> {
    /// `"nearest"`, `"distances"` or `"affine"`.
    kind: String,
    /// Centres or weights (rows of `cols`).
    model: Bound<'py, PyAny>,
    /// The bias (affine).
    bias: Option<Bound<'py, PyAny>>,
    /// Results: distances, decision values, or the nearest centre's
    /// squared distance.
    out: Bound<'py, PyAny>,
    /// The nearest centre of each row (nearest).
    labels: Option<Bound<'py, PyAny>>,
}

/// Applies a model to `x` (a path, or a 2-D array of the results' dtype)
/// and writes the results into `job`'s arrays, which the caller made for
/// this call. A value of `x` that is not finite is a `ValueError` naming
/// its row and column.
#[pyfunction]
pub(crate) fn apply_rows(
    py: Python<'_>,
    settings: &Settings,
    x: &Bound<'_, PyAny>,
    job: Job<'_>,
) -> PyResult<()> {
    let mut out = Array::of(&job.out, "out")?;
    let rows: Box<dyn RowsOf> = match x.extract::<PathBuf>() {
        Ok(path) => {
            let src = Source::from_path(&path, None).map_err(crate::to_py)?;
            let (_, cols) = src.shape().map_err(crate::to_py)?;
            Box::new(FileRows::new(
                BlockReader::open(&src).map_err(crate::to_py)?,
                cols,
            ))
        }
        Err(_) => {
            let a = Array::of(x, "X")?;
            if a.shape.len() != 2 || a.typestr == "<i4" {
                return Err(PyValueError::new_err(
                    "X: a 2-D array of float32 or float64 is needed",
                ));
            }
            Box::new(MemRows {
                addr: a.addr,
                rows: a.shape[0],
                cols: a.shape[1],
                wide: a.typestr == "<f8",
            })
        }
    };
    let r = match out.typestr.as_str() {
        "<f4" => run::<f32>(py, settings, rows.as_f32(), &job, &mut out),
        _ => run::<f64>(py, settings, rows.as_f64(), &job, &mut out),
    };
    crate::run::release_memory();
    r
}

/// Rows as either precision.
trait RowsOf: Sync {
    fn as_f32(&self) -> &dyn Rows<f32>;
    fn as_f64(&self) -> &dyn Rows<f64>;
}

impl<R: Rows<f32> + Rows<f64>> RowsOf for R {
    fn as_f32(&self) -> &dyn Rows<f32> {
        self
    }
    fn as_f64(&self) -> &dyn Rows<f64> {
        self
    }
}

/// The pass in `T`.
fn run<T: Real + Element>(
    py: Python<'_>,
    settings: &Settings,
    rows: &dyn Rows<T>,
    job: &Job<'_>,
    out: &mut Array,
) -> PyResult<()> {
    let model: Vec<T> = Array::of(&job.model, "model")?.to_vec("model")?;
    let cols = rows.cols();
    let width = model.len() / cols.max(1);
    let plan = Plan::new(
        settings.workers(),
        (rows.rows(), cols, width),
        std::mem::size_of::<T>(),
        settings.pass_budget(),
    );
    let mut labels = job
        .labels
        .as_ref()
        .map(|l| Array::of(l, "labels"))
        .transpose()?;
    let bias: Option<Vec<T>> = match &job.bias {
        Some(b) => Some(Array::of(b, "bias")?.to_vec("bias")?),
        None => None,
    };
    // SAFETY: `out` and `labels` are arrays the caller made for this call
    // and holds until it returns; nothing else refers to them.
    let out = unsafe { out.out::<T>("out")? };
    let task = match (job.kind.as_str(), labels.as_mut(), &bias) {
        ("nearest", Some(l), _) => Task::Nearest {
            centers: &model,
            // SAFETY: as `out` above.
            labels: unsafe { l.out::<i32>("labels")? },
            d2: out,
        },
        ("distances", _, _) => Task::Distances {
            centers: &model,
            out,
        },
        ("affine", _, Some(b)) => Task::Affine {
            weights: &model,
            bias: b,
            out,
        },
        (k, _, _) => {
            return Err(PyValueError::new_err(format!(
                "unknown pass '{k}' or a missing array"
            )))
        }
    };
    // Ctrl-C stops the pass at its next block, and raises KeyboardInterrupt.
    let stop = AtomicBool::new(false);
    let rows = Stoppable { rows, stop: &stop };
    crate::run::run_interruptible(
        py,
        || apply::apply(&rows, task, plan),
        || stop.store(true, Ordering::Relaxed),
    )
}
