//! Planning: every operation is validated once on the host and turned into a `Plan`, plain
//! data that says exactly what will run. The GPU runner (`Kvio`) and the CPU emulator
//! ([`crate::emulate`]) execute the same plan, so they cannot disagree on validation, backend
//! choice or staging.
//!
//! The public items here plan index lists held in host memory: [`slots_to_slices`] turns a
//! slot mapping into the fewest slices for the slice-based update; [`validate_slots`] and
//! [`validate_slices`] check host copies of index lists before the caller uploads them
//! (device-resident lists are checked by the kernels).

#[cfg(test)]
mod cpu_bench;
mod lists;

use kvio_kernels::args::{CopyArgs, SliceArgs, SlotArgs, TileArgs};
use kvio_kernels::ops::PAGE_TOKENS_FP8;

pub use lists::{
    slices_to_table, slots_to_slices, validate_slices, validate_slots, Slice, SlotIndex,
};

use crate::alloc::MemoryKind;
use crate::driver::Params;
use crate::inline::InlineVec;
use crate::launch::{Entry, GridCap};

/// What one operation does once validated.
#[derive(Debug)]
// A plan lives on the stack for one call; boxing the launch would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Plan<'a> {
    /// Nothing (no token, no pair).
    Nothing,
    /// Copy-engine copies, in order.
    Dma(Spans),
    /// One kernel launch (two for a block copy converting each part on its own), after an
    /// optional host-to-device upload of its index list.
    Kernel {
        /// Copied to the device first, on the same stream.
        upload: Option<Upload<'a>>,
        /// The launch.
        launch: Launch,
        /// A second launch after it, reading the same upload (V's part of a block copy
        /// between pools whose parts are laid out differently).
        then: Option<Launch>,
    },
    /// A slice update through a slot list of `tokens` i32 in `list` (the caller's buffer, or
    /// scratch the runner takes and gives back): the runner sets them to -1 and points both
    /// launches at them ([`Kernel::with_list`]).
    Expand {
        /// `kvio_slices_to_slots` (the slices into the list).
        expand: Launch,
        /// The slot update reading the list (`None`: no token to write).
        update: Option<Launch>,
        /// Entries of the list (the source's rows).
        tokens: usize,
        /// Where the list lives.
        list: Staging,
    },
}

/// The copies of a DMA plan: inline up to 16 (a decode-size transfer between cross-layer
/// pools plans no heap allocation), else one allocation of the planned count.
pub(crate) type Spans = InlineVec<Span, 16>;

/// One contiguous copy of the DMA backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Span {
    /// Destination address.
    pub(crate) dst: u64,
    /// Source address.
    pub(crate) src: u64,
    /// Bytes.
    pub(crate) bytes: u64,
}

/// Host bytes the launch needs on the device (a host block map).
#[derive(Debug)]
pub(crate) struct Upload<'a> {
    /// Where they go.
    pub(crate) dst: Staging,
    /// The bytes.
    pub(crate) src: &'a [u8],
}

/// Device memory an upload (or a slice update's slot list) lands in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Staging {
    /// The caller's staging buffer at this address (the launch's arguments already point
    /// there).
    Given(u64),
    /// Runner-owned scratch, stream-ordered: the runner takes it for the launch, points the
    /// launch's map at it ([`Kernel::with_map`]) and gives it back after the launch.
    Scratch,
}

/// A kernel with its arguments, grid and CTA size.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Launch {
    /// Which entry point, with its argument struct.
    pub(crate) kernel: Kernel,
    /// CTAs.
    pub(crate) grid: u32,
    /// Threads per CTA.
    pub(crate) threads: u32,
}

/// An entry point of the PTX module and its arguments.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kernel {
    /// `kvio_update_slots`.
    Slots(SlotArgs),
    /// `kvio_update_tiles` (`kvio_update_tiles_wide` for 4-byte cache elements).
    Tiles(TileArgs),
    /// `kvio_update_slices`.
    Slices(SliceArgs),
    /// `kvio_slices_to_slots` (a slice table into a slot list).
    Expand(SliceArgs),
    /// `kvio_copy_blocks` (device-side block copies).
    Copy(CopyArgs),
    /// `kvio_transfer_blocks` (block copies touching host memory, 512-thread CTAs).
    Transfer(CopyArgs),
    /// `kvio_transfer_blocks_tma` (block copies touching host memory through Hopper bulk
    /// copies, one-warp CTAs; `sm_90` only).
    TransferTma(CopyArgs),
    /// A block copy converting to or from vLLM's v0 layout: `kvio_convert_pages` (a page's
    /// heads per CTA through its shared tile) when `tile` is non-zero, else
    /// `kvio_convert_blocks` (a head page per group of lanes).
    Convert(CopyArgs),
}

impl Kernel {
    /// The entry point that runs it (on the GPU; the emulation runs the same bodies).
    pub(crate) fn entry(&self) -> Entry {
        match self {
            Kernel::Slots(a) if a.converts_rows() => Entry::UpdateRowsConvert,
            Kernel::Slots(a) if a.converts() => Entry::UpdateSlotsConvert,
            Kernel::Slots(a) if a.general() => Entry::UpdateSlotsGeneral,
            Kernel::Slots(a) if a.copies_rows() => Entry::UpdateRows,
            Kernel::Slots(_) => Entry::UpdateSlots,
            Kernel::Tiles(a) if a.elem == 4 => Entry::UpdateTilesWide,
            Kernel::Tiles(a) if a.streams() && a.elem == 1 => Entry::UpdateStreamFp8,
            Kernel::Tiles(a) if a.streams() && a.rotates() => Entry::UpdateStreamRot,
            Kernel::Tiles(a) if a.streams() => Entry::UpdateStream,
            Kernel::Tiles(a) if a.tile == 1 => Entry::UpdateTilesOne,
            Kernel::Tiles(a) if a.pages() && a.elem == 1 && a.tile as u64 == PAGE_TOKENS_FP8 => {
                Entry::UpdatePagesFp8_32
            }
            Kernel::Tiles(a) if a.pages() && a.elem == 1 => Entry::UpdatePagesFp8,
            Kernel::Tiles(a) if a.pages() => Entry::UpdatePages,
            Kernel::Tiles(a) if a.elem == 1 => Entry::UpdateTilesStaged,
            Kernel::Tiles(_) => Entry::UpdateTiles,
            Kernel::Slices(_) => Entry::UpdateSlices,
            Kernel::Expand(_) => Entry::SlicesToSlots,
            Kernel::Copy(_) => Entry::CopyBlocks,
            Kernel::Transfer(_) => Entry::TransferBlocks,
            Kernel::TransferTma(_) => Entry::TransferBlocksTma,
            Kernel::Convert(a) if a.tile != 0 => Entry::ConvertPages,
            Kernel::Convert(_) => Entry::ConvertBlocks,
        }
    }

    /// Whether this is a write-path kernel (an update), launched with programmatic dependent
    /// launch by default; block copies are launched plainly unless the caller asks.
    pub(crate) fn writes(&self) -> bool {
        matches!(
            self,
            Kernel::Slots(_) | Kernel::Tiles(_) | Kernel::Slices(_) | Kernel::Expand(_)
        )
    }

    /// The same launch reading its block map at `pairs` (block copies; other kernels have no
    /// map and are returned unchanged).
    pub(crate) fn with_map(self, pairs: u64) -> Kernel {
        match self {
            Kernel::Copy(a) => Kernel::Copy(CopyArgs {
                pairs: pairs as *const i64,
                ..a
            }),
            Kernel::Transfer(a) => Kernel::Transfer(CopyArgs {
                pairs: pairs as *const i64,
                ..a
            }),
            Kernel::TransferTma(a) => Kernel::TransferTma(CopyArgs {
                pairs: pairs as *const i64,
                ..a
            }),
            Kernel::Convert(a) => Kernel::Convert(CopyArgs {
                pairs: pairs as *const i64,
                ..a
            }),
            k => k,
        }
    }

    /// The same launch counting what it refuses in the error word at `errors` (`err::WORDS`
    /// `u32`): the emulation's host word ([`crate::emulate`]).
    pub(crate) fn with_errors(self, errors: u64) -> Kernel {
        let errors = errors as *mut u32;
        match self {
            Kernel::Slots(a) => Kernel::Slots(SlotArgs { errors, ..a }),
            Kernel::Tiles(a) => Kernel::Tiles(TileArgs { errors, ..a }),
            Kernel::Slices(a) => Kernel::Slices(SliceArgs { errors, ..a }),
            Kernel::Expand(a) => Kernel::Expand(SliceArgs { errors, ..a }),
            Kernel::Copy(a) => Kernel::Copy(CopyArgs { errors, ..a }),
            Kernel::Transfer(a) => Kernel::Transfer(CopyArgs { errors, ..a }),
            Kernel::TransferTma(a) => Kernel::TransferTma(CopyArgs { errors, ..a }),
            Kernel::Convert(a) => Kernel::Convert(CopyArgs { errors, ..a }),
        }
    }

    /// The same launch reading (a slot update) or writing (`kvio_slices_to_slots`) its slot
    /// list at `list` (other kernels are returned unchanged).
    pub(crate) fn with_list(self, list: u64) -> Kernel {
        match self {
            Kernel::Slots(a) => Kernel::Slots(SlotArgs {
                slots: list as *const u8,
                ..a
            }),
            Kernel::Tiles(a) => Kernel::Tiles(TileArgs {
                slots: list as *const u8,
                ..a
            }),
            Kernel::Expand(a) => Kernel::Expand(SliceArgs {
                dst: list as *mut u8,
                ..a
            }),
            k => k,
        }
    }

    /// The launch parameters of this kernel's argument struct.
    pub(crate) fn params(&self) -> Params {
        match self {
            Kernel::Slots(a) => Params::new(&a.to_words(), &SlotArgs::SIZES),
            Kernel::Tiles(a) => Params::new(&a.to_words(), &TileArgs::SIZES),
            Kernel::Slices(a) | Kernel::Expand(a) => Params::new(&a.to_words(), &SliceArgs::SIZES),
            Kernel::Copy(a) | Kernel::Transfer(a) | Kernel::TransferTma(a) | Kernel::Convert(a) => {
                Params::new(&a.to_words(), &CopyArgs::SIZES)
            }
        }
    }

    /// log2 of the lanes per work item (the group size every entry point is launched with).
    pub(crate) fn shift(&self) -> u32 {
        match self {
            Kernel::Slots(a) => a.shift,
            Kernel::Tiles(a) => a.shift,
            Kernel::Slices(a) | Kernel::Expand(a) => a.shift,
            Kernel::Copy(a) | Kernel::Transfer(a) | Kernel::TransferTma(a) | Kernel::Convert(a) => {
                a.shift
            }
        }
    }
}

/// What planning needs to know of the device: its occupancy caps and what kind of memory an
/// address is.
pub(crate) struct Target<'f> {
    /// Resident CTAs per kernel.
    pub(crate) caps: GridCap,
    /// Classifies an address (pinned host memory selects the transfer entry point).
    pub(crate) kind_of: &'f dyn Fn(u64) -> MemoryKind,
    /// Whether the runner has scratch memory for uploads ([`Staging::Scratch`]).
    pub(crate) scratch: bool,
    /// Whether the DMA backend submits one batched copy per call (`Backend::Auto`'s
    /// crossover is lower then).
    pub(crate) batched_dma: bool,
}
