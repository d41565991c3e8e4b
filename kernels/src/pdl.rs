//! Programmatic dependent launch (PDL, Hopper and later): the two `griddepcontrol`
//! instructions every `args::kernel!` entry point executes before it touches memory.
//!
//! PTX ISA (8.x, "griddepcontrol"; needs PTX ISA 7.8 and `sm_90`):
//! - `griddepcontrol.wait` "causes the executing thread to wait until all prerequisite grids in
//!   flight have completed and all the memory operations from the prerequisite grids are
//!   performed and made visible to the current grid". A grid launched without the
//!   programmatic attribute has no prerequisite grid in flight (stream order already waited
//!   for it), so there it returns at once.
//! - `griddepcontrol.launch_dependents` "signals that specific dependents the runtime system
//!   designated to react to this instruction can be scheduled as soon as all other CTAs in the
//!   grid issue the same instruction or have completed"; it does not publish memory: a
//!   dependent still sees this grid's writes only through its own `griddepcontrol.wait`,
//!   which waits for this grid to *complete*.
//!
//! kvio's entry points run `wait` before they read or write memory (nothing is touched before
//! the producer of their inputs and the previous user of their outputs has finished): first
//! thing, or, for the write path's bodies ([`Signal::BODY_WAITS`]), after the arithmetic that
//! reads only their arguments (the first item's index split), which then overlaps the grid
//! they wait for. Then `launch_dependents` (a dependent launched with the attribute may be scheduled while this
//! grid runs; it waits for its completion before touching memory, so an early signal is safe
//! for every dependent that waits, and a dependent that does not wait is unsafe whatever the
//! signal's position). Signalling after the wait rather than before it keeps a chain of
//! programmatic launches from filling the SMs with grids that only wait.
//!
//! Block copies ([`Signal::EARLY`] false for their arguments) skip the early signal: they run
//! long next to a launch, and an early signal would let a programmatic dependent park its
//! CTAs on the multiprocessors, waiting, for the whole copy (the dependent is then scheduled
//! when the copy's CTAs exit, as without the instruction). The prefill bodies of the write
//! path override their arguments' early signal (session 16, H100, back-to-back launches): the
//! v0 prefill kernels (`crate::ops::update_pages`, `update_pages_fp8`, `update_tiles_staged`:
//! persistent grids that fill the multiprocessors) never signal, which brought them 1.5–6
//! points closer to the copy ceiling; the quantizing MLA update (`update_rows_convert`)
//! signals at each thread's last row ([`signal_at_last`]).
//!
//! On targets without the instructions (the `sm_80` PTX, the host CPU) both are no-ops, so
//! the `sm_80` PTX holds no `griddepcontrol` and kvio never launches it with the attribute.

/// Waits until the grids this one programmatically depends on have completed and their
/// memory operations are visible (`griddepcontrol.wait`); a no-op without such grids and on
/// targets before `sm_90`.
#[inline(always)]
pub fn wait() {
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
    // SAFETY: sm_90+ is guaranteed by the cfg. No `nomem`: the asm is a memory barrier for the
    // compiler, so no load or store of the kernel is moved above it.
    unsafe {
        core::arch::asm!("griddepcontrol.wait;", options(nostack, preserves_flags));
    }
}

/// Lets the dependents launched with the programmatic attribute be scheduled once every CTA
/// of this grid has signalled or exited (`griddepcontrol.launch_dependents`); a no-op on
/// targets before `sm_90`.
#[inline(always)]
pub fn launch_dependents() {
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
    // SAFETY: sm_90+ is guaranteed by the cfg; the instruction only signals the scheduler.
    unsafe {
        core::arch::asm!(
            "griddepcontrol.launch_dependents;",
            options(nostack, preserves_flags)
        );
    }
}

/// When an entry point's grid signals its programmatic dependents: every argument struct of
/// [`crate::args`] implements it.
pub trait Signal {
    /// `true`: right after [`wait`] (the write path: short kernels, the next one may be
    /// scheduled at once; the bodies named in the module docs override it); `false`: never,
    /// so dependents are scheduled as the grid's CTAs exit (block copies).
    const EARLY: bool = true;
    /// `true`: the bodies taking these arguments run [`ready`] themselves, after the work that
    /// reads nothing but the arguments and the thread's indices (their first item's index
    /// split and addresses), so under programmatic dependent launch that work overlaps the
    /// grid they wait for; their entry points do not run [`prologue`]. `tests/ptx_abi.rs`
    /// checks, on the control-flow graph of every sm_90 entry, that no path reaches a memory
    /// access without passing `griddepcontrol.wait`.
    const BODY_WAITS: bool = false;
}

/// Whether a body gains from splitting its first item before [`ready`]: on sm_90 PTX (where
/// the wait overlaps the previous grid) and in the CPU emulation (which runs the same code,
/// so the emulated tests cover it); not on earlier architectures, which have no
/// `griddepcontrol` and where the split kept across the wait cost registers (the slot update
/// on sm_80: 80 -> 115).
pub const SPLIT_EARLY: bool = !cfg!(all(target_arch = "nvptx64", not(target_feature = "sm_90")));

/// A body's first item split before [`ready`]: `split()` where [`SPLIT_EARLY`], else a
/// placeholder that [`split_now`] never returns.
#[inline(always)]
pub fn split_first<T: Default>(split: impl FnOnce() -> T) -> T {
    if SPLIT_EARLY {
        split()
    } else {
        T::default()
    }
}

/// The split of the item a body takes: `early` (split ahead: [`split_first`] or the loop's
/// previous iteration) where [`SPLIT_EARLY`], else `split()` now.
#[inline(always)]
pub fn split_now<T>(early: T, split: impl FnOnce() -> T) -> T {
    if SPLIT_EARLY {
        early
    } else {
        split()
    }
}

/// The prologue a body of arguments `A` runs itself ([`Signal::BODY_WAITS`]).
#[inline(always)]
pub fn ready<A: Signal>() {
    prologue(A::EARLY);
}

/// [`launch_dependents`] once the calling thread takes the last item it will take (`item`
/// with `item + step >= items`, in a loop over `item, item + step, ..` below `items`). A
/// decode-size launch (one item per thread) signals at its first item, as [`prologue`] does
/// early; a prefill-size one near its end, so the dependents are not scheduled while it
/// streams. The quantizing MLA update (`crate::ops::update_rows_convert`) signals so: on the
/// H100, e4m3 rows at 16,384 tokens 103.5% -> 109.3% of the copy ceiling, 65,536 89.7% ->
/// 89.0%, and 0.05-0.15 µs less per decode-size update in a graph (session 16). The quantizing
/// slot update kept its early signal: with this one it held more spills and lost 1-1.5 points
/// and 0.06 µs.
#[inline(always)]
pub fn signal_at_last(item: u64, step: u64, items: u64) {
    if item.saturating_add(step) >= items {
        launch_dependents();
    }
}

/// The entry-point prologue: [`wait`], then [`launch_dependents`] when `early`.
#[inline(always)]
pub fn prologue(early: bool) {
    wait();
    if early {
        launch_dependents();
    }
}
