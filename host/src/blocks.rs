//! Block copies: whole KV blocks between two pools, inside one GPU (copy-on-write,
//! defragmentation), GPU → pinned host (offload) and pinned host → GPU (onload), converting
//! between layouts on the way. One call, [`Kvio::copy_blocks`], covers every direction: what
//! differs is only where the two [`BlockPool`]s live and how they are laid out.
//!
//! Two backends move the bytes:
//! - [`Backend::Dma`]: the copy engines, one `cuMemcpyAsync` per contiguous span (runs of
//!   consecutive block ids merged into one copy). Needs a host-side block map.
//! - [`Backend::Kernel`]: SM threads load and store both pools directly (pinned host memory is
//!   mapped into the device's address space), 16-byte accesses, a few CTAs only (default 4 when
//!   host memory is involved) so transfers leave the SMs to the model. With a device-resident
//!   block map it allocates nothing and never synchronises: it can be captured in a CUDA graph.
//!
//! [`Backend::Auto`] picks the kernel, except for transfers between host and device whose
//! contiguous spans are at least [`DMA_MIN_SPAN`] (and when a host map has no staging buffer).
//! The threshold is measured (`BENCHMARKS.md`, H200): each DMA copy costs about 2.4 µs, so
//! with blocks in random order DMA only wins for multi-megabyte spans; inside the GPU the
//! kernel won at every span size measured (up to 32 MiB).

use cust::sys as cu;
use kvio_kernels::args::CopyArgs;
use kvio_kernels::index::{access_width, group_shift};

use crate::alloc::{memory_kind, LayerTable, MemoryKind, TableAccess};
use crate::driver::{check, Params, StreamRef};
use crate::error::{invalid, Error, Result};
use crate::layout::{chunks_disjoint, PagedLayout};
use crate::mem::{DeviceBytes, DeviceErrors};
use crate::module::Kvio;
use crate::write::{BLOCK_THREADS, PER_LANE};

/// Contiguous span (bytes) from which [`Backend::Auto`] prefers the copy engines for transfers
/// between host and device (measured crossover on an H200: below it the kernel backend on its
/// default CTA budget moves more bytes per second).
pub const DMA_MIN_SPAN: usize = 2 << 20;
/// Threads per CTA of the kernel backend when a pool is in host memory (SGLang's transfer
/// kernels use the same): few CTAs, many bytes in flight.
pub(crate) const TRANSFER_THREADS: u32 = 1024;
/// Largest span one work item of the block copy moves; larger contiguous chunks are split so
/// whole-block copies still spread over the grid.
const MAX_PIECE: u64 = 16 * 1024;
/// Default CTA budget of the kernel backend when a pool is in host memory.
pub const DEFAULT_TRANSFER_CTAS: u32 = 4;

/// Saturating product: absurd shapes saturate and are then rejected by the pool's validation
/// (as overflows) instead of wrapping to a plausible layout.
fn sat(factors: &[usize]) -> usize {
    factors.iter().fold(1usize, |a, &b| a.saturating_mul(b))
}

/// Where the per-layer, per-part (K/V) bases of a pool come from.
///
/// ```
/// # fn main() -> kvio::Result<()> {
/// use kvio::{Bases, BlockPool, DeviceBytes, PagedLayout};
/// // SGLang's layer-first host pool `(2, L, NB, bs, H, D)` in one allocation.
/// let (nb, l, bs, h, d, e) = (100, 4, 16, 8, 128, 2);
/// let cache = nb * bs * h * d * e; // bytes of one layer's K (or V)
/// // SAFETY: a description only; nothing here touches the memory.
/// let mem = unsafe { DeviceBytes::from_raw(0x7000_0000, 2 * l * cache) };
/// let layer_first = BlockPool {
///     bases: Bases::Strided { mem, layer_stride: cache, part_stride: l * cache },
///     layers: l,
///     parts: 2,
///     layout: PagedLayout::nhd(nb, bs, h, d, e),
/// };
/// let (k, v, _) = layer_first.layer_view(1)?;
/// assert_eq!(k.ptr(), 0x7000_0000 + cache as u64);
/// assert_eq!(v.unwrap().ptr(), 0x7000_0000 + (5 * cache) as u64);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub enum Bases<'a> {
    /// One allocation: layer `l`, part `p` starts at byte `l * layer_stride + p * part_stride`
    /// of `mem` (cross-layer blocks, SGLang's layer-first host pool, ...).
    Strided {
        /// The whole pool.
        mem: DeviceBytes,
        /// Bytes between layers.
        layer_stride: usize,
        /// Bytes between K and V.
        part_stride: usize,
    },
    /// Layer-separate caches reached through a device-resident pointer table.
    Table(&'a LayerTable),
}

/// A pool of KV blocks: `layers × parts` caches (parts = 2 for K and V, 1 for a combined or
/// MLA cache), each laid out as `layout` (its block, token and head strides).
#[derive(Clone, Copy, Debug)]
pub struct BlockPool<'a> {
    /// Where each layer/part cache starts.
    pub bases: Bases<'a>,
    /// Number of layers.
    pub layers: usize,
    /// Caches per layer (2: K and V).
    pub parts: usize,
    /// Layout of one layer/part cache (strides in elements, `num_blocks` = pool size).
    pub layout: PagedLayout,
}

impl<'a> BlockPool<'a> {
    /// Bytes of a cross-layer pool of `num_blocks` blocks (NHD or HND order: the same size),
    /// checked for overflow: what to allocate for [`BlockPool::cross_layer_nhd`] /
    /// [`BlockPool::cross_layer_hnd`].
    ///
    /// ```no_run
    /// # fn main() -> kvio::Result<()> {
    /// use kvio::{BlockPool, DeviceAlloc, PinnedHost};
    /// let _ctx = kvio::PrimaryContext::retain(0)?;
    /// let (blocks, layers, bs, h, d) = (1024, 32, 16, 8, 128);
    /// let bytes = BlockPool::cross_layer_bytes(blocks, layers, bs, h, d, 2)?;
    /// let gpu = DeviceAlloc::new(bytes)?; // the device cache
    /// let host = PinnedHost::alloc(bytes)?; // a pinned pool of the same shape
    /// let pool = BlockPool::cross_layer_nhd(gpu.bytes(), blocks, layers, bs, h, d, 2);
    /// let (k0, v0, layout) = pool.layer_view(0)?; // layer 0's caches for the write path
    /// # let _ = (host, k0, v0, layout); Ok(()) }
    /// ```
    pub fn cross_layer_bytes(
        num_blocks: usize,
        layers: usize,
        block_size: usize,
        heads: usize,
        head_dim: usize,
        elem_bytes: usize,
    ) -> Result<usize> {
        [
            num_blocks, layers, 2, block_size, heads, head_dim, elem_bytes,
        ]
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or(Error::Overflow {
            name: "cross_layer_bytes",
        })
    }

    /// Cross-layer blocks in vLLM's FlashAttention NHD order `(NB, L, 2, bs, H, D)`: one block
    /// holds all layers, K then V, contiguously (vLLM #27743).
    ///
    /// ```
    /// # let mem = unsafe { kvio::DeviceBytes::from_raw(0x1000, 10 * 4 * 2 * 16 * 8 * 128 * 2) };
    /// let pool = kvio::BlockPool::cross_layer_nhd(mem, 10, 4, 16, 8, 128, 2);
    /// assert_eq!(pool.layout.block_stride, 4 * 2 * 16 * 8 * 128);
    /// ```
    pub fn cross_layer_nhd(
        mem: DeviceBytes,
        num_blocks: usize,
        layers: usize,
        block_size: usize,
        heads: usize,
        head_dim: usize,
        elem_bytes: usize,
    ) -> Self {
        let part = block_size.saturating_mul(heads).saturating_mul(head_dim);
        let mut layout = PagedLayout::nhd(num_blocks, block_size, heads, head_dim, elem_bytes);
        layout.block_stride = sat(&[layers, 2, part]);
        BlockPool {
            bases: Bases::Strided {
                mem,
                layer_stride: sat(&[2, part, elem_bytes]),
                part_stride: sat(&[part, elem_bytes]),
            },
            layers,
            parts: 2,
            layout,
        }
    }

    /// Cross-layer blocks in the HND order `(NB, H, L, 2, bs, D)`.
    ///
    /// ```
    /// # let mem = unsafe { kvio::DeviceBytes::from_raw(0x1000, 10 * 8 * 4 * 2 * 16 * 128 * 2) };
    /// let pool = kvio::BlockPool::cross_layer_hnd(mem, 10, 4, 16, 8, 128, 2);
    /// assert_eq!(pool.layout.head_stride, 4 * 2 * 16 * 128); // a head holds every layer's K and V
    /// assert_eq!(pool.layout.token_stride, 128);
    /// ```
    pub fn cross_layer_hnd(
        mem: DeviceBytes,
        num_blocks: usize,
        layers: usize,
        block_size: usize,
        heads: usize,
        head_dim: usize,
        elem_bytes: usize,
    ) -> Self {
        let part = block_size.saturating_mul(head_dim);
        let layout = PagedLayout {
            num_blocks,
            block_size,
            num_heads: heads,
            head_dim,
            elem_bytes,
            block_stride: sat(&[heads, layers, 2, part]),
            token_stride: head_dim,
            head_stride: sat(&[layers, 2, part]),
        };
        BlockPool {
            bases: Bases::Strided {
                mem,
                layer_stride: sat(&[2, part, elem_bytes]),
                part_stride: sat(&[part, elem_bytes]),
            },
            layers,
            parts: 2,
            layout,
        }
    }

    /// Layer-separate caches (each `layout`, e.g. [`PagedLayout::nhd`] or
    /// [`PagedLayout::hnd`]) reached through `table`.
    pub fn layer_separate(table: &'a LayerTable, layout: PagedLayout) -> Self {
        BlockPool {
            bases: Bases::Table(table),
            layers: table.layers(),
            parts: table.parts(),
            layout,
        }
    }

    /// The K and V caches of layer `layer` of a strided pool as views the write path accepts
    /// ([`crate::SlotUpdate`]): `(key_cache, value_cache, layout)`.
    ///
    /// ```
    /// # fn main() -> kvio::Result<()> {
    /// let (nb, l, bs, h, d, e) = (8, 4, 16, 2, 64, 2);
    /// let part = bs * h * d * e; // bytes of one layer's K (or V) in one block
    /// // SAFETY: a description only; nothing here touches the memory.
    /// let mem = unsafe { kvio::DeviceBytes::from_raw(0x10_0000, nb * l * 2 * part) };
    /// let pool = kvio::BlockPool::cross_layer_nhd(mem, nb, l, bs, h, d, e);
    /// let (k, v, layout) = pool.layer_view(2)?;
    /// assert_eq!(k.ptr(), 0x10_0000 + (2 * 2 * part) as u64);
    /// assert_eq!(v.unwrap().ptr(), k.ptr() + part as u64);
    /// assert_eq!(layout.block_stride, l * 2 * bs * h * d); // next block: past every layer
    /// # Ok(()) }
    /// ```
    pub fn layer_view(
        &self,
        layer: usize,
    ) -> Result<(DeviceBytes, Option<DeviceBytes>, PagedLayout)> {
        let Bases::Strided {
            mem,
            layer_stride,
            part_stride,
        } = self.bases
        else {
            return Err(invalid(
                "bases",
                "Table",
                "layer_view needs a strided pool; use the table's entries",
            ));
        };
        if layer >= self.layers {
            return Err(Error::IndexOutOfRange {
                name: "layer",
                at: 0,
                value: layer as i64,
                limit: self.layers as u64,
            });
        }
        self.extent("pool")?;
        let ext = self.layout.extent("layout")? as usize;
        let k = mem.slice(layer * layer_stride, ext)?;
        let v = if self.parts > 1 {
            Some(mem.slice(layer * layer_stride + part_stride, ext)?)
        } else {
            None
        };
        Ok((k, v, self.layout))
    }

    /// Checks the pool (sizes, strides, no two chunks sharing bytes, every cache inside its
    /// memory) and returns the byte extent of one layer/part cache.
    fn extent(&self, name: &'static str) -> Result<u64> {
        let ext = self.layout.extent(name)?;
        if self.layers == 0 || self.parts == 0 {
            return Err(invalid(
                name,
                (self.layers, self.parts),
                "layers and parts must be non-zero",
            ));
        }
        match self.bases {
            Bases::Strided {
                mem,
                layer_stride,
                part_stride,
            } => {
                let of = Error::Overflow { name };
                let total = ((self.layers - 1) as u64)
                    .checked_mul(layer_stride as u64)
                    .and_then(|a| {
                        ((self.parts - 1) as u64)
                            .checked_mul(part_stride as u64)
                            .and_then(|b| a.checked_add(b))
                    })
                    .and_then(|a| a.checked_add(ext))
                    .ok_or(of)?;
                if total > mem.len() as u64 {
                    return Err(Error::BufferTooSmall {
                        name,
                        needed: total,
                        len: mem.len() as u64,
                    });
                }
                let mut dims = self.layout.dims().to_vec();
                dims.push((self.layers, layer_stride as u64));
                dims.push((self.parts, part_stride as u64));
                if !chunks_disjoint(&dims, self.layout.chunk_bytes() as u64) {
                    return Err(invalid(
                        name,
                        (layer_stride, part_stride),
                        "layer/part strides make caches overlap",
                    ));
                }
            }
            Bases::Table(t) => {
                if t.layers() != self.layers || t.parts() != self.parts {
                    return Err(invalid(
                        name,
                        (t.layers(), t.parts()),
                        "table shape differs from the pool's",
                    ));
                }
                if (t.min_len() as u64) < ext {
                    return Err(Error::BufferTooSmall {
                        name,
                        needed: ext,
                        len: t.min_len() as u64,
                    });
                }
                let mut r: Vec<(u64, u64)> = t
                    .entries()
                    .iter()
                    .map(|e| (e.ptr(), e.ptr() + ext))
                    .collect();
                r.sort_unstable();
                if r.windows(2).any(|w| w[1].0 < w[0].1) {
                    return Err(invalid(name, "table", "two layer/part caches overlap"));
                }
            }
        }
        Ok(ext)
    }

    /// Address ranges of the pool's caches (for overlap and memory-kind checks).
    fn ranges(&self, ext: u64) -> Vec<(u64, u64)> {
        match self.bases {
            Bases::Strided { mem, .. } => vec![(mem.ptr(), mem.ptr() + mem.len() as u64)],
            Bases::Table(t) => t
                .entries()
                .iter()
                .map(|e| (e.ptr(), e.ptr() + ext))
                .collect(),
        }
    }

    /// Byte address of the chunk `(block, layer, part, token, head)` (host-side twin of the
    /// kernel's addressing, used by the DMA backend).
    fn addr(&self, block: u64, layer: u64, part: u64, token: u64, head: u64) -> u64 {
        let e = self.layout.elem_bytes as u64;
        let base = match self.bases {
            Bases::Strided {
                mem,
                layer_stride,
                part_stride,
            } => mem.ptr() + layer * layer_stride as u64 + part * part_stride as u64,
            Bases::Table(t) => t.entries()[(layer * self.parts as u64 + part) as usize].ptr(),
        };
        base + e
            * (block * self.layout.block_stride as u64
                + token * self.layout.token_stride as u64
                + head * self.layout.head_stride as u64)
    }
}

/// The `(src_block, dst_block)` pairs of a block copy. Negative ids mark padding (skipped).
///
/// ```
/// use kvio::BlockMap;
/// let pairs = [[3i64, 0], [-1, -1], [7, 1]]; // block 3 -> 0, padding, block 7 -> 1
/// let map = BlockMap::Host(&pairs);
/// assert!(matches!(map, BlockMap::Host(p) if p.len() == 3));
/// // On the device (vLLM's `block_mapping [n, 2]` i64): `BlockMap::Device { pairs, len: 3 }`,
/// // with `pairs` a `DeviceBytes` view of the 48 bytes.
/// ```
#[derive(Clone, Copy, Debug)]
pub enum BlockMap<'a> {
    /// Pairs in host memory: fully validated (ranges, duplicate destinations, overlap).
    Host(&'a [[i64; 2]]),
    /// `len` pairs of `i64` in device memory (`[len, 2]`, vLLM's `block_mapping`); checked by
    /// the kernel (bad ids skipped and counted).
    Device {
        /// The pairs.
        pairs: DeviceBytes,
        /// Number of pairs.
        len: usize,
    },
}

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The kernel, except DMA for host transfers with contiguous spans of at least
    /// [`DMA_MIN_SPAN`] bytes, or a host map without staging.
    Auto,
    /// Copy engines: one async copy per contiguous span.
    Dma,
    /// SM threads.
    Kernel,
}

/// Arguments of [`Kvio::copy_blocks`].
///
/// Run here through the CPU emulation on host memory; on a GPU the same value goes to
/// [`Kvio::copy_blocks`] with device or pinned memory.
///
/// ```
/// use kvio::{Backend, BlockCopy, BlockMap, BlockPool, DeviceBytes};
/// let (nb, l, bs, h, d) = (4, 2, 2, 1, 4); // f32 pools
/// let block = l * 2 * bs * h * d; // elements of one cross-layer block
/// let src: Vec<f32> = (0..nb * block).map(|x| x as f32).collect();
/// let mut dst = vec![0f32; nb * block];
/// let bytes = nb * block * 4;
/// // SAFETY: host memory, used by the emulation only.
/// let (s, t) = unsafe {
///     (
///         DeviceBytes::from_raw(src.as_ptr() as u64, bytes),
///         DeviceBytes::from_raw(dst.as_mut_ptr() as u64, bytes),
///     )
/// };
/// let op = BlockCopy {
///     src: BlockPool::cross_layer_nhd(s, nb, l, bs, h, d, 4),
///     dst: BlockPool::cross_layer_hnd(t, nb, l, bs, h, d, 4), // converted on the way
///     map: BlockMap::Host(&[[3, 0], [-1, -1], [1, 2]]),
///     backend: Backend::Kernel,
///     max_ctas: None,
///     staging: None,
///     errors: None,
/// };
/// // SAFETY: every view is live host memory of its length.
/// unsafe { kvio::emulate::copy_blocks(&op) }.unwrap();
/// // With one head, NHD and HND blocks hold the same bytes: block 3 -> 0, block 1 -> 2.
/// assert_eq!(dst[..block], src[3 * block..4 * block]);
/// assert_eq!(dst[2 * block..3 * block], src[block..2 * block]);
/// assert!(dst[block..2 * block].iter().all(|&x| x == 0.0));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct BlockCopy<'a> {
    /// Pool read from.
    pub src: BlockPool<'a>,
    /// Pool written to.
    pub dst: BlockPool<'a>,
    /// Which blocks go where.
    pub map: BlockMap<'a>,
    /// Which engine moves them.
    pub backend: Backend,
    /// CTAs the kernel backend may use (`None`: [`DEFAULT_TRANSFER_CTAS`] when either pool is
    /// host memory, the whole GPU otherwise).
    pub max_ctas: Option<u32>,
    /// Device scratch of `16 × pairs` bytes for a host map on the kernel backend (the map is
    /// copied there on the stream; not capturable). `None`: a host map uses DMA.
    pub staging: Option<DeviceBytes>,
    /// Where to count block ids past their pool (device maps).
    pub errors: Option<&'a DeviceErrors>,
}

/// Geometry shared by both backends.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Extents (layers, parts, tokens, heads) after merging contiguous dimensions.
    ext: [u64; 4],
    /// Contiguous bytes per chunk after merging.
    chunk: u64,
    /// Whole blocks are contiguous on both sides (runs of consecutive ids merge).
    block_contiguous: bool,
    host_involved: bool,
}

fn side_strides(p: &BlockPool<'_>) -> [Option<u64>; 4] {
    let e = p.layout.elem_bytes as u64;
    let (l, pt) = match p.bases {
        Bases::Strided {
            layer_stride,
            part_stride,
            ..
        } => (Some(layer_stride as u64), Some(part_stride as u64)),
        Bases::Table(_) => (None, None),
    };
    [
        l,
        pt,
        Some(p.layout.token_stride as u64 * e),
        Some(p.layout.head_stride as u64 * e),
    ]
}

pub(crate) fn geometry(
    op: &BlockCopy<'_>,
    kind_of: impl Fn(u64) -> MemoryKind,
) -> Result<Geometry> {
    let (s, d) = (&op.src, &op.dst);
    // Validate both pools (sizes, strides, every cache inside its memory).
    s.extent("src")?;
    d.extent("dst")?;
    let (a, b) = (&s.layout, &d.layout);
    if (
        s.layers,
        s.parts,
        a.block_size,
        a.num_heads,
        a.head_dim,
        a.elem_bytes,
    ) != (
        d.layers,
        d.parts,
        b.block_size,
        b.num_heads,
        b.head_dim,
        b.elem_bytes,
    ) {
        return Err(invalid(
            "dst",
            (
                d.layers,
                d.parts,
                b.block_size,
                b.num_heads,
                b.head_dim,
                b.elem_bytes,
            ),
            "(layers, parts, block_size, heads, head_dim, elem_bytes) differ from src's",
        ));
    }
    // Memory the pools live in: device or pinned host, nothing else. One driver query per
    // strided pool; a layer table was classified when it was built.
    let mut host_involved = false;
    for (name, pool) in [("src", s), ("dst", d)] {
        let verdict = match pool.bases {
            Bases::Strided { mem, .. } => match kind_of(mem.ptr()) {
                MemoryKind::Device => TableAccess::Device,
                MemoryKind::PinnedHost => TableAccess::WithHost,
                _ => TableAccess::Unreachable(mem.ptr()),
            },
            Bases::Table(t) => t.access(),
        };
        match verdict {
            TableAccess::Device => {}
            TableAccess::WithHost => host_involved = true,
            TableAccess::Unreachable(ptr) => return Err(Error::NotDeviceAccessible { name, ptr }),
        }
    }
    // Merge dimensions whose stride equals the span so far on both sides (innermost first).
    let counts = [
        s.layers as u64,
        s.parts as u64,
        a.block_size as u64,
        a.num_heads as u64,
    ];
    let (ss, ds) = (side_strides(s), side_strides(d));
    let mut ext = counts;
    let mut chunk = a.chunk_bytes() as u64;
    loop {
        let next = (0..4)
            .rev()
            .find(|&i| ext[i] > 1 && ss[i] == Some(chunk) && ds[i] == Some(chunk));
        match next {
            Some(i) => {
                chunk *= ext[i];
                ext[i] = 1;
            }
            None => break,
        }
    }
    let e = a.elem_bytes as u64;
    let block_contiguous = ext == [1, 1, 1, 1]
        && a.block_stride as u64 * e == chunk
        && b.block_stride as u64 * e == chunk;
    Ok(Geometry {
        ext,
        chunk,
        block_contiguous,
        host_involved,
    })
}

/// Validates a host map: ids in range (negatives are padding), no destination twice, and —
/// when the pools share memory — no block both read and written.
pub(crate) fn check_host_map(op: &BlockCopy<'_>, pairs: &[[i64; 2]]) -> Result<()> {
    let (nsrc, ndst) = (
        op.src.layout.num_blocks as u64,
        op.dst.layout.num_blocks as u64,
    );
    for (i, &[s, d]) in pairs.iter().enumerate() {
        if s < 0 || d < 0 {
            continue;
        }
        if s as u64 >= nsrc {
            return Err(Error::IndexOutOfRange {
                name: "map.src",
                at: i,
                value: s,
                limit: nsrc,
            });
        }
        if d as u64 >= ndst {
            return Err(Error::IndexOutOfRange {
                name: "map.dst",
                at: i,
                value: d,
                limit: ndst,
            });
        }
    }
    let mut dsts: Vec<(i64, usize)> = pairs
        .iter()
        .enumerate()
        .filter(|(_, p)| p[0] >= 0 && p[1] >= 0)
        .map(|(i, p)| (p[1], i))
        .collect();
    dsts.sort_unstable();
    if let Some(w) = dsts.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::Overlap {
            name: "map.dst",
            first: w[0].1,
            second: w[1].1,
        });
    }
    let (se, de) = (op.src.layout.extent("src")?, op.dst.layout.extent("dst")?);
    let shared = op
        .src
        .ranges(se)
        .iter()
        .any(|&(a0, a1)| op.dst.ranges(de).iter().any(|&(b0, b1)| a0 < b1 && b0 < a1));
    if shared {
        if let (Some(a), Some(b)) = (block_footprint(&op.src), block_footprint(&op.dst)) {
            // Block-major pools: compare the byte ranges blocks occupy.
            let mut reads: Vec<(u64, u64, usize)> = pairs
                .iter()
                .enumerate()
                .filter(|(_, p)| p[0] >= 0 && p[1] >= 0)
                .map(|(i, p)| (a.0 + p[0] as u64 * a.1, a.0 + (p[0] as u64 + 1) * a.1, i))
                .collect();
            reads.sort_unstable();
            for &(d, di) in &dsts {
                let (lo, hi) = (b.0 + d as u64 * b.1, b.0 + (d as u64 + 1) * b.1);
                // first read range ending after lo; it overlaps if it starts before hi
                let k = reads.partition_point(|r| r.0 + a.1 <= lo);
                if let Some(r) = reads.get(k).filter(|r| r.0 < hi) {
                    return Err(Error::Overlap {
                        name: "map",
                        first: r.2,
                        second: di,
                    });
                }
            }
        } else if same_block_addressing(&op.src, &op.dst) {
            // Scattered blocks, addressed identically: ids name the same bytes.
            let mut srcs: Vec<(i64, usize)> = pairs
                .iter()
                .enumerate()
                .filter(|(_, p)| p[0] >= 0 && p[1] >= 0)
                .map(|(i, p)| (p[0], i))
                .collect();
            srcs.sort_unstable();
            for &(d, di) in &dsts {
                if let Ok(k) = srcs.binary_search_by_key(&d, |&(s, _)| s) {
                    return Err(Error::Overlap {
                        name: "map",
                        first: srcs[k].1,
                        second: di,
                    });
                }
            }
        } else {
            return Err(invalid(
                "dst",
                "shares memory with src",
                "pools sharing memory must be block-major or address blocks identically",
            ));
        }
    }
    Ok(())
}

/// `(start, stride)` when every block of a strided pool lies inside its own `stride` bytes
/// from `start` (block-major pools: cross-layer NHD/HND), so block `b` is the byte range
/// `start + b * stride .. start + (b + 1) * stride`.
fn block_footprint(p: &BlockPool<'_>) -> Option<(u64, u64)> {
    let Bases::Strided {
        mem,
        layer_stride,
        part_stride,
    } = p.bases
    else {
        return None;
    };
    let l = &p.layout;
    let e = l.elem_bytes as u64;
    let inner = (l.block_size as u64 - 1) * l.token_stride as u64 * e
        + (l.num_heads as u64 - 1) * l.head_stride as u64 * e
        + l.chunk_bytes() as u64
        + (p.layers as u64 - 1) * layer_stride as u64
        + (p.parts as u64 - 1) * part_stride as u64;
    let stride = l.block_stride as u64 * e;
    (inner <= stride).then_some((mem.ptr(), stride))
}

/// A device-resident map must hold `len` 16-byte pairs and be 8-byte aligned.
pub(crate) fn check_device_map(pairs: DeviceBytes, len: usize) -> Result<()> {
    let need = (len as u64)
        .checked_mul(16)
        .ok_or(Error::Overflow { name: "map" })?;
    if need > pairs.len() as u64 {
        return Err(Error::BufferTooSmall {
            name: "map.pairs",
            needed: need,
            len: pairs.len() as u64,
        });
    }
    if !pairs.ptr().is_multiple_of(8) {
        return Err(invalid("map.pairs", pairs.ptr(), "must be 8-byte aligned"));
    }
    Ok(())
}

/// True when block `b` occupies the same bytes in both pools (same bases, same block stride).
fn same_block_addressing(a: &BlockPool<'_>, b: &BlockPool<'_>) -> bool {
    let bases = match (a.bases, b.bases) {
        (
            Bases::Strided {
                mem: m1,
                layer_stride: l1,
                part_stride: p1,
            },
            Bases::Strided {
                mem: m2,
                layer_stride: l2,
                part_stride: p2,
            },
        ) => m1.ptr() == m2.ptr() && l1 == l2 && p1 == p2,
        (Bases::Table(t1), Bases::Table(t2)) => t1
            .entries()
            .iter()
            .map(DeviceBytes::ptr)
            .eq(t2.entries().iter().map(DeviceBytes::ptr)),
        _ => false,
    };
    bases
        && a.layout.block_stride * a.layout.elem_bytes
            == b.layout.block_stride * b.layout.elem_bytes
}

impl Kvio {
    /// Copies whole blocks between two pools (inside the GPU, GPU → pinned host, pinned host →
    /// GPU), converting layouts if the pools differ; returns the backend that ran.
    ///
    /// ```no_run
    /// # fn main() -> kvio::Result<()> {
    /// use kvio::{Backend, BlockCopy, BlockMap, BlockPool, DeviceAlloc, PinnedHost, StreamRef};
    /// let _ctx = kvio::PrimaryContext::retain(0)?;
    /// let kv = kvio::Kvio::load()?;
    /// let stream = cust::stream::Stream::new(cust::stream::StreamFlags::NON_BLOCKING, None).unwrap();
    /// let (blocks, layers, bs, h, d) = (64, 32, 16, 8, 128);
    /// let bytes = blocks * layers * 2 * bs * h * d * 2;
    /// let gpu = DeviceAlloc::new(bytes)?;          // cross-layer cache on the GPU
    /// let host = PinnedHost::alloc(bytes)?;        // pinned pool, same layout
    /// let backend = kv.copy_blocks(&BlockCopy {
    ///     src: BlockPool::cross_layer_nhd(gpu.bytes(), blocks, layers, bs, h, d, 2),
    ///     dst: BlockPool::cross_layer_nhd(host.bytes(), blocks, layers, bs, h, d, 2),
    ///     map: BlockMap::Host(&[[3, 0], [4, 1], [9, 2]]),
    ///     backend: Backend::Auto,
    ///     max_ctas: None,
    ///     staging: None,
    ///     errors: None,
    /// }, StreamRef::from_cust(&stream))?;
    /// assert_eq!(backend, Backend::Dma); // whole 2 MiB blocks to the host: the copy engines
    /// # Ok(()) }
    /// ```
    pub fn copy_blocks(&self, op: &BlockCopy<'_>, stream: StreamRef<'_>) -> Result<Backend> {
        let geo = geometry(op, memory_kind)?;
        let backend = match (op.backend, op.map) {
            (Backend::Dma, BlockMap::Device { .. }) => {
                return Err(invalid(
                    "backend",
                    "Dma",
                    "the DMA backend needs a host block map",
                ))
            }
            (Backend::Dma, _) => Backend::Dma,
            (Backend::Kernel, BlockMap::Host(_)) if op.staging.is_none() => {
                return Err(invalid(
                    "staging",
                    "None",
                    "the kernel backend with a host map needs staging",
                ))
            }
            (Backend::Kernel, _) => Backend::Kernel,
            (Backend::Auto, BlockMap::Device { .. }) => Backend::Kernel,
            (Backend::Auto, BlockMap::Host(_)) => {
                let long = geo.host_involved && geo.chunk as usize >= DMA_MIN_SPAN;
                if long || op.staging.is_none() {
                    Backend::Dma
                } else {
                    Backend::Kernel
                }
            }
        };
        if let BlockMap::Host(pairs) = op.map {
            check_host_map(op, pairs)?;
        }
        match backend {
            Backend::Dma => {
                let BlockMap::Host(pairs) = op.map else {
                    unreachable!("checked above")
                };
                dma(op, &geo, pairs, stream)?;
            }
            _ => self.kernel(op, &geo, stream)?,
        }
        Ok(backend)
    }

    fn kernel(&self, op: &BlockCopy<'_>, geo: &Geometry, stream: StreamRef<'_>) -> Result<()> {
        let (pairs, n) = match op.map {
            BlockMap::Device { pairs, len } => {
                check_device_map(pairs, len)?;
                (pairs, len)
            }
            BlockMap::Host(host) => {
                let staging = op.staging.expect("checked by copy_blocks");
                let need = host.len() * 16;
                if !staging.ptr().is_multiple_of(8) {
                    return Err(invalid("staging", staging.ptr(), "must be 8-byte aligned"));
                }
                if need > staging.len() {
                    return Err(Error::BufferTooSmall {
                        name: "staging",
                        needed: need as u64,
                        len: staging.len() as u64,
                    });
                }
                if need > 0 {
                    // SAFETY: staging holds `need` bytes; the driver stages pageable memory
                    // before returning, so `host` may be dropped afterwards.
                    check("cuMemcpyHtoDAsync", unsafe {
                        cu::cuMemcpyHtoDAsync_v2(
                            staging.ptr(),
                            host.as_ptr().cast(),
                            need,
                            stream.cu_stream(),
                        )
                    })?;
                }
                (staging, host.len())
            }
        };
        let caps = (self.grid_cap.copy, self.grid_cap.transfer);
        let Some((args, grid, threads)) = copy_args(op, geo, pairs.ptr(), n, caps)? else {
            return Ok(());
        };
        let f = if threads == TRANSFER_THREADS {
            self.transfer_blocks
        } else {
            self.copy_blocks
        };
        Params::new(&args.to_words(), &CopyArgs::SIZES).launch(f, grid, threads, stream)
    }
}

/// Largest divisor of `n` that is at most `cap` (1 if none larger).
fn largest_divisor_at_most(n: u64, cap: u64) -> u64 {
    let mut best = 1;
    let mut i = 1;
    while i * i <= n {
        if n.is_multiple_of(i) {
            for d in [i, n / i] {
                if d <= cap && d > best {
                    best = d;
                }
            }
        }
        i += 1;
    }
    best
}

/// Kernel arguments, grid and CTA size of a validated block copy whose pairs are at `pairs`
/// (`n` of them); `None` when there is nothing to do. `caps` are the resident-block limits of
/// the device-copy and transfer entry points.
pub(crate) fn copy_args(
    op: &BlockCopy<'_>,
    geo: &Geometry,
    pairs: u64,
    n: usize,
    caps: (u32, u32),
) -> Result<Option<(CopyArgs, u32, u32)>> {
    let per_pair: u64 = geo.ext.iter().product();
    if n == 0 || per_pair == 0 {
        return Ok(None);
    }
    let side = |p: &BlockPool<'_>| -> (u64, u64, [u64; 5]) {
        let e = p.layout.elem_bytes as u64;
        let (base, table, ls, ps) = match p.bases {
            Bases::Strided {
                mem,
                layer_stride,
                part_stride,
            } => (mem.ptr(), 0, layer_stride as u64, part_stride as u64),
            Bases::Table(t) => (0, t.ptr(), 0, 0),
        };
        let l = &p.layout;
        (
            base,
            table,
            [
                ls,
                ps,
                l.block_stride as u64 * e,
                l.token_stride as u64 * e,
                l.head_stride as u64 * e,
            ],
        )
    };
    let (sb, st, ss) = side(&op.src);
    let (db, dt, ds) = side(&op.dst);
    let mut widths = vec![geo.chunk, sb, db];
    widths.extend_from_slice(&ss);
    widths.extend_from_slice(&ds);
    for pool in [&op.src, &op.dst] {
        if let Bases::Table(t) = pool.bases {
            widths.extend(t.entries().iter().map(DeviceBytes::ptr));
        }
    }
    let width = access_width(&widths);
    // Split big chunks into pieces of at most MAX_PIECE bytes (whole multiples of the access).
    let units = geo.chunk / width as u64;
    let piece = largest_divisor_at_most(units, (MAX_PIECE / width as u64).max(1)) * width as u64;
    let pieces = geo.chunk / piece;
    // Cannot overflow for validated pools (each factor is bounded by a buffer length), but the
    // kernel computes the same product: refuse rather than let it wrap.
    let items = (n as u64)
        .checked_mul(per_pair)
        .and_then(|v| v.checked_mul(pieces))
        .ok_or(Error::Overflow { name: "map" })?;
    let shift = group_shift(piece / width as u64, PER_LANE);
    let (threads, cap, default_budget) = if geo.host_involved {
        (TRANSFER_THREADS, caps.1, DEFAULT_TRANSFER_CTAS)
    } else {
        (BLOCK_THREADS, caps.0, u32::MAX)
    };
    let budget = op.max_ctas.unwrap_or(default_budget).min(cap.max(1)).max(1);
    let groups = (threads >> shift) as u64;
    let grid = items.div_ceil(groups).clamp(1, budget as u64) as u32;
    let [layers, parts, tokens, heads] = geo.ext;
    let args = CopyArgs {
        src_base: sb as *mut u8,
        src_table: st as *const u64,
        src_layer_stride: ss[0],
        src_part_stride: ss[1],
        src_block_stride: ss[2],
        src_token_stride: ss[3],
        src_head_stride: ss[4],
        dst_base: db as *mut u8,
        dst_table: dt as *const u64,
        dst_layer_stride: ds[0],
        dst_part_stride: ds[1],
        dst_block_stride: ds[2],
        dst_token_stride: ds[3],
        dst_head_stride: ds[4],
        layers,
        parts,
        tokens,
        heads,
        chunk: geo.chunk,
        piece,
        pieces,
        pairs: pairs as *const i64,
        num_pairs: n as u64,
        src_blocks: op.src.layout.num_blocks as u64,
        dst_blocks: op.dst.layout.num_blocks as u64,
        table_parts: op.src.parts as u64,
        width,
        shift,
        errors: op.errors.map_or(0, DeviceErrors::ptr) as *mut u32,
    };
    Ok(Some((args, grid, threads)))
}

/// The DMA backend: one `cuMemcpyAsync` per contiguous span; consecutive pairs `(s, d)`,
/// `(s+1, d+1)` merge when whole blocks are contiguous on both sides.
fn dma(
    op: &BlockCopy<'_>,
    geo: &Geometry,
    pairs: &[[i64; 2]],
    stream: StreamRef<'_>,
) -> Result<()> {
    let copy = |dst: u64, src: u64, bytes: u64| -> Result<()> {
        // SAFETY: both ranges lie in validated pools (device or pinned, mapped memory).
        check("cuMemcpyAsync", unsafe {
            cu::cuMemcpyAsync(dst, src, bytes as usize, stream.cu_stream())
        })
    };
    let valid: Vec<(u64, u64)> = pairs
        .iter()
        .filter(|p| p[0] >= 0 && p[1] >= 0)
        .map(|p| (p[0] as u64, p[1] as u64))
        .collect();
    let [nl, np, nt, nh] = geo.ext;
    let mut i = 0;
    while i < valid.len() {
        let (s0, d0) = valid[i];
        let mut run = 1;
        if geo.block_contiguous {
            while i + run < valid.len() && valid[i + run] == (s0 + run as u64, d0 + run as u64) {
                run += 1;
            }
        }
        for l in 0..nl {
            for p in 0..np {
                for t in 0..nt {
                    for h in 0..nh {
                        copy(
                            op.dst.addr(d0, l, p, t, h),
                            op.src.addr(s0, l, p, t, h),
                            geo.chunk * run as u64,
                        )?;
                    }
                }
            }
        }
        i += run;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Shapes used throughout: blocks, layers, block_size, heads, head_dim, elem_bytes.
    const NB: usize = 4;
    const L: usize = 3;
    const BS: usize = 16;
    const H: usize = 8;
    const D: usize = 128;
    const E: usize = 2;

    const SRC: u64 = 0x1000_0000;
    const DST: u64 = 0x8000_0000;

    fn bytes(ptr: u64, len: usize) -> DeviceBytes {
        // SAFETY: these views are only validated, never used.
        unsafe { DeviceBytes::from_raw(ptr, len) }
    }

    /// Bytes of a whole pool of `nb` blocks (every layer, K and V).
    fn pool_bytes(nb: usize, l: usize, bs: usize, h: usize, d: usize, e: usize) -> usize {
        nb * l * 2 * bs * h * d * e
    }

    fn nhd(
        at: u64,
        nb: usize,
        l: usize,
        bs: usize,
        h: usize,
        d: usize,
        e: usize,
    ) -> BlockPool<'static> {
        BlockPool::cross_layer_nhd(
            bytes(at, pool_bytes(nb, l, bs, h, d, e)),
            nb,
            l,
            bs,
            h,
            d,
            e,
        )
    }

    fn hnd(
        at: u64,
        nb: usize,
        l: usize,
        bs: usize,
        h: usize,
        d: usize,
        e: usize,
    ) -> BlockPool<'static> {
        BlockPool::cross_layer_hnd(
            bytes(at, pool_bytes(nb, l, bs, h, d, e)),
            nb,
            l,
            bs,
            h,
            d,
            e,
        )
    }

    /// SGLang-style layer-first pool in one allocation: `[2, L, NB, bs, H, D]` (parts outer).
    fn layer_first(
        at: u64,
        nb: usize,
        l: usize,
        bs: usize,
        h: usize,
        d: usize,
        e: usize,
    ) -> BlockPool<'static> {
        let cache = nb * bs * h * d * e;
        BlockPool {
            bases: Bases::Strided {
                mem: bytes(at, pool_bytes(nb, l, bs, h, d, e)),
                layer_stride: cache,
                part_stride: l * cache,
            },
            layers: l,
            parts: 2,
            layout: PagedLayout::nhd(nb, bs, h, d, e),
        }
    }

    fn op<'a>(src: BlockPool<'a>, dst: BlockPool<'a>, map: &'a [[i64; 2]]) -> BlockCopy<'a> {
        BlockCopy {
            src,
            dst,
            map: BlockMap::Host(map),
            backend: Backend::Auto,
            max_ctas: None,
            staging: None,
            errors: None,
        }
    }

    fn device(_: u64) -> MemoryKind {
        MemoryKind::Device
    }

    fn geo(src: BlockPool<'_>, dst: BlockPool<'_>) -> Result<Geometry> {
        geometry(&op(src, dst, &[]), device)
    }

    fn assert_invalid<T: std::fmt::Debug>(r: Result<T>, want: &'static str) {
        match r {
            Err(Error::InvalidArgument { name, .. }) if name == want => {}
            other => panic!("expected InvalidArgument {{ name: {want:?} }}, got {other:?}"),
        }
    }

    // ---- merging -------------------------------------------------------------------------

    #[test]
    fn cross_layer_nhd_to_itself_merges_whole_blocks() {
        let g = geo(nhd(SRC, NB, L, BS, H, D, E), nhd(DST, 7, L, BS, H, D, E)).unwrap();
        assert_eq!(
            g,
            Geometry {
                ext: [1, 1, 1, 1],
                chunk: (L * 2 * BS * H * D * E) as u64,
                block_contiguous: true,
                host_involved: false,
            }
        );
    }

    #[test]
    fn cross_layer_nhd_to_layer_first_merges_tokens_and_heads_only() {
        let want = Geometry {
            ext: [L as u64, 2, 1, 1],
            chunk: (BS * H * D * E) as u64,
            block_contiguous: false,
            host_involved: false,
        };
        let g = geo(
            nhd(SRC, NB, L, BS, H, D, E),
            layer_first(DST, NB, L, BS, H, D, E),
        )
        .unwrap();
        assert_eq!(g, want);
        // Either direction.
        let g = geo(
            layer_first(SRC, NB, L, BS, H, D, E),
            nhd(DST, NB, L, BS, H, D, E),
        )
        .unwrap();
        assert_eq!(g, want);
        // Layer-first to layer-first (different pool sizes): blocks contiguous per cache only.
        let g = geo(
            layer_first(SRC, NB, L, BS, H, D, E),
            layer_first(DST, 9, L, BS, H, D, E),
        )
        .unwrap();
        assert_eq!(g, want);
    }

    #[test]
    fn nhd_to_hnd_merges_nothing_beyond_head_dim() {
        let want = Geometry {
            ext: [L as u64, 2, BS as u64, H as u64],
            chunk: (D * E) as u64,
            block_contiguous: false,
            host_involved: false,
        };
        let g = geo(nhd(SRC, NB, L, BS, H, D, E), hnd(DST, NB, L, BS, H, D, E)).unwrap();
        assert_eq!(g, want);
        let g = geo(hnd(SRC, NB, L, BS, H, D, E), nhd(DST, NB, L, BS, H, D, E)).unwrap();
        assert_eq!(g, want);
    }

    #[test]
    fn cross_layer_hnd_to_itself_merges_whole_blocks() {
        // The head dimension is outermost in HND: it merges last, after layers and parts.
        let g = geo(hnd(SRC, NB, L, BS, H, D, E), hnd(DST, NB, L, BS, H, D, E)).unwrap();
        assert_eq!(
            g,
            Geometry {
                ext: [1, 1, 1, 1],
                chunk: (H * L * 2 * BS * D * E) as u64,
                block_contiguous: true,
                host_involved: false,
            }
        );
    }

    #[test]
    fn one_head_makes_nhd_and_hnd_identical() {
        let g = geo(nhd(SRC, NB, L, BS, 1, D, E), hnd(DST, NB, L, BS, 1, D, E)).unwrap();
        assert_eq!(
            g,
            Geometry {
                ext: [1, 1, 1, 1],
                chunk: (L * 2 * BS * D * E) as u64,
                block_contiguous: true,
                host_involved: false,
            }
        );
        let g = geo(
            nhd(SRC, NB, L, BS, 1, D, E),
            layer_first(DST, NB, L, BS, 1, D, E),
        )
        .unwrap();
        assert_eq!(
            g,
            Geometry {
                ext: [L as u64, 2, 1, 1],
                chunk: (BS * D * E) as u64,
                block_contiguous: false,
                host_involved: false,
            }
        );
    }

    #[test]
    fn one_layer_one_token_one_head() {
        // Every count 1 except parts: the chunk is K (or V) of one token of one head.
        let g = geo(
            nhd(SRC, NB, 1, 1, 1, 64, 4),
            layer_first(DST, NB, 1, 1, 1, 64, 4),
        )
        .unwrap();
        assert_eq!(
            g,
            Geometry {
                ext: [1, 2, 1, 1],
                chunk: 64 * 4,
                block_contiguous: false,
                host_involved: false,
            }
        );
    }

    // ---- memory kinds --------------------------------------------------------------------

    #[test]
    fn host_involved_iff_a_pool_is_pinned_host() {
        let (s, d) = (nhd(SRC, NB, L, BS, H, D, E), nhd(DST, NB, L, BS, H, D, E));
        let cases = [
            (None, false),
            (Some(SRC), true),
            (Some(DST), true),
            (Some(u64::MAX), false),
        ];
        for (host, want) in cases {
            let g = geometry(&op(s, d, &[]), |p| {
                if Some(p) == host {
                    MemoryKind::PinnedHost
                } else {
                    MemoryKind::Device
                }
            })
            .unwrap();
            assert_eq!(g.host_involved, want, "host pool at {host:x?}");
        }
        let g = geometry(&op(s, d, &[]), |_| MemoryKind::PinnedHost).unwrap();
        assert!(g.host_involved);
    }

    #[test]
    fn unreachable_memory_rejected() {
        let (s, d) = (nhd(SRC, NB, L, BS, H, D, E), nhd(DST, NB, L, BS, H, D, E));
        for bad in [MemoryKind::Unregistered, MemoryKind::Other] {
            let r = geometry(&op(s, d, &[]), |p| {
                if p == DST {
                    bad
                } else {
                    MemoryKind::Device
                }
            });
            assert_eq!(
                r,
                Err(Error::NotDeviceAccessible {
                    name: "dst",
                    ptr: DST
                })
            );
            let r = geometry(&op(s, d, &[]), |p| {
                if p == SRC {
                    bad
                } else {
                    MemoryKind::PinnedHost
                }
            });
            assert_eq!(
                r,
                Err(Error::NotDeviceAccessible {
                    name: "src",
                    ptr: SRC
                })
            );
        }
    }

    // ---- rejections ----------------------------------------------------------------------

    #[test]
    fn differing_pool_sizes_accepted() {
        assert!(geo(nhd(SRC, 1, L, BS, H, D, E), nhd(DST, 100, L, BS, H, D, E)).is_ok());
    }

    #[test]
    fn mismatched_shapes_rejected() {
        let s = nhd(SRC, NB, L, BS, H, D, E);
        assert!(geo(s, nhd(DST, NB, L, BS, H, D, E)).is_ok());
        assert_invalid(geo(s, nhd(DST, NB, L + 1, BS, H, D, E)), "dst");
        assert_invalid(geo(s, nhd(DST, NB, L, BS / 2, H, D, E)), "dst");
        assert_invalid(geo(s, nhd(DST, NB, L, BS, H / 2, D, E)), "dst");
        assert_invalid(geo(s, nhd(DST, NB, L, BS, H, D * 2, E)), "dst");
        assert_invalid(geo(s, nhd(DST, NB, L, BS, H, D, 4)), "dst");
        assert_invalid(geo(s, nhd(DST, NB, L, BS, H, D, 1)), "dst");
        // One part (a combined or MLA cache) against two.
        let cache = NB * BS * H * D * E;
        let one_part = BlockPool {
            bases: Bases::Strided {
                mem: bytes(DST, L * cache),
                layer_stride: cache,
                part_stride: 0,
            },
            layers: L,
            parts: 1,
            layout: PagedLayout::nhd(NB, BS, H, D, E),
        };
        assert!(geo(one_part, one_part).is_ok());
        assert_invalid(geo(s, one_part), "dst");
        assert_invalid(geo(one_part, s), "dst");
    }

    #[test]
    fn pool_memory_too_small_rejected() {
        let need = pool_bytes(NB, L, BS, H, D, E);
        let short = |at| BlockPool::cross_layer_nhd(bytes(at, need - 1), NB, L, BS, H, D, E);
        let ok = nhd(DST, NB, L, BS, H, D, E);
        let want = |name| {
            Err(Error::BufferTooSmall {
                name,
                needed: need as u64,
                len: need as u64 - 1,
            })
        };
        assert_eq!(geo(short(SRC), ok), want("src"));
        assert_eq!(geo(ok, short(SRC)), want("dst"));
        let mut lf = layer_first(DST, NB, L, BS, H, D, E);
        if let Bases::Strided { ref mut mem, .. } = lf.bases {
            *mem = bytes(DST, need - 1);
        }
        assert_eq!(geo(nhd(SRC, NB, L, BS, H, D, E), lf), want("dst"));
    }

    #[test]
    fn overlapping_layer_and_part_strides_rejected() {
        let part = BS * H * D * E;
        let with = |layer_stride, part_stride| {
            let mut p = nhd(SRC, NB, L, BS, H, D, E);
            p.bases = Bases::Strided {
                mem: bytes(SRC, 4 * pool_bytes(NB, L, BS, H, D, E)),
                layer_stride,
                part_stride,
            };
            p
        };
        let ok = nhd(DST, NB, L, BS, H, D, E);
        assert!(geo(with(2 * part, part), ok).is_ok());
        // K and V on the same bytes.
        assert_invalid(geo(with(2 * part, 0), ok), "src");
        // V of layer l is K of layer l + 1.
        assert_invalid(geo(ok, with(part, part)), "dst");
        // K of layer l + 1 starts inside V of layer l.
        assert_invalid(geo(with(2 * part - E, part), ok), "src");
        // V starts inside K.
        assert_invalid(geo(with(2 * part, part - 1), ok), "src");
    }

    #[test]
    fn zero_layers_or_parts_rejected() {
        let ok = nhd(DST, NB, L, BS, H, D, E);
        let mut z = nhd(SRC, NB, L, BS, H, D, E);
        z.layers = 0;
        assert_invalid(geo(z, ok), "src");
        assert_invalid(geo(ok, z), "dst");
        let mut z = nhd(SRC, NB, L, BS, H, D, E);
        z.parts = 0;
        assert_invalid(geo(z, ok), "src");
    }

    #[test]
    fn stride_overflow_rejected() {
        let mut p = nhd(SRC, NB, L, BS, H, D, E);
        p.bases = Bases::Strided {
            mem: bytes(SRC, usize::MAX),
            layer_stride: usize::MAX,
            part_stride: 0,
        };
        let r = geo(p, nhd(DST, NB, L, BS, H, D, E));
        assert_eq!(r, Err(Error::Overflow { name: "src" }));
    }

    // ---- host block maps -----------------------------------------------------------------

    /// Disjoint pools: src of 4 blocks, dst of 6.
    fn disjoint() -> (BlockPool<'static>, BlockPool<'static>) {
        (nhd(SRC, 4, 2, 4, 2, 8, 2), hnd(DST, 6, 2, 4, 2, 8, 2))
    }

    fn check(src: BlockPool<'_>, dst: BlockPool<'_>, pairs: &[[i64; 2]]) -> Result<()> {
        check_host_map(&op(src, dst, pairs), pairs)
    }

    #[test]
    fn host_map_ids_in_range_accepted() {
        let (s, d) = disjoint();
        assert_eq!(check(s, d, &[]), Ok(()));
        assert_eq!(check(s, d, &[[0, 0], [3, 5], [3, 4], [1, 1]]), Ok(()));
    }

    #[test]
    fn host_map_src_out_of_range() {
        let (s, d) = disjoint();
        // 4 is a valid destination but not a valid source.
        let r = check(s, d, &[[0, 0], [1, 1], [4, 2]]);
        assert_eq!(
            r,
            Err(Error::IndexOutOfRange {
                name: "map.src",
                at: 2,
                value: 4,
                limit: 4
            })
        );
        let r = check(s, d, &[[i64::MAX, 0]]);
        assert_eq!(
            r,
            Err(Error::IndexOutOfRange {
                name: "map.src",
                at: 0,
                value: i64::MAX,
                limit: 4
            })
        );
    }

    #[test]
    fn host_map_dst_out_of_range() {
        let (s, d) = disjoint();
        let r = check(s, d, &[[0, 5], [1, 6]]);
        assert_eq!(
            r,
            Err(Error::IndexOutOfRange {
                name: "map.dst",
                at: 1,
                value: 6,
                limit: 6
            })
        );
        // The first bad pair is reported.
        let r = check(s, d, &[[0, 0], [2, 100], [9, 1]]);
        assert_eq!(
            r,
            Err(Error::IndexOutOfRange {
                name: "map.dst",
                at: 1,
                value: 100,
                limit: 6
            })
        );
    }

    #[test]
    fn host_map_duplicate_destination() {
        let (s, d) = disjoint();
        let r = check(s, d, &[[0, 2], [1, 3], [3, 2]]);
        assert_eq!(
            r,
            Err(Error::Overlap {
                name: "map.dst",
                first: 0,
                second: 2
            })
        );
        // Same source twice is fine.
        assert_eq!(check(s, d, &[[0, 2], [0, 3]]), Ok(()));
    }

    #[test]
    fn host_map_negative_ids_are_padding() {
        let (s, d) = disjoint();
        let pairs = [
            [-1, -1],
            [-1, -1],
            [-1, 0],
            [-1, 0],
            [0, -1],
            [0, -1],
            [i64::MIN, 99],
            [99, i64::MIN],
            [1, 0],
        ];
        assert_eq!(check(s, d, &pairs), Ok(()));
        // Padding in a pool that shares memory does not count as a read or a write.
        let p = nhd(SRC, 4, 2, 4, 2, 8, 2);
        assert_eq!(check(p, p, &[[-1, 1], [1, 2], [3, -1], [2, -5]]), Ok(()));
    }

    #[test]
    fn host_map_shared_memory_block_read_and_written() {
        let p = nhd(SRC, 4, 2, 4, 2, 8, 2);
        // Block 1 is written by pair 0 and read by pair 1.
        let r = check(p, p, &[[0, 1], [1, 2]]);
        assert_eq!(
            r,
            Err(Error::Overlap {
                name: "map",
                first: 1,
                second: 0
            })
        );
        // A block copied onto itself.
        let r = check(p, p, &[[3, 3]]);
        assert_eq!(
            r,
            Err(Error::Overlap {
                name: "map",
                first: 0,
                second: 0
            })
        );
        // Same memory, other layout: still shared.
        let q = hnd(SRC, 4, 2, 4, 2, 8, 2);
        assert!(matches!(
            check(p, q, &[[0, 1], [1, 2]]),
            Err(Error::Overlap { name: "map", .. })
        ));
        // Disjoint sets of blocks in shared memory are fine (copy-on-write, defragmentation).
        assert_eq!(check(p, p, &[[0, 2], [1, 3]]), Ok(()));
    }

    #[test]
    fn host_map_disjoint_memory_same_ids_fine() {
        let (s, d) = disjoint();
        assert_eq!(check(s, d, &[[0, 0], [1, 1], [2, 2], [3, 3]]), Ok(()));
        assert_eq!(check(s, d, &[[0, 1], [1, 2]]), Ok(()));
        // Adjacent (touching, not overlapping) allocations are disjoint too.
        let a = nhd(SRC, 4, 2, 4, 2, 8, 2);
        let b = nhd(SRC + pool_bytes(4, 2, 4, 2, 8, 2) as u64, 4, 2, 4, 2, 8, 2);
        assert_eq!(check(a, b, &[[0, 1], [1, 2]]), Ok(()));
        assert_eq!(check(b, a, &[[0, 1], [1, 2]]), Ok(()));
        // One byte of overlap makes them shared: only a pair touching that byte collides.
        let c = nhd(
            SRC + pool_bytes(4, 2, 4, 2, 8, 2) as u64 - 1,
            4,
            2,
            4,
            2,
            8,
            2,
        );
        assert_eq!(check(a, c, &[[0, 1], [1, 2]]), Ok(()));
        assert!(matches!(
            check(a, c, &[[3, 0]]),
            Err(Error::Overlap { name: "map", .. })
        ));
    }

    #[test]
    fn host_map_shared_memory_offset_views_compare_bytes() {
        // dst views the same allocation one block further on, in HND order: dst block 0 is
        // the bytes of src block 1, rewritten in another order while they are read (a race).
        let block = pool_bytes(1, 2, 4, 2, 8, 2);
        let src = nhd(SRC, 4, 2, 4, 2, 8, 2);
        let dst = hnd(SRC + block as u64, 3, 2, 4, 2, 8, 2);
        let race = check(src, dst, &[[1, 0]]);
        assert!(
            matches!(race, Err(Error::Overlap { name: "map", .. })),
            "{race:?}"
        );
        // src block 0 -> dst block 0 (= src block 1) touches no byte twice.
        assert_eq!(check(src, dst, &[[0, 0]]), Ok(()));
    }

    // ---- layer views ---------------------------------------------------------------------

    #[test]
    fn layer_view_of_cross_layer_nhd() {
        let pool = nhd(SRC, NB, L, BS, H, D, E);
        let part = (BS * H * D * E) as u64;
        let ext = pool.layout.extent("x").unwrap() as usize;
        for l in 0..L {
            let (k, v, layout) = pool.layer_view(l).unwrap();
            let k_at = SRC + l as u64 * 2 * part;
            assert_eq!(k, bytes(k_at, ext), "layer {l}");
            assert_eq!(v, Some(bytes(k_at + part, ext)), "layer {l}");
            assert_eq!(layout, pool.layout);
        }
        // The last view ends exactly at the end of the pool.
        let (_, v, _) = pool.layer_view(L - 1).unwrap();
        let v = v.unwrap();
        assert_eq!(
            v.ptr() + v.len() as u64,
            SRC + pool_bytes(NB, L, BS, H, D, E) as u64
        );
    }

    #[test]
    fn layer_view_out_of_range() {
        let pool = nhd(SRC, NB, L, BS, H, D, E);
        for layer in [L, L + 1, usize::MAX / 2] {
            assert_eq!(
                pool.layer_view(layer),
                Err(Error::IndexOutOfRange {
                    name: "layer",
                    at: 0,
                    value: layer as i64,
                    limit: L as u64
                })
            );
        }
    }

    #[test]
    fn layer_view_of_one_part_pool_has_no_value() {
        let cache = NB * BS * H * D * E;
        let pool = BlockPool {
            bases: Bases::Strided {
                mem: bytes(SRC, L * cache),
                layer_stride: cache,
                part_stride: 0,
            },
            layers: L,
            parts: 1,
            layout: PagedLayout::nhd(NB, BS, H, D, E),
        };
        let (k, v, _) = pool.layer_view(2).unwrap();
        assert_eq!((k, v), (bytes(SRC + 2 * cache as u64, cache), None));
    }

    #[test]
    fn layer_view_checks_the_pool() {
        let mut pool = nhd(SRC, NB, L, BS, H, D, E);
        pool.bases = Bases::Strided {
            mem: bytes(SRC, pool_bytes(NB, L, BS, H, D, E) - 1),
            layer_stride: 2 * BS * H * D * E,
            part_stride: BS * H * D * E,
        };
        assert!(matches!(
            pool.layer_view(0),
            Err(Error::BufferTooSmall { name: "pool", .. })
        ));
    }

    #[test]
    fn cross_layer_bytes_sizes_and_overflows() {
        assert_eq!(
            BlockPool::cross_layer_bytes(10, 4, 16, 8, 128, 2),
            Ok(10 * 4 * 2 * 16 * 8 * 128 * 2)
        );
        let b = BlockPool::cross_layer_bytes(3, 2, 4, 2, 8, 2).unwrap();
        let mem = unsafe_bytes(0x1000, b);
        assert!(BlockPool::cross_layer_nhd(mem, 3, 2, 4, 2, 8, 2)
            .extent("p")
            .is_ok());
        assert!(BlockPool::cross_layer_hnd(mem, 3, 2, 4, 2, 8, 2)
            .extent("p")
            .is_ok());
        assert!(
            BlockPool::cross_layer_nhd(unsafe_bytes(0x1000, b - 1), 3, 2, 4, 2, 8, 2)
                .extent("p")
                .is_err()
        );
        assert_eq!(
            BlockPool::cross_layer_bytes(usize::MAX / 4, 4, 16, 8, 128, 2),
            Err(Error::Overflow {
                name: "cross_layer_bytes"
            })
        );
    }

    fn unsafe_bytes(ptr: u64, len: usize) -> DeviceBytes {
        // SAFETY: only validated, never used.
        unsafe { DeviceBytes::from_raw(ptr, len) }
    }
}
