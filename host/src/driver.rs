//! Thin, checked wrappers over the CUDA driver API (`cust::sys`), and raw-handle types.
//!
//! kvio runs in the caller's current context and on the caller's streams: it never creates a
//! context or a stream of its own, so memory and streams owned by cust, cudarc or candle work.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr;

use cust::sys as cu;

use crate::error::{Error, Result};

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

/// A borrowed CUDA stream: kvio enqueues work on it and never synchronises it.
///
/// Make one from any framework's raw `CUstream` with [`StreamRef::from_raw`], or from a cust
/// stream with [`StreamRef::from_cust`].
#[derive(Clone, Copy, Debug)]
pub struct StreamRef<'a> {
    raw: cu::CUstream,
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
            _life: PhantomData,
        }
    }

    /// Borrows a cust stream.
    pub fn from_cust(stream: &'a cust::stream::Stream) -> Self {
        StreamRef {
            raw: stream.as_inner(),
            _life: PhantomData,
        }
    }

    /// The raw `CUstream`.
    pub fn cu_stream(&self) -> cu::CUstream {
        self.raw
    }
}

/// The context current on this thread, or [`Error::NoContext`].
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

/// Kernel parameters for `cuLaunchKernel`: each value sits in its own 8-byte slot. A `u32`
/// parameter reads the first 4 bytes of its slot, which on little-endian hosts hold the value.
pub(crate) struct Params<const N: usize> {
    vals: [u64; N],
}

impl<const N: usize> Params<N> {
    pub(crate) fn new(vals: [u64; N]) -> Self {
        const { assert!(cfg!(target_endian = "little")) };
        Params { vals }
    }

    /// Launches `f` on `stream` with `grid` blocks of `block` threads.
    pub(crate) fn launch(
        &mut self,
        f: cu::CUfunction,
        grid: u32,
        block: u32,
        stream: StreamRef<'_>,
    ) -> Result<()> {
        let mut ptrs: [*mut c_void; N] = [ptr::null_mut(); N];
        for (p, v) in ptrs.iter_mut().zip(self.vals.iter_mut()) {
            *p = v as *mut u64 as *mut c_void;
        }
        // SAFETY: `f` is a loaded kernel whose parameter list has N entries of the sizes the
        // launcher encoded; the pointers point at live slots for the duration of the call
        // (the driver copies the values before returning).
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
                ptrs.as_mut_ptr(),
                ptr::null_mut(),
            )
        })
    }
}
