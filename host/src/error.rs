//! The error type of every fallible kvio call.

use std::fmt;

/// What went wrong. Argument errors name the argument and its value; none of them launched
/// anything.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA driver call failed (`code` is the `CUresult`).
    Driver {
        /// The driver function.
        call: &'static str,
        /// Its `CUresult` as a number.
        code: u32,
    },
    /// No CUDA context is current on this thread (kvio works in the caller's context).
    NoContext,
    /// The device's compute capability has no kernels in this build (needs 8.0 or newer).
    UnsupportedDevice {
        /// Compute capability major version.
        major: i32,
        /// Compute capability minor version.
        minor: i32,
    },
    /// An argument is malformed (zero size, bad element size, bad combination, ...).
    InvalidArgument {
        /// The argument.
        name: &'static str,
        /// Its value, printed.
        value: String,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// A buffer is too small for the layout that describes it.
    BufferTooSmall {
        /// The buffer.
        name: &'static str,
        /// Bytes the layout reaches.
        needed: u64,
        /// Bytes the buffer has.
        len: u64,
    },
    /// A host-held index is outside its range.
    IndexOutOfRange {
        /// The index array.
        name: &'static str,
        /// Position of the bad entry.
        at: usize,
        /// The bad value.
        value: i64,
        /// The exclusive upper bound.
        limit: u64,
    },
    /// Two writes of one call would land on the same bytes (a write-write race).
    Overlap {
        /// The argument whose entries collide.
        name: &'static str,
        /// Position of the first entry involved.
        first: usize,
        /// Position of the second entry involved.
        second: usize,
    },
    /// Memory the kernels must reach is neither device memory nor pinned, mapped host memory.
    NotDeviceAccessible {
        /// The argument.
        name: &'static str,
        /// The address.
        ptr: u64,
    },
    /// A size or offset computation overflowed.
    Overflow {
        /// The argument whose size overflowed.
        name: &'static str,
    },
}

/// `Result` with kvio's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Driver { call, code } => {
                write!(f, "CUDA driver call {call} failed with CUresult {code}")
            }
            Error::NoContext => write!(f, "no CUDA context is current on this thread"),
            Error::UnsupportedDevice { major, minor } => {
                write!(
                    f,
                    "compute capability {major}.{minor} is not supported (kvio needs 8.0 or newer)"
                )
            }
            Error::InvalidArgument {
                name,
                value,
                reason,
            } => write!(f, "invalid `{name}` = {value}: {reason}"),
            Error::BufferTooSmall { name, needed, len } => {
                write!(
                    f,
                    "`{name}` is {len} bytes but its layout reaches {needed} bytes"
                )
            }
            Error::IndexOutOfRange {
                name,
                at,
                value,
                limit,
            } => {
                write!(
                    f,
                    "`{name}`[{at}] = {value} is out of range (must be < {limit})"
                )
            }
            Error::Overlap {
                name,
                first,
                second,
            } => {
                write!(
                    f,
                    "`{name}` entries {first} and {second} write the same bytes"
                )
            }
            Error::NotDeviceAccessible { name, ptr } => write!(
                f,
                "`{name}` at {ptr:#x} is not device memory or pinned, mapped host memory (kernels cannot reach it)"
            ),
            Error::Overflow { name } => write!(f, "size of `{name}` overflows"),
        }
    }
}

impl std::error::Error for Error {}

/// Shorthand for [`Error::InvalidArgument`].
pub(crate) fn invalid(name: &'static str, value: impl fmt::Debug, reason: &'static str) -> Error {
    Error::InvalidArgument {
        name,
        value: format!("{value:?}"),
        reason,
    }
}
