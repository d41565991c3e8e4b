//! Offload and onload at the same time, on two non-blocking streams: stream A offloads some
//! blocks of a GPU pool into a pinned host pool while stream B onloads other blocks of that host
//! pool into other blocks of the GPU pool, both released by one event and synchronised only at
//! the end. Every pairing of backends (kernel + kernel on small CTA budgets, DMA + DMA, kernel +
//! DMA both ways, kernel + kernel with host maps through kvio's scratch from both streams at
//! once), several layouts, random data, poisoned destinations; both pools compared byte for
//! byte with the CPU reference. Skips without a GPU unless `KVIO_REQUIRE_GPU=1`.
//!
//! The two copies touch disjoint blocks (the offload reads GPU blocks `0..n/2` and writes host
//! blocks `0..n/2`; the onload reads host blocks `n/2..n` and writes GPU blocks `n/2..n`), so
//! the expected contents do not depend on how they interleave.

use kvio::reference;
use kvio::{Backend, BlockCopy, BlockMap, DeviceBytes, DeviceErrors, Event, Stream, StreamRef};
use kvio_suite::{assert_same, gpu, random_bytes, upload, Kind, Rng, Shape, TestPool};

/// How one direction is asked for.
#[derive(Clone, Copy, Debug, PartialEq)]
enum How {
    /// Kernel backend, device map, this many CTAs at most.
    Kernel(u32),
    /// Kernel backend, host map, no staging (the map goes through kvio's scratch).
    KernelScratch(u32),
    /// DMA backend, host map.
    Dma,
}

/// (offload, onload) pairings: the bench's kernel budgets (2 + 4 CTAs), the copy engines,
/// both mixes, and both streams taking kvio's scratch at once.
const PAIRINGS: [(How, How); 5] = [
    (How::Kernel(2), How::Kernel(4)),
    (How::Dma, How::Dma),
    (How::Kernel(2), How::Dma),
    (How::Dma, How::Kernel(4)),
    (How::KernelScratch(2), How::KernelScratch(4)),
];

/// (GPU pool, host pool) layouts: vLLM-style layer-separate caches with SGLang's layer-first
/// host pool, cross-layer on both sides, and conversions on the way (HND caches to and from
/// cross-layer blocks).
const LAYOUTS: [(Kind, Kind); 4] = [
    (Kind::SepNhd, Kind::LayerFirst),
    (Kind::CrossNhd, Kind::CrossNhd),
    (Kind::SepHnd, Kind::CrossNhd),
    (Kind::CrossHnd, Kind::LayerFirst),
];

/// `hi - lo` pairs from blocks `lo..hi` to distinct blocks `lo..hi` (shuffled), sources random
/// (repeats allowed), one in 10 padding `[-1, -1]`.
fn pairs_within(lo: usize, hi: usize, rng: &mut Rng) -> Vec<[i64; 2]> {
    let mut dsts: Vec<i64> = (lo as i64..hi as i64).collect();
    rng.shuffle(&mut dsts);
    dsts.into_iter()
        .map(|d| {
            if rng.below(10) == 0 {
                [-1, -1]
            } else {
                [(lo as u64 + rng.below((hi - lo) as u64)) as i64, d]
            }
        })
        .collect()
}

/// The offload's pairs (GPU blocks `0..n/2` to host blocks `0..n/2`) and the onload's (host
/// blocks `n/2..n` to GPU blocks `n/2..n`) of a case.
fn case_pairs(s: Shape, seed: u64) -> (Vec<[i64; 2]>, Vec<[i64; 2]>) {
    let mut rng = Rng::new(seed);
    let half = s.blocks / 2;
    (
        pairs_within(0, half, &mut rng),
        pairs_within(half, s.blocks, &mut rng),
    )
}

/// The copy of `pairs` from `src` to `dst` asked for as `how`.
fn op<'a>(
    src: &'a TestPool,
    dst: &'a TestPool,
    pairs: &'a [[i64; 2]],
    map: &'a kvio::cust::memory::DeviceBuffer<i64>,
    how: How,
    errors: &'a DeviceErrors,
) -> BlockCopy<'a> {
    let base = BlockCopy::new(src.pool(), dst.pool(), BlockMap::Host(pairs));
    match how {
        How::Kernel(ctas) => BlockCopy {
            map: BlockMap::Device {
                pairs: DeviceBytes::of(map),
                len: pairs.len(),
            },
            ..base.backend(Backend::Kernel).max_ctas(ctas)
        },
        How::KernelScratch(ctas) => base.backend(Backend::Kernel).max_ctas(ctas),
        How::Dma => base.backend(Backend::Dma),
    }
    .errors(errors)
}

/// Milliseconds from `from` to `to` (both completed).
fn ms(from: &Event, to: &Event) -> f32 {
    to.elapsed_ms(from).expect("cuEventElapsedTime")
}

/// Runs one offload + onload pair at once and checks both pools. Returns how long each stream
/// took from the common start, in ms (for the log; not asserted).
fn run_case(
    g: &kvio_suite::Gpu,
    (a, b): (&Stream, &Stream),
    s: Shape,
    (dev_kind, host_kind): (Kind, Kind),
    (off_how, on_how): (How, How),
    seed: u64,
) -> (f32, f32) {
    let name = format!(
        "{dev_kind:?}(gpu) <-> {host_kind:?}(host), offload {off_how:?} + onload {on_how:?}"
    );
    let (dev, dev_init) = TestPool::random(dev_kind, false, s, seed);
    let (host, host_init) = TestPool::random(host_kind, true, s, seed ^ 0x5EED);
    assert_ne!(dev_init, host_init);
    let (off_pairs, on_pairs) = case_pairs(s, seed);
    let flat = |p: &[[i64; 2]]| upload(&p.iter().flatten().copied().collect::<Vec<i64>>());
    let (off_map, on_map) = (flat(&off_pairs), flat(&on_pairs));
    let (off_err, on_err) = (DeviceErrors::new().unwrap(), DeviceErrors::new().unwrap());
    off_err.reset(a.sref()).unwrap();
    on_err.reset(b.sref()).unwrap();
    let offload = op(&dev, &host, &off_pairs, &off_map, off_how, &off_err);
    let onload = op(&host, &dev, &on_pairs, &on_map, on_how, &on_err);

    // One start for both streams; each stream's end recorded after its copy.
    let (go, a_end, b_end) = (
        Event::new().unwrap(),
        Event::new().unwrap(),
        Event::new().unwrap(),
    );
    go.record(a.sref()).unwrap();
    go.wait_on(b.sref()).unwrap();
    g.kv.copy_blocks(&offload, StreamRef::from(a))
        .unwrap_or_else(|e| panic!("{name}: offload: {e}"));
    g.kv.copy_blocks(&onload, StreamRef::from(b))
        .unwrap_or_else(|e| panic!("{name}: onload: {e}"));
    a_end.record(a.sref()).unwrap();
    b_end.record(b.sref()).unwrap();
    a.synchronize()
        .unwrap_or_else(|e| panic!("{name}: stream A: {e}"));
    b.synchronize()
        .unwrap_or_else(|e| panic!("{name}: stream B: {e}"));

    let mut want_host = host_init.clone();
    let off_counts = reference::copy_blocks(
        &dev.image(),
        &dev_init,
        &host.image(),
        &mut want_host,
        &off_pairs,
    );
    let mut want_dev = dev_init.clone();
    let on_counts = reference::copy_blocks(
        &host.image(),
        &host_init,
        &dev.image(),
        &mut want_dev,
        &on_pairs,
    );
    // The reference must have changed both pools, or the comparison proves nothing.
    assert_ne!(want_host, host_init, "{name}: offload changes nothing");
    assert_ne!(want_dev, dev_init, "{name}: onload changes nothing");
    assert_same(&format!("{name}: host pool"), &host.mem.read(), &want_host);
    assert_same(&format!("{name}: GPU pool"), &dev.mem.read(), &want_dev);
    assert_eq!(
        off_err.read(a.sref()).unwrap(),
        off_counts,
        "{name}: offload's error word"
    );
    assert_eq!(
        on_err.read(b.sref()).unwrap(),
        on_counts,
        "{name}: onload's error word"
    );
    (ms(&go, &a_end), ms(&go, &b_end))
}

/// Every pairing of backends on every layout pair, one mid-size shape (16 MiB per pool, 8 MiB
/// moved each way).
#[test]
fn offload_and_onload_at_once_every_pairing() {
    let Some(g) = gpu("concurrent offload + onload") else {
        return;
    };
    let (a, b) = (g.stream(), g.stream());
    assert!(a.is_non_blocking().unwrap() && b.is_non_blocking().unwrap());
    let s = Shape {
        blocks: 64,
        layers: 4,
        bs: 16,
        heads: 8,
        dim: 128,
        elem: 2,
    };
    let mut n = 0u64;
    for layouts in LAYOUTS {
        for pairing in PAIRINGS {
            let (ta, tb) = run_case(g, (&a, &b), s, layouts, pairing, 100 + n);
            eprintln!(
                "{layouts:?} {pairing:?}: offload done {ta:.3} ms, onload done {tb:.3} ms after the common start"
            );
            n += 1;
        }
    }
    assert_eq!(n, (LAYOUTS.len() * PAIRINGS.len()) as u64);
}

/// Page sizes 1 and 256 (spans of one token, and of whole large pages) and an MLA-like single
/// 576-wide head, kernel + kernel and DMA + DMA.
#[test]
fn offload_and_onload_at_once_page_sizes() {
    let Some(g) = gpu("concurrent offload + onload") else {
        return;
    };
    let (a, b) = (g.stream(), g.stream());
    for (i, (bs, heads, dim)) in [(1usize, 8usize, 128usize), (256, 2, 64), (16, 1, 576)]
        .into_iter()
        .enumerate()
    {
        let s = Shape {
            blocks: 32,
            layers: 3,
            bs,
            heads,
            dim,
            elem: 2,
        };
        for (j, pairing) in [PAIRINGS[0], PAIRINGS[1]].into_iter().enumerate() {
            let layouts = LAYOUTS[(i + j) % LAYOUTS.len()];
            run_case(g, (&a, &b), s, layouts, pairing, 500 + (2 * i + j) as u64);
        }
    }
}

/// On the CPU (kvio's emulation of both backends, strided pools): the two copies of a case
/// touch disjoint blocks, so either order gives what the reference computes from the initial
/// pools: what the GPU tests rely on when they let the copies interleave.
#[test]
fn the_two_copies_commute() {
    let s = Shape {
        blocks: 16,
        layers: 2,
        bs: 4,
        heads: 2,
        dim: 32,
        elem: 2,
    };
    for (i, (dev_kind, host_kind)) in [
        (Kind::CrossNhd, Kind::CrossNhd),
        (Kind::CrossHnd, Kind::LayerFirst),
    ]
    .into_iter()
    .enumerate()
    {
        let (off_pairs, on_pairs) = case_pairs(s, 7 + i as u64);
        let (dev_init, host_init) = (random_bytes(s.bytes(), 1), random_bytes(s.bytes(), 2));
        let mut want_host = host_init.clone();
        let (di, hi) = (s.image(dev_kind), s.image(host_kind));
        reference::copy_blocks(&di, &dev_init, &hi, &mut want_host, &off_pairs);
        let mut want_dev = dev_init.clone();
        reference::copy_blocks(&hi, &host_init, &di, &mut want_dev, &on_pairs);
        for backend in [Backend::Kernel, Backend::Dma] {
            for offload_first in [true, false] {
                let (mut dev, mut host) = (dev_init.clone(), host_init.clone());
                let view = |v: &mut Vec<u8>| {
                    // SAFETY: host memory that outlives the (synchronous) emulated calls below;
                    // only they touch it until the comparison.
                    unsafe { kvio::DeviceBytesMut::from_raw(v.as_mut_ptr() as u64, v.len()) }
                };
                let (dv, hv) = (view(&mut dev), view(&mut host));
                let (dv2, hv2) = (view(&mut dev), view(&mut host));
                let off = BlockCopy::new(
                    s.pool(dev_kind, dv),
                    s.pool(host_kind, hv),
                    BlockMap::Host(&off_pairs),
                )
                .backend(backend);
                let on = BlockCopy::new(
                    s.pool(host_kind, hv2),
                    s.pool(dev_kind, dv2),
                    BlockMap::Host(&on_pairs),
                )
                .backend(backend);
                let order = if offload_first {
                    [&off, &on]
                } else {
                    [&on, &off]
                };
                for op in order {
                    // SAFETY: every view is live host memory of its length.
                    unsafe { kvio::emulate::copy_blocks(op) }.unwrap();
                }
                let name =
                    format!("{dev_kind:?}/{host_kind:?} {backend:?} offload first {offload_first}");
                assert_same(&format!("{name}: host pool"), &host, &want_host);
                assert_same(&format!("{name}: GPU pool"), &dev, &want_dev);
            }
        }
    }
}

/// The random data is what the test thinks it is: never all zeros, different per seed.
#[test]
fn test_data_is_random() {
    let (x, y) = (random_bytes(4096, 1), random_bytes(4096, 2));
    assert!(x.iter().any(|&v| v != 0) && x != y);
}
