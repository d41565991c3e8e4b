//! Reliability under load (GPU).
//!
//! 1. `many_streams_random_ops_nothing_lost`: 8 streams, each fed by its own host thread,
//!    run 10,000 random operations in total (slot updates, slice updates (a third of them K
//!    and V in one call, through a slot list in kvio's scratch on the stream), block copies by
//!    kernel with device maps, by kernel with staged host maps, by DMA, by `Auto`; inside the
//!    GPU, GPU → pinned host, pinned host → GPU, pinned → pinned (kernel); layout-converting
//!    and not) on four shared pools, two on the device and two in pinned host memory. Every
//!    pool's blocks are partitioned up front: each stream owns some blocks of every pool and
//!    is the only one to write them; the rest are read-only sources shared by everybody. So
//!    operations in flight on different streams never touch the same destination bytes, and
//!    a stream only reads what nobody writes or what it wrote itself (stream-ordered). A host
//!    model applies `kvio::reference` in each stream's order (cross-stream order is
//!    irrelevant by disjointness). The run stops at 10 checkpoints (all streams synchronised):
//!    every pool is compared byte for byte with the model and the shared error word with the
//!    sum of the expected counts (bad ids are mixed in on purpose): nothing lost, nothing
//!    written twice, nothing written elsewhere. Checksums are printed.
//! 2. `conflicting_targets_rejected_nothing_launched`: the same destination twice in one host
//!    map or slot/slice list, and a block both read and written in one pool, are rejected by
//!    validation with the typed errors (`Error::Overlap`), and nothing is launched: every pool,
//!    the staging buffer and the error word are unchanged. Controls without the conflict do
//!    write.
//! 3. `pinned_to_pinned_dma_is_stream_ordered`: DMA between two pinned pools waits for the
//!    kernel queued before it on the same stream (kept out of test 1's random mix so that a
//!    failure there names the cause).
//!
//! `KVIO_STRESS_OPS` (default 10000) sets the number of operations of test 1 (the sanitizer
//! script lowers it). Skips without a GPU unless `KVIO_REQUIRE_GPU=1`.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use kvio::plan::{slices_to_table, slots_to_slices, validate_slices, validate_slots, Slice};
use kvio::reference::{self, PoolImage};
use kvio::Stream;
use kvio::{
    Backend, BlockCopy, BlockMap, BlockPool, DeviceBytes, DeviceBytesMut, DeviceErrors, Error,
    ErrorCounts, SliceUpdate, SlotMapping, SlotUpdate, StreamRef, TokenLayout, Writable,
};
use kvio_suite::{
    assert_same, env_usize, gpu, random_bytes, upload, Gpu, Kind, Mem, Rng, Shape, TestPool,
};

/// Streams (and host threads) of the stress test.
const STREAMS: usize = 8;
/// Blocks of every pool each stream owns (writes); contiguous, so DMA runs can merge. Many,
/// so that a lost write is seldom overwritten before the next checkpoint.
const OWN: usize = 32;
/// Blocks of every pool nobody writes (shared sources).
const READ_ONLY: usize = 16;
/// Blocks per pool.
const NB: usize = STREAMS * OWN + READ_ONLY;
const LAYERS: usize = 2;
const BS: usize = 16;
const HEADS: usize = 2;
const DIM: usize = 64;
const ELEM: usize = 2;
/// Bytes of one token row (all heads).
const ROW: usize = HEADS * DIM * ELEM;
/// Tokens of the shared, read-only input buffers the write operations take rows from.
const INPUT_TOKENS: usize = 4096;
/// Most tokens one write operation writes.
const MAX_TOKENS: usize = 24;
/// Most blocks one copy writes.
const MAX_COPY: usize = 8;
/// Most pairs one block copy holds (destinations + padding + a bad id).
const MAX_PAIRS: usize = MAX_COPY + 2;
/// Times the run stops (all streams synchronised) to compare every pool with the model.
const CHECKPOINTS: usize = 10;
/// Slots of one layer/part cache.
const NUM_SLOTS: usize = NB * BS;

/// FNV-1a, 64 bits: a checksum to report (the comparison itself is byte for byte).
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn add_counts(a: &mut ErrorCounts, b: ErrorCounts) {
    a.bad_slots += b.bad_slots;
    a.bad_slices += b.bad_slices;
    a.bad_counts += b.bad_counts;
    a.bad_blocks += b.bad_blocks;
}

// ---- pools ------------------------------------------------------------------------------

/// The shape of every shared pool.
const SHAPE: Shape = Shape {
    blocks: NB,
    layers: LAYERS,
    bs: BS,
    heads: HEADS,
    dim: DIM,
    elem: ELEM,
};
/// Bytes of a whole pool.
const POOL_BYTES: usize = NB * BS * HEADS * DIM * ELEM * 2 * LAYERS;

/// One shared pool (device or pinned host) and its name.
struct Pool {
    name: &'static str,
    pool: TestPool,
}

impl Pool {
    /// A pool filled with random bytes (returned, for the model).
    fn new(name: &'static str, kind: Kind, on_host: bool, seed: u64) -> (Pool, Vec<u8>) {
        let (pool, init) = TestPool::random(kind, on_host, SHAPE, seed);
        (Pool { name, pool }, init)
    }
}

impl std::ops::Deref for Pool {
    type Target = TestPool;
    fn deref(&self) -> &TestPool {
        &self.pool
    }
}

impl std::ops::DerefMut for Pool {
    fn deref_mut(&mut self) -> &mut TestPool {
        &mut self.pool
    }
}

/// Which of the four shared pools live in pinned host memory.
const ON_HOST: [bool; 4] = [false, false, true, true];

/// The four shared pools of the stress test and their initial contents. Pool 0 (device,
/// cross-layer NHD) is also the target of the write path, through its per-layer views.
fn make_pools() -> (Vec<Pool>, Vec<Vec<u8>>) {
    let specs = [
        ("dev-cross-nhd", Kind::CrossNhd),
        ("dev-sep-hnd", Kind::SepHnd),
        ("pinned-cross-nhd", Kind::CrossNhd),
        ("pinned-sep-nhd", Kind::SepNhd),
    ];
    specs
        .iter()
        .enumerate()
        .map(|(i, &(name, kind))| Pool::new(name, kind, ON_HOST[i], 0x5EED_0000 + i as u64))
        .unzip()
}

/// Which blocks of one pool each stream owns, and the read-only ones.
struct Owners {
    own: Vec<Vec<i64>>,
    read_only: Vec<i64>,
}

/// Partitions `0..NB` into one contiguous segment per stream and one read-only segment, in
/// random order.
fn owners(rng: &mut Rng) -> Owners {
    let mut segs: Vec<usize> = (0..=STREAMS).collect();
    rng.shuffle(&mut segs);
    let mut own = vec![Vec::new(); STREAMS];
    let mut read_only = Vec::new();
    let mut at = 0i64;
    for seg in segs {
        let n = if seg == STREAMS { READ_ONLY } else { OWN } as i64;
        let blocks: Vec<i64> = (at..at + n).collect();
        if seg == STREAMS {
            read_only = blocks;
        } else {
            own[seg] = blocks;
        }
        at += n;
    }
    assert_eq!(at as usize, NB);
    Owners { own, read_only }
}

// ---- operations ---------------------------------------------------------------------------

/// How a block copy is asked for.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// Kernel backend, device-resident map (the capturable path).
    KernelDevice,
    /// Copy engines, host map.
    Dma,
    /// Kernel backend, host map copied to the stream's staging buffer.
    KernelStaged,
    /// `Backend::Auto`, host map, staging available.
    Auto,
    /// `Backend::Auto`, host map, no staging (kvio's scratch, shared by every stream).
    AutoScratch,
}

/// One planned operation; device-resident indices live in the stream's arena at `*_at`.
#[derive(Debug)]
enum Op {
    Slots {
        layer: usize,
        key_only: bool,
        tok0: usize,
        n: usize,
        wide: bool,
        at: usize,
    },
    Slices {
        layer: usize,
        part: usize,
        from_value: bool,
        /// Keys into K and values into V in one call (through a slot list in kvio's scratch,
        /// taken and given back on the stream); `part` and `from_value` unused.
        both: bool,
        tok0: usize,
        n: usize,
        padded: usize,
        table_at: usize,
        count_at: usize,
    },
    Copy {
        src: usize,
        dst: usize,
        pairs: Vec<[i64; 2]>,
        mode: Mode,
        map_at: usize,
        max_ctas: Option<u32>,
    },
}

impl Op {
    fn label(&self) -> &'static str {
        match self {
            Op::Slots { .. } => "update_slots",
            Op::Slices { .. } => "update_slices",
            Op::Copy { mode, .. } => match mode {
                Mode::KernelDevice => "copy kernel/device map",
                Mode::Dma => "copy DMA/host map",
                Mode::KernelStaged => "copy kernel/staged host map",
                Mode::Auto => "copy auto/host map",
                Mode::AutoScratch => "copy auto/host map, kvio scratch",
            },
        }
    }
}

/// One stream's operations, its device-index arena, the error counts it must produce and its
/// random generator.
struct Plan {
    ops: Vec<Op>,
    arena: Vec<u8>,
    counts: ErrorCounts,
    rng: Rng,
}

/// The expected state after the first `ops` operations of every stream.
struct Checkpoint {
    ops: usize,
    imgs: Vec<Vec<u8>>,
    counts: ErrorCounts,
}

/// Plans `per_stream` operations for every stream, applying them to the model, phase by
/// phase, and records the model at each of the (up to) [`CHECKPOINTS`] phase ends.
fn plan_all(
    per_stream: usize,
    owners: &[Owners],
    model: &mut Model,
) -> (Vec<Plan>, Vec<Checkpoint>) {
    let mut plans: Vec<Plan> = (0..STREAMS)
        .map(|s| Plan {
            ops: Vec::with_capacity(per_stream),
            arena: Vec::new(),
            counts: ErrorCounts::default(),
            rng: Rng::new(1000 + s as u64),
        })
        .collect();
    let phases = CHECKPOINTS.clamp(1, per_stream.max(1));
    let mut checkpoints = Vec::with_capacity(phases);
    for k in 1..=phases {
        let end = k * per_stream / phases;
        let mut counts = ErrorCounts::default();
        for (s, plan) in plans.iter_mut().enumerate() {
            let n = end - plan.ops.len();
            plan_ops(plan, s, n, owners, model);
            add_counts(&mut counts, plan.counts);
        }
        checkpoints.push(Checkpoint {
            ops: end,
            imgs: model.imgs.clone(),
            counts,
        });
    }
    for plan in &mut plans {
        // Never empty (a zero-byte allocation is refused); the tail is never read.
        push(&mut plan.arena, &[0u8; 16]);
    }
    (plans, checkpoints)
}

/// Appends `data` to the arena at a 16-byte boundary; returns its offset.
fn push<T: bytemuck::Pod>(arena: &mut Vec<u8>, data: &[T]) -> usize {
    let at = arena.len().next_multiple_of(16);
    arena.resize(at, 0xA5);
    arena.extend_from_slice(bytemuck::cast_slice(data));
    at
}

/// The host model: pool images and the input rows.
struct Model {
    imgs: Vec<Vec<u8>>,
    descs: Vec<PoolImage>,
    key: Vec<u8>,
    val: Vec<u8>,
}

/// `n` distinct random slots of the blocks `own` (of pool 0).
fn own_slots(own: &[i64], n: usize, rng: &mut Rng) -> Vec<i64> {
    let mut cand: Vec<i64> = own
        .iter()
        .flat_map(|&b| (0..BS as i64).map(move |o| b * BS as i64 + o))
        .collect();
    rng.shuffle(&mut cand);
    cand.truncate(n);
    cand
}

/// Plans `n_ops` more operations of stream `s` and applies them to the model in order.
fn plan_ops(plan: &mut Plan, s: usize, n_ops: usize, owners: &[Owners], model: &mut Model) {
    let rng = &mut plan.rng;
    let w = model.descs[0];
    for _ in 0..n_ops {
        let pick = rng.below(100);
        let op = if pick < 20 {
            // Slot update of one layer of pool 0 (K and V, or K only).
            let layer = rng.below(LAYERS as u64) as usize;
            let key_only = rng.below(8) == 0;
            let n = 1 + rng.below(MAX_TOKENS as u64) as usize;
            let tok0 = rng.below((INPUT_TOKENS - n) as u64) as usize;
            let wide = rng.below(2) == 0;
            let mut slots = own_slots(&owners[0].own[s], n, rng);
            for x in slots.iter_mut() {
                match rng.below(100) {
                    0..=4 => *x = -1 - rng.below(1000) as i64,
                    5..=7 => {
                        *x = if wide && rng.below(2) == 0 {
                            i64::MAX
                        } else {
                            NUM_SLOTS as i64 + rng.below(1 << 20) as i64
                        }
                    }
                    _ => {}
                }
            }
            let at = if wide {
                push(&mut plan.arena, &slots[..])
            } else {
                let narrow: Vec<i32> = slots.iter().map(|&x| x as i32).collect();
                push(&mut plan.arena, &narrow[..])
            };
            let input = TokenLayout::contiguous(n, HEADS, DIM, ELEM);
            let k_at = layer * w.layer_stride;
            let rows = tok0 * ROW..(tok0 + n) * ROW;
            let c = reference::update_slots(
                &model.key[rows.clone()],
                (!key_only).then(|| &model.val[rows]),
                &input,
                &mut model.imgs[0],
                k_at,
                (!key_only).then_some(k_at + w.part_stride),
                &w.layout,
                &slots,
            );
            add_counts(&mut plan.counts, c);
            Op::Slots {
                layer,
                key_only,
                tok0,
                n,
                wide,
                at,
            }
        } else if pick < 35 {
            // Slice update of one layer/part cache of pool 0.
            let layer = rng.below(LAYERS as u64) as usize;
            let part = rng.below(2) as usize;
            let from_value = rng.below(2) == 0;
            let both = rng.below(3) == 0;
            let n = 1 + rng.below(MAX_TOKENS as u64) as usize;
            let tok0 = rng.below((INPUT_TOKENS - n) as u64) as usize;
            let own = &owners[0].own[s];
            let mut slots = own_slots(own, n, rng);
            if rng.below(2) == 0 {
                slots.sort_unstable(); // runs: multi-row slices
            }
            let mut slices = slots_to_slices(&slots, BS).unwrap();
            validate_slices(&slices, BS, NUM_SLOTS, n).unwrap();
            if rng.below(10) == 0 {
                // One slice the kernel must refuse (and count) without writing anything.
                let b = own[rng.below(OWN as u64 - 1) as usize] as i32;
                let bad = match rng.below(4) {
                    0 => Slice {
                        cache_start: NUM_SLOTS as i32 + rng.below(100) as i32,
                        new_kv_start: 0,
                        len: 1,
                    },
                    1 => Slice {
                        cache_start: b * BS as i32,
                        new_kv_start: 0,
                        len: BS as i32 + 1,
                    },
                    2 => Slice {
                        cache_start: b * BS as i32 + BS as i32 - 1,
                        new_kv_start: 0,
                        len: 2,
                    },
                    _ => Slice {
                        cache_start: b * BS as i32,
                        new_kv_start: n as i32,
                        len: 1,
                    },
                };
                let at = rng.below(slices.len() as u64 + 1) as usize;
                slices.insert(at, bad);
            }
            let padded = slices.len() + rng.below(4) as usize;
            let count = match rng.below(50) {
                0 => padded as i32 + 1,
                1 => -1,
                _ => slices.len() as i32,
            };
            let table_at = push(
                &mut plan.arena,
                &slices_to_table(&slices, padded).unwrap()[..],
            );
            let count_at = push(&mut plan.arena, &[count]);
            let mut padded_slices = slices;
            padded_slices.resize(padded, Slice::default());
            let input = TokenLayout::contiguous(n, HEADS, DIM, ELEM);
            let rows = tok0 * ROW..(tok0 + n) * ROW;
            let mut writes = vec![if from_value {
                (&model.val, part)
            } else {
                (&model.key, part)
            }];
            if both {
                writes = vec![(&model.key, 0), (&model.val, 1)];
            }
            // Bad slices and counts are counted once per call, whatever it writes.
            let mut counted = None;
            for (src, p) in writes {
                let at = layer * w.layer_stride + p * w.part_stride;
                let c = reference::update_slices(
                    &src[rows.clone()],
                    &input,
                    &mut model.imgs[0][at..],
                    &w.layout,
                    &padded_slices,
                    count,
                );
                counted.get_or_insert(c);
            }
            add_counts(&mut plan.counts, counted.unwrap());
            Op::Slices {
                layer,
                part,
                from_value,
                both,
                tok0,
                n,
                padded,
                table_at,
                count_at,
            }
        } else {
            // Block copy between two of the pools (possibly the same one).
            let mode = match rng.below(100) {
                0..=34 => Mode::KernelDevice,
                35..=69 => Mode::Dma,
                70..=89 => Mode::KernelStaged,
                90..=94 => Mode::Auto,
                _ => Mode::AutoScratch,
            };
            let (src, dst) = (rng.below(4) as usize, rng.below(4) as usize);
            // Pinned -> pinned DMA is synchronous with respect to the host (CUDA's API
            // synchronisation rules); whether it still waits for the work queued before it
            // is tested on its own (`pinned_to_pinned_dma_is_stream_ordered`), not here.
            let mode = if mode == Mode::Dma && ON_HOST[src] && ON_HOST[dst] {
                Mode::KernelStaged
            } else {
                mode
            };
            let own_d = &owners[dst].own[s];
            let mut pairs: Vec<[i64; 2]> = if mode == Mode::Dma && rng.below(3) == 0 {
                // A run of consecutive ids on both sides (merged into one copy when whole
                // blocks are contiguous on both sides).
                let r = 1 + rng.below(MAX_COPY as u64) as usize;
                let j = rng.below((OWN - r + 1) as u64) as usize;
                let s0 = rng.below((READ_ONLY - r + 1) as u64) as usize;
                (0..r)
                    .map(|i| [owners[src].read_only[s0 + i], own_d[j + i]])
                    .collect()
            } else {
                let k = 1 + rng.below(MAX_COPY as u64) as usize;
                let mut dsts = own_d.clone();
                rng.shuffle(&mut dsts);
                dsts.truncate(k);
                // Sources: shared read-only blocks, or this stream's own blocks (written
                // earlier on this stream), never a block this copy writes.
                let srcs: Vec<i64> = owners[src]
                    .read_only
                    .iter()
                    .chain(&owners[src].own[s])
                    .copied()
                    .filter(|b| src != dst || !dsts.contains(b))
                    .collect();
                dsts.iter()
                    .map(|&d| [srcs[rng.below(srcs.len() as u64) as usize], d])
                    .collect()
            };
            if rng.below(4) == 0 {
                // Padding: skipped silently.
                let any = rng.below(NB as u64) as i64;
                let pad = [[-1, -1], [-1, any], [any, -1], [i64::MIN, any]][rng.below(4) as usize];
                let at = rng.below(pairs.len() as u64 + 1) as usize;
                pairs.insert(at, pad);
            }
            if mode == Mode::KernelDevice && rng.below(5) == 0 {
                // An id past its pool: skipped and counted by the kernel.
                let d = own_d[0];
                let bad = [
                    [NB as i64 + rng.below(100) as i64, d],
                    [owners[src].read_only[0], NB as i64],
                    [i64::MAX, d],
                    [1 << 40, 1 << 40],
                ][rng.below(4) as usize];
                let at = rng.below(pairs.len() as u64 + 1) as usize;
                pairs.insert(at, bad);
            }
            assert!(pairs.len() <= MAX_PAIRS);
            let flat: Vec<i64> = pairs.iter().flatten().copied().collect();
            let map_at = if mode == Mode::KernelDevice {
                push(&mut plan.arena, &flat[..])
            } else {
                0
            };
            let max_ctas = match rng.below(3) {
                0 => None,
                _ => Some(1 + rng.below(8) as u32),
            };
            let (sd, dd) = (model.descs[src], model.descs[dst]);
            let c = if src == dst {
                let snapshot = model.imgs[src].clone();
                reference::copy_blocks(&sd, &snapshot, &dd, &mut model.imgs[dst], &pairs)
            } else {
                let mut out = std::mem::take(&mut model.imgs[dst]);
                let c = reference::copy_blocks(&sd, &model.imgs[src], &dd, &mut out, &pairs);
                model.imgs[dst] = out;
                c
            };
            add_counts(&mut plan.counts, c);
            Op::Copy {
                src,
                dst,
                pairs,
                mode,
                map_at,
                max_ctas,
            }
        };
        plan.ops.push(op);
    }
}

/// Everything the enqueuing threads share.
struct Shared<'a> {
    pools: &'a [Pool],
    key: DeviceBytes<'a>,
    val: DeviceBytes<'a>,
    errors: &'a DeviceErrors,
}

/// Enqueues one planned operation on `stream`.
fn enqueue(
    g: &Gpu,
    sh: &Shared<'_>,
    op: &Op,
    arena: DeviceBytes,
    staging: DeviceBytesMut,
    stream: &Stream,
    what: &str,
) {
    let sref = StreamRef::from(stream);
    fn rows<'a>(src: DeviceBytes<'a>, tok0: usize, n: usize) -> DeviceBytes<'a> {
        src.slice(tok0 * ROW, n * ROW).unwrap()
    }
    match *op {
        Op::Slots {
            layer,
            key_only,
            tok0,
            n,
            wide,
            at,
        } => {
            let (k, v, layout) = sh.pools[0].pool().layer_view_mut(layer).unwrap();
            let slots = if wide {
                SlotMapping::I64(arena.slice(at, n * 8).unwrap())
            } else {
                SlotMapping::I32(arena.slice(at, n * 4).unwrap())
            };
            let up = SlotUpdate {
                key: kvio::CacheWrite {
                    src: rows(sh.key, tok0, n),
                    dst: k,
                },
                value: ((!key_only).then(|| rows(sh.val, tok0, n)))
                    .zip(if key_only { None } else { v })
                    .map(|(src, dst)| kvio::CacheWrite { src, dst }),
                input: TokenLayout::contiguous(n, HEADS, DIM, ELEM),
                cache: layout,
                value_layout: None,
                slots,
                errors: Some(sh.errors),
                quantize: None,
            };
            g.kv.update_slots(&up, sref)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        }
        Op::Slices {
            layer,
            part,
            from_value,
            both,
            tok0,
            n,
            padded,
            table_at,
            count_at,
        } => {
            let (k, v, layout) = sh.pools[0].pool().layer_view_mut(layer).unwrap();
            if both {
                let up = SliceUpdate::new(
                    rows(sh.key, tok0, n),
                    TokenLayout::contiguous(n, HEADS, DIM, ELEM),
                    k,
                    layout,
                    arena.slice(table_at, padded * 12).unwrap(),
                    padded,
                    arena.slice(count_at, 4).unwrap(),
                )
                .value(rows(sh.val, tok0, n), v.unwrap())
                .errors(sh.errors);
                g.kv.update_slices(&up, sref)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                return;
            }
            let up = SliceUpdate {
                new_kv: rows(if from_value { sh.val } else { sh.key }, tok0, n),
                input: TokenLayout::contiguous(n, HEADS, DIM, ELEM),
                cache: if part == 0 { k } else { v.unwrap() },
                layout,
                slices: arena.slice(table_at, padded * 12).unwrap(),
                padded,
                num_slices: arena.slice(count_at, 4).unwrap(),
                errors: Some(sh.errors),
                value: None,
                value_layout: None,
                quantize: None,
                slot_list: None,
            };
            g.kv.update_slices(&up, sref)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        }
        Op::Copy {
            src,
            dst,
            ref pairs,
            mode,
            map_at,
            max_ctas,
        } => {
            let map = match mode {
                Mode::KernelDevice => BlockMap::Device {
                    pairs: arena.slice(map_at, pairs.len() * 16).unwrap(),
                    len: pairs.len(),
                },
                _ => BlockMap::Host(pairs),
            };
            let backend = match mode {
                Mode::KernelDevice | Mode::KernelStaged => Backend::Kernel,
                Mode::Dma => Backend::Dma,
                Mode::Auto | Mode::AutoScratch => Backend::Auto,
            };
            let copy = BlockCopy {
                src: sh.pools[src].pool().into(),
                dst: sh.pools[dst].pool(),
                map,
                backend,
                max_ctas,
                staging: matches!(mode, Mode::KernelStaged | Mode::Auto).then_some(staging),
                errors: Some(sh.errors),
            };
            let used =
                g.kv.copy_blocks(&copy, sref)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            if backend != Backend::Auto {
                assert_eq!(used, backend, "{what}");
            }
        }
    }
}

/// Compares every pool with the model at a checkpoint; returns what differs.
fn compare_pools(pools: &[Pool], want: &[Vec<u8>]) -> (Vec<String>, u64, u64) {
    let mut failures = Vec::new();
    let (mut sum_got, mut sum_want) = (0u64, 0u64);
    for (pool, want) in pools.iter().zip(want) {
        let got = pool.mem.read();
        sum_got = sum_got.rotate_left(7) ^ checksum(&got);
        sum_want = sum_want.rotate_left(7) ^ checksum(want);
        let bad_bytes = got.iter().zip(want).filter(|(a, b)| a != b).count();
        if bad_bytes != 0 {
            let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
            failures.push(format!(
                "pool {}: {bad_bytes} bytes differ, the first at byte {first} of {POOL_BYTES}: \
                 got {}, want {}",
                pool.name, got[first], want[first]
            ));
        }
    }
    (failures, sum_got, sum_want)
}

/// 10,000 random operations on 8 streams over shared pools, checked bit for bit.
#[test]
fn many_streams_random_ops_nothing_lost() {
    let Some(g) = gpu("stress") else { return };
    let total_ops = env_usize("KVIO_STRESS_OPS", 10_000).max(STREAMS);
    let per_stream = total_ops / STREAMS;
    let t0 = Instant::now();

    let (pools, init) = make_pools();
    let key_h = random_bytes(INPUT_TOKENS * ROW, 0xC0FFEE);
    let val_h = random_bytes(INPUT_TOKENS * ROW, 0xBADCAB);
    let mut key_d = Mem::new(false, key_h.len());
    let mut val_d = Mem::new(false, val_h.len());
    key_d.fill(&key_h);
    val_d.fill(&val_h);
    let mut rng = Rng::new(2024);
    let owners: Vec<Owners> = (0..pools.len()).map(|_| owners(&mut rng)).collect();
    let mut model = Model {
        imgs: init,
        descs: pools.iter().map(|p| p.image()).collect(),
        key: key_h,
        val: val_h,
    };
    let (plans, checkpoints) = plan_all(per_stream, &owners, &mut model);
    let mut per_kind: Vec<(&str, usize)> = Vec::new();
    for op in plans.iter().flat_map(|p| &p.ops) {
        match per_kind.iter_mut().find(|(k, _)| *k == op.label()) {
            Some((_, n)) => *n += 1,
            None => per_kind.push((op.label(), 1)),
        }
    }
    let arenas: Vec<Mem> = plans
        .iter()
        .map(|p| {
            let mut m = Mem::new(false, p.arena.len());
            m.fill(&p.arena);
            m
        })
        .collect();
    let stagings: Vec<Mem> = (0..STREAMS)
        .map(|s| {
            let mut m = Mem::new(false, MAX_PAIRS * 16);
            m.fill(&random_bytes(MAX_PAIRS * 16, 77 + s as u64));
            m
        })
        .collect();
    let errors = DeviceErrors::new().unwrap();
    let streams: Vec<Stream> = (0..STREAMS).map(|_| g.stream()).collect();
    let planned = t0.elapsed();

    // Phase by phase: one host thread per stream, all enqueuing at once; then every stream
    // is synchronised and every pool compared with the model.
    let shared = Shared {
        pools: &pools,
        key: key_d.bytes(),
        val: val_d.bytes(),
        errors: &errors,
    };
    let (mut ran, mut checked) = (Duration::ZERO, Duration::ZERO);
    let mut done = 0;
    let mut last = (0, 0, ErrorCounts::default());
    for (k, cp) in checkpoints.iter().enumerate() {
        let t1 = Instant::now();
        let start = Barrier::new(STREAMS);
        std::thread::scope(|scope| {
            for s in 0..STREAMS {
                let (plan, arena, staging) =
                    (&plans[s], arenas[s].bytes(), stagings[s].bytes_mut());
                let (stream, shared, start) = (&streams[s], &shared, &start);
                scope.spawn(move || {
                    let g = gpu("stress thread").expect("GPU vanished");
                    start.wait();
                    for (i, op) in plan.ops.iter().enumerate().take(cp.ops).skip(done) {
                        let what = format!("stream {s} op {i} ({op:?})");
                        enqueue(g, shared, op, arena, staging, stream, &what);
                    }
                    stream.synchronize().unwrap_or_else(|e| {
                        panic!("stream {s}: {e:?} (a kernel fault shows here)")
                    });
                });
            }
        });
        ran += t1.elapsed();
        let t2 = Instant::now();
        let (failures, sum_got, sum_want) = compare_pools(&pools, &cp.imgs);
        let counts = errors.read(StreamRef::from(&streams[0])).unwrap();
        checked += t2.elapsed();
        eprintln!(
            "stress: checkpoint {}/{}: {} ops per stream, checksum got {sum_got:016x} want \
             {sum_want:016x}, error word {counts:?}",
            k + 1,
            checkpoints.len(),
            cp.ops
        );
        assert!(
            failures.is_empty(),
            "checkpoint {} (ops {done}..{} of each stream): lost or stray writes:\n{}",
            k + 1,
            cp.ops,
            failures.join("\n")
        );
        assert_eq!(counts, cp.counts, "checkpoint {}: error word", k + 1);
        assert_eq!(sum_got, sum_want);
        done = cp.ops;
        last = (sum_got, sum_want, counts);
    }
    for (k, n) in &per_kind {
        eprintln!("stress: {n:>6} x {k}");
    }
    eprintln!(
        "stress: {} ops on {STREAMS} streams: planned in {planned:.2?}, enqueued and ran in \
         {ran:.2?}, checked in {checked:.2?}; final checksum {:016x} (model {:016x}); error \
         word {:?}",
        done * STREAMS,
        last.0,
        last.1,
        last.2
    );
    assert_eq!(done, per_stream);
    // The run really did something: some of every kind.
    assert!(per_kind.len() >= 6 || per_stream < 50, "{per_kind:?}");
}

// ---- conflicting targets ------------------------------------------------------------------

/// What an application does with a host-held slot list: validate it, then upload and launch.
/// Returns the validation error without launching anything.
fn submit_slots<S: kvio::plan::SlotIndex + cust::memory::DeviceCopy>(
    g: &Gpu,
    pool: &Pool,
    layer: usize,
    input: (DeviceBytes<'_>, DeviceBytes<'_>),
    slots: &[S],
    i64s: bool,
    stream: &Stream,
) -> kvio::Result<()> {
    let (k, v, layout) = pool.pool().layer_view_mut(layer)?;
    validate_slots(slots, layout.num_slots())?;
    let dev = upload(slots);
    let n = slots.len();
    g.kv.update_slots(
        &SlotUpdate {
            key: kvio::CacheWrite {
                src: input.0.slice(0, n * ROW)?,
                dst: k,
            },
            value: (Some(input.1.slice(0, n * ROW)?))
                .zip(v)
                .map(|(src, dst)| kvio::CacheWrite { src, dst }),
            input: TokenLayout::contiguous(n, HEADS, DIM, ELEM),
            cache: layout,
            value_layout: None,
            slots: if i64s {
                SlotMapping::I64(DeviceBytes::of(&dev))
            } else {
                SlotMapping::I32(DeviceBytes::of(&dev))
            },
            errors: None,
            quantize: None,
        },
        StreamRef::from(stream),
    )?;
    stream.synchronize().expect("cuStreamSynchronize");
    Ok(())
}

/// Conflicting targets inside one call are rejected by validation, typed, with nothing
/// launched: pools, staging and error word unchanged.
#[test]
fn conflicting_targets_rejected_nothing_launched() {
    let Some(g) = gpu("conflicts") else { return };
    let stream = g.stream();
    let sref = StreamRef::from(&stream);
    let (pools, _) = make_pools();
    let mut staging = Mem::new(false, 64 * 16);
    staging.fill(&random_bytes(64 * 16, 99));
    let errors = DeviceErrors::new().unwrap();
    let key_h = random_bytes(MAX_TOKENS * ROW, 0xAB);
    let val_h = random_bytes(MAX_TOKENS * ROW, 0xCD);
    let (key_d, val_d) = (upload(&key_h), upload(&val_h));
    let input = (DeviceBytes::of(&key_d), DeviceBytes::of(&val_d));
    let snapshot = |pools: &[Pool], staging: &Mem| -> Vec<Vec<u8>> {
        stream.synchronize().expect("cuStreamSynchronize");
        pools
            .iter()
            .map(|p| p.mem.read())
            .chain([staging.read()])
            .collect()
    };
    let unchanged = |what: &str, before: &[Vec<u8>], pools: &[Pool], staging: &Mem| {
        let now = snapshot(pools, staging);
        for (i, (a, b)) in now.iter().zip(before).enumerate() {
            let name = pools.get(i).map_or("staging", |p| p.name);
            assert_same(&format!("{what}: {name} changed"), a, b);
        }
        assert!(
            errors.read(sref).unwrap().is_clean(),
            "{what}: error word touched"
        );
    };
    let before = snapshot(&pools, &staging);

    // -- slot lists: the same slot twice (a write-write race) --------------------------------
    let good: Vec<i64> = (0..20).map(|i| 40 + 3 * i).collect();
    let mut dup = good.clone();
    dup[17] = good[3];
    let r = submit_slots(g, &pools[0], 1, input, &dup, true, &stream);
    assert_eq!(
        r,
        Err(Error::Overlap {
            name: "slots",
            first: 3,
            second: 17
        })
    );
    let dup32: Vec<i32> = dup.iter().map(|&x| x as i32).collect();
    let r = submit_slots(g, &pools[0], 0, input, &dup32, false, &stream);
    assert_eq!(
        r,
        Err(Error::Overlap {
            name: "slots",
            first: 3,
            second: 17
        })
    );
    // A negative slot twice is padding, not a conflict; two tokens to one slot far apart are.
    assert_eq!(validate_slots(&[-1i64, 5, -1, 6], NUM_SLOTS), Ok(()));
    assert!(matches!(
        validate_slots(&[7i64, 1, 2, 3, 4, 5, 7], NUM_SLOTS),
        Err(Error::Overlap {
            name: "slots",
            first: 0,
            second: 6
        })
    ));
    unchanged("duplicate slots", &before, &pools, &staging);

    // -- slice lists: two slices covering one slot --------------------------------------------
    let overlapping = [
        Slice {
            cache_start: 32,
            new_kv_start: 0,
            len: 4,
        },
        Slice {
            cache_start: 64,
            new_kv_start: 4,
            len: 1,
        },
        Slice {
            cache_start: 34,
            new_kv_start: 5,
            len: 2,
        },
    ];
    assert_eq!(
        validate_slices(&overlapping, BS, NUM_SLOTS, 8),
        Err(Error::Overlap {
            name: "slices",
            first: 0,
            second: 2
        })
    );

    // -- K and V views on the same bytes ------------------------------------------------------
    let (k, _, layout) = pools[0].pool().layer_view_mut(0).unwrap();
    let slots_d = upload(&good);
    let r = g.kv.update_slots(
        &SlotUpdate {
            key: kvio::CacheWrite {
                src: input.0.slice(0, 20 * ROW).unwrap(),
                dst: k,
            },
            value: Some(kvio::CacheWrite {
                src: input.1.slice(0, 20 * ROW).unwrap(),
                dst: k,
            }),
            input: TokenLayout::contiguous(20, HEADS, DIM, ELEM),
            cache: layout,
            value_layout: None,
            slots: SlotMapping::I64(DeviceBytes::of(&slots_d)),
            errors: Some(&errors),
            quantize: None,
        },
        sref,
    );
    assert!(
        matches!(
            r,
            Err(Error::InvalidArgument {
                name: "value_cache",
                ..
            })
        ),
        "{r:?}"
    );
    unchanged("K/V views overlap", &before, &pools, &staging);

    // -- block maps -------------------------------------------------------------------------
    // Ten valid pairs, then the conflicting one last: a backend that started copying before
    // validating the whole map would leave the first ten copied.
    let ten: Vec<[i64; 2]> = (0..10).map(|i| [10 + i, 20 + i]).collect();
    let with = |extra: [i64; 2]| -> Vec<[i64; 2]> { ten.iter().copied().chain([extra]).collect() };
    let dup_dst = Error::Overlap {
        name: "map.dst",
        first: 2,
        second: 10,
    };
    let read_written = Error::Overlap {
        name: "map",
        first: 1,
        second: 10,
    };
    // (what, source pool, destination pool): the ten pairs and one conflicting pair.
    let dup_dst_cases = [
        ("duplicate destination, GPU -> pinned", 0, 2),
        ("duplicate destination, pinned -> GPU", 2, 0),
        ("duplicate destination, GPU -> GPU (NHD -> HND)", 0, 1),
        ("duplicate destination, pinned -> pinned (table)", 2, 3),
    ];
    let read_written_cases = [
        ("block read and written, one cross-layer pool", 0, 0),
        ("block read and written, one table pool", 1, 1),
        ("block read and written, one pinned pool", 2, 2),
    ];
    let case = |(what, src, dst): (&'static str, usize, usize), extra, want: &Error| {
        let (s, d) = (pools[src].pool(), pools[dst].pool());
        (what, s, d, with(extra), want.clone())
    };
    #[allow(clippy::type_complexity)]
    let mut cases: Vec<(
        &str,
        BlockPool<'_, Writable>,
        BlockPool<'_, Writable>,
        Vec<[i64; 2]>,
        Error,
    )> = dup_dst_cases
        .into_iter()
        .map(|c| case(c, [40, 22], &dup_dst))
        .chain(
            read_written_cases
                .into_iter()
                .map(|c| case(c, [30, 11], &read_written)),
        )
        .collect();
    cases.extend([
        (
            "block copied onto itself",
            pools[0].pool(),
            pools[0].pool(),
            vec![[5, 5]],
            Error::Overlap {
                name: "map",
                first: 0,
                second: 0,
            },
        ),
        (
            "same memory seen as NHD and HND",
            pools[0].view(Kind::CrossNhd),
            pools[0].view(Kind::CrossHnd),
            vec![[3, 7], [7, 9]],
            Error::Overlap {
                name: "map",
                first: 1,
                second: 0,
            },
        ),
    ]);
    for (what, src, dst, pairs, want) in &cases {
        for backend in [Backend::Dma, Backend::Kernel, Backend::Auto] {
            let r = g.kv.copy_blocks(
                &BlockCopy {
                    src: (*src).into(),
                    dst: *dst,
                    map: BlockMap::Host(pairs),
                    backend,
                    max_ctas: None,
                    staging: Some(staging.bytes_mut()),
                    errors: Some(&errors),
                },
                sref,
            );
            assert_eq!(r, Err(want.clone()), "{what} ({backend:?})");
        }
        unchanged(what, &before, &pools, &staging);
    }

    // -- positive controls: the same calls without the conflict do write -------------------
    let descs: Vec<PoolImage> = pools.iter().map(|p| p.image()).collect();
    let mut want_pinned = before[2].clone();
    reference::copy_blocks(&descs[0], &before[0], &descs[2], &mut want_pinned, &ten);
    for backend in [Backend::Dma, Backend::Kernel] {
        let used =
            g.kv.copy_blocks(
                &BlockCopy {
                    src: pools[0].pool().into(),
                    dst: pools[2].pool(),
                    map: BlockMap::Host(&ten),
                    backend,
                    max_ctas: None,
                    staging: Some(staging.bytes_mut()),
                    errors: Some(&errors),
                },
                sref,
            )
            .unwrap();
        assert_eq!(used, backend);
        stream.synchronize().unwrap();
        let got = pools[2].mem.read();
        assert_same(&format!("control copy ({backend:?})"), &got, &want_pinned);
        assert_ne!(got, before[2], "control copy changed nothing");
    }
    let mut want0 = before[0].clone();
    let d0 = descs[0];
    reference::update_slots(
        &key_h[..20 * ROW],
        Some(&val_h[..20 * ROW]),
        &TokenLayout::contiguous(20, HEADS, DIM, ELEM),
        &mut want0,
        d0.layer_stride,
        Some(d0.layer_stride + d0.part_stride),
        &d0.layout,
        &good,
    );
    submit_slots(g, &pools[0], 1, input, &good, true, &stream).unwrap();
    let got0 = pools[0].mem.read();
    assert_same("control slot update", &got0, &want0);
    assert_ne!(got0, before[0], "control slot update changed nothing");
}

/// DMA between two pinned pools must not overtake work queued before it on the same stream:
/// CUDA performs host-to-host copies synchronously with respect to the host, so a backend that
/// handed them to the driver without ordering could read a block before the kernel queued
/// ahead of it has written it. A slow one-CTA kernel copy fills every block of a pinned pool;
/// then two of those blocks are copied by DMA into another pinned pool.
#[test]
fn pinned_to_pinned_dma_is_stream_ordered() {
    let Some(g) = gpu("pinned -> pinned order") else {
        return;
    };
    let stream = g.stream();
    let sref = StreamRef::from(&stream);
    let (mut pools, init) = make_pools();
    let all: Vec<[i64; 2]> = (0..NB as i64).map(|b| [b, b]).collect();
    let map = upload(&all.iter().flatten().copied().collect::<Vec<i64>>());
    let tail = [[NB as i64 - 1, 0], [NB as i64 / 2, 1]];
    let descs: Vec<PoolImage> = pools.iter().map(|p| p.image()).collect();
    let mut want2 = init[2].clone();
    reference::copy_blocks(&descs[0], &init[0], &descs[2], &mut want2, &all);
    let mut want3 = init[3].clone();
    reference::copy_blocks(&descs[2], &want2, &descs[3], &mut want3, &tail);
    for round in 0..3 {
        if round > 0 {
            // Put the old contents back (nothing is in flight).
            stream.synchronize().unwrap();
            for i in [2, 3] {
                pools[i].mem.fill(&init[i]);
            }
        }
        let fill = BlockCopy {
            src: pools[0].pool().into(),
            dst: pools[2].pool(),
            map: BlockMap::Device {
                pairs: DeviceBytes::of(&map),
                len: all.len(),
            },
            backend: Backend::Kernel,
            max_ctas: Some(1),
            staging: None,
            errors: None,
        };
        let h2h = BlockCopy {
            src: pools[2].pool().into(),
            dst: pools[3].pool(),
            map: BlockMap::Host(&tail),
            backend: Backend::Dma,
            max_ctas: None,
            staging: None,
            errors: None,
        };
        assert_eq!(g.kv.copy_blocks(&fill, sref).unwrap(), Backend::Kernel);
        assert_eq!(g.kv.copy_blocks(&h2h, sref).unwrap(), Backend::Dma);
        stream.synchronize().unwrap();
        assert_same(
            &format!("round {round}: pinned pool filled by the kernel"),
            &pools[2].mem.read(),
            &want2,
        );
        assert_same(
            &format!(
                "round {round}: pinned -> pinned DMA read its source before the kernel queued \
                 ahead of it on the same stream had written it"
            ),
            &pools[3].mem.read(),
            &want3,
        );
    }
}
