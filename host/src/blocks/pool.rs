//! Pool descriptors: where a pool's layer/part caches start ([`Bases`]) and how each is laid
//! out ([`BlockPool`]), with the validation every block copy runs on both of its pools.

use std::marker::PhantomData;

use kvio_kernels::index::PoolSide;

use crate::alloc::LayerTable;
use crate::error::{invalid, Error, Result};
use crate::layout::{chunks_disjoint, PagedLayout};
use crate::mem::{DeviceBytes, DeviceBytesMut};

/// Access marker of a [`BlockPool`] built on read views ([`DeviceBytes`]): a copy's source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadOnly;

/// Access marker of a [`BlockPool`] built on write views ([`DeviceBytesMut`], or a
/// [`LayerTable`], which holds write views): a copy's destination, or its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Writable;

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::mem::DeviceBytes<'_> {}
    impl Sealed for crate::mem::DeviceBytesMut<'_> {}
}

/// The memory a strided [`BlockPool`] is built on: a [`DeviceBytes`] makes a [`ReadOnly`]
/// pool, a [`DeviceBytesMut`] a [`Writable`] one.
pub trait PoolMemory<'a>: sealed::Sealed + Copy {
    /// The pool's access marker.
    type Access: Copy;
    /// The memory as a plain (read) view.
    fn view(self) -> DeviceBytes<'a>;
}

impl<'a> PoolMemory<'a> for DeviceBytes<'a> {
    type Access = ReadOnly;
    fn view(self) -> DeviceBytes<'a> {
        self
    }
}

impl<'a> PoolMemory<'a> for DeviceBytesMut<'a> {
    type Access = Writable;
    fn view(self) -> DeviceBytes<'a> {
        self.as_read()
    }
}

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
/// let layer_first = BlockPool::strided(mem, cache, l * cache, l, 2, PagedLayout::nhd(nb, bs, h, d, e));
/// assert!(matches!(layer_first.bases(), Bases::Strided { layer_stride, .. } if layer_stride == cache));
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
        mem: DeviceBytes<'a>,
        /// Bytes between layers.
        layer_stride: usize,
        /// Bytes between K and V.
        part_stride: usize,
    },
    /// Layer-separate caches reached through a device-resident pointer table.
    Table(&'a LayerTable<'a>),
}

/// A pool of KV blocks: `layers × parts` caches (parts = 2 for K and V, 1 for a combined or
/// MLA cache), each laid out as `layout` (its block, token and head strides).
///
/// `A` says whether the pool may be written: [`Writable`] when built on write views
/// ([`DeviceBytesMut`], a [`LayerTable`]), [`ReadOnly`] on read views. A copy's destination
/// must be writable; any pool converts into a read-only one (`.into()`, [`BlockPool::read`]).
#[derive(Clone, Copy, Debug)]
pub struct BlockPool<'a, A = ReadOnly> {
    /// Where each layer/part cache starts (read with [`BlockPool::bases`]; private so that a
    /// writable pool keeps the memory it was built on).
    pub(crate) bases: Bases<'a>,
    /// Number of layers.
    pub layers: usize,
    /// Caches per layer (2: K and V).
    pub parts: usize,
    /// Layout of one layer/part cache (strides in elements, `num_blocks` = pool size); of
    /// part 0 (K) when `value_layout` is given.
    pub layout: PagedLayout,
    /// Layout of part 1 (V) where it differs from `layout`: vLLM's v0 caches
    /// ([`PagedLayout::v0_key`] K, [`PagedLayout::v0_value`] V). Set with
    /// [`BlockPool::value_layout`].
    pub value_layout: Option<PagedLayout>,
    /// `Some(p)`: a one-part view of part `p` of a pool whose table holds every part (the
    /// planner's view of one part of a pool with a `value_layout`).
    pub(crate) part_of: Option<usize>,
    access: PhantomData<A>,
}

impl<'a> From<BlockPool<'a, Writable>> for BlockPool<'a, ReadOnly> {
    fn from(p: BlockPool<'a, Writable>) -> Self {
        p.read()
    }
}

impl BlockPool<'_> {
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
}

impl<'a> BlockPool<'a, Writable> {
    /// Layer-separate caches (each `layout`, e.g. [`PagedLayout::nhd`] or
    /// [`PagedLayout::hnd`]) reached through `table`.
    pub fn layer_separate(table: &'a LayerTable<'a>, layout: PagedLayout) -> Self {
        BlockPool {
            bases: Bases::Table(table),
            layers: table.layers(),
            parts: table.parts(),
            layout,
            value_layout: None,
            part_of: None,
            access: PhantomData,
        }
    }

    /// [`BlockPool::layer_view`] as write views, for the write path into this pool.
    pub fn layer_view_mut(
        &self,
        layer: usize,
    ) -> Result<(DeviceBytesMut<'a>, Option<DeviceBytesMut<'a>>, PagedLayout)> {
        let (k, v, layout) = self.layer_view(layer)?;
        // SAFETY: the views lie in the memory this writable pool was built on, which its write
        // view borrows exclusively for 'a.
        let w = |b: DeviceBytes<'a>| unsafe { DeviceBytesMut::from_raw(b.ptr(), b.len()) };
        Ok((w(k), v.map(w), layout))
    }
}

impl<'a, A: Copy> BlockPool<'a, A> {
    /// A pool of `layers × parts` caches in one allocation: layer `l`, part `p` starts at
    /// byte `l * layer_stride + p * part_stride` of `mem` (SGLang's layer-first host pool,
    /// vLLM's cross-layer blocks, ...).
    pub fn strided<M: PoolMemory<'a, Access = A>>(
        mem: M,
        layer_stride: usize,
        part_stride: usize,
        layers: usize,
        parts: usize,
        layout: PagedLayout,
    ) -> Self {
        BlockPool {
            bases: Bases::Strided {
                mem: mem.view(),
                layer_stride,
                part_stride,
            },
            layers,
            parts,
            layout,
            value_layout: None,
            part_of: None,
            access: PhantomData,
        }
    }

    /// Where each layer/part cache starts.
    pub fn bases(&self) -> Bases<'a> {
        self.bases
    }

    /// The same description as a copy destination, for computations that never touch the
    /// memory (NIXL descriptor counts): the result must not reach a kernel or a DMA.
    #[cfg(feature = "nixl")]
    pub(crate) fn description(&self) -> BlockPool<'a, Writable> {
        self.retyped()
    }

    /// The same pool, read-only (the source of a copy).
    pub fn read(&self) -> BlockPool<'a, ReadOnly> {
        self.retyped()
    }

    /// The same pool with part 1 (V) laid out as `layout` instead of [`BlockPool::layout`]:
    /// vLLM's v0 caches, whose key cache is [`PagedLayout::v0_key`] and value cache
    /// [`PagedLayout::v0_value`]. The pool needs two parts, `layout` the shape of the key
    /// layout (blocks, block size, heads, head size, element size), and both layouts whole
    /// blocks without gaps (v0 caches, contiguous NHD or HND caches); a block copy checks.
    ///
    /// Copies between pools whose parts agree inside a block move whole blocks; otherwise
    /// each part is converted on its own (one launch, or one set of DMA spans, per part).
    ///
    /// ```
    /// use kvio::{BlockPool, DeviceBytes, PagedLayout};
    /// let (nb, l, bs, h, d, e) = (100, 4, 16, 8, 128, 2);
    /// let (k, v) = (PagedLayout::v0_key(nb, bs, h, d, e), PagedLayout::v0_value(nb, bs, h, d, e));
    /// let cache = k.extent("k").unwrap() as usize; // bytes of one layer's K (or V)
    /// // SAFETY: a description only.
    /// let mem = unsafe { DeviceBytes::from_raw(0x1000, 2 * l * cache) };
    /// // K and V of each layer one after another (mistral.rs keeps one tensor each).
    /// let pool = BlockPool::strided(mem, 2 * cache, cache, l, 2, k).value_layout(v);
    /// assert_eq!((pool.part_layout(0), pool.part_layout(1)), (k, v));
    /// ```
    pub fn value_layout(self, layout: PagedLayout) -> Self {
        BlockPool {
            value_layout: Some(layout),
            ..self
        }
    }

    /// The layout of part `part` (`value_layout` for part 1 where given, else `layout`).
    pub fn part_layout(&self, part: usize) -> PagedLayout {
        match (part, self.value_layout) {
            (1, Some(v)) => v,
            _ => self.layout,
        }
    }

    /// A one-part view of part `part` (< `parts`) of this pool, laid out as that part: the
    /// planner moves each part of a pool with a `value_layout` on its own.
    pub(crate) fn part(&self, part: usize) -> Result<Self> {
        let bases = match self.bases {
            Bases::Strided {
                mem,
                layer_stride,
                part_stride,
            } => {
                let at = part.saturating_mul(part_stride).min(mem.len());
                Bases::Strided {
                    mem: mem.slice(at, mem.len() - at)?,
                    layer_stride,
                    part_stride,
                }
            }
            table => table,
        };
        Ok(BlockPool {
            bases,
            layers: self.layers,
            parts: 1,
            layout: self.part_layout(part),
            value_layout: None,
            part_of: Some(part),
            access: PhantomData,
        })
    }

    /// Bytes of one block of one layer/part when the pool moves whole blocks whatever their
    /// order inside (head vectors in pieces, or a `value_layout`: checked dense by
    /// [`BlockPool::extent`]); `None` for pools addressed chunk by chunk.
    pub(crate) fn dense_block(&self) -> Option<u64> {
        if self.layout.is_pieced() || self.value_layout.is_some() {
            self.layout.dense_block_bytes()
        } else {
            None
        }
    }

    /// The OR of the pool's table bases (0: strided, whose base enters through its side):
    /// what alignment checks need of a table without reading every entry.
    pub(crate) fn bases_or(&self) -> u64 {
        match self.bases {
            Bases::Table(t) => t.bases_or(),
            Bases::Strided { .. } => 0,
        }
    }

    /// Parts per layer of the pool's table (`None`: strided).
    pub(crate) fn table_parts(&self) -> Option<usize> {
        match self.bases {
            Bases::Table(t) => Some(t.parts()),
            Bases::Strided { .. } => None,
        }
    }

    /// Device address of the pool's table entry for layer 0 of its first part (`0`: strided).
    pub(crate) fn table_ptr(&self) -> u64 {
        match self.bases {
            Bases::Table(t) => t.ptr() + 8 * self.part_of.unwrap_or(0) as u64,
            Bases::Strided { .. } => 0,
        }
    }

    /// The same description with access marker `B` (callers decide whether that is sound).
    fn retyped<B>(&self) -> BlockPool<'a, B> {
        BlockPool {
            bases: self.bases,
            layers: self.layers,
            parts: self.parts,
            layout: self.layout,
            value_layout: self.value_layout,
            part_of: self.part_of,
            access: PhantomData,
        }
    }

    /// Cross-layer blocks of one part per layer, `(NB, L, bs, H, D)`: an MLA cache (one head of
    /// `kv_lora_rank + rope_dim` elements, DeepSeek) or a combined K|V cache, every layer of a
    /// block together. Its bytes: `num_blocks * layers * block_size * heads * head_dim * elem`.
    ///
    /// ```
    /// # fn main() -> kvio::Result<()> {
    /// let (nb, l, bs, row, e) = (10, 4, 64, 576, 2); // MLA: 512 + 64 elements a token
    /// # let mem = unsafe { kvio::DeviceBytes::from_raw(0x1000, nb * l * bs * row * e) };
    /// let pool = kvio::BlockPool::cross_layer_one_part(mem, nb, l, bs, 1, row, e);
    /// assert_eq!((pool.parts, pool.layout.block_stride), (1, l * bs * row));
    /// let (c, v, _) = pool.layer_view(1)?; // layer 1's cache, for `MlaUpdate`
    /// assert_eq!((c.ptr(), v), (0x1000 + (bs * row * e) as u64, None));
    /// # Ok(()) }
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn cross_layer_one_part<M: PoolMemory<'a, Access = A>>(
        mem: M,
        num_blocks: usize,
        layers: usize,
        block_size: usize,
        heads: usize,
        head_dim: usize,
        elem_bytes: usize,
    ) -> Self {
        Self::nhd_blocks(
            mem, num_blocks, layers, 1, block_size, heads, head_dim, elem_bytes,
        )
    }

    /// Cross-layer blocks in vLLM's FlashAttention NHD order `(NB, L, 2, bs, H, D)`: one block
    /// holds all layers, K then V, contiguously (vLLM #27743).
    ///
    /// ```
    /// # let mem = unsafe { kvio::DeviceBytes::from_raw(0x1000, 10 * 4 * 2 * 16 * 8 * 128 * 2) };
    /// let pool = kvio::BlockPool::cross_layer_nhd(mem, 10, 4, 16, 8, 128, 2);
    /// assert_eq!(pool.layout.block_stride, 4 * 2 * 16 * 8 * 128);
    /// ```
    pub fn cross_layer_nhd<M: PoolMemory<'a, Access = A>>(
        mem: M,
        num_blocks: usize,
        layers: usize,
        block_size: usize,
        heads: usize,
        head_dim: usize,
        elem_bytes: usize,
    ) -> Self {
        Self::nhd_blocks(
            mem, num_blocks, layers, 2, block_size, heads, head_dim, elem_bytes,
        )
    }

    /// Cross-layer NHD blocks `(NB, L, parts, bs, H, D)`.
    #[allow(clippy::too_many_arguments)]
    fn nhd_blocks<M: PoolMemory<'a, Access = A>>(
        mem: M,
        num_blocks: usize,
        layers: usize,
        parts: usize,
        block_size: usize,
        heads: usize,
        head_dim: usize,
        elem_bytes: usize,
    ) -> Self {
        let part = block_size.saturating_mul(heads).saturating_mul(head_dim);
        let mut layout = PagedLayout::nhd(num_blocks, block_size, heads, head_dim, elem_bytes);
        layout.block_stride = sat(&[layers, parts, part]);
        Self::cross_layer(mem, layers, parts, part, layout)
    }

    /// Cross-layer blocks in the HND order `(NB, H, L, 2, bs, D)`.
    ///
    /// ```
    /// # let mem = unsafe { kvio::DeviceBytes::from_raw(0x1000, 10 * 8 * 4 * 2 * 16 * 128 * 2) };
    /// let pool = kvio::BlockPool::cross_layer_hnd(mem, 10, 4, 16, 8, 128, 2);
    /// assert_eq!(pool.layout.head_stride, 4 * 2 * 16 * 128); // a head holds every layer's K and V
    /// assert_eq!(pool.layout.token_stride, 128);
    /// ```
    pub fn cross_layer_hnd<M: PoolMemory<'a, Access = A>>(
        mem: M,
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
            piece_elems: head_dim,
            piece_stride: head_dim,
        };
        Self::cross_layer(mem, layers, 2, part, layout)
    }

    /// A cross-layer pool: in each block, layer `l`'s `parts` parts (K then V), `part`
    /// elements each.
    fn cross_layer<M: PoolMemory<'a, Access = A>>(
        mem: M,
        layers: usize,
        parts: usize,
        part: usize,
        layout: PagedLayout,
    ) -> Self {
        let e = layout.elem_bytes;
        Self::strided(
            mem,
            sat(&[parts, part, e]),
            sat(&[part, e]),
            layers,
            parts,
            layout,
        )
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
    ) -> Result<(DeviceBytes<'a>, Option<DeviceBytes<'a>>, PagedLayout)> {
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
    pub(crate) fn extent(&self, name: &'static str) -> Result<u64> {
        let ext = self.layout.extent(name)?;
        if let Some(v) = self.value_layout {
            if self.parts != 2 || v.shape() != self.layout.shape() {
                return Err(invalid(
                    name,
                    (self.parts, v.shape()),
                    "a value layout needs two parts and the key layout's shape",
                ));
            }
            if v.extent(name)? != ext || v.dense_block_bytes() != self.layout.dense_block_bytes() {
                return Err(invalid(
                    name,
                    v,
                    "a value layout needs whole blocks without gaps, as the key layout",
                ));
            }
        }
        // Head vectors in pieces (v0), or parts laid out differently: the pool moves whole
        // blocks, which must be dense.
        let pieced_block = if self.layout.is_pieced() || self.value_layout.is_some() {
            Some(self.dense_block().ok_or_else(|| {
                invalid(
                    name,
                    self.layout,
                    "a pool whose head vectors are in pieces (v0), or whose parts are laid out \
                     differently, needs dense blocks",
                )
            })?)
        } else {
            None
        };
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
                // (count, byte stride) of each dimension, on the stack: [blocks] or [blocks,
                // slots, heads], then layers and parts.
                let mut dims = [(0usize, 0u64); 5];
                let (inner, chunk) = match pieced_block {
                    Some(block) => {
                        dims[0] = (
                            self.layout.num_blocks,
                            (self.layout.block_stride * self.layout.elem_bytes) as u64,
                        );
                        (1, block)
                    }
                    None => {
                        dims[..3].copy_from_slice(&self.layout.dims());
                        (3, self.layout.chunk_bytes() as u64)
                    }
                };
                dims[inner] = (self.layers, layer_stride as u64);
                dims[inner + 1] = (self.parts, part_stride as u64);
                if !chunks_disjoint(&dims[..inner + 2], chunk) {
                    return Err(invalid(
                        name,
                        (layer_stride, part_stride),
                        "layer/part strides make caches overlap",
                    ));
                }
            }
            Bases::Table(t) => {
                // A one-part view reads its part's entries of the whole table.
                let parts_ok = match self.part_of {
                    Some(p) => self.parts == 1 && p < t.parts(),
                    None => t.parts() == self.parts,
                };
                if t.layers() != self.layers || !parts_ok {
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
                // Sorted by address, two caches of `ext` bytes overlap exactly when two
                // consecutive bases are less than `ext` apart (the table keeps that gap).
                if t.min_gap() < ext {
                    return Err(invalid(name, "table", "two layer/part caches overlap"));
                }
            }
        }
        Ok(ext)
    }

    /// Address ranges of the pool's caches (for overlap and memory-kind checks).
    #[cfg(feature = "nixl")]
    pub(crate) fn ranges(&self, ext: u64) -> Vec<(u64, u64)> {
        match self.bases {
            Bases::Strided { mem, .. } => vec![(mem.ptr(), mem.ptr() + mem.len() as u64)],
            Bases::Table(t) => t
                .entries()
                .iter()
                .map(|e| (e.ptr(), e.ptr() + ext))
                .collect(),
        }
    }

    /// Address ranges of the pool's caches (a strided pool's whole view, or `ext` bytes from
    /// each table base), in address order and without allocating (a table sorts its bases
    /// when it is built). Disjoint for a pool that passed [`BlockPool::extent`] with `ext`.
    pub(crate) fn sorted_ranges(&self, ext: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let (one, table) = match self.bases {
            Bases::Strided { mem, .. } => (Some((mem.ptr(), mem.ptr() + mem.len() as u64)), None),
            Bases::Table(t) => (None, Some(t.sorted_bases())),
        };
        one.into_iter().chain(
            table
                .into_iter()
                .flatten()
                .map(move |&p| (p, p.saturating_add(ext))),
        )
    }

    /// The pool as the shared addressing sees it (`index::chunk_at`): strided base or the
    /// host copy of its table, byte strides `[layer, part, block, token, head]`.
    pub(crate) fn side(&self) -> PoolSide<&'a [u64]> {
        let e = self.layout.elem_bytes as u64;
        let (base, table, ls, ps) = match self.bases {
            Bases::Strided {
                mem,
                layer_stride,
                part_stride,
            } => (mem.ptr(), None, layer_stride as u64, part_stride as u64),
            // A one-part view starts at its part's entry of layer 0.
            Bases::Table(t) => (0, Some(&t.bases()[self.part_of.unwrap_or(0)..]), 0, 0),
        };
        let l = &self.layout;
        PoolSide {
            base: base as *mut u8,
            table,
            parts: self.table_parts().unwrap_or(self.parts) as u64,
            strides: [
                ls,
                ps,
                l.block_stride as u64 * e,
                l.token_stride as u64 * e,
                l.head_stride as u64 * e,
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::test_pools::*;

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
        let pool = one_part(SRC);
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
        let mem = bytes(0x1000, b);
        assert!(BlockPool::cross_layer_nhd(mem, 3, 2, 4, 2, 8, 2)
            .extent("p")
            .is_ok());
        assert!(BlockPool::cross_layer_hnd(mem, 3, 2, 4, 2, 8, 2)
            .extent("p")
            .is_ok());
        assert!(
            BlockPool::cross_layer_nhd(bytes(0x1000, b - 1), 3, 2, 4, 2, 8, 2)
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
}
