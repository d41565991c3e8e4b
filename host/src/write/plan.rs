//! Validation and launch planning of the write path: one [`Plan`] per update.

use kvio_kernels::args::{SliceArgs, SlotArgs, TileArgs};
use kvio_kernels::index::{access_width, group_shift};
use kvio_kernels::ops::{
    PAGE_TOKENS, PAGE_TOKENS_FP8, PAGE_UNITS, PAGE_UNITS_FP8, STREAM_LANES, STREAM_UNITS,
};

use kvio_kernels::convert;

use super::{
    CacheWrite, Fp8, MlaUpdate, Quantize, Scale, SliceUpdate, SlotMapping, SlotUpdate, SrcType,
};
use crate::error::{invalid, Error, Result};
use crate::error_word::DeviceErrors;
use crate::launch::{
    cta_threads, grid_for, one_cta_threads, Entry, BLOCK_THREADS, PAGE_THREADS, PER_LANE,
};
use crate::layout::{chunks_disjoint, PagedLayout, TokenLayout};
use crate::mem::DeviceBytes;
use crate::plan::{Kernel, Launch, Plan, Staging, Target};

/// Whether the byte ranges `[a, a + a_len)` and `[b, b + b_len)` share a byte (empty ranges
/// share none).
fn shares_bytes((a, a_len): (u64, u64), (b, b_len): (u64, u64)) -> bool {
    a_len > 0 && b_len > 0 && a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}

fn fits(name: &'static str, needed: u64, len: usize) -> Result<()> {
    if needed > len as u64 {
        Err(Error::BufferTooSmall {
            name,
            needed,
            len: len as u64,
        })
    } else {
        Ok(())
    }
}

/// The input and the cache agree on heads and head size, and their element sizes are what
/// the update stores: the same when copying, the source type's and one byte when quantizing
/// with `q`.
fn same_shape(input: &TokenLayout, cache: &PagedLayout, q: Option<&Quantize<'_>>) -> Result<()> {
    if input.num_heads != cache.num_heads || input.head_dim != cache.head_dim {
        return Err(invalid(
            "input",
            (input.num_heads, input.head_dim),
            "(num_heads, head_dim) differ from the cache's",
        ));
    }
    elem_sizes("input", input.elem_bytes, cache.elem_bytes, q)
}

/// Element sizes of new rows (`name`, `input` bytes) and cache: equal when copying; the source
/// type's and one byte when quantizing with `q`.
fn elem_sizes(
    name: &'static str,
    input: usize,
    cache: usize,
    q: Option<&Quantize<'_>>,
) -> Result<()> {
    match q {
        None if input != cache => Err(invalid(name, input, "elem_bytes differs from the cache's")),
        Some(q) if input != q.src.bytes() => Err(invalid(
            name,
            input,
            "elem_bytes differs from the quantized source type's size",
        )),
        Some(_) if cache != 1 => Err(invalid(
            "cache",
            cache,
            "an fp8 cache has one byte per element",
        )),
        _ => Ok(()),
    }
}

/// A quantizing update's scales (`heads` heads; V's given exactly when the update writes V):
/// the kernel's conversion code and whether the scales are per head.
fn check_scales(q: &Quantize<'_>, heads: usize, with_value: bool) -> Result<(u32, bool)> {
    if with_value != q.v_scale.is_some() {
        return Err(invalid(
            "v_scale",
            q.v_scale.is_some(),
            "a V scale is needed exactly when the update writes V",
        ));
    }
    let per_head = matches!(q.k_scale, Scale::PerHead(_));
    for (name, s) in [("k_scale", Some(q.k_scale)), ("v_scale", q.v_scale)] {
        let Some(s) = s else { continue };
        let (bytes, head) = match s {
            Scale::PerTensor(b) => (b, false),
            Scale::PerHead(b) => (b, true),
        };
        if head != per_head {
            return Err(invalid(
                name,
                head,
                "K and V scales must both be per tensor or per head",
            ));
        }
        let need = if head { 4 * heads as u64 } else { 4 };
        fits(name, need, bytes.len())?;
        if !bytes.ptr().is_multiple_of(4) {
            return Err(invalid(name, bytes.ptr(), "must be 4-byte aligned (f32)"));
        }
    }
    let src = match q.src {
        SrcType::Bf16 => convert::SRC_BF16,
        SrcType::F16 => convert::SRC_F16,
        SrcType::F32 => convert::SRC_F32,
    };
    let to = match q.fp8 {
        Fp8::E4m3 => convert::TO_E4M3,
        Fp8::E5m2 => convert::TO_E5M2,
    };
    Ok((convert::code(src, to), per_head))
}

/// A slot update's quantization checked ([`check_scales`]), if it quantizes.
fn scales_of(op: &SlotUpdate<'_>) -> Result<Option<(u32, bool)>> {
    op.quantize
        .as_ref()
        .map(|q| check_scales(q, op.input.num_heads, op.value.is_some()))
        .transpose()
}

/// Every buffer of a slot update holds what its layout reaches: the inputs `src_ext` bytes,
/// the key cache `k_ext`, the value cache `v_ext`.
fn kv_fit(op: &SlotUpdate<'_>, src_ext: u64, k_ext: u64, v_ext: u64) -> Result<()> {
    fits("key", src_ext, op.key.src.len())?;
    fits("key_cache", k_ext, op.key.dst.len())?;
    if let Some(v) = op.value {
        fits("value", src_ext, v.src.len())?;
        fits("value_cache", v_ext, v.dst.len())?;
    }
    Ok(())
}

/// Scale pointers of a quantizing update (0 when absent).
fn scale_ptr(s: Option<Scale<'_>>) -> u64 {
    match s {
        Some(Scale::PerTensor(b) | Scale::PerHead(b)) => b.ptr(),
        None => 0,
    }
}

fn err_ptr(e: Option<&DeviceErrors>) -> u64 {
    e.map_or(0, DeviceErrors::ptr)
}

/// Validates a slot update into one launch of `kvio_update_slots` ([`Plan::Nothing`] for no
/// token).
pub(crate) fn slots<'a>(op: &SlotUpdate<'_>, target: &Target<'_>) -> Result<Plan<'a>> {
    if op.cache.is_pieced() || op.value_layout.is_some_and(|v| v != op.cache) {
        return tiles(op, target);
    }
    let src_ext = op.input.extent("input")?;
    let dst_ext = op.cache.extent("cache")?;
    same_shape(&op.input, &op.cache, op.quantize.as_ref())?;
    let quant = scales_of(op)?;
    kv_fit(op, src_ext, dst_ext, dst_ext)?;
    if let Some(v) = op.value {
        {
            let (k, vp) = (op.key.dst.ptr(), v.dst.ptr());
            let (lo, hi) = if k <= vp { (k, vp) } else { (vp, k) };
            if hi < lo + dst_ext {
                // The views share an allocation: K and V chunks must still be disjoint.
                let dims = op.cache.dims();
                let all = [dims[0], dims[1], dims[2], (2, hi - lo)];
                if hi == lo || !chunks_disjoint(&all, op.cache.chunk_bytes() as u64) {
                    return Err(invalid(
                        "value_cache",
                        vp,
                        "overlaps key_cache: K and V writes would collide",
                    ));
                }
            }
        }
    }
    let Some((slots, w, n)) = slot_list(&op.slots, op.input.num_tokens)? else {
        return Ok(Plan::Nothing);
    };
    let e = op.cache.elem_bytes as u64;
    let ie = op.input.elem_bytes as u64;
    let (c, i) = (&op.cache, &op.input);
    // Merge all heads of a token into one span when both sides hold them contiguously (and no
    // scale differs between heads).
    let merged = (c.num_heads == 1 || c.head_stride == c.head_dim)
        && (i.num_heads == 1 || i.head_stride == i.head_dim)
        && !matches!(quant, Some((_, true)));
    let (heads, chunk) = if merged {
        (1, (c.num_heads * c.chunk_bytes()) as u64)
    } else {
        (c.num_heads as u64, c.chunk_bytes() as u64)
    };
    let args = SlotArgs {
        src_k: op.key.src.ptr() as *const u8,
        src_v: op.value.map_or(0, |v| v.src.ptr()) as *const u8,
        src_token_stride: i.token_stride as u64 * ie,
        src_head_stride: if merged { 0 } else { i.head_stride as u64 * ie },
        dst_k: op.key.dst.ptr() as *mut u8,
        dst_v: op.value.map_or(0, |v| v.dst.ptr()) as *mut u8,
        dst_block_stride: c.block_stride as u64 * e,
        dst_token_stride: c.token_stride as u64 * e,
        dst_head_stride: if merged { 0 } else { c.head_stride as u64 * e },
        num_blocks: c.num_blocks as u64,
        block_size: c.block_size as u64,
        heads,
        chunk_bytes: chunk,
        chunk_bytes_v: chunk,
        src_token_stride_v: i.token_stride as u64 * ie,
        slots: slots as *const u8,
        slot_is_i64: (w == 8) as u32,
        num_tokens: n as u64,
        convert: quant.map_or(convert::NONE, |(code, _)| code),
        k_scale: scale_ptr(op.quantize.map(|q| q.k_scale)) as *const f32,
        v_scale: scale_ptr(op.quantize.and_then(|q| q.v_scale)) as *const f32,
        scale_per_head: quant.is_some_and(|(_, per_head)| per_head) as u32,
        rows: 0,
        width: 0,
        shift: 0,
        errors: err_ptr(op.errors) as *mut u32,
    };
    slot_launch(args, ie, target)
}

/// Whether the cache `base` and the block, head and piece strides of `l` (the piece stride
/// only where there are pieces) are multiples of `bytes`: the alignment of what a run of a
/// part stores from a slot that is a multiple of 8 (transposed columns, and the pages
/// entries' 16-byte line chunks), whose token stride does not enter.
fn strides_aligned(l: &PagedLayout, base: u64, bytes: u64) -> bool {
    let e = l.elem_bytes as u64;
    let piece = if l.is_pieced() { l.piece_stride } else { 0 };
    [
        base,
        l.block_stride as u64 * e,
        l.head_stride as u64 * e,
        piece as u64 * e,
    ]
    .iter()
    .all(|v| v.is_multiple_of(bytes))
}

/// How a tiled update stores one part: `(unit, runs)`, elements per store (8, 4 or 1, each
/// store aligned to `min(unit * elem, 16)` bytes) and whether eight aligned consecutive slots
/// may be written as one run (8-slot-aligned blocks; with one element per piece, as
/// transposed columns of `8 * elem` bytes, which must be aligned too).
fn tile_stores(name: &'static str, l: &PagedLayout, base: u64) -> Result<(u32, bool)> {
    let e = l.elem_bytes as u64;
    let token = l.token_stride as u64 * e;
    let aligned = |bytes: u64| strides_aligned(l, base, bytes) && token.is_multiple_of(bytes);
    let pe = l.piece_elems;
    if l.is_pieced() && !(pe == 1 || pe == 4 || pe.is_multiple_of(8)) {
        return Err(invalid(
            name,
            pe,
            "piece_elems must be 1, 4 or a multiple of 8",
        ));
    }
    let unit = [8u32, 4, 1]
        .into_iter()
        .find(|&u| pe.is_multiple_of(u as usize) && aligned((u as u64 * e).min(16)))
        .ok_or_else(|| invalid(name, base, "misaligned for its element type"))?;
    let runs = l.block_size.is_multiple_of(8)
        && if pe == 1 {
            l.token_stride == 1 && strides_aligned(l, base, (8 * e).min(16))
        } else {
            unit > 1
        };
    Ok((unit, runs))
}

/// Whether the pages entries (`kvio_update_pages`, `kvio_update_pages_fp8`, `_fp8_32`) can
/// store part `l` at `base` from their tile, given what [`tile_stores`] decided for it
/// (`unit`, `runs`): one element per piece (v0 V, runs: consecutive slots) or 16-byte pieces
/// at consecutive 16-byte slots stored whole (v0 K, `unit == 8`), on pages of a multiple of
/// 16 slots, with [`strides_aligned`] to 16 bytes (for 2-byte elements runs and `unit == 8`
/// imply it, for fp8 only 8). Every 16-byte chunk of a line it stores is then aligned.
fn pageable(l: &PagedLayout, base: u64, unit: u32, runs: bool) -> bool {
    let lines = l.piece_elems == 1
        || (l.piece_elems * l.elem_bytes == 16 && l.token_stride == l.piece_elems && unit == 8);
    runs && lines
        && strides_aligned(l, base, 16)
        && l.block_size.is_multiple_of(PAGE_TOKENS as usize)
}

/// The largest page (slots, a power of two from 8) on which quantizing v0 prefills stream
/// (`kvio_update_stream_fp8`).
const STREAM_FP8_PAGE: usize = 64;

/// The largest page (slots, a power of two) on which copying v0 prefills into 2-byte caches
/// stream (`kvio_update_stream`, `kvio_update_stream_rot`).
const STREAM_COPY_PAGE: usize = 128;

/// Token count from which a tiled update takes eight tokens per thread.
const TILE_FROM: usize = 1024;

/// Validates a slot update whose caches split head vectors into pieces (vLLM's v0 layout), or
/// whose K and V caches are laid out differently, into one launch of `kvio_update_tiles`.
fn tiles<'a>(op: &SlotUpdate<'_>, target: &Target<'_>) -> Result<Plan<'a>> {
    let (i, kl) = (&op.input, &op.cache);
    let vl = op.value_layout.unwrap_or(*kl);
    let src_ext = i.extent("input")?;
    let k_ext = kl.extent("cache")?;
    let v_ext = vl.extent("value_layout")?;
    same_shape(i, kl, op.quantize.as_ref())?;
    if vl.shape() != kl.shape() {
        return Err(invalid(
            "value_layout",
            vl.shape(),
            "(blocks, block size, heads, head_dim, elem_bytes) differ from the key cache's",
        ));
    }
    if op.value.is_none() && op.value_layout.is_some() {
        return Err(invalid(
            "value_layout",
            "without value",
            "a value layout needs values and a value cache",
        ));
    }
    if !kl.head_dim.is_multiple_of(8) {
        return Err(invalid(
            "cache",
            kl.head_dim,
            "updates of layouts with pieces (v0) need head_dim a multiple of 8",
        ));
    }
    let quant = scales_of(op)?;
    kv_fit(op, src_ext, k_ext, v_ext)?;
    if let Some(v) = op.value {
        let (k, vp) = (op.key.dst.ptr(), v.dst.ptr());
        if shares_bytes((k, k_ext), (vp, v_ext)) {
            return Err(invalid(
                "value_cache",
                vp,
                "overlaps key_cache: K and V writes would collide",
            ));
        }
    }
    let Some((slots, w, n)) = slot_list(&op.slots, i.num_tokens)? else {
        return Ok(Plan::Nothing);
    };
    let (kv_dst, vv_dst) = (op.key.dst.ptr(), op.value.map_or(0, |v| v.dst.ptr()));
    let (unit_k, runs_k) = tile_stores("key_cache", kl, kv_dst)?;
    let (unit_v, runs_v) = if op.value.is_some() {
        tile_stores("value_cache", &vl, vv_dst)?
    } else {
        (1, false)
    };
    let (e, ie) = (kl.elem_bytes as u64, i.elem_bytes as u64);
    let (src_k, src_v) = (op.key.src.ptr(), op.value.map_or(0, |v| v.src.ptr()));
    let src_at = [
        src_k,
        src_v,
        i.token_stride as u64 * ie,
        i.head_stride as u64 * ie,
    ];
    let src_vec = src_at.iter().all(|v| v.is_multiple_of((8 * ie).min(16)));
    for (name, p) in [("key", src_k), ("value", src_v)] {
        if !p.is_multiple_of(ie) {
            return Err(invalid(name, p, "misaligned for its element type"));
        }
    }
    // Prefill sizes: tiles of eight tokens (runs of whole pages stored wide); decode sizes:
    // one token per thread, as latency-bound as the NHD update, K and V of one (token, head,
    // group) in one item, split in 32 bits (so fewer than 2^32 items).
    let groups = kl.head_dim as u64 / 8;
    // `kvio_update_tiles_one`'s items, where it takes the update (caches of 4-byte elements
    // run `kvio_update_tiles_wide`, one part per item).
    let one = (n as u64)
        .checked_mul(kl.num_heads as u64 * groups)
        .filter(|&v| n < TILE_FROM && e <= 2 && v <= u32::MAX as u64);
    // Prefill sizes into 2-byte v0 caches of pages of at most `STREAM_COPY_PAGE` slots (a power
    // of two past 16), copied: one token a lane, 32 a warp (`kvio_update_stream`; V as
    // transposed columns where `runs` allows). On the H200 it wrote one sequence of 16,384
    // tokens on 16-slot pages at 75–76% of the copy ceiling against the pages entry's 62%
    // (BENCHMARKS.md, sessions 19 and 20). On larger pages it lost prefill batches until its
    // shifted windows and 256-byte L2 fetches; on the H100 (session 32, against
    // `kvio_update_pages` in the same process) one sequence now gains 9–10 points on 32-,
    // 64- and 128-slot pages (84–88%), batches of 128-token sequences 5–8, of 1,024-token
    // ones +7 on 32-slot pages, −3 on 64, ±0 on 128.
    let stream_items = (n as u64)
        .div_ceil(STREAM_LANES)
        .checked_mul(STREAM_LANES * kl.num_heads as u64 * groups.div_ceil(STREAM_UNITS))
        .filter(|&v| v <= u32::MAX as u64);
    // Quantizing bf16 or f16 into fp8 v0 caches of pages of 8, 16 or 32 slots runs
    // `kvio_update_stream_fp8` where the key cache's 16-byte pieces (16 elements) are 16-byte
    // aligned, so that a run's two quantized units go out as one store (pages of fewer slots
    // hold no run: the tiles). On the H100 (BENCHMARKS.md, session 24), on 32-token pages:
    // one sequence at 77% of the copy ceiling against `kvio_update_pages_fp8_32`'s 70%, batches
    // of many sequences 1–9 points ahead. Session 32 (H100, same process): on 64-token pages
    // one sequence 85% against 73.5%, batches 3–5 points ahead; on 128-token pages one
    // sequence 84% against 73% but batches of 1,024-token sequences 9 points behind (session
    // 24: 10), so pages of 128 slots keep the pages entries.
    let stream_fp8 = e == 1
        && ie == 2
        && quant.is_some()
        && kl.block_size.is_power_of_two()
        && (8..=STREAM_FP8_PAGE).contains(&kl.block_size)
        && strides_aligned(kl, kv_dst, 16);
    let stream_copy = e == 2
        && quant.is_none()
        && (kl.block_size <= PAGE_TOKENS as usize
            || (kl.block_size <= STREAM_COPY_PAGE && kl.block_size.is_power_of_two()));
    let stream = n >= TILE_FROM
        && (stream_copy || stream_fp8)
        && src_vec
        && stream_items.is_some()
        && op.value.is_some()
        && vl.piece_elems == 1
        && kl.piece_elems * kl.elem_bytes == 16;
    let tile: u64 = if stream || one.is_some() || (n < TILE_FROM && e == 4) {
        1
    } else {
        8
    };
    let subs: u64 = match (tile, e) {
        (1, _) if stream => STREAM_LANES,
        (1, _) => 1,
        (_, 1) => 4,
        (_, 2) => 2,
        _ => 1,
    };
    let (runs_k, runs_v) = (runs_k && src_vec, runs_v && src_vec);
    // The copying stream on pages of 8 to 128 slots shifts its warps' windows of tokens, so
    // that a warp whose tokens do not start at a multiple of 8 slots (a batch's sequence
    // starting inside an earlier warp) still stores V as whole columns:
    // `kvio_update_stream_rot`. BENCHMARKS.md, session 28: batches of many sequences on
    // 16-slot pages 58–62% → 66–69% of the copy ceiling on the H200 (64–67% → 73–76% on the
    // H100), on 8-slot pages 66% → 71% (71% → 77%); one sequence loses 3.6 points on
    // 16-slot pages on the H200 (77% → 73%; 2 on the H100), 0.8 on 8-slot ones (the
    // entry's 92 registers leave two CTAs a multiprocessor where `kvio_update_stream` has
    // three). Pages of 1, 2 or 4 slots hold no octet: the plain stream.
    let rotate = stream && stream_copy && runs_v;
    // Prefill sizes into fp8 caches that the pages update below does not take run
    // `kvio_update_tiles_staged`, which copies each thread's next tile into shared memory
    // while it quantizes and stores the current one (`staged`) when the tiles may be runs and
    // their loads fit a 16-byte cell: 1- or 2-byte source elements, and a 16-byte aligned
    // slot array.
    let staged = tile == 8 && e == 1 && ie <= 2 && (runs_k || runs_v) && slots.is_multiple_of(16);
    // Prefill sizes whose pages a CTA can fill from its tile (v0 K and V, pages of a multiple
    // of 16 slots) run `kvio_update_pages` (2-byte caches, copied) or `kvio_update_pages_fp8`
    // (fp8 caches quantized from bf16 or f16): items of sixteen tokens (fp8 on pages of a
    // multiple of 32 slots: 32 tokens, so that a value line of one element fills a 32-byte
    // sector) of as many heads as make `PAGE_UNITS` (`PAGE_UNITS_FP8`) units of 32 tile bytes
    // per thread, stored through shared memory as whole lines: a head has
    // `head_dim * elem * tokens / 32` units. Copies into fp8 caches stay on the staged tiles,
    // f32 sources on the tiles.
    let fp8_pages = quant.is_some() && ie == 2;
    let item_tokens = if e == 1 && kl.block_size.is_multiple_of(PAGE_TOKENS_FP8 as usize) {
        PAGE_TOKENS_FP8
    } else {
        PAGE_TOKENS
    };
    let page_units = if e == 1 { PAGE_UNITS_FP8 } else { PAGE_UNITS };
    let max_units = page_units * PAGE_THREADS as u64;
    let head_units = kl.head_dim as u64 * e * item_tokens / 32;
    let pages = tile == 8
        && ((e == 2 && quant.is_none()) || (e == 1 && fp8_pages))
        && src_vec
        && head_units <= max_units
        && pageable(kl, kv_dst, unit_k, runs_k)
        && (op.value.is_none() || pageable(&vl, vv_dst, unit_v, runs_v));
    let (tile, subs) = if pages {
        let heads = (max_units / head_units).min(kl.num_heads as u64).max(1);
        (item_tokens, heads)
    } else {
        (tile, subs)
    };
    let parts = 1 + op.value.is_some() as u64;
    let items = if stream {
        stream_items.unwrap_or(0)
    } else if let Some(items) = one {
        items
    } else if pages {
        (n as u64)
            .div_ceil(tile)
            .checked_mul(parts * (kl.num_heads as u64).div_ceil(subs))
            .ok_or(Error::Overflow { name: "slots" })?
    } else {
        (n as u64)
            .div_ceil(tile * subs)
            .checked_mul(parts * subs)
            .and_then(|v| v.checked_mul(kl.num_heads as u64))
            .and_then(|v| v.checked_mul(groups))
            .ok_or(Error::Overflow { name: "slots" })?
    };
    let args = TileArgs {
        src_k: src_k as *const u8,
        src_v: src_v as *const u8,
        src_token_stride: i.token_stride as u64 * ie,
        src_head_stride: i.head_stride as u64 * ie,
        src_vec: src_vec as u32,
        dst_k: kv_dst as *mut u8,
        block_stride_k: kl.block_stride as u64 * e,
        token_stride_k: kl.token_stride as u64 * e,
        head_stride_k: kl.head_stride as u64 * e,
        piece_k: kl.piece_elems as u64,
        piece_stride_k: kl.piece_stride as u64 * e,
        unit_k,
        dst_v: vv_dst as *mut u8,
        block_stride_v: vl.block_stride as u64 * e,
        token_stride_v: vl.token_stride as u64 * e,
        head_stride_v: vl.head_stride as u64 * e,
        piece_v: vl.piece_elems as u64,
        piece_stride_v: vl.piece_stride as u64 * e,
        unit_v,
        runs: runs_k as u32 | (runs_v as u32) << 1 | (rotate as u32) << 2,
        num_blocks: kl.num_blocks as u64,
        block_size: kl.block_size as u64,
        heads: kl.num_heads as u64,
        groups,
        elem: e as u32,
        slots: slots as *const u8,
        slot_is_i64: (w == 8) as u32,
        num_tokens: n as u64,
        convert: quant.map_or(convert::NONE, |(code, _)| code),
        k_scale: scale_ptr(op.quantize.map(|q| q.k_scale)) as *const f32,
        v_scale: scale_ptr(op.quantize.and_then(|q| q.v_scale)) as *const f32,
        scale_per_head: quant.is_some_and(|(_, per_head)| per_head) as u32,
        tile: tile as u32,
        subs: subs as u32,
        staged: (staged && !pages) as u32,
        shift: 0,
        errors: err_ptr(op.errors) as *mut u32,
    };
    // The entry point that runs it gives the cap and the CTA size; one token per thread
    // (`kvio_update_tiles_one`) takes smaller CTAs, so a decode step's scattered V stores (one
    // sector per element) spread over many multiprocessors' load/store units.
    let entry = Kernel::Tiles(args).entry();
    let cap = target.caps.of(entry);
    let threads = match (entry, entry.cta_threads()) {
        (Entry::UpdateTilesOne, _) => one_cta_threads(items, target.caps.sms),
        (_, Some(threads)) => threads,
        (_, None) => unreachable!("a tiled update runs a write-path entry"),
    };
    Ok(Plan::Kernel {
        upload: None,
        then: None,
        launch: Launch {
            kernel: Kernel::Tiles(args),
            // A whole CTA per item for the pages entries.
            grid: grid_for(items, if pages { 1 } else { threads }, 0, cap),
            threads,
        },
    })
}

/// Validates an MLA update into one launch of the slot kernel: K is the latent part, V the
/// rope part of the same row (their own widths and input strides), one head; a quantizing
/// update makes each token's row one work item (`rows`).
pub(crate) fn mla<'a>(op: &MlaUpdate<'_>, target: &Target<'_>) -> Result<Plan<'a>> {
    let (lk, lp, c) = (&op.kv_c_layout, &op.k_pe_layout, &op.layout);
    if lk.num_heads != 1 || lp.num_heads != 1 || c.num_heads != 1 {
        return Err(invalid(
            "layout",
            (lk.num_heads, lp.num_heads, c.num_heads),
            "MLA rows have one head (kv_c, k_pe and the cache)",
        ));
    }
    if lk.head_dim.checked_add(lp.head_dim) != Some(c.head_dim) {
        return Err(invalid(
            "k_pe_layout",
            (lk.head_dim, lp.head_dim, c.head_dim),
            "kv_c and k_pe widths do not add up to the cache row",
        ));
    }
    if lk.elem_bytes != lp.elem_bytes {
        return Err(invalid(
            "k_pe_layout",
            (lk.elem_bytes, lp.elem_bytes),
            "kv_c and k_pe differ in element size",
        ));
    }
    elem_sizes(
        "kv_c_layout",
        lk.elem_bytes,
        c.elem_bytes,
        op.quantize.as_ref(),
    )?;
    let quant = match &op.quantize {
        Some(q) if q.v_scale.is_some() || matches!(q.k_scale, Scale::PerHead(_)) => {
            return Err(invalid(
                "quantize",
                "v_scale or per-head",
                "an MLA row has one per-tensor scale (k_scale only)",
            ))
        }
        Some(q) => Some(check_scales(q, 1, false)?.0),
        None => None,
    };
    fits("kv_c", lk.extent("kv_c_layout")?, op.kv_c.len())?;
    fits("k_pe", lp.extent("k_pe_layout")?, op.k_pe.len())?;
    fits("cache", c.extent("layout")?, op.cache.len())?;
    c.contiguous_heads("layout")?;
    let tokens = lk.num_tokens.min(lp.num_tokens);
    let Some((slots, w, n)) = slot_list(&op.slots, tokens)? else {
        return Ok(Plan::Nothing);
    };
    let (e, ie) = (c.elem_bytes as u64, lk.elem_bytes as u64);
    let scale = scale_ptr(op.quantize.map(|q| q.k_scale)) as *const f32;
    let args = SlotArgs {
        src_k: op.kv_c.ptr() as *const u8,
        src_v: op.k_pe.ptr() as *const u8,
        src_token_stride: lk.token_stride as u64 * ie,
        src_head_stride: 0,
        dst_k: op.cache.ptr() as *mut u8,
        dst_v: (op.cache.ptr() + lk.head_dim as u64 * e) as *mut u8,
        dst_block_stride: c.block_stride as u64 * e,
        dst_token_stride: c.token_stride as u64 * e,
        dst_head_stride: 0,
        num_blocks: c.num_blocks as u64,
        block_size: c.block_size as u64,
        heads: 1,
        chunk_bytes: lk.head_dim as u64 * e,
        chunk_bytes_v: lp.head_dim as u64 * e,
        src_token_stride_v: lp.token_stride as u64 * ie,
        slots: slots as *const u8,
        slot_is_i64: (w == 8) as u32,
        num_tokens: n as u64,
        convert: quant.unwrap_or(convert::NONE),
        k_scale: scale,
        v_scale: scale,
        scale_per_head: 0,
        // A row is one item: the rope part alone (eight 16-byte units) would leave most of a
        // group's lanes idle (measured 2x at T = 16,384 when converting). The rows kernels
        // (copying: `kvio_update_rows`, converting: `kvio_update_rows_convert`) load both
        // parts in one round before the slot is read.
        rows: 1,
        width: 0,
        shift: 0,
        errors: err_ptr(op.errors) as *mut u32,
    };
    slot_launch(args, ie, target)
}

/// A slot mapping's `(address, slot size, count)`, checked (length, alignment, at most
/// `num_tokens` slots); `None` when it holds no slot.
fn slot_list(slots: &SlotMapping<'_>, num_tokens: usize) -> Result<Option<(u64, usize, usize)>> {
    let (bytes, w) = slots.parts();
    if bytes.len() % w != 0 {
        return Err(invalid(
            "slots",
            bytes.len(),
            "byte length is not a multiple of the slot size",
        ));
    }
    if bytes.ptr() % w as u64 != 0 {
        return Err(invalid(
            "slots",
            bytes.ptr(),
            "misaligned for its element type",
        ));
    }
    let n = slots.len();
    if n > num_tokens {
        return Err(invalid("slots", n, "more slots than input tokens"));
    }
    Ok((n > 0).then_some((bytes.ptr(), w, n)))
}

/// The launch of a slot update whose addresses, strides and chunks are filled in: access
/// width and lanes per item (copying, or converting from `ie`-byte source elements), grid.
fn slot_launch<'a>(mut args: SlotArgs, ie: u64, target: &Target<'_>) -> Result<Plan<'a>> {
    let parts = if args.src_v.is_null() || args.rows != 0 {
        1
    } else {
        2
    };
    // The kernel iterates over this many items: refuse a count that would wrap.
    let items = args
        .num_tokens
        .checked_mul(parts)
        .and_then(|v| v.checked_mul(args.heads))
        .ok_or(Error::Overflow { name: "slots" })?;
    let converting = args.convert != convert::NONE;
    // An item's bytes: K's or V's chunk, or for a row the larger of its two parts (the rows
    // kernels split each part between the group's lanes, side by side).
    let chunk = args.chunk_bytes.max(args.chunk_bytes_v);
    if converting {
        // The converting kernel counts an item's elements (a row's both parts) in 32 bits.
        let both = args.chunk_bytes.checked_add(args.chunk_bytes_v);
        if both.is_none_or(|b| b > u32::MAX as u64) {
            return Err(Error::Overflow { name: "chunk" });
        }
        // Elements per span = fp8 bytes; 8-element units where both sides allow them.
        let src_ok = [args.src_k as u64, args.src_v as u64]
            .iter()
            .chain(&[
                args.src_token_stride,
                args.src_token_stride_v,
                args.src_head_stride,
            ])
            .all(|v| v.is_multiple_of(16));
        let dst_ok = [args.dst_k as u64, args.dst_v as u64]
            .iter()
            .chain(&[
                args.dst_block_stride,
                args.dst_token_stride,
                args.dst_head_stride,
            ])
            .all(|v| v.is_multiple_of(8));
        let vec = args.chunk_bytes.is_multiple_of(convert::VEC)
            && args.chunk_bytes_v.is_multiple_of(convert::VEC)
            && src_ok
            && dst_ok;
        if !vec {
            for (name, p) in [("key", args.src_k as u64), ("value", args.src_v as u64)] {
                if !p.is_multiple_of(ie) {
                    return Err(invalid(name, p, "misaligned for its element type"));
                }
            }
        }
        args.width = if vec { convert::VEC as u32 } else { 1 };
        let units = if vec { chunk / convert::VEC } else { chunk };
        // Converting is arithmetic, not just a copy. When the whole update fits in the
        // resident grid at one unit per lane (decode sizes), give each item that many lanes
        // (a group may span several warps): it finishes in one unit's time. Larger updates
        // stream with a few units per lane, as copies do.
        let max_shift = BLOCK_THREADS.trailing_zeros();
        let wide = (0..=max_shift)
            .find(|&s| 1u64 << s >= units)
            .unwrap_or(max_shift);
        let cap = target.caps.of(Kernel::Slots(args).entry());
        let resident = cap as u64 * BLOCK_THREADS as u64;
        args.shift = if items.saturating_mul(1 << wide) <= resident {
            wide
        } else if args.rows != 0 && vec {
            // `kvio_update_rows_convert` holds `convert::batch` units of the latent part and
            // one of the rope part per lane (four 16-byte loads: four units of bf16/f16, two
            // of f32) and loads a whole row in one round when both parts fit: an MLA row
            // (64 + 8 units) gets 16 lanes from bf16/f16 (4 + 1 units a lane), 32 from f32
            // (2 + 1).
            row_shift(
                [args.chunk_bytes, args.chunk_bytes_v].map(|b| b / convert::VEC),
                convert::batch(args.convert) as u64,
            )
        } else {
            group_shift(units, PER_LANE)
        };
    } else {
        args.width = access_width(&[
            args.src_k as u64,
            args.src_v as u64,
            args.dst_k as u64,
            args.dst_v as u64,
            args.src_token_stride,
            args.src_token_stride_v,
            args.src_head_stride,
            args.dst_block_stride,
            args.dst_token_stride,
            args.dst_head_stride,
            args.chunk_bytes,
            args.chunk_bytes_v,
        ]);
        let w = args.width as u64;
        args.shift = if args.rows != 0 {
            // `kvio_update_rows`: PER_LANE units of the latent part, one of the rope part.
            row_shift([args.chunk_bytes / w, args.chunk_bytes_v / w], PER_LANE)
        } else {
            group_shift(chunk / w, PER_LANE)
        };
    }
    let cap = target.caps.of(Kernel::Slots(args).entry());
    let threads = cta_threads(items, args.shift, target.caps.sms);
    Ok(Plan::Kernel {
        upload: None,
        then: None,
        launch: Launch {
            kernel: Kernel::Slots(args),
            grid: grid_for(items, threads, args.shift, cap),
            threads,
        },
    })
}

/// Lanes (as `log2`) for one-row items whose parts have `units` accesses each: the rows
/// kernels hold `per_lane` of the first part (the latent part) and one of the second (the rope
/// part) per lane and round, so a row takes one round where both fit.
fn row_shift(units: [u64; 2], per_lane: u64) -> u32 {
    group_shift(units[0], per_lane).max(group_shift(units[1], 1))
}

/// Bytes of rows one work item of the slice update copies (at most).
const SLICE_ITEM_BYTES: usize = 8192;

/// Validates a slice update: rows copied as they are into a cache of contiguous rows are one
/// launch of `kvio_update_slices`; every other update goes [`through_slots`]. The slice count
/// lives on the device, so there is always a launch.
pub(crate) fn slices<'a>(op: &SliceUpdate<'_>, target: &Target<'_>) -> Result<Plan<'a>> {
    let (l, i) = (&op.layout, &op.input);
    slice_table(op)?;
    let rows = |heads: usize, stride: usize, dim: usize| heads == 1 || stride == dim;
    if op.value.is_some()
        || op.value_layout.is_some()
        || op.quantize.is_some()
        || l.is_pieced()
        || !rows(l.num_heads, l.head_stride, l.head_dim)
        || !rows(i.num_heads, i.head_stride, i.head_dim)
    {
        return through_slots(op, target);
    }
    let src_ext = op.input.extent("input")?;
    let dst_ext = op.layout.extent("layout")?;
    same_shape(&op.input, &op.layout, None)?;
    fits("new_kv", src_ext, op.new_kv.len())?;
    fits("cache", dst_ext, op.cache.len())?;
    let row = l.num_heads * l.chunk_bytes();
    let e = l.elem_bytes;
    let merge = i.token_stride * e == row && l.token_stride * e == row;
    let rows_per_item = (SLICE_ITEM_BYTES / row).clamp(1, l.block_size) as u32;
    let width = access_width(&[
        op.new_kv.ptr(),
        op.cache.ptr(),
        (i.token_stride * e) as u64,
        (l.block_stride * e) as u64,
        (l.token_stride * e) as u64,
        row as u64,
    ]);
    let span = if merge {
        row as u64 * rows_per_item as u64
    } else {
        row as u64
    };
    let shift = group_shift(span / width as u64, PER_LANE);
    let pieces = (l.block_size as u64).div_ceil(rows_per_item as u64);
    let args = SliceArgs {
        src: op.new_kv.ptr() as *const u8,
        src_row_stride: (i.token_stride * e) as u64,
        dst: op.cache.ptr() as *mut u8,
        dst_page_stride: (l.block_stride * e) as u64,
        dst_row_stride: (l.token_stride * e) as u64,
        row_bytes: row as u64,
        num_slots: l.num_slots() as u64,
        num_tokens: i.num_tokens as u64,
        page_size: l.block_size as u32,
        slices: op.slices.ptr() as *const i32,
        padded: op.padded as u32,
        num_slices: op.num_slices.ptr() as *const i32,
        rows_per_item,
        merge: merge as u32,
        width,
        shift,
        errors: err_ptr(op.errors) as *mut u32,
    };
    Ok(Plan::Kernel {
        upload: None,
        then: None,
        launch: Launch {
            kernel: Kernel::Slices(args),
            grid: grid_for(
                op.padded as u64 * pieces,
                BLOCK_THREADS,
                shift,
                target.caps.of(Entry::UpdateSlices),
            ),
            threads: BLOCK_THREADS,
        },
    })
}

/// Where a slice update's slot list in scratch is planned ([`through_slots`]): an address
/// aligned as kvio's scratch memory is, never dereferenced (the runner and the emulator point
/// the launches at the real list first).
const LIST_STAND_IN: u64 = 1 << 40;

/// A slice update through a slot list: `kvio_slices_to_slots` turns the table into one `i32`
/// slot per source row (-1 where no slice names it), then the slot update planned by
/// [`slots`] (any layout, V with its own layout, fp8) writes the rows. Everything the slot
/// update checks is checked here, before anything runs.
fn through_slots<'a>(op: &SliceUpdate<'_>, target: &Target<'_>) -> Result<Plan<'a>> {
    let l = &op.layout;
    if l.num_slots() > 1 << 31 {
        return Err(invalid(
            "layout",
            l.num_slots(),
            "more slots than the slot list's i32 can name",
        ));
    }
    let tokens = op.input.num_tokens;
    let bytes = tokens
        .checked_mul(4)
        .ok_or(Error::Overflow { name: "input" })?;
    let (at, staging) = match op.slot_list {
        Some(given) => {
            fits("slot_list", bytes as u64, given.len())?;
            if !given.ptr().is_multiple_of(4) {
                return Err(invalid("slot_list", given.ptr(), "must be 4-byte aligned"));
            }
            // The list is set to -1 and rewritten before the update reads it: it must share
            // no byte with anything else the update reads or writes.
            let list = (given.ptr(), bytes as u64);
            let v = op
                .value
                .map(|v| [(v.src.ptr(), v.src.len()), (v.dst.ptr(), v.dst.len())]);
            let others = [
                (op.new_kv.ptr(), op.new_kv.len()),
                (op.cache.ptr(), op.cache.len()),
                (op.slices.ptr(), op.slices.len()),
                (op.num_slices.ptr(), op.num_slices.len()),
            ];
            if others
                .iter()
                .chain(v.iter().flatten())
                .any(|&(p, n)| shares_bytes(list, (p, n as u64)))
            {
                return Err(invalid(
                    "slot_list",
                    given.ptr(),
                    "overlaps another buffer of the update",
                ));
            }
            (given.ptr(), Staging::Given(given.ptr()))
        }
        None if target.scratch => (LIST_STAND_IN, Staging::Scratch),
        None => {
            return Err(invalid(
                "slot_list",
                "None",
                "this device has no memory pools: pass a slot list for slice updates of this \
                 layout",
            ))
        }
    };
    // SAFETY: a description of the list the launches are pointed at before they run
    // (`Kernel::with_list`): the caller's, or a stand-in for scratch, never dereferenced.
    let list = unsafe { DeviceBytes::from_raw(at, bytes) };
    let slot_op = SlotUpdate {
        key: CacheWrite {
            src: op.new_kv,
            dst: op.cache,
        },
        value: op.value,
        input: op.input,
        cache: op.layout,
        value_layout: op.value_layout,
        slots: SlotMapping::I32(list),
        errors: op.errors,
        quantize: op.quantize,
    };
    let update = match slots(&slot_op, target)? {
        Plan::Kernel {
            upload: None,
            launch,
            then: None,
        } => Some(launch),
        other => {
            // A slot update is one launch, or nothing without a token.
            debug_assert!(matches!(other, Plan::Nothing));
            None
        }
    };
    let args = SliceArgs {
        src: core::ptr::null(),
        src_row_stride: 0,
        dst: at as *mut u8,
        dst_page_stride: 0,
        dst_row_stride: 0,
        row_bytes: 0,
        num_slots: l.num_slots() as u64,
        num_tokens: tokens as u64,
        page_size: l.block_size as u32,
        slices: op.slices.ptr() as *const i32,
        padded: op.padded as u32,
        num_slices: op.num_slices.ptr() as *const i32,
        rows_per_item: 1,
        merge: 0,
        width: 4,
        shift: 0,
        errors: err_ptr(op.errors) as *mut u32,
    };
    let items = (op.padded as u64) * l.block_size as u64;
    Ok(Plan::Expand {
        expand: Launch {
            kernel: Kernel::Expand(args),
            grid: grid_for(
                items,
                BLOCK_THREADS,
                0,
                target.caps.of(Entry::SlicesToSlots),
            ),
            threads: BLOCK_THREADS,
        },
        update,
        tokens,
        list: staging,
    })
}

/// The checks of a slice table's description (the table and the count are read on the
/// device): capacity, lengths, alignment, and page and table sizes that fit the kernels' i32.
fn slice_table(op: &SliceUpdate<'_>) -> Result<()> {
    let l = &op.layout;
    if l.block_size > i32::MAX as usize {
        return Err(invalid(
            "layout.block_size",
            l.block_size,
            "must fit in i32",
        ));
    }
    if op.padded > i32::MAX as usize {
        return Err(invalid("padded", op.padded, "must fit in i32"));
    }
    let table = (op.padded as u64)
        .checked_mul(12)
        .ok_or(Error::Overflow { name: "slices" })?;
    fits("slices", table, op.slices.len())?;
    fits("num_slices", 4, op.num_slices.len())?;
    if !op.slices.ptr().is_multiple_of(4) {
        return Err(invalid("slices", op.slices.ptr(), "must be 4-byte aligned"));
    }
    if !op.num_slices.ptr().is_multiple_of(4) {
        return Err(invalid(
            "num_slices",
            op.num_slices.ptr(),
            "must be 4-byte aligned",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::MemoryKind;
    use crate::launch::GridCap;
    use crate::mem::{DeviceBytes, DeviceBytesMut};
    use crate::write::SlotMapping;

    fn target(cap: u32) -> Target<'static> {
        Target {
            caps: GridCap::uniform(cap),
            kind_of: &|_| MemoryKind::Device,
            scratch: false,
            batched_dma: false,
        }
    }

    /// The slot plan's arguments and grid (`None`: nothing to do).
    fn plan_slots(op: &SlotUpdate<'_>, cap: u32) -> Result<Option<(SlotArgs, u32)>> {
        Ok(match slots(op, &target(cap))? {
            Plan::Kernel {
                upload: None,
                then: None,
                launch:
                    Launch {
                        kernel: Kernel::Slots(a),
                        grid,
                        threads,
                    },
            } => {
                // Full CTAs, or smaller ones at decode sizes (`cta_threads`).
                assert!(threads.is_power_of_two() && (64..=BLOCK_THREADS).contains(&threads));
                Some((a, grid))
            }
            Plan::Nothing => None,
            other => panic!("not a slot-update plan: {other:?}"),
        })
    }

    /// The slice plan's arguments and grid.
    fn plan_slices(op: &SliceUpdate<'_>, cap: u32) -> Result<(SliceArgs, u32)> {
        match slices(op, &target(cap))? {
            Plan::Kernel {
                upload: None,
                then: None,
                launch:
                    Launch {
                        kernel: Kernel::Slices(a),
                        grid,
                        threads: BLOCK_THREADS,
                    },
            } => Ok((a, grid)),
            other => panic!("not a slice-update plan: {other:?}"),
        }
    }

    fn bytes(ptr: u64, len: usize) -> DeviceBytes<'static> {
        // SAFETY: these views are only validated, never used.
        unsafe { DeviceBytes::from_raw(ptr, len) }
    }

    fn bytes_mut(ptr: u64, len: usize) -> DeviceBytesMut<'static> {
        // SAFETY: as above.
        unsafe { DeviceBytesMut::from_raw(ptr, len) }
    }

    fn slot_op<'a>(cache: PagedLayout, n: usize) -> SlotUpdate<'a> {
        let input = TokenLayout::contiguous(n, cache.num_heads, cache.head_dim, cache.elem_bytes);
        let ext = cache.extent("c").unwrap() as usize;
        let src = input.extent("i").unwrap() as usize;
        SlotUpdate::new(
            bytes(0x1000_0000, src),
            input,
            bytes_mut(0x4000_0000, ext),
            cache,
            SlotMapping::I64(bytes(0x3000_0000, n * 8)),
        )
        .value(bytes(0x2000_0000, src), bytes_mut(0x8000_0000, ext))
    }

    #[test]
    fn plan_merges_contiguous_heads() {
        let op = slot_op(PagedLayout::nhd(8, 16, 8, 128, 2), 10);
        let (p, _) = plan_slots(&op, 132).unwrap().unwrap();
        assert_eq!((p.heads, p.chunk_bytes, p.width, p.shift), (1, 2048, 16, 5));
        let op = slot_op(PagedLayout::hnd(8, 16, 8, 128, 2), 10);
        let (p, _) = plan_slots(&op, 132).unwrap().unwrap();
        assert_eq!((p.heads, p.chunk_bytes), (8, 256));
    }

    /// The tiled plan of `op` and its grid.
    fn plan_tiles(op: &SlotUpdate<'_>, cap: u32) -> (TileArgs, u32, u32) {
        let Plan::Kernel { launch, .. } = slots(op, &target(cap)).unwrap() else {
            panic!("no launch")
        };
        let Kernel::Tiles(a) = launch.kernel else {
            panic!("not a tiled update")
        };
        (a, launch.grid, launch.threads)
    }

    /// v0 caches (bf16, fp8) at prefill size: 2-byte caches on pages of at most 16 slots, or
    /// of 32, 64 or 128, stream (`kvio_update_stream`: one token a lane, four groups of one
    /// head; on pages of 8 slots or more `kvio_update_stream_rot`, its warps' windows
    /// shifted); on other pages of a multiple of 16 slots (48, 256) a CTA per sixteen tokens
    /// of a head (`kvio_update_pages`: one item per CTA, so the grid is the item count up to
    /// the cap); fp8 copies, and heads too wide for the tile, tiles of eight tokens, K stored
    /// as whole 16-byte (8-byte) pieces, V as transposed columns; decode size: one token per
    /// thread.
    #[test]
    fn v0_plans_store_runs() {
        for e in [2usize, 1] {
            let (h, d) = (8, 128);
            let v0 = |bs: usize, d: usize| {
                let mut op = slot_op(PagedLayout::v0_key(3000 / bs + 8, bs, h, d, e), 3000);
                op.input = TokenLayout::contiguous(3000, h, d, e);
                op.value_layout = Some(PagedLayout::v0_value(3000 / bs + 8, bs, h, d, e));
                op
            };
            let op = v0(16, d);
            let (a, grid, threads) = plan_tiles(&op, 132);
            if e == 1 {
                // fp8 caches: the staged tiles.
                assert_eq!((a.tile, a.staged, threads), (8, 1, 128));
            } else {
                // The stream: 94 warps of 32 tokens × 8 heads × 4 quads of groups, one item a
                // thread, 128-thread CTAs (`kvio_update_stream_rot`) up to the cap.
                assert_eq!((a.tile, a.subs, grid, threads), (1, 32, 132, 128));
                assert!(a.streams() && !a.pages());
                assert_eq!(plan_tiles(&op, 100_000).1, 94 * 32 * 8 * 4 / 128);
                assert_eq!((a.unit_k, a.unit_v, a.piece_k, a.piece_v), (8, 1, 8, 1));
                // Both parts may go out as runs: V as transposed columns of octets, from
                // `kvio_update_stream_rot`'s shifted windows.
                assert_eq!(a.runs, 7);
                assert!(a.rotates());
                // Pages of 8, 32, 64 and 128 slots: the same, heads of 1,024 too; of 1 slot:
                // no runs, the plain stream.
                for (bs, runs) in [(1, 0), (8, 7), (32, 7), (64, 7), (128, 7)] {
                    let a = plan_tiles(&v0(bs, d), 132).0;
                    assert!(a.streams(), "page {bs}");
                    assert_eq!(a.runs, runs, "page {bs}");
                    assert_eq!(a.rotates(), bs >= 8, "page {bs}");
                }
                assert!(plan_tiles(&v0(32, 1024), 132).0.streams());
                // 48-token pages (a multiple of 16, not a power of two): items of four heads
                // (128 units each).
                let (a, grid, threads) = plan_tiles(&v0(48, d), 132);
                assert_eq!((a.tile, a.subs, grid, threads), (16, 4, 132, 128));
                assert!(a.pages());
                // 188 sixteen-token items × K and V × 2 groups of four heads.
                assert_eq!(plan_tiles(&v0(48, d), 100_000).1, 188 * 2 * 2);
                // 256-token pages too; heads of 256 (two an item) and 512 (one); a head whose
                // sixteen tokens exceed the 16 KiB tile does not.
                assert_eq!(plan_tiles(&v0(256, d), 132).0.tile, 16);
                assert_eq!(plan_tiles(&v0(48, 256), 132).0.subs, 2);
                assert_eq!(plan_tiles(&v0(48, 512), 132).0.subs, 1);
                assert_eq!(plan_tiles(&v0(48, 1024), 132).0.tile, 8);
                // Caches only 8-byte aligned: K stored in 8-byte halves, V without runs, so
                // neither part's 16-byte chunks would be aligned: the tiles (the stream on
                // the pages it takes, K in 8-byte halves).
                for part in [0, 1] {
                    let odd = |bs: usize| {
                        let mut op = v0(bs, d);
                        let dst = if part == 0 {
                            &mut op.key.dst
                        } else {
                            &mut op.value.as_mut().unwrap().dst
                        };
                        *dst = bytes_mut(dst.ptr() + 8, dst.len());
                        plan_tiles(&op, 132).0
                    };
                    let a = odd(16);
                    assert!(a.streams(), "part {part}");
                    assert_eq!(a.unit_k, if part == 0 { 4 } else { 8 }, "part {part}");
                    // No columns: K's pieces or V's columns would not be aligned.
                    assert!(a.unit_k != 8 || a.runs & 2 == 0, "part {part}");
                    assert_eq!(odd(48).tile, 8, "part {part}");
                }
            }
            // Tiles of eight tokens with runs: fp8 copies on 8-token pages, bf16 heads too
            // wide for the pages' tile.
            let (a, _, _) = plan_tiles(&if e == 1 { v0(8, d) } else { v0(48, 1024) }, 132);
            assert_eq!(
                (a.tile, a.runs, a.unit_k, a.unit_v, a.src_vec),
                (8, 3, 8, 1, 1),
                "e={e}"
            );
            assert_eq!((a.piece_k, a.piece_v), ((16 / e) as u64, 1));
            // Misaligned input rows (8-token pages): tiles of eight tokens, no runs.
            let mut op = v0(8, d);
            let mut odd = op;
            odd.input = TokenLayout {
                token_stride: h * d + 1,
                ..op.input
            };
            let big = bytes(0x5000_0000, 3000 * (h * d + 1) * e);
            odd.key.src = big;
            if let Some(v) = odd.value.as_mut() {
                v.src = big;
            }
            let Plan::Kernel { launch, .. } = slots(&odd, &target(132)).unwrap() else {
                panic!("no launch")
            };
            let Kernel::Tiles(a) = launch.kernel else {
                panic!("not a tiled update")
            };
            assert_eq!((a.tile, a.runs, a.src_vec), (8, 0, 0), "e={e}");
            op.slots = SlotMapping::I64(bytes(0x3000_0000, 8 * 8));
            let Plan::Kernel { launch, .. } = slots(&op, &target(132)).unwrap() else {
                panic!("no launch")
            };
            let Kernel::Tiles(a) = launch.kernel else {
                panic!("not a tiled update")
            };
            assert_eq!((a.tile, a.subs), (1, 1));
        }
        // A page size that is not a multiple of 8: no runs.
        let mut op = slot_op(PagedLayout::v0_key(200, 12, 8, 128, 2), 3000);
        op.value_layout = Some(PagedLayout::v0_value(200, 12, 8, 128, 2));
        let Plan::Kernel { launch, .. } = slots(&op, &target(132)).unwrap() else {
            panic!("no launch")
        };
        let Kernel::Tiles(a) = launch.kernel else {
            panic!("not a tiled update")
        };
        assert_eq!(a.runs, 0);
    }

    /// Quantizing bf16 or f16 into fp8 v0 caches at prefill size: on pages of 8, 16, 32 or 64
    /// slots `kvio_update_stream_fp8` (one token a lane, runs of both parts); on larger pages
    /// of a multiple of 32, and keys alone, `kvio_update_pages_fp8` with items of 32 tokens (two
    /// heads of 128, a head having 128 units of 32 tile bytes); key caches only 8-byte aligned
    /// and pages of other sizes stay on the staged tiles or the tiles, f32 sources on the tiles
    /// (plain fp8 copies: `v0_plans_store_runs`).
    #[test]
    fn fp8_v0_prefill_plans() {
        let (h, d, n) = (8, 128, 3000);
        let quant = |src: SrcType, bs: usize, d: usize| {
            let mut op = slot_op(PagedLayout::v0_key(n / bs + 8, bs, h, d, 1), n);
            op.input = TokenLayout::contiguous(n, h, d, src.bytes());
            let ext = op.input.extent("i").unwrap() as usize;
            op.key.src = bytes(0x1000_0000, ext);
            op.value.as_mut().unwrap().src = bytes(0x2000_0000, ext);
            op.value_layout = Some(PagedLayout::v0_value(n / bs + 8, bs, h, d, 1));
            let scale = Scale::PerTensor(bytes(0x7000_0000, 4));
            op.quantize = Some(Quantize::new(src, Fp8::E4m3, scale).value_scale(scale));
            op
        };
        let streams = |op: &SlotUpdate<'_>| {
            let (a, _, threads) = plan_tiles(op, 132);
            a.streams() && a.elem == 1 && threads == 256
        };
        for src in [SrcType::Bf16, SrcType::F16] {
            let (a, grid, _) = plan_tiles(&quant(src, 16, d), 100_000);
            assert!(streams(&quant(src, 16, d)), "{src:?}");
            assert_eq!(
                (a.tile, a.subs, a.runs, a.unit_k, a.piece_k),
                (1, 32, 3, 8, 16)
            );
            // 94 warps of 32 tokens × 8 heads × 4 quads of groups, one item a thread.
            assert_eq!(grid, 94 * 32 * 8 * 4 / 256);
            for d in [256, 512, 1024] {
                assert!(streams(&quant(src, 16, d)), "{src:?} {d}");
            }
            for bs in [8, 32, 64] {
                assert!(streams(&quant(src, bs, d)), "{src:?} {bs}");
            }
            // Pages of 24 slots (not measured): the staged tiles.
            assert!(!streams(&quant(src, 24, d)), "{src:?}");
        }
        for bs in [128, 256] {
            let (a, _, _) = plan_tiles(&quant(SrcType::Bf16, bs, d), 132);
            assert!(a.pages());
            assert_eq!((a.tile, a.subs), (32, 2), "bs {bs}");
        }
        let staged = |op: &SlotUpdate<'_>| {
            let (a, _, _) = plan_tiles(op, 132);
            a.tile == 8 && a.staged == 1
        };
        // f32 rows do not fit a stage's cell: tiles loaded as they come.
        let (a, _, _) = plan_tiles(&quant(SrcType::F32, 16, d), 132);
        assert_eq!((a.tile, a.staged), (8, 0));
        // Keys alone do not stream.
        for bs in [32, 128] {
            let mut op = quant(SrcType::Bf16, bs, d);
            op.value = None;
            op.value_layout = None;
            let scale = Scale::PerTensor(bytes(0x7000_0000, 4));
            op.quantize = Some(Quantize::new(SrcType::Bf16, Fp8::E4m3, scale));
            let (a, _, _) = plan_tiles(&op, 132);
            assert!(a.pages());
            assert_eq!((a.tile, a.subs), (32, 2), "bs {bs}");
        }
        // Pages of 4 slots hold no run of eight.
        let (a, _, _) = plan_tiles(&quant(SrcType::Bf16, 4, d), 132);
        assert!(!a.streams() && a.tile == 8);
        // A key cache only 8-byte aligned: its 16-byte pieces could not go out whole (the
        // staged tiles); a value cache so aligned still takes 8-byte columns.
        for part in [0, 1] {
            let mut odd = quant(SrcType::Bf16, 16, d);
            let dst = if part == 0 {
                &mut odd.key.dst
            } else {
                &mut odd.value.as_mut().unwrap().dst
            };
            *dst = bytes_mut(dst.ptr() + 8, dst.len());
            if part == 0 {
                assert!(staged(&odd));
            } else {
                assert!(streams(&odd));
                assert_eq!(plan_tiles(&odd, 132).0.runs, 3);
            }
        }
    }

    #[test]
    fn odd_rows_use_narrow_access() {
        let op = slot_op(PagedLayout::nhd(8, 16, 1, 3, 1), 10);
        assert_eq!(plan_slots(&op, 132).unwrap().unwrap().0.width, 1);
        let op = slot_op(PagedLayout::nhd(8, 16, 3, 2, 2), 10);
        assert_eq!(plan_slots(&op, 132).unwrap().unwrap().0.width, 4);
    }

    #[test]
    fn slot_update_rejections() {
        let base = slot_op(PagedLayout::nhd(8, 16, 8, 128, 2), 10);
        let mut op = base;
        op.key.dst = bytes_mut(0x4000_0000, 100);
        assert!(matches!(
            plan_slots(&op, 1),
            Err(Error::BufferTooSmall {
                name: "key_cache",
                ..
            })
        ));
        let mut op = base;
        op.value.as_mut().unwrap().src = bytes(0x2000_0000, 100);
        assert!(matches!(
            plan_slots(&op, 1),
            Err(Error::BufferTooSmall { name: "value", .. })
        ));
        let mut op = base;
        op.slots = SlotMapping::I64(bytes(0x3000_0000, 11 * 8));
        assert!(matches!(
            plan_slots(&op, 1),
            Err(Error::InvalidArgument { name: "slots", .. })
        ));
        let mut op = base;
        op.slots = SlotMapping::I32(bytes(0x3000_0000, 7));
        assert!(matches!(
            plan_slots(&op, 1),
            Err(Error::InvalidArgument { name: "slots", .. })
        ));
        let mut op = base;
        op.value.as_mut().unwrap().dst = op.key.dst;
        assert!(matches!(
            plan_slots(&op, 1),
            Err(Error::InvalidArgument {
                name: "value_cache",
                ..
            })
        ));
        let mut op = base;
        op.input.head_dim = 64;
        assert!(matches!(
            plan_slots(&op, 1),
            Err(Error::InvalidArgument { name: "input", .. })
        ));
        let mut op = base;
        op.slots = SlotMapping::I64(bytes(0x3000_0000, 0));
        assert!(plan_slots(&op, 1).unwrap().is_none());
    }

    #[test]
    fn combined_kv_views_accepted_when_disjoint() {
        // One allocation [slots, 2H, D]: K heads then V heads in each slot row.
        let (nb, bs, h, d) = (4, 16, 2, 64);
        let mut cache = PagedLayout::nhd(nb, bs, h, d, 2);
        cache.token_stride = 2 * h * d;
        cache.block_stride = bs * 2 * h * d;
        let mut op = slot_op(cache, 5);
        let total = nb * bs * 2 * h * d * 2;
        let kv = bytes_mut(0x4000_0000, total);
        op.key.dst = kv;
        op.value.as_mut().unwrap().dst = kv.slice(h * d * 2, total - h * d * 2).unwrap();
        assert!(plan_slots(&op, 1).is_ok());
        // V shifted by one element only: overlaps K.
        op.value.as_mut().unwrap().dst = kv.slice(2, total - 2).unwrap();
        assert!(plan_slots(&op, 1).is_err());
    }

    fn slice_op<'a>(layout: PagedLayout, t: usize, padded: usize) -> SliceUpdate<'a> {
        let input =
            TokenLayout::contiguous(t, layout.num_heads, layout.head_dim, layout.elem_bytes);
        SliceUpdate {
            new_kv: bytes(0x1000_0000, input.extent("i").unwrap() as usize),
            input,
            cache: bytes_mut(0x4000_0000, layout.extent("l").unwrap() as usize),
            layout,
            slices: bytes(0x2000_0000, padded * 12),
            padded,
            num_slices: bytes(0x3000_0000, 4),
            errors: None,
            value: None,
            value_layout: None,
            quantize: None,
            slot_list: None,
        }
    }

    #[test]
    fn slice_plan_and_rejections() {
        let op = slice_op(PagedLayout::nhd(8, 16, 16, 128, 2), 100, 20);
        let (p, _) = plan_slices(&op, 132).unwrap();
        assert_eq!(
            (p.row_bytes, p.rows_per_item, p.merge, p.width),
            (4096, 2, 1, 16)
        );
        let mut bad = op;
        bad.slices = bytes(0x2000_0000, 20 * 12 - 1);
        assert!(matches!(
            plan_slices(&bad, 1),
            Err(Error::BufferTooSmall { name: "slices", .. })
        ));
        let mut bad = op;
        bad.num_slices = bytes(0x3000_0002, 4);
        assert!(plan_slices(&bad, 1).is_err());
        // Heads apart: through a slot list, which needs memory pools or a given list of
        // 4 bytes a source row, 4-byte aligned.
        let mut hnd = op;
        hnd.layout = PagedLayout::hnd(8, 16, 16, 128, 2);
        assert!(matches!(
            slices(&hnd, &target(1)),
            Err(Error::InvalidArgument {
                name: "slot_list",
                ..
            })
        ));
        hnd.slot_list = Some(bytes_mut(0x5000_0000, 400));
        assert!(matches!(
            slices(&hnd, &target(1)),
            Ok(Plan::Expand {
                list: Staging::Given(0x5000_0000),
                tokens: 100,
                ..
            })
        ));
        hnd.slot_list = Some(bytes_mut(0x5000_0000, 399));
        assert!(matches!(
            slices(&hnd, &target(1)),
            Err(Error::BufferTooSmall {
                name: "slot_list",
                ..
            })
        ));
        hnd.slot_list = Some(bytes_mut(0x5000_0002, 400));
        assert!(matches!(
            slices(&hnd, &target(1)),
            Err(Error::InvalidArgument {
                name: "slot_list",
                ..
            })
        ));
        // Sharing a byte with the cache, the rows or the table is refused.
        for at in [0x4000_0000u64, 0x1000_0000, 0x2000_0000 - 4] {
            hnd.slot_list = Some(bytes_mut(at, 400));
            assert!(
                matches!(
                    slices(&hnd, &target(1)),
                    Err(Error::InvalidArgument {
                        name: "slot_list",
                        ..
                    })
                ),
                "{at:#x}"
            );
        }
    }

    /// The expansion and the slot update of a slice update through a slot list.
    fn plan_expand(op: &SliceUpdate<'_>) -> Result<(SliceArgs, u32, Option<Kernel>, usize)> {
        let t = Target {
            scratch: true,
            ..target(132)
        };
        match slices(op, &t)? {
            Plan::Expand {
                expand:
                    Launch {
                        kernel: Kernel::Expand(a),
                        grid,
                        threads: BLOCK_THREADS,
                    },
                update,
                tokens,
                list: Staging::Scratch,
            } => Ok((a, grid, update.map(|u| u.kernel), tokens)),
            other => panic!("not an expanding plan: {other:?}"),
        }
    }

    /// Layouts the row copy does not write, V, and fp8 go through a slot list: the expansion
    /// covers every (slice, row of a page) item and the source's rows, the slot update reads
    /// the list as i32 slots of every token, with the cache's own kernel (tiles for v0, the
    /// converting slot update for fp8).
    #[test]
    fn slices_of_other_layouts_go_through_a_slot_list() {
        let (h, d, t, padded) = (4, 128, 100, 20);
        let mut hnd = slice_op(PagedLayout::hnd(8, 16, h, d, 2), t, padded);
        hnd.errors = None;
        let (a, grid, update, tokens) = plan_expand(&hnd).unwrap();
        assert_eq!((a.num_tokens, a.num_slots, a.page_size), (100, 128, 16));
        assert_eq!((a.padded, a.shift, tokens), (20, 0, 100));
        assert_eq!(grid, (20 * 16u32).div_ceil(BLOCK_THREADS));
        let Some(Kernel::Slots(s)) = update else {
            panic!("HND: {update:?}")
        };
        assert_eq!(
            (s.slots as u64, s.slot_is_i64, s.num_tokens),
            (LIST_STAND_IN, 0, 100)
        );

        // v0 K and V (two parts, their own layouts): the tiled update.
        let mut v0 = slice_op(PagedLayout::v0_key(8, 16, h, d, 2), t, padded);
        v0.value = Some(CacheWrite {
            src: bytes(0x5000_0000, t * h * d * 2),
            dst: bytes_mut(0x6000_0000, 8 * 16 * h * d * 2),
        });
        v0.value_layout = Some(PagedLayout::v0_value(8, 16, h, d, 2));
        let (_, _, update, _) = plan_expand(&v0).unwrap();
        let Some(Kernel::Tiles(s)) = update else {
            panic!("v0: {update:?}")
        };
        assert!(!s.src_v.is_null() && s.slots as u64 == LIST_STAND_IN);
        // A v0 slice update is refused where a v0 slot update is (D not a multiple of 8).
        let odd = slice_op(PagedLayout::v0_key(8, 16, h, 12, 4), t, padded);
        assert!(matches!(
            plan_expand(&odd),
            Err(Error::InvalidArgument { name: "cache", .. })
        ));

        // fp8 into the TPU layout (K and V heads in one row): the converting slot update.
        let mut q = slice_op(PagedLayout::nhd(8, 16, 2 * h, d, 1), t, padded);
        q.input = TokenLayout::contiguous(t, 2 * h, d, 2);
        q.new_kv = bytes(0x1000_0000, t * 2 * h * d * 2);
        let scale = bytes(0x7000_0000, 4 * 2 * h);
        q.quantize = Some(Quantize::new(
            SrcType::Bf16,
            Fp8::E4m3,
            Scale::PerHead(scale),
        ));
        let (_, _, update, _) = plan_expand(&q).unwrap();
        let Some(Kernel::Slots(s)) = update else {
            panic!("fp8: {update:?}")
        };
        assert!(s.converts() && s.scale_per_head == 1);
        // V's scale without V, and per-head scales of the wrong length, are refused.
        let mut bad = q;
        bad.quantize = Some(
            Quantize::new(SrcType::Bf16, Fp8::E4m3, Scale::PerHead(scale))
                .value_scale(Scale::PerHead(scale)),
        );
        assert!(plan_expand(&bad).is_err());
        let mut bad = q;
        bad.quantize = Some(Quantize::new(
            SrcType::Bf16,
            Fp8::E4m3,
            Scale::PerHead(bytes(0x7000_0000, 4 * h)),
        ));
        assert!(plan_expand(&bad).is_err());
        // No token: the expansion still runs (it counts bad slices and counts).
        let mut none = hnd;
        none.input.num_tokens = 0;
        let (_, _, update, tokens) = plan_expand(&none).unwrap();
        assert!(update.is_none() && tokens == 0);
    }

    #[test]
    fn work_item_count_that_would_wrap_is_an_overflow() {
        // 2^31 tokens x K and V x 2^32 unmergeable head chunks = 2^64 items: the kernel's
        // item count would wrap to 0 and silently do nothing.
        let heads = 1usize << 32;
        let mut cache = PagedLayout::nhd(1, 1, heads, 1, 1);
        cache.head_stride = 2;
        cache.token_stride = 2 * heads;
        cache.block_stride = 2 * heads;
        let n = 1usize << 31;
        let mut input = TokenLayout::contiguous(n, heads, 1, 1);
        input.head_stride = 2;
        input.token_stride = 0;
        let src = input.extent("i").unwrap() as usize;
        let ext = cache.extent("c").unwrap() as usize;
        let op = SlotUpdate::new(
            bytes(0x1000_0000, src),
            input,
            bytes_mut(0x4000_0000_0000, ext),
            cache,
            SlotMapping::I32(bytes(0x3000_0000, n * 4)),
        )
        .value(
            bytes(0x2000_0000_0000, src),
            bytes_mut(0x8000_0000_0000, ext),
        );
        assert!(matches!(
            plan_slots(&op, 132),
            Err(Error::Overflow { name: "slots" })
        ));
    }
}
