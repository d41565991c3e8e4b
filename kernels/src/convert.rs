//! Converting a span on its way into the cache: source elements (bf16, f16 or f32) quantized to
//! fp8 with a scale (vLLM's `scaled_convert`: `fp8(x / scale)`), the copy core's counterpart
//! for caches that store another type than their inputs.
//!
//! A conversion is named by one `u32` code (a kernel parameter): the source type in the low
//! nibble, the fp8 format in the next; [`NONE`] (0) means "copy the bytes as they are".

use core::ptr::{read, write};

use crate::fp8::{bf16_to_f32, f16_to_f32, Fp8};
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
unsafe fn load(src: *const u8, i: u64, code: u32) -> f32 {
    // SAFETY: forwarded from the caller.
    unsafe {
        match code & 0xf {
            SRC_BF16 => bf16_to_f32(read((src as *const u16).add(i as usize))),
            SRC_F16 => f16_to_f32(read((src as *const u16).add(i as usize))),
            _ => read((src as *const f32).add(i as usize)),
        }
    }
}

/// Eight source elements starting at element `8 * u`, widened to f32.
///
/// # Safety
/// `src` holds elements `8u..8u + 8`, 16-byte aligned.
#[inline(always)]
unsafe fn load8(src: *const u8, u: u64, code: u32) -> [f32; 8] {
    let mut x = [0f32; 8];
    // SAFETY: forwarded from the caller (one or two whole 16-byte units).
    unsafe {
        if code & 0xf == SRC_F32 {
            let p = (src as *const V16).add(2 * u as usize);
            let (a, b) = (read(p).to_array(), read(p.add(1)).to_array());
            let mut k = 0;
            while k < 4 {
                x[k] = f32::from_bits(a[k]);
                x[k + 4] = f32::from_bits(b[k]);
                k += 1;
            }
        } else {
            let w = read((src as *const V16).add(u as usize)).to_array();
            let mut k = 0;
            while k < 4 {
                let (lo, hi) = (w[k] as u16, (w[k] >> 16) as u16);
                x[2 * k] = if code & 0xf == SRC_BF16 {
                    bf16_to_f32(lo)
                } else {
                    f16_to_f32(lo)
                };
                x[2 * k + 1] = if code & 0xf == SRC_BF16 {
                    bf16_to_f32(hi)
                } else {
                    f16_to_f32(hi)
                };
                k += 1;
            }
        }
    }
    x
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
    let fmt = format(code);
    if vec {
        let mut u = lane;
        while u < n / VEC {
            // SAFETY: unit u < n / 8 lies in both spans (caller's alignment).
            unsafe {
                let x = load8(src, u, code);
                let mut packed = 0u64;
                let mut k = 0;
                while k < 4 {
                    let pair = fmt.quantize_x2(x[2 * k], x[2 * k + 1], scale);
                    packed |= (pair as u64) << (16 * k);
                    k += 1;
                }
                write((dst as *mut u64).add(u as usize), packed.to_le());
            }
            u += lanes;
        }
    } else {
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
                }
            }
        }
    }
}
