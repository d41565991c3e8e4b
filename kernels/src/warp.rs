//! Exchanges between the lanes of a warp: an 8 × 8 transpose of 2-byte elements across the
//! eight lanes of an octet (eight consecutive lanes from a multiple of 8), in three butterfly
//! steps.
//!
//! Lane `i` of an octet starts with row `i` (eight 2-byte elements, packed two a word, element
//! `2k` in the low half of word `k`) and ends with column `i`: element `i` of rows `0 .. 7`,
//! packed the same way. Each step `s` swaps half of what a lane holds with the lane whose
//! index differs in bit `2 - s` ([`MASKS`]): [`send`] gives the two words a lane passes over,
//! [`take`] what it holds after receiving its partner's two. The GPU moves the words with
//! `shfl.sync.bfly` (`transpose`, compiled for the GPU only); the CPU tests move them between
//! the octet's eight arrays, so both run the same [`send`] and [`take`].
//!
//! The same transpose of 1-byte elements (eight bytes a row, two words, byte `k` of word `w`
//! being element `4w + k`): [`send_bytes`], [`take_bytes`] and `transpose_bytes`, three steps
//! of one word each.

use crate::tile::prmt;

/// The lane-index bit each butterfly step exchanges across (`1 << (2 - step)`).
pub const MASKS: [u32; 3] = [4, 2, 1];

/// Low halves of `a` and `b`: `a.lo | b.lo << 16`.
#[inline(always)]
fn lo_lo(a: u32, b: u32) -> u32 {
    (a & 0xffff) | (b << 16)
}

/// High halves of `a` and `b`: `a.hi | b.hi << 16`.
#[inline(always)]
fn hi_hi(a: u32, b: u32) -> u32 {
    (a >> 16) | (b & 0xffff_0000)
}

/// `a.lo | b.hi << 16`.
#[inline(always)]
fn lo_hi(a: u32, b: u32) -> u32 {
    (a & 0xffff) | (b & 0xffff_0000)
}

/// The two words the lane of octet index `i` passes to its partner in step `step` of the
/// transpose, holding `w`.
#[inline(always)]
pub fn send(step: usize, i: u32, w: &[u32; 4]) -> [u32; 2] {
    let b = i & MASKS[step] != 0;
    match step {
        // Columns 4..7 of its row go to the lane that keeps them (or 0..3, from the upper half).
        0 => {
            if b {
                [w[0], w[1]]
            } else {
                [w[2], w[3]]
            }
        }
        // The column pair of each of its two rows that the partner keeps.
        1 => {
            if b {
                [w[0], w[2]]
            } else {
                [w[1], w[3]]
            }
        }
        // The partner's column of each of its four rows, two rows a word.
        _ => {
            if b {
                [lo_lo(w[0], w[1]), lo_lo(w[2], w[3])]
            } else {
                [hi_hi(w[0], w[1]), hi_hi(w[2], w[3])]
            }
        }
    }
}

/// What the lane of octet index `i` holds after step `step`, having held `w` and received `r`
/// (its partner's [`send`]).
///
/// After step 0 a lane holds a 2 × 4 block (rows `i & 3` and `(i & 3) | 4`, its half of the
/// columns: two words each); after step 1 a 4 × 2 block (rows `i & 1`, `+ 2`, `+ 4`, `+ 6`,
/// one word each: its column pair); after step 2 its column, rows 0..7.
#[inline(always)]
pub fn take(step: usize, i: u32, w: &[u32; 4], r: [u32; 2]) -> [u32; 4] {
    let b = i & MASKS[step] != 0;
    match step {
        0 => {
            if b {
                [r[0], r[1], w[2], w[3]]
            } else {
                [w[0], w[1], r[0], r[1]]
            }
        }
        1 => {
            if b {
                [r[0], w[1], r[1], w[3]]
            } else {
                [w[0], r[0], w[2], r[1]]
            }
        }
        _ => {
            if b {
                [
                    lo_hi(r[0], w[0]),
                    hi_hi(r[0], w[1]),
                    lo_hi(r[1], w[2]),
                    hi_hi(r[1], w[3]),
                ]
            } else {
                [
                    lo_lo(w[0], r[0]),
                    lo_hi(w[1], r[0]),
                    lo_lo(w[2], r[1]),
                    lo_hi(w[3], r[1]),
                ]
            }
        }
    }
}

/// The word the lane of octet index `i` passes to its partner in step `step` of the byte
/// transpose, holding `w`.
///
/// Before step 0 a lane holds its row (bytes 0..3 in `w[0]`, 4..7 in `w[1]`); after step 0 a
/// 2 × 4 block (rows `i & 3` and `(i & 3) | 4`, its half of the columns: a word each); after
/// step 1 a 4 × 2 block (rows `i & 1`, `+ 2` in `w[0]`, `+ 4`, `+ 6` in `w[1]`, two bytes
/// each: its column pair); after step 2 its column, rows 0..3 in `w[0]` and 4..7 in `w[1]`.
#[inline(always)]
pub fn send_bytes(step: usize, i: u32, w: &[u32; 2]) -> u32 {
    let b = i & MASKS[step] != 0;
    match step {
        // The half of its row the partner keeps.
        0 => {
            if b {
                w[0]
            } else {
                w[1]
            }
        }
        // The column pair of each of its two rows that the partner keeps.
        1 => {
            if b {
                prmt(w[0], w[1], 0x5410)
            } else {
                prmt(w[0], w[1], 0x7632)
            }
        }
        // The partner's column of each of its four rows.
        _ => {
            if b {
                prmt(w[0], w[1], 0x6420)
            } else {
                prmt(w[0], w[1], 0x7531)
            }
        }
    }
}

/// What the lane of octet index `i` holds after step `step` of the byte transpose, having held
/// `w` and received `r` (its partner's [`send_bytes`]).
#[inline(always)]
pub fn take_bytes(step: usize, i: u32, w: &[u32; 2], r: u32) -> [u32; 2] {
    let b = i & MASKS[step] != 0;
    match step {
        0 => {
            if b {
                [r, w[1]]
            } else {
                [w[0], r]
            }
        }
        1 => {
            if b {
                [prmt(r, w[0], 0x7610), prmt(r, w[1], 0x7632)]
            } else {
                [prmt(w[0], r, 0x5410), prmt(w[1], r, 0x7610)]
            }
        }
        _ => {
            if b {
                [prmt(r, w[0], 0x7150), prmt(r, w[1], 0x7352)]
            } else {
                [prmt(w[0], r, 0x5240), prmt(w[1], r, 0x7260)]
            }
        }
    }
}

/// A whole-warp `shfl.sync` of one mode: `$name(v, b)` returns the value `v` of the lane that
/// mode `$mode` picks with operand `b`.
macro_rules! shfl {
    ($(#[$doc:meta])* $name:ident, $mode:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// Every lane of the warp executes it together.
        #[cfg(target_arch = "nvptx64")]
        #[inline(always)]
        pub unsafe fn $name(v: u32, b: u32) -> u32 {
            let r: u32;
            // SAFETY: register operands; every lane of the warp is here (caller).
            unsafe {
                core::arch::asm!(
                    concat!("shfl.sync.", $mode, ".b32 {r}, {v}, {b}, 0x1f, 0xffffffff;"),
                    r = out(reg32) r,
                    v = in(reg32) v,
                    b = in(reg32) b,
                    options(nostack, nomem)
                )
            };
            r
        }
    };
}

shfl!(
    /// `shfl.sync.bfly.b32`: the value `v` of lane `lane ^ b`.
    shfl_xor,
    "bfly"
);
shfl!(
    /// `shfl.sync.idx.b32`: the value `v` of lane `b`.
    shfl_idx,
    "idx"
);

/// The 8 × 8 transpose of this lane's row `w` across its octet (lanes `lane & !7 ..`), `i`
/// being `lane & 7` (see the module docs).
///
/// # Safety
/// Every lane of the warp executes it together.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn transpose(i: u32, w: [u32; 4]) -> [u32; 4] {
    // Three steps written out: constant steps, so each compiles to its own selects.
    // SAFETY (all three): forwarded (every lane runs the same steps).
    let w = unsafe { step::<0>(i, w) };
    let w = unsafe { step::<1>(i, w) };
    unsafe { step::<2>(i, w) }
}

/// Step `S` of `transpose`.
///
/// # Safety
/// Every lane of the warp executes it together.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn step<const S: usize>(i: u32, w: [u32; 4]) -> [u32; 4] {
    let out = send(S, i, &w);
    // SAFETY: forwarded.
    let r = unsafe { [shfl_xor(out[0], MASKS[S]), shfl_xor(out[1], MASKS[S])] };
    take(S, i, &w, r)
}

/// The 8 × 8 transpose of this lane's row of bytes `w` across its octet (see
/// [`send_bytes`]), `i` being `lane & 7`.
///
/// # Safety
/// Every lane of the warp executes it together.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn transpose_bytes(i: u32, w: [u32; 2]) -> [u32; 2] {
    // SAFETY (all three): forwarded (every lane runs the same steps).
    let w = unsafe { step_bytes::<0>(i, w) };
    let w = unsafe { step_bytes::<1>(i, w) };
    unsafe { step_bytes::<2>(i, w) }
}

/// Step `S` of `transpose_bytes`.
///
/// # Safety
/// Every lane of the warp executes it together.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn step_bytes<const S: usize>(i: u32, w: [u32; 2]) -> [u32; 2] {
    // SAFETY: forwarded.
    let r = unsafe { shfl_xor(send_bytes(S, i, &w), MASKS[S]) };
    take_bytes(S, i, &w, r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A xorshift32 stream from `x` (non-zero).
    fn xorshift(mut x: u32) -> impl FnMut() -> u32 {
        move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        }
    }

    /// The transpose of an octet's rows with the steps' exchanges done between arrays.
    fn transpose_octet(rows: [[u32; 4]; 8]) -> [[u32; 4]; 8] {
        let mut w = rows;
        for s in 0..3 {
            let out: [[u32; 2]; 8] = core::array::from_fn(|l| send(s, l as u32, &w[l]));
            w = core::array::from_fn(|l| take(s, l as u32, &w[l], out[l ^ MASKS[s] as usize]));
        }
        w
    }

    fn elem(w: &[u32; 4], c: usize) -> u16 {
        (w[c / 2] >> (16 * (c % 2))) as u16
    }

    #[test]
    fn octet_rows_become_columns() {
        let mut next = xorshift(0x9e37_79b9);
        for _ in 0..64 {
            let rows: [[u32; 4]; 8] = core::array::from_fn(|_| core::array::from_fn(|_| next()));
            let cols = transpose_octet(rows);
            for (i, col) in cols.iter().enumerate() {
                for (r, row) in rows.iter().enumerate() {
                    assert_eq!(elem(col, r), elem(row, i), "lane {i}, row {r}");
                }
            }
            // An involution: twice gives the rows back.
            assert_eq!(transpose_octet(cols), rows);
        }
    }

    /// [`transpose_octet`] for rows of bytes.
    fn transpose_octet_bytes(rows: [[u32; 2]; 8]) -> [[u32; 2]; 8] {
        let mut w = rows;
        for s in 0..3 {
            let out: [u32; 8] = core::array::from_fn(|l| send_bytes(s, l as u32, &w[l]));
            w = core::array::from_fn(|l| {
                take_bytes(s, l as u32, &w[l], out[l ^ MASKS[s] as usize])
            });
        }
        w
    }

    fn byte(w: &[u32; 2], c: usize) -> u8 {
        (w[c / 4] >> (8 * (c % 4))) as u8
    }

    #[test]
    fn octet_rows_of_bytes_become_columns() {
        let mut next = xorshift(0x2545_f491);
        for _ in 0..64 {
            let rows: [[u32; 2]; 8] = core::array::from_fn(|_| core::array::from_fn(|_| next()));
            let cols = transpose_octet_bytes(rows);
            for (i, col) in cols.iter().enumerate() {
                for (r, row) in rows.iter().enumerate() {
                    assert_eq!(byte(col, r), byte(row, i), "lane {i}, row {r}");
                }
            }
            assert_eq!(transpose_octet_bytes(cols), rows);
        }
    }
}
