//! The write path: new K/V tokens into a paged cache, by slot mapping or by slices.
//!
//! Both launchers validate every host-side argument first (typed errors, nothing launched),
//! then enqueue exactly one kernel on the caller's stream: no allocation, no synchronisation,
//! so they can be captured in a CUDA graph. Indices that live on the device (slots, slices,
//! the slice count) are checked by the kernel: bad ones are skipped and counted in the
//! [`DeviceErrors`] word, so nothing is ever written outside the cache.

use kvio_kernels::args::{SliceArgs, SlotArgs};
use kvio_kernels::index::{access_width, group_shift};

use crate::driver::{Params, StreamRef};
use crate::error::{invalid, Error, Result};
use crate::layout::{chunks_disjoint, PagedLayout, TokenLayout};
use crate::mem::{DeviceBytes, DeviceErrors};
use crate::module::Kvio;

/// Threads per block of every kvio launch.
pub(crate) const BLOCK_THREADS: u32 = 256;
/// Accesses each lane of a group is given per span (enough loads in flight, few idle lanes).
pub(crate) const PER_LANE: u64 = 4;

/// A device-resident slot mapping: one slot per token, `slot = block * block_size + offset`,
/// negative = skip the token.
///
/// ```
/// // SAFETY: a description only (three i32 slots at some device address).
/// let slots = unsafe { kvio::DeviceBytes::from_raw(0x7f00_0000_0000, 12) };
/// let mapping = kvio::SlotMapping::I32(slots);
/// assert_eq!(mapping.len(), 3);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotMapping {
    /// `i32` slots (4 bytes each).
    I32(DeviceBytes),
    /// `i64` slots (8 bytes each; vLLM's `slot_mapping`).
    I64(DeviceBytes),
}

impl SlotMapping {
    fn parts(&self) -> (DeviceBytes, usize) {
        match *self {
            SlotMapping::I32(b) => (b, 4),
            SlotMapping::I64(b) => (b, 8),
        }
    }

    /// Number of slots (tokens) the mapping holds.
    pub fn len(&self) -> usize {
        let (b, w) = self.parts();
        b.len() / w
    }

    /// Whether it holds no slot.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Arguments of [`Kvio::update_slots`] (vLLM `reshape_and_cache_flash` semantics).
///
/// Token `t < slots.len()` of `key` (and `value`) is written to slot `slots[t]` of `key_cache`
/// (and `value_cache`). K and V caches share one [`PagedLayout`]; for a combined K/V
/// allocation pass two views of it (e.g. `value_cache` = `key_cache` + the V offset).
///
/// Run here through the CPU emulation on host memory; on a GPU the same value goes to
/// [`Kvio::update_slots`] (see its example) with device memory.
///
/// ```
/// use kvio::{DeviceBytes, PagedLayout, SlotMapping, SlotUpdate, TokenLayout};
/// // Two tokens of one head of 4 f32 into an NHD cache of 2 blocks × 2 slots.
/// let key: Vec<f32> = (0..8).map(|x| x as f32).collect();
/// let mut cache = vec![0f32; 2 * 2 * 4];
/// let slots = [3i64, -1]; // token 0 -> block 1, offset 1; token 1 skipped
/// // SAFETY: host memory, used by the emulation only.
/// let op = unsafe {
///     SlotUpdate {
///         key: DeviceBytes::from_raw(key.as_ptr() as u64, 32),
///         value: None,
///         input: TokenLayout::contiguous(2, 1, 4, 4),
///         key_cache: DeviceBytes::from_raw(cache.as_mut_ptr() as u64, 64),
///         value_cache: None,
///         cache: PagedLayout::nhd(2, 2, 1, 4, 4),
///         slots: SlotMapping::I64(DeviceBytes::from_raw(slots.as_ptr() as u64, 16)),
///         errors: None,
///     }
/// };
/// // SAFETY: every view is live host memory of its length.
/// unsafe { kvio::emulate::update_slots(&op) }.unwrap();
/// assert_eq!(cache[12..16], [0.0, 1.0, 2.0, 3.0]);
/// assert!(cache[..12].iter().all(|&x| x == 0.0));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct SlotUpdate<'a> {
    /// New keys, `[T, H, D]` as described by `input`.
    pub key: DeviceBytes,
    /// New values (same layout as `key`), or `None` to write K only.
    pub value: Option<DeviceBytes>,
    /// Layout of `key` and `value`.
    pub input: TokenLayout,
    /// The key cache.
    pub key_cache: DeviceBytes,
    /// The value cache; `Some` exactly when `value` is.
    pub value_cache: Option<DeviceBytes>,
    /// Layout of each cache.
    pub cache: PagedLayout,
    /// Slot per token; its length is the number of tokens written (`≤ input.num_tokens`).
    pub slots: SlotMapping,
    /// Where to count slots past the end of the cache (`None`: skipped, not counted).
    pub errors: Option<&'a DeviceErrors>,
}

/// Arguments of [`Kvio::update_slices`] (vLLM TPU `kv_cache_update` semantics).
///
/// `slices` is `[3, padded]` `i32` in struct-of-arrays form: row 0 the first cache slot, row 1
/// the first token of `new_kv`, row 2 the length. Only the first `*num_slices` entries are
/// used (the count lives on the device, so the same padded launch can be replayed in a CUDA
/// graph with another count). A slice has `0 < len ≤ block_size` and stays inside one page;
/// `len == 0` is padding.
///
/// Run here through the CPU emulation on host memory; on a GPU the same value goes to
/// [`Kvio::update_slices`] with device memory.
///
/// ```
/// use kvio::plan::{slices_to_table, slots_to_slices};
/// use kvio::{DeviceBytes, PagedLayout, SliceUpdate, TokenLayout};
/// // Three tokens of one head of 2 u16 into a flat cache of 4 pages × 2 slots.
/// let rows: Vec<u16> = (0..6).collect();
/// let mut cache = vec![0u16; 4 * 2 * 2];
/// let slices = slots_to_slices(&[2i64, 3, 6], 2).unwrap(); // [2, 3] and [6]
/// let table = slices_to_table(&slices, 4).unwrap(); // `[3, 4]`, padded
/// let count = [slices.len() as i32];
/// // SAFETY: host memory, used by the emulation only.
/// let op = unsafe {
///     SliceUpdate {
///         new_kv: DeviceBytes::from_raw(rows.as_ptr() as u64, 12),
///         input: TokenLayout::contiguous(3, 1, 2, 2),
///         cache: DeviceBytes::from_raw(cache.as_mut_ptr() as u64, 32),
///         layout: PagedLayout::nhd(4, 2, 1, 2, 2),
///         slices: DeviceBytes::from_raw(table.as_ptr() as u64, 48),
///         padded: 4,
///         num_slices: DeviceBytes::from_raw(count.as_ptr() as u64, 4),
///         errors: None,
///     }
/// };
/// // SAFETY: every view is live host memory of its length.
/// unsafe { kvio::emulate::update_slices(&op) }.unwrap();
/// assert_eq!(cache[4..8], [0, 1, 2, 3]); // slots 2 and 3: tokens 0 and 1
/// assert_eq!(cache[12..14], [4, 5]); // slot 6: token 2
/// ```
#[derive(Clone, Copy, Debug)]
pub struct SliceUpdate<'a> {
    /// New K/V rows, `[T, H', D]` (each token's heads contiguous).
    pub new_kv: DeviceBytes,
    /// Layout of `new_kv`.
    pub input: TokenLayout,
    /// The cache, written in place.
    pub cache: DeviceBytes,
    /// Layout of the cache (each slot's heads contiguous; page = block).
    pub layout: PagedLayout,
    /// `[3, padded]` `i32` slice table on the device.
    pub slices: DeviceBytes,
    /// Capacity of the slice table.
    pub padded: usize,
    /// One device `i32`: how many slices are real.
    pub num_slices: DeviceBytes,
    /// Where to count refused slices and counts (`None`: skipped, not counted).
    pub errors: Option<&'a DeviceErrors>,
}

fn fits(name: &'static str, needed: u64, buf: &DeviceBytes) -> Result<()> {
    if needed > buf.len() as u64 {
        Err(Error::BufferTooSmall {
            name,
            needed,
            len: buf.len() as u64,
        })
    } else {
        Ok(())
    }
}

fn same_shape(input: &TokenLayout, cache: &PagedLayout) -> Result<()> {
    if input.num_heads != cache.num_heads
        || input.head_dim != cache.head_dim
        || input.elem_bytes != cache.elem_bytes
    {
        return Err(invalid(
            "input",
            (input.num_heads, input.head_dim, input.elem_bytes),
            "(num_heads, head_dim, elem_bytes) differ from the cache's",
        ));
    }
    Ok(())
}

/// Blocks for `items` work items handled by groups of `1 << shift` lanes, capped so the grid
/// stays resident-sized (the kernels loop over the rest).
fn grid_for(items: u64, shift: u32, max_blocks: u32) -> u32 {
    let groups_per_block = (BLOCK_THREADS >> shift) as u64;
    items
        .div_ceil(groups_per_block)
        .clamp(1, max_blocks.max(1) as u64) as u32
}

fn err_ptr(e: Option<&DeviceErrors>) -> u64 {
    e.map_or(0, DeviceErrors::ptr)
}

impl Kvio {
    /// Writes new tokens into a paged cache by slot mapping. See [`SlotUpdate`].
    ///
    /// ```no_run
    /// # fn main() -> kvio::Result<()> {
    /// use cust::memory::DeviceBuffer;
    /// use kvio::{DeviceBytes, PagedLayout, SlotMapping, SlotUpdate, StreamRef, TokenLayout};
    /// let _ctx = kvio::PrimaryContext::retain(0)?;
    /// let kv = kvio::Kvio::load()?;
    /// let stream = cust::stream::Stream::new(cust::stream::StreamFlags::NON_BLOCKING, None).unwrap();
    /// let (t, h, d) = (4, 8, 128);
    /// let cache = PagedLayout::nhd(64, 16, h, d, 2); // bf16
    /// let key = DeviceBuffer::from_slice(&vec![1u16; t * h * d]).unwrap();
    /// let value = DeviceBuffer::from_slice(&vec![2u16; t * h * d]).unwrap();
    /// let kc = DeviceBuffer::from_slice(&vec![0u16; 64 * 16 * h * d]).unwrap();
    /// let vc = DeviceBuffer::from_slice(&vec![0u16; 64 * 16 * h * d]).unwrap();
    /// let slots = DeviceBuffer::from_slice(&[17i64, 18, -1, 40]).unwrap();
    /// kv.update_slots(&SlotUpdate {
    ///     key: DeviceBytes::of(&key),
    ///     value: Some(DeviceBytes::of(&value)),
    ///     input: TokenLayout::contiguous(t, h, d, 2),
    ///     key_cache: DeviceBytes::of(&kc),
    ///     value_cache: Some(DeviceBytes::of(&vc)),
    ///     cache,
    ///     slots: SlotMapping::I64(DeviceBytes::of(&slots)),
    ///     errors: None,
    /// }, StreamRef::from_cust(&stream))?;
    /// # Ok(()) }
    /// ```
    pub fn update_slots(&self, op: &SlotUpdate<'_>, stream: StreamRef<'_>) -> Result<()> {
        let Some((args, grid)) = plan_slots(op, self.grid_cap.slots)? else {
            return Ok(());
        };
        Params::new(&args.to_words(), &SlotArgs::SIZES).launch(
            self.update_slots,
            grid,
            BLOCK_THREADS,
            stream,
        )
    }

    /// Copies slices of new rows into a paged cache in place. See [`SliceUpdate`].
    ///
    /// ```no_run
    /// # fn main() -> kvio::Result<()> {
    /// use cust::memory::DeviceBuffer;
    /// use kvio::plan::{slices_to_table, slots_to_slices};
    /// use kvio::{DeviceBytes, PagedLayout, SliceUpdate, StreamRef, TokenLayout};
    /// let _ctx = kvio::PrimaryContext::retain(0)?;
    /// let kv = kvio::Kvio::load()?;
    /// let stream = cust::stream::Stream::new(cust::stream::StreamFlags::NON_BLOCKING, None).unwrap();
    /// let (t, h2, d, page) = (5, 16, 128, 16); // K and V heads together: H' = 2H
    /// let layout = PagedLayout::nhd(64, page, h2, d, 2); // flat [64*16, H', D] bf16
    /// let new_kv = DeviceBuffer::from_slice(&vec![1u16; t * h2 * d]).unwrap();
    /// let cache = DeviceBuffer::from_slice(&vec![0u16; 64 * page * h2 * d]).unwrap();
    /// let slices = slots_to_slices(&[30i64, 31, 32, 33, 100], page)?; // 3 slices
    /// let padded = 8; // fixed capacity: the same launch serves any count up to 8
    /// let table = DeviceBuffer::from_slice(&slices_to_table(&slices, padded)?).unwrap();
    /// let count = DeviceBuffer::from_slice(&[slices.len() as i32]).unwrap();
    /// kv.update_slices(&SliceUpdate {
    ///     new_kv: DeviceBytes::of(&new_kv),
    ///     input: TokenLayout::contiguous(t, h2, d, 2),
    ///     cache: DeviceBytes::of(&cache),
    ///     layout,
    ///     slices: DeviceBytes::of(&table),
    ///     padded,
    ///     num_slices: DeviceBytes::of(&count),
    ///     errors: None,
    /// }, StreamRef::from_cust(&stream))?;
    /// # Ok(()) }
    /// ```
    pub fn update_slices(&self, op: &SliceUpdate<'_>, stream: StreamRef<'_>) -> Result<()> {
        let (args, grid) = plan_slices(op, self.grid_cap.slices)?;
        Params::new(&args.to_words(), &SliceArgs::SIZES).launch(
            self.update_slices,
            grid,
            BLOCK_THREADS,
            stream,
        )
    }
}

/// Validates a slot update and returns the kernel arguments and grid; `None` when there is
/// nothing to do (no token).
pub(crate) fn plan_slots(op: &SlotUpdate<'_>, max_blocks: u32) -> Result<Option<(SlotArgs, u32)>> {
    let src_ext = op.input.extent("input")?;
    let dst_ext = op.cache.extent("cache")?;
    same_shape(&op.input, &op.cache)?;
    fits("key", src_ext, &op.key)?;
    fits("key_cache", dst_ext, &op.key_cache)?;
    match (op.value, op.value_cache) {
        (Some(v), Some(vc)) => {
            fits("value", src_ext, &v)?;
            fits("value_cache", dst_ext, &vc)?;
            let (k, vp) = (op.key_cache.ptr(), vc.ptr());
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
        (None, None) => {}
        _ => {
            return Err(invalid(
                "value",
                op.value.is_some(),
                "value and value_cache must be given together",
            ))
        }
    }
    let (slots, w) = op.slots.parts();
    if slots.len() % w != 0 {
        return Err(invalid(
            "slots",
            slots.len(),
            "byte length is not a multiple of the slot size",
        ));
    }
    if slots.ptr() % w as u64 != 0 {
        return Err(invalid(
            "slots",
            slots.ptr(),
            "misaligned for its element type",
        ));
    }
    let n = op.slots.len();
    if n > op.input.num_tokens {
        return Err(invalid("slots", n, "more slots than input tokens"));
    }
    if n == 0 {
        return Ok(None);
    }
    let e = op.cache.elem_bytes as u64;
    let (c, i) = (&op.cache, &op.input);
    // Merge all heads of a token into one span when both sides hold them contiguously.
    let merged = (c.num_heads == 1 || c.head_stride == c.head_dim)
        && (i.num_heads == 1 || i.head_stride == i.head_dim);
    let (heads, chunk) = if merged {
        (1, (c.num_heads * c.chunk_bytes()) as u64)
    } else {
        (c.num_heads as u64, c.chunk_bytes() as u64)
    };
    let (slots, w) = op.slots.parts();
    let mut args = SlotArgs {
        src_k: op.key.ptr() as *const u8,
        src_v: op.value.map_or(0, |b| b.ptr()) as *const u8,
        src_token_stride: i.token_stride as u64 * e,
        src_head_stride: if merged { 0 } else { i.head_stride as u64 * e },
        dst_k: op.key_cache.ptr() as *mut u8,
        dst_v: op.value_cache.map_or(0, |b| b.ptr()) as *mut u8,
        dst_block_stride: c.block_stride as u64 * e,
        dst_token_stride: c.token_stride as u64 * e,
        dst_head_stride: if merged { 0 } else { c.head_stride as u64 * e },
        num_blocks: c.num_blocks as u64,
        block_size: c.block_size as u64,
        heads,
        chunk_bytes: chunk,
        slots: slots.ptr() as *const u8,
        slot_is_i64: (w == 8) as u32,
        num_tokens: n as u64,
        width: 0,
        shift: 0,
        errors: err_ptr(op.errors) as *mut u32,
    };
    args.width = access_width(&[
        args.src_k as u64,
        args.src_v as u64,
        args.dst_k as u64,
        args.dst_v as u64,
        args.src_token_stride,
        args.src_head_stride,
        args.dst_block_stride,
        args.dst_token_stride,
        args.dst_head_stride,
        chunk,
    ]);
    args.shift = group_shift(chunk / args.width as u64, PER_LANE);
    let parts = if op.value.is_some() { 2 } else { 1 };
    // The kernel iterates over this many items: refuse a count that would wrap.
    let items = (n as u64)
        .checked_mul(parts)
        .and_then(|v| v.checked_mul(heads))
        .ok_or(Error::Overflow { name: "slots" })?;
    Ok(Some((args, grid_for(items, args.shift, max_blocks))))
}

/// Bytes of rows one work item of the slice update copies (at most).
const SLICE_ITEM_BYTES: usize = 8192;

/// Validates a slice update and returns the kernel arguments and grid.
pub(crate) fn plan_slices(op: &SliceUpdate<'_>, max_blocks: u32) -> Result<(SliceArgs, u32)> {
    let src_ext = op.input.extent("input")?;
    let dst_ext = op.layout.extent("layout")?;
    same_shape(&op.input, &op.layout)?;
    fits("new_kv", src_ext, &op.new_kv)?;
    fits("cache", dst_ext, &op.cache)?;
    let (l, i) = (&op.layout, &op.input);
    if !(l.num_heads == 1 || l.head_stride == l.head_dim)
        || !(i.num_heads == 1 || i.head_stride == i.head_dim)
    {
        return Err(invalid(
            "layout",
            (l.head_stride, i.head_stride),
            "slice update needs each token's heads contiguous",
        ));
    }
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
    fits("slices", table, &op.slices)?;
    fits("num_slices", 4, &op.num_slices)?;
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
    Ok((args, grid_for(op.padded as u64 * pieces, shift, max_blocks)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(ptr: u64, len: usize) -> DeviceBytes {
        // SAFETY: these views are only validated, never used.
        unsafe { DeviceBytes::from_raw(ptr, len) }
    }

    fn slot_op<'a>(cache: PagedLayout, n: usize) -> SlotUpdate<'a> {
        let input = TokenLayout::contiguous(n, cache.num_heads, cache.head_dim, cache.elem_bytes);
        let ext = cache.extent("c").unwrap() as usize;
        let src = input.extent("i").unwrap() as usize;
        SlotUpdate {
            key: bytes(0x1000_0000, src),
            value: Some(bytes(0x2000_0000, src)),
            input,
            key_cache: bytes(0x4000_0000, ext),
            value_cache: Some(bytes(0x8000_0000, ext)),
            cache,
            slots: SlotMapping::I64(bytes(0x3000_0000, n * 8)),
            errors: None,
        }
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
        op.key_cache = bytes(0x4000_0000, 100);
        assert!(matches!(
            plan_slots(&op, 1),
            Err(Error::BufferTooSmall {
                name: "key_cache",
                ..
            })
        ));
        let mut op = base;
        op.value = None;
        assert!(matches!(
            plan_slots(&op, 1),
            Err(Error::InvalidArgument { name: "value", .. })
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
        op.value_cache = Some(op.key_cache);
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
        op.key_cache = bytes(0x4000_0000, total);
        op.value_cache = Some(bytes(0x4000_0000 + (h * d * 2) as u64, total - h * d * 2));
        assert!(plan_slots(&op, 1).is_ok());
        // V shifted by one element only: overlaps K.
        op.value_cache = Some(bytes(0x4000_0000 + 2, total - 2));
        assert!(plan_slots(&op, 1).is_err());
    }

    fn slice_op<'a>(layout: PagedLayout, t: usize, padded: usize) -> SliceUpdate<'a> {
        let input =
            TokenLayout::contiguous(t, layout.num_heads, layout.head_dim, layout.elem_bytes);
        SliceUpdate {
            new_kv: bytes(0x1000_0000, input.extent("i").unwrap() as usize),
            input,
            cache: bytes(0x4000_0000, layout.extent("l").unwrap() as usize),
            layout,
            slices: bytes(0x2000_0000, padded * 12),
            padded,
            num_slices: bytes(0x3000_0000, 4),
            errors: None,
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
        bad.layout = PagedLayout::hnd(8, 16, 16, 128, 2);
        assert!(matches!(
            plan_slices(&bad, 1),
            Err(Error::InvalidArgument { name: "layout", .. })
        ));
        let mut bad = op;
        bad.num_slices = bytes(0x3000_0002, 4);
        assert!(plan_slices(&bad, 1).is_err());
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
        let op = SlotUpdate {
            key: bytes(0x1000_0000, src),
            value: Some(bytes(0x2000_0000_0000, src)),
            input,
            key_cache: bytes(0x4000_0000_0000, ext),
            value_cache: Some(bytes(0x8000_0000_0000, ext)),
            cache,
            slots: SlotMapping::I32(bytes(0x3000_0000, n * 4)),
            errors: None,
        };
        assert!(matches!(
            plan_slots(&op, 132),
            Err(Error::Overflow { name: "slots" })
        ));
    }
}
