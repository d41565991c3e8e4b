//! The runner: executes a [`Plan`] on the caller's stream, in order, without synchronising.
//! (The CPU emulator, [`crate::emulate`], executes the same plans on host memory.)
//!
//! Driver calls per operation, planning and running together (the per-call floor, issue 13;
//! bench group `host` measures them). Nothing else reaches the driver per call: no context or
//! device query, no function lookup (entry points and occupancy caps are resolved by
//! [`Kvio::load`](crate::Kvio::load)), no synchronisation, and no heap allocation up to 64 host
//! pairs, 16 DMA spans and 64 batched copies (beyond, one allocation per list).
//! - `update_slots`, `update_mla`, `update_slices`: one launch, `cuLaunchKernelEx` with
//!   programmatic dependent launch where it is supported (the default, unless the
//!   [`StreamRef`] says `pdl(false)`), else `cuLaunchKernel`.
//! - `update_slices` of a layout the row copy does not write (pieces, heads apart, a value
//!   part, fp8): `cuMemAllocFromPoolAsync` + `cuMemsetD32Async` + the expansion's plain
//!   launch + the slot update's launch (as above) + `cuMemFreeAsync`; the caller's
//!   `SliceUpdate::slot_list` saves the allocation and the free.
//! - `copy_blocks`, planning: one `cuPointerGetAttributes` per pool given as one strided
//!   range (`blocks::plan::geometry`): whether it is device or pinned host memory decides the
//!   entry point and CTA size, and refuses memory the kernels cannot reach. The answer cannot
//!   be cached by address, since the caller may free and reuse the range between calls; a
//!   [`LayerTable`](crate::LayerTable) classifies its caches once, when it is built.
//! - `copy_blocks`, kernel backend: one plain launch (programmatic only when the
//!   [`StreamRef`] asks with `pdl(true)`), after the host map's upload if the map is
//!   on the host: `cuMemcpyHtoDAsync` into the caller's staging buffer, or else
//!   `cuMemAllocFromPoolAsync` + `cuMemcpyHtoDAsync` + launch + `cuMemFreeAsync` on kvio's
//!   scratch pool (stream-ordered, so concurrent streams never share the bytes and graph
//!   capture records them as nodes).
//! - `copy_blocks`, DMA backend: `cuStreamIsCapturing` (under capture kvio enqueues the
//!   per-span copies) and one `cuMemcpyBatchAsync` for all spans where the driver has it
//!   (CUDA ≥ 12.8, more than one span, not the legacy default stream); else one
//!   `cuMemcpyAsync` per span.

use cust::sys as cu;

use crate::driver::{capturing, check, LaunchKernelEx, StreamRef};
use crate::error::{Error, Result};
use crate::module::Kvio;
use crate::plan::{Kernel, Launch, Plan, Staging};

impl Kvio {
    /// Enqueues `plan` on `stream`: its DMA spans, or its upload and then its launch.
    pub(crate) fn run(&self, plan: &Plan<'_>, stream: StreamRef<'_>) -> Result<()> {
        match plan {
            Plan::Nothing => Ok(()),
            Plan::Dma(spans) => {
                // One batched driver call where the driver has one (CUDA ≥ 12.8); the per-span
                // loop on older drivers, on the legacy default stream (which the batch call
                // refuses) and under graph capture.
                let raw = stream.cu_stream();
                if let Some(batch) = self.memcpy_batch() {
                    if spans.len() > 1 && !raw.is_null() && !capturing(raw)? {
                        // SAFETY: as for the loop below; the spans of one plan never overlap
                        // (the planner refuses a destination written twice or read and
                        // written).
                        return unsafe { batch.copy(spans, raw) };
                    }
                }
                for s in spans.iter() {
                    // SAFETY: the planner validated both ranges against their pools (device or
                    // pinned, mapped memory the caller keeps alive for the work).
                    check("cuMemcpyAsync", unsafe {
                        cu::cuMemcpyAsync(s.dst, s.src, s.bytes as usize, stream.cu_stream())
                    })?;
                }
                Ok(())
            }
            Plan::Expand {
                expand,
                update,
                tokens,
                list,
            } => {
                let (list, scratch) = match list {
                    Staging::Given(ptr) => (*ptr, None),
                    Staging::Scratch => {
                        let s = self.scratch_for("slot_list")?;
                        (s.take(tokens.max(&1) * 4, stream)?, Some(s))
                    }
                };
                // Every row no slice names stays -1 (skipped by the slot update).
                let filled = if *tokens == 0 {
                    Ok(())
                } else {
                    // SAFETY: `list` holds `tokens` i32 for the work enqueued on `stream`
                    // (the caller's checked buffer, or scratch of that size).
                    check("cuMemsetD32Async", unsafe {
                        cu::cuMemsetD32Async(list, u32::MAX, *tokens, stream.cu_stream())
                    })
                };
                // After a memset: the expansion launches plainly; the update after it is a
                // kernel after a kernel.
                let launched = filled.and_then(|()| {
                    self.launch(expand.kernel.with_list(list), expand, stream, None)?;
                    match update {
                        Some(u) => self.launch(
                            u.kernel.with_list(list),
                            u,
                            stream,
                            self.launch_ex(stream, true),
                        ),
                        None => Ok(()),
                    }
                });
                // Scratch given back after the launches (or at once if nothing was enqueued).
                let back = scratch.map_or(Ok(()), |s| s.give_back(list, stream));
                launched?;
                back
            }
            Plan::Kernel {
                upload,
                launch,
                then,
            } => {
                let Some(u) = upload else {
                    // The only launches that may be programmatic: kernel after kernel.
                    for l in std::iter::once(launch).chain(then) {
                        self.launch(
                            l.kernel,
                            l,
                            stream,
                            self.launch_ex(stream, l.kernel.writes()),
                        )?;
                    }
                    return Ok(());
                };
                let to = match u.dst {
                    Staging::Given(ptr) => ptr,
                    Staging::Scratch => self.scratch_for("staging")?.take(u.src.len(), stream)?,
                };
                // SAFETY: `to` holds `src.len()` bytes (checked staging, or scratch of that
                // size); the driver stages pageable host memory before returning, so `src`
                // may go afterwards.
                let copied = check("cuMemcpyHtoDAsync", unsafe {
                    cu::cuMemcpyHtoDAsync_v2(
                        to,
                        u.src.as_ptr().cast(),
                        u.src.len(),
                        stream.cu_stream(),
                    )
                });
                // After a copy: plain launches (a programmatic dependency is one between
                // kernels).
                let launched = copied.and_then(|()| {
                    for l in std::iter::once(launch).chain(then) {
                        let kernel = match u.dst {
                            Staging::Given(_) => l.kernel,
                            Staging::Scratch => l.kernel.with_map(to),
                        };
                        self.launch(kernel, l, stream, None)?;
                    }
                    Ok(())
                });
                if u.dst == Staging::Scratch {
                    // Given back after the launch (or at once if nothing was enqueued).
                    let back = self.scratch().map_or(Ok(()), |s| s.give_back(to, stream));
                    launched?;
                    return back;
                }
                launched
            }
        }
    }

    /// kvio's scratch pool, for a plan that put `name` (the caller's buffer it stands in for)
    /// there; a typed error naming `name` on a device without memory pools (the planner
    /// checks this first, from the same [`Target`](crate::plan::Target)).
    fn scratch_for(&self, name: &'static str) -> Result<&crate::scratch::Scratch> {
        self.scratch().ok_or(Error::InvalidArgument {
            name,
            value: "None".into(),
            reason: "this device has no memory pools: pass the buffer",
        })
    }

    /// Launches `kernel` with `launch`'s grid and CTA size, programmatically through `ex`
    /// when given (every kernel of a plan waits for its programmatic prerequisites first).
    fn launch(
        &self,
        kernel: Kernel,
        launch: &Launch,
        stream: StreamRef<'_>,
        ex: Option<LaunchKernelEx>,
    ) -> Result<()> {
        kernel
            .params()
            .launch_with(self.entry(&kernel), launch.grid, launch.threads, stream, ex)
    }
}
