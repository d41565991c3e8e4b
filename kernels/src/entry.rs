//! `extern "ptx-kernel"` entry points: thin shells that map a thread to a work item, check the
//! item's device-resident indices (module `index`) and hand one span to `span::copy_span`.
//!
//! Parameters are scalars and raw pointers only. Byte strides and sizes are `u64`, counts that
//! the host bounds are `u32`.

use core::arch::nvptx::{_block_dim_x, _block_idx_x, _grid_dim_x, _thread_idx_x};
use core::sync::atomic::{AtomicU32, Ordering};

use crate::index::{self, err, PairCheck, SliceCheck, SlotTarget};
use crate::span::copy_span;

/// A thread's place in a grid split into groups of `1 << shift` lanes: each group owns one
/// work item at a time, so two groups never write the same span.
#[derive(Clone, Copy)]
struct Group {
    /// This group's first item.
    first: u64,
    /// Items a group moves on by (the number of groups in the grid).
    step: u64,
    /// Lane inside the group.
    lane: u64,
    /// Lanes in a group.
    lanes: u64,
}

#[inline(always)]
fn group(shift: u32) -> Group {
    // SAFETY: reading special registers has no preconditions.
    let (tid, bid, bdim, gdim) = unsafe {
        (
            _thread_idx_x(),
            _block_idx_x(),
            _block_dim_x(),
            _grid_dim_x(),
        )
    };
    let global = bid as u64 * bdim as u64 + tid as u64;
    let lanes = 1u64 << shift;
    Group {
        first: global >> shift,
        step: (gdim as u64 * bdim as u64) >> shift,
        lane: global & (lanes - 1),
        lanes,
    }
}

/// Adds one to counter `which` of the error word (if the caller gave one).
#[inline(always)]
unsafe fn count_error(errors: *mut u32, which: usize) {
    if !errors.is_null() {
        // SAFETY: the host passes an error word of `err::WORDS` aligned u32 that lives for the
        // launch; atomics make concurrent increments from any thread sound.
        unsafe { AtomicU32::from_ptr(errors.add(which)).fetch_add(1, Ordering::Relaxed) };
    }
}

/// Slot-mapping update (vLLM `reshape_and_cache_flash` semantics): token `t` of K (and V when
/// `src_v` is non-null) goes to slot `slots[t]`; negative slots are skipped, slots past the
/// cache are skipped and counted. One item = one (token, K/V, head chunk) span of
/// `chunk_bytes`; `heads` chunks per token (1 when the host merged contiguous heads).
///
/// # Safety
/// Pointers, strides and sizes were validated by the host: every in-range target lies inside
/// the destination caches, every token row inside the sources.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn kvio_update_slots(
    src_k: *const u8,
    src_v: *const u8,
    src_token_stride: u64,
    src_head_stride: u64,
    dst_k: *mut u8,
    dst_v: *mut u8,
    dst_block_stride: u64,
    dst_token_stride: u64,
    dst_head_stride: u64,
    num_blocks: u64,
    block_size: u64,
    heads: u64,
    chunk_bytes: u64,
    slots: *const u8,
    slot_is_i64: u32,
    num_tokens: u64,
    width: u32,
    shift: u32,
    errors: *mut u32,
) {
    let parts = if src_v.is_null() { 1 } else { 2 };
    let items = num_tokens * parts * heads;
    let g = group(shift);
    let mut item = g.first;
    while item < items {
        let (tok, part, head) = index::split3(item, parts, heads);
        // SAFETY: tok < num_tokens, the length of the slot array (host-validated).
        let slot = unsafe {
            if slot_is_i64 != 0 {
                *(slots as *const i64).add(tok as usize)
            } else {
                *(slots as *const i32).add(tok as usize) as i64
            }
        };
        match index::slot_target(slot, block_size, num_blocks) {
            SlotTarget::Skip => {}
            SlotTarget::OutOfRange => {
                if g.lane == 0 && part == 0 && head == 0 {
                    // SAFETY: see count_error.
                    unsafe { count_error(errors, err::BAD_SLOT) };
                }
            }
            SlotTarget::At { block, offset } => {
                let (src, dst) = if part == 0 {
                    (src_k, dst_k)
                } else {
                    (src_v as *const u8, dst_v)
                };
                // SAFETY: block < num_blocks, offset < block_size, head < heads, tok <
                // num_tokens: the host checked that all such spans lie in the buffers.
                unsafe {
                    let s = src.add((tok * src_token_stride + head * src_head_stride) as usize);
                    let d = dst.add(
                        (block * dst_block_stride
                            + offset * dst_token_stride
                            + head * dst_head_stride) as usize,
                    );
                    copy_span(s, d, chunk_bytes, g.lane, g.lanes, width);
                }
            }
        }
        item += g.step;
    }
}

/// Slice-based update (vLLM TPU `kv_cache_update` semantics): `slices` is `[3, padded]` i32
/// (cache start slot, source start token, length); only the first `*num_slices` are real.
/// Slot `s` of the cache lives at `(s / page_size) * dst_page_stride + (s % page_size) *
/// dst_row_stride`; source token `t` at `t * src_row_stride`. One item = up to
/// `rows_per_item` rows of one slice; when `merge` is set, rows are contiguous on both sides
/// and an item is one span.
///
/// # Safety
/// Host-validated pointers, strides and sizes: every valid slice's rows lie in the buffers.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn kvio_update_slices(
    src: *const u8,
    src_row_stride: u64,
    dst: *mut u8,
    dst_page_stride: u64,
    dst_row_stride: u64,
    row_bytes: u64,
    num_slots: u64,
    num_tokens: u64,
    page_size: u32,
    slices: *const i32,
    padded: u32,
    num_slices: *const i32,
    rows_per_item: u32,
    merge: u32,
    width: u32,
    shift: u32,
    errors: *mut u32,
) {
    let g = group(shift);
    // SAFETY: num_slices points at one device i32 (host-validated).
    let raw = unsafe { *num_slices };
    let Some(n) = index::checked_count(raw, padded) else {
        if g.first == 0 && g.lane == 0 {
            // SAFETY: see count_error.
            unsafe { count_error(errors, err::BAD_COUNT) };
        }
        return;
    };
    let per = rows_per_item as u64;
    let pieces = (page_size as u64).div_ceil(per);
    let items = n as u64 * pieces;
    let mut item = g.first;
    while item < items {
        let (i, _, piece) = index::split3(item, 1, pieces);
        // SAFETY: i < n <= padded, and `slices` holds 3 * padded i32.
        let (start, from, len) = unsafe {
            let p = padded as usize;
            (
                *slices.add(i as usize),
                *slices.add(p + i as usize),
                *slices.add(2 * p + i as usize),
            )
        };
        match index::check_slice(start, from, len, page_size, num_slots, num_tokens) {
            SliceCheck::Padding => {}
            SliceCheck::Invalid => {
                if g.lane == 0 && piece == 0 {
                    // SAFETY: see count_error.
                    unsafe { count_error(errors, err::BAD_SLICE) };
                }
            }
            SliceCheck::Valid => {
                let r0 = piece * per;
                let len = len as u64;
                if r0 < len {
                    let rows = if len - r0 < per { len - r0 } else { per };
                    let first_slot = start as u64 + r0;
                    let page = index::div_u64(first_slot, page_size as u64);
                    let in_page = first_slot - page * page_size as u64;
                    let s0 = (from as u64 + r0) * src_row_stride;
                    let d0 = page * dst_page_stride + in_page * dst_row_stride;
                    // SAFETY: the slice is valid (inside both buffers, one page), so these
                    // rows are too.
                    unsafe {
                        if merge != 0 {
                            copy_span(
                                src.add(s0 as usize),
                                dst.add(d0 as usize),
                                rows * row_bytes,
                                g.lane,
                                g.lanes,
                                width,
                            );
                        } else {
                            let mut r = 0;
                            while r < rows {
                                let s = src.add((s0 + r * src_row_stride) as usize);
                                let d = dst.add((d0 + r * dst_row_stride) as usize);
                                copy_span(s, d, row_bytes, g.lane, g.lanes, width);
                                r += 1;
                            }
                        }
                    }
                }
            }
        }
        item += g.step;
    }
}

/// One side of a block copy: where block `b`, layer `l`, part `p`, token `t`, head `h` lives.
/// With a non-null `table`, layer/part bases come from `table[l * parts + p]` (per-layer
/// caches); otherwise from `base + l * layer_stride + p * part_stride` (one allocation).
#[derive(Clone, Copy)]
struct Side {
    base: *mut u8,
    table: *const u64,
    layer_stride: u64,
    part_stride: u64,
    block_stride: u64,
    token_stride: u64,
    head_stride: u64,
}

impl Side {
    /// Address of one chunk.
    ///
    /// # Safety
    /// The indices are inside the (host-validated) pool; `table`, if used, holds `parts`
    /// entries per layer.
    #[inline(always)]
    unsafe fn at(
        &self,
        parts: u64,
        block: u64,
        layer: u64,
        part: u64,
        token: u64,
        head: u64,
    ) -> *mut u8 {
        // SAFETY: forwarded from the caller.
        unsafe {
            let base = if self.table.is_null() {
                self.base
                    .add((layer * self.layer_stride + part * self.part_stride) as usize)
            } else {
                *self.table.add((layer * parts + part) as usize) as *mut u8
            };
            base.add(
                (block * self.block_stride + token * self.token_stride + head * self.head_stride)
                    as usize,
            )
        }
    }
}

/// Block copy between two pools (device or mapped pinned host memory, any layouts): for each
/// pair `(pairs[2i], pairs[2i+1])` (i64 source and destination block), every (layer, part,
/// token, head) chunk of `chunk` bytes is copied. Merged dimensions have extent 1. Negative
/// ids are padding; ids past a pool are skipped and counted.
///
/// # Safety
/// Host-validated descriptors: every chunk of a valid pair lies inside both pools.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn kvio_copy_blocks(
    src_base: *mut u8,
    src_table: *const u64,
    src_layer_stride: u64,
    src_part_stride: u64,
    src_block_stride: u64,
    src_token_stride: u64,
    src_head_stride: u64,
    dst_base: *mut u8,
    dst_table: *const u64,
    dst_layer_stride: u64,
    dst_part_stride: u64,
    dst_block_stride: u64,
    dst_token_stride: u64,
    dst_head_stride: u64,
    layers: u64,
    parts: u64,
    tokens: u64,
    heads: u64,
    chunk: u64,
    pairs: *const i64,
    num_pairs: u64,
    src_blocks: u64,
    dst_blocks: u64,
    width: u32,
    shift: u32,
    errors: *mut u32,
) {
    let src = Side {
        base: src_base,
        table: src_table,
        layer_stride: src_layer_stride,
        part_stride: src_part_stride,
        block_stride: src_block_stride,
        token_stride: src_token_stride,
        head_stride: src_head_stride,
    };
    let dst = Side {
        base: dst_base,
        table: dst_table,
        layer_stride: dst_layer_stride,
        part_stride: dst_part_stride,
        block_stride: dst_block_stride,
        token_stride: dst_token_stride,
        head_stride: dst_head_stride,
    };
    let per_pair = layers * parts * tokens * heads;
    let items = num_pairs * per_pair;
    let g = group(shift);
    let mut item = g.first;
    let mut ix = [0u64; 4];
    while item < items {
        let pair = index::split_n(item, [layers, parts, tokens, heads], &mut ix);
        let [layer, part, token, head] = ix;
        // SAFETY: pair < num_pairs, and `pairs` holds 2 * num_pairs i64 (host-validated).
        let (s, d) = unsafe {
            (
                *pairs.add(2 * pair as usize),
                *pairs.add(2 * pair as usize + 1),
            )
        };
        match index::check_pair(s, d, src_blocks, dst_blocks) {
            PairCheck::Skip => {}
            PairCheck::OutOfRange => {
                if g.lane == 0 && item - pair * per_pair == 0 {
                    // SAFETY: see count_error.
                    unsafe { count_error(errors, err::BAD_BLOCK) };
                }
            }
            PairCheck::Valid => {
                // SAFETY: both blocks are inside their pools; the rest of the indices are below
                // the extents the host validated.
                unsafe {
                    let from = src.at(parts, s as u64, layer, part, token, head);
                    let to = dst.at(parts, d as u64, layer, part, token, head);
                    copy_span(from, to, chunk, g.lane, g.lanes, width);
                }
            }
        }
        item += g.step;
    }
}

/// An empty kernel: the benchmarks' launch-overhead ceiling.
#[no_mangle]
pub extern "ptx-kernel" fn kvio_noop() {}

/// The benchmarks' naive baseline: one thread per element over a precomputed list of spans
/// (`spans[2i]` = source address, `spans[2i+1]` = destination address, each `span_elems`
/// elements of `elem_bytes`), every element's index decomposed from scratch.
///
/// # Safety
/// Every listed span must be readable at its source and writable at its destination.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn kvio_naive_spans(
    spans: *const u64,
    num_spans: u64,
    span_elems: u64,
    elem_bytes: u32,
) {
    let g = group(0);
    let total = num_spans * span_elems;
    let mut i = g.first;
    while i < total {
        let span = i / span_elems;
        let e = i - span * span_elems;
        // SAFETY: span < num_spans; the caller guarantees the spans.
        unsafe {
            let src = *spans.add(2 * span as usize) as *const u8;
            let dst = *spans.add(2 * span as usize + 1) as *mut u8;
            let off = (e * elem_bytes as u64) as usize;
            copy_span(
                src.add(off),
                dst.add(off),
                elem_bytes as u64,
                0,
                1,
                elem_bytes,
            );
        }
        i += g.step;
    }
}
