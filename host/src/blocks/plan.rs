//! Planning a block copy: pool validation and dimension merging ([`Geometry`]), the backend
//! choice, map checks, and the DMA spans or the kernel launch (with the staging upload of a
//! host map).

use kvio_kernels::args::CopyArgs;
use kvio_kernels::bulk;
use kvio_kernels::index::{access_width, group_shift};

use super::dma;
use super::map::{check_device_map, check_host_map, BlockMap};
use super::pool::{Bases, BlockPool};
use super::{Backend, BlockCopy, DMA_MIN_SPAN, DMA_MIN_SPAN_BATCHED};
use crate::alloc::{MemoryKind, TableAccess};
use crate::error::{invalid, Error, Result};
use crate::error_word::DeviceErrors;
use crate::launch::{
    grid_for, Entry, GridCap, DEFAULT_TMA_TRANSFER_CTAS, DEFAULT_TRANSFER_CTAS, PER_LANE,
    TRANSFER_THREADS,
};
use crate::layout::PagedLayout;
use crate::plan::{Kernel, Launch, Plan, Staging, Target, Upload};

/// Largest span one work item of the block copy moves; larger contiguous chunks are split so
/// whole-block copies still spread over the grid.
const MAX_PIECE: u64 = 16 * 1024;

/// Validates a block copy and plans it: the backend that will run and what it does. A copy
/// that converts between pools laying their parts out differently ([`split_parts`]) is
/// planned part by part: K's backend, launch (or spans), then V's on the same backend, its
/// pairs counted once (by K's launch).
pub(crate) fn plan<'a>(op: &BlockCopy<'a>, target: &Target<'_>) -> Result<(Backend, Plan<'a>)> {
    let Some([k, v]) = split_parts(op)? else {
        return plan_one(op, target);
    };
    let (backend, first) = plan_one(&k, target)?;
    let v = BlockCopy {
        backend,
        errors: None,
        ..v
    };
    let (_, second) = plan_one(&v, target)?;
    let plan = match (first, second) {
        (Plan::Nothing, Plan::Nothing) => Plan::Nothing,
        (Plan::Dma(mut a), Plan::Dma(b)) => {
            for s in b.iter() {
                a.push(*s);
            }
            Plan::Dma(a)
        }
        // One upload of the map serves both launches (V's arguments point where K's do, or
        // the runner points both at its scratch).
        (
            Plan::Kernel {
                upload,
                launch,
                then: None,
            },
            Plan::Kernel {
                launch: second,
                then: None,
                ..
            },
        ) => Plan::Kernel {
            upload,
            launch,
            then: Some(second),
        },
        (a, b) => unreachable!("the parts of one copy planned apart: {a:?}, {b:?}"),
    };
    Ok((backend, plan))
}

/// `l` with head vectors whose pieces lie one after another (vLLM's v0 caches at one slot a
/// block) described as whole: the same bytes, moved without a conversion.
fn whole_heads(l: &PagedLayout) -> PagedLayout {
    if l.is_pieced() && l.piece_stride == l.piece_elems {
        PagedLayout {
            piece_elems: l.head_dim,
            piece_stride: l.head_dim,
            ..*l
        }
    } else {
        *l
    }
}

/// Whether part `p`'s layouts agree inside a block in pools `s` and `d` (the same bytes in the
/// same order).
fn part_agrees<A: Copy, B: Copy>(s: &BlockPool<'_, A>, d: &BlockPool<'_, B>, p: usize) -> bool {
    inside(&whole_heads(&s.part_layout(p))) == inside(&whole_heads(&d.part_layout(p)))
}

/// Token, head and piece strides and the piece size: what two layouts must share for a block
/// to be the same bytes in the same order in both.
fn inside(l: &PagedLayout) -> (usize, usize, usize, usize) {
    (l.token_stride, l.head_stride, l.piece_elems, l.piece_stride)
}

/// `op` as one copy per part (K, then V: one-part views of both pools) when a pool lays its
/// parts out differently ([`BlockPool::value_layout`]) and a part's layouts differ between the
/// pools: a conversion, which moves each part's head vectors by its own pieces. `None` when
/// the copy runs whole (parts laid out alike in both pools move as whole blocks).
pub(crate) fn split_parts<'a>(op: &BlockCopy<'a>) -> Result<Option<[BlockCopy<'a>; 2]>> {
    let (s, d) = (&op.src, &op.dst);
    if s.value_layout.is_none() && d.value_layout.is_none() || s.parts != d.parts {
        return Ok(None);
    }
    s.extent("src")?;
    d.extent("dst")?;
    if (0..2).all(|p| part_agrees(s, d, p)) {
        return Ok(None);
    }
    let part = |p: usize| -> Result<BlockCopy<'a>> {
        Ok(BlockCopy {
            src: s.part(p)?,
            dst: d.part(p)?,
            ..*op
        })
    };
    Ok(Some([part(0)?, part(1)?]))
}

/// [`plan`] of a copy that runs whole.
fn plan_one<'a>(op: &BlockCopy<'a>, target: &Target<'_>) -> Result<(Backend, Plan<'a>)> {
    let geo = geometry(op, target.kind_of)?;
    let backend = choose(op, &geo, &target.caps, target.scratch, target.batched_dma)?;
    let dst = op.dst.read();
    if let BlockMap::Host(pairs) = op.map {
        check_host_map(&op.src, &dst, pairs)?;
    }
    let plan = match op.map {
        BlockMap::Host(pairs) if backend == Backend::Dma => {
            Plan::Dma(dma::spans(&op.src, &dst, &geo, pairs))
        }
        map => kernel(op, &geo, map, target.caps, backend == Backend::Tma)?,
    };
    Ok((backend, plan))
}

/// The backend that runs `op` (never `Auto`). DMA needs a host map. A host map on the kernel
/// is uploaded to the caller's staging buffer, or else to the runner's scratch (without
/// scratch it needs staging). `Auto` takes the copy engines for transfers between host and
/// device whose contiguous chunk ([`Geometry::chunk`]: one block's span after merging, not a
/// merged run of blocks) is at least [`DMA_MIN_SPAN`] ([`DMA_MIN_SPAN_BATCHED`] with a batching
/// driver), and when a host map has nowhere to go;
/// the kernel otherwise. `Tma` runs as `Kernel` where it does not apply ([`tma_applies`]).
fn choose(
    op: &BlockCopy<'_>,
    geo: &Geometry,
    caps: &GridCap,
    scratch: bool,
    batched: bool,
) -> Result<Backend> {
    let uploadable = op.staging.is_some() || scratch;
    Ok(match (op.backend, op.map) {
        (Backend::Dma, BlockMap::Device { .. }) => {
            return Err(invalid(
                "backend",
                "Dma",
                "the DMA backend needs a host block map",
            ))
        }
        (Backend::Dma, _) => Backend::Dma,
        (Backend::Kernel | Backend::Tma, BlockMap::Host(_)) if !uploadable => {
            return Err(invalid(
                "staging",
                "None",
                "the kernel backend with a host map needs staging on this device",
            ))
        }
        (Backend::Kernel, _) => Backend::Kernel,
        (Backend::Tma, _) if tma_applies(op, geo, caps) => Backend::Tma,
        (Backend::Tma, _) => Backend::Kernel,
        (Backend::Auto, BlockMap::Device { .. }) => Backend::Kernel,
        (Backend::Auto, BlockMap::Host(_)) => {
            let min = if batched {
                DMA_MIN_SPAN_BATCHED
            } else {
                DMA_MIN_SPAN
            };
            let long = geo.host_involved && geo.span() as usize >= min;
            if long || !uploadable {
                Backend::Dma
            } else {
                Backend::Kernel
            }
        }
    })
}

/// The kernel backend: the map in place (device) or uploaded to staging or scratch (host),
/// then one launch.
fn kernel<'a>(
    op: &BlockCopy<'_>,
    geo: &Geometry,
    map: BlockMap<'a>,
    caps: GridCap,
    tma: bool,
) -> Result<Plan<'a>> {
    let (pairs, n, upload) = match map {
        BlockMap::Device { pairs, len } => {
            check_device_map(pairs, len)?;
            (pairs.ptr(), len, None)
        }
        BlockMap::Host(host) => {
            let bytes: &'a [u8] = bytemuck::cast_slice(host);
            let to = match op.staging {
                Some(staging) => {
                    if !staging.ptr().is_multiple_of(8) {
                        return Err(invalid("staging", staging.ptr(), "must be 8-byte aligned"));
                    }
                    if bytes.len() > staging.len() {
                        return Err(Error::BufferTooSmall {
                            name: "staging",
                            needed: bytes.len() as u64,
                            len: staging.len() as u64,
                        });
                    }
                    Staging::Given(staging.ptr())
                }
                // `choose` allows this only where the runner has scratch.
                None => Staging::Scratch,
            };
            let at = match to {
                Staging::Given(ptr) => ptr,
                Staging::Scratch => 0, // set by the runner
            };
            let upload = (!bytes.is_empty()).then_some(Upload {
                dst: to,
                src: bytes,
            });
            (at, host.len(), upload)
        }
    };
    Ok(match launch(op, geo, pairs, n, caps, tma)? {
        Some(launch) => Plan::Kernel {
            upload,
            launch,
            then: None,
        },
        None => Plan::Nothing,
    })
}

/// Geometry shared by both backends.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Extents (layers, parts, tokens, heads) after merging contiguous dimensions.
    pub(crate) ext: [u64; 4],
    /// Contiguous bytes per chunk after merging.
    pub(crate) chunk: u64,
    /// A chunk fills its block's stride on both sides, so the chunks of consecutive block ids
    /// are contiguous and runs of consecutive pairs merge: whole blocks (cross-layer pools) or
    /// one (layer, part) of each block (layer-separate pools).
    pub(crate) block_contiguous: bool,
    /// A pool is pinned host memory (the transfer entry point and its CTA budget).
    pub(crate) host_involved: bool,
    /// How each chunk (one head vector) is moved when the two sides split head vectors into
    /// pieces differently (a conversion to or from vLLM's v0 layout); `None`: each chunk is
    /// contiguous on both sides.
    pub(crate) pieces: Option<Pieces>,
}

/// A head vector moved piece by piece: `count` pieces of `bytes`, `src_stride` and
/// `dst_stride` bytes apart on either side (a contiguous side: `bytes` apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pieces {
    /// Bytes of one piece.
    pub(crate) bytes: u64,
    /// Pieces per head vector.
    pub(crate) count: u64,
    /// Source bytes between consecutive pieces.
    pub(crate) src_stride: u64,
    /// Destination bytes between consecutive pieces.
    pub(crate) dst_stride: u64,
}

impl Geometry {
    /// Bytes of the largest span both sides hold contiguously: a piece when converting, else
    /// the chunk.
    pub(crate) fn span(&self) -> u64 {
        self.pieces.map_or(self.chunk, |p| p.bytes)
    }
}

/// The pieces of a copy between layouts `a` and `b` (same shape) whose head vectors are split
/// differently: pieces of the smaller piece size, which must be the other side's piece size
/// too unless that side holds its head vectors whole.
fn conversion_pieces(a: &PagedLayout, b: &PagedLayout) -> Result<Pieces> {
    let (d, e) = (a.head_dim, a.elem_bytes as u64);
    let p = a.piece_elems.min(b.piece_elems);
    let fits = |l: &PagedLayout| l.piece_elems == p || !l.is_pieced();
    if !fits(a) || !fits(b) {
        return Err(invalid(
            "dst",
            (a.piece_elems, b.piece_elems),
            "a conversion between layouts whose head vectors are in pieces needs the same \
             piece size on both sides, or whole head vectors on one",
        ));
    }
    let stride = |l: &PagedLayout| {
        if l.is_pieced() {
            l.piece_stride as u64 * e
        } else {
            p as u64 * e
        }
    };
    Ok(Pieces {
        bytes: p as u64 * e,
        count: (d / p) as u64,
        src_stride: stride(a),
        dst_stride: stride(b),
    })
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

/// Validates both pools (sizes, strides, matching shapes, reachable memory) and merges the
/// dimensions that are contiguous on both sides into one chunk.
pub(crate) fn geometry(
    op: &BlockCopy<'_>,
    kind_of: &dyn Fn(u64) -> MemoryKind,
) -> Result<Geometry> {
    let (s, d) = (&op.src, &op.dst.read());
    // Validate both pools (sizes, strides, every cache inside its memory).
    s.extent("src")?;
    d.extent("dst")?;
    let (a, b) = (&whole_heads(&s.layout), &whole_heads(&d.layout));
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
    // A copy inside one pool asks once: the same address, classified at the same moment.
    let mut asked: Option<(u64, MemoryKind)> = None;
    let mut classify = |ptr: u64| match asked {
        Some((at, kind)) if at == ptr => kind,
        _ => {
            let kind = kind_of(ptr);
            asked = Some((ptr, kind));
            kind
        }
    };
    let mut host_involved = false;
    for (name, pool) in [("src", s), ("dst", d)] {
        let verdict = match pool.bases {
            Bases::Strided { mem, .. } => match classify(mem.ptr()) {
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
    let per_part = s.value_layout.is_some() || d.value_layout.is_some();
    if per_part && !(0..s.parts).all(|p| part_agrees(s, d, p)) {
        // `split_parts` plans such copies part by part.
        return Err(invalid(
            "dst",
            "value_layout",
            "pools with parts laid out differently convert part by part",
        ));
    }
    if a.is_pieced() || b.is_pieced() || per_part {
        if inside(a) != inside(b) {
            // A conversion to or from v0: every head vector piece by piece, nothing merged.
            return Ok(Geometry {
                ext,
                chunk,
                block_contiguous: false,
                host_involved,
                pieces: Some(conversion_pieces(a, b)?),
            });
        }
        // v0 pools of one layout inside a block, or parts laid out alike in both pools: whole
        // dense blocks (checked with the pools).
        chunk = a.dense_block_bytes().expect("checked by the pool");
        ext[2] = 1;
        ext[3] = 1;
    }
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
    let block_contiguous = ext[2..] == [1, 1]
        && a.block_stride as u64 * e == chunk
        && b.block_stride as u64 * e == chunk;
    Ok(Geometry {
        ext,
        chunk,
        block_contiguous,
        host_involved,
        pieces: None,
    })
}

/// Largest divisor of `n` that is at most `cap` (1 if none larger). Counts down from
/// `min(cap, n)`: at most `cap` (≤ 1,024 here) divisions, usually one (chunks are powers of two
/// times small factors), where a search up to `sqrt(n)` took hundreds per call.
fn largest_divisor_at_most(n: u64, cap: u64) -> u64 {
    (1..=cap.min(n))
        .rev()
        .find(|d| n.is_multiple_of(*d))
        .unwrap_or(1)
}

/// Whether [`Backend::Tma`] applies to `op`: a device whose module has the bulk-copy entry
/// (`sm_90`: a non-zero cap; the CPU emulation too), with every chunk, stride and base a
/// multiple of 16 bytes (`cp.async.bulk` moves multiples of 16 bytes between 16-byte aligned
/// addresses).
fn tma_applies(op: &BlockCopy<'_>, geo: &Geometry, caps: &GridCap) -> bool {
    caps.of(Entry::TransferBlocksTma) > 0 && geo.pieces.is_none() && access_width_of(op, geo) == 16
}

/// The access width of a block copy: the largest power of two (up to 16) dividing its chunk,
/// every stride and every base of both pools.
fn access_width_of(op: &BlockCopy<'_>, geo: &Geometry) -> u32 {
    let side = |p: &BlockPool<'_>| {
        let s = p.side();
        (s.base as u64, s.strides)
    };
    let (sb, ss) = side(&op.src);
    let (db, ds) = side(&op.dst.read());
    // `access_width` ORs its values, so a table's bases enter as the OR the table keeps.
    let (so, dor) = (op.src.bases_or(), op.dst.bases_or());
    let [s0, s1, s2, s3, s4] = ss;
    let [d0, d1, d2, d3, d4] = ds;
    let (sp, dp) = geo.pieces.map_or((0, 0), |p| (p.src_stride, p.dst_stride));
    access_width(&[
        geo.span(),
        sb,
        db,
        s0,
        s1,
        s2,
        s3,
        s4,
        d0,
        d1,
        d2,
        d3,
        d4,
        so,
        dor,
        sp,
        dp,
    ])
}

/// Rows of a head vector (`geo.chunk` bytes and a 16-byte pad each) the CTA tile of
/// `kvio_convert_pages` holds.
fn tile_rows(geo: &Geometry) -> u64 {
    kvio_kernels::cta::BYTES as u64 / (geo.chunk + 16)
}

/// Tokens per CTA item of `kvio_convert_pages` for conversion `op` (`None`: it runs on
/// `kvio_convert_blocks`): 1-, 2- or 4-byte elements, head vectors of a multiple of 16 bytes,
/// every base and stride 16-byte aligned except a columns side's token stride (a side whose
/// elements of consecutive tokens are adjacent, vLLM's v0 values, read and written as 16-byte
/// columns), a rows side's 16-byte vectors inside one piece or on adjacent pieces; the
/// largest power of two dividing the page whose rows fit the tile, at least a column's tokens.
fn page_tile(op: &BlockCopy<'_>, geo: &Geometry, p: &Pieces) -> Option<u64> {
    let l = &op.src.layout;
    let e = l.elem_bytes as u64;
    let sides = [op.src.side(), op.dst.read().side()];
    let mut need = op.src.bases_or() | op.dst.bases_or() | geo.chunk;
    let mut columns = false;
    for (s, piece_stride) in sides.iter().zip([p.src_stride, p.dst_stride]) {
        let [ls, ps, bs, ts, hs] = s.strides;
        need |= s.base as u64 | ls | ps | bs | hs;
        if ts == e && p.bytes == e {
            columns = true;
            need |= piece_stride;
        } else if piece_stride != p.bytes {
            // Pieces apart: each 16-byte vector inside one piece.
            need |= ts | piece_stride | p.bytes;
        } else {
            need |= ts;
        }
    }
    if !matches!(e, 1 | 2 | 4) || !need.is_multiple_of(16) {
        return None;
    }
    let min = if columns { 16 / e } else { 1 };
    let page = l.block_size as u64;
    let fit = tile_rows(geo);
    (0..=page.trailing_zeros())
        .rev()
        .map(|k| 1u64 << k)
        .find(|&t| t <= fit && t >= min)
}

/// The launch of a validated block copy whose `n` pairs are at device address `pairs`
/// (`tma`: through the bulk-copy entry, which [`tma_applies`] to it); `None` when there is
/// nothing to do.
fn launch(
    op: &BlockCopy<'_>,
    geo: &Geometry,
    pairs: u64,
    n: usize,
    caps: GridCap,
    tma: bool,
) -> Result<Option<Launch>> {
    let per_pair: u64 = geo.ext.iter().product();
    if n == 0 || per_pair == 0 {
        return Ok(None);
    }
    let side = |p: &BlockPool<'_>| -> (u64, u64, [u64; 5]) {
        let s = p.side();
        (s.base as u64, p.table_ptr(), s.strides)
    };
    let (sb, st, ss) = side(&op.src);
    let (db, dt, ds) = side(&op.dst.read());
    let width = access_width_of(op, geo);
    // Split big chunks into pieces of at most MAX_PIECE bytes (whole multiples of the access;
    // the bulk-copy path: of a stage's bytes).
    let max_piece = if tma {
        bulk::STAGE_BYTES as u64
    } else {
        MAX_PIECE
    };
    // A conversion through the tile: `tile` tokens of a page per CTA item.
    let tile = geo.pieces.and_then(|p| page_tile(op, geo, &p));
    let (piece, pieces, src_piece_stride, dst_piece_stride) = match geo.pieces {
        Some(p) => (p.bytes, p.count, p.src_stride, p.dst_stride),
        None => {
            let units = geo.chunk / width as u64;
            let piece =
                largest_divisor_at_most(units, (max_piece / width as u64).max(1)) * width as u64;
            (piece, geo.chunk / piece, piece, piece)
        }
    };
    // Cannot overflow for validated pools (each factor is bounded by a buffer length), but the
    // kernel computes the same product: refuse rather than let it wrap.
    // A conversion's items are head pages (their tokens' pieces are a group's lanes'; its
    // dimensions are never merged, so `ext[2]` is the page's tokens); a copy's are pieces.
    let per_item = match geo.pieces {
        Some(_) => per_pair / geo.ext[2],
        None => per_pair.saturating_mul(pieces),
    };
    let items = (n as u64)
        .checked_mul(per_item)
        .ok_or(Error::Overflow { name: "map" })?;
    let shift = if tma {
        bulk::SHIFT
    } else if geo.pieces.is_some() {
        // A conversion: a group per head page, its lanes sharing the tokens' pieces.
        group_shift(geo.ext[2] * pieces * (piece / width as u64), PER_LANE)
    } else {
        group_shift(piece / width as u64, PER_LANE)
    };
    // The entry point, chosen once: it gives the CTA size and the cap, and the launch's kernel
    // below is built for it.
    let entry = if tma {
        Entry::TransferBlocksTma
    } else if tile.is_some() {
        // A conversion through the tile.
        Entry::ConvertPages
    } else if geo.pieces.is_some() {
        // A conversion, on its own entry.
        Entry::ConvertBlocks
    } else if geo.host_involved {
        Entry::TransferBlocks
    } else {
        Entry::CopyBlocks
    };
    let threads = entry
        .cta_threads()
        .expect("a block copy runs a plan's entry point");
    let cap = caps.of(entry);
    // With host memory, the bulk-copy path's own default, else as many threads as the transfer
    // entry's default budget has; device to device, the whole device.
    let default_budget = match (geo.host_involved, tma) {
        (false, _) => u32::MAX,
        (true, true) => DEFAULT_TMA_TRANSFER_CTAS,
        (true, false) => DEFAULT_TRANSFER_CTAS * (TRANSFER_THREADS / threads),
    };
    let budget = op.max_ctas.unwrap_or(default_budget).min(cap.max(1)).max(1);
    let [layers, parts, mut tokens, heads] = geo.ext;
    // Through the tile: runs of `t` tokens per page, and as many heads of a whole page as
    // the tile holds per item.
    let mut subs = 1;
    if let Some(t) = tile {
        if t == tokens {
            subs = (tile_rows(geo) / t).clamp(1, heads);
        }
        tokens /= t;
    }
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
        src_piece_stride,
        dst_piece_stride,
        pairs: pairs as *const i64,
        num_pairs: n as u64,
        src_blocks: op.src.layout.num_blocks as u64,
        dst_blocks: op.dst.layout.num_blocks as u64,
        table_parts: (op.src.table_parts())
            .or(op.dst.table_parts())
            .unwrap_or(op.src.parts) as u64,
        elem: op.src.layout.elem_bytes as u32,
        tile: tile.unwrap_or(0) as u32,
        subs: subs as u32,
        width,
        shift,
        errors: op.errors.map_or(0, DeviceErrors::ptr) as *mut u32,
    };
    // The transfer entry steps its items' indices digit by digit in 32 bits
    // (`kvio_kernels::index::Digits`): refuse an extent past that (each is bounded by a pool's
    // bytes, so only a pool of billions of layers, tokens, heads or pieces comes near).
    if [
        args.layers,
        args.parts,
        args.tokens,
        args.heads,
        args.pieces,
    ]
    .iter()
    .any(|&e| e > u32::MAX as u64)
    {
        return Err(Error::Overflow { name: "map" });
    }
    let (kernel, grid) = match entry {
        // A CTA (one warp) moves batches of `lanes_for(piece)` items, one item per lane.
        Entry::TransferBlocksTma => (
            Kernel::TransferTma(args),
            items
                .div_ceil(bulk::lanes_for(piece))
                .clamp(1, budget as u64) as u32,
        ),
        // A whole CTA per item.
        Entry::ConvertPages => (
            Kernel::Convert(args),
            (n as u64 * layers * parts * tokens * heads.div_ceil(subs)).clamp(1, budget as u64)
                as u32,
        ),
        Entry::ConvertBlocks => (
            Kernel::Convert(args),
            grid_for(items, threads, shift, budget),
        ),
        Entry::TransferBlocks => (
            Kernel::Transfer(args),
            grid_for(items, threads, shift, budget),
        ),
        _ => (Kernel::Copy(args), grid_for(items, threads, shift, budget)),
    };
    debug_assert_eq!(kernel.entry(), entry);
    Ok(Some(Launch {
        kernel,
        grid,
        threads,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::test_pools::*;
    use crate::launch::{BLOCK_THREADS, PAGE_THREADS, TMA_THREADS};
    use crate::plan::Span;

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
                pieces: None,
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
            pieces: None,
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
        // Layer-first to layer-first (different pool sizes): blocks contiguous per cache only,
        // so runs of consecutive blocks merge inside each (layer, part).
        let g = geo(
            layer_first(SRC, NB, L, BS, H, D, E),
            layer_first(DST, 9, L, BS, H, D, E),
        )
        .unwrap();
        assert_eq!(
            g,
            Geometry {
                block_contiguous: true,
                ..want
            }
        );
    }

    #[test]
    fn nhd_to_hnd_merges_nothing_beyond_head_dim() {
        let want = Geometry {
            ext: [L as u64, 2, BS as u64, H as u64],
            chunk: (D * E) as u64,
            block_contiguous: false,
            host_involved: false,
            pieces: None,
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
                pieces: None,
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
                pieces: None,
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
                pieces: None,
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
                pieces: None,
            }
        );
    }

    // ---- conversions to and from v0 ------------------------------------------------------

    /// `L` layers of one part each, every cache `layout`, one after another.
    fn one_part_pool(at: u64, layout: PagedLayout) -> Pool {
        let ext = layout.extent("p").unwrap() as usize;
        BlockPool::strided(bytes_mut(at, L * ext), ext, 0, L, 1, layout)
    }

    /// Between a v0 cache and NHD: every head vector piece by piece (the key cache's 16-byte
    /// pieces, the value cache's single elements), nothing merged; a piece size neither side
    /// shares is refused.
    #[test]
    fn v0_conversions_move_head_vectors_piece_by_piece() {
        let (k, v) = (
            PagedLayout::v0_key(NB, BS, H, D, E),
            PagedLayout::v0_value(NB, BS, H, D, E),
        );
        let n = PagedLayout::nhd(NB, BS, H, D, E);
        let piecewise = |pieces| Geometry {
            ext: [L as u64, 1, BS as u64, H as u64],
            chunk: (D * E) as u64,
            block_contiguous: false,
            host_involved: false,
            pieces: Some(pieces),
        };
        let key = Pieces {
            bytes: 16,
            count: (D / 8) as u64,
            src_stride: (16 * BS) as u64,
            dst_stride: 16,
        };
        let g = geo(one_part_pool(SRC, k), one_part_pool(DST, n)).unwrap();
        assert_eq!(g, piecewise(key));
        assert_eq!(g.span(), 16);
        let g = geo(one_part_pool(SRC, n), one_part_pool(DST, v)).unwrap();
        assert_eq!(
            g,
            piecewise(Pieces {
                bytes: E as u64,
                count: D as u64,
                src_stride: E as u64,
                dst_stride: (E * BS) as u64,
            })
        );
        // One slot a block: a v0 head vector's pieces lie one after another, so it moves
        // whole, as NHD's.
        for l in [
            PagedLayout::v0_key(NB, 1, H, D, E),
            PagedLayout::v0_value(NB, 1, H, D, E),
        ] {
            let nhd1 = PagedLayout::nhd(NB, 1, H, D, E);
            let g = geo(one_part_pool(SRC, l), one_part_pool(DST, nhd1)).unwrap();
            assert_eq!((g.pieces, g.chunk), (None, (H * D * E) as u64));
        }
        // Same layout on both sides: still whole dense blocks.
        let g = geo(one_part_pool(SRC, v), one_part_pool(DST, v)).unwrap();
        assert_eq!((g.pieces, g.chunk), (None, (BS * H * D * E) as u64));
        // Pieces of 4 elements against the key cache's 8: neither divides into the other's.
        let mut four = k;
        four.piece_elems = 4;
        four.token_stride = 4;
        four.piece_stride = 4 * BS;
        assert_invalid(geo(one_part_pool(SRC, k), one_part_pool(DST, four)), "dst");
        // The kernel launch carries the piece strides; the DMA plan is one span per piece.
        let pairs = [[0i64, 1], [3, 2], [-1, 0]];
        let (s, d) = (one_part_pool(SRC, k), one_part_pool(DST, n));
        let conversion = |from: Pool, to: Pool| {
            let (b, p) = plan(&op(from, to, &pairs), &target(MemoryKind::Device)).unwrap();
            assert_eq!(b, Backend::Kernel);
            match p {
                Plan::Kernel {
                    launch:
                        launch @ Launch {
                            kernel: Kernel::Convert(a),
                            ..
                        },
                    ..
                } => (launch, a),
                p => panic!("{p:?}"),
            }
        };
        let (launch, a) = conversion(s, d);
        assert_eq!(
            (a.piece, a.pieces, a.src_piece_stride, a.dst_piece_stride),
            (16, key.count, key.src_stride, 16)
        );
        // Through the tile (`kvio_convert_pages`): whole 16-token pages, three heads an item
        // (3 × 16 rows of 256 + 16 bytes: 12.75 KiB of the tile); the value cache too (16-byte
        // columns of 8 tokens).
        assert_eq!((a.tile, a.tokens, a.elem, a.subs), (16, 1, 2, 3));
        assert_eq!(launch.threads, PAGE_THREADS);
        for (from, to) in [(v, n), (n, v)] {
            let (_, a) = conversion(one_part_pool(SRC, from), one_part_pool(DST, to));
            assert_eq!((a.tile, a.piece, a.pieces), (16, 2, D as u64));
        }
        // Misaligned (an 8-byte base): the per-group entry, `kvio_convert_blocks`, a group of
        // 32 lanes per head page (16 tokens × 16 pieces of two 8-byte units): 3 pairs (one
        // padding) × 3 layers × 8 heads items.
        let (launch, a) = conversion(one_part_pool(SRC + 8, k), one_part_pool(DST, n));
        assert_eq!((a.tile, a.width, a.shift), (0, 8, 5));
        assert_eq!((a.tokens, a.heads), (BS as u64, H as u64));
        let caps = target(MemoryKind::Device).caps;
        assert_eq!(
            launch.grid,
            grid_for(
                (3 * L * H) as u64,
                BLOCK_THREADS,
                5,
                caps.of(Entry::ConvertBlocks)
            )
        );
        let dma = BlockCopy {
            backend: Backend::Dma,
            ..op(s, d, &pairs)
        };
        let (_, p) = plan(&dma, &target(MemoryKind::PinnedHost)).unwrap();
        let Plan::Dma(spans) = p else { panic!("{p:?}") };
        assert_eq!(spans.len(), 2 * L * BS * H * D / 8);
        assert!(spans.iter().all(|s| s.bytes == 16));
        let piece = (16 * BS) as u64;
        assert_eq!(spans[1].src - spans[0].src, piece);
        assert_eq!(spans[1].dst - spans[0].dst, 16);
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
            let g = geometry(&op(s, d, &[]), &|p| {
                if Some(p) == host {
                    MemoryKind::PinnedHost
                } else {
                    MemoryKind::Device
                }
            })
            .unwrap();
            assert_eq!(g.host_involved, want, "host pool at {host:x?}");
        }
        let g = geometry(&op(s, d, &[]), &|_| MemoryKind::PinnedHost).unwrap();
        assert!(g.host_involved);
    }

    #[test]
    fn unreachable_memory_rejected() {
        let (s, d) = (nhd(SRC, NB, L, BS, H, D, E), nhd(DST, NB, L, BS, H, D, E));
        for bad in [MemoryKind::Unregistered, MemoryKind::Other] {
            let r = geometry(&op(s, d, &[]), &|p| {
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
            let r = geometry(&op(s, d, &[]), &|p| {
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
        let one_part = one_part(DST);
        assert!(geo(one_part, one_part).is_ok());
        assert_invalid(geo(s, one_part), "dst");
        assert_invalid(geo(one_part, s), "dst");
    }

    #[test]
    fn pool_memory_too_small_rejected() {
        let need = pool_bytes(NB, L, BS, H, D, E);
        let short = |at| BlockPool::cross_layer_nhd(bytes_mut(at, need - 1), NB, L, BS, H, D, E);
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

    /// An extent past 2^32 (here 2^32 layers of one-token, one-byte blocks) is refused before
    /// launch: the transfer entry steps item indices in 32-bit digits.
    #[test]
    fn extents_past_32_bits_refused() {
        let (l, far) = (1usize << 32, SRC + (1 << 40));
        let pairs = [[0i64, 1]];
        let (s, d) = (
            nhd(SRC, 2, l, 1, 1, 1, 1),
            layer_first(far, 2, l, 1, 1, 1, 1),
        );
        let r = plan(&op(s, d, &pairs), &target(MemoryKind::PinnedHost));
        assert_eq!(r.err(), Some(Error::Overflow { name: "map" }));
        // One layer fewer than 2^32 plans.
        let (s, d) = (
            nhd(SRC, 2, l - 1, 1, 1, 1, 1),
            layer_first(far, 2, l - 1, 1, 1, 1, 1),
        );
        assert!(plan(&op(s, d, &pairs), &target(MemoryKind::PinnedHost)).is_ok());
    }

    // ---- plans: backend choice, staging, DMA spans -----------------------------------------

    fn target(kind: MemoryKind) -> Target<'static> {
        with_scratch(kind, true)
    }

    fn with_scratch(kind: MemoryKind, scratch: bool) -> Target<'static> {
        Target {
            caps: GridCap::uniform(8),
            kind_of: match kind {
                MemoryKind::PinnedHost => &|_| MemoryKind::PinnedHost,
                _ => &|_| MemoryKind::Device,
            },
            scratch,
            batched_dma: false,
        }
    }

    /// `Tma` plans the bulk-copy entry for 16-byte aligned copies where the device has it
    /// (pieces of at most a stage, one-warp CTAs, one CTA per batch up to the budget), and the
    /// kernel otherwise: before `sm_90` (a zero cap) or with a misaligned base.
    #[test]
    fn tma_applies_to_aligned_copies_on_sm90_only() {
        let (s, d) = (nhd(SRC, NB, L, BS, H, D, E), nhd(DST, NB, L, BS, H, D, E));
        let pairs = [[0i64, 1], [2, 3], [-1, 0]];
        // A pretend device with room for more CTAs than the default budget.
        let host = Target {
            caps: GridCap::uniform(64),
            ..target(MemoryKind::PinnedHost)
        };
        let tma = BlockCopy {
            backend: Backend::Tma,
            ..op(s, d, &pairs)
        };
        let (b, p) = plan(&tma, &host).unwrap();
        assert_eq!(b, Backend::Tma);
        let Plan::Kernel { launch, .. } = p else {
            panic!("{p:?}")
        };
        let Kernel::TransferTma(a) = launch.kernel else {
            panic!("{launch:?}")
        };
        assert_eq!(
            (a.width, a.shift, launch.threads),
            (16, bulk::SHIFT, TMA_THREADS)
        );
        assert_eq!(a.piece, bulk::STAGE_BYTES as u64);
        // Whole cross-layer blocks (192 KiB) in 8 KiB pieces, one lane each: 3 pairs × 24
        // batches, on the bulk path's default budget of host transfers.
        assert_eq!(a.pieces * a.piece, a.chunk);
        assert_eq!(launch.grid, DEFAULT_TMA_TRANSFER_CTAS);
        let mut caps = GridCap::uniform(8);
        caps.ctas[Entry::TransferBlocksTma as usize] = 0;
        let sm80 = Target {
            caps,
            ..target(MemoryKind::PinnedHost)
        };
        let (b, p) = plan(&tma, &sm80).unwrap();
        assert_eq!(b, Backend::Kernel);
        assert!(matches!(
            p,
            Plan::Kernel {
                launch: Launch {
                    kernel: Kernel::Transfer(_),
                    ..
                },
                ..
            }
        ));
        let misaligned = BlockCopy {
            backend: Backend::Tma,
            ..op(nhd(SRC + 8, NB, L, BS, H, D, E), d, &pairs)
        };
        assert_eq!(plan(&misaligned, &host).unwrap().0, Backend::Kernel);
    }

    /// With a batching driver, `Auto` takes the copy engines from 64 KiB spans; without one,
    /// from 2 MiB.
    #[test]
    fn auto_crossover_follows_batching() {
        let batching = Target {
            batched_dma: true,
            ..target(MemoryKind::PinnedHost)
        };
        let pairs = [[0i64, 1]];
        // Layer-first on one side: a span is one layer's K or V of a block.
        for (bs, batched, plain) in [
            (16, Backend::Kernel, Backend::Kernel), // 32 KiB
            (32, Backend::Dma, Backend::Kernel),    // 64 KiB
            (256, Backend::Dma, Backend::Kernel),   // 512 KiB
        ] {
            let (s, lf) = (
                nhd(SRC, NB, L, bs, H, D, E),
                layer_first(DST, NB, L, bs, H, D, E),
            );
            let (b, _) = plan(&op(s, lf, &pairs), &batching).unwrap();
            assert_eq!(b, batched, "bs {bs}, batching driver");
            let (b, _) = plan(&op(s, lf, &pairs), &target(MemoryKind::PinnedHost)).unwrap();
            assert_eq!(b, plain, "bs {bs}");
        }
    }

    #[test]
    fn host_map_backend_and_staging_decide_the_plan() {
        let (s, d) = (nhd(SRC, NB, L, BS, H, D, E), nhd(DST, NB, L, BS, H, D, E));
        let pairs = [[0i64, 1], [2, 3]];
        let staging = bytes_mut(0x4000_0000, 32);
        let dev = target(MemoryKind::Device);
        // Auto without staging: the kernel, the map uploaded to the runner's scratch (the
        // launch's map pointer is the runner's to fill in).
        for backend in [Backend::Auto, Backend::Kernel] {
            let unstaged = BlockCopy {
                backend,
                ..op(s, d, &pairs)
            };
            let (b, p) = plan(&unstaged, &dev).unwrap();
            assert_eq!(b, Backend::Kernel);
            match p {
                Plan::Kernel {
                    upload: Some(u),
                    launch,
                    then: None,
                } => {
                    assert_eq!(u.dst, Staging::Scratch);
                    assert_eq!(u.src, bytemuck::cast_slice::<[i64; 2], u8>(&pairs));
                    let Kernel::Copy(a) = launch.kernel else {
                        panic!("{launch:?}")
                    };
                    assert_eq!((a.pairs as u64, a.num_pairs), (0, 2));
                    let Kernel::Copy(a) = launch.kernel.with_map(0x6000) else {
                        panic!("{launch:?}")
                    };
                    assert_eq!(a.pairs as u64, 0x6000);
                }
                other => panic!("{other:?}"),
            }
        }
        // Without scratch (a device without memory pools): Auto falls back to the copy
        // engines, the kernel needs staging.
        let bare = with_scratch(MemoryKind::Device, false);
        let (b, p) = plan(&op(s, d, &pairs), &bare).unwrap();
        assert_eq!(b, Backend::Dma);
        assert!(
            matches!(p, Plan::Dma(ref spans) if !spans.is_empty()),
            "{p:?}"
        );
        // Auto with staging on device pools: the kernel, the map uploaded to staging first.
        let staged = BlockCopy {
            staging: Some(staging),
            ..op(s, d, &pairs)
        };
        let (b, p) = plan(&staged, &dev).unwrap();
        assert_eq!(b, Backend::Kernel);
        match p {
            Plan::Kernel {
                upload: Some(u),
                launch,
                then: None,
            } => {
                assert_eq!(u.dst, Staging::Given(staging.ptr()));
                assert_eq!(u.src, bytemuck::cast_slice::<[i64; 2], u8>(&pairs));
                let Kernel::Copy(a) = launch.kernel else {
                    panic!("device pools take the device-copy entry: {launch:?}")
                };
                assert_eq!((a.pairs as u64, a.num_pairs), (staging.ptr(), 2));
                assert_eq!(launch.threads, BLOCK_THREADS);
            }
            other => panic!("{other:?}"),
        }
        // The same on pinned pools: whole 2-MiB-or-longer spans go to DMA, shorter to the
        // transfer entry point.
        let (b, p) = plan(&staged, &target(MemoryKind::PinnedHost)).unwrap();
        assert_eq!(b, Backend::Kernel);
        assert!(
            matches!(
                p,
                Plan::Kernel {
                    launch: Launch {
                        kernel: Kernel::Transfer(_),
                        threads: TRANSFER_THREADS,
                        ..
                    },
                    ..
                }
            ),
            "{p:?}"
        );
        // Staging too short, or misaligned.
        let short = BlockCopy {
            staging: Some(bytes_mut(0x4000_0000, 31)),
            ..staged
        };
        assert!(matches!(
            plan(&short, &dev),
            Err(Error::BufferTooSmall {
                name: "staging",
                ..
            })
        ));
        let odd = BlockCopy {
            staging: Some(bytes_mut(0x4000_0004, 32)),
            ..staged
        };
        assert_invalid(plan(&odd, &dev), "staging");
        // Kernel with a host map and neither staging nor scratch is refused, DMA with a device
        // map too.
        let unstaged = BlockCopy {
            backend: Backend::Kernel,
            ..op(s, d, &pairs)
        };
        assert_invalid(plan(&unstaged, &bare), "staging");
        let dma_device_map = BlockCopy {
            backend: Backend::Dma,
            map: BlockMap::Device {
                pairs: bytes(0x5000_0000, 32),
                len: 2,
            },
            ..op(s, d, &pairs)
        };
        assert_invalid(plan(&dma_device_map, &dev), "backend");
        // An empty host map on the kernel: nothing at all (no upload, no launch).
        let empty = BlockCopy {
            backend: Backend::Kernel,
            staging: Some(staging),
            ..op(s, d, &[])
        };
        assert!(matches!(
            plan(&empty, &dev),
            Ok((Backend::Kernel, Plan::Nothing))
        ));
    }

    #[test]
    fn largest_divisor_matches_a_full_search() {
        let full = |n: u64, cap: u64| {
            (1..=n)
                .filter(|d| n.is_multiple_of(*d) && *d <= cap)
                .max()
                .unwrap_or(1)
        };
        for n in (0..600).chain([1 << 17, 3 << 12, 1_000_003, 65_536 * 3 * 5]) {
            for cap in [0, 1, 2, 7, 64, 1024] {
                assert_eq!(largest_divisor_at_most(n, cap), full(n, cap), "{n} {cap}");
            }
        }
    }

    #[test]
    fn dma_spans_merge_runs_of_whole_blocks() {
        let (s, d) = (nhd(SRC, NB, L, BS, H, D, E), nhd(DST, 7, L, BS, H, D, E));
        let block = (L * 2 * BS * H * D * E) as u64;
        // 0->1, 1->2 form a run; padding is dropped; 3->0 stands alone.
        let pairs = [[0i64, 1], [1, 2], [-1, -1], [3, 0]];
        let dma = BlockCopy {
            backend: Backend::Dma,
            ..op(s, d, &pairs)
        };
        let (_, p) = plan(&dma, &target(MemoryKind::Device)).unwrap();
        let Plan::Dma(spans) = p else { panic!("{p:?}") };
        assert_eq!(
            spans.to_vec(),
            vec![
                Span {
                    dst: DST + block,
                    src: SRC,
                    bytes: 2 * block
                },
                Span {
                    dst: DST,
                    src: SRC + 3 * block,
                    bytes: block
                },
            ]
        );
    }

    #[test]
    fn dma_spans_convert_cross_layer_to_layer_first() {
        // One span per (layer, part): the chunk is one layer's K or V of a block.
        let (s, d) = (
            nhd(SRC, NB, L, BS, H, D, E),
            layer_first(DST, NB, L, BS, H, D, E),
        );
        let part = (BS * H * D * E) as u64;
        let cache = NB as u64 * part; // one layer's K (or V) in the layer-first pool
        let dma = BlockCopy {
            backend: Backend::Dma,
            ..op(s, d, &[[2, 1]])
        };
        let (_, p) = plan(&dma, &target(MemoryKind::Device)).unwrap();
        let Plan::Dma(spans) = p else { panic!("{p:?}") };
        let mut want = Vec::new();
        for l in 0..L as u64 {
            for k in 0..2u64 {
                want.push(Span {
                    dst: DST + l * cache + k * L as u64 * cache + part,
                    src: SRC + 2 * (L as u64 * 2 * part) + (2 * l + k) * part,
                    bytes: part,
                });
            }
        }
        assert_eq!(spans.to_vec(), want);
    }

    #[test]
    fn auto_takes_dma_for_long_host_spans_only() {
        // Whole cross-layer blocks of 3 layers × 256 tokens: 3 MiB spans, at least DMA_MIN_SPAN.
        let (s, d) = (nhd(SRC, NB, L, 256, H, D, E), nhd(DST, NB, L, 256, H, D, E));
        const { assert!(L * 2 * 256 * H * D * E >= DMA_MIN_SPAN) };
        let pairs = [[0i64, 1]];
        let (b, _) = plan(&op(s, d, &pairs), &target(MemoryKind::PinnedHost)).unwrap();
        assert_eq!(b, Backend::Dma);
        // The same spans inside the device: the kernel.
        let (b, _) = plan(&op(s, d, &pairs), &target(MemoryKind::Device)).unwrap();
        assert_eq!(b, Backend::Kernel);
        // Layer-first on one side: one layer's K or V of a block (256 KiB) is the span.
        let lf = layer_first(DST, NB, L, 256, H, D, E);
        let (b, _) = plan(&op(s, lf, &pairs), &target(MemoryKind::PinnedHost)).unwrap();
        assert_eq!(b, Backend::Kernel);
    }
}
