//! GPU to GPU through NIXL in two processes, against the peer-copy ceiling measured in the
//! same run.
//!
//! A sending process owns a cross-layer KV pool of 2 MiB blocks (32 layers, K and V, 16
//! tokens, 8 heads of 128 bf16) on GPU `S`; it re-executes itself as a receiving process with
//! an equal pool on GPU `R`. The two exchange NIXL metadata through files in a temporary folder
//! and talk UCX on this host only (`UCX_NET_DEVICES=lo`; `cuda_ipc` moves device memory over
//! the GPUs' link). The sender writes every block to the receiver's pool, timed from the post
//! to the completion, in two maps:
//!
//! - scattered: block `i` to block `7i mod N`, so no two blocks are neighbours on both sides:
//!   one 2 MiB descriptor per block (what a serving stack's scattered pages give);
//! - contiguous: block `i` to block `i`, one descriptor for the whole pool.
//!
//! `--requests K` splits each map's pairs into `K` parts posted as `K` NIXL transfers at once
//! (each notified in the last write) and waits for all of them.
//!
//! After each map the receiver checks every byte of its (poisoned beforehand) pool against
//! the sender's random data, moved by the CPU reference (`kvio::reference::copy_blocks`).
//! The ceiling is the sender's own peer copy (`cuMemcpyDtoDAsync` between the two GPUs with
//! peer access enabled, CUDA events on its stream) of 1 GiB and of one pool's bytes. Prints
//! the median and best GB/s of each, the ratios, and one JSON line (`nixl_peer {..}`).
//!
//! ```sh
//! # NIXL's libraries: the nixl-cu12 wheel (see .ci/run and the README)
//! cargo run --release --features nixl --example nixl_peer                    # GPU 0 -> GPU 1
//! cargo run --release --features nixl --example nixl_peer -- --devices 0,1 --blocks 256
//! cargo run --release --features nixl --example nixl_peer -- --dram            # no GPU
//! ```
//!
//! `KVIO_NIXL_UCX_PARAMS=key=value,..` sets UCX backend parameters over the plugin's defaults
//! (`kvio_suite::nixl::ucx_agent`; it prints what it sets), e.g. `num_threads=4` as vLLM's
//! NixlConnector passes. `--dram` runs both pools in host memory (UCX over TCP on loopback;
//! default 16 blocks, no ceiling): the same two processes, maps, requests and byte checks with
//! no GPU, as `.ci/run` does. Without the NIXL libraries, or without the two GPUs (and without
//! `--dram`), it says so and exits normally.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use kvio::cust::sys as cu;
use kvio::nixl::nixl_sys::XferOp;
use kvio::nixl::{self, Memory, Notifications, PostArgs};
use kvio::reference::{self, PoolImage};
use kvio::{
    BlockCopy, BlockMap, BlockPool, DeviceAlloc, DeviceBytes, DeviceBytesMut, Event, PoolMemory,
    PrimaryContext, Stream,
};
use kvio_suite::nixl::{fetch, publish, run_pair, ucx_agent, ucx_loopback};
use kvio_suite::{random_bytes, Mem};

const LAYERS: usize = 32;
const BS: usize = 16;
const HEADS: usize = 8;
const DIM: usize = 128;
const ELEM: usize = 2;
/// One cross-layer block: 2 MiB.
const BLOCK: usize = LAYERS * 2 * BS * HEADS * DIM * ELEM;
const SEED: u64 = 4242;
const POISON: u8 = 0xA5;
const WARMUP: usize = 3;
const REPS: usize = 20;
const TIMEOUT: Duration = Duration::from_secs(120);

type Res<T> = Result<T, Box<dyn Error>>;

/// The cross-layer pool of `blocks` 2 MiB blocks over `mem`.
fn pool<'a, M: PoolMemory<'a>>(mem: M, blocks: usize) -> BlockPool<'a, M::Access> {
    BlockPool::cross_layer_nhd(mem, blocks, LAYERS, BS, HEADS, DIM, ELEM)
}

/// `data` in a device allocation of the current context, or in host memory (`dram`).
fn pool_mem(dram: bool, data: Vec<u8>) -> Mem {
    if dram {
        return Mem::plain(data);
    }
    let mut mem = Mem::new(false, data.len());
    mem.fill(&data);
    mem
}

/// How NIXL addresses `mem` (a pool of `blocks` blocks).
fn nixl_memory(mem: &Mem, blocks: usize) -> Res<Memory> {
    Ok(match mem {
        Mem::Plain(_) => Memory::Dram,
        _ => nixl::pool_memory(&pool(mem.bytes(), blocks))?,
    })
}

/// The two maps: (name, pairs).
fn maps(blocks: usize) -> Vec<(&'static str, Vec<[i64; 2]>)> {
    let scattered = (0..blocks)
        .map(|i| [i as i64, (i * 7 % blocks) as i64])
        .collect();
    let contiguous = (0..blocks).map(|i| [i as i64, i as i64]).collect();
    vec![("scattered", scattered), ("contiguous", contiguous)]
}

fn check(what: &str, rc: cu::CUresult) -> Res<()> {
    if rc == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {rc:?}").into())
    }
}

/// Median and best of `v` (sorted in place).
fn median_best(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0])
}

/// The peer-copy ceiling: seconds per copy of `bytes` from GPU `src` to GPU `dst` (the
/// current context is `src`'s), each copy timed by events on the stream; (median, best).
fn peer_ceiling(src: &PrimaryContext, dst: &PrimaryContext, bytes: usize) -> Res<(f64, f64)> {
    dst.make_current()?;
    let to = DeviceAlloc::new(bytes)?;
    src.make_current()?;
    let mut from = DeviceAlloc::new(bytes)?;
    let stream = Stream::new()?;
    from.write(0, &vec![0x3C; bytes], stream.sref())?;
    stream.synchronize()?;
    let (a, b) = (Event::new()?, Event::new()?);
    let mut secs = Vec::new();
    for rep in 0..WARMUP + 10 {
        a.record(stream.sref())?;
        // SAFETY: both allocations are `bytes` long and alive until the stream is synchronised
        // below; unified addressing names each by its device pointer.
        check("cuMemcpyDtoDAsync", unsafe {
            cu::cuMemcpyDtoDAsync_v2(
                to.bytes().ptr(),
                from.bytes().ptr(),
                bytes,
                stream.cu_stream(),
            )
        })?;
        b.record(stream.sref())?;
        b.synchronize()?;
        if rep >= WARMUP {
            secs.push(b.elapsed_ms(&a)? as f64 / 1e3);
        }
    }
    Ok(median_best(&mut secs))
}

/// Lets `from`'s context reach `to`'s memory directly (NVLink or PCIe peer access).
fn enable_peer(from: &PrimaryContext, to: &PrimaryContext) -> Res<()> {
    from.make_current()?;
    // SAFETY: both contexts are retained; flags must be 0.
    let rc = unsafe { cu::cuCtxEnablePeerAccess(to.cu_context(), 0) };
    if rc != cu::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        check("cuCtxEnablePeerAccess", rc)?;
    }
    Ok(())
}

/// Both GPUs' primary contexts (the receiver's retained first, the sender's current), or none
/// (`--dram`).
fn contexts(dram: bool, devices: (i32, i32)) -> Res<Option<(PrimaryContext, PrimaryContext)>> {
    if dram {
        return Ok(None);
    }
    let peer = PrimaryContext::retain(devices.1)?;
    let ctx = PrimaryContext::retain(devices.0)?;
    Ok(Some((ctx, peer)))
}

/// Waits for `msg` from the receiving process's agent `from`, failing as soon as that
/// process has ended (its error is on its standard error) or after [`TIMEOUT`].
fn answer(inbox: &mut Notifications, from: &str, msg: &str, child: &mut Child) -> Res<()> {
    let start = Instant::now();
    while !inbox.take(from, msg.as_bytes())? {
        if let Some(status) = child.try_wait()? {
            return Err(format!("the receiving process ended ({status}) before \"{msg}\"").into());
        }
        if start.elapsed() > TIMEOUT {
            return Err(format!("no \"{msg}\" from the receiving process in {TIMEOUT:?}").into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// The sending process's side (`child`: the receiving process).
fn sender(dir: &Path, cfg: Cfg, child: &mut Child) -> Res<()> {
    let (devices, blocks, requests, dram) = (cfg.devices, cfg.blocks, cfg.requests, cfg.dram);
    let bytes = blocks * BLOCK;
    let ctxs = contexts(dram, devices)?;
    let mem = pool_mem(dram, random_bytes(bytes, SEED));

    println!(
        "nixl_peer: UCX backend parameters: the plugin's defaults{}",
        std::env::var("KVIO_NIXL_UCX_PARAMS").map_or(String::new(), |p| format!(", set: {p}"))
    );
    let a = ucx_agent("nixl-peer-send")?;
    let local = nixl_memory(&mem, blocks)?;
    // SAFETY: the pool outlives the registration (dropped at the end of this function) and is
    // only read by the transfers.
    let _reg = unsafe { nixl::register_pool_in(&a, &pool(mem.bytes(), blocks), local)? };
    publish(dir, "send.md", &a.get_local_md()?)?;
    let remote_name = a.load_remote_md(&fetch(dir, "recv.md", TIMEOUT)?)?;
    let info = String::from_utf8(fetch(dir, "recv.info", TIMEOUT)?)?;
    let mut it = info.split_whitespace();
    let ptr: u64 = it.next().ok_or("info")?.parse()?;
    let len: usize = it.next().ok_or("info")?.parse()?;
    let remote = match it.next().ok_or("info")? {
        "dram" => Memory::Dram,
        d => Memory::Vram { device: d.parse()? },
    };
    if len != bytes {
        return Err(format!("the receiver's pool is {len} bytes, expected {bytes}").into());
    }
    let mut inbox = Notifications::new(&a);

    let mut results = Vec::new();
    for (name, pairs) in maps(blocks) {
        // SAFETY: the receiver's registered pool as it described it (its address space).
        let dst = unsafe { DeviceBytesMut::from_raw(ptr, len) };
        // One copy per request: the map's pairs split into `requests` parts, posted together.
        let copies: Vec<BlockCopy<'_>> = pairs
            .chunks(pairs.len().div_ceil(requests))
            .map(|part| {
                // SAFETY: as `dst` above.
                let dst = unsafe { DeviceBytesMut::from_raw(dst.ptr(), dst.len()) };
                BlockCopy::new(
                    pool(mem.bytes(), blocks),
                    pool(dst, blocks),
                    BlockMap::Host(part),
                )
            })
            .collect();
        let mut secs = Vec::new();
        let mut descs = 0;
        for rep in 0..WARMUP + REPS {
            let last = rep + 1 == WARMUP + REPS;
            let start = Instant::now();
            let mut posted = Vec::with_capacity(copies.len());
            for (i, copy) in copies.iter().enumerate() {
                let tag = format!("{name}-written-{i}");
                let args = PostArgs {
                    local,
                    remote,
                    notify: last.then_some(tag.as_bytes()),
                };
                // SAFETY: the local pool stays allocated and unwritten until every transfer
                // is complete; the receiver touches its pool only after the notifications of
                // the last write, and answers before the next map's first write.
                posted.push(unsafe {
                    nixl::post_with(&a, &remote_name, XferOp::Write, copy, &args)?
                });
            }
            for t in &posted {
                t.wait(Some(TIMEOUT))?;
            }
            if rep >= WARMUP {
                secs.push(start.elapsed().as_secs_f64());
            }
            descs = posted.iter().map(nixl::Transfer::descs).sum();
        }
        // The receiver checks every byte, then poisons its pool again.
        answer(&mut inbox, &remote_name, &format!("{name}-checked"), child)?;
        let (med, best) = median_best(&mut secs);
        results.push((name, copies.len(), descs, med, best));
    }

    let gbps = |b: usize, s: f64| b as f64 / s / 1e9;
    let gib = 1usize << 30;
    // The peer-copy ceilings (1 GiB, one pool's bytes), as GB/s; none on host memory.
    let ceilings = match &ctxs {
        Some((ctx, peer)) => {
            enable_peer(ctx, peer)?;
            ctx.make_current()?;
            let (c1_med, c1_best) = peer_ceiling(ctx, peer, gib)?;
            let (cp_med, cp_best) = peer_ceiling(ctx, peer, bytes)?;
            println!(
                "nixl_peer: peer-copy ceiling GPU {} -> GPU {}: 1 GiB median {:.1} GB/s \
                 (best {:.1}); {} MiB median {:.1} GB/s (best {:.1})",
                devices.0,
                devices.1,
                gbps(gib, c1_med),
                gbps(gib, c1_best),
                bytes >> 20,
                gbps(bytes, cp_med),
                gbps(bytes, cp_best)
            );
            Some((gbps(gib, c1_med), gbps(bytes, cp_med)))
        }
        None => None,
    };
    let mut json = match ceilings {
        Some((c1, cp)) => format!(
            "{{\"blocks\":{blocks},\"block_bytes\":{BLOCK},\"ceiling_1gib_gbps\":{c1:.2},\
             \"ceiling_pool_gbps\":{cp:.2}"
        ),
        None => format!(
            "{{\"blocks\":{blocks},\"block_bytes\":{BLOCK},\"dram\":true,\
             \"ceiling_1gib_gbps\":null,\"ceiling_pool_gbps\":null"
        ),
    };
    let (from, to) = if dram {
        ("DRAM".to_string(), "DRAM".to_string())
    } else {
        (format!("VRAM {}", devices.0), format!("VRAM {}", devices.1))
    };
    for (name, reqs, descs, med, best) in &results {
        let g = gbps(bytes, *med);
        let ratios = match ceilings {
            Some((c1, cp)) => format!(
                " = {:.1}% of the 1 GiB ceiling, {:.1}% of the same-size copy",
                100.0 * g / c1,
                100.0 * g / cp
            ),
            None => String::new(),
        };
        println!(
            "nixl_peer: {name}: {blocks} blocks of 2 MiB ({} MiB) in {descs} descriptors \
             ({reqs} requests), {from} -> {to}: median {g:.1} GB/s (best {:.1}){ratios}; \
             every byte checked by the receiver",
            bytes >> 20,
            gbps(bytes, *best),
        );
        json.push_str(&format!(
            ",\"{name}\":{{\"requests\":{reqs},\"descs\":{descs},\"median_gbps\":{g:.2},\
             \"best_gbps\":{:.2}}}",
            gbps(bytes, *best)
        ));
    }
    println!("nixl_peer {json}}}");
    nixl::notify(&a, &remote_name, b"done")?;
    Ok(())
}

fn receiver(dir: &Path, cfg: Cfg) -> Res<()> {
    let (device, blocks, requests, dram) = (cfg.devices.1, cfg.blocks, cfg.requests, cfg.dram);
    let bytes = blocks * BLOCK;
    let _ctx = if dram {
        None
    } else {
        Some(PrimaryContext::retain(device)?)
    };
    let poison = vec![POISON; bytes];
    let mut mem = pool_mem(dram, poison.clone());
    let a = ucx_agent("nixl-peer-recv")?;
    let (ptr, len) = (mem.bytes().ptr(), mem.bytes().len());
    let local = nixl_memory(&mem, blocks)?;
    // SAFETY: the pool outlives the registration; it is read and re-poisoned only between a
    // map's last write (notified) and the answer that lets the sender go on.
    let _reg = unsafe { nixl::register_pool_in(&a, &pool(mem.bytes_mut(), blocks), local)? };
    let mut inbox = Notifications::new(&a);
    publish(dir, "recv.md", &a.get_local_md()?)?;
    let where_ = if dram {
        "dram".to_string()
    } else {
        device.to_string()
    };
    publish(dir, "recv.info", format!("{ptr} {len} {where_}").as_bytes())?;
    let remote = a.load_remote_md(&fetch(dir, "send.md", TIMEOUT)?)?;

    let src = random_bytes(bytes, SEED);
    // SAFETY: descriptions only, for the reference's byte offsets.
    let image = PoolImage::of(&pool(unsafe { DeviceBytes::from_raw(0, bytes) }, blocks))
        .ok_or("a cross-layer pool has an image")?;
    for (name, pairs) in maps(blocks) {
        for i in 0..pairs.len().div_ceil(pairs.len().div_ceil(requests)) {
            let tag = format!("{name}-written-{i}");
            inbox.wait(&remote, tag.as_bytes(), Some(TIMEOUT))?;
        }
        let got = mem.read();
        let mut want = poison.clone();
        let c = reference::copy_blocks(&image, &src, &image, &mut want, &pairs);
        if c.bad_blocks != 0 {
            return Err(format!("reference: {} bad blocks", c.bad_blocks).into());
        }
        if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
            return Err(format!("{name}: byte {i} (block {}) differs", i / BLOCK).into());
        }
        println!("nixl_peer receiver: {name}: all {bytes} bytes of its pool ({local:?}) match");
        mem.fill(&poison);
        nixl::notify(&a, &remote, format!("{name}-checked").as_bytes())?;
    }
    inbox.wait(&remote, b"done", Some(TIMEOUT))?;
    Ok(())
}

/// Device count, or why there is none.
fn device_count() -> Res<i32> {
    let mut n = 0;
    // SAFETY: plain driver calls with an out-pointer to a local.
    unsafe {
        check("cuInit", cu::cuInit(0))?;
        check("cuDeviceGetCount", cu::cuDeviceGetCount(&mut n))?;
    }
    Ok(n)
}

/// What both processes run with.
#[derive(Clone, Copy)]
struct Cfg {
    /// (sender's GPU, receiver's GPU).
    devices: (i32, i32),
    blocks: usize,
    requests: usize,
    /// Host memory pools, no GPU.
    dram: bool,
}

fn parent(cfg: Cfg) -> Res<()> {
    let Cfg { devices, dram, .. } = cfg;
    if !nixl::available() {
        println!("nixl_peer: libnixl_capi.so not found (see .ci/run); nothing to run");
        return Ok(());
    }
    match device_count() {
        _ if dram => {}
        Ok(n) if n > devices.0.max(devices.1) => {}
        Ok(n) => {
            println!(
                "nixl_peer: {n} GPUs here, GPUs {} and {} needed; nothing to run",
                devices.0, devices.1
            );
            return Ok(());
        }
        Err(e) => {
            println!("nixl_peer: no usable CUDA driver ({e}); nothing to run");
            return Ok(());
        }
    }
    ucx_loopback(!dram);
    let dir = std::env::temp_dir().join(format!("kvio-nixl-peer-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["--role", "recv", "--dir"]).arg(&dir).args([
        "--devices",
        &format!("{},{}", devices.0, devices.1),
        "--blocks",
        &cfg.blocks.to_string(),
        "--requests",
        &cfg.requests.to_string(),
    ]);
    if dram {
        cmd.arg("--dram");
    }
    run_pair(&dir, &mut cmd, "receiving", |child| {
        sender(&dir, cfg, child)
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    };
    let usage = "usage: nixl_peer [--devices S,R | --dram] [--blocks N] [--requests K] \
                 (--role recv --dir DIR: internal)";
    let run = || -> Res<()> {
        let dram = args.iter().any(|a| a == "--dram");
        let blocks: usize = value("--blocks")
            .unwrap_or(if dram { "16" } else { "256" })
            .parse()?;
        let requests: usize = value("--requests").unwrap_or("1").parse()?;
        if requests == 0 {
            return Err("--requests 0: at least 1".into());
        }
        if blocks < 2 || blocks.is_multiple_of(7) {
            return Err(format!("--blocks {blocks}: at least 2 and not a multiple of 7").into());
        }
        let (s, r) = value("--devices")
            .unwrap_or("0,1")
            .split_once(',')
            .ok_or(usage)?;
        let cfg = Cfg {
            devices: (s.trim().parse()?, r.trim().parse()?),
            blocks,
            requests,
            dram,
        };
        match (value("--role"), value("--dir")) {
            (Some("recv"), Some(dir)) => receiver(&PathBuf::from(dir), cfg),
            (None, None) => parent(cfg),
            _ => Err(usage.into()),
        }
    };
    if let Err(e) = run() {
        eprintln!("nixl_peer {}: {e}", value("--role").unwrap_or("send"));
        std::process::exit(1);
    }
}
