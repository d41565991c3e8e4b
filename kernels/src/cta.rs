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
//! (`bar.red.and.pred`), so a CTA can agree on a fast path at no extra barrier. A thread's
//! [`Phases::Carry`] stays in its registers from phase to phase and item to item, and each
//! phase knows the CTA's next item, so a body can prepare it ahead (the pages updates search
//! the next item's slots during the current one and hand the result over in a note past the
//! tile).
//!
//! The tile is a CTA's static shared memory `kvio_page_tile` of [`BYTES`] bytes (declared by
//! the host's build script in both PTX modules, since rustc cannot declare `.shared`
//! variables). Grids are persistent: CTA `c` of `n` takes items `c, c + n, ...`, and every
//! thread of a CTA runs the same items, so the barriers are never divergent.

/// Threads per CTA of every CTA-phase entry (the build gives them `.maxntid 128`).
pub const THREADS: u32 = 128;
/// Bytes of the tile (`kvio_page_tile`) a body's items may use.
pub const BYTES: u32 = 16384;
/// Bytes past [`BYTES`] that `kvio_page_tile` also holds: two words a body hands from one
/// item to a later one ([`Tile::note`]), then [`CELLS`] bytes a warp fetches into
/// ([`Tile::fetch`]).
pub const NOTE: u32 = 16 + CELLS;
/// Bytes of the fetch cells past the notes: sixteen for each of 96 lanes' rounds.
pub const CELLS: u32 = 96 * 16;

// Static shared memory of one CTA stays within the 48 KiB a launch gets without opting in.
const _: () = assert!(BYTES + NOTE <= 48 * 1024);

/// The `next` item [`Phases`] are given with a CTA's last item.
pub const LAST: u64 = u64::MAX;

/// A CTA-phase body.
pub trait Phases {
    /// What a thread keeps in registers from item to item and from phase to phase: it
    /// starts as `Default` for a CTA's first item.
    type Carry: Copy + Default;

    /// Work items of the launch.
    fn items(&self) -> u64;

    /// Phase one of `item` for thread `tid` (`< THREADS`), the CTA's next item being `next`
    /// ([`LAST`] when `item` is its last): returns the thread's vote.
    ///
    /// # Safety
    /// As the body's contract; `tile` is the CTA's tile.
    unsafe fn first(
        &self,
        item: u64,
        next: u64,
        tid: u32,
        tile: &Tile,
        carry: &mut Self::Carry,
    ) -> bool;

    /// Phase two of `item` for thread `tid`, after every thread's phase one: `all` tells
    /// whether every thread of the CTA voted `true`.
    ///
    /// # Safety
    /// As [`Phases::first`].
    unsafe fn second(
        &self,
        item: u64,
        next: u64,
        tid: u32,
        tile: &Tile,
        all: bool,
        carry: &mut Self::Carry,
    );
}

/// The item a CTA takes after `item`, its CTAs taking every `step`-th of `items` ([`LAST`]
/// when `item` is its last).
#[inline(always)]
fn next_item(item: u64, step: u64, items: u64) -> u64 {
    if item + step < items {
        item + step
    } else {
        LAST
    }
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
    let mut carry = P::Carry::default();
    while item < items {
        let next = next_item(item, ctas as u64, items);
        // SAFETY: forwarded; the barriers order the phases as the contract says.
        unsafe {
            let vote = p.first(item, next, tid, &tile, &mut carry);
            let all = sync_and(vote);
            p.second(item, next, tid, &tile, all, &mut carry);
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
    let mut mem = [0xA5A5_A5A5u32; ((BYTES + NOTE) / 4) as usize];
    let tile = Tile {
        base: mem.as_mut_ptr().cast(),
    };
    let (items, step) = (p.items(), grid.max(1) as u64);
    for cta in 0..step {
        let mut item = cta;
        let mut carry = [P::Carry::default(); THREADS as usize];
        while item < items {
            let next = next_item(item, step, items);
            let mut all = true;
            for (tid, c) in carry.iter_mut().enumerate() {
                // SAFETY: forwarded.
                all &= unsafe { p.first(item, next, tid as u32, &tile, c) };
            }
            for (tid, c) in carry.iter_mut().enumerate() {
                // SAFETY: forwarded.
                unsafe { p.second(item, next, tid as u32, &tile, all, c) };
            }
            item += step;
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

/// `vote.sync.ballot`: bit `l` of the result tells whether `p` held in lane `l` of the calling
/// warp.
///
/// # Safety
/// Every lane of the warp calls it together (the PTX leaves a partial warp undefined).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn ballot(p: bool) -> u32 {
    let m: u32;
    // SAFETY: register operands; every lane of the warp is here (caller).
    unsafe {
        core::arch::asm!(
            "{{ .reg .pred kv_b;",
            "setp.ne.u32 kv_b, {v}, 0;",
            "vote.sync.ballot.b32 {m}, kv_b, 0xffffffff; }}",
            v = in(reg32) p as u32,
            m = out(reg32) m,
            // Not `nomem`: loads that follow it stay after it (a run search's rounds load one
            // at a time, holding few registers).
            options(nostack)
        )
    };
    m
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

    /// Leaves `v` as the CTA's note `i` (0 or 1: a word past the tile's [`BYTES`]).
    #[inline(always)]
    pub fn put_note(&self, i: u32, v: u32) {
        // SAFETY: the notes lie inside `kvio_page_tile` (`BYTES + NOTE` bytes), aligned.
        unsafe { self.put32(BYTES + 4 * (i & 1), v) };
    }

    /// The CTA's note `i`, as a thread left it before a barrier.
    #[inline(always)]
    pub fn note(&self, i: u32) -> u32 {
        // SAFETY: as `put_note`; `readonly` orders it after the puts.
        unsafe { self.get(BYTES + 4 * (i & 1), 4) }
    }

    /// Starts copying `bytes` (4 or 8) from `src` to fetch cell byte `off` (`cp.async`, sm_80+);
    /// the copy is complete for the thread that issued it after [`Tile::fetched`].
    ///
    /// # Safety
    /// `src` is global memory readable for `bytes`, aligned to `bytes`; `off + bytes <=
    /// CELLS`, a multiple of `bytes`; no thread reads or writes those bytes until the copy
    /// completes.
    #[inline(always)]
    pub unsafe fn fetch(&self, off: u32, src: *const u8, bytes: u32) {
        // SAFETY: forwarded; the cells lie past the notes inside `kvio_page_tile`.
        unsafe { crate::shared::cp_async(self.base + BYTES + 16 + off, src, bytes) }
    }

    /// Waits until every copy the calling thread started ([`Tile::fetch`]) is complete.
    #[inline(always)]
    pub fn fetched(&self) {
        // SAFETY: no operands.
        unsafe { core::arch::asm!("cp.async.wait_all;", options(nostack)) };
    }

    /// The word at fetch cell byte `off`.
    ///
    /// # Safety
    /// `off + 4 <= CELLS`, a multiple of 4.
    #[inline(always)]
    pub unsafe fn cell(&self, off: u32) -> u32 {
        // SAFETY: inside the tile (caller).
        unsafe { self.get(BYTES + 16 + off, 4) }
    }

    /// Stores a word at `off`.
    ///
    /// # Safety
    /// `off + 4 <= BYTES + NOTE`, a multiple of 4.
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
    /// `off + bytes <= BYTES + NOTE`, a multiple of `bytes`.
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
    /// `off + bytes <= BYTES + NOTE`, a multiple of `bytes`.
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
    /// Leaves `v` as the CTA's note `i` (0 or 1: a word past the tile's [`BYTES`]).
    pub fn put_note(&self, i: u32, v: u32) {
        // SAFETY: the emulated tile holds `BYTES + NOTE` bytes.
        unsafe { self.put32(BYTES + 4 * (i & 1), v) };
    }

    /// The CTA's note `i`.
    pub fn note(&self, i: u32) -> u32 {
        // SAFETY: as `put_note`.
        unsafe { self.get(BYTES + 4 * (i & 1), 4) }
    }

    /// Copies `bytes` (4 or 8) from `src` to fetch cell byte `off`.
    ///
    /// # Safety
    /// `src` is readable for `bytes`; `off + bytes <= CELLS`.
    pub unsafe fn fetch(&self, off: u32, src: *const u8, bytes: u32) {
        debug_assert!(off + bytes <= CELLS);
        // SAFETY: forwarded; inside the emulated tile.
        unsafe {
            core::ptr::copy_nonoverlapping(
                src,
                self.base.add((BYTES + 16 + off) as usize),
                bytes as usize,
            )
        };
    }

    /// The copies are complete at once on the CPU.
    pub fn fetched(&self) {}

    /// The word at fetch cell byte `off`.
    ///
    /// # Safety
    /// `off + 4 <= CELLS`, a multiple of 4.
    pub unsafe fn cell(&self, off: u32) -> u32 {
        // SAFETY: inside the emulated tile (caller).
        unsafe { self.get(BYTES + 16 + off, 4) }
    }

    /// Stores a word at `off`.
    ///
    /// # Safety
    /// `off + 4 <= BYTES + NOTE`, a multiple of 4.
    pub unsafe fn put32(&self, off: u32, v: u32) {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= BYTES + NOTE);
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
    /// `off + bytes <= BYTES + NOTE`, a multiple of `bytes`.
    pub unsafe fn put(&self, off: u32, v: u32, bytes: u32) {
        debug_assert!(off.is_multiple_of(bytes) && off + bytes <= BYTES + NOTE);
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
    /// `off + bytes <= BYTES + NOTE`, a multiple of `bytes`.
    pub unsafe fn get(&self, off: u32, bytes: u32) -> u32 {
        debug_assert!(off.is_multiple_of(bytes) && off + bytes <= BYTES + NOTE);
        // SAFETY: inside the emulated tile (caller).
        (0..bytes).fold(0, |v, k| {
            v | (unsafe { self.base.add((off + k) as usize).read() } as u32) << (8 * k)
        })
    }
}
