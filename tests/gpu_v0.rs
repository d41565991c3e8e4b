//! vLLM's v0 paged layout (paged attention v1/v2; mistral.rs, candle-vllm): key cache
//! `[NB, H, D/x, bs, x]`, value cache `[NB, H, D, bs]`, written by slot mapping (vLLM
//! `reshape_and_cache`), plain copies and fp8 quantize-on-write, against the CPU reference,
//! bit for bit, in emulation and on the GPU. The addresses of both layouts are also checked
//! against vLLM's own index formulas (independently of the descriptors).

use kvio::{
    reference, DeviceBytes, DeviceBytesMut, Error, Fp8, PagedLayout, Quantize, Scale, SlotMapping,
    SlotUpdate, SrcType, TokenLayout,
};
use kvio_suite::{
    assert_same, batch_pages, batch_sequences, batch_slots, emulate_slot_cases, gpu_slot_cases,
    quantize_source, random_bytes, Rng, SlotCase, SlotData,
};
use proptest::prelude::{any, Strategy};

/// How a case's values are stored and written.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Format {
    /// Bytes copied as they are, caches of this element size.
    Copy(usize),
    /// Quantized to fp8 from this source type.
    Quant(SrcType, Fp8, bool),
}

/// How tokens map to slots.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Slots {
    /// Every token a random free slot (decode-like scatter).
    Random,
    /// Consecutive tokens fill whole pages in a random page order (prefill), with padding
    /// and out-of-range slots sprinkled in (they break the transposed runs of their tile).
    Pages,
    /// A prefill batch: sequences of 1 to 79 tokens, each on fresh pages from the start of its
    /// first (so a sequence's runs of whole pages start at any token index), padding and
    /// out-of-range slots sprinkled in as in `Pages`.
    Batch,
    /// As `Batch`, each sequence continuing a chunked prefill: from a random slot of its first
    /// page.
    Chunked,
    /// Sequences of 32 tokens (a warp of the streams each), every other one continuing a
    /// chunked prefill from slot 5 of its first page: a warp whose window of tokens is a run
    /// from a page's start, then one whose first slot is not a multiple of 8 (the streams'
    /// shifted or split windows at a warp's seam).
    Seams,
}

/// One v0 slot update: the host data it runs on, its format and the two cache layouts.
struct Case {
    data: SlotData,
    format: Format,
    key_layout: PagedLayout,
    value_layout: PagedLayout,
    /// Keys only: no values, the value cache keeps its poison.
    k_only: bool,
}

/// A case of 4 heads.
fn case(format: Format, bs: usize, d: usize, t: usize, mode: Slots, seed: u64) -> Case {
    case_h(format, bs, 4, d, t, mode, seed)
}

/// A case of `h` heads of `d` elements (a multiple of the key layout's `x`).
fn case_h(format: Format, bs: usize, h: usize, d: usize, t: usize, mode: Slots, seed: u64) -> Case {
    let mut rng = Rng::new(seed);
    // Batch modes: sequences as (offset in the first page, tokens).
    let seqs = match mode {
        Slots::Batch | Slots::Chunked => {
            batch_sequences(&mut rng, t, 79, bs, mode == Slots::Chunked)
        }
        Slots::Seams => (0..t.div_ceil(32))
            .map(|k| (if k % 2 == 1 { 5 } else { 0 }, 32.min(t - 32 * k)))
            .collect(),
        _ => vec![],
    };
    let used = batch_pages(&seqs, bs);
    let nb = ((2 * t).max(64).div_ceil(bs) + 1).max(used + 1);
    let (ie, e) = match format {
        Format::Copy(e) => (e, e),
        Format::Quant(src, _, _) => (src.bytes(), 1),
    };
    let input = TokenLayout::contiguous(t, h, d, ie);
    let key_layout = PagedLayout::v0_key(nb, bs, h, d, e);
    let value_layout = PagedLayout::v0_value(nb, bs, h, d, e);
    let num_slots = (nb * bs) as i64;
    let mut bad_slots = 0;
    let slots: Vec<i64> = match mode {
        Slots::Random => {
            let mut free: Vec<i64> = (0..num_slots).collect();
            rng.shuffle(&mut free);
            free.truncate(t);
            free
        }
        Slots::Pages => {
            let mut pages: Vec<i64> = (0..nb as i64).collect();
            rng.shuffle(&mut pages);
            (0..t)
                .map(|i| pages[i / bs] * bs as i64 + (i % bs) as i64)
                .collect()
        }
        Slots::Batch | Slots::Chunked | Slots::Seams => {
            let mut pages: Vec<i64> = (0..nb as i64).collect();
            rng.shuffle(&mut pages);
            batch_slots(&seqs, bs, pages)
        }
    };
    let slots = slots
        .into_iter()
        .enumerate()
        .map(|(i, s)| match i % 97 {
            13 => -1,
            41 => {
                bad_slots += 1;
                num_slots + rng.below(1000) as i64
            }
            _ => s,
        })
        .collect();
    let (keys, values, scales_k, scales_v) = match format {
        Format::Copy(e) => (
            random_bytes(t * h * d * e, seed ^ 1),
            random_bytes(t * h * d * e, seed ^ 2),
            vec![],
            vec![],
        ),
        Format::Quant(src, _, per_head) => {
            let n = if per_head { h } else { 1 };
            let mut scale = || 0.01 + rng.below(10_000) as f32 / 1000.0;
            let (sk, sv): (Vec<f32>, Vec<f32>) = (0..n).map(|_| (scale(), scale())).unzip();
            (
                quantize_source(t * h * d, h * d, src, &mut rng),
                quantize_source(t * h * d, h * d, src, &mut rng),
                sk,
                sv,
            )
        }
    };
    let ext = key_layout.extent("k").unwrap() as usize;
    Case {
        data: SlotData {
            name: format!("{format:?} bs={bs} H={h} D={d} T={t} {mode:?}"),
            input,
            keys,
            values,
            scales_k,
            scales_v,
            slots,
            poison: random_bytes(2 * ext, seed ^ 0x0F),
            bad_slots,
            // Both slot widths: the staged fp8 entry reads i32 slots in two 16-byte cells,
            // i64 in four.
            slots_i32: seed % 2 == 1,
        },
        format,
        key_layout,
        value_layout,
        k_only: false,
    }
}

/// [`case_h`] writing keys only.
fn k_only(format: Format, bs: usize, h: usize, d: usize, t: usize, seed: u64) -> Case {
    Case {
        k_only: true,
        ..case_h(format, bs, h, d, t, Slots::Pages, seed)
    }
}

impl Case {
    fn ext(&self) -> usize {
        self.key_layout.extent("k").unwrap() as usize
    }

    /// Whether the update takes tiles of eight tokens (from 1,024 tokens).
    fn prefill(&self) -> bool {
        self.data.input.num_tokens >= 1024
    }
}

impl SlotCase for Case {
    fn data(&self) -> &SlotData {
        &self.data
    }

    /// Both caches as the reference computes them: K into the key layout, V into the value
    /// layout (one part per call), after quantizing the rows for fp8 cases.
    fn expected(&self) -> Vec<u8> {
        let d = &self.data;
        let (k, v, input) = match self.format {
            Format::Copy(_) => (d.keys.clone(), d.values.clone(), d.input),
            Format::Quant(src, fp8, _) => {
                let q =
                    |rows: &[u8], s: &[f32]| reference::quantize_rows(rows, &d.input, src, fp8, s);
                let i = &d.input;
                (
                    q(&d.keys, &d.scales_k),
                    q(&d.values, &d.scales_v),
                    TokenLayout::contiguous(i.num_tokens, i.num_heads, i.head_dim, 1),
                )
            }
        };
        let mut want = d.poison.clone();
        let ck = reference::update_slots(
            &k,
            None,
            &input,
            &mut want,
            0,
            None,
            &self.key_layout,
            &d.slots,
        );
        let ext = self.ext();
        if self.k_only {
            return want;
        }
        reference::update_slots(
            &v,
            None,
            &input,
            &mut want,
            ext,
            None,
            &self.value_layout,
            &d.slots,
        );
        assert_eq!(ck.bad_slots, d.bad_slots, "{}: reference count", d.name);
        want
    }

    fn op<'a>(
        &self,
        keys: DeviceBytes<'a>,
        values: DeviceBytes<'a>,
        caches: DeviceBytesMut<'a>,
        slots: DeviceBytes<'a>,
        (sk, sv): (DeviceBytes<'a>, DeviceBytes<'a>),
    ) -> SlotUpdate<'a> {
        let (kc, vc) = caches.split_at(self.ext()).unwrap();
        let slots = if self.data.slots_i32 {
            SlotMapping::I32(slots)
        } else {
            SlotMapping::I64(slots)
        };
        if self.k_only {
            let op = SlotUpdate::new(keys, self.data.input, kc, self.key_layout, slots);
            return match self.format {
                Format::Copy(_) => op,
                Format::Quant(src, fp8, per_head) => {
                    let scale = if per_head {
                        Scale::PerHead(sk)
                    } else {
                        Scale::PerTensor(sk)
                    };
                    op.quantize(Quantize::new(src, fp8, scale))
                }
            };
        }
        let op = SlotUpdate::new(keys, self.data.input, kc, self.key_layout, slots)
            .value(values, vc)
            .value_layout(self.value_layout);
        match self.format {
            Format::Copy(_) => op,
            Format::Quant(src, fp8, per_head) => {
                let wrap = |b| {
                    if per_head {
                        Scale::PerHead(b)
                    } else {
                        Scale::PerTensor(b)
                    }
                };
                op.quantize(Quantize::new(src, fp8, wrap(sk)).value_scale(wrap(sv)))
            }
        }
    }
}

/// The formats the tests cover: copies of 2, 4 and 1-byte elements, and quantizing from each
/// source type to both fp8 formats with either scale kind.
const FORMATS: [Format; 7] = [
    Format::Copy(2),
    Format::Copy(4),
    Format::Copy(1),
    Format::Quant(SrcType::Bf16, Fp8::E4m3, false),
    Format::Quant(SrcType::Bf16, Fp8::E5m2, true),
    Format::Quant(SrcType::F16, Fp8::E4m3, true),
    Format::Quant(SrcType::F32, Fp8::E5m2, false),
];

/// Every format × page size (1, 16, 128, and 8 and 32) × head dim (64, 128, 256), decode and
/// prefill sizes (one token per thread below 1,024 tokens, tiles of eight from there),
/// scattered and page-filling slots; `full` adds the larger and rarer ones.
/// [`case_h`] (3 heads of 48 elements, 16-token pages) with a key cache of the v0 form whose
/// pieces hold 24 elements instead of `x`.
fn pieces_of_24(format: Format, t: usize, mode: Slots, seed: u64) -> Case {
    let mut c = case_h(format, 16, 3, 48, t, mode, seed);
    c.key_layout = PagedLayout {
        token_stride: 24,
        piece_elems: 24,
        piece_stride: 16 * 24,
        ..c.key_layout
    };
    c.data.name = format!("{} keys in pieces of 24", c.data.name);
    c
}

fn cases(full: bool) -> Vec<Case> {
    let mut v = Vec::new();
    let mut seed = 100;
    for format in FORMATS {
        // Prefill size (eight tokens per thread, whole pages stored as runs) with a partial
        // last tile, also in emulation.
        v.push(case(format, 16, 64, 1030, Slots::Pages, seed));
        // Prefill size on 8- and 128-token pages too.
        v.push(case(format, 8, 128, 1030, Slots::Pages, seed + 1000));
        v.push(case(format, 128, 64, 1030, Slots::Pages, seed + 2000));
        // Prefill size with 5 heads of 128: the pages updates take four heads an item, so the
        // last item of a part has one.
        v.push(case_h(format, 16, 5, 128, 1030, Slots::Pages, seed + 3000));
        // Quantizing into fp8 pages takes four heads of 128 an item: 9 heads, two full items
        // and a short one.
        if matches!(format, Format::Quant(..)) {
            v.push(case_h(format, 16, 9, 128, 1030, Slots::Pages, seed + 6000));
        }
        // Prefill batches of many sequences (runs of whole pages from any token index), on
        // 8-, 16-, 32-, 48-, 64- and 128-token pages, fresh and continuing chunked prefills
        // (2-byte caches take the shifted windows, `kvio_update_stream_rot`).
        v.push(case(format, 16, 128, 1030, Slots::Batch, seed + 7000));
        v.push(case(format, 32, 128, 1030, Slots::Chunked, seed + 8000));
        v.push(case(format, 128, 64, 1030, Slots::Batch, seed + 9000));
        v.push(case(format, 8, 128, 1030, Slots::Batch, seed + 10000));
        v.push(case(format, 8, 64, 1030, Slots::Chunked, seed + 11000));
        v.push(case(format, 64, 128, 1030, Slots::Batch, seed + 14000));
        // 48-token pages: the pages entries (the streams take powers of two only).
        v.push(case(format, 48, 128, 1030, Slots::Batch, seed + 16000));
        // Sequences of one warp each, every other one from slot 5 of its first page: the
        // streams' windows at warp seams (8-, 16- and 128-token pages).
        v.push(case(format, 16, 64, 1030, Slots::Seams, seed + 12000));
        v.push(case(format, 8, 128, 1030, Slots::Seams, seed + 13000));
        v.push(case(format, 128, 128, 1030, Slots::Seams, seed + 15000));
        // Keys only (one part) at prefill size.
        v.push(k_only(format, 16, 3, 128, 1030, seed + 4000));
        seed += 1;
        if format == Format::Copy(2) {
            // Keys in pieces of 24 elements (not a power of two: the stores' division path)
            // at decode and prefill sizes.
            for (t, mode) in [
                (1, Slots::Random),
                (37, Slots::Random),
                (1030, Slots::Pages),
            ] {
                v.push(pieces_of_24(format, t, mode, seed + 5000));
                seed += 1;
            }
        }
        for bs in [1, 16, 128, 8, 32] {
            for d in [64, 128, 256] {
                if !full && (d == 256 || bs == 8) {
                    continue;
                }
                for (t, mode) in [(1, Slots::Random), (37, Slots::Random), (300, Slots::Pages)] {
                    v.push(case(format, bs, d, t, mode, seed));
                    seed += 1;
                }
                if full {
                    v.push(case(format, bs, d, 2048, Slots::Pages, seed));
                    seed += 1;
                }
            }
        }
    }
    v
}

/// The descriptors address elements exactly as vLLM's formulas do: key `(((b*H + h)*(D/x) +
/// d/x)*bs + o)*x + d%x`, value `((b*H + h)*D + d)*bs + o` (written out here, not derived
/// from the descriptors), checked through the reference with one marked element at a time.
#[test]
fn v0_descriptors_match_vllm_formulas() {
    for e in [1usize, 2, 4] {
        let (nb, bs, h, d) = (3, 4, 2, 16);
        let x = 16 / e;
        for (b, o, hh, dd) in [(0, 0, 0, 0), (2, 3, 1, 15), (1, 2, 0, 9), (2, 1, 1, x % d)] {
            let input = TokenLayout::contiguous(1, h, d, e);
            let mut row = vec![0u8; h * d * e];
            row[(hh * d + dd) * e] = 0xAB;
            let slot = [(b * bs + o) as i64];
            for (layout, want) in [
                (
                    PagedLayout::v0_key(nb, bs, h, d, e),
                    (((b * h + hh) * (d / x) + dd / x) * bs + o) * x + dd % x,
                ),
                (
                    PagedLayout::v0_value(nb, bs, h, d, e),
                    ((b * h + hh) * d + dd) * bs + o,
                ),
            ] {
                let mut cache = vec![0u8; layout.extent("c").unwrap() as usize];
                reference::update_slots(&row, None, &input, &mut cache, 0, None, &layout, &slot);
                let at: Vec<usize> = (0..cache.len()).filter(|&i| cache[i] != 0).collect();
                assert_eq!(
                    at,
                    vec![want * e],
                    "e={e} ({b}, {o}, {hh}, {dd}) {layout:?}"
                );
            }
        }
    }
}

/// The plans the GPU runs, executed on the CPU (the tile kernel's own code), every format.
#[test]
fn emulated_v0_updates_match_reference() {
    emulate_slot_cases(&cases(false));
}

/// The random v0 updates of the property tests, as `(format, bs, h, d, t, slots, seed)`:
/// every format (copies of 1, 2 and 4-byte elements, quantizing from each source type), 1 to
/// 6 heads of 1 to 20 times `max(x, 8)` elements (`D` a multiple of `x = 16 / e` and of 8,
/// the README's constraint for v0 updates), any page size listed, decode sizes (one token per
/// thread) and, one case in five, prefill sizes (tiles of eight tokens), scattered or
/// page-filling slots (the cases add skipped and out-of-range ones).
fn v0_params() -> impl Strategy<Value = (Format, usize, usize, usize, usize, Slots, u64)> {
    (
        proptest::sample::select(&FORMATS[..]),
        proptest::sample::select(vec![1usize, 2, 5, 8, 16, 32, 128]),
        1usize..=6,
        1usize..=20,
        proptest::prop_oneof![4 => 1usize..80, 1 => 1024usize..1100],
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(format, bs, h, pieces, t, pages, seed)| {
            let e = match format {
                Format::Copy(e) => e,
                Format::Quant(..) => 1,
            };
            let mode = if pages { Slots::Pages } else { Slots::Random };
            (format, bs, h, pieces * (16 / e).max(8), t, mode, seed)
        })
}

/// Random prefill-size v0 updates on pages of 8, 16, 32, 48, 64 and 128 tokens: copies into
/// 2-byte caches (`kvio_update_stream_rot`, `kvio_update_pages` on 48-token pages) and bf16 or
/// f16 quantized into fp8 caches (`kvio_update_stream_fp8` on 8- to 64-token pages,
/// `kvio_update_pages_fp8` on 48, `kvio_update_pages_fp8_32` on 128; scales per tensor or per
/// head); 1 to 10 heads (the
/// pages entries' items of several heads, the last one short), head dims of 8 to 256 (16 to
/// 256 for fp8, whose key pieces hold 16), 1,024 to 1,199 tokens (a short last item),
/// page-filling slots of one sequence or of a batch of sequences (fresh or continuing chunked
/// prefills, or one warp's worth each with every other one mid-page: `Slots::Seams`), or
/// scattered slots (the cases add skipped and out-of-range ones, and the fp8
/// sources special values, which send a warp or an item token by token).
fn pages_params() -> impl Strategy<Value = (Format, usize, usize, usize, usize, Slots, u64)> {
    let formats = vec![
        Format::Copy(2),
        Format::Quant(SrcType::Bf16, Fp8::E4m3, false),
        Format::Quant(SrcType::Bf16, Fp8::E5m2, true),
        Format::Quant(SrcType::F16, Fp8::E4m3, true),
        Format::Quant(SrcType::F16, Fp8::E5m2, false),
    ];
    (
        proptest::sample::select(formats),
        proptest::sample::select(vec![8usize, 16, 32, 48, 64, 128]),
        1usize..=10,
        1usize..=16,
        1024usize..1200,
        proptest::prop_oneof![
            3 => proptest::strategy::Just(Slots::Pages),
            2 => proptest::strategy::Just(Slots::Batch),
            2 => proptest::strategy::Just(Slots::Chunked),
            1 => proptest::strategy::Just(Slots::Seams),
            1 => proptest::strategy::Just(Slots::Random),
        ],
        any::<u64>(),
    )
        .prop_map(|(format, bs, h, pieces, t, mode, seed)| {
            if format == Format::Copy(2) {
                (
                    format,
                    bs,
                    h,
                    8 * (2 * pieces - seed as usize % 2),
                    t,
                    mode,
                    seed,
                )
            } else {
                (format, bs, h, 16 * pieces, t, mode, seed)
            }
        })
}

proptest::proptest! {
    // `PROPTEST_CASES` cases (default 96); failures are kept in proptest-regressions/.
    #![proptest_config(proptest::test_runner::Config::with_cases(kvio_suite::proptest_cases(96)))]

    /// Random v0 slot updates ([`v0_params`]) in emulation, bit-exact against the reference.
    #[test]
    fn v0_updates_emulated_property((format, bs, h, d, t, mode, seed) in v0_params()) {
        emulate_slot_cases(&[case_h(format, bs, h, d, t, mode, seed)]);
    }
}

proptest::proptest! {
    // `PROPTEST_CASES` cases (default 48: prefill sizes are slow to emulate).
    #![proptest_config(proptest::test_runner::Config::with_cases(kvio_suite::proptest_cases(48)))]

    /// Random page-filling v0 prefills ([`pages_params`]) in emulation, bit-exact.
    #[test]
    fn v0_pages_emulated_property((format, bs, h, d, t, mode, seed) in pages_params()) {
        emulate_slot_cases(&[case_h(format, bs, h, d, t, mode, seed)]);
    }
}

/// The random page-filling v0 prefills of [`pages_params`] on the GPU (`PROPTEST_CASES` of
/// them, default 96), with the error word.
#[test]
fn v0_pages_gpu_property() {
    gpu_property("v0 random page-filling prefills", pages_params());
}

/// Runs `PROPTEST_CASES` (default 96) cases of `params` on the GPU, each bit-exact against the
/// reference with the error word (skipped without a GPU, as `what`).
fn gpu_property(
    what: &str,
    params: impl Strategy<Value = (Format, usize, usize, usize, usize, Slots, u64)>,
) {
    let Some(g) = kvio_suite::gpu(what) else {
        return;
    };
    let config = proptest::test_runner::Config::with_cases(kvio_suite::proptest_cases(96));
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let result = runner.run(&params, |(format, bs, h, d, t, mode, seed)| {
        gpu_slot_cases(g, &[case_h(format, bs, h, d, t, mode, seed)]);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The same random v0 slot updates on the GPU (`PROPTEST_CASES` of them, default 96), with
/// the error word: the tiled entries, the staged one included, on shapes the fixed cases do
/// not reach (odd head counts and widths, partial tiles, pages of 2 and 5 tokens).
#[test]
fn v0_updates_gpu_property() {
    gpu_property("v0 random slot updates", v0_params());
}

/// The same on the GPU, with the error word: every case below 1,024 tokens (one token per
/// thread, `kvio_update_tiles_one`).
#[test]
fn gpu_v0_updates_match_reference() {
    let Some(g) = kvio_suite::gpu("v0 slot updates") else {
        return;
    };
    let decode: Vec<Case> = cases(true).into_iter().filter(|c| !c.prefill()).collect();
    let n = gpu_slot_cases(g, &decode);
    println!("{n} v0 slot updates bit-exact");
}

/// The prefill-size cases on the GPU (`kvio_update_stream_rot` for 2-byte caches on pages of 8
/// and 16 slots, `kvio_update_stream` on smaller ones, `kvio_update_pages` on larger pages,
/// `kvio_update_pages_fp8` /
/// `kvio_update_pages_fp8_32` and `kvio_update_tiles_staged` for fp8 caches, tiles of eight
/// tokens (`kvio_update_tiles`) for the rest, with i32 and i64 slots), separately so that
/// `scripts/sanitize gpu_v0_prefill` runs them under compute-sanitizer in minutes.
#[test]
fn gpu_v0_prefill_updates_match_reference() {
    let Some(g) = kvio_suite::gpu("v0 prefill slot updates") else {
        return;
    };
    let prefill: Vec<Case> = cases(true).into_iter().filter(Case::prefill).collect();
    let n = gpu_slot_cases(g, &prefill);
    println!("{n} v0 prefill slot updates bit-exact");
}

/// Bad v0 arguments are refused before launch, typed.
#[test]
fn v0_arguments_are_checked() {
    let mut keys = vec![0u8; 1 << 16];
    let mut caches = vec![0u8; 1 << 22];
    let slots = [0i64, 1];
    let (t, h) = (2, 4);
    let mk =
        |kl: PagedLayout, vl: PagedLayout, ie: usize, keys: &mut Vec<u8>, caches: &mut Vec<u8>| {
            let input = TokenLayout::contiguous(t, h, kl.head_dim, ie);
            // SAFETY: host memory, only validated here (or emulated when valid).
            let (k, v, kc, vc, s) = unsafe {
                (
                    DeviceBytes::from_raw(keys.as_ptr() as u64, 1 << 15),
                    DeviceBytes::from_raw(keys.as_ptr() as u64 + (1 << 15), 1 << 15),
                    DeviceBytesMut::from_raw(caches.as_mut_ptr() as u64, 1 << 21),
                    DeviceBytesMut::from_raw(caches.as_mut_ptr() as u64 + (1 << 21), 1 << 21),
                    DeviceBytes::from_raw(slots.as_ptr() as u64, 16),
                )
            };
            let op = SlotUpdate::new(k, input, kc, kl, SlotMapping::I64(s))
                .value(v, vc)
                .value_layout(vl);
            // SAFETY: every view is host memory of its length.
            unsafe { kvio::emulate::update_slots(&op) }
        };
    // (key layout, value layout, input element size, the argument refused; None: accepted)
    let cases = [
        ((64, 16, 2), (64, 16, 2), 2, None),
        // fp8 v0 key cache: x = 16, D = 120 is not a multiple.
        ((120, 16, 1), (120, 16, 1), 1, Some("cache")),
        // D = 20: a multiple of x = 4 (f32) but not of 8.
        ((20, 16, 4), (20, 16, 4), 4, Some("cache")),
        // Value layout of another shape.
        ((64, 16, 2), (64, 32, 2), 2, Some("value_layout")),
        // Input element size differs from the cache's (no quantization).
        ((64, 16, 2), (64, 16, 2), 4, Some("input")),
    ];
    for ((kd, kbs, ke), (vd, vbs, ve), ie, refused) in cases {
        let (kl, vl) = (
            PagedLayout::v0_key(8, kbs, h, kd, ke),
            PagedLayout::v0_value(8, vbs, h, vd, ve),
        );
        let r = mk(kl, vl, ie, &mut keys, &mut caches);
        match refused {
            None => assert!(r.is_ok(), "{r:?}"),
            Some(want) => assert!(
                matches!(r, Err(Error::InvalidArgument { name, .. }) if name == want),
                "{want}: {r:?}"
            ),
        }
    }
    // Slice updates into v0 caches check them as slot updates do: a value layout without
    // values, and one of another shape, are refused before anything runs.
    let layout = PagedLayout::v0_key(8, 16, h, 64, 2);
    // SAFETY: descriptions only.
    let (src, dst, table, count) = unsafe {
        (
            DeviceBytes::from_raw(0x1000, 1 << 16),
            DeviceBytesMut::from_raw(0x100_0000, 1 << 20),
            DeviceBytes::from_raw(0x2000, 48),
            DeviceBytes::from_raw(0x3000, 4),
        )
    };
    let op = kvio::SliceUpdate::new(
        src,
        TokenLayout::contiguous(2, h, 64, 2),
        dst,
        layout,
        table,
        4,
        count,
    );
    let no_values = op.value_layout(PagedLayout::v0_value(8, 16, h, 64, 2));
    let other_shape = op
        .value(src, dst)
        .value_layout(PagedLayout::v0_value(9, 16, h, 64, 2));
    for op in [no_values, other_shape] {
        // SAFETY: rejected before anything is read.
        let r = unsafe { kvio::emulate::update_slices(&op) };
        assert!(
            matches!(
                r,
                Err(Error::InvalidArgument {
                    name: "value_layout",
                    ..
                })
            ),
            "{r:?}"
        );
    }
}

// ---- Block copies of v0 pools ----------------------------------------------------------------

use kvio::reference::PoolImage;
use kvio::{
    Backend, BlockCopy, BlockMap, BlockPool, DeviceErrors, LayerTable, StreamRef, Writable,
};
use kvio_suite::Mem;

const V0_PAIRS: [[i64; 2]; 4] = [[0, 3], [5, 1], [-1, -1], [2, 2]];

/// The pools of the block-copy tests: 6 blocks, 3 layers of K and V.
#[derive(Clone, Copy, Debug, PartialEq)]
enum PoolKind {
    /// vLLM's v0 caches (K `v0_key`, V `v0_value`), each layer's K then V in one buffer.
    V0,
    /// Layer-separate NHD caches in one buffer, as `V0`.
    Nhd,
    /// Layer-separate HND caches in one buffer, as `V0`.
    Hnd,
    /// vLLM's cross-layer blocks `(NB, L, 2, bs, H, D)`.
    CrossNhd,
}

/// Blocks, layers, heads and head size of the block-copy tests (five heads: `kvio_convert_pages`
/// takes them in items of up to as many heads as its tile holds, three for f32 at 16-slot
/// pages, so a page's last item has fewer).
const NB: usize = 6;
const LAYERS: usize = 3;
const HEADS: usize = 5;
const DIM: usize = 64;

/// Bytes of a pool of element size `e` and block size `bs` (every kind has the same).
fn pool_len(bs: usize, e: usize) -> usize {
    ConvShape::fixed(bs, e).len()
}

/// The shape of a block-copy test's pools: `NB` blocks of `layers` layers, K and V.
#[derive(Clone, Copy, Debug)]
struct ConvShape {
    e: usize,
    bs: usize,
    heads: usize,
    dim: usize,
    layers: usize,
}

impl ConvShape {
    /// The fixed tests' shape at element size `e` and block size `bs`.
    fn fixed(bs: usize, e: usize) -> Self {
        ConvShape {
            e,
            bs,
            heads: HEADS,
            dim: DIM,
            layers: LAYERS,
        }
    }

    /// Bytes of a pool (every kind has the same).
    fn len(&self) -> usize {
        NB * self.layers * 2 * self.bs * self.heads * self.dim * self.e
    }

    /// The pool of `kind` over `mem` ([`ConvShape::len`] bytes).
    fn pool<'a>(&self, kind: PoolKind, mem: DeviceBytesMut<'a>) -> BlockPool<'a, Writable> {
        let ConvShape {
            e,
            bs,
            heads: h,
            dim: d,
            layers,
        } = *self;
        let (k, v) = (
            PagedLayout::v0_key(NB, bs, h, d, e),
            PagedLayout::v0_value(NB, bs, h, d, e),
        );
        let cache = k.extent("k").unwrap() as usize;
        let layer_separate = |l| BlockPool::strided(mem, 2 * cache, cache, layers, 2, l);
        match kind {
            PoolKind::V0 => layer_separate(k).value_layout(v),
            PoolKind::Nhd => layer_separate(PagedLayout::nhd(NB, bs, h, d, e)),
            PoolKind::Hnd => layer_separate(PagedLayout::hnd(NB, bs, h, d, e)),
            PoolKind::CrossNhd => BlockPool::cross_layer_nhd(mem, NB, layers, bs, h, d, e),
        }
    }
}

/// The pool of `kind` over `mem` ([`pool_len`] bytes) in the fixed tests' shape.
fn v0_pool<'a>(
    kind: PoolKind,
    mem: DeviceBytesMut<'a>,
    bs: usize,
    e: usize,
) -> BlockPool<'a, Writable> {
    ConvShape::fixed(bs, e).pool(kind, mem)
}

/// What a block copy from `src` to `dst` (strided pools, or evenly spaced tables) leaves in
/// `dst`: the reference's element-by-element copy, part by part with each part's layout, and
/// the error counts.
fn v0_expected<A: Copy, B: Copy>(
    src: &BlockPool<'_, A>,
    src_bytes: &[u8],
    dst: &BlockPool<'_, B>,
    dst_bytes: &[u8],
    pairs: &[[i64; 2]],
) -> (Vec<u8>, kvio::ErrorCounts) {
    let (si, di) = (PoolImage::of(src).unwrap(), PoolImage::of(dst).unwrap());
    let one = |img: PoolImage, layout| PoolImage {
        parts: 1,
        layout,
        part_stride: 0,
        ..img
    };
    let mut want = dst_bytes.to_vec();
    let mut counts = kvio::ErrorCounts::default();
    for p in 0..2 {
        counts = reference::copy_blocks(
            &one(si, src.part_layout(p)),
            &src_bytes[p * si.part_stride..],
            &one(di, dst.part_layout(p)),
            &mut want[p * di.part_stride..],
            pairs,
        );
    }
    (want, counts)
}

/// (element bytes, block size) of the conversion tests: 16-token pages of each element size
/// (the tiled entry, `kvio_convert_pages`), 128-token pages (runs of a page per CTA item),
/// 8-token pages (bf16 through the tile; fp8 too short for a 16-byte column of tokens, so on
/// `kvio_convert_blocks`) and one-slot pages (no conversion: v0 head vectors are whole).
const CONVERSION_SHAPES: [(usize, usize); 7] =
    [(1, 16), (2, 16), (4, 16), (2, 128), (2, 8), (1, 8), (2, 1)];

/// Every conversion the tests run: (source, destination) kinds, each way between v0 and the
/// others, and v0 to v0 (whole blocks).
fn conversions() -> Vec<(PoolKind, PoolKind)> {
    let mut v = vec![(PoolKind::V0, PoolKind::V0)];
    for other in [PoolKind::Nhd, PoolKind::Hnd, PoolKind::CrossNhd] {
        v.push((PoolKind::V0, other));
        v.push((other, PoolKind::V0));
    }
    v
}

/// v0 pools (K and V in their own layouts) copied to v0 pools (whole blocks) and converted to
/// and from layer-separate NHD and HND and cross-layer NHD pools, fp8, bf16 and f32, pages of
/// 1 and 16 slots, on every backend, in emulation.
#[test]
fn emulated_v0_block_copies_match_reference() {
    for (e, bs) in CONVERSION_SHAPES {
        let len = pool_len(bs, e);
        let src = Mem::plain(random_bytes(len, 71 + e as u64));
        let poison = random_bytes(len, 72);
        for (from, to) in conversions() {
            for backend in [Backend::Kernel, Backend::Dma, Backend::Tma, Backend::Auto] {
                let mut dst = Mem::plain(poison.clone());
                let op = BlockCopy::new(
                    v0_pool(from, src.bytes_mut(), bs, e),
                    v0_pool(to, dst.bytes_mut(), bs, e),
                    BlockMap::Host(&V0_PAIRS),
                )
                .backend(backend);
                // SAFETY: every view is plain host memory of its length.
                let ran = unsafe { kvio::emulate::copy_blocks(&op) }.unwrap();
                let what = format!("{from:?} -> {to:?} e {e} bs {bs} {backend:?} (ran {ran:?})");
                let (want, _) = v0_expected(&op.src, &src.read(), &op.dst, &poison, &V0_PAIRS);
                assert_same(&what, &dst.read(), &want);
                dst.fill(&poison);
            }
        }
    }
    // A part whose pieces neither side shares: refused before anything moves.
    let len = pool_len(16, 2);
    let (a, b) = (Mem::plain(vec![1; len]), Mem::plain(vec![2; len]));
    let mut four = PagedLayout::v0_key(NB, 16, HEADS, DIM, 2);
    (four.piece_elems, four.token_stride, four.piece_stride) = (4, 4, 4 * 16);
    let cache = four.extent("k").unwrap() as usize;
    let op = BlockCopy::new(
        v0_pool(PoolKind::V0, a.bytes_mut(), 16, 2),
        BlockPool::strided(b.bytes_mut(), 2 * cache, cache, LAYERS, 2, four),
        BlockMap::Host(&V0_PAIRS),
    );
    // SAFETY: refused before anything is touched.
    let r = unsafe { kvio::emulate::copy_blocks(&op) };
    assert!(
        matches!(r, Err(Error::InvalidArgument { name: "dst", .. })),
        "{r:?}"
    );
    assert_eq!(b.read(), vec![2; len]);
    // A value layout of another shape, or on a one-part pool: refused.
    let k = PagedLayout::v0_key(NB, 16, HEADS, DIM, 2);
    let bad = [
        BlockPool::strided(b.bytes_mut(), 2 * cache, cache, LAYERS, 2, k)
            .value_layout(PagedLayout::v0_value(NB, 8, HEADS, DIM, 2)),
        BlockPool::strided(b.bytes_mut(), cache, 0, LAYERS, 1, k)
            .value_layout(PagedLayout::v0_value(NB, 16, HEADS, DIM, 2)),
    ];
    for dst in bad {
        let op = BlockCopy::new(
            v0_pool(PoolKind::V0, a.bytes_mut(), 16, 2),
            dst,
            BlockMap::Host(&V0_PAIRS),
        );
        // SAFETY: refused before anything is touched.
        let r = unsafe { kvio::emulate::copy_blocks(&op) };
        assert!(
            matches!(r, Err(Error::InvalidArgument { name: "dst", .. })),
            "{r:?}"
        );
    }
}

/// Random conversions in emulation: element size, page size (1 to 64 slots), 1 to 6 heads,
/// head sizes of 1 to 16 key pieces, 1 to 3 layers, each other kind both ways, pools 16-byte
/// aligned (the tiled entry where the shape allows it) or one element off (the per-group
/// entry), kernel or DMA backend; bit-exact against the reference, the poison outside the
/// copied blocks kept.
fn conversion_params() -> impl Strategy<Value = (ConvShape, PoolKind, bool, bool, bool, u64)> {
    (
        proptest::sample::select(vec![1usize, 2, 4]),
        proptest::sample::select(vec![1usize, 2, 4, 8, 16, 32, 64]),
        1usize..=6,
        1usize..=16,
        1usize..=3,
        proptest::sample::select(vec![PoolKind::Nhd, PoolKind::Hnd, PoolKind::CrossNhd]),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(
            |(e, bs, heads, pieces, layers, other, into_v0, shifted, dma, seed)| {
                let shape = ConvShape {
                    e,
                    bs,
                    heads,
                    dim: pieces * 16 / e,
                    layers,
                };
                (shape, other, into_v0, shifted, dma, seed)
            },
        )
}

proptest::proptest! {
    // `PROPTEST_CASES` cases (default 64).
    #![proptest_config(proptest::test_runner::Config::with_cases(kvio_suite::proptest_cases(64)))]

    /// Random conversions to and from v0 ([`conversion_params`]) in emulation, bit-exact.
    #[test]
    fn v0_conversions_emulated_property(
        (shape, other, into_v0, shifted, dma, seed) in conversion_params()
    ) {
        let (from, to) = if into_v0 { (other, PoolKind::V0) } else { (PoolKind::V0, other) };
        let len = shape.len();
        // One element past a 16-byte boundary when shifted: the per-group entry.
        let at = if shifted { shape.e } else { 0 };
        let src = Mem::plain(random_bytes(len + 16, seed));
        let poison = random_bytes(len + 16, seed ^ 1);
        let dst = Mem::plain(poison.clone());
        let pairs = [[0i64, 3], [3, 1], [-1, 2], [2, 0]];
        let op = BlockCopy::new(
            shape.pool(from, src.bytes_mut().slice(at, len).unwrap()),
            shape.pool(to, dst.bytes_mut().slice(at, len).unwrap()),
            BlockMap::Host(&pairs),
        )
        .backend(if dma { Backend::Dma } else { Backend::Kernel });
        // SAFETY: every view is plain host memory of its length.
        unsafe { kvio::emulate::copy_blocks(&op) }.unwrap();
        let (want, _) = v0_expected(
            &op.src,
            &src.read()[at..at + len],
            &op.dst,
            &poison[at..at + len],
            &pairs,
        );
        let got = dst.read();
        assert_same(&format!("{shape:?} {from:?} -> {to:?} at {at} dma {dma}"), &got[at..at + len], &want);
        assert_eq!(got[..at], poison[..at]);
        assert_eq!(got[at + len..], poison[at + len..]);
    }
}

/// On the GPU: the conversions of the emulated test device → device, offload to pinned host
/// and onload back, on every backend and on a device map with an out-of-range pair (counted
/// once, though each part is its own launch); and a layer-table v0 pool (per-layer K and V
/// tensors, as mistral.rs keeps them) converted to and from a cross-layer pool.
#[test]
fn gpu_v0_block_copies_match_reference() {
    let Some(g) = kvio_suite::gpu("v0 block copies") else {
        return;
    };
    let stream = g.stream();
    let sref = StreamRef::from(&stream);
    // Drivers of CUDA 12.8 and later take the DMA backend's copies as one batch.
    let mut version = 0;
    // SAFETY: out-pointer to a local.
    unsafe { cust::sys::cuDriverGetVersion(&mut version) };
    assert_eq!(g.kv.batched_dma(), version >= 12080, "driver {version}");
    let errors = DeviceErrors::new().unwrap();
    let bad_pairs: [[i64; 2]; 5] = [[0, 3], [5, 1], [-1, -1], [2, 2], [NB as i64, 0]];
    let device_map = kvio_suite::upload(&bad_pairs.iter().flatten().copied().collect::<Vec<i64>>());
    for (e, bs) in CONVERSION_SHAPES {
        let len = pool_len(bs, e);
        let src_bytes = random_bytes(len, 81 + e as u64);
        let poison = random_bytes(len, 82);
        for (from, to) in conversions() {
            for (src_host, dst_host) in [(false, false), (false, true), (true, false)] {
                let mut src = Mem::new(src_host, len);
                src.fill(&src_bytes);
                let mut dst = Mem::new(dst_host, len);
                for backend in [Backend::Kernel, Backend::Dma, Backend::Tma, Backend::Auto] {
                    dst.fill(&poison);
                    let op = BlockCopy::new(
                        v0_pool(from, src.bytes_mut(), bs, e),
                        v0_pool(to, dst.bytes_mut(), bs, e),
                        BlockMap::Host(&V0_PAIRS),
                    )
                    .backend(backend);
                    let ran = g.kv.copy_blocks(&op, sref).unwrap();
                    stream.synchronize().unwrap();
                    let what = format!(
                        "{from:?} -> {to:?} e {e} bs {bs} host {src_host}->{dst_host} \
                         {backend:?} (ran {ran:?})"
                    );
                    let (want, _) = v0_expected(&op.src, &src_bytes, &op.dst, &poison, &V0_PAIRS);
                    assert_same(&what, &dst.read(), &want);
                }
                // A device map with a pair past the source pool: skipped, counted once.
                dst.fill(&poison);
                errors.reset(sref).unwrap();
                let op = BlockCopy::new(
                    v0_pool(from, src.bytes_mut(), bs, e),
                    v0_pool(to, dst.bytes_mut(), bs, e),
                    BlockMap::Device {
                        pairs: DeviceBytes::of(&device_map),
                        len: bad_pairs.len(),
                    },
                )
                .errors(&errors);
                g.kv.copy_blocks(&op, sref).unwrap();
                stream.synchronize().unwrap();
                let what = format!("{from:?} -> {to:?} e {e} bs {bs} device map");
                let (want, counts) = v0_expected(&op.src, &src_bytes, &op.dst, &poison, &bad_pairs);
                assert_same(&what, &dst.read(), &want);
                assert_eq!(counts.bad_blocks, 1);
                assert_eq!(errors.read(sref).unwrap(), counts, "{what}");
            }
        }
    }
    // Per-layer K and V tensors through a layer table, to and from cross-layer blocks.
    let (e, bs) = (2, 16);
    let len = pool_len(bs, e);
    let src_bytes = random_bytes(len, 91);
    let poison = random_bytes(len, 92);
    let mut tensors = Mem::new(false, len);
    let mut cross = Mem::new(false, len);
    let cache = len / (2 * LAYERS);
    for into_table in [false, true] {
        for backend in [Backend::Kernel, Backend::Dma] {
            tensors.fill(if into_table { &poison } else { &src_bytes });
            cross.fill(if into_table { &src_bytes } else { &poison });
            let views: Vec<DeviceBytesMut<'_>> = (0..2 * LAYERS)
                .map(|i| tensors.bytes_mut().slice(i * cache, cache).unwrap())
                .collect();
            let table = LayerTable::new(&views, 2).unwrap();
            let v0 = BlockPool::layer_separate(&table, PagedLayout::v0_key(NB, bs, HEADS, DIM, e))
                .value_layout(PagedLayout::v0_value(NB, bs, HEADS, DIM, e));
            let other = v0_pool(PoolKind::CrossNhd, cross.bytes_mut(), bs, e);
            let op = if into_table {
                BlockCopy::new(other, v0, BlockMap::Host(&V0_PAIRS))
            } else {
                BlockCopy::new(v0, other, BlockMap::Host(&V0_PAIRS))
            }
            .backend(backend);
            g.kv.copy_blocks(&op, sref).unwrap();
            stream.synchronize().unwrap();
            let (want, _) = v0_expected(&op.src, &src_bytes, &op.dst, &poison, &V0_PAIRS);
            drop(table);
            let got = if into_table {
                tensors.read()
            } else {
                cross.read()
            };
            assert_same(
                &format!("table, into table {into_table}, {backend:?}"),
                &got,
                &want,
            );
        }
    }
}
