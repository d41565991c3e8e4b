//! Kernels of kvio: KV-cache I/O in plain `no_std` Rust.
//!
//! Everything except the `extern "ptx-kernel"` entry points (module `entry`, built only for
//! `nvptx64`) is ordinary Rust that also compiles and runs on the host CPU, so the index math
//! and the span-copy core are unit-tested there. The host crate `kvio` compiles this crate to
//! PTX with rustc's NVPTX backend and loads it through the CUDA driver.
#![no_std]
#![feature(portable_simd)]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, stdarch_nvptx))]

pub mod index;
pub mod span;

#[cfg(target_arch = "nvptx64")]
mod entry;
