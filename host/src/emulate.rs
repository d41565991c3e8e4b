//! CPU emulation of kvio's operations: the same planner as on a GPU (validation, backend choice,
//! staging) produces the same `Plan`; here its DMA spans and uploads are `memcpy`s and its
//! launch runs the very same kernel bodies (`kvio_kernels::ops`) for every thread of the planned
//! grid. For property tests and fuzzing without a GPU; far slower than the GPU.
//!
//! The `*_counted` functions also give the kernels an error word, in host memory (a
//! [`DeviceErrors`](crate::DeviceErrors) lives on a device), and return what they counted: the
//! in-kernel guards of device-resident indices are tested without a GPU too.
//!
//! Every [`DeviceBytes`](crate::DeviceBytes) in the arguments must describe **host** memory
//! (`DeviceBytes::from_raw(vec.as_ptr() as u64, len)`), hence the `unsafe`. All memory counts as
//! device memory (so block copies take the device-side entry point).

use kvio_kernels::ops;

use crate::alloc::MemoryKind;
use crate::blocks::{self, Backend, BlockCopy};
use crate::error::{Error, Result};
use crate::error_word::{ErrorCounts, WORDS};
use crate::launch::{Entry, GridCap};
use crate::plan::{Kernel, Launch, Plan, Staging, Target};
use crate::write::{plan as write_plan, MlaUpdate, SliceUpdate, SlotUpdate};

/// The pretend device: two multiprocessors' worth of CTAs for every kernel (it only sizes the
/// grid), all memory device memory, scratch for host maps (a host vector here).
const EMULATED: Target<'static> = Target {
    caps: GridCap::uniform(2),
    kind_of: &|_| MemoryKind::Device,
    scratch: true,
    batched_dma: false,
};

/// [`Kvio::update_slots`](crate::Kvio::update_slots) on host memory.
///
/// See the example of [`crate::SlotUpdate`].
///
/// # Safety
/// Every view in `op` (and the error word, if any) is valid host memory of its length.
pub unsafe fn update_slots(op: &SlotUpdate<'_>) -> Result<()> {
    // SAFETY: forwarded.
    unsafe { run(&write_plan::slots(op, &EMULATED)?, None) };
    Ok(())
}

/// [`update_slots`], returning what its kernels counted in an error word (see the module
/// documentation); `op`'s own error word, if any, is not used.
///
/// # Safety
/// As [`update_slots`].
pub unsafe fn update_slots_counted(op: &SlotUpdate<'_>) -> Result<ErrorCounts> {
    // SAFETY: forwarded.
    Ok(unsafe { counted(&write_plan::slots(op, &EMULATED)?) })
}

/// Bytes of slot list the pretend device's scratch holds (1 Mi rows): a slice update through
/// a slot list of more source rows needs [`SliceUpdate::slot_list`] here.
pub const SCRATCH_LIST_BYTES: usize = 4 << 20;

/// [`Kvio::update_slices`](crate::Kvio::update_slices) on host memory. A slot list in
/// scratch holds at most [`SCRATCH_LIST_BYTES`] (a typed error beyond).
///
/// See the example of [`crate::SliceUpdate`].
///
/// # Safety
/// As [`update_slots`].
pub unsafe fn update_slices(op: &SliceUpdate<'_>) -> Result<()> {
    // SAFETY: forwarded.
    unsafe { run(&slices_plan(op)?, None) };
    Ok(())
}

/// [`update_slices`], returning what its kernels counted in an error word (see the module
/// documentation); `op`'s own error word, if any, is not used.
///
/// # Safety
/// As [`update_slots`].
pub unsafe fn update_slices_counted(op: &SliceUpdate<'_>) -> Result<ErrorCounts> {
    // SAFETY: forwarded.
    Ok(unsafe { counted(&slices_plan(op)?) })
}

/// The plan of a slice update on the pretend device, whose scratch holds at most
/// [`SCRATCH_LIST_BYTES`] of slot list.
fn slices_plan<'a>(op: &SliceUpdate<'a>) -> Result<Plan<'a>> {
    let plan = write_plan::slices(op, &EMULATED)?;
    if let Plan::Expand {
        tokens,
        list: Staging::Scratch,
        ..
    } = plan
    {
        if tokens > SCRATCH_LIST_BYTES / 4 {
            return Err(Error::InvalidArgument {
                name: "slot_list",
                value: "None".into(),
                reason: "the emulation's scratch holds slot lists of up to 1 Mi rows: pass a \
                         slot list",
            });
        }
    }
    Ok(plan)
}

/// [`Kvio::update_mla`](crate::Kvio::update_mla) on host memory.
///
/// See the example of [`crate::MlaUpdate`].
///
/// # Safety
/// As [`update_slots`].
pub unsafe fn update_mla(op: &MlaUpdate<'_>) -> Result<()> {
    // SAFETY: forwarded.
    unsafe { run(&write_plan::mla(op, &EMULATED)?, None) };
    Ok(())
}

/// [`update_mla`], returning what its kernels counted in an error word (see the module
/// documentation); `op`'s own error word, if any, is not used.
///
/// # Safety
/// As [`update_slots`].
pub unsafe fn update_mla_counted(op: &MlaUpdate<'_>) -> Result<ErrorCounts> {
    // SAFETY: forwarded.
    Ok(unsafe { counted(&write_plan::mla(op, &EMULATED)?) })
}

/// [`Kvio::copy_blocks`](crate::Kvio::copy_blocks) on host memory; returns the backend that
/// ran. Pools with a [`LayerTable`](crate::LayerTable) need a GPU (the table lives there).
///
/// See the example of [`crate::BlockCopy`].
///
/// # Safety
/// As [`update_slots`]; a device map's pairs and the staging buffer are host memory too.
pub unsafe fn copy_blocks(op: &BlockCopy<'_>) -> Result<Backend> {
    let (backend, plan) = blocks::plan(op, &EMULATED)?;
    // SAFETY: forwarded.
    unsafe { run(&plan, None) };
    Ok(backend)
}

/// [`copy_blocks`], returning also what its kernels counted in an error word (see the module
/// documentation; the DMA backend counts nothing); `op`'s own error word, if any, is not used.
///
/// # Safety
/// As [`copy_blocks`].
pub unsafe fn copy_blocks_counted(op: &BlockCopy<'_>) -> Result<(Backend, ErrorCounts)> {
    let (backend, plan) = blocks::plan(op, &EMULATED)?;
    // SAFETY: forwarded.
    Ok((backend, unsafe { counted(&plan) }))
}

/// Executes a validated plan on host memory with an error word of its own, and returns its
/// counters.
///
/// # Safety
/// As [`run`].
unsafe fn counted(plan: &Plan<'_>) -> ErrorCounts {
    let mut word = [0u32; WORDS];
    // SAFETY: forwarded; the word is WORDS aligned u32 alive for the call.
    unsafe { run(plan, Some(word.as_mut_ptr() as u64)) };
    ErrorCounts::of(&word)
}

/// Executes a validated plan on host memory, in the order the GPU runner enqueues it; with
/// `errors`, its kernels count what they refuse there instead of in the plan's error word.
///
/// # Safety
/// Every address in the plan is host memory valid for what the plan does with it; `errors`
/// points at `WORDS` aligned `u32`.
unsafe fn run(plan: &Plan<'_>, errors: Option<u64>) {
    match plan {
        Plan::Nothing => {}
        Plan::Dma(spans) => {
            for s in spans.iter() {
                // SAFETY: validated spans in host memory (caller).
                unsafe { std::ptr::copy(s.src as *const u8, s.dst as *mut u8, s.bytes as usize) };
            }
        }
        Plan::Expand {
            expand,
            update,
            tokens,
            list,
        } => {
            // Scratch for the slot list, as aligned as the runner's (its planned alignment).
            #[repr(C, align(256))]
            struct Block([i32; 64]);
            let mut scratch: Vec<Block> = Vec::new();
            let at = match list {
                Staging::Given(ptr) => *ptr,
                Staging::Scratch => {
                    scratch = (0..tokens.div_ceil(64).max(1))
                        .map(|_| Block([0; 64]))
                        .collect();
                    scratch.as_mut_ptr() as u64
                }
            };
            // Every row no slice names stays -1, as the runner's memset leaves it.
            // SAFETY: the list holds `tokens` i32 of host memory (the caller's checked
            // buffer, or the scratch above).
            unsafe { std::ptr::write_bytes(at as *mut u8, 0xFF, tokens * 4) };
            for l in std::iter::once(expand).chain(update) {
                let kernel = l.kernel.with_list(at);
                let kernel = errors.map_or(kernel, |e| kernel.with_errors(e));
                // SAFETY: forwarded; the list holds at least `tokens` i32 of host memory.
                unsafe { emulate_launch(kernel, l) };
            }
            drop(scratch); // alive until the kernel bodies have run
        }
        Plan::Kernel {
            upload,
            launch,
            then,
        } => {
            let mut scratch: Vec<u64> = Vec::new();
            let mut map = None;
            if let Some(u) = upload {
                let to = match u.dst {
                    Staging::Given(ptr) => ptr as *mut u8,
                    Staging::Scratch => {
                        scratch = vec![0; u.src.len().div_ceil(8)];
                        map = Some(scratch.as_ptr() as u64);
                        scratch.as_mut_ptr().cast()
                    }
                };
                // SAFETY: `to` holds `src.len()` bytes of host memory (the caller's staging,
                // or the scratch vector above).
                unsafe { std::ptr::copy_nonoverlapping(u.src.as_ptr(), to, u.src.len()) };
            }
            for l in std::iter::once(launch).chain(then) {
                let kernel = map.map_or(l.kernel, |m| l.kernel.with_map(m));
                let kernel = errors.map_or(kernel, |e| kernel.with_errors(e));
                // SAFETY: forwarded (the map, if any, uploaded above).
                unsafe { emulate_launch(kernel, l) };
            }
            drop(scratch); // alive until the kernel bodies have run
        }
    }
}

/// Runs one launch of a plan on host memory: the body of the entry point a GPU launch of it
/// runs ([`Kernel::entry`], the one place that chooses it), so the emulated tests run the
/// code the GPU would.
///
/// # Safety
/// As [`run`].
unsafe fn emulate_launch(kernel: Kernel, launch: &Launch) {
    let entry = kernel.entry();
    // What a GPU launch of the plan would need: the CTA size its entry point takes.
    debug_assert!(
        entry.cta_threads().is_some_and(|t| launch.threads <= t),
        "{entry:?}: {} threads",
        launch.threads
    );
    match (entry, &kernel) {
        // SAFETY: as below; a whole CTA per item, phase by phase.
        (
            Entry::UpdatePages | Entry::UpdatePagesFp8 | Entry::UpdatePagesFp8_32,
            Kernel::Tiles(a),
        ) => return unsafe { ops::emulate_pages(a, launch.grid) },
        // SAFETY: as above.
        (Entry::ConvertPages, Kernel::Convert(a)) => {
            return unsafe { ops::emulate_convert_pages(a, launch.grid) }
        }
        _ => {}
    }
    // SAFETY: arguments validated like a launch; the memory is host memory (caller).
    ops::emulate(launch.grid, launch.threads, kernel.shift(), |g| unsafe {
        match (entry, &kernel) {
            (Entry::UpdateRowsConvert, Kernel::Slots(a)) => ops::update_rows_convert(a, g),
            (Entry::UpdateSlotsConvert, Kernel::Slots(a)) => ops::update_slots_convert(a, g),
            (Entry::UpdateSlotsGeneral, Kernel::Slots(a)) => ops::update_slots_general(a, g),
            (Entry::UpdateRows, Kernel::Slots(a)) => ops::update_rows(a, g),
            (Entry::UpdateSlots, Kernel::Slots(a)) => ops::update_slots(a, g),
            (Entry::UpdateTilesWide, Kernel::Tiles(a)) => ops::update_tiles_wide(a, g),
            (Entry::UpdateStreamFp8, Kernel::Tiles(a)) => ops::update_stream_fp8(a, g),
            (Entry::UpdateStreamRot, Kernel::Tiles(a)) => ops::update_stream_rot(a, g),
            (Entry::UpdateStream, Kernel::Tiles(a)) => ops::update_stream(a, g),
            (Entry::UpdateTilesOne, Kernel::Tiles(a)) => ops::update_tiles_one(a, g),
            (Entry::UpdateTilesStaged, Kernel::Tiles(a)) => ops::update_tiles_staged(a, g),
            (Entry::UpdateTiles, Kernel::Tiles(a)) => ops::update_tiles(a, g),
            (Entry::UpdateSlices, Kernel::Slices(a)) => ops::update_slices(a, g),
            (Entry::SlicesToSlots, Kernel::Expand(a)) => ops::slices_to_slots(a, g),
            (Entry::CopyBlocks, Kernel::Copy(a)) => ops::copy_blocks(a, g),
            (Entry::TransferBlocks, Kernel::Transfer(a)) => ops::transfer_blocks(a, g),
            (Entry::TransferBlocksTma, Kernel::TransferTma(a)) => ops::transfer_blocks_tma(a, g),
            (Entry::ConvertBlocks, Kernel::Convert(a)) => ops::convert_blocks(a, g),
            // `Kernel::entry` gives each variant only entries that take its arguments, and
            // the pages entries returned above.
            (entry, _) => unreachable!("{entry:?} is not a plan's per-thread entry"),
        }
    });
}
