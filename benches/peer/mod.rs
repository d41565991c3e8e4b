//! vLLM's own cache-write kernels in the bench's process, so that kvio's rows and vLLM's are
//! timed the same way on the same GPU and every ratio comes from one run.
//!
//! Nothing of vLLM is part of this repository. The kernels come from a cubin that the person
//! running the bench builds from vLLM's source (`KVIO_BENCH_VLLM_CUBIN`, the path of the
//! cubin; BENCHMARKS.md says how); this module knows only the mangled names of six kernel
//! instantiations, their parameter lists and the launch shapes vLLM's host functions choose
//! (one CTA a token, at most 512 threads). Without the variable no `vllm-*` row runs.

use std::ffi::{c_void, CString};

use cust::sys as cu;
use kvio::{Stream, TokenLayout};

/// `reshape_and_cache_flash_kernel<bf16, bf16, kAuto>`, then `<bf16, uint8_t, kFp8E4M3>`.
const FLASH: [&str; 2] = [
    "_ZN4vllm30reshape_and_cache_flash_kernelI13__nv_bfloat16S1_LNS_18Fp8KVCacheDataTypeE0EEEvPKT_S5_PT0_S7_PKlllllliiiPKfSB_i",
    "_ZN4vllm30reshape_and_cache_flash_kernelI13__nv_bfloat16hLNS_18Fp8KVCacheDataTypeE1EEEvPKT_S5_PT0_S7_PKlllllliiiPKfSB_i",
];
/// `reshape_and_cache_kernel` (the v0 layout), bf16 then e4m3 caches.
const V0: [&str; 2] = [
    "_ZN4vllm24reshape_and_cache_kernelI13__nv_bfloat16S1_LNS_18Fp8KVCacheDataTypeE0EEEvPKT_S5_PT0_S7_PKliiiiiiPKfSB_b",
    "_ZN4vllm24reshape_and_cache_kernelI13__nv_bfloat16hLNS_18Fp8KVCacheDataTypeE1EEEvPKT_S5_PT0_S7_PKliiiiiiPKfSB_b",
];
/// `concat_and_cache_mla_kernel<.., skip_scale = false>`, bf16 then e4m3 caches.
const MLA: [&str; 2] = [
    "_ZN4vllm27concat_and_cache_mla_kernelI13__nv_bfloat16S1_LNS_18Fp8KVCacheDataTypeE0ELb0EEEvPKT_S5_PT0_PKliiiiiiiPKf",
    "_ZN4vllm27concat_and_cache_mla_kernelI13__nv_bfloat16hLNS_18Fp8KVCacheDataTypeE1ELb0EEEvPKT_S5_PT0_PKliiiiiiiPKf",
];

/// vLLM's kernels, loaded from `KVIO_BENCH_VLLM_CUBIN` into the current context.
pub struct Vllm {
    /// The cubin's path.
    pub path: String,
    flash: [cu::CUfunction; 2],
    v0: [cu::CUfunction; 2],
    mla: [cu::CUfunction; 2],
}

/// One kernel parameter as the driver takes it: the address of its value.
fn arg<T>(v: &T) -> *mut c_void {
    v as *const T as *mut c_void
}

/// bf16 K and V `[T, H, D]` (contiguous) into NHD caches `[NB, bs, H, D]`
/// (`reshape_and_cache_flash`); `k_scale`/`v_scale`: one f32 each on the device (read for
/// fp8 caches only).
pub struct Flash {
    pub key: u64,
    pub value: u64,
    pub key_cache: u64,
    pub value_cache: u64,
    pub slots: u64,
    pub tokens: usize,
    pub heads: usize,
    pub dim: usize,
    pub block_size: usize,
    pub k_scale: u64,
    pub v_scale: u64,
}

impl Flash {
    /// The arguments for contiguous bf16 inputs `key` and `value` of `input`'s tokens, heads
    /// and head size, the caches `[key, value]` of pages of `block_size` tokens, the slot
    /// array `slots` (i64) and the scales at `scales` (K's f32, then V's; kernels into bf16
    /// caches read none).
    pub fn new(
        [key, value]: [u64; 2],
        [key_cache, value_cache]: [u64; 2],
        slots: u64,
        input: &TokenLayout,
        block_size: usize,
        scales: u64,
    ) -> Flash {
        Flash {
            key,
            value,
            key_cache,
            value_cache,
            slots,
            tokens: input.num_tokens,
            heads: input.num_heads,
            dim: input.head_dim,
            block_size,
            k_scale: scales,
            v_scale: scales + 4,
        }
    }
}

/// bf16 K and V `[T, H, D]` into the v0 caches (`reshape_and_cache`): key `[NB, H, D/x, bs,
/// x]`, value `[NB, H, D, bs]`, `x = 16 / cache element bytes`.
pub type V0 = Flash;

/// `[T, 576]` bf16 rows (latent 512 then rope 64) into an MLA cache `[NB, bs, 576]`
/// (`concat_and_cache_mla`); `scale`: one f32 on the device (read for fp8 caches only).
pub struct Mla {
    pub rows: u64,
    pub cache: u64,
    pub slots: u64,
    pub tokens: usize,
    pub block_size: usize,
    pub scale: u64,
}

impl Vllm {
    /// The kernels of the cubin `KVIO_BENCH_VLLM_CUBIN` names; `None` without the variable.
    /// Panics if the cubin does not load or lacks one of the six kernels.
    pub fn load() -> Option<Vllm> {
        let path = std::env::var("KVIO_BENCH_VLLM_CUBIN").ok()?;
        let c = CString::new(path.clone()).expect("path");
        let mut module = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; a context is current (the bench's GPU).
        let r = unsafe { cu::cuModuleLoad(&mut module, c.as_ptr()) };
        assert_eq!(r, cu::CUresult::CUDA_SUCCESS, "cuModuleLoad({path})");
        let get = |name: &str| {
            let n = CString::new(name).unwrap();
            let mut f = std::ptr::null_mut();
            // SAFETY: out-pointer to a local; the module stays loaded for the process (never
            // unloaded).
            let r = unsafe { cu::cuModuleGetFunction(&mut f, module, n.as_ptr()) };
            assert_eq!(r, cu::CUresult::CUDA_SUCCESS, "{name} in the cubin");
            f
        };
        Some(Vllm {
            path,
            flash: FLASH.map(get),
            v0: V0.map(get),
            mla: MLA.map(get),
        })
    }

    /// Launches `f` on `grid` CTAs of `block` threads with `params` on `stream`.
    ///
    /// # Safety
    /// `params` are the kernel's parameters, in order, each pointing at a value of the type the
    /// kernel declares; every address among them is valid for what the kernel does with it.
    unsafe fn launch(
        f: cu::CUfunction,
        grid: usize,
        block: usize,
        params: &mut [*mut c_void],
        stream: &Stream,
    ) {
        if grid == 0 {
            return;
        }
        // SAFETY: as the caller promised; no extra arguments.
        let r = unsafe {
            cu::cuLaunchKernel(
                f,
                grid as u32,
                1,
                1,
                block as u32,
                1,
                1,
                0,
                stream.cu_stream(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(r, cu::CUresult::CUDA_SUCCESS, "vLLM kernel launch");
    }

    /// `reshape_and_cache_flash` with vLLM's launch shape; `fp8`: e4m3 caches.
    ///
    /// # Safety
    /// The addresses of `a` hold what [`Flash`] says, every slot inside the caches.
    pub unsafe fn flash(&self, fp8: bool, a: &Flash, stream: &Stream) {
        let hd = (a.heads * a.dim) as i64;
        let (block_stride, page_stride, head_stride) = (a.block_size as i64 * hd, hd, a.dim as i64);
        let (key_stride, value_stride) = (hd, hd);
        let (heads, dim, bs, scale_stride) =
            (a.heads as i32, a.dim as i32, a.block_size as i32, 0i32);
        let mut p = [
            arg(&a.key),
            arg(&a.value),
            arg(&a.key_cache),
            arg(&a.value_cache),
            arg(&a.slots),
            arg(&block_stride),
            arg(&page_stride),
            arg(&head_stride),
            arg(&key_stride),
            arg(&value_stride),
            arg(&heads),
            arg(&dim),
            arg(&bs),
            arg(&a.k_scale),
            arg(&a.v_scale),
            arg(&scale_stride),
        ];
        // SAFETY: the parameter list of FLASH's kernels; addresses as the caller promised.
        unsafe {
            Self::launch(
                self.flash[fp8 as usize],
                a.tokens,
                (a.heads * a.dim).min(512),
                &mut p,
                stream,
            )
        }
    }

    /// `reshape_and_cache` (the v0 layout) with vLLM's launch shape; `fp8`: e4m3 caches.
    ///
    /// # Safety
    /// As [`Vllm::flash`], for the v0 caches.
    pub unsafe fn v0(&self, fp8: bool, a: &V0, stream: &Stream) {
        let x = if fp8 { 16 } else { 8 };
        let hd = (a.heads * a.dim) as i32;
        let (heads, dim, bs, x32) = (a.heads as i32, a.dim as i32, a.block_size as i32, x as i32);
        let interleaved_v = false;
        let mut p = [
            arg(&a.key),
            arg(&a.value),
            arg(&a.key_cache),
            arg(&a.value_cache),
            arg(&a.slots),
            arg(&hd),
            arg(&hd),
            arg(&heads),
            arg(&dim),
            arg(&bs),
            arg(&x32),
            arg(&a.k_scale),
            arg(&a.v_scale),
            arg(&interleaved_v),
        ];
        let block = (a.heads * a.dim / x).min(512);
        // SAFETY: the parameter list of V0's kernels; addresses as the caller promised.
        unsafe { Self::launch(self.v0[fp8 as usize], a.tokens, block, &mut p, stream) }
    }

    /// `concat_and_cache_mla` (512 + 64) with vLLM's launch shape; `fp8`: an e4m3 cache.
    ///
    /// # Safety
    /// The addresses of `a` hold what [`Mla`] says, every slot inside the cache.
    pub unsafe fn mla(&self, fp8: bool, a: &Mla, stream: &Stream) {
        let k_pe = a.rows + 1024;
        let (row, rank, pe) = (576i32, 512i32, 64i32);
        let block_stride = a.block_size as i32 * row;
        let bs = a.block_size as i32;
        let mut p = [
            arg(&a.rows),
            arg(&k_pe),
            arg(&a.cache),
            arg(&a.slots),
            arg(&block_stride),
            arg(&row),
            arg(&row),
            arg(&row),
            arg(&rank),
            arg(&pe),
            arg(&bs),
            arg(&a.scale),
        ];
        // SAFETY: the parameter list of MLA's kernels; addresses as the caller promised.
        unsafe { Self::launch(self.mla[fp8 as usize], a.tokens, 512, &mut p, stream) }
    }
}
