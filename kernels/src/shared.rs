//! Reads of `.shared` memory by window address, for the kernels whose CTAs hold module-scope
//! shared variables (declared by the host's build script; their addresses come from
//! `shared_base!`): the staged tiles' cells ([`crate::stage`]) and the pages tile
//! ([`crate::cta`]).

/// The 16 bytes at `.shared` window address `addr`.
///
/// # Safety
/// `addr` is 16-byte aligned, inside a shared variable of the calling CTA, and the bytes were
/// written before: by this thread, or by other threads of the CTA before a barrier.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn load128(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: forwarded; a read, ordered after the writes and barriers before it (`readonly`
    // keeps it after any asm that may write memory).
    unsafe {
        core::arch::asm!(
            "ld.shared.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a,
            b = out(reg32) b,
            c = out(reg32) c,
            d = out(reg32) d,
            p = in(reg32) addr,
            options(readonly, nostack)
        )
    };
    [a, b, c, d]
}
