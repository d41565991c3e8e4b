//! fp8 quantize-on-write on the GPU. Three device probes in kvio's PTX, each called over all
//! its inputs from a small entry appended to the PTX here: the sm_90 hardware fp8 conversion
//! (`kvio_fp8_probe`, `fp8::hw`) against the software path (`fp8::soft`, what sm_80 and the
//! CPU run) for all 2^16 bf16 inputs; the division by a scale (`kvio_divider_probe`) and the
//! fast-range test (`kvio_range_probe`) for all 2^32 patterns, in both PTX flavours. Then the
//! quantizing slot updates against the CPU reference, and their argument checks.

use cust::launch;
use cust::memory::{CopyDestination, DeviceBuffer};
use cust::module::Module;
use cust::stream::{Stream, StreamFlags};
use kvio_kernels::fp8::{self, soft};

/// An entry point appended to the sm_90 PTX at run time: thread i writes
/// kvio_fp8_probe(bf16(i), bf16(i + 1), scale) to out[i].
const CHECK_ENTRY: &str = r#"
.visible .entry kvio_fp8_check(.param .u64 out_p, .param .f32 scale_p)
{
    .reg .b32 %cr<12>;
    .reg .b64 %crd<5>;
    mov.u32 %cr1, %ctaid.x;
    mov.u32 %cr2, %ntid.x;
    mov.u32 %cr3, %tid.x;
    mad.lo.u32 %cr4, %cr1, %cr2, %cr3;
    shl.b32 %cr5, %cr4, 16;
    add.u32 %cr6, %cr4, 1;
    shl.b32 %cr6, %cr6, 16;
    ld.param.b32 %cr7, [scale_p];
    {
        .param .b32 a0;
        .param .b32 a1;
        .param .b32 a2;
        .param .b32 rv;
        st.param.b32 [a0], %cr5;
        st.param.b32 [a1], %cr6;
        st.param.b32 [a2], %cr7;
        call.uni (rv), kvio_fp8_probe, (a0, a1, a2);
        ld.param.b32 %cr8, [rv];
    }
    ld.param.u64 %crd1, [out_p];
    cvta.to.global.u64 %crd2, %crd1;
    mul.wide.u32 %crd3, %cr4, 4;
    add.s64 %crd4, %crd2, %crd3;
    st.global.u32 [%crd4], %cr8;
    ret;
}
"#;

#[test]
fn hw_fp8_equals_soft_for_all_bf16() {
    let Some(_gpu) = kvio_suite::gpu("hw_fp8_equals_soft_for_all_bf16") else {
        return;
    };
    let ptx = format!("{}\n{}", kvio::PTX_SM90, CHECK_ENTRY);
    let module = Module::from_ptx(&ptx, &[]).expect("load sm_90 PTX + check entry");
    let check = module.get_function("kvio_fp8_check").unwrap();
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(1 << 16).unwrap();
    let mut bad = 0usize;
    for scale in [1.0f32, 0.0213, 3.7, 1e-30, 1e30, -1.5] {
        unsafe {
            launch!(check<<<256, 256, 0, stream>>>(out.as_device_ptr(), scale)).unwrap();
        }
        stream.synchronize().unwrap();
        let mut got = vec![0u32; 1 << 16];
        out.copy_to(&mut got[..]).unwrap();
        for i in 0..=u16::MAX {
            let (a, b) = (fp8::bf16_to_f32(i), fp8::bf16_to_f32(i.wrapping_add(1)));
            let want = soft::f32x2_to_e4m3x2(a / scale, b / scale) as u32
                | (soft::f32x2_to_e5m2x2(a / scale, b / scale) as u32) << 16;
            let g = got[i as usize];
            if g != want {
                if bad < 20 {
                    eprintln!(
                        "scale {scale:e} bf16 {i:#06x} ({a:e}), next ({b:e}): hw {g:#010x} soft {want:#010x} \
                         (bytes: e4m3 lo/hi, e5m2 lo/hi)"
                    );
                }
                bad += 1;
            }
        }
    }
    // What the instruction does with NaNs of either sign (bf16 0x7fc0 / 0xffc0), for the record.
    let mut got = vec![0u32; 1 << 16];
    unsafe {
        launch!(check<<<256, 256, 0, stream>>>(out.as_device_ptr(), 1.0f32)).unwrap();
    }
    stream.synchronize().unwrap();
    out.copy_to(&mut got[..]).unwrap();
    eprintln!(
        "hw NaN codes: +NaN {:#010x}, -NaN {:#010x} (e4m3 in bits 0..8, e5m2 in bits 16..24)",
        got[0x7fc0], got[0xffc0]
    );
    assert_eq!(bad, 0, "{bad} mismatches between hw and soft");
}

/// An entry point, `kvio_check`, appended to kvio's PTX: thread i calls `probe(i * count,
/// count)` (with `scaled`, `probe(i * count, count, scale)`), the probe checking the bit
/// patterns `[i * count, (i + 1) * count)`, and adds the low and high 16 bits of what it
/// returns to `out[0]` and `out[1]`. Launched by [`all_patterns`].
fn probe_entry(probe: &str, scaled: bool) -> String {
    let (param, arg) = if scaled {
        (
            ", .param .f32 scale_p",
            "\n        .param .b32 a2;\n        ld.param.b32 %pr7, [scale_p];\n        st.param.b32 [a2], %pr7;",
        )
    } else {
        ("", "")
    };
    let args = if scaled { "a0, a1, a2" } else { "a0, a1" };
    format!(
        r#"
.visible .entry kvio_check(.param .u64 out_p, .param .u32 count_p{param})
{{
    .reg .b32 %pr<12>;
    .reg .b64 %prd<4>;
    mov.u32 %pr1, %ctaid.x;
    mov.u32 %pr2, %ntid.x;
    mov.u32 %pr3, %tid.x;
    mad.lo.u32 %pr4, %pr1, %pr2, %pr3;
    ld.param.u32 %pr5, [count_p];
    mul.lo.u32 %pr6, %pr4, %pr5;
    {{
        .param .b32 a0;
        .param .b32 a1;
        .param .b32 rv;{arg}
        st.param.b32 [a0], %pr6;
        st.param.b32 [a1], %pr5;
        call.uni (rv), {probe}, ({args});
        ld.param.b32 %pr8, [rv];
    }}
    and.b32 %pr9, %pr8, 65535;
    shr.u32 %pr10, %pr8, 16;
    ld.param.u64 %prd1, [out_p];
    cvta.to.global.u64 %prd2, %prd1;
    atom.global.add.u32 %pr11, [%prd2], %pr9;
    atom.global.add.u32 %pr11, [%prd2+4], %pr10;
    ret;
}}
"#
    )
}

/// Bit patterns each thread of [`all_patterns`] checks.
const PATTERNS_PER_THREAD: u32 = 1 << 12;

/// Runs `kvio_check` of `module` ([`probe_entry`]) over every 32-bit pattern on `stream`
/// (with `scale` where the probe takes one) and returns the two sums it adds up.
fn all_patterns(module: &Module, stream: &Stream, scale: Option<f32>) -> [u32; 2] {
    let check = module.get_function("kvio_check").unwrap();
    let threads = 256u32;
    let blocks = ((1u64 << 32) / (PATTERNS_PER_THREAD as u64 * threads as u64)) as u32;
    // The kernel adds to the sums: they start at zero.
    let out = DeviceBuffer::<u32>::from_slice(&[0u32; 2]).unwrap();
    let count = PATTERNS_PER_THREAD;
    unsafe {
        match scale {
            Some(scale) => launch!(check<<<blocks, threads, 0, stream>>>(
                out.as_device_ptr(),
                count,
                scale
            )),
            None => launch!(check<<<blocks, threads, 0, stream>>>(out.as_device_ptr(), count)),
        }
        .unwrap();
    }
    stream.synchronize().unwrap();
    let mut got = [u32::MAX; 2];
    out.copy_to(&mut got[..]).unwrap();
    got
}

/// The quantizing kernels take the division's fast path for a warp's units only where every
/// element is finite and at most 2^80 (`convert::in_fast_range`). The sm_90 PTX finds the
/// largest magnitude with packed `max.NaN.xorsign.abs` instructions; the sm_80 PTX (and the
/// CPU) test each word's halves with integer arithmetic. On the GPU, for every 32-bit pattern
/// as one word of four units of bf16, f16 and f32 elements (the other words in range, of both
/// signs): both tests agree, in both PTX flavours.
#[test]
fn fast_range_tests_agree_for_every_word() {
    let Some(_gpu) = kvio_suite::gpu("fast_range_tests_agree_for_every_word") else {
        return;
    };
    let entry = probe_entry("kvio_range_probe", false);
    for (arch, base) in [("sm_90", kvio::PTX_SM90), ("sm_80", kvio::PTX_SM80)] {
        let module = Module::from_ptx(format!("{base}\n{entry}"), &[]).expect("load PTX + probe");
        let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
        let got = all_patterns(&module, &stream, None);
        assert_eq!(got, [0, 0], "{arch}: the two fast-range tests differ");
    }
}

/// The quantizing kernels divide by a scale through `fp8::Divider` (a reciprocal computed once
/// per scale, three operations per element on the GPU). It must round exactly as IEEE
/// division: checked against `div.rn.f32` on the GPU for every f32 bit pattern of `x` (all
/// bf16 and f16 values widen to some of them), for scales that stress the reciprocal (all-ones
/// mantissas, powers of two, the ends of the fast path's range, just outside it, negatives,
/// which divide element by element, subnormal, zero, inf, NaN) and random ones; in both PTX
/// flavours (sm_80 and sm_90). The same probe checks `Divider::div8_fp8` (zeros and tiny
/// values on the fast path, exact only up to fp8 rounding): its e4m3 and e5m2 codes against
/// those of IEEE division for every pattern of magnitude up to 2^80.
#[test]
fn divider_matches_ieee_division_for_every_f32() {
    let Some(_gpu) = kvio_suite::gpu("divider_matches_ieee_division_for_every_f32") else {
        return;
    };
    let mut scales: Vec<f32> = vec![
        1.0,
        0.37,
        1.9,
        3.7,
        0.0213,
        -1.5,
        448.0,
        1.0 / 448.0,
        f32::from_bits(0x3fff_ffff), // 1.99999988: all-ones mantissa
        f32::from_bits(0x3f7f_ffff), // 0.99999994
        f32::from_bits(0x3f80_0001), // 1.00000012
        f32::from_bits(0x3fc0_0001),
        f32::from_bits(0x2f80_0000), // 2^-32: the fast path's lower end
        f32::from_bits(0x4f80_0000), // 2^32: its upper end
        f32::from_bits(0x2f7f_ffff), // just below 2^-32
        f32::from_bits(0x4f80_0001), // just above 2^32
        f32::from_bits(0x0000_0001), // smallest subnormal
        0.0,
        f32::INFINITY,
        f32::NAN,
    ];
    let mut rng = Rng::new(4242);
    for _ in 0..44 {
        // Exponent in [-40, 40], random mantissa, negative one time in four (the fast path
        // takes positive scales only).
        let e = (rng.below(81) as u32 + 127 - 40) << 23;
        let sign = if rng.below(4) == 0 { 0x8000_0000 } else { 0 };
        let bits = (rng.next_u64() as u32 & 0x007f_ffff) | e | sign;
        scales.push(f32::from_bits(bits));
    }
    let entry = probe_entry("kvio_divider_probe", true);
    for (arch, base) in [("sm_90", kvio::PTX_SM90), ("sm_80", kvio::PTX_SM80)] {
        let module = Module::from_ptx(format!("{base}\n{entry}"), &[]).expect("load PTX + probe");
        let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
        let mut total = 0u64;
        for &scale in &scales {
            let got = all_patterns(&module, &stream, Some(scale));
            if got[0] != 0 {
                eprintln!(
                    "{arch}: scale {scale:e} ({:#010x}): {} mismatches",
                    scale.to_bits(),
                    got[0]
                );
            }
            total += got[0] as u64;
            // Every pattern was looked at: positive in-range scales take the fast path exactly
            // for the aligned groups of eight with every |x| in [2^-80, 2^80] (2 signs x
            // 0x5000_0000 patterns); other scales (negative ones included) never.
            let in_range =
                scale >= f32::from_bits(0x2f80_0000) && scale <= f32::from_bits(0x4f80_0000);
            let want_fast = if in_range { 0xa000_0000u32 } else { 0 };
            assert_eq!(
                got[1], want_fast,
                "{arch}: scale {scale:e}: fast-path patterns"
            );
        }
        eprintln!(
            "{arch}: {} scales x 2^32 patterns: {total} mismatches",
            scales.len()
        );
        assert_eq!(total, 0, "{arch}: fp8::Divider differs from IEEE division");
    }
}

// ---- fp8 quantize-on-write: slot updates ---------------------------------------------------

use kvio::{
    reference, CacheWrite, DeviceBytes, DeviceBytesMut, Fp8, PagedLayout, Quantize, Scale,
    SlotMapping, SlotUpdate, SrcType, TokenLayout,
};
use kvio_suite::{
    emulate_slot_cases, gpu_slot_cases, host_view, quantize_source, random_bytes, Rng, SlotCase,
    SlotData,
};

/// One quantizing slot update: the host data it runs on, its formats and cache layout.
struct QCase {
    data: SlotData,
    src: SrcType,
    fp8: Fp8,
    per_head: bool,
    cache: PagedLayout,
}

/// A case of `t` tokens of `h` heads.
#[allow(clippy::too_many_arguments)]
fn qcase(
    t: usize,
    h: usize,
    src: SrcType,
    fp8: Fp8,
    per_head: bool,
    hnd: bool,
    bs: usize,
    d: usize,
    seed: u64,
) -> QCase {
    let nb = (2 * t).max(256).div_ceil(bs);
    let mut rng = Rng::new(seed);
    let input = TokenLayout::contiguous(t, h, d, src.bytes());
    let cache = if hnd {
        PagedLayout::hnd(nb, bs, h, d, 1)
    } else {
        PagedLayout::nhd(nb, bs, h, d, 1)
    };
    let n_scales = if per_head { h } else { 1 };
    let scale = |rng: &mut Rng| 0.01 + (rng.below(10_000) as f32) / 1000.0;
    let scales_k: Vec<f32> = (0..n_scales).map(|_| scale(&mut rng)).collect();
    let scales_v: Vec<f32> = (0..n_scales).map(|_| scale(&mut rng)).collect();
    let num_slots = (nb * bs) as u64;
    let mut free: Vec<i64> = (0..num_slots as i64).collect();
    rng.shuffle(&mut free);
    let mut bad_slots = 0;
    let slots: Vec<i64> = (0..t)
        .map(|i| match i % 9 {
            4 => -1,
            7 => {
                bad_slots += 1;
                num_slots as i64 + rng.below(1000) as i64
            }
            _ => free[i],
        })
        .collect();
    let ext = cache.extent("cache").unwrap() as usize;
    QCase {
        data: SlotData {
            name: format!(
                "{src:?}->{fp8:?} {} {} bs={bs} D={d} T={t}",
                if per_head { "per-head" } else { "per-tensor" },
                if hnd { "HND" } else { "NHD" }
            ),
            input,
            keys: quantize_source(t * h * d, h * d, src, &mut rng),
            values: quantize_source(t * h * d, h * d, src, &mut rng),
            scales_k,
            scales_v,
            slots,
            poison: random_bytes(2 * ext, seed ^ 0xF8),
            bad_slots,
            slots_i32: false,
        },
        src,
        fp8,
        per_head,
        cache,
    }
}

impl QCase {
    fn ext(&self) -> usize {
        self.cache.extent("cache").unwrap() as usize
    }
}

impl SlotCase for QCase {
    fn data(&self) -> &SlotData {
        &self.data
    }

    /// The caches (K then V) as the reference computes them.
    fn expected(&self) -> Vec<u8> {
        let d = &self.data;
        let q = |rows: &[u8], scales: &[f32]| {
            reference::quantize_rows(rows, &d.input, self.src, self.fp8, scales)
        };
        let (qk, qv) = (q(&d.keys, &d.scales_k), q(&d.values, &d.scales_v));
        let one_byte =
            TokenLayout::contiguous(d.input.num_tokens, d.input.num_heads, d.input.head_dim, 1);
        let mut want = d.poison.clone();
        let c = reference::update_slots(
            &qk,
            Some(&qv),
            &one_byte,
            &mut want,
            0,
            Some(self.ext()),
            &self.cache,
            &d.slots,
        );
        assert_eq!(c.bad_slots, d.bad_slots, "{}: reference count", d.name);
        want
    }

    /// The update over these views.
    fn op<'a>(
        &self,
        keys: DeviceBytes<'a>,
        values: DeviceBytes<'a>,
        caches: DeviceBytesMut<'a>,
        slots: DeviceBytes<'a>,
        (sk, sv): (DeviceBytes<'a>, DeviceBytes<'a>),
    ) -> SlotUpdate<'a> {
        let (kc, vc) = caches.split_at(self.ext()).unwrap();
        let wrap = |b| {
            if self.per_head {
                Scale::PerHead(b)
            } else {
                Scale::PerTensor(b)
            }
        };
        SlotUpdate {
            key: CacheWrite { src: keys, dst: kc },
            value: Some(CacheWrite {
                src: values,
                dst: vc,
            }),
            input: self.data.input,
            cache: self.cache,
            value_layout: None,
            slots: SlotMapping::I64(slots),
            errors: None,
            quantize: Some(Quantize::new(self.src, self.fp8, wrap(sk)).value_scale(wrap(sv))),
        }
    }
}

fn qcases(full: bool) -> Vec<QCase> {
    let mut v = Vec::new();
    let mut seed = 1;
    for src in [SrcType::Bf16, SrcType::F16, SrcType::F32] {
        for fp8 in [Fp8::E4m3, Fp8::E5m2] {
            for per_head in [false, true] {
                for (hnd, bs, d) in [
                    (false, 16, 128),
                    (true, 1, 64),
                    (false, 128, 256),
                    (true, 16, 20),
                ] {
                    if full || (bs, d) != (128, 256) {
                        v.push(qcase(37, 4, src, fp8, per_head, hnd, bs, d, seed));
                    }
                    seed += 1;
                }
                if full {
                    for (hnd, bs, d) in [
                        (false, 1, 64),
                        (true, 128, 128),
                        (false, 16, 256),
                        (true, 128, 256),
                    ] {
                        v.push(qcase(37, 4, src, fp8, per_head, hnd, bs, d, seed));
                        seed += 1;
                    }
                    // Prefill size: more work than the resident grid at one unit per lane
                    // (the streaming regime, several units per lane).
                    v.push(qcase(4000, 4, src, fp8, per_head, false, 16, 128, seed));
                    seed += 1;
                }
            }
        }
    }
    v
}

/// The same plans the GPU runs, executed on the CPU: every format, source type, scale kind,
/// both cache orders, vector (D % 8 == 0) and element-wise (D = 20) spans, against the
/// reference's element-by-element quantization.
#[test]
fn emulated_quantized_slot_updates_match_reference() {
    emulate_slot_cases(&qcases(false));
}

proptest::proptest! {
    // `PROPTEST_CASES` cases (default 96); failures are kept in proptest-regressions/.
    #![proptest_config(proptest::test_runner::Config::with_cases(kvio_suite::proptest_cases(96)))]

    /// Random quantizing slot updates in emulation: any source type, fp8 format and scale
    /// kind, either cache order, 1 to 6 heads of 1 to 160 elements (vector units and
    /// element-wise spans), any page size listed, 1 to 160 tokens with skipped and
    /// out-of-range slots, inputs with every class of value; bit-exact against the reference.
    #[test]
    fn quantized_slot_updates_emulated_property(
        t in 1usize..160,
        h in 1usize..=6,
        d in 1usize..=160,
        bs in proptest::sample::select(vec![1usize, 2, 3, 5, 8, 16, 32, 128]),
        src in proptest::sample::select(vec![SrcType::Bf16, SrcType::F16, SrcType::F32]),
        fp8 in proptest::sample::select(vec![Fp8::E4m3, Fp8::E5m2]),
        per_head: bool,
        hnd: bool,
        seed: u64,
    ) {
        emulate_slot_cases(&[qcase(t, h, src, fp8, per_head, hnd, bs, d, seed)]);
    }
}

/// The same on the GPU (sm_90: the hardware conversion), every case, with the error word.
#[test]
fn gpu_quantized_slot_updates_match_reference() {
    let Some(g) = kvio_suite::gpu("fp8 slot updates") else {
        return;
    };
    let n = gpu_slot_cases(g, &qcases(true));
    println!("{n} quantizing slot updates bit-exact");
}

/// Bad quantization arguments are refused before launch, typed.
#[test]
fn quantize_arguments_are_checked() {
    let c = qcase(37, 4, SrcType::Bf16, Fp8::E4m3, true, false, 16, 128, 99);
    let d = &c.data;
    let mut caches = d.poison.clone();
    // SAFETY: host memory; validation refuses every op below before touching it.
    let dst = unsafe { DeviceBytesMut::from_raw(caches.as_mut_ptr() as u64, caches.len()) };
    let (sk, sv) = (host_view(&d.scales_k), host_view(&d.scales_v));
    let good = c.op(
        host_view(&d.keys),
        host_view(&d.values),
        dst,
        host_view(&d.slots),
        (sk, sv),
    );
    let check = |op: SlotUpdate<'_>, name: &str| {
        // SAFETY: as above.
        match unsafe { kvio::emulate::update_slots(&op) } {
            Err(kvio::Error::InvalidArgument { name: n, .. })
            | Err(kvio::Error::BufferTooSmall { name: n, .. })
                if n == name => {}
            other => panic!("{name}: expected a typed error naming it, got {other:?}"),
        }
    };
    let q = good.quantize.unwrap();
    // Per-head scales shorter than H f32.
    let short = Scale::PerHead(sk.slice(0, 4 * 3).unwrap());
    check(
        SlotUpdate {
            quantize: Some(Quantize {
                k_scale: short,
                ..q
            }),
            ..good
        },
        "k_scale",
    );
    // V written without a V scale, and K and V scales of different kinds.
    check(
        SlotUpdate {
            quantize: Some(Quantize { v_scale: None, ..q }),
            ..good
        },
        "v_scale",
    );
    let mixed = Quantize {
        v_scale: Some(Scale::PerTensor(sv)),
        ..q
    };
    check(
        SlotUpdate {
            quantize: Some(mixed),
            ..good
        },
        "v_scale",
    );
    // A cache wider than one byte, an input whose element size is not the source type's.
    let mut wide = good;
    wide.cache.elem_bytes = 2;
    check(wide, "cache");
    check(
        SlotUpdate {
            quantize: Some(Quantize {
                src: SrcType::F32,
                ..q
            }),
            ..good
        },
        "input",
    );
    // Misaligned scales.
    let long = [1.0f32; 8];
    let odd = Scale::PerHead(host_view(&long).slice(1, 16).unwrap());
    let bad = Quantize {
        k_scale: odd,
        v_scale: Some(Scale::PerHead(sv)),
        ..q
    };
    check(
        SlotUpdate {
            quantize: Some(bad),
            ..good
        },
        "k_scale",
    );
    // The good one runs.
    // SAFETY: as above (it writes `caches`, which is ours).
    unsafe { kvio::emulate::update_slots(&good) }.unwrap();
}
