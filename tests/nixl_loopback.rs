//! NIXL block transfers between two agents of this process over UCX on loopback, DRAM to
//! DRAM, against the CPU reference, bit for bit: agent A writes blocks of its pool into agent
//! B's pool, then reads blocks of B's pool back into a second pool of its own, for a
//! cross-layer pool and a layer-first (layer-separate style) strided pool. The write carries
//! a notification: B learns from it (not from A) that the bytes are there. Notification
//! timeouts and plain notifications are checked too.
//!
//! UCX is kept on this host: `UCX_TLS=sm,self,tcp`, `UCX_NET_DEVICES=lo` (unless already set).
//! Skips when `libnixl_capi.so` cannot be loaded unless `KVIO_REQUIRE_NIXL=1` (see `.ci/run`
//! for the libraries: the `nixl-cu12` wheel on `LD_LIBRARY_PATH` and `NIXL_PLUGIN_DIR`).

use std::time::Duration;

use kvio::nixl::nixl_sys::{Agent, XferOp};
use kvio::nixl::{self, Notifications, PostArgs, Registration};
use kvio::reference::{self, PoolImage};
use kvio::{BlockCopy, BlockMap, BlockPool, DeviceBytes, DeviceBytesMut, Writable};
use kvio_suite::nixl::{agent, loopback_only, present, run_pairs};
use kvio_suite::{assert_same, random_bytes, Kind, Rng, Shape};

/// Longest a transfer may take before the test fails (loopback: milliseconds).
const TIMEOUT: Duration = Duration::from_secs(60);

/// Bytes a destination holds before a transfer (never what a source holds everywhere).
const POISON: u8 = 0xA5;

/// A pool of `kind` over host memory `mem`.
///
/// # Safety
///
/// `mem` outlives the pool's use, and is not touched otherwise while a transfer runs.
unsafe fn read_pool(shape: &Shape, kind: Kind, mem: &[u8]) -> BlockPool<'static> {
    shape.pool(kind, DeviceBytes::from_raw(mem.as_ptr() as u64, mem.len()))
}

/// [`read_pool`], written to.
///
/// # Safety
///
/// As [`read_pool`].
unsafe fn write_pool(shape: &Shape, kind: Kind, mem: &mut [u8]) -> BlockPool<'static, Writable> {
    shape.pool(
        kind,
        DeviceBytesMut::from_raw(mem.as_mut_ptr() as u64, mem.len()),
    )
}

/// Registers a pool with an agent (the test keeps the memory alive and untouched meanwhile).
fn register<A: Copy>(agent: &Agent, pool: &BlockPool<'_, A>) -> Registration {
    // SAFETY: the pools of this test are Vecs that outlive every registration and are read
    // only after the transfers into them completed.
    unsafe { nixl::register_pool(agent, pool) }.expect("register_pool")
}

/// Runs `copy` from `agent` to `remote` as `op` and waits for it; returns the descriptors.
fn run(agent: &Agent, remote: &str, op: XferOp, copy: &BlockCopy<'_>) -> usize {
    // SAFETY: both pools are Vecs of this test, alive and untouched until `wait` returned.
    let t = unsafe { nixl::post(agent, remote, op, copy) }.expect("post");
    t.wait(Some(TIMEOUT)).expect("wait");
    t.descs()
}

/// The bytes `pairs` leave in `dst_mem` by the reference.
fn expected(
    src: &PoolImage,
    src_mem: &[u8],
    dst: &PoolImage,
    dst_mem: &[u8],
    pairs: &[[i64; 2]],
) -> Vec<u8> {
    let mut want = dst_mem.to_vec();
    let c = reference::copy_blocks(src, src_mem, dst, &mut want, pairs);
    assert_eq!(c.bad_blocks, 0);
    want
}

fn write_then_read_back(kind: Kind, seed: u64) {
    let test = format!("nixl_loopback::{kind:?}");
    let (sa, sb) = (
        Shape {
            blocks: 16,
            layers: 3,
            bs: 4,
            heads: 2,
            dim: 16,
            elem: 2,
        },
        Shape {
            blocks: 12,
            layers: 3,
            bs: 4,
            heads: 2,
            dim: 16,
            elem: 2,
        },
    );
    let mut rng = Rng::new(seed);
    let a_mem = random_bytes(sa.bytes(), seed);
    assert!(a_mem.iter().any(|&x| x != POISON));
    let mut b_mem = vec![POISON; sb.bytes()];
    let mut back_mem = vec![POISON; sa.bytes()];

    let (a, b) = (
        agent(&format!("kvio-a-{kind:?}")),
        agent(&format!("kvio-b-{kind:?}")),
    );
    // SAFETY: the Vecs outlive the pools (both dropped at the end of this function) and are
    // read only between completed transfers.
    let (a_pool, b_pool, back_pool) = unsafe {
        (
            read_pool(&sa, kind, &a_mem),
            write_pool(&sb, kind, &mut b_mem),
            write_pool(&sa, kind, &mut back_mem),
        )
    };
    let _regs = [
        register(&a, &a_pool),
        register(&b, &b_pool),
        register(&a, &back_pool),
    ];
    // Metadata exchange, in process (what a side channel carries between hosts).
    let b_name = a
        .load_remote_md(&b.get_local_md().expect("B's metadata"))
        .expect("A loads B's metadata");
    assert_eq!(b_name, b.name());
    b.load_remote_md(&a.get_local_md().expect("A's metadata"))
        .expect("B loads A's metadata");

    // 1. A writes blocks of its pool into B's pool with a notification; B waits for that
    //    notification, then reads its pool (A's transfer handle is only dropped afterwards).
    let pairs = run_pairs(sa.blocks, sb.blocks, &mut rng);
    let write = BlockCopy::new(a_pool, b_pool, BlockMap::Host(&pairs));
    let mut inbox = Notifications::new(&b);
    let msg = format!("blocks-ready-{kind:?}");
    let args = PostArgs {
        notify: Some(msg.as_bytes()),
        ..PostArgs::default()
    };
    // SAFETY: both pools are Vecs of this test, alive and untouched until B got the
    // notification and A's transfer reports completion.
    let t = unsafe { nixl::post_with(&a, &b_name, XferOp::Write, &write, &args) }.expect("post");
    // One thread plays both agents: A's side must be progressed (its status polled) for the
    // transfer to finish and the notification to go out, as a sending process does.
    let start = std::time::Instant::now();
    while !inbox.take(&a.name(), msg.as_bytes()).expect("B polls") {
        t.done().expect("A progresses its transfer");
        assert!(start.elapsed() < TIMEOUT, "{test}: no notification");
    }
    t.wait(Some(TIMEOUT)).expect("wait");
    let descs = t.descs();
    drop(t);
    let valid = pairs.iter().filter(|p| p[0] >= 0).count();
    eprintln!("{test}: write: {valid} blocks in {descs} descriptors");
    let want = expected(
        &sa.image(kind),
        &a_mem,
        &sb.image(kind),
        &vec![POISON; sb.bytes()],
        &pairs,
    );
    assert_same(&format!("{test} write"), &b_mem, &want);

    // 2. A reads blocks of B's pool (as written in 1) into its second pool.
    let back_pairs = run_pairs(sb.blocks, sa.blocks, &mut rng);
    // SAFETY: as above; B's pool is the source now.
    let b_src = unsafe { read_pool(&sb, kind, &b_mem) };
    let read = BlockCopy::new(b_src, back_pool, BlockMap::Host(&back_pairs));
    let descs = run(&a, &b_name, XferOp::Read, &read);
    let valid = back_pairs.iter().filter(|p| p[0] >= 0).count();
    eprintln!("{test}: read: {valid} blocks in {descs} descriptors");
    let want = expected(
        &sb.image(kind),
        &b_mem,
        &sa.image(kind),
        &vec![POISON; sa.bytes()],
        &back_pairs,
    );
    assert_same(&format!("{test} read"), &back_mem, &want);
}

/// Notifications without transfers, and waits that time out.
fn notifications() {
    let (a, b) = (agent("kvio-notify-a"), agent("kvio-notify-b"));
    b.load_remote_md(&a.get_local_md().expect("A's metadata"))
        .expect("B loads A's metadata");
    a.load_remote_md(&b.get_local_md().expect("B's metadata"))
        .expect("A loads B's metadata");
    let mut inbox = Notifications::new(&b);
    // Nothing sent: a short wait times out, as a typed error.
    let e = inbox
        .wait("kvio-notify-a", b"never", Some(Duration::from_millis(50)))
        .unwrap_err();
    assert!(
        matches!(
            e,
            kvio::Error::Timeout {
                op: "Notifications::wait",
                ..
            }
        ),
        "{e:?}"
    );
    // Two messages; waiting for the second leaves the first pending.
    nixl::notify(&a, &b.name(), b"first").expect("notify");
    nixl::notify(&a, &b.name(), b"second").expect("notify");
    inbox
        .wait("kvio-notify-a", b"second", Some(TIMEOUT))
        .expect("second");
    assert!(inbox.take("kvio-notify-a", b"first").expect("take"));
    assert!(!inbox.take("kvio-notify-a", b"first").expect("take"));
    assert!(inbox.drain().is_empty());
}

#[test]
fn nixl_loopback_dram() {
    if !present("nixl_loopback_dram") {
        return;
    }
    // One test function: the UCX environment is set before any agent exists, on one thread.
    loopback_only(false);
    write_then_read_back(Kind::CrossNhd, 1);
    write_then_read_back(Kind::LayerFirst, 2);
    notifications();
}
