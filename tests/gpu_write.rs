//! GPU tests of the write path against the CPU reference, bit for bit, on random data with
//! poisoned caches. Each test skips (and says so) without a GPU, and fails instead when
//! `KVIO_REQUIRE_GPU=1`.

use cust::memory::DeviceBuffer;
use kvio::plan::{slices_to_table, slots_to_slices, Slice};
use kvio::{
    reference, DeviceBytes, DeviceBytesMut, DeviceErrors, ErrorCounts, PagedLayout, SliceUpdate,
    SlotMapping, SlotUpdate, StreamRef, TokenLayout,
};
use kvio_suite::{assert_same, download, gpu, overwrite, random_bytes, upload, Graph, Rng};

/// How the K and V caches sit in memory.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Caches {
    /// Two allocations, NHD.
    SeparateNhd,
    /// Two allocations, HND.
    SeparateHnd,
    /// One allocation `[NB, bs, 2H, D]`: each slot holds K heads then V heads.
    CombinedRow,
    /// Layer `layer` of a cross-layer allocation `(NB, L, 2, bs, H, D)`.
    CrossLayer { layers: usize, layer: usize },
    /// K only (no V).
    KeyOnly,
}

#[derive(Clone, Copy, Debug)]
struct SlotCase {
    blocks: usize,
    bs: usize,
    heads: usize,
    dim: usize,
    elem: usize,
    tokens: usize,
    i64_slots: bool,
    caches: Caches,
    /// Extra elements between input tokens (a view into a wider qkv tensor).
    input_pad: usize,
    /// Fraction (per mille) of tokens given a negative slot.
    skip_permille: u64,
    /// Fraction (per mille) of tokens given a slot past the cache.
    bad_permille: u64,
    seed: u64,
}

impl SlotCase {
    fn new(blocks: usize, bs: usize, heads: usize, dim: usize, elem: usize, tokens: usize) -> Self {
        SlotCase {
            blocks,
            bs,
            heads,
            dim,
            elem,
            tokens,
            i64_slots: true,
            caches: Caches::SeparateNhd,
            input_pad: 0,
            skip_permille: 50,
            bad_permille: 0,
            seed: 1,
        }
    }
}

/// Random distinct slots for `tokens` tokens, some negative, some out of range.
fn make_slots(c: &SlotCase, rng: &mut Rng) -> Vec<i64> {
    let num_slots = (c.blocks * c.bs) as u64;
    assert!(c.tokens as u64 <= num_slots, "case needs a slot per token");
    let mut all: Vec<i64> = (0..num_slots as i64).collect();
    rng.shuffle(&mut all);
    let mut slots: Vec<i64> = all[..c.tokens].to_vec();
    let max = if c.i64_slots {
        i64::MAX
    } else {
        i32::MAX as i64
    };
    let min = if c.i64_slots {
        i64::MIN
    } else {
        i32::MIN as i64
    };
    for s in slots.iter_mut() {
        let r = rng.below(1000);
        if r < c.skip_permille {
            *s = match rng.below(3) {
                0 => -1,
                1 => min,
                _ => -(1 + rng.below(1 << 20) as i64),
            };
        } else if r < c.skip_permille + c.bad_permille {
            *s = match rng.below(3) {
                0 => num_slots as i64,
                1 => max,
                _ => num_slots as i64 + rng.below(1 << 30) as i64,
            };
        }
    }
    slots
}

/// Runs one slot-update case on the GPU and compares the caches with the reference.
fn run_slot_case(c: SlotCase) {
    let name = format!("{c:?}");
    let Some(g) = gpu("slot update") else { return };
    let stream = g.stream();
    let mut rng = Rng::new(c.seed);
    let (h, d, e) = (c.heads, c.dim, c.elem);

    let mut input = TokenLayout::contiguous(c.tokens, h, d, e);
    input.token_stride += c.input_pad;
    let in_bytes = (input.extent("input").unwrap() as usize).max(1);
    let key_h = random_bytes(in_bytes, c.seed ^ 0x11);
    let val_h = random_bytes(in_bytes, c.seed ^ 0x22);

    // The cache allocation(s) and the layout/offsets of the K and V views inside them.
    let nhd = PagedLayout::nhd(c.blocks, c.bs, h, d, e);
    let (layout, alloc, key_at, value_at, separate) = match c.caches {
        Caches::SeparateNhd => (nhd, nhd.extent("c").unwrap() as usize, 0, Some(0), true),
        Caches::KeyOnly => (nhd, nhd.extent("c").unwrap() as usize, 0, None, true),
        Caches::SeparateHnd => {
            let l = PagedLayout::hnd(c.blocks, c.bs, h, d, e);
            (l, l.extent("c").unwrap() as usize, 0, Some(0), true)
        }
        Caches::CombinedRow => {
            let mut l = nhd;
            l.token_stride = 2 * h * d;
            l.block_stride = c.bs * 2 * h * d;
            (
                l,
                c.blocks * c.bs * 2 * h * d * e,
                0,
                Some(h * d * e),
                false,
            )
        }
        Caches::CrossLayer { layers, layer } => {
            let mut l = nhd;
            let per_block = layers * 2 * c.bs * h * d;
            l.block_stride = per_block;
            let k = layer * 2 * c.bs * h * d * e;
            (
                l,
                c.blocks * per_block * e,
                k,
                Some(k + c.bs * h * d * e),
                false,
            )
        }
    };

    let slots = make_slots(&c, &mut rng);
    let expect_bad = slots
        .iter()
        .filter(|&&s| s >= (c.blocks * c.bs) as i64)
        .count() as u32;

    let key = upload(&key_h);
    let val = upload(&val_h);
    let slots_i32: Vec<i32> = slots.iter().map(|&s| s as i32).collect();
    let slots64 = upload(&slots);
    let slots32 = upload(&slots_i32);
    let slot_map = if c.i64_slots {
        SlotMapping::I64(DeviceBytes::of(&slots64))
    } else {
        SlotMapping::I32(DeviceBytes::of(&slots32))
    };
    let errors = DeviceErrors::new().unwrap();

    // Two runs, each on freshly poisoned caches.
    for run in 0..2u64 {
        let poison_k = random_bytes(alloc, c.seed ^ 0xA5A5 ^ run);
        let poison_v = random_bytes(alloc, c.seed ^ 0x5A5A ^ run);
        let mut kc = upload(&poison_k);
        let mut vc = upload(&poison_v);
        errors.reset(StreamRef::from(&stream)).unwrap();
        let (kw, vw) = (DeviceBytesMut::of(&mut kc), DeviceBytesMut::of(&mut vc));
        let kview = kw.slice(key_at, alloc - key_at).unwrap();
        let vview = match (c.caches, value_at) {
            (_, None) => None,
            (_, Some(at)) if separate => Some(vw.slice(at, alloc - at).unwrap()),
            (_, Some(at)) => Some(kw.slice(at, alloc - at).unwrap()),
        };
        let op = SlotUpdate {
            key: kvio::CacheWrite {
                src: DeviceBytes::of(&key),
                dst: kview,
            },
            value: (value_at.map(|_| DeviceBytes::of(&val)))
                .zip(vview)
                .map(|(src, dst)| kvio::CacheWrite { src, dst }),
            input,
            cache: layout,
            value_layout: None,
            slots: slot_map,
            errors: Some(&errors),
            quantize: None,
        };
        g.kv.update_slots(&op, StreamRef::from(&stream))
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        let got_k = download(&kc, &stream);
        let got_v = download(&vc, &stream);
        let counts = errors.read(StreamRef::from(&stream)).unwrap();

        // Reference: K and V in their own host images (or both in the one image).
        let mut want_k = poison_k.clone();
        let mut want_v = poison_v.clone();
        let ref_counts = if separate {
            let r = reference::update_slots(
                &key_h,
                None,
                &input,
                &mut want_k,
                key_at,
                None,
                &layout,
                &slots,
            );
            if value_at.is_some() {
                reference::update_slots(
                    &val_h,
                    None,
                    &input,
                    &mut want_v,
                    0,
                    None,
                    &layout,
                    &slots,
                );
            }
            r
        } else {
            reference::update_slots(
                &key_h,
                Some(&val_h),
                &input,
                &mut want_k,
                key_at,
                value_at,
                &layout,
                &slots,
            )
        };
        assert_same(&format!("{name} K cache"), &got_k, &want_k);
        assert_same(&format!("{name} V cache"), &got_v, &want_v);
        assert_eq!(
            counts,
            ErrorCounts {
                bad_slots: expect_bad,
                ..Default::default()
            },
            "{name}"
        );
        assert_eq!(ref_counts.bad_slots, expect_bad, "{name}: reference count");
    }
}

#[test]
fn slot_update_page_sizes_nhd_i64() {
    for (i, bs) in [1usize, 2, 16, 32, 128, 256].into_iter().enumerate() {
        let mut c = SlotCase::new(2048 / bs + 3, bs, 8, 128, 2, 1000);
        c.seed = 100 + i as u64;
        run_slot_case(c);
    }
}

#[test]
fn slot_update_page_sizes_hnd_i32() {
    for (i, bs) in [1usize, 2, 16, 32, 128, 256].into_iter().enumerate() {
        let mut c = SlotCase::new(2048 / bs + 3, bs, 4, 64, 2, 777);
        c.caches = Caches::SeparateHnd;
        c.i64_slots = false;
        c.seed = 200 + i as u64;
        run_slot_case(c);
    }
}

#[test]
fn slot_update_element_sizes_and_odd_rows() {
    // (heads, dim, elem): fp8, bf16, f32, and rows that are not multiples of 16 bytes.
    let shapes = [
        (8, 128, 1),
        (2, 64, 4),
        (1, 576, 2),
        (3, 5, 1),
        (1, 3, 2),
        (5, 7, 4),
        (7, 1, 1),
        (2, 12, 2),
    ];
    for (i, (h, d, e)) in shapes.into_iter().enumerate() {
        for caches in [
            Caches::SeparateNhd,
            Caches::SeparateHnd,
            Caches::CombinedRow,
        ] {
            let mut c = SlotCase::new(40, 16, h, d, e, 300);
            c.caches = caches;
            c.i64_slots = i % 2 == 0;
            c.seed = 300 + i as u64;
            run_slot_case(c);
        }
    }
}

#[test]
fn slot_update_strided_views() {
    // Input is a view into a wider tensor; the cache is one layer of a cross-layer block pool.
    for (i, layer) in [0usize, 3, 7].into_iter().enumerate() {
        let mut c = SlotCase::new(33, 16, 8, 128, 2, 400);
        c.caches = Caches::CrossLayer { layers: 8, layer };
        c.input_pad = 3 * 128; // e.g. q heads beside k
        c.seed = 400 + i as u64;
        run_slot_case(c);
    }
    let mut c = SlotCase::new(20, 32, 2, 64, 2, 300);
    c.caches = Caches::KeyOnly;
    c.input_pad = 1; // odd pad: narrow accesses
    run_slot_case(c);
}

#[test]
fn slot_update_token_counts() {
    for (i, t) in [0usize, 1, 2, 31, 100_003].into_iter().enumerate() {
        let mut c = SlotCase::new(t.div_ceil(16) + 4, 16, 1, 64, 2, t);
        c.seed = 500 + i as u64;
        c.i64_slots = i % 2 == 1;
        run_slot_case(c);
    }
}

#[test]
fn slot_update_adversarial_slots_counted_and_contained() {
    for (i, i64s) in [true, false].into_iter().enumerate() {
        let mut c = SlotCase::new(50, 16, 2, 64, 2, 700);
        c.i64_slots = i64s;
        c.skip_permille = 200;
        c.bad_permille = 300;
        c.seed = 600 + i as u64;
        c.caches = if i64s {
            Caches::CombinedRow
        } else {
            Caches::SeparateNhd
        };
        run_slot_case(c);
    }
}

/// One slice-update case: a random slot mapping turned into slices, mixed with adversarial
/// slices, in a padded table with a device-side count.
fn run_slice_case(
    bs: usize,
    heads: usize,
    dim: usize,
    elem: usize,
    tokens: usize,
    adversarial: usize,
    seed: u64,
) {
    let name = format!("slices bs={bs} h={heads} d={dim} e={elem} T={tokens} bad={adversarial}");
    let Some(g) = gpu("slice update") else { return };
    let stream = g.stream();
    let mut rng = Rng::new(seed);
    let blocks = tokens.div_ceil(bs) * 2 + 3;
    let layout = PagedLayout::nhd(blocks, bs, heads, dim, elem);
    let num_slots = layout.num_slots();
    let input = TokenLayout::contiguous(tokens, heads, dim, elem);
    let src_h = random_bytes((input.extent("i").unwrap() as usize).max(1), seed ^ 7);

    // Tokens go to runs of consecutive slots at random page offsets.
    let mut slots = vec![-1i64; tokens];
    let mut pages: Vec<usize> = (0..blocks).collect();
    rng.shuffle(&mut pages);
    // Runs of random length, separated by gaps of 0 or 1 slot, filling pages in random order
    // (a page gets at least half its slots, so `blocks` suffices).
    let (mut t, mut p, mut off) = (0, 0, 0);
    while t < tokens {
        let run = (1 + rng.below(bs as u64) as usize)
            .min(bs - off)
            .min(tokens - t);
        for r in 0..run {
            slots[t + r] = (pages[p] * bs + off + r) as i64;
        }
        t += run;
        off += run + rng.below(2) as usize;
        if off >= bs {
            p += 1;
            off = 0;
        }
    }
    let mut slices = slots_to_slices(&slots, bs).unwrap();
    let good = slices.len();
    let mut bad = Vec::new();
    for k in 0..adversarial {
        let s = match k % 7 {
            0 => Slice {
                cache_start: num_slots as i32,
                new_kv_start: 0,
                len: 1,
            },
            1 => Slice {
                cache_start: -5,
                new_kv_start: 0,
                len: 1,
            },
            2 => Slice {
                cache_start: 0,
                new_kv_start: 0,
                len: bs as i32 + 1,
            },
            3 if bs > 1 => Slice {
                cache_start: bs as i32 - 1,
                new_kv_start: 0,
                len: 2,
            },
            4 => Slice {
                cache_start: 0,
                new_kv_start: tokens as i32,
                len: 1,
            },
            5 => Slice {
                cache_start: i32::MAX,
                new_kv_start: i32::MAX,
                len: i32::MAX,
            },
            _ => Slice {
                cache_start: 0,
                new_kv_start: -1,
                len: -3,
            },
        };
        bad.push(s);
    }
    let expect_bad = bad.len() as u32;
    for s in bad {
        let at = rng.below(slices.len() as u64 + 1) as usize;
        slices.insert(at, s);
    }
    let padded = slices.len() + 5;
    let table = slices_to_table(&slices, padded).unwrap();
    let table_d = upload(&table);
    let mut count_d = upload(&[slices.len() as i32]);
    let errors = DeviceErrors::new().unwrap();
    let src = upload(&src_h);
    let cache_bytes = layout.extent("l").unwrap() as usize;
    // The update of `cache` by the table, with the device-side count in `count`.
    macro_rules! slice_op {
        ($cache:expr, $count:expr) => {
            SliceUpdate::new(
                DeviceBytes::of(&src),
                input,
                DeviceBytesMut::of($cache),
                layout,
                DeviceBytes::of(&table_d),
                padded,
                DeviceBytes::of($count),
            )
            .errors(&errors)
        };
    }

    for run in 0..2u64 {
        let poison = random_bytes(cache_bytes, seed ^ 0xBEEF ^ run);
        let mut cache = upload(&poison);
        errors.reset(StreamRef::from(&stream)).unwrap();
        let op = slice_op!(&mut cache, &count_d);
        g.kv.update_slices(&op, StreamRef::from(&stream))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = download(&cache, &stream);
        let counts = errors.read(StreamRef::from(&stream)).unwrap();
        let mut want = poison.clone();
        let mut padded_slices = slices.clone();
        padded_slices.resize(padded, Slice::default());
        let rc = reference::update_slices(
            &src_h,
            &input,
            &mut want,
            &layout,
            &padded_slices,
            slices.len() as i32,
        );
        assert_same(&name, &got, &want);
        assert_eq!(rc.bad_slices, expect_bad, "{name}: reference");
        assert_eq!(
            counts,
            ErrorCounts {
                bad_slices: expect_bad,
                ..Default::default()
            },
            "{name}"
        );
        assert!(good > 0 || tokens == 0);
    }

    // Bad device-side counts: nothing written, one count error each.
    for bad_count in [-1i32, padded as i32 + 1, i32::MIN] {
        let poison = random_bytes(cache_bytes, seed ^ 0xC0DE);
        let mut cache = upload(&poison);
        overwrite(&mut count_d, &[bad_count], &stream);
        errors.reset(StreamRef::from(&stream)).unwrap();
        let op = slice_op!(&mut cache, &count_d);
        g.kv.update_slices(&op, StreamRef::from(&stream)).unwrap();
        assert_same(
            &format!("{name} count={bad_count}"),
            &download(&cache, &stream),
            &poison,
        );
        let counts = errors.read(StreamRef::from(&stream)).unwrap();
        assert_eq!(
            counts,
            ErrorCounts {
                bad_counts: 1,
                ..Default::default()
            },
            "{name} count={bad_count}"
        );
    }
}

#[test]
fn slice_update_page_sizes() {
    for (i, bs) in [1usize, 2, 16, 32, 128, 256].into_iter().enumerate() {
        run_slice_case(bs, 8, 128, 2, 1500, 0, 800 + i as u64);
    }
}

#[test]
fn slice_update_odd_rows_and_elements() {
    for (i, (h, d, e)) in [(3, 5, 1), (1, 3, 2), (5, 7, 4), (16, 128, 1), (2, 64, 4)]
        .into_iter()
        .enumerate()
    {
        run_slice_case(16, h, d, e, 333, 0, 900 + i as u64);
    }
}

#[test]
fn slice_update_token_counts() {
    run_slice_case(16, 1, 64, 2, 0, 0, 1000);
    run_slice_case(16, 1, 64, 2, 1, 0, 1001);
    run_slice_case(64, 1, 64, 2, 70_001, 0, 1002);
}

#[test]
fn slice_update_adversarial_slices() {
    for (i, bs) in [1usize, 16, 256].into_iter().enumerate() {
        run_slice_case(bs, 2, 64, 2, 500, 21, 1100 + i as u64);
    }
}

/// Captures one slot update and one slice update in a CUDA graph, then replays it with the
/// device-side slots, slices and count changed between replays; each replay is verified.
#[test]
fn graph_capture_replays_with_new_device_indices() {
    let Some(g) = gpu("graph capture") else {
        return;
    };
    let stream = g.stream();
    let (blocks, bs, h, d, e) = (64usize, 16usize, 8usize, 128usize, 2usize);
    let t = 64usize;
    let layout = PagedLayout::nhd(blocks, bs, h, d, e);
    let input = TokenLayout::contiguous(t, h, d, e);
    let cache_bytes = layout.extent("l").unwrap() as usize;
    let key_h = random_bytes(input.extent("i").unwrap() as usize, 1);
    let val_h = random_bytes(input.extent("i").unwrap() as usize, 2);
    let key = upload(&key_h);
    let val = upload(&val_h);
    let mut kc: DeviceBuffer<u8> = upload(&random_bytes(cache_bytes, 3));
    let mut vc: DeviceBuffer<u8> = upload(&random_bytes(cache_bytes, 4));
    let mut sc: DeviceBuffer<u8> = upload(&random_bytes(cache_bytes, 5));
    let mut slots_d = upload(&vec![-1i64; t]);
    let padded = 2 * t;
    let mut table_d = upload(&vec![0i32; 3 * padded]);
    let mut count_d = upload(&[0i32]);
    let errors = DeviceErrors::new().unwrap();

    let slot_op = SlotUpdate {
        key: kvio::CacheWrite {
            src: DeviceBytes::of(&key),
            dst: DeviceBytesMut::of(&mut kc),
        },
        value: Some(kvio::CacheWrite {
            src: DeviceBytes::of(&val),
            dst: DeviceBytesMut::of(&mut vc),
        }),
        input,
        cache: layout,
        value_layout: None,
        slots: SlotMapping::I64(DeviceBytes::of(&slots_d)),
        errors: Some(&errors),
        quantize: None,
    };
    let slice_op = SliceUpdate {
        new_kv: DeviceBytes::of(&key),
        input,
        cache: DeviceBytesMut::of(&mut sc),
        layout,
        slices: DeviceBytes::of(&table_d),
        padded,
        num_slices: DeviceBytes::of(&count_d),
        errors: Some(&errors),
        value: None,
        value_layout: None,
        quantize: None,
        slot_list: None,
    };
    let graph = Graph::retrying(&stream, |s| {
        g.kv.update_slots(&slot_op, s)?;
        g.kv.update_slices(&slice_op, s)
    });

    let mut rng = Rng::new(77);
    for replay in 0..10u64 {
        let mut all: Vec<i64> = (0..(blocks * bs) as i64).collect();
        rng.shuffle(&mut all);
        let mut slots: Vec<i64> = all[..t].to_vec();
        slots[rng.below(t as u64) as usize] = -1;
        let live = rng.below(t as u64) as usize + 1; // tokens that take part in the slice update
        let mut sl = vec![-1i64; t];
        let mut p = rng.below(blocks as u64 - 8) as usize;
        let mut off = 0;
        for s in sl.iter_mut().take(live) {
            *s = (p * bs + off) as i64;
            off += 1;
            if off == bs || rng.below(5) == 0 {
                p += 1;
                off = 0;
            }
        }
        let slices = slots_to_slices(&sl, bs).unwrap();
        let table = slices_to_table(&slices, padded).unwrap();
        let pk = random_bytes(cache_bytes, 10 + replay);
        let pv = random_bytes(cache_bytes, 20 + replay);
        let ps = random_bytes(cache_bytes, 30 + replay);
        overwrite(&mut slots_d, &slots, &stream);
        overwrite(&mut table_d, &table, &stream);
        overwrite(&mut count_d, &[slices.len() as i32], &stream);
        overwrite(&mut kc, &pk, &stream);
        overwrite(&mut vc, &pv, &stream);
        overwrite(&mut sc, &ps, &stream);
        graph.launch(&stream);
        let (gk, gv, gs) = (
            download(&kc, &stream),
            download(&vc, &stream),
            download(&sc, &stream),
        );
        let (mut wk, mut wv, mut ws) = (pk, pv, ps);
        reference::update_slots(&key_h, None, &input, &mut wk, 0, None, &layout, &slots);
        reference::update_slots(&val_h, None, &input, &mut wv, 0, None, &layout, &slots);
        let mut padded_slices = slices.clone();
        padded_slices.resize(padded, Slice::default());
        reference::update_slices(
            &key_h,
            &input,
            &mut ws,
            &layout,
            &padded_slices,
            slices.len() as i32,
        );
        assert_same(&format!("replay {replay} K"), &gk, &wk);
        assert_same(&format!("replay {replay} V"), &gv, &wv);
        assert_same(&format!("replay {replay} slices"), &gs, &ws);
    }
    assert!(errors.read(StreamRef::from(&stream)).unwrap().is_clean());
}

/// Host-side validation rejects bad arguments before any launch (needs a loaded module).
#[test]
fn launchers_reject_bad_host_arguments() {
    let Some(g) = gpu("host validation") else {
        return;
    };
    let stream = g.stream();
    let layout = PagedLayout::nhd(4, 16, 2, 64, 2);
    let input = TokenLayout::contiguous(8, 2, 64, 2);
    let key = upload(&random_bytes(input.extent("i").unwrap() as usize, 1));
    let mut small = upload(&random_bytes(100, 2));
    let slots = upload(&[0i64; 8]);
    let op = SlotUpdate {
        key: kvio::CacheWrite {
            src: DeviceBytes::of(&key),
            dst: DeviceBytesMut::of(&mut small),
        },
        value: None,
        input,
        cache: layout,
        value_layout: None,
        slots: SlotMapping::I64(DeviceBytes::of(&slots)),
        errors: None,
        quantize: None,
    };
    let err =
        g.kv.update_slots(&op, StreamRef::from(&stream))
            .unwrap_err();
    assert!(
        matches!(
            err,
            kvio::Error::BufferTooSmall {
                name: "key_cache",
                ..
            }
        ),
        "{err}"
    );
    assert_same(
        "untouched",
        &download(&small, &stream),
        &random_bytes(100, 2),
    );
}

/// Typed host data (`half::bf16`, `half::f16`, `f32`, fp8 as `u8`) through `bytemuck`:
/// the caches hold exactly the typed values written, read back as the same type.
#[test]
fn slot_update_typed_elements() {
    fn run<T: bytemuck::Pod + PartialEq + std::fmt::Debug>(make: impl Fn(u32) -> T, seed: u64) {
        let Some(g) = gpu("typed elements") else {
            return;
        };
        let stream = g.stream();
        let (blocks, bs, h, d, t) = (24usize, 16usize, 4usize, 32usize, 200usize);
        let e = std::mem::size_of::<T>();
        let mut rng = Rng::new(seed);
        let key: Vec<T> = (0..t * h * d)
            .map(|_| make(rng.next_u64() as u32))
            .collect();
        let cache0: Vec<T> = (0..blocks * bs * h * d)
            .map(|_| make(rng.next_u64() as u32))
            .collect();
        let mut all: Vec<i64> = (0..(blocks * bs) as i64).collect();
        rng.shuffle(&mut all);
        let slots = &all[..t];
        let key_d = upload(bytemuck::cast_slice::<T, u8>(&key));
        let mut cache_d = upload(bytemuck::cast_slice::<T, u8>(&cache0));
        let slots_d = upload(slots);
        let input = TokenLayout::contiguous(t, h, d, e);
        let layout = PagedLayout::hnd(blocks, bs, h, d, e);
        g.kv.update_slots(
            &SlotUpdate {
                key: kvio::CacheWrite {
                    src: DeviceBytes::of(&key_d),
                    dst: DeviceBytesMut::of(&mut cache_d),
                },
                value: None,
                input,
                cache: layout,
                value_layout: None,
                slots: SlotMapping::I64(DeviceBytes::of(&slots_d)),
                errors: None,
                quantize: None,
            },
            StreamRef::from(&stream),
        )
        .unwrap();
        let got: Vec<T> = bytemuck::pod_collect_to_vec(&download(&cache_d, &stream));
        // Typed expectation: element (b, s, h, d) of HND = key[token, h, d] for the token mapped there.
        let mut want = cache0.clone();
        for (tok, &slot) in slots.iter().enumerate() {
            let (b, s) = (slot as usize / bs, slot as usize % bs);
            for hh in 0..h {
                for dd in 0..d {
                    want[((b * h + hh) * bs + s) * d + dd] = key[(tok * h + hh) * d + dd];
                }
            }
        }
        let (got_b, want_b): (&[u8], &[u8]) =
            (bytemuck::cast_slice(&got), bytemuck::cast_slice(&want));
        assert_same(std::any::type_name::<T>(), got_b, want_b);
    }
    run(|x| half::bf16::from_bits(x as u16 | 1), 1);
    run(|x| half::f16::from_bits(x as u16 | 1), 2);
    run(|x| f32::from_bits(x | 1), 3);
    run(|x| (x as u8) | 1, 4);
}
