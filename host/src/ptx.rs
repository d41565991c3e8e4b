//! The PTX of kvio's kernels, generated at build time from `kernels/` by rustc's NVPTX backend.
//!
//! The text is public so a program can load it with its own module loader (candle's
//! `load_custom_ptx`/cudarc's `load_module`, for instance); the kernel names are in
//! [`KERNELS`].

/// PTX compiled for `sm_80` (Ampere; runs on every later GPU through the driver's JIT).
pub const PTX_SM80: &str = include_str!(concat!(env!("OUT_DIR"), "/kvio_sm80.ptx"));
/// PTX compiled for `sm_90` (Hopper and later).
pub const PTX_SM90: &str = include_str!(concat!(env!("OUT_DIR"), "/kvio_sm90.ptx"));

/// The bytes of a file of `OUT_DIR`, 8-byte aligned (the driver reads a cubin image as an ELF
/// file in memory; an embedded byte string alone has no alignment).
#[cfg(feature = "sass")]
macro_rules! cubin {
    ($file:literal) => {{
        #[repr(C, align(8))]
        struct Aligned<T: ?Sized>(T);
        static BYTES: &Aligned<[u8]> =
            &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/", $file)));
        Some(&BYTES.0)
    }};
}
/// Without the `sass` feature there is no machine code.
#[cfg(not(feature = "sass"))]
macro_rules! cubin {
    ($file:literal) => {
        None
    };
}

/// Machine code of [`PTX_SM80`] for compute capability 8.x: a cubin assembled by ptxas at
/// build time with the `sass` feature, 8-byte aligned; `None` without it. A `static`, not a
/// `const`: one copy of the bytes in a program, however many crates name it.
pub static SASS_SM80: Option<&[u8]> = cubin!("kvio_sm80.cubin");
/// Machine code of [`PTX_SM90`] for compute capability 9.0 (as [`SASS_SM80`]).
pub static SASS_SM90: Option<&[u8]> = cubin!("kvio_sm90.cubin");

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

    /// Whether this architecture's machine code ([`sass`]) runs on a device of compute
    /// capability `major.minor`: machine code for `sm_XY` runs on `X.Z` with `Z ≥ Y` only, so
    /// `sm_80`'s on every 8.x device and `sm_90`'s on 9.x, not on later major versions
    /// (those compile the PTX).
    ///
    /// ```
    /// use kvio::Arch;
    /// assert!(Arch::Sm90.runs_sass_on(9, 0)); // H100, H200
    /// assert!(Arch::Sm80.runs_sass_on(8, 6)); // A10
    /// assert!(!Arch::Sm80.runs_sass_on(9, 0)); // the sm_80 build on Hopper: PTX
    /// assert!(!Arch::Sm90.runs_sass_on(10, 0)); // Blackwell: PTX
    /// ```
    pub fn runs_sass_on(self, major: i32, minor: i32) -> bool {
        let (m, n) = match self {
            Arch::Sm80 => (8, 0),
            Arch::Sm90 => (9, 0),
        };
        major == m && minor >= n
    }
}

/// Which form of its kernels a [`crate::Kvio`] loaded ([`crate::Kvio::code`]).
///
/// Non-exhaustive: match with a wildcard arm.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// The PTX, compiled by the driver when it loaded the module (its JIT; the driver caches
    /// the result on the machine, by default under `~/.nv/ComputeCache`).
    Ptx,
    /// The machine code assembled at build time (feature `sass`): nothing compiled at load.
    Sass,
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

/// The machine code (a cubin) of [`ptx`]`(arch)`, assembled at build time by ptxas with the
/// `sass` feature; `None` without it. It runs where [`Arch::runs_sass_on`] says;
/// [`crate::Kvio::load`] loads it there instead of the PTX.
///
/// ```
/// let elf = kvio::sass(kvio::Arch::Sm90);
/// assert_eq!(elf.is_some(), cfg!(feature = "sass"));
/// if let Some(bytes) = elf {
///     assert_eq!(&bytes[..4], b"\x7fELF");
/// }
/// ```
pub fn sass(arch: Arch) -> Option<&'static [u8]> {
    match arch {
        Arch::Sm80 => SASS_SM80,
        Arch::Sm90 => SASS_SM90,
    }
}
