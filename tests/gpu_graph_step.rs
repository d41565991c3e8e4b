//! One "serving step" of a 32-layer model captured in a CUDA graph and replayed 100 times:
//! the slot update of every layer (the layer views of one cross-layer block pool) followed by
//! a kernel-backend offload of a few blocks (device-resident block map) to a pinned host pool.
//! Between replays the device-side inputs, slots and block map change — by async copies from
//! pinned staging on the replay stream, or by synchronous copies after a stream sync — and
//! every replay is checked bit for bit against `kvio::reference` (whole device pool, whole
//! pinned pool, error word). Skips without a GPU unless `KVIO_REQUIRE_GPU=1`.

use cust::memory::DeviceBuffer;
use cust::sys as cu;
use kvio::reference::{self, PoolImage};
use kvio::Stream;
use kvio::{
    Backend, BlockCopy, BlockMap, BlockPool, DeviceBytes, DeviceErrors, ErrorCounts, PinnedHost,
    SlotMapping, SlotUpdate, StreamRef, TokenLayout,
};
use kvio_suite::{assert_same, gpu, overwrite, random_bytes, upload, Graph, Mem, Rng};

const LAYERS: usize = 32;
const BLOCKS: usize = 96;
const HOST_BLOCKS: usize = 48;
const BS: usize = 16;
const HEADS: usize = 4;
const DIM: usize = 64;
const ELEM: usize = 2;
/// Tokens written per step (per layer).
const TOKENS: usize = 64;
/// Capacity of the offload block map (unused entries are `[-1, -1]` padding).
const MAP_CAP: usize = 6;
const REPLAYS: u64 = 100;

/// The step's changing inputs, as host data.
struct StepData {
    /// `[L, T, H, D]` new keys.
    keys: Vec<u8>,
    /// `[L, T, H, D]` new values.
    values: Vec<u8>,
    /// One slot per token (shared by every layer); negative = skip, past the pool = counted.
    slots: Vec<i64>,
    /// `MAP_CAP` pairs `(gpu block, host block)`.
    pairs: Vec<[i64; 2]>,
}

fn step_data(replay: u64, rng: &mut Rng, in_bytes: usize) -> StepData {
    let num_slots = (BLOCKS * BS) as i64;
    let mut all: Vec<i64> = (0..num_slots).collect();
    rng.shuffle(&mut all);
    let mut slots = all[..TOKENS].to_vec();
    for s in slots.iter_mut() {
        match rng.below(32) {
            0 => *s = -1,
            1 => *s = num_slots + rng.below(1000) as i64,
            _ => {}
        }
    }
    // 1..=MAP_CAP real pairs; sources often the blocks just written; distinct destinations.
    let real = 1 + rng.below(MAP_CAP as u64) as usize;
    let mut dsts: Vec<i64> = (0..HOST_BLOCKS as i64).collect();
    rng.shuffle(&mut dsts);
    let mut pairs: Vec<[i64; 2]> = (0..MAP_CAP)
        .map(|i| {
            if i >= real {
                [-1, -1]
            } else if rng.below(2) == 0 && slots[i] >= 0 && slots[i] < num_slots {
                [slots[i] / BS as i64, dsts[i]]
            } else {
                [rng.below(BLOCKS as u64) as i64, dsts[i]]
            }
        })
        .collect();
    if replay % 10 == 3 {
        // A block id past the GPU pool: skipped by the kernel and counted.
        pairs[MAP_CAP - 1] = [BLOCKS as i64 + 7, dsts[MAP_CAP - 1]];
    }
    StepData {
        keys: random_bytes(LAYERS * in_bytes, 1000 + replay),
        values: random_bytes(LAYERS * in_bytes, 2000 + replay),
        slots,
        pairs,
    }
}

/// Enqueues `host[off..off + len]` → `dst` on `stream` (pinned source: truly asynchronous).
fn copy_async(dst: u64, staging: &PinnedHost, off: usize, len: usize, stream: &Stream) {
    let src = staging.as_slice().expect("wait")[off..off + len].as_ptr();
    // SAFETY: `dst` holds `len` bytes; the pinned source stays untouched until the stream is
    // synchronised (the test waits for every replay before writing staging again).
    let r = unsafe { cu::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, stream.cu_stream()) };
    assert_eq!(r, cu::CUresult::CUDA_SUCCESS, "cuMemcpyHtoDAsync");
}

#[test]
fn graph_serving_step_replays() {
    let Some(g) = gpu("graph serving step") else {
        return;
    };
    let stream = g.stream();
    let pool_bytes = BLOCKS * LAYERS * 2 * BS * HEADS * DIM * ELEM;
    let host_bytes = HOST_BLOCKS * LAYERS * 2 * BS * HEADS * DIM * ELEM;
    let input = TokenLayout::contiguous(TOKENS, HEADS, DIM, ELEM);
    let in_bytes = input.extent("input").unwrap() as usize;

    // Pools, poisoned: the device pool evolves over the replays, and so does its mirror.
    let mut gpu_pool = Mem::new(false, pool_bytes);
    let mut host_pool = Mem::new(true, host_bytes);
    let mut gpu_mirror = random_bytes(pool_bytes, 1);
    let mut host_mirror = random_bytes(host_bytes, 2);
    gpu_pool.fill(&gpu_mirror);
    host_pool.fill(&host_mirror);
    let dev =
        BlockPool::cross_layer_nhd(gpu_pool.bytes_mut(), BLOCKS, LAYERS, BS, HEADS, DIM, ELEM);
    let host = BlockPool::cross_layer_nhd(
        host_pool.bytes_mut(),
        HOST_BLOCKS,
        LAYERS,
        BS,
        HEADS,
        DIM,
        ELEM,
    );
    let dev_img = PoolImage::of(&dev).expect("cross-layer pools are strided");
    let host_img = PoolImage::of(&host).expect("cross-layer pools are strided");

    // Device-side step inputs, rewritten between replays (the graph holds their addresses).
    let mut keys: DeviceBuffer<u8> = upload(&vec![0u8; LAYERS * in_bytes]);
    let mut values: DeviceBuffer<u8> = upload(&vec![0u8; LAYERS * in_bytes]);
    let mut slots_d: DeviceBuffer<i64> = upload(&[-1i64; TOKENS]);
    let mut map_d: DeviceBuffer<i64> = upload(&[-1i64; 2 * MAP_CAP]);
    let errors = DeviceErrors::new().unwrap();
    // Pinned staging for the async updates: [slots | map | keys | values].
    let (slots_at, map_at, keys_at) = (0, TOKENS * 8, TOKENS * 8 + MAP_CAP * 16);
    let values_at = keys_at + LAYERS * in_bytes;
    let mut staging = PinnedHost::alloc(values_at + LAYERS * in_bytes).unwrap();

    // The step: every layer's slot update, then the offload; captured once.
    let kd = DeviceBytes::of(&keys);
    let vd = DeviceBytes::of(&values);
    let ops: Vec<SlotUpdate<'_>> = (0..LAYERS)
        .map(|l| {
            let (k, v, layout) = dev.layer_view_mut(l).unwrap();
            SlotUpdate {
                key: kvio::CacheWrite {
                    src: kd.slice(l * in_bytes, in_bytes).unwrap(),
                    dst: k,
                },
                value: (Some(vd.slice(l * in_bytes, in_bytes).unwrap()))
                    .zip(v)
                    .map(|(src, dst)| kvio::CacheWrite { src, dst }),
                input,
                cache: layout,
                value_layout: None,
                slots: SlotMapping::I64(DeviceBytes::of(&slots_d)),
                errors: Some(&errors),
                quantize: None,
            }
        })
        .collect();
    let offload = BlockCopy {
        src: dev.into(),
        dst: host,
        map: BlockMap::Device {
            pairs: DeviceBytes::of(&map_d),
            len: MAP_CAP,
        },
        backend: Backend::Kernel,
        max_ctas: Some(4),
        staging: None,
        errors: Some(&errors),
    };
    let graph = Graph::retrying(&stream, |s| {
        errors.reset(s)?;
        for op in &ops {
            g.kv.update_slots(op, s)?;
        }
        let used = g.kv.copy_blocks(&offload, s)?;
        assert_eq!(used, Backend::Kernel);
        Ok(())
    });

    let mut rng = Rng::new(2024);
    let layer_layout = dev.layer_view(0).unwrap().2;
    for replay in 0..REPLAYS {
        let d = step_data(replay, &mut rng, in_bytes);
        if replay % 2 == 0 {
            // Async copies from pinned staging, queued on the replay stream before the graph.
            let st = staging.as_mut_slice().expect("wait");
            st[slots_at..map_at].copy_from_slice(bytemuck::cast_slice(&d.slots));
            st[map_at..keys_at].copy_from_slice(bytemuck::cast_slice(&d.pairs));
            st[keys_at..values_at].copy_from_slice(&d.keys);
            st[values_at..].copy_from_slice(&d.values);
            let s = &stream;
            copy_async(
                DeviceBytes::of(&slots_d).ptr(),
                &staging,
                slots_at,
                TOKENS * 8,
                s,
            );
            copy_async(
                DeviceBytes::of(&map_d).ptr(),
                &staging,
                map_at,
                MAP_CAP * 16,
                s,
            );
            let (kd, vd) = (DeviceBytes::of(&keys).ptr(), DeviceBytes::of(&values).ptr());
            copy_async(kd, &staging, keys_at, LAYERS * in_bytes, s);
            copy_async(vd, &staging, values_at, LAYERS * in_bytes, s);
        } else {
            // Synchronous copies after a stream sync.
            overwrite(&mut slots_d, &d.slots, &stream);
            let flat: Vec<i64> = d.pairs.iter().flatten().copied().collect();
            overwrite(&mut map_d, &flat, &stream);
            overwrite(&mut keys, &d.keys, &stream);
            overwrite(&mut values, &d.values, &stream);
        }
        graph.launch(&stream);
        stream
            .synchronize()
            .unwrap_or_else(|e| panic!("replay {replay}: {e:?}"));

        // Reference: the same step on the mirrors, in the same order.
        let mut want = ErrorCounts::default();
        let part = BS * HEADS * DIM * ELEM;
        for l in 0..LAYERS {
            let k_at = l * 2 * part;
            let c = reference::update_slots(
                &d.keys[l * in_bytes..(l + 1) * in_bytes],
                Some(&d.values[l * in_bytes..(l + 1) * in_bytes]),
                &input,
                &mut gpu_mirror,
                k_at,
                Some(k_at + part),
                &layer_layout,
                &d.slots,
            );
            want.bad_slots += c.bad_slots;
        }
        let c =
            reference::copy_blocks(&dev_img, &gpu_mirror, &host_img, &mut host_mirror, &d.pairs);
        want.bad_blocks += c.bad_blocks;

        assert_same(
            &format!("replay {replay}: device pool"),
            &gpu_pool.read(),
            &gpu_mirror,
        );
        assert_same(
            &format!("replay {replay}: pinned pool"),
            &host_pool.read(),
            &host_mirror,
        );
        assert_eq!(
            errors.read(StreamRef::from(&stream)).unwrap(),
            want,
            "replay {replay}: error word"
        );
    }
}

/// `Graph::retrying` takes a capture again when it was invalidated: here by the capturing
/// thread itself, which synchronizes the stream inside its first try (CUDA refuses that and
/// invalidates the capture, as it does when another thread synchronizes the device).
#[test]
fn capture_retries_an_invalidated_capture() {
    let Some(g) = gpu("capture retry") else {
        return;
    };
    let stream = g.stream();
    let errors = DeviceErrors::new().unwrap();
    let mut tries = 0;
    let graph = Graph::retrying(&stream, |s| {
        tries += 1;
        if tries == 1 {
            // SAFETY: a valid stream; the call fails (the stream is capturing).
            let r = unsafe { cu::cuStreamSynchronize(stream.cu_stream()) };
            assert_ne!(r, cu::CUresult::CUDA_SUCCESS, "a sync inside a capture");
        }
        errors.reset(s)
    });
    assert_eq!(tries, 2, "one invalidated capture, one retry");
    graph.launch(&stream);
    stream.synchronize().unwrap();
    assert!(errors.read(StreamRef::from(&stream)).unwrap().is_clean());
}
