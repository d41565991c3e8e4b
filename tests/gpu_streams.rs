//! kvio on truly non-blocking streams: the streams the tests use are non-blocking, and work on
//! two of them is ordered by an event alone. Skips without a GPU unless `KVIO_REQUIRE_GPU=1`.

use kvio::cust::memory::DeviceBuffer;
use kvio::reference;
use kvio::{Backend, BlockCopy, BlockMap, DeviceBytes, Event};
use kvio_suite::{assert_same, gpu, upload, Kind, Shape, TestPool};

#[test]
fn test_streams_are_non_blocking() {
    let Some(g) = gpu("streams") else { return };
    let stream = g.stream();
    assert!(stream.is_non_blocking().unwrap());
}

/// Stream A copies every block of a large pool P0 into P1; stream B, after waiting for an
/// event recorded on A, copies P1 into P2. Only B is synchronised: P2 must hold P0's blocks.
#[test]
fn block_copies_on_two_streams_ordered_by_an_event() {
    let Some(g) = gpu("streams") else { return };
    let (a, b) = (g.stream(), g.stream());
    // 128 blocks × 32 layers × K/V × 16 tokens × 8 × 128 bf16: 256 MiB per pool, so that
    // B would overtake A without the event.
    let s = Shape {
        blocks: 128,
        layers: 32,
        bs: 16,
        heads: 8,
        dim: 128,
        elem: 2,
    };
    let (p0, data) = TestPool::random(Kind::CrossNhd, false, s, 7);
    let (p1, _) = TestPool::random(Kind::CrossHnd, false, s, 8);
    let (p2, poison) = TestPool::random(Kind::CrossNhd, false, s, 9);
    let n = s.blocks as i64;
    // Reversed on the way in, reversed back on the way out: P2 = P0 block for block.
    let there: Vec<i64> = (0..n).flat_map(|i| [i, n - 1 - i]).collect();
    let back: Vec<i64> = (0..n).flat_map(|i| [n - 1 - i, i]).collect();
    let (there_d, back_d) = (upload(&there), upload(&back));
    let (first, second) = (
        copy(&p0, &p1, &there_d, s.blocks),
        copy(&p1, &p2, &back_d, s.blocks),
    );
    let done = Event::new().unwrap();
    g.kv.copy_blocks(&first, a.sref()).unwrap();
    done.record(a.sref()).unwrap();
    done.wait_on(b.sref()).unwrap();
    g.kv.copy_blocks(&second, b.sref()).unwrap();
    b.synchronize().unwrap();
    let got = p2.mem.read();
    assert_ne!(got, poison, "the second copy changed nothing");
    let mut want = poison;
    let identity: Vec<[i64; 2]> = (0..n).map(|i| [i, i]).collect();
    reference::copy_blocks(&p0.image(), &data, &p2.image(), &mut want, &identity);
    assert_same("P2 after A then B", &got, &want);
}

/// A kernel-backend copy of `len` pairs held on the device.
fn copy<'a>(
    src: &'a TestPool,
    dst: &'a TestPool,
    map: &'a DeviceBuffer<i64>,
    len: usize,
) -> BlockCopy<'a> {
    BlockCopy {
        src: src.pool().into(),
        dst: dst.pool(),
        map: BlockMap::Device {
            pairs: DeviceBytes::of(map),
            len,
        },
        backend: Backend::Kernel,
        max_ctas: None,
        staging: None,
        errors: None,
    }
}

/// `DeviceAlloc::write` and `read` on a stream: ordered with each other and with a kvio call
/// between them, ranges checked.
#[test]
fn device_alloc_copies_are_stream_ordered() {
    let Some(g) = gpu("streams") else { return };
    let stream = g.stream();
    let s = Shape {
        blocks: 8,
        layers: 2,
        bs: 16,
        heads: 2,
        dim: 64,
        elem: 2,
    };
    let (mut src, mut dst) = (
        kvio::DeviceAlloc::new(s.bytes()).unwrap(),
        kvio::DeviceAlloc::new(s.bytes()).unwrap(),
    );
    let data = kvio_suite::random_bytes(s.bytes(), 31);
    let poison = kvio_suite::random_bytes(s.bytes(), 32);
    src.write(0, &data, stream.sref()).unwrap();
    dst.write(0, &poison, stream.sref()).unwrap();
    // A kvio call between the uploads and the read-back, on the same stream.
    let pairs = [[3i64, 0], [-1, -1], [5, 6]];
    let op = BlockCopy {
        src: s.pool(Kind::CrossNhd, src.bytes()),
        dst: s.pool(Kind::CrossNhd, dst.bytes_mut()),
        map: BlockMap::Host(&pairs),
        backend: Backend::Auto,
        max_ctas: None,
        staging: None,
        errors: None,
    };
    g.kv.copy_blocks(&op, stream.sref()).unwrap();
    let mut got = vec![0u8; s.bytes()];
    dst.read(0, &mut got, stream.sref()).unwrap();
    let mut want = poison.clone();
    let img = s.image(Kind::CrossNhd);
    reference::copy_blocks(&img, &data, &img, &mut want, &pairs);
    assert_same("dst after write, copy_blocks, read", &got, &want);
    // An offset write and read inside the allocation; past its end, a typed error.
    src.write(100, &[0xAB; 28], stream.sref()).unwrap();
    let mut part = [0u8; 30];
    src.read(99, &mut part, stream.sref()).unwrap();
    assert_eq!(part[0], data[99]);
    assert!(part[1..29].iter().all(|&b| b == 0xAB));
    assert_eq!(part[29], data[128]);
    let end = s.bytes();
    assert!(matches!(
        src.write(end - 1, &[0, 0], stream.sref()),
        Err(kvio::Error::BufferTooSmall { .. })
    ));
    assert!(matches!(
        src.read(end, &mut [0u8; 1], stream.sref()),
        Err(kvio::Error::BufferTooSmall { .. })
    ));
}

/// The host side of a pinned pool cannot race a transfer: right after an offload into it is
/// enqueued (nothing synchronised), `as_slice` waits and sees every block; after an onload
/// reads it, `as_mut_slice` waits before the host may overwrite it (transfers on the kernel
/// backend with one CTA). This checks what the accessors hand out; it does not show that a
/// read without the wait would fail here: a byte-wise volatile read without it, tried on the
/// H200, lagged the transfer and saw it finished.
#[test]
fn pinned_host_access_waits_for_transfers() {
    let Some(g) = gpu("streams") else { return };
    let stream = g.stream();
    let s = Shape {
        blocks: 64,
        layers: 32,
        bs: 16,
        heads: 8,
        dim: 128,
        elem: 2,
    }; // 128 MiB
    let data = kvio_suite::random_bytes(s.bytes(), 41);
    let poison = kvio_suite::random_bytes(s.bytes(), 42);
    let mut dev = kvio::DeviceAlloc::new(s.bytes()).unwrap();
    dev.write(0, &data, stream.sref()).unwrap();
    stream.synchronize().unwrap();
    let mut host = kvio::PinnedHost::alloc(s.bytes()).unwrap();
    host.as_mut_slice().unwrap().copy_from_slice(&poison);
    let pairs: Vec<[i64; 2]> = (0..s.blocks as i64).map(|b| [b, b]).collect();

    // Offload, then read on the host at once: as_slice waits for it.
    let op = BlockCopy::new(
        s.pool(Kind::CrossNhd, dev.bytes()),
        s.pool(Kind::CrossNhd, host.bytes_mut()),
        BlockMap::Host(&pairs),
    )
    .backend(Backend::Kernel)
    .max_ctas(1);
    g.kv.copy_blocks(&op, stream.sref()).unwrap();
    assert_same(
        "offloaded pool, read at once",
        host.as_slice().unwrap(),
        &data,
    );

    // Onload back into poisoned device memory, then overwrite the pool on the host at once:
    // as_mut_slice waits until the onload has read it.
    dev.write(0, &poison, stream.sref()).unwrap();
    let op = BlockCopy::new(
        s.pool(Kind::CrossNhd, host.bytes()),
        s.pool(Kind::CrossNhd, dev.bytes_mut()),
        BlockMap::Host(&pairs),
    )
    .backend(Backend::Kernel)
    .max_ctas(1);
    g.kv.copy_blocks(&op, stream.sref()).unwrap();
    host.as_mut_slice().unwrap().fill(0x5A);
    let mut back = vec![0u8; s.bytes()];
    dev.read(0, &mut back, stream.sref()).unwrap();
    assert_same("onloaded pool, host overwrote it at once", &back, &data);
}
