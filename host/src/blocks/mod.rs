//! Block copies: whole KV blocks between two pools, inside one GPU (copy-on-write,
//! defragmentation), GPU → pinned host (offload) and pinned host → GPU (onload), converting
//! between layouts on the way. One call, [`Kvio::copy_blocks`], covers every direction: what
//! differs is only where the two [`BlockPool`]s live and how they are laid out.
//!
//! Two backends move the bytes:
//! - [`Backend::Dma`]: the copy engines: the contiguous spans (runs of consecutive block ids
//!   merged into one) as one `cuMemcpyBatchAsync` on drivers of CUDA 12.8 and later
//!   ([`Kvio::batched_dma`]), else one `cuMemcpyAsync` per span. Needs a host-side block map.
//! - [`Backend::Kernel`]: SM threads load and store both pools directly (pinned host memory is
//!   mapped into the device's address space), a few CTAs only when host memory is involved
//!   ([`DEFAULT_TRANSFER_CTAS`]). With a device-resident block map it allocates nothing and
//!   never synchronises: it can be captured in a CUDA graph.
//! - [`Backend::Tma`] (opt-in, `sm_90`): the kernel backend's launch, but its SM threads move
//!   the bytes with Hopper bulk copies (`cp.async.bulk`) through shared memory; copies that
//!   are not 16-byte aligned, and GPUs before `sm_90`, run [`Backend::Kernel`] instead.
//!
//! [`Backend::Auto`] picks the kernel, except for transfers between host and device whose
//! contiguous span is at least [`DMA_MIN_SPAN_BATCHED`] when the driver batches the copies
//! ([`Kvio::batched_dma`]), or [`DMA_MIN_SPAN`] when it does not. The thresholds are measured
//! crossovers (`BENCHMARKS.md`). A host block map reaches the kernel through the caller's `staging`
//! buffer or, without one, through kvio's own stream-ordered scratch memory; either way the
//! call returns the backend that ran.
//!
//! The modules follow the data: [`BlockPool`] descriptors (`pool`), block maps (`map`), the
//! planner (`plan`: validation, geometry, backend choice, kernel launch) and the DMA spans
//! (`dma`).

pub(crate) mod dma;
pub(crate) mod map;
pub(crate) mod plan;
mod pool;
#[cfg(test)]
pub(crate) mod test_pools;

pub use crate::launch::{DEFAULT_TMA_TRANSFER_CTAS, DEFAULT_TRANSFER_CTAS};
pub use map::BlockMap;
pub(crate) use plan::plan;
pub use pool::{Bases, BlockPool, PoolMemory, ReadOnly, Writable};

use crate::driver::StreamRef;
use crate::error::Result;
use crate::error_word::DeviceErrors;
use crate::mem::DeviceBytesMut;
use crate::module::Kvio;

/// Contiguous span (bytes) from which [`Backend::Auto`] prefers the copy engines for transfers
/// between host and device (measured crossover on an H200: below it the kernel backend on its
/// default CTA budget moves more bytes per second). The span is what one block contributes in
/// one piece, both pools' layouts considered (a whole cross-layer block, or one layer's K of a
/// block), whatever runs of consecutive block ids the DMA backend would then merge.
pub const DMA_MIN_SPAN: usize = 2 << 20;

/// [`DMA_MIN_SPAN`] for drivers that take a call's copies as one batch
/// ([`Kvio::batched_dma`]): from 64 KiB per copy the batched copy engines reach 95–97% of the
/// pinned link on an H200 (the kernel backend 92–94% on its default CTAs), with no SM.
pub const DMA_MIN_SPAN_BATCHED: usize = 64 << 10;

/// How the bytes move.
///
/// ```
/// use kvio::{blocks::DMA_MIN_SPAN, Backend};
/// // `Auto` uses the copy engines for host transfers of long contiguous spans, SM threads
/// // otherwise.
/// let cross_layer_block_16 = 32 * 2 * 16 * 8 * 128 * 2; // a whole 32-layer block: 2 MiB
/// assert!(cross_layer_block_16 >= DMA_MIN_SPAN); // DMA
/// let layer_page_16 = 16 * 8 * 128 * 2; // one layer's K of a 16-token page: 32 KiB
/// assert!(layer_page_16 < DMA_MIN_SPAN); // the kernel backend
/// # let _ = Backend::Auto;
/// ```
///
/// Non-exhaustive: later kvio versions may add backends (match with a wildcard arm).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The kernel, except DMA for host transfers with contiguous spans of at least
    /// [`DMA_MIN_SPAN`] bytes (and for a host map without staging on a device without
    /// memory pools).
    Auto,
    /// Copy engines: the contiguous spans of a call as one batched copy
    /// (`cuMemcpyBatchAsync`, stream-ordered, on drivers of CUDA 12.8 and later; see
    /// [`Kvio::batched_dma`]), else one async copy per span.
    Dma,
    /// SM threads.
    Kernel,
    /// SM threads issuing Hopper bulk copies (`cp.async.bulk`, the TMA unit) through shared
    /// memory: the `sm_90` entry point `kvio_transfer_blocks_tma` (one-warp CTAs, each lane
    /// pipelining pieces of up to 8 KiB through five shared stages), meant for transfers
    /// between device and pinned host memory. A CTA here is one warp: the default budget is
    /// [`DEFAULT_TMA_TRANSFER_CTAS`] (four times [`DEFAULT_TRANSFER_CTAS`]) when a pool
    /// is host memory, the whole GPU otherwise, and `max_ctas` counts one-warp CTAs. Where it
    /// does not apply (a GPU before `sm_90`, a copy whose chunks, strides or bases are not all
    /// multiples of 16 bytes, or a conversion to or from vLLM's v0 layout) the call runs as
    /// [`Backend::Kernel`] and returns that. Never chosen by [`Backend::Auto`]. The CPU
    /// emulation ([`crate::emulate::copy_blocks`]) runs its item schedule with plain copies.
    ///
    /// ```
    /// use kvio::{Backend, BlockCopy, BlockMap, BlockPool, DeviceBytes, DeviceBytesMut};
    /// let (nb, l, bs, h, d) = (4, 2, 16, 2, 64); // bf16-sized elements: 16-byte aligned
    /// let src: Vec<u16> = (0..nb * l * 2 * bs * h * d).map(|x| x as u16).collect();
    /// let mut dst = vec![0u16; src.len()];
    /// // SAFETY: host memory, used by the emulation only.
    /// let (s, t) = unsafe {
    ///     (
    ///         DeviceBytes::from_raw(src.as_ptr() as u64, src.len() * 2),
    ///         DeviceBytesMut::from_raw(dst.as_mut_ptr() as u64, dst.len() * 2),
    ///     )
    /// };
    /// let op = BlockCopy::new(
    ///     BlockPool::cross_layer_nhd(s, nb, l, bs, h, d, 2),
    ///     BlockPool::cross_layer_nhd(t, nb, l, bs, h, d, 2),
    ///     BlockMap::Host(&[[1, 2]]),
    /// )
    /// .backend(Backend::Tma);
    /// // SAFETY: every view is live host memory of its length.
    /// let ran = unsafe { kvio::emulate::copy_blocks(&op) }.unwrap();
    /// assert_eq!(ran, Backend::Tma);
    /// let block = l * 2 * bs * h * d;
    /// assert_eq!(dst[2 * block..3 * block], src[block..2 * block]);
    /// ```
    Tma,
}

/// Arguments of [`Kvio::copy_blocks`].
///
/// Run here through the CPU emulation on host memory; on a GPU the same value goes to
/// [`Kvio::copy_blocks`] with device or pinned memory.
///
/// ```
/// use kvio::{Backend, BlockCopy, BlockMap, BlockPool, DeviceBytes, DeviceBytesMut};
/// let (nb, l, bs, h, d) = (4, 2, 2, 1, 4); // f32 pools
/// let block = l * 2 * bs * h * d; // elements of one cross-layer block
/// let src: Vec<f32> = (0..nb * block).map(|x| x as f32).collect();
/// let mut dst = vec![0f32; nb * block];
/// let bytes = nb * block * 4;
/// // SAFETY: host memory, used by the emulation only.
/// let (s, t) = unsafe {
///     (
///         DeviceBytes::from_raw(src.as_ptr() as u64, bytes),
///         DeviceBytesMut::from_raw(dst.as_mut_ptr() as u64, bytes),
///     )
/// };
/// let op = BlockCopy {
///     src: BlockPool::cross_layer_nhd(s, nb, l, bs, h, d, 4),
///     dst: BlockPool::cross_layer_hnd(t, nb, l, bs, h, d, 4), // converted on the way
///     map: BlockMap::Host(&[[3, 0], [-1, -1], [1, 2]]),
///     backend: Backend::Auto,
///     max_ctas: None,
///     staging: None, // kvio uploads the map to its own scratch
///     errors: None,
/// };
/// // SAFETY: every view is live host memory of its length.
/// let ran = unsafe { kvio::emulate::copy_blocks(&op) }.unwrap();
/// assert_eq!(ran, Backend::Kernel); // short spans: SM threads, as on a GPU
/// // With one head, NHD and HND blocks hold the same bytes: block 3 -> 0, block 1 -> 2.
/// assert_eq!(dst[..block], src[3 * block..4 * block]);
/// assert_eq!(dst[2 * block..3 * block], src[block..2 * block]);
/// assert!(dst[block..2 * block].iter().all(|&x| x == 0.0));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct BlockCopy<'a> {
    /// Pool read from.
    pub src: BlockPool<'a>,
    /// Pool written to (built on write views).
    pub dst: BlockPool<'a, Writable>,
    /// Which blocks go where.
    pub map: BlockMap<'a>,
    /// Which engine moves them.
    pub backend: Backend,
    /// CTAs the kernel backend may use (`None`: [`DEFAULT_TRANSFER_CTAS`] when either pool is
    /// host memory, [`DEFAULT_TMA_TRANSFER_CTAS`] one-warp CTAs on [`Backend::Tma`], the
    /// whole GPU otherwise). A conversion to or from vLLM's v0 layout runs smaller CTAs (128
    /// threads through its shared tile, else 256): with host memory its default is as many
    /// threads as [`DEFAULT_TRANSFER_CTAS`] of the transfer entry's 512.
    ///
    /// An offload and an onload running at once share the link: the offload's stores to
    /// host memory and the onload's read requests travel the same direction. Give the
    /// offload fewer CTAs than the onload: measured on an H100 (`cargo bench`, group
    /// `concurrent`, 128 MiB each way, three processes), an offload on 1 CTA beside an
    /// onload on 4 moved 76–81 GB/s together, 88–97% of its process's bidirectional DMA
    /// ceiling (70–74 GB/s, 81–84%, for layer-separate 1-token pages), against 67–71 GB/s
    /// for 2 + 4. Where the runs are long (cross-layer blocks, or pages of 256 tokens),
    /// [`Backend::Dma`] on both sides moved 90–100% with no CTA at all.
    pub max_ctas: Option<u32>,
    /// Device memory of `16 × pairs` bytes, 8-byte aligned, for a host map on the kernel
    /// backend (the map is copied there on the stream; not capturable). `None`: kvio uploads
    /// the map to its own scratch, taken and given back on the stream (a stream-ordered memory
    /// pool kvio keeps: after the first calls, no allocation and no synchronisation).
    pub staging: Option<DeviceBytesMut<'a>>,
    /// Where to count block ids past their pool (device maps).
    pub errors: Option<&'a DeviceErrors>,
}

impl<'a> BlockCopy<'a> {
    /// Copies the blocks `map` names from `src` to `dst` with [`Backend::Auto`], no CTA cap,
    /// no staging buffer (kvio's scratch takes a host map) and no error word; the other methods
    /// change one of those.
    ///
    /// ```
    /// use kvio::{Backend, BlockCopy, BlockMap, BlockPool, DeviceBytes, DeviceBytesMut};
    /// // SAFETY: descriptions only.
    /// let (a, b) = unsafe { (DeviceBytes::from_raw(0x1000, 1 << 20), DeviceBytesMut::from_raw(0x20_0000, 1 << 20)) };
    /// let pairs = [[0i64, 1]];
    /// let op = BlockCopy::new(
    ///     BlockPool::cross_layer_nhd(a, 4, 2, 16, 2, 64, 2),
    ///     BlockPool::cross_layer_nhd(b, 4, 2, 16, 2, 64, 2),
    ///     BlockMap::Host(&pairs),
    /// )
    /// .backend(Backend::Kernel)
    /// .max_ctas(2);
    /// assert_eq!((op.backend, op.max_ctas, op.staging), (Backend::Kernel, Some(2), None));
    /// ```
    pub fn new(
        src: impl Into<BlockPool<'a>>,
        dst: BlockPool<'a, Writable>,
        map: BlockMap<'a>,
    ) -> Self {
        BlockCopy {
            src: src.into(),
            dst,
            map,
            backend: Backend::Auto,
            max_ctas: None,
            staging: None,
            errors: None,
        }
    }

    /// Copies blocks inside one pool (copy-on-write, defragmentation: vLLM's `copy_blocks`),
    /// otherwise as [`BlockCopy::new`]. Pairs whose source is another pair's destination read
    /// whichever bytes are there when they run: the device applies the pairs in no order.
    ///
    /// ```
    /// use kvio::{Bases, BlockCopy, BlockMap, BlockPool, DeviceBytesMut};
    /// // SAFETY: a description only.
    /// let cache = unsafe { DeviceBytesMut::from_raw(0x1000, 1 << 20) };
    /// let pool = BlockPool::cross_layer_nhd(cache, 4, 2, 16, 2, 64, 2);
    /// let op = BlockCopy::within(pool, BlockMap::Host(&[[0, 3]]));
    /// let Bases::Strided { mem, .. } = op.src.bases() else { unreachable!() };
    /// assert_eq!(mem, cache.as_read());
    /// ```
    pub fn within(pool: BlockPool<'a, Writable>, map: BlockMap<'a>) -> Self {
        Self::new(pool, pool, map)
    }

    /// Moves the bytes with `backend`.
    pub fn backend(self, backend: Backend) -> Self {
        BlockCopy { backend, ..self }
    }

    /// Lets the kernel backend use at most `ctas` CTAs.
    pub fn max_ctas(self, ctas: u32) -> Self {
        BlockCopy {
            max_ctas: Some(ctas),
            ..self
        }
    }

    /// Uploads a host map to `staging` (16 bytes a pair, 8-byte aligned) instead of kvio's
    /// scratch.
    pub fn staging(self, staging: DeviceBytesMut<'a>) -> Self {
        BlockCopy {
            staging: Some(staging),
            ..self
        }
    }

    /// Counts device-map pairs with an id past its pool in `errors`.
    pub fn errors(self, errors: &'a DeviceErrors) -> Self {
        BlockCopy {
            errors: Some(errors),
            ..self
        }
    }
}

impl Kvio {
    /// Copies whole blocks between two pools (inside the GPU, GPU → pinned host, pinned host →
    /// GPU), converting layouts if the pools differ; returns the backend that ran.
    ///
    /// ```no_run
    /// # fn main() -> kvio::Result<()> {
    /// use kvio::{Backend, BlockCopy, BlockMap, BlockPool, DeviceAlloc, PinnedHost};
    /// let _ctx = kvio::PrimaryContext::retain(0)?;
    /// let kv = kvio::Kvio::load()?;
    /// let stream = kvio::Stream::new()?; // non-blocking
    /// let (blocks, layers, bs, h, d) = (64, 32, 16, 8, 128);
    /// let bytes = blocks * layers * 2 * bs * h * d * 2;
    /// let gpu = DeviceAlloc::new(bytes)?;          // cross-layer cache on the GPU
    /// let mut host = PinnedHost::alloc(bytes)?;    // pinned pool, same layout
    /// let op = BlockCopy::new(
    ///     BlockPool::cross_layer_nhd(gpu.bytes(), blocks, layers, bs, h, d, 2),
    ///     BlockPool::cross_layer_nhd(host.bytes_mut(), blocks, layers, bs, h, d, 2),
    ///     BlockMap::Host(&[[3, 0], [4, 1], [9, 2]]),
    /// );
    /// let backend = kv.copy_blocks(&op, stream.sref())?;
    /// assert_eq!(backend, Backend::Dma); // whole 2 MiB blocks to the host: the copy engines
    /// let offloaded = host.as_slice()?; // waits for the transfer first
    /// # Ok(()) }
    /// ```
    pub fn copy_blocks(&self, op: &BlockCopy<'_>, stream: StreamRef<'_>) -> Result<Backend> {
        let (backend, plan) = plan::plan(op, &self.target())?;
        self.run(&plan, stream)?;
        Ok(backend)
    }
}
