//! The benchmarks' baselines must copy correctly too: the naive one-thread-per-element kernel
//! against a host-side copy of the same spans; the spin yardstick (group `concurrent`) must
//! compute and store every thread's value.

use kvio::{DeviceBytes, StreamRef};
use kvio_suite::{assert_same, download, gpu, random_bytes, upload, Rng};

#[test]
fn naive_spans_kernel_copies_listed_spans() {
    let Some(g) = gpu("naive baseline") else {
        return;
    };
    let stream = g.stream();
    for (elem, span_bytes, n) in [
        (2usize, 2048usize, 2usize),
        (1, 64, 1000),
        (4, 4096, 300),
        (2, 2, 1),
    ] {
        let src_h = random_bytes(span_bytes * n, 1);
        let dst_h = random_bytes(span_bytes * n * 2, 2);
        let src = upload(&src_h);
        let dst = upload(&dst_h);
        let mut order: Vec<usize> = (0..2 * n).collect();
        Rng::new(3).shuffle(&mut order);
        let spans: Vec<u64> = (0..n)
            .flat_map(|i| {
                [
                    src.as_device_ptr().as_raw() + (i * span_bytes) as u64,
                    dst.as_device_ptr().as_raw() + (order[i] * span_bytes) as u64,
                ]
            })
            .collect();
        let table = upload(&spans);
        // SAFETY: every span lies inside `src` and `dst`.
        unsafe {
            g.kv.bench_naive_spans(
                DeviceBytes::of(&table),
                n as u64,
                (span_bytes / elem) as u64,
                elem as u32,
                StreamRef::from(&stream),
            )
        }
        .unwrap();
        let mut want = dst_h.clone();
        for i in 0..n {
            let d = order[i] * span_bytes;
            want[d..d + span_bytes].copy_from_slice(&src_h[i * span_bytes..(i + 1) * span_bytes]);
        }
        assert_same(
            &format!("naive elem={elem} span={span_bytes} n={n}"),
            &download(&dst, &stream),
            &want,
        );
    }
}

/// The spin yardstick stores each thread's chain value at the thread's index, bit for bit the
/// CPU's (`ops::spin_value`; the PTX multiplies and adds without fusing), over a NaN-poisoned
/// buffer with a tail it must not touch; a buffer too short for the grid is refused.
#[test]
fn spin_yardstick_stores_every_threads_value() {
    let Some(g) = gpu("spin yardstick") else {
        return;
    };
    let stream = g.stream();
    let (grid, block, iters) = (5u32, 256u32, 10_000u32);
    let threads = (grid * block) as usize;
    let poison: Vec<u8> = (0..threads + 16)
        .flat_map(|i| f32::from_bits(0x7FC0_0000 | i as u32).to_le_bytes())
        .collect();
    let mut out = upload(&poison);
    g.kv.bench_spin(
        kvio::DeviceBytesMut::of(&mut out),
        iters,
        grid,
        block,
        StreamRef::from(&stream),
    )
    .unwrap();
    let got = download(&out, &stream);
    let mut want: Vec<u8> = (0..threads)
        .flat_map(|t| kvio_kernels::ops::spin_value(t as u64, iters).to_le_bytes())
        .collect();
    want.extend_from_slice(&poison[4 * threads..]);
    assert_same("spin outputs", &got, &want);
    let mut short = upload(&vec![0u8; 4 * threads - 4]);
    let r = g.kv.bench_spin(
        kvio::DeviceBytesMut::of(&mut short),
        iters,
        grid,
        block,
        StreamRef::from(&stream),
    );
    assert!(
        matches!(r, Err(kvio::Error::BufferTooSmall { .. })),
        "{r:?}"
    );
}

#[test]
fn empty_kernel_launches() {
    let Some(g) = gpu("noop") else { return };
    let stream = g.stream();
    for _ in 0..1000 {
        g.kv.bench_noop(StreamRef::from(&stream)).unwrap();
    }
    stream.synchronize().unwrap();
}

/// Many queued launches of each kernel (as the benchmarks issue them) complete.
#[test]
#[ignore = "long; run explicitly"]
fn many_queued_launches() {
    let Some(g) = gpu("many launches") else {
        return;
    };
    let stream = g.stream();
    let src = upload(&random_bytes(4096, 1));
    let dst = upload(&random_bytes(8192, 2));
    let (s0, d0) = (src.as_device_ptr().as_raw(), dst.as_device_ptr().as_raw());
    let spans = upload(&[s0, d0, s0 + 2048, d0 + 4096]);
    let which = std::env::var("KVIO_MANY").unwrap_or_default();
    let n: usize = std::env::var("KVIO_MANY_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8192);
    let mut cache = upload(&random_bytes(64 * 16 * 2048, 3));
    let key = upload(&random_bytes(2048, 4));
    let slots = upload(&[5i64]);
    let op = kvio::SlotUpdate {
        key: kvio::CacheWrite {
            src: DeviceBytes::of(&key),
            dst: kvio::DeviceBytesMut::of(&mut cache),
        },
        value: None,
        input: kvio::TokenLayout::contiguous(1, 8, 128, 2),
        cache: kvio::PagedLayout::nhd(64, 16, 8, 128, 2),
        value_layout: None,
        slots: kvio::SlotMapping::I64(DeviceBytes::of(&slots)),
        errors: None,
        quantize: None,
    };
    let rounds: u32 = std::env::var("KVIO_MANY_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for round in 0..rounds {
        for _ in 0..(n << round) {
            match which.as_str() {
                "noop" => g.kv.bench_noop(StreamRef::from(&stream)).unwrap(),
                "slots" => g.kv.update_slots(&op, StreamRef::from(&stream)).unwrap(),
                // SAFETY: spans inside src/dst.
                _ => unsafe {
                    g.kv.bench_naive_spans(
                        DeviceBytes::of(&spans),
                        2,
                        1024,
                        2,
                        StreamRef::from(&stream),
                    )
                }
                .unwrap(),
            }
        }
        stream.synchronize().unwrap();
        eprintln!("{which}: round {round}: {} launches ok", n << round);
    }
}
