//! The device-side error word: counters the kernels increment for device-resident indices
//! they refuse, and the host-side [`ErrorCounts`] read back from it.

use cust::sys as cu;
use kvio_kernels::index::err;

use crate::alloc::DeviceAlloc;
use crate::driver::{check, settle_legacy, StreamRef};
use crate::error::Result;

/// Counters read back from a [`DeviceErrors`] word: device-resident indices a kernel refused.
///
/// ```
/// let counts = kvio::ErrorCounts { bad_slots: 2, ..Default::default() };
/// assert!(!counts.is_clean());
/// assert!(kvio::ErrorCounts::default().is_clean());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorCounts {
    /// Slot-mapping entries past the end of the cache (tokens skipped).
    pub bad_slots: u32,
    /// Slices out of range, too long or crossing a page (slices skipped); for slice updates
    /// through a slot list (layouts other than contiguous rows, fp8) also each source row a
    /// second slice names (that row written once).
    pub bad_slices: u32,
    /// Device-side counts outside their capacity (whole launches skipped).
    pub bad_counts: u32,
    /// Block pairs with an id outside its pool (pairs skipped; one count per pair, even with
    /// both ids bad; pairs with a negative id are padding and not counted).
    pub bad_blocks: u32,
}

impl ErrorCounts {
    /// True when no kernel refused anything.
    pub fn is_clean(&self) -> bool {
        *self == ErrorCounts::default()
    }

    /// The counters of an error word as the kernels left them.
    pub(crate) fn of(w: &[u32; WORDS]) -> ErrorCounts {
        ErrorCounts {
            bad_slots: w[err::BAD_SLOT],
            bad_slices: w[err::BAD_SLICE],
            bad_counts: w[err::BAD_COUNT],
            bad_blocks: w[err::BAD_BLOCK],
        }
    }
}

/// The device-side error word: counters the kernels increment (atomically) for each index
/// they skip because it was out of range. One word may serve many launches and streams.
///
/// ```no_run
/// # fn main() -> kvio::Result<()> {
/// let _ctx = kvio::PrimaryContext::retain(0)?;
/// let stream = kvio::Stream::new()?; // non-blocking
/// let s = stream.sref();
/// let errors = kvio::DeviceErrors::new()?; // set-up time
/// errors.reset(s)?;                         // before a step (capturable)
/// // ... launches with `errors: Some(&errors)` ...
/// let counts = errors.read(s)?;             // waits for the stream
/// if !counts.is_clean() {
///     eprintln!("kernels skipped bad indices: {counts:?}");
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct DeviceErrors {
    mem: DeviceAlloc,
}

/// `u32` counters of an error word.
pub(crate) const WORDS: usize = err::WORDS;

impl DeviceErrors {
    /// Allocates a zeroed error word in the current context (this call synchronises: do it at
    /// set-up time, not on a hot path).
    pub fn new() -> Result<Self> {
        let mem = DeviceAlloc::new(WORDS * 4)?;
        // SAFETY: a fresh allocation of WORDS u32.
        check("cuMemsetD32", unsafe {
            cu::cuMemsetD32_v2(mem.ptr, 0, WORDS)
        })?;
        settle_legacy()?;
        Ok(DeviceErrors { mem })
    }

    /// The device address of the counters (`u32` × 4), for a kernel parameter.
    pub fn ptr(&self) -> u64 {
        self.mem.ptr
    }

    /// Zeroes the counters, asynchronously on `stream`.
    pub fn reset(&self, stream: StreamRef<'_>) -> Result<()> {
        // SAFETY: the allocation lives while self does.
        check("cuMemsetD32Async", unsafe {
            cu::cuMemsetD32Async(self.ptr(), 0, WORDS, stream.cu_stream())
        })
    }

    /// Copies the counters to the host after the work queued on `stream` so far; this waits
    /// for `stream` (it is the one kvio call that synchronises, and only when asked).
    pub fn read(&self, stream: StreamRef<'_>) -> Result<ErrorCounts> {
        let mut w = [0u32; WORDS];
        self.mem.read(0, bytemuck::cast_slice_mut(&mut w), stream)?;
        Ok(ErrorCounts::of(&w))
    }
}
