//! Set-up-time allocations: device memory, pinned host pools (allocated or registered), and
//! per-layer pointer tables. These synchronise and allocate; create them once, not per step.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU8, Ordering};

use cust::sys as cu;

use crate::driver::{check, current_context, settle_legacy, sync_context, with_ctx, StreamRef};
#[cfg(doc)]
use crate::error::Error;
use crate::error::{invalid, Result};
use crate::mem::{DeviceBytes, DeviceBytesMut};

/// Device memory owned by kvio (for example a cross-layer cache). Dropping it waits for all
/// work in its context, then frees it: no view of it can be in use by then.
///
/// ```no_run
/// # fn main() -> kvio::Result<()> {
/// let _ctx = kvio::PrimaryContext::retain(0)?;
/// let (blocks, layers, bs, h, d) = (64, 32, 16, 8, 128);
/// let mut mem = kvio::DeviceAlloc::new(blocks * layers * 2 * bs * h * d * 2)?; // uninitialised
/// let pool = kvio::BlockPool::cross_layer_nhd(mem.bytes_mut(), blocks, layers, bs, h, d, 2);
/// assert_eq!(pool.layers, layers);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct DeviceAlloc {
    pub(crate) ptr: u64,
    len: usize,
    ctx: cu::CUcontext,
}

impl DeviceAlloc {
    /// Allocates `len` bytes (uninitialised) in the current context.
    pub fn new(len: usize) -> Result<Self> {
        let ctx = current_context()?;
        if len == 0 {
            return Err(invalid("len", len, "allocation of zero bytes"));
        }
        let mut ptr = 0;
        // SAFETY: out-pointer to a local; a context is current.
        check("cuMemAlloc", unsafe { cu::cuMemAlloc_v2(&mut ptr, len) })?;
        Ok(DeviceAlloc { ptr, len, ctx })
    }

    /// A view of the whole allocation for calls that read it.
    pub fn bytes(&self) -> DeviceBytes<'_> {
        // SAFETY: device memory of `len` bytes, borrowed; drop waits for work using it.
        unsafe { DeviceBytes::from_raw(self.ptr, self.len) }
    }

    /// A view of the whole allocation for calls that write it.
    pub fn bytes_mut(&mut self) -> DeviceBytesMut<'_> {
        // SAFETY: device memory of `len` bytes, exclusively borrowed; drop waits for work.
        unsafe { DeviceBytesMut::from_raw(self.ptr, self.len) }
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the allocation is empty (never: zero-byte allocations are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes `offset..offset + len` of the allocation, or [`Error::BufferTooSmall`].
    fn range(&self, offset: usize, len: usize) -> Result<u64> {
        self.bytes().slice(offset, len).map(|v| v.ptr())
    }

    /// Copies `data` to byte `offset` of the allocation, ordered on `stream` after the work
    /// enqueued there so far. `data` is staged by the driver before this returns, so it may be
    /// reused at once; the host does not wait for the copy itself.
    ///
    /// ```no_run
    /// # fn main() -> kvio::Result<()> {
    /// let _ctx = kvio::PrimaryContext::retain(0)?;
    /// let stream = kvio::Stream::new()?;
    /// let mut mem = kvio::DeviceAlloc::new(4096)?;
    /// mem.write(0, &[7u8; 4096], stream.sref())?;
    /// let mut back = vec![0u8; 16];
    /// mem.read(100, &mut back, stream.sref())?; // waits for the stream, then copies
    /// assert_eq!(back, [7u8; 16]);
    /// # Ok(()) }
    /// ```
    pub fn write(&mut self, offset: usize, data: &[u8], stream: StreamRef<'_>) -> Result<()> {
        let at = self.range(offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: `at..at + data.len()` lies in this live allocation; the driver copies the
        // pageable source before returning.
        check("cuMemcpyHtoDAsync", unsafe {
            cu::cuMemcpyHtoDAsync_v2(at, data.as_ptr().cast(), data.len(), stream.cu_stream())
        })
    }

    /// Copies `out.len()` bytes from byte `offset` of the allocation into `out` once the work
    /// enqueued on `stream` so far is done; returns when `out` holds them (this waits).
    pub fn read(&self, offset: usize, out: &mut [u8], stream: StreamRef<'_>) -> Result<()> {
        let at = self.range(offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        // SAFETY: the range lies in this live allocation and `out` is exclusively borrowed;
        // the stream synchronisation returns after the copy has landed.
        unsafe {
            check(
                "cuMemcpyDtoHAsync",
                cu::cuMemcpyDtoHAsync_v2(
                    out.as_mut_ptr().cast(),
                    at,
                    out.len(),
                    stream.cu_stream(),
                ),
            )?;
            check(
                "cuStreamSynchronize",
                cu::cuStreamSynchronize(stream.cu_stream()),
            )
        }
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        // Work enqueued with a view of this allocation may still run: wait for it (a drop is
        // a set-up-time event; the views' borrows have ended, the work need not have).
        let _ = sync_context(self.ctx);
        // SAFETY: allocated by cuMemAlloc in ctx; nothing uses it any more.
        with_ctx(self.ctx, || unsafe {
            cu::cuMemFree_v2(self.ptr);
        });
    }
}

// SAFETY: a device allocation may be used and freed from any thread.
unsafe impl Send for DeviceAlloc {}
// SAFETY: &self only hands out the address.
unsafe impl Sync for DeviceAlloc {}

/// Page-locked host memory mapped into the device's address space: a host KV pool that both
/// the copy engines (DMA) and kernels (SM loads/stores over PCIe/NVLink-C2C) can reach.
/// Either allocated by kvio or the caller's own memory registered in place.
///
/// Host access cannot race a transfer: the host-side accessors first wait for the work in the
/// pool's context if a view was handed out since the last wait ([`PinnedHost::as_slice`] if a
/// write view was, [`PinnedHost::as_mut_slice`] if any view was), and while a host slice is
/// borrowed no view can be taken. Dropping the pool waits the same way before freeing it. The
/// memory is pinned for its own context only (not `PORTABLE`), so no other context's work
/// escapes that wait.
///
/// ```no_run
/// # fn main() -> kvio::Result<()> {
/// let _ctx = kvio::PrimaryContext::retain(0)?;
/// let mut pool = kvio::PinnedHost::alloc(64 << 20)?;
/// pool.as_mut_slice()?.fill(0); // nothing in flight: no wait
/// assert_eq!(kvio::memory_kind(pool.bytes().ptr()), kvio::MemoryKind::PinnedHost);
/// // Memory the program already owns, pinned and mapped in place:
/// let mut mine = vec![0u8; 1 << 20];
/// // SAFETY: `mine` outlives `registered` and every transfer using it.
/// let registered = unsafe { kvio::PinnedHost::register(mine.as_mut_ptr(), mine.len())? };
/// assert_eq!(registered.as_slice()?.len(), 1 << 20);
/// # Ok(()) }
/// ```
///
/// A host slice cannot be held while a write view exists (the transfer the view is for could
/// land under it):
///
/// ```compile_fail,E0502
/// # fn main() -> kvio::Result<()> {
/// let mut pool = kvio::PinnedHost::alloc(4096)?;
/// let seen = pool.as_slice()?;
/// let dst = pool.bytes_mut(); // e.g. the destination pool of an offload
/// println!("{} {}", seen[0], dst.len());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PinnedHost {
    host: *mut u8,
    dev: u64,
    len: usize,
    registered: bool,
    ctx: cu::CUcontext,
    /// Views handed out since the last wait ([`READ_VIEW`], [`WRITE_VIEW`] bits).
    lent: AtomicU8,
}

/// A read view of a [`PinnedHost`] was handed out since its last wait.
const READ_VIEW: u8 = 1;
/// A write view of a [`PinnedHost`] was handed out since its last wait.
const WRITE_VIEW: u8 = 2;

impl PinnedHost {
    /// Allocates `len` bytes of pinned, device-mapped host memory.
    pub fn alloc(len: usize) -> Result<Self> {
        let ctx = current_context()?;
        if len == 0 {
            return Err(invalid("len", len, "allocation of zero bytes"));
        }
        let mut host: *mut c_void = ptr::null_mut();
        // SAFETY: out-pointer to a local; a context is current.
        check("cuMemHostAlloc", unsafe {
            cu::cuMemHostAlloc(&mut host, len, cu::CU_MEMHOSTALLOC_DEVICEMAP)
        })?;
        let mut this = PinnedHost {
            host: host.cast(),
            dev: 0,
            len,
            registered: false,
            ctx,
            lent: AtomicU8::new(0),
        };
        this.dev = device_pointer(host)?;
        Ok(this)
    }

    /// Pins and maps memory the caller already owns (`cuMemHostRegister`); unregistered on
    /// drop.
    ///
    /// # Safety
    /// `host..host + len` must be valid, writable host memory that outlives the returned value,
    /// must not be registered already, and must be accessed only through the returned value
    /// while it lives.
    pub unsafe fn register(host: *mut u8, len: usize) -> Result<Self> {
        let ctx = current_context()?;
        if len == 0 || host.is_null() {
            return Err(invalid("len", len, "registering an empty or null range"));
        }
        // SAFETY: the caller guarantees the range is valid host memory.
        check("cuMemHostRegister", unsafe {
            cu::cuMemHostRegister_v2(host.cast(), len, cu::CU_MEMHOSTREGISTER_DEVICEMAP)
        })?;
        let mut this = PinnedHost {
            host,
            dev: 0,
            len,
            registered: true,
            ctx,
            lent: AtomicU8::new(0),
        };
        this.dev = device_pointer(host.cast())?;
        Ok(this)
    }

    /// The device-side view for calls that read the pool (the source of an onload).
    pub fn bytes(&self) -> DeviceBytes<'_> {
        self.lent.fetch_or(READ_VIEW, Ordering::AcqRel);
        // SAFETY: mapped pinned memory of `len` bytes, reachable from the device at `dev`,
        // borrowed; host writes (`as_mut_slice`) and drop wait for work using it.
        unsafe { DeviceBytes::from_raw(self.dev, self.len) }
    }

    /// The device-side view for calls that write the pool (the destination of an offload).
    pub fn bytes_mut(&mut self) -> DeviceBytesMut<'_> {
        *self.lent.get_mut() |= WRITE_VIEW;
        // SAFETY: as above, exclusively borrowed; host access and drop wait for work.
        unsafe { DeviceBytesMut::from_raw(self.dev, self.len) }
    }

    /// Waits for the pool's context if a view in `mask` was handed out since the last wait.
    fn settle(&self, mask: u8) -> Result<()> {
        if self.lent.load(Ordering::Acquire) & mask != 0 {
            sync_context(self.ctx)?;
            // Only views taken before the wait are covered; new read views may be taken
            // concurrently (shared borrows), write views cannot (they need `&mut self`).
            self.lent.fetch_and(!mask, Ordering::AcqRel);
        }
        Ok(())
    }

    /// The host-side bytes, once no transfer writing them can be in flight: if a write view
    /// was handed out since the last wait, this waits for all work in the pool's context.
    pub fn as_slice(&self) -> Result<&[u8]> {
        self.settle(WRITE_VIEW)?;
        // SAFETY: the wait above covers every write view taken so far, and none can be taken
        // while the returned shared borrow lives.
        Ok(unsafe { self.as_slice_unchecked() })
    }

    /// Mutable host-side bytes, once no transfer using them can be in flight: if any view was
    /// handed out since the last wait, this waits for all work in the pool's context.
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        self.settle(READ_VIEW | WRITE_VIEW)?;
        // SAFETY: every view taken so far is waited for; none can be taken while the
        // exclusive borrow lives.
        Ok(unsafe { self.as_mut_slice_unchecked() })
    }

    /// The host-side bytes without waiting (when the caller has ordered the transfers itself,
    /// e.g. synchronised the stream that wrote them).
    ///
    /// # Safety
    /// No work writing the pool may be in flight while the slice lives.
    pub unsafe fn as_slice_unchecked(&self) -> &[u8] {
        // SAFETY: `len` bytes of valid host memory owned or registered by self; the caller
        // excludes concurrent device writes.
        unsafe { std::slice::from_raw_parts(self.host, self.len) }
    }

    /// Mutable host-side bytes without waiting.
    ///
    /// # Safety
    /// No work reading or writing the pool may be in flight while the slice lives.
    pub unsafe fn as_mut_slice_unchecked(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed; the caller excludes concurrent device access.
        unsafe { std::slice::from_raw_parts_mut(self.host, self.len) }
    }
}

/// The device address of mapped host memory.
fn device_pointer(host: *mut c_void) -> Result<u64> {
    let mut dev = 0;
    // SAFETY: `host` is pinned and mapped (just allocated/registered with DEVICEMAP).
    check("cuMemHostGetDevicePointer", unsafe {
        cu::cuMemHostGetDevicePointer_v2(&mut dev, host, 0)
    })?;
    Ok(dev)
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        // As `DeviceAlloc`: work enqueued with a view may still run.
        if *self.lent.get_mut() != 0 {
            let _ = sync_context(self.ctx);
        }
        let (host, registered) = (self.host, self.registered);
        // SAFETY: allocated by cuMemHostAlloc / registered by cuMemHostRegister in ctx.
        with_ctx(self.ctx, || unsafe {
            if registered {
                cu::cuMemHostUnregister(host.cast());
            } else {
                cu::cuMemFreeHost(host.cast());
            }
        });
    }
}

// SAFETY: pinned memory may be used and freed from any thread.
unsafe impl Send for PinnedHost {}
// SAFETY: shared access only reads the handle; host-side access follows Rust borrows.
unsafe impl Sync for PinnedHost {}

/// What kind of memory an address is, as the driver sees it.
///
/// ```no_run
/// # fn main() -> kvio::Result<()> {
/// use kvio::{memory_kind, MemoryKind};
/// let _ctx = kvio::PrimaryContext::retain(0)?;
/// let pageable = vec![0u8; 4096];
/// assert_eq!(memory_kind(pageable.as_ptr() as u64), MemoryKind::Unregistered);
/// let dev = kvio::DeviceAlloc::new(4096)?;
/// assert_eq!(memory_kind(dev.bytes().ptr()), MemoryKind::Device);
/// # Ok(()) }
/// ```
///
/// Non-exhaustive: later kvio versions may tell more kinds apart (match with a wildcard arm).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    /// Device memory.
    Device,
    /// Pinned (page-locked, registered) host memory.
    PinnedHost,
    /// Managed or other memory kvio does not classify.
    Other,
    /// Not known to the driver: ordinary pageable host memory (or garbage).
    Unregistered,
}

/// Classifies an address with `cuPointerGetAttribute`.
pub fn memory_kind(ptr: u64) -> MemoryKind {
    let mut kind: u32 = 0;
    let mut attr = cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    let mut data: *mut std::ffi::c_void = (&mut kind as *mut u32).cast();
    // SAFETY: one attribute, its out-pointer a local u32 (a CUmemorytype). Unlike
    // cuPointerGetAttribute, the plural call reports an unknown pointer as type 0 instead of
    // failing, so checking pageable memory raises no driver error.
    let r = unsafe { cu::cuPointerGetAttributes(1, &mut attr, &mut data, ptr) };
    if r != cu::CUresult::CUDA_SUCCESS {
        return MemoryKind::Unregistered;
    }
    match kind {
        0 => MemoryKind::Unregistered,
        k if k == cu::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 => MemoryKind::Device,
        k if k == cu::CUmemorytype::CU_MEMORYTYPE_HOST as u32 => MemoryKind::PinnedHost,
        _ => MemoryKind::Other,
    }
}

/// A device-resident table of per-layer cache base pointers (`layers × parts` entries, layer
/// major: entry `l * parts + p`), so one launch reaches every layer of a layer-separate cache.
///
/// The table holds write views of its caches ([`DeviceBytesMut`]), so the caches stay
/// exclusively borrowed for its lifetime `'a`: neither dropped nor touched from the host while
/// a block copy could use them. Caches a framework owns enter through
/// [`DeviceBytesMut::from_raw`] (`unsafe`: the caller keeps them alive).
///
/// ```no_run
/// # fn main() -> kvio::Result<()> {
/// use kvio::{BlockPool, DeviceAlloc, LayerTable, PagedLayout};
/// let _ctx = kvio::PrimaryContext::retain(0)?;
/// let (layers, blocks, bs, h, d) = (4, 128, 16, 8, 128);
/// let layout = PagedLayout::nhd(blocks, bs, h, d, 2);
/// let bytes = layout.extent("layout")? as usize;
/// // One K and one V cache per layer, anywhere in memory (e.g. a framework's tensors).
/// let mut caches: Vec<DeviceAlloc> = (0..2 * layers).map(|_| DeviceAlloc::new(bytes)).collect::<kvio::Result<_>>()?;
/// let views: Vec<_> = caches.iter_mut().map(DeviceAlloc::bytes_mut).collect(); // L0 K, L0 V, L1 K, ...
/// let table = LayerTable::new(&views, 2)?;
/// let pool = BlockPool::layer_separate(&table, layout);
/// assert_eq!((pool.layers, pool.parts), (layers, 2));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LayerTable<'a> {
    table: DeviceAlloc,
    entries: Vec<DeviceBytesMut<'a>>,
    /// Host copy of the uploaded bases (what the DMA planner addresses with).
    bases: Vec<u64>,
    parts: usize,
    /// What the entries are, classified once here rather than on every launch.
    access: TableAccess,
    /// Facts of the entries each block copy checks, computed once here rather than per call:
    /// the bases in address order, the smallest gap between consecutive ones (`u64::MAX` for
    /// one entry), the shortest view and the OR of all bases (their common alignment).
    sorted: Vec<u64>,
    min_gap: u64,
    min_len: usize,
    bases_or: u64,
}

/// The memory kind of a table's entries, as one verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TableAccess {
    /// All device memory.
    Device,
    /// Device or pinned host memory, at least one pinned.
    WithHost,
    /// This entry's address is neither (kernels cannot reach it).
    Unreachable(u64),
}

impl<'a> LayerTable<'a> {
    /// Uploads the base pointers of `caches` (`layers × parts` views, layer major). Every view
    /// must be at least as long as the layout later used with it (checked at each call).
    /// Synchronous: a set-up-time call.
    pub fn new(caches: &[DeviceBytesMut<'a>], parts: usize) -> Result<Self> {
        if parts == 0 || caches.is_empty() || !caches.len().is_multiple_of(parts) {
            return Err(invalid(
                "caches",
                (caches.len(), parts),
                "need layers × parts views",
            ));
        }
        let ptrs: Vec<u64> = caches.iter().map(DeviceBytesMut::ptr).collect();
        let table = DeviceAlloc::new(ptrs.len() * 8)?;
        // SAFETY: table holds ptrs.len() u64; synchronous copy from a live host vector.
        check("cuMemcpyHtoD", unsafe {
            cu::cuMemcpyHtoD_v2(table.ptr, ptrs.as_ptr().cast(), ptrs.len() * 8)
        })?;
        settle_legacy()?;
        let mut access = TableAccess::Device;
        for e in caches {
            match memory_kind(e.ptr()) {
                MemoryKind::Device => {}
                MemoryKind::PinnedHost => access = TableAccess::WithHost,
                _ => {
                    access = TableAccess::Unreachable(e.ptr());
                    break;
                }
            }
        }
        let mut sorted = ptrs.clone();
        sorted.sort_unstable();
        let min_gap = sorted
            .windows(2)
            .map(|w| w[1] - w[0])
            .min()
            .unwrap_or(u64::MAX);
        Ok(LayerTable {
            table,
            entries: caches.to_vec(),
            bases_or: ptrs.iter().fold(0, |a, &p| a | p),
            min_len: caches.iter().map(DeviceBytesMut::len).min().unwrap_or(0),
            bases: ptrs,
            parts,
            access,
            sorted,
            min_gap,
        })
    }

    /// Number of layers.
    pub fn layers(&self) -> usize {
        self.entries.len() / self.parts
    }

    /// Parts per layer (2 for K and V).
    pub fn parts(&self) -> usize {
        self.parts
    }

    /// The views the table points at (host copy).
    pub fn entries(&self) -> &[DeviceBytesMut<'a>] {
        &self.entries
    }

    /// The bases the device table holds, in its order (host copy).
    pub(crate) fn bases(&self) -> &[u64] {
        &self.bases
    }

    /// Device address of the table.
    pub fn ptr(&self) -> u64 {
        self.table.ptr
    }

    /// The entries' memory kind, classified at construction.
    pub(crate) fn access(&self) -> TableAccess {
        self.access
    }

    /// Shortest view in the table.
    pub(crate) fn min_len(&self) -> usize {
        self.min_len
    }

    /// The bases in address order.
    pub(crate) fn sorted_bases(&self) -> &[u64] {
        &self.sorted
    }

    /// Smallest distance between two bases in address order (`u64::MAX` with one entry):
    /// caches of `ext` bytes overlap exactly when it is less than `ext`.
    pub(crate) fn min_gap(&self) -> u64 {
        self.min_gap
    }

    /// The OR of all bases: the largest power of two dividing them all is its lowest set bit.
    pub(crate) fn bases_or(&self) -> u64 {
        self.bases_or
    }
}
