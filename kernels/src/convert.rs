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
    // Arithmetic rather than a `match`, which LLVM turns into a table in global memory: a load
    // that may be placed before `griddepcontrol.wait` (see `pdl::Signal::BODY_WAITS`).
    let c = code & 0xf;
    if c == 0 || c > SRC_F32 {
        0
    } else {
        2 << (c == SRC_F32) as u64
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
pub type Raw = [V16; 2];

/// What a lane loads (through the span core, [`crate::span::load_round`]) for one vector unit
/// of a conversion and holds until it converts it: one 16-byte access of bf16/f16 ([`V16`]),
/// two of f32 ([`Raw`]).
pub trait Loaded: crate::span::Unit {
    /// The unit's raw bytes, as [`Span::load`] holds them.
    fn raw(&self) -> Raw;
}

impl Loaded for V16 {
    #[inline(always)]
    fn raw(&self) -> Raw {
        [*self, V16::splat(0)]
    }
}

impl Loaded for Raw {
    #[inline(always)]
    fn raw(&self) -> Raw {
        *self
    }
}

/// One vector unit of conversion `C` (eight source elements, as loaded) divided by the
/// divider's scale and quantized: eight fp8 bytes, as the little-endian `u64` to store. A unit
/// whose elements [`fast`] accepts (finite, at most 2^80: zeros and tiny values too) takes
/// [`Divider::div8_fp8`], any other IEEE division element by element. (Against
/// [`Divider::div8`], which sends a unit holding a zero or a tiny value to IEEE division,
/// on the H100: fp8 NHD update 90.7% against 88.5% of the copy ceiling at 65,536 tokens,
/// MLA fp8 equal at 65,536, 1.84 against 1.92 µs in a graph at 256; BENCHMARKS.md,
/// session 15.)
#[inline(always)]
pub(crate) fn unit<const C: u32>(raw: &Raw, div: &Divider) -> u64 {
    let x = widen(raw, C);
    let q = if fast::<C, 1>(core::array::from_ref(raw), div) {
        div.div8_fp8(&x)
    } else {
        div.div8_ieee(&x)
    };
    pack8_with(&q, format(C))
}

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

/// Vector units a lane has in flight per batch of [`Span::load`]: four 16-byte loads (four
/// units of bf16/f16, two of f32, whose units take two loads each).
pub const fn batch(code: u32) -> u32 {
    if code & 0xf == SRC_F32 {
        2
    } else {
        4
    }
}

/// Most units of a batch (the register array [`Span::load`] fills).
pub const MAX_BATCH: usize = 4;

/// A batch of raw units ([`Span::load`]), converted and stored by [`Span::store`].
pub type Batch = [Raw; MAX_BATCH];

/// The source of one work item of a converting update: `split` steps (vector units of
/// [`VEC`] elements, or single elements) at `src[0]`, then the rest of `total` at `src[1]`
/// from its first step (an MLA row: latent then rope part; otherwise `split == total`).
/// Lane `lane` of a group of `lanes` converts steps `lane, lane + lanes, ...`; its
/// destination is laid out alike (`split` steps at `dst[0]`, the rest at `dst[1]`).
#[derive(Clone, Copy, Debug)]
pub struct Span {
    /// Where steps `0..split` and `split..total` start.
    pub src: [*const u8; 2],
    /// Steps at `src[0]`.
    pub split: u32,
    /// Steps in all.
    pub total: u32,
}

impl Span {
    /// Which part step `j` lies in, and its index there.
    #[inline(always)]
    fn at(&self, j: u32) -> (usize, u32) {
        if j < self.split {
            (0, j)
        } else {
            (1, j - self.split)
        }
    }

    /// Loads the lane's vector units `j, j + lanes, ...` (at most [`batch`]`(C)` of them,
    /// those below `total`) without converting them, so the loads are in flight while the
    /// caller looks up where they go. Volatile, so the compiler cannot sink them past that
    /// lookup.
    ///
    /// # Safety
    /// Every unit below `total` lies in its part of the source, 16-byte aligned (vector
    /// units of conversion `C`).
    #[inline(always)]
    pub unsafe fn load<const C: u32>(&self, j: u32, lanes: u32) -> Batch {
        let mut raw = [[V16::splat(0); 2]; MAX_BATCH];
        // Unrolled: constant indices keep the batch in registers.
        unroll4!(b => {
            let u = j + b as u32 * lanes;
            if b < batch(C) as usize && u < self.total {
                let (part, k) = self.at(u);
                // SAFETY: unit u < total lies in its part (the caller's contract).
                raw[b] = unsafe { load_raw(self.src[part], k as u64, C) };
            }
        });
        raw
    }

    /// Converts and stores what [`Span::load`] loaded for the same `j` and `lanes`, one unit
    /// after the other (8 bytes of fp8 each), into `dst` (laid out as the source).
    ///
    /// # Safety
    /// Every unit below `total` lies in its part of the destination, 8-byte aligned.
    #[inline(always)]
    pub unsafe fn store<const C: u32>(
        &self,
        dst: [*mut u8; 2],
        raw: &Batch,
        j: u32,
        lanes: u32,
        div: &Divider,
    ) {
        unroll4!(b => {
            let u = j + b as u32 * lanes;
            if b < batch(C) as usize && u < self.total {
                let (part, k) = self.at(u);
                let v = unit::<C>(&raw[b], div);
                // SAFETY: unit u < total lies in its part (the caller's contract).
                unsafe { write((dst[part] as *mut u64).add(k as usize), v) };
            }
        });
    }

    /// Converts the lane's vector units from `j` on (`j`'s batch already loaded into `raw`),
    /// batch after batch.
    ///
    /// # Safety
    /// As [`Span::load`] and [`Span::store`]; `raw` is `self.load::<C>(j, lanes)`.
    #[inline(always)]
    pub unsafe fn convert<const C: u32>(
        &self,
        dst: [*mut u8; 2],
        raw: &Batch,
        j: u32,
        lanes: u32,
        div: &Divider,
    ) {
        // SAFETY: forwarded.
        unsafe { self.store::<C>(dst, raw, j, lanes, div) };
        let mut j = j + batch(C) * lanes;
        while j < self.total {
            // SAFETY: forwarded.
            unsafe {
                let raw = self.load::<C>(j, lanes);
                self.store::<C>(dst, &raw, j, lanes, div);
            }
            j += batch(C) * lanes;
        }
    }

    /// Converts the lane's elements one at a time (steps are elements), dividing by `scale`.
    ///
    /// # Safety
    /// Every element below `total` lies in its part of the source (aligned for conversion
    /// `C`'s source type) and of the destination.
    #[inline(always)]
    pub unsafe fn convert_scalar<const C: u32>(
        &self,
        dst: [*mut u8; 2],
        lane: u32,
        lanes: u32,
        scale: f32,
    ) {
        let fmt = format(C);
        let mut i = lane;
        while i < self.total {
            let (part, k) = self.at(i);
            // SAFETY: element i < total lies in its part of both spans.
            unsafe {
                let x = load(self.src[part], k as u64, C);
                write(dst[part].add(k as usize), fmt.quantize(x, scale));
            }
            i += lanes;
        }
    }
}

/// Whether every element of the units `raws` of conversion `C` (as loaded) is finite and of
/// magnitude at most 2^80 ([`crate::fp8::FP8_FAST_MAX`], checked on the raw bits) and `div`
/// has a fast path ([`Divider::has_fast`]): then [`unit_fast`] converts each of them exactly
/// as [`unit`](fn@unit) would.
///
/// For bf16 and f16 the two elements of a 32-bit word are tested at once: with `m` a 16-bit
/// magnitude (below `0x8000`), `(max | 0x8000) - m` has bit 15 set exactly when `m <= max`,
/// without borrowing from the other half. A bf16's f32 bits are its bits shifted up by 16, so
/// its bound is the f32 one shifted down; every finite f16 lies below 2^80, so its bound is
/// the largest finite f16, `0x7bff`.
#[inline(always)]
pub(crate) fn fast<const C: u32, const N: usize>(raws: &[Raw; N], div: &Divider) -> bool {
    div.has_fast() && in_fast_range::<C, N>(raws)
}

/// [`fast`]'s test of the elements (see there), without the divider's.
///
/// In kvio's sm_90 PTX the largest magnitude is found first, one packed `max` a 32-bit word
/// (`max_abs`) in a tree of four chains, and tested once; elsewhere each word is tested
/// as it comes (two elements at a time for 2-byte sources, see [`fast`]). Both give the same
/// answer: the packed `max` keeps NaN (a NaN's magnitude bits lie above the bound).
#[inline(always)]
fn in_fast_range<const C: u32, const N: usize>(raws: &[Raw; N]) -> bool {
    let (max, max16) = fast_bounds::<C>();
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
    {
        // Four chains (one per word of a 16-byte half), so that the maxima do not wait on
        // each other; the first unit's words start them (their signs and NaN payloads do not
        // matter: the test below reads magnitude bits).
        let mut acc = raws[0][0].to_array();
        let mut n = 0;
        while n < N {
            let (a, b) = (raws[n][0].to_array(), raws[n][1].to_array());
            let mut k = 0;
            while k < 4 {
                if n > 0 {
                    acc[k] = max_abs::<C>(acc[k], a[k]);
                }
                if C & 0xf == SRC_F32 {
                    acc[k] = max_abs::<C>(acc[k], b[k]);
                }
                k += 1;
            }
            n += 1;
        }
        let m = max_abs::<C>(max_abs::<C>(acc[0], acc[1]), max_abs::<C>(acc[2], acc[3]));
        if C & 0xf == SRC_F32 {
            m & 0x7fff_ffff <= max
        } else {
            (m & 0x7fff <= max16) & ((m >> 16) & 0x7fff <= max16)
        }
    }
    #[cfg(not(all(target_arch = "nvptx64", target_feature = "sm_90")))]
    {
        in_fast_range_words::<C, N>(raws, max, max16)
    }
}

/// The largest magnitude bits [`in_fast_range`] accepts for conversion `C`'s source elements:
/// as f32 bits ([`crate::fp8::FP8_FAST_MAX`]), and as 16-bit halves (a bf16's bits are its f32
/// bits shifted down by 16; every finite f16 lies below 2^80, so its bound is the largest
/// finite f16, `0x7bff`).
#[inline(always)]
fn fast_bounds<const C: u32>() -> (u32, u32) {
    let max = crate::fp8::FP8_FAST_MAX;
    (
        max,
        if C & 0xf == SRC_BF16 {
            max >> 16
        } else {
            0x7bff
        },
    )
}

/// [`in_fast_range`] word by word: for 2-byte sources `(max16 | 0x8000) - m` of each half's
/// magnitude `m`, whose bit 15 is set exactly where `m <= max16`.
#[inline(always)]
fn in_fast_range_words<const C: u32, const N: usize>(
    raws: &[Raw; N],
    max: u32,
    max16: u32,
) -> bool {
    const HALF: u32 = 0x8000_8000;
    let max2 = (max16 | 0x8000) * 0x1_0001;
    let mut ok = HALF;
    let mut wide = true;
    let mut n = 0;
    while n < N {
        let (a, b) = (raws[n][0].to_array(), raws[n][1].to_array());
        let mut k = 0;
        while k < 4 {
            if C & 0xf == SRC_F32 {
                wide &= (a[k] & 0x7fff_ffff <= max) & (b[k] & 0x7fff_ffff <= max);
            } else {
                ok &= max2.wrapping_sub(a[k] & !HALF);
            }
            k += 1;
        }
        n += 1;
    }
    wide && ok & HALF == HALF
}

/// The larger magnitude of `a` and `b`, per element of conversion `C`'s source type (two
/// bf16 or f16 halves of a word, or one f32), NaN where either is NaN; the sign bits are
/// their XOR (PTX `max.NaN.xorsign.abs`, sm_86 and later, PTX ISA 7.2).
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
#[inline(always)]
fn max_abs<const C: u32>(a: u32, b: u32) -> u32 {
    let m: u32;
    // SAFETY: register-only arithmetic.
    unsafe {
        if C & 0xf == SRC_BF16 {
            core::arch::asm!("max.NaN.xorsign.abs.bf16x2 {m}, {a}, {b};",
                m = out(reg32) m, a = in(reg32) a, b = in(reg32) b,
                options(pure, nomem, nostack));
        } else if C & 0xf == SRC_F16 {
            core::arch::asm!("max.NaN.xorsign.abs.f16x2 {m}, {a}, {b};",
                m = out(reg32) m, a = in(reg32) a, b = in(reg32) b,
                options(pure, nomem, nostack));
        } else {
            core::arch::asm!("max.NaN.xorsign.abs.f32 {m}, {a}, {b};",
                m = out(reg32) m, a = in(reg32) a, b = in(reg32) b,
                options(pure, nomem, nostack));
        }
    }
    m
}

/// [`unit`](fn@unit) for a unit whose elements [`fast`] accepted: the same bytes.
#[inline(always)]
pub(crate) fn unit_fast<const C: u32>(raw: &Raw, div: &Divider) -> u64 {
    pack8_with(&div.div8_fp8(&widen(raw, C)), format(C))
}

/// Eight elements quantized, as the little-endian bytes of one u64 (element 0 first).
#[inline(always)]
pub(crate) fn pack8(x: &[f32; 8], fmt: Fp8, div: &Divider) -> u64 {
    pack8_with(&div.div8(x), fmt)
}

/// Eight quotients converted to `fmt`, as the little-endian bytes of one u64.
#[inline(always)]
fn pack8_with(q: &[f32; 8], fmt: Fp8) -> u64 {
    let mut packed = 0u64;
    let mut k = 0;
    while k < 4 {
        let pair = fmt.from_f32x2(q[2 * k], q[2 * k + 1]);
        packed |= (pair as u64) << (16 * k);
        k += 1;
    }
    packed.to_le()
}

/// Not a kernel: a device function that checks [`in_fast_range`] against
/// [`in_fast_range_words`] for four units of each source type (bf16, f16, f32), every unit's
/// words in range except one, which takes each 32-bit pattern `first, first + 1, ..,
/// first + count - 1` in turn, in the unit, word and half that the pattern's low bits pick
/// (in range words of both signs around it); returns how many answers differ.
/// `tests/gpu_fp8.rs` calls it from a small entry point appended to the PTX, over all 2^32
/// patterns: in the sm_90 PTX the two tests are different code.
#[cfg(target_arch = "nvptx64")]
#[no_mangle]
#[inline(never)]
pub fn kvio_range_probe(first: u32, count: u32) -> u32 {
    fn check<const C: u32>(w: u32, at: u32) -> u32 {
        let (max, max16) = fast_bounds::<C>();
        // In range, of both signs: 1.5 and -0.75 (bf16), 1.5 and -0.75 (f16), 1.5 (f32).
        let fill = match C & 0xf {
            SRC_BF16 => 0xbf40_3fc0,
            SRC_F16 => 0xba00_3e00,
            _ => 0x3fc0_0000,
        };
        let mut raws = [[V16::splat(fill), V16::splat(fill ^ 0x8000_0000)]; 4];
        let (u, h, k) = (
            (at >> 3) as usize & 3,
            (at >> 2) as usize & 1,
            at as usize & 3,
        );
        let h = if C & 0xf == SRC_F32 { h } else { 0 };
        let mut words = raws[u][h].to_array();
        words[k] = w;
        raws[u][h] = V16::from_array(words);
        (in_fast_range::<C, 4>(&raws) != in_fast_range_words::<C, 4>(&raws, max, max16)) as u32
    }
    let mut bad = 0;
    let mut i = 0;
    while i < count {
        let w = first.wrapping_add(i);
        bad += check::<{ code(SRC_BF16, TO_E4M3) }>(w, w);
        bad += check::<{ code(SRC_F16, TO_E4M3) }>(w, w >> 5);
        bad += check::<{ code(SRC_F32, TO_E4M3) }>(w, w >> 10);
        i += 1;
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Converts `n` elements at `p` into `out` with every lane of `lanes`, as one span or
    /// split in two parts at element `split`, by vector units or one element at a time.
    fn run<const C: u32>(p: *const u8, n: u32, split: u32, lanes: u32, vec: bool) -> [u64; 16] {
        let mut out = [0u64; 16];
        let o = out.as_mut_ptr() as *mut u8;
        let per = if vec { VEC as u32 } else { 1 };
        // SAFETY: n elements of the source type fit in 256 bytes, n bytes in 128; split is a
        // multiple of VEC, so both parts keep the vector alignment.
        unsafe {
            let sp = Span {
                src: [p, p.add((split as u64 * src_bytes(C)) as usize)],
                split: split / per,
                total: n / per,
            };
            let dst = [o, o.add(split as usize)];
            let div = Divider::new(0.75);
            for lane in 0..lanes {
                if vec {
                    let raw = sp.load::<C>(lane, lanes);
                    sp.convert::<C>(dst, &raw, lane, lanes, &div);
                } else {
                    sp.convert_scalar::<C>(dst, lane, lanes, 0.75);
                }
            }
        }
        out
    }

    fn check<const C: u32>(p: *const u8) {
        let n = (256 / src_bytes(C)) as u32;
        let want = run::<C>(p, n, n, 1, false);
        for lanes in [1u32, 3, 8, 32] {
            for split in [n, 0, 8, 24, n - 8] {
                for vec in [false, true] {
                    let got = run::<C>(p, n, split, lanes, vec);
                    assert_eq!(
                        got, want,
                        "code {C:#x} lanes {lanes} split {split} vec {vec}"
                    );
                }
            }
        }
    }

    /// The vector and scalar paths agree with one another (the oracle tests of `fp8` cover
    /// the conversion itself), for every source type and format, any lane split, one part
    /// or two.
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
        check::<{ code(SRC_BF16, TO_E4M3) }>(p);
        check::<{ code(SRC_F16, TO_E4M3) }>(p);
        check::<{ code(SRC_F32, TO_E4M3) }>(p);
        check::<{ code(SRC_BF16, TO_E5M2) }>(p);
        check::<{ code(SRC_F16, TO_E5M2) }>(p);
        check::<{ code(SRC_F32, TO_E5M2) }>(p);
    }

    /// Whether `x` lies in the fast range of the fp8 division, by its float value.
    fn in_range(x: f32) -> bool {
        x.abs() <= f32::from_bits(crate::fp8::FP8_FAST_MAX)
    }

    /// The packed test of 16-bit sources agrees with the float test for every bf16 and f16
    /// bit pattern at every position of a unit (the others ordinary values), in one unit and
    /// as the last of two.
    #[test]
    fn fast_range_matches_the_float_test_for_every_16_bit_pattern() {
        fn check<const C: u32>(one: u16, wide: fn(u16) -> f32) {
            for p in 0..=u16::MAX {
                for k in 0..8 {
                    let mut h = [one; 8];
                    h[k] = p;
                    let w: [u32; 4] =
                        core::array::from_fn(|j| h[2 * j] as u32 | (h[2 * j + 1] as u32) << 16);
                    let raw = [V16::from_array(w), V16::splat(0)];
                    let want = in_range(wide(p));
                    assert_eq!(
                        in_fast_range::<C, 1>(&[raw]),
                        want,
                        "{C:#x} {p:#06x} at {k}"
                    );
                    let ok = [V16::from_array([one as u32 * 0x1_0001; 4]), V16::splat(0)];
                    assert_eq!(in_fast_range::<C, 2>(&[ok, raw]), want, "{C:#x} {p:#06x}");
                }
            }
        }
        check::<{ code(SRC_BF16, TO_E4M3) }>(0x3f80, crate::fp8::bf16_to_f32);
        check::<{ code(SRC_F16, TO_E5M2) }>(0x3c00, crate::fp8::f16_to_f32);
    }

    /// The test of f32 sources agrees with the float test at the range's edges, for specials
    /// and for random patterns, at every position of a unit.
    #[test]
    fn fast_range_matches_the_float_test_for_f32() {
        let max = crate::fp8::FP8_FAST_MAX;
        let edges = [
            0,
            1,
            0x7f80_0000,
            0x7fc0_0000,
            0x7f80_0001,
            0x3f80_0000,
            u32::MAX >> 1,
        ];
        let bounds = [max - 1, max, max + 1, 0x1780_0000, 0x177f_ffff];
        let mut r = 0x9e37_79b9_7f4a_7c15u64;
        let random = core::iter::repeat_with(move || {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            r as u32
        });
        for b in edges.into_iter().chain(bounds).chain(random.take(4096)) {
            for sign in [0, 0x8000_0000] {
                let x = b | sign;
                for k in 0..8 {
                    let mut w = [0x3f80_0000u32; 8];
                    w[k] = x;
                    let raw = [
                        V16::from_array([w[0], w[1], w[2], w[3]]),
                        V16::from_array([w[4], w[5], w[6], w[7]]),
                    ];
                    let want = in_range(f32::from_bits(x));
                    assert_eq!(
                        in_fast_range::<{ code(SRC_F32, TO_E4M3) }, 1>(&[raw]),
                        want,
                        "{x:#010x} at {k}"
                    );
                }
            }
        }
    }
}
