//! Hopper bulk copies (`cp.async.bulk`, the TMA unit's non-tensor copies) for the block
//! transfer entry `kvio_transfer_blocks_tma` ([`crate::ops::transfer_blocks_tma`]).
//!
//! Layout of a CTA's static shared memory (declared by the host's build script in the `sm_90`
//! PTX, since rustc cannot declare `.shared` variables; the kernel takes the addresses with
//! `mov.u32`, i.e. 32-bit `.shared` window addresses):
//! - `kvio_tma_stage`: [`STAGES`] stages of [`STAGE_BYTES`] bytes, 128-byte aligned. In a stage,
//!   lane `k` of the CTA's single warp owns bytes `k * piece .. (k + 1) * piece`;
//! - `kvio_tma_bar`: one `mbarrier` (8 bytes) per (stage, lane): `bar[stage * 32 + lane]`.
//!
//! Every lane is its own pipeline (its own slots, barriers and bulk groups), so lanes never
//! synchronise with each other. The PTX rules followed (PTX ISA 8.x):
//! - `cp.async.bulk` sizes are multiples of 16 and its global and shared addresses 16-byte
//!   aligned (the host plans this path only for 16-byte aligned copies);
//! - a barrier is initialised (`mbarrier.init`, count 1) and made visible to the async proxy
//!   (`fence.mbarrier_init.release.cluster`, `fence.proxy.async.shared::cta`) before its first
//!   use by a bulk copy;
//! - global → shared: `mbarrier.arrive.expect_tx` with the byte count, then the copy with
//!   `.mbarrier::complete_tx::bytes`; the thread waits with `mbarrier.try_wait.parity` on the
//!   barrier's current phase (phase `n` of a barrier has parity `n & 1`);
//! - shared → global: `cp.async.bulk.global.shared::cta.bulk_group`, then
//!   `cp.async.bulk.commit_group`; a slot is overwritten only after
//!   `cp.async.bulk.wait_group.read` has seen the stores reading it finish their reads, and the
//!   CTA exits only after `cp.async.bulk.wait_group 0` (shared memory must outlive the reads).

/// Stages of the pipeline (each lane's slots of each stage: one in-flight piece).
pub const STAGES: u32 = 5;
/// Bytes of one stage: the largest piece a plan for this path may use.
pub const STAGE_BYTES: u32 = 8 * 1024;
/// Threads per CTA: one warp, whose lanes each run their own pipeline.
pub const THREADS: u32 = 32;
/// log2 of [`THREADS`]: the `shift` of the path's arguments (a group is the CTA's warp).
pub const SHIFT: u32 = 5;
/// Loads a lane keeps in flight ahead of the piece it waits for: at the wait, `LOOKAHEAD + 1`
/// loads are in flight; when a load is issued, up to `STAGES - 1 - LOOKAHEAD` stores may still
/// be reading their slots.
pub const LOOKAHEAD: u32 = 2;
/// Bytes of static shared memory for the stages (`kvio_tma_stage`).
pub const SMEM_STAGE_BYTES: u32 = STAGES * STAGE_BYTES;
/// Number of `mbarrier`s (`kvio_tma_bar`, 8 bytes each).
pub const BARRIERS: u32 = STAGES * THREADS;

// Static shared memory of one CTA stays within the 48 KiB a launch gets without opting in.
const _: () = assert!(SMEM_STAGE_BYTES + 8 * BARRIERS <= 48 * 1024);

/// Pieces of `piece` bytes a stage holds, one per lane (at least one, at most a warp's lanes).
#[inline(always)]
pub fn lanes_for(piece: u64) -> u64 {
    let n = STAGE_BYTES as u64 / piece.max(1);
    n.clamp(1, THREADS as u64)
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
pub(crate) mod hw {
    //! The instructions (sm_90, PTX ISA 8.0; `host/build.rs` raises the module's version).
    use core::arch::asm;

    /// `.shared` window address of this CTA's stage area.
    #[inline(always)]
    pub fn stage_base() -> u32 {
        shared_base!("kvio_tma_stage")
    }

    /// `.shared` window address of this CTA's barrier array.
    #[inline(always)]
    pub fn bar_base() -> u32 {
        shared_base!("kvio_tma_bar")
    }

    /// Initialises the barrier at `bar` for one arrival and makes that visible to the async
    /// proxy.
    ///
    /// # Safety
    /// `bar` is an 8-byte aligned barrier of this CTA no bulk copy uses yet.
    #[inline(always)]
    pub unsafe fn init(bar: u32) {
        // SAFETY: forwarded.
        unsafe {
            asm!(
                "mbarrier.init.shared::cta.b64 [{b}], 1;",
                b = in(reg32) bar,
                options(nostack, preserves_flags)
            )
        };
    }

    /// Orders barrier initialisations before their use by the async proxy.
    #[inline(always)]
    pub fn fence_init() {
        // SAFETY: fences only.
        unsafe {
            asm!(
                "fence.mbarrier_init.release.cluster;",
                "fence.proxy.async.shared::cta;",
                options(nostack, preserves_flags)
            )
        };
    }

    /// Synchronises the warp's lanes that are still running (`activemask`, `bar.warp.sync`).
    #[inline(always)]
    pub fn sync_lanes() {
        // SAFETY: the mask is the set of lanes executing this very instruction.
        unsafe {
            asm!(
                "{{ .reg .b32 m;",
                "activemask.b32 m;",
                "bar.warp.sync m; }}",
                options(nostack, preserves_flags)
            )
        };
    }

    /// Global (or mapped host) `src` → shared `dst`, `bytes` bytes, completing on `bar`
    /// (which expects them first).
    ///
    /// # Safety
    /// `bytes` a multiple of 16, both addresses 16-byte aligned, `src..src + bytes` readable,
    /// `dst` this lane's slot (no bulk store still reading it), `bar` this slot's barrier.
    #[inline(always)]
    pub unsafe fn load(dst: u32, src: *const u8, bytes: u32, bar: u32) {
        // SAFETY: forwarded.
        unsafe {
            asm!(
                "mbarrier.arrive.expect_tx.shared::cta.b64 _, [{b}], {n};",
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{s}], {n}, [{b}];",
                d = in(reg32) dst,
                s = in(reg64) src,
                n = in(reg32) bytes,
                b = in(reg32) bar,
                options(nostack, preserves_flags)
            )
        };
    }

    /// Completes the barrier's current phase without a copy (a slot with nothing to load).
    ///
    /// # Safety
    /// `bar` an initialised barrier of this lane.
    #[inline(always)]
    pub unsafe fn arrive(bar: u32) {
        // SAFETY: forwarded.
        unsafe {
            asm!(
                "mbarrier.arrive.shared::cta.b64 _, [{b}];",
                b = in(reg32) bar,
                options(nostack, preserves_flags)
            )
        };
    }

    /// Waits until the phase of parity `parity` of `bar` has completed.
    ///
    /// # Safety
    /// `bar` an initialised barrier of this lane.
    #[inline(always)]
    pub unsafe fn wait(bar: u32, parity: u32) {
        loop {
            let done: u32;
            // SAFETY: forwarded. Not `nomem`: the wait orders the slot's reads after it.
            unsafe {
                asm!(
                    "{{ .reg .pred p;",
                    "mbarrier.try_wait.parity.shared::cta.b64 p, [{b}], {q};",
                    "selp.u32 {d}, 1, 0, p; }}",
                    b = in(reg32) bar,
                    q = in(reg32) parity,
                    d = out(reg32) done,
                    options(nostack, preserves_flags)
                )
            };
            if done != 0 {
                return;
            }
        }
    }

    /// Shared `src` → global (or mapped host) `dst`, `bytes` bytes, in this thread's current
    /// bulk group (committed by [`commit`]).
    ///
    /// # Safety
    /// As [`load`], with `dst..dst + bytes` writable and the slot's load complete.
    #[inline(always)]
    pub unsafe fn store(dst: *mut u8, src: u32, bytes: u32) {
        // SAFETY: forwarded. The proxy fence is conservative: the slot was written by the
        // async proxy (the load) and is read by it again.
        unsafe {
            asm!(
                "fence.proxy.async.shared::cta;",
                "cp.async.bulk.global.shared::cta.bulk_group [{d}], [{s}], {n};",
                d = in(reg64) dst,
                s = in(reg32) src,
                n = in(reg32) bytes,
                options(nostack, preserves_flags)
            )
        };
    }

    /// Closes this thread's current bulk group (possibly empty).
    #[inline(always)]
    pub fn commit() {
        // SAFETY: bookkeeping of this thread's own bulk copies.
        unsafe {
            asm!(
                "cp.async.bulk.commit_group;",
                options(nostack, preserves_flags)
            )
        };
    }

    /// Waits until all but the `N` most recent bulk groups of this thread have finished
    /// reading their sources.
    #[inline(always)]
    pub fn wait_read<const N: u32>() {
        // SAFETY: waits only.
        unsafe {
            asm!(
                "cp.async.bulk.wait_group.read {n};",
                n = const N,
                options(nostack, preserves_flags)
            )
        };
    }

    /// Waits until every bulk group of this thread has completed (writes performed).
    #[inline(always)]
    pub fn wait_all() {
        // SAFETY: waits only.
        unsafe {
            asm!(
                "cp.async.bulk.wait_group 0;",
                options(nostack, preserves_flags)
            )
        };
    }
}
