//! Byte views of device-accessible memory: what every operation descriptor points with.
//!
//! A view borrows what it views. [`DeviceBytes`] (read) comes from a shared borrow of its
//! owner, [`DeviceBytesMut`] (written) from an exclusive one, so the owner can neither be
//! dropped nor touched from the host while a view of it exists. Raw addresses enter through the
//! `unsafe` constructors. Both views are `Copy`: a copy keeps the owner's borrow alive, and two
//! views of one owner may overlap (what the device does with overlapping views is the caller's
//! business; it cannot reach host memory Rust code holds). The crate docs' "Soundness" section
//! says what the safe API guarantees.

use std::marker::PhantomData;

use cust::memory::{DeviceCopy, DeviceSlice};

use crate::error::{Error, Result};

/// `offset..offset + len` inside a view of `total` bytes, or the typed error.
fn sub_range(offset: usize, len: usize, total: usize) -> Result<()> {
    let end = offset
        .checked_add(len)
        .ok_or(Error::Overflow { name: "slice" })?;
    if end > total {
        return Err(Error::BufferTooSmall {
            name: "slice",
            needed: end as u64,
            len: total as u64,
        });
    }
    Ok(())
}

/// A view of `len` bytes of device-accessible memory at `ptr` that a kvio call reads (inputs,
/// slot mappings, block maps, source pools), borrowed from its owner for `'a`.
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
///
/// A view cannot outlive the memory it views:
///
/// ```compile_fail,E0597
/// # fn main() -> kvio::Result<()> {
/// let view;
/// {
///     let mem = kvio::DeviceAlloc::new(4096)?;
///     view = mem.bytes();
/// } // `mem` is freed here, while `view` still points at it
/// println!("{:#x}", view.ptr());
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceBytes<'a> {
    ptr: u64,
    len: usize,
    _owner: PhantomData<&'a [u8]>,
}

impl<'a> DeviceBytes<'a> {
    /// A view of raw device-accessible memory (from a framework's tensor, cudarc's
    /// `device_ptr`, ...). The lifetime is the caller's choice.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be device-accessible memory of the context kvio runs in (device
    /// memory, or pinned host memory mapped into the device's address space) that stays
    /// allocated until the work enqueued with the view has finished, and host code must not
    /// write it while that work runs.
    pub unsafe fn from_raw(ptr: u64, len: usize) -> Self {
        DeviceBytes {
            ptr,
            len,
            _owner: PhantomData,
        }
    }

    /// The bytes of a cust device slice (a `DeviceBuffer` derefs to one), borrowed from it.
    /// cust frees a `DeviceBuffer` with `cuMemFree`, which kvio relies on not to release
    /// memory that enqueued work still uses (see the crate docs' "Soundness").
    pub fn of<T: DeviceCopy>(s: &'a DeviceSlice<T>) -> Self {
        // SAFETY: cust's device allocation of `len * size_of::<T>()` bytes, borrowed for 'a.
        // DeviceSlice is a (pointer, length) pair, not a DST: size_of_val is its own size.
        unsafe {
            Self::from_raw(
                s.as_device_ptr().as_raw(),
                s.len() * std::mem::size_of::<T>(),
            )
        }
    }

    /// The bytes `offset..offset + len` of this view.
    pub fn slice(&self, offset: usize, len: usize) -> Result<DeviceBytes<'a>> {
        sub_range(offset, len, self.len)?;
        // SAFETY: a sub-range of this view, with its borrow.
        Ok(unsafe { Self::from_raw(self.ptr + offset as u64, len) })
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

/// A view of `len` bytes of device-accessible memory at `ptr` that a kvio call writes (caches,
/// destination pools), borrowed exclusively from its owner for `'a`: while it (or a copy of
/// it) lives, the owner cannot be read or written from the host, nor dropped.
///
/// ```
/// # fn main() -> kvio::Result<()> {
/// // SAFETY: only described here, never dereferenced.
/// let kv = unsafe { kvio::DeviceBytesMut::from_raw(0x7f00_0000_0000, 4096) };
/// let (k, v) = kv.split_at(2048)?; // a combined K|V allocation
/// assert_eq!((v.ptr(), v.len()), (0x7f00_0000_0800, 2048));
/// assert_eq!(k.as_read().len(), 2048); // the same bytes, for a call that reads them
/// # Ok(()) }
/// ```
///
/// A shared borrow gives no write view, so a cache cannot be written through a
/// read view:
///
/// ```compile_fail,E0308
/// # fn main() -> kvio::Result<()> {
/// let cache = kvio::DeviceAlloc::new(4096)?;
/// let written: kvio::DeviceBytesMut<'_> = cache.bytes(); // needs `cache.bytes_mut()`
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceBytesMut<'a> {
    ptr: u64,
    len: usize,
    _owner: PhantomData<&'a [u8]>,
}

impl<'a> DeviceBytesMut<'a> {
    /// A write view of raw device-accessible memory. The lifetime is the caller's choice.
    ///
    /// # Safety
    /// As [`DeviceBytes::from_raw`], and host code must neither read nor write the memory
    /// while work that writes it through the view runs.
    pub unsafe fn from_raw(ptr: u64, len: usize) -> Self {
        DeviceBytesMut {
            ptr,
            len,
            _owner: PhantomData,
        }
    }

    /// The bytes of a cust device slice, borrowed exclusively (see [`DeviceBytes::of`]).
    pub fn of<T: DeviceCopy>(s: &'a mut DeviceSlice<T>) -> Self {
        // SAFETY: cust's device allocation of `len * size_of::<T>()` bytes, exclusively
        // borrowed for 'a.
        unsafe {
            Self::from_raw(
                s.as_device_ptr().as_raw(),
                s.len() * std::mem::size_of::<T>(),
            )
        }
    }

    /// The bytes `offset..offset + len` of this view.
    pub fn slice(&self, offset: usize, len: usize) -> Result<DeviceBytesMut<'a>> {
        sub_range(offset, len, self.len)?;
        // SAFETY: a sub-range of this view, with its borrow.
        Ok(unsafe { Self::from_raw(self.ptr + offset as u64, len) })
    }

    /// The view cut at byte `mid`: `(..mid, mid..)`.
    pub fn split_at(&self, mid: usize) -> Result<(DeviceBytesMut<'a>, DeviceBytesMut<'a>)> {
        Ok((
            self.slice(0, mid)?,
            self.slice(mid, self.len.saturating_sub(mid))?,
        ))
    }

    /// The same bytes as a read view (for a call that reads them: the source of a copy
    /// inside one pool, or a check of what was written).
    pub fn as_read(&self) -> DeviceBytes<'a> {
        // SAFETY: the same range, with the same (exclusive, hence also shared) borrow.
        unsafe { DeviceBytes::from_raw(self.ptr, self.len) }
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

impl<'a> From<DeviceBytesMut<'a>> for DeviceBytes<'a> {
    fn from(v: DeviceBytesMut<'a>) -> Self {
        v.as_read()
    }
}
