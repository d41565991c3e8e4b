//! CPU reference implementations, element by element, written independently of the kernels'
//! index math. The GPU tests compare against these bit for bit.

use crate::blocks::{Bases, BlockPool};
use crate::error_word::ErrorCounts;
use crate::layout::{PagedLayout, TokenLayout};
use crate::plan::Slice;
use crate::write::{Fp8, SrcType};

fn copy_elem(src: &[u8], s: usize, dst: &mut [u8], d: usize, e: usize) {
    dst[d..d + e].copy_from_slice(&src[s..s + e]);
}

/// Slot-mapping update on host memory. `cache` is one host buffer that holds the K cache at
/// byte `key_at` and, when `value` is given, the V cache at byte `value_at`; both laid out as
/// `layout` (call it once per part for K and V caches of different layouts, e.g. vLLM's v0).
///
/// ```
/// use kvio::{reference, PagedLayout, TokenLayout};
/// let key = [1u8, 2, 3, 4]; // 2 tokens, 1 head of 2 fp8 elements
/// let mut cache = [0u8; 8]; // NHD: 2 blocks of 2 slots
/// let c = reference::update_slots(
///     &key, None, &TokenLayout::contiguous(2, 1, 2, 1), &mut cache, 0, None,
///     &PagedLayout::nhd(2, 2, 1, 2, 1), &[2, 9],
/// );
/// assert_eq!(cache, [0, 0, 0, 0, 1, 2, 0, 0]); // slot 2; slot 9 is past the cache:
/// assert_eq!(c.bad_slots, 1); // counted and skipped
/// ```
#[allow(clippy::too_many_arguments)]
pub fn update_slots(
    key: &[u8],
    value: Option<&[u8]>,
    input: &TokenLayout,
    cache: &mut [u8],
    key_at: usize,
    value_at: Option<usize>,
    layout: &PagedLayout,
    slots: &[i64],
) -> ErrorCounts {
    let mut counts = ErrorCounts::default();
    let e = layout.elem_bytes;
    // i128 throughout: no size (up to usize::MAX) or index (any i64) can wrap.
    let num_slots = layout.num_blocks as i128 * layout.block_size as i128;
    for (t, &slot) in slots.iter().enumerate() {
        if slot < 0 {
            continue;
        }
        if slot as i128 >= num_slots {
            counts.bad_slots += 1;
            continue;
        }
        let block = slot as usize / layout.block_size;
        let off = slot as usize % layout.block_size;
        let mut parts = vec![(key, key_at)];
        if let (Some(v), Some(at)) = (value, value_at) {
            parts.push((v, at));
        }
        for (src, at) in parts {
            for h in 0..layout.num_heads {
                for d in 0..layout.head_dim {
                    let s = (t * input.token_stride + h * input.head_stride + d) * e;
                    // A head vector in pieces (v0 layout): piece d / pe, element d % pe.
                    let pe = layout.piece_elems;
                    let o = (block * layout.block_stride
                        + off * layout.token_stride
                        + h * layout.head_stride
                        + (d / pe) * layout.piece_stride
                        + d % pe)
                        * e;
                    copy_elem(src, s, cache, at + o, e);
                }
            }
        }
    }
    counts
}

/// Slice-based update on host memory; `num_slices` is the device-side count (checked against
/// `slices.len()`, the padded capacity, like the kernel does).
///
/// ```
/// use kvio::plan::Slice;
/// use kvio::{reference, PagedLayout, TokenLayout};
/// let rows = [1u8, 2, 3]; // 3 tokens of 1 byte
/// let mut cache = [0u8; 4]; // 2 pages of 2 slots
/// let slices = [Slice { cache_start: 1, new_kv_start: 1, len: 1 }, Slice::default()];
/// let layout = PagedLayout::nhd(2, 2, 1, 1, 1);
/// reference::update_slices(&rows, &TokenLayout::contiguous(3, 1, 1, 1), &mut cache, &layout, &slices, 1);
/// assert_eq!(cache, [0, 2, 0, 0]);
/// // A count past the padded capacity writes nothing and is counted.
/// assert_eq!(reference::update_slices(&rows, &TokenLayout::contiguous(3, 1, 1, 1), &mut cache, &layout, &slices, 3).bad_counts, 1);
/// ```
pub fn update_slices(
    new_kv: &[u8],
    input: &TokenLayout,
    cache: &mut [u8],
    layout: &PagedLayout,
    slices: &[Slice],
    num_slices: i32,
) -> ErrorCounts {
    let mut counts = ErrorCounts::default();
    if num_slices < 0 || num_slices as usize > slices.len() {
        counts.bad_counts = 1;
        return counts;
    }
    let e = layout.elem_bytes;
    // i128 throughout: no size (up to usize::MAX) or sum of i32 fields can wrap.
    let page = layout.block_size as i128;
    let num_slots = layout.num_blocks as i128 * layout.block_size as i128;
    for s in &slices[..num_slices as usize] {
        let (start, src, len) = (s.cache_start as i128, s.new_kv_start as i128, s.len as i128);
        if len == 0 {
            continue;
        }
        let ok = len > 0
            && len <= page
            && start >= 0
            && src >= 0
            && start + len <= num_slots
            && src + len <= input.num_tokens as i128
            && start / page == (start + len - 1) / page;
        if !ok {
            counts.bad_slices += 1;
            continue;
        }
        for r in 0..len {
            let slot = (start + r) as usize;
            let (block, off) = (slot / layout.block_size, slot % layout.block_size);
            let t = (src + r) as usize;
            for h in 0..layout.num_heads {
                for d in 0..layout.head_dim {
                    let si = (t * input.token_stride + h * input.head_stride + d) * e;
                    // A head vector in pieces (v0 layout): piece d / pe, element d % pe.
                    let pe = layout.piece_elems;
                    let di = (block * layout.block_stride
                        + off * layout.token_stride
                        + h * layout.head_stride
                        + (d / pe) * layout.piece_stride
                        + d % pe)
                        * e;
                    copy_elem(new_kv, si, cache, di, e);
                }
            }
        }
    }
    counts
}

/// One pool of blocks in a single host buffer (the test images of device/pinned pools):
/// layer `l`, part `p` of block `b` starts at byte
/// `l * layer_stride + p * part_stride + b * block_stride * elem` (strides of `layout` in
/// elements, `layer_stride`/`part_stride` in bytes).
#[derive(Clone, Copy, Debug)]
pub struct PoolImage {
    /// Number of layers.
    pub layers: usize,
    /// Caches per layer (2: K and V).
    pub parts: usize,
    /// Layout of one layer/part cache.
    pub layout: PagedLayout,
    /// Bytes between layers.
    pub layer_stride: usize,
    /// Bytes between K and V.
    pub part_stride: usize,
}

impl PoolImage {
    /// The image of a pool laid out in one buffer that starts at the pool's lowest base: a
    /// strided pool as it is; a layer-table pool when its entries are evenly spaced
    /// (`entry(l, p) = entry(0, 0) + l * layer_stride + p * part_stride`, as when the tables
    /// point into one allocation). `None` for a table whose entries are scattered.
    ///
    /// ```
    /// use kvio::{reference::PoolImage, BlockPool, DeviceBytes};
    /// // SAFETY: a description only.
    /// let mem = unsafe { DeviceBytes::from_raw(0x1000, 4 * 2 * 2 * 8 * 2) };
    /// let img = PoolImage::of(&BlockPool::cross_layer_nhd(mem, 4, 2, 2, 1, 8, 2)).unwrap();
    /// assert_eq!((img.layer_stride, img.part_stride), (2 * 2 * 8 * 2, 2 * 8 * 2));
    /// ```
    pub fn of<A: Copy>(pool: &BlockPool<'_, A>) -> Option<PoolImage> {
        let (layer_stride, part_stride) = match pool.bases {
            Bases::Strided {
                layer_stride,
                part_stride,
                ..
            } => (layer_stride, part_stride),
            Bases::Table(t) => {
                let at = |l: usize, p: usize| t.entries()[l * t.parts() + p].ptr();
                let base = at(0, 0);
                let ls = if t.layers() > 1 {
                    at(1, 0).checked_sub(base)?
                } else {
                    0
                };
                let ps = if t.parts() > 1 {
                    at(0, 1).checked_sub(base)?
                } else {
                    0
                };
                let even = (0..t.layers()).all(|l| {
                    (0..t.parts()).all(|p| at(l, p) == base + l as u64 * ls + p as u64 * ps)
                });
                if !even {
                    return None;
                }
                (ls as usize, ps as usize)
            }
        };
        Some(PoolImage {
            layers: pool.layers,
            parts: pool.parts,
            layout: pool.layout,
            layer_stride,
            part_stride,
        })
    }

    fn offset(
        &self,
        block: usize,
        layer: usize,
        part: usize,
        token: usize,
        head: usize,
        d: usize,
    ) -> usize {
        let l = &self.layout;
        let pe = l.piece_elems;
        layer * self.layer_stride
            + part * self.part_stride
            + (block * l.block_stride
                + token * l.token_stride
                + head * l.head_stride
                + (d / pe) * l.piece_stride
                + d % pe)
                * l.elem_bytes
    }
}

/// Block copy on host images: for each pair `[src, dst]` (negative = padding, skipped; past a
/// pool = counted in `bad_blocks`, skipped), every element of every layer and part of block
/// `src` of `src` is written to block `dst` of `dst`.
///
/// ```
/// use kvio::reference::{copy_blocks, PoolImage};
/// use kvio::PagedLayout;
/// // One layer, K and V, blocks of 1 slot × 1 head × 1 byte: K of all blocks, then V.
/// let img = PoolImage { layers: 1, parts: 2, layout: PagedLayout::nhd(3, 1, 1, 1, 1), layer_stride: 6, part_stride: 3 };
/// let src = [10u8, 11, 12, 20, 21, 22]; // K0 K1 K2 V0 V1 V2
/// let mut dst = [0u8; 6];
/// let c = copy_blocks(&img, &src, &img, &mut dst, &[[2, 0], [-1, -1], [5, 1]]);
/// assert_eq!(dst, [12, 0, 0, 22, 0, 0]); // block 2 -> 0; block 5 does not exist:
/// assert_eq!(c.bad_blocks, 1);
/// ```
pub fn copy_blocks(
    src: &PoolImage,
    src_mem: &[u8],
    dst: &PoolImage,
    dst_mem: &mut [u8],
    pairs: &[[i64; 2]],
) -> ErrorCounts {
    let mut counts = ErrorCounts::default();
    let l = &src.layout;
    let e = l.elem_bytes;
    for &[s, d] in pairs {
        if s < 0 || d < 0 {
            continue;
        }
        if s as u64 >= l.num_blocks as u64 || d as u64 >= dst.layout.num_blocks as u64 {
            counts.bad_blocks += 1;
            continue;
        }
        let (s, d) = (s as usize, d as usize);
        for layer in 0..src.layers {
            for part in 0..src.parts {
                for t in 0..l.block_size {
                    for h in 0..l.num_heads {
                        for x in 0..l.head_dim {
                            let so = src.offset(s, layer, part, t, h, x);
                            let dof = dst.offset(d, layer, part, t, h, x);
                            copy_elem(src_mem, so, dst_mem, dof, e);
                        }
                    }
                }
            }
        }
    }
    counts
}

/// The value of fp8 code `code` in `fmt`, exactly (NaN for NaN codes, ±inf for e5m2's).
fn fp8_value(code: u8, fmt: Fp8) -> f64 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let (exp_bits, man_bits, bias) = match fmt {
        Fp8::E4m3 => (4u32, 3u32, 7i32),
        Fp8::E5m2 => (5, 2, 15),
    };
    let exp = ((code & 0x7f) >> man_bits) as i32;
    let man = (code & ((1 << man_bits) - 1)) as f64;
    let top = (1 << exp_bits) - 1;
    match fmt {
        Fp8::E4m3 if code & 0x7f == 0x7f => return f64::NAN,
        Fp8::E5m2 if exp == top => {
            return if man == 0.0 {
                sign * f64::INFINITY
            } else {
                f64::NAN
            }
        }
        _ => {}
    }
    let scale = (1u64 << man_bits) as f64;
    let v = if exp == 0 {
        man / scale * 2f64.powi(1 - bias)
    } else {
        (1.0 + man / scale) * 2f64.powi(exp - bias)
    };
    sign * v
}

/// `x` as an fp8 code of `fmt`, the way vLLM stores it: the nearest finite value (ties to the
/// even code), ±max for anything at or past ±max (±inf included), `0x7f` for NaN, the sign
/// kept for −0 and negatives that round to zero. Found by searching every code's exact value
/// (slow, obviously right).
///
/// ```
/// use kvio::{reference::fp8_from_f32, Fp8};
/// assert_eq!(fp8_from_f32(1.0, Fp8::E4m3), 0x38);
/// assert_eq!(fp8_from_f32(1e9, Fp8::E4m3), 0x7e); // saturates to 448
/// assert_eq!(fp8_from_f32(f32::NEG_INFINITY, Fp8::E5m2), 0xfb); // -57344
/// assert_eq!(fp8_from_f32(f32::NAN, Fp8::E5m2), 0x7f);
/// ```
pub fn fp8_from_f32(x: f32, fmt: Fp8) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let max_code: u8 = match fmt {
        Fp8::E4m3 => 0x7e,
        Fp8::E5m2 => 0x7b,
    };
    static VALUES: std::sync::OnceLock<[[f64; 128]; 2]> = std::sync::OnceLock::new();
    let table = VALUES.get_or_init(|| {
        let decode = |fmt| std::array::from_fn(|k| fp8_value(k as u8, fmt));
        [decode(Fp8::E4m3), decode(Fp8::E5m2)]
    });
    let values = &table[(fmt == Fp8::E5m2) as usize];
    let a = (x as f64).abs();
    let mut best = 0u8;
    if a >= values[max_code as usize] {
        best = max_code;
    } else {
        let mut best_d = f64::INFINITY;
        for k in 0..=max_code {
            let d = (values[k as usize] - a).abs();
            if d < best_d || (d == best_d && k % 2 == 0) {
                best = k;
                best_d = d;
            }
        }
    }
    if x.is_sign_negative() {
        best | 0x80
    } else {
        best
    }
}

/// Quantizes new rows the way a quantizing update stores them: element `(t, h, d)` of `src`
/// (laid out as `input`, elements of `ty`) becomes `fp8_from_f32(x / scale)` with `scale =
/// scales[h]` (or `scales[0]` when only one is given) divided in f32. Returns contiguous
/// `[T, H, D]` fp8 bytes, ready for [`update_slots`] with one-byte layouts.
pub fn quantize_rows(
    src: &[u8],
    input: &TokenLayout,
    ty: SrcType,
    fmt: Fp8,
    scales: &[f32],
) -> Vec<u8> {
    let e = ty.bytes();
    let (t, h, d) = (input.num_tokens, input.num_heads, input.head_dim);
    let mut out = Vec::with_capacity(t * h * d);
    for tok in 0..t {
        for head in 0..h {
            let scale = scales[if scales.len() == 1 { 0 } else { head }];
            for i in 0..d {
                let at = (tok * input.token_stride + head * input.head_stride + i) * e;
                let b = &src[at..at + e];
                let x = match ty {
                    SrcType::Bf16 => {
                        f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)
                    }
                    SrcType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
                    SrcType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                };
                out.push(fp8_from_f32(x / scale, fmt));
            }
        }
    }
    out
}
