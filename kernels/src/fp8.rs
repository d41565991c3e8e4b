//! fp8 quantize-on-write, vLLM semantics: `cache = fp8(x / scale)` with `x` widened to f32
//! exactly, `scale` an f32 and IEEE (round-to-nearest) f32 division, then the conversion of
//! CUDA's `__nv_cvt_float_to_fp8(v, __NV_SATFINITE, kind)`, i.e. PTX
//! `cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32`:
//!
//! - round to nearest, ties to even (on the fp8 code: the even code wins), fp8 subnormals
//!   included; f32 subnormal inputs are converted exactly too (they all round to ±0);
//! - finite values beyond the largest finite fp8 value and ±inf saturate to ±max finite
//!   (448 for e4m3fn, 57344 for e5m2); e5m2's infinity codes are never produced;
//! - NaN → [`NAN`] (`0x7f`) in both formats, whatever the NaN's sign and payload;
//! - the sign is kept for everything else: −0 → `0x80`, and a negative value that rounds to
//!   zero gives `0x80` as well.
//!
//! Two bit-identical implementations: [`soft`] (integer bit manipulation, branch-light, for
//! sm_80 and the CPU) and, on nvptx built for sm_90 or later (kvio's sm_90 PTX), `hw` (one
//! `cvt.rn.satfinite.*x2.f32` per pair of values). The functions at the top of this module pick
//! `hw` where it is compiled in (cfg `all(target_arch = "nvptx64", target_feature = "sm_90")`,
//! which rustc sets for `-Ctarget-cpu=sm_90` and above) and `soft` everywhere else. sm_89 has
//! the instruction too, but only from PTX ISA 8.1 (ptxas 12.9: "cvt with .e4m3x2/.e5m2x2 on
//! sm_89 requires PTX ISA .version 8.1"), while rustc's sm_89 PTX is `.version 7.8`; so sm_89
//! builds take the software path.
//!
//! NaN encoding. The PTX ISA only says, for `.satfinite` with `.e4m3x2`/`.e5m2x2` destinations:
//! "if the input value is NaN, then the result is NaN in the specified destination format", and
//! for `.relu`: "NaN results are converted to canonical NaN". CUDA's own host fallback of
//! `__nv_cvt_float_to_fp8` (cuda_fp8.hpp, used where the instruction is unavailable) first
//! replaces any NaN input by `0x7FFFFFFF` and then returns `0x7F` for e4m3 and
//! `0x7E | mantissa = 0x7F` for e5m2, sign dropped; vLLM's notes give NaN → `0x7F`. [`soft`]
//! does the same: `0x7f` for every NaN, both formats. Whether the instruction keeps a
//! NaN's sign (`0xff`) has not been observed here (no GPU); the hardware path passes the
//! instruction's bits through untouched.
//!
//! Pairs: `*x2` functions take `(lo, hi)` and return `lo`'s code in bits 0..8 and `hi`'s in
//! bits 8..16, i.e. the little-endian memory order of two consecutive fp8 elements (`lo` at
//! the lower address). PTX's `cvt...x2.f32 d, a, b` puts `a` in the *upper* byte, so the
//! hardware path passes `hi` first.
//!
//! A kernel quantizing a span calls [`quantize_e4m3x2`] (or the e5m2 one) on consecutive pairs
//! of widened inputs ([`bf16_to_f32`], [`f16_to_f32`], or f32 as is) and stores the `u16`s;
//! `kvio_fp8_probe` (nvptx only) keeps both paths in the PTX until such a kernel exists.

/// The NaN code both conversions produce (positive sign, all exponent and mantissa bits set).
pub const NAN: u8 = 0x7f;

/// Largest finite e4m3fn value (code `0x7e`).
pub const E4M3_MAX: f32 = 448.0;

/// Largest finite e5m2 value (code `0x7b`).
pub const E5M2_MAX: f32 = 57344.0;

/// An fp8 format of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8 {
    /// `float8_e4m3fn`: bias 7, 3 mantissa bits, max 448, no infinities, NaN `0x7f`/`0xff`.
    E4m3,
    /// `float8_e5m2`: bias 15, 2 mantissa bits, max 57344, infinities `0x7c`/`0xfc`.
    E5m2,
}

impl Fp8 {
    /// `x` converted to this format (see the module docs).
    #[inline(always)]
    pub fn from_f32(self, x: f32) -> u8 {
        match self {
            Fp8::E4m3 => f32_to_e4m3(x),
            Fp8::E5m2 => f32_to_e5m2(x),
        }
    }

    /// `lo` and `hi` converted to this format, `lo` in the low byte.
    #[inline(always)]
    pub fn from_f32x2(self, lo: f32, hi: f32) -> u16 {
        match self {
            Fp8::E4m3 => f32x2_to_e4m3x2(lo, hi),
            Fp8::E5m2 => f32x2_to_e5m2x2(lo, hi),
        }
    }

    /// `x / scale` converted to this format (vLLM's `scaled_convert`).
    #[inline(always)]
    pub fn quantize(self, x: f32, scale: f32) -> u8 {
        self.from_f32(x / scale)
    }

    /// `lo / scale` and `hi / scale` converted to this format, `lo` in the low byte.
    #[inline(always)]
    pub fn quantize_x2(self, lo: f32, hi: f32, scale: f32) -> u16 {
        self.from_f32x2(lo / scale, hi / scale)
    }
}

/// Division of many values by one scale, rounded exactly as IEEE f32 division (`x / scale`).
///
/// A kernel quantizing a span divides every element by the same scale. IEEE division compiles
/// to a reciprocal estimate, its refinement, the quotient, one correction and a range check
/// with an out-of-line slow path — per element. The refined reciprocal depends on the scale
/// only, so the GPU path computes it once ([`Divider::new`]) and spends three instructions per
/// element: `q = x * y`, `e = fma(-q, scale, x)` (exact), `q' = fma(e, y, q)`, the same
/// operations, in the same order, as the fast path of the division `ptxas` emits for
/// `div.rn.f32`. That path is correctly rounded where no intermediate leaves the normal range;
/// [`Divider::div8`] takes it only where `scale` lies in `[2^-32, 2^32]` (positive) and every
/// `|x|` in `[2^-80, 2^80]` (zeros, subnormals, ±inf, NaN and extremes go through `x / scale`).
/// `tests/gpu_fp8.rs` checks it bit for bit against `div.rn.f32` on the GPU for every f32 bit
/// pattern of `x` and a set of scales. On the CPU it is `x / scale`.
#[derive(Clone, Copy, Debug)]
pub struct Divider {
    scale: f32,
    /// The refined reciprocal where the fast path may be taken (GPU, `scale` in range),
    /// else 0.
    #[cfg_attr(not(target_arch = "nvptx64"), allow(dead_code))]
    recip: f32,
}

/// The range of positive scales of the fast path (see [`Divider`]): 2^-32 ..= 2^32.
const FAST_SCALE: (f32, f32) = (f32::from_bits(0x2f80_0000), f32::from_bits(0x4f80_0000));
/// `|x|` range of the fast path: 2^-80 ..= 2^80.
#[cfg(target_arch = "nvptx64")]
const FAST_X: (f32, f32) = (f32::from_bits(FAST_X_BITS.0), f32::from_bits(FAST_X_BITS.1));

/// The bits of [`Divider`]'s fast `|x|` range (2^-80 ..= 2^80) as f32 magnitudes (sign bit
/// clear): a value's magnitude bits lie in it exactly when its magnitude does (NaN's lie
/// above).
const FAST_X_BITS: (u32, u32) = (0x1780_0000, 0x6780_0000);

/// The largest magnitude bits (sign bit clear) of a value [`Divider::div8_fp8`] takes: 2^80
/// (infinities and NaNs lie above).
pub const FP8_FAST_MAX: u32 = FAST_X_BITS.1;

impl Divider {
    /// A placeholder for code that does not divide (a divider by 1 without the fast path).
    pub const UNUSED: Divider = Divider {
        scale: 1.0,
        recip: 0.0,
    };

    /// A divider by `scale`. The GPU fast path is for positive scales in `[2^-32, 2^32]`
    /// (negative ones, which no stack stores, divide element by element: see
    /// [`Divider::div8_fp8`] for why the sign matters).
    #[inline(always)]
    pub fn new(scale: f32) -> Divider {
        let fast = scale >= FAST_SCALE.0 && scale <= FAST_SCALE.1;
        Divider {
            scale,
            recip: if fast { gpu::recip(scale) } else { 0.0 },
        }
    }

    /// The scale divided by.
    #[inline(always)]
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// Whether [`Divider::div8`] takes the fast path for `x`: this divider has one (GPU,
    /// `scale` in range) and every `|x[k]|` lies in the fast range.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn fast8(&self, x: &[f32; 8]) -> bool {
        let mut ok = self.recip != 0.0;
        let mut k = 0;
        while k < 8 {
            let a = f32::from_bits(x[k].to_bits() & 0x7fff_ffff);
            ok &= (a >= FAST_X.0) & (a <= FAST_X.1);
            k += 1;
        }
        ok
    }

    /// Whether [`Divider::div8_fp8`] may be used for values whose magnitude bits the caller
    /// checked against [`FP8_FAST_MAX`]: on the GPU when `scale` lies in the fast range; on
    /// the CPU always (there it divides), so that the emulation runs the same branches.
    #[inline(always)]
    pub fn has_fast(&self) -> bool {
        cfg!(not(target_arch = "nvptx64")) || self.recip != 0.0
    }

    /// `x[k] / scale` for eight values on their way to fp8, by the fast path alone, where
    /// [`Divider::has_fast`] and every `|x[k]|`'s bits are at most [`FP8_FAST_MAX`] (2^80; the
    /// caller checks both). From 2^-80 up each quotient is rounded as IEEE division (the fast
    /// path of [`Divider::div8`], with the residual's sign turned: the same value); below
    /// (zeros included) it is a value of magnitude below 2^-47 with `x`'s sign, the exact
    /// quotient's for the positive scales the fast path takes, which every fp8 format rounds
    /// to the same signed zero as the exact quotient (the smallest fp8 magnitude is 2^-16).
    /// The sign comes out of the operations themselves (`gpu::refine`), so no
    /// instruction copies it. `tests/gpu_fp8.rs` checks the fp8 codes against those of IEEE
    /// division for every f32 bit pattern. On the CPU it divides.
    #[inline(always)]
    pub fn div8_fp8(&self, x: &[f32; 8]) -> [f32; 8] {
        let mut q = [0f32; 8];
        let mut k = 0;
        while k < 8 {
            #[cfg(target_arch = "nvptx64")]
            {
                q[k] = gpu::refine(x[k], self.scale, self.recip);
            }
            #[cfg(not(target_arch = "nvptx64"))]
            {
                q[k] = x[k] / self.scale;
            }
            k += 1;
        }
        q
    }

    /// `x[k] / scale` for eight values by IEEE division alone (out of line on the GPU): what
    /// [`Divider::div8_fp8`]'s callers take where it may not be used.
    #[inline(always)]
    pub fn div8_ieee(&self, x: &[f32; 8]) -> [f32; 8] {
        let mut q = [0f32; 8];
        let mut k = 0;
        while k < 8 {
            q[k] = divide(x[k], self.scale);
            k += 1;
        }
        q
    }

    /// `x[k] / scale` for eight values, each rounded as IEEE division.
    #[inline(always)]
    pub fn div8(&self, x: &[f32; 8]) -> [f32; 8] {
        #[cfg(target_arch = "nvptx64")]
        {
            if self.fast8(x) {
                let mut q = [0f32; 8];
                let mut k = 0;
                while k < 8 {
                    q[k] = gpu::refine(x[k], self.scale, self.recip);
                    k += 1;
                }
                return q;
            }
        }
        let mut q = [0f32; 8];
        let mut k = 0;
        while k < 8 {
            q[k] = divide(x[k], self.scale);
            k += 1;
        }
        q
    }
}

/// `x / s`, IEEE f32 division: out of line on the GPU, where it is the rarely taken path (its
/// code is not repeated in every inlined copy of [`Divider::div8`]).
#[cfg_attr(target_arch = "nvptx64", inline(never))]
#[cfg_attr(not(target_arch = "nvptx64"), inline(always))]
fn divide(x: f32, s: f32) -> f32 {
    x / s
}

/// The GPU arithmetic of [`Divider`], in PTX so that its operations and rounding are fixed.
#[cfg(target_arch = "nvptx64")]
mod gpu {
    /// `1 / s`, refined: the MUFU estimate plus one Newton step (`ptxas`' `div.rn.f32`
    /// prologue).
    #[inline(always)]
    pub(super) fn recip(s: f32) -> f32 {
        let y: f32;
        // SAFETY: register-only arithmetic.
        unsafe {
            core::arch::asm!(
                "{{ .reg .f32 r, t, n;",
                "rcp.approx.ftz.f32 r, {s};",
                "neg.f32 n, {s};",
                "fma.rn.f32 t, r, n, 0f3F800000;",
                "fma.rn.f32 {y}, r, t, r; }}",
                s = in(reg32) s,
                y = out(reg32) y,
                options(pure, nomem, nostack),
            );
        }
        y
    }

    /// `x / s` from the refined reciprocal `y` (`s > 0`): the estimate `q0 = x * y` and one
    /// correction by the residual, negated so that zeros keep `x`'s sign: `e = q0 * s - x`,
    /// `q = q0 - y * e`. Where `x` and the quotient are nonzero (the fast path of
    /// [`super::Divider::div8`]) this is the textbook correction `q0 + y * (x - q0 * s)`
    /// with both signs turned, so the same value (rounding to nearest is symmetric), rounded as
    /// IEEE division. For [`super::Divider::div8_fp8`]: for `x = -0`, `q0 = -0`, `e = -0 + 0 =
    /// +0` and `q = -0 - (+0) = -0`; for a tiny `x` whose product `q0` rounds to zero, `e = -x`
    /// and `q` is `x * y` rounded once, with its sign. ptxas folds both negations into the
    /// multiply-adds' operands: three instructions an element.
    #[inline(always)]
    pub(super) fn refine(x: f32, s: f32, y: f32) -> f32 {
        let q: f32;
        // SAFETY: register-only arithmetic.
        unsafe {
            core::arch::asm!(
                "{{ .reg .f32 q0, e, nx, ny;",
                "mul.rn.f32 q0, {x}, {y};",
                "neg.f32 nx, {x};",
                "fma.rn.f32 e, q0, {s}, nx;",
                "neg.f32 ny, {y};",
                "fma.rn.f32 {q}, ny, e, q0; }}",
                x = in(reg32) x,
                s = in(reg32) s,
                y = in(reg32) y,
                q = out(reg32) q,
                options(pure, nomem, nostack),
            );
        }
        q
    }
}

/// The CPU has no fast path: [`Divider::div8`] divides.
#[cfg(not(target_arch = "nvptx64"))]
mod gpu {
    #[inline(always)]
    pub(super) fn recip(_s: f32) -> f32 {
        0.0
    }
}

/// bf16 (raw bits) widened to f32: exact, NaN payload and sign kept.
#[inline(always)]
pub const fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// IEEE binary16 (raw bits) widened to f32: exact for every input (subnormals normalised),
/// ±inf kept, NaN sign and payload kept (payload shifted into the top of the f32 mantissa,
/// quiet bit included).
#[inline(always)]
pub const fn f16_to_f32(bits: u16) -> f32 {
    let h = bits as u32;
    let sign = (h & 0x8000) << 16;
    let exp = (h >> 10) & 0x1f;
    let man = h & 0x3ff;
    let mag = if exp == 0x1f {
        // inf / NaN
        0x7f80_0000 | (man << 13)
    } else if exp != 0 {
        // normal: rebias 15 -> 127
        ((exp + 112) << 23) | (man << 13)
    } else if man == 0 {
        0
    } else {
        // subnormal: man * 2^-24 with man in 1..1024; its leading one is bit `p` (0..=9),
        // so the value is 2^(p-24) * (1 + rest / 2^p).
        let p = 31 - man.leading_zeros();
        ((p + 103) << 23) | ((man << (23 - p)) & 0x7f_ffff)
    };
    f32::from_bits(sign | mag)
}

/// `x` converted to e4m3fn (see the module docs for rounding, saturation and NaN).
#[inline(always)]
pub fn f32_to_e4m3(x: f32) -> u8 {
    f32x2_to_e4m3x2(x, 0.0) as u8
}

/// `x` converted to e5m2 (see the module docs for rounding, saturation and NaN).
#[inline(always)]
pub fn f32_to_e5m2(x: f32) -> u8 {
    f32x2_to_e5m2x2(x, 0.0) as u8
}

/// `lo` and `hi` converted to e4m3fn, `lo`'s code in the low byte.
#[inline(always)]
pub fn f32x2_to_e4m3x2(lo: f32, hi: f32) -> u16 {
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
    {
        hw::f32x2_to_e4m3x2(lo, hi)
    }
    #[cfg(not(all(target_arch = "nvptx64", target_feature = "sm_90")))]
    {
        soft::f32x2_to_e4m3x2(lo, hi)
    }
}

/// `lo` and `hi` converted to e5m2, `lo`'s code in the low byte.
#[inline(always)]
pub fn f32x2_to_e5m2x2(lo: f32, hi: f32) -> u16 {
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
    {
        hw::f32x2_to_e5m2x2(lo, hi)
    }
    #[cfg(not(all(target_arch = "nvptx64", target_feature = "sm_90")))]
    {
        soft::f32x2_to_e5m2x2(lo, hi)
    }
}

/// `x / scale` (IEEE f32 division) converted to e4m3fn.
#[inline(always)]
pub fn quantize_e4m3(x: f32, scale: f32) -> u8 {
    f32_to_e4m3(x / scale)
}

/// `x / scale` (IEEE f32 division) converted to e5m2.
#[inline(always)]
pub fn quantize_e5m2(x: f32, scale: f32) -> u8 {
    f32_to_e5m2(x / scale)
}

/// `lo / scale` and `hi / scale` converted to e4m3fn, `lo`'s code in the low byte.
#[inline(always)]
pub fn quantize_e4m3x2(lo: f32, hi: f32, scale: f32) -> u16 {
    f32x2_to_e4m3x2(lo / scale, hi / scale)
}

/// `lo / scale` and `hi / scale` converted to e5m2, `lo`'s code in the low byte.
#[inline(always)]
pub fn quantize_e5m2x2(lo: f32, hi: f32, scale: f32) -> u16 {
    f32x2_to_e5m2x2(lo / scale, hi / scale)
}

/// The software conversion: integer operations only, no data-dependent branches (the two
/// range cases are selects), usable on every GPU and on the CPU.
pub mod soft {
    /// `x` converted to e4m3fn (bias 7, 3 mantissa bits, max code `0x7e` = 448).
    #[inline(always)]
    pub const fn f32_to_e4m3(x: f32) -> u8 {
        convert::<3, 7, 0x7e>(x)
    }

    /// `x` converted to e5m2 (bias 15, 2 mantissa bits, max code `0x7b` = 57344).
    #[inline(always)]
    pub const fn f32_to_e5m2(x: f32) -> u8 {
        convert::<2, 15, 0x7b>(x)
    }

    /// `lo` and `hi` converted to e4m3fn, `lo`'s code in the low byte.
    #[inline(always)]
    pub const fn f32x2_to_e4m3x2(lo: f32, hi: f32) -> u16 {
        f32_to_e4m3(lo) as u16 | (f32_to_e4m3(hi) as u16) << 8
    }

    /// `lo` and `hi` converted to e5m2, `lo`'s code in the low byte.
    #[inline(always)]
    pub const fn f32x2_to_e5m2x2(lo: f32, hi: f32) -> u16 {
        f32_to_e5m2(lo) as u16 | (f32_to_e5m2(hi) as u16) << 8
    }

    /// f32 → fp8 with `M` mantissa bits, exponent bias `BIAS` and largest finite magnitude code
    /// `MAX` (the format's exponent width follows from `MAX`).
    ///
    /// fp8 magnitude codes are ordered like the values, as are f32 magnitude bits, so the
    /// conversion is "scale the magnitude so that one fp8 unit in the last place becomes 1,
    /// round to nearest even, clamp to `MAX`":
    /// - normal fp8 result (|x| ≥ 2^(1-BIAS)): rebias the f32 exponent field from 127 to `BIAS`
    ///   in place and drop the low `23 - M` bits; a carry out of the mantissa bumps the
    ///   exponent, as it should;
    /// - subnormal fp8 result (|x| < 2^(1-BIAS), f32 subnormals included): the significand
    ///   with its implicit bit, shifted right so that one unit is 2^(1-BIAS-M).
    #[inline(always)]
    const fn convert<const M: u32, const BIAS: u32, const MAX: u32>(x: f32) -> u8 {
        let bits = x.to_bits();
        let sign = (bits >> 24) & 0x80;
        let mag = bits & 0x7fff_ffff;
        let exp = mag >> 23;
        // f32 exponent field of the smallest normal fp8 value 2^(1 - BIAS).
        let min_normal = 128 - BIAS;
        let (v, shift) = if exp >= min_normal {
            (mag - ((127 - BIAS) << 23), 23 - M)
        } else {
            // value = sig * 2^(e - 150) with e = max(exp, 1); in units of 2^(1 - BIAS - M)
            // that is sig >> (151 - BIAS - M - e). Past 31 the result is 0 anyway (sig < 2^24).
            let e = if exp == 0 { 1 } else { exp };
            let sig = (mag & 0x7f_ffff) | ((exp != 0) as u32) << 23;
            let s = 151 - BIAS - M - e;
            (sig, if s > 31 { 31 } else { s })
        };
        // Round to nearest, ties to even: add just under half a unit, plus one when the kept
        // part is odd. No overflow: v < 2^31 and half < 2^30.
        let half = 1u32 << (shift - 1);
        let code = (v + (half - 1) + ((v >> shift) & 1)) >> shift;
        // Saturate finite overflow and ±inf (whose rebased bits are far above MAX).
        let code = if code > MAX { MAX } else { code };
        if mag > 0x7f80_0000 {
            super::NAN
        } else {
            (sign | code) as u8
        }
    }
}

/// The hardware conversion: sm_90 and later (PTX ISA 7.8), one `cvt.rn.satfinite` per pair.
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
pub mod hw {
    /// `lo` and `hi` converted to e4m3fn by `cvt.rn.satfinite.e4m3x2.f32`, `lo` in the low byte
    /// (the instruction's first source goes to the upper byte).
    #[inline(always)]
    pub fn f32x2_to_e4m3x2(lo: f32, hi: f32) -> u16 {
        let d: u16;
        // SAFETY: a register-only conversion; sm_90+ is guaranteed by the cfg.
        unsafe {
            core::arch::asm!(
                "cvt.rn.satfinite.e4m3x2.f32 {d}, {a}, {b};",
                d = out(reg16) d,
                a = in(reg32) hi,
                b = in(reg32) lo,
                options(pure, nomem, nostack),
            );
        }
        d
    }

    /// `lo` and `hi` converted to e5m2 by `cvt.rn.satfinite.e5m2x2.f32`, `lo` in the low byte.
    #[inline(always)]
    pub fn f32x2_to_e5m2x2(lo: f32, hi: f32) -> u16 {
        let d: u16;
        // SAFETY: as above.
        unsafe {
            core::arch::asm!(
                "cvt.rn.satfinite.e5m2x2.f32 {d}, {a}, {b};",
                d = out(reg16) d,
                a = in(reg32) hi,
                b = in(reg32) lo,
                options(pure, nomem, nostack),
            );
        }
        d
    }
}

/// Not a kernel: a device function that keeps the conversions (the hardware one in the sm_90
/// PTX, the software one in the sm_80 PTX) in the generated PTX, so `ptxas` checks them
/// before any kernel calls them. Returns the e4m3 pair of `(a/scale, b/scale)` in bits 0..16
/// and the e5m2 pair in bits 16..32.
#[cfg(target_arch = "nvptx64")]
#[no_mangle]
#[inline(never)]
pub fn kvio_fp8_probe(a: f32, b: f32, scale: f32) -> u32 {
    quantize_e4m3x2(a, b, scale) as u32 | (quantize_e5m2x2(a, b, scale) as u32) << 16
}

/// Not a kernel: a device function that checks [`Divider::div8`] against IEEE division
/// (`div.rn.f32`) for the `count` f32 bit patterns `first, first + 1, ...` (a multiple of 8,
/// below 2^16), and, where the divider has a fast path, the e4m3 and e5m2 codes of
/// [`Divider::div8_fp8`]'s quotients against those of IEEE division for the patterns of
/// magnitude up to [`FP8_FAST_MAX`]; returns how many differ (bits 0..16) and how many took
/// `div8`'s fast path (bits 16..32). `tests/gpu_fp8.rs` calls it from a small entry
/// point appended to the PTX, over all 2^32 patterns.
#[cfg(target_arch = "nvptx64")]
#[no_mangle]
#[inline(never)]
pub fn kvio_divider_probe(first: u32, count: u32, scale: f32) -> u32 {
    let d = Divider::new(scale);
    let mut bad = 0;
    let mut i = 0;
    while i < count {
        let mut x = [0f32; 8];
        let mut k = 0;
        while k < 8 {
            x[k] = f32::from_bits(first.wrapping_add(i + k as u32));
            k += 1;
        }
        let q = d.div8(&x);
        let mut k = 0;
        while k < 8 {
            bad += (q[k].to_bits() != divide(x[k], scale).to_bits()) as u32;
            k += 1;
        }
        bad += (d.fast8(&x) as u32 * 8) << 16;
        // The fp8 codes of `div8_fp8`'s quotients against those of IEEE division, both formats,
        // where it may be used.
        if d.has_fast() {
            let q = d.div8_fp8(&x);
            let mut k = 0;
            while k < 8 {
                if x[k].to_bits() & 0x7fff_ffff <= FP8_FAST_MAX {
                    let want = divide(x[k], scale);
                    for f in [Fp8::E4m3, Fp8::E5m2] {
                        bad += (f.from_f32(q[k]) != f.from_f32(want)) as u32;
                    }
                }
                k += 1;
            }
        }
        i += 8;
    }
    bad
}
