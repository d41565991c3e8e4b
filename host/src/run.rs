//! The runner: executes a [`Plan`] on the caller's stream, in order, without synchronising.
//! (The CPU emulator, [`crate::emulate`], executes the same plans on host memory.)

use cust::sys as cu;
use kvio_kernels::args::{CopyArgs, SliceArgs, SlotArgs};

use crate::driver::{check, Params, StreamRef};
use crate::error::Result;
use crate::module::Kvio;
use crate::plan::{Kernel, Plan};

impl Kvio {
    /// Enqueues `plan` on `stream`: its DMA spans, or its upload and then its launch.
    pub(crate) fn run(&self, plan: &Plan<'_>, stream: StreamRef<'_>) -> Result<()> {
        match plan {
            Plan::Nothing => Ok(()),
            Plan::Dma(spans) => {
                for s in spans {
                    // SAFETY: the planner validated both ranges against their pools (device or
                    // pinned, mapped memory the caller keeps alive for the work).
                    check("cuMemcpyAsync", unsafe {
                        cu::cuMemcpyAsync(s.dst, s.src, s.bytes as usize, stream.cu_stream())
                    })?;
                }
                Ok(())
            }
            Plan::Kernel { upload, launch } => {
                if let Some(u) = upload {
                    // SAFETY: the planner checked that `dst` holds `src.len()` bytes; the driver
                    // stages pageable host memory before returning, so `src` may go afterwards.
                    check("cuMemcpyHtoDAsync", unsafe {
                        cu::cuMemcpyHtoDAsync_v2(
                            u.dst,
                            u.src.as_ptr().cast(),
                            u.src.len(),
                            stream.cu_stream(),
                        )
                    })?;
                }
                let mut params = match &launch.kernel {
                    Kernel::Slots(a) => Params::new(&a.to_words(), &SlotArgs::SIZES),
                    Kernel::Slices(a) => Params::new(&a.to_words(), &SliceArgs::SIZES),
                    Kernel::Copy(a) | Kernel::Transfer(a) => {
                        Params::new(&a.to_words(), &CopyArgs::SIZES)
                    }
                };
                params.launch(
                    self.entry(&launch.kernel),
                    launch.grid,
                    launch.threads,
                    stream,
                )
            }
        }
    }
}
