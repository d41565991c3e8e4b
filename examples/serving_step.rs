//! A small simulated serving loop on a cross-layer KV cache `(NB, L, 2, bs, H, D)`:
//!
//! 1. admission: a new sequence either starts empty or, on a *prefix hit*, gets the first
//!    blocks of a finished sequence back from the pinned host pool (onload);
//! 2. every step each running sequence appends a few tokens: one slot update per layer, on the
//!    layer views of the one cross-layer pool;
//! 3. blocks that became full are offloaded to the pinned host pool (kernel backend, device
//!    block map, 4 CTAs: the SMs stay with the model);
//! 4. sequences that reach their length finish: their blocks stay in the host pool as a
//!    reusable prefix, their GPU blocks are freed (and poisoned).
//!
//! Every stage is verified against the data that went in, and timed with CUDA events on the
//! stream; a per-stage GB/s summary is printed at the end. Without a GPU it says so and exits
//! normally.
//!
//! ```sh
//! cargo run --release --example serving_step
//! ```

use std::collections::VecDeque;
use std::error::Error;

use kvio::{
    Backend, BlockCopy, BlockMap, BlockPool, DeviceAlloc, DeviceErrors, Kvio, PinnedHost,
    PoolMemory, PrimaryContext, SlotMapping, SlotUpdate, StreamRef, TokenLayout,
};
use kvio::{Event, Stream};
use kvio_suite::{random_bytes, Rng};

const LAYERS: usize = 32;
const HEADS: usize = 8;
const DIM: usize = 128;
const ELEM: usize = 2; // bf16
const BS: usize = 16;
const GPU_BLOCKS: usize = 96;
const HOST_BLOCKS: usize = 160;
/// Sequences running at once.
const SEQS: usize = 8;
/// Tokens a sequence has when it finishes (a multiple of BS: every block gets offloaded).
const MAX_LEN: usize = 128;
/// Most tokens a sequence appends per step.
const MAX_STEP: usize = 32;
/// Token capacity of one step's batch (the input and slot buffers are padded to it).
const T_MAX: usize = SEQS * MAX_STEP;
/// Block-map capacity of one offload or onload.
const MAP_CAP: usize = SEQS * (MAX_LEN / BS);
const STEPS: usize = 24;

/// One (K or V) token row of all heads.
const ROW: usize = HEADS * DIM * ELEM;
/// One block: all layers, K and V.
const BLOCK: usize = LAYERS * 2 * BS * ROW;

/// Byte offset of the row of `(block, layer, part, offset)` in a cross-layer NHD pool.
fn row_at(block: usize, layer: usize, part: usize, offset: usize) -> usize {
    block * BLOCK + (layer * 2 + part) * BS * ROW + offset * ROW
}

#[derive(Default)]
struct Seq {
    /// GPU blocks, in token order.
    blocks: Vec<usize>,
    /// Tokens written.
    len: usize,
    /// Host blocks holding its leading full blocks (offloaded or onloaded from a prefix).
    host: Vec<usize>,
}

/// GPU time and bytes of one stage.
#[derive(Default)]
struct Stage {
    bytes: u64,
    ms: f64,
    calls: u32,
    backend: Option<Backend>,
}

impl Stage {
    fn add(&mut self, bytes: usize, start: &Event, stop: &Event) -> Result<(), Box<dyn Error>> {
        stop.synchronize()?;
        self.ms += stop.elapsed_ms(start)? as f64;
        self.bytes += bytes as u64;
        self.calls += 1;
        Ok(())
    }

    fn print(&self, name: &str) {
        let gbps = self.bytes as f64 / (self.ms / 1e3) / 1e9;
        let backend = self.backend.map_or(String::new(), |b| format!(" ({b:?})"));
        println!(
            "  {name:<8} {:>8.1} MiB in {:>4} calls, {:>8.3} ms GPU time: {gbps:>7.1} GB/s{backend}",
            self.bytes as f64 / (1 << 20) as f64,
            self.calls,
            self.ms
        );
    }
}

/// Host-pool bookkeeping: reference counts of host blocks and the finished prefixes.
struct HostPool {
    free: Vec<usize>,
    refs: Vec<u32>,
    prefixes: VecDeque<Vec<usize>>,
}

impl HostPool {
    fn take(&mut self) -> usize {
        while self.free.is_empty() {
            let oldest = self.prefixes.pop_front().expect("host pool too small");
            for b in oldest {
                self.release(b);
            }
        }
        let b = self.free.pop().unwrap();
        self.refs[b] = 1;
        b
    }

    fn retain(&mut self, b: usize) {
        self.refs[b] += 1;
    }

    fn release(&mut self, b: usize) {
        self.refs[b] -= 1;
        if self.refs[b] == 0 {
            self.free.push(b);
        }
    }
}

/// The cross-layer NHD pool of `blocks` blocks over `mem` (read-only or writable, as `mem`).
fn pool<'a, M: PoolMemory<'a>>(mem: M, blocks: usize) -> BlockPool<'a, M::Access> {
    BlockPool::cross_layer_nhd(mem, blocks, LAYERS, BS, HEADS, DIM, ELEM)
}

/// The whole of `mem`, once the work queued on `stream` so far is done.
fn download(mem: &DeviceAlloc, out: &mut Vec<u8>, stream: StreamRef<'_>) -> kvio::Result<()> {
    out.resize(mem.len(), 0);
    mem.read(0, out, stream)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("serving_step: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let _ctx = match PrimaryContext::retain(0) {
        Ok(ctx) => ctx,
        Err(e) => {
            println!("serving_step: no usable CUDA device ({e}); nothing to simulate.");
            return Ok(());
        }
    };
    let kv = Kvio::load()?;
    let stream = Stream::new()?;
    let sref = StreamRef::from(&stream);
    println!(
        "serving_step: {LAYERS} layers x {HEADS} heads x {DIM} (bf16), pages of {BS}; \
         {GPU_BLOCKS} GPU blocks, {HOST_BLOCKS} pinned host blocks of {} MiB; PTX {:?}",
        BLOCK >> 20,
        kv.arch()
    );

    // The two pools' memory: cross-layer NHD on the GPU and in pinned host memory. Each call
    // describes them afresh ([`pool`]): read through a shared borrow, written through an
    // exclusive one, so the host reads below cannot overlap a transfer.
    let mut gpu_mem = DeviceAlloc::new(GPU_BLOCKS * BLOCK)?;
    let mut host_mem = PinnedHost::alloc(HOST_BLOCKS * BLOCK)?;

    // Step inputs `[L, T_MAX, H, D]` for K and V, slots padded with -1, block maps, staging.
    let input = TokenLayout::contiguous(T_MAX, HEADS, DIM, ELEM);
    // Uninitialised: each step writes them (on the stream) before a kvio call reads them.
    let mut keys = DeviceAlloc::new(LAYERS * T_MAX * ROW)?;
    let mut values = DeviceAlloc::new(LAYERS * T_MAX * ROW)?;
    let mut slots_d = DeviceAlloc::new(8 * T_MAX)?;
    let mut map_d = DeviceAlloc::new(16 * MAP_CAP)?;
    let mut staging = DeviceAlloc::new(16 * MAP_CAP)?;
    let errors = DeviceErrors::new()?;

    let mut rng = Rng::new(7);
    let mut free_gpu: Vec<usize> = (0..GPU_BLOCKS).rev().collect();
    let mut hp = HostPool {
        free: (0..HOST_BLOCKS).rev().collect(),
        refs: vec![0; HOST_BLOCKS],
        prefixes: VecDeque::new(),
    };
    let mut seqs: Vec<Option<Seq>> = (0..SEQS).map(|_| None).collect();
    let (mut write, mut offload, mut onload) =
        (Stage::default(), Stage::default(), Stage::default());
    let (start, stop) = (Event::new()?, Event::new()?);
    let mut snapshot = Vec::new();
    let poison = vec![0xA5u8; BLOCK];
    let mut finished = 0;
    let mut hits = 0;

    for step in 0..STEPS {
        // 1. Admission; prefix hits onload the first blocks of a finished sequence.
        let mut pairs: Vec<[i64; 2]> = Vec::new();
        for slot in seqs.iter_mut().filter(|s| s.is_none()) {
            let mut seq = Seq::default();
            if !hp.prefixes.is_empty() && rng.below(2) == 0 {
                let p = hp.prefixes[rng.below(hp.prefixes.len() as u64) as usize].clone();
                let k = 1 + rng.below(p.len() as u64 - 1) as usize; // a strict prefix
                for &hb in &p[..k] {
                    let gb = free_gpu.pop().expect("GPU pool too small");
                    pairs.push([hb as i64, gb as i64]);
                    hp.retain(hb);
                    seq.blocks.push(gb);
                    seq.host.push(hb);
                }
                seq.len = k * BS;
                hits += 1;
            }
            *slot = Some(seq);
        }
        if !pairs.is_empty() {
            start.record(stream.sref())?;
            // Auto: whole 2 MiB blocks go by the copy engines.
            let op = BlockCopy::new(
                pool(host_mem.bytes(), HOST_BLOCKS),
                pool(gpu_mem.bytes_mut(), GPU_BLOCKS),
                BlockMap::Host(&pairs),
            )
            .staging(staging.bytes_mut())
            .errors(&errors);
            let used = kv.copy_blocks(&op, sref)?;
            stop.record(stream.sref())?;
            onload.add(pairs.len() * BLOCK, &start, &stop)?;
            onload.backend = Some(used);
            download(&gpu_mem, &mut snapshot, sref)?;
            let host_bytes = host_mem.as_slice()?; // nothing wrote it: no wait
            for &[hb, gb] in &pairs {
                let (hb, gb) = (hb as usize, gb as usize);
                let want = &host_bytes[hb * BLOCK..(hb + 1) * BLOCK];
                if snapshot[gb * BLOCK..(gb + 1) * BLOCK] != *want {
                    return Err(format!("step {step}: onloaded block {gb} != host {hb}").into());
                }
            }
        }
        let onloaded = pairs.len();

        // 2. Each running sequence appends 1..=MAX_STEP tokens; one slot update per layer.
        let mut slots = vec![-1i64; T_MAX];
        let mut t = 0;
        for seq in seqs.iter_mut().flatten() {
            let n = (1 + rng.below(MAX_STEP as u64) as usize).min(MAX_LEN - seq.len);
            for _ in 0..n {
                if seq.len % BS == 0 {
                    seq.blocks.push(free_gpu.pop().expect("GPU pool too small"));
                }
                slots[t] = (seq.blocks[seq.len / BS] * BS + seq.len % BS) as i64;
                seq.len += 1;
                t += 1;
            }
        }
        let k_host = random_bytes(LAYERS * T_MAX * ROW, 2 * step as u64);
        let v_host = random_bytes(LAYERS * T_MAX * ROW, 2 * step as u64 + 1);
        keys.write(0, &k_host, stream.sref())?;
        values.write(0, &v_host, stream.sref())?;
        slots_d.write(0, bytemuck::cast_slice(&slots), stream.sref())?;
        let (kd, vd) = (keys.bytes(), values.bytes());
        start.record(stream.sref())?;
        let gpu = pool(gpu_mem.bytes_mut(), GPU_BLOCKS);
        for l in 0..LAYERS {
            let (k_cache, v_cache, layout) = gpu.layer_view_mut(l)?;
            let rows = l * T_MAX * ROW..(l + 1) * T_MAX * ROW;
            let op = SlotUpdate::new(
                kd.slice(rows.start, rows.len())?,
                input,
                k_cache,
                layout,
                SlotMapping::I64(slots_d.bytes()),
            )
            .value(vd.slice(rows.start, rows.len())?, v_cache.expect("K and V"))
            .errors(&errors);
            kv.update_slots(&op, sref)?;
        }
        stop.record(stream.sref())?;
        write.add(t * LAYERS * 2 * ROW, &start, &stop)?;
        download(&gpu_mem, &mut snapshot, sref)?;
        for (j, &s) in slots[..t].iter().enumerate() {
            let (b, o) = (s as usize / BS, s as usize % BS);
            for l in 0..LAYERS {
                for (part, src) in [&k_host, &v_host].into_iter().enumerate() {
                    let at = row_at(b, l, part, o);
                    let from = (l * T_MAX + j) * ROW;
                    if snapshot[at..at + ROW] != src[from..from + ROW] {
                        return Err(format!("step {step}: token {j} layer {l} part {part}").into());
                    }
                }
            }
        }

        // 3. Offload blocks that became full (kernel backend, device map, 4 CTAs).
        let mut pairs: Vec<[i64; 2]> = Vec::new();
        for seq in seqs.iter_mut().flatten() {
            while seq.host.len() < seq.len / BS {
                let hb = hp.take();
                pairs.push([seq.blocks[seq.host.len()] as i64, hb as i64]);
                seq.host.push(hb);
            }
        }
        if !pairs.is_empty() {
            let mut flat: Vec<i64> = pairs.iter().flatten().copied().collect();
            flat.resize(2 * MAP_CAP, -1);
            map_d.write(0, bytemuck::cast_slice(&flat), stream.sref())?;
            start.record(stream.sref())?;
            let op = BlockCopy::new(
                pool(gpu_mem.bytes(), GPU_BLOCKS),
                pool(host_mem.bytes_mut(), HOST_BLOCKS),
                BlockMap::Device {
                    pairs: map_d.bytes(),
                    len: MAP_CAP,
                },
            )
            .backend(Backend::Kernel)
            .max_ctas(4)
            .errors(&errors);
            let used = kv.copy_blocks(&op, sref)?;
            stop.record(stream.sref())?;
            offload.add(pairs.len() * BLOCK, &start, &stop)?;
            offload.backend = Some(used);
            let host_bytes = host_mem.as_slice()?; // waits: the offload wrote it
            for &[gb, hb] in &pairs {
                let (gb, hb) = (gb as usize, hb as usize);
                if host_bytes[hb * BLOCK..(hb + 1) * BLOCK]
                    != snapshot[gb * BLOCK..(gb + 1) * BLOCK]
                {
                    return Err(format!("step {step}: offloaded block {gb} != host {hb}").into());
                }
            }
        }

        // 4. Finished sequences: the prefix stays on the host, the GPU blocks are freed.
        for slot in seqs.iter_mut() {
            if slot.as_ref().is_some_and(|s| s.len == MAX_LEN) {
                let seq = slot.take().unwrap();
                for &gb in &seq.blocks {
                    // Poison freed blocks, so a later onload must really copy.
                    gpu_mem.write(gb * BLOCK, &poison, sref)?;
                    free_gpu.push(gb);
                }
                hp.prefixes.push_back(seq.host);
                finished += 1;
            }
        }
        println!(
            "step {step:>2}: {t:>3} tokens x {LAYERS} layers written, {:>2} blocks offloaded, \
             {onloaded:>2} onloaded; {} running, {} prefixes on the host; verified",
            pairs.len(),
            seqs.iter().flatten().count(),
            hp.prefixes.len()
        );
    }
    stream.synchronize()?;
    let counts = errors.read(sref)?;
    if !counts.is_clean() {
        return Err(format!("device error word: {counts:?}").into());
    }
    println!("{finished} sequences finished, {hits} prefix hits; per stage:");
    write.print("write");
    offload.print("offload");
    onload.print("onload");
    Ok(())
}
