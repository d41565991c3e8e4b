//! `kvio::emulate::copy_blocks_counted` (block-map validation, pool geometry and the kernel body
//! run on the CPU, with an error word) with arbitrary pool descriptors (strided bases), host
//! block maps (through a staging buffer, as the kernel backend requires) or device block maps,
//! and views on small host buffers, the two pools in separate buffers or in one. No panic or
//! overflow; an accepted call touches nothing outside its views (AddressSanitizer past the end,
//! checked bytes before), never writes the source pool (separate buffers) or the map, counts
//! each pair with an id past its pool once, and —
//! when its pools are separate and no two valid pairs share a destination — writes exactly
//! what `kvio::reference::copy_blocks` writes. A refused call writes nothing.
#![no_main]

use kvio::reference::{self, PoolImage};
use kvio::{Backend, BlockCopy, BlockMap, BlockPool, PoolMemory};
use kvio_fuzz::{assert_same, elem, index, paged_shape, size, stride, Buf, MAX_BUF};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

/// Shape shared by both pools (a mismatch is a refusal worth fuzzing too).
#[derive(Clone, Copy, Debug)]
struct Shape {
    layers: usize,
    parts: usize,
    bs: usize,
    h: usize,
    d: usize,
    e: usize,
}

fn shape(u: &mut Unstructured) -> Result<Shape> {
    Ok(Shape {
        layers: size(u, 3)?,
        parts: size(u, 2)?,
        bs: size(u, 20)?,
        h: size(u, 3)?,
        d: size(u, 8)?,
        e: elem(u)?,
    })
}

/// A pool descriptor: block-major or layer-first placement, then any field perturbed.
fn pool<M: PoolMemory<'static>>(
    u: &mut Unstructured,
    s: Shape,
    mem: M,
) -> Result<BlockPool<'static, M::Access>> {
    let s = if u.ratio(1u8, 8)? { shape(u)? } else { s };
    let nb = size(u, 6)?;
    let hd = s.h.wrapping_mul(s.d);
    let part = s.bs.wrapping_mul(hd);
    let hnd: bool = u.arbitrary()?;
    let mut layout = paged_shape(hnd, nb, s.bs, s.h, s.d, s.e);
    let lp = s.layers.wrapping_mul(s.parts);
    let block_major: bool = u.arbitrary()?;
    let (bstride, ts, hs, ls, ps) = match (block_major, hnd) {
        // (NB, L, P, bs, H, D)
        (true, false) => (
            lp.wrapping_mul(part),
            hd,
            s.d,
            s.parts.wrapping_mul(part),
            part,
        ),
        // (NB, H, L, P, bs, D)
        (true, true) => {
            let p = s.bs.wrapping_mul(s.d);
            (
                s.h.wrapping_mul(lp).wrapping_mul(p),
                s.d,
                lp.wrapping_mul(p),
                s.parts.wrapping_mul(p),
                p,
            )
        }
        // (L, P, NB, ...)
        (false, false) => {
            let c = nb.wrapping_mul(part);
            (part, hd, s.d, s.parts.wrapping_mul(c), c)
        }
        (false, true) => {
            let c = nb.wrapping_mul(part);
            (
                part,
                s.d,
                s.bs.wrapping_mul(s.d),
                s.parts.wrapping_mul(c),
                c,
            )
        }
    };
    layout.block_stride = stride(u, bstride, 256)?;
    layout.token_stride = stride(u, ts, 256)?;
    layout.head_stride = stride(u, hs, 256)?;
    let e = s.e;
    let layer_stride = stride(u, ls, 256)?.wrapping_mul(e);
    let part_stride = stride(u, ps, 256)?.wrapping_mul(e);
    Ok(BlockPool::strided(
        mem,
        layer_stride,
        part_stride,
        s.layers,
        s.parts,
        layout,
    ))
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let _ = run(&mut u);
});

fn run(u: &mut Unstructured) -> Result<()> {
    let s = shape(u)?;
    let shared: bool = u.arbitrary()?;
    let src_len = u.int_in_range(0..=8192usize)?.min(MAX_BUF);
    let dst_len = u.int_in_range(0..=8192usize)?.min(MAX_BUF);
    let mut src_buf = Buf::new(u.int_in_range(0..=15)?, src_len, 0x11);
    let mut dst_buf = Buf::new(u.int_in_range(0..=15)?, dst_len, 0x22);
    let src_mem = src_buf.view(0, usize::MAX);
    let dst_mem = if shared {
        let at = u.int_in_range(0..=src_len)?;
        src_buf.view_mut(at, usize::MAX)
    } else {
        dst_buf.view_mut(0, usize::MAX)
    };
    let src = pool(u, s, src_mem)?;
    let dst = pool(u, s, dst_mem)?;
    // Keep the kernel's work small: huge pools are validated, then nothing is copied.
    let n = u.int_in_range(0usize..=12)?;
    let mut pairs = Vec::with_capacity(n);
    for _ in 0..n {
        pairs.push([
            index(u, src.layout.num_blocks.min(64))?,
            index(u, dst.layout.num_blocks.min(64))?,
        ]);
    }
    let device_map: bool = u.arbitrary()?;
    let map_pad = u.int_in_range(0usize..=1)? * 8 + if u.ratio(1u8, 16)? { 4 } else { 0 };
    let map_len = match u.int_in_range(0u8..=7)? {
        0 => (16 * n).saturating_sub(1),
        _ => 16 * n,
    };
    let map_bytes: Vec<u8> = pairs
        .iter()
        .flatten()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    let mut map_buf = Buf::new(map_pad, map_len, 0);
    let mv = map_buf.view(0, usize::MAX);
    // SAFETY: the view holds `mv.len()` bytes.
    unsafe { std::ptr::copy_nonoverlapping(map_bytes.as_ptr(), mv.ptr() as *mut u8, mv.len()) };
    // A host map goes through staging on the kernel backend (as on the GPU): 16 bytes a pair.
    let mut staging_buf = Buf::new(8, 16 * n, 0x33);
    let (map, staging) = if device_map {
        (BlockMap::Device { pairs: mv, len: n }, None)
    } else {
        (
            BlockMap::Host(&pairs),
            Some(staging_buf.view_mut(0, usize::MAX)),
        )
    };
    let op = BlockCopy {
        src,
        dst,
        map,
        backend: Backend::Kernel,
        max_ctas: if u.arbitrary()? {
            None
        } else {
            Some(u.int_in_range(0..=64)?)
        },
        staging,
        errors: None,
    };

    let before = (
        src_buf.data().to_vec(),
        dst_buf.data().to_vec(),
        map_buf.data().to_vec(),
    );
    // SAFETY: every view (pools, device map) is host memory of its length.
    let r = unsafe { kvio::emulate::copy_blocks_counted(&op) };
    src_buf.check_pad("src");
    dst_buf.check_pad("dst");
    map_buf.check_pad("map");
    staging_buf.check_pad("staging");
    assert_same("map", map_buf.data(), &before.2);
    let Ok((_, counts)) = r else {
        assert_same("refused: src", src_buf.data(), &before.0);
        assert_same("refused: dst", dst_buf.data(), &before.1);
        return Ok(());
    };
    // Accepted: each pair with an id past its pool is counted once (a negative id is
    // padding).
    let (nsrc, ndst) = (src.layout.num_blocks as u64, dst.layout.num_blocks as u64);
    let bad = pairs
        .iter()
        .filter(|&&[a, b]| a >= 0 && b >= 0 && (a as u64 >= nsrc || b as u64 >= ndst))
        .count() as u32;
    let want_counts = kvio::ErrorCounts {
        bad_blocks: bad,
        ..Default::default()
    };
    assert_eq!(counts, want_counts, "error word");
    if shared {
        return Ok(());
    }
    assert_same("src", src_buf.data(), &before.0);
    dst_buf.check_pad("dst");

    // Accepted, separate pools: compare with the reference unless a destination repeats.
    let mut dsts: Vec<i64> = pairs
        .iter()
        .filter(|&&[a, b]| a >= 0 && b >= 0 && (a as u64) < nsrc && (b as u64) < ndst)
        .map(|p| p[1])
        .collect();
    dsts.sort_unstable();
    if dsts.windows(2).any(|w| w[0] == w[1]) {
        return Ok(());
    }
    let image = |p: &BlockPool<'_>| PoolImage::of(p).expect("strided pools have an image");
    let mut want = before.1.clone();
    reference::copy_blocks(
        &image(&src),
        &before.0,
        &image(&dst.read()),
        &mut want,
        &pairs,
    );
    assert_same("dst", dst_buf.data(), &want);
    Ok(())
}
