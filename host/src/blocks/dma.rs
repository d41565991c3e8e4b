//! The DMA backend's plan: one copy-engine span per contiguous chunk, addressed by the same
//! `index::chunk_at` the kernel uses (with the host copies of the layer tables).

use kvio_kernels::index::{check_pair, chunk_at, PairCheck};

use super::plan::Geometry;
use super::pool::BlockPool;
use crate::plan::{Span, Spans};

/// The spans of a validated block copy with a host map; consecutive pairs `(s, d)`,
/// `(s+1, d+1)` merge into one span when a block's chunk fills its block stride on both sides
/// ([`Geometry::block_contiguous`]): one span a run of whole blocks (cross-layer pools), or one
/// a run per (layer, part) (layer-separate pools). A conversion to or from vLLM's v0 layout
/// ([`Geometry::pieces`]) is one span per piece of a head vector. The NIXL descriptors (`crate::nixl`) are
/// these spans too.
pub(crate) fn spans(
    src: &BlockPool<'_>,
    dst: &BlockPool<'_>,
    geo: &Geometry,
    pairs: &[[i64; 2]],
) -> Spans {
    let (nsrc, ndst) = (src.layout.num_blocks as u64, dst.layout.num_blocks as u64);
    // The valid pairs in order (padding dropped), without collecting them.
    let mut valid = pairs
        .iter()
        .filter(|p| check_pair(p[0], p[1], nsrc, ndst) == PairCheck::Valid)
        .map(|p| (p[0] as u64, p[1] as u64))
        .peekable();
    let (from, to) = (src.side(), dst.side());
    let [nl, np, nt, nh] = geo.ext;
    // At most one span per chunk of each pair: one allocation of that size at most.
    let per_pair = geo.ext.iter().product::<u64>() * geo.pieces.map_or(1, |p| p.count);
    let bound = (pairs.len() as u64).saturating_mul(per_pair);
    // (reserved up to 2^20 spans; a larger plan grows as it goes).
    let mut out = Spans::with_capacity(bound.min(1 << 20) as usize);
    while let Some((s0, d0)) = valid.next() {
        let mut run = 1;
        if geo.block_contiguous {
            while valid.peek() == Some(&(s0 + run as u64, d0 + run as u64)) {
                valid.next();
                run += 1;
            }
        }
        for l in 0..nl {
            for p in 0..np {
                for t in 0..nt {
                    for h in 0..nh {
                        let at = [l, p, t, h];
                        // SAFETY: validated pools: a table holds `layers × parts` entries and
                        // `l < layers`, `p < parts` (host slices are bounds-checked anyway).
                        let (s, d) = unsafe { (chunk_at(&from, s0, at), chunk_at(&to, d0, at)) };
                        let (s, d) = (s as u64, d as u64);
                        match geo.pieces {
                            // A conversion (no run: blocks are not contiguous): piece by piece.
                            Some(pc) => {
                                for k in 0..pc.count {
                                    out.push(Span {
                                        dst: d + k * pc.dst_stride,
                                        src: s + k * pc.src_stride,
                                        bytes: pc.bytes,
                                    });
                                }
                            }
                            None => out.push(Span {
                                dst: d,
                                src: s,
                                bytes: geo.chunk * run as u64,
                            }),
                        }
                    }
                }
            }
        }
    }
    out
}
