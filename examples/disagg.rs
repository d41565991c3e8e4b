//! Disaggregated prefill and decode over NIXL, two processes on this host.
//!
//! The prefill process writes a prompt's K/V into its cross-layer KV cache with kvio
//! (`Kvio::update_slots`, one call per layer, into blocks scattered over its cache), then
//! ships the prompt's blocks to the decode process's cache as one NIXL write (one descriptor
//! per run of consecutive blocks on both sides) that carries a notification. The decode
//! process waits for the notification, appends decode tokens into the received blocks (the
//! prompt's last, partly filled block first) with kvio, and checks every byte of its cache
//! against the CPU reference (`kvio::reference`), then tells the prefill process it is done.
//!
//! The process re-executes itself with `--role decode`; the two exchange NIXL metadata and
//! the decode cache's address through files in a temporary folder. UCX stays on this host:
//! `UCX_NET_DEVICES=lo`, `UCX_TLS=sm,self,tcp` (plus `cuda_copy` on a machine with NVIDIA GPUs,
//! which NIXL requires even for host memory, and `cuda_ipc` for device caches) unless
//! set. `--dram` runs both caches in host memory, kvio's kernels executed on the CPU
//! (`kvio::emulate`): no GPU needed. `--devices P,D` puts the prefill cache on GPU `P` and the
//! decode cache on GPU `D` (default `0,0`: both on the first GPU), so on a two-GPU machine
//! `--devices 0,1` ships the prompt over the GPUs' link (UCX `cuda_ipc`). Without a GPU (and
//! without `--dram`), or without the NIXL libraries, it says so and exits normally.
//!
//! ```sh
//! # NIXL's libraries: the nixl-cu12 wheel (see .ci/run)
//! export LD_LIBRARY_PATH=$NIXL/.nixl_cu12.mesonpy.libs NIXL_PLUGIN_DIR=$NIXL/.nixl_cu12.mesonpy.libs/plugins
//! cargo run --release --features nixl --example disagg            # device caches (VRAM)
//! cargo run --release --features nixl --example disagg -- --dram   # host caches, CPU kernels
//! cargo run --release --features nixl --example disagg -- --devices 0,1  # GPU 0 -> GPU 1
//! ```

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kvio::nixl::nixl_sys::XferOp;
use kvio::nixl::{self, Memory, Notifications, PostArgs};
use kvio::reference;
use kvio::{
    BlockCopy, BlockMap, BlockPool, DeviceAlloc, DeviceBytes, DeviceBytesMut, Kvio, PoolMemory,
    PrimaryContext, SlotMapping, SlotUpdate, Stream, StreamRef, TokenLayout,
};
use kvio_suite::nixl::{fetch, publish, run_pair, ucx_agent, ucx_loopback};
use kvio_suite::{random_bytes, Rng};

const LAYERS: usize = 4;
const HEADS: usize = 4;
const DIM: usize = 64;
const ELEM: usize = 2; // bf16
const BS: usize = 16;
/// Blocks of each process's cache.
const BLOCKS: usize = 32;
/// Prompt tokens (the last block partly filled).
const PROMPT: usize = 100;
/// Tokens the decode process appends.
const DECODE: usize = 40;
/// One token row of all heads.
const ROW: usize = HEADS * DIM * ELEM;
/// One cross-layer block: all layers, K and V.
const BLOCK: usize = LAYERS * 2 * BS * ROW;
const SEED: u64 = 2024;
const TIMEOUT: Duration = Duration::from_secs(120);

type Res<T> = Result<T, Box<dyn Error>>;

/// The cross-layer NHD pool of one process over `mem`.
fn pool<'a, M: PoolMemory<'a>>(mem: M) -> BlockPool<'a, M::Access> {
    BlockPool::cross_layer_nhd(mem, BLOCKS, LAYERS, BS, HEADS, DIM, ELEM)
}

/// Blocks needed for `tokens` tokens.
fn blocks_for(tokens: usize) -> usize {
    tokens.div_ceil(BS)
}

/// The blocks of a sequence in a cache: `n` distinct blocks, partly in runs, from `seed`.
fn pick_blocks(n: usize, seed: u64) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..BLOCKS).collect();
    // Shuffle runs of 3 blocks, so that some neighbours stay neighbours.
    let mut runs: Vec<Vec<usize>> = ids.chunks(3).map(<[usize]>::to_vec).collect();
    Rng::new(seed).shuffle(&mut runs);
    ids = runs.concat();
    ids.truncate(n);
    ids
}

/// Slot of each token `from..to` of a sequence in `blocks`.
fn slots(blocks: &[usize], from: usize, to: usize) -> Vec<i64> {
    (from..to)
        .map(|t| (blocks[t / BS] * BS + t % BS) as i64)
        .collect()
}

/// Random K and V rows of every layer for `tokens` tokens (`[layer][token][head][dim]`).
fn kv_input(tokens: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let n = LAYERS * tokens * ROW;
    (random_bytes(n, seed), random_bytes(n, seed ^ 0x5555))
}

/// A process's cache: device memory with kvio on the GPU, or host memory (`--dram`).
enum Cache {
    Gpu {
        kv: Box<Kvio>,
        stream: Stream,
        mem: DeviceAlloc,
        _ctx: PrimaryContext,
    },
    Host {
        mem: Vec<u8>,
    },
}

impl Cache {
    /// A cache filled with `fill` bytes, on GPU `device` unless `dram`; `None` (after saying
    /// why) without that GPU.
    fn new(dram: bool, device: i32, fill: u8, role: &str) -> Res<Option<Cache>> {
        if dram {
            return Ok(Some(Cache::Host {
                mem: vec![fill; BLOCKS * BLOCK],
            }));
        }
        let ctx = match PrimaryContext::retain(device) {
            Ok(c) => c,
            Err(e) => {
                println!(
                    "disagg {role}: no usable CUDA device {device} ({e}); run with --dram for \
                     host caches"
                );
                return Ok(None);
            }
        };
        let kv = Kvio::load()?;
        let stream = Stream::new()?;
        let mut mem = DeviceAlloc::new(BLOCKS * BLOCK)?;
        mem.write(0, &vec![fill; BLOCKS * BLOCK], StreamRef::from(&stream))?;
        stream.synchronize()?;
        Ok(Some(Cache::Gpu {
            kv: Box::new(kv),
            stream,
            mem,
            _ctx: ctx,
        }))
    }

    /// The cache's bytes as kvio and NIXL address them.
    fn bytes_mut(&mut self) -> DeviceBytesMut<'_> {
        match self {
            Cache::Gpu { mem, .. } => mem.bytes_mut(),
            // SAFETY: the vector lives as long as the borrow of `self`; kvio's CPU runner and
            // NIXL are the only ones that touch it meanwhile.
            Cache::Host { mem } => unsafe {
                DeviceBytesMut::from_raw(mem.as_mut_ptr() as u64, mem.len())
            },
        }
    }

    /// Writes the tokens' K/V of every layer (`kv_input` order) into `slots`, with kvio.
    fn write_tokens(&mut self, keys: &[u8], values: &[u8], slots: &[i64]) -> Res<()> {
        let t = slots.len();
        let slot_bytes: Vec<u8> = slots.iter().flat_map(|s| s.to_le_bytes()).collect();
        let input = TokenLayout::contiguous(t, HEADS, DIM, ELEM);
        // Inputs where the kernels read them: device buffers, or the host vectors themselves.
        let dev = match self {
            Cache::Gpu { stream, .. } => {
                let up = |data: &[u8]| -> Res<DeviceAlloc> {
                    let mut d = DeviceAlloc::new(data.len())?;
                    d.write(0, data, StreamRef::from(&*stream))?;
                    Ok(d)
                };
                Some((up(keys)?, up(values)?, up(&slot_bytes)?))
            }
            Cache::Host { .. } => None,
        };
        fn view<'a>(host: &'a [u8], d: Option<&'a DeviceAlloc>) -> DeviceBytes<'a> {
            match d {
                Some(d) => d.bytes(),
                // SAFETY: the view borrows the host vector for its lifetime.
                None => unsafe { DeviceBytes::from_raw(host.as_ptr() as u64, host.len()) },
            }
        }
        let (k_in, v_in, s_in) = (
            view(keys, dev.as_ref().map(|d| &d.0)),
            view(values, dev.as_ref().map(|d| &d.1)),
            view(&slot_bytes, dev.as_ref().map(|d| &d.2)),
        );
        let per_layer = t * ROW;
        let cache = self.bytes_mut();
        // SAFETY: a description of the same memory for the layer views below.
        let cache = unsafe { DeviceBytesMut::from_raw(cache.ptr(), cache.len()) };
        let p = pool(cache);
        let mut ops = Vec::new();
        for l in 0..LAYERS {
            let (kc, vc, layout) = p.layer_view_mut(l)?;
            let op = SlotUpdate::new(
                k_in.slice(l * per_layer, per_layer)?,
                input,
                kc,
                layout,
                SlotMapping::I64(s_in),
            )
            .value(v_in.slice(l * per_layer, per_layer)?, vc.expect("K and V"));
            ops.push(op);
        }
        match self {
            Cache::Gpu { kv, stream, .. } => {
                for op in &ops {
                    kv.update_slots(op, StreamRef::from(&*stream))?;
                }
                stream.synchronize()?;
            }
            Cache::Host { .. } => {
                for op in &ops {
                    // SAFETY: every view is host memory of its length (the cache vector and
                    // the input vectors, alive here).
                    unsafe { kvio::emulate::update_slots(op)? };
                }
            }
        }
        drop(dev);
        Ok(())
    }

    /// The whole cache, read back.
    fn read(&self) -> Res<Vec<u8>> {
        match self {
            Cache::Gpu { mem, stream, .. } => {
                let mut out = vec![0; mem.len()];
                mem.read(0, &mut out, StreamRef::from(stream))?;
                stream.synchronize()?;
                Ok(out)
            }
            Cache::Host { mem } => Ok(mem.clone()),
        }
    }

    fn memory(&mut self) -> Res<Memory> {
        match self {
            Cache::Gpu { .. } => Ok(nixl::pool_memory(&pool(self.bytes_mut()))?),
            Cache::Host { .. } => Ok(Memory::Dram),
        }
    }
}

/// The CPU reference: `slots` of `cache` (a whole cross-layer cache image) get the tokens.
fn reference_write(cache: &mut [u8], keys: &[u8], values: &[u8], slots: &[i64]) -> Res<()> {
    let t = slots.len();
    let input = TokenLayout::contiguous(t, HEADS, DIM, ELEM);
    // SAFETY: a description only: its layer views give the byte offsets of each layer's caches.
    let desc = pool(unsafe { DeviceBytes::from_raw(0, BLOCKS * BLOCK) });
    for l in 0..LAYERS {
        let (k, v, layout) = desc.layer_view(l)?;
        let v = v.expect("K and V");
        let r = l * t * ROW..(l + 1) * t * ROW;
        let c = reference::update_slots(
            &keys[r.clone()],
            Some(&values[r]),
            &input,
            cache,
            k.ptr() as usize,
            Some(v.ptr() as usize),
            &layout,
            slots,
        );
        if c.bad_slots != 0 {
            return Err(format!("reference: {} bad slots", c.bad_slots).into());
        }
    }
    Ok(())
}

fn prefill(dir: &Path, dram: bool, device: i32) -> Res<()> {
    let Some(mut cache) = Cache::new(dram, device, 0, "prefill")? else {
        return Ok(());
    };
    // 1. The prompt's K/V into this cache, with kvio.
    let blocks = pick_blocks(blocks_for(PROMPT), SEED);
    let (keys, values) = kv_input(PROMPT, SEED);
    cache.write_tokens(&keys, &values, &slots(&blocks, 0, PROMPT))?;

    // 2. NIXL: register, publish metadata, learn the decode side's.
    let a = ucx_agent("prefill")?;
    let mem = cache.memory()?;
    // SAFETY: the cache outlives the registration (dropped at the end of this function) and is
    // not touched while the transfer runs.
    let _reg = unsafe { nixl::register_pool_in(&a, &pool(cache.bytes_mut()), mem)? };
    publish(dir, "prefill.md", &a.get_local_md()?)?;
    let remote = a.load_remote_md(&fetch(dir, "decode.md", TIMEOUT)?)?;
    let info = String::from_utf8(fetch(dir, "decode.info", TIMEOUT)?)?;
    let mut it = info.split_whitespace();
    let (ptr, len): (u64, usize) = (
        it.next().ok_or("info")?.parse()?,
        it.next().ok_or("info")?.parse()?,
    );
    let remote_mem = match it.next().ok_or("info")? {
        "dram" => Memory::Dram,
        d => Memory::Vram { device: d.parse()? },
    };
    let dst_blocks: Vec<usize> = it.map(str::parse).collect::<Result<_, _>>()?;

    // 3. The prompt's blocks to the decode cache: one write, notified.
    let pairs: Vec<[i64; 2]> = blocks
        .iter()
        .zip(&dst_blocks)
        .map(|(&s, &d)| [s as i64, d as i64])
        .collect();
    let src = cache.bytes_mut();
    // SAFETY: the remote cache as the decode process described it (its address space).
    let dst = unsafe { DeviceBytesMut::from_raw(ptr, len) };
    let copy = BlockCopy::new(pool(src.as_read()), pool(dst), BlockMap::Host(&pairs));
    let args = PostArgs {
        local: mem,
        remote: remote_mem,
        notify: Some(b"prompt-ready"),
    };
    let start = Instant::now();
    // SAFETY: the cache is registered, stays allocated and untouched until the transfer is
    // complete; the remote cache is registered by the decode process, which waits for the
    // notification before touching it.
    let t = unsafe { nixl::post_with(&a, &remote, XferOp::Write, &copy, &args)? };
    t.wait(Some(TIMEOUT))?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "disagg prefill: {PROMPT} prompt tokens in {} blocks ({} KiB) sent as {} descriptors \
         ({mem:?} -> {remote_mem:?}) in {:.3} ms",
        blocks.len(),
        blocks.len() * BLOCK / 1024,
        t.descs(),
        secs * 1e3
    );
    // 4. Stay until the decode process says it is done.
    Notifications::new(&a).wait(&remote, b"decode-done", Some(TIMEOUT))?;
    Ok(())
}

fn decode(dir: &Path, dram: bool, device: i32) -> Res<()> {
    const POISON: u8 = 0xA5;
    let Some(mut cache) = Cache::new(dram, device, POISON, "decode")? else {
        return Ok(());
    };
    let total = PROMPT + DECODE;
    let blocks = pick_blocks(blocks_for(total), SEED + 1);
    let a = ucx_agent("decode")?;
    let mem = cache.memory()?;
    let view = cache.bytes_mut();
    let (ptr, len) = (view.ptr(), view.len());
    // SAFETY: the cache outlives the registration and is only read after the notification.
    let _reg = unsafe { nixl::register_pool_in(&a, &pool(view), mem)? };
    let mut inbox = Notifications::new(&a);
    publish(dir, "decode.md", &a.get_local_md()?)?;
    let mem_word = match mem {
        Memory::Dram => "dram".to_string(),
        Memory::Vram { device } => device.to_string(),
        other => return Err(format!("a cache in {other:?}: neither DRAM nor VRAM").into()),
    };
    let ids: Vec<String> = blocks[..blocks_for(PROMPT)]
        .iter()
        .map(usize::to_string)
        .collect();
    publish(
        dir,
        "decode.info",
        format!("{ptr} {len} {mem_word} {}", ids.join(" ")).as_bytes(),
    )?;
    let remote = a.load_remote_md(&fetch(dir, "prefill.md", TIMEOUT)?)?;

    // 1. The prompt's blocks arrive.
    inbox.wait(&remote, b"prompt-ready", Some(TIMEOUT))?;
    // 2. Decode tokens appended into them (and the blocks after), with kvio.
    let (keys, values) = kv_input(DECODE, SEED + 7);
    let decode_slots = slots(&blocks, PROMPT, total);
    cache.write_tokens(&keys, &values, &decode_slots)?;

    // 3. Every byte against the CPU reference.
    let mut want = vec![POISON; BLOCKS * BLOCK];
    let (pk, pv) = kv_input(PROMPT, SEED);
    reference_write(&mut want, &pk, &pv, &slots(&blocks, 0, PROMPT))?;
    // The prompt's last block also carries the prefill side's bytes past the prompt: zeros.
    let last = blocks[blocks_for(PROMPT) - 1];
    let tail: Vec<i64> = (PROMPT % BS..BS).map(|o| (last * BS + o) as i64).collect();
    if !PROMPT.is_multiple_of(BS) {
        let zeros = vec![0u8; LAYERS * tail.len() * ROW];
        reference_write(&mut want, &zeros, &zeros, &tail)?;
    }
    reference_write(&mut want, &keys, &values, &decode_slots)?;
    let got = cache.read()?;
    if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
        return Err(format!(
            "decode cache differs from the reference at byte {i} (block {})",
            i / BLOCK
        )
        .into());
    }
    println!(
        "disagg decode: {PROMPT} prompt tokens received ({mem:?}), {DECODE} decode tokens \
         appended; all {} bytes of the cache match the CPU reference",
        got.len()
    );
    nixl::notify(&a, &remote, b"decode-done")?;
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dram = args.iter().any(|a| a == "--dram");
    let role = args
        .iter()
        .position(|a| a == "--role")
        .and_then(|i| args.get(i + 1));
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    let dir = value("--dir").map(PathBuf::from);
    let usage =
        "usage: disagg [--dram | --devices P,D] (--role decode --dir DIR --device D: internal)";
    let result = match (role.map(String::as_str), dir) {
        (Some("decode"), Some(dir)) => match value("--device").map(|d| d.parse()) {
            Some(Ok(d)) => decode(&dir, dram, d),
            _ => Err(usage.into()),
        },
        (None, None) => match value("--devices").map(|v| parse_devices(v)) {
            None => parent(dram, (0, 0)),
            Some(Some(devs)) if !dram => parent(dram, devs),
            Some(_) => Err(usage.into()),
        },
        _ => Err(usage.into()),
    };
    if let Err(e) = result {
        eprintln!("disagg {}: {e}", role.map_or("prefill", String::as_str));
        std::process::exit(1);
    }
}

/// `P,D`: the prefill and the decode process's GPU ordinals.
fn parse_devices(v: &str) -> Option<(i32, i32)> {
    let (p, d) = v.split_once(',')?;
    Some((p.trim().parse().ok()?, d.trim().parse().ok()?))
}

/// The prefill process (on GPU `devices.0`): starts the decode process (on `devices.1`), runs
/// its side, waits for the other.
fn parent(dram: bool, devices: (i32, i32)) -> Res<()> {
    if !nixl::available() {
        println!(
            "disagg: libnixl_capi.so not found (the nixl-cu12 wheel's libraries on \
             LD_LIBRARY_PATH, see .ci/run); nothing to run"
        );
        return Ok(());
    }
    ucx_loopback(!dram);
    let dir = std::env::temp_dir().join(format!("kvio-disagg-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["--role", "decode", "--dir"]).arg(&dir);
    cmd.args(["--device", &devices.1.to_string()]);
    if dram {
        cmd.arg("--dram");
    }
    run_pair(&dir, &mut cmd, "decode", |_| prefill(&dir, dram, devices.0))
}
