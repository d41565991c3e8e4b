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
//! - [`Kvio::update_slices`]: slice-based update (vLLM TPU `kv_cache_update`) with a
//!   device-resident slice count.
//!
//!
//! Block copies ([`Kvio::copy_blocks`]): whole blocks inside the GPU, GPU → pinned host and
//! back, for layer-separate ([`LayerTable`]) and cross-layer ([`BlockPool::cross_layer_nhd`])
//! pools, converting layouts on the way, by DMA or by an SM kernel ([`Backend`]).
//!
//! Every operation is validated once on the host into a plan (typed [`Error`] on a bad
//! argument, nothing enqueued), which one runner executes on the caller's stream: it allocates
//! nothing and never synchronises. [`emulate`] executes the same plans on the CPU. Device-resident
//! indices are checked in the kernel: bad ones are skipped and counted in a [`DeviceErrors`]
//! word.
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
mod launch;
pub mod layout;
mod mem;
mod module;
pub mod plan;
mod ptx;
pub mod reference;
mod run;
mod scratch;
mod write;

pub use alloc::{memory_kind, DeviceAlloc, LayerTable, MemoryKind, PinnedHost};
pub use blocks::{Backend, Bases, BlockCopy, BlockMap, BlockPool};
pub use cust;
pub use driver::{
    current_context, current_device, device_attribute, Event, PrimaryContext, Stream, StreamRef,
};
pub use error::{Error, Result};
pub use error_word::{DeviceErrors, ErrorCounts};
pub use layout::{PagedLayout, TokenLayout};
pub use mem::DeviceBytes;
pub use module::Kvio;
pub use ptx::{ptx, Arch, KERNELS, PTX_SM80, PTX_SM90};
pub use write::{SliceUpdate, SlotMapping, SlotUpdate};

/// The README's example, compiled as a doctest so it cannot drift from the API.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
