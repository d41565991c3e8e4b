//! # kvio: KV-cache I/O kernels for LLM serving, in pure Rust
//!
//! The kernels are plain Rust (`kernels/`, a `no_std` crate) compiled to PTX at build time by
//! rustc's own NVPTX backend: no nvcc, no CUDA toolkit, no C++. This crate embeds that PTX,
//! loads it into the caller's current CUDA context ([`Kvio::load`]) and launches it on the
//! caller's raw stream ([`StreamRef`]), so memory and streams owned by cust, cudarc or candle
//! all work.
//!
//! Write path:
//! - [`Kvio::update_slots`]: slot-mapping update (vLLM `reshape_and_cache_flash`, Habana's flat
//!   layout); i32 or i64 slots, negative = skip; NHD, HND or any strided cache view.
//!   Optionally quantized to fp8 on the way ([`Quantize`]: bf16/f16/f32 → e4m3/e5m2, scales
//!   per tensor or per head, read on the device).
//! - [`Kvio::update_mla`]: MLA rows (vLLM `concat_and_cache_mla`): latent and rope part side by
//!   side in one cache row, bf16 or fp8.
//! - [`Kvio::update_slices`]: slice-based update (vLLM TPU `kv_cache_update`) with a
//!   device-resident slice count.
//!
//! Block copies ([`Kvio::copy_blocks`]): whole blocks inside the GPU, GPU → pinned host and
//! back, for layer-separate ([`LayerTable`]) and cross-layer ([`BlockPool::cross_layer_nhd`],
//! one part per layer: [`BlockPool::cross_layer_one_part`]) pools, converting layouts on the
//! way, by DMA or by an SM kernel ([`Backend`]).
//!
//! With feature `candle`, `kvio::candle` runs mistral.rs' `reshape_and_cache`, `copy_blocks`
//! and `swap_blocks` on candle tensors; with feature `cudarc`, `kvio::cudarc` makes kvio's
//! views from cudarc's slices and streams. With feature `nixl`, `kvio::nixl` registers block
//! pools with NIXL and turns block copies into NIXL descriptor lists (DRAM for now).
//!
//! Every operation is validated once on the host into a plan (typed [`Error`] on a bad
//! argument, nothing enqueued), which one runner executes on the caller's stream: it allocates
//! nothing and never synchronises. [`emulate`] executes the same plans on the CPU. Device-resident
//! indices are checked in the kernel: bad ones are skipped and counted in a [`DeviceErrors`]
//! word.
//!
//! # Soundness
//!
//! No safe call can make kvio's work touch freed memory, write outside a view, or race host
//! code that Rust lets read or write the same bytes. What the safe API guarantees:
//! - **Views borrow what they view.** [`DeviceBytes`] (read) comes from a shared borrow of its
//!   owner ([`DeviceAlloc::bytes`], [`PinnedHost::bytes`], [`DeviceBytes::of`] for cust,
//!   `kvio::cudarc::read`), [`DeviceBytesMut`] (written) from an exclusive one
//!   (`bytes_mut`, [`DeviceBytesMut::of`], `kvio::cudarc::write`). Descriptors carry the
//!   borrow: destinations ([`CacheWrite::dst`], [`SliceUpdate::cache`], a [`Writable`]
//!   [`BlockPool`], staging) accept only write views, and a [`LayerTable`] keeps its caches
//!   exclusively borrowed for its lifetime. A view cannot outlive its owner (compile-fail
//!   example on [`DeviceBytes`]).
//! - **Owners wait before they let go.** A borrow ends when the call is enqueued, not when the
//!   GPU is done, so kvio's owners synchronise: dropping a [`DeviceAlloc`] or a [`PinnedHost`]
//!   waits for all work in its context before freeing it. cudarc's slices record kvio's use on
//!   their events (`kvio::cudarc`). cust's `DeviceBuffer` is freed with `cuMemFree`, which
//!   kvio relies on not to release memory that queued work still uses (the driver waits for
//!   the device; the CUDA docs do not promise it in so many words).
//! - **Host access to pinned memory waits for transfers.** [`PinnedHost::as_slice`] waits for
//!   the pool's context when a write view was handed out since the last wait,
//!   [`PinnedHost::as_mut_slice`] when any view was; while a host slice is borrowed no view can
//!   be taken (compile-fail example on [`PinnedHost`]). The memory is pinned for its own
//!   context only, so no other context's work escapes the wait.
//! - **Every address is checked before it is used.** Host-side sizes, strides and lengths
//!   are validated into a plan before anything is enqueued (typed [`Error`]); device-resident
//!   indices are bounds-checked by the kernels (skipped and counted in [`DeviceErrors`]).
//!
//! What the caller promises, in `unsafe`: [`DeviceBytes::from_raw`] /
//! [`DeviceBytesMut::from_raw`] (the range is device-accessible memory of kvio's context that
//! stays allocated until the work using it has finished, and that the host does not access
//! against the view's direction meanwhile), [`StreamRef::from_raw`] (a live stream of that
//! context), [`PinnedHost::register`] (the range is the caller's, outlives the pool, and is
//! accessed only through it) and the `_unchecked` pinned accessors (no conflicting transfer
//! in flight).
//!
//! What stays the caller's business because it cannot harm the host program: the ordering of
//! device work on different streams. Two unordered streams writing the same device bytes, or
//! a copy whose pairs overlap inside one pool, leave unspecified values in device memory;
//! order such work with stream order or [`Event`]s.
//!
//! The modules, from what the caller describes to what runs:
//! - descriptors: [`layout`] (token and paged layouts), `mem` ([`DeviceBytes`] views), `alloc`
//!   (device, pinned and table allocations), `write` ([`SlotUpdate`], [`SliceUpdate`]),
//!   [`blocks`] ([`BlockPool`], [`BlockMap`], [`BlockCopy`]);
//! - plans: [`plan`] (the plan type and host-side index lists), with each operation's planner
//!   beside its descriptors (`write::plan`, `blocks::plan`) and the launch geometry in `launch`;
//! - runners: `run` (the GPU, on a stream) and [`emulate`] (the CPU);
//! - kernels: the `kvio-kernels` crate (PTX from `ptx`), whose index rules the planners call
//!   too; [`reference`](mod@reference) is the independent oracle the tests compare with.
#![warn(missing_docs)]

mod alloc;
pub mod blocks;
#[cfg(feature = "candle")]
pub mod candle;
#[cfg(feature = "cudarc")]
pub mod cudarc;
mod driver;
pub mod emulate;
mod error;
mod error_word;
mod inline;
mod launch;
pub mod layout;
mod mem;
mod module;
#[cfg(feature = "nixl")]
pub mod nixl;
pub mod plan;
mod ptx;
pub mod reference;
mod run;
mod scratch;
mod write;

pub use alloc::{memory_kind, DeviceAlloc, LayerTable, MemoryKind, PinnedHost};
pub use blocks::{Backend, Bases, BlockCopy, BlockMap, BlockPool, PoolMemory, ReadOnly, Writable};
pub use cust;
pub use driver::{
    current_context, current_device, device_attribute, Event, PrimaryContext, Stream, StreamRef,
};
pub use error::{Error, Result};
pub use error_word::{DeviceErrors, ErrorCounts};
pub use layout::{PagedLayout, TokenLayout};
pub use mem::{DeviceBytes, DeviceBytesMut};
pub use module::Kvio;
pub use ptx::{ptx, sass, Arch, Code, KERNELS, PTX_SM80, PTX_SM90, SASS_SM80, SASS_SM90};
pub use write::{
    CacheWrite, Fp8, MlaUpdate, Quantize, Scale, SliceUpdate, SlotMapping, SlotUpdate, SrcType,
};

/// The README's example, compiled as a doctest so it cannot drift from the API.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
