//! Staged tiled updates: prefill-size writes into caches whose head vectors are stored in
//! pieces (vLLM's v0 paged layout), assembled page by page in shared memory so that both the
//! loads and the stores are whole, consecutive 16-byte accesses.
//!
//! One item is one page's worth of input tokens (`a.tile` = the block size, starting at a
//! multiple of it) × one part (K or V) × a chunk of `a.chunk_heads` heads. A CTA takes an
//! item in two phases separated by barriers:
//! 1. [`stage`]: every thread loads 8-element groups of the input (consecutive lanes take
//!    consecutive tokens, so each load instruction reads whole sectors), converts them when the
//!    cache is fp8, and writes them into the shared image at the position they have inside the
//!    destination page (for V, one element per piece: the transposition happens here); the
//!    first `tile` threads also copy the tile's slots into the image's header.
//! 2. [`drain`]: when the tile's slots are the page's slots in order (a run: slot `i` is slot 0
//!    plus `i`, slot 0 the first of an in-range block), the image is the page's heads
//!    `h0..h0 + chunk` byte for byte (the host only stages dense layouts), and the CTA copies it
//!    out with consecutive 16-byte stores. Otherwise every token goes to its own slot from the
//!    input as in the unstaged kernel (negative slots skipped, slots past the cache counted).
//!
//! The GPU runs both phases in [`update_tiles_staged`]; the host's emulator runs [`stage`]
//! for every thread of a CTA, then [`drain`] for every thread ([`emulate_staged`]), which is
//! what the barriers guarantee on the GPU.

use crate::args::TileArgs;
use crate::convert;
use crate::fp8::Divider;
use crate::index::{self, err, SlotTarget};
use crate::ops::{count_error, tile_row, tile_slot, tile_store_row, TilePart};
use crate::span::V16;
use crate::tile::{self, Row};

/// Bytes of the shared-memory image of one item (a page's heads of one part).
pub const STAGE_BYTES: u64 = 32 * 1024;
/// Most tokens in one item (the slot header's entries): the largest staged block size.
pub const STAGE_TOKENS: u64 = 256;
/// Shared memory of a staged CTA: the image, then the slot header (`i64` per token).
pub const STAGE_SMEM: usize = (STAGE_BYTES + 8 * STAGE_TOKENS) as usize;
/// Threads of a staged CTA (one item per CTA at a time).
pub const STAGE_THREADS: u32 = 256;
/// Units (8-element groups) a thread loads before it writes any to the image (`unroll4!`).
const BATCH: u64 = 4;

/// Where an item lies: tokens `t0..t0 + n` of a tile of `tile`, part `part`, heads
/// `h0..h0 + hc`.
struct Item {
    t0: u64,
    n: u64,
    tile: u64,
    part: u64,
    h0: u64,
    hc: u64,
}

impl Item {
    #[inline(always)]
    fn of(a: &TileArgs, item: u64) -> Item {
        let parts = if a.src_v.is_null() { 1 } else { 2 };
        let chunk = a.chunk_heads as u64;
        let chunks = a.heads.div_ceil(chunk);
        let (page, part, c) = index::split3(item, parts, chunks);
        let tile = a.tile as u64;
        let t0 = page * tile;
        let h0 = c * chunk;
        Item {
            t0,
            n: (a.num_tokens - t0).min(tile),
            tile,
            part,
            h0,
            hc: (a.heads - h0).min(chunk),
        }
    }

    /// Units (8-element groups) of the whole tile.
    #[inline(always)]
    fn units(&self, a: &TileArgs) -> u64 {
        self.tile * self.hc * a.groups
    }

    /// Unit `k` as (token in the tile, head in the chunk, group): up to sixteen consecutive
    /// units are consecutive tokens of one group, so a warp's loads read whole sectors of
    /// sixteen rows and its image writes of one-element pieces fall in few banks.
    #[inline(always)]
    fn unit(&self, a: &TileArgs, k: u64) -> (u64, u64, u64) {
        let lt = self.tile.min(16);
        let mut ix = [0u64; 3];
        let h = index::split_n(k, [self.tile / lt, a.groups, lt], &mut ix);
        let [t_hi, grp, t_lo] = ix;
        (t_hi * lt + t_lo, h, grp)
    }
}

/// Items of a staged update.
#[inline(always)]
pub fn staged_items(a: &TileArgs) -> u64 {
    let parts = if a.src_v.is_null() { 1 } else { 2 };
    a.num_tokens.div_ceil(a.tile as u64) * parts * a.heads.div_ceil(a.chunk_heads as u64)
}

/// The input group of unit (token `t` of the item, head `h` of its chunk, group `grp`).
///
/// # Safety
/// `t < it.n`, `h < it.hc`, `grp < a.groups`: inside the validated source.
#[inline(always)]
unsafe fn source(a: &TileArgs, it: &Item, t: u64, h: u64, grp: u64) -> *const u8 {
    let se = if a.convert != convert::NONE {
        convert::src_bytes(a.convert)
    } else {
        a.elem as u64
    };
    let src = if it.part == 0 { a.src_k } else { a.src_v };
    let at = (it.t0 + t) * a.src_token_stride + (it.h0 + h) * a.src_head_stride + grp * 8 * se;
    // SAFETY: forwarded.
    unsafe { src.add(at as usize) }
}

/// The part's divider for head `head` (per-head scales) or the tensor.
///
/// # Safety
/// A converting update's scales hold one f32 (or one per head) for each part written.
#[inline(always)]
unsafe fn divider(a: &TileArgs, part: u64, head: u64) -> Divider {
    if a.convert == convert::NONE {
        return Divider::UNUSED;
    }
    let scales = if part == 0 { a.k_scale } else { a.v_scale };
    let at = if a.scale_per_head != 0 { head } else { 0 };
    // SAFETY: forwarded.
    Divider::new(unsafe { *scales.add(at as usize) })
}

/// A thread's place among an item's units: tokens `t_hi · lt + t_lo` (`t_lo` fixed: the
/// thread's lane modulo `lt`, as the CTA's threads are a multiple of `lt`), head `h` of the
/// chunk, group `grp`; moved by whole strides without divisions.
#[derive(Clone, Copy)]
struct Cursor {
    h: u32,
    t_hi: u32,
    grp: u32,
}

impl Cursor {
    /// The place `n` units of this thread's sequence further (`n · step` in the combined
    /// index `(h · nt + t_hi) · groups + grp`).
    #[inline(always)]
    fn advance(self, n: u32, nt: u32, groups: u32) -> Cursor {
        let Cursor {
            mut h,
            mut t_hi,
            mut grp,
        } = self;
        grp += n;
        while grp >= groups {
            grp -= groups;
            t_hi += 1;
            if t_hi == nt {
                t_hi = 0;
                h += 1;
            }
        }
        Cursor { h, t_hi, grp }
    }
}

/// Phase 1 of item `item` for thread `lane` of `lanes`: the tile's slots into the header,
/// its input groups (converted) into the image at their place in the page.
///
/// # Safety
/// Host-validated staged arguments (see [`update_tiles_staged`]); `smem` holds
/// [`STAGE_SMEM`] bytes, 16-byte aligned, used by this CTA only; `lanes` a multiple of 16.
#[inline(always)]
pub unsafe fn stage<const E: usize>(a: &TileArgs, item: u64, lane: u64, lanes: u64, smem: *mut u8) {
    let it = Item::of(a, item);
    let header = smem.wrapping_add(STAGE_BYTES as usize) as *mut i64;
    let mut t = lane;
    while t < it.n {
        // SAFETY: t < n ≤ tile ≤ STAGE_TOKENS entries of the header; the slot array holds
        // num_tokens entries.
        unsafe { header.add(t as usize).write(tile_slot(a, it.t0 + t)) };
        t += lanes;
    }
    let p = TilePart::of(a, it.part);
    let per_head = a.scale_per_head != 0;
    // SAFETY: forwarded (scales validated by the host).
    let tensor_div = unsafe { divider(a, it.part, 0) };
    // 32-bit image geometry (the image is STAGE_BYTES); the host stages only pieces of one
    // element or of 8 · 2^k elements.
    let (head, token, ps) = (p.head as u32, p.token as u32, p.piece_stride as u32);
    let one = p.piece == 1;
    let gshift = if one {
        0
    } else {
        ((p.piece / 8) as u32).trailing_zeros()
    };
    let gmask = (1u32 << gshift) - 1;
    let lt = it.tile.min(16) as u32;
    let nt = it.tile as u32 / lt;
    let groups = a.groups as u32;
    let t_lo = lane as u32 % lt;
    let step = lanes as u32 / lt;
    let src = if it.part == 0 { a.src_k } else { a.src_v };
    let se = if a.convert != convert::NONE {
        convert::src_bytes(a.convert)
    } else {
        E as u64
    };
    let mut at = Cursor {
        h: 0,
        t_hi: 0,
        grp: 0,
    }
    .advance(lane as u32 / lt, nt, groups);
    let hc = it.hc as u32;
    while at.h < hc {
        // BATCH units of this thread: every load issued before any image write.
        let mut rows: [Row; BATCH as usize] = [[0; 8]; BATCH as usize];
        let mut offs = [u32::MAX; BATCH as usize];
        let mut c = at;
        unroll4!(b => {
            let t = c.t_hi * lt + t_lo;
            if c.h < hc && (t as u64) < it.n {
                let div = if per_head {
                    // SAFETY: forwarded.
                    unsafe { divider(a, it.part, it.h0 + c.h as u64) }
                } else {
                    tensor_div
                };
                let s_at = (it.t0 + t as u64) * a.src_token_stride
                    + (it.h0 + c.h as u64) * a.src_head_stride
                    + c.grp as u64 * 8 * se;
                // SAFETY: t < n, h < hc, grp < groups: inside the validated source;
                // staged sources are vector-aligned.
                rows[b] = unsafe { tile_row::<E>(a, src.add(s_at as usize), true, &div) };
                offs[b] = if one {
                    c.h * head + t * token + c.grp * 8 * ps
                } else {
                    c.h * head + t * token + (c.grp >> gshift) * ps + (c.grp & gmask) * 8 * E as u32
                };
            }
            c = c.advance(step, nt, groups);
        });
        unroll4!(b => {
            let off = offs[b];
            if off != u32::MAX {
                // SAFETY: a dense page's heads: the unit's elements lie inside the image
                // (hc · head ≤ STAGE_BYTES, checked by the host), aligned like the cache
                // (pieces of 8 · 2^k elements: one store of 8E bytes).
                unsafe {
                    let d = smem.add(off as usize);
                    if one {
                        unroll8!(j => {
                            tile::store::<E>(d.add(j * ps as usize), &rows[b], j, 1);
                        });
                    } else {
                        tile::store::<E>(d, &rows[b], 0, 8);
                    }
                }
            }
        });
        at = c;
    }
}

/// Phase 2 of item `item` for thread `lane` of `lanes`: the image out as the page's heads
/// when the tile is a run, else token by token from the input.
///
/// # Safety
/// As [`stage`], after every thread of the CTA finished [`stage`] of the same item.
#[inline(always)]
pub unsafe fn drain<const E: usize>(a: &TileArgs, item: u64, lane: u64, lanes: u64, smem: *mut u8) {
    let it = Item::of(a, item);
    let header = smem.wrapping_add(STAGE_BYTES as usize) as *const i64;
    let p = TilePart::of(a, it.part);
    // SAFETY: the header holds the tile's n slots (stage).
    let slot0 = unsafe { *header };
    let mut run = false;
    let mut base = 0;
    if it.n == it.tile {
        if let SlotTarget::At { block, offset } =
            index::slot_target(slot0, a.block_size, a.num_blocks)
        {
            run = offset == 0;
            base = block * p.block + it.h0 * p.head;
        }
        let mut t = 1;
        while run && t < it.n {
            // SAFETY: t < n entries.
            run = unsafe { *header.add(t as usize) } == slot0 + t as i64;
            t += 1;
        }
    }
    if run {
        let words = it.hc * p.head / 16;
        let mut w = lane;
        while w < words {
            // SAFETY: the image holds hc heads of the page (stage); the page's heads h0..h0+hc
            // are a valid block's, 16-byte aligned (host-checked dense, aligned layout).
            unsafe {
                let v = (smem as *const V16).add(w as usize).read();
                (p.dst.add(base as usize) as *mut V16)
                    .add(w as usize)
                    .write(v);
            }
            w += lanes;
        }
        return;
    }
    // SAFETY: forwarded (scales validated by the host).
    let tensor_div = unsafe { divider(a, it.part, 0) };
    let units = it.units(a);
    let mut k = lane;
    while k < units {
        let (t, h, grp) = it.unit(a, k);
        k += lanes;
        if t >= it.n {
            continue;
        }
        // SAFETY: t < n entries of the header.
        let slot = unsafe { *header.add(t as usize) };
        match index::slot_target(slot, a.block_size, a.num_blocks) {
            SlotTarget::Skip => {}
            SlotTarget::OutOfRange => {
                if it.part == 0 && it.h0 + h == 0 && grp == 0 {
                    // SAFETY: see count_error.
                    unsafe { count_error(a.errors, err::BAD_SLOT) };
                }
            }
            SlotTarget::At { block, offset } => {
                let div = if a.scale_per_head != 0 {
                    // SAFETY: forwarded.
                    unsafe { divider(a, it.part, it.h0 + h) }
                } else {
                    tensor_div
                };
                let at = block * p.block + offset * p.token + (it.h0 + h) * p.head;
                // SAFETY: the unit's input group and a valid target's head; the host checked
                // the alignment of the part's stores.
                unsafe {
                    let row = tile_row::<E>(a, source(a, &it, t, h, grp), true, &div);
                    tile_store_row::<E>(&p, p.dst.add(at as usize), &row, grp * 8);
                }
            }
        }
    }
}

/// The staged update on the GPU: this CTA's items, each staged, then drained, with a barrier
/// after each phase (`a.shift` makes the group the whole CTA).
///
/// # Safety
/// Host-validated arguments: as [`crate::ops::update_tiles`], plus: caches of 1- or 2-byte
/// elements whose parts are dense pages (a page's heads are `heads · head` consecutive bytes,
/// every (token, element) of it at `token · t + piece_offset(e)` of its head), `tile` the
/// block size (8 or a multiple of 16, at most [`STAGE_TOKENS`]), `chunk_heads · head` at most
/// [`STAGE_BYTES`] for each part, vector-aligned sources, 16-byte aligned caches, blocks and
/// heads; launched with [`STAGE_THREADS`] threads per CTA.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn update_tiles_staged(a: &TileArgs, g: crate::ops::Group) {
    let smem = shared_image();
    let items = staged_items(a);
    let mut item = g.first;
    while item < items {
        // SAFETY: forwarded; the barriers order the phases across the CTA.
        unsafe {
            if a.elem == 1 {
                stage::<1>(a, item, g.lane, g.lanes, smem);
            } else {
                stage::<2>(a, item, g.lane, g.lanes, smem);
            }
            core::arch::nvptx::_syncthreads();
            if a.elem == 1 {
                drain::<1>(a, item, g.lane, g.lanes, smem);
            } else {
                drain::<2>(a, item, g.lane, g.lanes, smem);
            }
            core::arch::nvptx::_syncthreads();
        }
        item += g.step;
    }
}

/// The generic address of the CTA's shared image (`kvio_stage`, declared at module scope by
/// the host's build script: [`STAGE_SMEM`] bytes, 16-byte aligned).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn shared_image() -> *mut u8 {
    let p: u64;
    // SAFETY: converts the address of a module-scope shared variable to a generic address;
    // no memory is touched.
    unsafe {
        core::arch::asm!(
            "cvta.shared.u64 {p}, kvio_stage;",
            p = out(reg64) p,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    p as *mut u8
}

/// Runs a staged update's CTAs on the host, one after another: for each of a CTA's items,
/// [`stage`] for every thread, then [`drain`] for every thread (what the barriers order on
/// the GPU), in a shared image of [`STAGE_SMEM`] bytes.
///
/// # Safety
/// As [`update_tiles_staged`], on host memory.
pub unsafe fn emulate_staged(a: &TileArgs, grid: u32, threads: u32) {
    let mut image = [V16::splat(0); STAGE_SMEM / 16];
    let smem = image.as_mut_ptr() as *mut u8;
    let (grid, lanes) = (grid as u64, threads as u64);
    let items = staged_items(a);
    for cta in 0..grid {
        let mut item = cta;
        while item < items {
            for lane in 0..lanes {
                // SAFETY: forwarded; `image` is this CTA's shared memory.
                unsafe {
                    if a.elem == 1 {
                        stage::<1>(a, item, lane, lanes, smem)
                    } else {
                        stage::<2>(a, item, lane, lanes, smem)
                    }
                }
            }
            for lane in 0..lanes {
                // SAFETY: as above, after the whole CTA's stage.
                unsafe {
                    if a.elem == 1 {
                        drain::<1>(a, item, lane, lanes, smem)
                    } else {
                        drain::<2>(a, item, lane, lanes, smem)
                    }
                }
            }
            item += grid;
        }
    }
}
