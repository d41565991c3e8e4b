//! The bulk-copy path (`Backend::Tma`, entry `kvio_transfer_blocks_tma`) in the CPU emulation:
//! the planner picks it for 16-byte aligned pools and the emulated kernel body (the same item
//! schedule as on `sm_90`: one-warp CTAs, batches of items one lane each, with plain copies
//! for the bulk ones) moves exactly the reference's bytes, on random data with poisoned
//! destinations: cross-layer and layer-separate (layer-first, strided) pools and conversions
//! between them, page sizes 1, 16 and 128, maps with padding and ids past either pool, several
//! CTA budgets; misaligned pools fall back to `Backend::Kernel`. No GPU needed.

use kvio::{reference, Backend, BlockCopy, BlockMap, DeviceBytes, DeviceBytesMut};
use kvio_suite::{random_bytes, random_pairs, Kind, Rng, Shape};

/// A 16-byte aligned host buffer of `len + off` bytes holding `data` at byte `off`.
fn aligned(data: &[u8], off: usize) -> Vec<u128> {
    let mut v = vec![0u128; (data.len() + off).div_ceil(16)];
    bytemuck::cast_slice_mut::<u128, u8>(&mut v)[off..off + data.len()].copy_from_slice(data);
    v
}

/// Runs one emulated copy with `backend` from `src` (kind `sk`) to a poisoned `dst` (kind
/// `dk`), both `off` bytes past 16-byte alignment; returns the backend that ran after checking
/// the bytes against the reference.
#[allow(clippy::too_many_arguments)]
fn run(
    s: Shape,
    sk: Kind,
    dk: Kind,
    pairs: &[[i64; 2]],
    device_map: bool,
    off: usize,
    max_ctas: Option<u32>,
    seed: u64,
    name: &str,
) -> Backend {
    let src_data = random_bytes(s.bytes(), seed);
    let poison = random_bytes(s.bytes(), seed ^ 0xdead);
    let src = aligned(&src_data, off);
    let mut dst = aligned(&poison, off);
    let flat: Vec<i64> = pairs.iter().flatten().copied().collect();
    // SAFETY: host memory alive for the call, used by the emulation only.
    let (sv, dv, map) = unsafe {
        (
            DeviceBytes::from_raw(src.as_ptr() as u64 + off as u64, s.bytes()),
            DeviceBytesMut::from_raw(dst.as_mut_ptr() as u64 + off as u64, s.bytes()),
            DeviceBytes::from_raw(flat.as_ptr() as u64, flat.len() * 8),
        )
    };
    let map = if device_map {
        BlockMap::Device {
            pairs: map,
            len: pairs.len(),
        }
    } else {
        BlockMap::Host(pairs)
    };
    let mut op = BlockCopy::new(s.pool(sk, sv), s.pool(dk, dv), map).backend(Backend::Tma);
    op.max_ctas = max_ctas;
    // SAFETY: every view in `op` is live host memory of its length.
    let ran = unsafe { kvio::emulate::copy_blocks(&op) }.unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut want = poison;
    let counts = reference::copy_blocks(&s.image(sk), &src_data, &s.image(dk), &mut want, pairs);
    let got = &bytemuck::cast_slice::<u128, u8>(&dst)[off..off + s.bytes()];
    if let Some(at) = got.iter().zip(&want).position(|(a, b)| a != b) {
        panic!("{name}: first difference at byte {at} (counts {counts:?})");
    }
    ran
}

#[test]
fn tma_emulated_matches_reference() {
    let mut rng = Rng::new(0x7a3);
    let mut seed = 1u64;
    for bs in [1usize, 16, 128] {
        let s = Shape {
            blocks: 7,
            layers: 2,
            bs,
            heads: 4,
            dim: 64,
            elem: 2,
        };
        for (sk, dk) in [
            (Kind::CrossNhd, Kind::CrossNhd),
            (Kind::CrossNhd, Kind::LayerFirst),
            (Kind::LayerFirst, Kind::CrossHnd),
            (Kind::LayerFirst, Kind::LayerFirst),
            (Kind::CrossHnd, Kind::CrossNhd),
        ] {
            for device_map in [true, false] {
                for max_ctas in [None, Some(1), Some(3)] {
                    let mut pairs = random_pairs(5, s.blocks, s.blocks, 10, &mut rng);
                    if device_map {
                        // Ids past either pool and padding (device maps only: a host map with
                        // them is refused).
                        pairs.extend([[s.blocks as i64, 0], [1, 1 << 40], [-1, 2], [3, -5]]);
                    }
                    let name =
                        format!("bs={bs} {sk:?}->{dk:?} device_map={device_map} ctas={max_ctas:?}");
                    let ran = run(s, sk, dk, &pairs, device_map, 0, max_ctas, seed, &name);
                    assert_eq!(ran, Backend::Tma, "{name}");
                    seed += 1;
                }
            }
        }
    }
}

#[test]
fn tma_emulated_falls_back_when_misaligned() {
    let mut rng = Rng::new(5);
    let s = Shape {
        blocks: 5,
        layers: 2,
        bs: 16,
        heads: 2,
        dim: 64,
        elem: 2,
    };
    let pairs = random_pairs(4, s.blocks, s.blocks, 10, &mut rng);
    // Pools 8 bytes past alignment: every access 8 bytes wide, the kernel backend.
    let ran = run(
        s,
        Kind::CrossNhd,
        Kind::LayerFirst,
        &pairs,
        true,
        8,
        None,
        3,
        "off 8",
    );
    assert_eq!(ran, Backend::Kernel);
    // Chunks of 6 bytes.
    let s = Shape {
        dim: 3,
        heads: 1,
        ..s
    };
    let ran = run(
        s,
        Kind::LayerFirst,
        Kind::CrossHnd,
        &pairs,
        false,
        0,
        None,
        4,
        "6-byte chunks",
    );
    assert_eq!(ran, Backend::Kernel);
}
