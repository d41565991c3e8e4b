//! Index lists held in host memory: turned into slices, or checked by the kernels' own rules
//! (`kvio_kernels::index`) before the caller uploads them.

use kvio_kernels::index::{slice_fault, slot_target, SliceFault, SlotTarget};

use crate::error::{invalid, Error, Result};

/// One slice of the slice-based update: `len` rows of the new K/V starting at token
/// `new_kv_start` go to cache slots `cache_start..cache_start + len` (inside one page).
///
/// ```
/// use kvio::plan::Slice;
/// let s = Slice { cache_start: 32, new_kv_start: 0, len: 16 }; // a whole page of 16 slots
/// assert_eq!(Slice::default().len, 0); // padding
/// # let _ = s;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slice {
    /// First cache slot.
    pub cache_start: i32,
    /// First token of the new K/V.
    pub new_kv_start: i32,
    /// Number of rows; 0 marks padding.
    pub len: i32,
}

/// A slot index type: `i32` or `i64`.
pub trait SlotIndex: Copy {
    /// The slot as `i64`.
    fn to_i64(self) -> i64;
}

impl SlotIndex for i32 {
    fn to_i64(self) -> i64 {
        self as i64
    }
}

impl SlotIndex for i64 {
    fn to_i64(self) -> i64 {
        self
    }
}

/// The fewest slices that write token `t` to slot `slots[t]` for every `t` with a
/// non-negative slot: runs of consecutive tokens going to consecutive slots of one page.
///
/// ```
/// use kvio::plan::{slots_to_slices, Slice};
/// let s = slots_to_slices(&[4i64, 5, 6, 7, 8, -1, 20], 8).unwrap();
/// assert_eq!(s, vec![
///     Slice { cache_start: 4, new_kv_start: 0, len: 4 },
///     Slice { cache_start: 8, new_kv_start: 4, len: 1 },
///     Slice { cache_start: 20, new_kv_start: 6, len: 1 },
/// ]);
/// ```
pub fn slots_to_slices<S: SlotIndex>(slots: &[S], page_size: usize) -> Result<Vec<Slice>> {
    if page_size == 0 || page_size > i32::MAX as usize {
        return Err(invalid("page_size", page_size, "must be in 1..=i32::MAX"));
    }
    if slots.len() > i32::MAX as usize {
        return Err(invalid("slots", slots.len(), "more than i32::MAX tokens"));
    }
    let page = page_size as i64;
    let mut out: Vec<Slice> = Vec::new();
    let mut prev: Option<(usize, i64)> = None; // (token, slot) of the last kept token
    for (t, s) in slots.iter().enumerate() {
        let s = s.to_i64();
        if s < 0 {
            prev = None;
            continue;
        }
        if s > i32::MAX as i64 {
            return Err(Error::IndexOutOfRange {
                name: "slots",
                at: t,
                value: s,
                limit: i32::MAX as u64 + 1,
            });
        }
        let extends = matches!(prev, Some((pt, ps)) if pt + 1 == t && ps + 1 == s && s % page != 0);
        match out.last_mut() {
            Some(last) if extends => last.len += 1,
            _ => out.push(Slice {
                cache_start: s as i32,
                new_kv_start: t as i32,
                len: 1,
            }),
        }
        prev = Some((t, s));
    }
    Ok(out)
}

/// Packs slices into vLLM's `[3, padded]` struct-of-arrays `i32` table (padding entries are
/// zero, i.e. `len == 0`).
///
/// ```
/// use kvio::plan::{slices_to_table, Slice};
/// let s = [Slice { cache_start: 4, new_kv_start: 0, len: 2 }, Slice { cache_start: 9, new_kv_start: 2, len: 1 }];
/// assert_eq!(slices_to_table(&s, 3).unwrap(), vec![4, 9, 0, 0, 2, 0, 2, 1, 0]);
/// ```
pub fn slices_to_table(slices: &[Slice], padded: usize) -> Result<Vec<i32>> {
    if slices.len() > padded {
        return Err(invalid("padded", padded, "fewer entries than slices"));
    }
    let mut t = vec![
        0i32;
        padded
            .checked_mul(3)
            .ok_or(Error::Overflow { name: "padded" })?
    ];
    for (i, s) in slices.iter().enumerate() {
        t[i] = s.cache_start;
        t[padded + i] = s.new_kv_start;
        t[2 * padded + i] = s.len;
    }
    Ok(t)
}

/// Checks host-held slots: each is negative (skip) or `< num_slots`, and no slot is written
/// twice (two tokens racing for one slot).
///
/// ```
/// use kvio::plan::validate_slots;
/// assert!(validate_slots(&[3i64, -1, 7], 8).is_ok());
/// assert!(validate_slots(&[3i64, 8], 8).is_err()); // past the cache
/// assert!(validate_slots(&[3i32, 3], 8).is_err()); // slot 3 written twice
/// ```
pub fn validate_slots<S: SlotIndex>(slots: &[S], num_slots: usize) -> Result<()> {
    let mut seen: Vec<(i64, usize)> = Vec::with_capacity(slots.len());
    for (t, s) in slots.iter().enumerate() {
        let s = s.to_i64();
        // The kernel's rule, on a cache seen as `num_slots` blocks of one slot.
        match slot_target(s, 1, num_slots as u64) {
            SlotTarget::Skip => {}
            SlotTarget::OutOfRange => {
                return Err(Error::IndexOutOfRange {
                    name: "slots",
                    at: t,
                    value: s,
                    limit: num_slots as u64,
                })
            }
            SlotTarget::At { .. } => seen.push((s, t)),
        }
    }
    seen.sort_unstable();
    for w in seen.windows(2) {
        if w[0].0 == w[1].0 {
            return Err(Error::Overlap {
                name: "slots",
                first: w[0].1,
                second: w[1].1,
            });
        }
    }
    Ok(())
}

/// Checks host-held slices the way the kernel does (`0 ≤ len ≤ page_size`, inside the cache
/// and the source, one page) and also that no two slices write the same cache slot.
///
/// ```
/// use kvio::plan::{validate_slices, Slice};
/// let ok = [Slice { cache_start: 0, new_kv_start: 0, len: 4 }, Slice::default()];
/// assert!(validate_slices(&ok, 4, 16, 4).is_ok());
/// let crosses = [Slice { cache_start: 2, new_kv_start: 0, len: 4 }]; // pages 0 and 1
/// assert!(validate_slices(&crosses, 4, 16, 4).is_err());
/// ```
pub fn validate_slices(
    slices: &[Slice],
    page_size: usize,
    num_slots: usize,
    num_tokens: usize,
) -> Result<()> {
    if page_size == 0 || page_size > i32::MAX as usize {
        return Err(invalid("page_size", page_size, "must be in 1..=i32::MAX"));
    }
    let mut ranges = Vec::with_capacity(slices.len());
    for (i, s) in slices.iter().enumerate() {
        let bad = |value: i64, limit: u64| Error::IndexOutOfRange {
            name: "slices",
            at: i,
            value,
            limit,
        };
        if s.len == 0 {
            continue;
        }
        let (start, src, len) = (s.cache_start as i64, s.new_kv_start as i64, s.len as i64);
        // The kernel's rule (`index::slice_fault`), with the failed check named.
        let fault = slice_fault(
            s.cache_start,
            s.new_kv_start,
            s.len,
            page_size as u32,
            num_slots as u64,
            num_tokens as u64,
        );
        match fault {
            None => {}
            Some(SliceFault::Length) => return Err(bad(len, page_size as u64 + 1)),
            Some(SliceFault::CacheRange) => return Err(bad(start, num_slots as u64)),
            Some(SliceFault::SourceRange) => return Err(bad(src, num_tokens as u64)),
            Some(SliceFault::CrossesPage) => {
                return Err(invalid("slices", (i, *s), "crosses a page boundary"))
            }
        }
        ranges.push((start, start + len, i));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(Error::Overlap {
                name: "slices",
                first: w[0].2,
                second: w[1].2,
            });
        }
    }
    Ok(())
}
