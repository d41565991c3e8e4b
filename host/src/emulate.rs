//! CPU emulation of kvio's launches: the same host-side validation and planning, and the very
//! same kernel bodies (`kvio_kernels::ops`), run for every thread of the planned grid on the
//! CPU. For property tests and fuzzing without a GPU; far slower than the GPU.
//!
//! Every [`DeviceBytes`](crate::DeviceBytes) in the arguments must describe **host** memory
//! (`DeviceBytes::from_raw(vec.as_ptr() as u64, len)`), hence the `unsafe`.

use kvio_kernels::ops;

use crate::alloc::MemoryKind;
use crate::blocks::{check_device_map, check_host_map, copy_args, geometry, BlockCopy, BlockMap};
use crate::error::Result;
use crate::write::{plan_slices, plan_slots, SliceUpdate, SlotUpdate, BLOCK_THREADS};

/// Multiprocessors the emulated device pretends to have (it only sizes the grid).
const EMULATED_SMS: u32 = 2;

/// [`Kvio::update_slots`](crate::Kvio::update_slots) on host memory.
///
/// See the example of [`crate::SlotUpdate`].
///
/// # Safety
/// Every view in `op` (and the error word, if any) is valid host memory of its length.
pub unsafe fn update_slots(op: &SlotUpdate<'_>) -> Result<()> {
    if let Some((a, grid)) = plan_slots(op, EMULATED_SMS)? {
        // SAFETY: validated like a launch; the memory is host memory (caller).
        ops::emulate(grid, BLOCK_THREADS, a.shift, |g| unsafe {
            ops::update_slots(&a, g)
        });
    }
    Ok(())
}

/// [`Kvio::update_slices`](crate::Kvio::update_slices) on host memory.
///
/// See the example of [`crate::SliceUpdate`].
///
/// # Safety
/// As [`update_slots`].
pub unsafe fn update_slices(op: &SliceUpdate<'_>) -> Result<()> {
    let (a, grid) = plan_slices(op, EMULATED_SMS)?;
    // SAFETY: as above.
    ops::emulate(grid, BLOCK_THREADS, a.shift, |g| unsafe {
        ops::update_slices(&a, g)
    });
    Ok(())
}

/// [`Kvio::copy_blocks`](crate::Kvio::copy_blocks) on host memory, kernel backend, pools with
/// strided bases (pointer tables live on a device). All pools count as device memory.
///
/// See the example of [`crate::BlockCopy`].
///
/// # Safety
/// As [`update_slots`]; a device map's pairs are host memory too.
pub unsafe fn copy_blocks(op: &BlockCopy<'_>) -> Result<()> {
    let geo = geometry(op, |_| MemoryKind::Device)?;
    let (pairs, n) = match op.map {
        BlockMap::Host(p) => {
            check_host_map(op, p)?;
            (p.as_ptr() as u64, p.len())
        }
        BlockMap::Device { pairs, len } => {
            check_device_map(pairs, len)?;
            (pairs.ptr(), len)
        }
    };
    if let Some((a, grid, threads)) = copy_args(op, &geo, pairs, n, (EMULATED_SMS, EMULATED_SMS))? {
        // SAFETY: as above.
        ops::emulate(grid, threads, a.shift, |g| unsafe {
            ops::copy_blocks(&a, g)
        });
    }
    Ok(())
}
