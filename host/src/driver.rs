//! Thin, checked wrappers over the CUDA driver API (`cust::sys`), and raw-handle types.
//!
//! kvio runs in the caller's current context and on the caller's streams: it never creates a
//! context or a stream of its own, so memory and streams owned by cust, cudarc or candle work.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr;

use cust::sys as cu;

use crate::error::{Error, Result};
use crate::inline::InlineVec;
use crate::plan::Span;

/// Turns a `CUresult` into `Ok(())` or [`Error::Driver`] naming `call`.
pub(crate) fn check(call: &'static str, r: cu::CUresult) -> Result<()> {
    if r == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Driver {
            call,
            code: r as u32,
        })
    }
}

/// Waits for the legacy default stream of the current context: the synchronous copies and
/// memsets kvio issues at set-up time run there, and may still be in flight when they return
/// (a pageable upload returns once staged); a non-blocking stream would not wait for them.
pub(crate) fn settle_legacy() -> Result<()> {
    // SAFETY: the null stream is the current context's legacy default stream.
    check("cuStreamSynchronize", unsafe {
        cu::cuStreamSynchronize(ptr::null_mut())
    })
}

/// Runs `f` with `ctx` pushed as the current context (releases in `Drop` impls, which may run
/// on any thread); does nothing if the context cannot be pushed.
pub(crate) fn with_ctx(ctx: cu::CUcontext, f: impl FnOnce()) {
    // SAFETY: push/pop of a context handle that outlives the call.
    unsafe {
        if cu::cuCtxPushCurrent_v2(ctx) == cu::CUresult::CUDA_SUCCESS {
            f();
            let mut old = ptr::null_mut();
            cu::cuCtxPopCurrent_v2(&mut old);
        }
    }
}

/// Waits for all work in `ctx` (every stream), pushing it current for the call: what kvio's
/// owners do before handing host memory to Rust code or freeing memory work may still use.
pub(crate) fn sync_context(ctx: cu::CUcontext) -> Result<()> {
    // SAFETY: push/pop of a live context handle around a synchronisation.
    unsafe {
        check("cuCtxPushCurrent", cu::cuCtxPushCurrent_v2(ctx))?;
        let r = check("cuCtxSynchronize", cu::cuCtxSynchronize());
        let mut old = ptr::null_mut();
        cu::cuCtxPopCurrent_v2(&mut old);
        r
    }
}

/// A borrowed CUDA stream: kvio enqueues work on it and never synchronises it.
///
/// Make one from a kvio [`Stream`] ([`Stream::sref`]), from any framework's raw `CUstream`
/// with [`StreamRef::from_raw`], or from a cust stream with [`StreamRef::from_cust`] (cust
/// 0.3.2 creates blocking streams only, whatever flags it is given: prefer [`Stream`]).
///
/// ```no_run
/// # fn main() -> kvio::Result<()> {
/// let _ctx = kvio::PrimaryContext::retain(0)?;
/// let stream = kvio::Stream::new()?; // non-blocking
/// let s = stream.sref();
/// // Any framework's raw handle works too (cudarc: `cu_stream()`, torch: `cuda_stream`):
/// // SAFETY: the stream outlives every use of `raw`.
/// let raw = unsafe { kvio::StreamRef::from_raw(s.cu_stream()) };
/// assert_eq!(raw.cu_stream(), stream.cu_stream());
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct StreamRef<'a> {
    raw: cu::CUstream,
    /// `None`: kvio's default (PDL where supported), else the caller's choice.
    pdl: Option<bool>,
    _life: PhantomData<&'a ()>,
}

impl<'a> StreamRef<'a> {
    /// Wraps a raw stream handle (null means the legacy default stream).
    ///
    /// # Safety
    /// `raw` must be a valid stream of the current context (or null) for as long as the
    /// returned value and the work enqueued through it are in use.
    pub unsafe fn from_raw(raw: cu::CUstream) -> Self {
        StreamRef {
            raw,
            pdl: None,
            _life: PhantomData,
        }
    }

    /// Borrows a cust stream.
    pub fn from_cust(stream: &'a cust::stream::Stream) -> Self {
        StreamRef {
            raw: stream.as_inner(),
            pdl: None,
            _life: PhantomData,
        }
    }

    /// The raw `CUstream`.
    pub fn cu_stream(&self) -> cu::CUstream {
        self.raw
    }

    /// The same stream, with kvio's kernels launched through it using programmatic dependent
    /// launch (`on`) or not (PDL, Hopper and later). Without this call kvio launches its
    /// updates with PDL wherever it is supported
    /// ([`Kvio::supports_pdl`](crate::Kvio::supports_pdl)) and its block copies plainly: the
    /// results are the same either way, and on the H200 a PDL launch costs about 0.45 µs
    /// less host time than a plain one (bench group `host`, rows `slots-nhd` and
    /// `slots-nhd-pdl`), while a programmatic block copy would keep its CTAs on the
    /// multiprocessors, waiting, for as long as the kernel before it runs. Block copies never
    /// signal their dependents early: an update launched after one is scheduled as its CTAs
    /// exit.
    ///
    /// With PDL each launch carries the attribute
    /// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 1` (`cuLaunchKernelEx`), so
    /// it may be scheduled while the kernel enqueued before it on the stream (the one that
    /// produced K/V, say) is still finishing, once that kernel's CTAs have all signalled
    /// (`griddepcontrol.launch_dependents`) or exited. kvio's kernels then wait
    /// (`griddepcontrol.wait`) for that kernel to complete and its writes to be visible
    /// before they read or write anything, so the results are those of plain stream order:
    /// what overlaps is the launch and the CTAs' start-up, not memory accesses. Work enqueued
    /// after a kvio kernel waits for all of it, as in plain stream order.
    ///
    /// Inside stream capture the dependency becomes a programmatic edge of the graph (CUDA
    /// 12.3 and later); `pdl(false)` captures plain edges. kvio launches plainly (same
    /// results, no overlap) where PDL is not available (the `sm_80` PTX, whose kernels do not
    /// wait, or a driver older than CUDA 12.3), for operations that enqueue a host-to-device
    /// copy before their kernel (a block copy with a host block map) and for those that
    /// launch no kernel (DMA copies).
    ///
    /// ```no_run
    /// # fn main() -> kvio::Result<()> {
    /// # use cust::memory::DeviceBuffer;
    /// # use kvio::{DeviceBytes, DeviceBytesMut, PagedLayout, SlotMapping, SlotUpdate, TokenLayout};
    /// let _ctx = kvio::PrimaryContext::retain(0)?;
    /// let kv = kvio::Kvio::load()?;
    /// let stream = kvio::Stream::new()?;
    /// # let (t, h, d) = (4, 8, 128);
    /// # let key = DeviceBuffer::from_slice(&vec![1u16; t * h * d]).unwrap();
    /// # let value = DeviceBuffer::from_slice(&vec![2u16; t * h * d]).unwrap();
    /// # let mut kc = DeviceBuffer::from_slice(&vec![0u16; 64 * 16 * h * d]).unwrap();
    /// # let mut vc = DeviceBuffer::from_slice(&vec![0u16; 64 * 16 * h * d]).unwrap();
    /// # let slots = DeviceBuffer::from_slice(&[17i64, 18, -1, 40]).unwrap();
    /// # let op = SlotUpdate::new(DeviceBytes::of(&key), TokenLayout::contiguous(t, h, d, 2),
    /// #     DeviceBytesMut::of(&mut kc), PagedLayout::nhd(64, 16, h, d, 2),
    /// #     SlotMapping::I64(DeviceBytes::of(&slots)))
    /// #     .value(DeviceBytes::of(&value), DeviceBytesMut::of(&mut vc));
    /// // ... the model's kernel that writes `key` and `value`, enqueued on `stream` ...
    /// // The update may start while that kernel drains; it reads `key`/`value` only after it.
    /// kv.update_slots(&op, stream.sref().pdl(true))?;
    /// println!("overlapped launch: {}", kv.supports_pdl());
    /// # Ok(()) }
    /// ```
    pub fn pdl(self, on: bool) -> Self {
        StreamRef {
            pdl: Some(on),
            ..self
        }
    }

    /// The caller's choice of programmatic dependent launch for this reference
    /// ([`StreamRef::pdl`]); `None`: kvio's default, PDL wherever it is supported.
    pub fn pdl_choice(&self) -> Option<bool> {
        self.pdl
    }
}

impl<'a> From<&'a cust::stream::Stream> for StreamRef<'a> {
    fn from(stream: &'a cust::stream::Stream) -> Self {
        StreamRef::from_cust(stream)
    }
}

impl<'a> From<&'a Stream> for StreamRef<'a> {
    fn from(stream: &'a Stream) -> Self {
        stream.sref()
    }
}

/// A stream kvio creates through the driver with `CU_STREAM_NON_BLOCKING`: it does not
/// synchronise with the legacy default stream, so work on it is ordered only by stream order
/// and events (cust 0.3.2's `Stream::new` drops that flag). Destroyed on drop.
///
/// ```no_run
/// # fn main() -> kvio::Result<()> {
/// let _ctx = kvio::PrimaryContext::retain(0)?;
/// let stream = kvio::Stream::new()?; // in the current context
/// assert!(stream.is_non_blocking()?);
/// // ... kvio calls with `stream.sref()` ...
/// stream.synchronize()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Stream {
    raw: cu::CUstream,
    ctx: cu::CUcontext,
}

impl Stream {
    /// A new non-blocking stream in the current context.
    pub fn new() -> Result<Self> {
        let ctx = current_context()?;
        let mut raw = ptr::null_mut();
        // SAFETY: out-pointer to a local; a context is current.
        check("cuStreamCreate", unsafe {
            cu::cuStreamCreate(&mut raw, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Stream { raw, ctx })
    }

    /// The stream for kvio's calls.
    pub fn sref(&self) -> StreamRef<'_> {
        StreamRef {
            raw: self.raw,
            pdl: None,
            _life: PhantomData,
        }
    }

    /// The raw `CUstream`.
    pub fn cu_stream(&self) -> cu::CUstream {
        self.raw
    }

    /// Waits for everything enqueued so far.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a live stream.
        check("cuStreamSynchronize", unsafe {
            cu::cuStreamSynchronize(self.raw)
        })
    }

    /// Whether the driver reports the stream as non-blocking.
    pub fn is_non_blocking(&self) -> Result<bool> {
        let mut flags = 0u32;
        // SAFETY: a live stream; out-pointer to a local.
        check("cuStreamGetFlags", unsafe {
            cu::cuStreamGetFlags(self.raw, &mut flags)
        })?;
        Ok(flags & cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32 != 0)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let raw = self.raw;
        // SAFETY: created in ctx; the driver finishes queued work before releasing it.
        with_ctx(self.ctx, || unsafe {
            cu::cuStreamDestroy_v2(raw);
        });
    }
}

// SAFETY: a stream handle may be used from any thread with its context current.
unsafe impl Send for Stream {}
// SAFETY: enqueueing on one stream from several threads is thread-safe in the driver.
unsafe impl Sync for Stream {}

/// A CUDA event (timing enabled), for ordering work across streams and timing it on the GPU.
/// Destroyed on drop.
///
/// ```no_run
/// # fn main() -> kvio::Result<()> {
/// let _ctx = kvio::PrimaryContext::retain(0)?;
/// let (a, b) = (kvio::Stream::new()?, kvio::Stream::new()?);
/// let (start, done) = (kvio::Event::new()?, kvio::Event::new()?);
/// start.record(a.sref())?;
/// // ... kvio calls on `a` ...
/// done.record(a.sref())?;
/// done.wait_on(b.sref())?; // work enqueued on `b` from here on runs after it
/// done.synchronize()?;
/// println!("{} ms on the GPU", done.elapsed_ms(&start)?);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Event {
    raw: cu::CUevent,
    ctx: cu::CUcontext,
}

impl Event {
    /// A new event in the current context.
    pub fn new() -> Result<Self> {
        let ctx = current_context()?;
        let mut raw = ptr::null_mut();
        // SAFETY: out-pointer to a local; a context is current.
        check("cuEventCreate", unsafe { cu::cuEventCreate(&mut raw, 0) })?;
        Ok(Event { raw, ctx })
    }

    /// Records the event after the work enqueued on `stream` so far.
    pub fn record(&self, stream: StreamRef<'_>) -> Result<()> {
        // SAFETY: a live event and stream.
        check("cuEventRecord", unsafe {
            cu::cuEventRecord(self.raw, stream.cu_stream())
        })
    }

    /// Makes work enqueued on `stream` after this call wait for the event's last record
    /// (on the device; the host does not block).
    pub fn wait_on(&self, stream: StreamRef<'_>) -> Result<()> {
        // SAFETY: a live event and stream.
        check("cuStreamWaitEvent", unsafe {
            cu::cuStreamWaitEvent(stream.cu_stream(), self.raw, 0)
        })
    }

    /// Waits on the host for the event's last record.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a live event.
        check("cuEventSynchronize", unsafe {
            cu::cuEventSynchronize(self.raw)
        })
    }

    /// Milliseconds between `start`'s record and this event's (both completed).
    pub fn elapsed_ms(&self, start: &Event) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: live events; out-pointer to a local.
        check("cuEventElapsedTime", unsafe {
            cu::cuEventElapsedTime(&mut ms, start.raw, self.raw)
        })?;
        Ok(ms)
    }

    /// The raw `CUevent`.
    pub fn cu_event(&self) -> cu::CUevent {
        self.raw
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let raw = self.raw;
        // SAFETY: created in ctx.
        with_ctx(self.ctx, || unsafe {
            cu::cuEventDestroy_v2(raw);
        });
    }
}

// SAFETY: an event handle may be used from any thread with its context current.
unsafe impl Send for Event {}
// SAFETY: the driver's event calls are thread-safe.
unsafe impl Sync for Event {}

/// The context current on this thread, or [`Error::NoContext`].
///
/// ```no_run
/// # fn main() -> kvio::Result<()> {
/// let ctx = kvio::PrimaryContext::retain(0)?;
/// assert_eq!(kvio::current_context()?, ctx.cu_context());
/// # Ok(()) }
/// ```
pub fn current_context() -> Result<cu::CUcontext> {
    let mut ctx = ptr::null_mut();
    // SAFETY: out-pointer to a local.
    check("cuCtxGetCurrent", unsafe { cu::cuCtxGetCurrent(&mut ctx) })?;
    if ctx.is_null() {
        Err(Error::NoContext)
    } else {
        Ok(ctx)
    }
}

/// The device of the current context.
pub fn current_device() -> Result<cu::CUdevice> {
    current_context()?;
    let mut dev = 0;
    // SAFETY: out-pointer to a local; a context is current.
    check("cuCtxGetDevice", unsafe { cu::cuCtxGetDevice(&mut dev) })?;
    Ok(dev)
}

/// One integer attribute of a device.
///
/// ```no_run
/// # fn main() -> kvio::Result<()> {
/// use kvio::cust::sys::CUdevice_attribute as A;
/// let _ctx = kvio::PrimaryContext::retain(0)?;
/// let dev = kvio::current_device()?;
/// let sms = kvio::device_attribute(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
/// println!("{sms} SMs");
/// # Ok(()) }
/// ```
pub fn device_attribute(dev: cu::CUdevice, attr: cu::CUdevice_attribute) -> Result<i32> {
    let mut v = 0;
    // SAFETY: out-pointer to a local.
    check("cuDeviceGetAttribute", unsafe {
        cu::cuDeviceGetAttribute(&mut v, attr, dev)
    })?;
    Ok(v)
}

/// The primary context of a device, retained and made current on this thread; released on
/// drop. For programs that have no framework to create a context (tests, examples). Frameworks
/// (cudarc, candle, cust's `quick_init`) make their own current instead.
///
/// ```no_run
/// # fn main() -> kvio::Result<()> {
/// let ctx = kvio::PrimaryContext::retain(0)?; // current on this thread from here on
/// let kv = kvio::Kvio::load()?;
/// std::thread::scope(|s| {
///     s.spawn(|| {
///         ctx.make_current().unwrap(); // other threads make it current themselves
///         // ... launches through `kv` ...
///     });
/// });
/// # drop(kv); Ok(()) }
/// ```
#[derive(Debug)]
pub struct PrimaryContext {
    dev: cu::CUdevice,
    ctx: cu::CUcontext,
}

impl PrimaryContext {
    /// Initialises the driver, retains device `ordinal`'s primary context and makes it current.
    pub fn retain(ordinal: i32) -> Result<Self> {
        // SAFETY: plain driver calls with out-pointers to locals.
        unsafe {
            check("cuInit", cu::cuInit(0))?;
            let mut dev = 0;
            check("cuDeviceGet", cu::cuDeviceGet(&mut dev, ordinal))?;
            let mut ctx = ptr::null_mut();
            check(
                "cuDevicePrimaryCtxRetain",
                cu::cuDevicePrimaryCtxRetain(&mut ctx, dev),
            )?;
            check("cuCtxSetCurrent", cu::cuCtxSetCurrent(ctx))?;
            Ok(PrimaryContext { dev, ctx })
        }
    }

    /// Makes this context current on the calling thread.
    pub fn make_current(&self) -> Result<()> {
        // SAFETY: the context is retained while self lives.
        check("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(self.ctx) })
    }

    /// The raw context handle.
    pub fn cu_context(&self) -> cu::CUcontext {
        self.ctx
    }

    /// The raw device handle.
    pub fn cu_device(&self) -> cu::CUdevice {
        self.dev
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: balanced with the retain in `retain`.
        unsafe { cu::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

// SAFETY: a primary context may be made current and released from any thread.
unsafe impl Send for PrimaryContext {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for PrimaryContext {}

/// `CUmemLocation` (CUDA 12.8–13): a location kind and an id; all zero here (no hint: the
/// hints slowed batches of small copies down on the H200, see `BENCHMARKS.md`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MemLocation {
    kind: u32,
    id: i32,
}

/// `CUmemcpyAttributes` (CUDA 12.8–13).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MemcpyAttributes {
    src_access_order: u32,
    src_loc_hint: MemLocation,
    dst_loc_hint: MemLocation,
    flags: u32,
}

/// `CU_MEMCPY_SRC_ACCESS_ORDER_STREAM`: the source is read in stream order (the only order
/// that is safe for device-to-host copies of data the stream's earlier work writes, vLLM
/// #39306, and for host-to-device copies of what an earlier offload on the stream wrote).
const SRC_ACCESS_ORDER_STREAM: u32 = 1;

type BatchV12 = unsafe extern "C" fn(
    *mut u64,
    *mut u64,
    *mut usize,
    usize,
    *mut MemcpyAttributes,
    *mut usize,
    usize,
    *mut usize,
    cu::CUstream,
) -> cu::CUresult;
type BatchV13 = unsafe extern "C" fn(
    *mut u64,
    *mut u64,
    *mut usize,
    usize,
    *mut MemcpyAttributes,
    *mut usize,
    usize,
    cu::CUstream,
) -> cu::CUresult;

/// `cuMemcpyBatchAsync`, resolved at run time (`cuGetProcAddress`) in the ABI of the CUDA
/// version the driver reports: CUDA 12.8 and 12.9 take a `failIdx` out-parameter, CUDA 13
/// dropped it (vLLM #38915). `None` from [`MemcpyBatch::resolve`] on older drivers.
#[derive(Clone, Copy, Debug)]
pub(crate) enum MemcpyBatch {
    /// The CUDA 12.8 entry point.
    V12(BatchV12),
    /// The CUDA 13 entry point.
    V13(BatchV13),
}

impl MemcpyBatch {
    /// The driver's batched copy, if it has one.
    pub(crate) fn resolve() -> Option<MemcpyBatch> {
        let mut version = 0;
        // SAFETY: out-pointer to a local.
        if unsafe { cu::cuDriverGetVersion(&mut version) } != cu::CUresult::CUDA_SUCCESS {
            return None;
        }
        let abi = if version >= 13000 {
            13000
        } else if version >= 12080 {
            12080
        } else {
            return None;
        };
        let mut f: *mut std::os::raw::c_void = std::ptr::null_mut();
        // SAFETY: a NUL-terminated name and an out-pointer to a local.
        let r = unsafe { cu::cuGetProcAddress(c"cuMemcpyBatchAsync".as_ptr(), &mut f, abi, 0) };
        if r != cu::CUresult::CUDA_SUCCESS || f.is_null() {
            return None;
        }
        // SAFETY: the driver returned the entry point of the ABI of CUDA `abi`, whose
        // signature is the one named here (cuda.h of 12.8 and of 13.0).
        Some(unsafe {
            if abi == 13000 {
                MemcpyBatch::V13(std::mem::transmute::<*mut std::os::raw::c_void, BatchV13>(
                    f,
                ))
            } else {
                MemcpyBatch::V12(std::mem::transmute::<*mut std::os::raw::c_void, BatchV12>(
                    f,
                ))
            }
        })
    }

    /// Enqueues the copies on `stream` as one batch: stream-ordered as a
    /// whole, in no order inside (the spans of one call never overlap). `stream` must not be
    /// the legacy default stream.
    ///
    /// # Safety
    /// Every range is device or host memory the driver can reach, alive until the copies
    /// complete; no two ranges overlap.
    pub(crate) unsafe fn copy(&self, spans: &[Span], stream: cu::CUstream) -> Result<()> {
        // The driver takes three parallel arrays: on the stack up to 64 copies, one heap
        // allocation each beyond.
        let mut dsts: InlineVec<u64, 64> = InlineVec::with_capacity(spans.len());
        let mut srcs: InlineVec<u64, 64> = InlineVec::with_capacity(spans.len());
        let mut sizes: InlineVec<usize, 64> = InlineVec::with_capacity(spans.len());
        for s in spans {
            dsts.push(s.dst);
            srcs.push(s.src);
            sizes.push(s.bytes as usize);
        }
        let mut attrs = [MemcpyAttributes {
            src_access_order: SRC_ACCESS_ORDER_STREAM,
            ..Default::default()
        }];
        let mut idx = [0usize];
        let n = spans.len();
        // SAFETY: arrays of `n` entries (one attribute for all copies, from index 0), alive
        // for the call; the driver reads them before returning. Ranges: the caller's.
        let r = unsafe {
            match *self {
                MemcpyBatch::V12(f) => {
                    let mut fail = 0usize;
                    f(
                        dsts.as_mut_ptr(),
                        srcs.as_mut_ptr(),
                        sizes.as_mut_ptr(),
                        n,
                        attrs.as_mut_ptr(),
                        idx.as_mut_ptr(),
                        1,
                        &mut fail,
                        stream,
                    )
                }
                MemcpyBatch::V13(f) => f(
                    dsts.as_mut_ptr(),
                    srcs.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    n,
                    attrs.as_mut_ptr(),
                    idx.as_mut_ptr(),
                    1,
                    stream,
                ),
            }
        };
        check("cuMemcpyBatchAsync", r)
    }
}

/// `CUlaunchAttributeValue` (CUDA 12.0–13): a union of 64 bytes, 8-byte aligned (its
/// access-policy and event members hold pointers). kvio sets one `int` member at offset 0
/// (`programmaticStreamSerializationAllowed`).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union LaunchAttributeValue {
    pad: [u8; 64],
    int: i32,
    _align: u64,
}

/// `CUlaunchAttribute` (CUDA 12.0–13): `{ CUlaunchAttributeID id; char pad[4];
/// CUlaunchAttributeValue value; }`, 72 bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct LaunchAttribute {
    id: u32,
    pad: [u8; 4],
    value: LaunchAttributeValue,
}

/// `CUlaunchConfig` (CUDA 12.0–13): grid and block sizes, dynamic shared memory, stream,
/// attribute array; 56 bytes.
#[repr(C)]
pub(crate) struct LaunchConfig {
    grid_dim_x: u32,
    grid_dim_y: u32,
    grid_dim_z: u32,
    block_dim_x: u32,
    block_dim_y: u32,
    block_dim_z: u32,
    shared_mem_bytes: u32,
    stream: cu::CUstream,
    attrs: *mut LaunchAttribute,
    num_attrs: u32,
}

/// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` (cuda.h, CUDA 11.8–13).
const LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: u32 = 6;

/// The driver version from which kvio launches with programmatic dependent launch: CUDA 12.3
/// captures such launches into graphs as programmatic edges.
pub(crate) const PDL_MIN_DRIVER: i32 = 12030;

type LaunchKernelExFn = unsafe extern "C" fn(
    *const LaunchConfig,
    cu::CUfunction,
    *mut *mut c_void,
    *mut *mut c_void,
) -> cu::CUresult;

/// `cuLaunchKernelEx` (CUDA 12.0+; cust 0.3.2's bindings predate it), resolved at run time
/// with `cuGetProcAddress`. `None` from [`LaunchKernelEx::resolve`] on drivers older than
/// [`PDL_MIN_DRIVER`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaunchKernelEx(LaunchKernelExFn);

impl LaunchKernelEx {
    /// The driver's `cuLaunchKernelEx`, if the driver is recent enough for PDL in graphs.
    pub(crate) fn resolve() -> Option<LaunchKernelEx> {
        let mut version = 0;
        // SAFETY: out-pointer to a local.
        if unsafe { cu::cuDriverGetVersion(&mut version) } != cu::CUresult::CUDA_SUCCESS
            || version < PDL_MIN_DRIVER
        {
            return None;
        }
        let mut f: *mut c_void = ptr::null_mut();
        // SAFETY: a NUL-terminated name and an out-pointer to a local.
        let r = unsafe { cu::cuGetProcAddress(c"cuLaunchKernelEx".as_ptr(), &mut f, 12000, 0) };
        if r != cu::CUresult::CUDA_SUCCESS || f.is_null() {
            return None;
        }
        // SAFETY: the driver returned the CUDA 12.0 ABI of `cuLaunchKernelEx`, whose
        // signature (cuda.h of 12.0 through 13) is the one named here.
        Some(LaunchKernelEx(unsafe {
            std::mem::transmute::<*mut c_void, LaunchKernelExFn>(f)
        }))
    }
}

/// Whether `stream` is being captured into a CUDA graph (then kvio enqueues plain copies).
pub(crate) fn capturing(stream: cu::CUstream) -> Result<bool> {
    let mut status = cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: out-pointer to a local; the stream is the caller's live stream.
    check("cuStreamIsCapturing", unsafe {
        cu::cuStreamIsCapturing(stream, &mut status)
    })?;
    Ok(status != cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Kernel parameters packed into one buffer with the kernel ABI's layout (each parameter at
/// the next offset aligned to its size), passed to `cuLaunchKernel` through
/// `CU_LAUNCH_PARAM_BUFFER_POINTER`: the driver copies exactly `len` bytes from one buffer and
/// dereferences no per-parameter pointers.
pub(crate) struct Params {
    buf: ParamBytes,
    len: usize,
}

/// The packed parameter bytes as little-endian 8-byte words, 8-byte aligned like the kernel's
/// parameter space (every parameter sits at a multiple of its size, so none straddles a word).
struct ParamBytes([u64; 64]);

impl Params {
    /// Packs `words[i]` (little-endian, its low `sizes[i]` bytes: 1, 2, 4 or 8) at naturally
    /// aligned offsets.
    pub(crate) fn new(words: &[u64], sizes: &[usize]) -> Self {
        const { assert!(cfg!(target_endian = "little")) };
        assert_eq!(words.len(), sizes.len(), "one size per parameter");
        // Packed straight into the aligned buffer the driver reads (no second pass), a word at
        // a time: a parameter ORed into its word, with no division and no byte-slice copy.
        let mut buf = ParamBytes([0; 64]);
        let mut off = 0usize;
        for (&w, &size) in words.iter().zip(sizes) {
            assert!(matches!(size, 1 | 2 | 4 | 8), "parameter size {size}");
            off = (off + size - 1) & !(size - 1);
            let low = w & (u64::MAX >> (64 - 8 * size));
            buf.0[off / 8] |= low << (8 * (off % 8));
            off += size;
        }
        Params { buf, len: off }
    }

    /// The `i`-th 8-byte word of the packed buffer.
    #[cfg(test)]
    fn word(&self, i: usize) -> u64 {
        self.buf.0[i]
    }

    /// Launches `f` on `stream` with `grid` blocks of `block` threads (`cuLaunchKernel`).
    pub(crate) fn launch(
        &mut self,
        f: cu::CUfunction,
        grid: u32,
        block: u32,
        stream: StreamRef<'_>,
    ) -> Result<()> {
        self.launch_with(f, grid, block, stream, None)
    }

    /// Launches `f` on `stream` with `grid` blocks of `block` threads: through `ex`
    /// (`cuLaunchKernelEx`) with programmatic stream serialization when given, else through
    /// `cuLaunchKernel`. Only kernels that execute `griddepcontrol.wait` before touching
    /// memory may be given `ex`.
    pub(crate) fn launch_with(
        &mut self,
        f: cu::CUfunction,
        grid: u32,
        block: u32,
        stream: StreamRef<'_>,
        ex: Option<LaunchKernelEx>,
    ) -> Result<()> {
        // CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE, CU_LAUNCH_PARAM_END.
        let mut len = self.len;
        // The markers are the integers 1 and 2 (cuda.h), not addresses.
        const BUFFER_POINTER: *mut c_void = ptr::without_provenance_mut(1);
        const BUFFER_SIZE: *mut c_void = ptr::without_provenance_mut(2);
        let mut extra: [*mut c_void; 5] = [
            BUFFER_POINTER,
            self.buf.0.as_mut_ptr().cast(),
            BUFFER_SIZE,
            (&mut len as *mut usize).cast(),
            ptr::null_mut(),
        ];
        let extra_ptr = if self.len == 0 {
            ptr::null_mut()
        } else {
            extra.as_mut_ptr()
        };
        if let Some(LaunchKernelEx(launch_ex)) = ex {
            let mut attr = LaunchAttribute {
                id: LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value: LaunchAttributeValue { pad: [0; 64] },
            };
            attr.value.int = 1;
            let config = LaunchConfig {
                grid_dim_x: grid,
                grid_dim_y: 1,
                grid_dim_z: 1,
                block_dim_x: block,
                block_dim_y: 1,
                block_dim_z: 1,
                shared_mem_bytes: 0,
                stream: stream.cu_stream(),
                attrs: &mut attr,
                num_attrs: 1,
            };
            // SAFETY: as for `cuLaunchKernel` below; `config` and the one attribute it points
            // to are live locals of the CUDA 12/13 layouts, read by the driver before it
            // returns.
            return check("cuLaunchKernelEx", unsafe {
                launch_ex(&config, f, ptr::null_mut(), extra_ptr)
            });
        }
        // SAFETY: `f` is a loaded kernel whose parameters are exactly the packed buffer
        // (layout from its generated argument struct); the buffer and its size outlive the
        // call, which copies them before returning.
        check("cuLaunchKernel", unsafe {
            cu::cuLaunchKernel(
                f,
                grid,
                1,
                1,
                block,
                1,
                1,
                0,
                stream.cu_stream(),
                ptr::null_mut(),
                extra_ptr,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Params;

    #[test]
    fn params_pack_with_natural_alignment() {
        // u64, u32, u64, u32, u32 -> offsets 0, 8, 16, 24, 28; 32 bytes.
        let p = Params::new(&[0x1111_2222_3333_4444, 5, 6, 7, 8], &[8, 4, 8, 4, 4]);
        assert_eq!(p.len, 32);
        assert_eq!(p.word(0), 0x1111_2222_3333_4444);
        assert_eq!(p.word(1), 5);
        assert_eq!(p.word(2), 6);
        assert_eq!(p.word(3), 7 | (8 << 32));
        // a u32 followed by a u64 leaves a 4-byte hole
        let p = Params::new(&[u32::MAX as u64, 9], &[4, 8]);
        assert_eq!((p.len, p.word(0), p.word(1)), (16, u32::MAX as u64, 9));
        assert_eq!(Params::new(&[], &[]).len, 0);
        // Only a parameter's low `size` bytes are packed; 1- and 2-byte ones at their own
        // alignment: u8 at 0, u16 at 2, u8 at 4, u32 at 8, u8 at 12, u64 at 16.
        let p = Params::new(
            &[
                0xaaaa_bb01,
                0xcccc_0203,
                0xdd04,
                0xffff_ffff_0506_0708,
                0x1_09,
                u64::MAX,
            ],
            &[1, 2, 1, 4, 1, 8],
        );
        assert_eq!(p.len, 24);
        assert_eq!(p.word(0), 0x0000_0004_0203_0001);
        assert_eq!(p.word(1), 0x0000_0009_0506_0708);
        assert_eq!(p.word(2), u64::MAX);
    }

    #[test]
    fn launch_structs_have_the_cuda_12_and_13_layouts() {
        use super::{LaunchAttribute, LaunchAttributeValue, LaunchConfig};
        use std::mem::{align_of, offset_of, size_of};
        // cuda.h (12.0 through 13.x), x86-64 and aarch64.
        assert_eq!(
            (
                size_of::<LaunchAttributeValue>(),
                align_of::<LaunchAttributeValue>()
            ),
            (64, 8)
        );
        assert_eq!(
            (size_of::<LaunchAttribute>(), align_of::<LaunchAttribute>()),
            (72, 8)
        );
        assert_eq!(offset_of!(LaunchAttribute, id), 0);
        assert_eq!(offset_of!(LaunchAttribute, pad), 4);
        assert_eq!(offset_of!(LaunchAttribute, value), 8);
        assert_eq!(
            (size_of::<LaunchConfig>(), align_of::<LaunchConfig>()),
            (56, 8)
        );
        let offsets = [
            offset_of!(LaunchConfig, grid_dim_x),
            offset_of!(LaunchConfig, grid_dim_y),
            offset_of!(LaunchConfig, grid_dim_z),
            offset_of!(LaunchConfig, block_dim_x),
            offset_of!(LaunchConfig, block_dim_y),
            offset_of!(LaunchConfig, block_dim_z),
            offset_of!(LaunchConfig, shared_mem_bytes),
            offset_of!(LaunchConfig, stream),
            offset_of!(LaunchConfig, attrs),
            offset_of!(LaunchConfig, num_attrs),
        ];
        assert_eq!(offsets, [0, 4, 8, 12, 16, 20, 24, 32, 40, 48]);
        // The `int` member the attribute sets sits at the value's first byte.
        let mut v = LaunchAttributeValue { pad: [0; 64] };
        v.int = 1;
        // SAFETY: every member is plain bytes; `pad` covers the whole union.
        let bytes = unsafe { v.pad };
        assert_eq!(bytes[..4], 1i32.to_ne_bytes());
        assert!(bytes[4..].iter().all(|&b| b == 0));
    }

    /// The same layouts as cudarc's bindgen-generated ones (its `cuda-12080` bindings).
    #[cfg(feature = "cudarc")]
    #[test]
    fn launch_structs_match_cudarc() {
        use cudarc::driver::sys as c;
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(
            size_of::<super::LaunchAttributeValue>(),
            size_of::<c::CUlaunchAttributeValue>()
        );
        assert_eq!(
            align_of::<super::LaunchAttributeValue>(),
            align_of::<c::CUlaunchAttributeValue>()
        );
        assert_eq!(
            size_of::<super::LaunchAttribute>(),
            size_of::<c::CUlaunchAttribute>()
        );
        assert_eq!(
            offset_of!(super::LaunchAttribute, value),
            offset_of!(c::CUlaunchAttribute, value)
        );
        assert_eq!(
            size_of::<super::LaunchConfig>(),
            size_of::<c::CUlaunchConfig>()
        );
        assert_eq!(
            offset_of!(super::LaunchConfig, stream),
            offset_of!(c::CUlaunchConfig, hStream)
        );
        assert_eq!(
            offset_of!(super::LaunchConfig, attrs),
            offset_of!(c::CUlaunchConfig, attrs)
        );
        assert_eq!(
            offset_of!(super::LaunchConfig, num_attrs),
            offset_of!(c::CUlaunchConfig, numAttrs)
        );
        assert_eq!(
            c::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION as u32,
            super::LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        );
    }

    #[test]
    fn every_argument_list_fits_the_buffer() {
        use kvio_kernels::args::{CopyArgs, NaiveArgs, SliceArgs, SlotArgs, SpinArgs, TileArgs};
        for sizes in [
            &SlotArgs::SIZES[..],
            &TileArgs::SIZES[..],
            &SliceArgs::SIZES[..],
            &CopyArgs::SIZES[..],
            &NaiveArgs::SIZES[..],
            &SpinArgs::SIZES[..],
        ] {
            let p = Params::new(&vec![0; sizes.len()], sizes);
            assert!(p.len <= 8 * p.buf.0.len() && p.len <= 4096, "{sizes:?}");
        }
    }
}
