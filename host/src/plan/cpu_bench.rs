//! CPU micro-benchmark of the planners (`cargo test -p kvio --release --lib plan_time --
//! --ignored --nocapture`): host nanoseconds, heap allocations and memory-kind queries per
//! plan of every operation, no GPU needed. The addresses are descriptions only (never
//! dereferenced); memory kinds come from a stand-in for `cuPointerGetAttributes` that counts
//! its calls. "plan+pack" adds what the runner does on the CPU before its driver call: the
//! kernel's argument words packed into the launch buffer ([`Params`]). The driver calls the
//! runner then makes are listed in `run.rs` (and in BENCHMARKS.md, group `host`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::time::Instant;

use crate::alloc::MemoryKind;
use crate::blocks::{self, Backend, BlockCopy, BlockMap, BlockPool};
use crate::launch::GridCap;
use crate::layout::{PagedLayout, TokenLayout};
use crate::mem::{DeviceBytes, DeviceBytesMut};
use crate::plan::{Plan, Target};
use crate::write::{plan as write_plan, Fp8, MlaUpdate, Quantize, Scale, SliceUpdate};
use crate::write::{SlotMapping, SlotUpdate, SrcType};

thread_local! {
    /// Heap allocations made by this thread (the counting allocator below).
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    /// Memory-kind queries made by this thread's planners.
    static KIND_QUERIES: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting each thread's allocations (the lib's unit-test binary only).
struct Counting;

// SAFETY: forwards to the system allocator unchanged; the counter is a const-initialised
// thread-local `Cell` (no allocation, no reentrancy).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Pinned host memory of the stand-in classifier starts here; device memory below.
const HOST_FROM: u64 = 0x10_0000_0000;

fn kind_of(ptr: u64) -> MemoryKind {
    KIND_QUERIES.with(|c| c.set(c.get() + 1));
    if ptr >= HOST_FROM {
        MemoryKind::PinnedHost
    } else {
        MemoryKind::Device
    }
}

fn target(batched_dma: bool) -> Target<'static> {
    Target {
        caps: GridCap::uniform(132 * 4),
        kind_of: &kind_of,
        scratch: true,
        batched_dma,
    }
}

fn bytes(ptr: u64, len: usize) -> DeviceBytes<'static> {
    // SAFETY: descriptions only, never dereferenced.
    unsafe { DeviceBytes::from_raw(ptr, len) }
}

fn bytes_mut(ptr: u64, len: usize) -> DeviceBytesMut<'static> {
    // SAFETY: as above.
    unsafe { DeviceBytesMut::from_raw(ptr, len) }
}

/// The runner's CPU work before its driver call: the argument words packed.
fn pack(plan: &Plan<'_>) -> usize {
    match plan {
        Plan::Kernel { launch, .. } => {
            black_box(&launch.kernel.params());
            1
        }
        Plan::Expand { expand, update, .. } => {
            black_box(&expand.kernel.params());
            black_box(&update.map(|u| u.kernel.params()));
            1 + update.is_some() as usize
        }
        Plan::Dma(spans) => spans.len(),
        Plan::Nothing => 0,
    }
}

/// Fastest of 41 rounds (the least disturbed by other work on the machine) of ns per call of
/// `f`, and its allocations and kind queries per call.
fn time(name: &str, mut f: impl FnMut() -> usize) {
    const ITERS: u64 = 4_000;
    let mut best = f64::INFINITY;
    let (a0, k0) = (ALLOCS.with(Cell::get), KIND_QUERIES.with(Cell::get));
    black_box(f());
    let (allocs, kinds) = (
        ALLOCS.with(Cell::get) - a0,
        KIND_QUERIES.with(Cell::get) - k0,
    );
    for _ in 0..41 {
        let t0 = Instant::now();
        for _ in 0..ITERS {
            black_box(f());
        }
        best = best.min(t0.elapsed().as_nanos() as f64 / ITERS as f64);
    }
    println!("{name:<56} {best:>9.1} ns {allocs:>7} allocs {kinds:>4} kind queries");
}

#[test]
#[ignore = "a benchmark: run with --release --ignored --nocapture"]
fn plan_time() {
    let (t, h, d) = (16usize, 8usize, 128usize);
    println!(
        "{:<44} {:>12} (per call, T = {t}, H = {h}, D = {d})",
        "plan", "time"
    );
    // Write path.
    let cache = PagedLayout::nhd(16, 16, h, d, 2);
    let input = TokenLayout::contiguous(t, h, d, 2);
    let (src, ext) = (t * h * d * 2, cache.extent("c").unwrap() as usize);
    let nhd = SlotUpdate::new(
        bytes(0x1000_0000, src),
        input,
        bytes_mut(0x4000_0000, ext),
        cache,
        SlotMapping::I64(bytes(0x3000_0000, t * 8)),
    )
    .value(bytes(0x2000_0000, src), bytes_mut(0x8000_0000, ext));
    let tg = target(true);
    time("update_slots nhd bf16", || {
        black_box(write_plan::slots(black_box(&nhd), &tg).unwrap());
        0
    });
    time("update_slots nhd bf16 plan+pack", || {
        pack(&write_plan::slots(black_box(&nhd), &tg).unwrap())
    });
    let fp8_cache = PagedLayout::nhd(16, 16, h, d, 1);
    let scales = bytes(0x5000_0000, 8);
    let q = Quantize::new(
        SrcType::Bf16,
        Fp8::E4m3,
        Scale::PerTensor(scales.slice(0, 4).unwrap()),
    )
    .value_scale(Scale::PerTensor(scales.slice(4, 4).unwrap()));
    let fext = fp8_cache.extent("c").unwrap() as usize;
    let fp8 = SlotUpdate::new(
        bytes(0x1000_0000, src),
        input,
        bytes_mut(0x4000_0000, fext),
        fp8_cache,
        SlotMapping::I64(bytes(0x3000_0000, t * 8)),
    )
    .value(bytes(0x2000_0000, src), bytes_mut(0x8000_0000, fext))
    .quantize(q);
    time("update_slots nhd fp8 plan+pack", || {
        pack(&write_plan::slots(black_box(&fp8), &tg).unwrap())
    });
    for (e, name) in [
        (2, "update_slots v0 bf16 plan+pack"),
        (1, "update_slots v0 fp8 plan+pack"),
    ] {
        let (kl, vl) = (
            PagedLayout::v0_key(16, 16, h, d, e),
            PagedLayout::v0_value(16, 16, h, d, e),
        );
        let vext = kl.extent("c").unwrap() as usize;
        let mut op = SlotUpdate::new(
            bytes(0x1000_0000, src),
            input,
            bytes_mut(0x4000_0000, vext),
            kl,
            SlotMapping::I64(bytes(0x3000_0000, t * 8)),
        )
        .value(bytes(0x2000_0000, src), bytes_mut(0x8000_0000, vext))
        .value_layout(vl);
        if e == 1 {
            op = op.quantize(q);
        }
        time(name, || {
            pack(&write_plan::slots(black_box(&op), &tg).unwrap())
        });
    }
    for (e, name) in [
        (2, "update_mla bf16 plan+pack"),
        (1, "update_mla fp8 plan+pack"),
    ] {
        let mut lk = TokenLayout::contiguous(t, 1, 512, 2);
        let mut lp = TokenLayout::contiguous(t, 1, 64, 2);
        (lk.token_stride, lp.token_stride) = (576, 576);
        let layout = PagedLayout::nhd(16, 64, 1, 576, e);
        let input = bytes(0x1000_0000, t * 576 * 2);
        let mut op = MlaUpdate::new(
            input,
            lk,
            input.slice(1024, input.len() - 1024).unwrap(),
            lp,
            bytes_mut(0x4000_0000, layout.extent("c").unwrap() as usize),
            layout,
            SlotMapping::I64(bytes(0x3000_0000, t * 8)),
        );
        if e == 1 {
            op = op.quantize(Quantize::new(
                SrcType::Bf16,
                Fp8::E4m3,
                Scale::PerTensor(scales.slice(0, 4).unwrap()),
            ));
        }
        time(name, || {
            pack(&write_plan::mla(black_box(&op), &tg).unwrap())
        });
    }
    {
        let layout = PagedLayout::nhd(16, 16, 2 * h, d, 2);
        let input = TokenLayout::contiguous(t, 2 * h, d, 2);
        let padded = 16;
        let op = SliceUpdate::new(
            bytes(0x1000_0000, 2 * src),
            input,
            bytes_mut(0x4000_0000, layout.extent("l").unwrap() as usize),
            layout,
            bytes(0x3000_0000, padded * 12),
            padded,
            bytes(0x3100_0000, 4),
        );
        time("update_slices plan+pack", || {
            pack(&write_plan::slices(black_box(&op), &tg).unwrap())
        });
    }
    // Block copies: 4 shuffled pairs, 16-token pages, 32 layers, between strided pools (a
    // layer table needs a GPU to build).
    let (nb, l, bs) = (8usize, 32usize, 16usize);
    let whole = nb * l * 2 * bs * h * d * 2;
    let pairs: [[i64; 2]; 4] = [[5, 2], [1, 7], [6, 0], [3, 4]];
    let map_d = bytes(0x3000_0000, pairs.len() * 16);
    let staging = bytes_mut(0x3200_0000, 4096);
    let cross = |at: u64| BlockPool::cross_layer_nhd(bytes_mut(at, whole), nb, l, bs, h, d, 2);
    let layer_first = |at: u64| {
        let cache = nb * bs * h * d * 2;
        let layout = PagedLayout::nhd(nb, bs, h, d, 2);
        BlockPool::strided(bytes_mut(at, whole), cache, l * cache, l, 2, layout)
    };
    {
        // Copy-on-write inside one pool (blocks 0..4 to 4..8).
        let pool = cross(0x1_0000_0000);
        let cow: [[i64; 2]; 4] = [[1, 6], [3, 4], [0, 7], [2, 5]];
        let op = BlockCopy::within(pool, BlockMap::Host(&cow)).backend(Backend::Kernel);
        let tg = target(true);
        time("copy_blocks cross-layer one pool kernel host map", || {
            let (_, plan) = blocks::plan::plan(black_box(&op), &tg).unwrap();
            pack(&plan)
        });
    }
    for (label, src, dst) in [
        (
            "cross-layer d2d",
            cross(0x1_0000_0000),
            cross(0x2_0000_0000),
        ),
        ("cross-layer d2h", cross(0x1_0000_0000), cross(HOST_FROM)),
        (
            "layer-first d2h",
            layer_first(0x1_0000_0000),
            layer_first(HOST_FROM),
        ),
    ] {
        let base = BlockCopy::new(
            src,
            dst,
            BlockMap::Device {
                pairs: map_d,
                len: 4,
            },
        )
        .backend(Backend::Kernel);
        let host = BlockCopy {
            map: BlockMap::Host(&pairs),
            ..base
        };
        for (how, op, batched) in [
            ("kernel device map", base, true),
            ("kernel host map (scratch)", host, true),
            ("kernel host map staging", host.staging(staging), true),
            ("dma (batched)", host.backend(Backend::Dma), true),
            ("dma (per span)", host.backend(Backend::Dma), false),
            ("auto host map", host.backend(Backend::Auto), true),
        ] {
            let tg = target(batched);
            time(&format!("copy_blocks {label} {how}"), || {
                let (_, plan) = blocks::plan::plan(black_box(&op), &tg).unwrap();
                pack(&plan)
            });
        }
    }
}
