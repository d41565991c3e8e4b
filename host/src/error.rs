//! The error type of every fallible kvio call.

use std::fmt;

/// What went wrong. Argument errors name the argument and its value; none of them launched
/// anything.
///
/// ```
/// let layout = kvio::PagedLayout::nhd(16, 16, 8, 128, 3); // 3-byte elements
/// let e = layout.extent("cache").unwrap_err();
/// assert!(matches!(e, kvio::Error::InvalidArgument { name: "cache", .. }));
/// assert_eq!(e.to_string(), "invalid `cache` = 3: elem_bytes must be 1, 2 or 4");
/// ```
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
    /// A NIXL call failed (feature `nixl`).
    Nixl {
        /// The NIXL operation (`nixl_sys` method).
        op: &'static str,
        /// What NIXL reported.
        detail: String,
    },
    /// A wait gave up: what it waited for did not happen in time (feature `nixl`).
    Timeout {
        /// What was waited for (`"Transfer::wait"`, `"Notifications::wait"`).
        op: &'static str,
        /// How long it waited.
        waited: std::time::Duration,
    },
}

/// `Result` with kvio's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Driver { call, code } => match result_name(*code) {
                Some(n) => write!(f, "CUDA driver call {call} failed with CUresult {code} ({n})"),
                None => write!(f, "CUDA driver call {call} failed with CUresult {code}"),
            },
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
            Error::Nixl { op, detail } => write!(f, "NIXL call {op} failed: {detail}"),
            Error::Timeout { op, waited } => write!(f, "{op} timed out after {waited:?}"),
        }
    }
}

impl std::error::Error for Error {}

macro_rules! result_names {
    ($($name:ident),* $(,)?) => {
        /// The `CUresult` names kvio's messages spell out, with their numbers.
        const RESULT_NAMES: &[(u32, &str)] = &[$((cust::sys::CUresult::$name as u32, stringify!($name))),*];
    };
}

result_names!(
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_DEINITIALIZED,
    CUDA_ERROR_STUB_LIBRARY,
    CUDA_ERROR_NO_DEVICE,
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_INVALID_IMAGE,
    CUDA_ERROR_INVALID_CONTEXT,
    CUDA_ERROR_NO_BINARY_FOR_GPU,
    CUDA_ERROR_INVALID_PTX,
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
    CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_ILLEGAL_STATE,
    CUDA_ERROR_NOT_FOUND,
    CUDA_ERROR_NOT_READY,
    CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
    CUDA_ERROR_LAUNCH_TIMEOUT,
    CUDA_ERROR_CONTEXT_IS_DESTROYED,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    CUDA_ERROR_MISALIGNED_ADDRESS,
    CUDA_ERROR_LAUNCH_FAILED,
    CUDA_ERROR_NOT_PERMITTED,
    CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
    CUDA_ERROR_CAPTURED_EVENT,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
    CUDA_ERROR_UNKNOWN,
);

/// The symbolic name of a `CUresult` number, when kvio knows it (no driver call: the stub
/// library and a dead context can still be named).
fn result_name(code: u32) -> Option<&'static str> {
    RESULT_NAMES.iter().find(|e| e.0 == code).map(|e| e.1)
}

/// Shorthand for [`Error::InvalidArgument`].
pub(crate) fn invalid(name: &'static str, value: impl fmt::Debug, reason: &'static str) -> Error {
    Error::InvalidArgument {
        name,
        value: format!("{value:?}"),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn says(e: Error, want: &str) {
        assert_eq!(e.to_string(), want, "{e:?}");
    }

    #[test]
    fn nixl_names_the_operation() {
        says(
            Error::Nixl {
                op: "create_xfer_req",
                detail: "Invalid parameter provided to NIXL".into(),
            },
            "NIXL call create_xfer_req failed: Invalid parameter provided to NIXL",
        );
    }

    #[test]
    fn driver_names_the_call_and_the_result() {
        says(
            Error::Driver {
                call: "cuMemAlloc",
                code: 2,
            },
            "CUDA driver call cuMemAlloc failed with CUresult 2 (CUDA_ERROR_OUT_OF_MEMORY)",
        );
        says(
            Error::Driver {
                call: "cuInit",
                code: 34,
            },
            "CUDA driver call cuInit failed with CUresult 34 (CUDA_ERROR_STUB_LIBRARY)",
        );
        says(
            Error::Driver {
                call: "cuLaunchKernel",
                code: 719,
            },
            "CUDA driver call cuLaunchKernel failed with CUresult 719 (CUDA_ERROR_LAUNCH_FAILED)",
        );
        // A number kvio has no name for is still printed.
        says(
            Error::Driver {
                call: "cuFoo",
                code: 123_456,
            },
            "CUDA driver call cuFoo failed with CUresult 123456",
        );
    }

    #[test]
    fn result_names_match_the_driver_enum() {
        use cust::sys::CUresult as R;
        for (r, n) in [
            (R::CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"),
            (R::CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE"),
            (R::CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX"),
            (R::CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS"),
            (
                R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
            ),
            (R::CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN"),
        ] {
            assert_eq!(result_name(r as u32), Some(n));
        }
        assert_eq!(result_name(0), None, "success is not an error name");
        let mut codes: Vec<u32> = RESULT_NAMES.iter().map(|e| e.0).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), RESULT_NAMES.len(), "one name per number");
    }

    #[test]
    fn no_context() {
        says(
            Error::NoContext,
            "no CUDA context is current on this thread",
        );
    }

    #[test]
    fn unsupported_device_names_the_compute_capability() {
        says(
            Error::UnsupportedDevice { major: 7, minor: 5 },
            "compute capability 7.5 is not supported (kvio needs 8.0 or newer)",
        );
    }

    #[test]
    fn invalid_argument_names_argument_value_and_reason() {
        says(
            invalid("elem_bytes", 3usize, "elem_bytes must be 1, 2 or 4"),
            "invalid `elem_bytes` = 3: elem_bytes must be 1, 2 or 4",
        );
        // Values are printed with Debug: strings quoted, tuples as tuples.
        says(
            invalid(
                "staging",
                "None",
                "the kernel backend with a host map needs staging",
            ),
            "invalid `staging` = \"None\": the kernel backend with a host map needs staging",
        );
        says(
            invalid("caches", (3usize, 2usize), "need layers × parts views"),
            "invalid `caches` = (3, 2): need layers × parts views",
        );
    }

    #[test]
    fn buffer_too_small_names_buffer_length_and_need() {
        says(
            Error::BufferTooSmall {
                name: "key_cache",
                needed: 4096,
                len: 100,
            },
            "`key_cache` is 100 bytes but its layout reaches 4096 bytes",
        );
    }

    #[test]
    fn index_out_of_range_names_position_value_and_limit() {
        says(
            Error::IndexOutOfRange {
                name: "map.src",
                at: 2,
                value: -7,
                limit: 4,
            },
            "`map.src`[2] = -7 is out of range (must be < 4)",
        );
    }

    #[test]
    fn overlap_names_both_entries() {
        says(
            Error::Overlap {
                name: "map.dst",
                first: 0,
                second: 2,
            },
            "`map.dst` entries 0 and 2 write the same bytes",
        );
    }

    #[test]
    fn not_device_accessible_names_the_address() {
        says(
            Error::NotDeviceAccessible {
                name: "dst",
                ptr: 0x7f00_dead_b000,
            },
            "`dst` at 0x7f00deadb000 is not device memory or pinned, mapped host memory (kernels cannot reach it)",
        );
    }

    #[test]
    fn overflow_names_the_argument() {
        says(
            Error::Overflow { name: "slices" },
            "size of `slices` overflows",
        );
    }

    #[test]
    fn every_variant_is_covered() {
        // Adding a variant breaks this match: give it a Display arm and a test above.
        let all = [
            Error::Driver { call: "c", code: 1 },
            Error::NoContext,
            Error::UnsupportedDevice { major: 1, minor: 0 },
            invalid("a", 1, "r"),
            Error::BufferTooSmall {
                name: "b",
                needed: 2,
                len: 1,
            },
            Error::IndexOutOfRange {
                name: "i",
                at: 0,
                value: 1,
                limit: 1,
            },
            Error::Overlap {
                name: "o",
                first: 0,
                second: 1,
            },
            Error::NotDeviceAccessible { name: "n", ptr: 1 },
            Error::Overflow { name: "v" },
            Error::Nixl {
                op: "x",
                detail: "d".into(),
            },
            Error::Timeout {
                op: "w",
                waited: std::time::Duration::from_millis(5),
            },
        ];
        for e in all {
            let named = match &e {
                Error::Driver { call, .. } => *call,
                Error::NoContext => "context",
                Error::UnsupportedDevice { .. } => "compute capability",
                Error::InvalidArgument { name, .. }
                | Error::BufferTooSmall { name, .. }
                | Error::IndexOutOfRange { name, .. }
                | Error::Overlap { name, .. }
                | Error::NotDeviceAccessible { name, .. }
                | Error::Overflow { name } => name,
                Error::Nixl { op, .. } | Error::Timeout { op, .. } => op,
            };
            let msg = e.to_string();
            assert!(msg.contains(named), "{msg:?} does not name {named:?}");
            let _: &dyn std::error::Error = &e;
        }
    }
}
