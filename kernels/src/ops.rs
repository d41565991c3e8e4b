//! Kernel bodies: what one thread does, as plain functions of the argument struct (module
//! `args`) and the thread's [`Group`]. On the GPU the entry points call them for the calling
//! thread; on the CPU [`emulate`] calls them for every thread of a grid in turn, so the very
//! same code is property-tested against the reference without a GPU.

use core::sync::atomic::{AtomicI32, AtomicU32, Ordering};

use crate::args::{CopyArgs, NaiveArgs, SliceArgs, SlotArgs, SpinArgs, TileArgs};
use crate::bulk;
use crate::convert::{self, Span};
use crate::cta;
use crate::fp8::Divider;
use crate::index::{
    self, chunk_at, err, Digits, PairCheck, PoolSide, SliceCheck, SlotTarget, TablePtr,
};
use crate::pdl;
use crate::span::{
    self, copy_span, copy_spans, load_round, load_staged, store_staged, Unit, BATCH_UNITS,
    STAGE_UNITS, V16,
};
use crate::stage::Stage;
use crate::tile::{self, Row, TILE};

/// A thread's place in a grid split into groups of `1 << shift` lanes: each group owns one
/// work item at a time (items `first`, `first + step`, ...), so two groups never write the
/// same span, and the lanes of a group split the span's units between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    /// This group's first item.
    pub first: u64,
    /// Items a group moves on by (the number of groups in the grid).
    pub step: u64,
    /// Lane inside the group.
    pub lane: u64,
    /// Lanes in a group.
    pub lanes: u64,
}

impl Group {
    /// The group of global thread `thread` in a grid of `threads` threads (a multiple of
    /// `1 << shift`).
    #[inline(always)]
    pub fn new(thread: u64, threads: u64, shift: u32) -> Group {
        let lanes = 1u64 << shift;
        Group {
            first: thread >> shift,
            step: threads >> shift,
            lane: thread & (lanes - 1),
            lanes,
        }
    }

    /// The calling GPU thread's group.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub fn this_thread(shift: u32) -> Group {
        use core::arch::nvptx::{_block_dim_x, _block_idx_x, _grid_dim_x, _thread_idx_x};
        // SAFETY: reading special registers has no preconditions.
        let (tid, bid, bdim, gdim) = unsafe {
            (
                _thread_idx_x(),
                _block_idx_x(),
                _block_dim_x(),
                _grid_dim_x(),
            )
        };
        Group::new(
            bid as u64 * bdim as u64 + tid as u64,
            gdim as u64 * bdim as u64,
            shift,
        )
    }
}

/// Runs `body` for every thread of a `grid × block` launch, one thread after another (the
/// bodies it runs have no inter-thread synchronisation, so any order is a valid schedule; the
/// CTA-phase bodies have their own runner, [`crate::cta::emulate`]).
pub fn emulate(grid: u32, block: u32, shift: u32, mut body: impl FnMut(Group)) {
    let threads = grid as u64 * block as u64;
    for t in 0..threads {
        body(Group::new(t, threads, shift));
    }
}

/// Adds one to counter `which` of the error word (if there is one).
///
/// # Safety
/// `errors` is null or points at `err::WORDS` aligned `u32` alive for the launch.
#[inline(always)]
unsafe fn count_error(errors: *mut u32, which: usize) {
    if !errors.is_null() {
        // SAFETY: forwarded; atomics make concurrent increments sound.
        unsafe { AtomicU32::from_ptr(errors.add(which)).fetch_add(1, Ordering::Relaxed) };
    }
}

/// Slot-mapping update (vLLM `reshape_and_cache_flash` semantics): token `t` of K (and V when
/// `src_v` is non-null) goes to slot `slots[t]`; negative slots are skipped, slots past the
/// cache are skipped and counted. One item = one (token, K/V, head chunk) span.
///
/// With a conversion (`a.convert`), each span's source elements are quantized to fp8 with the
/// part's scale (per tensor, or per head) instead of copied.
///
/// # Safety
/// Host-validated arguments: every in-range target lies inside the destination caches, every
/// token row inside the sources, `slots` holds `num_tokens` entries, and a converting update's
/// scales hold one f32 (or one per head) for each part written.
#[inline(always)]
pub unsafe fn update_slots(a: &SlotArgs, g: Group) {
    // SAFETY: forwarded.
    unsafe { slots_body::<false>(a, g) }
}

/// [`update_slots`] for K and V parts of different widths or input strides, copied: the same
/// body with those compiled in, as its own entry point, so the plain copy keeps its registers.
///
/// # Safety
/// As [`update_slots`], without `rows`.
#[inline(always)]
pub unsafe fn update_slots_general(a: &SlotArgs, g: Group) {
    // SAFETY: forwarded.
    unsafe { slots_body::<true>(a, g) }
}

/// [`update_slots`] for one row per token (`a.rows`: an MLA row, latent part `K` then rope part
/// `V`, one head), copied: `rows_body` with the access width dispatched once.
///
/// # Safety
/// As [`update_slots`], with `rows`.
#[inline(always)]
pub unsafe fn update_rows(a: &SlotArgs, g: Group) {
    pdl::ready::<SlotArgs>();
    // SAFETY: forwarded (the width divides every address and chunk: host-checked).
    unsafe { span::by_width!(a.width, rows_body(a, g)) }
}

/// The per-token loop of the one-row updates ([`rows_body`], [`rows_convert_body`]), over the
/// tokens of group `$g` (`$a` the [`SlotArgs`]): binds `$from` to the token's source rows (its
/// K and V parts) and runs the `early` statements (the loads that need only `$from`, issued
/// before the slot is read so the two latencies overlap; what they bind stays in scope); then
/// a negative slot is skipped, one past the cache counted (by lane 0, `err::BAD_SLOT`), and
/// for an in-range slot `$to` is bound to the row's K and V parts at the slot (the same offset
/// of both caches) and the `store` block runs.
///
/// A macro, not a function taking the two steps as closures, so that it expands in place: the
/// closures' calls (returning the loaded round by value) changed the generated PTX of both
/// entry points. Only for use inside an `unsafe fn` whose contract includes [`update_slots`]'s
/// with `rows`; `early` and `store` may access `$from` and `$to` as far as the host validated
/// a row (`chunk_bytes` of K, `chunk_bytes_v` of V). With `$late` true each thread signals
/// the programmatic dependents at its last row ([`pdl::signal_at_last`]).
macro_rules! for_each_row {
    ($a:ident, $g:ident, $late:expr, |$from:ident| { $($early:tt)* }, |$to:ident| $store:block) => {{
        let mut tok = $g.first;
        while tok < $a.num_tokens {
            if $late {
                pdl::signal_at_last(tok, $g.step, $a.num_tokens);
            }
            // SAFETY: tok < num_tokens.
            let $from = unsafe { row_source($a, tok) };
            $($early)*
            // SAFETY: tok < num_tokens, the length of the slot array.
            let slot = unsafe { slot_of($a, tok) };
            // SAFETY: the error word is the launch's. A row's offset ([`at_slot`], head 0): the
            // host checked that the row (both parts, at the same offset of their caches) lies
            // in the cache. (The callers' store blocks keep their own `unsafe` blocks.)
            #[allow(unused_unsafe)]
            unsafe {
                at_slot($a, slot, 0, || $g.lane == 0, |at| {
                    let $to = [$a.dst_k.add(at), $a.dst_v.add(at)];
                    $store
                })
            }
            tok += $g.step;
        }
    }};
}

/// Token `tok`'s row in the sources: its latent part `K` and its rope part `V`.
///
/// # Safety
/// `tok < num_tokens`: both parts' rows lie in the (host-validated) sources.
#[inline(always)]
unsafe fn row_source(a: &SlotArgs, tok: u64) -> [*const u8; 2] {
    // SAFETY: forwarded.
    unsafe {
        [
            a.src_k.add((tok * a.src_token_stride) as usize),
            a.src_v.add((tok * a.src_token_stride_v) as usize),
        ]
    }
}

/// One round of a row's two parts as a lane holds it ([`load_row`]): up to `P` values of the
/// latent part `K` and one of the rope part `V`. A row's parts are lopsided (an MLA row of
/// bf16 is 64 + 8 units of 16 bytes): holding one value of `V`, not `P`, keeps the registers
/// to what such a row needs.
type RowRound<T, const P: usize> = ([T; P], T);

/// Steps of a lane's unit positions (of `K`, of `V`) from one round of a row to the next, for
/// `lanes` lanes: `P` units of `K` and one of `V` a lane.
#[inline(always)]
fn row_step<const P: usize>(lanes: u32) -> [u32; 2] {
    [P as u32 * lanes, lanes]
}

/// Loads one lane's round of a row ([`RowRound`]): values `u[0] + j * lanes` (`j < P`) of
/// span `K` at `from[0]` and value `u[1]` of span `V` at `from[1]`, those below the span's
/// `units`, as accesses of `T` read as `READ` says ([`load_round`]).
///
/// # Safety
/// `units[k]` values of `T` readable at `from[k]`, aligned for `T`.
#[inline(always)]
unsafe fn load_row<T: Unit, const P: usize, const READ: u8>(
    from: &[*const u8; 2],
    units: [u32; 2],
    u: [u32; 2],
    lanes: u32,
) -> RowRound<T, P> {
    // SAFETY: forwarded, one span at a time.
    unsafe {
        let k = load_round::<T, 1, P, READ>(&[from[0]], &[true], |_| units[0], u[0], lanes);
        let v = load_round::<T, 1, 1, READ>(&[from[1]], &[true], |_| units[1], u[1], lanes);
        (k[0], v[0][0])
    }
}

/// Stores what [`load_row`] loaded for the same `(units, u, lanes)` at `to`, each value
/// passed through `f` on its way and written as `WRITE` says ([`span::store_round_map`]).
///
/// # Safety
/// `units[k]` values of `O` writable at `to[k]`, aligned for `O`.
#[inline(always)]
unsafe fn store_row_map<T: Copy, O: Unit, const P: usize, const WRITE: u8>(
    to: &[*mut u8; 2],
    units: [u32; 2],
    u: [u32; 2],
    lanes: u32,
    v: &RowRound<T, P>,
    f: impl Fn(&T) -> O,
) {
    // SAFETY: forwarded, one span at a time.
    unsafe {
        span::store_round_map::<T, O, 1, P, WRITE>(
            &[to[0]],
            &[true],
            |_| units[0],
            u[0],
            lanes,
            &[v.0],
            &f,
        );
        span::store_round_map::<T, O, 1, 1, WRITE>(
            &[to[1]],
            &[true],
            |_| units[1],
            u[1],
            lanes,
            &[[v.1]],
            &f,
        );
    }
}

/// The copying update of one-row items (`a.rows`: an MLA row, latent part `K` then rope part
/// `V`, one head), with accesses of `T`, through [`for_each_row`]: a group copies a token's two
/// parts together, [`BATCH_UNITS`] units of `K` and one of `V` a lane per round
/// ([`load_row`]), in one round when both fit (loaded before the slot is read, so the two
/// latencies overlap), else round by round once the slot is known. Each row is read and
/// written once: streaming accesses ([`span::ONCE`]). On the H100 (BENCHMARKS.md, session 27)
/// they took bf16 rows at T = 65,536 from 87.4–87.5% of the copy ceiling to 87.8–87.9% (a
/// prefill's slots 89.1–89.2% → 90.1–90.2%); at T = 16,384, where the bench's repeated source
/// stays in L2 between its iterations, from 128–130% to 112–113%.
///
/// # Safety
/// As [`update_slots`], with every address, stride and chunk a multiple of `size_of::<T>()`.
#[inline(always)]
unsafe fn rows_body<T: Unit>(a: &SlotArgs, g: Group) {
    const P: usize = BATCH_UNITS as usize;
    let w = core::mem::size_of::<T>() as u64;
    // Chunks are far below 4 GiB (host-checked): unit counts fit in 32 bits.
    let units = [(a.chunk_bytes / w) as u32, (a.chunk_bytes_v / w) as u32];
    let (lane, lanes) = (g.lane as u32, g.lanes as u32);
    let step = row_step::<P>(lanes);
    // A whole row in one round (the lanes the host gives a row of 16-byte units): loaded before
    // the slot is read, so the two latencies overlap. Other rows go round by round.
    let one_round = units[0] <= step[0] && units[1] <= step[1];
    for_each_row!(
        a,
        g,
        false,
        |from| {
            let held = if one_round {
                // SAFETY: `from` is a token's row ([`for_each_row`]): `units` values of T per
                // part, aligned for T.
                unsafe { load_row::<T, P, { span::ONCE }>(&from, units, [lane; 2], lanes) }
            } else {
                ([T::ZERO; P], T::ZERO)
            };
        },
        |to| {
            // SAFETY: `from` and `to` are the token's row in the sources and at its slot in the
            // caches ([`for_each_row`]): `units` values of T per part, aligned for T.
            unsafe {
                if one_round {
                    let (u, held) = ([lane; 2], &held);
                    store_row_map::<T, T, P, { span::ONCE }>(&to, units, u, lanes, held, |x| *x);
                } else {
                    let mut u = [lane; 2];
                    while u[0] < units[0] || u[1] < units[1] {
                        let v = load_row::<T, P, { span::ONCE }>(&from, units, u, lanes);
                        store_row_map::<T, T, P, { span::ONCE }>(&to, units, u, lanes, &v, |x| *x);
                        u = [u[0] + step[0], u[1] + step[1]];
                    }
                }
            }
        }
    );
}

/// [`update_slots`] for converting updates (`a.convert` set) of separate K and V items:
/// `slots_convert_body` compiled once per conversion code (dispatched here, once), so the
/// source type and the fp8 format are constants in each copy. One-row items (`a.rows`) are
/// [`update_rows_convert`]'s (the host routes them there: [`SlotArgs::converts_rows`]).
///
/// # Safety
/// As [`update_slots`], without `rows` (`a.rows == 0`, checked in debug builds only);
/// `a.convert` is a valid conversion code.
#[inline(always)]
pub unsafe fn update_slots_convert(a: &SlotArgs, g: Group) {
    // SAFETY: forwarded.
    convert::by_code!(a.convert, C => unsafe { slots_convert_body::<C>(a, g) })
}

/// [`update_slots`] for converting updates of one row per token (`a.rows`: an MLA row, latent
/// part `K` then rope part `V`, one head, K's per-tensor scale): `rows_convert_body` compiled
/// once per conversion code, with the unit a lane loads per 8 elements (one 16-byte access of
/// bf16/f16, two of f32) and [`convert::batch`] units of the latent part (one of the rope
/// part) per lane in a round.
///
/// # Safety
/// As [`update_slots`], with `rows`; `a.convert` is a valid conversion code.
#[inline(always)]
pub unsafe fn update_rows_convert(a: &SlotArgs, g: Group) {
    // The dependents are signalled at each thread's last row (`for_each_row!`).
    pdl::prologue(false);
    // SAFETY: forwarded. `C` is a constant in each arm: the branch not taken is dropped.
    convert::by_code!(a.convert, C => unsafe {
        if convert::src_bytes(C) == 4 {
            rows_convert_body::<C, convert::Raw, { convert::batch(C) as usize }>(a, g)
        } else {
            rows_convert_body::<C, V16, { convert::batch(C) as usize }>(a, g)
        }
    })
}

/// The converting update of one-row items for conversion `C` ([`update_rows_convert`]): a
/// group takes a token's two parts a round at a time, `P` vector units (loaded as `U`) of `K`
/// and one of `V` per lane ([`load_row`]; an MLA row is one round), and converts and stores
/// each round ([`store_row_map`] through [`convert::unit`]). Before converting a round it
/// loads the next one (the same row's next round, or the next row's first with that row's
/// slot), so the group's loads are in flight while it converts: converting is arithmetic
/// enough that, with the next row loaded only after the current one was stored, the entry
/// waited on its loads at about half its issue rate (Nsight Compute, H100, T = 65,536).
/// One (single) copy of the round's conversion code serves every row: each copy converts
/// `P + 1` units, inlined, and this entry holds one per conversion. A row without the vector
/// alignment (`width` 1) goes element by element once its slot is known
/// ([`Span::convert_scalar`], through [`for_each_row`]).
///
/// # Safety
/// As [`update_slots`], with `rows`; `C` is the conversion code of `a.convert`, `U` the unit
/// of its source type.
#[inline(always)]
unsafe fn rows_convert_body<const C: u32, U: convert::Loaded, const P: usize>(
    a: &SlotArgs,
    g: Group,
) {
    let vec = a.width as u64 == convert::VEC;
    // Steps: vector units of VEC elements, or single elements (`chunk_bytes` counts fp8
    // bytes, one per element; far below 4 GiB, host-checked).
    let per = if vec { convert::VEC } else { 1 };
    let units = [(a.chunk_bytes / per) as u32, (a.chunk_bytes_v / per) as u32];
    let (lane, lanes) = (g.lane as u32, g.lanes as u32);
    let step = row_step::<P>(lanes);
    if !vec {
        // Rows without the vector alignment: element by element, once the slot is known.
        for_each_row!(a, g, true, |from| {}, |to| {
            // SAFETY: `from` and `to` are the token's row in the sources and at its slot in
            // the caches ([`for_each_row`]); the host checked K's per-tensor scale.
            unsafe {
                let sp = Span {
                    src: from,
                    split: units[0],
                    total: units[0] + units[1],
                };
                sp.convert_scalar::<C>(to, lane, lanes, *a.k_scale);
            }
        });
        return;
    }
    // Vector rows, a round at a time ([`load_row`]; one round per row where both parts fit,
    // as for an MLA row). The round after the one being converted (the same row's next, or
    // the next row's first with its slot) is loaded before the conversion, so a group's
    // loads are in flight while it converts: one copy of the conversion for every row.
    let one_round = units[0] <= step[0] && units[1] <= step[1];
    // SAFETY: only called with tok < num_tokens.
    let source = |tok: u64| unsafe { row_source(a, tok) };
    let mut tok = g.first;
    if tok >= a.num_tokens {
        return;
    }
    let mut u = [lane; 2];
    // SAFETY: tok < num_tokens: its rows hold `units` vector units per part, 16-byte aligned
    // (host-checked); the slot array holds num_tokens entries.
    let (mut held, mut slot) = unsafe {
        (
            load_row::<U, P, { span::VOLATILE }>(&source(tok), units, u, lanes),
            slot_of(a, tok),
        )
    };
    // SAFETY: the host checked one per-tensor scale (K's) for the rows.
    let scale = unsafe { *a.k_scale };
    // Where the first row is the thread's last (decode sizes), its dependents are signalled
    // before the scale is used: [`Divider::new`] waits for the scale's load, and the signal
    // behind it delayed each decode-size update in a graph by about a load's latency. (The
    // loop signals that row again; a second signal changes nothing.)
    pdl::signal_at_last(tok, g.step, a.num_tokens);
    let div = Divider::new(scale);
    loop {
        let first = u[0] == lane;
        if first {
            pdl::signal_at_last(tok, g.step, a.num_tokens);
        }
        // The next round: this row's next, or the next row's first.
        let rest = !one_round && (u[0] + step[0] < units[0] || u[1] + step[1] < units[1]);
        let (next_tok, next_u) = if rest {
            (tok, [u[0] + step[0], u[1] + step[1]])
        } else {
            (tok + g.step, [lane; 2])
        };
        let more = next_tok < a.num_tokens;
        let (next, next_slot) = if more {
            // SAFETY: next_tok < num_tokens (as for the first round).
            unsafe {
                (
                    load_row::<U, P, { span::VOLATILE }>(&source(next_tok), units, next_u, lanes),
                    if rest { slot } else { slot_of(a, next_tok) },
                )
            }
        } else {
            (([U::ZERO; P], U::ZERO), slot)
        };
        // SAFETY: the error word is the launch's; counted at a row's first round only. A row's
        // offset ([`at_slot`], head 0): the host checked that the row (both parts, at the same
        // offset of their caches) lies in the cache; the round's units lie below `units` of
        // each part, 8 bytes of fp8 each, aligned.
        unsafe {
            at_slot(
                a,
                slot,
                0,
                || first && g.lane == 0,
                |at| {
                    let to = [a.dst_k.add(at), a.dst_v.add(at)];
                    let q = |v: &U| convert::unit::<C>(&v.raw(), &div);
                    store_row_map::<U, u64, P, { span::PLAIN }>(&to, units, u, lanes, &held, q);
                },
            )
        }
        if !more {
            break;
        }
        (tok, u, held, slot) = (next_tok, next_u, next, next_slot);
    }
}

/// The slot update: plain copies, or (`GENERAL`) K and V of different widths or input
/// strides.
///
/// # Safety
/// As [`update_slots`], without `rows`.
#[inline(always)]
unsafe fn slots_body<const GENERAL: bool>(a: &SlotArgs, g: Group) {
    let parts = if a.src_v.is_null() { 1 } else { 2 };
    let items = a.num_tokens * parts * a.heads;
    // Spans a group holds in registers are loaded before the slot is read, so the two
    // memory latencies overlap (decode-size updates are latency-bound).
    let units = if GENERAL {
        a.chunk_bytes.max(a.chunk_bytes_v)
    } else {
        a.chunk_bytes
    } / 16;
    // Only in the latency regime (at most one item per group); large updates keep the
    // streaming path.
    let staged = a.width == 16 && units <= STAGE_UNITS * g.lanes && items <= g.step;
    let mut item = g.first;
    // The first item's split only reads arguments: done before waiting for the grid this one
    // depends on (each iteration splits the next one, if any, after its own stores).
    let mut next = pdl::split_first(|| index::split3(item, parts, a.heads));
    pdl::ready::<SlotArgs>();
    while item < items {
        let (tok, part, head) = pdl::split_now(next, || index::split3(item, parts, a.heads));
        // In the general entry K and V may differ in width and input stride; the copying
        // entry keeps one of each.
        let (src, dst, chunk, sts) = if part == 0 {
            (a.src_k, a.dst_k, a.chunk_bytes, a.src_token_stride)
        } else if GENERAL {
            (a.src_v, a.dst_v, a.chunk_bytes_v, a.src_token_stride_v)
        } else {
            (a.src_v, a.dst_v, a.chunk_bytes, a.src_token_stride)
        };
        // SAFETY: tok < num_tokens and head < heads: inside the (host-validated) source.
        let s = unsafe { src.add((tok * sts + head * a.src_head_stride) as usize) };
        let units = chunk / 16;
        let held = if staged {
            // SAFETY: as above; staged implies 16-byte alignment and `units` units.
            unsafe { load_staged(s, units, g.lane, g.lanes) }
        } else {
            [V16::splat(0); 4]
        };
        // SAFETY: tok < num_tokens, the length of the slot array.
        let slot = unsafe { slot_of(a, tok) };
        let count = || g.lane == 0 && part == 0 && head == 0;
        // SAFETY: the error word is the launch's, counted by one lane of the token's first
        // item. head < heads: [`at_slot`]'s offset of a span in the caches.
        unsafe {
            at_slot(a, slot, head, count, |at| {
                let d = dst.add(at);
                if staged {
                    store_staged(d, &held, units, g.lane, g.lanes);
                } else {
                    copy_span(s, d, chunk, g.lane, g.lanes, a.width);
                }
            })
        }
        item += g.step;
        if pdl::SPLIT_EARLY {
            if item >= items {
                break;
            }
            next = index::split3(item, parts, a.heads);
        }
    }
}

/// Calls `store` with the byte offset in the caches (`dst_k`, `dst_v`) where `slot` puts head
/// `head`'s chunk; a negative slot is skipped, one past the cache skipped and counted in
/// `a.errors` where `count()` (true for one lane of the token; evaluated only for such a slot).
///
/// # Safety
/// `a.errors` as [`count_error`]'s. The offset `store` gets lies in the caches for any
/// `head < heads` (the host checked every such span).
#[inline(always)]
unsafe fn at_slot(
    a: &SlotArgs,
    slot: i64,
    head: u64,
    count: impl FnOnce() -> bool,
    store: impl FnOnce(usize),
) {
    match index::slot_target(slot, a.block_size, a.num_blocks) {
        SlotTarget::Skip => {}
        SlotTarget::OutOfRange => {
            if count() {
                // SAFETY: forwarded (see count_error).
                unsafe { count_error(a.errors, err::BAD_SLOT) };
            }
        }
        SlotTarget::At { block, offset } => store(
            (block * a.dst_block_stride + offset * a.dst_token_stride + head * a.dst_head_stride)
                as usize,
        ),
    }
}

/// The slot of token `tok`.
///
/// # Safety
/// `tok < num_tokens`, the length of the slot array.
#[inline(always)]
unsafe fn slot_of(a: &SlotArgs, tok: u64) -> i64 {
    // SAFETY: forwarded.
    unsafe {
        if a.slot_is_i64 != 0 {
            *(a.slots as *const i64).add(tok as usize)
        } else {
            *(a.slots as *const i32).add(tok as usize) as i64
        }
    }
}

/// The converting slot update for conversion `C`: each item's source elements quantized to
/// fp8 with the part's scale (per tensor, or per head), K and V as separate items. One-row
/// items (`rows`: MLA rows) are [`update_rows_convert`]'s: the host never sends them here.
///
/// One path for every size, kept lean in registers so that several CTAs share a
/// multiprocessor: a lane loads its first batch of vector units (four 16-byte loads: a
/// decode-size group has one unit per lane, a streaming one up to four) and the item's scale
/// before it reads the slot, so the latencies overlap; then it converts and stores unit by
/// unit. Offsets inside an item are 32-bit (chunks are far below 4 GiB), the divider lives
/// for one item.
///
/// # Safety
/// As [`update_slots`], without `rows` (`a.rows == 0`: checked in debug builds, so in the
/// emulated tests); `C` is the conversion code of `a.convert`.
#[inline(always)]
unsafe fn slots_convert_body<const C: u32>(a: &SlotArgs, g: Group) {
    debug_assert!(a.rows == 0, "rows go to update_rows_convert");
    let parts = if a.src_v.is_null() { 1 } else { 2 };
    let items = a.num_tokens * parts * a.heads;
    let vec = a.width as u64 == convert::VEC;
    // Steps: vector units of VEC elements, or single elements.
    let per = if vec { convert::VEC } else { 1 };
    let (lane, lanes) = (g.lane as u32, g.lanes as u32);
    let mut item = g.first;
    // As in `slots_body`: the first item's split before the wait; but here each iteration
    // splits the next item as soon as it has taken its own (splitting it after the stores, as
    // `slots_body` does, cost 1.6-2.9% of this entry's prefill throughput on the H100).
    let mut next = pdl::split_first(|| index::split3(item, parts, a.heads));
    pdl::ready::<SlotArgs>();
    while item < items {
        let (tok, part, head) = pdl::split_now(next, || index::split3(item, parts, a.heads));
        item += g.step;
        if pdl::SPLIT_EARLY {
            next = index::split3(item, parts, a.heads);
        }
        // K and V may differ in width and input stride (as in the general copying entry).
        let (src, dst, chunk, sts, scales) = if part == 0 {
            (
                a.src_k,
                a.dst_k,
                a.chunk_bytes,
                a.src_token_stride,
                a.k_scale,
            )
        } else {
            (
                a.src_v,
                a.dst_v,
                a.chunk_bytes_v,
                a.src_token_stride_v,
                a.v_scale,
            )
        };
        // SAFETY: tok < num_tokens and head < heads: inside the (host-validated) sources.
        let s = unsafe { src.add((tok * sts + head * a.src_head_stride) as usize) };
        // One part: every step at `s` (`src[1]` is never read).
        let sp = Span {
            src: [s, s],
            split: (chunk / per) as u32,
            total: (chunk / per) as u32,
        };
        let at = if a.scale_per_head != 0 {
            head as usize
        } else {
            0
        };
        // SAFETY: the host checked one scale (or one per head) for each part written.
        let scale = unsafe { *scales.add(at) };
        let raw = if vec {
            // SAFETY: `vec`: the host checked the vector alignment of sources and chunks.
            unsafe { sp.load::<C>(lane, lanes) }
        } else {
            [[V16::splat(0); 2]; convert::MAX_BATCH]
        };
        // SAFETY: tok < num_tokens, the length of the slot array.
        let slot = unsafe { slot_of(a, tok) };
        // [`at_slot`]'s match, written out: through the helper ptxas spills this entry (92
        // bytes of spill stores on sm_90 instead of 28, 64 on sm_80 instead of none).
        match index::slot_target(slot, a.block_size, a.num_blocks) {
            SlotTarget::Skip => {}
            SlotTarget::OutOfRange => {
                if g.lane == 0 && part == 0 && head == 0 {
                    // SAFETY: see count_error.
                    unsafe { count_error(a.errors, err::BAD_SLOT) };
                }
            }
            SlotTarget::At { block, offset } => {
                let at = block * a.dst_block_stride
                    + offset * a.dst_token_stride
                    + head * a.dst_head_stride;
                // SAFETY: block < num_blocks, offset < block_size, head < heads: the host
                // checked that all such spans lie in the caches, with the vector alignment
                // where `vec`.
                unsafe {
                    let d = dst.add(at as usize);
                    if vec {
                        let div = Divider::new(scale);
                        sp.convert::<C>([d, d], &raw, lane, lanes, &div);
                    } else {
                        sp.convert_scalar::<C>([d, d], lane, lanes, scale);
                    }
                }
            }
        }
    }
}

/// Tiled slot update: [`update_slots`]'s semantics (negative slots skipped, slots past the
/// cache skipped and counted, fp8 conversion with per-tensor or per-head scales) for caches
/// whose head vectors are stored in pieces (vLLM's v0 paged layout). One item = eight
/// consecutive tokens × one (part, head, 8-element group); consecutive threads take the
/// `subs` tiles of one group, so their transposed stores fill whole sectors.
///
/// # Safety
/// Host-validated arguments: every in-range target lies inside the destination caches, every
/// token row inside the sources, `slots` holds `num_tokens` entries, each part's stores are
/// aligned to `min(unit * elem, 16)` bytes (and to `min(8 * elem, 16)` where `runs` allows
/// columns), and a converting update's scales hold one f32 (or one per head) per part.
///
/// This entry point serves caches of 2-byte elements; 1-byte ones (fp8) run
/// [`update_tiles_staged`], 4-byte ones [`update_tiles_wide`] (twice the registers per row, so
/// its own register budget).
#[inline(always)]
pub unsafe fn update_tiles(a: &TileArgs, g: Group) {
    pdl::ready::<TileArgs>();
    // SAFETY: forwarded.
    unsafe { tiles_body::<2>(a, g) }
}

/// [`update_tiles`] for fp8 caches (1-byte elements, copied or quantized), eight tokens per
/// item, in CTAs of [`crate::stage::THREADS`] threads: with `a.staged`, each thread copies its
/// next tile's rows and slots into shared memory (`cp.async`) before it quantizes and stores
/// the current one (see [`crate::stage`]), so a tile's loads are in flight during the previous
/// tile's conversion; without, it loads each tile when it comes to it, as [`update_tiles`].
/// (Quantizing bf16 or f16 into pages of a multiple of 16 slots runs `update_pages_fp8` or
/// `update_pages_fp8_32` instead. 2-byte caches stay on [`update_tiles`]: on the H100, in one
/// run, staging wrote bf16 at 59% of the copy ceiling against its 60.5%. Quantizing to e4m3
/// went from 39.9% to 45.9% at 16,384 tokens and from 43.7% to 53.2% at 65,536;
/// BENCHMARKS.md, session 10.)
///
/// The body is compiled once per conversion code (dispatched here, once), so that the loop
/// holds one straight-line conversion for one source type and format: with the code chosen at
/// run time inside the unrolled tile, the loop's code outgrew the instruction cache and a
/// quarter of the warps' cycles went to instruction fetch. On the H100 (BENCHMARKS.md,
/// session 15) that, one fast-path test per tile (`convert::fast`) and one split per item
/// took e4m3 from 46% to 70% of the copy ceiling at 16,384 tokens (53% to 75% at 65,536).
///
/// # Safety
/// As [`update_tiles`], and: `a.elem == 1`, `a.tile == 8`; with `a.staged`, the slot array is
/// 16-byte aligned and source elements are of at most 2 bytes (a row's group is one 8- or
/// 16-byte copy, aligned to its size where runs are allowed).
#[inline(always)]
pub unsafe fn update_tiles_staged(a: &TileArgs, g: Group) {
    // Dependents are scheduled as the CTAs exit (as `update_pages`): e4m3 60.5 -> 65.0% at
    // T = 4,096, 69.7 -> 71.4% at 16,384 on the H100 (BENCHMARKS.md, session 16).
    pdl::prologue(false);
    // SAFETY: forwarded. `C` is a constant in each arm.
    unsafe {
        if a.convert == convert::NONE {
            staged_body::<{ convert::NONE }>(a, g)
        } else {
            convert::by_code!(a.convert, C => staged_body::<C>(a, g))
        }
    }
}

/// [`update_tiles`] for one token per thread (`a.tile == 1`, decode sizes), 1- and 2-byte
/// elements. A decode step is latency-bound: each warp runs its few items alone on its
/// scheduler, so every instruction on the way to the stores counts. One thread writes both
/// parts of one (token, head, group) item: one index split and one slot read for K and V,
/// 32-bit index arithmetic, shifts and masks for power-of-two extents, pieces and block sizes,
/// and K's and V's stores each compiled for their own part (not selected at run time).
///
/// # Safety
/// As [`update_tiles`], with `a.tile == 1` and `num_tokens * heads * groups` below 2^32.
#[inline(always)]
pub unsafe fn update_tiles_one(a: &TileArgs, g: Group) {
    // SAFETY: forwarded.
    unsafe {
        if a.elem == 1 {
            tiles_one_body::<1>(a, g)
        } else {
            tiles_one_body::<2>(a, g)
        }
    }
}

/// [`update_tiles`] at prefill sizes into caches of 2-byte elements whose V has one element per
/// piece and whose pages hold at most 16 slots, or 32, 64 or 128 (the host's choice; vLLM's
/// v0 layout defaults to 16):
/// the lanes of a warp take [`STREAM_LANES`] consecutive tokens, each lane
/// [`STREAM_UNITS`] consecutive 8-element groups of one head of its token, K and V, loaded
/// before any is stored. No shared memory, no barrier: every warp streams on its own.
///
/// Stores. When each octet of the warp's lanes (eight consecutive tokens) goes to eight
/// consecutive slots from a multiple of 8 in one block (a prefill's whole pages; the plan's
/// `runs` says V's columns are 16-byte aligned), the octet transposes its V rows across its
/// lanes ([`crate::warp`]: three butterfly steps of `shfl.sync`): each lane then
/// holds one element of the group for the octet's eight tokens and stores it as one 16-byte
/// column, so one V store instruction of the warp writes whole 32-byte sectors (four 128-byte
/// lines on 16-token pages) where one 2-byte element a lane wrote two sectors; K goes out as
/// the lanes' 16-byte pieces, which neighbouring tokens place side by side. A warp with any
/// other octet (a sequence's start or end inside it, padding, a slot past the cache) stores
/// token by token, K as its pieces and V element by element. The decision is the warp's
/// (one ballot), so the exchange never diverges. The CPU emulation decides from the slots and
/// reads the columns from the source instead of exchanging rows; the steps of the exchange
/// are tested on the CPU lane by lane (`warp`'s tests).
///
/// On the H200 (16-token pages, % of the copy ceiling, BENCHMARKS.md sessions 19 and 20):
/// one sequence of 16,384 tokens 62.4% with `update_pages`, 72.5–73.5% with element stores,
/// 75.4–75.9% with the columns; 4,096 tokens 60.0% / 69.6–71.1% / 78.2–78.9%; batches of
/// many sequences 0.2–1.8 points over element stores. On larger pages the pages entries
/// stay: there this body gained 7–13 points on one sequence but lost 1–8 on most batches,
/// whose warps more often hold a sequence's partial first or last page and store token by
/// token.
///
/// Tokens need no run search: each lane reads its own slot (negative: skipped; past the
/// cache: counted once per token).
///
/// # Safety
/// As [`update_tiles`], with `a.elem == 2`, no conversion, `a.tile == 1`, `a.subs ==
/// STREAM_LANES`, `a.src_vec`, and at most `u32::MAX` items: `num_tokens` rounded up to
/// [`STREAM_LANES`], times `heads`, times `groups / STREAM_UNITS` rounded up. Launched with
/// CTAs of whole warps (every lane of a warp runs the same items).
#[inline(always)]
pub unsafe fn update_stream(a: &TileArgs, g: Group) {
    // Prefill sizes: dependents are scheduled as the CTAs exit (as `update_pages`).
    pdl::prologue(false);
    // SAFETY: forwarded.
    unsafe { stream_body::<{ convert::NONE }, STREAM_OWN>(a, g) }
}

/// [`update_stream`] with shifted windows (`STREAM_SHIFT`, `Window`): a warp takes the 32
/// tokens from its first token whose slot starts an octet of slots (its lanes below that shift
/// `d` load the next warp's first `d` tokens; its own first `d` go to the warp before), so that
/// a warp whose tokens go to runs of slots that do not start at a multiple of 8 (a batch's
/// sequence that starts inside an earlier warp) still stores V as whole transposed columns.
/// Where a window is no run (a sequence's start or end inside it) its tokens go token by
/// token, a lane its own; the warp's first `d` tokens too where the warp before's window does
/// not hold them (no run of the same shift). Its own entry point: the shift's slot loads, window checks and exchange take 92
/// registers (two CTAs a multiprocessor, where [`update_stream`] has three).
///
/// The host runs it on pages of 8, 16, 32, 64 and 128 slots
/// ([`crate::args::TileArgs::rotates`]). BENCHMARKS.md, session 28, % of the copy ceiling at
/// 16,384 tokens: batches of many sequences on 16-slot pages 58–62 → 66–69 on the H200
/// (64–67 → 73–76 on the H100), on 8-slot pages 66 → 71 (71 → 77; session 27's rotation with
/// split octets); one sequence on 16-slot pages 77 → 73 on the H200 (83 → 81 on the H100), on
/// 8-slot pages 74–75 → 74. Session 32 (H100), against `update_pages` on 32-, 64- and
/// 128-slot pages: one sequence 77.5 / 77 / 74.7 → 87.8 / 87.3 / 83.9.
///
/// # Safety
/// As [`update_stream`].
#[inline(always)]
pub unsafe fn update_stream_rot(a: &TileArgs, g: Group) {
    pdl::prologue(false);
    // SAFETY: forwarded.
    unsafe { stream_body::<{ convert::NONE }, STREAM_SHIFT>(a, g) }
}

/// [`update_stream`] for quantizing updates into fp8 v0 caches (bf16 or f16 sources, e4m3 or
/// e5m2, scales per tensor or per head) whose key pieces hold 16 elements: the same lanes and
/// loads, compiled once per conversion code (dispatched here, once). A warp whose virtual
/// octets are runs (`Run`: the lanes read rotated so that octets line up with aligned slots
/// wherever a batch's sequence starts) and whose every loaded element lies on the division's
/// fast path (`convert::fast`, one ballot) converts in one straight-line copy of the
/// conversion: K's two units of a piece as one 16-byte store, V's transposed column of eight
/// tokens, quantized, as one 8-byte store (two octets fill a page's 16-byte value line, a
/// warp's store two whole 128-byte lines; the split last octet in two partial columns). Any
/// other warp goes token by token, each lane converting its token's groups again from the
/// source with the general conversion (infinities, NaNs, magnitudes past 2^80).
///
/// On the H100 (BENCHMARKS.md, session 23; `kvio_update_pages_fp8` or the staged tiles
/// before, same calls), e4m3 v0 prefill in % of the copy ceiling: one sequence of 16,384
/// tokens on 16-token pages 74.9 -> 76.9, on 8-token pages 69.3 -> 77.0; batches on 16-token
/// pages 64.2 -> 66.8 (chunked), 65.1 -> 66.4 (sequences of 1,024 tokens), 52.7 -> 58.4 (of
/// 128); batches on 8-token pages 13-15 -> 59-69. On 32-token pages (session 24; before,
/// `kvio_update_pages_fp8_32`): one sequence 70.5 -> 76.9, batches 45-58 -> 54-62. Without
/// the rotation (a warp whose octets do not start at multiples of 8 token by token) batches
/// of 1,024-token sequences on 16-token pages lost 7 points; rotated with the split octet's
/// tokens stored element by element, 3.
///
/// Since session 25 V's rows are quantized before the octet's exchange, which then moves
/// bytes (two words a lane) instead of 2-byte elements (four): H100, one sequence of 16,384
/// tokens 76.4-77.2 -> 78.6-79.1% on 8-, 16- and 32-token pages, batches -1 to +3 points.
/// And every lane finds its first V store's octet the same way, so a rotated warp computes
/// that address once, not once for its whole octets and once for the split one: batches of
/// 1,024-token sequences and chunked batches 1-2 points up again (H100).
///
/// Since session 26 the division takes three instructions an element (`fp8::Divider`), the
/// fast-range test one packed `max` a word (sm_90), and each lane works out its targets once
/// an item (`Columns`): H100, one sequence of 16,384 tokens 78.5-79.0 -> 81.0-81.2% on 8-
/// and 16-token pages, 17.31 M -> 14.37 M warp instructions.
///
/// # Safety
/// As [`update_stream`], except: `a.elem == 1`, `a.convert` converts 2-byte source elements
/// (another code writes nothing), K's pieces hold 16 elements, and with V runs (`a.runs & 2`)
/// and `a.unit_k == 8` the key cache's pieces are 16-byte aligned; V is present (`src_v`
/// non-null: the body reads both parts' scales) and the scales hold one f32 (or one per head)
/// for each part.
#[inline(always)]
pub unsafe fn update_stream_fp8(a: &TileArgs, g: Group) {
    pdl::prologue(false);
    // SAFETY: forwarded. `C` is a constant in each arm.
    unsafe {
        convert::by_code!(a.convert, C => {
            if convert::src_bytes(C) == 2 {
                stream_body::<C, STREAM_SPLIT>(a, g)
            }
        })
    }
}

/// The body of [`update_stream`] and [`update_stream_rot`] (`C` = [`convert::NONE`]: 2-byte
/// caches, copied; `MODE` [`STREAM_OWN`] and [`STREAM_SHIFT`]) and of [`update_stream_fp8`]
/// (`C` a conversion of 2-byte sources into 1-byte caches, `MODE` [`STREAM_SPLIT`]).
///
/// # Safety
/// As the entry point of `C` and `MODE`.
#[inline(always)]
unsafe fn stream_body<const C: u32, const MODE: u8>(a: &TileArgs, g: Group) {
    let quant = C != convert::NONE;
    // Whether this stream shifts its windows ([`STREAM_SHIFT`]; `shift` below: where it
    // stores columns at all). Only copies shift: a quantizing stream's token-by-token path
    // would then also take the next warp's tokens of a run that is not on the division's
    // fast path (measured with shifted windows, the quantizing stream spilled and lost).
    const { assert!(MODE <= STREAM_SHIFT && !(MODE == STREAM_SHIFT && C != convert::NONE)) };
    let shifted = MODE == STREAM_SHIFT;
    let (heads, quads) = (a.heads as u32, a.groups.div_ceil(STREAM_UNITS) as u32);
    let items = a.num_tokens.div_ceil(STREAM_LANES) * a.heads * quads as u64 * STREAM_LANES;
    let (k, v) = (TilePart::of(a, 0), TilePart::of(a, 1));
    let with_v = !a.src_v.is_null();
    // Warps whose octets all go to eight consecutive, 8-aligned slots may store V as
    // transposed columns, K as whole 16-byte pieces.
    let columns = with_v && a.runs & 2 != 0 && a.unit_k == 8;
    let bs_shift = index::pow2_shift(a.block_size);
    let mut item = g.first;
    while item < items {
        // Item `((tb * heads + head) * quads + quad) * STREAM_LANES + lane`: token `tb *
        // STREAM_LANES + lane`, groups from `quad * STREAM_UNITS` (32-bit split: host-checked).
        let (rest, lane) = ((item / STREAM_LANES) as u32, (item % STREAM_LANES) as u32);
        let (rest, quad) = index::split_u32(rest, quads);
        let (tb, head) = index::split_u32(rest, heads);
        let (t, head, g0) = (
            tb as u64 * STREAM_LANES + lane as u64,
            head as u64,
            quad as u64 * STREAM_UNITS,
        );
        item += g.step;
        // Every lane stays to the end of the item: the octets exchange their rows.
        let live = t < a.num_tokens;
        let at = t * a.src_token_stride + head * a.src_head_stride;
        // SAFETY: t < num_tokens where live, head < heads, groups below `groups`: inside the
        // validated sources, 16-byte aligned (`src_vec`).
        let mut rows = unsafe { stream_rows::<C>(a, at, g0, live, with_v) };
        let slot = if live {
            // SAFETY: t < num_tokens, the length of the slot array.
            unsafe { tile_slot(a, t) }
        } else {
            -1
        };
        // A shifted window ([`STREAM_SHIFT`]) takes the next warp's first tokens and leaves
        // its own first ones to the warp before: the slots of both warps' tokens on this lane.
        let shift = shifted && columns;
        let slot_next = if shift && lane < 8 && t + STREAM_LANES < a.num_tokens {
            // SAFETY: t + 32 < num_tokens.
            unsafe { tile_slot(a, t + STREAM_LANES) }
        } else {
            -1
        };
        let slot_prev = if shift && t >= STREAM_LANES {
            // SAFETY: t - 32 < t, and t - 32 < num_tokens.
            unsafe { tile_slot(a, t - STREAM_LANES) }
        } else {
            -1
        };
        // The scales (the same on every lane of the warp: one head).
        let (sk, sv) = if quant {
            (tile_scale(a, C, 0, head), tile_scale(a, C, 1, head))
        } else {
            (Divider::UNUSED, Divider::UNUSED)
        };
        // SAFETY: every lane of the warp is here (the loop is warp-uniform); `slot` is token
        // t's (-1 past the last token), `slot_next` token t + 32's on lanes below 8,
        // `slot_prev` token t - 32's.
        let win = if columns {
            unsafe { warp_window::<MODE>(a, t, lane, [slot_prev, slot, slot_next], bs_shift) }
        } else {
            Window::OWN
        };
        // This lane's own token goes token by token where no window takes it: below `d` the
        // warp before's window holds it if that is a run of the same shift (`prev`), from `d`
        // on this warp's.
        let own = if shift && lane < win.d {
            !win.prev
        } else {
            win.run.is_none()
        };
        // One token token by token ([`stream_token`]): its rows (a copy's; a conversion reads
        // the source again), its source rows' offset and its slot.
        // SAFETY (every call): the rows (a copy's) and the source offset are the token's, its
        // slot -1 past the last token; as the entry point.
        let token = |rows: Option<&[[Row; 2]; STREAM_UNITS as usize]>, at: u64, slot: i64| unsafe {
            stream_token::<C>(a, rows, at, g0, head, slot, bs_shift, with_v, &sk, &sv)
        };
        if shifted && own && !quant {
            // Before the rows of a run's lanes below `d` are replaced (below): token t's.
            token(Some(&rows), at, slot);
        }
        if let Some(r) = win.run.filter(|_| shift) {
            if lane < r.d {
                // This lane's virtual token is the next warp's: its rows.
                // SAFETY: a window's tokens exist (their slots are runs).
                rows = unsafe {
                    stream_rows::<C>(a, at + STREAM_LANES * a.src_token_stride, g0, true, with_v)
                };
            }
        }
        // SAFETY: as above (`run` is the same on every lane).
        let run = win.run.filter(|r| {
            let d = if shift { r.d } else { 0 };
            !quant || unsafe { warp_fast::<C>(a, &rows, t, lane, d, head, g0, &sk, &sv) }
        });
        if let Some(run) = run {
            // Every virtual octet of the warp a run: K as 16-byte pieces (each lane its own
            // virtual token's), V as transposed columns.
            let vslot = if shift && lane < run.d {
                slot_next
            } else {
                slot
            };
            let (block, offset) = index::split_slot(vslot as u64, a.block_size, bs_shift);
            // The warp's first token's source offset.
            let at_w = at - lane as u64 * a.src_token_stride;
            if quant {
                // SAFETY: as in the copy's loop below; the key pieces are 16-byte aligned
                // (the entry's contract).
                unsafe {
                    stream_columns_fp8::<C>(
                        a, &rows, &run, bs_shift, lane, at_w, g0, head, block, offset, &sk, &sv,
                    )
                };
            } else {
                // SAFETY: `run` is the warp's, head < heads, g0 < groups.
                let cols = unsafe { Columns::new(&v, a, &run, bs_shift, lane, head, g0) };
                let k0 = block * k.block + head * k.head + g0 * k.piece_stride + offset * k.token;
                unroll4!(u => {
                    let grp = g0 + u as u64;
                    if grp < a.groups {
                        // SAFETY: every lane of the warp is here (`groups` is the same on every
                        // lane); the warp's tokens exist, its group lies in the source.
                        let col = unsafe { octet_column(a, &rows[u][1], lane, &run, at_w + 16 * grp) };
                        // SAFETY: a valid target (block < num_blocks, offset < block_size, head <
                        // heads), elements 8 grp .. 8 grp + 7 of the head; V: `run`'s slots,
                        // columns 16-byte aligned (`runs`).
                        unsafe {
                            let dk = k.dst.add((k0 + u as u64 * k.piece_stride) as usize);
                            tile::store::<2>(dk, &rows[u][0], 0, 8);
                            store_column::<2>(&cols, u as u64, &run, lane, col);
                        }
                    }
                });
            }
            if !(shifted && quant) {
                // Nothing else of this lane's: no value is kept across the column path.
                continue;
            }
        }
        if !shifted && !quant {
            // Token by token (no run), from the rows this lane holds: token t's.
            token(Some(&rows), at, slot);
        }
        if quant {
            // Token by token from the source (one call site, so that the kernel holds one copy
            // of the general conversion): this lane's own token where no window takes it,
            // then its virtual token where the window is a run whose elements are not all on
            // the division's fast path. (With the assert above, `shift` is false wherever
            // `quant` holds, so only `which == 0` runs; the branches stay written this way
            // because the form without them compiled to different PTX for all three stream
            // entries and cost the quantizing stream 1.3–1.6 points on the H100: session 29.)
            let mut which = 0;
            while which < if shift { 2 } else { 1 } {
                let (on, at, slot) = if which == 0 {
                    // Without a shift: this lane's token wherever the warp stores no columns.
                    (if shift { own } else { run.is_none() }, at, slot)
                } else {
                    let virt = shift && win.run.is_some() && run.is_none();
                    if lane < win.d {
                        (virt, at + STREAM_LANES * a.src_token_stride, slot_next)
                    } else {
                        (virt, at, slot)
                    }
                };
                if on {
                    // Token t, or token t + 32, which a run's window holds (it exists).
                    token(None, at, slot);
                }
                which += 1;
            }
        }
    }
}

/// The groups `g0 ..` (at most [`STREAM_UNITS`], below `groups`) of the head whose source rows
/// start at offset `at`, as [`stream_body`]'s lane holds them: K's and V's (where `with_v`);
/// zeros where not `live`.
///
/// # Safety
/// Where `live`, the groups lie in the sources, 16-byte aligned.
#[inline(always)]
unsafe fn stream_rows<const C: u32>(
    a: &TileArgs,
    at: u64,
    g0: u64,
    live: bool,
    with_v: bool,
) -> [[Row; 2]; STREAM_UNITS as usize] {
    let mut rows = [[[0u32; 8]; 2]; STREAM_UNITS as usize];
    if C == convert::NONE && live && g0 + STREAM_UNITS <= a.groups && with_v {
        // A live token's whole quad (the common case): every row loaded, none zeroed first.
        // (Not in the quantizing stream: there the same branch spilled 16 bytes at its 80
        // registers.)
        unroll4!(u => {
            // SAFETY: as below, every group of the quad below `groups`.
            rows[u] = unsafe { stream_group(a, at, g0 + u as u64, true) };
        });
    } else {
        unroll4!(u => {
            let grp = g0 + u as u64;
            if live && grp < a.groups {
                // SAFETY: a live token's group below `groups` (caller).
                rows[u] = unsafe { stream_group(a, at, grp, with_v) };
            }
        });
    }
    rows
}

/// [`stream_body`]'s token-by-token store of one token (its source rows at offset `at`; its
/// groups `g0 ..` of head `head` in `rows`, which a copy needs and a conversion does not read)
/// at `slot`: skipped where negative, counted once per token (at its first item) past the
/// cache; K as its pieces and V element by element, copied from `rows` or, for a conversion
/// `C`, converted again from the source ([`stream_tokens`]).
///
/// # Safety
/// The token's groups lie in the sources at `at` (16-byte aligned), `rows` are them where `C`
/// copies (`None` stores nothing then), `head < heads`; as the entry point.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stream_token<const C: u32>(
    a: &TileArgs,
    rows: Option<&[[Row; 2]; STREAM_UNITS as usize]>,
    at: u64,
    g0: u64,
    head: u64,
    slot: i64,
    bs_shift: u32,
    with_v: bool,
    sk: &Divider,
    sv: &Divider,
) {
    if slot < 0 {
        return;
    }
    let (block, offset) = index::split_slot(slot as u64, a.block_size, bs_shift);
    if block >= a.num_blocks {
        if head == 0 && g0 == 0 {
            // SAFETY: see count_error.
            unsafe { count_error(a.errors, err::BAD_SLOT) };
        }
        return;
    }
    if C != convert::NONE {
        core::hint::cold_path();
        // SAFETY: the token's groups lie in the sources, head < heads; a valid target.
        unsafe { stream_tokens::<C>(a, at, head, g0, block, offset, sk, sv) };
        return;
    }
    let (k, v) = (TilePart::of(a, 0), TilePart::of(a, 1));
    // SAFETY (both stores): a valid target (block < num_blocks, offset < block_size, head <
    // heads); elements 8 grp .. 8 grp + 7 of the head.
    let store = |grp: u64, row: &[Row; 2]| unsafe {
        store_part::<2>(&k, block, offset, head, &row[0], 8 * grp, 1);
        if with_v {
            store_part::<2>(&v, block, offset, head, &row[1], 8 * grp, 1);
        }
    };
    if let Some(rows) = rows {
        unroll4!(u => {
            let grp = g0 + u as u64;
            if grp < a.groups {
                store(grp, &rows[u]);
            }
        });
    }
}

/// Group `grp` (eight elements) of the head whose source rows start at offset `at`, as
/// [`stream_body`] holds it: K's, and V's where `with_v` (else zeros).
///
/// On sm_90 each 16-byte load asks L2 to fetch 256 bytes on a miss (`ld.global.L2::256B`):
/// a lane loads 64 bytes of a token's head row and the warps of the neighbouring items the
/// rest of it at about the same time, so the first miss brings the whole row (for head
/// dimension 128 and 2-byte elements) from DRAM in one go and the others find it in L2. The
/// same loads, the same registers; on the H100 (BENCHMARKS.md, session 30, two rounds in one
/// process) v0 prefill of one sequence of 16,384 tokens went from 83.0–83.5% of the copy
/// ceiling to 87.7–88.6% (bf16, 8- and 16-token pages) and from 82.1–82.4% to 85.2–85.5%
/// (e4m3), batches of 1,024-token sequences (and chunked) up 3.4–5.0 points (bf16) and
/// 1.7–3.9 (e4m3). An L2 prefetch of the next item's rows instead (`prefetch.global.L2`)
/// lost 9–17 points in the same runs.
///
/// # Safety
/// The group lies in the sources (K's, and V's where `with_v`), 16-byte aligned.
#[inline(always)]
unsafe fn stream_group(a: &TileArgs, at: u64, grp: u64, with_v: bool) -> [Row; 2] {
    let off = (at + 16 * grp) as usize;
    // SAFETY: forwarded.
    unsafe {
        #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
        let ld = |p: *const u8| -> Row {
            let w = ld_v4!("ld.global.L2::256B.v4.b32", reg64 p);
            [w[0], w[1], w[2], w[3], 0, 0, 0, 0]
        };
        #[cfg(not(all(target_arch = "nvptx64", target_feature = "sm_90")))]
        let ld = |p: *const u8| tile::load_copy::<2>(p, true, 1);
        let k = ld(a.src_k.add(off));
        let v = if with_v { ld(a.src_v.add(off)) } else { [0; 8] };
        [k, v]
    }
}

/// [`stream_body`]'s column path for a conversion `C` (every virtual octet of the warp a run,
/// every element of the warp's groups on the division's fast path): K's units `2h` and `2h +
/// 1` quantized into piece `g0 / 2 + h` as one 16-byte store (pieces of 16 elements; groups
/// come in pairs, as `head_dim` is a multiple of 16), V's transposed columns of the virtual
/// octet's eight tokens quantized into one 8-byte store each ([`store_column`]): each lane
/// quantizes its own row, then the octet transposes bytes ([`octet_column_fp8`]).
///
/// # Safety
/// Every lane of the warp calls it together (GPU). `run` is the warp's ([`warp_window`]), the
/// warp's first token's group lies at source offset `at_w`, (`block`, `offset`) is this lane's
/// valid target; the key pieces are 16-byte aligned, the value columns 8-byte aligned.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stream_columns_fp8<const C: u32>(
    a: &TileArgs,
    rows: &[[Row; 2]; STREAM_UNITS as usize],
    run: &Run,
    bs_shift: u32,
    lane: u32,
    at_w: u64,
    g0: u64,
    head: u64,
    block: u64,
    offset: u64,
    sk: &Divider,
    sv: &Divider,
) {
    let (k, v) = (TilePart::of(a, 0), TilePart::of(a, 1));
    // Piece g0 / 2 of this lane's token (pieces of 16 elements, two groups).
    let k0 = block * k.block + head * k.head + offset * k.token + (g0 / 2) * k.piece_stride;
    unroll2!(h => {
        let grp = g0 + 2 * h as u64;
        if grp < a.groups {
            let lo = convert::unit_fast::<C>(&raw_of(&rows[2 * h][0]), sk);
            let hi = convert::unit_fast::<C>(&raw_of(&rows[2 * h + 1][0]), sk);
            let w = [lo as u32, (lo >> 32) as u32, hi as u32, (hi >> 32) as u32];
            // SAFETY: a valid target's head, elements 8 grp .. 8 grp + 15: one whole piece,
            // 16-byte aligned (caller).
            unsafe {
                let d = k.dst.add((k0 + h as u64 * k.piece_stride) as usize);
                core::ptr::write(d as *mut V16, V16::from_array(w));
            }
        }
    });
    // SAFETY: `run` is the warp's, head < heads, g0 < groups (caller).
    let cols = unsafe { Columns::new(&v, a, run, bs_shift, lane, head, g0) };
    unroll4!(u => {
        let grp = g0 + u as u64;
        if grp < a.groups {
            // SAFETY: every lane of the warp is here (`groups` is the same on every lane);
            // the warp's tokens exist, its group lies in the source.
            let q = unsafe { octet_column_fp8::<C>(a, &rows[u][1], lane, run, at_w + 16 * grp, sv) };
            // SAFETY: `cols` is this lane's for `run`, g0 + u < groups; columns 8-byte aligned
            // (caller).
            unsafe { store_column::<1>(&cols, u as u64, run, lane, [q[0], q[1], 0, 0]) };
        }
    });
}

/// A loaded group of 2-byte source elements (the first four words of `row`) as a conversion's
/// raw unit.
#[inline(always)]
fn raw_of(row: &Row) -> convert::Raw {
    [
        V16::from_array([row[0], row[1], row[2], row[3]]),
        V16::splat(0),
    ]
}

/// [`stream_body`]'s token-by-token path for a conversion `C`: the groups `g0 ..` of head
/// `head` (K, then V if any) of the token whose row starts at source offset `at`, loaded again
/// from the source, converted with the general conversion (any element) and stored at slot
/// (`block`, `offset`). A loop, not unrolled, so that the kernel holds one more copy of the
/// conversion, not eight.
///
/// # Safety
/// The token's groups lie in the sources (16-byte aligned), `head < heads`, (`block`,
/// `offset`) is a valid target; as the entry point.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stream_tokens<const C: u32>(
    a: &TileArgs,
    at: u64,
    head: u64,
    g0: u64,
    block: u64,
    offset: u64,
    dk: &Divider,
    dv: &Divider,
) {
    let parts = if a.src_v.is_null() { 1 } else { 2 };
    let mut j = 0;
    while j < parts * STREAM_UNITS {
        let (part, grp) = (j / STREAM_UNITS, g0 + j % STREAM_UNITS);
        if grp < a.groups {
            let (src, div) = if part == 0 {
                (a.src_k, dk)
            } else {
                (a.src_v, dv)
            };
            // SAFETY: the token's group grp < groups: inside the validated source, 16-byte
            // aligned; a valid target's head, elements 8 grp .. 8 grp + 7.
            unsafe {
                let src = src.add((at + 16 * grp) as usize);
                let row = tile::row_of(convert::unit::<C>(&load_group::<C>(src), div));
                store_part::<1>(
                    &TilePart::of(a, part),
                    block,
                    offset,
                    head,
                    &row,
                    8 * grp,
                    1,
                );
            }
        }
        j += 1;
    }
}

/// Whether every element of the groups that [`stream_body`]'s warp loaded (`rows`: this lane's,
/// of token `t`, or of token `t + 32` on lanes below the window's shift `d`; head `head`,
/// groups `g0 ..`) lies on the division's fast path of conversion `C` with the scales `dk`
/// (K) and `dv` (V) ([`convert::fast`]). The same on every lane.
///
/// # Safety
/// Every lane of the warp calls it together (GPU); the warp's live tokens' groups lie in the
/// sources (16-byte aligned).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn warp_fast<const C: u32>(
    a: &TileArgs,
    rows: &[[Row; 2]; STREAM_UNITS as usize],
    t: u64,
    lane: u32,
    d: u32,
    head: u64,
    g0: u64,
    dk: &Divider,
    dv: &Divider,
) -> bool {
    #[cfg(target_arch = "nvptx64")]
    {
        let _ = (a, t, lane, d, head, g0);
        let raws = |p: usize| {
            [
                raw_of(&rows[0][p]),
                raw_of(&rows[1][p]),
                raw_of(&rows[2][p]),
                raw_of(&rows[3][p]),
            ]
        };
        let ok = convert::fast::<C, 4>(&raws(0), dk) && convert::fast::<C, 4>(&raws(1), dv);
        // SAFETY: every lane of the warp is here (caller).
        unsafe { cta::ballot(ok) == u32::MAX }
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        // The warp's virtual lanes in turn: each live token's groups, as the lanes loaded them.
        let _ = rows;
        let tw = t - lane as u64 + d as u64;
        let mut j = 0;
        while j < STREAM_LANES && tw + j < a.num_tokens {
            let at = (tw + j) * a.src_token_stride + head * a.src_head_stride;
            let mut u = 0;
            while u < STREAM_UNITS && g0 + u < a.groups {
                // SAFETY: a live token's group: inside the sources (caller; V present).
                let [rk, rv] = unsafe { stream_group(a, at, g0 + u, true) };
                if !convert::fast::<C, 1>(&[raw_of(&rk)], dk)
                    || !convert::fast::<C, 1>(&[raw_of(&rv)], dv)
                {
                    return false;
                }
                u += 1;
            }
            j += 1;
        }
        true
    }
}

/// How [`stream_body`]'s warps take their tokens: each lane its own ([`update_stream`]).
const STREAM_OWN: u8 = 0;
/// How [`stream_body`]'s warps take their tokens: rotated within the warp, the last virtual
/// octet split between two octets of slots ([`update_stream_fp8`]; see [`Run`]).
const STREAM_SPLIT: u8 = 1;
/// How [`stream_body`]'s warps take their tokens: a window shifted past the warp's first
/// tokens into the next warp's ([`update_stream_rot`]; see [`Run`], [`Window`]).
const STREAM_SHIFT: u8 = 2;

/// Where [`stream_body`]'s warp stores V as transposed columns: the lanes are read as
/// *virtual* lanes, so that each virtual octet (lanes `8m .. 8m + 8`) goes to eight
/// consecutive slots from a multiple of 8 in one block, whatever the first token's slot modulo
/// 8 (a batch's sequences start at any token of the warp). Virtual lane `L` is read from lane
/// `(L + d) % 32`, and holds:
/// - [`STREAM_SHIFT`]: token `tw + d + L` of the warp whose first token is `tw` (lanes below
///   `d` load the next warp's first `d` tokens): the window of 32 tokens is shifted by `d`, no
///   octet is split ([`Window`] says which warp stores which tokens);
/// - [`STREAM_SPLIT`]: token `tw + (L + d) % 32`, the warp's own tokens rotated. With `d > 0`
///   the last virtual octet holds two pieces: virtual lanes `24 .. 32 - d` (the warp's last
///   tokens) at slots `pa .. pa + 8 - d`, and `32 - d .. 32` (its first `d` tokens, wrapped
///   around) at `pb + 8 - d .. pb + 8`.
///
/// In [`update_stream`] ([`STREAM_OWN`]) `d` is 0.
#[derive(Clone, Copy)]
struct Run {
    /// The lanes' rotation (0 with [`STREAM_OWN`]).
    d: u32,
    /// The first slot of this lane's virtual octet (a multiple of 8).
    base: u64,
    /// [`STREAM_SPLIT`] with `d > 0`: the first slots of the octets of the last virtual
    /// octet's two pieces (else 0).
    pa: u64,
    pb: u64,
    /// [`STREAM_SPLIT`]: the last virtual octet is split where `d > 0`.
    split: bool,
}

impl Run {
    /// Whether lane `lane` holds a piece of a split last virtual octet ([`STREAM_SPLIT`]:
    /// virtual lanes 24..32 with `d > 0`), so that it stores its column in two pieces.
    #[inline(always)]
    fn splits(&self, lane: u32) -> bool {
        self.split && self.d != 0 && lane >= 24
    }

    /// The lane whose register holds virtual lane `lane`'s token: `(lane + d) % 32`.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn source(&self, lane: u32) -> u32 {
        (lane + self.d) & 31
    }

    /// Virtual lane `lane`'s token, counted from the warp's first: `(lane + d) % 32` split,
    /// `lane + d` shifted.
    #[cfg(not(target_arch = "nvptx64"))]
    #[inline(always)]
    fn token(&self, lane: u32) -> u64 {
        if self.split {
            ((lane + self.d) & 31) as u64
        } else {
            (lane + self.d) as u64
        }
    }
}

/// Which tokens [`stream_body`]'s warp stores, and how. With [`STREAM_SHIFT`], warp `w` (first
/// token `tw = 32 w`) has the window of tokens `tw + d .. tw + 32 + d`, `d` its shift (from
/// token `tw`'s slot: `(8 - slot % 8) % 8`; 0 for the first warp). Where the window's tokens go
/// to runs of slots (`run`; see [`Run`]) the warp stores them as transposed columns. Its own
/// first `d` tokens belong to the warp before's window where that one is a run of the same
/// shift (`prev`; a run of shift 0 ends at token `tw`), else to this warp. So a lane stores its
/// own token token by token where no run takes it: below `d` where `prev` is false, from `d` on
/// where `run` is `None`; every token is stored once. With [`STREAM_OWN`] and [`STREAM_SPLIT`]
/// the warp stores its own 32 tokens (`prev` false), as columns where `run` is a run.
#[derive(Clone, Copy)]
struct Window {
    run: Option<Run>,
    d: u32,
    prev: bool,
}

impl Window {
    /// A warp of a stream without columns: its own 32 tokens, token by token.
    const OWN: Window = Window {
        run: None,
        d: 0,
        prev: false,
    };
}

/// The warp's [`Window`] for mode `MODE` (`[s_prev, s, s_next]`: the slots of tokens `t - 32`,
/// `t` and, on lanes below 8, `t + 32`, -1 where no such token is; only `s` is read without
/// [`STREAM_SHIFT`]): its run when every virtual octet goes to consecutive slots of one
/// aligned octet of a block (see [`Run`]), so that the warp can store V as transposed columns,
/// else `None` (a sequence's start or end inside the window, a skipped or out-of-range slot,
/// padding); with [`STREAM_SHIFT`] whether the warp before's window is a run. The same on
/// every lane.
///
/// # Safety
/// Every lane of the warp calls it together (GPU); the slots as above.
#[inline(always)]
unsafe fn warp_window<const MODE: u8>(
    a: &TileArgs,
    t: u64,
    lane: u32,
    [s_prev, s, s_next]: [i64; 3],
    bs_shift: u32,
) -> Window {
    // Virtual lane `l` with slot `vs`, its piece's first virtual lane holding `first_base`:
    // the slot is at its place in an aligned octet of a valid block, the same octet as the
    // piece's first lane's. A token past the last has slot -1, which no run holds.
    let ok = |l: u32, vs: i64, first_base: i64| {
        vs >= 0
            && (vs & 7) as u32 == l & 7
            && vs & !7 == first_base
            && index::split_slot(vs as u64, a.block_size, bs_shift).0 < a.num_blocks
    };
    let tw = t - lane as u64;
    let (split, shift) = (MODE == STREAM_SPLIT, MODE == STREAM_SHIFT);
    // The rotation that puts the slot `x` of a window's first token at an octet's start (0
    // for the first warp's shifted window).
    let rotation = |first: u64, x: i64| {
        if shift && first == 0 {
            0
        } else {
            (8 - (x as u32 & 7)) & 7
        }
    };
    // The first virtual lane of virtual lane `l`'s piece (split: the last octet's two pieces).
    let first = |l: u32, d: u32| if split && l + d >= 32 { 32 - d } else { l & !7 };
    let run = |all: bool, d: u32, base: i64, pa: i64, pb: i64| {
        all.then_some(Run {
            d,
            base: base as u64,
            pa: pa as u64,
            pb: pb as u64,
            split,
        })
    };
    #[cfg(target_arch = "nvptx64")]
    {
        // SAFETY: every lane of the warp is here (caller).
        let sh = |x: i64, src: u32| unsafe {
            (crate::warp::shfl_idx(x as u32, src) as u64
                | (crate::warp::shfl_idx((x as u64 >> 32) as u32, src) as u64) << 32)
                as i64
        };
        // SAFETY: as above.
        let low = |x: i64| unsafe { crate::warp::shfl_idx(x as u32, 0) as i64 };
        // Whether the window rotated by `d` over the slots `lo` (its warp's tokens) and `hi`
        // (shifted: the next warp's, on lanes below `d`) is a run; the base of this lane's
        // virtual octet.
        let window = |d: u32, lo: i64, hi: i64| {
            let vs = if MODE == STREAM_OWN {
                lo
            } else {
                sh(if shift && lane < d { hi } else { lo }, (lane + d) & 31)
            };
            let base = vs & !7;
            let fb = sh(base, first(lane, d));
            // SAFETY: as above.
            (unsafe { cta::ballot(ok(lane, vs, fb)) } == u32::MAX, base)
        };
        let d = if MODE == STREAM_OWN {
            0
        } else {
            rotation(tw, low(s))
        };
        let (all, base) = window(d, s, s_next);
        let (pa, pb) = if split {
            (sh(base, 24), sh(base, 31))
        } else {
            (0, 0)
        };
        // The warp before's window holds this warp's first `d` tokens only with the same
        // shift (a run shifted by `dp > 0` ends at token `tw + dp`; one of `dp = 0` at `tw`).
        // `dp` and `d` are the same on every lane: the ballot runs on all or none.
        let prev = shift && tw >= STREAM_LANES && {
            let dp = rotation(tw - STREAM_LANES, low(s_prev));
            dp == d && window(dp, s_prev, s).0
        };
        Window {
            run: run(all, d, base, pa, pb),
            d,
            prev,
        }
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        let _ = (s_prev, s, s_next);
        // The slot of token `tw + j` (j may be negative: the warp before's).
        let slot = |j: i64| {
            let tj = tw as i64 + j;
            if tj >= 0 && (tj as u64) < a.num_tokens {
                // SAFETY: tj < num_tokens: inside the slot array.
                unsafe { tile_slot(a, tj as u64) }
            } else {
                -1
            }
        };
        // The window rotated by `d` from token `tw + from`: a run; this lane's octet's base.
        let vslot = |from: i64, d: u32, l: u32| {
            let j = if split { (l + d) & 31 } else { l + d };
            slot(from + j as i64)
        };
        let window = |from: i64, d: u32| {
            let mut all = true;
            let mut l = 0;
            while l < 32 {
                all &= ok(l, vslot(from, d, l), vslot(from, d, first(l, d)) & !7);
                l += 1;
            }
            (all, vslot(from, d, lane) & !7)
        };
        let d = if MODE == STREAM_OWN {
            0
        } else {
            rotation(tw, slot(0))
        };
        let (all, base) = window(0, d);
        let (pa, pb) = (vslot(0, d, 24) & !7, vslot(0, d, 31) & !7);
        let prev = shift && tw >= STREAM_LANES && {
            let dp = rotation(tw - STREAM_LANES, slot(-32));
            dp == d && window(-32, dp).0
        };
        Window {
            run: run(all, d, base, pa, pb),
            d,
            prev,
        }
    }
}

/// Column `lane & 7` of the V rows of [`stream_body`]'s virtual octet (virtual lanes `lane &
/// !7 ..` of `run`'s rotation `d`) in one group: element `lane & 7` of the group of each of the
/// octet's eight tokens, the `j`-th virtual token in the `j`-th 2-byte half-word. The GPU
/// transposes each octet's rows (`row` is this lane's; in a rotated warp, `run.d > 0`, the
/// virtual lane's, exchanged first): there it serves the copying streams (the quantizing
/// stream rotates its quantized rows in [`octet_column_fp8`]). The CPU reads the column of
/// virtual lanes, the warp's first token's group lying at source offset `at_w`.
///
/// # Safety
/// Every lane of the warp calls it together (GPU); the warp's 32 tokens exist and the group
/// lies in the source.
#[inline(always)]
unsafe fn octet_column(a: &TileArgs, row: &Row, lane: u32, run: &Run, at_w: u64) -> [u32; 4] {
    #[cfg(target_arch = "nvptx64")]
    {
        let _ = (a, at_w);
        let mut w = [row[0], row[1], row[2], row[3]];
        if run.d != 0 {
            // The virtual lane's row.
            let src = run.source(lane);
            // SAFETY: every lane of the warp is here (`run` is the same on every lane).
            w = w.map(|x| unsafe { crate::warp::shfl_idx(x, src) });
        }
        // SAFETY: forwarded.
        unsafe { crate::warp::transpose(lane & 7, w) }
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        let _ = row;
        let mut col = [0u32; 4];
        let mut j = 0;
        while j < 8 {
            let tok = run.token((lane & !7) + j as u32);
            let off = at_w + tok * a.src_token_stride + 2 * (lane & 7) as u64;
            // SAFETY: the warp's tok-th token, element lane & 7 of the group: inside the
            // validated source.
            let x = unsafe { core::ptr::read(a.src_v.add(off as usize) as *const u16) };
            col[j / 2] |= (x as u32) << (16 * (j % 2));
            j += 1;
        }
        col
    }
}

/// [`octet_column`] quantized by conversion `C` with the scale `div`, as eight bytes (the
/// `j`-th virtual token's in byte `j`). The GPU quantizes this lane's row first, then rotates
/// and transposes bytes (two words a lane, where the 2-byte column takes four); the CPU
/// quantizes the column [`octet_column`] reads. Both give the same bytes: the conversion
/// takes each element alone, with one scale for the warp's head.
///
/// # Safety
/// As [`octet_column`]; every element of the warp's group lies on the division's fast path
/// ([`convert::fast`]).
#[inline(always)]
unsafe fn octet_column_fp8<const C: u32>(
    a: &TileArgs,
    row: &Row,
    lane: u32,
    run: &Run,
    at_w: u64,
    div: &Divider,
) -> [u32; 2] {
    #[cfg(target_arch = "nvptx64")]
    {
        let _ = (a, at_w);
        let q = convert::unit_fast::<C>(&raw_of(row), div);
        // The virtual lane's row (this stream always reads its lanes rotated, `run.d` maybe 0).
        let src = run.source(lane);
        // SAFETY: every lane of the warp is here.
        let w = unsafe { [q as u32, (q >> 32) as u32].map(|x| crate::warp::shfl_idx(x, src)) };
        // SAFETY: forwarded.
        unsafe { crate::warp::transpose_bytes(lane & 7, w) }
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        // SAFETY: forwarded.
        let col = unsafe { octet_column(a, row, lane, run, at_w) };
        let q = convert::unit_fast::<C>(&[V16::from_array(col), V16::splat(0)], div);
        [q as u32, (q >> 32) as u32]
    }
}

/// Where a lane of [`stream_body`]'s column path stores V ([`store_column`]): for the item's
/// first group `g0`, the address of its first store (in its own virtual octet, or in the
/// first piece's octet of a split last octet: every lane finds it the same way) and, in a
/// rotated warp, the second piece's octet; and the step from one group to the next. Computed
/// once an item, so that each group's addresses are one addition from the last (the slots'
/// splits and strides are not worked out again for every group).
#[derive(Clone, Copy)]
struct Columns {
    /// Element `8 g0 + (lane & 7)` of the first store's octet.
    pa: *mut u8,
    /// The same element of the second piece's octet (`run.pb`) where the warp rotates, else
    /// `pa`.
    pb: *mut u8,
    /// Bytes from a group's column to the next group's (eight pieces).
    step: u64,
}

impl Columns {
    /// The targets of lane `lane` for the item's first group `g0` of head `head`.
    ///
    /// # Safety
    /// `run` is the warp's ([`warp_window`]): every slot it names is valid; `head < heads`, `g0 <
    /// groups`.
    #[inline(always)]
    unsafe fn new(
        v: &TilePart,
        a: &TileArgs,
        run: &Run,
        bs_shift: u32,
        lane: u32,
        head: u64,
        g0: u64,
    ) -> Columns {
        let at = |slot: u64| {
            let (block, offset) = index::split_slot(slot, a.block_size, bs_shift);
            let at = block * v.block
                + head * v.head
                + (8 * g0 + (lane & 7) as u64) * v.piece_stride
                + offset * v.token;
            // SAFETY: a valid slot's element of the head (the caller's contract).
            unsafe { v.dst.add(at as usize) }
        };
        let pa = at(if run.splits(lane) { run.pa } else { run.base });
        let pb = if run.split && run.d != 0 {
            at(run.pb)
        } else {
            pa
        };
        Columns {
            pa,
            pb,
            step: 8 * v.piece_stride,
        }
    }
}

/// Stores column `col` of [`stream_body`]'s virtual octet ([`octet_column`], quantized into
/// its first two words for 1-byte caches: `E`) for the item's group `g0 + u` (`c` from
/// [`Columns::new`] for `g0`): element `8 (g0 + u) + (lane & 7)` of the octet's eight slots,
/// one store of `8 E` bytes from `run.base`; for a lane of a split last octet (rotated warps),
/// the first `8 - d` elements from `run.pa` and the last `d` up to the end of `run.pb`'s
/// octet, each piece in at most three stores (of 4, 2 and 1 bytes for 1-byte caches, of 8, 4
/// and 2 for 2-byte ones), aligned to their sizes.
///
/// # Safety
/// `c` is this lane's [`Columns`] for the warp's `run`, `g0 + u < groups`; the value cache's
/// columns are aligned to `8 E` bytes and a slot's element is the byte after the previous
/// slot's (`runs`).
#[inline(always)]
unsafe fn store_column<const E: usize>(c: &Columns, u: u64, run: &Run, lane: u32, col: [u32; 4]) {
    // SAFETY (all stores): valid slots' elements of group g0 + u < groups (`c` names those
    // of g0, a group's column lies `step` bytes after the previous group's), each store inside
    // its octet's eight elements, aligned to its size (a whole column from an aligned octet's
    // first slot; a split column's pieces as `split_column` stores them).
    unsafe {
        let pa = c.pa.add((u * c.step) as usize);
        let pb = c.pb.add((u * c.step) as usize);
        if E == 2 {
            if !run.splits(lane) {
                core::ptr::write(pa as *mut V16, V16::from_array(col));
                return;
            }
            let x = col[0] as u128
                | (col[1] as u128) << 32
                | (col[2] as u128) << 64
                | (col[3] as u128) << 96;
            split_column(pa, pb, x, 2 * (8 - run.d as usize), 2 * run.d as usize, 2);
            return;
        }
        let x = col[0] as u64 | (col[1] as u64) << 32;
        if !run.splits(lane) {
            core::ptr::write(pa as *mut u64, x);
        } else {
            split_column(pa, pb, x, 8 - run.d as usize, run.d as usize, 1);
        }
    }
}

/// An octet's column of [`store_column`] as one integer (`u64` for 1-byte elements, `u128`
/// for 2-byte ones), the `j`-th virtual token's element in its `j`-th `E` bytes.
trait ColumnBits: Copy + core::ops::Shr<usize, Output = Self> {
    /// The low eight bytes.
    fn low(self) -> u64;
}

impl ColumnBits for u64 {
    #[inline(always)]
    fn low(self) -> u64 {
        self
    }
}

impl ColumnBits for u128 {
    #[inline(always)]
    fn low(self) -> u64 {
        self as u64
    }
}

/// Stores a split column `x` of elements of `e` bytes (see [`store_column`]): its first `n`
/// bytes from `pa` (the first piece's octet start) in stores of decreasing sizes (`4e`, `2e`,
/// `e` where `n` holds them), its last `d` bytes up to the end of `pb`'s octet in stores of
/// increasing sizes. Each store lies inside its octet, aligned to its size where `pa` and
/// `pb` are aligned to `8e`.
///
/// # Safety
/// `n + d == 8e`, both multiples of `e`; `pa .. pa + n` and `pb + n .. pb + 8e` writable,
/// `pa` and `pb` aligned to `8e` bytes.
#[inline(always)]
unsafe fn split_column<X: ColumnBits>(
    pa: *mut u8,
    pb: *mut u8,
    x: X,
    n: usize,
    d: usize,
    e: usize,
) {
    // Writes the low `size` bytes of `v` at `p` (a constant size after inlining).
    // SAFETY (both closures' stores): as the caller promised, aligned to `size`.
    let put = |p: *mut u8, v: u64, size: usize| unsafe {
        match size {
            1 => core::ptr::write(p, v as u8),
            2 => core::ptr::write(p as *mut u16, v as u16),
            4 => core::ptr::write(p as *mut u32, v as u32),
            _ => core::ptr::write(p as *mut u64, v),
        }
    };
    // Decreasing sizes from the first piece's octet start: a store of `size` bytes at the
    // bytes of `n` above it (SAFETY: inside `pa .. pa + n`).
    let dec = |size: usize| {
        if n & size != 0 {
            let o = n & !(2 * size - 1);
            put(unsafe { pa.add(o) }, (x >> (8 * o)).low(), size);
        }
    };
    dec(4 * e);
    dec(2 * e);
    dec(e);
    // Increasing sizes up to the end of the second piece's octet (SAFETY: inside `pb + n ..
    // pb + 8e`).
    let mut o = n;
    let mut inc = |size: usize| {
        if d & size != 0 {
            put(unsafe { pb.add(o) }, (x >> (8 * o)).low(), size);
            o += size;
        }
    };
    inc(e);
    inc(2 * e);
    inc(4 * e);
}

/// Tokens a warp of [`update_stream`] takes together, one a lane (four octets of eight).
pub const STREAM_LANES: u64 = 32;
/// Consecutive 8-element groups of one (token, head) a lane of [`update_stream`] loads before
/// it stores any (K and V each).
pub const STREAM_UNITS: u64 = 4;
const _: () = assert!(STREAM_UNITS == 4, "update_stream unrolls four groups");

/// [`update_tiles`] for caches of 4-byte elements.
///
/// # Safety
/// As [`update_tiles`].
#[inline(always)]
pub unsafe fn update_tiles_wide(a: &TileArgs, g: Group) {
    pdl::ready::<TileArgs>();
    // SAFETY: forwarded.
    unsafe { tiles_body::<4>(a, g) }
}

/// Tokens of one `update_pages` work item: a whole page of 16 slots, or 16 aligned slots of
/// a larger page (`a.tile`).
pub const PAGE_TOKENS: u64 = 16;

/// Tokens of one `update_pages_fp8` work item on pages of a multiple of 32 slots (`a.tile`;
/// [`PAGE_TOKENS`] on 16-token pages): an fp8 value line of 32 tokens fills a 32-byte sector,
/// where one of 16 fills half of one.
pub const PAGE_TOKENS_FP8: u64 = 32;

/// [`update_tiles`] at prefill sizes into v0 caches of 2-byte elements (bf16, f16, copied)
/// whose pages the tokens fill (`a.tile == 16`): one work item is a window of [`PAGE_TOKENS`]
/// batch tokens of one part and `a.subs` heads (so that an item has [`PAGE_UNITS`] units per
/// thread), done by a whole CTA of [`cta::THREADS`] threads in two phases ([`crate::cta`]).
/// A *run* is sixteen tokens whose slots are sixteen consecutive slots from a valid multiple
/// of sixteen (one block's aligned sixteen): it belongs to the window it starts in, at any
/// token of it ([`index::window_runs`]), so the runs of every sequence of a prefill batch,
/// wherever it starts in the batch and in its first page, take the fast path. Phase one loads
/// the run's head vectors (coalesced; a thread issues all its units' loads before it uses any)
/// and writes them into the CTA's tile in the cache's order: V transposed (one line of sixteen
/// tokens per element), K as sixteen 16-byte pieces per piece index. Phase two stores the tile
/// as 16-byte chunks, consecutive threads at consecutive addresses, so a warp's stores fill
/// whole 128-byte lines (a page's head in the v0 layout is one contiguous span when the page
/// holds sixteen slots). The window's tokens outside runs (a sequence's partial pages,
/// padding, out-of-range slots) go token by token in phase two, with [`update_slots`]'
/// semantics. Where the runs around the window lie, warp 0 finds during the previous item
/// (its slots fetched into shared memory at the end of phase one, searched by ballots at the
/// end of phase two) and leaves in the CTA's note; a CTA's first item searches with every
/// warp. On the H100 (BENCHMARKS.md, session 18) that took a prefill batch of sequences of
/// 1,024 tokens on average from 21% to 72% of the copy ceiling (16-token pages), and cost a
/// single sequence on fresh pages 3.3 points at 16,384 tokens (80.4 to 77%) and 13 at 4,096.
///
/// On the H100 (BENCHMARKS.md, session 11) it wrote bf16 v0 prefill at 79% of the copy ceiling
/// at 16,384 tokens (88% at 65,536) against the tiles' 61% (63%); with two units per thread
/// and an 8 KiB tile, 77% (84%). Quantizing updates into fp8 caches run the same phases
/// (`update_pages_fp8`).
///
/// The grid does not signal its programmatic dependents early ([`pdl::prologue`] with
/// `early` false): they are scheduled as its CTAs exit. Back to back under PDL that took it
/// from 89% to 94–95% at 4,096 tokens, 79% to 80.5% at 16,384 and 77% to 79% on 128-token
/// pages (H100, BENCHMARKS.md, session 16).
///
/// # Safety
/// As [`update_tiles`], and: `a.elem == 2` with no conversion; both parts' layouts are pieced
/// with pieces of one element at consecutive slots (V) or of 8 elements at consecutive 16-byte
/// slots (K); blocks hold a multiple of [`PAGE_TOKENS`] slots; block, head and piece strides
/// and the caches are 16-byte aligned; `src_vec`; `a.subs >= 1` heads per item hold at most
/// `PAGE_UNITS * cta::THREADS` units (`8 * groups` each), so their tile, 32 bytes a unit, fits
/// [`cta::BYTES`]; launched with [`cta::THREADS`] threads per CTA.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn update_pages(a: &TileArgs, _g: Group) {
    pdl::prologue(false);
    // SAFETY: forwarded.
    unsafe { cta::run(&Pages::<2, { convert::NONE }, PAGE_TOKENS>(a)) }
}

/// [`update_pages`] for quantizing updates into fp8 caches (bf16 or f16 sources, `e4m3` or
/// `e5m2` caches, scales per tensor or per head): the same two phases, compiled once per
/// conversion code (dispatched here, once), with a unit of 32 tile bytes being four tokens × 8
/// elements (V: a word of each of eight transposed lines) or two tokens × 16 elements (K: two
/// 16-byte pieces), loaded as four 16-byte source groups and quantized in phase one. An item
/// is sixteen tokens (`update_pages_fp8_32`: 32) of as many heads as make
/// [`PAGE_UNITS_FP8`] units a thread. Phase one's
/// vote also carries the division's fast path ([`convert::fast`]): an item holding an element
/// off it (an infinity, a NaN, a magnitude past 2^80) goes token by token in phase two, as
/// tokens outside runs do, so the loop holds one copy of the conversion.
///
/// # Safety
/// As [`update_pages`], except: `a.elem == 1`, `a.convert` converts 2-byte source elements
/// (another code writes nothing), K's pieces are of 16 elements, and `a.subs` heads hold at
/// most `PAGE_UNITS_FP8 * cta::THREADS` units (`4 * groups` each); a converting update's
/// scales hold one f32 (or one per head) per part.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn update_pages_fp8(a: &TileArgs, _g: Group) {
    // SAFETY: forwarded.
    unsafe { pages_fp8::<PAGE_TOKENS>(a) }
}

/// [`update_pages_fp8`] with items of [`PAGE_TOKENS_FP8`] tokens (`a.tile`), on pages of a
/// multiple of 32 slots. Its own entry: compiled into one kernel with the sixteen-token body,
/// the pair needed more registers than either alone (176 B of spills at five CTAs on sm_90,
/// against 8 B and 24 B apart).
///
/// # Safety
/// As [`update_pages_fp8`], with `a.tile == PAGE_TOKENS_FP8` and blocks of a multiple of 32
/// slots.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn update_pages_fp8_32(a: &TileArgs, _g: Group) {
    // SAFETY: forwarded.
    unsafe { pages_fp8::<PAGE_TOKENS_FP8>(a) }
}

/// The fp8 pages entries' body for items of `T` tokens, dispatched once on the conversion.
///
/// # Safety
/// As [`update_pages_fp8`], with `a.tile == T`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn pages_fp8<const T: u64>(a: &TileArgs) {
    pdl::prologue(false);
    // SAFETY: forwarded. `C` is a constant in each arm.
    unsafe {
        convert::by_code!(a.convert, C => {
            if convert::src_bytes(C) == 2 {
                cta::run(&Pages::<1, C, T>(a))
            }
        })
    }
}

/// `update_pages` (2-byte caches) or `update_pages_fp8` (1-byte caches) on the CPU, for a grid
/// of `grid` CTAs ([`cta::emulate`]).
///
/// # Safety
/// As those entries, on host memory.
#[cfg(not(target_arch = "nvptx64"))]
pub unsafe fn emulate_pages(a: &TileArgs, grid: u32) {
    // SAFETY: forwarded. `C` is a constant in each arm.
    unsafe {
        if a.elem == 1 {
            convert::by_code!(a.convert, C => {
                if convert::src_bytes(C) == 2 {
                    if a.tile as u64 == PAGE_TOKENS_FP8 {
                        cta::emulate(&Pages::<1, C, PAGE_TOKENS_FP8>(a), grid)
                    } else {
                        cta::emulate(&Pages::<1, C, PAGE_TOKENS>(a), grid)
                    }
                }
            })
        } else {
            cta::emulate(&Pages::<2, { convert::NONE }, PAGE_TOKENS>(a), grid)
        }
    }
}

/// The slot of window position `t` and of its predecessor (`i64::MIN` for the first
/// position, which has none) from the fetch cells `cell` and `cell + 8`: what the GPU and CPU
/// forms of `Pages::runs_fetched` read for each position. A macro, not a method: as a
/// function it changed the pages entries' PTX. Expands to `unsafe` calls: the caller's
/// `unsafe` block covers them (the cells were fetched and their copies are complete).
macro_rules! cell_pair {
    ($p:expr, $tile:expr, $cell:expr, $t:expr) => {{
        let cell = $cell;
        (
            $p.cell_slot($tile, cell),
            if $t > 0 {
                $p.cell_slot($tile, cell + 8)
            } else {
                i64::MIN
            },
        )
    }};
}

/// The runs around window `$w0 .. $w0 + T` of a `Pages` body `$p` on the GPU
/// ([`index::window_runs`]): lane `l` of the calling warp (thread `$tid`) takes positions `l`,
/// `32 + l`, `64 + l`, a round at a time: `$pair`, with round `$k` and token `$t` bound, gives
/// the position's slot and its predecessor's, then the round's ballots gather the masks. A
/// macro, not a function taking `$pair` as a closure, so that it expands in place: with a
/// closure, the search's PTX in the pages entries changed (session 18). Only inside an
/// `unsafe fn` whose every lane of the warp calls it together.
#[cfg(target_arch = "nvptx64")]
macro_rules! window_ballots {
    ($p:ident, $w0:expr, $tid:expr, |$k:ident, $t:ident| $pair:block) => {{
        let limit = $p.0.num_blocks * $p.0.block_size;
        let (mut aligned, mut follows) = (0u128, 0u128);
        unroll4!($k => {
            if $k < 3 && 32 * ($k as u64) < 3 * T {
                let mut bits = (false, false);
                if let Some($t) = $p.run_token($w0, 32 * $k as u64 + $tid % 32) {
                    let (s, before) = $pair;
                    bits = Self::run_bits(s, before, limit);
                }
                // SAFETY: every lane of the warp is here (caller).
                let (x, y) = unsafe { (cta::ballot(bits.0), cta::ballot(bits.1)) };
                aligned |= (x as u128) << (32 * $k);
                follows |= (y as u128) << (32 * $k);
            }
        });
        Around::of(index::window_runs::<T>(aligned, follows))
    }};
}

/// `update_pages`' phases for caches of `E`-byte elements (2: copied; 1: quantized by
/// conversion `C`), items of `T` tokens ([`PAGE_TOKENS`]; fp8 also [`PAGE_TOKENS_FP8`]).
struct Pages<'a, const E: usize, const C: u32, const T: u64>(&'a TileArgs);

/// Units (two tokens × 8 elements of one head) a thread loads per item of
/// `update_pages`, all issued before any is used: the host sizes items (heads per item) so
/// that they have at most `PAGE_UNITS * cta::THREADS` units.
pub const PAGE_UNITS: u64 = 4;
const _: () = assert!(PAGE_UNITS == 4, "Pages::first unrolls four units");

/// Units (32 bytes of the tile: four tokens × 8 elements of V, two tokens × 16 elements of K,
/// each loaded as four 16-byte source groups) a thread loads per item of `update_pages_fp8`,
/// all issued before any is used; items have at most `PAGE_UNITS_FP8 * cta::THREADS` units.
pub const PAGE_UNITS_FP8: u64 = 2;
const _: () = assert!(
    PAGE_UNITS_FP8 <= 4,
    "Pages::first_quantized unrolls four units"
);
/// [`PAGE_UNITS_FP8`] as an index bound.
const FP8_UNITS: usize = PAGE_UNITS_FP8 as usize;

/// Items whose run the emulated pages updates stored whole (in this process, all threads):
/// lets a test see that runs take the fast path, which the caches alone cannot show.
#[cfg(not(target_arch = "nvptx64"))]
pub static PAGE_RUNS_STORED: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// What a thread of `update_pages_fp8` loads for an item ([`Pages::load_quantized`]): its
/// units' source groups as loaded.
#[derive(Clone, Copy)]
struct PageLoads {
    raw: [[convert::Raw; 4]; FP8_UNITS],
}

/// What phase one of a `Pages` item tells its phase two: where the runs around the item's
/// window lie ([`index::window_runs`]), `covered` in the low 16 bits, `start` above (one
/// register across the barrier).
#[derive(Clone, Copy, Default)]
struct Around(u32);

impl Around {
    /// The window's tokens `0..covered` belong to the previous window's run.
    #[inline(always)]
    fn covered(self) -> u64 {
        (self.0 & 0xFFFF) as u64
    }

    /// Where the window's own run starts (`T` when it holds none).
    #[inline(always)]
    fn start(self) -> u64 {
        (self.0 >> 16) as u64
    }

    /// `(covered, start)` as [`index::window_runs`] returns them.
    #[inline(always)]
    fn of((covered, start): (u64, u64)) -> Around {
        Around(covered as u32 | (start as u32) << 16)
    }
}

/// What a thread of a `Pages` body keeps from phase to phase and item to item.
#[derive(Clone, Copy, Default)]
struct PagesCarry {
    /// The runs around the current item's window.
    around: Around,
    /// Whether the CTA's note `note` holds the runs around the current item's window (left by
    /// warp 0 in the previous item's phase two; not for a CTA's first item).
    ahead: bool,
    /// Which of the CTA's two notes the current item reads (the other takes the next item's).
    note: u32,
}

impl<const E: usize, const C: u32, const T: u64> Pages<'_, E, C, T> {
    /// Tokens a word of a transposed line holds.
    const WORD_TOKENS: u64 = 4 / E as u64;
    /// Word columns of a line (units per group of a head).
    const COLS: u64 = T / Self::WORD_TOKENS;
    /// Bytes of a transposed line (an item's tokens' element).
    const LINE: u64 = T * E as u64;
    /// Token pairs of an item: a K unit of an fp8 item is tokens `q` and `q + HALF`.
    const HALF: u64 = T / 2;
    /// A transposed line `d` sits at line `d ^ ((d >> 3) & SWIZZLE)` of its head's part of the
    /// tile, so the eight lines a thread writes (`8g .. 8g + 8`) and those of the threads
    /// beside it fall in different banks (`128 / LINE - 1`: four lines span the banks).
    const SWIZZLE: u64 = 128 / Self::LINE - 1;

    /// Heads per item (`a.subs` in this entry).
    #[inline(always)]
    fn heads_per_item(&self) -> u64 {
        self.0.subs as u64
    }

    /// Item `item` as (first token, part, first head, heads): head groups vary fastest, so
    /// the CTAs at work at once read neighbouring source bytes.
    #[inline(always)]
    fn split(&self, item: u64) -> (u64, u64, u64, u64) {
        let a = self.0;
        let parts = if a.src_v.is_null() { 1 } else { 2 };
        let hp = self.heads_per_item();
        let mut ix = [0u64; 2];
        let o = index::split_n(item, [parts, a.heads.div_ceil(hp)], &mut ix);
        let h0 = ix[1] * hp;
        (o * T, ix[0], h0, hp.min(a.heads - h0))
    }

    /// Bytes of one head's `T` tokens in the tile.
    #[inline(always)]
    fn head_bytes(&self) -> u64 {
        T * 8 * self.0.groups * E as u64
    }

    /// Bytes of a source element: the conversion's source type, or the cache's.
    const SRC_BYTES: u64 = if C == convert::NONE {
        E as u64
    } else {
        convert::src_bytes(C)
    };

    /// The source group `g` of token `t` of `head` in part `part`.
    ///
    /// # Safety
    /// `t < num_tokens`, `head < heads`, `g < groups`.
    #[inline(always)]
    unsafe fn src(&self, part: u64, t: u64, head: u64, g: u64) -> *const u8 {
        // SAFETY: forwarded.
        unsafe { tile_src(self.0, part, t, head, g * 8, Self::SRC_BYTES) }
    }

    /// Phase one's loads for a copy of 2-byte elements: thread `tid` takes units `tid, tid +
    /// THREADS, ..` (`PAGE_UNITS` of them) of two tokens × 8 elements, all issued before any
    /// is used, for [`Pages::write_copy`].
    ///
    /// # Safety
    /// As [`cta::Phases::first`], for tokens `t0 .. t0 + T <= num_tokens` of heads `h0 ..
    /// h0 + hn` of part `part`.
    #[inline(always)]
    unsafe fn load_copy(
        &self,
        t0: u64,
        part: u64,
        h0: u64,
        hn: u64,
        tid: u64,
        rows: &mut [[Row; 2]; PAGE_UNITS as usize],
    ) {
        let k = Self::WORD_TOKENS;
        let per_head = Self::COLS * self.0.groups;
        // Four units (`PAGE_UNITS`), unrolled so that their rows stay in registers.
        unroll4!(v => {
            let u = tid + v as u64 * cta::THREADS as u64;
            let (hh, r) = (u / per_head, u % per_head);
            let (q, g) = (r % Self::COLS, r / Self::COLS);
            if hh < hn {
                let head = h0 + hh;
                unroll2!(i => {
                    // SAFETY: token t0 + q k + i < t0 + T <= num_tokens, head < heads,
                    // g < groups; sources are vector-aligned (`src_vec`).
                    rows[v][i] = unsafe {
                        let t = t0 + q * k + i as u64;
                        tile::load_copy::<2>(self.src(part, t, head, g), true, 1)
                    };
                });
            }
        });
    }

    /// Phase one's tile writes for a copy of 2-byte elements, of the rows
    /// [`Pages::load_copy`] loaded: V transposed (one line of the item's tokens per
    /// element), K as 16-byte pieces.
    ///
    /// # Safety
    /// As [`cta::Phases::first`], for an item of `hn` heads of part `part`.
    #[inline(always)]
    unsafe fn write_copy(
        &self,
        part: u64,
        hn: u64,
        tid: u64,
        tile: &cta::Tile,
        rows: &[[Row; 2]; PAGE_UNITS as usize],
    ) {
        let p = TilePart::of(self.0, part);
        let k = Self::WORD_TOKENS;
        let per_head = Self::COLS * self.0.groups;
        unroll4!(v => {
            let u = tid + v as u64 * cta::THREADS as u64;
            let (hh, r) = (u / per_head, u % per_head);
            let (q, g) = (r % Self::COLS, r / Self::COLS);
            if hh < hn {
                let base = hh * self.head_bytes();
                if p.piece == 1 {
                    // V: element 8g + j of the k tokens is one word of line 8g + j.
                    unroll8!(j => {
                        let d = g * 8 + j as u64;
                        let line = d ^ (g & Self::SWIZZLE);
                        let off = base + line * Self::LINE + q * 4;
                        // SAFETY: off + 4 <= hn * head_bytes <= BYTES (host).
                        unsafe { tile.put32(off as u32, tile::pair_column(&rows[v], j)) };
                    });
                } else {
                    // K: group g is piece g (16 bytes). Token t of piece g sits at slot
                    // t ^ (g & 3) of the piece's line (banks again).
                    unroll2!(i => {
                        let t = (q * k + i as u64) ^ (g & 3);
                        let off = (base + (g * T + t) * 16) as u32;
                        let r = &rows[v][i];
                        // SAFETY: inside the head's part of the tile, aligned.
                        unsafe { tile.put128(off, [r[0], r[1], r[2], r[3]]) };
                    });
                }
            }
        });
    }

    /// The loads of an fp8 item (`E == 1`, `C` a conversion of 2-byte source elements) into
    /// `own`, for [`Pages::first_quantized`], all issued before any is used: thread `tid`
    /// takes units `tid, tid + THREADS, ..` (`PAGE_UNITS_FP8` of them), four 16-byte source
    /// groups each: a V unit is four tokens (`4q .. 4q + 4`) × 8 elements (group `g`), a K
    /// unit two tokens (`q` and `q + T / 2`) × 16 elements (piece `pc`: groups `2pc`,
    /// `2pc + 1`).
    ///
    /// # Safety
    /// As [`cta::Phases::first`], for tokens `t0 .. t0 + T <= num_tokens` of heads `h0 ..
    /// h0 + hn` of part `part`.
    #[inline(always)]
    unsafe fn load_quantized(
        &self,
        t0: u64,
        part: u64,
        h0: u64,
        hn: u64,
        tid: u64,
        own: &mut PageLoads,
    ) {
        let a = self.0;
        let per_head = Self::COLS * a.groups;
        unroll4!(v => {
            if v < FP8_UNITS {
                let u = tid + v as u64 * cta::THREADS as u64;
                let (hh, r) = (u / per_head, u % per_head);
                if hh < hn {
                    let head = h0 + hh;
                    unroll4!(i => {
                        let (t, g) = if part == 0 {
                            (r % Self::HALF + Self::HALF * (i as u64 / 2), 2 * (r / Self::HALF) + i as u64 % 2)
                        } else {
                            (4 * (r % Self::COLS) + i as u64, r / Self::COLS)
                        };
                        // SAFETY: t0 + t < t0 + T <= num_tokens, head < heads, g < groups
                        // (groups is even: pieces of 16); sources are vector-aligned.
                        own.raw[v][i][0] = unsafe {
                            core::ptr::read(self.src(part, t0 + t, head, g) as *const V16)
                        };
                    });
                }
            }
        });
    }

    /// Phase one's quantization and tile writes for an fp8 cache ([`cta::Phases::first`] past
    /// the vote), from what [`Pages::load_quantized`] loaded: each unit's 32 tile bytes,
    /// V as word `j` of line `8g + j`, column `q` ([`tile::transpose4`]), K as two 16-byte
    /// pieces. Returns whether every element it converted lies on the division's fast path
    /// (else what it wrote is not used: the item goes token by token).
    ///
    /// # Safety
    /// As [`cta::Phases::first`], for an item `(t0, part, h0, hn)` with `t0 + T <= num_tokens`
    /// whose loads `own` holds.
    #[inline(always)]
    unsafe fn first_quantized(
        &self,
        part: u64,
        h0: u64,
        hn: u64,
        tid: u64,
        tile: &cta::Tile,
        own: &PageLoads,
    ) -> bool {
        let a = self.0;
        let per_head = Self::COLS * a.groups;
        let raw = &own.raw;
        let mut fast = true;
        unroll4!(v => {
            let u = tid + v as u64 * cta::THREADS as u64;
            let (hh, r) = (u / per_head, u % per_head);
            if v < FP8_UNITS && hh < hn {
                let div = tile_scale(a, C, part, h0 + hh);
                fast &= convert::fast::<C, 4>(&raw[v], &div);
                let mut q = [0u64; 4];
                unroll4!(i => {
                    q[i] = convert::unit_fast::<C>(&raw[v][i], &div);
                });
                let base = hh * self.head_bytes();
                if part == 0 {
                    // Token t of piece pc sits at slot t ^ (pc & 3) of the piece's line, as for
                    // 2-byte caches; a quarter warp's eight stores fill eight different slots.
                    let (qq, pc) = (r % Self::HALF, r / Self::HALF);
                    unroll2!(i => {
                        let t = (qq + Self::HALF * i as u64) ^ (pc & 3);
                        let off = (base + (pc * T + t) * 16) as u32;
                        let (lo, hi) = (q[2 * i], q[2 * i + 1]);
                        let w = [lo as u32, (lo >> 32) as u32, hi as u32, (hi >> 32) as u32];
                        // SAFETY: inside the head's part of the tile, aligned.
                        unsafe { tile.put128(off, w) };
                    });
                } else {
                    let (qq, g) = (r % Self::COLS, r / Self::COLS);
                    let cols = tile::transpose4(&q);
                    unroll8!(j => {
                        let d = g * 8 + j as u64;
                        let line = d ^ (g & Self::SWIZZLE);
                        let off = base + line * Self::LINE + qq * 4;
                        // SAFETY: off + 4 <= hn * head_bytes <= BYTES (host).
                        unsafe { tile.put32(off as u32, cols[j]) };
                    });
                }
            }
        });
        fast
    }
}

impl<const E: usize, const C: u32, const T: u64> Pages<'_, E, C, T> {
    /// The token at position `p` of the `3 * T` around window `w0 .. w0 + T` (token
    /// `w0 - T + p`), when it is in the batch.
    #[inline(always)]
    fn run_token(&self, w0: u64, p: u64) -> Option<u64> {
        let t = (w0 + p).wrapping_sub(T);
        if p >= 3 * T || w0 + p < T || t >= self.0.num_tokens {
            None
        } else {
            Some(t)
        }
    }

    /// The bits of the masks of [`index::window_runs`] for a token in the batch with slot `s`
    /// (its predecessor's `before`; `i64::MIN` for the first token): whether `s` is valid and
    /// a multiple of `T` (`aligned`; `limit` is the cache's slot count), and whether it is
    /// `before + 1` (`follows`).
    #[inline(always)]
    fn run_bits(s: i64, before: i64, limit: u64) -> (bool, bool) {
        let aligned = s >= 0 && (s as u64) < limit && (s as u64).is_multiple_of(T);
        (aligned, s == before.wrapping_add(1))
    }

    /// Token `t`'s slot and its predecessor's (`i64::MIN` for the first token).
    ///
    /// # Safety
    /// `t < num_tokens`.
    #[inline(always)]
    unsafe fn run_pair(&self, t: u64) -> (i64, i64) {
        // SAFETY: t < num_tokens, and t - 1 where t > 0.
        unsafe {
            (
                tile_slot(self.0, t),
                if t > 0 {
                    tile_slot(self.0, t - 1)
                } else {
                    i64::MIN
                },
            )
        }
    }

    /// The runs around window `w0 .. w0 + T` ([`index::window_runs`]) from the slot array:
    /// lane `l` of the calling warp takes positions `l`, `32 + l`, `64 + l`, a round at a time
    /// (its loads, then the round's ballots).
    ///
    /// # Safety
    /// The slot array holds `num_tokens` entries; every lane of the warp calls it together.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn runs_around(&self, w0: u64, tid: u64) -> Around {
        window_ballots!(self, w0, tid, |_k, t| {
            // SAFETY: t < num_tokens.
            unsafe { self.run_pair(t) }
        })
    }

    /// [`Pages::runs_around`] on the CPU: one thread takes every position.
    ///
    /// # Safety
    /// The slot array holds `num_tokens` entries.
    #[cfg(not(target_arch = "nvptx64"))]
    unsafe fn runs_around(&self, w0: u64, _tid: u64) -> Around {
        // SAFETY: t < num_tokens.
        self.runs_cpu(w0, |_, t| unsafe { self.run_pair(t) })
    }

    /// The runs around window `w0 .. w0 + T` on the CPU, over every position `p` in the batch
    /// (token `t`), its slot and its predecessor's from `pair(p, t)`: the masks the GPU's
    /// ballots gather, then [`index::window_runs`].
    #[cfg(not(target_arch = "nvptx64"))]
    fn runs_cpu(&self, w0: u64, pair: impl Fn(u64, u64) -> (i64, i64)) -> Around {
        let limit = self.0.num_blocks * self.0.block_size;
        let (mut aligned, mut follows) = (0u128, 0u128);
        for p in 0..3 * T {
            if let Some(t) = self.run_token(w0, p) {
                let (s, before) = pair(p, t);
                let (x, y) = Self::run_bits(s, before, limit);
                aligned |= (x as u128) << p;
                follows |= (y as u128) << p;
            }
        }
        Around::of(index::window_runs::<T>(aligned, follows))
    }

    /// Byte of the fetch cell of round `k`, lane `lane` (16 bytes: a slot, its predecessor's).
    #[inline(always)]
    fn run_cell(k: u64, lane: u64) -> u32 {
        ((32 * k + lane) * 16) as u32
    }

    /// Starts copying the slots the run search around window `w0 .. w0 + T` needs from this
    /// lane (of warp 0) into its fetch cells ([`cta::Tile::fetch`]): no register holds them
    /// while they travel.
    ///
    /// # Safety
    /// The slot array holds `num_tokens` entries, aligned to its element size; the cells'
    /// earlier reads by this thread are done.
    #[inline(always)]
    unsafe fn fetch_runs(&self, w0: u64, tid: u64, tile: &cta::Tile) {
        let a = self.0;
        let w = if a.slot_is_i64 != 0 { 8 } else { 4 };
        unroll4!(k => {
            if k < 3 && 32 * (k as u64) < 3 * T {
                if let Some(t) = self.run_token(w0, 32 * k as u64 + tid % 32) {
                    let cell = Self::run_cell(k as u64, tid % 32);
                    // SAFETY: t < num_tokens (and t - 1 where t > 0): inside the slot array,
                    // aligned; the cell's 16 bytes are this lane's.
                    unsafe {
                        tile.fetch(cell, a.slots.add((t * w) as usize), w as u32);
                        if t > 0 {
                            tile.fetch(cell + 8, a.slots.add(((t - 1) * w) as usize), w as u32);
                        }
                    }
                }
            }
        });
    }

    /// The slot at fetch cell byte `off`.
    ///
    /// # Safety
    /// A slot was fetched there and the copy is complete.
    #[inline(always)]
    unsafe fn cell_slot(&self, tile: &cta::Tile, off: u32) -> i64 {
        // SAFETY: forwarded.
        unsafe {
            let lo = tile.cell(off);
            if self.0.slot_is_i64 != 0 {
                ((tile.cell(off + 4) as u64) << 32 | lo as u64) as i64
            } else {
                lo as i32 as i64
            }
        }
    }

    /// The runs around window `w0 .. w0 + T` from what [`Pages::fetch_runs`] fetched (each
    /// lane reads its own cells, once its copies are complete).
    ///
    /// # Safety
    /// Every lane of warp 0 calls it together, after its [`Pages::fetch_runs`] of `w0`.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn runs_fetched(&self, w0: u64, tid: u64, tile: &cta::Tile) -> Around {
        tile.fetched();
        window_ballots!(self, w0, tid, |k, t| {
            // SAFETY: this lane fetched these cells and waited for them.
            unsafe { cell_pair!(self, tile, Self::run_cell(k as u64, tid % 32), t) }
        })
    }

    /// [`Pages::runs_fetched`] on the CPU: one thread reads every lane's cells.
    ///
    /// # Safety
    /// Warp 0's threads fetched the cells of `w0` ([`Pages::fetch_runs`]).
    #[cfg(not(target_arch = "nvptx64"))]
    unsafe fn runs_fetched(&self, w0: u64, _tid: u64, tile: &cta::Tile) -> Around {
        self.runs_cpu(w0, |p, t| {
            // SAFETY: fetched by the lane of position p.
            unsafe { cell_pair!(self, tile, Self::run_cell(p / 32, p % 32), t) }
        })
    }
}

impl<const E: usize, const C: u32, const T: u64> cta::Phases for Pages<'_, E, C, T> {
    type Carry = PagesCarry;

    #[inline(always)]
    fn items(&self) -> u64 {
        let a = self.0;
        let parts = if a.src_v.is_null() { 1 } else { 2 };
        a.num_tokens.div_ceil(T) * parts * a.heads.div_ceil(self.heads_per_item())
    }

    /// Takes the runs around the item's window ([`index::window_runs`]) from the CTA's note,
    /// where the previous item's phase two left them (a CTA's first item searches itself, every
    /// warp the same, by ballots), and, when the window starts a run, writes the run's `T`
    /// tokens into the tile in the cache's order: copied ([`Pages::load_copy`],
    /// [`Pages::write_copy`]) or quantized ([`Pages::load_quantized`],
    /// [`Pages::first_quantized`]). Then warp 0 starts fetching the slots around the next
    /// item's window into shared memory, for its search in phase two. Votes whether the window
    /// starts a run (for fp8, also whether every element of it lies on the division's fast
    /// path).
    #[inline(always)]
    unsafe fn first(
        &self,
        item: u64,
        next: u64,
        tid: u32,
        tile: &cta::Tile,
        carry: &mut PagesCarry,
    ) -> bool {
        let a = self.0;
        let (w0, part, h0, hn) = self.split(item);
        let tid = tid as u64;
        let mut rows: [[Row; 2]; PAGE_UNITS as usize] = [[[0; 8]; 2]; PAGE_UNITS as usize];
        let mut own = PageLoads {
            raw: [[[V16::splat(0); 2]; 4]; FP8_UNITS],
        };
        // SAFETY (both loads): tokens t0 .. t0 + T lie in the batch.
        let load = |t0: u64, rows: &mut _, own: &mut _| unsafe {
            if E == 2 {
                self.load_copy(t0, part, h0, hn, tid, rows)
            } else {
                self.load_quantized(t0, part, h0, hn, tid, own)
            }
        };
        carry.around = if carry.ahead {
            Around(tile.note(carry.note))
        } else {
            // SAFETY: the slot array holds num_tokens entries; every thread of the CTA takes
            // this branch (its first item).
            unsafe { self.runs_around(w0, tid) }
        };
        let start = carry.around.start();
        let t0 = w0 + start % T;
        if t0 + T <= a.num_tokens {
            load(t0, &mut rows, &mut own);
        }
        carry.ahead = next != cta::LAST;
        let mut vote = false;
        if start < T {
            vote = if E == 2 {
                // SAFETY: forwarded.
                unsafe { self.write_copy(part, hn, tid, tile, &rows) };
                true
            } else {
                // SAFETY: forwarded.
                unsafe { self.first_quantized(part, h0, hn, tid, tile, &own) }
            };
        }
        // Warp 0 starts fetching the slots around the next item's window, for phase two.
        if carry.ahead && tid < 32 {
            // SAFETY: the slot array holds num_tokens entries, aligned (host); this lane read
            // its cells in the previous item's phase two.
            unsafe { self.fetch_runs(self.split(next).0, tid, tile) };
        }
        vote
    }

    /// A run: each head's part of the tile stored as 16-byte chunks, thread `tid` taking
    /// chunks `tid, tid + THREADS, ..` in cache order. Then the window's tokens that no run
    /// stores (before its run, past the previous window's; all of them if it starts none; and
    /// its run's own when they left the fast path) one (head, token, group) per thread at a
    /// time ([`tile_tokens`]).
    ///
    /// Last, warp 0 finds the runs around the next item's window in the slots phase one
    /// fetched, and leaves them in the note the next item reads.
    #[inline(always)]
    unsafe fn second(
        &self,
        item: u64,
        next: u64,
        tid: u32,
        tile: &cta::Tile,
        all: bool,
        carry: &mut PagesCarry,
    ) {
        // SAFETY: forwarded.
        unsafe { self.store(item, tid as u64, tile, all, carry.around) };
        // Then it finds the runs around that window in what it fetched, and leaves them in
        // the note the current item does not read.
        if carry.ahead && tid < 32 {
            // SAFETY: warp 0 is here whole, after its fetch_runs of the same window.
            let around = unsafe { self.runs_fetched(self.split(next).0, tid as u64, tile) };
            if tid == 0 {
                tile.put_note(carry.note ^ 1, around.0);
            }
        }
        carry.note ^= 1;
    }
}

impl<const E: usize, const C: u32, const T: u64> Pages<'_, E, C, T> {
    /// Phase two's stores of `item` ([`cta::Phases::second`]) for thread `tid`.
    ///
    /// # Safety
    /// As [`cta::Phases::second`]; `around` holds the runs around the item's window.
    #[inline(always)]
    unsafe fn store(&self, item: u64, tid: u64, tile: &cta::Tile, all: bool, around: Around) {
        let a = self.0;
        let (w0, part, h0, hn) = self.split(item);
        let p = TilePart::of(a, part);
        let start = around.start();
        if all {
            #[cfg(not(target_arch = "nvptx64"))]
            if tid == 0 {
                PAGE_RUNS_STORED.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
            }
            // SAFETY: w0 + start < num_tokens (the run lies in the batch).
            let s0 = unsafe { tile_slot(a, w0 + start) };
            let SlotTarget::At { block, offset } =
                index::slot_target(s0, a.block_size, a.num_blocks)
            else {
                return; // not reached: a run's slots are valid
            };
            let at0 = block * p.block + offset * p.token;
            let chunks = self.head_bytes() / 16;
            let mut hh = 0;
            while hh < hn {
                let (from0, to0) = (hh * self.head_bytes(), at0 + (h0 + hh) * p.head);
                let mut c = tid;
                while c < chunks {
                    let (from, to) = if p.piece == 1 {
                        let per = Self::LINE / 16;
                        let (d, w) = (c / per, c % per);
                        let line = d ^ ((d >> 3) & Self::SWIZZLE);
                        (line * Self::LINE + w * 16, d * p.piece_stride + w * 16)
                    } else {
                        let (pc, t) = (c / T, c % T);
                        ((pc * T + (t ^ (pc & 3))) * 16, pc * p.piece_stride + t * 16)
                    };
                    // SAFETY: the run's T slots are valid consecutive slots of one block from
                    // a multiple of T: every chunk is inside the target's head in the part,
                    // 16-byte aligned (host); `from` is inside the tile.
                    unsafe {
                        let v = tile.get128((from0 + from) as u32);
                        let d = p.dst.add((to0 + to) as usize) as *mut V16;
                        d.write(V16::from_array(v));
                    }
                    c += cta::THREADS as u64;
                }
                hh += 1;
            }
        }
        // Tokens w0 + lo .. w0 + hi go one at a time.
        let lo = around.covered();
        let hi = if all {
            start
        } else if start < T {
            start + T
        } else {
            T.min(a.num_tokens - w0)
        };
        if lo >= hi {
            return;
        }
        let t0 = w0 + lo;
        let per_head = (hi - lo) * a.groups;
        let mut u = tid;
        while u < hn * per_head {
            let (hh, r) = (u / per_head, u % per_head);
            let (i, g) = (r / a.groups, r % a.groups);
            let head = h0 + hh;
            let tokens = Tokens {
                t0: t0 + i,
                n: 1,
                head,
                e0: g * 8,
                vec: a.src_vec != 0,
                counting: part == 0 && head == 0 && g == 0,
            };
            // SAFETY: token t0 + i < w0 + hi <= num_tokens, head < heads, g < groups.
            unsafe {
                let src = self.src(part, t0 + i, head, g);
                tile_tokens::<E>(a, C, &p, src, &tokens, &tile_scale(a, C, part, head));
            }
            u += cta::THREADS as u64;
        }
    }
}

/// One cache part of a tiled update, as the stores see it.
struct TilePart {
    dst: *mut u8,
    block: u64,
    token: u64,
    head: u64,
    piece: u64,
    piece_stride: u64,
    unit: u64,
    runs: bool,
}

impl TilePart {
    /// Part `part` of a tiled update: 0 = K, else V.
    #[inline(always)]
    fn of(a: &TileArgs, part: u64) -> TilePart {
        if part == 0 {
            TilePart {
                dst: a.dst_k,
                block: a.block_stride_k,
                token: a.token_stride_k,
                head: a.head_stride_k,
                piece: a.piece_k,
                piece_stride: a.piece_stride_k,
                unit: a.unit_k as u64,
                runs: a.runs & 1 != 0,
            }
        } else {
            TilePart {
                dst: a.dst_v,
                block: a.block_stride_v,
                token: a.token_stride_v,
                head: a.head_stride_v,
                piece: a.piece_v,
                piece_stride: a.piece_stride_v,
                unit: a.unit_v as u64,
                runs: a.runs & 2 != 0,
            }
        }
    }
}

/// Part `part`'s source (K, else V) at element `e0` of head `head` of token `t`, source
/// elements of `se` bytes.
///
/// # Safety
/// `t < num_tokens`, `head < heads`, `e0 < 8 * groups`: inside the validated source.
#[inline(always)]
unsafe fn tile_src(a: &TileArgs, part: u64, t: u64, head: u64, e0: u64, se: u64) -> *const u8 {
    let src = if part == 0 { a.src_k } else { a.src_v };
    // SAFETY: forwarded.
    unsafe { src.add((t * a.src_token_stride + head * a.src_head_stride + e0 * se) as usize) }
}

/// The slot of token `t`.
///
/// # Safety
/// `t < num_tokens`, the length of the slot array.
#[inline(always)]
unsafe fn tile_slot(a: &TileArgs, t: u64) -> i64 {
    // SAFETY: forwarded.
    unsafe {
        if a.slot_is_i64 != 0 {
            *(a.slots as *const i64).add(t as usize)
        } else {
            *(a.slots as *const i32).add(t as usize) as i64
        }
    }
}

/// One token's group (eight elements of its head, `step` apart) as cache elements: loaded, and
/// converted when the update converts.
///
/// # Safety
/// `src` holds the group (see [`tile::load_copy`], [`tile::load_convert`]).
#[inline(always)]
unsafe fn tile_row<const E: usize>(
    code: u32,
    src: *const u8,
    vec: bool,
    step: u64,
    div: &Divider,
) -> Row {
    // SAFETY: forwarded.
    unsafe {
        // Conversions produce fp8: only the 1-byte instance converts.
        if E == 1 && code != convert::NONE {
            tile::load_convert(src, vec, step as usize, code, div)
        } else {
            tile::load_copy::<E>(src, vec, step as usize)
        }
    }
}

/// Stores one token's group (elements `e0 .. e0 + 7` of its head) at `d`, the token's head in
/// the cache, in the part's pieces.
///
/// # Safety
/// `d` is a valid target's head; the host checked the alignment of the part's stores.
#[inline(always)]
unsafe fn tile_store_row<const E: usize>(p: &TilePart, d: *mut u8, row: &Row, e0: u64) {
    let e = E as u64;
    // SAFETY: every element stored belongs to the target's head (forwarded).
    unsafe {
        if p.unit == 8 {
            let off = index::piece_offset(e0, p.piece, p.piece_stride, e);
            tile::store::<E>(d.add(off as usize), row, 0, 8);
        } else if p.unit == 4 {
            let off = index::piece_offset(e0, p.piece, p.piece_stride, e);
            tile::store::<E>(d.add(off as usize), row, 0, 4);
            let off = index::piece_offset(e0 + 4, p.piece, p.piece_stride, e);
            tile::store::<E>(d.add(off as usize), row, 4, 4);
        } else {
            unroll8!(j => {
                let x = e0 + j as u64;
                let off = if p.piece == 1 {
                    x * p.piece_stride
                } else {
                    index::piece_offset(x, p.piece, p.piece_stride, e)
                };
                tile::store::<E>(d.add(off as usize), row, j, 1);
            });
        }
    }
}

/// [`update_tiles`] for caches of `E`-byte elements.
///
/// # Safety
/// As [`update_tiles`].
#[inline(always)]
unsafe fn tiles_body<const E: usize>(a: &TileArgs, g: Group) {
    let parts = if a.src_v.is_null() { 1 } else { 2 };
    let (subs, tile) = (a.subs as u64, a.tile as u64);
    let outer = a.num_tokens.div_ceil(tile * subs);
    let items = outer * parts * a.heads * a.groups * subs;
    let se = if a.convert != convert::NONE {
        convert::src_bytes(a.convert)
    } else {
        E as u64
    };
    let mut item = g.first;
    let mut ix = [0u64; 4];
    while item < items {
        let o = index::split_n(item, [parts, a.heads, a.groups, subs], &mut ix);
        let [part, head, grp, sub] = ix;
        item += g.step;
        let t0 = (o * subs + sub) * tile;
        if t0 >= a.num_tokens {
            continue;
        }
        let n = (a.num_tokens - t0).min(tile);
        let p = TilePart::of(a, part);
        let e0 = grp * TILE as u64;
        // SAFETY: t0 < num_tokens, head < heads, grp < groups: inside the validated source.
        let src = unsafe { tile_src(a, part, t0, head, e0, se) };
        let scale = tile_scale(a, a.convert, part, head);
        let counting = part == 0 && head == 0 && grp == 0;
        // A full tile whose eight tokens fill eight aligned consecutive slots of one block is
        // one run: rows at consecutive slots (K), or transposed columns (one element per
        // piece: V). Anything else goes token by token.
        if p.runs && n == TILE as u64 {
            // All sixteen loads (rows and slots) issued before any is used.
            let mut rows: [Row; TILE] = [[0; 8]; TILE];
            let mut slots = [0i64; TILE];
            unroll8!(i => {
                // SAFETY: the tile is full: token t0 + i's group lies in the source (runs
                // imply vector-aligned sources) and its slot in the slot array.
                unsafe {
                    let s = src.add((i as u64 * a.src_token_stride) as usize);
                    rows[i] = tile_row::<E>(a.convert, s, true, 1, &scale);
                    slots[i] = tile_slot(a, t0 + i as u64);
                }
            });
            let (bs, nb) = (a.block_size, a.num_blocks);
            let (block, offset, mut run) = match index::slot_target(slots[0], bs, nb) {
                SlotTarget::At { block, offset } => (block, offset, offset % TILE as u64 == 0),
                _ => (0, 0, false),
            };
            // Consecutive slots of one block: slot i = slot 0 + i, and slot 0 starts an
            // aligned group of eight (block sizes are multiples of 8), so all stay inside.
            unroll8!(i => {
                run = run && slots[i] == slots[0] + i as i64;
            });
            if run {
                let at0 = block * p.block + offset * p.token + head * p.head;
                // SAFETY: the eight targets are valid consecutive slots of one block; the host
                // checked the alignment of runs.
                unsafe {
                    if p.piece == 1 {
                        unroll8!(j => {
                            let d = p.dst.add((at0 + (e0 + j as u64) * p.piece_stride) as usize);
                            tile::store::<E>(d, &tile::column::<E>(&rows, j), 0, TILE);
                        });
                    } else {
                        // Pieces of 8k elements (one store per row) or of 4 (two): the host
                        // gives runs no narrower stores.
                        let e = E as u64;
                        let off = index::piece_offset(e0, p.piece, p.piece_stride, e);
                        let off4 = index::piece_offset(e0 + 4, p.piece, p.piece_stride, e);
                        unroll8!(i => {
                            let d = p.dst.add((at0 + i as u64 * p.token) as usize);
                            if p.unit == 8 {
                                tile::store::<E>(d.add(off as usize), &rows[i], 0, 8);
                            } else {
                                tile::store::<E>(d.add(off as usize), &rows[i], 0, 4);
                                tile::store::<E>(d.add(off4 as usize), &rows[i], 4, 4);
                            }
                        });
                    }
                }
                continue;
            }
        }
        let tokens = Tokens {
            t0,
            n,
            head,
            e0,
            vec: a.src_vec != 0,
            counting,
        };
        // SAFETY: forwarded: the item's tokens, inside the source and the slot array.
        unsafe { tile_tokens::<E>(a, a.convert, &p, src, &tokens, &scale) };
    }
}

/// [`update_tiles_one`]'s body for caches of `E`-byte elements: item `((t * heads) + head) *
/// groups + grp` loads K's group `grp` (elements `8 grp .. 8 grp + 7`) and V's (elements `grp,
/// grp + groups, ..` when V has one element per piece, so the `groups` threads of a head store
/// consecutive pieces; else `8 grp ..`), then reads the token's slot (both latencies overlap)
/// and stores each part in its pieces.
///
/// # Safety
/// As [`update_tiles_one`].
#[inline(always)]
unsafe fn tiles_one_body<const E: usize>(a: &TileArgs, g: Group) {
    let items = a.num_tokens * a.heads * a.groups;
    let (heads, groups) = (a.heads as u32, a.groups as u32);
    let se = if a.convert != convert::NONE {
        convert::src_bytes(a.convert)
    } else {
        E as u64
    };
    let (k, v) = (TilePart::of(a, 0), TilePart::of(a, 1));
    let with_v = !a.src_v.is_null();
    let strided = v.piece == 1;
    let (vec, bs_shift) = (a.src_vec != 0, index::pow2_shift(a.block_size));
    // Item `i`'s (token, head, group) and source offset (items < 2^32, host-checked: the
    // split is 32-bit).
    let locate = |i: u64| {
        let (th, grp) = index::split_u32(i as u32, groups);
        let (t, head) = index::split_u32(th, heads);
        let (t, head, grp) = (t as u64, head as u64, grp as u64);
        (
            t,
            head,
            grp,
            t * a.src_token_stride + head * a.src_head_stride,
        )
    };
    let mut item = g.first;
    // The first item's place only reads arguments: found before waiting for the grid this
    // one depends on (each iteration locates the next one, if any, after its own stores).
    let mut next = locate(item);
    pdl::ready::<TileArgs>();
    while item < items {
        let (t, head, grp, at) = next;
        'item: {
            let (ve0, vstep) = if strided {
                (grp, a.groups)
            } else {
                (8 * grp, 1)
            };
            // SAFETY: t < num_tokens, head < heads, grp < groups: both groups lie in the
            // validated sources (V's elements grp + j * groups < 8 * groups too).
            let (row_k, row_v) = unsafe {
                let s = a.src_k.add((at + 8 * grp * se) as usize);
                let row_k = tile_row::<E>(a.convert, s, vec, 1, &tile_scale(a, a.convert, 0, head));
                let row_v = if with_v {
                    let s = a.src_v.add((at + ve0 * se) as usize);
                    tile_row::<E>(
                        a.convert,
                        s,
                        vec && !strided,
                        vstep,
                        &tile_scale(a, a.convert, 1, head),
                    )
                } else {
                    [0; 8]
                };
                (row_k, row_v)
            };
            // SAFETY: t < num_tokens, the length of the slot array.
            let slot = unsafe { tile_slot(a, t) };
            if slot < 0 {
                break 'item;
            }
            let (block, offset) = index::split_slot(slot as u64, a.block_size, bs_shift);
            if block >= a.num_blocks {
                if head == 0 && grp == 0 {
                    // SAFETY: see count_error.
                    unsafe { count_error(a.errors, err::BAD_SLOT) };
                }
                break 'item;
            }
            // SAFETY: a valid target (block < num_blocks, offset < block_size, head < heads).
            unsafe {
                store_part::<E>(&k, block, offset, head, &row_k, 8 * grp, 1);
                if with_v {
                    store_part::<E>(&v, block, offset, head, &row_v, ve0, vstep);
                }
            }
        }
        item += g.step;
        if item >= items {
            break;
        }
        next = locate(item);
    }
}

/// Stores one token's group of part `p` at its target (`block`, `offset`, `head`): elements
/// `e0, e0 + step, .., e0 + 7 * step` of the head, in the part's pieces (found by a shift and
/// a mask when pieces hold a power of two of elements, as every v0 layout's do). `step` is 1
/// unless the part has one element per piece.
///
/// # Safety
/// The target is valid; the host checked the alignment of the part's stores.
#[inline(always)]
unsafe fn store_part<const E: usize>(
    p: &TilePart,
    block: u64,
    offset: u64,
    head: u64,
    row: &Row,
    e0: u64,
    step: u64,
) {
    let e = E as u64;
    // SAFETY: every element stored belongs to the target's head (forwarded).
    unsafe {
        let d = p
            .dst
            .add((block * p.block + offset * p.token + head * p.head) as usize);
        if !p.piece.is_power_of_two() {
            tile_store_row::<E>(p, d, row, e0);
            return;
        }
        let (sh, mask) = (p.piece.trailing_zeros(), p.piece - 1);
        let off = |x: u64| ((x >> sh) * p.piece_stride + (x & mask) * e) as usize;
        if p.unit == 8 {
            tile::store::<E>(d.add(off(e0)), row, 0, 8);
        } else if p.unit == 4 {
            tile::store::<E>(d.add(off(e0)), row, 0, 4);
            tile::store::<E>(d.add(off(e0 + 4)), row, 4, 4);
        } else if p.piece == 1 {
            // One element per piece (v0 V): the eight stores are `step` pieces apart.
            let (d0, by) = (d.add(off(e0)), (step * p.piece_stride) as usize);
            unroll8!(j => {
                tile::store::<E>(d0.add(j * by), row, j, 1);
            });
        } else {
            unroll8!(j => {
                tile::store::<E>(d.add(off(e0 + j as u64)), row, j, 1);
            });
        }
    }
}

/// The token-by-token path's view of an item: tokens `t0 .. t0 + n` of head `head`,
/// elements `e0 .. e0 + 7` of each.
struct Tokens {
    t0: u64,
    n: u64,
    head: u64,
    e0: u64,
    /// Vector loads of each token's group (see [`tile::load_copy`]).
    vec: bool,
    /// This item counts its tokens' out-of-range slots (one item per token does).
    counting: bool,
}

/// An item token by token: each token's group loaded from `src` (the first token's), its
/// slot read, then skipped (negative), counted (past the cache) or stored in the part's
/// pieces.
///
/// # Safety
/// As [`update_tiles`]: the tokens lie in the source and the slot array.
#[inline(always)]
unsafe fn tile_tokens<const E: usize>(
    a: &TileArgs,
    code: u32,
    p: &TilePart,
    src: *const u8,
    k: &Tokens,
    scale: &Divider,
) {
    let mut i = 0;
    while i < k.n {
        // SAFETY: t0 + i < num_tokens: its group lies in the source; the row is loaded
        // before the slot is read, so both latencies overlap.
        let row = unsafe {
            let s = src.add((i * a.src_token_stride) as usize);
            tile_row::<E>(code, s, k.vec, 1, scale)
        };
        // SAFETY: as above.
        let slot = unsafe { tile_slot(a, k.t0 + i) };
        match index::slot_target(slot, a.block_size, a.num_blocks) {
            SlotTarget::Skip => {}
            SlotTarget::OutOfRange => {
                if k.counting {
                    // SAFETY: see count_error.
                    unsafe { count_error(a.errors, err::BAD_SLOT) };
                }
            }
            SlotTarget::At { block, offset } => {
                let at = block * p.block + offset * p.token + k.head * p.head;
                // SAFETY: a valid target's head.
                unsafe { tile_store_row::<E>(p, p.dst.add(at as usize), &row, k.e0) };
            }
        }
        i += 1;
    }
}

/// The divider of part `part`'s scale for head `head` (unused without a conversion).
#[inline(always)]
fn tile_scale(a: &TileArgs, code: u32, part: u64, head: u64) -> Divider {
    if code != convert::NONE {
        let scales = if part == 0 { a.k_scale } else { a.v_scale };
        let at = if a.scale_per_head != 0 { head } else { 0 };
        // SAFETY: the host checked one scale (or one per head) for each part written.
        Divider::new(unsafe { *scales.add(at as usize) })
    } else {
        Divider::UNUSED
    }
}

/// [`update_tiles_staged`]'s body (1-byte cache elements): [`tiles_body`]'s work (eight
/// tokens per item; runs stored as rows or transposed columns; anything else token by token),
/// with each thread's next tile copied into its stage before the current one is worked on
/// (`a.staged`), and the run test on 32-bit halves with slot 0 split by a shift (fewer
/// instructions beside the conversions: on the H100, both builds at 128 registers and four
/// CTAs per multiprocessor, e4m3 reached 46.1% / 53.3% of the copy ceiling at 16,384 / 65,536
/// tokens with it and 44.4% / 51.3% with [`tiles_body`]'s test, in separate calls).
///
/// It is a separate body, not [`tiles_body`] with a switch, so that the 2-byte kernels' code
/// stays as measured: a build with one switched body wrote bf16 v0 prefill at 59.7% of the
/// copy ceiling against 60.6% (H100, two runs). Its PTX had one of the eight 16-byte row loads
/// split into three (since fixed in [`tile::load_copy`]); whether that was all of the loss was
/// not measured apart.
///
/// `C` is the conversion code ([`convert::NONE`] for a copy). A run's tile is converted in one
/// straight-line copy when every element lies on the division's fast path
/// (`convert::fast`; zeros and tiny values do); a tile that does not goes token by token,
/// as non-runs do. (Converting such a tile row by row instead, behind a cold-path hint, took
/// 222 registers uncapped and spilled 772 B at the 168 cap; sending tiles holding a zero token
/// by token, before zeros joined the fast path, cost 17 points at 16,384 tokens: the bench's
/// activations hold about thirty exact zeros, and each such tile's warp ran 8 dependent
/// token steps past the others.)
///
/// # Safety
/// As [`update_tiles_staged`].
#[inline(always)]
unsafe fn staged_body<const C: u32>(a: &TileArgs, g: Group) {
    const E: usize = 1;
    let parts = if a.src_v.is_null() { 1 } else { 2 };
    let subs = a.subs as u64;
    let outer = a.num_tokens.div_ceil(TILE as u64 * subs);
    let items = outer * parts * a.heads * a.groups * subs;
    let se = staged_src_bytes::<C>();
    let bs_shift = index::pow2_shift(a.block_size);
    let staged = a.staged != 0;
    let mut st = Stage::new();
    // The stage the current item's copies went to (the next item's go to the other one).
    let mut cur = 0;
    // Each item is split once: the next item's split serves its staging now and its work in
    // the next round.
    let mut next = StagedItem::of(a, g.first, items);
    if staged {
        // SAFETY: forwarded.
        unsafe { stage_item(a, &mut st, cur, &next, se) };
    }
    let mut item = g.first;
    while item < items {
        let StagedItem {
            part,
            head,
            grp,
            t0,
            ..
        } = next;
        let s = cur;
        item += g.step;
        next = StagedItem::of(a, item, items);
        if staged {
            // The next item's copies go out before this one's cells are read.
            // SAFETY: forwarded.
            unsafe { stage_item(a, &mut st, s ^ 1, &next, se) };
            st.wait_older();
            cur ^= 1;
        }
        if t0 >= a.num_tokens {
            continue;
        }
        let n = (a.num_tokens - t0).min(TILE as u64);
        let p = TilePart::of(a, part);
        let e0 = grp * TILE as u64;
        // SAFETY: t0 < num_tokens, head < heads, grp < groups: inside the validated source.
        let src = unsafe { tile_src(a, part, t0, head, e0, se) };
        let scale = tile_scale(a, C, part, head);
        if p.runs && n == TILE as u64 {
            // The tile's groups as loaded (from the stage or from the source), then converted
            // by one copy of the conversion code for both.
            let mut raw = [[V16::splat(0); 2]; TILE];
            let mut slots = [0i64; TILE];
            // f32 sources are never staged (their groups do not fit a cell).
            if convert::src_bytes(C) <= 2 && staged {
                // SAFETY: stage_item copied this full tile's rows and slots into stage s (< 2),
                // and wait_older let them land.
                unsafe { staged_tile(a, &st, s, &mut raw, &mut slots) };
            } else {
                unroll8!(i => {
                    // SAFETY: the tile is full: token t0 + i's group lies in the source (runs
                    // imply vector-aligned sources) and its slot in the slot array.
                    unsafe {
                        let r = src.add((i as u64 * a.src_token_stride) as usize);
                        raw[i] = load_group::<C>(r);
                        slots[i] = tile_slot(a, t0 + i as u64);
                    }
                });
            }
            // A tile whose every element lies on the division's fast path (finite, at most
            // 2^80: `convert::fast`) converts in one straight-line copy of the conversion; any
            // other goes token by token below, as tiles that are not runs do, so the loop
            // holds no second copy (instruction fetch stalled the warps when every row carried
            // its own fallback; BENCHMARKS.md, session 15).
            let fast = C == convert::NONE || convert::fast::<C, TILE>(&raw, &scale);
            let s0 = slots[0];
            let (block, offset) = index::split_slot(s0 as u64, a.block_size, bs_shift);
            // Consecutive slots of one block: slot i = slot 0 + i, and slot 0 starts an
            // aligned group of eight (block sizes are multiples of 8), so all stay inside.
            if fast && s0 >= 0 && index::consecutive8(&slots) && block < a.num_blocks {
                let mut rows: [Row; TILE] = [[0; 8]; TILE];
                unroll8!(i => {
                    rows[i] = if C == convert::NONE {
                        // Copied fp8: the group's 8 bytes.
                        let w = raw[i][0].to_array();
                        [w[0], w[1], 0, 0, 0, 0, 0, 0]
                    } else {
                        tile::row_of(convert::unit_fast::<C>(&raw[i], &scale))
                    };
                });
                let at0 = block * p.block + offset * p.token + head * p.head;
                // SAFETY: the eight targets are valid consecutive slots of one block; the host
                // checked the alignment of runs.
                unsafe { store_run::<E>(&p, at0, e0, &rows) };
                continue;
            }
        }
        core::hint::cold_path();
        // SAFETY: forwarded: the item's tokens lie in the source and the slot array.
        unsafe { staged_tokens::<C>(a, part, head, grp, t0, n) };
    }
}

/// The token-by-token path of [`staged_body`] ([`tile_tokens`]: a partial tile, a part
/// without runs, slots that do not form a run, or a tile with an element off the division's
/// fast path: an infinity, a NaN or a magnitude past 2^80). Inlined behind a cold-path hint, which
/// places it after the loop: a call would take the address of the kernel's arguments, which
/// then live in local memory for the whole kernel.
///
/// # Safety
/// As [`update_tiles_staged`]; `t0 + n <= num_tokens`, `head < heads`, `grp < groups`, and
/// `C` is the update's conversion.
#[inline(always)]
unsafe fn staged_tokens<const C: u32>(
    a: &TileArgs,
    part: u64,
    head: u64,
    grp: u64,
    t0: u64,
    n: u64,
) {
    let se = staged_src_bytes::<C>();
    let p = TilePart::of(a, part);
    let e0 = grp * TILE as u64;
    let tokens = Tokens {
        t0,
        n,
        head,
        e0,
        vec: a.src_vec != 0,
        counting: part == 0 && head == 0 && grp == 0,
    };
    // SAFETY: forwarded: the item's tokens, inside the source and the slot array.
    unsafe {
        let src = tile_src(a, part, t0, head, e0, se);
        tile_tokens::<1>(a, C, &p, src, &tokens, &tile_scale(a, C, part, head));
    }
}

/// Bytes of a source element of [`staged_body`] for conversion `C`: the conversion's source
/// type, or the cache's byte for a copy.
#[inline(always)]
const fn staged_src_bytes<const C: u32>() -> u64 {
    if C != convert::NONE {
        convert::src_bytes(C)
    } else {
        1
    }
}

/// One item of [`staged_body`], split: its part, head and group, and its first token (at or
/// past `num_tokens` for an item with no tokens, or past the last item).
#[derive(Clone, Copy)]
struct StagedItem {
    part: u64,
    head: u64,
    grp: u64,
    t0: u64,
}

impl StagedItem {
    /// Item `item` of `items` ([`staged_body`]'s order: parts, heads, groups and token tiles
    /// of `a.subs`, the last varying fastest); past the last, an item without tokens.
    #[inline(always)]
    fn of(a: &TileArgs, item: u64, items: u64) -> StagedItem {
        if item >= items {
            return StagedItem {
                part: 0,
                head: 0,
                grp: 0,
                t0: u64::MAX,
            };
        }
        let parts = if a.src_v.is_null() { 1 } else { 2 };
        let subs = a.subs as u64;
        let mut ix = [0u64; 4];
        let o = index::split_n(item, [parts, a.heads, a.groups, subs], &mut ix);
        let [part, head, grp, sub] = ix;
        StagedItem {
            part,
            head,
            grp,
            t0: (o * subs + sub) * TILE as u64,
        }
    }
}

/// Stores a run: eight rows at consecutive slots from `at0` (the first slot's head in the
/// part), or, for a part of one element per piece, their eight transposed columns.
///
/// # Safety
/// `at0` is a valid target's head and the next seven slots are in its block; the host checked
/// the alignment of runs.
#[inline(always)]
unsafe fn store_run<const E: usize>(p: &TilePart, at0: u64, e0: u64, rows: &[Row; TILE]) {
    // SAFETY: forwarded.
    unsafe {
        if p.piece == 1 {
            let d = p.dst.add((at0 + e0 * p.piece_stride) as usize);
            unroll8!(j => {
                let dj = d.add(j * p.piece_stride as usize);
                tile::store::<E>(dj, &tile::column::<E>(rows, j), 0, TILE);
            });
        } else {
            // Pieces of 8k elements (one store per row) or of 4 (two): the host gives runs no
            // narrower stores.
            let e = E as u64;
            let off = index::piece_offset_pow2(e0, p.piece, p.piece_stride, e);
            let off4 = index::piece_offset_pow2(e0 + 4, p.piece, p.piece_stride, e);
            let d = p.dst.add(at0 as usize);
            unroll8!(i => {
                let di = d.add(i * p.token as usize);
                if p.unit == 8 {
                    tile::store::<E>(di.add(off as usize), &rows[i], 0, 8);
                } else {
                    tile::store::<E>(di.add(off as usize), &rows[i], 0, 4);
                    tile::store::<E>(di.add(off4 as usize), &rows[i], 4, 4);
                }
            });
        }
    }
}

/// Starts copying item `it`'s rows and slots into stage `s` of the thread's cells when the
/// item is a full tile of a part with runs (what [`staged_body`] reads from the stage), nothing
/// otherwise; then closes the group (possibly empty, so every item has one).
///
/// # Safety
/// As [`update_tiles_staged`] with `a.staged`.
#[inline(always)]
unsafe fn stage_item(a: &TileArgs, st: &mut Stage, s: usize, it: &StagedItem, se: u64) {
    let StagedItem {
        part,
        head,
        grp,
        t0,
    } = *it;
    let runs = a.runs & (1 << part) != 0;
    // `t0 + TILE` does not overflow: t0 is below num_tokens or u64::MAX (checked first).
    if runs && t0 < a.num_tokens && t0 + TILE as u64 <= a.num_tokens {
        let w = if a.slot_is_i64 != 0 { 8 } else { 4 };
        // SAFETY: a full tile: its eight groups (8 * se bytes each, aligned to that with
        // runs) lie in the source; its eight slots lie in the 16-byte aligned slot array
        // (t0 is a multiple of 8, so they start 16-byte aligned).
        unsafe {
            let src = tile_src(a, part, t0, head, grp * TILE as u64, se);
            unroll8!(i => {
                let r = src.add((i as u64 * a.src_token_stride) as usize);
                st.fetch(s, i, r, 8 * se as u32);
            });
            let sl = a.slots.add((t0 * w) as usize);
            st.fetch(s, 8, sl, 16);
            st.fetch(s, 9, sl.add(16), 16);
            if w == 8 {
                st.fetch(s, 10, sl.add(32), 16);
                st.fetch(s, 11, sl.add(48), 16);
            }
        }
    }
    st.commit();
}

/// A staged full tile (see [`stage_item`]): its eight groups as loaded (one 16-byte cell each;
/// a copied fp8 group is the cell's first 8 bytes) and its eight slots.
///
/// # Safety
/// `s < STAGES`, and stage `s` holds a full tile's copies, landed.
#[inline(always)]
unsafe fn staged_tile(
    a: &TileArgs,
    st: &Stage,
    s: usize,
    raw: &mut [convert::Raw; TILE],
    slots: &mut [i64; TILE],
) {
    unroll8!(i => {
        // SAFETY: cells 0..8 of stage s, landed (caller).
        raw[i][0] = V16::from_array(unsafe { st.get(s, i) });
    });
    if a.slot_is_i64 != 0 {
        unroll8!(i => {
            // SAFETY: cells 8..12 of stage s, landed (caller).
            let c = unsafe { st.get(s, 8 + i / 2) };
            let k = 2 * (i % 2);
            slots[i] = (c[k] as u64 | (c[k + 1] as u64) << 32) as i64;
        });
    } else {
        unroll8!(i => {
            // SAFETY: cells 8..10 of stage s, landed (caller).
            slots[i] = unsafe { st.get(s, 8 + i / 4) }[i % 4] as i32 as i64;
        });
    }
}

/// One token's group (eight source elements) of conversion `C` as loaded: one 16-byte access
/// of bf16/f16, two of f32, or, copying fp8 (`C` = [`convert::NONE`]), one 8-byte access (in
/// the first unit's low words).
///
/// # Safety
/// `src` holds the group, aligned to its size (16 bytes at most).
#[inline(always)]
unsafe fn load_group<const C: u32>(src: *const u8) -> convert::Raw {
    // SAFETY: forwarded from the caller.
    unsafe {
        if C == convert::NONE {
            let v = core::ptr::read(src as *const u64);
            [
                V16::from_array([v as u32, (v >> 32) as u32, 0, 0]),
                V16::splat(0),
            ]
        } else if convert::src_bytes(C) == 4 {
            let p = src as *const V16;
            [core::ptr::read(p), core::ptr::read(p.add(1))]
        } else {
            [core::ptr::read(src as *const V16), V16::splat(0)]
        }
    }
}

/// The device-side slice count of a slice launch, or `None` when it is outside `0..=padded`
/// (then counted once per launch, by its first lane).
///
/// # Safety
/// `num_slices` points at one i32; `errors` as [`count_error`].
#[inline(always)]
unsafe fn slice_count(a: &SliceArgs, g: &Group) -> Option<u32> {
    // SAFETY: forwarded.
    let raw = unsafe { *a.num_slices };
    let n = index::checked_count(raw, a.padded);
    if n.is_none() && g.first == 0 && g.lane == 0 {
        // SAFETY: see count_error.
        unsafe { count_error(a.errors, err::BAD_COUNT) };
    }
    n
}

/// Entry `i` of the `[3, padded]` slice table: (cache start, source start, length).
///
/// # Safety
/// `i < padded`, and `slices` holds `3 * padded` i32.
#[inline(always)]
unsafe fn slice_entry(a: &SliceArgs, i: u64) -> (i32, i32, i32) {
    let (p, i) = (a.padded as usize, i as usize);
    // SAFETY: forwarded.
    unsafe {
        (
            *a.slices.add(i),
            *a.slices.add(p + i),
            *a.slices.add(2 * p + i),
        )
    }
}

/// Slice-based update (vLLM TPU `kv_cache_update` semantics): the first `*num_slices` entries
/// of the `[3, padded]` table (cache start, source start, length) are copied; a bad count
/// skips everything (counted once), a bad slice is skipped and counted. Slot `s` lives at
/// `(s / page_size) * dst_page_stride + (s % page_size) * dst_row_stride`.
///
/// # Safety
/// Host-validated arguments: every valid slice's rows lie in the buffers; `slices` holds
/// `3 * padded` entries and `num_slices` one.
#[inline(always)]
pub unsafe fn update_slices(a: &SliceArgs, g: Group) {
    // SAFETY: forwarded.
    let Some(n) = (unsafe { slice_count(a, &g) }) else {
        return;
    };
    let per = a.rows_per_item as u64;
    let page = a.page_size as u64;
    let pieces = page.div_ceil(per);
    let items = n as u64 * pieces;
    let mut item = g.first;
    while item < items {
        let mut piece = [0u64; 1];
        let i = index::split_n(item, [pieces], &mut piece);
        let piece = piece[0];
        // SAFETY: i < n <= padded.
        let (start, from, len) = unsafe { slice_entry(a, i) };
        match index::check_slice(start, from, len, a.page_size, a.num_slots, a.num_tokens) {
            SliceCheck::Padding => {}
            SliceCheck::Invalid => {
                if g.lane == 0 && piece == 0 {
                    // SAFETY: see count_error.
                    unsafe { count_error(a.errors, err::BAD_SLICE) };
                }
            }
            SliceCheck::Valid => {
                let r0 = piece * per;
                let len = len as u64;
                if r0 < len {
                    let rows = if len - r0 < per { len - r0 } else { per };
                    let first_slot = start as u64 + r0;
                    let pg = index::div_u64(first_slot, page);
                    let s0 = (from as u64 + r0) * a.src_row_stride;
                    let d0 = pg * a.dst_page_stride + (first_slot - pg * page) * a.dst_row_stride;
                    // SAFETY: the slice is valid (inside both buffers, one page), so are these rows.
                    unsafe {
                        if a.merge != 0 {
                            copy_span(
                                a.src.add(s0 as usize),
                                a.dst.add(d0 as usize),
                                rows * a.row_bytes,
                                g.lane,
                                g.lanes,
                                a.width,
                            );
                        } else {
                            let mut r = 0;
                            while r < rows {
                                let s = a.src.add((s0 + r * a.src_row_stride) as usize);
                                let d = a.dst.add((d0 + r * a.dst_row_stride) as usize);
                                copy_span(s, d, a.row_bytes, g.lane, g.lanes, a.width);
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

/// The slice table as a slot list: for each valid slice (as [`update_slices`] checks it) and
/// each of its rows `j`, `dst[src_start + j] = cache_start + j` as an `i32`, so that the slot
/// update writes exactly the slices' rows into any layout, converting on the way (the host
/// sets all `num_tokens` entries to -1 first: rows no slice names are skipped). A bad count
/// skips everything (counted once); a bad slice is skipped and counted once; a source row
/// that two slices name goes to one of their slots (whichever claims it first) and counts
/// [`err::BAD_SLICE`] once per extra claim. One lane per (slice, row of a page) item.
///
/// # Safety
/// As [`update_slices`]; `dst` holds `num_tokens` aligned `i32`.
#[inline(always)]
pub unsafe fn slices_to_slots(a: &SliceArgs, g: Group) {
    // SAFETY: forwarded.
    let Some(n) = (unsafe { slice_count(a, &g) }) else {
        return;
    };
    let page = a.page_size as u64;
    let items = n as u64 * page;
    let list = a.dst as *mut i32;
    let mut item = g.first;
    while item < items {
        let i = index::div_u64(item, page);
        let row = item - i * page;
        // SAFETY: i < n <= padded.
        let (start, from, len) = unsafe { slice_entry(a, i) };
        match index::check_slice(start, from, len, a.page_size, a.num_slots, a.num_tokens) {
            SliceCheck::Padding => {}
            SliceCheck::Invalid => {
                if row == 0 {
                    // SAFETY: see count_error.
                    unsafe { count_error(a.errors, err::BAD_SLICE) };
                }
            }
            SliceCheck::Valid => {
                if row < len as u64 {
                    // SAFETY: a valid slice's rows lie in the source, whose `num_tokens` rows
                    // the list covers; atomics make a row named twice sound.
                    let claimed = unsafe {
                        AtomicI32::from_ptr(list.add(from as usize + row as usize))
                            .compare_exchange(
                                -1,
                                start + row as i32,
                                Ordering::Relaxed,
                                Ordering::Relaxed,
                            )
                            .is_ok()
                    };
                    if !claimed {
                        // SAFETY: see count_error.
                        unsafe { count_error(a.errors, err::BAD_SLICE) };
                    }
                }
            }
        }
        item += g.step;
    }
}

/// Block copy between two pools (device or mapped pinned host memory, any layouts): for pair
/// `i` (`pairs[2i]` source block, `pairs[2i+1]` destination block), every (layer, part, token,
/// head) chunk, as `pieces` work items of `piece` bytes, `src_piece_stride` and
/// `dst_piece_stride` apart (a contiguous chunk split in `piece`s, or a head vector moved
/// piece by piece between layouts that split it differently: vLLM's v0 and NHD); merged
/// dimensions have extent 1. Negative ids are padding,
/// ids past a pool are skipped and counted.
///
/// # Safety
/// Host-validated descriptors: every chunk of a valid pair lies inside both pools; `pairs`
/// holds `2 * num_pairs` entries; every extent (`layers`, `parts`, `tokens`, `heads`,
/// `pieces`) is non-zero and below 2^32 (the item indices step in 32-bit digits, [`Digits`]).
#[inline(always)]
pub unsafe fn copy_blocks(a: &CopyArgs, g: Group) {
    let per_pair = a.layers * a.parts * a.tokens * a.heads * a.pieces;
    let items = a.num_pairs * per_pair;
    let mut item = g.first;
    let (dims, stride, mut at) = item_steps(a, g);
    while item < items {
        // SAFETY: item < items, `at` its split; a valid item's piece lies in both pools.
        unsafe {
            if let Some((from, to)) = item_span_at(a, &at, g.lane) {
                copy_span(from, to, a.piece, g.lane, g.lanes, a.width);
            }
        }
        item += g.step;
        at = at.add(&stride, dims);
    }
}

/// The block copy of a conversion (`kvio_convert_blocks`: head vectors moved piece by piece
/// between layouts that split them differently, vLLM's v0 and NHD): the pieces of
/// [`copy_blocks`], but one work item per (pair, layer, part, head), a head's page of `tokens ×
/// pieces` pieces shared by the group's lanes, tokens fastest (lane `j` takes piece `j /
/// tokens` of token `j % tokens`, then `j + lanes`, ..., four in flight before their stores).
/// The item's index split is paid once per head page, and on the side whose pieces hold a run
/// of tokens (vLLM's v0 caches: a value element's `block_size` tokens, a key piece's
/// `block_size` 16-byte pieces) consecutive lanes access consecutive addresses; on the other
/// side (head vectors whole), lanes `t` and `t + tokens` take one row's neighbouring pieces.
///
/// # Safety
/// As [`copy_blocks`].
#[inline(always)]
pub unsafe fn convert_blocks(a: &CopyArgs, g: Group) {
    // SAFETY: forwarded; each arm's unit is the width the host checked every address against.
    unsafe { span::by_width!(a.width, convert_body(a, g)) }
}

/// [`convert_blocks`] with accesses of `T`.
///
/// # Safety
/// As [`copy_blocks`], with every address, stride and piece a multiple of `size_of::<T>()`.
#[inline(always)]
unsafe fn convert_body<T: Unit>(a: &CopyArgs, g: Group) {
    let heads = CopyArgs {
        tokens: 1,
        pieces: 1,
        ..*a
    };
    let per_pair = a.layers * a.parts * a.heads;
    let items = a.num_pairs * per_pair;
    let size = core::mem::size_of::<T>() as u64;
    // Units of `T` per piece (one, unless an access narrower than the piece was all that
    // the pools' alignment allowed), per head page.
    let per_piece = a.piece / size;
    let units = a.tokens * a.pieces * per_piece;
    let (shift_t, shift_u) = (index::pow2_shift(a.tokens), index::pow2_shift(per_piece));
    // Byte offsets of unit `u` of a page from its head's first piece, source and destination.
    let at = |u: u64| -> (usize, usize) {
        let (j, s) = index::split_slot(u, per_piece, shift_u);
        let (k, t) = index::split_slot(j, a.tokens, shift_t);
        let o = s * size;
        (
            (t * a.src_token_stride + k * a.src_piece_stride + o) as usize,
            (t * a.dst_token_stride + k * a.dst_piece_stride + o) as usize,
        )
    };
    let mut item = g.first;
    while item < items {
        // SAFETY: item < items; a valid item's head page lies in both pools, every unit
        // aligned for `T` (the host's width).
        unsafe {
            if let Some((from, to)) = item_span(&heads, item, per_pair, g.lane) {
                let unit = |u: u64| {
                    let (s, d) = at(u);
                    (from.add(s) as *const T, to.add(d) as *mut T)
                };
                let mut u = g.lane;
                while u + 3 * g.lanes < units {
                    let p = [
                        unit(u),
                        unit(u + g.lanes),
                        unit(u + 2 * g.lanes),
                        unit(u + 3 * g.lanes),
                    ];
                    let v = [
                        core::ptr::read(p[0].0),
                        core::ptr::read(p[1].0),
                        core::ptr::read(p[2].0),
                        core::ptr::read(p[3].0),
                    ];
                    unroll4!(k => { core::ptr::write(p[k].1, v[k]) });
                    u += 4 * g.lanes;
                }
                while u < units {
                    let (s, d) = unit(u);
                    core::ptr::write(d, core::ptr::read(s));
                    u += g.lanes;
                }
            }
        }
        item += g.step;
    }
}

/// The block conversion of [`convert_blocks`] through a CTA's shared tile
/// (`kvio_convert_pages`, [`cta`] phases): a work item is `tile` tokens of one (pair, layer,
/// part, head) page; phase one reads them with 16-byte accesses along the source's contiguous
/// direction into the tile (row-major by token, rows of `chunk` bytes padded by 16), phase two
/// writes them with 16-byte accesses along the destination's. A side whose value cache holds a
/// run of tokens per element (vLLM's v0 values: elements of consecutive tokens adjacent) is
/// read or written as columns, 16 bytes of consecutive tokens of one element, scattered into
/// or gathered from the tile element by element; any other side as rows, 16 bytes of one
/// token's head vector (tokens fastest where consecutive tokens' pieces are adjacent: the v0
/// key cache). Consecutive threads take consecutive vectors, so both sides' accesses are
/// whole 16-byte units at consecutive addresses where the layout has them.
///
/// # Safety
/// As [`copy_blocks`], and: a conversion plan (`tokens` runs of `tile` tokens per page,
/// `pieces` pieces of `piece` bytes per head vector of `chunk` bytes, `elem`-byte elements);
/// `tile * (chunk + 16) <= cta::BYTES`; `chunk` a multiple of 16; every base, table entry and
/// stride 16-byte aligned except a columns side's token stride (`elem`), and `tile` a
/// multiple of `16 / elem` there; a rows side's 16-byte vectors lie inside one piece or its
/// pieces are adjacent; launched with [`cta::THREADS`] threads per CTA.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn convert_pages(a: &CopyArgs, _g: Group) {
    // SAFETY: forwarded.
    unsafe { cta::run(&ConvertPages(a)) }
}

/// `convert_pages` on the CPU, for a grid of `grid` CTAs ([`cta::emulate`]).
///
/// # Safety
/// As `convert_pages`, on host memory.
#[cfg(not(target_arch = "nvptx64"))]
pub unsafe fn emulate_convert_pages(a: &CopyArgs, grid: u32) {
    // SAFETY: forwarded.
    unsafe { cta::emulate(&ConvertPages(a), grid) }
}

/// `convert_pages`' phases.
struct ConvertPages<'a>(&'a CopyArgs);

/// Four little-endian words as one value (byte `i` of the result is byte `i` of the words),
/// so a column's elements are taken by shifts rather than by indexing the words.
#[inline(always)]
fn words_u128(w: [u32; 4]) -> u128 {
    w[0] as u128 | (w[1] as u128) << 32 | (w[2] as u128) << 64 | (w[3] as u128) << 96
}

/// The inverse of [`words_u128`].
#[inline(always)]
fn u128_words(x: u128) -> [u32; 4] {
    [
        x as u32,
        (x >> 32) as u32,
        (x >> 64) as u32,
        (x >> 96) as u32,
    ]
}

/// One side of `convert_pages`: its token, piece and head strides in bytes, and whether it
/// is read or written as columns.
#[derive(Clone, Copy)]
struct PageSide {
    token: u64,
    piece: u64,
    head: u64,
    columns: bool,
}

impl ConvertPages<'_> {
    /// Bytes between tile rows (a token's head vector, padded so a column's elements spread
    /// over banks).
    #[inline(always)]
    fn row(&self) -> u64 {
        self.0.chunk + 16
    }

    /// The source (`src`) or destination side.
    #[inline(always)]
    fn side(&self, src: bool) -> PageSide {
        let a = self.0;
        let (token, piece, head) = if src {
            (a.src_token_stride, a.src_piece_stride, a.src_head_stride)
        } else {
            (a.dst_token_stride, a.dst_piece_stride, a.dst_head_stride)
        };
        PageSide {
            token,
            piece,
            head,
            columns: token == a.elem as u64 && a.piece == a.elem as u64,
        }
    }

    /// 16-byte vectors of one head of an item.
    #[inline(always)]
    fn per_head(&self) -> u64 {
        self.0.tile as u64 * self.0.chunk / 16
    }

    /// Groups of `subs` heads of a page.
    #[inline(always)]
    fn groups(&self) -> u64 {
        self.0.heads.div_ceil(self.0.subs as u64)
    }

    /// Vector `v` of side `s` (head `v / per_head` of the item's): its byte offset from the
    /// item's first head's first token, its tile row and its byte offset inside the head
    /// vector (a columns vector holds `16 / elem` tokens of one element, rows from the one
    /// returned; a rows vector 16 bytes of one token).
    #[inline(always)]
    fn vector(&self, s: PageSide, v: u64) -> (u64, u64, u64) {
        let per = self.per_head();
        let (hh, v) = index::split_slot(v, per, index::pow2_shift(per));
        let (off, t, b) = self.in_head(s, v);
        (off + hh * s.head, hh * self.0.tile as u64 + t, b)
    }

    /// Vector `v` of one head (see [`ConvertPages::vector`]): offset, token, byte in the head.
    #[inline(always)]
    fn in_head(&self, s: PageSide, v: u64) -> (u64, u64, u64) {
        let a = self.0;
        let (tile, e) = (a.tile as u64, a.elem as u64);
        let (t, b) = if s.columns {
            let per = tile * e / 16;
            let (d, it) = index::split_slot(v, per, index::pow2_shift(per));
            (it * (16 / e), d * e)
        } else {
            let per = a.chunk / 16;
            if s.token == 16 {
                let (ib, t) = index::split_slot(v, tile, index::pow2_shift(tile));
                (t, ib * 16)
            } else {
                let (t, ib) = index::split_slot(v, per, index::pow2_shift(per));
                (t, ib * 16)
            }
        };
        let off = t * s.token + index::piece_offset_pow2(b, a.piece, s.piece, 1);
        (off, t, b)
    }

    /// The item's start in both pools and its 16-byte vectors (`None`: padding or an id past
    /// a pool, counted by thread 0 in phase one only).
    ///
    /// # Safety
    /// As [`copy_blocks`]; `item < items`.
    #[inline(always)]
    unsafe fn page(&self, item: u64, count: bool) -> Option<(*const u8, *mut u8, u64)> {
        let a = self.0;
        let (tile, subs, groups) = (a.tile as u64, a.subs as u64, self.groups());
        let runs = CopyArgs {
            pieces: 1,
            heads: groups,
            src_token_stride: a.src_token_stride * tile,
            dst_token_stride: a.dst_token_stride * tile,
            src_head_stride: a.src_head_stride * subs,
            dst_head_stride: a.dst_head_stride * subs,
            ..*a
        };
        let per_pair = a.layers * a.parts * a.tokens * groups;
        // The item's head group is its innermost index (one piece).
        let (_, group) = index::split_slot(item, groups, index::pow2_shift(groups));
        let heads = (a.heads - group * subs).min(subs);
        // SAFETY: forwarded.
        unsafe { item_span(&runs, item, per_pair, if count { 0 } else { 1 }) }
            .map(|(from, to)| (from, to, heads * self.per_head()))
    }
}

impl cta::Phases for ConvertPages<'_> {
    type Carry = ();

    #[inline(always)]
    fn items(&self) -> u64 {
        let a = self.0;
        a.num_pairs * a.layers * a.parts * a.tokens * self.groups()
    }

    /// Reads the item's source vectors (four in flight per thread) into the tile.
    #[inline(always)]
    unsafe fn first(&self, item: u64, _: u64, tid: u32, tile: &cta::Tile, _: &mut ()) -> bool {
        // SAFETY: item < items (the runner).
        let Some((from, _, n)) = (unsafe { self.page(item, tid == 0) }) else {
            return true;
        };
        let (s, row, e) = (self.side(true), self.row(), self.0.elem);
        let mut v = tid as u64;
        while v < n {
            let mut at = [(0u64, 0u64, 0u64); 4];
            let mut val = [[0u32; 4]; 4];
            unroll4!(k => {
                let w = v + k as u64 * cta::THREADS as u64;
                if w < n {
                    at[k] = self.vector(s, w);
                    // SAFETY: inside the source page, 16-byte aligned (the contract).
                    val[k] = unsafe { core::ptr::read(from.add(at[k].0 as usize) as *const V16) }
                        .to_array();
                }
            });
            unroll4!(k => {
                let w = v + k as u64 * cta::THREADS as u64;
                if w < n {
                    let (_, t, b) = at[k];
                    // SAFETY: t < tile rows, b + 16 <= chunk: inside the tile (contract).
                    unsafe {
                        if s.columns {
                            let x = words_u128(val[k]);
                            for j in 0..16 / e {
                                let off = (t + j as u64) * row + b;
                                tile.put(off as u32, (x >> (8 * j * e)) as u32, e);
                            }
                        } else {
                            tile.put128((t * row + b) as u32, val[k]);
                        }
                    }
                }
            });
            v += 4 * cta::THREADS as u64;
        }
        true
    }

    /// Writes the item's destination vectors from the tile.
    #[inline(always)]
    unsafe fn second(&self, item: u64, _: u64, tid: u32, tile: &cta::Tile, _: bool, _: &mut ()) {
        // SAFETY: item < items (the runner).
        let Some((_, to, n)) = (unsafe { self.page(item, false) }) else {
            return;
        };
        let (s, row, e) = (self.side(false), self.row(), self.0.elem);
        let mut v = tid as u64;
        while v < n {
            let (off, t, b) = self.vector(s, v);
            // SAFETY: inside the tile (contract), written in phase one.
            let val = unsafe {
                if s.columns {
                    let mut x = 0u128;
                    for j in 0..16 / e {
                        x |=
                            (tile.get(((t + j as u64) * row + b) as u32, e) as u128) << (8 * j * e);
                    }
                    u128_words(x)
                } else {
                    tile.get128((t * row + b) as u32)
                }
            };
            // SAFETY: inside the destination page, 16-byte aligned (the contract).
            unsafe { core::ptr::write(to.add(off as usize) as *mut V16, V16::from_array(val)) };
            v += cta::THREADS as u64;
        }
    }
}

/// Work items one group of the transfer entry ([`transfer_blocks`]) holds in flight at once.
///
/// Bytes in flight: a PCIe link at ~55 GB/s with ~2 µs of latency per host access needs
/// 55 GB/s × 2 µs ≈ 110 KB outstanding across the (≤ 2 offload, ≤ 4 onload) CTAs of a
/// transfer. A group's lanes each hold up to [`BATCH_UNITS`] units of every item of the
/// batch, so a 512-thread CTA (`.maxntid 512`) has up to 512 × 3 items × 4 units × 16 B =
/// 96 KiB in flight, and two CTAs ~192 KiB: 1.7× the link's bandwidth-delay product, so the
/// address lookups (pair, layer table) that precede each batch's loads stay hidden too. For
/// small chunks the batch is what keeps the link busy: a 1-KiB chunk (64 units) gets a
/// 16-lane group, so a warp has 2 groups × 3 = 6 chunks (6 KiB) in flight, where one item
/// per group left it 1 KiB behind a chain of dependent lookups; a 2-KiB chunk gets a whole
/// warp, 3 chunks (6 KiB) in flight. Three items take the 128 registers a 512-thread CTA
/// allows, without spills (data: 3 × 4 × 4 = 48; the rest is the three items' addresses and
/// the stepped index digits, [`Digits`]; 120 when each item was divided anew); four spill, and
/// at 1024 threads (64 registers) even two do.
pub const TRANSFER_BATCH: usize = 3;

/// [`copy_blocks`] for copies touching pinned host memory (`kvio_transfer_blocks`: few
/// 512-thread CTAs, every access crossing PCIe): the same items and the same bytes, but each
/// group takes [`TRANSFER_BATCH`] items at once (`item`, `item + step`, ...), looks up all
/// their addresses, issues all their loads, then all their stores, so small chunks keep many
/// bytes in flight per warp (see [`TRANSFER_BATCH`]).
///
/// # Safety
/// As [`copy_blocks`].
#[inline(always)]
pub unsafe fn transfer_blocks(a: &CopyArgs, g: Group) {
    // SAFETY: forwarded; each arm's unit is the width the host checked every address against.
    unsafe { span::by_width!(a.width, transfer_body(a, g)) }
}

/// [`transfer_blocks`] with accesses of `T`: batches of [`TRANSFER_BATCH`] items, looked up,
/// then copied together by the span core's [`copy_spans`].
///
/// # Safety
/// As [`copy_blocks`], with every address and length a multiple of `size_of::<T>()`.
#[inline(always)]
unsafe fn transfer_body<T: Unit>(a: &CopyArgs, g: Group) {
    const B: usize = TRANSFER_BATCH;
    let per_pair = a.layers * a.parts * a.tokens * a.heads * a.pieces;
    let items = a.num_pairs * per_pair;
    // A piece is at most 16 KiB (the host's MAX_PIECE): unit indices fit in 32 bits.
    let units = (a.piece / core::mem::size_of::<T>() as u64) as u32;
    let mut item = g.first;
    let (dims, stride, mut at) = item_steps(a, g);
    while item < items {
        let mut from = [core::ptr::null::<u8>(); B];
        let mut to = [core::ptr::null_mut::<u8>(); B];
        let mut live = [false; B];
        // Constant indices only (unrolled), so the batch's addresses stay in registers.
        unroll4!(k => {
            let it = item + k as u64 * g.step;
            if k < B && it < items {
                // SAFETY: it < items, and `at` is its split.
                if let Some((f, t)) = unsafe { item_span_at(a, &at, g.lane) } {
                    from[k] = f;
                    to[k] = t;
                    live[k] = true;
                }
            }
            if k < B {
                at = at.add(&stride, dims);
            }
        });
        // SAFETY: each live item's piece (`units` values of T) lies in both pools, aligned.
        unsafe { copy_spans::<T, B>(&from, &to, &live, units, g.lane as u32, g.lanes as u32) };
        item += B as u64 * g.step;
    }
}

/// [`copy_blocks`] for transfers touching pinned host memory with Hopper bulk copies
/// (`kvio_transfer_blocks_tma`, one-warp CTAs, [`crate::bulk`]): the warp of CTA `c` takes
/// batches `c`, `c + grid`, ... of [`bulk::lanes_for`]`(piece)` consecutive items, lane `k`
/// item `k` of each batch (`tma_item`). On `sm_90` every lane pipelines its pieces through
/// [`bulk::STAGES`] shared-memory slots: bulk load (global → shared, completing on the slot's
/// `mbarrier`), then bulk store (shared → global), with [`bulk::LOOKAHEAD`] loads in flight
/// ahead of the one it waits for and up to `STAGES - 1 - LOOKAHEAD` stores still reading
/// their slots. Elsewhere (the `sm_80` PTX, where kvio never launches this entry, and the CPU
/// emulation) each lane copies its item with plain accesses: the same items, the same bytes,
/// the same error counts.
///
/// # Safety
/// As [`copy_blocks`], with `shift` = [`bulk::SHIFT`] and one-warp CTAs; on `sm_90` the piece
/// a multiple of 16 no larger than [`bulk::STAGE_BYTES`], every address 16-byte aligned
/// (`width` 16).
#[inline(always)]
pub unsafe fn transfer_blocks_tma(a: &CopyArgs, g: Group) {
    let per_pair = a.layers * a.parts * a.tokens * a.heads * a.pieces;
    let items = a.num_pairs * per_pair;
    let per = bulk::lanes_for(a.piece);
    if g.lane >= per {
        return;
    }
    let batches = items.div_ceil(per);
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
    // SAFETY: forwarded.
    unsafe {
        tma_lane(a, g, per_pair, items, per, batches)
    };
    #[cfg(not(all(target_arch = "nvptx64", target_feature = "sm_90")))]
    {
        let mut b = g.first;
        while b < batches {
            // SAFETY: a valid item's piece lies in both pools, aligned for `width`.
            unsafe {
                if let Some((from, to)) = tma_item(a, b, per, g.lane, items, per_pair) {
                    copy_span(from, to, a.piece, 0, 1, a.width);
                }
            }
            b += g.step;
        }
    }
}

/// The item lane `lane` moves in batch `batch` of [`transfer_blocks_tma`] (`per` items a
/// batch): its source and destination, `None` past the last item, for padding and for ids
/// past a pool (counted once per pair, as [`item_span`] does: every item has one lane).
///
/// # Safety
/// As [`copy_blocks`]; `lane < per`, `items = num_pairs * per_pair`.
#[inline(always)]
unsafe fn tma_item(
    a: &CopyArgs,
    batch: u64,
    per: u64,
    lane: u64,
    items: u64,
    per_pair: u64,
) -> Option<(*const u8, *mut u8)> {
    let it = batch * per + lane;
    if it < items {
        // SAFETY: it < items; one lane per item, so it counts as lane 0.
        unsafe { item_span(a, it, per_pair, 0) }
    } else {
        None
    }
}

/// One lane's bulk-copy pipeline of [`transfer_blocks_tma`] on `sm_90`.
///
/// Step `i` (the lane's `i`-th batch, `g.first + i * g.step`) uses stage `i % STAGES`: it
/// waits until the stores committed `STAGES - LOOKAHEAD` steps before have read their slots
/// (so the one that last used this stage has), loads its piece into the slot (or completes
/// the barrier's phase with a bare arrival when it has none), then waits for the load of step
/// `i - LOOKAHEAD` (phase `(i - LOOKAHEAD) / STAGES` of its barrier), stores that piece and
/// commits one bulk group (empty when there was nothing to store), so every step commits
/// exactly one group and the `wait_group.read` count is a constant.
///
/// # Safety
/// As [`transfer_blocks_tma`] on `sm_90`; `lane < per`.
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
#[inline(always)]
unsafe fn tma_lane(a: &CopyArgs, g: Group, per_pair: u64, items: u64, per: u64, batches: u64) {
    use bulk::{hw, LOOKAHEAD, STAGES, STAGE_BYTES, THREADS};
    const { assert!(LOOKAHEAD == 2 && STAGES > LOOKAHEAD) };
    let bytes = a.piece as u32;
    let slot0 = hw::stage_base() + g.lane as u32 * bytes;
    let bar0 = hw::bar_base() + g.lane as u32 * 8;
    let bar_step = THREADS * 8;
    let mut s = 0;
    while s < STAGES {
        // SAFETY: this lane's own barriers, before any copy.
        unsafe { hw::init(bar0 + s * bar_step) };
        s += 1;
    }
    hw::fence_init();
    // Each lane initialised only its own barriers, but ptxas issues barrier operations on
    // lane-varying addresses lane by lane through the warp's uniform datapath: a warp-level
    // sync makes the initialisation visibly ordered before every lane's first arrival.
    hw::sync_lanes();
    let steps = if g.first < batches {
        (batches - 1 - g.first) / g.step + 1
    } else {
        0
    };
    // Destinations of the pieces loaded one and two steps ago (null: nothing loaded).
    let (mut d1, mut d2) = (core::ptr::null_mut::<u8>(), core::ptr::null_mut::<u8>());
    let mut i = 0u64;
    // Stages of steps i and i - LOOKAHEAD, and the parity of the latter's barrier phase.
    let (mut st, mut sw, mut pw) = (0u32, 0u32, 0u32);
    while i < steps + LOOKAHEAD as u64 {
        let mut cur = core::ptr::null_mut::<u8>();
        if i < steps {
            let slot = slot0 + st * STAGE_BYTES;
            let bar = bar0 + st * bar_step;
            // The store of step i - STAGES (committed at step i - STAGES + LOOKAHEAD) has read
            // this slot once at most STAGES - 1 - LOOKAHEAD later groups are pending.
            hw::wait_read::<{ STAGES - 1 - LOOKAHEAD }>();
            // SAFETY: i < steps: batch g.first + i * step < batches; lane < per.
            let span = unsafe { tma_item(a, g.first + i * g.step, per, g.lane, items, per_pair) };
            // SAFETY: the slot is free (above), the piece valid, 16-byte aligned (host).
            unsafe {
                match span {
                    Some((from, to)) => {
                        hw::load(slot, from, bytes, bar);
                        cur = to;
                    }
                    None => hw::arrive(bar),
                }
            }
        }
        if i >= LOOKAHEAD as u64 {
            let bar = bar0 + sw * bar_step;
            // SAFETY: the barrier of step i - LOOKAHEAD, whose phase that step completes.
            unsafe { hw::wait(bar, pw) };
            if !d2.is_null() {
                // SAFETY: the slot's load has completed; the destination is valid (host).
                unsafe { hw::store(d2, slot0 + sw * STAGE_BYTES, bytes) };
            }
            hw::commit();
            sw += 1;
            if sw == STAGES {
                sw = 0;
                pw ^= 1;
            }
        }
        d2 = d1;
        d1 = cur;
        st += 1;
        if st == STAGES {
            st = 0;
        }
        i += 1;
    }
    // Shared memory must outlive the stores' reads; wait for their writes too.
    hw::wait_all();
}

/// Source and destination of item `item` of a block copy, `None` when its pair is padding or
/// out of range (counted once per pair, by lane 0 of the group holding its first item).
///
/// # Safety
/// As [`copy_blocks`]; `item < num_pairs * per_pair`.
#[inline(always)]
unsafe fn item_span(
    a: &CopyArgs,
    item: u64,
    per_pair: u64,
    lane: u64,
) -> Option<(*const u8, *mut u8)> {
    let mut ix = [0u64; 5];
    let pair = index::split_n_divide(item, copy_dims(a), &mut ix);
    // SAFETY: forwarded (the split of item).
    unsafe { pair_span(a, pair, ix, lane, || item == pair * per_pair) }
}

/// The extents a block copy's flat item index splits over, outermost first (the pair index
/// above them): layer, part, token, head, piece.
#[inline(always)]
fn copy_dims(a: &CopyArgs) -> [u64; 5] {
    [a.layers, a.parts, a.tokens, a.heads, a.pieces]
}

/// A block-copy loop's item stepping for group `g`: the extents ([`copy_dims`], each below
/// 2^32: host-checked), the split of the grid stride and that of the group's first item. The
/// loop adds the stride ([`Digits::add`]) instead of dividing each item anew: small pages make
/// many small items, and a division per extent per item was most of a transfer group's work.
#[inline(always)]
fn item_steps(a: &CopyArgs, g: Group) -> ([u32; 5], Digits<5>, Digits<5>) {
    let dims = copy_dims(a).map(|d| d as u32);
    (
        dims,
        Digits::split(g.step, dims),
        Digits::split(g.first, dims),
    )
}

/// [`item_span`] of the item split as `at` ([`Digits`] over [`copy_dims`]).
///
/// # Safety
/// As [`copy_blocks`]; `at` is the split of an item below `num_pairs * per_pair`.
#[inline(always)]
unsafe fn item_span_at(a: &CopyArgs, at: &Digits<5>, lane: u64) -> Option<(*const u8, *mut u8)> {
    // A pair's first item has every digit zero (OR-ed: an array comparison would call
    // `memcmp`, which the driver cannot link).
    let d = at.digits;
    // SAFETY: forwarded.
    unsafe {
        pair_span(a, at.top, d.map(|v| v as u64), lane, || {
            d[0] | d[1] | d[2] | d[3] | d[4] == 0
        })
    }
}

/// [`item_span`] of the item at `ix = [layer, part, token, head, piece]` of pair `pair`;
/// `first()`: it is the pair's first item (the one whose group counts a bad pair), asked only
/// for a pair out of range.
///
/// # Safety
/// As [`copy_blocks`]; `pair < num_pairs` and every index below its extent.
#[inline(always)]
unsafe fn pair_span(
    a: &CopyArgs,
    pair: u64,
    ix: [u64; 5],
    lane: u64,
    first: impl Fn() -> bool,
) -> Option<(*const u8, *mut u8)> {
    let [layer, part, token, head, piece] = ix;
    // SAFETY: pair < num_pairs.
    let (s, d) = unsafe {
        (
            *a.pairs.add(2 * pair as usize),
            *a.pairs.add(2 * pair as usize + 1),
        )
    };
    match index::check_pair(s, d, a.src_blocks, a.dst_blocks) {
        PairCheck::Skip => None,
        PairCheck::OutOfRange => {
            if lane == 0 && first() {
                // SAFETY: see count_error.
                unsafe { count_error(a.errors, err::BAD_BLOCK) };
            }
            None
        }
        PairCheck::Valid => {
            let side = |base: *mut u8, table: *const u64, strides: [u64; 5]| PoolSide {
                base,
                table: if table.is_null() {
                    None
                } else {
                    Some(TablePtr(table))
                },
                parts: a.table_parts,
                strides,
            };
            let src = side(
                a.src_base,
                a.src_table,
                [
                    a.src_layer_stride,
                    a.src_part_stride,
                    a.src_block_stride,
                    a.src_token_stride,
                    a.src_head_stride,
                ],
            );
            let dst = side(
                a.dst_base,
                a.dst_table,
                [
                    a.dst_layer_stride,
                    a.dst_part_stride,
                    a.dst_block_stride,
                    a.dst_token_stride,
                    a.dst_head_stride,
                ],
            );
            let at = [layer, part, token, head];
            let (so, dof) = (
                (piece * a.src_piece_stride) as usize,
                (piece * a.dst_piece_stride) as usize,
            );
            // SAFETY: both blocks are inside their pools, the other indices below their
            // validated extents.
            unsafe {
                Some((
                    chunk_at(&src, s as u64, at).add(so) as *const u8,
                    chunk_at(&dst, d as u64, at).add(dof),
                ))
            }
        }
    }
}

/// The benchmarks' naive baseline: thread per element over `(src, dst)` span pairs, each
/// element's position decomposed from scratch.
///
/// # Safety
/// Every listed span must be readable at its source and writable at its destination.
#[inline(always)]
pub unsafe fn naive_spans(a: &NaiveArgs, g: Group) {
    let total = a.num_spans * a.span_elems;
    let mut i = g.first;
    while i < total {
        let span = i / a.span_elems;
        let e = i - span * a.span_elems;
        // SAFETY: span < num_spans; the caller guarantees the spans.
        unsafe {
            let src = *a.spans.add(2 * span as usize) as *const u8;
            let dst = *a.spans.add(2 * span as usize + 1) as *mut u8;
            let off = (e * a.elem_bytes as u64) as usize;
            copy_span(
                src.add(off),
                dst.add(off),
                a.elem_bytes as u64,
                0,
                1,
                a.elem_bytes,
            );
        }
        i += g.step;
    }
}

/// The value thread `thread` of the spin yardstick computes: a chain of `iters` dependent
/// multiply-adds (`x = x * a + b`, converging to 1 from `thread`'s own start, so it stays finite
/// for any length). Pure register arithmetic: no memory access until the one store. Rust does
/// not fuse the multiply and the add (the PTX has `mul.rn` then `add.rn`), so the GPU computes
/// the very bits the CPU does.
#[inline(always)]
pub fn spin_value(thread: u64, iters: u32) -> f32 {
    const A: f32 = 0.999_9;
    const B: f32 = 1.0e-4;
    let mut x = (thread % 1024) as f32 * 1.0e-3;
    let mut i = 0;
    while i < iters {
        x = x * A + B;
        i += 1;
    }
    x
}

/// The benchmarks' compute-bound yardstick: every thread runs [`spin_value`]'s dependent chain
/// and stores its result in `out[thread]`, so the chain is not optimised away.
///
/// # Safety
/// `out` holds one writable `f32` per thread of the grid.
#[inline(always)]
pub unsafe fn spin(a: &SpinArgs, g: Group) {
    let v = spin_value(g.first, a.iters);
    // SAFETY: one `f32` per thread (the caller's contract); with shift 0, `g.first` is the
    // thread's global index.
    unsafe { *a.out.add(g.first as usize) = v };
}
