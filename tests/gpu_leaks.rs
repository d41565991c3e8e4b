//! Resource leaks (GPU): memory in use is the same before and after 10,000 calls of each
//! operation (`update_slots`, `update_slices`, `copy_blocks` by kernel with device and staged
//! host maps and by DMA, `DeviceErrors` reset/read, rejected calls), 100 `Kvio::load` + drop
//! and 1,000 create + drop cycles of each resource (`DeviceAlloc`, `PinnedHost` allocated
//! and registered, `LayerTable`, `DeviceErrors`).
//!
//! What is measured (`Usage`), once after one warm-up call ("before") and once after the loop
//! and a context synchronisation ("after"):
//! - device memory in use: `total - free` of `cuMemGetInfo`. Covers every device allocation of
//!   this context (kvio's, the driver's, module code and data) — and of any other process on
//!   the GPU, so run this executable alone on its GPU. Compared exactly. Small objects
//!   (a 16-byte error word, a pointer table) are allocated 10,000 times or made large (a
//!   4,096-entry table) so that a leak adds up to megabytes and cannot hide in the driver's
//!   2 MiB allocation granularity.
//! - pinned host memory in use: Linux has no counter of "page-locked by the CUDA driver", so
//!   three process-wide approximations are taken from `/proc/self`: the bytes of this
//!   process's mappings of the NVIDIA device files (`/dev/nvidia*` in `maps`: the driver
//!   maps its own host allocations, `cuMemHostAlloc` among them, through these files),
//!   `VmLck + VmPin` from `status` (pages mlocked or pinned and accounted to the process), both
//!   compared exactly, and `VmSize` (all mappings) with a slack of 64 MiB (the allocator may
//!   keep freed heap) — a leaked pinned buffer per iteration would add ≥ 1 GiB here. Which of
//!   them see pinned memory on this driver is printed by `measures_see_allocations`. On top of
//!   that, every `PinnedHost` is checked object by object: its address is known to the driver
//!   as pinned host memory while it lives (`cuPointerGetAttribute`) and unknown right after
//!   its drop — exact, and independent of the driver's mapping scheme.
//!
//! Tests of this file run one at a time (a process-wide lock) so that none measures another's
//! allocations. `KVIO_LEAK_ITERS` (default 10000) scales the counts (loads: /100, creates:
//! /10). Under compute-sanitizer (`KVIO_SANITIZER` set, see scripts/sanitize) the tool's own
//! device and host allocations make the process-wide numbers meaningless: they are printed,
//! not asserted; the per-object checks still are. Skips without a GPU unless
//! `KVIO_REQUIRE_GPU=1`.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cust::sys as cu;
use kvio::plan::{slices_to_table, slots_to_slices, Slice};
use kvio::reference;
use kvio::{
    memory_kind, Backend, BlockCopy, BlockMap, DeviceAlloc, DeviceBytes, DeviceErrors, Error, Kvio,
    LayerTable, MemoryKind, PagedLayout, PinnedHost, SliceUpdate, SlotMapping, SlotUpdate,
    StreamRef, TokenLayout,
};
use kvio_suite::{
    assert_same, download, env_usize, gpu, random_bytes, upload, Kind, Shape, TestPool,
};

/// Calls per operation.
fn calls() -> usize {
    env_usize("KVIO_LEAK_ITERS", 10_000).max(10)
}

/// `Kvio::load` + drop cycles.
fn loads() -> usize {
    (calls() / 100).max(1)
}

/// Create + drop cycles per resource type.
fn creates() -> usize {
    (calls() / 10).max(1)
}

fn under_sanitizer() -> bool {
    std::env::var_os("KVIO_SANITIZER").is_some()
}

static SERIAL: Mutex<()> = Mutex::new(());

/// Held for a whole test: no other test of this process allocates while one measures.
fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[track_caller]
fn cu_ok(call: &str, r: cu::CUresult) {
    assert_eq!(r, cu::CUresult::CUDA_SUCCESS, "{call} failed");
}

/// Waits for all work of the current context (a kernel fault shows here).
fn sync_ctx() {
    // SAFETY: no arguments; a context is current (gpu() made it so).
    cu_ok("cuCtxSynchronize", unsafe { cu::cuCtxSynchronize() });
}

/// Memory in use (see the file's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Usage {
    /// Device memory in use (`total - free`), bytes.
    device: u64,
    /// Bytes mapped from `/dev/nvidia*` files.
    nv_maps: u64,
    /// `VmLck + VmPin`, bytes.
    locked: u64,
    /// `VmSize`, bytes.
    vm: u64,
}

/// Slack allowed on `VmSize` (heap the allocator keeps; a leak is ≥ 1 GiB).
const VM_SLACK: u64 = 64 << 20;

impl Usage {
    fn now() -> Usage {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: out-pointers to locals; a context is current.
        cu_ok("cuMemGetInfo", unsafe {
            cu::cuMemGetInfo_v2(&mut free, &mut total)
        });
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        let kb = |key: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|r| r.trim().trim_end_matches("kB").trim())
                .and_then(|r| r.parse::<u64>().ok())
                .map_or(0, |k| k * 1024)
        };
        let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
        let nv_maps = maps
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let range = f.next()?;
                let path = f.nth(4)?;
                if !path.starts_with("/dev/nvidia") {
                    return None;
                }
                let (a, b) = range.split_once('-')?;
                Some(u64::from_str_radix(b, 16).ok()? - u64::from_str_radix(a, 16).ok()?)
            })
            .sum();
        Usage {
            device: (total - free) as u64,
            nv_maps,
            locked: kb("VmLck:") + kb("VmPin:"),
            vm: kb("VmSize:"),
        }
    }

    /// What grew (or shrank) between `self` (before) and `after`.
    fn problems(&self, after: &Usage) -> Vec<String> {
        let mut p = Vec::new();
        let d = |a: u64, b: u64| b as i128 - a as i128;
        if after.device != self.device {
            p.push(format!(
                "device memory in use changed by {} bytes",
                d(self.device, after.device)
            ));
        }
        if after.nv_maps != self.nv_maps {
            p.push(format!(
                "/dev/nvidia* mappings changed by {} bytes",
                d(self.nv_maps, after.nv_maps)
            ));
        }
        if after.locked != self.locked {
            p.push(format!(
                "VmLck+VmPin changed by {} bytes",
                d(self.locked, after.locked)
            ));
        }
        if after.vm > self.vm + VM_SLACK {
            p.push(format!(
                "VmSize grew by {} bytes (slack {VM_SLACK})",
                d(self.vm, after.vm)
            ));
        }
        p
    }
}

/// Runs `step(0)` once as warm-up, takes the "before" reading, runs `step(i)` for `i` in
/// `0..n`, synchronises and compares. A difference is re-read a few times (frees the driver
/// defers, another process's transient use) before it counts.
fn no_growth(what: &str, n: usize, mut step: impl FnMut(usize)) {
    step(0);
    sync_ctx();
    let before = Usage::now();
    let t = Instant::now();
    for i in 0..n {
        step(i);
        if i % 1000 == 999 {
            sync_ctx();
        }
    }
    sync_ctx();
    let took = t.elapsed();
    let mut after = Usage::now();
    let mut problems = before.problems(&after);
    for _ in 0..5 {
        if problems.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        sync_ctx();
        after = Usage::now();
        problems = before.problems(&after);
    }
    eprintln!("leaks: {what}: {n} times in {took:.2?}\n  before {before:?}\n  after  {after:?}");
    if problems.is_empty() {
        return;
    }
    let msg = format!("{what}: after {n} times: {}", problems.join("; "));
    if under_sanitizer() {
        eprintln!("leaks: NOT ASSERTED under compute-sanitizer: {msg}");
    } else {
        panic!("{msg}");
    }
}

// ---- shapes shared by the operation tests -------------------------------------------------

const NB: usize = 32;
const BS: usize = 16;
const H: usize = 8;
const D: usize = 128;
const E: usize = 2;
const T: usize = 40;

/// A cache, its initial (poison) contents and its layout.
struct Cache {
    init: Vec<u8>,
    dev: cust::memory::DeviceBuffer<u8>,
    layout: PagedLayout,
}

fn cache(layout: PagedLayout, seed: u64) -> Cache {
    let init = random_bytes(layout.extent("cache").unwrap() as usize, seed);
    Cache {
        dev: upload(&init),
        init,
        layout,
    }
}

/// 10,000 slot updates (K and V, i64 slots, one slot past the cache each: the error word
/// must count every launch).
#[test]
fn update_slots_calls() {
    let Some(g) = gpu("leaks") else { return };
    let _serial = serial();
    let stream = g.stream();
    let sref = StreamRef::from(&stream);
    let input = TokenLayout::contiguous(T, H, D, E);
    let in_bytes = input.extent("input").unwrap() as usize;
    let (key_h, val_h) = (random_bytes(in_bytes, 1), random_bytes(in_bytes, 2));
    let (key, val) = (upload(&key_h), upload(&val_h));
    let (mut kc, mut vc) = (
        cache(PagedLayout::nhd(NB, BS, H, D, E), 3),
        cache(PagedLayout::nhd(NB, BS, H, D, E), 4),
    );
    let num_slots = (NB * BS) as i64;
    let mut slots: Vec<i64> = (0..T as i64).map(|i| i * 17 % num_slots).collect();
    slots[5] = num_slots + 3;
    slots[9] = -1;
    let slots_d = upload(&slots);
    let errors = DeviceErrors::new().unwrap();
    let op = SlotUpdate {
        key: kvio::CacheWrite {
            src: DeviceBytes::of(&key),
            dst: kvio::DeviceBytesMut::of(&mut kc.dev),
        },
        value: Some(kvio::CacheWrite {
            src: DeviceBytes::of(&val),
            dst: kvio::DeviceBytesMut::of(&mut vc.dev),
        }),
        input,
        cache: kc.layout,
        value_layout: None,
        slots: SlotMapping::I64(DeviceBytes::of(&slots_d)),
        errors: Some(&errors),
        quantize: None,
    };
    let n = calls();
    no_growth("update_slots", n, |_| {
        g.kv.update_slots(&op, sref).unwrap();
    });
    for (c, src, what) in [(&kc, &key_h, "K"), (&vc, &val_h, "V")] {
        let mut want = c.init.clone();
        reference::update_slots(src, None, &input, &mut want, 0, None, &c.layout, &slots);
        assert_same(what, &download(&c.dev, &stream), &want);
    }
    let counts = errors.read(sref).unwrap();
    assert_eq!(counts.bad_slots as usize, n + 1, "one bad slot per launch");
}

/// 10,000 slice updates (one refused slice each: counted every launch).
#[test]
fn update_slices_calls() {
    slices_calls(PagedLayout::nhd(NB, BS, H, D, E), "update_slices");
}

/// 10,000 slice updates into HND caches, through a slot list in kvio's scratch memory each
/// (taken and given back on the stream every call).
#[test]
fn update_slices_through_slot_list_calls() {
    slices_calls(
        PagedLayout::hnd(NB, BS, H, D, E),
        "update_slices (slot list)",
    );
}

fn slices_calls(layout: PagedLayout, what: &str) {
    let Some(g) = gpu("leaks") else { return };
    let _serial = serial();
    let stream = g.stream();
    let sref = StreamRef::from(&stream);
    let input = TokenLayout::contiguous(T, H, D, E);
    let src_h = random_bytes(input.extent("input").unwrap() as usize, 5);
    let src = upload(&src_h);
    let mut c = cache(layout, 6);
    let slots: Vec<i64> = (0..T as i64).map(|i| 3 * BS as i64 + 5 + i).collect();
    let mut slices = slots_to_slices(&slots, BS).unwrap();
    slices.push(Slice {
        cache_start: (NB * BS) as i32,
        new_kv_start: 0,
        len: 1,
    });
    let padded = slices.len() + 3;
    let table = upload(&slices_to_table(&slices, padded).unwrap());
    let count = upload(&[slices.len() as i32]);
    let errors = DeviceErrors::new().unwrap();
    let op = SliceUpdate {
        new_kv: DeviceBytes::of(&src),
        input,
        cache: kvio::DeviceBytesMut::of(&mut c.dev),
        layout: c.layout,
        slices: DeviceBytes::of(&table),
        padded,
        num_slices: DeviceBytes::of(&count),
        errors: Some(&errors),
        value: None,
        value_layout: None,
        quantize: None,
        slot_list: None,
    };
    let n = calls();
    no_growth(what, n, |_| {
        g.kv.update_slices(&op, sref).unwrap();
    });
    let mut want = c.init.clone();
    let mut all = slices.clone();
    all.resize(padded, Slice::default());
    reference::update_slices(
        &src_h,
        &input,
        &mut want,
        &c.layout,
        &all,
        slices.len() as i32,
    );
    assert_same(what, &download(&c.dev, &stream), &want);
    let counts = errors.read(sref).unwrap();
    assert_eq!(
        counts.bad_slices as usize,
        n + 1,
        "one bad slice per launch"
    );
}

// ---- block copies -------------------------------------------------------------------------

const PNB: usize = 24;
const PL: usize = 4;

/// The shape of the block-copy pools.
const PSHAPE: Shape = Shape {
    blocks: PNB,
    layers: PL,
    bs: BS,
    heads: H,
    dim: D,
    elem: E,
};

/// A cross-layer NHD pool, filled with random bytes.
struct Filled {
    pool: TestPool,
    init: Vec<u8>,
}

impl Filled {
    fn new(on_host: bool, seed: u64) -> Filled {
        let (pool, init) = TestPool::random(Kind::CrossNhd, on_host, PSHAPE, seed);
        Filled { pool, init }
    }

    /// Checks the pool holds its initial bytes with `pairs` copied in from `src`.
    fn check(&self, what: &str, src: &Filled, pairs: &[[i64; 2]]) {
        sync_ctx();
        let mut want = self.init.clone();
        reference::copy_blocks(
            &src.pool.image(),
            &src.init,
            &self.pool.image(),
            &mut want,
            pairs,
        );
        assert_same(what, &self.pool.mem.read(), &want);
    }
}

/// A copy from `src` to `dst`.
fn copy_op<'a>(
    src: &'a Filled,
    dst: &'a Filled,
    map: BlockMap<'a>,
    backend: Backend,
    staging: Option<kvio::DeviceBytesMut<'a>>,
    errors: Option<&'a DeviceErrors>,
) -> BlockCopy<'a> {
    BlockCopy {
        src: src.pool.pool().into(),
        dst: dst.pool.pool(),
        map,
        backend,
        max_ctas: None,
        staging,
        errors,
    }
}

/// 10,000 kernel-backend copies with a device map (GPU → GPU and GPU → pinned host, one id
/// out of range each: counted every launch).
#[test]
fn copy_blocks_kernel_device_map_calls() {
    let Some(g) = gpu("leaks") else { return };
    let _serial = serial();
    let stream = g.stream();
    let sref = StreamRef::from(&stream);
    let src = Filled::new(false, 10);
    let (to_dev, to_host) = (Filled::new(false, 11), Filled::new(true, 12));
    let pairs: Vec<[i64; 2]> = vec![[0, 5], [7, 6], [2, 17], [PNB as i64 + 1, 8], [-1, 3]];
    let map = upload(&pairs.iter().flatten().copied().collect::<Vec<i64>>());
    let errors = DeviceErrors::new().unwrap();
    let dmap = BlockMap::Device {
        pairs: DeviceBytes::of(&map),
        len: pairs.len(),
    };
    let (d2d, d2h) = (
        copy_op(&src, &to_dev, dmap, Backend::Kernel, None, Some(&errors)),
        copy_op(&src, &to_host, dmap, Backend::Kernel, None, Some(&errors)),
    );
    let n = calls();
    no_growth("copy_blocks kernel, device map", n, |i| {
        let op = if i % 2 == 0 { &d2d } else { &d2h };
        assert_eq!(g.kv.copy_blocks(op, sref).unwrap(), Backend::Kernel);
    });
    to_dev.check("GPU -> GPU", &src, &pairs);
    to_host.check("GPU -> pinned", &src, &pairs);
    let counts = errors.read(sref).unwrap();
    assert_eq!(counts.bad_blocks as usize, n + 1, "one bad pair per launch");
}

/// 10,000 kernel-backend copies with a host map through staging (GPU → pinned host, pinned
/// host → GPU).
#[test]
fn copy_blocks_kernel_staged_host_map_calls() {
    let Some(g) = gpu("leaks") else { return };
    let _serial = serial();
    let stream = g.stream();
    let sref = StreamRef::from(&stream);
    let (dev, host) = (Filled::new(false, 20), Filled::new(true, 21));
    let (to_host, to_dev) = (Filled::new(true, 22), Filled::new(false, 23));
    let pairs: Vec<[i64; 2]> = vec![[1, 4], [3, 9], [-1, -1], [20, 0]];
    let mut staging = upload(&random_bytes(pairs.len() * 16, 24));
    let st = Some(kvio::DeviceBytesMut::of(&mut staging));
    let hmap = BlockMap::Host(&pairs);
    let (d2h, h2d) = (
        copy_op(&dev, &to_host, hmap, Backend::Kernel, st, None),
        copy_op(&host, &to_dev, hmap, Backend::Kernel, st, None),
    );
    no_growth("copy_blocks kernel, staged host map", calls(), |i| {
        let op = if i % 2 == 0 { &d2h } else { &h2d };
        assert_eq!(g.kv.copy_blocks(op, sref).unwrap(), Backend::Kernel);
    });
    to_host.check("GPU -> pinned (staged)", &dev, &pairs);
    to_dev.check("pinned -> GPU (staged)", &host, &pairs);
}

/// 10,000 kernel copies with a host map and no staging (kvio's own stream-ordered scratch),
/// GPU → pinned host and back: after the first call, no device memory grows.
#[test]
fn copy_blocks_scratch_host_map_calls() {
    let Some(g) = gpu("leaks") else { return };
    let _serial = serial();
    let stream = g.stream();
    let sref = StreamRef::from(&stream);
    let (dev, host) = (Filled::new(false, 25), Filled::new(true, 26));
    let (to_host, to_dev) = (Filled::new(true, 27), Filled::new(false, 28));
    let pairs: Vec<[i64; 2]> = vec![[2, 5], [7, 1], [-1, -1], [20, 23]];
    let hmap = BlockMap::Host(&pairs);
    let (d2h, h2d) = (
        copy_op(&dev, &to_host, hmap, Backend::Kernel, None, None),
        copy_op(&host, &to_dev, hmap, Backend::Kernel, None, None),
    );
    no_growth("copy_blocks, host map in kvio's scratch", calls(), |i| {
        let op = if i % 2 == 0 { &d2h } else { &h2d };
        assert_eq!(g.kv.copy_blocks(op, sref).unwrap(), Backend::Kernel);
    });
    to_host.check("GPU -> pinned (scratch)", &dev, &pairs);
    to_dev.check("pinned -> GPU (scratch)", &host, &pairs);
}

/// 10,000 DMA copies (GPU → pinned host, pinned host → GPU, GPU → GPU; runs merged).
#[test]
fn copy_blocks_dma_calls() {
    let Some(g) = gpu("leaks") else { return };
    let _serial = serial();
    let stream = g.stream();
    let sref = StreamRef::from(&stream);
    let (dev, host) = (Filled::new(false, 30), Filled::new(true, 31));
    let (to_host, to_dev, to_dev2) = (
        Filled::new(true, 32),
        Filled::new(false, 33),
        Filled::new(false, 34),
    );
    let pairs: Vec<[i64; 2]> = vec![[0, 10], [1, 11], [2, 12], [8, 3], [-1, 5]];
    let hmap = BlockMap::Host(&pairs);
    let ops = [
        copy_op(&dev, &to_host, hmap, Backend::Dma, None, None),
        copy_op(&host, &to_dev, hmap, Backend::Dma, None, None),
        copy_op(&dev, &to_dev2, hmap, Backend::Dma, None, None),
    ];
    no_growth("copy_blocks DMA", calls(), |i| {
        assert_eq!(g.kv.copy_blocks(&ops[i % 3], sref).unwrap(), Backend::Dma);
    });
    to_host.check("GPU -> pinned (DMA)", &dev, &pairs);
    to_dev.check("pinned -> GPU (DMA)", &host, &pairs);
    to_dev2.check("GPU -> GPU (DMA)", &dev, &pairs);
}

/// 10,000 rounds of reset, one launch that refuses one slot, read (which synchronises).
#[test]
fn device_errors_reset_read_calls() {
    let Some(g) = gpu("leaks") else { return };
    let _serial = serial();
    let stream = g.stream();
    let sref = StreamRef::from(&stream);
    let input = TokenLayout::contiguous(2, 1, 64, 2);
    let key = upload(&random_bytes(input.extent("input").unwrap() as usize, 40));
    let mut c = cache(PagedLayout::nhd(4, 16, 1, 64, 2), 41);
    let slots = upload(&[3i32, 64]);
    let errors = DeviceErrors::new().unwrap();
    let op = SlotUpdate {
        key: kvio::CacheWrite {
            src: DeviceBytes::of(&key),
            dst: kvio::DeviceBytesMut::of(&mut c.dev),
        },
        value: None,
        input,
        cache: c.layout,
        value_layout: None,
        slots: SlotMapping::I32(DeviceBytes::of(&slots)),
        errors: Some(&errors),
        quantize: None,
    };
    no_growth("DeviceErrors reset + read", calls(), |i| {
        errors.reset(sref).unwrap();
        g.kv.update_slots(&op, sref).unwrap();
        let counts = errors.read(sref).unwrap();
        assert_eq!(counts.bad_slots, 1, "round {i}: {counts:?}");
    });
}

/// 10,000 rejected calls (typed errors, nothing launched, nothing allocated).
#[test]
fn rejected_calls() {
    let Some(g) = gpu("leaks") else { return };
    let _serial = serial();
    let stream = g.stream();
    let sref = StreamRef::from(&stream);
    let (dev, host) = (Filled::new(false, 50), Filled::new(true, 51));
    let dup = [[0i64, 1], [2, 1]];
    let mut staging = upload(&[0u8; 64]);
    let (st, hmap) = (
        Some(kvio::DeviceBytesMut::of(&mut staging)),
        BlockMap::Host(&dup),
    );
    let (dma, kernel) = (
        copy_op(&dev, &host, hmap, Backend::Dma, st, None),
        copy_op(&dev, &host, hmap, Backend::Kernel, st, None),
    );
    let mut c = cache(PagedLayout::nhd(4, 16, 1, 64, 2), 52);
    let input = TokenLayout::contiguous(2, 1, 64, 2);
    let key = upload(&random_bytes(input.extent("input").unwrap() as usize, 53));
    let slots = upload(&[1i64, 2]);
    let whole = kvio::DeviceBytesMut::of(&mut c.dev);
    let kv_overlap = SlotUpdate {
        key: kvio::CacheWrite {
            src: DeviceBytes::of(&key),
            dst: whole,
        },
        value: Some(kvio::CacheWrite {
            src: DeviceBytes::of(&key),
            dst: whole,
        }),
        input,
        cache: c.layout,
        value_layout: None,
        slots: SlotMapping::I64(DeviceBytes::of(&slots)),
        errors: None,
        quantize: None,
    };
    no_growth("rejected calls", calls(), |_| {
        for op in [&dma, &kernel] {
            assert!(matches!(
                g.kv.copy_blocks(op, sref),
                Err(Error::Overlap {
                    name: "map.dst",
                    ..
                })
            ));
        }
        assert!(matches!(
            g.kv.update_slots(&kv_overlap, sref),
            Err(Error::InvalidArgument {
                name: "value_cache",
                ..
            })
        ));
    });
    assert_same("untouched pinned pool", &host.pool.mem.read(), &host.init);
    assert_same("untouched cache", &download(&c.dev, &stream), &c.init);
}

// ---- loads and set-up-time resources ------------------------------------------------------

/// 100 module loads and drops; each loaded module launches once.
#[test]
fn kvio_load_and_drop() {
    let Some(g) = gpu("leaks") else { return };
    let _serial = serial();
    let stream = g.stream();
    no_growth("Kvio::load + drop", loads(), |_| {
        let kv = Kvio::load().unwrap();
        kv.bench_noop(StreamRef::from(&stream)).unwrap();
        stream.synchronize().expect("cuStreamSynchronize");
        drop(kv);
    });
}

/// The measures see what they are meant to see: a live 64 MiB device allocation moves the
/// device reading by at least 64 MiB; what a live 64 MiB pinned allocation moves is printed.
#[test]
fn measures_see_allocations() {
    let Some(_g) = gpu("leaks") else { return };
    let _serial = serial();
    const BIG: usize = 64 << 20;
    sync_ctx();
    let before = Usage::now();
    let dev = DeviceAlloc::new(BIG).unwrap();
    let with_dev = Usage::now();
    drop(dev);
    let mut pinned = PinnedHost::alloc(BIG).unwrap();
    pinned.as_mut_slice().unwrap().fill(0x5A);
    let with_pinned = Usage::now();
    drop(pinned);
    let after = Usage::now();
    eprintln!(
        "leaks: measures: before {before:?}\n  with 64 MiB device   {with_dev:?}\n  \
         with 64 MiB pinned   {with_pinned:?}\n  after                {after:?}"
    );
    let seen = |name: &str, a: u64, b: u64| {
        let yes = b >= a + BIG as u64;
        eprintln!(
            "leaks: a 64 MiB pinned allocation {} {name}",
            if yes {
                "is visible in"
            } else {
                "is NOT visible in"
            }
        );
        yes
    };
    let any = [
        seen("/dev/nvidia* mappings", before.nv_maps, with_pinned.nv_maps),
        seen("VmLck+VmPin", before.locked, with_pinned.locked),
        seen("VmSize", before.vm, with_pinned.vm),
    ]
    .contains(&true);
    if !any {
        eprintln!(
            "leaks: no /proc measure sees pinned memory on this driver: pinned leaks are caught \
             by the per-object driver checks only"
        );
    }
    if !under_sanitizer() {
        assert!(
            with_dev.device >= before.device + BIG as u64,
            "cuMemGetInfo does not see a live 64 MiB allocation: {before:?} -> {with_dev:?}"
        );
    }
}

/// 1,000 device allocations of 1 MiB, created and dropped.
#[test]
fn device_alloc_create_drop() {
    let Some(_g) = gpu("leaks") else { return };
    let _serial = serial();
    no_growth("DeviceAlloc::new + drop (1 MiB)", creates(), |_| {
        let a = DeviceAlloc::new(1 << 20).unwrap();
        assert_eq!(a.bytes().len(), 1 << 20);
        assert_eq!(memory_kind(a.bytes().ptr()), MemoryKind::Device);
        drop(a);
    });
}

/// 1,000 pinned allocations of 1 MiB, created, touched and dropped; each is known to the
/// driver while it lives and unknown right after.
#[test]
fn pinned_alloc_create_drop() {
    let Some(_g) = gpu("leaks") else { return };
    let _serial = serial();
    no_growth("PinnedHost::alloc + drop (1 MiB)", creates(), |i| {
        let mut p = PinnedHost::alloc(1 << 20).unwrap();
        let s = p.as_mut_slice().unwrap();
        s[0] = i as u8;
        s[(1 << 20) - 1] = 1 + i as u8;
        let host = p.as_slice().unwrap().as_ptr() as u64;
        assert_eq!(memory_kind(host), MemoryKind::PinnedHost, "live, round {i}");
        assert_eq!(memory_kind(p.bytes().ptr()), MemoryKind::PinnedHost);
        drop(p);
        assert_eq!(
            memory_kind(host),
            MemoryKind::Unregistered,
            "round {i}: freed pinned memory still known to the driver"
        );
    });
}

/// 1,000 registrations of the same 1 MiB of ordinary memory, dropped (unregistered) each
/// time: registering it again would fail if the previous drop had not unregistered it.
#[test]
fn pinned_register_drop() {
    let Some(_g) = gpu("leaks") else { return };
    let _serial = serial();
    let mut buf = random_bytes(1 << 20, 60);
    let host = buf.as_ptr() as u64;
    no_growth("PinnedHost::register + drop (1 MiB)", creates(), |i| {
        // SAFETY: `buf` is valid, writable, outlives `p`, and is not registered (the previous
        // round's drop unregistered it — which is what this test checks).
        let p = unsafe { PinnedHost::register(buf.as_mut_ptr(), buf.len()) }
            .unwrap_or_else(|e| panic!("round {i}: {e}"));
        assert_eq!(memory_kind(host), MemoryKind::PinnedHost, "round {i}");
        assert_eq!(p.as_slice().unwrap()[7], buf[7]);
        drop(p);
        assert_eq!(memory_kind(host), MemoryKind::Unregistered, "round {i}");
    });
    assert_eq!(memory_kind(host), MemoryKind::Unregistered);
    drop(buf);
}

/// 1,000 layer tables of 4,096 entries (32 KiB on the device each), created and dropped.
#[test]
fn layer_table_create_drop() {
    let Some(_g) = gpu("leaks") else { return };
    let _serial = serial();
    let mut mem = DeviceAlloc::new(1 << 20).unwrap();
    let whole = mem.bytes_mut();
    let views: Vec<kvio::DeviceBytesMut> = (0..4096)
        .map(|i| whole.slice(i * 256, 256).unwrap())
        .collect();
    no_growth("LayerTable::new + drop (4096 entries)", creates(), |_| {
        let t = LayerTable::new(&views, 2).unwrap();
        assert_eq!((t.layers(), t.parts()), (2048, 2));
        assert_eq!(memory_kind(t.ptr()), MemoryKind::Device);
        drop(t);
    });
}

/// 10,000 error words (16 bytes each: 10,000 of them leaked would be megabytes), created and
/// dropped.
#[test]
fn device_errors_create_drop() {
    let Some(g) = gpu("leaks") else { return };
    let _serial = serial();
    let stream = g.stream();
    let sref = StreamRef::from(&stream);
    no_growth("DeviceErrors::new + drop", calls(), |_| {
        let e = DeviceErrors::new().unwrap();
        assert!(e.read(sref).unwrap().is_clean());
        drop(e);
    });
}
