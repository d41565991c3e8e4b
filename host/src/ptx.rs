//! The PTX of kvio's kernels, generated at build time from `kernels/` by rustc's NVPTX backend.
//!
//! The text is public so a program can load it with its own module loader (candle's
//! `load_custom_ptx`/cudarc's `load_module`, for instance); the kernel names are in
//! [`KERNELS`].

/// PTX compiled for `sm_80` (Ampere; runs on every later GPU through the driver's JIT).
pub const PTX_SM80: &str = include_str!(concat!(env!("OUT_DIR"), "/kvio_sm80.ptx"));
/// PTX compiled for `sm_90` (Hopper and later).
pub const PTX_SM90: &str = include_str!(concat!(env!("OUT_DIR"), "/kvio_sm90.ptx"));

/// Names of the kernel entry points in the PTX.
///
/// ```
/// for k in kvio::KERNELS {
///     assert!(kvio::ptx(kvio::Arch::Sm80).contains(&format!(".entry {k}(")));
/// }
/// ```
pub const KERNELS: &[&str] = &[
    "kvio_update_slots",
    "kvio_update_slots_general",
    "kvio_update_rows",
    "kvio_update_slots_convert",
    "kvio_update_rows_convert",
    "kvio_update_tiles",
    "kvio_update_tiles_one",
    "kvio_update_stream",
    "kvio_update_stream_rot",
    "kvio_update_stream_fp8",
    "kvio_update_tiles_wide",
    "kvio_update_tiles_staged",
    "kvio_update_pages",
    "kvio_update_pages_fp8",
    "kvio_update_pages_fp8_32",
    "kvio_update_slices",
    "kvio_slices_to_slots",
    "kvio_copy_blocks",
    "kvio_transfer_blocks",
    "kvio_transfer_blocks_tma",
    "kvio_convert_blocks",
    "kvio_convert_pages",
    "kvio_noop",
    "kvio_wait",
    "kvio_naive_spans",
    "kvio_spin",
    "kvio_produce",
];

/// A PTX target architecture kvio ships.
///
/// ```
/// use kvio::Arch;
/// assert_eq!(Arch::for_compute_capability(9, 0), Some(Arch::Sm90)); // H100, H200
/// assert_eq!(Arch::for_compute_capability(12, 0), Some(Arch::Sm90)); // newer: JIT from sm_90
/// assert_eq!(Arch::for_compute_capability(8, 6), Some(Arch::Sm80)); // A10, RTX 30xx
/// assert_eq!(Arch::for_compute_capability(7, 5), None);
/// ```
///
/// Non-exhaustive: later kvio versions may add PTX builds (match with a wildcard arm).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `sm_80`.
    Sm80,
    /// `sm_90`.
    Sm90,
}

impl Arch {
    /// The best PTX for a device of compute capability `major.minor`, or `None` below 8.0.
    pub fn for_compute_capability(major: i32, minor: i32) -> Option<Arch> {
        let _ = minor;
        match major {
            9.. => Some(Arch::Sm90),
            8 => Some(Arch::Sm80),
            _ => None,
        }
    }
}

/// The PTX text for `arch`.
///
/// ```
/// let ptx = kvio::ptx(kvio::Arch::Sm90);
/// assert!(ptx.contains(".entry kvio_update_slots"));
/// ```
pub fn ptx(arch: Arch) -> &'static str {
    match arch {
        Arch::Sm80 => PTX_SM80,
        Arch::Sm90 => PTX_SM90,
    }
}
