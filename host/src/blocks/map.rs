//! Block maps: which block goes where, held on the host (validated here, in full) or on the
//! device (shape checked here, ids checked by the kernel).

use kvio_kernels::index::{check_pair, pair_fault, PairCheck, PairFault};

use super::pool::{Bases, BlockPool};
use crate::error::{invalid, Error, Result};
use crate::inline::InlineVec;
use crate::mem::DeviceBytes;

/// The `(src_block, dst_block)` pairs of a block copy.
///
/// The rules, the same for host and device maps (`kvio_kernels::index::check_pair`):
/// - a pair with a negative id on either side is padding: skipped, never an error, whatever the
///   other id is;
/// - otherwise a pair with an id past its pool is refused: a host map fails the call
///   ([`Error::IndexOutOfRange`] naming `map.src`, checked first, or `map.dst`); a device map's
///   pair is skipped and counted **once** in [`ErrorCounts::bad_blocks`](crate::ErrorCounts),
///   even when both ids are bad.
///
/// ```
/// use kvio::BlockMap;
/// let pairs = [[3i64, 0], [-1, -1], [7, 1]]; // block 3 -> 0, padding, block 7 -> 1
/// let map = BlockMap::Host(&pairs);
/// assert!(matches!(map, BlockMap::Host(p) if p.len() == 3));
/// // On the device (vLLM's `block_mapping [n, 2]` i64): `BlockMap::Device { pairs, len: 3 }`,
/// // with `pairs` a `DeviceBytes` view of the 48 bytes.
/// ```
#[derive(Clone, Copy, Debug)]
pub enum BlockMap<'a> {
    /// Pairs in host memory: fully validated (ranges, duplicate destinations, overlap).
    Host(&'a [[i64; 2]]),
    /// `len` pairs of `i64` in device memory (`[len, 2]`, vLLM's `block_mapping`); checked by
    /// the kernel (bad ids skipped and counted).
    Device {
        /// The pairs.
        pairs: DeviceBytes<'a>,
        /// Number of pairs.
        len: usize,
    },
}

/// Pairs of a host map checked without a heap allocation (larger maps allocate once).
const INLINE_PAIRS: usize = 64;

/// Whether two lists of disjoint ranges, each in address order, share a byte (one sweep).
fn intersect(a: impl Iterator<Item = (u64, u64)>, b: impl Iterator<Item = (u64, u64)>) -> bool {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    while let (Some(&(a0, a1)), Some(&(b0, b1))) = (a.peek(), b.peek()) {
        if a0 < b1 && b0 < a1 {
            return true;
        }
        // The range that ends first cannot meet any later range of the other list.
        if a1 <= b1 {
            a.next();
        } else {
            b.next();
        }
    }
    false
}

/// Validates a host map: ids in range (negatives are padding), no destination twice, and —
/// when the pools share memory — no block both read and written.
pub(crate) fn check_host_map(
    src: &BlockPool<'_>,
    dst: &BlockPool<'_>,
    pairs: &[[i64; 2]],
) -> Result<()> {
    let dsts = check_host_ids(src, dst, pairs)?;
    let (nsrc, ndst) = (src.layout.num_blocks as u64, dst.layout.num_blocks as u64);
    let (se, de) = (src.layout.extent("src")?, dst.layout.extent("dst")?);
    let shared = intersect(src.sorted_ranges(se), dst.sorted_ranges(de));
    if shared {
        if let (Some(a), Some(b)) = (block_footprint(src), block_footprint(dst)) {
            // Block-major pools: compare the byte ranges blocks occupy.
            let mut reads: InlineVec<(u64, u64, usize), INLINE_PAIRS> =
                InlineVec::with_capacity(pairs.len());
            for (i, p) in pairs.iter().enumerate() {
                if check_pair(p[0], p[1], nsrc, ndst) == PairCheck::Valid {
                    reads.push((a.0 + p[0] as u64 * a.1, a.0 + (p[0] as u64 + 1) * a.1, i));
                }
            }
            reads.sort_unstable();
            for &(d, di) in dsts.iter() {
                let (lo, hi) = (b.0 + d as u64 * b.1, b.0 + (d as u64 + 1) * b.1);
                // first read range ending after lo; it overlaps if it starts before hi
                let k = reads.partition_point(|r| r.0 + a.1 <= lo);
                if let Some(r) = reads.get(k).filter(|r| r.0 < hi) {
                    return Err(Error::Overlap {
                        name: "map",
                        first: r.2,
                        second: di,
                    });
                }
            }
        } else if same_block_addressing(src, dst) {
            // Scattered blocks, addressed identically: ids name the same bytes.
            let mut srcs: InlineVec<(i64, usize), INLINE_PAIRS> =
                InlineVec::with_capacity(pairs.len());
            for (i, p) in pairs.iter().enumerate() {
                if check_pair(p[0], p[1], nsrc, ndst) == PairCheck::Valid {
                    srcs.push((p[0], i));
                }
            }
            srcs.sort_unstable();
            for &(d, di) in dsts.iter() {
                if let Ok(k) = srcs.binary_search_by_key(&d, |&(s, _)| s) {
                    return Err(Error::Overlap {
                        name: "map",
                        first: srcs[k].1,
                        second: di,
                    });
                }
            }
        } else {
            return Err(invalid(
                "dst",
                "shares memory with src",
                "pools sharing memory must be block-major or address blocks identically",
            ));
        }
    }
    Ok(())
}

/// The checks of [`check_host_map`] that hold whatever memory the pools share: ids in range
/// (negatives are padding) and no destination twice. Returns the valid pairs' `(dst, at)`,
/// sorted. Pools in different address spaces (a NIXL transfer's remote pool) need only these.
pub(crate) fn check_host_ids(
    src: &BlockPool<'_>,
    dst: &BlockPool<'_>,
    pairs: &[[i64; 2]],
) -> Result<InlineVec<(i64, usize), INLINE_PAIRS>> {
    let (nsrc, ndst) = (src.layout.num_blocks as u64, dst.layout.num_blocks as u64);
    for (i, &[s, d]) in pairs.iter().enumerate() {
        // The kernel's rule (`index::check_pair`), with the bad side named.
        if check_pair(s, d, nsrc, ndst) == PairCheck::OutOfRange {
            let (name, value, limit) = match pair_fault(s, d, nsrc, ndst) {
                Some(PairFault::Src) => ("map.src", s, nsrc),
                _ => ("map.dst", d, ndst),
            };
            return Err(Error::IndexOutOfRange {
                name,
                at: i,
                value,
                limit,
            });
        }
    }
    let mut dsts: InlineVec<(i64, usize), INLINE_PAIRS> = InlineVec::with_capacity(pairs.len());
    for (i, p) in pairs.iter().enumerate() {
        if check_pair(p[0], p[1], nsrc, ndst) == PairCheck::Valid {
            dsts.push((p[1], i));
        }
    }
    dsts.sort_unstable();
    if let Some(w) = dsts.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::Overlap {
            name: "map.dst",
            first: w[0].1,
            second: w[1].1,
        });
    }
    Ok(dsts)
}

/// `(start, stride)` when every block of a strided pool lies inside its own `stride` bytes
/// from `start` (block-major pools: cross-layer NHD/HND), so block `b` is the byte range
/// `start + b * stride .. start + (b + 1) * stride`.
fn block_footprint(p: &BlockPool<'_>) -> Option<(u64, u64)> {
    let Bases::Strided {
        mem,
        layer_stride,
        part_stride,
    } = p.bases
    else {
        return None;
    };
    let l = &p.layout;
    let e = l.elem_bytes as u64;
    // One layer/part's block: dense when head vectors are in pieces (v0) or parts are laid
    // out differently (the pool checked).
    let block = match p.dense_block() {
        Some(b) => b,
        None => {
            (l.block_size as u64 - 1) * l.token_stride as u64 * e
                + (l.num_heads as u64 - 1) * l.head_stride as u64 * e
                + l.chunk_bytes() as u64
        }
    };
    let inner = block
        + (p.layers as u64 - 1) * layer_stride as u64
        + (p.parts as u64 - 1) * part_stride as u64;
    let stride = l.block_stride as u64 * e;
    (inner <= stride).then_some((mem.ptr(), stride))
}

/// A device-resident map must hold `len` 16-byte pairs and be 8-byte aligned.
pub(crate) fn check_device_map(pairs: DeviceBytes, len: usize) -> Result<()> {
    let need = (len as u64)
        .checked_mul(16)
        .ok_or(Error::Overflow { name: "map" })?;
    if need > pairs.len() as u64 {
        return Err(Error::BufferTooSmall {
            name: "map.pairs",
            needed: need,
            len: pairs.len() as u64,
        });
    }
    if !pairs.ptr().is_multiple_of(8) {
        return Err(invalid("map.pairs", pairs.ptr(), "must be 8-byte aligned"));
    }
    Ok(())
}

/// True when block `b` occupies the same bytes in both pools (same bases, same block stride).
fn same_block_addressing(a: &BlockPool<'_>, b: &BlockPool<'_>) -> bool {
    let bases = match (a.bases, b.bases) {
        (
            Bases::Strided {
                mem: m1,
                layer_stride: l1,
                part_stride: p1,
            },
            Bases::Strided {
                mem: m2,
                layer_stride: l2,
                part_stride: p2,
            },
        ) => m1.ptr() == m2.ptr() && l1 == l2 && p1 == p2,
        (Bases::Table(t1), Bases::Table(t2)) => t1.bases() == t2.bases(),
        _ => false,
    };
    bases
        && a.layout.block_stride * a.layout.elem_bytes
            == b.layout.block_stride * b.layout.elem_bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::test_pools::*;

    // ---- host block maps -----------------------------------------------------------------

    /// Disjoint pools: src of 4 blocks, dst of 6.
    fn disjoint() -> (Pool, Pool) {
        (nhd(SRC, 4, 2, 4, 2, 8, 2), hnd(DST, 6, 2, 4, 2, 8, 2))
    }

    fn check(src: Pool, dst: Pool, pairs: &[[i64; 2]]) -> Result<()> {
        check_host_map(&src.read(), &dst.read(), pairs)
    }

    #[test]
    fn host_map_ids_in_range_accepted() {
        let (s, d) = disjoint();
        assert_eq!(check(s, d, &[]), Ok(()));
        assert_eq!(check(s, d, &[[0, 0], [3, 5], [3, 4], [1, 1]]), Ok(()));
    }

    #[test]
    fn host_map_src_out_of_range() {
        let (s, d) = disjoint();
        // 4 is a valid destination but not a valid source.
        let r = check(s, d, &[[0, 0], [1, 1], [4, 2]]);
        assert_eq!(
            r,
            Err(Error::IndexOutOfRange {
                name: "map.src",
                at: 2,
                value: 4,
                limit: 4
            })
        );
        let r = check(s, d, &[[i64::MAX, 0]]);
        assert_eq!(
            r,
            Err(Error::IndexOutOfRange {
                name: "map.src",
                at: 0,
                value: i64::MAX,
                limit: 4
            })
        );
    }

    #[test]
    fn host_map_dst_out_of_range() {
        let (s, d) = disjoint();
        let r = check(s, d, &[[0, 5], [1, 6]]);
        assert_eq!(
            r,
            Err(Error::IndexOutOfRange {
                name: "map.dst",
                at: 1,
                value: 6,
                limit: 6
            })
        );
        // The first bad pair is reported.
        let r = check(s, d, &[[0, 0], [2, 100], [9, 1]]);
        assert_eq!(
            r,
            Err(Error::IndexOutOfRange {
                name: "map.dst",
                at: 1,
                value: 100,
                limit: 6
            })
        );
    }

    #[test]
    fn host_map_duplicate_destination() {
        let (s, d) = disjoint();
        let r = check(s, d, &[[0, 2], [1, 3], [3, 2]]);
        assert_eq!(
            r,
            Err(Error::Overlap {
                name: "map.dst",
                first: 0,
                second: 2
            })
        );
        // Same source twice is fine.
        assert_eq!(check(s, d, &[[0, 2], [0, 3]]), Ok(()));
    }

    #[test]
    fn host_map_negative_ids_are_padding() {
        let (s, d) = disjoint();
        let pairs = [
            [-1, -1],
            [-1, -1],
            [-1, 0],
            [-1, 0],
            [0, -1],
            [0, -1],
            [i64::MIN, 99],
            [99, i64::MIN],
            [1, 0],
        ];
        assert_eq!(check(s, d, &pairs), Ok(()));
        // Padding in a pool that shares memory does not count as a read or a write.
        let p = nhd(SRC, 4, 2, 4, 2, 8, 2);
        assert_eq!(check(p, p, &[[-1, 1], [1, 2], [3, -1], [2, -5]]), Ok(()));
    }

    #[test]
    fn host_map_shared_memory_block_read_and_written() {
        let p = nhd(SRC, 4, 2, 4, 2, 8, 2);
        // Block 1 is written by pair 0 and read by pair 1.
        let r = check(p, p, &[[0, 1], [1, 2]]);
        assert_eq!(
            r,
            Err(Error::Overlap {
                name: "map",
                first: 1,
                second: 0
            })
        );
        // A block copied onto itself.
        let r = check(p, p, &[[3, 3]]);
        assert_eq!(
            r,
            Err(Error::Overlap {
                name: "map",
                first: 0,
                second: 0
            })
        );
        // Same memory, other layout: still shared.
        let q = hnd(SRC, 4, 2, 4, 2, 8, 2);
        assert!(matches!(
            check(p, q, &[[0, 1], [1, 2]]),
            Err(Error::Overlap { name: "map", .. })
        ));
        // Disjoint sets of blocks in shared memory are fine (copy-on-write, defragmentation).
        assert_eq!(check(p, p, &[[0, 2], [1, 3]]), Ok(()));
    }

    #[test]
    fn host_map_disjoint_memory_same_ids_fine() {
        let (s, d) = disjoint();
        assert_eq!(check(s, d, &[[0, 0], [1, 1], [2, 2], [3, 3]]), Ok(()));
        assert_eq!(check(s, d, &[[0, 1], [1, 2]]), Ok(()));
        // Adjacent (touching, not overlapping) allocations are disjoint too.
        let a = nhd(SRC, 4, 2, 4, 2, 8, 2);
        let b = nhd(SRC + pool_bytes(4, 2, 4, 2, 8, 2) as u64, 4, 2, 4, 2, 8, 2);
        assert_eq!(check(a, b, &[[0, 1], [1, 2]]), Ok(()));
        assert_eq!(check(b, a, &[[0, 1], [1, 2]]), Ok(()));
        // One byte of overlap makes them shared: only a pair touching that byte collides.
        let c = nhd(
            SRC + pool_bytes(4, 2, 4, 2, 8, 2) as u64 - 1,
            4,
            2,
            4,
            2,
            8,
            2,
        );
        assert_eq!(check(a, c, &[[0, 1], [1, 2]]), Ok(()));
        assert!(matches!(
            check(a, c, &[[3, 0]]),
            Err(Error::Overlap { name: "map", .. })
        ));
    }

    #[test]
    fn host_map_shared_memory_offset_views_compare_bytes() {
        // dst views the same allocation one block further on, in HND order: dst block 0 is
        // the bytes of src block 1, rewritten in another order while they are read (a race).
        let block = pool_bytes(1, 2, 4, 2, 8, 2);
        let src = nhd(SRC, 4, 2, 4, 2, 8, 2);
        let dst = hnd(SRC + block as u64, 3, 2, 4, 2, 8, 2);
        let race = check(src, dst, &[[1, 0]]);
        assert!(
            matches!(race, Err(Error::Overlap { name: "map", .. })),
            "{race:?}"
        );
        // src block 0 -> dst block 0 (= src block 1) touches no byte twice.
        assert_eq!(check(src, dst, &[[0, 0]]), Ok(()));
    }
}
