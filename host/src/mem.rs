//! Byte views of device-accessible memory: what every operation descriptor points with.

use cust::memory::{DeviceCopy, DeviceSlice};

use crate::error::{Error, Result};

/// A view of `len` bytes of device memory at `ptr` (memory kvio reads or writes, owned by the
/// caller). It is only a pair of numbers: make sure the memory outlives the work enqueued on it.
///
/// ```
/// # fn main() -> kvio::Result<()> {
/// // SAFETY: only described here, never dereferenced.
/// let cache = unsafe { kvio::DeviceBytes::from_raw(0x7f00_0000_0000, 4096) };
/// let v_half = cache.slice(2048, 2048)?; // e.g. V of a combined K|V allocation
/// assert_eq!((v_half.ptr(), v_half.len()), (0x7f00_0000_0800, 2048));
/// assert!(cache.slice(4000, 100).is_err()); // past the end: BufferTooSmall
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceBytes {
    ptr: u64,
    len: usize,
}

impl DeviceBytes {
    /// A view of raw device memory (from cudarc's `device_ptr`, candle's storage, ...).
    ///
    /// # Safety
    /// `ptr..ptr + len` must be device-accessible memory of the current context (device memory,
    /// or pinned host memory mapped into the device's address space), valid for as long as
    /// work using the view is in flight.
    pub unsafe fn from_raw(ptr: u64, len: usize) -> Self {
        DeviceBytes { ptr, len }
    }

    /// The bytes of a cust device slice.
    pub fn of<T: DeviceCopy>(s: &DeviceSlice<T>) -> Self {
        DeviceBytes {
            ptr: s.as_device_ptr().as_raw(),
            // DeviceSlice is a (pointer, length) pair, not a DST: size_of_val is its own size.
            len: s.len() * std::mem::size_of::<T>(),
        }
    }

    /// The bytes `offset..offset + len` of this view.
    pub fn slice(&self, offset: usize, len: usize) -> Result<Self> {
        let end = offset
            .checked_add(len)
            .ok_or(Error::Overflow { name: "slice" })?;
        if end > self.len {
            return Err(Error::BufferTooSmall {
                name: "slice",
                needed: end as u64,
                len: self.len as u64,
            });
        }
        Ok(DeviceBytes {
            ptr: self.ptr + offset as u64,
            len,
        })
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}
