//! Reads of `.shared` memory by window address, for the kernels whose CTAs hold module-scope
//! shared variables (declared by the host's build script; their addresses come from
//! `shared_base!`): the staged tiles' cells ([`crate::stage`]) and the pages tile
//! ([`crate::cta`]); and the asynchronous copies into them.

/// The 16 bytes at `.shared` window address `addr`.
///
/// # Safety
/// `addr` is 16-byte aligned, inside a shared variable of the calling CTA, and the bytes were
/// written before: by this thread, or by other threads of the CTA before a barrier.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn load128(addr: u32) -> [u32; 4] {
    // SAFETY: forwarded; a read, ordered after the writes and barriers before it (`ld_v4!`
    // keeps it after any asm that may write memory).
    unsafe { ld_v4!("ld.shared.v4.u32", reg32 addr) }
}

/// `cp.async.ca.shared.global`: starts copying `bytes` (4, 8 or 16) from global `src` to
/// `.shared` window address `dst` (sm_80+); the copy is complete for the calling thread after
/// a `cp.async.wait_*` that covers it.
///
/// # Safety
/// `src` is global memory readable for `bytes` and `dst` shared memory of the calling CTA
/// writable for `bytes`, both aligned to `bytes`; nothing reads or writes `dst` until the copy
/// completes.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn cp_async(dst: u32, src: *const u8, bytes: u32) {
    // SAFETY: forwarded.
    unsafe {
        if bytes == 16 {
            core::arch::asm!(
                "cp.async.ca.shared.global [{d}], [{s}], 16;",
                d = in(reg32) dst,
                s = in(reg64) src,
                options(nostack)
            )
        } else if bytes == 8 {
            core::arch::asm!(
                "cp.async.ca.shared.global [{d}], [{s}], 8;",
                d = in(reg32) dst,
                s = in(reg64) src,
                options(nostack)
            )
        } else {
            core::arch::asm!(
                "cp.async.ca.shared.global [{d}], [{s}], 4;",
                d = in(reg32) dst,
                s = in(reg64) src,
                options(nostack)
            )
        }
    }
}
