//! [`Kvio`]: kvio's kernels loaded into the caller's current context.

use std::ffi::CString;
use std::ptr;

use cust::sys as cu;

use crate::alloc::memory_kind;
use crate::driver::{
    check, current_context, current_device, device_attribute, with_ctx, LaunchKernelEx, MemcpyBatch,
};
use crate::error::{Error, Result};
use crate::launch::{resident_ctas, Entry, GridCap};
use crate::plan::{Kernel, Target};
use crate::ptx::{ptx, sass, Arch, Code};
use crate::scratch::Scratch;

/// Kvio's kernels, loaded into one CUDA context. Load once, at set-up time; every operation is
/// a method that plans it (all validation, on the host) and runs the plan on the caller's
/// stream.
///
/// ```no_run
/// # fn main() -> kvio::Result<()> {
/// let _ctx = kvio::PrimaryContext::retain(0)?; // or a context made current by cudarc/candle
/// let kv = kvio::Kvio::load()?;
/// println!("loaded PTX for {:?}", kv.arch());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Kvio {
    ctx: cu::CUcontext,
    module: cu::CUmodule,
    /// Every entry point, indexed by [`Entry`].
    functions: [cu::CUfunction; Entry::ALL.len()],
    sm_count: u32,
    grid_cap: GridCap,
    arch: Arch,
    code: Code,
    /// Where host block maps go without a staging buffer (`None`: no memory pools).
    scratch: Option<Scratch>,
    memcpy_batch: Option<MemcpyBatch>,
    /// `cuLaunchKernelEx` for programmatic dependent launch: `Some` only with the `sm_90` PTX
    /// (whose entry points wait) on a driver of CUDA ≥ 12.3.
    launch_ex: Option<LaunchKernelEx>,
}

/// The compute capability `(major, minor)` of `dev`.
fn compute_capability(dev: cu::CUdevice) -> Result<(i32, i32)> {
    use cu::CUdevice_attribute::*;
    Ok((
        device_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        device_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    ))
}

/// Loads `arch`'s kernels into the current context, whose device has compute capability
/// `(major, minor)`: their machine code where the device runs it (feature `sass`,
/// [`Arch::runs_sass_on`]), else their PTX. A cubin the device should run but the driver
/// refuses is an error, not a silent fall-back to the PTX.
fn load_module(arch: Arch, (major, minor): (i32, i32)) -> Result<(cu::CUmodule, Code)> {
    let mut module = ptr::null_mut();
    if let Some(bin) = sass(arch) {
        if arch.runs_sass_on(major, minor) {
            // SAFETY: a cubin assembled from this build's PTX for `arch`, 8-byte aligned as the
            // driver reads it (`ptx.rs`), static; out-pointer to a local; a context is current.
            check("cuModuleLoadData", unsafe {
                cu::cuModuleLoadData(&mut module, bin.as_ptr().cast())
            })?;
            return Ok((module, Code::Sass));
        }
    }
    let text = CString::new(ptx(arch))
        .map_err(|_| crate::error::invalid("ptx", arch, "PTX holds a NUL byte"))?;
    // SAFETY: NUL-terminated PTX text; out-pointer to a local; a context is current.
    check("cuModuleLoadData", unsafe {
        cu::cuModuleLoadData(&mut module, text.as_ptr().cast())
    })?;
    Ok((module, Code::Ptx))
}

impl Kvio {
    /// Loads the PTX that fits the current context's device (`sm_90` on compute capability 9.x
    /// and later, `sm_80` on 8.x): with the `sass` feature its machine code where the device
    /// runs it ([`Arch::runs_sass_on`]), else the PTX, which the driver compiles at load time
    /// where its cache does not hold it yet (tens of seconds for kvio's PTX, the README's
    /// "Loading"; what the feature saves). [`Kvio::code`] tells which was loaded.
    pub fn load() -> Result<Self> {
        let dev = current_device()?;
        let (major, minor) = compute_capability(dev)?;
        let arch = Arch::for_compute_capability(major, minor)
            .ok_or(Error::UnsupportedDevice { major, minor })?;
        Self::load_on(arch, dev, (major, minor))
    }

    /// Loads the PTX of a given architecture (it must not be newer than the device).
    ///
    /// ```no_run
    /// # fn main() -> kvio::Result<()> {
    /// let _ctx = kvio::PrimaryContext::retain(0)?;
    /// // The sm_80 build on a Hopper GPU (for comparisons; `Kvio::load` picks sm_90 there).
    /// let kv = kvio::Kvio::load_arch(kvio::Arch::Sm80)?;
    /// assert_eq!(kv.arch(), kvio::Arch::Sm80);
    /// # Ok(()) }
    /// ```
    pub fn load_arch(arch: Arch) -> Result<Self> {
        let dev = current_device()?;
        Self::load_on(arch, dev, compute_capability(dev)?)
    }

    /// [`Kvio::load_arch`] on the current context's device `dev`, of compute capability `cc`
    /// (queried once by the caller).
    fn load_on(arch: Arch, dev: cu::CUdevice, cc: (i32, i32)) -> Result<Self> {
        let ctx = current_context()?;
        let sms = device_attribute(
            dev,
            cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?;
        let (module, code) = load_module(arch, cc)?;
        let mut this = Kvio {
            ctx,
            module,
            functions: [ptr::null_mut(); Entry::ALL.len()],
            sm_count: sms.max(1) as u32,
            grid_cap: GridCap::uniform(1),
            arch,
            code,
            scratch: None,
            memcpy_batch: MemcpyBatch::resolve(),
            launch_ex: match arch {
                Arch::Sm90 => LaunchKernelEx::resolve(),
                Arch::Sm80 => None,
            },
        };
        for e in Entry::ALL {
            this.functions[e as usize] = this.function(e.name())?;
        }
        // Its CTAs each hold 48 KiB of staging: ask for the largest shared-memory carveout, so
        // four fit on a multiprocessor (the driver's default split fit three on the H100).
        // SAFETY: a loaded kernel; the attribute takes a percentage.
        check("cuFuncSetAttribute", unsafe {
            cu::cuFuncSetAttribute(
                this.func(Entry::UpdateTilesStaged),
                cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                100,
            )
        })?;
        // Persistent grids: never more CTAs than can be resident at once.
        let sms = this.sm_count;
        let mut ctas = [0; Entry::ALL.len()];
        for e in Entry::ALL {
            ctas[e as usize] = match e.cta_threads() {
                // The sm_80 module's bulk-copy entry is plain copies: never offered there.
                _ if e == Entry::TransferBlocksTma && arch == Arch::Sm80 => 0,
                Some(threads) => resident_ctas(this.func(e), threads, sms)?,
                None => 0, // a bench or test helper: no plan launches it
            };
        }
        this.grid_cap = GridCap { sms, ctas };
        this.scratch = Scratch::new(ctx, dev)?;
        Ok(this)
    }

    fn function(&self, name: &str) -> Result<cu::CUfunction> {
        let cname = CString::new(name).expect("kernel names have no NUL");
        let mut f = ptr::null_mut();
        // SAFETY: the module is loaded; out-pointer to a local.
        check("cuModuleGetFunction", unsafe {
            cu::cuModuleGetFunction(&mut f, self.module, cname.as_ptr())
        })?;
        Ok(f)
    }

    /// The entry point that runs `k`.
    pub(crate) fn entry(&self, k: &Kernel) -> cu::CUfunction {
        self.func(k.entry())
    }

    /// Entry point `e`.
    fn func(&self, e: Entry) -> cu::CUfunction {
        self.functions[e as usize]
    }

    /// What the planners need to know of this device.
    pub(crate) fn target(&self) -> Target<'static> {
        Target {
            caps: self.grid_cap,
            kind_of: &memory_kind,
            scratch: self.scratch.is_some(),
            batched_dma: self.memcpy_batch.is_some(),
        }
    }

    /// The driver's batched copy (`cuMemcpyBatchAsync`, CUDA ≥ 12.8), if it has one.
    pub(crate) fn memcpy_batch(&self) -> Option<MemcpyBatch> {
        self.memcpy_batch
    }

    /// Whether the DMA backend submits each call's copies as one batch
    /// (`cuMemcpyBatchAsync`, found at load time on drivers of CUDA 12.8 and later) rather
    /// than one `cuMemcpyAsync` per contiguous span. Either way the copies are stream-ordered
    /// with the caller's other work; under graph capture and on the legacy default stream the
    /// per-span copies are used.
    pub fn batched_dma(&self) -> bool {
        self.memcpy_batch.is_some()
    }

    /// Whether kvio's kernel launches use programmatic dependent launch (by default, or
    /// through a [`StreamRef::pdl`](crate::StreamRef::pdl)`(true)` reference): the `sm_90`
    /// PTX is loaded (its entry points execute `griddepcontrol.wait` before they touch
    /// memory; the `sm_80` PTX cannot) and the driver is of CUDA 12.3 or later
    /// (`cuLaunchKernelEx`, programmatic edges in captured graphs). When false, launches are
    /// plain `cuLaunchKernel` launches: the same results, without the overlap.
    ///
    /// ```no_run
    /// # fn main() -> kvio::Result<()> {
    /// let _ctx = kvio::PrimaryContext::retain(0)?;
    /// let kv = kvio::Kvio::load()?;
    /// if kv.arch() == kvio::Arch::Sm80 {
    ///     assert!(!kv.supports_pdl());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn supports_pdl(&self) -> bool {
        self.launch_ex.is_some()
    }

    /// `cuLaunchKernelEx` for a launch on `stream` that may use programmatic dependent launch
    /// (`None`: launch plainly). Without the caller's choice ([`crate::StreamRef::pdl`]) only
    /// the write path's kernels (`by_default`) are programmatic: a block copy is long next to
    /// its launch, and a programmatic one would hold its CTAs on the multiprocessors, waiting,
    /// for as long as the kernel before it runs.
    pub(crate) fn launch_ex(
        &self,
        stream: crate::StreamRef<'_>,
        by_default: bool,
    ) -> Option<LaunchKernelEx> {
        if stream.pdl_choice().unwrap_or(by_default) {
            self.launch_ex
        } else {
            None
        }
    }

    /// The runner's scratch pool, if the device has memory pools.
    pub(crate) fn scratch(&self) -> Option<&Scratch> {
        self.scratch.as_ref()
    }

    /// The architecture whose PTX was loaded.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// Whether the kernels were loaded as PTX (compiled by the driver at load time) or as
    /// machine code assembled at build time (feature `sass`, on a device that runs it).
    pub fn code(&self) -> Code {
        self.code
    }

    /// The context the kernels live in.
    pub fn cu_context(&self) -> cu::CUcontext {
        self.ctx
    }

    /// Launches an empty kernel (one block of one thread): the launch-overhead yardstick of
    /// the benchmarks.
    #[doc(hidden)]
    pub fn bench_noop(&self, stream: crate::StreamRef<'_>) -> Result<()> {
        crate::driver::Params::new(&[], &[]).launch(self.func(Entry::Noop), 1, 1, stream)
    }

    /// Launches a kernel (one block of one thread) that only waits for the grids it depends on
    /// (`kvio_wait`; with programmatic dependent launch where `stream` asks for it, else
    /// plainly): the benchmarks' floor of what a kernel chained after a producer adds.
    #[doc(hidden)]
    pub fn bench_wait(&self, stream: crate::StreamRef<'_>) -> Result<()> {
        let ex = self.launch_ex(stream, false);
        crate::driver::Params::new(&[], &[]).launch_with(self.func(Entry::Wait), 1, 1, stream, ex)
    }

    /// The benchmarks' naive baseline: one thread per element over `n` spans listed as
    /// `(src, dst)` address pairs in device memory.
    ///
    /// # Safety
    /// Every listed span (`span_elems * elem_bytes` bytes) must be valid at both addresses.
    #[doc(hidden)]
    pub unsafe fn bench_naive_spans(
        &self,
        spans: crate::DeviceBytes,
        n: u64,
        span_elems: u64,
        elem_bytes: u32,
        stream: crate::StreamRef<'_>,
    ) -> Result<()> {
        let total = n * span_elems;
        let grid = total.div_ceil(256).clamp(1, self.sm_count as u64 * 16) as u32;
        let args = kvio_kernels::args::NaiveArgs {
            spans: spans.ptr() as *const u64,
            num_spans: n,
            span_elems,
            elem_bytes,
            shift: 0,
        };
        crate::driver::Params::new(&args.to_words(), &kvio_kernels::args::NaiveArgs::SIZES).launch(
            self.func(Entry::NaiveSpans),
            grid,
            256,
            stream,
        )
    }

    /// The benchmarks' compute-bound yardstick: `grid` CTAs of `block` threads, each thread a
    /// chain of `iters` dependent multiply-adds on registers, then one store to `out[thread]`
    /// (so `out` needs `grid * block` `f32`s: a shorter view is refused, typed). The bench
    /// sizes the grid to leave SMs free for transfers running beside it.
    #[doc(hidden)]
    pub fn bench_spin(
        &self,
        out: crate::DeviceBytesMut<'_>,
        iters: u32,
        grid: u32,
        block: u32,
        stream: crate::StreamRef<'_>,
    ) -> Result<()> {
        let need = grid as u64 * block as u64 * 4;
        if (out.len() as u64) < need {
            return Err(Error::BufferTooSmall {
                name: "out",
                needed: need,
                len: out.len() as u64,
            });
        }
        let args = kvio_kernels::args::SpinArgs {
            out: out.ptr() as *mut f32,
            iters,
            shift: 0,
        };
        crate::driver::Params::new(&args.to_words(), &kvio_kernels::args::SpinArgs::SIZES).launch(
            self.func(Entry::Spin),
            grid.max(1),
            block.max(1),
            stream,
        )
    }

    /// The benchmarks' and tests' K/V producer (`kvio_produce`): one CTA of 256 threads per
    /// multiprocessor, each thread running `iters` dependent integer steps, then the grid
    /// writing pseudo-random 32-bit words over all of `dst` (a function of `seed`, `iters`
    /// and the position). It signals its programmatic dependents before the arithmetic with
    /// `early`, else just before its stores (on the `sm_90` PTX; the `sm_80` one does not
    /// signal). Launched plainly, like a model's kernel before a kvio launch.
    #[doc(hidden)]
    pub fn bench_produce(
        &self,
        dst: crate::DeviceBytesMut<'_>,
        iters: u32,
        seed: u32,
        early: bool,
        stream: crate::StreamRef<'_>,
    ) -> Result<()> {
        if !dst.ptr().is_multiple_of(4) || !dst.len().is_multiple_of(4) {
            return Err(crate::error::invalid(
                "dst",
                (dst.ptr(), dst.len()),
                "the producer writes 4-byte words: address and length must be multiples of 4",
            ));
        }
        crate::driver::Params::new(
            &[
                dst.ptr(),
                dst.len() as u64,
                iters as u64,
                seed as u64,
                early as u64,
            ],
            &[8, 8, 4, 4, 4],
        )
        .launch(self.func(Entry::Produce), self.sm_count, 256, stream)
    }

    /// Number of multiprocessors of the device (used to size grids).
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }
}

impl Drop for Kvio {
    fn drop(&mut self) {
        let module = self.module;
        // SAFETY: the module was loaded in `ctx`, pushed current for the unload.
        with_ctx(self.ctx, || unsafe {
            cu::cuModuleUnload(module);
        });
    }
}

// SAFETY: module and function handles may be used from any thread that has the context
// current; launches through them are thread-safe in the driver.
unsafe impl Send for Kvio {}
// SAFETY: as above; all methods take &self and only read the handles.
unsafe impl Sync for Kvio {}
