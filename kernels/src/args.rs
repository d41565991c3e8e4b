//! Kernel argument lists, defined once: each `kernel!` invocation declares the argument
//! struct the body takes (module `ops`), its `to_words()` (the `cuLaunchKernel` parameter
//! array the host builds, in declaration order), and — on nvptx — the `extern "ptx-kernel"`
//! entry point with one scalar or raw-pointer parameter per field, in the same order. Host and
//! device can therefore never disagree on parameter order.

/// A kernel parameter as the 8-byte slot the host passes to `cuLaunchKernel` (a `u32`
/// parameter reads the low 4 bytes of its slot).
pub trait Word: Copy {
    /// The value widened to 64 bits.
    fn word(self) -> u64;
}

impl Word for u64 {
    fn word(self) -> u64 {
        self
    }
}
impl Word for u32 {
    fn word(self) -> u64 {
        self as u64
    }
}
impl<T> Word for *const T {
    fn word(self) -> u64 {
        self as u64
    }
}
impl<T> Word for *mut T {
    fn word(self) -> u64 {
        self as u64
    }
}

macro_rules! count {
    () => { 0usize };
    ($head:ident $($tail:ident)*) => { 1usize + count!($($tail)*) };
}

/// The entry points of an argument struct: each runs the struct's body, or its own body when
/// the entry names one (`name [path::to::body]`).
macro_rules! entry_points {
    ($args:ident, $body:path, $fields:tt ;) => {};
    ($args:ident, $body:path, $fields:tt ; $entry:ident [$own:path] $($rest:tt)*) => {
        entry_point!($args, $own, $entry, $fields);
        entry_points!($args, $body, $fields ; $($rest)*);
    };
    ($args:ident, $body:path, $fields:tt ; $entry:ident $($rest:tt)*) => {
        entry_point!($args, $body, $entry, $fields);
        entry_points!($args, $body, $fields ; $($rest)*);
    };
}

macro_rules! entry_point {
    ($args:ident, $body:path, $entry:ident, ($($field:ident : $ty:ty),*)) => {
        /// PTX entry point: waits for the grids it programmatically depends on (a no-op
        /// unless launched with programmatic dependent launch, and before `sm_90`; see
        /// [`crate::pdl`]), rebuilds the argument struct and runs the body on this thread's
        /// group.
        ///
        /// # Safety
        /// The host validated the arguments (see the body's contract).
        #[cfg(target_arch = "nvptx64")]
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $entry($($field: $ty),*) {
            // Before the first read of any argument's memory (inputs, slots, scales, tables)
            // and the first write.
            // (Unless the body does so itself, after its argument-only arithmetic.)
            if !<$args as $crate::pdl::Signal>::BODY_WAITS {
                $crate::pdl::prologue(<$args as $crate::pdl::Signal>::EARLY);
            }
            let a = $args { $($field),* };
            // SAFETY: forwarded from the launcher's validation.
            unsafe { $body(&a, $crate::ops::Group::this_thread(a.shift)) }
        }
    };
}

macro_rules! kernel {
    (
        $(#[$meta:meta])*
        $entry:ident $(| $more:ident $([$mbody:path])?)* ($args:ident) => $body:path {
            $($(#[$fmeta:meta])* $field:ident : $ty:ty),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug)]
        pub struct $args {
            $($(#[$fmeta])* pub $field: $ty),*
        }

        impl $args {
            /// Number of kernel parameters.
            pub const WORDS: usize = count!($($field)*);
            /// Byte size of each kernel parameter, in order.
            pub const SIZES: [usize; Self::WORDS] = [$(core::mem::size_of::<$ty>()),*];
            /// Name of the (first) PTX entry point.
            pub const ENTRY: &'static str = stringify!($entry);
            /// Names of every PTX entry point taking these arguments.
            pub const ENTRIES: &'static [&'static str] = &[stringify!($entry) $(, stringify!($more))*];
            /// The parameter slots for `cuLaunchKernel`, in the entry point's order.
            pub fn to_words(&self) -> [u64; Self::WORDS] {
                [$($crate::args::Word::word(self.$field)),*]
            }
        }

        entry_points!($args, $body, ($($field: $ty),*) ; $entry $($more $([$mbody])?)*);
    };
}

kernel! {
    /// Arguments of the slot-mapping update (see [`crate::ops::update_slots`]), for five entry
    /// points: `kvio_update_slots` (bytes copied, K and V alike), `kvio_update_slots_general`
    /// (K and V of different widths or strides: [`crate::ops::update_slots_general`]),
    /// `kvio_update_rows` (one row per token, an MLA row: [`crate::ops::update_rows`]),
    /// `kvio_update_slots_convert` (quantized on the way:
    /// [`crate::ops::update_slots_convert`]) and `kvio_update_rows_convert` (rows quantized on
    /// the way: [`crate::ops::update_rows_convert`]), so each keeps only the registers it
    /// needs.
    kvio_update_slots | kvio_update_slots_general [crate::ops::update_slots_general] | kvio_update_rows [crate::ops::update_rows] | kvio_update_slots_convert [crate::ops::update_slots_convert] | kvio_update_rows_convert [crate::ops::update_rows_convert] (SlotArgs) => crate::ops::update_slots {
        /// New keys.
        src_k: *const u8,
        /// New values (null: K only).
        src_v: *const u8,
        /// Bytes between input tokens.
        src_token_stride: u64,
        /// Bytes between input heads (0 when heads are merged).
        src_head_stride: u64,
        /// Key cache.
        dst_k: *mut u8,
        /// Value cache (null: K only).
        dst_v: *mut u8,
        /// Bytes between cache blocks.
        dst_block_stride: u64,
        /// Bytes between slots of a block.
        dst_token_stride: u64,
        /// Bytes between cache heads (0 when heads are merged).
        dst_head_stride: u64,
        /// Blocks in the cache.
        num_blocks: u64,
        /// Slots per block.
        block_size: u64,
        /// Head chunks per token (1 when merged).
        heads: u64,
        /// Bytes per chunk (K's; converting: fp8 bytes, one per element).
        chunk_bytes: u64,
        /// Bytes per chunk of V (equal to K's, except for an MLA row's rope part).
        chunk_bytes_v: u64,
        /// Bytes between input tokens of V (equal to K's, except for MLA's `k_pe`).
        src_token_stride_v: u64,
        /// Slot per token (i32 or i64).
        slots: *const u8,
        /// Non-zero: slots are i64.
        slot_is_i64: u32,
        /// Tokens (slots) to process.
        num_tokens: u64,
        /// Conversion on the way (`convert::NONE`: copy bytes; else a `convert::code`, and
        /// `chunk_bytes` counts fp8 bytes, one per element).
        convert: u32,
        /// K's scale(s), f32 (converting updates only).
        k_scale: *const f32,
        /// V's scale(s), f32 (converting updates with V only).
        v_scale: *const f32,
        /// Non-zero: one scale per head (`scale[head]`), else one per tensor.
        scale_per_head: u32,
        /// Non-zero: K's and V's chunks of a (token, head) are one item, V's units numbered
        /// after K's (an MLA row: latent then rope part, one scale, `k_scale`); else K and V
        /// are separate items.
        rows: u32,
        /// Access width in bytes (converting: `convert::VEC` for 8-element units, else 1).
        width: u32,
        /// log2 of lanes per work item.
        shift: u32,
        /// Error word (may be null).
        errors: *mut u32,
    }
}

impl SlotArgs {
    /// Whether this update converts (entry point `kvio_update_slots_convert`, or
    /// `kvio_update_rows_convert` for rows: [`SlotArgs::converts_rows`]).
    pub fn converts(&self) -> bool {
        self.convert != crate::convert::NONE
    }

    /// Whether this converting update writes one row per token (`rows`: an MLA row), entry
    /// point `kvio_update_rows_convert`.
    pub fn converts_rows(&self) -> bool {
        self.converts() && self.rows != 0
    }

    /// Whether this copying update writes one row per token (`rows`: an MLA row), entry point
    /// `kvio_update_rows`.
    pub fn copies_rows(&self) -> bool {
        !self.converts() && self.rows != 0
    }

    /// Whether this copying update of separate K and V items needs
    /// `kvio_update_slots_general`: its K and V parts differ in width or input stride.
    pub fn general(&self) -> bool {
        !self.converts()
            && self.rows == 0
            && (self.chunk_bytes_v != self.chunk_bytes
                || self.src_token_stride_v != self.src_token_stride)
    }
}

kernel! {
    /// Arguments of the tiled slot update (see [`crate::ops::update_tiles`]): the slot-mapping
    /// update for caches whose head vectors are split into pieces (vLLM's v0 paged layout),
    /// eight tokens per thread. K and V each have their own cache descriptor (byte strides,
    /// piece size in elements, piece stride in bytes, elements per store). One token per
    /// thread (decode sizes) runs `kvio_update_tiles_one`, caches of 4-byte elements
    /// `kvio_update_tiles_wide`, prefill sizes into fp8 caches `kvio_update_tiles_staged`, and
    /// prefill sizes that fill v0 pages of 2-byte elements `kvio_update_pages` (a whole CTA
    /// per sixteen tokens of one or more heads: `crate::ops::update_pages`), those that fill
    /// fp8 v0 pages from bf16 or f16 `kvio_update_pages_fp8` (`kvio_update_pages_fp8_32` on
    /// pages of a multiple of 32 slots), and prefill sizes into 2-byte v0 caches of pages of
    /// at most 16 slots, or of 32, 64 or 128, `kvio_update_stream` (a warp's lanes on
    /// consecutive tokens: `crate::ops::update_stream`; on pages of 8 slots or more
    /// `kvio_update_stream_rot`, its warps' windows shifted: `crate::ops::update_stream_rot`),
    /// and those quantizing bf16 or f16 into fp8 v0 caches of pages of 8, 16, 32 or 64 slots
    /// `kvio_update_stream_fp8`.
    kvio_update_tiles | kvio_update_tiles_one [crate::ops::update_tiles_one] | kvio_update_stream [crate::ops::update_stream] | kvio_update_stream_rot [crate::ops::update_stream_rot] | kvio_update_stream_fp8 [crate::ops::update_stream_fp8] | kvio_update_tiles_wide [crate::ops::update_tiles_wide] | kvio_update_tiles_staged [crate::ops::update_tiles_staged] | kvio_update_pages [crate::ops::update_pages] | kvio_update_pages_fp8 [crate::ops::update_pages_fp8] | kvio_update_pages_fp8_32 [crate::ops::update_pages_fp8_32] (TileArgs) => crate::ops::update_tiles {
        /// New keys.
        src_k: *const u8,
        /// New values (null: K only).
        src_v: *const u8,
        /// Bytes between input tokens.
        src_token_stride: u64,
        /// Bytes between input heads.
        src_head_stride: u64,
        /// Non-zero: every 8-element source group is aligned for vector loads.
        src_vec: u32,
        /// Key cache.
        dst_k: *mut u8,
        /// K: bytes between blocks.
        block_stride_k: u64,
        /// K: bytes between slots of a block.
        token_stride_k: u64,
        /// K: bytes between heads.
        head_stride_k: u64,
        /// K: elements per piece (1, 4, or a multiple of 8).
        piece_k: u64,
        /// K: bytes between pieces.
        piece_stride_k: u64,
        /// K: elements per store (8, 4 or 1).
        unit_k: u32,
        /// Value cache (null: K only).
        dst_v: *mut u8,
        /// V: bytes between blocks.
        block_stride_v: u64,
        /// V: bytes between slots of a block.
        token_stride_v: u64,
        /// V: bytes between heads.
        head_stride_v: u64,
        /// V: elements per piece.
        piece_v: u64,
        /// V: bytes between pieces.
        piece_stride_v: u64,
        /// V: elements per store.
        unit_v: u32,
        /// Bit 0 (K), bit 1 (V): eight aligned consecutive slots of a block may be stored as
        /// one run (rows, or transposed columns for one element per piece); set only with
        /// `src_vec`, 8-slot-aligned blocks and stores aligned for it. Bit 2: the copying
        /// stream shifts its warps' windows (`kvio_update_stream_rot`: [`TileArgs::rotates`]).
        runs: u32,
        /// Blocks in the caches.
        num_blocks: u64,
        /// Slots per block.
        block_size: u64,
        /// Heads per token.
        heads: u64,
        /// 8-element groups per head (`head_dim / 8`).
        groups: u64,
        /// Bytes per cache element (1, 2 or 4).
        elem: u32,
        /// Slot per token (i32 or i64).
        slots: *const u8,
        /// Non-zero: slots are i64.
        slot_is_i64: u32,
        /// Tokens (slots) to process.
        num_tokens: u64,
        /// Conversion on the way (`convert::NONE`: copy; else a `convert::code`, `elem` 1).
        convert: u32,
        /// K's scale(s), f32 (converting updates only).
        k_scale: *const f32,
        /// V's scale(s), f32 (converting updates with V only).
        v_scale: *const f32,
        /// Non-zero: one scale per head.
        scale_per_head: u32,
        /// Tokens per tile: 8 (prefill: full tiles of consecutive slots are stored as runs), 1
        /// (decode: one token per thread, nothing serialised) or 16 (`kvio_update_pages`:
        /// sixteen tokens of `subs` heads per CTA, whole pages stored through shared memory;
        /// `kvio_update_pages_fp8_32`: 32, on pages of a multiple of 32 slots).
        tile: u32,
        /// Tiles of one (part, head, group) handled by consecutive threads (1, 2 or 4); for
        /// the pages entries (`tile` 16 or 32), the heads of one work item; with `tile` 1,
        /// 32 selects `kvio_update_stream` (tokens a warp).
        subs: u32,
        /// Non-zero: `kvio_update_tiles_staged` copies each thread's next tile into shared
        /// memory (the slot array is 16-byte aligned, source elements are of at most 2 bytes,
        /// and a part has runs).
        staged: u32,
        /// log2 of lanes per work item (always 0: one thread per item).
        shift: u32,
        /// Error word (may be null).
        errors: *mut u32,
    }
}

impl TileArgs {
    /// Whether this update runs `kvio_update_pages` or `kvio_update_pages_fp8` (sixteen
    /// tokens of `subs` heads per CTA).
    pub fn pages(&self) -> bool {
        self.tile >= crate::ops::PAGE_TOKENS as u32
    }

    /// Whether this update runs `kvio_update_stream` (`kvio_update_stream_rot`:
    /// [`TileArgs::rotates`]) or, into 1-byte caches, `kvio_update_stream_fp8` (one token a
    /// lane, `subs` = [`crate::ops::STREAM_LANES`] tokens a warp).
    pub fn streams(&self) -> bool {
        self.tile == 1 && self.subs as u64 == crate::ops::STREAM_LANES
    }

    /// Whether this copying stream ([`TileArgs::streams`], 2-byte caches) runs
    /// `kvio_update_stream_rot`, its warps' windows shifted (`runs` bit 2).
    pub fn rotates(&self) -> bool {
        self.runs & 4 != 0
    }
}

kernel! {
    /// Arguments of the slice-based update (see [`crate::ops::update_slices`]), for two entry
    /// points: `kvio_update_slices` (rows copied as they are) and `kvio_slices_to_slots` (the
    /// slices turned into a slot list at `dst`, for the slot update to write layouts and
    /// conversions the row copy does not: [`crate::ops::slices_to_slots`]).
    kvio_update_slices | kvio_slices_to_slots [crate::ops::slices_to_slots] (SliceArgs) => crate::ops::update_slices {
        /// New K/V rows.
        src: *const u8,
        /// Bytes between source rows.
        src_row_stride: u64,
        /// The cache (`kvio_slices_to_slots`: the slot list, `num_tokens` i32 set to -1).
        dst: *mut u8,
        /// Bytes between cache pages.
        dst_page_stride: u64,
        /// Bytes between rows of a page.
        dst_row_stride: u64,
        /// Bytes per row.
        row_bytes: u64,
        /// Slots in the cache.
        num_slots: u64,
        /// Rows in the source.
        num_tokens: u64,
        /// Slots per page.
        page_size: u32,
        /// `[3, padded]` i32 slice table.
        slices: *const i32,
        /// Capacity of the table.
        padded: u32,
        /// Device-side slice count.
        num_slices: *const i32,
        /// Rows one work item copies at most.
        rows_per_item: u32,
        /// Non-zero: rows contiguous on both sides (an item is one span).
        merge: u32,
        /// Access width in bytes.
        width: u32,
        /// log2 of lanes per work item.
        shift: u32,
        /// Error word (may be null).
        errors: *mut u32,
    }
}

kernel! {
    /// Arguments of the block copy (see [`crate::ops::copy_blocks`]). Three entry points run
    /// it: `kvio_copy_blocks` (device-side copies, 256-thread CTAs) and `kvio_transfer_blocks`
    /// (copies touching host memory, 512-thread CTAs: the build gives it `.maxntid 512`; its own
    /// body, [`crate::ops::transfer_blocks`], moves the same bytes in batches of items), and
    /// `kvio_transfer_blocks_tma` (the same copies through Hopper bulk copies and shared memory,
    /// one-warp CTAs: [`crate::ops::transfer_blocks_tma`]; launched on `sm_90` only), and
    /// `kvio_convert_blocks` (conversions to and from vLLM's v0 layout, a head page per group:
    /// [`crate::ops::convert_blocks`]), and `kvio_convert_pages` (the same conversions through
    /// a CTA's shared tile, 16-byte accesses on both sides: `crate::ops::convert_pages`).
    kvio_copy_blocks | kvio_transfer_blocks [crate::ops::transfer_blocks] | kvio_transfer_blocks_tma [crate::ops::transfer_blocks_tma] | kvio_convert_blocks [crate::ops::convert_blocks] | kvio_convert_pages [crate::ops::convert_pages] (CopyArgs) => crate::ops::copy_blocks {
        /// Source pool base (strided pools).
        src_base: *mut u8,
        /// Source layer/part pointer table (null: strided).
        src_table: *const u64,
        /// Source bytes between layers.
        src_layer_stride: u64,
        /// Source bytes between parts.
        src_part_stride: u64,
        /// Source bytes between blocks.
        src_block_stride: u64,
        /// Source bytes between tokens.
        src_token_stride: u64,
        /// Source bytes between heads.
        src_head_stride: u64,
        /// Destination pool base (strided pools).
        dst_base: *mut u8,
        /// Destination layer/part pointer table (null: strided).
        dst_table: *const u64,
        /// Destination bytes between layers.
        dst_layer_stride: u64,
        /// Destination bytes between parts.
        dst_part_stride: u64,
        /// Destination bytes between blocks.
        dst_block_stride: u64,
        /// Destination bytes between tokens.
        dst_token_stride: u64,
        /// Destination bytes between heads.
        dst_head_stride: u64,
        /// Layer extent (1 when merged).
        layers: u64,
        /// Part extent (1 when merged).
        parts: u64,
        /// Token extent (1 when merged).
        tokens: u64,
        /// Head extent (1 when merged).
        heads: u64,
        /// Contiguous bytes per chunk (after merging dimensions).
        chunk: u64,
        /// Bytes one work item copies (divides `chunk`).
        piece: u64,
        /// Work items per chunk (`chunk / piece` when a chunk is contiguous on both sides).
        pieces: u64,
        /// Source bytes between consecutive items of a chunk (`piece` when contiguous; a
        /// layout whose head vectors are in pieces, vLLM's v0: its piece stride).
        src_piece_stride: u64,
        /// Destination bytes between consecutive items of a chunk (as `src_piece_stride`).
        dst_piece_stride: u64,
        /// `[n, 2]` i64 block pairs.
        pairs: *const i64,
        /// Number of pairs.
        num_pairs: u64,
        /// Blocks in the source pool.
        src_blocks: u64,
        /// Blocks in the destination pool.
        dst_blocks: u64,
        /// Parts per layer of the pools (table indexing), before merging.
        table_parts: u64,
        /// Bytes per element (`kvio_convert_pages`).
        elem: u32,
        /// Tokens of a head page one CTA item of `kvio_convert_pages` moves (divides the page;
        /// `tokens` then counts such runs per page); 0 elsewhere.
        tile: u32,
        /// Heads one CTA item of `kvio_convert_pages` moves (the last item of a page's heads
        /// may have fewer); 1 elsewhere.
        subs: u32,
        /// Access width in bytes.
        width: u32,
        /// log2 of lanes per work item.
        shift: u32,
        /// Error word (may be null).
        errors: *mut u32,
    }
}

kernel! {
    /// Arguments of the benchmarks' naive baseline (see [`crate::ops::naive_spans`]).
    kvio_naive_spans(NaiveArgs) => crate::ops::naive_spans {
        /// `(src, dst)` address pairs.
        spans: *const u64,
        /// Number of spans.
        num_spans: u64,
        /// Elements per span.
        span_elems: u64,
        /// Bytes per element.
        elem_bytes: u32,
        /// Always 0 (one thread per element).
        shift: u32,
    }
}

kernel! {
    /// Arguments of the benchmarks' compute-bound yardstick (see [`crate::ops::spin`]): the
    /// kernel that keeps the SMs busy while transfers run beside it.
    kvio_spin(SpinArgs) => crate::ops::spin {
        /// One `f32` per thread of the grid.
        out: *mut f32,
        /// Length of each thread's dependent multiply-add chain.
        iters: u32,
        /// Always 0 (one thread per output).
        shift: u32,
    }
}

// Write-path kernels and the benchmarks' own signal early; block copies do not (see
// [`crate::pdl`]).
impl crate::pdl::Signal for SlotArgs {
    const BODY_WAITS: bool = true;
}
impl crate::pdl::Signal for TileArgs {
    const BODY_WAITS: bool = true;
}
impl crate::pdl::Signal for SliceArgs {}
impl crate::pdl::Signal for NaiveArgs {}
impl crate::pdl::Signal for SpinArgs {}
impl crate::pdl::Signal for CopyArgs {
    const EARLY: bool = false;
}
