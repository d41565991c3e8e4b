//! The write path: new K/V tokens into a paged cache, by slot mapping or by slices.
//!
//! The descriptors live here; [`plan`] validates each into one kernel launch (typed errors,
//! nothing launched on a bad argument). No allocation, no synchronisation: both can be
//! captured in a CUDA graph. Indices that live on the device (slots, slices, the slice count)
//! are checked by the kernel: bad ones are skipped and counted in the [`DeviceErrors`] word,
//! so nothing is ever written outside the cache.

pub(crate) mod plan;

use crate::driver::StreamRef;
use crate::error::Result;
use crate::error_word::DeviceErrors;
use crate::layout::{PagedLayout, TokenLayout};
use crate::mem::{DeviceBytes, DeviceBytesMut};
use crate::module::Kvio;

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
pub enum SlotMapping<'a> {
    /// `i32` slots (4 bytes each).
    I32(DeviceBytes<'a>),
    /// `i64` slots (8 bytes each; vLLM's `slot_mapping`).
    I64(DeviceBytes<'a>),
}

impl<'a> SlotMapping<'a> {
    /// The bytes and the size of one slot.
    pub(crate) fn parts(&self) -> (DeviceBytes<'a>, usize) {
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

/// New rows and the cache they are written to: K's or V's half of an update. The rows are
/// read, the cache written, so its view is a [`DeviceBytesMut`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheWrite<'a> {
    /// New rows, `[T, H, D]` as the update's `input` layout describes.
    pub src: DeviceBytes<'a>,
    /// The cache, laid out as the update's cache layout.
    pub dst: DeviceBytesMut<'a>,
}

/// Element type of new rows that are quantized on write ([`Quantize`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SrcType {
    /// bfloat16 (2 bytes).
    Bf16,
    /// IEEE half (2 bytes).
    F16,
    /// IEEE single (4 bytes).
    F32,
}

impl SrcType {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            SrcType::Bf16 | SrcType::F16 => 2,
            SrcType::F32 => 4,
        }
    }
}

/// fp8 format of a quantized cache (one byte per element): the kernels' own enum,
/// `E4m3` (`float8_e4m3fn`, vLLM `fp8` / `fp8_e4m3`) or `E5m2` (vLLM `fp8_e5m2`).
pub use kvio_kernels::fp8::Fp8;

/// Where a quantization scale lives: f32 on the device (read by the kernel at each launch, so
/// a captured CUDA graph replays with whatever scale is there).
///
/// Any f32 is exact, but the kernels' fast division (one reciprocal per scale, three
/// operations an element) serves positive scales in `[2^-32, 2^32]`, the ones stacks store;
/// other scales (negative, zero, tiny, huge, inf, NaN) divide element by element, slower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale<'a> {
    /// One f32 for the whole tensor.
    PerTensor(DeviceBytes<'a>),
    /// One f32 per KV head (`[H]`).
    PerHead(DeviceBytes<'a>),
}

/// fp8 quantize-on-write (vLLM's `kv_cache_dtype = "fp8"` with `k_scale`/`v_scale`): every
/// element is stored as `fp8(x / scale)`, rounded to nearest even, finite values past the
/// format's range and ±inf saturated to ±max, NaN stored as NaN (`0x7f`). The update's input
/// layout has the source type's element size, its cache layout one byte per element.
///
/// ```
/// use kvio::{DeviceBytes, Fp8, Quantize, Scale, SrcType};
/// // SAFETY: descriptions only.
/// let (k, v) = unsafe { (DeviceBytes::from_raw(0x1000, 4), DeviceBytes::from_raw(0x1004, 4)) };
/// let q = Quantize::new(SrcType::Bf16, Fp8::E4m3, Scale::PerTensor(k)).value_scale(Scale::PerTensor(v));
/// assert_eq!(q.v_scale, Some(Scale::PerTensor(v)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantize<'a> {
    /// Type of the new rows.
    pub src: SrcType,
    /// Format of the caches.
    pub fp8: Fp8,
    /// K's scale.
    pub k_scale: Scale<'a>,
    /// V's scale, of the same kind as K's: given exactly when the update writes V.
    pub v_scale: Option<Scale<'a>>,
}

impl<'a> Quantize<'a> {
    /// Quantization of K only (add V's scale with [`Quantize::value_scale`]).
    pub fn new(src: SrcType, fp8: Fp8, k_scale: Scale<'a>) -> Self {
        Quantize {
            src,
            fp8,
            k_scale,
            v_scale: None,
        }
    }

    /// V's scale.
    pub fn value_scale(self, v_scale: Scale<'a>) -> Self {
        Quantize {
            v_scale: Some(v_scale),
            ..self
        }
    }
}

/// Arguments of [`Kvio::update_slots`] (vLLM `reshape_and_cache_flash` semantics).
///
/// Token `t < slots.len()` of `key.src` (and `value.src`) is written to slot `slots[t]` of
/// `key.dst` (and `value.dst`). K and V caches share one [`PagedLayout`]; for a combined K/V
/// allocation pass two views of it ([`DeviceBytesMut::split_at`], or the V offset with
/// [`DeviceBytesMut::slice`]: K and V chunks must not share bytes).
///
/// Run here through the CPU emulation on host memory; on a GPU the same value goes to
/// [`Kvio::update_slots`] (see its example) with device memory.
///
/// ```
/// use kvio::{CacheWrite, DeviceBytes, DeviceBytesMut, PagedLayout, SlotMapping, SlotUpdate, TokenLayout};
/// // Two tokens of one head of 4 f32 into an NHD cache of 2 blocks × 2 slots.
/// let key: Vec<f32> = (0..8).map(|x| x as f32).collect();
/// let mut cache = vec![0f32; 2 * 2 * 4];
/// let slots = [3i64, -1]; // token 0 -> block 1, offset 1; token 1 skipped
/// // SAFETY: host memory, used by the emulation only.
/// let op = unsafe {
///     SlotUpdate {
///         key: CacheWrite {
///             src: DeviceBytes::from_raw(key.as_ptr() as u64, 32),
///             dst: DeviceBytesMut::from_raw(cache.as_mut_ptr() as u64, 64),
///         },
///         value: None,
///         input: TokenLayout::contiguous(2, 1, 4, 4),
///         cache: PagedLayout::nhd(2, 2, 1, 4, 4),
///         value_layout: None,
///         slots: SlotMapping::I64(DeviceBytes::from_raw(slots.as_ptr() as u64, 16)),
///         errors: None,
///         quantize: None,
///     }
/// };
/// // SAFETY: every view is live host memory of its length.
/// unsafe { kvio::emulate::update_slots(&op) }.unwrap();
/// assert_eq!(cache[12..16], [0.0, 1.0, 2.0, 3.0]);
/// assert!(cache[..12].iter().all(|&x| x == 0.0));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct SlotUpdate<'a> {
    /// New keys and the key cache.
    pub key: CacheWrite<'a>,
    /// New values and the value cache, or `None` to write K only.
    pub value: Option<CacheWrite<'a>>,
    /// Layout of the new keys and values.
    pub input: TokenLayout,
    /// Layout of the key cache (and of the value cache unless `value_layout` is given).
    pub cache: PagedLayout,
    /// Layout of the value cache where it differs from the key cache's: vLLM's v0 paged
    /// layout ([`PagedLayout::v0_key`] for `cache`, [`PagedLayout::v0_value`] here). `None`:
    /// V is laid out as K. Both describe the same blocks, slots, heads and elements.
    pub value_layout: Option<PagedLayout>,
    /// Slot per token; its length is the number of tokens written (`≤ input.num_tokens`).
    pub slots: SlotMapping<'a>,
    /// Where to count slots past the end of the cache (`None`: skipped, not counted).
    pub errors: Option<&'a DeviceErrors>,
    /// fp8 quantize-on-write (`None`: the bytes are copied as they are).
    pub quantize: Option<Quantize<'a>>,
}

impl<'a> SlotUpdate<'a> {
    /// An update of the key cache only, with no error word: add V with [`SlotUpdate::value`]
    /// (values and their cache always together) and a counter with [`SlotUpdate::errors`].
    ///
    /// ```
    /// use kvio::{CacheWrite, DeviceBytes, DeviceBytesMut, PagedLayout, SlotMapping, SlotUpdate, TokenLayout};
    /// // SAFETY: descriptions only.
    /// let [k, v, s] = [0x1000u64, 0x2000, 0x3000].map(|p| unsafe { DeviceBytes::from_raw(p, 4096) });
    /// let [kc, vc] = [0x10_0000u64, 0x20_0000].map(|p| unsafe { DeviceBytesMut::from_raw(p, 4096) });
    /// let op = SlotUpdate::new(
    ///     k,
    ///     TokenLayout::contiguous(2, 1, 4, 4),
    ///     kc,
    ///     PagedLayout::nhd(2, 2, 1, 4, 4),
    ///     SlotMapping::I64(s),
    /// )
    /// .value(v, vc);
    /// assert_eq!(op.value, Some(CacheWrite { src: v, dst: vc }));
    /// ```
    pub fn new(
        key: DeviceBytes<'a>,
        input: TokenLayout,
        key_cache: DeviceBytesMut<'a>,
        cache: PagedLayout,
        slots: SlotMapping<'a>,
    ) -> Self {
        SlotUpdate {
            key: CacheWrite {
                src: key,
                dst: key_cache,
            },
            value: None,
            input,
            cache,
            value_layout: None,
            slots,
            errors: None,
            quantize: None,
        }
    }

    /// Lays the value cache out as `layout` instead of as the key cache (vLLM's v0 paged
    /// layout: [`PagedLayout::v0_value`]).
    ///
    /// ```
    /// use kvio::{DeviceBytes, DeviceBytesMut, PagedLayout, SlotMapping, SlotUpdate, TokenLayout};
    /// // mistral.rs / candle-vllm `reshape_and_cache`: bf16, 16-slot blocks, v0 caches.
    /// let (t, h, d) = (4, 8, 128);
    /// let len = 64 * 16 * h * d * 2;
    /// // SAFETY: descriptions only.
    /// let [k, v, s] = [0x1000u64, 0x2_0000, 0x3_0000].map(|p| unsafe { DeviceBytes::from_raw(p, 1 << 16) });
    /// let [kc, vc] = [1u64 << 32, 2 << 32].map(|p| unsafe { DeviceBytesMut::from_raw(p, len) });
    /// let op = SlotUpdate::new(
    ///     k,
    ///     TokenLayout::contiguous(t, h, d, 2),
    ///     kc,
    ///     PagedLayout::v0_key(64, 16, h, d, 2),
    ///     SlotMapping::I64(s),
    /// )
    /// .value(v, vc)
    /// .value_layout(PagedLayout::v0_value(64, 16, h, d, 2));
    /// assert_eq!(op.value_layout.unwrap().piece_elems, 1);
    /// ```
    pub fn value_layout(self, layout: PagedLayout) -> Self {
        SlotUpdate {
            value_layout: Some(layout),
            ..self
        }
    }

    /// Quantizes K (and V) to fp8 on the way into the caches (see [`Quantize`]).
    pub fn quantize(self, quantize: Quantize<'a>) -> Self {
        SlotUpdate {
            quantize: Some(quantize),
            ..self
        }
    }

    /// Also writes `value` (laid out as the keys) into `value_cache` (laid out as the key cache).
    pub fn value(self, value: DeviceBytes<'a>, value_cache: DeviceBytesMut<'a>) -> Self {
        SlotUpdate {
            value: Some(CacheWrite {
                src: value,
                dst: value_cache,
            }),
            ..self
        }
    }

    /// Counts slots past the end of the cache in `errors`.
    pub fn errors(self, errors: &'a DeviceErrors) -> Self {
        SlotUpdate {
            errors: Some(errors),
            ..self
        }
    }
}

/// Arguments of [`Kvio::update_mla`] (vLLM `concat_and_cache_mla`, DeepSeek-style MLA caches):
/// token `t < slots.len()` gets one cache row at slot `slots[t]`, its latent `kv_c` (e.g. 512
/// elements) followed by its rope part `k_pe` (e.g. 64). The cache has one head whose width is
/// the sum of the two; negative slots are skipped, slots past the cache counted, as in every
/// write. Optionally quantized to fp8 with one per-tensor scale for the whole row (vLLM's
/// `scale`): give a [`Quantize`] with `k_scale` only.
///
/// ```
/// use kvio::{DeviceBytes, DeviceBytesMut, MlaUpdate, PagedLayout, SlotMapping, TokenLayout};
/// // Two tokens of a 4 + 2 element row (f32), into 2 pages of 2 slots.
/// let kv_c: Vec<f32> = (0..8).map(|x| x as f32).collect();
/// let k_pe = [100f32, 101., 102., 103.];
/// let mut cache = vec![0f32; 2 * 2 * 6];
/// let slots = [3i64, 0];
/// // SAFETY: host memory, used by the emulation only.
/// let op = unsafe {
///     MlaUpdate::new(
///         DeviceBytes::from_raw(kv_c.as_ptr() as u64, 32),
///         TokenLayout::contiguous(2, 1, 4, 4),
///         DeviceBytes::from_raw(k_pe.as_ptr() as u64, 16),
///         TokenLayout::contiguous(2, 1, 2, 4),
///         DeviceBytesMut::from_raw(cache.as_mut_ptr() as u64, 96),
///         PagedLayout::nhd(2, 2, 1, 6, 4),
///         SlotMapping::I64(DeviceBytes::from_raw(slots.as_ptr() as u64, 16)),
///     )
/// };
/// // SAFETY: every view is live host memory of its length.
/// unsafe { kvio::emulate::update_mla(&op) }.unwrap();
/// assert_eq!(cache[18..24], [0., 1., 2., 3., 100., 101.]); // slot 3: token 0
/// assert_eq!(cache[0..6], [4., 5., 6., 7., 102., 103.]); // slot 0: token 1
/// ```
#[derive(Clone, Copy, Debug)]
pub struct MlaUpdate<'a> {
    /// Latent rows `[T, 1, kv_lora_rank]`.
    pub kv_c: DeviceBytes<'a>,
    /// Layout of `kv_c` (one head; its token stride may skip other columns).
    pub kv_c_layout: TokenLayout,
    /// Rope rows `[T, 1, rope_dim]`.
    pub k_pe: DeviceBytes<'a>,
    /// Layout of `k_pe`.
    pub k_pe_layout: TokenLayout,
    /// The cache, written in place.
    pub cache: DeviceBytesMut<'a>,
    /// Layout of the cache: one head of `kv_lora_rank + rope_dim` elements per slot.
    pub layout: PagedLayout,
    /// Slot per token.
    pub slots: SlotMapping<'a>,
    /// Where to count slots past the end of the cache (`None`: skipped, not counted).
    pub errors: Option<&'a DeviceErrors>,
    /// fp8 quantize-on-write with one per-tensor scale (`k_scale`; no `v_scale`).
    pub quantize: Option<Quantize<'a>>,
}

impl<'a> MlaUpdate<'a> {
    /// An MLA update with no error word and no quantization.
    pub fn new(
        kv_c: DeviceBytes<'a>,
        kv_c_layout: TokenLayout,
        k_pe: DeviceBytes<'a>,
        k_pe_layout: TokenLayout,
        cache: DeviceBytesMut<'a>,
        layout: PagedLayout,
        slots: SlotMapping<'a>,
    ) -> Self {
        MlaUpdate {
            kv_c,
            kv_c_layout,
            k_pe,
            k_pe_layout,
            cache,
            layout,
            slots,
            errors: None,
            quantize: None,
        }
    }

    /// Counts slots past the end of the cache in `errors`.
    pub fn errors(self, errors: &'a DeviceErrors) -> Self {
        MlaUpdate {
            errors: Some(errors),
            ..self
        }
    }

    /// Quantizes the row to fp8 (`k_scale` per tensor, no `v_scale`).
    pub fn quantize(self, quantize: Quantize<'a>) -> Self {
        MlaUpdate {
            quantize: Some(quantize),
            ..self
        }
    }
}

/// Arguments of [`Kvio::update_slices`] (vLLM TPU `kv_cache_update` semantics).
///
/// `slices` is `[3, padded]` `i32` in struct-of-arrays form: row 0 the first cache slot, row 1
/// the first token of `new_kv`, row 2 the length. Only the first `*num_slices` entries are
/// used (the count lives on the device, so the same padded launch can be replayed in a CUDA
/// graph with another count). A slice has `0 < len ≤ block_size` and stays inside one page;
/// `len == 0` is padding.
///
/// Any cache layout, converting on the way: with [`SliceUpdate::value`] the same slices also
/// write V rows into a value cache (vLLM's v0 caches: [`PagedLayout::v0_key`] as `layout`
/// and [`SliceUpdate::value_layout`] with [`PagedLayout::v0_value`]), and with
/// [`SliceUpdate::quantize`] the rows are quantized to fp8 as in a slot update (per-head
/// scales count the layout's heads: for TPU rows that mix K and V heads, one scale per row
/// head). Rows copied as they are into a cache whose rows are contiguous (the TPU layout,
/// NHD) take one launch of `kvio_update_slices`; every other update turns the slices into a
/// slot list on the device first (in kvio's scratch memory, or in the caller's buffer given
/// with [`SliceUpdate::slot_list`]; a device without memory pools needs that buffer) and runs
/// the slot update ([`Kvio::update_slots`]) over it: there a source row that two slices name
/// is written once and counted as a bad slice.
///
/// Run here through the CPU emulation on host memory; on a GPU the same value goes to
/// [`Kvio::update_slices`] with device memory.
///
/// ```
/// use kvio::plan::{slices_to_table, slots_to_slices};
/// use kvio::{DeviceBytes, DeviceBytesMut, PagedLayout, SliceUpdate, TokenLayout};
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
///         cache: DeviceBytesMut::from_raw(cache.as_mut_ptr() as u64, 32),
///         layout: PagedLayout::nhd(4, 2, 1, 2, 2),
///         slices: DeviceBytes::from_raw(table.as_ptr() as u64, 48),
///         padded: 4,
///         num_slices: DeviceBytes::from_raw(count.as_ptr() as u64, 4),
///         errors: None,
///         value: None,
///         value_layout: None,
///         quantize: None,
///         slot_list: None,
///     }
/// };
/// // SAFETY: every view is live host memory of its length.
/// unsafe { kvio::emulate::update_slices(&op) }.unwrap();
/// assert_eq!(cache[4..8], [0, 1, 2, 3]); // slots 2 and 3: tokens 0 and 1
/// assert_eq!(cache[12..14], [4, 5]); // slot 6: token 2
/// ```
#[derive(Clone, Copy, Debug)]
pub struct SliceUpdate<'a> {
    /// New rows, `[T, H', D]` as `input` describes (the TPU layout: K and V heads of a token
    /// in one row; with [`SliceUpdate::value`], the keys).
    pub new_kv: DeviceBytes<'a>,
    /// Layout of `new_kv`.
    pub input: TokenLayout,
    /// The cache, written in place.
    pub cache: DeviceBytesMut<'a>,
    /// Layout of the cache (page = block): any layout; contiguous rows take the row copy.
    pub layout: PagedLayout,
    /// `[3, padded]` `i32` slice table on the device.
    pub slices: DeviceBytes<'a>,
    /// Capacity of the slice table.
    pub padded: usize,
    /// One device `i32`: how many slices are real.
    pub num_slices: DeviceBytes<'a>,
    /// Where to count refused slices and counts (`None`: skipped, not counted).
    pub errors: Option<&'a DeviceErrors>,
    /// New values (laid out as `input`) and the value cache, written through the same slices
    /// (`None`: `new_kv` only).
    pub value: Option<CacheWrite<'a>>,
    /// Layout of the value cache where it differs from `layout` (vLLM's v0 value cache);
    /// `None`: as `layout`.
    pub value_layout: Option<PagedLayout>,
    /// fp8 quantize-on-write (`None`: the bytes are copied as they are).
    pub quantize: Option<Quantize<'a>>,
    /// Where the slot list goes when the update needs one (`4 * input.num_tokens` bytes,
    /// 4-byte aligned, sharing no byte with the update's other buffers, overwritten);
    /// `None`: kvio's scratch memory, taken and given back on the stream.
    pub slot_list: Option<DeviceBytesMut<'a>>,
}

impl<'a> SliceUpdate<'a> {
    /// A slice update with no error word (add one with [`SliceUpdate::errors`]).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        new_kv: DeviceBytes<'a>,
        input: TokenLayout,
        cache: DeviceBytesMut<'a>,
        layout: PagedLayout,
        slices: DeviceBytes<'a>,
        padded: usize,
        num_slices: DeviceBytes<'a>,
    ) -> Self {
        SliceUpdate {
            new_kv,
            input,
            cache,
            layout,
            slices,
            padded,
            num_slices,
            errors: None,
            value: None,
            value_layout: None,
            quantize: None,
            slot_list: None,
        }
    }

    /// Counts refused slices and counts in `errors`.
    pub fn errors(self, errors: &'a DeviceErrors) -> Self {
        SliceUpdate {
            errors: Some(errors),
            ..self
        }
    }

    /// Also writes `value` (laid out as `new_kv`) through the same slices into `value_cache`
    /// (laid out as the cache, or as [`SliceUpdate::value_layout`]).
    pub fn value(self, value: DeviceBytes<'a>, value_cache: DeviceBytesMut<'a>) -> Self {
        SliceUpdate {
            value: Some(CacheWrite {
                src: value,
                dst: value_cache,
            }),
            ..self
        }
    }

    /// Lays the value cache out as `layout` (vLLM's v0 value cache:
    /// [`PagedLayout::v0_value`]).
    ///
    /// ```
    /// use kvio::{DeviceBytes, DeviceBytesMut, PagedLayout, SliceUpdate, TokenLayout};
    /// // Slices of new K and V tokens into mistral.rs / candle-vllm v0 caches (bf16).
    /// let (t, h, d, nb, bs) = (64, 8, 128, 64, 16);
    /// let len = nb * bs * h * d * 2;
    /// // SAFETY: descriptions only.
    /// let [k, v, table, count] = [0x1000u64, 0x4_0000, 0x8_0000, 0x9_0000]
    ///     .map(|p| unsafe { DeviceBytes::from_raw(p, 1 << 16) });
    /// let [kc, vc] = [1u64 << 32, 2 << 32].map(|p| unsafe { DeviceBytesMut::from_raw(p, len) });
    /// let op = SliceUpdate::new(
    ///     k,
    ///     TokenLayout::contiguous(t, h, d, 2),
    ///     kc,
    ///     PagedLayout::v0_key(nb, bs, h, d, 2),
    ///     table,
    ///     16,
    ///     count,
    /// )
    /// .value(v, vc)
    /// .value_layout(PagedLayout::v0_value(nb, bs, h, d, 2));
    /// assert!(op.value.is_some());
    /// ```
    pub fn value_layout(self, layout: PagedLayout) -> Self {
        SliceUpdate {
            value_layout: Some(layout),
            ..self
        }
    }

    /// Quantizes the rows to fp8 on the way into the caches (see [`Quantize`]; V's scale
    /// given exactly when the update writes V).
    pub fn quantize(self, quantize: Quantize<'a>) -> Self {
        SliceUpdate {
            quantize: Some(quantize),
            ..self
        }
    }

    /// Builds the slot list (when the update needs one) in `list`: at least
    /// `4 * input.num_tokens` bytes, 4-byte aligned, overwritten by every call. Without it
    /// kvio takes the list from its scratch pool on the stream (an allocation node under
    /// graph capture); with it the call allocates nothing.
    pub fn slot_list(self, list: DeviceBytesMut<'a>) -> Self {
        SliceUpdate {
            slot_list: Some(list),
            ..self
        }
    }
}

impl Kvio {
    /// Writes new tokens into a paged cache by slot mapping. See [`SlotUpdate`].
    ///
    /// ```no_run
    /// # fn main() -> kvio::Result<()> {
    /// use cust::memory::DeviceBuffer;
    /// use kvio::{DeviceBytes, DeviceBytesMut, PagedLayout, SlotMapping, SlotUpdate, TokenLayout};
    /// let _ctx = kvio::PrimaryContext::retain(0)?;
    /// let kv = kvio::Kvio::load()?;
    /// let stream = kvio::Stream::new()?; // non-blocking
    /// let (t, h, d) = (4, 8, 128);
    /// let cache = PagedLayout::nhd(64, 16, h, d, 2); // bf16
    /// let key = DeviceBuffer::from_slice(&vec![1u16; t * h * d]).unwrap();
    /// let value = DeviceBuffer::from_slice(&vec![2u16; t * h * d]).unwrap();
    /// let mut kc = DeviceBuffer::from_slice(&vec![0u16; 64 * 16 * h * d]).unwrap();
    /// let mut vc = DeviceBuffer::from_slice(&vec![0u16; 64 * 16 * h * d]).unwrap();
    /// let slots = DeviceBuffer::from_slice(&[17i64, 18, -1, 40]).unwrap();
    /// let op = SlotUpdate::new(
    ///     DeviceBytes::of(&key),
    ///     TokenLayout::contiguous(t, h, d, 2),
    ///     DeviceBytesMut::of(&mut kc),
    ///     cache,
    ///     SlotMapping::I64(DeviceBytes::of(&slots)),
    /// )
    /// .value(DeviceBytes::of(&value), DeviceBytesMut::of(&mut vc));
    /// kv.update_slots(&op, stream.sref())?;
    /// # Ok(()) }
    /// ```
    pub fn update_slots(&self, op: &SlotUpdate<'_>, stream: StreamRef<'_>) -> Result<()> {
        self.run(&plan::slots(op, &self.target())?, stream)
    }

    /// Copies slices of new rows into a paged cache in place. See [`SliceUpdate`].
    ///
    /// ```no_run
    /// # fn main() -> kvio::Result<()> {
    /// use cust::memory::DeviceBuffer;
    /// use kvio::plan::{slices_to_table, slots_to_slices};
    /// use kvio::{DeviceBytes, DeviceBytesMut, PagedLayout, SliceUpdate, TokenLayout};
    /// let _ctx = kvio::PrimaryContext::retain(0)?;
    /// let kv = kvio::Kvio::load()?;
    /// let stream = kvio::Stream::new()?; // non-blocking
    /// let (t, h2, d, page) = (5, 16, 128, 16); // K and V heads together: H' = 2H
    /// let layout = PagedLayout::nhd(64, page, h2, d, 2); // flat [64*16, H', D] bf16
    /// let new_kv = DeviceBuffer::from_slice(&vec![1u16; t * h2 * d]).unwrap();
    /// let mut cache = DeviceBuffer::from_slice(&vec![0u16; 64 * page * h2 * d]).unwrap();
    /// let slices = slots_to_slices(&[30i64, 31, 32, 33, 100], page)?; // 3 slices
    /// let padded = 8; // fixed capacity: the same launch serves any count up to 8
    /// let table = DeviceBuffer::from_slice(&slices_to_table(&slices, padded)?).unwrap();
    /// let count = DeviceBuffer::from_slice(&[slices.len() as i32]).unwrap();
    /// let op = SliceUpdate::new(
    ///     DeviceBytes::of(&new_kv),
    ///     TokenLayout::contiguous(t, h2, d, 2),
    ///     DeviceBytesMut::of(&mut cache),
    ///     layout,
    ///     DeviceBytes::of(&table),
    ///     padded,
    ///     DeviceBytes::of(&count),
    /// );
    /// kv.update_slices(&op, stream.sref())?;
    /// # Ok(()) }
    /// ```
    pub fn update_slices(&self, op: &SliceUpdate<'_>, stream: StreamRef<'_>) -> Result<()> {
        self.run(&plan::slices(op, &self.target())?, stream)
    }

    /// Writes MLA cache rows (latent and rope part side by side) by slot mapping. See
    /// [`MlaUpdate`]; one launch, like [`Kvio::update_slots`].
    pub fn update_mla(&self, op: &MlaUpdate<'_>, stream: StreamRef<'_>) -> Result<()> {
        self.run(&plan::mla(op, &self.target())?, stream)
    }
}
