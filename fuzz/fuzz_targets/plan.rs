//! The host-side planners and validators of index lists (`kvio::plan`): `slots_to_slices`,
//! `slices_to_table`, `validate_slots`, `validate_slices`, on arbitrary lists and sizes.
//! Beyond "no panic, no overflow":
//! - `validate_slots` accepts exactly the lists with every slot negative or in range and no
//!   slot twice;
//! - `slots_to_slices` covers exactly the tokens with a non-negative slot, one page per slice,
//!   or names the first slot past `i32::MAX`;
//! - `slices_to_table` lays the slices out as `[3, padded]`, zero padded;
//! - `validate_slices` refuses page sizes outside `1..=i32::MAX`, accepts only slices the kernel
//!   would copy (in range, one page) that never write one slot twice, and refuses every list
//!   with a slice the kernel would refuse.
#![no_main]

use kvio::plan::{slices_to_table, slots_to_slices, validate_slices, validate_slots, Slice};
use kvio::Error;
use kvio_fuzz::{index, size, slice_copied};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

struct Case {
    slots: Vec<i64>,
    i32_slots: bool,
    page: usize,
    num_slots: usize,
    num_tokens: usize,
    slices: Vec<Slice>,
    padded: usize,
}

fn case(u: &mut Unstructured) -> Result<Case> {
    let page = size(u, 20)?;
    let num_slots = size(u, 64)?;
    let num_tokens = size(u, 64)?;
    let i32_slots = u.arbitrary()?;
    let n = u.int_in_range(0usize..=64)?;
    let mut slots = Vec::with_capacity(n);
    for _ in 0..n {
        let s = index(u, num_slots.min(1 << 16))?;
        slots.push(if i32_slots { s as i32 as i64 } else { s });
    }
    let m = u.int_in_range(0usize..=32)?;
    let mut slices = Vec::with_capacity(m);
    for _ in 0..m {
        let i32_index = |u: &mut Unstructured, hint| -> Result<i32> {
            Ok(index(u, hint)?.clamp(i32::MIN as i64, i32::MAX as i64) as i32)
        };
        slices.push(Slice {
            cache_start: i32_index(u, num_slots.min(1 << 16))?,
            new_kv_start: i32_index(u, num_tokens.min(1 << 16))?,
            len: i32_index(u, page.min(1 << 16))?,
        });
    }
    let padded = match u.int_in_range(0u8..=7)? {
        0 => size(u, 64)?,
        k => m + k as usize - 1,
    };
    Ok(Case {
        slots,
        i32_slots,
        page,
        num_slots,
        num_tokens,
        slices,
        padded,
    })
}

fn check_validate_slots(c: &Case) {
    let got = if c.i32_slots {
        let s: Vec<i32> = c.slots.iter().map(|&s| s as i32).collect();
        validate_slots(&s, c.num_slots)
    } else {
        validate_slots(&c.slots, c.num_slots)
    };
    let oor = c
        .slots
        .iter()
        .position(|&s| s >= 0 && s as u64 >= c.num_slots as u64);
    let mut live: Vec<i64> = c.slots.iter().copied().filter(|&s| s >= 0).collect();
    live.sort_unstable();
    let dup = live.windows(2).any(|w| w[0] == w[1]);
    match got {
        Ok(()) => assert!(
            oor.is_none() && !dup,
            "validate_slots accepted {:?}",
            c.slots
        ),
        Err(Error::IndexOutOfRange {
            name: "slots",
            at,
            value,
            limit,
        }) => {
            assert_eq!(Some(at), oor, "first out-of-range slot");
            assert_eq!((value, limit), (c.slots[at], c.num_slots as u64));
        }
        Err(Error::Overlap {
            name: "slots",
            first,
            second,
        }) => {
            assert!(oor.is_none() && first < second && c.slots[first] == c.slots[second]);
            assert!(c.slots[first] >= 0);
        }
        Err(e) => panic!("validate_slots: unexpected {e:?}"),
    }
}

fn check_slots_to_slices(c: &Case) -> Option<Vec<Slice>> {
    let got = if c.i32_slots {
        let s: Vec<i32> = c.slots.iter().map(|&s| s as i32).collect();
        slots_to_slices(&s, c.page)
    } else {
        slots_to_slices(&c.slots, c.page)
    };
    if c.page == 0 || c.page > i32::MAX as usize {
        assert!(matches!(
            got,
            Err(Error::InvalidArgument {
                name: "page_size",
                ..
            })
        ));
        return None;
    }
    if let Some(at) = c.slots.iter().position(|&s| s > i32::MAX as i64) {
        assert_eq!(
            got,
            Err(Error::IndexOutOfRange {
                name: "slots",
                at,
                value: c.slots[at],
                limit: i32::MAX as u64 + 1
            })
        );
        return None;
    }
    let slices = got.expect("slots_to_slices");
    let page = c.page as i64;
    let mut covered = Vec::new();
    for s in &slices {
        let (start, from, len) = (s.cache_start as i64, s.new_kv_start as i64, s.len as i64);
        assert!(len >= 1 && len <= page && start >= 0 && from >= 0, "{s:?}");
        assert_eq!(
            start / page,
            (start + len - 1) / page,
            "{s:?} crosses a page"
        );
        covered.extend((0..len).map(|r| (from + r, start + r)));
    }
    covered.sort_unstable();
    let want: Vec<(i64, i64)> = (0..)
        .zip(c.slots.iter().copied())
        .filter(|p| p.1 >= 0)
        .collect();
    assert_eq!(covered, want, "slots_to_slices coverage");
    Some(slices)
}

fn check_table(slices: &[Slice], padded: usize) {
    if padded > slices.len() + (1 << 16) {
        // A huge table is the caller's choice; only the overflow check is exercised here.
        if padded > usize::MAX / 3 {
            assert_eq!(
                slices_to_table(slices, padded),
                Err(Error::Overflow { name: "padded" })
            );
        }
        return;
    }
    match slices_to_table(slices, padded) {
        Ok(t) => {
            assert!(padded >= slices.len());
            assert_eq!(t.len(), 3 * padded);
            for i in 0..padded {
                let s = slices.get(i).copied().unwrap_or_default();
                assert_eq!(
                    (t[i], t[padded + i], t[2 * padded + i]),
                    (s.cache_start, s.new_kv_start, s.len)
                );
            }
        }
        Err(Error::InvalidArgument { name: "padded", .. }) => assert!(padded < slices.len()),
        Err(e) => panic!("slices_to_table: unexpected {e:?}"),
    }
}

fn check_validate_slices(slices: &[Slice], page: usize, num_slots: usize, num_tokens: usize) {
    let got = validate_slices(slices, page, num_slots, num_tokens);
    if page == 0 || page > i32::MAX as usize {
        assert!(matches!(
            got,
            Err(Error::InvalidArgument {
                name: "page_size",
                ..
            })
        ));
        return;
    }
    let bad = slices
        .iter()
        .position(|s| s.len != 0 && !slice_copied(s, page, num_slots, num_tokens));
    match got {
        Ok(()) => {
            assert!(
                bad.is_none(),
                "validate_slices accepted {:?}",
                slices[bad.unwrap()]
            );
            let mut r: Vec<(i64, i64)> = slices
                .iter()
                .filter(|s| s.len != 0)
                .map(|s| (s.cache_start as i64, s.cache_start as i64 + s.len as i64))
                .collect();
            r.sort_unstable();
            assert!(
                r.windows(2).all(|w| w[0].1 <= w[1].0),
                "accepted overlapping slices"
            );
        }
        Err(Error::IndexOutOfRange {
            name: "slices", at, ..
        }) => assert_eq!(Some(at), bad),
        Err(Error::InvalidArgument { name: "slices", .. }) => {
            let what = format!("validate_slices({slices:?}, {page}, {num_slots}, {num_tokens})");
            let s = slices[bad.unwrap_or_else(|| panic!("{what}: refused, no bad slice"))];
            let (start, len) = (s.cache_start as i64, s.len as i64);
            assert!(
                len > 0 && start / page as i64 != (start + len - 1) / page as i64,
                "{what}: {s:?} refused as crossing a page"
            );
        }
        Err(Error::Overlap {
            name: "slices",
            first,
            second,
        }) => {
            assert!(bad.is_none());
            let (a, b) = (slices[first], slices[second]);
            let (a0, a1) = (a.cache_start as i64, a.cache_start as i64 + a.len as i64);
            let (b0, b1) = (b.cache_start as i64, b.cache_start as i64 + b.len as i64);
            assert!(first != second && a.len > 0 && b.len > 0 && a0 < b1 && b0 < a1);
        }
        Err(e) => panic!("validate_slices: unexpected {e:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(c) = case(&mut u) else { return };
    check_validate_slots(&c);
    if let Some(planned) = check_slots_to_slices(&c) {
        check_table(&planned, c.padded);
        let tokens = c.slots.len();
        // Planned from in-range, distinct slots, the slices are valid and disjoint.
        let s: Vec<i64> = c.slots.clone();
        let fine = s.iter().all(|&x| x < 0 || (x as u64) < c.num_slots as u64) && {
            let mut l: Vec<i64> = s.iter().copied().filter(|&x| x >= 0).collect();
            l.sort_unstable();
            l.windows(2).all(|w| w[0] != w[1])
        };
        if fine {
            assert_eq!(
                validate_slices(&planned, c.page, c.num_slots, tokens),
                Ok(())
            );
        }
    }
    check_table(&c.slices, c.padded);
    check_validate_slices(&c.slices, c.page, c.num_slots, c.num_tokens);
});
