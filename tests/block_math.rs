//! CPU tests of the block-copy index math (`kvio_kernels::index::{check_pair, split_n}`) and
//! of the CPU reference block copy (`kvio::reference::copy_blocks`), against independent
//! formulations.

use kvio::reference::{copy_blocks, PoolImage};
use kvio::{ErrorCounts, PagedLayout};
use kvio_kernels::index::{check_pair, split_n, PairCheck};
use kvio_suite::{Kind, Shape};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

// ---------------------------------------------------------------------------------------------
// check_pair
// ---------------------------------------------------------------------------------------------

/// Independent expectation for `check_pair`, in i128.
fn expected_pair(src: i64, dst: i64, src_blocks: u64, dst_blocks: u64) -> PairCheck {
    if src < 0 || dst < 0 {
        PairCheck::Skip
    } else if src as i128 >= src_blocks as i128 || dst as i128 >= dst_blocks as i128 {
        PairCheck::OutOfRange
    } else {
        PairCheck::Valid
    }
}

#[test]
fn check_pair_negative_either_side_is_skipped() {
    let negs = [-1i64, -2, -(1 << 40), i64::MIN, i64::MIN + 1];
    let others = [0i64, 1, 5, 1000, i64::MAX, -1, i64::MIN];
    for &n in &negs {
        for &o in &others {
            for (sb, db) in [(0u64, 0u64), (1, 1), (10, 3), (u64::MAX, u64::MAX)] {
                assert_eq!(check_pair(n, o, sb, db), PairCheck::Skip, "({n}, {o})");
                assert_eq!(check_pair(o, n, sb, db), PairCheck::Skip, "({o}, {n})");
            }
        }
    }
}

#[test]
fn check_pair_ids_at_or_past_their_pool_are_out_of_range() {
    // src pool of 10 blocks, dst pool of 3.
    assert_eq!(check_pair(9, 2, 10, 3), PairCheck::Valid);
    assert_eq!(check_pair(10, 2, 10, 3), PairCheck::OutOfRange);
    assert_eq!(check_pair(9, 3, 10, 3), PairCheck::OutOfRange);
    assert_eq!(check_pair(10, 3, 10, 3), PairCheck::OutOfRange);
    // Each id is checked against its own pool: 5 is a valid source, not a valid destination.
    assert_eq!(check_pair(5, 1, 10, 3), PairCheck::Valid);
    assert_eq!(check_pair(1, 5, 10, 3), PairCheck::OutOfRange);
    assert_eq!(check_pair(i64::MAX, 0, 10, 3), PairCheck::OutOfRange);
    assert_eq!(check_pair(0, i64::MAX, 10, 3), PairCheck::OutOfRange);
    assert_eq!(check_pair(1 << 33, 0, 1 << 33, 3), PairCheck::OutOfRange);
    assert_eq!(check_pair((1 << 33) - 1, 0, 1 << 33, 3), PairCheck::Valid);
}

#[test]
fn check_pair_extreme_values() {
    assert_eq!(
        check_pair(i64::MAX, i64::MAX, u64::MAX, u64::MAX),
        PairCheck::Valid
    );
    assert_eq!(
        check_pair(i64::MAX, i64::MAX, i64::MAX as u64, u64::MAX),
        PairCheck::OutOfRange
    );
    assert_eq!(
        check_pair(i64::MAX - 1, i64::MAX - 1, i64::MAX as u64, i64::MAX as u64),
        PairCheck::Valid
    );
    assert_eq!(check_pair(i64::MIN, i64::MAX, 0, 0), PairCheck::Skip);
    assert_eq!(check_pair(i64::MAX, i64::MIN, 0, 0), PairCheck::Skip);
}

#[test]
fn check_pair_zero_block_pools_accept_nothing() {
    for (s, d) in [(0i64, 0i64), (0, 1), (1, 0), (i64::MAX, i64::MAX)] {
        assert_eq!(check_pair(s, d, 0, 0), PairCheck::OutOfRange);
        assert_eq!(check_pair(s, 0, 0, 1), PairCheck::OutOfRange);
        assert_eq!(check_pair(0, d, 1, 0), PairCheck::OutOfRange);
    }
    assert_eq!(check_pair(0, 0, 1, 1), PairCheck::Valid);
    assert_eq!(check_pair(-1, 0, 0, 0), PairCheck::Skip);
}

#[test]
fn check_pair_random_against_expectation() {
    let mut rng = SmallRng::seed_from_u64(0xb10c);
    let id = |rng: &mut SmallRng| -> i64 {
        match rng.gen_range(0..4) {
            0 => rng.gen_range(-3..20),
            1 => rng.gen(),
            2 => rng.gen_range(0..1i64 << 34),
            _ => *[i64::MIN, i64::MAX, -1, 0].choose(rng).unwrap(),
        }
    };
    let count = |rng: &mut SmallRng| -> u64 {
        match rng.gen_range(0..3) {
            0 => rng.gen_range(0..20),
            1 => rng.gen(),
            _ => rng.gen_range(0..1u64 << 34),
        }
    };
    for _ in 0..100_000 {
        let (s, d) = (id(&mut rng), id(&mut rng));
        let (sb, db) = (count(&mut rng), count(&mut rng));
        assert_eq!(
            check_pair(s, d, sb, db),
            expected_pair(s, d, sb, db),
            "check_pair({s}, {d}, {sb}, {db})"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// split_n
// ---------------------------------------------------------------------------------------------

/// Recomposes `(outer, out)` over `dims` (outermost first) in u128.
fn recompose<const N: usize>(outer: u64, dims: [u64; N], out: [u64; N]) -> u128 {
    let mut v = outer as u128;
    for (&d, &o) in dims.iter().zip(&out) {
        // Saturating: a wrong split must fail the comparison, not overflow.
        v = v.saturating_mul(d as u128).saturating_add(o as u128);
    }
    v
}

#[test]
fn split_n_examples() {
    let mut out = [0u64; 2];
    assert_eq!(split_n(7, [2, 3], &mut out), 1);
    assert_eq!(out, [0, 1]);
    assert_eq!(split_n(5, [2, 3], &mut out), 0);
    assert_eq!(out, [1, 2]);
    let mut out = [9u64; 3];
    assert_eq!(split_n(0, [4, 5, 6], &mut out), 0);
    assert_eq!(out, [0, 0, 0]);
    assert_eq!(split_n(4 * 5 * 6 - 1, [4, 5, 6], &mut out), 0);
    assert_eq!(out, [3, 4, 5]);
    assert_eq!(split_n(4 * 5 * 6, [4, 5, 6], &mut out), 1);
    assert_eq!(out, [0, 0, 0]);
    let mut out = [0u64; 1];
    assert_eq!(split_n(u64::MAX, [1], &mut out), u64::MAX);
    assert_eq!(out, [0]);
    assert_eq!(split_n(u64::MAX, [u64::MAX], &mut out), 1);
    assert_eq!(out, [0]);
    assert_eq!(split_n(u64::MAX - 1, [u64::MAX], &mut out), 0);
    assert_eq!(out, [u64::MAX - 1]);
    // Past 2^32 on the 64-bit path.
    let mut out = [0u64; 2];
    let big = 1u64 << 33;
    assert_eq!(split_n(3 * big * 5 + 2 * 5 + 4, [big, 5], &mut out), 3);
    assert_eq!(out, [2, 4]);
    let mut out = [0u64; 0];
    assert_eq!(split_n(12345, [], &mut out), 12345);
}

/// Product of the extents in u128, saturating (four u64 extents can exceed u128).
fn product(dims: &[u64]) -> u128 {
    dims.iter()
        .fold(1u128, |acc, &d| acc.saturating_mul(d as u128))
}

fn random_dim(rng: &mut SmallRng) -> u64 {
    match rng.gen_range(0..6) {
        0 => 1,
        1 => rng.gen_range(1..17),
        2 => rng.gen_range(1..1 << 20),
        3 => rng.gen_range((1 << 32) - 3..(1 << 32) + 3),
        4 => rng.gen_range(1..1u64 << 40),
        _ => rng.gen_range(1..=u64::MAX),
    }
}

fn random_item(rng: &mut SmallRng, dims: &[u64]) -> u64 {
    let total = product(dims);
    match rng.gen_range(0..4) {
        // Inside the nested extents (outer quotient 0) when they fit in u64.
        0 if total <= u64::MAX as u128 => rng.gen_range(0..total as u64),
        1 => rng.gen_range(0..1u64 << 32),
        2 => u64::MAX - rng.gen_range(0..4),
        _ => rng.gen(),
    }
}

fn split_n_inverse<const N: usize>(rng: &mut SmallRng, iters: usize) {
    for _ in 0..iters {
        let mut dims = [0u64; N];
        for d in &mut dims {
            *d = random_dim(rng);
        }
        let item = random_item(rng, &dims);
        let mut out = [u64::MAX; N];
        let outer = split_n(item, dims, &mut out);
        assert!(
            out.iter().zip(&dims).all(|(o, d)| o < d),
            "split_n({item}, {dims:?}) = {outer}, {out:?}"
        );
        let total = product(&dims);
        assert_eq!(
            outer as u128,
            item as u128 / total,
            "split_n({item}, {dims:?}) outer"
        );
        assert_eq!(
            recompose(outer, dims, out),
            item as u128,
            "split_n({item}, {dims:?}) = {outer}, {out:?}"
        );
    }
}

#[test]
fn split_n_is_the_inverse_of_the_nested_index() {
    let mut rng = SmallRng::seed_from_u64(0x5917);
    split_n_inverse::<1>(&mut rng, 50_000);
    split_n_inverse::<2>(&mut rng, 50_000);
    split_n_inverse::<3>(&mut rng, 50_000);
    split_n_inverse::<4>(&mut rng, 50_000);
}

#[test]
fn split_n_enumerates_small_extents_in_order() {
    // Consecutive items walk the innermost index fastest, like the kernels' nested loops.
    let dims = [2u64, 3, 1, 4];
    let mut item = 0u64;
    for a in 0..2 {
        for b in 0..3 {
            for d in 0..4 {
                let mut out = [0u64; 4];
                assert_eq!(split_n(item, dims, &mut out), 0);
                assert_eq!(out, [a, b, 0, d], "item {item}");
                item += 1;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// reference::copy_blocks
// ---------------------------------------------------------------------------------------------

/// Hand example: 2 layers × 2 parts × 2 blocks × 2 tokens × 1 head × 2 elements of 1 byte.
/// Cross-layer NHD `(NB, L, 2, bs, H, D)`: block 16 bytes, layer 8, part 4.
fn tiny_cross_layer() -> PoolImage {
    let mut layout = PagedLayout::nhd(2, 2, 1, 2, 1);
    layout.block_stride = 16;
    PoolImage {
        layers: 2,
        parts: 2,
        layout,
        layer_stride: 8,
        part_stride: 4,
    }
}

/// Layer-first, parts outer `(2, L, NB, bs, H, D)`: part 16 bytes, layer 8, block 4.
fn tiny_layer_first() -> PoolImage {
    PoolImage {
        layers: 2,
        parts: 2,
        layout: PagedLayout::nhd(2, 2, 1, 2, 1),
        layer_stride: 8,
        part_stride: 16,
    }
}

/// The reference copy of `pairs` from a [`tiny_cross_layer`] image to a [`tiny_layer_first`]
/// one.
fn tiny_copy(src: &[u8], dst: &mut [u8], pairs: &[[i64; 2]]) -> ErrorCounts {
    copy_blocks(&tiny_cross_layer(), src, &tiny_layer_first(), dst, pairs)
}

fn iota(n: usize) -> Vec<u8> {
    (0..n).map(|i| i as u8).collect()
}

#[test]
fn copy_blocks_hand_example() {
    let src = iota(32);
    let mut dst = vec![0xee; 32];
    let counts = tiny_copy(&src, &mut dst, &[[0, 1], [1, 0]]);
    assert_eq!(counts, ErrorCounts::default());
    #[rustfmt::skip]
    let want: [u8; 32] = [
        // K, layer 0: block 0 (= src block 1), block 1 (= src block 0)
        16, 17, 18, 19, 0, 1, 2, 3,
        // K, layer 1
        24, 25, 26, 27, 8, 9, 10, 11,
        // V, layer 0
        20, 21, 22, 23, 4, 5, 6, 7,
        // V, layer 1
        28, 29, 30, 31, 12, 13, 14, 15,
    ];
    assert_eq!(dst, want);

    // And back: the swapped blocks come home swapped again.
    let mut back = vec![0xee; 32];
    let counts = copy_blocks(
        &tiny_layer_first(),
        &dst,
        &tiny_cross_layer(),
        &mut back,
        &[[0, 1], [1, 0]],
    );
    assert_eq!(counts, ErrorCounts::default());
    assert_eq!(back, src);
}

#[test]
fn copy_blocks_only_touches_mapped_blocks() {
    let src = iota(32);
    let mut dst = vec![0xee; 32];
    tiny_copy(&src, &mut dst, &[[1, 1]]);
    #[rustfmt::skip]
    let want: [u8; 32] = [
        0xee, 0xee, 0xee, 0xee, 16, 17, 18, 19,
        0xee, 0xee, 0xee, 0xee, 24, 25, 26, 27,
        0xee, 0xee, 0xee, 0xee, 20, 21, 22, 23,
        0xee, 0xee, 0xee, 0xee, 28, 29, 30, 31,
    ];
    assert_eq!(dst, want);
}

#[test]
fn copy_blocks_padding_pairs_skipped() {
    let src = iota(32);
    let mut dst = vec![0xee; 32];
    let pairs = [
        [-1, 0],
        [0, -1],
        [-1, -1],
        [i64::MIN, 1],
        [1, i64::MIN],
        [-1, 99],
        [99, -1],
    ];
    let counts = tiny_copy(&src, &mut dst, &pairs);
    assert_eq!(counts, ErrorCounts::default());
    assert_eq!(dst, vec![0xee; 32]);
}

#[test]
fn copy_blocks_out_of_range_pairs_counted_and_skipped() {
    let src = iota(32);
    let mut dst = vec![0xee; 32];
    let pairs = [[2, 0], [0, 2], [i64::MAX, 0], [0, i64::MAX], [2, 2]];
    let counts = tiny_copy(&src, &mut dst, &pairs);
    assert_eq!(
        counts,
        ErrorCounts {
            bad_blocks: 5,
            ..ErrorCounts::default()
        }
    );
    assert_eq!(dst, vec![0xee; 32]);

    // Mixed with padding and a good pair: only the good pair lands.
    let mut dst = vec![0xee; 32];
    let pairs = [[-1, 0], [5, 0], [1, 1], [0, 3]];
    let counts = tiny_copy(&src, &mut dst, &pairs);
    assert_eq!(counts.bad_blocks, 2);
    assert_eq!(counts.bad_slots + counts.bad_slices + counts.bad_counts, 0);
    let mut want = vec![0xee; 32];
    tiny_copy(&src, &mut want, &[[1, 1]]);
    assert_eq!(dst, want);
}

#[test]
fn copy_blocks_limits_are_per_pool() {
    // src has 2 blocks, dst 3: block 2 is a valid destination only.
    let src = iota(32);
    let mut big = tiny_layer_first();
    big.layout.num_blocks = 3;
    big.layer_stride = 12;
    big.part_stride = 24;
    let mut dst = vec![0xee; 48];
    let counts = copy_blocks(&tiny_cross_layer(), &src, &big, &mut dst, &[[0, 2], [2, 0]]);
    assert_eq!(counts.bad_blocks, 1);
    // dst block 2 of (part p, layer l) at p*24 + l*12 + 8 holds src block 0's (l, p) bytes.
    for l in 0..2 {
        for p in 0..2 {
            let at = p * 24 + l * 12;
            assert_eq!(&dst[at..at + 8], &[0xee; 8], "l {l} p {p}");
            let want: Vec<u8> = (0..4).map(|j| (l * 8 + p * 4 + j) as u8).collect();
            assert_eq!(&dst[at + 8..at + 12], &want[..], "l {l} p {p}");
        }
    }
}

/// Host images of the cross-layer NHD and HND pools of one shape, and their size in bytes.
fn pools(
    nb: usize,
    l: usize,
    bs: usize,
    h: usize,
    d: usize,
    e: usize,
) -> (PoolImage, PoolImage, usize) {
    let s = Shape {
        blocks: nb,
        layers: l,
        bs,
        heads: h,
        dim: d,
        elem: e,
    };
    (s.image(Kind::CrossNhd), s.image(Kind::CrossHnd), s.bytes())
}

#[test]
fn copy_blocks_nhd_hnd_nhd_round_trip() {
    let mut rng = SmallRng::seed_from_u64(0xc0b1);
    for e in [1usize, 2, 4] {
        for _ in 0..40 {
            let (nb, l, bs, h, d) = (
                rng.gen_range(1..5),
                rng.gen_range(1..4),
                rng.gen_range(1..6),
                rng.gen_range(1..5),
                rng.gen_range(1..7),
            );
            let (nhd, hnd, bytes) = pools(nb, l, bs, h, d, e);
            let mut orig = vec![0u8; bytes];
            rng.fill(&mut orig[..]);
            let ident: Vec<[i64; 2]> = (0..nb as i64).map(|b| [b, b]).collect();

            let mut mid = vec![0xa5u8; bytes];
            let c = copy_blocks(&nhd, &orig, &hnd, &mut mid, &ident);
            assert_eq!(c, ErrorCounts::default());
            // The intermediate image is HND (NB, H, L, 2, bs, D), checked element by element
            // against NHD (NB, L, 2, bs, H, D) with the offsets written out here.
            for b in 0..nb {
                for li in 0..l {
                    for p in 0..2 {
                        for t in 0..bs {
                            for hi in 0..h {
                                for x in 0..d {
                                    let n = ((((b * l + li) * 2 + p) * bs + t) * h + hi) * d + x;
                                    let m = ((((b * h + hi) * l + li) * 2 + p) * bs + t) * d + x;
                                    assert_eq!(
                                        mid[m * e..(m + 1) * e],
                                        orig[n * e..(n + 1) * e],
                                        "e {e} shape {:?} at {:?}",
                                        (nb, l, bs, h, d),
                                        (b, li, p, t, hi, x)
                                    );
                                }
                            }
                        }
                    }
                }
            }

            let mut back = vec![0x5au8; bytes];
            let c = copy_blocks(&hnd, &mid, &nhd, &mut back, &ident);
            assert_eq!(c, ErrorCounts::default());
            assert_eq!(back, orig, "e {e} shape {:?}", (nb, l, bs, h, d));
        }
    }
}

#[test]
fn copy_blocks_round_trip_through_a_permutation() {
    // NHD --perm--> HND --inverse perm--> NHD is the identity too.
    let mut rng = SmallRng::seed_from_u64(0x9e4d);
    for e in [1usize, 2, 4] {
        let (nb, l, bs, h, d) = (6, 2, 3, 3, 5);
        let (nhd, hnd, bytes) = pools(nb, l, bs, h, d, e);
        let mut orig = vec![0u8; bytes];
        rng.fill(&mut orig[..]);
        let mut perm: Vec<i64> = (0..nb as i64).collect();
        perm.shuffle(&mut rng);
        let there: Vec<[i64; 2]> = (0..nb as i64).map(|b| [b, perm[b as usize]]).collect();
        let back_pairs: Vec<[i64; 2]> = there.iter().map(|&[s, d]| [d, s]).collect();
        let mut mid = vec![0u8; bytes];
        copy_blocks(&nhd, &orig, &hnd, &mut mid, &there);
        let mut back = vec![0u8; bytes];
        copy_blocks(&hnd, &mid, &nhd, &mut back, &back_pairs);
        assert_eq!(back, orig, "e {e} perm {perm:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// ops::transfer_blocks (the batched body of kvio_transfer_blocks) against ops::copy_blocks
// ---------------------------------------------------------------------------------------------

/// One side of a random block copy: byte strides `[layer, part, block, token, head]` from a
/// random nesting order with random padding (multiples of `width`), and the buffer size.
fn random_side(rng: &mut SmallRng, ext: [u64; 5], chunk: u64, width: u64) -> ([u64; 5], u64) {
    let mut order = [0usize, 1, 2, 3, 4];
    order.shuffle(rng);
    let mut strides = [0u64; 5];
    let mut span = chunk;
    // Innermost first: each dimension's stride is the span so far plus some padding.
    for &d in order.iter().rev() {
        let stride = span + width * rng.gen_range(0..3u64);
        strides[d] = stride;
        span = stride * ext[d];
    }
    (strides, span)
}

/// `ops::transfer_blocks` (items in batches per group, one instance per access width) copies
/// exactly what `ops::copy_blocks` copies and counts the same errors, for random strided and
/// table-addressed pools, every access width, group size, piece split and grid (padding and
/// out-of-range pairs included).
#[test]
fn transfer_blocks_matches_copy_blocks() {
    use kvio_kernels::args::CopyArgs;
    use kvio_kernels::index::err;
    use kvio_kernels::ops;

    let mut rng = SmallRng::seed_from_u64(0x7a5f_e12b);
    for case in 0..400 {
        let width = [1u64, 2, 4, 8, 16][rng.gen_range(0..5)];
        let (layers, parts) = (rng.gen_range(1..4u64), rng.gen_range(1..3u64));
        let (tokens, heads) = (rng.gen_range(1..4u64), rng.gen_range(1..4u64));
        let units = rng.gen_range(1..80u64);
        let chunk = units * width;
        let pieces = (1..=units)
            .filter(|p| units.is_multiple_of(*p))
            .collect::<Vec<_>>()
            .choose(&mut rng)
            .copied()
            .unwrap();
        let (src_blocks, dst_blocks) = (rng.gen_range(1..6u64), rng.gen_range(1..6u64));
        let table = rng.gen_bool(0.3);
        let (ss, s_len) = random_side(
            &mut rng,
            [layers, parts, src_blocks, tokens, heads],
            chunk,
            width,
        );
        let (ds, d_len) = random_side(
            &mut rng,
            [layers, parts, dst_blocks, tokens, heads],
            chunk,
            width,
        );
        // 16-byte aligned buffers (u128), filled with random bytes.
        let words = |n: u64| n.div_ceil(16) as usize;
        let src: Vec<u128> = (0..words(s_len)).map(|_| rng.gen()).collect();
        let dst0: Vec<u128> = (0..words(d_len)).map(|_| rng.gen()).collect();
        // Pairs: valid, padding and out-of-range ids; valid destinations distinct.
        let mut free: Vec<i64> = (0..dst_blocks as i64).collect();
        free.shuffle(&mut rng);
        let pairs: Vec<i64> = (0..rng.gen_range(1..8))
            .flat_map(|_| match rng.gen_range(0..8) {
                0 => [-1, rng.gen_range(-1..3)],
                1 => [src_blocks as i64 + rng.gen_range(0..2), 0],
                2 => [0, dst_blocks as i64],
                _ => [
                    rng.gen_range(0..src_blocks as i64),
                    free.pop().unwrap_or(-1),
                ],
            })
            .collect();
        let shift = rng.gen_range(0..6u32);
        let threads = [32u32, 64, 96][rng.gen_range(0..3)];
        let grid = rng.gen_range(1..4u32);
        let run = |transfer: bool| -> (Vec<u128>, [u32; err::WORDS]) {
            let mut dst = dst0.clone();
            let mut errors = [0u32; err::WORDS];
            let (sb, db) = (src.as_ptr() as *mut u8, dst.as_mut_ptr() as *mut u8);
            // Layer tables: entry layer * parts + part is that (layer, part)'s base.
            let bases = |base: *mut u8, s: &[u64; 5]| -> Vec<u64> {
                (0..layers * parts)
                    .map(|i| base as u64 + (i / parts) * s[0] + (i % parts) * s[1])
                    .collect()
            };
            let (st, dt) = (bases(sb, &ss), bases(db, &ds));
            let a = CopyArgs {
                src_base: sb,
                src_table: if table { st.as_ptr() } else { std::ptr::null() },
                src_layer_stride: ss[0],
                src_part_stride: ss[1],
                src_block_stride: ss[2],
                src_token_stride: ss[3],
                src_head_stride: ss[4],
                dst_base: db,
                dst_table: if table { dt.as_ptr() } else { std::ptr::null() },
                dst_layer_stride: ds[0],
                dst_part_stride: ds[1],
                dst_block_stride: ds[2],
                dst_token_stride: ds[3],
                dst_head_stride: ds[4],
                layers,
                parts,
                tokens,
                heads,
                chunk,
                piece: chunk / pieces,
                pieces,
                src_piece_stride: chunk / pieces,
                dst_piece_stride: chunk / pieces,
                pairs: pairs.as_ptr(),
                num_pairs: pairs.len() as u64 / 2,
                src_blocks,
                dst_blocks,
                table_parts: parts,
                elem: 1,
                tile: 0,
                subs: 1,
                width: width as u32,
                shift,
                errors: errors.as_mut_ptr(),
            };
            ops::emulate(grid, threads, shift, |g| {
                // SAFETY: every chunk of a valid pair lies inside both buffers (the strides
                // were derived from the extents), all 16-byte aligned and multiples of
                // `width`; the tables hold layers * parts entries.
                unsafe {
                    if transfer {
                        ops::transfer_blocks(&a, g)
                    } else {
                        ops::copy_blocks(&a, g)
                    }
                }
            });
            (dst, errors)
        };
        let (want, want_err) = run(false);
        let (got, got_err) = run(true);
        assert!(
            want != dst0
                || pairs.chunks(2).all(|p| p[0] < 0
                    || p[1] < 0
                    || p[0] >= src_blocks as i64
                    || p[1] >= dst_blocks as i64),
            "case {case}: nothing copied"
        );
        assert_eq!(got_err, want_err, "case {case}: error counts");
        assert!(got == want, "case {case}: bytes differ (width {width}, shift {shift}, threads {threads}, grid {grid}, pieces {pieces}, table {table})");
    }
}
