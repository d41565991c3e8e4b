//! The span-copy core every kernel reuses: a group of lanes copies one contiguous span of
//! bytes with the widest naturally aligned accesses (up to 16 bytes), several loads in flight
//! per lane before the matching stores.

use core::ptr::{read, write};

/// One 16-byte access unit (a 4-lane vector, so the load is one `ld.global.v4`).
pub type V16 = core::simd::u32x4;

/// Copies `len` bytes from `src` to `dst` as lane `lane` of a group of `lanes`, using accesses
/// of `width` bytes (16, 8, 4, 2, anything else means 1). Lanes of a group touch disjoint
/// units; together they copy the whole span exactly once.
///
/// # Safety
/// `src..src+len` must be readable and `dst..dst+len` writable; `src`, `dst` and `len` must be
/// multiples of `width`; `lanes > 0`.
#[inline(always)]
pub unsafe fn copy_span(src: *const u8, dst: *mut u8, len: u64, lane: u64, lanes: u64, width: u32) {
    // SAFETY: forwarded from the caller; each arm divides `len` by the access size it uses.
    unsafe {
        match width {
            16 => copy_units(src as *const V16, dst as *mut V16, len >> 4, lane, lanes),
            8 => copy_units(src as *const u64, dst as *mut u64, len >> 3, lane, lanes),
            4 => copy_units(src as *const u32, dst as *mut u32, len >> 2, lane, lanes),
            2 => copy_units(src as *const u16, dst as *mut u16, len >> 1, lane, lanes),
            _ => copy_units(src, dst, len, lane, lanes),
        }
    }
}

/// Lane-strided copy of `n` values of `T`, four loads issued before their four stores.
///
/// # Safety
/// `src..src+n` readable, `dst..dst+n` writable, both aligned for `T`.
#[inline(always)]
unsafe fn copy_units<T: Copy>(src: *const T, dst: *mut T, n: u64, lane: u64, lanes: u64) {
    let mut i = lane;
    // SAFETY: every index used is < n (checked by the loop conditions).
    unsafe {
        while i + 3 * lanes < n {
            let a = read(src.add(i as usize));
            let b = read(src.add((i + lanes) as usize));
            let c = read(src.add((i + 2 * lanes) as usize));
            let d = read(src.add((i + 3 * lanes) as usize));
            write(dst.add(i as usize), a);
            write(dst.add((i + lanes) as usize), b);
            write(dst.add((i + 2 * lanes) as usize), c);
            write(dst.add((i + 3 * lanes) as usize), d);
            i += 4 * lanes;
        }
        while i < n {
            write(dst.add(i as usize), read(src.add(i as usize)));
            i += lanes;
        }
    }
}

/// Evaluates `$call::<T>($args)` with `T` the access type of width `$width` (16, 8, 4, 2 bytes,
/// anything else 1): a kernel body generic over [`Unit`] dispatched on the width once, at its
/// entry.
macro_rules! by_width {
    ($width:expr, $call:ident($($arg:expr),*)) => {
        match $width {
            16 => $call::<$crate::span::V16>($($arg),*),
            8 => $call::<u64>($($arg),*),
            4 => $call::<u32>($($arg),*),
            2 => $call::<u16>($($arg),*),
            _ => $call::<u8>($($arg),*),
        }
    };
}

pub(crate) use by_width;

/// Units (accesses of the copy's width) each lane holds per span in [`copy_spans`].
pub const BATCH_UNITS: u32 = 4;

/// A value one access copies: the access widths of [`copy_span`], and a pair of 16-byte
/// accesses (a vector unit of f32 elements that [`crate::convert`] turns into 8 fp8 bytes).
pub trait Unit: Copy {
    /// A value to initialise registers with (never stored).
    const ZERO: Self;

    /// Reads a value that nothing reads again soon ([`ONCE`]): on the GPU a 16-byte unit is
    /// one streaming load (`ld.global.cs`, evicted first from the caches); other units, and
    /// the CPU, read plainly.
    ///
    /// # Safety
    /// `p` readable and aligned for `Self`; on the GPU in the global state space (device or
    /// mapped host memory, not shared or local memory: the 16-byte unit's load is
    /// `ld.global`).
    #[inline(always)]
    unsafe fn read_once(p: *const Self) -> Self {
        // SAFETY: the caller's.
        unsafe { read(p) }
    }

    /// Writes a value that nothing reads again soon: on the GPU a 16-byte unit is one
    /// streaming store (`st.global.cs`); other units, and the CPU, write plainly.
    ///
    /// # Safety
    /// `p` writable and aligned for `Self`; on the GPU in the global state space (as for
    /// [`Unit::read_once`]).
    #[inline(always)]
    unsafe fn write_once(p: *mut Self, v: Self) {
        // SAFETY: the caller's.
        unsafe { write(p, v) }
    }
}
impl Unit for V16 {
    const ZERO: Self = V16::from_array([0; 4]);

    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn read_once(p: *const Self) -> Self {
        // SAFETY: `p` readable and 16-byte aligned (the caller's). `ld_v4!` keeps the load
        // where it is written, as a volatile read would be ([`load_round`]).
        V16::from_array(unsafe { ld_v4!("ld.global.cs.v4.b32", reg64 p) })
    }

    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn write_once(p: *mut Self, v: Self) {
        let w = v.to_array();
        // SAFETY: `p` writable and 16-byte aligned (the caller's).
        unsafe {
            core::arch::asm!(
                "st.global.cs.v4.b32 [{p}], {{{a}, {b}, {c}, {d}}};",
                p = in(reg64) p,
                a = in(reg32) w[0],
                b = in(reg32) w[1],
                c = in(reg32) w[2],
                d = in(reg32) w[3],
                options(nostack),
            );
        }
    }
}
impl Unit for u64 {
    const ZERO: Self = 0;
}
impl Unit for u32 {
    const ZERO: Self = 0;
}
impl Unit for u16 {
    const ZERO: Self = 0;
}
impl Unit for u8 {
    const ZERO: Self = 0;
}
impl Unit for [V16; 2] {
    const ZERO: Self = [V16::from_array([0; 4]); 2];
}

/// One round of a multi-span copy in registers: up to `P ≤` [`BATCH_UNITS`] values of each of
/// `B` spans ([`load_round`], [`store_round_map`]).
pub type Round<T, const B: usize, const P: usize> = [[T; P]; B];

/// [`load_round`]'s reads: plain.
pub const PLAIN: u8 = 0;
/// [`load_round`]'s reads: volatile, which keeps the compiler from sinking the loads past a
/// lookup that follows them (a caller that loads before it knows where the values go).
pub const VOLATILE: u8 = 1;
/// [`load_round`]'s reads, [`store_round_map`]'s writes: of data nothing reads again soon
/// ([`Unit::read_once`], [`Unit::write_once`]: streaming accesses of 16-byte units on the
/// GPU, kept in place as volatile reads are).
pub const ONCE: u8 = 2;

/// Loads one lane's share of one round of `B ≤ 4` spans: values `u + j * lanes` (`j < P ≤`
/// [`BATCH_UNITS`], below `units(k)`) of every live span `k` at `from[k]`, as accesses of `T`
/// read as `READ` says ([`PLAIN`], [`VOLATILE`], [`ONCE`]). The unit counts come as a function
/// of the span.
///
/// # Safety
/// Every live span: `units(k)` values of `T` readable at `from[k]`, aligned for `T` (with
/// `READ` [`ONCE`], in global memory on the GPU: [`Unit::read_once`]).
#[inline(always)]
pub unsafe fn load_round<T: Unit, const B: usize, const P: usize, const READ: u8>(
    from: &[*const u8; B],
    live: &[bool; B],
    units: impl Fn(usize) -> u32,
    u: u32,
    lanes: u32,
) -> Round<T, B, P> {
    const { assert!(P <= BATCH_UNITS as usize) };
    let mut v = [[T::ZERO; P]; B];
    // Constant indices only (unrolled), so the values stay in registers.
    unroll4!(k => {
        unroll4!(j => {
            let i = u + j as u32 * lanes;
            if k < B && j < P && live[k] && i < units(k) {
                let p = (from[k] as *const T).add(i as usize);
                // SAFETY: i < units(k): inside span k, aligned for T.
                v[k][j] = unsafe {
                    match READ {
                        VOLATILE => core::ptr::read_volatile(p),
                        ONCE => T::read_once(p),
                        _ => read(p),
                    }
                };
            }
        });
    });
    v
}

/// Stores what [`load_round`] loaded for the same `(live, units, u, lanes)` at `to`, every
/// value passed through `f` on its way (a copy: the identity; a conversion: values of `T`
/// loaded, values of `O` stored, span `k`'s `i`-th at `to[k] + i * size_of::<O>()`), written
/// plainly or, with `WRITE` [`ONCE`], as [`Unit::write_once`] does. Only the values the round
/// holds are passed through `f`.
///
/// # Safety
/// Every live span: `units(k)` values of `O` writable at `to[k]`, aligned for `O` (with
/// `WRITE` [`ONCE`], in global memory on the GPU: [`Unit::write_once`]).
#[inline(always)]
pub unsafe fn store_round_map<T: Copy, O: Unit, const B: usize, const P: usize, const WRITE: u8>(
    to: &[*mut u8; B],
    live: &[bool; B],
    units: impl Fn(usize) -> u32,
    u: u32,
    lanes: u32,
    v: &Round<T, B, P>,
    f: impl Fn(&T) -> O,
) {
    const { assert!(P <= BATCH_UNITS as usize) };
    unroll4!(k => {
        unroll4!(j => {
            let i = u + j as u32 * lanes;
            if k < B && j < P && live[k] && i < units(k) {
                let p = (to[k] as *mut O).add(i as usize);
                // SAFETY: as for the load.
                unsafe {
                    if WRITE == ONCE {
                        O::write_once(p, f(&v[k][j]))
                    } else {
                        write(p, f(&v[k][j]))
                    }
                };
            }
        });
    });
}

/// [`copy_span`] for `B ≤ 4` spans of `units` accesses of `T` each at once (span `k` from
/// `from[k]` to `to[k]`, copied where `live[k]`), as lane `lane` of `lanes`: each round issues
/// up to [`BATCH_UNITS`] loads of every live span before any of their stores, so short spans
/// (a KiB or two, a PCIe round trip each) keep many bytes in flight per group. Generic over
/// the access type so that a caller dispatches on the width once, outside its loop.
///
/// # Safety
/// Every live span: `units` values of `T` readable at `from[k]` and writable at `to[k]`, both
/// aligned for `T`; `lanes > 0`.
#[inline(always)]
pub unsafe fn copy_spans<T: Unit, const B: usize>(
    from: &[*const u8; B],
    to: &[*mut u8; B],
    live: &[bool; B],
    units: u32,
    lane: u32,
    lanes: u32,
) {
    // The body of load_round and store_round_map with one count for every span, kept inline: this
    // form is what the transfer kernel was tuned with (the two calls measured 2% slower at
    // 1-token pages on the H200, through different code).
    const P: usize = BATCH_UNITS as usize;
    let mut u = lane;
    while u < units {
        let mut v = [[T::ZERO; P]; B];
        // Constant indices only (unrolled), so the values stay in registers.
        unroll4!(k => {
            unroll4!(j => {
                let i = u + j as u32 * lanes;
                if k < B && j < P && live[k] && i < units {
                    // SAFETY: i < units: inside span k, aligned for T.
                    v[k][j] = unsafe { read((from[k] as *const T).add(i as usize)) };
                }
            });
        });
        unroll4!(k => {
            unroll4!(j => {
                let i = u + j as u32 * lanes;
                if k < B && j < P && live[k] && i < units {
                    // SAFETY: as for the load.
                    unsafe { write((to[k] as *mut T).add(i as usize), v[k][j]) };
                }
            });
        });
        u += P as u32 * lanes;
    }
}

/// Units (16-byte accesses) each lane can hold in registers for a staged copy.
pub const STAGE_UNITS: u64 = 4;

/// Loads lane `lane`'s share of a span of `units` 16-byte units (`units ≤ STAGE_UNITS *
/// lanes`) into registers, so the loads can be in flight while the caller finds out where the
/// span goes ([`store_staged`] writes them). Volatile, so the compiler cannot sink the loads
/// past the caller's index lookup.
///
/// # Safety
/// `src..src + 16 * units` readable and 16-byte aligned.
#[inline(always)]
pub unsafe fn load_staged(src: *const u8, units: u64, lane: u64, lanes: u64) -> [V16; 4] {
    let s = src as *const V16;
    let mut v = [V16::splat(0); 4];
    let mut k = 0;
    while k < 4 {
        let i = lane + k as u64 * lanes;
        if i < units {
            // SAFETY: i < units (caller's range).
            v[k] = unsafe { core::ptr::read_volatile(s.add(i as usize)) };
        }
        k += 1;
    }
    v
}

/// Stores what [`load_staged`] loaded for the same `(units, lane, lanes)`.
///
/// # Safety
/// `dst..dst + 16 * units` writable and 16-byte aligned.
#[inline(always)]
pub unsafe fn store_staged(dst: *mut u8, v: &[V16; 4], units: u64, lane: u64, lanes: u64) {
    let d = dst as *mut V16;
    let mut k = 0;
    while k < 4 {
        let i = lane + k as u64 * lanes;
        if i < units {
            // SAFETY: i < units (caller's range).
            unsafe { write(d.add(i as usize), v[k]) };
        }
        k += 1;
    }
}
