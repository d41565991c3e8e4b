//! Token tiles: eight tokens' eight-element groups held in registers, so a cache layout that
//! splits a head vector into narrow pieces (vLLM's v0 paged layout: K in 16-byte pieces `bs`
//! slots apart, V transposed with one element per piece) is written with wide stores. A
//! thread loads the eight rows (one 8-element group of one head for eight consecutive input
//! tokens), converts them if the cache is fp8, and stores them either row by row at each
//! token's slot, or, when the eight tokens fill eight aligned consecutive slots of one block
//! and the layout has one element per piece, as eight transposed columns of eight elements.
//!
//! A row is `[u32; 8]`: the group's eight cache elements of `E` bytes in little-endian order
//! (`E = 1` uses words 0..2, `E = 2` words 0..4, `E = 4` all eight). Every index into a row is
//! a compile-time constant once the fixed-count loops are unrolled, so rows stay in registers.

use core::ptr::{read, write};

use crate::convert;
use crate::fp8::Divider;
use crate::span::V16;

/// Tokens (and elements) in a tile's side.
pub const TILE: usize = 8;

/// Eight cache elements of `E` bytes.
pub type Row = [u32; 8];

/// Element `j` of a row.
#[inline(always)]
pub fn get<const E: usize>(row: &Row, j: usize) -> u32 {
    match E {
        1 => (row[j / 4] >> (8 * (j % 4))) & 0xff,
        2 => (row[j / 2] >> (16 * (j % 2))) & 0xffff,
        _ => row[j],
    }
}

/// Ors element `j` (already masked to `E` bytes) into a row whose element `j` is zero.
#[inline(always)]
fn put<const E: usize>(row: &mut Row, j: usize, v: u32) {
    match E {
        1 => row[j / 4] |= v << (8 * (j % 4)),
        2 => row[j / 2] |= v << (16 * (j % 2)),
        _ => row[j] = v,
    }
}

/// `prmt.b32`: byte `k` of the result is byte `sel >> 4k & 7` of the eight bytes `b:a`
/// (`a` bytes 0..4, `b` bytes 4..8). One instruction on the GPU (the shifts, masks and ors it
/// replaces were most of a tile's instructions).
#[inline(always)]
pub fn prmt(a: u32, b: u32, sel: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let d: u32;
        // SAFETY: a pure register operation.
        unsafe {
            core::arch::asm!(
                "prmt.b32 {d}, {a}, {b}, {s};",
                d = out(reg32) d,
                a = in(reg32) a,
                b = in(reg32) b,
                s = in(reg32) sel,
                options(pure, nomem, nostack)
            )
        };
        d
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        let x = (a as u64) | ((b as u64) << 32);
        let mut d = 0u32;
        for k in 0..4 {
            let n = (sel >> (4 * k)) & 7;
            d |= (((x >> (8 * n)) & 0xff) as u32) << (8 * k);
        }
        d
    }
}

/// The transposed column `j` of eight rows: element `i` is element `j` of row `i`. Built with
/// [`prmt`]: four instructions for 2-byte elements, six for 1-byte ones, none for 4-byte ones.
#[inline(always)]
pub fn column<const E: usize>(rows: &[Row; TILE], j: usize) -> Row {
    let mut col = [0u32; 8];
    match E {
        1 => {
            // Byte j % 4 of word j / 4 of four rows, two rows a step.
            let (w, b) = (j / 4, (j % 4) as u32);
            let sel = b | (4 + b) << 4;
            let mut k = 0;
            while k < 2 {
                let lo = prmt(rows[4 * k][w], rows[4 * k + 1][w], sel);
                let hi = prmt(rows[4 * k + 2][w], rows[4 * k + 3][w], sel);
                col[k] = prmt(lo, hi, 0x5410);
                k += 1;
            }
        }
        2 => {
            // Half j % 2 of word j / 2 of two rows.
            let (w, sel) = (j / 2, if j.is_multiple_of(2) { 0x5410 } else { 0x7632 });
            let mut k = 0;
            while k < 4 {
                col[k] = prmt(rows[2 * k][w], rows[2 * k + 1][w], sel);
                k += 1;
            }
        }
        _ => {
            unroll8!(i => {
                col[i] = rows[i][j];
            });
        }
    }
    col
}

/// Element `j` of two rows of 2-byte elements packed into one word (row 0 in the low half):
/// two consecutive tokens' element `j` as a transposed line stores them. One [`prmt`].
#[inline(always)]
pub fn pair_column(rows: &[Row; 2], j: usize) -> u32 {
    let sel = if j.is_multiple_of(2) { 0x5410 } else { 0x7632 };
    prmt(rows[0][j / 2], rows[1][j / 2], sel)
}

/// Four rows of eight fp8 bytes (little-endian, element 0 first) transposed: word `j` holds
/// element `j` of rows 0..4 (row 0 in the low byte), as a v0 value line of fp8 holds four
/// consecutive tokens' element. Sixteen [`prmt`]s: each pair of rows is interleaved byte by
/// byte, then the pairs' halves are joined.
#[inline(always)]
pub fn transpose4(rows: &[u64; 4]) -> [u32; 8] {
    let mut out = [0u32; 8];
    unroll2!(w => {
        let word = |r: u64| (r >> (32 * w)) as u32;
        let (r0, r1, r2, r3) = (word(rows[0]), word(rows[1]), word(rows[2]), word(rows[3]));
        // Bytes 0, 1 (then 2, 3) of two rows, interleaved.
        let (a, b) = (prmt(r0, r1, 0x5140), prmt(r0, r1, 0x7362));
        let (c, d) = (prmt(r2, r3, 0x5140), prmt(r2, r3, 0x7362));
        out[4 * w] = prmt(a, c, 0x5410);
        out[4 * w + 1] = prmt(a, c, 0x7632);
        out[4 * w + 2] = prmt(b, d, 0x5410);
        out[4 * w + 3] = prmt(b, d, 0x7632);
    });
    out
}

/// Sixteen bytes at `p` (global memory: every source kvio loads a group from), on sm_90 as
/// `ld.global.L2::256B` (on a miss L2 fetches the 256 bytes around them).
///
/// # Safety
/// `p` readable and 16-byte aligned, in global memory.
#[inline(always)]
unsafe fn read16(p: *const V16) -> V16 {
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
    // SAFETY: the caller's.
    let v = V16::from_array(unsafe { ld_v4!("ld.global.L2::256B.v4.b32", reg64 p) });
    #[cfg(not(all(target_arch = "nvptx64", target_feature = "sm_90")))]
    // SAFETY: the caller's.
    let v = unsafe { read(p) };
    v
}

/// Loads eight elements of `E` bytes (copied as they are), `step` elements apart: vector
/// accesses when `vec` (`step == 1`, `src` aligned to `min(8E, 16)` bytes), else one access per
/// element.
///
/// # Safety
/// Elements `0, step, .., 7 * step` at `src` readable, aligned for `E`-byte elements (and as
/// above with `vec`).
#[inline(always)]
pub unsafe fn load_copy<const E: usize>(src: *const u8, vec: bool, step: usize) -> Row {
    let mut row = [0u32; 8];
    // SAFETY: forwarded from the caller; each access stays inside the 8E bytes.
    unsafe {
        if vec {
            match E {
                1 => {
                    let v = read(src as *const u64);
                    row[0] = v as u32;
                    row[1] = (v >> 32) as u32;
                }
                2 => {
                    let v = read16(src as *const V16).to_array();
                    // Word by word, not copy_from_slice: LLVM lowered that slice copy of the
                    // last of eight rows into three narrower loads.
                    row[0] = v[0];
                    row[1] = v[1];
                    row[2] = v[2];
                    row[3] = v[3];
                }
                _ => {
                    let v = read16(src as *const V16).to_array();
                    let w = read16((src as *const V16).add(1)).to_array();
                    row = [v[0], v[1], v[2], v[3], w[0], w[1], w[2], w[3]];
                }
            }
        } else {
            unroll8!(j => {
                let v = match E {
                    1 => read(src.add(j * step)) as u32,
                    2 => read((src as *const u16).add(j * step)) as u32,
                    _ => read((src as *const u32).add(j * step)),
                };
                put::<E>(&mut row, j, v);
            });
        }
    }
    row
}

/// Loads eight source elements of conversion `code`, `step` elements apart, and quantizes them
/// to fp8 with `scale` (one byte each, `E = 1`): vector accesses when `vec` (`step == 1`, `src`
/// 16-byte aligned), else one access per element.
///
/// # Safety
/// `src` holds source elements `0, step, .., 7 * step` of `code`'s type, aligned for it (16
/// bytes with `vec`).
#[inline(always)]
pub unsafe fn load_convert(
    src: *const u8,
    vec: bool,
    step: usize,
    code: u32,
    div: &Divider,
) -> Row {
    // SAFETY: forwarded from the caller.
    let x = unsafe {
        if vec {
            // Plain (not volatile) loads: nothing is looked up between them and their use.
            let p = src as *const V16;
            let raw = if code & 0xf == convert::SRC_F32 {
                [read16(p), read16(p.add(1))]
            } else {
                [read16(p), V16::splat(0)]
            };
            convert::widen(&raw, code)
        } else {
            let mut x = [0f32; 8];
            unroll8!(j => {
                x[j] = convert::load(src, (j * step) as u64, code);
            });
            x
        }
    };
    pack_row(&x, code, div)
}

/// Eight values quantized to fp8 with `div` as a row (`E = 1`).
#[inline(always)]
fn pack_row(x: &[f32; 8], code: u32, div: &Divider) -> Row {
    row_of(convert::pack8(x, convert::format(code), div))
}

/// Eight fp8 bytes (little-endian, element 0 first) as a row (`E = 1`).
#[inline(always)]
pub fn row_of(packed: u64) -> Row {
    let packed = u64::from_le(packed);
    let mut row = [0u32; 8];
    row[0] = packed as u32;
    row[1] = (packed >> 32) as u32;
    row
}

/// Stores elements `c..c + n` of a row (`n` = 8, 4 or 1 elements of `E` bytes; `c` a multiple
/// of `n`) at `dst`, with accesses of at most 16 bytes.
///
/// # Safety
/// `dst..dst + nE` writable and aligned to `min(nE, 16)` bytes.
#[inline(always)]
pub unsafe fn store<const E: usize>(dst: *mut u8, row: &Row, c: usize, n: usize) {
    // SAFETY: forwarded from the caller; word indices are below 8 for every (E, c, n) used.
    unsafe {
        if n == 1 {
            match E {
                1 => write(dst, get::<E>(row, c) as u8),
                2 => write(dst as *mut u16, get::<E>(row, c) as u16),
                _ => write(dst as *mut u32, get::<E>(row, c)),
            }
            return;
        }
        // n ≥ 4 elements of ≥ 1 byte starting at a multiple of n: whole words.
        let w0 = c * E / 4;
        match n * E {
            4 => write(dst as *mut u32, row[w0]),
            8 => write(
                dst as *mut u64,
                (row[w0] as u64) | ((row[w0 + 1] as u64) << 32),
            ),
            16 => write(
                dst as *mut V16,
                V16::from_array([row[w0], row[w0 + 1], row[w0 + 2], row[w0 + 3]]),
            ),
            _ => {
                // 32 bytes: a whole row of f32.
                let d = dst as *mut V16;
                write(d, V16::from_array([row[0], row[1], row[2], row[3]]));
                write(d.add(1), V16::from_array([row[4], row[5], row[6], row[7]]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_transpose_every_element_size() {
        let mut rows = [[0u32; 8]; 8];
        for (i, r) in rows.iter_mut().enumerate() {
            for (w, x) in r.iter_mut().enumerate() {
                *x = ((i * 8 + w) as u32).wrapping_mul(0x9E37_79B9);
            }
        }
        fn check<const E: usize>(rows: &[Row; 8]) {
            for j in 0..8 {
                let col = column::<E>(rows, j);
                for (i, row) in rows.iter().enumerate() {
                    assert_eq!(get::<E>(&col, i), get::<E>(row, j), "E {E} ({i}, {j})");
                }
            }
        }
        check::<1>(&rows);
        check::<2>(&rows);
        check::<4>(&rows);
    }

    #[test]
    fn transpose4_gathers_each_element_of_four_rows() {
        let rows: [u64; 4] =
            core::array::from_fn(|i| (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let cols = transpose4(&rows);
        for (j, col) in cols.iter().enumerate() {
            for (i, row) in rows.iter().enumerate() {
                let want = (row >> (8 * j)) as u8;
                assert_eq!((col >> (8 * i)) as u8, want, "element {j} of row {i}");
            }
        }
    }

    #[test]
    fn loads_and_stores_round_trip() {
        let src: [u8; 32] = core::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0x5a);
        let aligned: [V16; 2] = [
            V16::from_array(core::array::from_fn(|k| {
                u32::from_le_bytes(src[4 * k..4 * k + 4].try_into().unwrap())
            })),
            V16::from_array(core::array::from_fn(|k| {
                u32::from_le_bytes(src[16 + 4 * k..20 + 4 * k].try_into().unwrap())
            })),
        ];
        let p = aligned.as_ptr() as *const u8;
        fn each<const E: usize>(p: *const u8, src: &[u8; 32]) {
            for vec in [false, true] {
                // SAFETY: 32 readable bytes, 16-byte aligned.
                let row = unsafe { load_copy::<E>(p, vec, 1) };
                for n in [1usize, 4, 8] {
                    let mut out = [V16::splat(0); 2];
                    for c in (0..8).step_by(n) {
                        // SAFETY: 32 writable bytes, aligned; offset c*E + n*E <= 8E.
                        unsafe { store::<E>((out.as_mut_ptr() as *mut u8).add(c * E), &row, c, n) };
                    }
                    // SAFETY: plain bytes.
                    let got: [u8; 32] = unsafe { core::mem::transmute(out) };
                    assert_eq!(got[..8 * E], src[..8 * E], "E {E} n {n} vec {vec}");
                }
            }
        }
        each::<1>(p, &src);
        each::<2>(p, &src);
        each::<4>(p, &src);
    }
}
