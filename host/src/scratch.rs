//! The runner's scratch memory: a stream-ordered memory pool of kvio's own, for uploading host
//! block maps when the caller gives no staging buffer. Each use takes memory on the launch's
//! stream and gives it back on the same stream after the launch, so concurrent streams never
//! share bytes; the pool keeps what it reserved (release threshold: never), so after the
//! first calls no use reaches the driver's allocator or synchronises.

use std::ptr;

use cust::sys as cu;

use crate::driver::{check, with_ctx, StreamRef};
use crate::error::Result;

/// A memory pool on one device, destroyed on drop.
#[derive(Debug)]
pub(crate) struct Scratch {
    pool: cu::CUmemoryPool,
    ctx: cu::CUcontext,
}

impl Scratch {
    /// A pool on `dev` (in the current context `ctx`), or `None` where the device has no
    /// stream-ordered memory pools.
    pub(crate) fn new(ctx: cu::CUcontext, dev: cu::CUdevice) -> Result<Option<Self>> {
        let supported = crate::driver::device_attribute(
            dev,
            cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        )?;
        if supported == 0 {
            return Ok(None);
        }
        // SAFETY: a zeroed props struct is the driver's documented default apart from the
        // fields set below.
        let mut props: cu::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        props.location = cu::CUmemLocation {
            type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: dev,
        };
        let mut pool = ptr::null_mut();
        // SAFETY: out-pointer to a local, props fully initialised.
        check("cuMemPoolCreate", unsafe {
            cu::cuMemPoolCreate(&mut pool, &props)
        })?;
        let this = Scratch { pool, ctx };
        let mut keep = u64::MAX;
        // SAFETY: a live pool; the attribute takes a u64 (cuuint64_t).
        check("cuMemPoolSetAttribute", unsafe {
            cu::cuMemPoolSetAttribute(
                pool,
                cu::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )
        })?;
        Ok(Some(this))
    }

    /// `bytes` of device memory usable by work enqueued on `stream` after this call.
    pub(crate) fn take(&self, bytes: usize, stream: StreamRef<'_>) -> Result<u64> {
        let mut ptr = 0;
        // SAFETY: out-pointer to a local; a live pool of the stream's device.
        check("cuMemAllocFromPoolAsync", unsafe {
            cu::cuMemAllocFromPoolAsync(&mut ptr, bytes, self.pool, stream.cu_stream())
        })?;
        Ok(ptr)
    }

    /// Gives `ptr` (from [`Scratch::take`] on the same stream) back once the work enqueued on
    /// `stream` so far is done.
    pub(crate) fn give_back(&self, ptr: u64, stream: StreamRef<'_>) -> Result<()> {
        // SAFETY: `ptr` came from this pool; the free is ordered after the stream's work.
        check("cuMemFreeAsync", unsafe {
            cu::cuMemFreeAsync(ptr, stream.cu_stream())
        })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let pool = self.pool;
        // SAFETY: created in ctx; the driver defers the release of memory still in use.
        with_ctx(self.ctx, || unsafe {
            cu::cuMemPoolDestroy(pool);
        });
    }
}
