//! Index math shared by every kernel: plain functions, unit-tested on the CPU.
//!
//! The kernels trust nothing that lives in device memory (slots, slices, counts, block ids):
//! each such index goes through one of the checks here before it is turned into an address.

/// Positions of the counters in the device-side error word (an array of [`err::WORDS`] `u32`).
pub mod err {
    /// Slot-mapping entries `>= num_blocks * block_size` (skipped).
    pub const BAD_SLOT: usize = 0;
    /// Slices with a bad start, length, source range or page crossing (skipped).
    pub const BAD_SLICE: usize = 1;
    /// Device-side counts outside `0..=capacity` (the whole launch is skipped).
    pub const BAD_COUNT: usize = 2;
    /// Block ids outside their pool (skipped).
    pub const BAD_BLOCK: usize = 3;
    /// Number of `u32` counters in the error word.
    pub const WORDS: usize = 4;
}

/// Where one slot-mapping entry sends its token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotTarget {
    /// A negative slot: padding, the token is skipped silently.
    Skip,
    /// A slot past the end of the cache: skipped and counted as an error.
    OutOfRange,
    /// A valid slot: the block and the token's position inside it.
    At {
        /// Block (page) index, `< num_blocks`.
        block: u64,
        /// Position inside the block, `< block_size`.
        offset: u64,
    },
}

/// Decodes `slot = block * block_size + offset`, guarding against every value of `slot`.
///
/// `block_size` must be non-zero (the host validates it).
#[inline(always)]
pub fn slot_target(slot: i64, block_size: u64, num_blocks: u64) -> SlotTarget {
    if slot < 0 {
        return SlotTarget::Skip;
    }
    let slot = slot as u64;
    let block = div_u64(slot, block_size);
    if block >= num_blocks {
        return SlotTarget::OutOfRange;
    }
    SlotTarget::At {
        block,
        offset: slot - block * block_size,
    }
}

/// Whether eight slots are `s0, s0 + 1, .., s0 + 7` with `s0` a multiple of 8, tested on
/// 32-bit halves (with the low three bits of `s0` clear, adding `i < 8` never carries).
#[inline(always)]
pub fn consecutive8(s: &[i64; 8]) -> bool {
    let (lo0, hi0) = (s[0] as u32, (s[0] as u64 >> 32) as u32);
    let mut acc = lo0 & 7;
    unroll8!(i => {
        let (lo, hi) = (s[i] as u32, (s[i] as u64 >> 32) as u32);
        acc |= (hi ^ hi0) | (lo ^ (lo0 | i as u32));
    });
    acc == 0
}

/// Where whole runs lie around one window of `T` batch tokens (a CTA-phase work item of the v0
/// pages updates), from two masks over the `3 * T` tokens from one window before it to one
/// after it (bit `p` is token `window_start - T + p`):
/// - `aligned`: the token's slot is valid (not negative, inside the cache) and a multiple of
///   `T`;
/// - `follows`: the token is in the batch and its slot is the previous token's plus one.
///
/// A *run* is `T` tokens from an aligned one whose slots follow each other: `T` consecutive
/// slots from a multiple of `T`, so inside one block when blocks hold a multiple of `T` slots.
/// Runs never overlap (the tokens after a run's first are not aligned), so each window holds
/// at most one run start, and a run belongs to the window it starts in. Returns `(covered,
/// start)`: the window's tokens `0..covered` belong to the run the previous window starts,
/// and its own run starts at token `start` (`T` when none does). Wherever the batch holds
/// sequences on pages of their own, every whole aligned group of slots is a run, whatever the
/// token index it starts at. `T` is a power of two from 2 to 64.
#[inline(always)]
pub fn window_runs<const T: u64>(aligned: u128, follows: u128) -> (u64, u64) {
    // Bit c of `r`: tokens c + 1 ..= c + n follow their predecessors, for n doubling up to
    // T / 2, then once more to reach c + T - 1.
    let mut r = follows >> 1;
    let mut n = 1;
    while 2 * n < T {
        r &= r >> n;
        n *= 2;
    }
    if n < T - 1 {
        r &= r >> (T - 1 - n);
    }
    let full = aligned & r;
    let window = (1u128 << T) - 1;
    let (prev, own) = (full & window, (full >> T) & window);
    let covered = if prev != 0 {
        prev.trailing_zeros() as u64
    } else {
        0
    };
    let start = if own != 0 {
        own.trailing_zeros() as u64
    } else {
        T
    };
    (covered, start)
}

/// `log2(n)` when `n` is a power of two, else 64 (split by dividing).
#[inline(always)]
pub fn pow2_shift(n: u64) -> u32 {
    if n.is_power_of_two() {
        n.trailing_zeros()
    } else {
        64
    }
}

/// `(slot / block_size, slot % block_size)`: a shift and a mask where `shift` (from
/// [`pow2_shift`]) is below 64.
#[inline(always)]
pub fn split_slot(slot: u64, block_size: u64, shift: u32) -> (u64, u64) {
    if shift < 64 {
        (slot >> shift, slot & (block_size - 1))
    } else {
        let b = div_u64(slot, block_size);
        (b, slot - b * block_size)
    }
}

/// [`piece_offset`] with a shift and a mask for power-of-two pieces (the v0 key
/// cache's).
#[inline(always)]
pub fn piece_offset_pow2(e: u64, piece: u64, piece_stride: u64, elem: u64) -> u64 {
    if piece.is_power_of_two() {
        let sh = piece.trailing_zeros();
        (e >> sh) * piece_stride + (e & (piece - 1)) * elem
    } else {
        piece_offset(e, piece, piece_stride, elem)
    }
}

/// Byte offset of element `e` of a head vector stored in pieces of `piece` elements (of
/// `elem` bytes), `piece_stride` bytes apart: `(e / piece) * piece_stride + (e % piece) *
/// elem`. A contiguous head is one piece. vLLM's v0 key cache has pieces of `16 / elem`
/// elements `16 * block_size` bytes apart, its value cache pieces of one element
/// `elem * block_size` bytes apart. `piece` must be non-zero.
#[inline(always)]
pub fn piece_offset(e: u64, piece: u64, piece_stride: u64, elem: u64) -> u64 {
    let p = div_u64(e, piece);
    p * piece_stride + (e - p * piece) * elem
}

/// Verdict on one slice `(cache_start, new_kv_start, len)` of the slice-based update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SliceCheck {
    /// `len == 0`: a padding entry, skipped silently.
    Padding,
    /// Out of range, negative, longer than a page or crossing a page: skipped and counted.
    Invalid,
    /// Safe to copy.
    Valid,
}

/// Why a (non-padding) slice is refused, in the order the checks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SliceFault {
    /// `len < 0`, `len > page_size` or `page_size == 0`.
    Length,
    /// `cache_start < 0` or the slice ends past `num_slots`.
    CacheRange,
    /// `src_start < 0` or the slice ends past `num_tokens`.
    SourceRange,
    /// First and last row on different pages.
    CrossesPage,
}

/// The rule for one slice `(cache_start, src_start, len)` with `len != 0`, against the cache
/// (`num_slots` rows in pages of `page_size`) and the source (`num_tokens` rows): `None` when
/// it stays inside one page and inside both buffers, else the first failed check. The kernel
/// ([`check_slice`]) and the host's `validate_slices` both decide through this function.
#[inline(always)]
pub fn slice_fault(
    cache_start: i32,
    src_start: i32,
    len: i32,
    page_size: u32,
    num_slots: u64,
    num_tokens: u64,
) -> Option<SliceFault> {
    if len < 0 || len as u32 > page_size || page_size == 0 {
        return Some(SliceFault::Length);
    }
    let len = len as u64;
    // Each sum is < 2^32: no overflow.
    if cache_start < 0 || cache_start as u64 + len > num_slots {
        return Some(SliceFault::CacheRange);
    }
    if src_start < 0 || src_start as u64 + len > num_tokens {
        return Some(SliceFault::SourceRange);
    }
    let (start, page) = (cache_start as u64, page_size as u64);
    if len > 0 && div_u64(start, page) != div_u64(start + len - 1, page) {
        return Some(SliceFault::CrossesPage);
    }
    None
}

/// Checks one slice against the cache (`num_slots` rows in pages of `page_size`) and the
/// source (`num_tokens` rows). A valid slice stays inside one page and inside both buffers.
#[inline(always)]
pub fn check_slice(
    cache_start: i32,
    src_start: i32,
    len: i32,
    page_size: u32,
    num_slots: u64,
    num_tokens: u64,
) -> SliceCheck {
    if len == 0 {
        SliceCheck::Padding
    } else if slice_fault(
        cache_start,
        src_start,
        len,
        page_size,
        num_slots,
        num_tokens,
    )
    .is_some()
    {
        SliceCheck::Invalid
    } else {
        SliceCheck::Valid
    }
}

/// Reads a device-side count: `Some(n)` when `0 <= raw <= capacity`, else `None`
/// (the kernel then does nothing and counts [`err::BAD_COUNT`]).
#[inline(always)]
pub fn checked_count(raw: i32, capacity: u32) -> Option<u32> {
    if raw < 0 || raw as u32 > capacity {
        None
    } else {
        Some(raw as u32)
    }
}

/// Splits a flat item index into `(outer, mid, inner)` with `mid < n_mid`, `inner < n_inner`,
/// i.e. the inverse of `(outer * n_mid + mid) * n_inner + inner`. Both sizes must be non-zero.
#[inline(always)]
pub fn split3(item: u64, n_mid: u64, n_inner: u64) -> (u64, u64, u64) {
    let mut ix = [0u64; 2];
    let outer = split_n(item, [n_mid, n_inner], &mut ix);
    (outer, ix[0], ix[1])
}

/// `(n / d, n % d)` in 32 bits: a shift and a mask when `d` is a power of two. `d` must be
/// non-zero.
#[inline(always)]
pub fn split_u32(n: u32, d: u32) -> (u32, u32) {
    if d.is_power_of_two() {
        (n >> d.trailing_zeros(), n & (d - 1))
    } else {
        (n / d, n % d)
    }
}

/// Division that takes the cheap 32-bit path when both operands fit (64-bit division is a
/// long software sequence on the GPU). `d` must be non-zero.
#[inline(always)]
pub fn div_u64(n: u64, d: u64) -> u64 {
    if (n | d) >> 32 == 0 {
        ((n as u32) / (d as u32)) as u64
    } else {
        n / d
    }
}

/// The widest access (16, 8, 4, 2 or 1 bytes) that divides every value given: pass every base
/// address, stride and span length a copy will use, and each access is then naturally aligned.
#[inline(always)]
pub fn access_width(values: &[u64]) -> u32 {
    let mut acc: u64 = 16;
    for v in values {
        acc |= *v;
    }
    // lowest set bit of (16 | all values) is the largest power of two dividing them all, ≤ 16
    (acc & acc.wrapping_neg()) as u32
}

/// Lanes that share one span: the smallest power of two (≤ 32) that, with `per_lane` accesses
/// each, covers `units` accesses. Returned as `log2(lanes)`.
#[inline(always)]
pub fn group_shift(units: u64, per_lane: u64) -> u32 {
    let mut shift = 0u32;
    while shift < 5 && (1u64 << shift) * per_lane < units {
        shift += 1;
    }
    shift
}

/// Verdict on one `(src, dst)` block pair of a block copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PairCheck {
    /// A negative id on either side: padding, skipped silently.
    Skip,
    /// An id past its pool: skipped and counted as [`err::BAD_BLOCK`].
    OutOfRange,
    /// Both ids inside their pools.
    Valid,
}

/// Which id of a (non-padding) pair is past its pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PairFault {
    /// The source id (checked first).
    Src,
    /// The destination id.
    Dst,
}

/// Checks a block pair against the two pools' block counts.
#[inline(always)]
pub fn check_pair(src: i64, dst: i64, src_blocks: u64, dst_blocks: u64) -> PairCheck {
    if src < 0 || dst < 0 {
        PairCheck::Skip
    } else if pair_fault(src, dst, src_blocks, dst_blocks).is_some() {
        PairCheck::OutOfRange
    } else {
        PairCheck::Valid
    }
}

/// The range rule for a pair with both ids non-negative: `None` when both are inside their
/// pools, else the first id past its pool. [`check_pair`] and the host's block-map validation
/// both decide through this function. (A negative id reads as past any pool.)
#[inline(always)]
pub fn pair_fault(src: i64, dst: i64, src_blocks: u64, dst_blocks: u64) -> Option<PairFault> {
    if src as u64 >= src_blocks {
        Some(PairFault::Src)
    } else if dst as u64 >= dst_blocks {
        Some(PairFault::Dst)
    } else {
        None
    }
}

/// The per-(layer, part) cache bases of a layer-separate pool, entry `layer * parts + part`:
/// the host's copy as a slice, or the device-resident table on the GPU ([`TablePtr`]).
pub trait BaseTable {
    /// Entry `i`.
    ///
    /// # Safety
    /// `i` is below the table's length.
    unsafe fn entry(&self, i: u64) -> u64;
}

impl BaseTable for &[u64] {
    #[inline(always)]
    unsafe fn entry(&self, i: u64) -> u64 {
        self[i as usize]
    }
}

/// A table of bases given by its address (the kernels' view of a `LayerTable`).
#[derive(Clone, Copy, Debug)]
pub struct TablePtr(pub *const u64);

impl BaseTable for TablePtr {
    #[inline(always)]
    unsafe fn entry(&self, i: u64) -> u64 {
        // SAFETY: forwarded (the table holds entry `i`).
        unsafe { *self.0.add(i as usize) }
    }
}

/// One side of a block copy as addressing sees it: where each (layer, part) cache starts and
/// the byte strides `[layer, part, block, token, head]` (layer and part strides apply only
/// without a table).
#[derive(Clone, Copy, Debug)]
pub struct PoolSide<T> {
    /// Base of a strided pool (ignored with a table).
    pub base: *mut u8,
    /// Per-(layer, part) bases, `parts` entries per layer; `None` for a strided pool.
    pub table: Option<T>,
    /// Entries per layer of the table.
    pub parts: u64,
    /// Byte strides: layer, part, block, token, head.
    pub strides: [u64; 5],
}

/// Address of chunk `(layer, part, token, head)` of block `block` of a pool side: the one
/// addressing rule of block copies, used by the kernel (device table) and by the host's DMA
/// planning (host slice). Computed with wrapping arithmetic, so the host may compute device
/// addresses; nothing is dereferenced but the table.
///
/// # Safety
/// With a table, `layer * parts + part` is below its length.
#[inline(always)]
pub unsafe fn chunk_at<T: BaseTable + Copy>(
    side: &PoolSide<T>,
    block: u64,
    ix: [u64; 4],
) -> *mut u8 {
    let [layer, part, token, head] = ix;
    let [ls, ps, bs, ts, hs] = side.strides;
    let base = match side.table {
        // SAFETY: forwarded from the caller.
        Some(t) => (unsafe { t.entry(layer * side.parts + part) }) as *mut u8,
        None => side.base.wrapping_add((layer * ls + part * ps) as usize),
    };
    base.wrapping_add((block * bs + token * ts + head * hs) as usize)
}

/// Splits a flat item index over the nested extents `dims` (outermost first, each non-zero)
/// into one index per extent, written to `out`; returns the outermost quotient (the index past
/// all of `dims`). An extent that is a power of two (head counts, head-dim groups, K/V) splits
/// with a shift instead of a division: the divisions are a chain of dependent steps in front
/// of a decode-size update's first load (H200, slot update in a graph: 1.57 -> 1.40 us at
/// T = 1).
#[inline(always)]
pub fn split_n<const N: usize>(item: u64, dims: [u64; N], out: &mut [u64; N]) -> u64 {
    split_with::<N, true>(item, dims, out)
}

/// [`split_n`] dividing by every extent, for the block copies' item lookup: there the
/// power-of-two test changed the transfer kernel's code and cost onload 5% (H200, both
/// binaries in one run).
#[inline(always)]
pub fn split_n_divide<const N: usize>(item: u64, dims: [u64; N], out: &mut [u64; N]) -> u64 {
    split_with::<N, false>(item, dims, out)
}

/// A flat item index split over nested extents ([`split_n_divide`]), each extent below 2^32:
/// the outermost quotient `top` and one digit per extent (the last fastest), each below its
/// extent. [`Digits::add`] advances it by another split index without dividing, so a loop with
/// a fixed stride splits its first item and its stride once and then adds: a few instructions
/// per extent instead of one division each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Digits<const N: usize> {
    /// The index past all of the extents (the outermost quotient).
    pub top: u64,
    /// The index within each extent, outermost first.
    pub digits: [u32; N],
}

impl<const N: usize> Digits<N> {
    /// `item` split over `dims` (outermost first, each non-zero and below 2^32).
    #[inline(always)]
    pub fn split(item: u64, dims: [u32; N]) -> Self {
        let mut wide = [0u64; N];
        let top = split_n_divide(item, dims.map(|d| d as u64), &mut wide);
        Digits {
            top,
            // Each digit is below its extent, so below 2^32.
            digits: wide.map(|d| d as u32),
        }
    }

    /// The split of the sum of the two indices `self` and `step`, both split over `dims`:
    /// digit by digit from the fastest, carrying (each sum of two digits and a carry lies below
    /// twice the extent, so one subtraction reduces it; twice an extent below 2^32 fits in 64
    /// bits).
    #[inline(always)]
    pub fn add(&self, step: &Self, dims: [u32; N]) -> Self {
        let mut out = *self;
        let mut carry = 0u64;
        let mut i = N;
        while i > 0 {
            i -= 1;
            let v = self.digits[i] as u64 + step.digits[i] as u64 + carry;
            let over = v >= dims[i] as u64;
            out.digits[i] = (if over { v - dims[i] as u64 } else { v }) as u32;
            carry = over as u64;
        }
        out.top = self.top + step.top + carry;
        out
    }
}

#[inline(always)]
fn split_with<const N: usize, const SHIFT: bool>(
    mut item: u64,
    dims: [u64; N],
    out: &mut [u64; N],
) -> u64 {
    let mut i = N;
    while i > 0 {
        i -= 1;
        let d = dims[i];
        let q = if SHIFT && d.is_power_of_two() {
            item >> d.trailing_zeros()
        } else {
            div_u64(item, d)
        };
        out[i] = item - q * d;
        item = q;
    }
    item
}
