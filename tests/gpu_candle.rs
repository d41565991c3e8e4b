//! GPU tests of kvio's candle interop (`kvio::candle`, feature `candle`): mistral.rs'
//! `reshape_and_cache`, `copy_blocks` and `swap_blocks` on candle CUDA tensors, compared bit for
//! bit with results computed here on the host from the same random bytes (plain index loops),
//! with every output poisoned first (random bytes, never zeros) so unwritten and wrongly
//! written bytes both show. The typed-error cases need CUDA tensors too, so every test is
//! GPU-gated: skipped without a GPU unless `KVIO_REQUIRE_GPU=1`.
//!
//! Building it needs nvcc (candle's CUDA kernels): `eval "$(scripts/candle-env)"` first, then
//! `cargo test --features candle --test gpu_candle`.
#![cfg(feature = "candle")]

use std::collections::HashMap;

use half::bf16;
use kvio::candle::candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use kvio::candle::CandleKvio;
use kvio::Error;
use kvio_suite::{assert_same, gpu_required, random_bytes, Rng};

/// kvio loaded for candle's CUDA device 0.
struct Rig {
    kv: CandleKvio,
    dev: Device,
}

fn skip<T>(test: &str, why: &str) -> Option<T> {
    if gpu_required() {
        panic!("{test}: KVIO_REQUIRE_GPU=1 but {why}");
    }
    kvio_suite::skipped(test, why);
    None
}

fn rig(test: &str) -> Option<Rig> {
    // cudarc panics when it cannot load a library at all; the stub makes it fail cleanly.
    let dev = match std::panic::catch_unwind(|| Device::new_cuda(0)) {
        Ok(Ok(dev)) => dev,
        Ok(Err(e)) => return skip(test, &format!("no usable CUDA device (candle: {e})")),
        Err(_) => return skip(test, "candle could not initialise CUDA"),
    };
    match CandleKvio::new(&dev) {
        Ok(kv) => Some(Rig { kv, dev }),
        Err(e) => skip(
            test,
            &format!("loading kvio into candle's context failed: {e}"),
        ),
    }
}

/// A tensor of `dtype` holding exactly `bytes` (little-endian element bits), on `dev`.
fn tensor(dtype: DType, bytes: &[u8], shape: &[usize], dev: &Device) -> Tensor {
    let shape = shape.to_vec();
    let cpu = match dtype {
        DType::BF16 => Tensor::from_vec(
            bytes
                .chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect::<Vec<_>>(),
            shape,
            &Device::Cpu,
        ),
        DType::F32 => Tensor::from_vec(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_bits(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect::<Vec<_>>(),
            shape,
            &Device::Cpu,
        ),
        DType::U8 => Tensor::from_vec(bytes.to_vec(), shape, &Device::Cpu),
        DType::I64 => Tensor::from_vec(
            bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect::<Vec<_>>(),
            shape,
            &Device::Cpu,
        ),
        DType::I32 => Tensor::from_vec(
            bytes
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                .collect::<Vec<_>>(),
            shape,
            &Device::Cpu,
        ),
        DType::F8E4M3 => Tensor::from_raw_buffer(bytes, dtype, &shape, &Device::Cpu),
        other => panic!("no test tensors of {other:?}"),
    }
    .expect("Tensor::from_vec");
    cpu.to_device(dev).expect("to_device")
}

/// The bytes of a tensor (row-major, little-endian element bits), read back through candle
/// (which orders the copy after the work on the device's stream).
fn bytes_of(t: &Tensor) -> Vec<u8> {
    let c = t
        .to_device(&Device::Cpu)
        .expect("to_device (a kernel fault shows here)")
        .flatten_all()
        .expect("flatten_all");
    match t.dtype() {
        DType::BF16 => c
            .to_vec1::<bf16>()
            .unwrap()
            .iter()
            .flat_map(|x| x.to_bits().to_le_bytes())
            .collect(),
        DType::F32 => c
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .flat_map(|x| x.to_bits().to_le_bytes())
            .collect(),
        DType::U8 => c.to_vec1::<u8>().unwrap(),
        DType::F8E4M3 => {
            let (st, _) = c.storage_and_layout();
            match &*st {
                Storage::Cpu(CpuStorage::F8E4M3(v)) => v.iter().map(|x| x.to_bits()).collect(),
                _ => panic!("not CPU fp8 storage"),
            }
        }
        other => panic!("no test read-back of {other:?}"),
    }
}

/// Slot tensor (`i64` or `i32`) from slot values.
fn slots_tensor(dtype: DType, slots: &[i64], dev: &Device) -> Tensor {
    let bytes: Vec<u8> = match dtype {
        DType::I64 => slots.iter().flat_map(|s| s.to_le_bytes()).collect(),
        DType::I32 => slots
            .iter()
            .flat_map(|&s| (s as i32).to_le_bytes())
            .collect(),
        other => panic!("{other:?}"),
    };
    tensor(dtype, &bytes, &[slots.len()], dev)
}

#[track_caller]
fn invalid_arg(r: kvio::Result<()>, want: &str) {
    match r {
        Err(Error::InvalidArgument { name, .. }) if name == want => {}
        other => panic!("want InvalidArgument naming `{want}`, got {other:?}"),
    }
}

#[test]
fn reshape_and_cache_matches_host_scatter() {
    let Some(rig) = rig("reshape_and_cache_matches_host_scatter") else {
        return;
    };
    let (t, hq, h, d, nb, bs) = (7usize, 2, 3, 16, 6, 4);
    let mut seed = 1;
    for dtype in [DType::BF16, DType::F32] {
        let e = dtype.size_in_bytes();
        for slot_dtype in [DType::I64, DType::I32] {
            // Both K and V as strided views of one packed qkv tensor (one launch), then V
            // contiguous (other strides than K: two launches).
            for packed_value in [true, false] {
                seed += 1;
                let heads = hq + 2 * h;
                let qkv_bytes = random_bytes(t * heads * d * e, seed);
                let qkv = tensor(dtype, &qkv_bytes, &[t, heads, d], &rig.dev);
                let key = qkv.narrow(1, hq, h).unwrap();
                let value = if packed_value {
                    qkv.narrow(1, hq + h, h).unwrap()
                } else {
                    qkv.narrow(1, hq + h, h).unwrap().contiguous().unwrap()
                };
                assert!(!key.is_contiguous());
                // The key cache is a view past one leading block of a larger tensor (a start
                // offset); poison = random bytes everywhere.
                let block = bs * h * d * e;
                let k_all0 = random_bytes((nb + 1) * block, seed + 100);
                let v0 = random_bytes(nb * block, seed + 200);
                let k_all = tensor(dtype, &k_all0, &[nb + 1, bs, h, d], &rig.dev);
                let key_cache = k_all.narrow(0, 1, nb).unwrap();
                let value_cache = tensor(dtype, &v0, &[nb, bs, h, d], &rig.dev);
                // T' = t - 1 slots (the last token is padding), distinct, one skipped.
                let mut all: Vec<i64> = (0..(nb * bs) as i64).collect();
                Rng::new(seed).shuffle(&mut all);
                let mut slots: Vec<i64> = all[..t - 1].to_vec();
                slots[2] = -1;
                let slot_mapping = slots_tensor(slot_dtype, &slots, &rig.dev);

                rig.kv
                    .reshape_and_cache(
                        &key,
                        &value,
                        None,
                        None,
                        &key_cache,
                        &value_cache,
                        &slot_mapping,
                    )
                    .unwrap();

                let (mut want_k, mut want_v) = (k_all0.clone(), v0.clone());
                let row = d * e;
                for (tok, &s) in slots.iter().enumerate() {
                    if s < 0 {
                        continue;
                    }
                    let (b, o) = (s as usize / bs, s as usize % bs);
                    for head in 0..h {
                        let kin = ((tok * heads + hq + head) * d) * e;
                        let vin = ((tok * heads + hq + h + head) * d) * e;
                        let at = ((b * bs + o) * h + head) * row;
                        want_k[block + at..block + at + row]
                            .copy_from_slice(&qkv_bytes[kin..kin + row]);
                        want_v[at..at + row].copy_from_slice(&qkv_bytes[vin..vin + row]);
                    }
                }
                let what = format!("{dtype:?} slots {slot_dtype:?} packed V {packed_value}");
                assert_same(&format!("key cache, {what}"), &bytes_of(&k_all), &want_k);
                assert_same(
                    &format!("value cache, {what}"),
                    &bytes_of(&value_cache),
                    &want_v,
                );
            }
        }
    }
}

/// mistral.rs' own layout: vLLM's v0 caches (key `[NB, H, D/x, bs, x]`, value `[NB, H, D,
/// bs]`), bf16 copied and bf16 quantized into F8E4M3 caches with `k_scale`/`v_scale` (per
/// tensor and per head), against kvio's CPU reference.
#[test]
fn reshape_and_cache_v0_and_fp8_match_reference() {
    use kvio::{reference, Fp8, PagedLayout, SrcType, TokenLayout};
    let Some(rig) = rig("reshape_and_cache_v0_and_fp8_match_reference") else {
        return;
    };
    let (t, h, d, nb, bs) = (37usize, 4, 64, 8, 16);
    let mut seed = 500;
    // (cache dtype, v0 layout, scales per head)
    for (cdt, v0, per_head) in [
        (DType::BF16, true, false),
        (DType::F8E4M3, true, false),
        (DType::F8E4M3, true, true),
        (DType::F8E4M3, false, false),
    ] {
        seed += 1;
        let ce = cdt.size_in_bytes();
        let input = TokenLayout::contiguous(t, h, d, 2);
        let (kb, vb) = (
            random_bytes(t * h * d * 2, seed),
            random_bytes(t * h * d * 2, seed + 1),
        );
        let key = tensor(DType::BF16, &kb, &[t, h, d], &rig.dev);
        let value = tensor(DType::BF16, &vb, &[t, h, d], &rig.dev);
        let (kl, vl, kshape, vshape) = if v0 {
            let x = 16 / ce;
            (
                PagedLayout::v0_key(nb, bs, h, d, ce),
                PagedLayout::v0_value(nb, bs, h, d, ce),
                vec![nb, h, d / x, bs, x],
                vec![nb, h, d, bs],
            )
        } else {
            let l = PagedLayout::nhd(nb, bs, h, d, ce);
            (l, l, vec![nb, bs, h, d], vec![nb, bs, h, d])
        };
        let len = nb * bs * h * d * ce;
        let (k0, v0b) = (random_bytes(len, seed + 2), random_bytes(len, seed + 3));
        let key_cache = tensor(cdt, &k0, &kshape, &rig.dev);
        let value_cache = tensor(cdt, &v0b, &vshape, &rig.dev);
        let mut all: Vec<i64> = (0..(nb * bs) as i64).collect();
        Rng::new(seed).shuffle(&mut all);
        let mut slots = all[..t].to_vec();
        slots[5] = -1;
        let slot_mapping = slots_tensor(DType::I64, &slots, &rig.dev);
        let n = if per_head { h } else { 1 };
        let ks: Vec<f32> = (0..n).map(|i| 0.05 + 0.3 * i as f32).collect();
        let vs: Vec<f32> = (0..n).map(|i| 1.7 - 0.2 * i as f32).collect();
        let (kst, vst) = (
            Tensor::new(ks.as_slice(), &rig.dev).unwrap(),
            Tensor::new(vs.as_slice(), &rig.dev).unwrap(),
        );
        let fp8 = cdt == DType::F8E4M3;
        let (ksc, vsc) = if fp8 {
            (Some(&kst), Some(&vst))
        } else {
            (None, None)
        };
        rig.kv
            .reshape_and_cache(
                &key,
                &value,
                ksc,
                vsc,
                &key_cache,
                &value_cache,
                &slot_mapping,
            )
            .unwrap();

        let (rk, rv, rin) = if fp8 {
            (
                reference::quantize_rows(&kb, &input, SrcType::Bf16, Fp8::E4m3, &ks),
                reference::quantize_rows(&vb, &input, SrcType::Bf16, Fp8::E4m3, &vs),
                TokenLayout::contiguous(t, h, d, 1),
            )
        } else {
            (kb.clone(), vb.clone(), input)
        };
        let (mut want_k, mut want_v) = (k0.clone(), v0b.clone());
        reference::update_slots(&rk, None, &rin, &mut want_k, 0, None, &kl, &slots);
        reference::update_slots(&rv, None, &rin, &mut want_v, 0, None, &vl, &slots);
        let what = format!("{cdt:?} v0 {v0} per-head {per_head}");
        assert_same(
            &format!("key cache, {what}"),
            &bytes_of(&key_cache),
            &want_k,
        );
        assert_same(
            &format!("value cache, {what}"),
            &bytes_of(&value_cache),
            &want_v,
        );
    }
}

/// `layers` K and V caches of `shape` (random bytes), their host copies.
fn caches(
    rig: &Rig,
    dtype: DType,
    shape: &[usize],
    layers: usize,
    seed: u64,
) -> (Vec<Tensor>, Vec<Vec<u8>>) {
    let n: usize = shape.iter().product::<usize>() * dtype.size_in_bytes();
    let host: Vec<Vec<u8>> = (0..2 * layers)
        .map(|i| random_bytes(n, seed + i as u64))
        .collect();
    let t = host
        .iter()
        .map(|b| tensor(dtype, b, shape, &rig.dev))
        .collect();
    (t, host)
}

/// Applies `src -> dsts` block copies to a host pool of `block`-byte blocks.
fn copy_host(pool: &mut [u8], block: usize, pairs: &[(usize, usize)]) {
    let before = pool.to_vec();
    for &(s, d) in pairs {
        pool[d * block..(d + 1) * block].copy_from_slice(&before[s * block..(s + 1) * block]);
    }
}

#[test]
fn copy_blocks_matches_host_copies_in_every_layer() {
    let Some(rig) = rig("copy_blocks_matches_host_copies_in_every_layer") else {
        return;
    };
    let (layers, nb, bs, h, d) = (3usize, 9, 4, 2, 16);
    // The flash layout, and mistral.rs' v0 layout (key 5-D, value 4-D): block copies do not
    // depend on the layout inside a block.
    let x = 8;
    let shapes: [(&[usize], &[usize]); 2] = [
        (&[nb, bs, h, d], &[nb, bs, h, d]),
        (&[nb, h, d / x, bs, x], &[nb, h, d, bs]),
    ];
    for (i, (k_shape, v_shape)) in shapes.into_iter().enumerate() {
        let dtype = DType::BF16;
        let block = bs * h * d * 2;
        let seed = 1000 * (i as u64 + 1);
        let (kt, mut kh) = caches(&rig, dtype, k_shape, layers, seed);
        let (vt, mut vh) = caches(&rig, dtype, v_shape, layers, seed + 500);
        let (kt, vt) = (&kt[..layers], &vt[..layers]);
        let (kh, vh) = (&mut kh[..layers], &mut vh[..layers]);
        let k: Vec<&Tensor> = kt.iter().collect();
        let v: Vec<&Tensor> = vt.iter().collect();
        // One source to two destinations, another to one; then a second call on the same
        // caches (the pointer table is reused).
        let calls: [HashMap<usize, Vec<usize>>; 2] = [
            HashMap::from([(2, vec![5, 7]), (0, vec![3])]),
            HashMap::from([(6, vec![1, 8]), (4, vec![4])]), // 4 -> 4 is a no-op
        ];
        for map in &calls {
            rig.kv.copy_blocks(&k, &v, map).unwrap();
            let pairs: Vec<(usize, usize)> = map
                .iter()
                .flat_map(|(&s, ds)| ds.iter().map(move |&d| (s, d)))
                .collect();
            for l in 0..layers {
                copy_host(&mut kh[l], block, &pairs);
                copy_host(&mut vh[l], block, &pairs);
            }
            for l in 0..layers {
                assert_same(&format!("shape {i}, K layer {l}"), &bytes_of(k[l]), &kh[l]);
                assert_same(&format!("shape {i}, V layer {l}"), &bytes_of(v[l]), &vh[l]);
            }
        }
    }
    // Other caches (the table is rebuilt), of f32, as views with a start offset.
    let (all, mut host) = caches(&rig, DType::F32, &[nb + 2, bs, h, d], 1, 77);
    let block = bs * h * d * 4;
    let views: Vec<Tensor> = all.iter().map(|t| t.narrow(0, 2, nb).unwrap()).collect();
    let map = HashMap::from([(1, vec![0, 2, 3])]);
    rig.kv
        .copy_blocks(&[&views[0]], &[&views[1]], &map)
        .unwrap();
    for (i, t) in all.iter().enumerate() {
        copy_host(&mut host[i][2 * block..], block, &[(1, 0), (1, 2), (1, 3)]);
        assert_same(&format!("f32 view cache {i}"), &bytes_of(t), &host[i]);
    }
}

#[test]
fn swap_blocks_gpu_to_gpu_and_cpu_to_gpu() {
    let Some(rig) = rig("swap_blocks_gpu_to_gpu_and_cpu_to_gpu") else {
        return;
    };
    let (bs, h, d) = (4usize, 2, 32);
    for dtype in [DType::BF16, DType::F32] {
        let e = dtype.size_in_bytes();
        let block = bs * h * d * e;
        let (n_src, n_dst) = (5usize, 9usize);
        let src0 = random_bytes(n_src * block, 5);
        let dst0 = random_bytes(n_dst * block, 6);
        let map = HashMap::from([(1, 0), (4, 2), (3, 3), (0, 8)]);
        let pairs: Vec<(usize, usize)> = map.iter().map(|(&s, &d)| (s, d)).collect();
        let mut want = dst0.clone();
        for &(s, d) in &pairs {
            want[d * block..(d + 1) * block].copy_from_slice(&src0[s * block..(s + 1) * block]);
        }
        // GPU -> GPU.
        let src = tensor(dtype, &src0, &[n_src, bs, h, d], &rig.dev);
        let dst = tensor(dtype, &dst0, &[n_dst, bs, h, d], &rig.dev);
        rig.kv.swap_blocks(&src, &dst, &map).unwrap();
        assert_same(&format!("{dtype:?} GPU -> GPU"), &bytes_of(&dst), &want);
        assert_same(&format!("{dtype:?} GPU source"), &bytes_of(&src), &src0);
        // CPU -> GPU (runs of consecutive blocks merged: 0..3 -> 1..4), into a view.
        let cpu = tensor(dtype, &src0, &[n_src, bs, h, d], &Device::Cpu);
        let dst_all0 = random_bytes((n_dst + 1) * block, 7);
        let dst_all = tensor(dtype, &dst_all0, &[n_dst + 1, bs, h, d], &rig.dev);
        let dst_view = dst_all.narrow(0, 1, n_dst).unwrap();
        let map = HashMap::from([(0, 1), (1, 2), (2, 3), (4, 7)]);
        rig.kv.swap_blocks(&cpu, &dst_view, &map).unwrap();
        let mut want = dst_all0.clone();
        for (&s, &d) in &map {
            let at = (d + 1) * block;
            want[at..at + block].copy_from_slice(&src0[s * block..(s + 1) * block]);
        }
        assert_same(&format!("{dtype:?} CPU -> GPU"), &bytes_of(&dst_all), &want);
    }
}

#[test]
fn bad_arguments_are_typed_errors_and_write_nothing() {
    let Some(rig) = rig("bad_arguments_are_typed_errors_and_write_nothing") else {
        return;
    };
    let dev = &rig.dev;
    let (t, h, d, nb, bs) = (3usize, 2, 16, 4, 4);
    let bf = DType::BF16;
    let key = tensor(bf, &random_bytes(t * h * d * 2, 1), &[t, h, d], dev);
    let value = tensor(bf, &random_bytes(t * h * d * 2, 2), &[t, h, d], dev);
    let kc0 = random_bytes(nb * bs * h * d * 2, 3);
    let vc0 = random_bytes(nb * bs * h * d * 2, 4);
    let kc = tensor(bf, &kc0, &[nb, bs, h, d], dev);
    let vc = tensor(bf, &vc0, &[nb, bs, h, d], dev);
    let slots = slots_tensor(DType::I64, &[0, 5, 9], dev);
    let scale = Tensor::new(&[1f32], dev).unwrap();
    let rc = |k: &Tensor, v: &Tensor, kc: &Tensor, vc: &Tensor, s: &Tensor| {
        rig.kv.reshape_and_cache(k, v, None, None, kc, vc, s)
    };

    invalid_arg(
        rig.kv
            .reshape_and_cache(&key, &value, Some(&scale), None, &kc, &vc, &slots),
        "k_scale",
    );
    invalid_arg(
        rig.kv
            .reshape_and_cache(&key, &value, None, Some(&scale), &kc, &vc, &slots),
        "v_scale",
    );
    // vLLM's v0 layout: a key cache [NB, H, D/x, bs, x] with x not 16 bytes, a value cache
    // of the wrong shape, an fp8 cache without scales.
    let v0_key_x4 = tensor(bf, &kc0, &[nb, h, d / 4, bs, 4], dev);
    let v0_value = tensor(bf, &vc0, &[nb, h, d, bs], dev);
    invalid_arg(rc(&key, &value, &v0_key_x4, &v0_value, &slots), "key_cache");
    let v0_key = tensor(bf, &kc0, &[nb, h, d / 8, bs, 8], dev);
    let v0_value_bad = tensor(bf, &vc0, &[nb, h, bs, d], dev);
    invalid_arg(
        rc(&key, &value, &v0_key, &v0_value_bad, &slots),
        "value_cache",
    );
    let f8 = |b: &[u8], shape: &[usize]| tensor(DType::F8E4M3, &b[..b.len() / 2], shape, dev);
    let (kc8, vc8) = (f8(&kc0, &[nb, bs, h, d]), f8(&vc0, &[nb, bs, h, d]));
    invalid_arg(rc(&key, &value, &kc8, &vc8, &slots), "k_scale");
    // dtypes
    let value_f32 = value.to_dtype(DType::F32).unwrap();
    invalid_arg(rc(&key, &value_f32, &kc, &vc, &slots), "value");
    let vc_f32 = vc.to_dtype(DType::F32).unwrap();
    invalid_arg(rc(&key, &value, &kc, &vc_f32, &slots), "value_cache");
    let key_f64 = key.to_dtype(DType::F64).unwrap();
    invalid_arg(rc(&key_f64, &key_f64, &kc, &vc, &slots), "key");
    // shapes
    let narrow_kc = kc.narrow(2, 0, 1).unwrap(); // one head, key has two
    let narrow_vc = vc.narrow(2, 0, 1).unwrap();
    invalid_arg(
        rc(&key, &value, &narrow_kc, &narrow_vc, &slots),
        "key_cache",
    );
    invalid_arg(
        rc(&key, &value.narrow(0, 0, 2).unwrap(), &kc, &vc, &slots),
        "value",
    );
    invalid_arg(
        rc(&key, &value, &kc, &vc.narrow(0, 0, 2).unwrap(), &slots),
        "value_cache",
    );
    let flat = key.reshape((t, h * d)).unwrap();
    invalid_arg(rc(&flat, &flat, &kc, &vc, &slots), "key");
    // slot mappings: u32, too long, 2-D, strided
    let u32_slots = Tensor::new(&[0u32, 1, 2], dev).unwrap();
    invalid_arg(rc(&key, &value, &kc, &vc, &u32_slots), "slot_mapping");
    let long = slots_tensor(DType::I64, &[0, 1, 2, 3], dev);
    invalid_arg(rc(&key, &value, &kc, &vc, &long), "slot_mapping");
    let two_d = slots_tensor(DType::I64, &[0, 1, 2, 3, 4, 5], dev)
        .reshape((3, 2))
        .unwrap();
    invalid_arg(rc(&key, &value, &kc, &vc, &two_d), "slot_mapping");
    let strided = two_d.narrow(1, 0, 1).unwrap().squeeze(1).unwrap();
    invalid_arg(rc(&key, &value, &kc, &vc, &strided), "slot_mapping");
    // a CPU tensor among CUDA ones
    let cpu_key = key.to_device(&Device::Cpu).unwrap();
    invalid_arg(rc(&cpu_key, &value, &kc, &vc, &slots), "key");
    // innermost dimension not contiguous
    let kt = kc.transpose(2, 3).unwrap(); // [nb, bs, d, h] view
    let vt = vc.transpose(2, 3).unwrap();
    let key_t = tensor(bf, &random_bytes(t * d * h * 2, 9), &[t, d, h], dev);
    invalid_arg(rc(&key_t, &key_t, &kt, &vt, &slots), "key_cache");
    let key_tt = key_t.transpose(1, 2).unwrap(); // [t, h, d] view, last stride h
    invalid_arg(rc(&key_tt, &key_tt, &kc, &vc, &slots), "key");

    // copy_blocks
    let cb = |m: HashMap<usize, Vec<usize>>| rig.kv.copy_blocks(&[&kc], &[&vc], &m);
    assert!(matches!(
        cb(HashMap::from([(nb, vec![0])])),
        Err(Error::IndexOutOfRange {
            name: "map.src",
            ..
        })
    ));
    assert!(matches!(
        cb(HashMap::from([(0, vec![nb])])),
        Err(Error::IndexOutOfRange {
            name: "map.dst",
            ..
        })
    ));
    assert!(matches!(
        cb(HashMap::from([(0, vec![2]), (1, vec![2])])),
        Err(Error::Overlap { .. })
    ));
    assert!(matches!(
        cb(HashMap::from([(0, vec![1]), (1, vec![2])])),
        Err(Error::Overlap { .. })
    ));
    invalid_arg(
        rig.kv
            .copy_blocks(&[&kc], &[], &HashMap::from([(0, vec![1])])),
        "value_caches",
    );
    invalid_arg(
        rig.kv
            .copy_blocks(&[&kc], &[&vc_f32], &HashMap::from([(0, vec![1])])),
        "value_caches",
    );
    let small = vc.narrow(0, 0, 2).unwrap();
    invalid_arg(
        rig.kv
            .copy_blocks(&[&kc], &[&small], &HashMap::from([(0, vec![1])])),
        "value_caches",
    );

    // swap_blocks
    let cpu_cache = kc.to_device(&Device::Cpu).unwrap();
    invalid_arg(
        rig.kv
            .swap_blocks(&kc, &cpu_cache, &HashMap::from([(0, 0)])),
        "dst",
    );
    invalid_arg(
        rig.kv
            .swap_blocks(&kc, &narrow_vc, &HashMap::from([(0, 0)])),
        "dst",
    );
    invalid_arg(
        rig.kv.swap_blocks(&kc, &vc_f32, &HashMap::from([(0, 0)])),
        "dst",
    );
    assert!(matches!(
        rig.kv
            .swap_blocks(&kc, &vc, &HashMap::from([(0, 1), (1, 1)])),
        Err(Error::Overlap { .. })
    ));
    assert!(matches!(
        rig.kv
            .swap_blocks(&cpu_cache, &vc, &HashMap::from([(0, nb)])),
        Err(Error::IndexOutOfRange {
            name: "map.dst",
            ..
        })
    ));
    assert!(matches!(
        rig.kv
            .swap_blocks(&cpu_cache, &vc, &HashMap::from([(0, 1), (1, 1)])),
        Err(Error::Overlap { .. })
    ));

    // Nothing of the refused calls reached the caches.
    assert_same("key cache", &bytes_of(&kc), &kc0);
    assert_same("value cache", &bytes_of(&vc), &vc0);
}
