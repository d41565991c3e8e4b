//! Work a whole CTA does together: each work item runs in two phases separated by a barrier,
//! with a tile of shared memory between them. Phase one of every thread (typically: load
//! rows, rearrange them into the tile) completes before phase two of any thread (typically:
//! store the tile in the target's order), and every thread finishes phase two of an item
//! before any thread starts phase one of the next, so a body may write the tile in one order
//! and read it in another without synchronising itself.
//!
//! Bodies stay written one thread at a time: [`Phases`] gives the two phases as functions of
//! `(item, thread)`. On the GPU `run` calls them for the calling thread with `bar.red.and`
//! and `bar.sync` in between; on the CPU [`emulate`] calls phase one for every thread of a CTA,
//! then phase two for every thread, item after item, which is one valid schedule of the same
//! program. Phase one also returns a vote: phase two learns whether every thread voted `true`
//! (`bar.red.and.pred`), so a CTA can agree on a fast path at no extra barrier.
//!
//! The tile is a CTA's static shared memory `kvio_page_tile` of [`BYTES`] bytes (declared by
//! the host's build script in both PTX modules, since rustc cannot declare `.shared`
//! variables). Grids are persistent: CTA `c` of `n` takes items `c, c + n, ...`, and every
//! thread of a CTA runs the same items, so the barriers are never divergent.

/// Threads per CTA of every CTA-phase entry (the build gives them `.maxntid 128`).
pub const THREADS: u32 = 128;
/// Bytes of the tile (`kvio_page_tile`).
pub const BYTES: u32 = 16384;

// Static shared memory of one CTA stays within the 48 KiB a launch gets without opting in.
const _: () = assert!(BYTES <= 48 * 1024);

/// A CTA-phase body.
pub trait Phases {
    /// Work items of the launch.
    fn items(&self) -> u64;

    /// Phase one of `item` for thread `tid` (`< THREADS`): returns the thread's vote.
    ///
    /// # Safety
    /// As the body's contract; `tile` is the CTA's tile.
    unsafe fn first(&self, item: u64, tid: u32, tile: &Tile) -> bool;

    /// Phase two of `item` for thread `tid`, after every thread's phase one: `all` tells
    /// whether every thread of the CTA voted `true`.
    ///
    /// # Safety
    /// As [`Phases::first`].
    unsafe fn second(&self, item: u64, tid: u32, tile: &Tile, all: bool);
}

/// Runs `p` on the calling thread of a CTA of [`THREADS`] threads.
///
/// # Safety
/// As `p`'s phases; launched with [`THREADS`] threads per CTA.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn run<P: Phases>(p: &P) {
    use core::arch::nvptx::{_block_idx_x, _grid_dim_x, _thread_idx_x};
    // SAFETY: reading special registers has no preconditions.
    let (tid, cta, ctas) = unsafe { (_thread_idx_x(), _block_idx_x(), _grid_dim_x()) };
    let tile = Tile::cta();
    let items = p.items();
    let mut item = cta as u64;
    while item < items {
        // SAFETY: forwarded; the barriers order the phases as the contract says.
        unsafe {
            let vote = p.first(item, tid as u32, &tile);
            let all = sync_and(vote);
            p.second(item, tid as u32, &tile, all);
        }
        sync();
        item += ctas as u64;
    }
}

/// Runs `p` on the CPU for a grid of `grid` CTAs: CTA after CTA, item after item, phase one
/// of every thread, then phase two of every thread. The tile starts filled with a pattern, so
/// a body that reads what it never wrote reads garbage here too.
///
/// # Safety
/// As `p`'s phases, on host memory.
#[cfg(not(target_arch = "nvptx64"))]
pub unsafe fn emulate<P: Phases>(p: &P, grid: u32) {
    let mut mem = [0xA5A5_A5A5u32; (BYTES / 4) as usize];
    let tile = Tile {
        base: mem.as_mut_ptr().cast(),
    };
    let items = p.items();
    for cta in 0..grid.max(1) as u64 {
        let mut item = cta;
        while item < items {
            let mut all = true;
            for tid in 0..THREADS {
                // SAFETY: forwarded.
                all &= unsafe { p.first(item, tid, &tile) };
            }
            for tid in 0..THREADS {
                // SAFETY: forwarded.
                unsafe { p.second(item, tid, &tile, all) };
            }
            item += grid.max(1) as u64;
        }
    }
}

/// `bar.sync 0`: waits for every thread of the CTA; their shared-memory accesses before it
/// are visible to each other after it.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn sync() {
    // SAFETY: no operands; every thread of the CTA reaches it (see `run`).
    unsafe { core::arch::asm!("bar.sync 0;", options(nostack)) };
}

/// `bar.red.and.pred`: [`sync`], returning whether `vote` held in every thread.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn sync_and(vote: bool) -> bool {
    let all: u32;
    // SAFETY: register operands; every thread of the CTA reaches it (see `run`).
    unsafe {
        core::arch::asm!(
            "{{ .reg .pred kv_in, kv_all;",
            "setp.ne.u32 kv_in, {v}, 0;",
            "bar.red.and.pred kv_all, 0, kv_in;",
            "selp.u32 {a}, 1, 0, kv_all; }}",
            v = in(reg32) vote as u32,
            a = out(reg32) all,
            options(nostack)
        )
    };
    all != 0
}

/// A CTA's tile of [`BYTES`] bytes of shared memory, addressed by byte offset.
pub struct Tile {
    /// `.shared` window address of the tile.
    #[cfg(target_arch = "nvptx64")]
    base: u32,
    /// The emulated tile.
    #[cfg(not(target_arch = "nvptx64"))]
    base: *mut u8,
}

#[cfg(target_arch = "nvptx64")]
impl Tile {
    /// The CTA's tile.
    #[inline(always)]
    fn cta() -> Tile {
        Tile {
            base: shared_base!("kvio_page_tile"),
        }
    }

    /// Stores a word at `off`.
    ///
    /// # Safety
    /// `off + 4 <= BYTES`, a multiple of 4.
    #[inline(always)]
    pub unsafe fn put32(&self, off: u32, v: u32) {
        // SAFETY: inside the tile (caller).
        unsafe {
            core::arch::asm!(
                "st.shared.u32 [{a}], {v};",
                a = in(reg32) self.base + off,
                v = in(reg32) v,
                options(nostack)
            )
        };
    }

    /// Stores four words at `off`.
    ///
    /// # Safety
    /// `off + 16 <= BYTES`, a multiple of 16.
    #[inline(always)]
    pub unsafe fn put128(&self, off: u32, v: [u32; 4]) {
        // SAFETY: inside the tile (caller).
        unsafe {
            core::arch::asm!(
                "st.shared.v4.u32 [{a}], {{{x}, {y}, {z}, {w}}};",
                a = in(reg32) self.base + off,
                x = in(reg32) v[0],
                y = in(reg32) v[1],
                z = in(reg32) v[2],
                w = in(reg32) v[3],
                options(nostack)
            )
        };
    }

    /// The four words at `off`.
    ///
    /// # Safety
    /// `off + 16 <= BYTES`, a multiple of 16.
    #[inline(always)]
    pub unsafe fn get128(&self, off: u32) -> [u32; 4] {
        // SAFETY: inside the tile, aligned (caller); the runner's barriers order the puts.
        unsafe { crate::shared::load128(self.base + off) }
    }

    /// Stores the low `bytes` (1, 2 or 4) bytes of `v` at `off`.
    ///
    /// # Safety
    /// `off + bytes <= BYTES`, a multiple of `bytes`.
    #[inline(always)]
    pub unsafe fn put(&self, off: u32, v: u32, bytes: u32) {
        let a = self.base + off;
        // SAFETY: inside the tile, aligned (caller).
        unsafe {
            match bytes {
                4 => {
                    core::arch::asm!("st.shared.u32 [{a}], {v};", a = in(reg32) a, v = in(reg32) v, options(nostack))
                }
                2 => {
                    core::arch::asm!("st.shared.u16 [{a}], {v};", a = in(reg32) a, v = in(reg32) v, options(nostack))
                }
                _ => {
                    core::arch::asm!("st.shared.u8 [{a}], {v};", a = in(reg32) a, v = in(reg32) v, options(nostack))
                }
            }
        };
    }

    /// The `bytes` (1, 2 or 4) bytes at `off`, zero-extended.
    ///
    /// # Safety
    /// `off + bytes <= BYTES`, a multiple of `bytes`.
    #[inline(always)]
    pub unsafe fn get(&self, off: u32, bytes: u32) -> u32 {
        let a = self.base + off;
        let v: u32;
        // SAFETY: inside the tile, aligned (caller); `readonly` orders it after the puts.
        unsafe {
            match bytes {
                4 => {
                    core::arch::asm!("ld.shared.u32 {v}, [{a}];", a = in(reg32) a, v = out(reg32) v, options(readonly, nostack))
                }
                2 => {
                    core::arch::asm!("ld.shared.u16 {v}, [{a}];", a = in(reg32) a, v = out(reg32) v, options(readonly, nostack))
                }
                _ => {
                    core::arch::asm!("ld.shared.u8 {v}, [{a}];", a = in(reg32) a, v = out(reg32) v, options(readonly, nostack))
                }
            }
        };
        v
    }
}

#[cfg(not(target_arch = "nvptx64"))]
impl Tile {
    /// Stores a word at `off`.
    ///
    /// # Safety
    /// `off + 4 <= BYTES`, a multiple of 4.
    pub unsafe fn put32(&self, off: u32, v: u32) {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= BYTES);
        // SAFETY: inside the emulated tile (caller), aligned: it is an array of words.
        unsafe { self.base.add(off as usize).cast::<u32>().write(v) };
    }

    /// Stores four words at `off`.
    ///
    /// # Safety
    /// `off + 16 <= BYTES`, a multiple of 16.
    pub unsafe fn put128(&self, off: u32, v: [u32; 4]) {
        debug_assert!(off.is_multiple_of(16) && off + 16 <= BYTES);
        // SAFETY: as `put32`, four times.
        unsafe {
            for (k, w) in v.into_iter().enumerate() {
                self.put32(off + 4 * k as u32, w);
            }
        }
    }

    /// The four words at `off`.
    ///
    /// # Safety
    /// `off + 16 <= BYTES`, a multiple of 16.
    pub unsafe fn get128(&self, off: u32) -> [u32; 4] {
        debug_assert!(off.is_multiple_of(16) && off + 16 <= BYTES);
        // SAFETY: inside the emulated tile (caller), aligned words.
        core::array::from_fn(|k| unsafe {
            self.base.add(off as usize + 4 * k).cast::<u32>().read()
        })
    }

    /// Stores the low `bytes` (1, 2 or 4) bytes of `v` at `off` (little-endian, as the GPU).
    ///
    /// # Safety
    /// `off + bytes <= BYTES`, a multiple of `bytes`.
    pub unsafe fn put(&self, off: u32, v: u32, bytes: u32) {
        debug_assert!(off.is_multiple_of(bytes) && off + bytes <= BYTES);
        for k in 0..bytes {
            // SAFETY: inside the emulated tile (caller).
            unsafe {
                self.base
                    .add((off + k) as usize)
                    .write((v >> (8 * k)) as u8)
            };
        }
    }

    /// The `bytes` (1, 2 or 4) bytes at `off`, zero-extended.
    ///
    /// # Safety
    /// `off + bytes <= BYTES`, a multiple of `bytes`.
    pub unsafe fn get(&self, off: u32, bytes: u32) -> u32 {
        debug_assert!(off.is_multiple_of(bytes) && off + bytes <= BYTES);
        // SAFETY: inside the emulated tile (caller).
        (0..bytes).fold(0, |v, k| {
            v | (unsafe { self.base.add((off + k) as usize).read() } as u32) << (8 * k)
        })
    }
}
