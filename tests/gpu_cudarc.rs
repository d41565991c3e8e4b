//! GPU tests of kvio on cudarc-owned contexts, streams, device slices and pinned memory
//! (`kvio::cudarc`, feature `cudarc`): every operation — slot and slice updates, block copies
//! inside the GPU, offload to pinned host memory and onload back on both backends — against
//! the CPU reference, bit for bit, on random data with poisoned outputs. cudarc creates the
//! (primary) context; kvio is loaded into it. Skips without a GPU unless `KVIO_REQUIRE_GPU=1`.
//!
//! Run with `cargo test --features cudarc --test gpu_cudarc`.
#![cfg(feature = "cudarc")]

use std::sync::Arc;

use kvio::cudarc::{
    self as kc,
    driver::{sys, CudaContext, CudaSlice, CudaStream, DeviceRepr, PinnedHostSlice},
};
use kvio::plan::{slices_to_table, slots_to_slices, Slice};
use kvio::reference;
use kvio::{
    Backend, BlockCopy, BlockMap, BlockPool, DeviceErrors, ErrorCounts, Kvio, PagedLayout,
    PinnedHost, SliceUpdate, SlotMapping, SlotUpdate, TokenLayout,
};
use kvio_suite::{assert_same, gpu_required, random_bytes, random_pairs, Kind, Rng, Shape};

/// kvio loaded into cudarc's primary context, and a cudarc stream. Field order is drop order:
/// the module goes before the context.
struct Rig {
    kv: Kvio,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
}

fn skip<T>(test: &str, why: &str) -> Option<T> {
    if gpu_required() {
        panic!("{test}: KVIO_REQUIRE_GPU=1 but {why}");
    }
    kvio_suite::skipped(test, why);
    None
}

/// cudarc first (it retains the primary context and makes it current), then kvio.
fn rig(test: &str) -> Option<Rig> {
    // cudarc panics when it cannot dlopen libcuda at all; the link stub makes it fail cleanly.
    let ctx = match std::panic::catch_unwind(|| CudaContext::new(0)) {
        Ok(Ok(ctx)) => ctx,
        Ok(Err(e)) => return skip(test, &format!("no usable CUDA device (cudarc: {:?})", e.0)),
        Err(_) => return skip(test, "cudarc could not load the CUDA driver library"),
    };
    let kv = match kc::load(&ctx) {
        Ok(kv) => kv,
        Err(e) => {
            return skip(
                test,
                &format!("loading kvio into cudarc's context failed: {e}"),
            )
        }
    };
    assert_eq!(
        kvio::current_context().unwrap() as usize,
        ctx.cu_ctx() as usize,
        "kvio runs in cudarc's context"
    );
    assert_eq!(kv.cu_context() as usize, ctx.cu_ctx() as usize);
    let stream = ctx.new_stream().expect("cuStreamCreate");
    Some(Rig { kv, stream, ctx })
}

fn up<T: DeviceRepr>(s: &Arc<CudaStream>, data: &[T]) -> CudaSlice<T> {
    s.clone_htod(data).expect("clone_htod")
}

/// Synchronous download (cudarc waits for the slice's last write first).
fn down(s: &Arc<CudaStream>, slice: &CudaSlice<u8>) -> Vec<u8> {
    s.clone_dtoh(slice)
        .expect("clone_dtoh (a kernel fault shows here)")
}

/// Pinned, device-mapped, portable host memory from cudarc, filled with `data`.
fn pinned(ctx: &Arc<CudaContext>, data: &[u8]) -> PinnedHostSlice<u8> {
    let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
    // SAFETY: fully written right below, before any read.
    let mut p =
        unsafe { ctx.alloc_pinned_with_flags::<u8>(data.len(), flags) }.expect("cuMemHostAlloc");
    p.as_mut_slice().unwrap().copy_from_slice(data);
    p
}

/// Random distinct slots for `t` tokens of a cache of `num_slots`, with skipped (negative) and
/// out-of-range entries that fit in `i32`.
fn make_slots(t: usize, num_slots: usize, rng: &mut Rng) -> Vec<i64> {
    let mut all: Vec<i64> = (0..num_slots as i64).collect();
    rng.shuffle(&mut all);
    let mut slots = all[..t].to_vec();
    for s in slots.iter_mut() {
        match rng.below(20) {
            0 => *s = -1,
            1 => *s = i32::MIN as i64,
            2 => *s = num_slots as i64,
            3 => *s = i32::MAX as i64,
            _ => {}
        }
    }
    slots
}

fn bad_slots(slots: &[i64], num_slots: usize) -> u32 {
    slots.iter().filter(|&&s| s >= num_slots as i64).count() as u32
}

/// Slot updates (i64 and i32 slots, NHD and HND caches, K+V and K only) on cudarc slices.
#[test]
fn cudarc_slot_update() {
    let Some(r) = rig("cudarc slot update") else {
        return;
    };
    let s = &r.stream;
    let (blocks, bs, h, d, e, t) = (40usize, 16usize, 8usize, 128usize, 2usize, 300usize);
    let input = TokenLayout::contiguous(t, h, d, e);
    let in_bytes = input.extent("input").unwrap() as usize;
    let (kh, vh) = (random_bytes(in_bytes, 1), random_bytes(in_bytes, 2));
    let (key, value) = (up(s, &kh), up(s, &vh));
    let errors = DeviceErrors::new().unwrap();
    let mut rng = Rng::new(3);
    let mut case = 0u64;
    for layout in [
        PagedLayout::nhd(blocks, bs, h, d, e),
        PagedLayout::hnd(blocks, bs, h, d, e),
    ] {
        for i64_slots in [true, false] {
            for with_v in [true, false] {
                case += 1;
                let name = format!("{layout:?} i64={i64_slots} v={with_v}");
                let cache_bytes = layout.extent("cache").unwrap() as usize;
                let (pk, pv) = (
                    random_bytes(cache_bytes, 10 + case),
                    random_bytes(cache_bytes, 20 + case),
                );
                let (mut kcache, mut vcache) = (up(s, &pk), up(s, &pv));
                let slots = make_slots(t, layout.num_slots(), &mut rng);
                let s64 = up(s, &slots);
                let s32 = up(s, &slots.iter().map(|&x| x as i32).collect::<Vec<i32>>());
                errors.reset(kc::stream(s)).unwrap();
                {
                    let k = kc::read(&key, s);
                    let v = kc::read(&value, s);
                    let sl = if i64_slots {
                        kc::read(&s64, s)
                    } else {
                        kc::read(&s32, s)
                    };
                    let kw = kc::write(&mut kcache, s);
                    let vw = kc::write(&mut vcache, s);
                    r.kv.update_slots(
                        &SlotUpdate {
                            key: kvio::CacheWrite {
                                src: k.bytes(),
                                dst: kw.bytes_mut(),
                            },
                            value: (with_v.then(|| v.bytes()))
                                .zip(with_v.then(|| vw.bytes_mut()))
                                .map(|(src, dst)| kvio::CacheWrite { src, dst }),
                            input,
                            cache: layout,
                            value_layout: None,
                            slots: if i64_slots {
                                SlotMapping::I64(sl.bytes())
                            } else {
                                SlotMapping::I32(sl.bytes())
                            },
                            errors: Some(&errors),
                            quantize: None,
                        },
                        kc::stream(s),
                    )
                    .unwrap_or_else(|err| panic!("{name}: {err}"));
                }
                let (gk, gv) = (down(s, &kcache), down(s, &vcache));
                let (mut wk, mut wv) = (pk, pv);
                let rc =
                    reference::update_slots(&kh, None, &input, &mut wk, 0, None, &layout, &slots);
                if with_v {
                    reference::update_slots(&vh, None, &input, &mut wv, 0, None, &layout, &slots);
                }
                assert_same(&format!("{name} K"), &gk, &wk);
                assert_same(&format!("{name} V"), &gv, &wv);
                let want = ErrorCounts {
                    bad_slots: bad_slots(&slots, layout.num_slots()),
                    ..Default::default()
                };
                assert_eq!(rc, want, "{name}: reference");
                assert_eq!(errors.read(kc::stream(s)).unwrap(), want, "{name}");
            }
        }
    }
}

/// The layer views of one cudarc allocation holding a cross-layer pool `(NB, L, 2, bs, H, D)`
/// take a slot update per layer.
#[test]
fn cudarc_cross_layer_views() {
    let Some(r) = rig("cudarc cross-layer views") else {
        return;
    };
    let s = &r.stream;
    let (blocks, layers, bs, h, d, e, t) = (12usize, 6usize, 16usize, 4usize, 64usize, 2, 90);
    let bytes = blocks * layers * 2 * bs * h * d * e;
    let poison = random_bytes(bytes, 1);
    let mut pool = up(s, &poison);
    let input = TokenLayout::contiguous(t, h, d, e);
    let in_bytes = input.extent("input").unwrap() as usize;
    let mut rng = Rng::new(5);
    let mut want = poison.clone();
    let mut inputs = Vec::new();
    for layer in 0..layers {
        let (kh, vh) = (
            random_bytes(in_bytes, 100 + layer as u64),
            random_bytes(in_bytes, 200 + layer as u64),
        );
        let slots = make_slots(t, blocks * bs, &mut rng);
        inputs.push((up(s, &kh), up(s, &vh), up(s, &slots)));
        let part = bs * h * d * e;
        let k_at = layer * 2 * part;
        let mut layout = PagedLayout::nhd(blocks, bs, h, d, e);
        layout.block_stride = layers * 2 * bs * h * d;
        reference::update_slots(
            &kh,
            Some(&vh),
            &input,
            &mut want,
            k_at,
            Some(k_at + part),
            &layout,
            &slots,
        );
    }
    {
        let w = kc::write(&mut pool, s);
        let p = BlockPool::cross_layer_nhd(w.bytes_mut(), blocks, layers, bs, h, d, e);
        for (layer, (k, v, sl)) in inputs.iter().enumerate() {
            let (kc_, vc_, layout) = p.layer_view_mut(layer).unwrap();
            let (k, v, sl) = (kc::read(k, s), kc::read(v, s), kc::read(sl, s));
            r.kv.update_slots(
                &SlotUpdate {
                    key: kvio::CacheWrite {
                        src: k.bytes(),
                        dst: kc_,
                    },
                    value: (Some(v.bytes()))
                        .zip(vc_)
                        .map(|(src, dst)| kvio::CacheWrite { src, dst }),
                    input,
                    cache: layout,
                    value_layout: None,
                    slots: SlotMapping::I64(sl.bytes()),
                    errors: None,
                    quantize: None,
                },
                kc::stream(s),
            )
            .unwrap();
        }
    }
    assert_same("cross-layer pool", &down(s, &pool), &want);
}

/// Slice updates with a device-side count, including adversarial slices.
#[test]
fn cudarc_slice_update() {
    let Some(r) = rig("cudarc slice update") else {
        return;
    };
    let s = &r.stream;
    let mut rng = Rng::new(9);
    for (bs, h, d, e, t) in [
        (16usize, 16usize, 128usize, 2usize, 500usize),
        (1, 2, 64, 4, 77),
    ] {
        let name = format!("bs={bs} h={h} d={d} e={e} T={t}");
        let blocks = t.div_ceil(bs) * 2 + 3;
        let layout = PagedLayout::nhd(blocks, bs, h, d, e);
        let input = TokenLayout::contiguous(t, h, d, e);
        let src_h = random_bytes(input.extent("input").unwrap() as usize, bs as u64);
        // Runs of consecutive slots in shuffled pages, sometimes leaving a gap.
        let mut pages: Vec<usize> = (0..blocks).collect();
        rng.shuffle(&mut pages);
        let mut slots = vec![-1i64; t];
        let (mut p, mut off) = (0, 0);
        for slot in slots.iter_mut() {
            *slot = (pages[p] * bs + off) as i64;
            off += 1 + (rng.below(8) == 0) as usize;
            if off >= bs {
                p += 1;
                off = 0;
            }
        }
        let mut slices = slots_to_slices(&slots, bs).unwrap();
        let bad = [
            Slice {
                cache_start: layout.num_slots() as i32,
                new_kv_start: 0,
                len: 1,
            },
            Slice {
                cache_start: 0,
                new_kv_start: t as i32,
                len: 1,
            },
        ];
        for b in bad {
            let at = rng.below(slices.len() as u64 + 1) as usize;
            slices.insert(at, b);
        }
        let padded = slices.len() + 7;
        let table = up(s, &slices_to_table(&slices, padded).unwrap());
        let count = up(s, &[slices.len() as i32]);
        let src = up(s, &src_h);
        let poison = random_bytes(layout.extent("layout").unwrap() as usize, 77 + bs as u64);
        let mut cache = up(s, &poison);
        let errors = DeviceErrors::new().unwrap();
        {
            let (nk, tb, ct) = (kc::read(&src, s), kc::read(&table, s), kc::read(&count, s));
            let cw = kc::write(&mut cache, s);
            r.kv.update_slices(
                &SliceUpdate {
                    new_kv: nk.bytes(),
                    input,
                    cache: cw.bytes_mut(),
                    layout,
                    slices: tb.bytes(),
                    padded,
                    num_slices: ct.bytes(),
                    errors: Some(&errors),
                    value: None,
                    value_layout: None,
                    quantize: None,
                    slot_list: None,
                },
                kc::stream(s),
            )
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        }
        let got = down(s, &cache);
        let mut want = poison;
        let mut all = slices.clone();
        all.resize(padded, Slice::default());
        let rc = reference::update_slices(
            &src_h,
            &input,
            &mut want,
            &layout,
            &all,
            slices.len() as i32,
        );
        assert_same(&name, &got, &want);
        assert_eq!(rc.bad_slices, 2, "{name}: reference");
        assert_eq!(errors.read(kc::stream(s)).unwrap(), rc, "{name}");
    }
}

/// Random pairs: distinct destinations, random sources, one in 8 padding.
fn make_pairs(n: usize, blocks: usize, rng: &mut Rng) -> Vec<[i64; 2]> {
    random_pairs(n, blocks, blocks, 8, rng)
}

/// Flattened pairs for a device map; `bad` appends a pair whose source is past the pool
/// (skipped and counted by the kernel).
fn device_pairs(pairs: &[[i64; 2]], blocks: usize, bad: bool) -> Vec<[i64; 2]> {
    let mut v = pairs.to_vec();
    if bad {
        v.push([blocks as i64 + 3, 0]);
    }
    v
}

/// What `dst` (initially `init`, a pool of kind `dk`) holds after the reference copies `pairs`
/// into it from `src` (a pool of kind `sk`), and the counts.
fn reference_copy(
    sh: &Shape,
    sk: Kind,
    src: &[u8],
    dk: Kind,
    init: Vec<u8>,
    pairs: &[[i64; 2]],
) -> (Vec<u8>, ErrorCounts) {
    let mut want = init;
    let counts = reference::copy_blocks(&sh.image(sk), src, &sh.image(dk), &mut want, pairs);
    (want, counts)
}

fn flat(pairs: &[[i64; 2]]) -> Vec<i64> {
    pairs.iter().flatten().copied().collect()
}

/// Block copies between two cudarc device pools (layout conversions, DMA and kernel), and
/// copy-on-write inside one cudarc pool.
#[test]
fn cudarc_copy_blocks_d2d() {
    let Some(r) = rig("cudarc copy_blocks d2d") else {
        return;
    };
    let s = &r.stream;
    let sh = Shape {
        blocks: 24,
        layers: 4,
        bs: 16,
        heads: 8,
        dim: 128,
        elem: 2,
    };
    let src_data = random_bytes(sh.bytes(), 1);
    let src = up(s, &src_data);
    let errors = DeviceErrors::new().unwrap();
    let mut rng = Rng::new(17);
    let mut n = 0u64;
    for (sk, dk) in [
        (Kind::CrossNhd, Kind::CrossNhd),
        (Kind::CrossNhd, Kind::CrossHnd),
        (Kind::CrossHnd, Kind::LayerFirst),
        (Kind::LayerFirst, Kind::CrossNhd),
    ] {
        for backend in [Backend::Dma, Backend::Kernel] {
            n += 1;
            let name = format!("{sk:?} -> {dk:?} {backend:?}");
            let poison = random_bytes(sh.bytes(), 100 + n);
            let mut dst = up(s, &poison);
            let host_pairs = make_pairs(12, sh.blocks, &mut rng);
            let pairs = device_pairs(&host_pairs, sh.blocks, backend == Backend::Kernel);
            let map = up(s, &flat(&pairs));
            errors.reset(kc::stream(s)).unwrap();
            {
                let (sa, ma) = (kc::read(&src, s), kc::read(&map, s));
                let da = kc::write(&mut dst, s);
                let used =
                    r.kv.copy_blocks(
                        &BlockCopy {
                            src: sh.pool(sk, sa.bytes()),
                            dst: sh.pool(dk, da.bytes_mut()),
                            map: if backend == Backend::Kernel {
                                BlockMap::Device {
                                    pairs: ma.bytes(),
                                    len: pairs.len(),
                                }
                            } else {
                                BlockMap::Host(&pairs)
                            },
                            backend,
                            max_ctas: None,
                            staging: None,
                            errors: Some(&errors),
                        },
                        kc::stream(s),
                    )
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(used, backend, "{name}");
            }
            let got = down(s, &dst);
            let (want, counts) = reference_copy(&sh, sk, &src_data, dk, poison, &pairs);
            assert_same(&name, &got, &want);
            assert_eq!(errors.read(kc::stream(s)).unwrap(), counts, "{name}");
        }
    }

    // Copy-on-write inside one pool: the one write view serves as source and destination.
    let data = random_bytes(sh.bytes(), 2);
    let mut pool = up(s, &data);
    let pairs: Vec<[i64; 2]> = (0..sh.blocks as i64 / 2)
        .map(|i| [i, sh.blocks as i64 - 1 - i])
        .collect();
    let map = up(s, &flat(&pairs));
    {
        let (w, m) = (kc::write(&mut pool, s), kc::read(&map, s));
        let p = sh.pool(Kind::CrossNhd, w.bytes_mut());
        r.kv.copy_blocks(
            &BlockCopy {
                src: p.into(),
                dst: p,
                map: BlockMap::Device {
                    pairs: m.bytes(),
                    len: pairs.len(),
                },
                backend: Backend::Kernel,
                max_ctas: None,
                staging: None,
                errors: None,
            },
            kc::stream(s),
        )
        .unwrap();
    }
    let mut want = data.clone();
    let img = sh.image(Kind::CrossNhd);
    reference::copy_blocks(&img, &data, &img, &mut want, &pairs);
    assert_same("copy within one cudarc pool", &down(s, &pool), &want);
}

/// Offload from a cudarc device pool to pinned host memory (cudarc's and kvio's) and onload
/// back, by the kernel backend (device map, host map through staging) and by DMA.
#[test]
fn cudarc_offload_and_onload() {
    let Some(r) = rig("cudarc offload/onload") else {
        return;
    };
    let s = &r.stream;
    let sh = Shape {
        blocks: 20,
        layers: 8,
        bs: 16,
        heads: 4,
        dim: 128,
        elem: 2,
    };
    let gpu_data = random_bytes(sh.bytes(), 3);
    let gpu = up(s, &gpu_data);
    let errors = DeviceErrors::new().unwrap();
    let mut rng = Rng::new(23);

    // 1. Offload, kernel backend, device map, 2 CTAs: cudarc device -> cudarc pinned
    //    (SGLang layer-first).
    let poison = random_bytes(sh.bytes(), 4);
    let mut host = pinned(&r.ctx, &poison);
    let pairs = device_pairs(&make_pairs(10, sh.blocks, &mut rng), sh.blocks, true);
    let map = up(s, &flat(&pairs));
    errors.reset(kc::stream(s)).unwrap();
    {
        let (g, m) = (kc::read(&gpu, s), kc::read(&map, s));
        let h = kc::write_pinned(&mut host, s).unwrap();
        assert_eq!(
            kvio::memory_kind(h.bytes().ptr()),
            kvio::MemoryKind::PinnedHost
        );
        let used =
            r.kv.copy_blocks(
                &BlockCopy {
                    src: sh.pool(Kind::CrossNhd, g.bytes()),
                    dst: sh.pool(Kind::LayerFirst, h.bytes_mut()),
                    map: BlockMap::Device {
                        pairs: m.bytes(),
                        len: pairs.len(),
                    },
                    backend: Backend::Kernel,
                    max_ctas: Some(2),
                    staging: None,
                    errors: Some(&errors),
                },
                kc::stream(s),
            )
            .unwrap();
        assert_eq!(used, Backend::Kernel);
    }
    // as_slice waits for the event the Access recorded after the launch.
    let got = host.as_slice().unwrap().to_vec();
    let (want, counts) = reference_copy(
        &sh,
        Kind::CrossNhd,
        &gpu_data,
        Kind::LayerFirst,
        poison,
        &pairs,
    );
    assert_same("offload kernel -> cudarc pinned", &got, &want);
    assert_eq!(errors.read(kc::stream(s)).unwrap(), counts);
    assert_eq!(counts.bad_blocks, 1);

    // 2. Offload by DMA with a host map: cudarc device -> kvio::PinnedHost (cross-layer HND).
    let poison = random_bytes(sh.bytes(), 5);
    let mut kvio_host = PinnedHost::alloc(sh.bytes()).unwrap();
    kvio_host.as_mut_slice().unwrap().copy_from_slice(&poison);
    let pairs = make_pairs(10, sh.blocks, &mut rng);
    {
        let g = kc::read(&gpu, s);
        let used =
            r.kv.copy_blocks(
                &BlockCopy {
                    src: sh.pool(Kind::CrossNhd, g.bytes()),
                    dst: sh.pool(Kind::CrossHnd, kvio_host.bytes_mut()),
                    map: BlockMap::Host(&pairs),
                    backend: Backend::Dma,
                    max_ctas: None,
                    staging: None,
                    errors: None,
                },
                kc::stream(s),
            )
            .unwrap();
        assert_eq!(used, Backend::Dma);
    }
    s.synchronize().unwrap();
    let (want, _) = reference_copy(
        &sh,
        Kind::CrossNhd,
        &gpu_data,
        Kind::CrossHnd,
        poison,
        &pairs,
    );
    assert_same(
        "offload DMA -> kvio pinned",
        kvio_host.as_slice().unwrap(),
        &want,
    );

    // 3. Onload, kernel backend, device map: cudarc pinned (layer-first) -> cudarc device
    //    (cross-layer HND), all SMs allowed.
    let host_data = random_bytes(sh.bytes(), 6);
    let host = pinned(&r.ctx, &host_data);
    let poison = random_bytes(sh.bytes(), 7);
    let mut dst = up(s, &poison);
    let pairs = device_pairs(&make_pairs(15, sh.blocks, &mut rng), sh.blocks, true);
    let map = up(s, &flat(&pairs));
    errors.reset(kc::stream(s)).unwrap();
    {
        let h = kc::read_pinned(&host, s).unwrap();
        let (d, m) = (kc::write(&mut dst, s), kc::read(&map, s));
        r.kv.copy_blocks(
            &BlockCopy {
                src: sh.pool(Kind::LayerFirst, h.bytes()),
                dst: sh.pool(Kind::CrossHnd, d.bytes_mut()),
                map: BlockMap::Device {
                    pairs: m.bytes(),
                    len: pairs.len(),
                },
                backend: Backend::Kernel,
                max_ctas: Some(64),
                staging: None,
                errors: Some(&errors),
            },
            kc::stream(s),
        )
        .unwrap();
    }
    let (want, counts) = reference_copy(
        &sh,
        Kind::LayerFirst,
        &host_data,
        Kind::CrossHnd,
        poison,
        &pairs,
    );
    assert_same("onload kernel <- cudarc pinned", &down(s, &dst), &want);
    assert_eq!(errors.read(kc::stream(s)).unwrap(), counts);

    // 4. Onload, kernel backend, host map through cudarc staging: cudarc pinned (cross NHD)
    //    -> cudarc device (cross NHD).
    let host_data = random_bytes(sh.bytes(), 8);
    let host = pinned(&r.ctx, &host_data);
    let poison = random_bytes(sh.bytes(), 9);
    let mut dst = up(s, &poison);
    let pairs = make_pairs(12, sh.blocks, &mut rng);
    let mut staging = s.alloc_zeros::<i64>(2 * pairs.len()).unwrap();
    {
        let h = kc::read_pinned(&host, s).unwrap();
        let d = kc::write(&mut dst, s);
        let st = kc::write(&mut staging, s);
        let used =
            r.kv.copy_blocks(
                &BlockCopy {
                    src: sh.pool(Kind::CrossNhd, h.bytes()),
                    dst: sh.pool(Kind::CrossNhd, d.bytes_mut()),
                    map: BlockMap::Host(&pairs),
                    backend: Backend::Kernel,
                    max_ctas: None,
                    staging: Some(st.bytes_mut()),
                    errors: None,
                },
                kc::stream(s),
            )
            .unwrap();
        assert_eq!(used, Backend::Kernel);
    }
    let (want, _) = reference_copy(
        &sh,
        Kind::CrossNhd,
        &host_data,
        Kind::CrossNhd,
        poison,
        &pairs,
    );
    assert_same(
        "onload staged kernel <- cudarc pinned",
        &down(s, &dst),
        &want,
    );

    // 5. Onload by DMA: kvio::PinnedHost (cross HND, written in step 2) -> cudarc device
    //    (layer-first).
    let host_data = kvio_host.as_slice().unwrap().to_vec();
    let poison = random_bytes(sh.bytes(), 10);
    let mut dst = up(s, &poison);
    let pairs = make_pairs(12, sh.blocks, &mut rng);
    {
        let d = kc::write(&mut dst, s);
        r.kv.copy_blocks(
            &BlockCopy {
                src: sh.pool(Kind::CrossHnd, kvio_host.bytes()),
                dst: sh.pool(Kind::LayerFirst, d.bytes_mut()),
                map: BlockMap::Host(&pairs),
                backend: Backend::Dma,
                max_ctas: None,
                staging: None,
                errors: None,
            },
            kc::stream(s),
        )
        .unwrap();
    }
    let (want, _) = reference_copy(
        &sh,
        Kind::CrossHnd,
        &host_data,
        Kind::LayerFirst,
        poison,
        &pairs,
    );
    assert_same("onload DMA <- kvio pinned", &down(s, &dst), &want);
}

/// cudarc's event tracking orders kvio's launches against cudarc work on other streams: the
/// caches are made on stream B, kvio writes them on stream A, B reads them back — with no
/// explicit synchronisation in between. Also loads kvio on a second thread.
#[test]
fn cudarc_event_tracking_across_streams_and_threads() {
    let Some(r) = rig("cudarc event tracking") else {
        return;
    };
    let a = &r.stream;
    let b = r.ctx.new_stream().unwrap();
    assert!(r.ctx.is_managing_stream_synchronization());
    let (blocks, bs, h, d, e, t) = (4200usize, 16usize, 8usize, 128usize, 2usize, 65_536usize);
    let layout = PagedLayout::nhd(blocks, bs, h, d, e);
    let input = TokenLayout::contiguous(t, h, d, e);
    let kh = random_bytes(input.extent("input").unwrap() as usize, 1);
    let key = up(&b, &kh);
    let poison = random_bytes(layout.extent("cache").unwrap() as usize, 2);
    let mut cache = up(&b, &poison);
    let mut rng = Rng::new(4);
    let mut all: Vec<i64> = (0..layout.num_slots() as i64).collect();
    rng.shuffle(&mut all);
    let slots = all[..t].to_vec();
    let sl = up(&b, &slots);
    {
        let (k, s_) = (kc::read(&key, a), kc::read(&sl, a));
        let c = kc::write(&mut cache, a);
        r.kv.update_slots(
            &SlotUpdate {
                key: kvio::CacheWrite {
                    src: k.bytes(),
                    dst: c.bytes_mut(),
                },
                value: None,
                input,
                cache: layout,
                value_layout: None,
                slots: SlotMapping::I64(s_.bytes()),
                errors: None,
                quantize: None,
            },
            kc::stream(a),
        )
        .unwrap();
    }
    // B waits for A's write event (recorded when `c` dropped), not for the host.
    let got = b.clone_dtoh(&cache).unwrap();
    let mut want = poison;
    reference::update_slots(&kh, None, &input, &mut want, 0, None, &layout, &slots);
    assert_same("kvio on A, read on B", &got, &want);

    // A second thread: bind cudarc's context there and load kvio again.
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let kv = kc::load(&r.ctx).expect("kvio::cudarc::load on another thread");
            assert_eq!(
                kvio::current_context().unwrap() as usize,
                r.ctx.cu_ctx() as usize
            );
            let stream = r.ctx.new_stream().unwrap();
            let small = PagedLayout::nhd(8, 16, 2, 64, 2);
            let inp = TokenLayout::contiguous(3, 2, 64, 2);
            let kh = random_bytes(inp.extent("input").unwrap() as usize, 9);
            let key = up(&stream, &kh);
            let poison = random_bytes(small.extent("cache").unwrap() as usize, 10);
            let mut cache = up(&stream, &poison);
            let slots = [5i64, -1, 100];
            let sl = up(&stream, &slots);
            {
                let (k, s_) = (kc::read(&key, &stream), kc::read(&sl, &stream));
                let c = kc::write(&mut cache, &stream);
                kv.update_slots(
                    &SlotUpdate {
                        key: kvio::CacheWrite {
                            src: k.bytes(),
                            dst: c.bytes_mut(),
                        },
                        value: None,
                        input: inp,
                        cache: small,
                        value_layout: None,
                        slots: SlotMapping::I64(s_.bytes()),
                        errors: None,
                        quantize: None,
                    },
                    kc::stream(&stream),
                )
                .unwrap();
            }
            let mut want = poison;
            reference::update_slots(&kh, None, &inp, &mut want, 0, None, &small, &slots);
            assert_same("second thread", &down(&stream, &cache), &want);
        });
    });
}
