//! Converting a span on its way into the cache: source elements (bf16, f16 or f32) quantized to
//! fp8 with a scale (vLLM's `scaled_convert`: `fp8(x / scale)`), the copy core's counterpart
//! for caches that store another type than their inputs.
//!
//! A conversion is named by one `u32` code (a kernel parameter): the source type in the low
//! nibble, the fp8 format in the next; [`NONE`] (0) means "copy the bytes as they are".

use core::ptr::{read, write};

use crate::fp8::{bf16_to_f32, f16_to_f32, Divider, Fp8};
use crate::span::V16;

/// No conversion: the kernels copy bytes.
pub const NONE: u32 = 0;
/// Source elements are bf16.
pub const SRC_BF16: u32 = 1;
/// Source elements are f16.
pub const SRC_F16: u32 = 2;
/// Source elements are f32.
pub const SRC_F32: u32 = 3;
/// The cache is `float8_e4m3fn`.
pub const TO_E4M3: u32 = 0;
/// The cache is `float8_e5m2`.
pub const TO_E5M2: u32 = 1 << 4;

/// Elements one vector unit converts: 16 bytes of bf16/f16 (two 16-byte loads of f32) into 8
/// bytes of fp8.
pub const VEC: u64 = 8;

/// Evaluates `$body` with `$c` bound to `$code` as a constant: each valid conversion gets its
/// own copy of the body, with the source type and fp8 format folded in (no per-element
/// selects). Invalid codes (the host never passes one) take the bf16 → e4m3 copy.
macro_rules! by_code {
    ($code:expr, $c:ident => $body:expr) => {
        match $code {
            0x02 => {
                const $c: u32 =
                    $crate::convert::code($crate::convert::SRC_F16, $crate::convert::TO_E4M3);
                $body
            }
            0x03 => {
                const $c: u32 =
                    $crate::convert::code($crate::convert::SRC_F32, $crate::convert::TO_E4M3);
                $body
            }
            0x11 => {
                const $c: u32 =
                    $crate::convert::code($crate::convert::SRC_BF16, $crate::convert::TO_E5M2);
                $body
            }
            0x12 => {
                const $c: u32 =
                    $crate::convert::code($crate::convert::SRC_F16, $crate::convert::TO_E5M2);
                $body
            }
            0x13 => {
                const $c: u32 =
                    $crate::convert::code($crate::convert::SRC_F32, $crate::convert::TO_E5M2);
                $body
            }
            _ => {
                const $c: u32 =
                    $crate::convert::code($crate::convert::SRC_BF16, $crate::convert::TO_E4M3);
                $body
            }
        }
    };
}

pub(crate) use by_code;

/// The code of a conversion from `src` ([`SRC_BF16`], ...) to `to` ([`TO_E4M3`], ...).
pub const fn code(src: u32, to: u32) -> u32 {
    src | to
}

/// Bytes of one source element of `code` (0 for an invalid source).
pub const fn src_bytes(code: u32) -> u64 {
    match code & 0xf {
        SRC_BF16 | SRC_F16 => 2,
        SRC_F32 => 4,
        _ => 0,
    }
}

/// The fp8 format of `code`.
#[inline(always)]
pub fn format(code: u32) -> Fp8 {
    if code & TO_E5M2 != 0 {
        Fp8::E5m2
    } else {
        Fp8::E4m3
    }
}

/// Source element `i` of `src`, widened to f32 (exactly).
///
/// # Safety
/// `src` holds element `i` of the code's source type, aligned for it.
#[inline(always)]
pub(crate) unsafe fn load(src: *const u8, i: u64, code: u32) -> f32 {
    // SAFETY: forwarded from the caller.
    unsafe {
        match code & 0xf {
            SRC_BF16 => bf16_to_f32(read((src as *const u16).add(i as usize))),
            SRC_F16 => f16_to_f32(read((src as *const u16).add(i as usize))),
            _ => read((src as *const f32).add(i as usize)),
        }
    }
}

/// The raw bytes of one vector unit: one 16-byte access of bf16/f16, two of f32.
pub(crate) type Raw = [V16; 2];

/// The raw bytes of unit `u` (elements `8u..8u + 8`). Volatile, so a caller can issue it
/// before an index lookup and the compiler cannot sink it past that lookup.
///
/// # Safety
/// `src` holds elements `8u..8u + 8`, 16-byte aligned.
#[inline(always)]
unsafe fn load_raw(src: *const u8, u: u64, code: u32) -> Raw {
    // SAFETY: forwarded from the caller (one or two whole 16-byte units).
    unsafe {
        if code & 0xf == SRC_F32 {
            let p = (src as *const V16).add(2 * u as usize);
            [
                core::ptr::read_volatile(p),
                core::ptr::read_volatile(p.add(1)),
            ]
        } else {
            let p = (src as *const V16).add(u as usize);
            [core::ptr::read_volatile(p), V16::splat(0)]
        }
    }
}

/// A unit's eight elements widened to f32.
#[inline(always)]
pub(crate) fn widen(raw: &Raw, code: u32) -> [f32; 8] {
    let mut x = [0f32; 8];
    let (a, b) = (raw[0].to_array(), raw[1].to_array());
    let mut k = 0;
    while k < 4 {
        if code & 0xf == SRC_F32 {
            x[k] = f32::from_bits(a[k]);
            x[k + 4] = f32::from_bits(b[k]);
        } else {
            let (lo, hi) = (a[k] as u16, (a[k] >> 16) as u16);
            if code & 0xf == SRC_BF16 {
                x[2 * k] = bf16_to_f32(lo);
                x[2 * k + 1] = bf16_to_f32(hi);
            } else {
                x[2 * k] = f16_to_f32(lo);
                x[2 * k + 1] = f16_to_f32(hi);
            }
        }
        k += 1;
    }
    x
}

/// The unit one lane holds from [`preload`] (the first of its share).
pub struct Held(Raw);

/// Loads lane `lane`'s first vector unit of a span of `n` elements (if it has one), so the
/// load is in flight while the caller reads the slot; [`convert_held`] converts it and the
/// rest of the lane's share.
///
/// # Safety
/// As [`convert_span`] with `vec`.
#[inline(always)]
pub unsafe fn preload(src: *const u8, n: u64, lane: u64, code: u32) -> Held {
    if lane < n / VEC {
        // SAFETY: the unit is < n / VEC (the caller's span).
        Held(unsafe { load_raw(src, lane, code) })
    } else {
        Held([V16::splat(0); 2])
    }
}

/// [`convert_span`] (vector units) for a lane that [`preload`]ed its first unit.
///
/// # Safety
/// As [`convert_span`] with `vec`; `held` came from [`preload`] with the same span and lane.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn convert_held(
    src: *const u8,
    dst: *mut u8,
    n: u64,
    lane: u64,
    lanes: u64,
    code: u32,
    scale: f32,
    held: &Held,
) {
    let div = Divider::new(scale);
    // SAFETY: the held unit is < units; the rest as in convert_span.
    by_code!(code, C => unsafe {
        let (fmt, units) = (format(C), n / VEC);
        let d = dst as *mut u64;
        if lane < units {
            write(d.add(lane as usize), pack8(&widen(&held.0, C), fmt, &div));
        }
        convert_units(src, dst, lane + lanes, units, lanes, C, &div);
    })
}

/// Vector units `first, first + lanes, ...` below `units`, two a step (both loaded before
/// either is converted).
///
/// # Safety
/// As [`convert_span`] with `vec`.
#[inline(always)]
unsafe fn convert_units(
    src: *const u8,
    dst: *mut u8,
    first: u64,
    units: u64,
    lanes: u64,
    code: u32,
    div: &Divider,
) {
    let fmt = format(code);
    let d = dst as *mut u64;
    let mut u = first;
    // SAFETY: every unit loaded and stored is < units (the caller's span).
    unsafe {
        // Two units in flight per lane: both loads are issued before either is converted
        // (four would need registers that cost more occupancy than they gain).
        while u + lanes < units {
            let (a, b) = (load_raw(src, u, code), load_raw(src, u + lanes, code));
            write(d.add(u as usize), pack8(&widen(&a, code), fmt, div));
            let v = pack8(&widen(&b, code), fmt, div);
            write(d.add((u + lanes) as usize), v);
            u += 2 * lanes;
        }
        while u < units {
            write(
                d.add(u as usize),
                pack8(&widen(&load_raw(src, u, code), code), fmt, div),
            );
            u += lanes;
        }
    }
}

/// Eight elements quantized, as the little-endian bytes of one u64 (element 0 first).
#[inline(always)]
pub(crate) fn pack8(x: &[f32; 8], fmt: Fp8, div: &Divider) -> u64 {
    let q = div.div8(x);
    let mut packed = 0u64;
    let mut k = 0;
    while k < 4 {
        let pair = fmt.from_f32x2(q[2 * k], q[2 * k + 1]);
        packed |= (pair as u64) << (16 * k);
        k += 1;
    }
    packed.to_le()
}

/// Converts the `n` source elements at `src` into `n` fp8 bytes at `dst`, `fp8(x / scale)`,
/// as lane `lane` of a group of `lanes`. With `vec`, units of [`VEC`] elements (one 16-byte
/// load per 8 bf16/f16, two per 8 f32; one 8-byte store); otherwise one element at a time.
/// Lanes touch disjoint elements; together they convert the span exactly once.
///
/// # Safety
/// `src` holds `n` source elements of `code`'s type and `dst` `n` writable bytes; with `vec`,
/// `n` is a multiple of [`VEC`], `src` 16-byte aligned and `dst` 8-byte aligned; otherwise
/// `src` is aligned for its element type.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn convert_span(
    src: *const u8,
    dst: *mut u8,
    n: u64,
    lane: u64,
    lanes: u64,
    code: u32,
    scale: f32,
    vec: bool,
) {
    if vec {
        let div = Divider::new(scale);
        // SAFETY: forwarded from the caller.
        by_code!(code, C => unsafe { convert_units(src, dst, lane, n / VEC, lanes, C, &div) });
    } else {
        let fmt = format(code);
        let mut i = lane;
        while i < n {
            // SAFETY: element i < n lies in both spans.
            unsafe { write(dst.add(i as usize), fmt.quantize(load(src, i, code), scale)) };
            i += lanes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector and scalar paths agree with one another (the oracle tests of `fp8` cover
    /// the conversion itself), for every source type and format, any lane split.
    #[test]
    fn vector_and_scalar_paths_agree() {
        let mut src = [0u32; 64]; // 16-byte aligned through V16 below
        for (i, w) in src.iter_mut().enumerate() {
            *w = (i as u32).wrapping_mul(0x9E37_79B9) ^ 0x3C00_4000;
        }
        let aligned: [V16; 16] = core::array::from_fn(|k| {
            V16::from_array([src[4 * k], src[4 * k + 1], src[4 * k + 2], src[4 * k + 3]])
        });
        let p = aligned.as_ptr() as *const u8;
        for s in [SRC_BF16, SRC_F16, SRC_F32] {
            for to in [TO_E4M3, TO_E5M2] {
                let c = code(s, to);
                let n = 256 / src_bytes(c);
                for lanes in [1u64, 3, 8] {
                    let (mut a, mut b) = ([0u64; 16], [0u64; 16]);
                    for lane in 0..lanes {
                        // SAFETY: n elements of the source type fit in 256 bytes; 128-byte outputs.
                        unsafe {
                            convert_span(p, a.as_mut_ptr().cast(), n, lane, lanes, c, 0.75, true);
                            convert_span(p, b.as_mut_ptr().cast(), n, lane, lanes, c, 0.75, false);
                        }
                    }
                    assert_eq!(a, b, "code {c:#x} lanes {lanes}");
                    let mut h = [0u64; 16];
                    for lane in 0..lanes {
                        // SAFETY: as above.
                        unsafe {
                            let held = preload(p, n, lane, c);
                            convert_held(p, h.as_mut_ptr().cast(), n, lane, lanes, c, 0.75, &held);
                        }
                    }
                    assert_eq!(h, b, "preloaded: code {c:#x} lanes {lanes}");
                }
            }
        }
    }
}
