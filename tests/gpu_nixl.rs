//! NIXL block transfers between two agents of this process on the one GPU, over UCX on this
//! host: device (VRAM) pools to pinned host (DRAM) pools, host to device and device to
//! device, cross-layer and layer-separate (a `LayerTable` whose caches are registered one by
//! one), same and different layouts on the two sides, random data, poisoned destinations,
//! bit-exact against the CPU reference. Each write carries a notification the receiving agent
//! waits for; one read per case moves the blocks back.
//!
//! Skips without a GPU unless `KVIO_REQUIRE_GPU=1`, and without the NIXL libraries unless
//! `KVIO_REQUIRE_NIXL=1`. UCX: `UCX_TLS=sm,self,tcp,cuda_copy,cuda_ipc`, `UCX_NET_DEVICES=lo`,
//! `UCX_CUDA_IPC_ENABLE_SAME_PROCESS=y` unless set (the `nixl-cu12` 1.5.1 wheel's UCX has the
//! CUDA transports, `ucx/libuct_cuda.so`, but no `gdr_copy`).
//!
//! The ignored test `nixl_plans_gbps` measures the two ways to ship blocks from a
//! layer-separate pool to a cross-layer one: per-chunk descriptors, or a kvio gather into a
//! contiguous staging pool and one descriptor per run (`kvio::nixl::plans`), on VRAM and on
//! pinned DRAM, and prints GB/s and descriptor counts.

use std::time::{Duration, Instant};

use kvio::nixl::nixl_sys::{Agent, XferOp};
use kvio::nixl::{self, Memory, Notifications, PostArgs, Registration};
use kvio::reference;
use kvio::{BlockCopy, BlockMap, BlockPool, StreamRef, Writable};
use kvio_suite::nixl::{agent, connect, loopback_only, present, run_pairs};
use kvio_suite::{assert_same, gpu, random_bytes, Gpu, Kind, Rng, Shape, TestPool};

/// Longest a transfer may take before the test fails.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Registers a test pool with `agent` in the memory the driver reports for it.
fn register(agent: &Agent, pool: &TestPool) -> (Registration, Memory) {
    let p = pool.pool();
    let mem = nixl::pool_memory(&p).expect("pool_memory");
    assert_eq!(
        matches!(mem, Memory::Vram { .. }),
        !pool.mem.on_host(),
        "{mem:?}"
    );
    // SAFETY: the test pools outlive their registrations (dropped first, at the end of each
    // case) and are read from the host or written only between completed transfers.
    let reg = unsafe { nixl::register_pool_in(agent, &p, mem) }.expect("register_pool_in");
    (reg, mem)
}

/// Runs `copy` from `a` to `b` as `op`, notifying `b`, and waits until `b` has the
/// notification and `a` the completion. Returns the descriptors and the seconds it took.
fn run(
    a: &Agent,
    b: &Agent,
    op: XferOp,
    copy: &BlockCopy<'_>,
    local: Memory,
    remote: Memory,
) -> (usize, f64) {
    let msg = b"kvio-gpu-nixl";
    let args = PostArgs {
        local,
        remote,
        notify: Some(msg),
    };
    let mut inbox = Notifications::new(b);
    let start = Instant::now();
    // SAFETY: both pools are test allocations, alive and untouched until the transfer is
    // complete and the notification arrived; their contents were written synchronously.
    let t = unsafe { nixl::post_with(a, &b.name(), op, copy, &args) }.expect("post_with");
    while !inbox.take(&a.name(), msg).expect("notifications") {
        t.done().expect("transfer status");
        assert!(start.elapsed() < TIMEOUT, "no notification");
    }
    t.wait(Some(TIMEOUT)).expect("wait");
    (t.descs(), start.elapsed().as_secs_f64())
}

/// The bytes `pairs` leave in `dst` (holding `dst_init`) by the reference.
fn expected(
    src: &TestPool,
    src_init: &[u8],
    dst: &TestPool,
    dst_init: &[u8],
    pairs: &[[i64; 2]],
) -> Vec<u8> {
    let mut want = dst_init.to_vec();
    let c = reference::copy_blocks(&src.image(), src_init, &dst.image(), &mut want, pairs);
    assert_eq!(c.bad_blocks, 0);
    want
}

/// One case: agent A's pool (`src_kind`, on the host or the device) written into agent B's
/// poisoned pool (`dst_kind`), then B's blocks read back by A into a second poisoned pool.
fn case(src_kind: Kind, src_host: bool, dst_kind: Kind, dst_host: bool, seed: u64) {
    let name = format!(
        "gpu_nixl {src_kind:?}@{} -> {dst_kind:?}@{}",
        if src_host { "DRAM" } else { "VRAM" },
        if dst_host { "DRAM" } else { "VRAM" }
    );
    let sa = Shape {
        blocks: 24,
        layers: 3,
        bs: 16,
        heads: 2,
        dim: 64,
        elem: 2,
    };
    let sb = Shape { blocks: 20, ..sa };
    let mut rng = Rng::new(seed);
    let (a_pool, a_init) = TestPool::random(src_kind, src_host, sa, seed);
    let mut b_pool = TestPool::new(dst_kind, dst_host, sb);
    let b_init = random_bytes(sb.bytes(), seed ^ 0xDEAD);
    b_pool.mem.fill(&b_init);
    let mut back = TestPool::new(src_kind, src_host, sa);
    let back_init = random_bytes(sa.bytes(), seed ^ 0xBEEF);
    back.mem.fill(&back_init);

    let tag = seed.to_string();
    let (a, b) = (
        agent(&format!("gpu-a-{tag}")),
        agent(&format!("gpu-b-{tag}")),
    );
    let (ra, ma) = register(&a, &a_pool);
    let (rb, mb) = register(&b, &b_pool);
    let (rback, mback) = register(&a, &back);
    connect(&a, &b);

    // 1. A writes into B, B learns it from the notification.
    let pairs = run_pairs(sa.blocks, sb.blocks, &mut rng);
    let write = BlockCopy::new(a_pool.pool(), b_pool.pool(), BlockMap::Host(&pairs));
    let (descs, secs) = run(&a, &b, XferOp::Write, &write, ma, mb);
    let bytes = pairs.iter().filter(|p| p[0] >= 0).count() * sa.bytes() / sa.blocks;
    eprintln!(
        "{name}: write: {bytes} B in {descs} descriptors, {:.3} ms",
        secs * 1e3
    );
    let b_now = b_pool.mem.read();
    assert_same(
        &format!("{name} write"),
        &b_now,
        &expected(&a_pool, &a_init, &b_pool, &b_init, &pairs),
    );

    // 2. A reads B's blocks back into its second pool (B notified again).
    let back_pairs = run_pairs(sb.blocks, sa.blocks, &mut rng);
    let read = BlockCopy::new(b_pool.pool(), back.pool(), BlockMap::Host(&back_pairs));
    let (descs, _) = run(&a, &b, XferOp::Read, &read, mback, mb);
    eprintln!("{name}: read: {descs} descriptors");
    assert_same(
        &format!("{name} read"),
        &back.mem.read(),
        &expected(&b_pool, &b_now, &back, &back_init, &back_pairs),
    );
    drop((ra, rb, rback));
}

/// Whether this test can run: a GPU, then the NIXL libraries (both gates may panic).
fn ready(test: &str) -> Option<&'static Gpu> {
    let g = gpu(test)?;
    if !present(test) {
        return None;
    }
    loopback_only(true);
    Some(g)
}

#[test]
fn nixl_gpu_transfers() {
    if ready("nixl_gpu_transfers").is_none() {
        return;
    }
    let mut seed = 10;
    // (source layout, destination layout): same layouts, and layer-separate to cross-layer.
    let layouts = [
        (Kind::CrossNhd, Kind::CrossNhd),
        (Kind::SepNhd, Kind::SepNhd),
        (Kind::SepNhd, Kind::CrossNhd),
        (Kind::CrossHnd, Kind::SepHnd),
    ];
    // (source on the host, destination on the host): VRAM -> DRAM, DRAM -> VRAM, VRAM -> VRAM.
    for (src_host, dst_host) in [(false, true), (true, false), (false, false)] {
        for (sk, dk) in layouts {
            seed += 1;
            case(sk, src_host, dk, dst_host, seed);
        }
    }
}

/// One strategy's result.
struct Measured {
    descs: usize,
    gather_s: f64,
    xfer_s: f64,
}

/// Ships every block of a layer-separate pool (`local`, on the host or the device) to a
/// cross-layer pool of agent B, per chunk (direct) and staged (kvio gathers into a
/// cross-layer staging pool on the same side, then one descriptor per run), `reps` times each;
/// checks B's bytes after each strategy. Returns (direct, staged).
fn measure(g: &Gpu, host: bool, s: Shape, reps: usize) -> (Measured, Measured) {
    let (local, init) = TestPool::random(Kind::SepNhd, host, s, 77);
    let staging = TestPool::new(Kind::CrossNhd, host, s);
    let mut remote = TestPool::new(Kind::CrossNhd, host, s);
    let poison = vec![0xA5; s.bytes()];
    remote.mem.fill(&poison);
    let (a, b) = (
        agent(&format!("plans-a-{host}")),
        agent(&format!("plans-b-{host}")),
    );
    let (r1, ml) = register(&a, &local);
    let (r2, ms) = register(&a, &staging);
    let (r3, mr) = register(&b, &remote);
    connect(&a, &b);
    // Every block, in runs of 8 consecutive blocks shuffled (a prompt's blocks are mostly
    // consecutive on the receiving side).
    let mut rng = Rng::new(5);
    let mut runs: Vec<usize> = (0..s.blocks / 8).collect();
    rng.shuffle(&mut runs);
    let pairs: Vec<[i64; 2]> = runs
        .iter()
        .enumerate()
        .flat_map(|(i, &r)| (0..8).map(move |k| [(r * 8 + k) as i64, (i * 8 + k) as i64]))
        .collect();
    let want = expected(&local, &init, &remote, &poison, &pairs);

    // Direct: per-chunk descriptors.
    let (p, direct) = {
        let copy = BlockCopy::new(local.pool(), remote.pool(), BlockMap::Host(&pairs));
        let p = nixl::plans(&copy, XferOp::Write).expect("plans");
        let mut direct = Measured {
            descs: p.direct,
            gather_s: 0.0,
            xfer_s: f64::MAX,
        };
        for _ in 0..reps {
            let (n, t) = run(&a, &b, XferOp::Write, &copy, ml, mr);
            assert_eq!(n, p.direct);
            direct.xfer_s = direct.xfer_s.min(t);
        }
        (p, direct)
    };
    assert_same("plans direct", &remote.mem.read(), &want);
    remote.mem.fill(&poison);

    // Staged: kvio gathers block pairs[i][0] into staging block i, then staging -> remote.
    let stream = g.stream();
    let gather_pairs: Vec<[i64; 2]> = pairs
        .iter()
        .enumerate()
        .map(|(i, p)| [p[0], i as i64])
        .collect();
    let stage_pairs: Vec<[i64; 2]> = pairs
        .iter()
        .enumerate()
        .map(|(i, p)| [i as i64, p[1]])
        .collect();
    let stage_pool: BlockPool<'_, Writable> = staging.pool();
    let ship = BlockCopy::new(
        stage_pool.read(),
        remote.pool(),
        BlockMap::Host(&stage_pairs),
    );
    let gather = BlockCopy::new(local.pool(), staging.pool(), BlockMap::Host(&gather_pairs));
    let mut staged = Measured {
        descs: p.staged,
        gather_s: f64::MAX,
        xfer_s: f64::MAX,
    };
    for _ in 0..reps {
        let start = Instant::now();
        g.kv.copy_blocks(&gather, StreamRef::from(&stream))
            .expect("gather");
        stream.synchronize().expect("synchronize");
        staged.gather_s = staged.gather_s.min(start.elapsed().as_secs_f64());
        let (n, t) = run(&a, &b, XferOp::Write, &ship, ms, mr);
        assert_eq!(n, p.staged);
        staged.xfer_s = staged.xfer_s.min(t);
    }
    drop((r1, r2, r3));
    (direct, staged)
}

#[test]
#[ignore = "a measurement: cargo test --features nixl --test gpu_nixl -- --ignored --nocapture"]
fn nixl_plans_gbps() {
    let Some(g) = ready("nixl_plans_gbps") else {
        return;
    };
    let s = Shape {
        blocks: 256,
        layers: 32,
        bs: 16,
        heads: 8,
        dim: 128,
        elem: 2,
    };
    for host in [false, true] {
        let (d, st) = measure(g, host, s, 5);
        let gb = s.bytes() as f64 / 1e9;
        let mem = if host { "DRAM (pinned)" } else { "VRAM" };
        println!(
            "nixl plans, {mem}, {:.1} MiB layer-separate -> cross-layer: direct {} descriptors \
             {:.1} GB/s; staged {} descriptors {:.1} GB/s transfer, gather {:.3} ms, \
             {:.1} GB/s with the gather",
            s.bytes() as f64 / (1 << 20) as f64,
            d.descs,
            gb / d.xfer_s,
            st.descs,
            gb / st.xfer_s,
            st.gather_s * 1e3,
            gb / (st.xfer_s + st.gather_s),
        );
    }
}
