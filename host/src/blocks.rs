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
//! [`Backend::Auto`] picks DMA when the contiguous span is large (≥ [`DMA_MIN_SPAN`]) and the
//! kernel otherwise (DMA loses badly on small copies: vLLM #42212).

use cust::sys as cu;
use kvio_kernels::index::{access_width, group_shift};

use crate::alloc::{memory_kind, LayerTable, MemoryKind};
use crate::driver::{check, Params, StreamRef};
use crate::error::{invalid, Error, Result};
use crate::layout::{chunks_disjoint, PagedLayout};
use crate::mem::{DeviceBytes, DeviceErrors};
use crate::module::Kvio;
use crate::write::BLOCK_THREADS;

/// Contiguous span (bytes) from which [`Backend::Auto`] prefers the copy engines.
pub const DMA_MIN_SPAN: usize = 28 * 1024;
/// Default CTA budget of the kernel backend when a pool is in host memory.
pub const DEFAULT_TRANSFER_CTAS: u32 = 4;

/// Where the per-layer, per-part (K/V) bases of a pool come from.
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
        let part = block_size * heads * head_dim;
        let mut layout = PagedLayout::nhd(num_blocks, block_size, heads, head_dim, elem_bytes);
        layout.block_stride = layers * 2 * part;
        BlockPool {
            bases: Bases::Strided {
                mem,
                layer_stride: 2 * part * elem_bytes,
                part_stride: part * elem_bytes,
            },
            layers,
            parts: 2,
            layout,
        }
    }

    /// Cross-layer blocks in the HND order `(NB, H, L, 2, bs, D)`.
    pub fn cross_layer_hnd(
        mem: DeviceBytes,
        num_blocks: usize,
        layers: usize,
        block_size: usize,
        heads: usize,
        head_dim: usize,
        elem_bytes: usize,
    ) -> Self {
        let part = block_size * head_dim;
        let layout = PagedLayout {
            num_blocks,
            block_size,
            num_heads: heads,
            head_dim,
            elem_bytes,
            block_stride: heads * layers * 2 * part,
            token_stride: head_dim,
            head_stride: layers * 2 * part,
        };
        BlockPool {
            bases: Bases::Strided {
                mem,
                layer_stride: 2 * part * elem_bytes,
                part_stride: part * elem_bytes,
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// DMA for contiguous spans of at least [`DMA_MIN_SPAN`] bytes with a host map, the
    /// kernel otherwise.
    Auto,
    /// Copy engines: one async copy per contiguous span.
    Dma,
    /// SM threads.
    Kernel,
}

/// Arguments of [`Kvio::copy_blocks`].
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
    let src_ext = s.extent("src")?;
    let dst_ext = d.extent("dst")?;
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
    // Memory the pools live in: device or pinned host, nothing else.
    let mut host_involved = false;
    for (name, pool, ext) in [("src", s, src_ext), ("dst", d, dst_ext)] {
        for (lo, _) in pool.ranges(ext) {
            match kind_of(lo) {
                MemoryKind::Device => {}
                MemoryKind::PinnedHost => host_involved = true,
                _ => return Err(Error::NotDeviceAccessible { name, ptr: lo }),
            }
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
    }
    Ok(())
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
    /// assert_eq!(backend, Backend::Dma); // 1 MiB contiguous blocks: the copy engines win
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
                if geo.chunk as usize >= DMA_MIN_SPAN || op.staging.is_none() {
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
                if pairs.ptr() % 8 != 0 {
                    return Err(invalid("map.pairs", pairs.ptr(), "must be 8-byte aligned"));
                }
                (pairs, len)
            }
            BlockMap::Host(host) => {
                let staging = op.staging.expect("checked by copy_blocks");
                let need = host.len() * 16;
                if need > staging.len() || staging.ptr() % 8 != 0 {
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
        let items = (n as u64).saturating_mul(geo.ext.iter().product());
        if items == 0 {
            return Ok(());
        }
        let side = |p: &BlockPool<'_>| -> [u64; 7] {
            let e = p.layout.elem_bytes as u64;
            let (base, table, ls, ps) = match p.bases {
                Bases::Strided {
                    mem,
                    layer_stride,
                    part_stride,
                } => (mem.ptr(), 0, layer_stride as u64, part_stride as u64),
                Bases::Table(t) => (0, t.ptr(), 0, 0),
            };
            [
                base,
                table,
                ls,
                ps,
                p.layout.block_stride as u64 * e,
                p.layout.token_stride as u64 * e,
                p.layout.head_stride as u64 * e,
            ]
        };
        let (s, d) = (side(&op.src), side(&op.dst));
        let mut widths = vec![geo.chunk];
        widths.extend_from_slice(&s);
        widths.extend_from_slice(&d);
        if let Bases::Table(t) = op.src.bases {
            widths.extend(t.entries().iter().map(DeviceBytes::ptr));
        }
        if let Bases::Table(t) = op.dst.bases {
            widths.extend(t.entries().iter().map(DeviceBytes::ptr));
        }
        let width = access_width(&widths);
        let shift = group_shift(geo.chunk / width as u64, 4);
        let budget = op.max_ctas.unwrap_or(if geo.host_involved {
            DEFAULT_TRANSFER_CTAS
        } else {
            self.sm_count * 8
        });
        let groups = (BLOCK_THREADS >> shift) as u64;
        let grid = items.div_ceil(groups).clamp(1, budget.max(1) as u64) as u32;
        let [l, p, t, h] = geo.ext;
        Params::new([
            s[0],
            s[1],
            s[2],
            s[3],
            s[4],
            s[5],
            s[6],
            d[0],
            d[1],
            d[2],
            d[3],
            d[4],
            d[5],
            d[6],
            l,
            p,
            t,
            h,
            geo.chunk,
            pairs.ptr(),
            n as u64,
            op.src.layout.num_blocks as u64,
            op.dst.layout.num_blocks as u64,
            width as u64,
            shift as u64,
            op.errors.map_or(0, DeviceErrors::ptr),
        ])
        .launch(self.copy_blocks, grid, BLOCK_THREADS, stream)
    }
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
