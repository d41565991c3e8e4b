//! Description-only pools for the block-copy unit tests (addresses are never dereferenced).

use super::plan::{geometry, Geometry};
use super::*;
use crate::alloc::MemoryKind;
use crate::error::{Error, Result};
use crate::layout::PagedLayout;
use crate::mem::{DeviceBytes, DeviceBytesMut};

// Shapes used throughout: blocks, layers, block_size, heads, head_dim, elem_bytes.
pub(crate) const NB: usize = 4;
pub(crate) const L: usize = 3;
pub(crate) const BS: usize = 16;
pub(crate) const H: usize = 8;
pub(crate) const D: usize = 128;
pub(crate) const E: usize = 2;

pub(crate) const SRC: u64 = 0x1000_0000;
pub(crate) const DST: u64 = 0x8000_0000;

pub(crate) fn bytes(ptr: u64, len: usize) -> DeviceBytes<'static> {
    // SAFETY: these views are only validated, never used.
    unsafe { DeviceBytes::from_raw(ptr, len) }
}

pub(crate) fn bytes_mut(ptr: u64, len: usize) -> DeviceBytesMut<'static> {
    // SAFETY: as above.
    unsafe { DeviceBytesMut::from_raw(ptr, len) }
}

/// A writable test pool (usable as source and destination).
pub(crate) type Pool = BlockPool<'static, Writable>;

/// Bytes of a whole pool of `nb` blocks (every layer, K and V).
pub(crate) fn pool_bytes(nb: usize, l: usize, bs: usize, h: usize, d: usize, e: usize) -> usize {
    nb * l * 2 * bs * h * d * e
}

pub(crate) fn nhd(at: u64, nb: usize, l: usize, bs: usize, h: usize, d: usize, e: usize) -> Pool {
    let mem = bytes_mut(at, pool_bytes(nb, l, bs, h, d, e));
    BlockPool::cross_layer_nhd(mem, nb, l, bs, h, d, e)
}

pub(crate) fn hnd(at: u64, nb: usize, l: usize, bs: usize, h: usize, d: usize, e: usize) -> Pool {
    let mem = bytes_mut(at, pool_bytes(nb, l, bs, h, d, e));
    BlockPool::cross_layer_hnd(mem, nb, l, bs, h, d, e)
}

/// A one-part pool (a combined K|V or MLA cache per layer) of `NB` blocks, `L` layers.
pub(crate) fn one_part(at: u64) -> Pool {
    let cache = NB * BS * H * D * E;
    let layout = PagedLayout::nhd(NB, BS, H, D, E);
    BlockPool::strided(bytes_mut(at, L * cache), cache, 0, L, 1, layout)
}

/// SGLang-style layer-first pool in one allocation: `[2, L, NB, bs, H, D]` (parts outer).
pub(crate) fn layer_first(
    at: u64,
    nb: usize,
    l: usize,
    bs: usize,
    h: usize,
    d: usize,
    e: usize,
) -> Pool {
    let cache = nb * bs * h * d * e;
    let mem = bytes_mut(at, pool_bytes(nb, l, bs, h, d, e));
    let layout = PagedLayout::nhd(nb, bs, h, d, e);
    BlockPool::strided(mem, cache, l * cache, l, 2, layout)
}

pub(crate) fn op<'a>(
    src: BlockPool<'a, Writable>,
    dst: BlockPool<'a, Writable>,
    map: &'a [[i64; 2]],
) -> BlockCopy<'a> {
    BlockCopy::new(src, dst, BlockMap::Host(map))
}

pub(crate) fn device(_: u64) -> MemoryKind {
    MemoryKind::Device
}

pub(crate) fn geo(src: Pool, dst: Pool) -> Result<Geometry> {
    geometry(&op(src, dst, &[]), &device)
}

pub(crate) fn assert_invalid<T: std::fmt::Debug>(r: Result<T>, want: &'static str) {
    match r {
        Err(Error::InvalidArgument { name, .. }) if name == want => {}
        other => panic!("expected InvalidArgument {{ name: {want:?} }}, got {other:?}"),
    }
}
