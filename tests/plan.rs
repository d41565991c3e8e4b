//! Tests of the host-side planning and validation (`kvio::plan`) and of the CPU reference
//! updates (`kvio::reference`).

use kvio::plan::{slices_to_table, slots_to_slices, validate_slices, validate_slots, Slice};
use kvio::reference::{update_slices, update_slots};
use kvio::{Error, ErrorCounts, PagedLayout, TokenLayout};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

fn sl(cache_start: i32, new_kv_start: i32, len: i32) -> Slice {
    Slice {
        cache_start,
        new_kv_start,
        len,
    }
}

// ---------------------------------------------------------------------------------------------
// slots_to_slices
// ---------------------------------------------------------------------------------------------

#[test]
fn slots_to_slices_doc_example() {
    let s = slots_to_slices(&[4i64, 5, 6, 7, 8, -1, 20], 8).unwrap();
    assert_eq!(s, vec![sl(4, 0, 4), sl(8, 4, 1), sl(20, 6, 1)]);
}

#[test]
fn slots_to_slices_empty_and_all_negative_give_no_slices() {
    assert_eq!(slots_to_slices::<i64>(&[], 4).unwrap(), vec![]);
    assert_eq!(slots_to_slices(&[-1i32, -5, i32::MIN], 4).unwrap(), vec![]);
}

#[test]
fn slots_to_slices_run_stops_at_each_page_start() {
    // page 4: slots 2..=13 span pages 0, 1, 2 and 3
    let slots: Vec<i64> = (2..14).collect();
    assert_eq!(
        slots_to_slices(&slots, 4).unwrap(),
        vec![sl(2, 0, 2), sl(4, 2, 4), sl(8, 6, 4), sl(12, 10, 2)]
    );
    // page 1: every token its own slice
    assert_eq!(
        slots_to_slices(&[7i64, 8, 9], 1).unwrap(),
        vec![sl(7, 0, 1), sl(8, 1, 1), sl(9, 2, 1)]
    );
    // a full page is one slice, the next page a new one
    assert_eq!(
        slots_to_slices(&[16i32, 17, 18, 19, 20], 4).unwrap(),
        vec![sl(16, 0, 4), sl(20, 4, 1)]
    );
    // non-power-of-two page
    assert_eq!(
        slots_to_slices(&[1i64, 2, 3, 4, 5, 6, 7], 3).unwrap(),
        vec![sl(1, 0, 2), sl(3, 2, 3), sl(6, 5, 2)]
    );
}

#[test]
fn slots_to_slices_negative_slot_breaks_a_run() {
    // 1, 2, (skip), 4: slot 4 follows slot 2's token + 2, never merged with the first run
    assert_eq!(
        slots_to_slices(&[1i64, 2, -1, 3], 16).unwrap(),
        vec![sl(1, 0, 2), sl(3, 3, 1)]
    );
    assert_eq!(
        slots_to_slices(&[-1i64, 0, 1, -7, -1, 2, 3], 16).unwrap(),
        vec![sl(0, 1, 2), sl(2, 5, 2)]
    );
}

#[test]
fn slots_to_slices_non_consecutive_slots_start_new_slices() {
    // consecutive tokens, slots going down, repeating or jumping
    assert_eq!(
        slots_to_slices(&[5i64, 4, 4, 6, 7, 9], 16).unwrap(),
        vec![
            sl(5, 0, 1),
            sl(4, 1, 1),
            sl(4, 2, 1),
            sl(6, 3, 2),
            sl(9, 5, 1)
        ]
    );
}

#[test]
fn slots_to_slices_accepts_i32_and_i64_alike() {
    let s32: Vec<i32> = vec![0, 1, 2, -1, 10, 11, 12, 13, 14, i32::MAX];
    let s64: Vec<i64> = s32.iter().map(|&s| s as i64).collect();
    let a = slots_to_slices(&s32, 4).unwrap();
    let b = slots_to_slices(&s64, 4).unwrap();
    assert_eq!(a, b);
    assert_eq!(
        a,
        vec![sl(0, 0, 3), sl(10, 4, 2), sl(12, 6, 3), sl(i32::MAX, 9, 1)]
    );
}

#[test]
fn slots_to_slices_rejects_page_size_zero() {
    assert!(matches!(
        slots_to_slices(&[0i64], 0),
        Err(Error::InvalidArgument {
            name: "page_size",
            ..
        })
    ));
    assert!(matches!(
        slots_to_slices::<i32>(&[], 0),
        Err(Error::InvalidArgument {
            name: "page_size",
            ..
        })
    ));
}

#[test]
fn slots_to_slices_rejects_page_size_over_i32_max() {
    assert!(matches!(
        slots_to_slices(&[0i64], i32::MAX as usize + 1),
        Err(Error::InvalidArgument {
            name: "page_size",
            ..
        })
    ));
    assert!(slots_to_slices(&[0i64], i32::MAX as usize).is_ok());
}

#[test]
fn slots_to_slices_rejects_slots_past_i32_max() {
    let big = i32::MAX as i64 + 1;
    assert_eq!(
        slots_to_slices(&[0i64, 1, -1, big, 2], 16),
        Err(Error::IndexOutOfRange {
            name: "slots",
            at: 3,
            value: big,
            limit: big as u64,
        })
    );
    assert_eq!(
        slots_to_slices(&[i64::MAX], 16),
        Err(Error::IndexOutOfRange {
            name: "slots",
            at: 0,
            value: i64::MAX,
            limit: big as u64,
        })
    );
    // i64::MIN is merely negative
    assert_eq!(slots_to_slices(&[i64::MIN], 16).unwrap(), vec![]);
}

/// The (token, slot) writes of a slot mapping, sorted.
fn writes_of_slots(slots: &[i64]) -> Vec<(i64, i64)> {
    let mut w: Vec<(i64, i64)> = slots
        .iter()
        .enumerate()
        .filter(|(_, &s)| s >= 0)
        .map(|(t, &s)| (t as i64, s))
        .collect();
    w.sort_unstable();
    w
}

/// The (token, slot) writes of a list of slices, sorted.
fn writes_of_slices(slices: &[Slice]) -> Vec<(i64, i64)> {
    let mut w = Vec::new();
    for s in slices {
        for r in 0..s.len as i64 {
            w.push((s.new_kv_start as i64 + r, s.cache_start as i64 + r));
        }
    }
    w.sort_unstable();
    w
}

/// Independent count of maximal runs: a new run starts at every kept token whose predecessor
/// token is skipped or does not go to the previous slot of the same page.
fn count_runs(slots: &[i64], page: i64) -> usize {
    let mut runs = 0;
    for t in 0..slots.len() {
        let s = slots[t];
        if s < 0 {
            continue;
        }
        let continues = t > 0 && {
            let p = slots[t - 1];
            p >= 0 && p + 1 == s && p / page == s / page
        };
        if !continues {
            runs += 1;
        }
    }
    runs
}

/// Random slot mapping over `num_slots` slots: mostly runs, with jumps, negatives and (when
/// `distinct` is false) repeats.
fn random_slots(rng: &mut SmallRng, n: usize, num_slots: usize, distinct: bool) -> Vec<i64> {
    let mut used = vec![false; num_slots];
    let mut out = Vec::with_capacity(n);
    let mut prev: Option<usize> = None;
    for _ in 0..n {
        let r = rng.gen_range(0..100);
        if r < 10 {
            out.push(-rng.gen_range(1..1000));
            prev = None;
            continue;
        }
        let mut pick = match prev {
            Some(p) if r < 75 && p + 1 < num_slots => p + 1,
            _ => rng.gen_range(0..num_slots),
        };
        if distinct {
            let mut tries = 0;
            while used[pick] && tries < 20 {
                pick = rng.gen_range(0..num_slots);
                tries += 1;
            }
            if used[pick] {
                out.push(-1);
                prev = None;
                continue;
            }
        }
        used[pick] = true;
        out.push(pick as i64);
        prev = Some(pick);
    }
    out
}

#[test]
fn slots_to_slices_random_reproduces_the_mapping_with_minimal_valid_slices() {
    let mut rng = SmallRng::seed_from_u64(0x511ce5);
    for iter in 0..3000 {
        let page = [1usize, 2, 3, 4, 5, 8, 16, 64][rng.gen_range(0..8)];
        let num_slots = page * rng.gen_range(1..40);
        let n = rng.gen_range(0..200);
        let distinct = iter % 4 != 0;
        let slots = random_slots(&mut rng, n, num_slots, distinct);
        let slices = slots_to_slices(&slots, page).unwrap();
        let ctx = format!("page {page}, slots {slots:?}");

        assert_eq!(writes_of_slices(&slices), writes_of_slots(&slots), "{ctx}");
        assert_eq!(slices.len(), count_runs(&slots, page as i64), "{ctx}");
        for s in &slices {
            assert!(s.len >= 1 && s.len as usize <= page, "{ctx}: {s:?}");
        }
        // slices come out in token order
        assert!(
            slices
                .windows(2)
                .all(|w| w[0].new_kv_start + w[0].len <= w[1].new_kv_start),
            "{ctx}"
        );
        if distinct {
            assert_eq!(
                validate_slices(&slices, page, num_slots, n),
                Ok(()),
                "{ctx}"
            );
            assert_eq!(validate_slots(&slots, num_slots), Ok(()), "{ctx}");
        }
        // i32 input gives the same plan
        let s32: Vec<i32> = slots.iter().map(|&s| s as i32).collect();
        assert_eq!(slots_to_slices(&s32, page).unwrap(), slices, "{ctx}");
    }
}

// ---------------------------------------------------------------------------------------------
// slices_to_table
// ---------------------------------------------------------------------------------------------

#[test]
fn slices_to_table_is_struct_of_arrays_with_zero_padding() {
    let t = slices_to_table(&[sl(4, 0, 4), sl(8, 4, 1), sl(20, 6, 2)], 5).unwrap();
    assert_eq!(
        t,
        vec![
            4, 8, 20, 0, 0, // cache_start
            0, 4, 6, 0, 0, // new_kv_start
            4, 1, 2, 0, 0, // len
        ]
    );
    assert_eq!(slices_to_table(&[sl(-3, 7, 9)], 1).unwrap(), vec![-3, 7, 9]);
    assert_eq!(slices_to_table(&[], 2).unwrap(), vec![0; 6]);
    assert_eq!(slices_to_table(&[], 0).unwrap(), Vec::<i32>::new());
}

#[test]
fn slices_to_table_rejects_padded_below_slice_count() {
    assert!(matches!(
        slices_to_table(&[sl(0, 0, 1), sl(1, 1, 1)], 1),
        Err(Error::InvalidArgument { name: "padded", .. })
    ));
    assert!(matches!(
        slices_to_table(&[sl(0, 0, 1)], 0),
        Err(Error::InvalidArgument { name: "padded", .. })
    ));
    assert_eq!(slices_to_table(&[sl(0, 0, 1)], 1).unwrap(), vec![0, 0, 1]);
}

#[test]
fn slices_to_table_overflowing_padded_is_an_error() {
    assert_eq!(
        slices_to_table(&[], usize::MAX),
        Err(Error::Overflow { name: "padded" })
    );
}

// ---------------------------------------------------------------------------------------------
// validate_slots
// ---------------------------------------------------------------------------------------------

#[test]
fn validate_slots_accepts_distinct_in_range_and_negative_slots() {
    assert_eq!(validate_slots::<i64>(&[], 0), Ok(()));
    assert_eq!(validate_slots(&[-1i64, -1, i64::MIN], 0), Ok(()));
    assert_eq!(validate_slots(&[3i64, -1, 0, -1, 9, 1], 10), Ok(()));
    assert_eq!(validate_slots(&[3i32, -1, 0, -1, 9, 1], 10), Ok(()));
}

#[test]
fn validate_slots_out_of_range_reports_position_value_and_limit() {
    assert_eq!(
        validate_slots(&[0i64, -1, 10, 11], 10),
        Err(Error::IndexOutOfRange {
            name: "slots",
            at: 2,
            value: 10,
            limit: 10,
        })
    );
    assert_eq!(
        validate_slots(&[-5i32, i32::MAX], 100),
        Err(Error::IndexOutOfRange {
            name: "slots",
            at: 1,
            value: i32::MAX as i64,
            limit: 100,
        })
    );
    assert_eq!(validate_slots(&[i64::MAX], usize::MAX), Ok(()));
    assert_eq!(
        validate_slots(&[0i64], 0),
        Err(Error::IndexOutOfRange {
            name: "slots",
            at: 0,
            value: 0,
            limit: 0,
        })
    );
}

#[test]
fn validate_slots_duplicates_are_overlap() {
    assert_eq!(
        validate_slots(&[5i64, 3, -1, 5], 10),
        Err(Error::Overlap {
            name: "slots",
            first: 0,
            second: 3,
        })
    );
    assert_eq!(
        validate_slots(&[1i32, 2, 9, 9], 10),
        Err(Error::Overlap {
            name: "slots",
            first: 2,
            second: 3,
        })
    );
    // repeated negatives are fine
    assert_eq!(validate_slots(&[-1i64, -1, -2, -2], 1), Ok(()));
}

// ---------------------------------------------------------------------------------------------
// validate_slices
// ---------------------------------------------------------------------------------------------

#[test]
fn validate_slices_accepts_valid_adjacent_and_padding_entries() {
    let s = [
        sl(0, 0, 4),
        sl(4, 4, 2),
        sl(6, 10, 2),  // ends at the page end
        sl(-9, -9, 0), // padding: ignored whatever its fields
        sl(12, 0, 4),
    ];
    assert_eq!(validate_slices(&s, 4, 16, 12), Ok(()));
    assert_eq!(validate_slices(&[], 4, 0, 0), Ok(()));
    // two slices reading the same tokens into different slots are fine
    assert_eq!(
        validate_slices(&[sl(0, 0, 2), sl(2, 0, 2)], 4, 4, 2),
        Ok(())
    );
}

#[test]
fn validate_slices_rejects_length_over_a_page_or_negative() {
    assert_eq!(
        validate_slices(&[sl(0, 0, 1), sl(0, 0, 5)], 4, 100, 100),
        Err(Error::IndexOutOfRange {
            name: "slices",
            at: 1,
            value: 5,
            limit: 5,
        })
    );
    assert_eq!(
        validate_slices(&[sl(0, 0, -1)], 4, 100, 100),
        Err(Error::IndexOutOfRange {
            name: "slices",
            at: 0,
            value: -1,
            limit: 5,
        })
    );
}

#[test]
fn validate_slices_rejects_starts_outside_cache_or_source() {
    let err = |at, value, limit| {
        Err(Error::IndexOutOfRange {
            name: "slices",
            at,
            value,
            limit,
        })
    };
    // negative cache start
    assert_eq!(validate_slices(&[sl(-1, 0, 1)], 4, 16, 8), err(0, -1, 16));
    // past the cache (ends at 17 > 16), and starting at the cache end
    assert_eq!(validate_slices(&[sl(15, 0, 2)], 8, 16, 8), err(0, 15, 16));
    assert_eq!(validate_slices(&[sl(16, 0, 1)], 8, 16, 8), err(0, 16, 16));
    // negative source start
    assert_eq!(
        validate_slices(&[sl(0, 0, 1), sl(1, -3, 1)], 4, 16, 8),
        err(1, -3, 8)
    );
    // past the tokens
    assert_eq!(validate_slices(&[sl(0, 7, 2)], 4, 16, 8), err(0, 7, 8));
    assert_eq!(validate_slices(&[sl(0, 8, 1)], 4, 16, 8), err(0, 8, 8));
    // exactly at both ends is fine
    assert_eq!(validate_slices(&[sl(15, 7, 1)], 4, 16, 8), Ok(()));
}

#[test]
fn validate_slices_rejects_page_crossing() {
    assert!(matches!(
        validate_slices(&[sl(3, 0, 2)], 4, 16, 8),
        Err(Error::InvalidArgument { name: "slices", .. })
    ));
    assert!(matches!(
        validate_slices(&[sl(0, 0, 1), sl(5, 0, 4)], 4, 16, 8),
        Err(Error::InvalidArgument { name: "slices", .. })
    ));
    assert_eq!(validate_slices(&[sl(4, 0, 4)], 4, 16, 8), Ok(()));
}

/// The two positions an overlap of `slices` names, in order; panics on any other result.
fn overlapping(r: kvio::Result<()>) -> [usize; 2] {
    match r {
        Err(Error::Overlap {
            name: "slices",
            first,
            second,
        }) => {
            let mut p = [first, second];
            p.sort_unstable();
            p
        }
        other => panic!("expected overlap, got {other:?}"),
    }
}

#[test]
fn validate_slices_rejects_overlapping_cache_ranges() {
    assert_eq!(
        overlapping(validate_slices(&[sl(4, 0, 3), sl(6, 3, 2)], 8, 16, 8)),
        [0, 1]
    );
    // overlap of a slice contained in an earlier one, with an unrelated slice in between
    let slices = [sl(0, 0, 8), sl(20, 0, 1), sl(3, 0, 1)];
    assert_eq!(overlapping(validate_slices(&slices, 8, 32, 8)), [0, 2]);
    // identical slices
    assert!(matches!(
        validate_slices(&[sl(1, 0, 1), sl(1, 1, 1)], 8, 16, 8),
        Err(Error::Overlap { name: "slices", .. })
    ));
}

#[test]
fn validate_slices_rejects_page_size_zero() {
    assert!(matches!(
        validate_slices(&[], 0, 16, 8),
        Err(Error::InvalidArgument {
            name: "page_size",
            ..
        })
    ));
}

#[test]
fn validate_slices_agrees_with_the_kernel_check_on_single_slices() {
    use kvio_kernels::index::{check_slice, SliceCheck};
    let mut rng = SmallRng::seed_from_u64(0x7a11d);
    for _ in 0..100_000 {
        let page = rng.gen_range(1..=9usize);
        let num_slots = rng.gen_range(0..40usize);
        let num_tokens = rng.gen_range(0..40usize);
        let s = sl(
            rng.gen_range(-3..45),
            rng.gen_range(-3..45),
            rng.gen_range(-2..11),
        );
        let kernel = check_slice(
            s.cache_start,
            s.new_kv_start,
            s.len,
            page as u32,
            num_slots as u64,
            num_tokens as u64,
        );
        let host = validate_slices(&[s], page, num_slots, num_tokens);
        assert_eq!(
            host.is_ok(),
            kernel != SliceCheck::Invalid,
            "{s:?} page {page} slots {num_slots} tokens {num_tokens}: host {host:?}, kernel {kernel:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// reference::update_slots / update_slices
// ---------------------------------------------------------------------------------------------

const P: u8 = 0xEE;

#[test]
fn reference_update_slots_tiny_nhd_example() {
    // 2 blocks x 2 slots x 1 head x 2 elems of u8: 8 bytes per cache, K at 0, V at 8.
    let layout = PagedLayout::nhd(2, 2, 1, 2, 1);
    let input = TokenLayout::contiguous(5, 1, 2, 1);
    let key = [10u8, 11, 20, 21, 30, 31, 40, 41, 50, 51];
    let value = [110u8, 111, 120, 121, 130, 131, 140, 141, 150, 151];
    // token 0 -> slot 3, token 1 skipped, token 2 -> slot 0, token 3 out of range (4),
    // token 4 out of range (i64::MAX)
    let slots = [3i64, -1, 0, 4, i64::MAX];
    let mut cache = [P; 16];
    let counts = update_slots(
        &key,
        Some(&value),
        &input,
        &mut cache,
        0,
        Some(8),
        &layout,
        &slots,
    );
    assert_eq!(
        counts,
        ErrorCounts {
            bad_slots: 2,
            ..Default::default()
        }
    );
    assert_eq!(
        cache,
        [
            30, 31, P, P, P, P, 10, 11, // K: slot 0 <- token 2, slot 3 <- token 0
            130, 131, P, P, P, P, 110, 111, // V
        ]
    );

    // key only, cache at an offset inside a larger buffer
    let mut cache = [P; 12];
    let counts = update_slots(&key, None, &input, &mut cache, 4, None, &layout, &[1, 2]);
    assert!(counts.is_clean());
    assert_eq!(cache, [P, P, P, P, P, P, 10, 11, 20, 21, P, P]);
}

#[test]
fn reference_update_slots_tiny_hnd_example_with_two_heads() {
    // HND: [block, head, slot, d]; 2 blocks x 2 heads x 2 slots x 2 elems = 16 bytes.
    let layout = PagedLayout::hnd(2, 2, 2, 2, 1);
    let input = TokenLayout::contiguous(2, 2, 2, 1);
    // token t, head h, elem d = 100 * (t + 1) + 10 * h + d
    let key = [100u8, 101, 110, 111, 200, 201, 210, 211];
    let mut cache = [P; 16];
    let counts = update_slots(&key, None, &input, &mut cache, 0, None, &layout, &[1, 2]);
    assert!(counts.is_clean());
    assert_eq!(
        cache,
        [
            P, P, 100, 101, // block 0, head 0, slots 0 and 1
            P, P, 110, 111, // block 0, head 1
            200, 201, P, P, // block 1, head 0
            210, 211, P, P, // block 1, head 1
        ]
    );
}

#[test]
fn reference_update_slots_respects_input_strides() {
    // input padded: token stride 5 elements (2 heads of 2 plus 1 unused)
    let input = TokenLayout {
        num_tokens: 2,
        num_heads: 2,
        head_dim: 2,
        elem_bytes: 1,
        token_stride: 5,
        head_stride: 2,
    };
    let key = [1u8, 2, 3, 4, 99, 5, 6, 7, 8, 99];
    let layout = PagedLayout::nhd(1, 2, 2, 2, 1);
    let mut cache = [P; 8];
    update_slots(&key, None, &input, &mut cache, 0, None, &layout, &[1, 0]);
    assert_eq!(cache, [5, 6, 7, 8, 1, 2, 3, 4]);
}

#[test]
fn reference_update_slices_tiny_example() {
    let layout = PagedLayout::nhd(2, 2, 1, 2, 1);
    let input = TokenLayout::contiguous(3, 1, 2, 1);
    let kv = [10u8, 11, 20, 21, 30, 31];
    let slices = [
        sl(1, 0, 1), // token 0 -> slot 1
        sl(0, 0, 0), // padding
        sl(2, 1, 2), // tokens 1, 2 -> slots 2, 3
        sl(1, 0, 2), // crosses a page: counted
        sl(3, 2, 3), // longer than a page: counted
        sl(0, 2, 2), // past the tokens: counted
        sl(0, 0, 1), // beyond num_slices: ignored
    ];
    let mut cache = [P; 8];
    let counts = update_slices(&kv, &input, &mut cache, &layout, &slices, 6);
    assert_eq!(
        counts,
        ErrorCounts {
            bad_slices: 3,
            ..Default::default()
        }
    );
    assert_eq!(cache, [P, P, 10, 11, 20, 21, 30, 31]);
}

#[test]
fn reference_update_slices_bad_count_does_nothing() {
    let layout = PagedLayout::nhd(2, 2, 1, 2, 1);
    let input = TokenLayout::contiguous(3, 1, 2, 1);
    let kv = [10u8, 11, 20, 21, 30, 31];
    let slices = [sl(1, 0, 1), sl(2, 1, 2)];
    for n in [-1, 3, i32::MIN, i32::MAX] {
        let mut cache = [P; 8];
        let counts = update_slices(&kv, &input, &mut cache, &layout, &slices, n);
        assert_eq!(
            counts,
            ErrorCounts {
                bad_counts: 1,
                ..Default::default()
            },
            "num_slices {n}"
        );
        assert_eq!(cache, [P; 8], "num_slices {n}");
    }
    // a count of 1 applies only the first slice, 0 none
    let mut cache = [P; 8];
    assert!(update_slices(&kv, &input, &mut cache, &layout, &slices, 1).is_clean());
    assert_eq!(cache, [P, P, 10, 11, P, P, P, P]);
    let mut cache = [P; 8];
    assert!(update_slices(&kv, &input, &mut cache, &layout, &slices, 0).is_clean());
    assert_eq!(cache, [P; 8]);
}

/// Reads element (block, slot, head, d) of a cache as bytes.
fn elem<'a>(cache: &'a [u8], l: &PagedLayout, b: usize, s: usize, h: usize, d: usize) -> &'a [u8] {
    let o = (b * l.block_stride + s * l.token_stride + h * l.head_stride + d) * l.elem_bytes;
    &cache[o..o + l.elem_bytes]
}

/// Logical `[block][slot][head][d]` contents of a cache, element by element.
fn logical(cache: &[u8], l: &PagedLayout) -> Vec<u8> {
    let mut v = Vec::new();
    for b in 0..l.num_blocks {
        for s in 0..l.block_size {
            for h in 0..l.num_heads {
                for d in 0..l.head_dim {
                    v.extend_from_slice(elem(cache, l, b, s, h, d));
                }
            }
        }
    }
    v
}

#[test]
fn reference_nhd_and_hnd_agree_after_logical_read_back() {
    let mut rng = SmallRng::seed_from_u64(0x4d4d);
    for iter in 0..200 {
        let (nb, bs, nh, hd) = (
            rng.gen_range(1..5),
            rng.gen_range(1..6),
            rng.gen_range(1..4),
            rng.gen_range(1..5),
        );
        let e = [1usize, 2, 4][iter % 3];
        let nhd = PagedLayout::nhd(nb, bs, nh, hd, e);
        let hnd = PagedLayout::hnd(nb, bs, nh, hd, e);
        let num_slots = nb * bs;
        let t = rng.gen_range(0..=num_slots + 3);
        let input = TokenLayout::contiguous(t, nh, hd, e);
        let mut key = vec![0u8; input.row_bytes() * t];
        let mut value = vec![0u8; key.len()];
        rng.fill(&mut key[..]);
        rng.fill(&mut value[..]);
        // distinct slots, some negative, some out of range
        let mut pool: Vec<i64> = (0..num_slots as i64).collect();
        pool.shuffle(&mut rng);
        let slots: Vec<i64> = (0..t)
            .map(|i| match rng.gen_range(0..10) {
                0 => -1,
                1 => num_slots as i64 + rng.gen_range(0..3),
                _ => pool.get(i).copied().unwrap_or(-1),
            })
            .collect();
        let bytes = num_slots * nh * hd * e;
        let init: Vec<u8> = (0..2 * bytes).map(|_| rng.gen()).collect();
        let mut c_nhd = init.clone();
        let (l0, l1) = init.split_at(bytes);
        // same logical initial contents in both layouts
        let mut c_hnd = c_hnd_initial(l0, &nhd, &hnd);
        c_hnd.extend(c_hnd_initial(l1, &nhd, &hnd));
        let a = update_slots(
            &key,
            Some(&value),
            &input,
            &mut c_nhd,
            0,
            Some(bytes),
            &nhd,
            &slots,
        );
        let b = update_slots(
            &key,
            Some(&value),
            &input,
            &mut c_hnd,
            0,
            Some(bytes),
            &hnd,
            &slots,
        );
        assert_eq!(a, b);
        let bad = slots.iter().filter(|&&s| s >= num_slots as i64).count() as u32;
        assert_eq!(a.bad_slots, bad);
        let (kn, vn) = c_nhd.split_at(bytes);
        let (kh, vh) = c_hnd.split_at(bytes);
        assert_eq!(logical(kn, &nhd), logical(kh, &hnd), "K, iter {iter}");
        assert_eq!(logical(vn, &nhd), logical(vh, &hnd), "V, iter {iter}");

        // every written element holds its token's data, every other one its initial value
        let mut want_k = logical(l0, &nhd);
        let row = nh * hd * e;
        for (tok, &s) in slots.iter().enumerate() {
            if s >= 0 && (s as usize) < num_slots {
                let s = s as usize;
                want_k[s * row..(s + 1) * row].copy_from_slice(&key[tok * row..(tok + 1) * row]);
            }
        }
        assert_eq!(logical(kh, &hnd), want_k, "K content, iter {iter}");

        // the slice-based update of the same mapping gives the same caches
        let kept: Vec<i64> = slots
            .iter()
            .map(|&s| if s >= num_slots as i64 { -1 } else { s })
            .collect();
        let slices = slots_to_slices(&kept, bs).unwrap();
        for (l, c_slots) in [(&nhd, &c_nhd), (&hnd, &c_hnd)] {
            let mut c = if l == &nhd {
                init[..bytes].to_vec()
            } else {
                c_hnd_initial(&init[..bytes], &nhd, &hnd)
            };
            let n = slices.len() as i32;
            assert!(update_slices(&key, &input, &mut c, l, &slices, n).is_clean());
            assert_eq!(&c[..], &c_slots[..bytes], "slices vs slots, iter {iter}");
        }
    }
}

/// The HND cache holding the same logical contents as an NHD one.
fn c_hnd_initial(nhd_cache: &[u8], nhd: &PagedLayout, hnd: &PagedLayout) -> Vec<u8> {
    let mut out = vec![0u8; nhd_cache.len()];
    let e = nhd.elem_bytes;
    for b in 0..nhd.num_blocks {
        for s in 0..nhd.block_size {
            for h in 0..nhd.num_heads {
                for d in 0..nhd.head_dim {
                    let o =
                        (b * hnd.block_stride + s * hnd.token_stride + h * hnd.head_stride + d) * e;
                    out[o..o + e].copy_from_slice(elem(nhd_cache, nhd, b, s, h, d));
                }
            }
        }
    }
    out
}

#[test]
fn validate_slices_rejects_page_sizes_past_i32() {
    let s = [kvio::plan::Slice {
        cache_start: 0,
        new_kv_start: 0,
        len: -1,
    }];
    for page in [usize::MAX, i32::MAX as usize + 1] {
        assert!(matches!(
            kvio::plan::validate_slices(&s, page, 10, 10),
            Err(kvio::Error::InvalidArgument {
                name: "page_size",
                ..
            })
        ));
    }
}
