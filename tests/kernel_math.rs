//! CPU unit tests of the kernels' index math (`kvio_kernels::index`) and of the span-copy core
//! (`kvio_kernels::span`), each compared against straightforward independent formulations.

use kvio_kernels::index::{
    access_width, check_slice, checked_count, div_u64, group_shift, slot_target, split3,
    split_n_divide, Digits, SliceCheck, SlotTarget,
};
use kvio_kernels::span::copy_span;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

// ---------------------------------------------------------------------------------------------
// slot_target
// ---------------------------------------------------------------------------------------------

/// Independent expectation for `slot_target`, in u128 with plain `/` and `%`.
fn expected_slot_target(slot: i64, block_size: u64, num_blocks: u64) -> SlotTarget {
    if slot < 0 {
        return SlotTarget::Skip;
    }
    let s = slot as u128;
    let bs = block_size as u128;
    if s >= bs * num_blocks as u128 {
        return SlotTarget::OutOfRange;
    }
    SlotTarget::At {
        block: (s / bs) as u64,
        offset: (s % bs) as u64,
    }
}

#[test]
fn slot_target_negative_slots_are_skipped() {
    for slot in [-1i64, -2, -17, -(1 << 40), i64::MIN, i64::MIN + 1] {
        for (bs, nb) in [(1u64, 1u64), (16, 100), (u64::MAX, u64::MAX), (1 << 33, 3)] {
            assert_eq!(slot_target(slot, bs, nb), SlotTarget::Skip, "slot {slot}");
        }
    }
}

#[test]
fn slot_target_slots_at_or_past_the_end_are_out_of_range() {
    // 10 blocks of 16: slots 0..160 are valid.
    assert_eq!(slot_target(160, 16, 10), SlotTarget::OutOfRange);
    assert_eq!(slot_target(161, 16, 10), SlotTarget::OutOfRange);
    assert_eq!(slot_target(1 << 40, 16, 10), SlotTarget::OutOfRange);
    assert_eq!(slot_target(i64::MAX, 16, 10), SlotTarget::OutOfRange);
    assert_eq!(
        slot_target(159, 16, 10),
        SlotTarget::At {
            block: 9,
            offset: 15
        }
    );
    // no blocks at all: every non-negative slot is out of range
    assert_eq!(slot_target(0, 16, 0), SlotTarget::OutOfRange);
    // block_size 1: slot == block
    assert_eq!(slot_target(7, 1, 7), SlotTarget::OutOfRange);
    assert_eq!(
        slot_target(6, 1, 7),
        SlotTarget::At {
            block: 6,
            offset: 0
        }
    );
}

#[test]
fn slot_target_valid_slots_decode_to_block_and_offset() {
    assert_eq!(
        slot_target(0, 16, 10),
        SlotTarget::At {
            block: 0,
            offset: 0
        }
    );
    assert_eq!(
        slot_target(37, 16, 10),
        SlotTarget::At {
            block: 2,
            offset: 5
        }
    );
    assert_eq!(
        slot_target(48, 16, 10),
        SlotTarget::At {
            block: 3,
            offset: 0
        }
    );
    // block_size 1 with huge num_blocks
    assert_eq!(
        slot_target(i64::MAX, 1, u64::MAX),
        SlotTarget::At {
            block: i64::MAX as u64,
            offset: 0
        }
    );
    // i64::MAX with a block size that does not divide it
    assert_eq!(
        slot_target(i64::MAX, 1000, u64::MAX),
        SlotTarget::At {
            block: i64::MAX as u64 / 1000,
            offset: i64::MAX as u64 % 1000
        }
    );
    // i64::MAX fits exactly in num_blocks blocks
    let bs = 7u64;
    let nb = i64::MAX as u64 / bs + 1;
    assert_eq!(
        slot_target(i64::MAX, bs, nb),
        SlotTarget::At {
            block: nb - 1,
            offset: i64::MAX as u64 % bs
        }
    );
    assert_eq!(slot_target(i64::MAX, bs, nb - 1), SlotTarget::OutOfRange);
}

#[test]
fn slot_target_above_2_pow_32_uses_full_64_bit_division() {
    // slot > 2^32, block size small: the 32-bit fast path must not be taken.
    let slot = (1i64 << 32) + 5;
    assert_eq!(
        slot_target(slot, 16, 1 << 30),
        SlotTarget::At {
            block: (1u64 << 28),
            offset: 5
        }
    );
    // block size > 2^32 with a small slot: block 0
    assert_eq!(
        slot_target(123, (1 << 32) + 1, 2),
        SlotTarget::At {
            block: 0,
            offset: 123
        }
    );
    // both above 2^32
    let bs = (1u64 << 32) + 3;
    let slot = (bs * 5 + 77) as i64;
    assert_eq!(
        slot_target(slot, bs, 6),
        SlotTarget::At {
            block: 5,
            offset: 77
        }
    );
    assert_eq!(slot_target(slot, bs, 5), SlotTarget::OutOfRange);
    // a slot whose low 32 bits are small (truncation would give the wrong block)
    let slot = (3i64 << 32) | 9;
    assert_eq!(
        slot_target(slot, 1 << 20, 1 << 20),
        SlotTarget::At {
            block: (3u64 << 12),
            offset: 9
        }
    );
}

fn random_i64(rng: &mut SmallRng) -> i64 {
    match rng.gen_range(0..6) {
        0 => rng.gen::<i64>(),
        1 => rng.gen_range(-100..100_000),
        2 => rng.gen_range(0..(1i64 << 33)),
        3 => [i64::MAX, i64::MIN, 0, -1, 1, u32::MAX as i64, 1 << 32][rng.gen_range(0..7)],
        4 => rng.gen_range((1i64 << 32) - 1000..(1i64 << 32) + 1000),
        _ => rng.gen::<u32>() as i64,
    }
}

fn random_block_size(rng: &mut SmallRng) -> u64 {
    match rng.gen_range(0..6) {
        0 => 1,
        1 => rng.gen_range(1..=256),
        2 => rng.gen_range(1..=u32::MAX as u64),
        3 => rng.gen_range((1u64 << 32)..(1u64 << 40)),
        4 => rng.gen_range(1..=u64::MAX),
        _ => [16u64, 32, 64, u32::MAX as u64, 1 << 32, u64::MAX][rng.gen_range(0..6)],
    }
}

fn random_num_blocks(rng: &mut SmallRng) -> u64 {
    match rng.gen_range(0..5) {
        0 => rng.gen_range(0..=1000),
        1 => rng.gen_range(0..=u32::MAX as u64),
        2 => rng.gen(),
        3 => u64::MAX,
        _ => rng.gen_range(0..(1u64 << 36)),
    }
}

#[test]
fn slot_target_matches_plain_division_over_random_sweep() {
    let mut rng = SmallRng::seed_from_u64(0x5107_7a59);
    for i in 0..400_000 {
        let slot = random_i64(&mut rng);
        let bs = random_block_size(&mut rng);
        let nb = random_num_blocks(&mut rng);
        // make a good share of the cases land inside the cache
        let nb = if i % 3 == 0 && slot >= 0 {
            (slot as u64 / bs).saturating_add(rng.gen_range(0..3))
        } else {
            nb
        };
        assert_eq!(
            slot_target(slot, bs, nb),
            expected_slot_target(slot, bs, nb),
            "slot_target({slot}, {bs}, {nb})"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// check_slice
// ---------------------------------------------------------------------------------------------

/// Independent predicate for `check_slice`, in i128 (no overflow possible).
fn expected_check_slice(
    cache_start: i32,
    src_start: i32,
    len: i32,
    page_size: u32,
    num_slots: u64,
    num_tokens: u64,
) -> SliceCheck {
    if len == 0 {
        return SliceCheck::Padding;
    }
    let (c, s, l, p) = (
        cache_start as i128,
        src_start as i128,
        len as i128,
        page_size as i128,
    );
    let ok = l > 0
        && c >= 0
        && s >= 0
        && p > 0
        && l <= p
        && c + l <= num_slots as i128
        && s + l <= num_tokens as i128
        && c / p == (c + l - 1) / p;
    if ok {
        SliceCheck::Valid
    } else {
        SliceCheck::Invalid
    }
}

#[test]
fn check_slice_zero_length_is_padding_whatever_the_other_fields() {
    assert_eq!(check_slice(0, 0, 0, 16, 100, 100), SliceCheck::Padding);
    assert_eq!(check_slice(-5, -7, 0, 16, 0, 0), SliceCheck::Padding);
    assert_eq!(
        check_slice(i32::MAX, i32::MIN, 0, 16, 10, 10),
        SliceCheck::Padding
    );
    assert_eq!(check_slice(3, 3, 0, 0, 10, 10), SliceCheck::Padding);
}

#[test]
fn check_slice_rejects_negative_fields() {
    assert_eq!(check_slice(0, 0, -1, 16, 100, 100), SliceCheck::Invalid);
    assert_eq!(
        check_slice(0, 0, i32::MIN, 16, 100, 100),
        SliceCheck::Invalid
    );
    assert_eq!(check_slice(-1, 0, 1, 16, 100, 100), SliceCheck::Invalid);
    assert_eq!(
        check_slice(i32::MIN, 0, 1, 16, 100, 100),
        SliceCheck::Invalid
    );
    assert_eq!(check_slice(0, -1, 1, 16, 100, 100), SliceCheck::Invalid);
    assert_eq!(
        check_slice(0, i32::MIN, 1, 16, 100, 100),
        SliceCheck::Invalid
    );
    // negative length that would be huge as u32 but a page size of u32::MAX
    assert_eq!(
        check_slice(0, 0, -1, u32::MAX, u64::MAX, u64::MAX),
        SliceCheck::Invalid
    );
}

#[test]
fn check_slice_rejects_length_over_a_page_and_page_crossing() {
    assert_eq!(check_slice(0, 0, 16, 16, 100, 100), SliceCheck::Valid);
    assert_eq!(check_slice(0, 0, 17, 16, 100, 100), SliceCheck::Invalid);
    // crossing from page 0 into page 1
    assert_eq!(check_slice(15, 0, 2, 16, 100, 100), SliceCheck::Invalid);
    assert_eq!(check_slice(8, 0, 9, 16, 100, 100), SliceCheck::Invalid);
    // ending exactly at the page end is fine
    assert_eq!(check_slice(8, 0, 8, 16, 100, 100), SliceCheck::Valid);
    assert_eq!(check_slice(15, 0, 1, 16, 100, 100), SliceCheck::Valid);
    assert_eq!(check_slice(16, 0, 16, 16, 100, 100), SliceCheck::Valid);
    // page size 1: only single rows
    assert_eq!(check_slice(5, 0, 1, 1, 100, 100), SliceCheck::Valid);
    assert_eq!(check_slice(5, 0, 2, 1, 100, 100), SliceCheck::Invalid);
    // non power of two page
    assert_eq!(check_slice(3, 0, 3, 3, 100, 100), SliceCheck::Valid);
    assert_eq!(check_slice(4, 0, 3, 3, 100, 100), SliceCheck::Invalid);
}

#[test]
fn check_slice_rejects_ends_past_the_cache_or_the_source() {
    assert_eq!(check_slice(90, 0, 10, 16, 100, 100), SliceCheck::Invalid); // crosses 96
    assert_eq!(check_slice(96, 0, 4, 16, 100, 100), SliceCheck::Valid); // ends at 100
    assert_eq!(check_slice(96, 0, 5, 16, 100, 100), SliceCheck::Invalid); // ends at 101
    assert_eq!(check_slice(100, 0, 1, 16, 100, 100), SliceCheck::Invalid);
    assert_eq!(check_slice(0, 95, 5, 16, 100, 100), SliceCheck::Valid);
    assert_eq!(check_slice(0, 96, 5, 16, 100, 100), SliceCheck::Invalid);
    assert_eq!(check_slice(0, 100, 1, 16, 100, 100), SliceCheck::Invalid);
    assert_eq!(check_slice(0, 0, 1, 16, 0, 100), SliceCheck::Invalid);
    assert_eq!(check_slice(0, 0, 1, 16, 100, 0), SliceCheck::Invalid);
}

#[test]
fn check_slice_handles_i32_max_without_overflow() {
    let big = u64::MAX;
    assert_eq!(
        check_slice(i32::MAX, i32::MAX, 1, 16, big, big),
        SliceCheck::Valid
    );
    assert_eq!(
        check_slice(i32::MAX, i32::MAX, i32::MAX, 1 << 31, big, big),
        SliceCheck::Invalid // rows 2^31 - 1 ..= 2^32 - 3 cross the page start 2^31
    );
    assert_eq!(
        check_slice(i32::MAX, i32::MAX, i32::MAX, u32::MAX, big, big),
        SliceCheck::Valid // all inside page 0 of 2^32 - 1 rows
    );
    assert_eq!(
        check_slice(0, i32::MAX, i32::MAX, u32::MAX, big, big),
        SliceCheck::Valid
    );
    // end = 2^31 exactly
    let end = 1u64 << 31;
    assert_eq!(check_slice(i32::MAX, 0, 1, 1, end, 1), SliceCheck::Valid);
    assert_eq!(
        check_slice(i32::MAX, 0, 1, 1, end - 1, 1),
        SliceCheck::Invalid
    );
    assert_eq!(
        check_slice(0, i32::MAX, 1, 1, 1, end - 1),
        SliceCheck::Invalid
    );
    assert_eq!(check_slice(0, i32::MAX, 1, 1, 1, end), SliceCheck::Valid);
    // i32::MAX length on a page of i32::MAX starting at page 1
    assert_eq!(
        check_slice(i32::MAX, 0, i32::MAX, i32::MAX as u32, big, big),
        SliceCheck::Valid
    );
}

#[test]
fn check_slice_page_size_zero_is_invalid() {
    assert_eq!(check_slice(0, 0, 1, 0, 100, 100), SliceCheck::Invalid);
    assert_eq!(check_slice(5, 5, 3, 0, 100, 100), SliceCheck::Invalid);
}

fn random_i32(rng: &mut SmallRng) -> i32 {
    match rng.gen_range(0..6) {
        0 => rng.gen(),
        1 => rng.gen_range(-4..200),
        2 => [0, -1, 1, i32::MAX, i32::MIN, i32::MAX - 1][rng.gen_range(0..6)],
        3 => rng.gen_range(0..i32::MAX),
        4 => rng.gen_range(i32::MAX - 300..=i32::MAX),
        _ => rng.gen_range(0..40),
    }
}

fn random_page(rng: &mut SmallRng) -> u32 {
    match rng.gen_range(0..5) {
        0 => 0,
        1 => rng.gen_range(1..=64),
        2 => rng.gen(),
        3 => [1, 16, u32::MAX, i32::MAX as u32, 1 << 31][rng.gen_range(0..5)],
        _ => rng.gen_range(1..=8),
    }
}

fn random_extent(rng: &mut SmallRng) -> u64 {
    match rng.gen_range(0..5) {
        0 => rng.gen_range(0..300),
        1 => rng.gen(),
        2 => [0, u64::MAX, 1 << 31, (1 << 31) - 1, 1 << 32][rng.gen_range(0..5)],
        3 => rng.gen_range(0..(1u64 << 33)),
        _ => rng.gen_range(0..50),
    }
}

#[test]
fn check_slice_matches_independent_predicate_over_random_sweep() {
    let mut rng = SmallRng::seed_from_u64(0xc4ec_5117);
    let (mut valid, mut invalid, mut padding) = (0u32, 0u32, 0u32);
    for _ in 0..500_000 {
        let (c, s, l) = (
            random_i32(&mut rng),
            random_i32(&mut rng),
            random_i32(&mut rng),
        );
        let p = random_page(&mut rng);
        let (ns, nt) = (random_extent(&mut rng), random_extent(&mut rng));
        let want = expected_check_slice(c, s, l, p, ns, nt);
        assert_eq!(
            check_slice(c, s, l, p, ns, nt),
            want,
            "check_slice({c}, {s}, {l}, {p}, {ns}, {nt})"
        );
        match want {
            SliceCheck::Valid => valid += 1,
            SliceCheck::Invalid => invalid += 1,
            SliceCheck::Padding => padding += 1,
        }
    }
    // the sweep must actually exercise every verdict
    assert!(
        valid > 1000 && invalid > 1000 && padding > 1000,
        "{valid} {invalid} {padding}"
    );
}

// ---------------------------------------------------------------------------------------------
// checked_count, split3, div_u64, access_width, group_shift
// ---------------------------------------------------------------------------------------------

#[test]
fn checked_count_accepts_exactly_zero_to_capacity() {
    assert_eq!(checked_count(0, 0), Some(0));
    assert_eq!(checked_count(1, 0), None);
    assert_eq!(checked_count(-1, 0), None);
    assert_eq!(checked_count(-1, u32::MAX), None);
    assert_eq!(checked_count(i32::MIN, u32::MAX), None);
    assert_eq!(checked_count(5, 5), Some(5));
    assert_eq!(checked_count(6, 5), None);
    assert_eq!(checked_count(4, 5), Some(4));
    assert_eq!(checked_count(i32::MAX, u32::MAX), Some(i32::MAX as u32));
    assert_eq!(
        checked_count(i32::MAX, i32::MAX as u32),
        Some(i32::MAX as u32)
    );
    assert_eq!(checked_count(i32::MAX, i32::MAX as u32 - 1), None);
    let mut rng = SmallRng::seed_from_u64(7);
    for _ in 0..100_000 {
        let raw = random_i32(&mut rng);
        let cap = match rng.gen_range(0..3) {
            0 => rng.gen::<u32>(),
            1 => rng.gen_range(0..300),
            _ => raw
                .unsigned_abs()
                .wrapping_add(rng.gen_range(0..3))
                .wrapping_sub(1),
        };
        let want = if (0..=cap as i64).contains(&(raw as i64)) {
            Some(raw as u32)
        } else {
            None
        };
        assert_eq!(checked_count(raw, cap), want, "checked_count({raw}, {cap})");
    }
}

/// `Digits::add` (the transfer entry's stepping) agrees with splitting the sum afresh, for
/// random extents (ones, powers of two, up to 2^32 - 1), items and strides, chained as the
/// entry chains it; the digits reassemble to the item.
#[test]
fn digit_steps_match_fresh_splits() {
    let mut rng = SmallRng::seed_from_u64(0xd161);
    for case in 0..20_000 {
        let dims: [u32; 5] = core::array::from_fn(|_| match rng.gen_range(0..4) {
            0 => 1,
            1 => 1 << rng.gen_range(0..6),
            2 => rng.gen_range(1..64),
            _ => rng.gen_range(1..=u32::MAX),
        });
        let per = dims.iter().fold(1u128, |p, &d| p.saturating_mul(d as u128));
        let wide = dims.map(|d| d as u64);
        // Items and strides up to a few hundred pairs' worth (or any u64 where that is more).
        let span = per.saturating_mul(300).min(u64::MAX as u128 / 8) as u64;
        let mut item = rng.gen_range(0..=span);
        let step = rng.gen_range(1..=span);
        let stride = Digits::split(step, dims);
        let mut at = Digits::split(item, dims);
        for _ in 0..4 {
            let mut want = [0u64; 5];
            let top = split_n_divide(item, wide, &mut want);
            assert_eq!(at.top, top, "case {case}: {item} over {dims:?}");
            assert_eq!(
                at.digits.map(|d| d as u64),
                want,
                "case {case}: {item} over {dims:?}"
            );
            let back = at
                .digits
                .iter()
                .zip(dims)
                .fold(at.top as u128, |acc, (&d, e)| acc * e as u128 + d as u128);
            assert_eq!(back, item as u128);
            let Some(next) = item.checked_add(step) else {
                break;
            };
            (item, at) = (next, at.add(&stride, dims));
        }
    }
}

#[test]
fn split3_inverts_the_flat_index() {
    assert_eq!(split3(0, 1, 1), (0, 0, 0));
    assert_eq!(split3(7, 1, 1), (7, 0, 0));
    // (o * 3 + m) * 4 + i with o = 2, m = 1, i = 3: 31
    assert_eq!(split3(31, 3, 4), (2, 1, 3));
    assert_eq!(split3(11, 3, 4), (0, 2, 3));
    assert_eq!(split3(12, 3, 4), (1, 0, 0));
    let mut rng = SmallRng::seed_from_u64(0x5b117);
    for k in 0..300_000 {
        let (n_mid, n_inner) = match k % 4 {
            0 => (rng.gen_range(1..=64u64), rng.gen_range(1..=64u64)),
            1 => (
                rng.gen_range(1..=u32::MAX as u64),
                rng.gen_range(1..=u32::MAX as u64),
            ),
            2 => (
                rng.gen_range(1..(1u64 << 20)),
                rng.gen_range((1u64 << 32)..(1u64 << 36)),
            ),
            _ => (
                rng.gen_range((1u64 << 32)..(1u64 << 34)),
                rng.gen_range(1..=1024u64),
            ),
        };
        let mid = rng.gen_range(0..n_mid);
        let inner = rng.gen_range(0..n_inner);
        let cap = u64::MAX / (n_mid * n_inner).max(1);
        let outer_max = cap.saturating_sub(1).min(match k % 3 {
            0 => 16,
            1 => u32::MAX as u64,
            _ => u64::MAX,
        });
        let outer = rng.gen_range(0..=outer_max);
        let item = (outer as u128 * n_mid as u128 + mid as u128) * n_inner as u128 + inner as u128;
        if item > u64::MAX as u128 {
            continue;
        }
        assert_eq!(
            split3(item as u64, n_mid, n_inner),
            (outer, mid, inner),
            "split3({item}, {n_mid}, {n_inner})"
        );
    }
}

#[test]
fn split3_of_arbitrary_items_reassembles() {
    let mut rng = SmallRng::seed_from_u64(0xa55e);
    for _ in 0..200_000 {
        let item: u64 = if rng.gen() {
            rng.gen()
        } else {
            rng.gen_range(0..(1u64 << 34))
        };
        let n_mid = random_block_size(&mut rng);
        let n_inner = random_block_size(&mut rng);
        let (o, m, i) = split3(item, n_mid, n_inner);
        assert!(
            m < n_mid && i < n_inner,
            "split3({item}, {n_mid}, {n_inner})"
        );
        let back = (o as u128 * n_mid as u128 + m as u128) * n_inner as u128 + i as u128;
        assert_eq!(back, item as u128, "split3({item}, {n_mid}, {n_inner})");
    }
}

#[test]
fn div_u64_matches_plain_division() {
    let cases = [
        (0u64, 1u64),
        (u64::MAX, 1),
        (u64::MAX, u64::MAX),
        (u32::MAX as u64, 1),
        (1 << 32, 1),
        (1 << 32, 2),
        ((1 << 32) + 1, 1 << 32),
        (5, 1 << 32),
        (u32::MAX as u64, u32::MAX as u64),
        (u32::MAX as u64 + 1, u32::MAX as u64),
        (100, 7),
    ];
    for (n, d) in cases {
        assert_eq!(div_u64(n, d), n / d, "div_u64({n}, {d})");
    }
    let mut rng = SmallRng::seed_from_u64(0xd1f);
    for _ in 0..500_000 {
        let n: u64 = match rng.gen_range(0..4) {
            0 => rng.gen(),
            1 => rng.gen::<u32>() as u64,
            2 => rng.gen_range(0..(1u64 << 34)),
            _ => rng.gen_range(0..1000),
        };
        let d = random_block_size(&mut rng);
        assert_eq!(div_u64(n, d), n / d, "div_u64({n}, {d})");
    }
}

#[test]
fn access_width_is_the_largest_power_of_two_up_to_16_dividing_all() {
    assert_eq!(access_width(&[0x1000, 2048]), 16);
    assert_eq!(access_width(&[2]), 2);
    assert_eq!(access_width(&[3]), 1);
    assert_eq!(access_width(&[]), 16);
    assert_eq!(access_width(&[8, 24]), 8);
    assert_eq!(access_width(&[0]), 16);
    assert_eq!(access_width(&[32, 64, 4]), 4);
    assert_eq!(access_width(&[u64::MAX]), 1);
    assert_eq!(access_width(&[1 << 63]), 16);
    assert_eq!(access_width(&[16, 16, 16, 6]), 2);
    let mut rng = SmallRng::seed_from_u64(0xacce55);
    for _ in 0..100_000 {
        let n = rng.gen_range(0..6);
        let vals: Vec<u64> = (0..n)
            .map(|_| {
                let shift = rng.gen_range(0..8);
                (rng.gen::<u64>() >> rng.gen_range(0..60)) << shift
            })
            .collect();
        let want = [16u32, 8, 4, 2, 1]
            .into_iter()
            .find(|w| vals.iter().all(|v| v % *w as u64 == 0))
            .unwrap();
        assert_eq!(access_width(&vals), want, "access_width({vals:?})");
    }
}

#[test]
fn group_shift_picks_the_fewest_lanes_covering_the_units() {
    assert_eq!(group_shift(128, 4), 5);
    assert_eq!(group_shift(16, 4), 2);
    assert_eq!(group_shift(1, 4), 0);
    assert_eq!(group_shift(0, 4), 0);
    assert_eq!(group_shift(4, 4), 0);
    assert_eq!(group_shift(5, 4), 1);
    assert_eq!(group_shift(17, 4), 3);
    assert_eq!(group_shift(129, 4), 5); // capped at 32 lanes
    assert_eq!(group_shift(u64::MAX, 4), 5);
    assert_eq!(group_shift(1 << 40, 1), 5);
    assert_eq!(group_shift(32, 1), 5);
    assert_eq!(group_shift(31, 1), 5);
    assert_eq!(group_shift(16, 1), 4);
    for units in 0..2000u64 {
        for per_lane in 1..=8u64 {
            let want = (0..=5u32)
                .find(|s| (1u64 << s) * per_lane >= units)
                .unwrap_or(5);
            assert_eq!(
                group_shift(units, per_lane),
                want,
                "group_shift({units}, {per_lane})"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// span::copy_span
// ---------------------------------------------------------------------------------------------

const POISON: u8 = 0xA5;
const GUARD: usize = 48;

/// A 16-byte aligned byte buffer (backed by `u128`s).
struct Aligned {
    store: Vec<u128>,
    len: usize,
}

impl Aligned {
    fn new(len: usize, fill: u8) -> Self {
        let mut a = Aligned {
            store: vec![0u128; len.div_ceil(16) + 1],
            len,
        };
        a.bytes_mut().fill(fill);
        a
    }
    fn ptr(&mut self) -> *mut u8 {
        self.store.as_mut_ptr().cast()
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: the store holds at least `len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.store.as_ptr().cast(), self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.store.as_mut_ptr().cast(), self.len) }
    }
}

/// Offset of a span inside its buffer: a multiple of `width` that is (for widths < 16) not a
/// multiple of `2 * width`, so only `width`-byte alignment holds.
fn misaligned_offset(width: usize) -> usize {
    if width >= 16 {
        GUARD
    } else {
        GUARD + width
    }
}

/// Copies `len` bytes with every lane of a group of `lanes`, one lane after the other, from a
/// random source to a poisoned destination with guard bytes around the span. Returns
/// (source span, destination buffer, span offset in the destination).
fn run_group(
    len: usize,
    lanes: u64,
    width: u32,
    dst_fill: u8,
    seed: u64,
) -> (Vec<u8>, Vec<u8>, usize) {
    let w = width as usize;
    let (src_off, dst_off) = (
        misaligned_offset(w),
        misaligned_offset(w) + 16 * (w >= 16) as usize,
    );
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut src = Aligned::new(src_off + len + GUARD, 0);
    rng.fill(src.bytes_mut());
    let mut dst = Aligned::new(dst_off + len + GUARD, dst_fill);
    let (s, d) = (src.ptr(), dst.ptr());
    assert_eq!(s as usize % 16, 0);
    for lane in 0..lanes {
        // SAFETY: both spans lie inside their buffers, aligned to `width`; len % width == 0.
        unsafe {
            copy_span(
                s.add(src_off),
                d.add(dst_off),
                len as u64,
                lane,
                lanes,
                width,
            )
        };
    }
    (
        src.bytes()[src_off..src_off + len].to_vec(),
        dst.bytes().to_vec(),
        dst_off,
    )
}

fn span_lengths(width: usize, lanes: usize) -> Vec<usize> {
    let mut units: Vec<usize> = vec![
        0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 65, 100, 257, 1023,
    ];
    for k in [1, 2, 3] {
        let group = 4 * lanes * k;
        units.extend([group - 1, group, group + 1, group + lanes - 1, group + 3]);
    }
    units.sort_unstable();
    units.dedup();
    units.into_iter().map(|u| u * width).collect()
}

#[test]
fn copy_span_group_copies_exactly_the_span_for_every_width_and_group_size() {
    let mut seed = 1u64;
    for width in [16u32, 8, 4, 2, 1] {
        for lanes in [1u64, 2, 4, 8, 32] {
            for len in span_lengths(width as usize, lanes as usize) {
                seed += 1;
                let (src, dst, off) = run_group(len, lanes, width, POISON, seed);
                let ctx = format!("width {width}, lanes {lanes}, len {len}");
                assert!(
                    dst[..off].iter().all(|&b| b == POISON),
                    "{ctx}: guard before the span was written"
                );
                assert!(
                    dst[off + len..].iter().all(|&b| b == POISON),
                    "{ctx}: guard after the span was written"
                );
                if let Some(i) = src
                    .iter()
                    .zip(&dst[off..off + len])
                    .position(|(a, b)| a != b)
                {
                    panic!(
                        "{ctx}: byte {i} differs: got {:#x}, want {:#x}",
                        dst[off + i],
                        src[i]
                    );
                }
            }
        }
    }
}

#[test]
fn copy_span_result_does_not_depend_on_prior_destination_contents() {
    for width in [16u32, 8, 4, 2, 1] {
        for lanes in [1u64, 3, 32] {
            let len = (4 * lanes as usize * 2 + 5) * width as usize;
            let (src_a, a, off) = run_group(len, lanes, width, 0x00, 99);
            let (src_b, b, _) = run_group(len, lanes, width, 0xFF, 99);
            assert_eq!(src_a, src_b);
            assert_eq!(
                &a[off..off + len],
                &src_a[..],
                "width {width} lanes {lanes}"
            );
            assert_eq!(
                &a[off..off + len],
                &b[off..off + len],
                "width {width} lanes {lanes}"
            );
            assert!(a[..off].iter().chain(&a[off + len..]).all(|&x| x == 0x00));
            assert!(b[..off].iter().chain(&b[off + len..]).all(|&x| x == 0xFF));
        }
    }
}

/// Runs each lane alone on its own poisoned destination (the source never contains the poison
/// byte) and checks that the lanes' writes partition the span into whole `width`-byte units:
/// every byte is written by exactly one lane, and no lane writes part of a unit.
#[test]
fn copy_span_lanes_write_disjoint_whole_units_covering_the_span_once() {
    let mut rng = SmallRng::seed_from_u64(0x0c0de);
    for width in [16u32, 8, 4, 2, 1] {
        let w = width as usize;
        for lanes in [1u64, 2, 4, 8, 32] {
            for len in span_lengths(w, lanes as usize) {
                let off = misaligned_offset(w);
                let mut src = Aligned::new(off + len + GUARD, 0);
                for b in src.bytes_mut() {
                    *b = rng.gen_range(0..POISON); // never the poison byte
                }
                let mut writer = vec![None::<u64>; len];
                for lane in 0..lanes {
                    let mut dst = Aligned::new(off + len + GUARD, POISON);
                    let (s, d) = (src.ptr(), dst.ptr());
                    // SAFETY: spans inside their buffers, aligned to `width`.
                    unsafe { copy_span(s.add(off), d.add(off), len as u64, lane, lanes, width) };
                    let got = dst.bytes();
                    let ctx = format!("width {width}, lanes {lanes}, len {len}, lane {lane}");
                    assert!(
                        got[..off].iter().all(|&b| b == POISON),
                        "{ctx}: wrote before span"
                    );
                    assert!(
                        got[off + len..].iter().all(|&b| b == POISON),
                        "{ctx}: wrote after span"
                    );
                    for (u, unit) in got[off..off + len].chunks(w).enumerate() {
                        let written = unit.iter().filter(|&&b| b != POISON).count();
                        assert!(
                            written == 0 || written == w,
                            "{ctx}: unit {u} partly written"
                        );
                        if written == w {
                            assert_eq!(
                                unit,
                                &src.bytes()[off + u * w..off + (u + 1) * w],
                                "{ctx}: unit {u}"
                            );
                            for k in 0..w {
                                if let Some(other) = writer[u * w + k] {
                                    panic!(
                                        "{ctx}: byte {} also written by lane {other}",
                                        u * w + k
                                    );
                                }
                                writer[u * w + k] = Some(lane);
                            }
                        }
                    }
                }
                if let Some(i) = writer.iter().position(Option::is_none) {
                    panic!("width {width}, lanes {lanes}, len {len}: byte {i} written by no lane");
                }
                if lanes > 1 && len >= 4 * w * lanes as usize {
                    // with enough work every lane takes part
                    for lane in 0..lanes {
                        assert!(
                            writer.contains(&Some(lane)),
                            "lane {lane} idle: width {width}, len {len}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn copy_span_other_widths_copy_byte_by_byte() {
    for width in [0u32, 3, 5, 32, u32::MAX] {
        for lanes in [1u64, 4, 32] {
            for len in [0usize, 1, 3, 17, 130, 1001] {
                let (src, dst, off) = run_group(len, lanes, width, POISON, len as u64 + 3);
                assert!(dst[..off].iter().all(|&b| b == POISON), "width {width}");
                assert!(
                    dst[off + len..].iter().all(|&b| b == POISON),
                    "width {width}"
                );
                assert_eq!(
                    &dst[off..off + len],
                    &src[..],
                    "width {width} lanes {lanes} len {len}"
                );
            }
        }
    }
}

/// Staged copies (registers between load and store) move exactly the span, for every lane
/// count and unit count they accept.
#[test]
fn staged_load_store_round_trip() {
    use kvio_kernels::span::{load_staged, store_staged, STAGE_UNITS};
    for lanes in [1u64, 2, 4, 8, 16, 32] {
        for units in 0..=STAGE_UNITS * lanes {
            let src: Vec<u128> = (0..units as u128 + 2)
                .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835) | 1)
                .collect();
            let mut dst: Vec<u128> =
                vec![0xA5A5_A5A5_A5A5_A5A5_A5A5_A5A5_A5A5_A5A5; units as usize + 2];
            for lane in 0..lanes {
                // SAFETY: 16-byte aligned vectors with `units` + 2 elements.
                unsafe {
                    let v = load_staged(src.as_ptr() as *const u8, units, lane, lanes);
                    store_staged(dst.as_mut_ptr() as *mut u8, &v, units, lane, lanes);
                }
            }
            assert_eq!(
                &dst[..units as usize],
                &src[..units as usize],
                "lanes {lanes} units {units}"
            );
            assert!(
                dst[units as usize..]
                    .iter()
                    .all(|&x| x == 0xA5A5_A5A5_A5A5_A5A5_A5A5_A5A5_A5A5_A5A5),
                "guard"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// slice_fault, pair_fault (the rules host validation shares with the kernels)
// ---------------------------------------------------------------------------------------------

#[test]
fn slice_fault_names_the_first_failed_check() {
    use kvio_kernels::index::{slice_fault, SliceFault};
    assert_eq!(slice_fault(0, 0, 16, 16, 100, 100), None);
    // Length is checked first: every other field is bad too.
    assert_eq!(slice_fault(-1, -1, 17, 16, 0, 0), Some(SliceFault::Length));
    assert_eq!(
        slice_fault(0, 0, -1, 16, 100, 100),
        Some(SliceFault::Length)
    );
    assert_eq!(slice_fault(0, 0, 1, 0, 100, 100), Some(SliceFault::Length));
    // Then the cache range, then the source range, then the page.
    assert_eq!(
        slice_fault(-1, -1, 2, 16, 100, 100),
        Some(SliceFault::CacheRange)
    );
    assert_eq!(
        slice_fault(99, 200, 2, 16, 100, 100),
        Some(SliceFault::CacheRange)
    );
    assert_eq!(
        slice_fault(15, -1, 2, 16, 100, 100),
        Some(SliceFault::SourceRange)
    );
    assert_eq!(
        slice_fault(15, 99, 2, 16, 100, 100),
        Some(SliceFault::SourceRange)
    );
    assert_eq!(
        slice_fault(15, 0, 2, 16, 100, 100),
        Some(SliceFault::CrossesPage)
    );
}

#[test]
fn pair_fault_names_the_source_first() {
    use kvio_kernels::index::{pair_fault, PairFault};
    assert_eq!(pair_fault(9, 2, 10, 3), None);
    assert_eq!(pair_fault(10, 3, 10, 3), Some(PairFault::Src));
    assert_eq!(pair_fault(10, 2, 10, 3), Some(PairFault::Src));
    assert_eq!(pair_fault(9, 3, 10, 3), Some(PairFault::Dst));
    assert_eq!(
        pair_fault(0, i64::MAX, 1, u64::MAX >> 1),
        Some(PairFault::Dst)
    );
}

// ---------------------------------------------------------------------------------------------
// chunk_at: one addressing rule for strided pools and layer tables
// ---------------------------------------------------------------------------------------------

#[test]
fn chunk_at_table_with_strided_bases_matches_the_strided_pool() {
    use kvio_kernels::index::{chunk_at, PoolSide};
    let (layers, parts) = (3u64, 2u64);
    let base = 0x7000_0000u64;
    let strides = [1 << 20, 1 << 19, 4096, 256, 64];
    let bases: Vec<u64> = (0..layers)
        .flat_map(|l| (0..parts).map(move |p| base + l * strides[0] + p * strides[1]))
        .collect();
    let strided: PoolSide<&[u64]> = PoolSide {
        base: base as *mut u8,
        table: None,
        parts,
        strides,
    };
    let table = PoolSide {
        table: Some(&bases[..]),
        // With a table the base and the layer/part strides are not used.
        base: std::ptr::null_mut(),
        strides: [0, 0, strides[2], strides[3], strides[4]],
        parts,
    };
    let mut rng = SmallRng::seed_from_u64(7);
    for _ in 0..1000 {
        let block = rng.gen_range(0..100u64);
        let ix = [
            rng.gen_range(0..layers),
            rng.gen_range(0..parts),
            rng.gen_range(0..16u64),
            rng.gen_range(0..4u64),
        ];
        let want = base
            + ix[0] * strides[0]
            + ix[1] * strides[1]
            + block * strides[2]
            + ix[2] * strides[3]
            + ix[3] * strides[4];
        // SAFETY: the table holds layers × parts entries and ix is inside them.
        let (a, b) = unsafe { (chunk_at(&strided, block, ix), chunk_at(&table, block, ix)) };
        assert_eq!((a as u64, b as u64), (want, want), "block {block}, {ix:?}");
    }
}

#[test]
fn chunk_at_reads_the_table_entry_of_layer_and_part() {
    use kvio_kernels::index::{chunk_at, PoolSide};
    // Scattered bases: entry l * parts + p, whatever the order in memory.
    let bases = [0x9000u64, 0x1000, 0x5000, 0x3000];
    let side = PoolSide {
        base: std::ptr::null_mut(),
        table: Some(&bases[..]),
        parts: 2,
        strides: [0, 0, 0x100, 0x10, 0x4],
    };
    for (i, &b) in bases.iter().enumerate() {
        let ix = [i as u64 / 2, i as u64 % 2, 3, 1];
        // SAFETY: i < 4 entries.
        let at = unsafe { chunk_at(&side, 2, ix) } as u64;
        assert_eq!(at, b + 2 * 0x100 + 3 * 0x10 + 0x4);
    }
}

// ---------------------------------------------------------------------------------------------
// the benchmarks' spin yardstick
// ---------------------------------------------------------------------------------------------

/// Every thread of an emulated grid stores its own chain's value, at its own index, and the
/// chain follows the recurrence (x = x * a + b from (thread % 1024) * 1e-3, finite, tending to 1).
#[test]
fn spin_stores_each_threads_chain_value() {
    use kvio_kernels::args::SpinArgs;
    use kvio_kernels::ops::{emulate, spin, spin_value};
    let (grid, block, iters) = (3u32, 64u32, 500u32);
    let mut out = vec![f32::NAN; (grid * block) as usize];
    let args = SpinArgs {
        out: out.as_mut_ptr(),
        iters,
        shift: 0,
    };
    // SAFETY: one f32 per thread of the grid.
    emulate(grid, block, 0, |g| unsafe { spin(&args, g) });
    for (t, &v) in out.iter().enumerate() {
        let mut x = (t % 1024) as f32 * 1e-3;
        for _ in 0..iters {
            x = x * 0.9999 + 1e-4;
        }
        assert_eq!(v, x, "thread {t}");
    }
    assert_eq!(spin_value(5, 0), 5.0f32 * 1e-3);
    assert_eq!(
        spin_value(1029, 0),
        spin_value(5, 0),
        "starts repeat every 1024 threads"
    );
    let long = spin_value(1000, 1 << 20);
    assert!(long.is_finite() && (long - 1.0).abs() < 1e-3, "{long}");
}

// ---------------------------------------------------------------------------------------------
// the converting rows entry
// ---------------------------------------------------------------------------------------------

/// `n` source elements of `bytes` bytes each (2: bf16 or f16 bits, 4: f32), spread like
/// activations with a few arbitrary bit patterns (NaN, inf, huge, tiny).
fn source_elements(n: usize, bytes: usize, rng: &mut SmallRng) -> Vec<u8> {
    (0..n)
        .flat_map(|i| {
            let any = i % 29 == 0;
            let x = rng.gen_range(-6.0f32..6.0);
            let bits: u32 = if any { rng.gen() } else { x.to_bits() };
            if bytes == 4 {
                bits.to_le_bytes().to_vec()
            } else {
                // bf16 bits of x, or (f16 sources) simply 16 arbitrary-ish bits: the two
                // entries compared here share the conversion, only the routing differs.
                ((bits >> 16) as u16).to_le_bytes().to_vec()
            }
        })
        .collect()
}

/// `kvio_update_rows_convert`'s body against the general converting entry's, on the same
/// rows (MLA rows: latent then rope part, one per-tensor scale), which that entry writes as
/// separate K and V items (`rows: 0`, both parts with the same scale): the same cache bytes
/// and the same error word, for every conversion, vector units and single elements (the
/// rows entry's out-of-line element-by-element path), groups of 1 to 256 lanes (a row in one
/// round of loads, or in several: its out-of-line round-by-round path), grids whose groups
/// loop over tokens, negative and out-of-range slots.
#[test]
fn rows_convert_matches_the_general_converting_entry() {
    use kvio_kernels::args::SlotArgs;
    use kvio_kernels::convert::{self, code};
    use kvio_kernels::index::err;
    use kvio_kernels::ops::{emulate, update_rows_convert, update_slots_convert};

    let mut rng = SmallRng::seed_from_u64(0x5eed_0fa1);
    let (t, bs, nb) = (37usize, 4usize, 12usize);
    let num_slots = (bs * nb) as i64;
    // Valid slots i * 5 mod 48: distinct for these 37 tokens.
    let slots: Vec<i64> = (0..t as i64)
        .map(|i| match i % 7 {
            2 => -1,
            5 => num_slots + i,
            _ => (i * 5) % num_slots,
        })
        .collect();
    let bad = slots.iter().filter(|&&s| s >= num_slots).count() as u32;
    let scale = [0.37f32];
    for src in [convert::SRC_BF16, convert::SRC_F16, convert::SRC_F32] {
        for to in [convert::TO_E4M3, convert::TO_E5M2] {
            let c = code(src, to);
            let e = convert::src_bytes(c) as usize;
            // (latent, rope) elements: an MLA row, a wide latent part (several rounds even on
            // 32 lanes), a narrow row.
            for (lora, rope) in [(512usize, 64usize), (2048, 64), (24, 8)] {
                let row = lora + rope;
                let in_row = row + 8; // 8 elements of padding keep rows 16-byte aligned
                let input = source_elements(t * in_row, e, &mut rng);
                // 16-byte aligned copies of the input and the cache.
                let mut inbuf = vec![0u128; input.len().div_ceil(16)];
                // SAFETY: inbuf holds at least input.len() bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        input.as_ptr(),
                        inbuf.as_mut_ptr().cast::<u8>(),
                        input.len(),
                    )
                };
                let cache_len = nb * bs * row;
                let poison: Vec<u8> = (0..cache_len).map(|_| rng.gen()).collect();
                for width in [convert::VEC as u32, 1] {
                    for (shift, grid, block) in [
                        (0u32, 1u32, 32u32),
                        (2, 2, 32),
                        (4, 1, 64),
                        (5, 3, 32),
                        (6, 2, 64),
                        (8, 1, 256),
                    ] {
                        let run = |rows_entry: bool| {
                            let mut cache = vec![0u128; cache_len.div_ceil(16)];
                            let dst = cache.as_mut_ptr().cast::<u8>();
                            // SAFETY: cache holds at least cache_len bytes.
                            unsafe {
                                std::ptr::copy_nonoverlapping(poison.as_ptr(), dst, cache_len)
                            };
                            let mut errors = [0u32; err::WORDS];
                            let src_k = inbuf.as_ptr().cast::<u8>();
                            let a = SlotArgs {
                                src_k,
                                // SAFETY: inside the input (the first row's rope part).
                                src_v: unsafe { src_k.add(lora * e) },
                                src_token_stride: (in_row * e) as u64,
                                src_head_stride: 0,
                                dst_k: dst,
                                // SAFETY: inside the cache (the first row's rope columns).
                                dst_v: unsafe { dst.add(lora) },
                                dst_block_stride: (bs * row) as u64,
                                dst_token_stride: row as u64,
                                dst_head_stride: 0,
                                num_blocks: nb as u64,
                                block_size: bs as u64,
                                heads: 1,
                                chunk_bytes: lora as u64,
                                chunk_bytes_v: rope as u64,
                                src_token_stride_v: (in_row * e) as u64,
                                slots: slots.as_ptr().cast(),
                                slot_is_i64: 1,
                                num_tokens: t as u64,
                                convert: c,
                                k_scale: scale.as_ptr(),
                                v_scale: scale.as_ptr(),
                                scale_per_head: 0,
                                rows: rows_entry as u32,
                                width,
                                shift,
                                errors: errors.as_mut_ptr(),
                            };
                            assert_eq!(a.converts_rows(), rows_entry);
                            // SAFETY: every row the slots reach lies in the buffers above,
                            // aligned for `width` (rows of 16-byte multiples, 8-byte fp8 rows).
                            emulate(grid, block, shift, |g| unsafe {
                                if rows_entry {
                                    update_rows_convert(&a, g)
                                } else {
                                    update_slots_convert(&a, g)
                                }
                            });
                            // SAFETY: cache holds cache_len initialised bytes.
                            let bytes =
                                unsafe { std::slice::from_raw_parts(dst.cast_const(), cache_len) }
                                    .to_vec();
                            (bytes, errors)
                        };
                        let what = format!(
                            "code {c:#x} row {lora}+{rope} width {width} shift {shift} grid \
                             {grid}x{block}"
                        );
                        let (want, want_err) = run(false);
                        let (got, got_err) = run(true);
                        assert_eq!(want_err[err::BAD_SLOT], bad, "{what}: general entry");
                        assert_eq!(got_err, want_err, "{what}: error word");
                        assert!(got == want, "{what}: cache bytes differ");
                        assert!(got != poison, "{what}: nothing written");
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The staged v0 body's run test and slot split; the tiles' transposed columns
// ---------------------------------------------------------------------------------------------

/// `consecutive8` (tested on 32-bit halves), `split_slot` (a shift for power-of-two block
/// sizes) and `piece_offset_pow2` against their plain definitions, around the places where
/// 32-bit halves could go wrong: negative slots, a high word, the top of the low word.
#[test]
fn run_test_and_slot_split_match_their_definitions() {
    use kvio_kernels::index::{
        consecutive8, piece_offset, piece_offset_pow2, pow2_shift, split_slot,
    };
    let starts: [i64; 10] = [
        0,
        8,
        16,
        1 << 20,
        (1 << 32) - 8,
        1 << 32,
        (1 << 33) + 24,
        -8,
        -1,
        i64::MAX - 7,
    ];
    let mut runs = 0;
    for &s0 in &starts {
        for bump in [None, Some(1usize), Some(7)] {
            for shift0 in [0i64, 1, 3] {
                let mut s = [0i64; 8];
                for (i, v) in s.iter_mut().enumerate() {
                    *v = s0.wrapping_add(shift0).wrapping_add(i as i64);
                }
                if let Some(k) = bump {
                    s[k] = s[k].wrapping_add(1 << 32);
                }
                let want = s[0] % 8 == 0 && (0..8).all(|i| s[i] == s[0].wrapping_add(i as i64));
                assert_eq!(consecutive8(&s), want, "{s:?}");
                runs += want as u32;
            }
        }
    }
    // Runs: the nine starts that are multiples of 8 (shift 0, no bump), and -1 shifted by 1.
    assert_eq!(runs, 10);
    for bs in [8u64, 16, 24, 32, 128, 1000] {
        let sh = pow2_shift(bs);
        assert_eq!(sh < 64, bs.is_power_of_two());
        for slot in [
            0u64,
            7,
            8,
            15,
            16,
            1023,
            1 << 31,
            (1 << 32) + 5,
            u64::MAX / 3,
        ] {
            assert_eq!(
                split_slot(slot, bs, sh),
                (slot / bs, slot % bs),
                "{slot} {bs}"
            );
        }
    }
    for piece in [1u64, 4, 8, 16, 12] {
        for e in [0u64, 3, 4, 7, 8, 15, 16, 127] {
            assert_eq!(
                piece_offset_pow2(e, piece, 256, 2),
                piece_offset(e, piece, 256, 2),
                "{e} {piece}"
            );
        }
    }
}

/// The transposed columns (`prmt` on the GPU; its byte-select semantics on the CPU) hold
/// element `j` of each of the eight rows, for 1-, 2- and 4-byte elements.
#[test]
fn tile_columns_transpose_rows() {
    use kvio_kernels::tile::{column, get, Row};
    let mut rng = SmallRng::seed_from_u64(0x7117);
    fn check<const E: usize>(rows: &[Row; 8]) {
        for j in 0..8 {
            let col = column::<E>(rows, j);
            for (i, row) in rows.iter().enumerate() {
                assert_eq!(get::<E>(&col, i), get::<E>(row, j), "E {E} ({i}, {j})");
            }
        }
    }
    for _ in 0..64 {
        let mut rows = [[0u32; 8]; 8];
        for r in rows.iter_mut() {
            for x in r.iter_mut() {
                *x = rng.gen();
            }
        }
        check::<1>(&rows);
        check::<2>(&rows);
        check::<4>(&rows);
    }
}

// ---------------------------------------------------------------------------------------------
// The v0 pages updates' runs around a window
// ---------------------------------------------------------------------------------------------

/// `window_runs` against the plain definition (a run is `T` tokens in the batch from one whose
/// slot is valid and a multiple of `T`, each slot the one before plus one), on the `3 * T`
/// slots around windows of random prefill batches: sequences on fresh pages or continuing
/// chunked prefills, padding, out-of-range and negative slots, scattered slots, a batch's
/// first and last window.
#[test]
fn window_runs_match_their_definition() {
    use kvio_kernels::index::window_runs;
    fn check<const T: u64>(rng: &mut SmallRng) -> (u32, u32) {
        let t = T as usize;
        let (bs, num_slots) = (t * (1 << rng.gen_range(0..3)), 1i64 << 20);
        // A batch of 4 to 12 windows, slots as a serving stack would give them.
        let n = t * rng.gen_range(4..12) + rng.gen_range(0..t);
        let mut slots = Vec::with_capacity(n);
        let mut next_page = 0i64;
        while slots.len() < n {
            let len = rng.gen_range(1..6 * t);
            let off = if rng.gen_bool(0.5) {
                0
            } else {
                rng.gen_range(0..bs)
            };
            for i in off..off + len {
                slots.push((next_page + (i / bs) as i64) * bs as i64 + (i % bs) as i64);
            }
            next_page += (off + len).div_ceil(bs) as i64 + rng.gen_range(0..3);
        }
        slots.truncate(n);
        for s in slots.iter_mut() {
            match rng.gen_range(0..400) {
                0 => *s = -1,
                1 => *s = num_slots + rng.gen_range(0..100),
                2 => *s = rng.gen_range(0..num_slots),
                3 => *s = i64::MIN + rng.gen_range(0..4),
                _ => {}
            }
        }
        let (mut runs, mut windows) = (0, 0);
        for w in 0..n.div_ceil(t) {
            // Token of position p, when it is in the batch.
            let tok = |p: usize| (w * t + p).checked_sub(t).filter(|&k| k < n);
            let (mut aligned, mut follows) = (0u128, 0u128);
            for p in 0..3 * t {
                let Some(k) = tok(p) else { continue };
                let s = slots[k];
                if s >= 0 && s < num_slots && s % T as i64 == 0 {
                    aligned |= 1 << p;
                }
                if k > 0 && s == slots[k - 1].wrapping_add(1) {
                    follows |= 1 << p;
                }
            }
            let run = |c: usize| {
                let Some(k0) = tok(c) else { return false };
                let s0 = slots[k0];
                s0 >= 0
                    && s0 < num_slots
                    && s0 % T as i64 == 0
                    && (1..t).all(|j| tok(c + j).is_some_and(|k| slots[k] == s0 + j as i64))
            };
            let prev: Vec<usize> = (0..t).filter(|&c| run(c)).collect();
            let own: Vec<usize> = (t..2 * t).filter(|&c| run(c)).collect();
            assert!(prev.len() <= 1 && own.len() <= 1, "{prev:?} {own:?}");
            let want = (
                prev.first().map_or(0, |&c| c as u64),
                own.first().map_or(T, |&c| (c - t) as u64),
            );
            assert_eq!(window_runs::<T>(aligned, follows), want, "T={T} window {w}");
            runs += own.len() as u32;
            windows += 1;
        }
        (runs, windows)
    }
    let mut rng = SmallRng::seed_from_u64(0x0f11_5eed);
    let (mut runs, mut windows) = (0, 0);
    for _ in 0..300 {
        for (r, w) in [
            check::<16>(&mut rng),
            check::<32>(&mut rng),
            check::<8>(&mut rng),
        ] {
            runs += r;
            windows += w;
        }
    }
    // Most windows of these batches hold a run (the test would prove little if none did), and
    // not every one does.
    assert!(
        runs > windows / 3 && runs < windows,
        "{runs} runs in {windows} windows"
    );
}
