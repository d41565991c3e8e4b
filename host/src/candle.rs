//! candle interop (feature `candle`): mistral.rs' paged-attention cache calls
//! (`mistralrs-paged-attn`: `reshape_and_cache`, `copy_blocks`, `swap_blocks`) on candle
//! [`Tensor`]s, run by kvio.
//!
//! candle 0.11's CUDA backend is built on cudarc 0.19, the cudarc of [`crate::cudarc`]: a CUDA
//! tensor's storage is a cudarc `CudaSlice` and its device's stream a cudarc `CudaStream`, so
//! every call here is a thin translation — the tensors' layouts (sizes, strides, start offsets)
//! into kvio's descriptors ([`TokenLayout`], [`PagedLayout`], [`BlockPool`]), their storage into
//! [`DeviceBytes`] (through [`crate::cudarc::read`]), the device's stream
//! (`CudaDevice::cuda_stream()`) into a [`crate::StreamRef`] — followed by one kvio operation.
//!
//! | mistral.rs | here | kvio |
//! |---|---|---|
//! | `reshape_and_cache(k, v, k_scale, v_scale, kc, vc, slots)` | [`CandleKvio::reshape_and_cache`] | [`Kvio::update_slots`] |
//! | `copy_blocks(kcs, vcs, &HashMap<usize, Vec<usize>>)` | [`CandleKvio::copy_blocks`] | [`Kvio::copy_blocks`] through a [`LayerTable`] |
//! | `swap_blocks(src, dst, HashMap<usize, usize>)` | [`CandleKvio::swap_blocks`] | [`Kvio::copy_blocks`] (GPU → GPU); async copies from pageable memory (CPU → GPU) |
//!
//! What kvio does not do yet, refused with [`Error::InvalidArgument`] before anything runs:
//! fp8 quantize-on-write (`k_scale`/`v_scale` given) and writes into vLLM's v0 layout (a 5-D key
//! cache `[NB, H, D/x, bs, x]`, mistral.rs' own layout). Block copies do not depend on the layout
//! inside a block, so `copy_blocks` and `swap_blocks` take v0 caches too.
//!
//! # Ordering and in-place writes
//!
//! Every call enqueues its work on the stream of the tensors' candle device
//! (`CudaDevice::cuda_stream()`; all tensors of a call must be on one candle device) and
//! returns: no synchronisation, except where a method's documentation says so. Caches are
//! written in place through `&Tensor`, as mistral.rs does (and as candle's own `slice_set`):
//! kvio reads the storage under candle's shared lock, so a concurrent reader of a cache sees
//! the write only in stream order. With cudarc's multi-stream event tracking on, each storage
//! is accessed through [`crate::cudarc::read`]: the stream waits for the storage's last write,
//! and the access is recorded as a read (also for the caches kvio writes, which cudarc's
//! shared-borrow API cannot record as writes): work on *other* streams that reads a cache
//! right after must be ordered by the caller. candle itself uses one stream per device.
//!
//! # Example
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::collections::HashMap;
//! use kvio::candle::{candle_core::{DType, Device, Tensor}, CandleKvio};
//! let dev = Device::new_cuda(0)?;
//! let kv = CandleKvio::new(&dev)?; // loads kvio into the device's context
//! let (t, h, d, blocks, bs) = (4, 8, 128, 64, 16);
//! let key = Tensor::randn(0f32, 1., (t, h, d), &dev)?.to_dtype(DType::BF16)?;
//! let value = Tensor::randn(0f32, 1., (t, h, d), &dev)?.to_dtype(DType::BF16)?;
//! let key_cache = Tensor::zeros((blocks, bs, h, d), DType::BF16, &dev)?;
//! let value_cache = Tensor::zeros((blocks, bs, h, d), DType::BF16, &dev)?;
//! let slots = Tensor::new(&[17i64, 18, -1, 40], &dev)?; // -1: token 2 is skipped
//! kv.reshape_and_cache(&key, &value, None, None, &key_cache, &value_cache, &slots)?;
//! // Copy-on-write: block 1 into blocks 5 and 6 of every layer (one layer here).
//! let cow = HashMap::from([(1usize, vec![5usize, 6])]);
//! kv.copy_blocks(&[&key_cache], &[&value_cache], &cow)?;
//! // Swap block 5 out to another GPU pool's block 0.
//! let other = Tensor::zeros((8, bs, h, d), DType::BF16, &dev)?;
//! kv.swap_blocks(&key_cache, &other, &HashMap::from([(5usize, 0usize)]))?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The candle-core kvio was built against (`kvio::candle::candle_core`), re-exported so callers
/// name exactly the tensor types kvio's calls take.
pub use ::candle_core;
use ::candle_core::cuda_backend::{CudaStorage, CudaStorageSlice};
use ::candle_core::{CpuStorage, CudaDevice, DType, Device, Layout, Storage, Tensor};
use ::cudarc::driver::{CudaContext, CudaStream};
use cust::sys as cu;

use crate::alloc::LayerTable;
use crate::blocks::{BlockCopy, BlockMap, BlockPool};
use crate::cudarc::{self as kc, Access};
use crate::driver::check;
use crate::error::{invalid, Error, Result};
use crate::layout::{PagedLayout, TokenLayout};
use crate::mem::{DeviceBytes, DeviceBytesMut};
use crate::module::Kvio;
use crate::write::{Fp8, Quantize, Scale, SlotMapping, SlotUpdate, SrcType};

/// kvio loaded into a candle CUDA device's context, with mistral.rs' three paged-attention cache
/// calls on candle tensors. Create it once per device at set-up time ([`CandleKvio::new`]) and
/// keep it beside the caches.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dev = kvio::candle::candle_core::Device::new_cuda(0)?;
/// let kv = kvio::candle::CandleKvio::new(&dev)?;
/// println!("kvio {:?} on {:?}", kv.kvio().arch(), dev.location());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct CandleKvio {
    // Field order is drop order: the table (device memory) and the module go before the
    // context they live in.
    table: Mutex<Option<CachedTable>>,
    kv: Kvio,
    _ctx: Arc<CudaContext>,
}

/// The device pointer table of the last [`CandleKvio::copy_blocks`] caches.
#[derive(Debug)]
struct CachedTable {
    /// `(address, length)` of each cache, to recognise the same caches on the next call.
    entries: Vec<(u64, usize)>,
    /// Built from write views of the caches' memory; used only while the caller passes caches
    /// at exactly these addresses (live tensors), never dereferenced otherwise.
    table: LayerTable<'static>,
}

impl CandleKvio {
    /// Loads kvio into the context of `device` (a candle CUDA device; its context is made
    /// current on this thread). Calls on tensors of any candle device of the same GPU work.
    pub fn new(device: &Device) -> Result<Self> {
        let Device::Cuda(dev) = device else {
            return Err(invalid("device", device.location(), "not a CUDA device"));
        };
        let ctx = dev.cuda_stream().context().clone();
        let kv = kc::load(&ctx)?;
        Ok(CandleKvio {
            table: Mutex::new(None),
            kv,
            _ctx: ctx,
        })
    }

    /// The loaded kvio, for its other operations (on `kvio::cudarc` views of candle storage).
    pub fn kvio(&self) -> &Kvio {
        &self.kv
    }

    /// Writes new keys and values into paged caches by slot mapping: mistral.rs'
    /// `reshape_and_cache`, for its own layout (vLLM's v0 paged layout, `reshape_and_cache`)
    /// and for the FlashAttention (NHD) layout (`reshape_and_cache_flash`), optionally
    /// quantized to fp8. One kernel launch on the tensors' device stream.
    ///
    /// - `key`, `value`: `[T, H, D]`, any strides with the last dimension contiguous (views
    ///   into a packed qkv tensor work without a copy).
    /// - `key_cache`, `value_cache`, written in place, either
    ///   - v0: key `[NB, H, D/x, bs, x]` with `x` elements of 16 bytes (8 for bf16/f16, 16 for
    ///     fp8) and value `[NB, H, D, bs]`, any strides with the last dimension contiguous;
    ///     `D` a multiple of 8; or
    ///   - flash: both `[NB, bs, H, D]`, any strides with the last dimension contiguous (an
    ///     HND cache `[NB, H, bs, D]` passed as its `transpose(1, 2)` view works).
    /// - `k_scale`, `v_scale`: for `F8E4M3` caches written from bf16, f16 or f32 inputs, both
    ///   given, contiguous f32 with one element (per tensor) or `H` (per head); each element is
    ///   stored as `fp8(x / scale)` (vLLM's semantics; saturating, NaN kept). `None` for caches
    ///   of the inputs' dtype.
    /// - `slot_mapping`: `[T']` `i64` or `i32`, contiguous, `T' ≤ T` (tokens past `T'` are
    ///   padding); `slot = block * bs + offset`; a negative slot skips its token, a slot past
    ///   the cache is skipped too (the kernel never writes outside the cache).
    /// - All five tensors on one candle CUDA device; inputs and caches of one dtype of 1, 2 or
    ///   4 bytes (copied as bytes: f16, bf16, f32, u8, fp8 ...).
    ///
    /// Refused with [`Error::InvalidArgument`], nothing enqueued: scales for a cache that is not
    /// fp8, an fp8 cache without both scales, differing dtypes, devices or shapes, a v0 key
    /// cache whose `x` is not 16 bytes, a non-CUDA tensor. K and V inputs whose strides differ
    /// take two launches instead of one.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use kvio::candle::{candle_core::{DType, Device, Tensor}, CandleKvio};
    /// let dev = Device::new_cuda(0)?;
    /// let kv = CandleKvio::new(&dev)?;
    /// let (t, hq, h, d) = (3, 32, 8, 128);
    /// // K and V straight out of a packed qkv projection: strided views, no copy.
    /// let qkv = Tensor::randn(0f32, 1., (t, hq + 2 * h, d), &dev)?.to_dtype(DType::F16)?;
    /// let (k, v) = (qkv.narrow(1, hq, h)?, qkv.narrow(1, hq + h, h)?);
    /// let kc = Tensor::zeros((128, 16, h, d), DType::F16, &dev)?;
    /// let vc = Tensor::zeros((128, 16, h, d), DType::F16, &dev)?;
    /// let slots = Tensor::new(&[0i64, 1, 2], &dev)?;
    /// kv.reshape_and_cache(&k, &v, None, None, &kc, &vc, &slots)?;
    /// # Ok(()) }
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn reshape_and_cache(
        &self,
        key: &Tensor,
        value: &Tensor,
        k_scale: Option<&Tensor>,
        v_scale: Option<&Tensor>,
        key_cache: &Tensor,
        value_cache: &Tensor,
        slot_mapping: &Tensor,
    ) -> Result<()> {
        let dev = self.device(&[
            ("key", key),
            ("value", value),
            ("key_cache", key_cache),
            ("value_cache", value_cache),
            ("slot_mapping", slot_mapping),
        ])?;
        let elem = elem_bytes("key", key.dtype())?;
        if value.dtype() != key.dtype() {
            return Err(invalid("value", value.dtype(), "dtype differs from key's"));
        }
        if value_cache.dtype() != key_cache.dtype() {
            return Err(invalid(
                "value_cache",
                value_cache.dtype(),
                "dtype differs from key_cache's",
            ));
        }
        // fp8 caches quantize on write with the scales; any other cache stores the inputs'
        // dtype as it is.
        let src = match key.dtype() {
            DType::BF16 => Some(SrcType::Bf16),
            DType::F16 => Some(SrcType::F16),
            DType::F32 => Some(SrcType::F32),
            _ => None,
        };
        let fp8 = key_cache.dtype() == DType::F8E4M3 && key.dtype() != DType::F8E4M3;
        match (fp8, k_scale, v_scale) {
            (true, Some(_), Some(_)) if src.is_some() => {}
            (true, _, _) if src.is_none() => {
                return Err(invalid(
                    "key",
                    key.dtype(),
                    "an fp8 cache is written from bf16, f16 or f32 inputs",
                ))
            }
            (true, _, _) => {
                return Err(invalid(
                    if k_scale.is_none() {
                        "k_scale"
                    } else {
                        "v_scale"
                    },
                    "None",
                    "an fp8 (F8E4M3) cache needs k_scale and v_scale",
                ))
            }
            (false, Some(s), _) | (false, None, Some(s)) => return Err(invalid(
                if k_scale.is_some() {
                    "k_scale"
                } else {
                    "v_scale"
                },
                s.dims(),
                "scales quantize into an fp8 (F8E4M3) cache; this cache stores the inputs' dtype",
            )),
            (false, None, None) => {
                if key_cache.dtype() != key.dtype() {
                    return Err(invalid(
                        "key_cache",
                        key_cache.dtype(),
                        "dtype differs from key's (and is not an fp8 cache)",
                    ));
                }
            }
        }
        let cache_elem = key_cache.dtype().size_in_bytes();
        if value.dims() != key.dims() {
            return Err(invalid(
                "value",
                value.dims(),
                "shape differs from key's [T, H, D]",
            ));
        }
        let v0 = key_cache.rank() == 5;
        let (k_cache, v_cache) = if v0 {
            (
                cache_layout(
                    "key_cache",
                    key_cache.layout(),
                    cache_elem,
                    CacheDims::V0Key,
                )?,
                cache_layout(
                    "value_cache",
                    value_cache.layout(),
                    cache_elem,
                    CacheDims::V0Value,
                )?,
            )
        } else {
            if value_cache.dims() != key_cache.dims() {
                return Err(invalid(
                    "value_cache",
                    value_cache.dims(),
                    "shape differs from key_cache's [NB, bs, H, D]",
                ));
            }
            (
                cache_layout(
                    "key_cache",
                    key_cache.layout(),
                    cache_elem,
                    CacheDims::Flash,
                )?,
                cache_layout(
                    "value_cache",
                    value_cache.layout(),
                    cache_elem,
                    CacheDims::Flash,
                )?,
            )
        };
        let k_in = token_layout("key", key.layout(), elem)?;
        let v_in = token_layout("value", value.layout(), elem)?;
        if (k_cache.num_heads, k_cache.head_dim) != (k_in.num_heads, k_in.head_dim) {
            return Err(invalid(
                "key_cache",
                key_cache.dims(),
                "heads and head_dim differ from key's [T, H, D]",
            ));
        }
        let shape = |l: &PagedLayout| (l.num_blocks, l.block_size, l.num_heads, l.head_dim);
        if v0 && shape(&v_cache) != shape(&k_cache) {
            return Err(invalid(
                "value_cache",
                value_cache.dims(),
                "must be [NB, H, D, bs] for a key cache [NB, H, D/x, bs, x]",
            ));
        }
        let slot_bytes = match slot_mapping.dtype() {
            DType::I64 => 8,
            DType::I32 => 4,
            other => {
                return Err(invalid(
                    "slot_mapping",
                    other,
                    "slot_mapping must be i64 or i32",
                ))
            }
        };
        let sl = slot_mapping.layout();
        let n_slots = match *sl.dims() {
            [n] if n <= 1 || sl.stride()[0] == 1 => n,
            _ => {
                return Err(invalid(
                    "slot_mapping",
                    (sl.dims(), sl.stride()),
                    "slot_mapping must be a contiguous [T'] tensor",
                ))
            }
        };
        if n_slots > k_in.num_tokens {
            return Err(invalid(
                "slot_mapping",
                sl.dims(),
                "more slots than tokens in key",
            ));
        }

        let stream = self.stream(&dev)?;
        let (k_st, _) = key.storage_and_layout();
        let (v_st, _) = value.storage_and_layout();
        let (kc_st, _) = key_cache.storage_and_layout();
        let (vc_st, _) = value_cache.storage_and_layout();
        let (s_st, _) = slot_mapping.storage_and_layout();
        let k_acc = access(cuda("key", &k_st)?, &stream);
        let v_acc = access(cuda("value", &v_st)?, &stream);
        let kc_acc = access(cuda("key_cache", &kc_st)?, &stream);
        let vc_acc = access(cuda("value_cache", &vc_st)?, &stream);
        let s_acc = access(cuda("slot_mapping", &s_st)?, &stream);
        let k = at_offset("key", &k_acc, key.layout(), elem)?;
        let v = at_offset("value", &v_acc, value.layout(), elem)?;
        let kc_bytes = written("key_cache", &kc_acc, key_cache.layout(), cache_elem)?;
        let vc_bytes = written("value_cache", &vc_acc, value_cache.layout(), cache_elem)?;
        let slots =
            at_offset("slot_mapping", &s_acc, sl, slot_bytes)?.slice(0, n_slots * slot_bytes)?;
        let slots = if slot_bytes == 8 {
            SlotMapping::I64(slots)
        } else {
            SlotMapping::I32(slots)
        };
        let on = kc::stream(&stream);
        // fp8 scales: one f32 per tensor, or one per KV head.
        let scale_guards = match (fp8, k_scale, v_scale) {
            (true, Some(ks), Some(vs)) => Some((ks.storage_and_layout(), vs.storage_and_layout())),
            _ => None,
        };
        let scale_accs = match &scale_guards {
            Some(((ks, kl), (vs, vl))) => {
                for (name, t, l) in [("k_scale", k_scale, kl), ("v_scale", v_scale, vl)] {
                    let t = t.expect("given");
                    if t.dtype() != DType::F32 || !l.is_contiguous() {
                        return Err(invalid(
                            name,
                            (t.dtype(), l.dims()),
                            "scales must be contiguous f32 tensors",
                        ));
                    }
                }
                Some((
                    access(cuda("k_scale", ks)?, &stream),
                    access(cuda("v_scale", vs)?, &stream),
                ))
            }
            None => None,
        };
        let quantize = match (&scale_accs, &scale_guards) {
            (Some((ka, va)), Some(((_, kl), (_, vl)))) => {
                let (kn, vn) = (kl.shape().elem_count(), vl.shape().elem_count());
                let ks = at_offset("k_scale", ka, kl, 4)?.slice(0, 4 * kn)?;
                let vs = at_offset("v_scale", va, vl, 4)?.slice(0, 4 * vn)?;
                let wrap = |b, n| {
                    if n == 1 {
                        Scale::PerTensor(b)
                    } else {
                        Scale::PerHead(b)
                    }
                };
                let src = src.expect("checked above");
                Some(Quantize::new(src, Fp8::E4m3, wrap(ks, kn)).value_scale(wrap(vs, vn)))
            }
            _ => None,
        };
        if k_in == v_in {
            let mut op = SlotUpdate::new(k, k_in, kc_bytes, k_cache, slots).value(v, vc_bytes);
            if k_cache != v_cache {
                op = op.value_layout(v_cache);
            }
            if let Some(q) = quantize {
                op = op.quantize(q);
            }
            self.kv.update_slots(&op, on)
        } else {
            // kvio's SlotUpdate shares one input layout between K and V: one launch each.
            let mut ko = SlotUpdate::new(k, k_in, kc_bytes, k_cache, slots);
            let mut vo = SlotUpdate::new(v, v_in, vc_bytes, v_cache, slots);
            if let Some(q) = quantize {
                ko = ko.quantize(Quantize::new(q.src, q.fp8, q.k_scale));
                let vs = q.v_scale.expect("V's scale is given with K's");
                vo = vo.quantize(Quantize::new(q.src, q.fp8, vs));
            }
            self.kv.update_slots(&ko, on)?;
            self.kv.update_slots(&vo, on)
        }
    }

    /// Copies whole blocks inside every layer's key and value caches: mistral.rs'
    /// `copy_blocks` (vLLM's, for copy-on-write): for each `src → dsts` entry of
    /// `block_mapping`, block `src` of each cache is copied to each block of `dsts`, in every
    /// layer. One kernel launch for all layers on the caches' device stream, plus the upload
    /// of the pairs (kvio's stream-ordered scratch memory: no synchronisation).
    ///
    /// `key_caches[l]` and `value_caches[l]` are layer `l`'s caches: one candle CUDA device, one
    /// dtype (any, copied as bytes), and one block geometry for all of them — the same number of
    /// blocks `NB` (dimension 0), the same shape and strides within a block, and each block
    /// contiguous (dimensions after the first row-major). The layout inside a block does not
    /// matter: flash `[NB, bs, H, D]` and v0 `[NB, H, D/x, bs, x]` / `[NB, H, D, bs]` caches
    /// both work.
    ///
    /// The layer-separate caches are reached through a device pointer table ([`LayerTable`]),
    /// kept between calls: the first call, and any call whose caches moved (other tensors,
    /// other offsets), synchronises the context once to build a new one (a set-up-time cost;
    /// mistral.rs allocates its caches once). Calls with the same caches do not synchronise.
    ///
    /// Refused ([`Error`], nothing enqueued): a block id past `NB` ([`Error::IndexOutOfRange`]),
    /// one destination named twice, or a block both copied from and written
    /// ([`Error::Overlap`]: the copies run in parallel). A `src → src` pair is a no-op and
    /// dropped.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::collections::HashMap;
    /// use kvio::candle::{candle_core::{DType, Device, Tensor}, CandleKvio};
    /// let dev = Device::new_cuda(0)?;
    /// let kv = CandleKvio::new(&dev)?;
    /// let new = || Tensor::zeros((256, 16, 8, 128), DType::BF16, &dev);
    /// let (k, v): (Vec<Tensor>, Vec<Tensor>) = (0..32).map(|_| Ok((new()?, new()?)))
    ///     .collect::<candle_core::Result<Vec<_>>>()?.into_iter().unzip();
    /// let (k, v): (Vec<&Tensor>, Vec<&Tensor>) = (k.iter().collect(), v.iter().collect());
    /// kv.copy_blocks(&k, &v, &HashMap::from([(3, vec![10, 11]), (4, vec![12])]))?;
    /// # use kvio::candle::candle_core; Ok(()) }
    /// ```
    pub fn copy_blocks(
        &self,
        key_caches: &[&Tensor],
        value_caches: &[&Tensor],
        block_mapping: &HashMap<usize, Vec<usize>>,
    ) -> Result<()> {
        if key_caches.len() != value_caches.len() {
            return Err(invalid(
                "value_caches",
                (key_caches.len(), value_caches.len()),
                "need one value cache per key cache",
            ));
        }
        let mut pairs = Vec::new();
        for (&src, dsts) in block_mapping {
            for &dst in dsts {
                if src != dst {
                    pairs.push([block_id(src)?, block_id(dst)?]);
                }
            }
        }
        pairs.sort_unstable();
        if key_caches.is_empty() || pairs.is_empty() {
            return Ok(());
        }
        // Layer major, K then V: the table's order.
        let caches: Vec<(&'static str, &Tensor)> = key_caches
            .iter()
            .zip(value_caches)
            .flat_map(|(&k, &v)| [("key_caches", k), ("value_caches", v)])
            .collect();
        let dev = self.device(&caches)?;
        let dtype = caches[0].1.dtype();
        let layout = block_layout("key_caches", caches[0].1.layout(), dtype)?;
        for &(name, t) in &caches {
            if t.dtype() != dtype {
                return Err(invalid(
                    name,
                    t.dtype(),
                    "dtype differs from key_caches[0]'s",
                ));
            }
            if block_layout(name, t.layout(), dtype)? != layout {
                return Err(invalid(
                    name,
                    (t.dims(), t.stride()),
                    "block count, block shape or block stride differs from key_caches[0]'s",
                ));
            }
        }

        let stream = self.stream(&dev)?;
        let guards: Vec<_> = caches.iter().map(|(_, t)| t.storage_and_layout()).collect();
        let mut accesses = Vec::with_capacity(caches.len());
        for ((name, _), (st, _)) in caches.iter().zip(&guards) {
            accesses.push(access(cuda(name, st)?, &stream));
        }
        let mut entries = Vec::with_capacity(caches.len());
        for ((name, t), acc) in caches.iter().zip(&accesses) {
            let v = at_offset(name, acc, t.layout(), dtype.size_in_bytes())?;
            entries.push((v.ptr(), v.len()));
        }

        let mut cached = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if cached.as_ref().is_none_or(|c| c.entries != entries) {
            // Dropping the old table waits for the work that may still read it.
            drop(cached.take());
            let views: Vec<DeviceBytesMut<'static>> = entries
                .iter()
                // SAFETY: the caches are candle device memory, written in place through shared
                // tensors as mistral.rs' own kernels do (host code cannot reach it); the table
                // is used only by calls passing these same live caches (checked above).
                .map(|&(ptr, len)| unsafe { DeviceBytesMut::from_raw(ptr, len) })
                .collect();
            let table = LayerTable::new(&views, 2)?;
            *cached = Some(CachedTable { entries, table });
        }
        let table = &cached.as_ref().expect("table built above").table;
        let pool = BlockPool::layer_separate(table, layout);
        self.kv.copy_blocks(
            &BlockCopy::within(pool, BlockMap::Host(&pairs)),
            kc::stream(&stream),
        )?;
        Ok(())
    }

    /// Copies whole blocks from `src` to `dst`, `block_mapping` naming `src_block → dst_block`:
    /// mistral.rs' `swap_blocks`. Both tensors are block pools `[NB, ...]` of one dtype (any,
    /// copied as bytes) and one shape per block, each block contiguous (dimensions after the
    /// first row-major); their block counts may differ. Enqueued on the GPU tensor's device
    /// stream.
    ///
    /// - GPU → GPU (one candle device): one kvio block copy ([`Kvio::copy_blocks`],
    ///   [`crate::Backend::Auto`]); asynchronous, no synchronisation.
    /// - CPU → GPU (swap-in from a candle CPU tensor, which is pageable memory kvio's kernels
    ///   and copy engines cannot reach): one `cuMemcpyHtoDAsync` per run of consecutive blocks,
    ///   as mistral.rs does per block. Ordered on the stream, but the driver stages pageable
    ///   memory before each call returns, so this blocks the host for the copy's duration.
    /// - GPU → CPU and CPU → CPU: refused ([`Error::InvalidArgument`]; mistral.rs refuses them
    ///   too): candle CPU tensors are only reachable through a shared borrow. Offload into
    ///   pinned host memory instead ([`crate::cudarc::write_pinned`] + [`Kvio::copy_blocks`]).
    ///
    /// Block ids past a pool ([`Error::IndexOutOfRange`]) and a destination named twice or
    /// overlapping a source in the same pool ([`Error::Overlap`]) are refused before anything
    /// is enqueued.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::collections::HashMap;
    /// use kvio::candle::{candle_core::{DType, Device, Tensor}, CandleKvio};
    /// let dev = Device::new_cuda(0)?;
    /// let kv = CandleKvio::new(&dev)?;
    /// let gpu = Tensor::zeros((256, 16, 8, 128), DType::BF16, &dev)?;
    /// let cpu = Tensor::ones((64, 16, 8, 128), DType::BF16, &Device::Cpu)?;
    /// kv.swap_blocks(&cpu, &gpu, &HashMap::from([(0, 7), (1, 8)]))?; // swap in
    /// # Ok(()) }
    /// ```
    pub fn swap_blocks(
        &self,
        src: &Tensor,
        dst: &Tensor,
        block_mapping: &HashMap<usize, usize>,
    ) -> Result<()> {
        let dtype = src.dtype();
        if dst.dtype() != dtype {
            return Err(invalid("dst", dst.dtype(), "dtype differs from src's"));
        }
        let s_layout = block_layout("src", src.layout(), dtype)?;
        let d_layout = block_layout("dst", dst.layout(), dtype)?;
        if s_layout.head_dim != d_layout.head_dim || src.dims()[1..] != dst.dims()[1..] {
            return Err(invalid(
                "dst",
                dst.dims(),
                "block shape differs from src's (dimensions after the first)",
            ));
        }
        let mut pairs = block_mapping
            .iter()
            .map(|(&s, &d)| Ok([block_id(s)?, block_id(d)?]))
            .collect::<Result<Vec<_>>>()?;
        pairs.sort_unstable();
        match (src.device(), dst.device()) {
            (Device::Cuda(_), Device::Cuda(_)) => {
                let dev = self.device(&[("src", src), ("dst", dst)])?;
                if pairs.is_empty() {
                    return Ok(());
                }
                let stream = self.stream(&dev)?;
                let (s_st, _) = src.storage_and_layout();
                let (d_st, _) = dst.storage_and_layout();
                let s_acc = access(cuda("src", &s_st)?, &stream);
                let d_acc = access(cuda("dst", &d_st)?, &stream);
                let e = dtype.size_in_bytes();
                let op = BlockCopy::new(
                    BlockPool::strided(at_offset("src", &s_acc, src.layout(), e)?, 0, 0, 1, 1, s_layout),
                    BlockPool::strided(written("dst", &d_acc, dst.layout(), e)?, 0, 0, 1, 1, d_layout),
                    BlockMap::Host(&pairs),
                );
                self.kv.copy_blocks(&op, kc::stream(&stream))?;
                Ok(())
            }
            (Device::Cpu, Device::Cuda(_)) => {
                let dev = self.device(&[("dst", dst)])?;
                self.swap_in(src, s_layout, dst, d_layout, &pairs, &dev)
            }
            (Device::Cuda(_), Device::Cpu) | (Device::Cpu, Device::Cpu) => Err(invalid(
                "dst",
                dst.device().location(),
                "swap_blocks into a CPU tensor is not supported: offload into pinned host memory (kvio::cudarc::write_pinned + Kvio::copy_blocks)",
            )),
            (s, d) => Err(invalid(
                "src",
                (s.location(), d.location()),
                "swap_blocks needs CUDA or CPU tensors",
            )),
        }
    }

    /// CPU → GPU part of [`CandleKvio::swap_blocks`]: async copies from pageable memory.
    fn swap_in(
        &self,
        src: &Tensor,
        s_layout: PagedLayout,
        dst: &Tensor,
        d_layout: PagedLayout,
        pairs: &[[i64; 2]],
        dev: &CudaDevice,
    ) -> Result<()> {
        let (ns, nd) = (s_layout.num_blocks as u64, d_layout.num_blocks as u64);
        for (at, &[s, d]) in pairs.iter().enumerate() {
            for (name, value, limit) in [("map.src", s, ns), ("map.dst", d, nd)] {
                if value as u64 >= limit {
                    return Err(Error::IndexOutOfRange {
                        name,
                        at,
                        value,
                        limit,
                    });
                }
            }
        }
        let mut by_dst: Vec<(i64, usize)> =
            pairs.iter().enumerate().map(|(i, p)| (p[1], i)).collect();
        by_dst.sort_unstable();
        if let Some(w) = by_dst.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(Error::Overlap {
                name: "map.dst",
                first: w[0].1,
                second: w[1].1,
            });
        }
        if pairs.is_empty() {
            return Ok(());
        }
        let stream = self.stream(dev)?;
        let (s_st, _) = src.storage_and_layout();
        let (d_st, _) = dst.storage_and_layout();
        let Storage::Cpu(host) = &*s_st else {
            return Err(invalid("src", src.device().location(), "not a CPU tensor"));
        };
        let host = cpu_bytes(host);
        let d_acc = access(cuda("dst", &d_st)?, &stream);
        let e = src.dtype().size_in_bytes();
        let host = host
            .get(src.layout().start_offset() * e..)
            .ok_or(Error::BufferTooSmall {
                name: "src",
                needed: (src.layout().start_offset() * e) as u64,
                len: host.len() as u64,
            })?;
        let dev_bytes = at_offset("dst", &d_acc, dst.layout(), e)?;
        // Both layouts are in bytes (elem_bytes 1): the block is `head_dim` bytes.
        let block = s_layout.head_dim;
        let (s_stride, d_stride) = (s_layout.block_stride, d_layout.block_stride);
        // Runs of consecutive source and destination blocks, each pool block-contiguous.
        let mut runs: Vec<(usize, usize, usize)> = Vec::new(); // (src block, dst block, count)
        for &[s, d] in pairs {
            let (s, d) = (s as usize, d as usize);
            match runs.last_mut() {
                Some((rs, rd, n))
                    if s == *rs + *n && d == *rd + *n && s_stride == block && d_stride == block =>
                {
                    *n += 1
                }
                _ => runs.push((s, d, 1)),
            }
        }
        for (s, d, n) in runs {
            let bytes = (n - 1) * s_stride + block;
            let from =
                host.get(s * s_stride..s * s_stride + bytes)
                    .ok_or(Error::BufferTooSmall {
                        name: "src",
                        needed: (s * s_stride + bytes) as u64,
                        len: host.len() as u64,
                    })?;
            let to = dev_bytes.slice(d * d_stride, (n - 1) * d_stride + block)?;
            // SAFETY: `to` lies in the destination tensor's storage (checked by `slice`), kept
            // alive by its read guard until the copy is enqueued and by candle's allocator
            // afterwards (stream-ordered frees); `from` is a live host slice of `bytes` bytes,
            // staged by the driver before the call returns (pageable memory).
            check("cuMemcpyHtoDAsync", unsafe {
                cu::cuMemcpyHtoDAsync_v2(
                    to.ptr(),
                    from.as_ptr().cast(),
                    bytes,
                    stream.cu_stream() as cu::CUstream,
                )
            })?;
        }
        Ok(())
    }

    /// The one candle CUDA device of `tensors`, which must be the GPU kvio was loaded on.
    fn device(&self, tensors: &[(&'static str, &Tensor)]) -> Result<CudaDevice> {
        let mut first: Option<&Device> = None;
        for &(name, t) in tensors {
            let Device::Cuda(dev) = t.device() else {
                return Err(invalid(name, t.device().location(), "not a CUDA tensor"));
            };
            match first {
                None => {
                    if dev.cuda_stream().context().cu_ctx() as usize
                        != self.kv.cu_context() as usize
                    {
                        return Err(invalid(
                            name,
                            t.device().location(),
                            "on another GPU than the one kvio was loaded for",
                        ));
                    }
                    first = Some(t.device());
                }
                Some(f) if !f.same_device(t.device()) => {
                    return Err(invalid(
                        name,
                        t.device().location(),
                        "on another candle device (another stream) than the call's first tensor",
                    ))
                }
                Some(_) => {}
            }
        }
        match first {
            Some(Device::Cuda(dev)) => Ok(dev.clone()),
            _ => Err(invalid("tensors", tensors.len(), "no tensor given")),
        }
    }

    /// The device's stream, with its context current on this thread.
    fn stream(&self, dev: &CudaDevice) -> Result<Arc<CudaStream>> {
        let stream = dev.cuda_stream();
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| kc::driver_error("cuCtxSetCurrent", e))?;
        Ok(stream)
    }
}

/// The CUDA storage behind a tensor's storage guard.
fn cuda<'a>(name: &'static str, storage: &'a Storage) -> Result<&'a CudaStorage> {
    match storage {
        Storage::Cuda(s) => Ok(s),
        _ => Err(invalid(name, "not CUDA storage", "not a CUDA tensor")),
    }
}

/// A byte view of the whole of a CUDA storage (any dtype), through `kvio::cudarc::read`.
fn access<'a>(s: &'a CudaStorage, stream: &'a CudaStream) -> Access<'a> {
    use CudaStorageSlice as S;
    match &s.slice {
        S::U8(x) | S::F6E2M3(x) | S::F6E3M2(x) | S::F4(x) | S::F8E8M0(x) => kc::read(x, stream),
        S::U32(x) => kc::read(x, stream),
        S::I16(x) => kc::read(x, stream),
        S::I32(x) => kc::read(x, stream),
        S::I64(x) => kc::read(x, stream),
        S::BF16(x) => kc::read(x, stream),
        S::F16(x) => kc::read(x, stream),
        S::F32(x) => kc::read(x, stream),
        S::F64(x) => kc::read(x, stream),
        S::F8E4M3(x) => kc::read(x, stream),
    }
}

/// The bytes of a CPU storage (any dtype).
fn cpu_bytes(s: &CpuStorage) -> &[u8] {
    fn bytes<T>(v: &[T]) -> &[u8] {
        // SAFETY: plain-old-data elements (integers, floats, their bit wrappers): every byte
        // is initialised; the slice borrows `v`.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
    }
    use CpuStorage as C;
    match s {
        C::U8(v) | C::F6E2M3(v) | C::F6E3M2(v) | C::F4(v) | C::F8E8M0(v) => v,
        C::U32(v) => bytes(v),
        C::I16(v) => bytes(v),
        C::I32(v) => bytes(v),
        C::I64(v) => bytes(v),
        C::BF16(v) => bytes(v),
        C::F16(v) => bytes(v),
        C::F32(v) => bytes(v),
        C::F64(v) => bytes(v),
        C::F8E4M3(v) => bytes(v),
    }
}

/// The view from the layout's start offset (in elements of `elem` bytes) to the storage's end.
fn at_offset<'a>(
    name: &'static str,
    a: &'a Access<'_>,
    l: &Layout,
    elem: usize,
) -> Result<DeviceBytes<'a>> {
    let whole = a.bytes();
    let off = l
        .start_offset()
        .checked_mul(elem)
        .ok_or(Error::Overflow { name })?;
    if off > whole.len() {
        return Err(Error::BufferTooSmall {
            name,
            needed: off as u64,
            len: whole.len() as u64,
        });
    }
    whole.slice(off, whole.len() - off)
}

/// [`at_offset`] as a write view: candle hands out its storage through shared handles and
/// mistral.rs' calls write caches given as `&Tensor`, as its own CUDA kernels do. cudarc's
/// event for the storage then records a read: order other streams that read the caches after
/// the call yourself (mistral.rs runs everything on the device's one stream).
fn written<'a>(
    name: &'static str,
    a: &'a Access<'_>,
    l: &Layout,
    elem: usize,
) -> Result<DeviceBytesMut<'a>> {
    let v = at_offset(name, a, l, elem)?;
    // SAFETY: candle device memory (no host reference to it can exist), kept alive by the
    // tensor's storage guard and the Access while the call is enqueued; cudarc frees it in
    // stream order after its recorded events.
    Ok(unsafe { DeviceBytesMut::from_raw(v.ptr(), v.len()) })
}

/// Bytes per element of a dtype the write path copies (1, 2 or 4).
fn elem_bytes(name: &'static str, dtype: DType) -> Result<usize> {
    match dtype.size_in_bytes() {
        e @ (1 | 2 | 4) if !matches!(dtype, DType::F6E2M3 | DType::F6E3M2 | DType::F4) => Ok(e),
        _ => Err(invalid(
            name,
            dtype,
            "dtype must have elements of 1, 2 or 4 bytes",
        )),
    }
}

/// A block id as kvio's map entry.
fn block_id(id: usize) -> Result<i64> {
    i64::try_from(id).map_err(|_| Error::Overflow {
        name: "block_mapping",
    })
}

/// The last dimension must be contiguous (stride 1) unless it has one element.
fn inner_contiguous(name: &'static str, l: &Layout) -> Result<()> {
    match (l.dims().last(), l.stride().last()) {
        (Some(&n), Some(&s)) if n <= 1 || s == 1 => Ok(()),
        _ => Err(invalid(
            name,
            (l.dims(), l.stride()),
            "the last dimension must be contiguous (stride 1)",
        )),
    }
}

/// `[T, H, D]` as a kvio token layout.
fn token_layout(name: &'static str, l: &Layout, elem: usize) -> Result<TokenLayout> {
    let &[num_tokens, num_heads, head_dim] = l.dims() else {
        return Err(invalid(
            name,
            l.dims(),
            "must be [num_tokens, num_heads, head_dim]",
        ));
    };
    inner_contiguous(name, l)?;
    Ok(TokenLayout {
        num_tokens,
        num_heads,
        head_dim,
        elem_bytes: elem,
        token_stride: l.stride()[0],
        head_stride: l.stride()[1],
    })
}

/// How a candle cache tensor's dimensions map onto a kvio paged layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CacheDims {
    /// FlashAttention / NHD `[NB, bs, H, D]`.
    Flash,
    /// vLLM's v0 key cache `[NB, H, D/x, bs, x]`, `x * elem = 16`.
    V0Key,
    /// vLLM's v0 value cache `[NB, H, D, bs]` (pieces of one element).
    V0Value,
}

/// A cache tensor as a kvio paged layout, its strides as they are (last dimension contiguous).
fn cache_layout(
    name: &'static str,
    l: &Layout,
    elem: usize,
    dims: CacheDims,
) -> Result<PagedLayout> {
    let s = l.stride();
    // (blocks, slots, heads, pieces per head, elements per piece) and the strides of
    // (block, slot, head, piece), in elements.
    let (shape, strides) = match (dims, l.dims()) {
        (CacheDims::Flash, &[nb, bs, h, d]) => ((nb, bs, h, 1, d), [s[0], s[1], s[2], d]),
        (CacheDims::V0Key, &[nb, h, p, bs, x]) => ((nb, bs, h, p, x), [s[0], s[3], s[1], s[2]]),
        (CacheDims::V0Value, &[nb, h, d, bs]) => ((nb, bs, h, d, 1), [s[0], s[3], s[1], s[2]]),
        (_, d) => {
            let want = match dims {
                CacheDims::Flash => "must be [num_blocks, block_size, num_heads, head_dim]",
                CacheDims::V0Key => "must be [NB, H, D/x, bs, x]",
                CacheDims::V0Value => "must be [NB, H, D, bs] for a key cache [NB, H, D/x, bs, x]",
            };
            return Err(invalid(name, d, want));
        }
    };
    let (num_blocks, block_size, num_heads, pieces, piece_elems) = shape;
    if dims == CacheDims::V0Key && piece_elems * elem != 16 {
        return Err(invalid(
            name,
            l.dims(),
            "the last dimension x must hold 16 bytes (x = 16 / element size)",
        ));
    }
    inner_contiguous(name, l)?;
    Ok(PagedLayout {
        num_blocks,
        block_size,
        num_heads,
        head_dim: pieces * piece_elems,
        elem_bytes: elem,
        block_stride: strides[0],
        token_stride: strides[1],
        head_stride: strides[2],
        piece_elems,
        piece_stride: strides[3],
    })
}

/// A pool of `dims[0]` contiguous blocks, in bytes: the layout for block copies, whatever the
/// layout inside a block (one "head" of `block bytes` 1-byte elements per block).
fn block_layout(name: &'static str, l: &Layout, dtype: DType) -> Result<PagedLayout> {
    let e = dtype.size_in_bytes();
    if e == 0 {
        return Err(invalid(name, dtype, "dtype has no whole-byte elements"));
    }
    let (dims, strides) = (l.dims(), l.stride());
    let Some(&num_blocks) = dims.first() else {
        return Err(invalid(name, dims, "a block pool needs a block dimension"));
    };
    // Dimensions after the first must be row-major contiguous (those of one element aside).
    let mut want = 1usize;
    for (&n, &s) in dims[1..].iter().zip(&strides[1..]).rev() {
        if n > 1 && s != want {
            return Err(invalid(
                name,
                (dims, strides),
                "each block (dimensions after the first) must be contiguous",
            ));
        }
        want = want.checked_mul(n).ok_or(Error::Overflow { name })?;
    }
    let block = want.checked_mul(e).ok_or(Error::Overflow { name })?;
    let block_stride = strides[0].checked_mul(e).ok_or(Error::Overflow { name })?;
    Ok(PagedLayout {
        num_blocks,
        block_size: 1,
        num_heads: 1,
        head_dim: block,
        elem_bytes: 1,
        // A pool of one block has any stride: give it the block's own.
        block_stride: if num_blocks > 1 { block_stride } else { block },
        token_stride: block,
        head_stride: block,
        piece_elems: block,
        piece_stride: block,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Contiguous candle caches map onto kvio's own constructors exactly.
    #[test]
    fn cache_tensors_map_onto_the_layout_constructors() {
        let (nb, bs, h, d) = (5, 16, 4, 64);
        for e in [1usize, 2, 4] {
            let x = 16 / e;
            let l = |dims: &[usize]| Layout::contiguous(dims.to_vec());
            let flash = cache_layout("k", &l(&[nb, bs, h, d]), e, CacheDims::Flash).unwrap();
            assert_eq!(flash, PagedLayout::nhd(nb, bs, h, d, e));
            let key = cache_layout("k", &l(&[nb, h, d / x, bs, x]), e, CacheDims::V0Key).unwrap();
            assert_eq!(key, PagedLayout::v0_key(nb, bs, h, d, e));
            let value = cache_layout("v", &l(&[nb, h, d, bs]), e, CacheDims::V0Value).unwrap();
            assert_eq!(value, PagedLayout::v0_value(nb, bs, h, d, e));
        }
        // x not 16 bytes, wrong rank.
        let bad_x = Layout::contiguous(vec![nb, h, d / 4, bs, 4]);
        assert!(cache_layout("k", &bad_x, 2, CacheDims::V0Key).is_err());
        let rank3 = Layout::contiguous(vec![nb, h, d]);
        assert!(cache_layout("v", &rank3, 2, CacheDims::V0Value).is_err());
    }
}
