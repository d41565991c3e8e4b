//! Launch geometry shared by every operation: CTA sizes, lanes per span, grid sizing and the
//! per-kernel occupancy caps measured when the module is loaded.

use cust::sys as cu;

use crate::driver::check;
use crate::error::Result;

/// Threads per CTA of the write-path kernels and of device-side block copies.
pub(crate) const BLOCK_THREADS: u32 = 256;
/// Threads per CTA of `kvio_update_stream_rot`: at 90 registers (sm_90) a multiprocessor holds
/// five 128-thread CTAs, 20 warps, where it held two of [`BLOCK_THREADS`], 16 (the stream's warps
/// work alone: the CTA size is free). On the H100 (BENCHMARKS.md, session 29) that took bf16
/// v0 prefill on 8- and 16-token pages 1.1–2.3 points up for one sequence and −0.1 to +4.2
/// for batches.
pub(crate) const ROT_THREADS: u32 = 128;
/// Threads per CTA of decode-size write-path kernels at their smallest (see [`cta_threads`]).
pub(crate) const SMALL_CTA_THREADS: u32 = 64;
/// Threads per CTA of the one-token-per-thread tiled update (`kvio_update_tiles_one`): one
/// warp, so a decode step's items spread over as many multiprocessors as there are warps (half
/// a warp where even that grid fits on the multiprocessors: [`one_cta_threads`]). Its v0 V
/// stores are one sector per element, and each multiprocessor's load/store unit takes a warp's
/// stores line by line: on the H100, in a graph, 32-thread CTAs wrote T = 1 / 16 in 1.30 /
/// 1.47 µs against 1.43 / 1.56 µs with 64, 16-thread CTAs T = 1 in 1.25 µs (but T = 256 in
/// 5.8 µs against 4.5 µs: a grid larger than the machine; BENCHMARKS.md, session 14).
pub(crate) const ONE_CTA_THREADS: u32 = 32;

/// Threads per CTA of `kvio_update_tiles_one` for `items` items (one thread each) on `sms`
/// multiprocessors: [`ONE_CTA_THREADS`], or half of it when the grid of half-warp CTAs still
/// fits on the multiprocessors (one CTA each).
pub(crate) fn one_cta_threads(items: u64, sms: u32) -> u32 {
    let half = ONE_CTA_THREADS / 2;
    if items.div_ceil(half as u64) <= sms as u64 {
        half
    } else {
        ONE_CTA_THREADS
    }
}
/// Threads per CTA of block copies touching host memory: few CTAs, many bytes in flight. The
/// build gives that entry point `.maxntid 512`, so ptxas may use 128 registers per thread:
/// each group holds three items' loads at once (`kvio_kernels::ops::TRANSFER_BATCH`), which
/// takes all 128 without spilling (at 1024 threads and 64 registers, even one item per group
/// spilled).
/// Bytes in flight per CTA: 512 threads × 3 items × 4 units × 16 B = 96 KiB, so the two
/// offload CTAs hold ~192 KiB, above the ~110 KB (55 GB/s × 2 µs) a PCIe link needs.
pub(crate) const TRANSFER_THREADS: u32 = 512;
/// Threads per CTA of the bulk-copy transfer (`kvio_transfer_blocks_tma`): one warp, whose
/// lanes each pipeline pieces through the CTA's 40 KiB of shared stages
/// (`kvio_kernels::bulk`).
pub(crate) const TMA_THREADS: u32 = kvio_kernels::bulk::THREADS;
/// Threads per CTA of the staged tiled update (`kvio_update_tiles_staged`): each thread owns
/// two stages of the CTA's 48 KiB of shared memory (`kvio_kernels::stage`).
pub(crate) const STAGED_THREADS: u32 = kvio_kernels::stage::THREADS;
/// Threads per CTA of the CTA-phase entries (`kvio_update_pages`, `kvio_update_pages_fp8`,
/// `kvio_update_pages_fp8_32`, `kvio_convert_pages`; `kvio_kernels::cta`).
pub(crate) const PAGE_THREADS: u32 = kvio_kernels::cta::THREADS;
/// kvio's PTX entry points, in the order of [`crate::KERNELS`] (`e as usize` indexes its name
/// there): what [`crate::Kvio`] loads, and what a plan's kernel runs
/// ([`Kernel::entry`](crate::plan::Kernel::entry)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    UpdateSlots,
    UpdateSlotsGeneral,
    UpdateRows,
    UpdateSlotsConvert,
    UpdateRowsConvert,
    UpdateTiles,
    UpdateTilesOne,
    UpdateStream,
    UpdateStreamRot,
    UpdateStreamFp8,
    UpdateTilesWide,
    UpdateTilesStaged,
    UpdatePages,
    UpdatePagesFp8,
    UpdatePagesFp8_32,
    UpdateSlices,
    SlicesToSlots,
    CopyBlocks,
    TransferBlocks,
    TransferBlocksTma,
    ConvertBlocks,
    ConvertPages,
    Noop,
    Wait,
    NaiveSpans,
    Spin,
    Produce,
}

impl Entry {
    /// Every entry point, in [`crate::KERNELS`]' order.
    pub(crate) const ALL: [Entry; 27] = [
        Entry::UpdateSlots,
        Entry::UpdateSlotsGeneral,
        Entry::UpdateRows,
        Entry::UpdateSlotsConvert,
        Entry::UpdateRowsConvert,
        Entry::UpdateTiles,
        Entry::UpdateTilesOne,
        Entry::UpdateStream,
        Entry::UpdateStreamRot,
        Entry::UpdateStreamFp8,
        Entry::UpdateTilesWide,
        Entry::UpdateTilesStaged,
        Entry::UpdatePages,
        Entry::UpdatePagesFp8,
        Entry::UpdatePagesFp8_32,
        Entry::UpdateSlices,
        Entry::SlicesToSlots,
        Entry::CopyBlocks,
        Entry::TransferBlocks,
        Entry::TransferBlocksTma,
        Entry::ConvertBlocks,
        Entry::ConvertPages,
        Entry::Noop,
        Entry::Wait,
        Entry::NaiveSpans,
        Entry::Spin,
        Entry::Produce,
    ];

    /// Its name in the PTX.
    pub(crate) fn name(self) -> &'static str {
        crate::ptx::KERNELS[self as usize]
    }

    /// The CTA size a plan launches it with at the most, at which
    /// [`Kvio::load`](crate::Kvio::load) measures its occupancy cap ([`GridCap`]); never more
    /// than the `.maxntid` its PTX declares (`host/build.rs`). `None`: the bench's and tests'
    /// helpers, which no plan launches.
    pub(crate) fn cta_threads(self) -> Option<u32> {
        Some(match self {
            Entry::UpdateTilesOne => ONE_CTA_THREADS,
            Entry::UpdateStreamRot => ROT_THREADS,
            Entry::UpdateTilesStaged => STAGED_THREADS,
            Entry::UpdatePages
            | Entry::UpdatePagesFp8
            | Entry::UpdatePagesFp8_32
            | Entry::ConvertPages => PAGE_THREADS,
            Entry::TransferBlocks => TRANSFER_THREADS,
            Entry::TransferBlocksTma => TMA_THREADS,
            Entry::Noop | Entry::Wait | Entry::NaiveSpans | Entry::Spin | Entry::Produce => {
                return None
            }
            _ => BLOCK_THREADS,
        })
    }
}

/// Accesses each lane of a group is given per span (enough loads in flight, few idle lanes).
pub(crate) const PER_LANE: u64 = 4;
/// Default CTA budget of block copies when a pool is in host memory (leaves the SMs to the
/// model).
pub const DEFAULT_TRANSFER_CTAS: u32 = 4;
/// Default CTA budget of the bulk-copy path (`Backend::Tma`) when a pool is in host memory:
/// its CTAs are one warp each, and on the H200 it takes four times the kernel's CTA count (a
/// quarter of its threads) to move as many bytes (8 one-warp CTAs offload at 94% of the
/// pinned ceiling, 2 at 31%).
pub const DEFAULT_TMA_TRANSFER_CTAS: u32 = 4 * DEFAULT_TRANSFER_CTAS;

/// Most CTAs of each kernel that are resident on the whole device at once, measured at its
/// [`Entry::cta_threads`]. The grids are persistent (kernels loop over their work), so no
/// launch asks for more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GridCap {
    /// Multiprocessors of the device.
    pub(crate) sms: u32,
    /// Per entry point, indexed by [`Entry`] (0 for the helpers no plan launches, and for
    /// `kvio_transfer_blocks_tma` before `sm_90`: the path is not offered there).
    pub(crate) ctas: [u32; Entry::ALL.len()],
}

impl GridCap {
    /// The same cap for every kernel (tests and the CPU emulation).
    pub(crate) const fn uniform(cap: u32) -> Self {
        GridCap {
            sms: cap,
            ctas: [cap; Entry::ALL.len()],
        }
    }

    /// The cap of entry point `e`.
    pub(crate) fn of(&self, e: Entry) -> u32 {
        self.ctas[e as usize]
    }
}

/// CTAs of `threads` threads for `items` work items handled by groups of `1 << shift` lanes,
/// at least one and at most `cap` (the kernels loop over the rest).
pub(crate) fn grid_for(items: u64, threads: u32, shift: u32, cap: u32) -> u32 {
    let groups_per_cta = (threads >> shift).max(1) as u64;
    items.div_ceil(groups_per_cta).clamp(1, cap.max(1) as u64) as u32
}

/// Threads per CTA for `items` work items handled by groups of `1 << shift` lanes on a device
/// of `sms` multiprocessors: [`BLOCK_THREADS`], or, at decode sizes (fewer 256-thread CTAs
/// than multiprocessors), smaller CTAs (down to [`SMALL_CTA_THREADS`], never below one group)
/// while the grid still fits on the multiprocessors: a decode-size update is bound by each
/// multiprocessor's load/store bandwidth, so spreading its bytes over more of them shortens
/// it.
pub(crate) fn cta_threads(items: u64, shift: u32, sms: u32) -> u32 {
    let lanes = items.saturating_mul(1 << shift);
    let floor = SMALL_CTA_THREADS.max(1 << shift);
    let mut threads = BLOCK_THREADS;
    while threads / 2 >= floor && lanes.div_ceil((threads / 2) as u64) <= sms as u64 {
        threads /= 2;
    }
    threads
}

/// Resident CTAs of `threads` threads on the whole device (`sms` multiprocessors) for kernel
/// `f`, at least one per multiprocessor.
pub(crate) fn resident_ctas(f: cu::CUfunction, threads: u32, sms: u32) -> Result<u32> {
    let mut n = 0;
    // SAFETY: out-pointer to a local; `f` is a loaded kernel.
    check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
        cu::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, f, threads as i32, 0)
    })?;
    Ok(sms * (n.max(0) as u32).max(1))
}

#[cfg(test)]
mod tests {
    use super::{cta_threads, Entry, BLOCK_THREADS, SMALL_CTA_THREADS};
    use crate::Arch;

    /// Decode-size updates spread over the multiprocessors in smaller CTAs; larger ones keep
    /// full CTAs; a CTA never holds less than one group.
    #[test]
    fn cta_threads_spread_decode_sizes() {
        // NHD K+V, 8 heads: 16 items a token, groups of 4 lanes; 132 multiprocessors.
        let nhd = |t: u64| cta_threads(16 * t, 2, 132);
        assert_eq!(nhd(1), SMALL_CTA_THREADS); // 64 lanes: one CTA either way
        assert_eq!(nhd(16), SMALL_CTA_THREADS); // 16 CTAs instead of 4
        assert_eq!(nhd(64), SMALL_CTA_THREADS); // 64 CTAs instead of 16
        assert_eq!(nhd(256), 128); // 128 CTAs instead of 64 (256 of 64 would not fit)
        assert_eq!(nhd(4096), BLOCK_THREADS);
        // Groups wider than the smallest CTA keep one group per CTA at least.
        assert_eq!(cta_threads(1, 8, 132), 256);
        assert_eq!(cta_threads(4, 7, 132), 128);
        // A device with few multiprocessors keeps full CTAs sooner.
        assert_eq!(cta_threads(16 * 16, 2, 2), BLOCK_THREADS);
        // v0 decode, 8 heads of 16 groups: T = 1 and 16 on half warps, T = 64 on warps.
        let v0 = |t: u64| super::one_cta_threads(t * 8 * 16, 132);
        assert_eq!((v0(1), v0(16), v0(64)), (16, 16, 32));
    }

    /// `Entry::X` is `kvio_x` in `KERNELS` (its name from its own spelling, so an entry out of
    /// order or renamed on one side fails).
    #[test]
    fn entries_follow_the_kernel_list() {
        assert_eq!(Entry::ALL.len(), crate::KERNELS.len());
        for (i, e) in Entry::ALL.into_iter().enumerate() {
            assert_eq!(e as usize, i);
            let mut snake = String::from("kvio");
            for c in format!("{e:?}").chars() {
                if c.is_ascii_uppercase() {
                    snake.push('_');
                }
                snake.push(c.to_ascii_lowercase());
            }
            assert_eq!(e.name(), snake);
        }
    }

    /// Every entry's largest CTA fits the `.maxntid` its PTX declares (a launch past it would
    /// fail), in both builds.
    #[test]
    fn cta_sizes_fit_the_ptx() {
        for arch in [Arch::Sm80, Arch::Sm90] {
            let text = crate::ptx(arch);
            for e in Entry::ALL {
                let Some(threads) = e.cta_threads() else {
                    continue;
                };
                let start = text.find(&format!(".entry {}(", e.name())).unwrap();
                let close = start + text[start..].find("\n)\n").unwrap() + 3;
                let max = text[close..]
                    .strip_prefix(".maxntid ")
                    .map_or(1024, |rest| {
                        rest.split(',').next().unwrap().parse().unwrap()
                    });
                assert!(threads <= max, "{arch:?} {}: {threads} > {max}", e.name());
            }
        }
    }
}
