//! cudarc interop (feature `cudarc`): kvio's operations on cudarc-owned contexts, streams,
//! device slices and pinned host memory.
//!
//! Every kvio launcher takes a [`StreamRef`] and [`DeviceBytes`] views; this module makes them
//! from cudarc's types, nothing more:
//!
//! | cudarc | kvio | here |
//! |---|---|---|
//! | `CudaContext` (the device's primary context) | current context for [`Kvio::load`] | [`load`] |
//! | `&CudaStream` | [`StreamRef`] | [`stream`] |
//! | `&CudaSlice<T>`, `&CudaView<T>` (read by the kernel) | [`DeviceBytes`] | [`read()`] |
//! | `&mut CudaSlice<T>`, `&mut CudaViewMut<T>` (written) | [`DeviceBytesMut`] | [`write()`] |
//! | `&PinnedHostSlice<T>` / `&mut PinnedHostSlice<T>` | [`DeviceBytes`] / [`DeviceBytesMut`] of mapped host memory | [`read_pinned`] / [`write_pinned`] |
//! | `DriverError` | [`Error::Driver`] | [`driver_error`] |
//!
//! The cudarc kvio was built against is re-exported as [`driver`] (`kvio::cudarc::driver`), so
//! the types always match. candle 0.11 uses the same cudarc (0.19), so candle's
//! `CudaDevice::cuda_stream()` and `CudaStorage::as_cuda_slice::<T>()` work here directly.
//!
//! # Context and ordering
//!
//! [`load`] binds cudarc's context to the calling thread and loads kvio into it (other threads
//! call `ctx.bind_to_thread()` first). Drop the [`Kvio`] before the last `Arc<CudaContext>`.
//!
//! [`read()`], [`write()`], [`read_pinned`] and [`write_pinned`] go through cudarc's
//! `device_ptr`/`device_ptr_mut`, so with event tracking on (cudarc's default) the kvio stream
//! waits for conflicting work on other streams, and the returned [`Access`] records the kvio use
//! when dropped. Take each view with the stream the kvio call runs on and drop it right after
//! that call is enqueued. With tracking off, order the streams yourself. For CUDA-graph
//! capture, take the views before `begin_capture` and drop them after `end_capture`.
//!
//! ```no_run
//! # fn main() -> kvio::Result<()> {
//! use kvio::cudarc::{self as kc, driver::CudaContext};
//! use kvio::{PagedLayout, SlotMapping, SlotUpdate, TokenLayout};
//! let e = |e| kc::driver_error("cudarc", e);
//! let ctx = CudaContext::new(0).map_err(e)?; // primary context, current on this thread
//! let kv = kc::load(&ctx)?;
//! let stream = ctx.new_stream().map_err(e)?;
//! let (t, h, d) = (4, 8, 128);
//! let layout = PagedLayout::nhd(64, 16, h, d, 2);
//! let key = stream.clone_htod(&vec![1u16; t * h * d]).map_err(e)?;
//! let value = stream.clone_htod(&vec![2u16; t * h * d]).map_err(e)?;
//! let mut k_cache = stream.alloc_zeros::<u16>(64 * 16 * h * d).map_err(e)?;
//! let mut v_cache = stream.alloc_zeros::<u16>(64 * 16 * h * d).map_err(e)?;
//! let slots = stream.clone_htod(&[17i64, 18, -1, 40]).map_err(e)?;
//! {
//!     let (k, v, s) = (kc::read(&key, &stream), kc::read(&value, &stream), kc::read(&slots, &stream));
//!     let (kcw, vcw) = (kc::write(&mut k_cache, &stream), kc::write(&mut v_cache, &stream));
//!     let op = SlotUpdate::new(
//!         k.bytes(),
//!         TokenLayout::contiguous(t, h, d, 2),
//!         kcw.bytes_mut(),
//!         layout,
//!         SlotMapping::I64(s.bytes()),
//!     )
//!     .value(v.bytes(), vcw.bytes_mut());
//!     kv.update_slots(&op, kc::stream(&stream))?;
//! } // the guards drop here, after the launch: cudarc now tracks it
//! let host: Vec<u16> = stream.clone_dtoh(&k_cache).map_err(e)?;
//! # drop(host); Ok(()) }
//! ```

use ::cudarc::driver::{
    CudaContext, CudaStream, DevicePtr, DevicePtrMut, DriverError, HostSlice, PinnedHostSlice,
    SyncOnDrop,
};
use cust::sys as cu;

/// The cudarc driver API kvio was built against (`cudarc::driver`), re-exported so callers
/// name exactly the types kvio's helpers take.
pub use ::cudarc::driver;

use crate::driver::{check, StreamRef};
use crate::error::{Error, Result};
use crate::mem::{DeviceBytes, DeviceBytesMut};
use crate::module::Kvio;

/// A cudarc `DriverError` as kvio's [`Error::Driver`], naming `call`.
///
/// ```
/// use kvio::cudarc::{driver::{sys::CUresult, DriverError}, driver_error};
/// let e = driver_error("cuMemAlloc", DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
/// assert_eq!(e, kvio::Error::Driver { call: "cuMemAlloc", code: 2 });
/// ```
pub fn driver_error(call: &'static str, e: DriverError) -> Error {
    Error::Driver {
        call,
        code: e.0 as u32,
    }
}

/// Makes cudarc's context current on this thread (`ctx.bind_to_thread()`) and loads kvio's
/// kernels into it ([`Kvio::load`]). Drop the result before the last `Arc<CudaContext>`.
///
/// ```no_run
/// # fn main() -> kvio::Result<()> {
/// let ctx = kvio::cudarc::driver::CudaContext::new(0)
///     .map_err(|e| kvio::cudarc::driver_error("cuDevicePrimaryCtxRetain", e))?;
/// let kv = kvio::cudarc::load(&ctx)?;
/// println!("kvio {:?} in cudarc's primary context", kv.arch());
/// # Ok(()) }
/// ```
pub fn load(ctx: &CudaContext) -> Result<Kvio> {
    ctx.bind_to_thread()
        .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
    Kvio::load()
}

/// Borrows a cudarc stream for kvio's launchers (`CudaStream::cu_stream()`). The stream must
/// belong to the context kvio was loaded in (the driver rejects the launch otherwise).
///
/// ```no_run
/// # fn main() -> kvio::Result<()> {
/// let ctx = kvio::cudarc::driver::CudaContext::new(0).unwrap();
/// let stream = ctx.new_stream().unwrap();
/// let errors = kvio::DeviceErrors::new()?;
/// assert!(errors.read(kvio::cudarc::stream(&stream))?.is_clean());
/// # Ok(()) }
/// ```
pub fn stream(stream: &CudaStream) -> StreamRef<'_> {
    // SAFETY: the borrow keeps cudarc's stream alive for the returned lifetime; cudarc and
    // cust name the same opaque `CUstream_st` pointer type.
    unsafe { StreamRef::from_raw(stream.cu_stream() as cu::CUstream) }
}

/// Access to cudarc-owned memory for one kvio call, holding cudarc's `SyncOnDrop` guard: drop
/// it after the kvio call that uses its views has been enqueued (see the [module docs](self)).
/// The views borrow the `Access`, so they cannot outlive the guard.
#[derive(Debug)]
#[must_use = "keep the Access alive until the kvio call using it is enqueued"]
pub struct Access<'a> {
    ptr: u64,
    len: usize,
    _sync: SyncOnDrop<'a>,
}

/// [`Access`] to memory a kvio call writes, from [`write()`] or [`write_pinned`] (which borrow
/// it exclusively): it also gives the write view.
#[derive(Debug)]
#[must_use = "keep the AccessMut alive until the kvio call using it is enqueued"]
pub struct AccessMut<'a>(Access<'a>);

impl AccessMut<'_> {
    /// The write view (whole slice or view, in bytes).
    pub fn bytes_mut(&self) -> DeviceBytesMut<'_> {
        // SAFETY: cudarc's memory, exclusively borrowed (`&mut`) for the guard's lifetime,
        // which the view's borrow of `self` cannot outlive.
        unsafe { DeviceBytesMut::from_raw(self.0.ptr, self.0.len) }
    }

    /// The same memory as a read view.
    pub fn bytes(&self) -> DeviceBytes<'_> {
        self.0.bytes()
    }

    /// Records the use on cudarc's events now (same as dropping it).
    pub fn finish(self) {}
}

impl Access<'_> {
    /// The read view (whole slice or view, in bytes). Sub-ranges: [`DeviceBytes::slice`].
    pub fn bytes(&self) -> DeviceBytes<'_> {
        // SAFETY: cudarc's memory, borrowed for the Access's lifetime (which the view's
        // borrow of `self` cannot outlive).
        unsafe { DeviceBytes::from_raw(self.ptr, self.len) }
    }

    /// Records the use on cudarc's events now (same as dropping it).
    pub fn finish(self) {}
}

/// Memory a kvio call reads: a `CudaSlice<T>` or `CudaView<T>` (inputs, slot mappings, slice
/// tables, block maps, a source pool). `stream` first waits for the slice's last write;
/// dropping the [`Access`] records the read.
///
/// ```no_run
/// let ctx = kvio::cudarc::driver::CudaContext::new(0).unwrap();
/// let stream = ctx.new_stream().unwrap();
/// let slots = stream.clone_htod(&[3i64, -1, 7]).unwrap();
/// let s = kvio::cudarc::read(&slots, &stream);
/// let mapping = kvio::SlotMapping::I64(s.bytes());
/// assert_eq!(mapping.len(), 3);
/// ```
pub fn read<'a, T, S: DevicePtr<T>>(src: &'a S, stream: &'a CudaStream) -> Access<'a> {
    let bytes = src.num_bytes();
    let (ptr, sync) = src.device_ptr(stream);
    Access {
        ptr,
        len: bytes,
        _sync: sync,
    }
}

/// Memory a kvio call writes: a `CudaSlice<T>` or `CudaViewMut<T>` (caches, a destination
/// pool). `stream` first waits for the slice's last read and write; dropping the [`Access`]
/// records the write. A pool both read and written (copy within one pool) needs only this
/// one view: use it as source and destination.
///
/// ```no_run
/// let ctx = kvio::cudarc::driver::CudaContext::new(0).unwrap();
/// let stream = ctx.new_stream().unwrap();
/// let mut cache = stream.alloc_zeros::<u16>(1 << 20).unwrap(); // bf16 bits
/// let c = kvio::cudarc::write(&mut cache, &stream);
/// assert_eq!(c.bytes_mut().len(), 2 << 20);
/// ```
pub fn write<'a, T, S: DevicePtrMut<T>>(dst: &'a mut S, stream: &'a CudaStream) -> AccessMut<'a> {
    let bytes = dst.num_bytes();
    let (ptr, sync) = dst.device_ptr_mut(stream);
    AccessMut(Access {
        ptr,
        len: bytes,
        _sync: sync,
    })
}

/// The device address of pinned host memory (`cuMemHostGetDevicePointer`).
fn mapped(host: *const u8) -> Result<u64> {
    let mut dev = 0;
    // SAFETY: `host` starts a pinned allocation made by cuMemHostAlloc (unified addressing
    // maps every such allocation; DEVICEMAP makes it explicit); out-pointer to a local.
    check("cuMemHostGetDevicePointer", unsafe {
        cu::cuMemHostGetDevicePointer_v2(&mut dev, host as *mut _, 0)
    })?;
    Ok(dev)
}

/// cudarc pinned host memory a kvio call reads (the source pool of an onload). Allocate it
/// with `ctx.alloc_pinned_with_flags(n, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE)`:
/// cudarc's plain `alloc_pinned` is write-combined, which the kernel backend can use but host
/// code reads very slowly. `stream` waits for the slice's event; dropping the [`Access`]
/// records the use on it.
///
/// ```no_run
/// # fn main() -> kvio::Result<()> {
/// use kvio::cudarc::driver::{sys, CudaContext};
/// let ctx = CudaContext::new(0).unwrap();
/// let stream = ctx.new_stream().unwrap();
/// let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
/// // SAFETY: read only after it is written below.
/// let mut pool = unsafe { ctx.alloc_pinned_with_flags::<u8>(1 << 20, flags) }.unwrap();
/// pool.as_mut_slice().unwrap().fill(7);
/// let p = kvio::cudarc::read_pinned(&pool, &stream)?;
/// assert_eq!(kvio::memory_kind(p.bytes().ptr()), kvio::MemoryKind::PinnedHost);
/// # Ok(()) }
/// ```
pub fn read_pinned<'a, T>(
    host: &'a PinnedHostSlice<T>,
    stream: &'a CudaStream,
) -> Result<Access<'a>> {
    let len = host.num_bytes();
    // SAFETY: the slice is used on `stream` only (the kvio call the Access is for).
    let (s, sync) = unsafe { host.stream_synced_slice(stream) };
    Ok(Access {
        ptr: mapped(s.as_ptr().cast())?,
        len,
        _sync: sync,
    })
}

/// cudarc pinned host memory a kvio call writes (the destination pool of an offload); see
/// [`read_pinned`] for the allocation flags. Dropping the [`Access`] records the transfer on
/// the slice's event (when cudarc tracks events), so `PinnedHostSlice::as_slice()` waits for
/// it; without tracking, synchronise the stream first.
///
/// ```no_run
/// # fn main() -> kvio::Result<()> {
/// use kvio::cudarc::driver::{sys, CudaContext};
/// let ctx = CudaContext::new(0).unwrap();
/// let stream = ctx.new_stream().unwrap();
/// let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
/// // SAFETY: read only after kvio has written it.
/// let mut pool = unsafe { ctx.alloc_pinned_with_flags::<u8>(1 << 20, flags) }.unwrap();
/// {
///     let p = kvio::cudarc::write_pinned(&mut pool, &stream)?;
///     // ... kv.copy_blocks(&BlockCopy::new(.., BlockPool::cross_layer_nhd(p.bytes_mut(), ..), ..), ..)
/// }
/// let offloaded: &[u8] = pool.as_slice().unwrap(); // waits for the transfer
/// # let _ = offloaded; Ok(()) }
/// ```
pub fn write_pinned<'a, T>(
    host: &'a mut PinnedHostSlice<T>,
    stream: &'a CudaStream,
) -> Result<AccessMut<'a>> {
    let len = host.num_bytes();
    // SAFETY: the slice is used on `stream` only (the kvio call the Access is for).
    let (s, sync) = unsafe { host.stream_synced_mut_slice(stream) };
    Ok(AccessMut(Access {
        ptr: mapped(s.as_ptr().cast())?,
        len,
        _sync: sync,
    }))
}
