//! Per-thread staging of a tiled update's loads in shared memory, for
//! `kvio_update_tiles_staged` ([`crate::ops::update_tiles_staged`]): a thread copies the next
//! tile's eight source rows and eight slots into its own cells with `cp.async` (sm_80+), then
//! works on the tile before it, whose cells have landed. The loads of one tile are therefore
//! always in flight while the thread converts, transposes and stores the previous one, without
//! holding registers for them (the register-tile kernel waits for a tile's loads, then works
//! on it; at two CTAs of 128 registers per multiprocessor its warps stalled mostly on those
//! loads: Nsight Compute, bf16, long scoreboard 36% of stall cycles).
//!
//! Layout of a CTA's static shared memory `kvio_tile_stage` (declared by the host's build
//! script in both PTX modules, since rustc cannot declare `.shared` variables): [`STAGES`]
//! stages of [`CELLS`] cells; cell `c` of stage `s` of thread `t` is the 16 bytes at
//! `((s * CELLS + c) * THREADS + t) * 16`, so a warp's accesses to one cell are 512
//! consecutive bytes (no bank conflicts). Cells 0..8 hold the rows (16 or 8 bytes each),
//! cells 8..12 the slots (four cells of two i64, or two of four i32).
//!
//! Only the thread that issued a copy reads its cells, after `cp.async.wait_group`, and a cell
//! is overwritten only by a copy issued after the thread's own reads of it: no thread touches
//! another's cells, so no barrier is needed. On the CPU the cells are an array owned by the
//! calling thread and a copy happens when it is issued.

/// Threads per CTA of the staged entry (the build gives it `.maxntid 128`).
pub const THREADS: u32 = 128;
/// Cells per stage: eight rows and four slot cells.
pub const CELLS: usize = 12;
/// Stages per thread: the tile being worked on and the next one.
pub const STAGES: usize = 2;
/// Bytes of static shared memory (`kvio_tile_stage`).
pub const BYTES: u32 = THREADS * (STAGES * CELLS) as u32 * 16;

// Static shared memory of one CTA stays within the 48 KiB a launch gets without opting in.
const _: () = assert!(BYTES <= 48 * 1024);

/// One thread's cells.
pub struct Stage {
    /// `.shared` window address of the thread's cell 0 of stage 0.
    #[cfg(target_arch = "nvptx64")]
    base: u32,
    /// The cells themselves (CPU).
    #[cfg(not(target_arch = "nvptx64"))]
    cells: [[u32; 4]; STAGES * CELLS],
}

#[cfg(target_arch = "nvptx64")]
impl Stage {
    /// The calling thread's cells (a CTA of [`THREADS`] threads).
    #[inline(always)]
    pub fn new() -> Stage {
        let sym = shared_base!("kvio_tile_stage");
        // SAFETY: reading a special register has no preconditions.
        let tid = unsafe { core::arch::nvptx::_thread_idx_x() } as u32;
        Stage {
            base: sym + tid * 16,
        }
    }

    #[inline(always)]
    fn addr(&self, stage: usize, cell: usize) -> u32 {
        self.base + ((stage * CELLS + cell) as u32 * THREADS) * 16
    }

    /// Starts copying `bytes` (8 or 16) from `src` into a cell.
    ///
    /// # Safety
    /// `src` is global memory readable for `bytes`, aligned to `bytes`; the cell's earlier
    /// reads have been issued.
    #[inline(always)]
    pub unsafe fn fetch(&mut self, stage: usize, cell: usize, src: *const u8, bytes: u32) {
        // SAFETY: forwarded; the cell lies in this thread's part of the stage area.
        unsafe {
            crate::shared::cp_async(
                self.addr(stage, cell),
                src,
                if bytes == 16 { 16 } else { 8 },
            )
        }
    }

    /// Closes the group of copies issued since the last commit (possibly empty).
    #[inline(always)]
    pub fn commit(&mut self) {
        // SAFETY: no operands.
        unsafe { core::arch::asm!("cp.async.commit_group;", options(nostack)) };
    }

    /// Waits until every group but the newest has landed.
    #[inline(always)]
    pub fn wait_older(&mut self) {
        // SAFETY: no operands; a compiler barrier for the cell reads after it.
        unsafe { core::arch::asm!("cp.async.wait_group 1;", options(nostack)) };
    }

    /// A cell's 16 bytes (after [`Stage::wait_older`] for its group).
    ///
    /// # Safety
    /// `stage < STAGES`, `cell < CELLS`, and the cell's copy has landed.
    #[inline(always)]
    pub unsafe fn get(&self, stage: usize, cell: usize) -> [u32; 4] {
        // SAFETY: this thread's cell in the stage area (in range: caller), 16-byte aligned,
        // landed (caller).
        unsafe { crate::shared::load128(self.addr(stage, cell)) }
    }
}

#[cfg(not(target_arch = "nvptx64"))]
impl Stage {
    /// The calling thread's cells.
    #[inline(always)]
    pub fn new() -> Stage {
        Stage {
            cells: [[0; 4]; STAGES * CELLS],
        }
    }

    /// Copies `bytes` (8 or 16) from `src` into a cell (the rest of the cell is zeroed).
    ///
    /// # Safety
    /// `src` is readable for `bytes`.
    #[inline(always)]
    pub unsafe fn fetch(&mut self, stage: usize, cell: usize, src: *const u8, bytes: u32) {
        let mut b = [0u8; 16];
        // SAFETY: forwarded.
        unsafe { core::ptr::copy_nonoverlapping(src, b.as_mut_ptr(), bytes as usize) };
        let c = &mut self.cells[stage * CELLS + cell];
        for (k, w) in c.iter_mut().enumerate() {
            *w = u32::from_le_bytes([b[4 * k], b[4 * k + 1], b[4 * k + 2], b[4 * k + 3]]);
        }
    }

    /// Closes a group of copies (nothing to do on the CPU).
    #[inline(always)]
    pub fn commit(&mut self) {}

    /// Waits for older groups (they have landed on the CPU).
    #[inline(always)]
    pub fn wait_older(&mut self) {}

    /// A cell's 16 bytes.
    ///
    /// # Safety
    /// As on the GPU: `stage < STAGES`, `cell < CELLS` (checked here by the array index).
    #[inline(always)]
    pub unsafe fn get(&self, stage: usize, cell: usize) -> [u32; 4] {
        self.cells[stage * CELLS + cell]
    }
}

impl Default for Stage {
    fn default() -> Stage {
        Stage::new()
    }
}
