//! Layout descriptors: sizes and explicit strides (in elements) of the token-major inputs and
//! of paged caches. Sizes are always taken from these descriptors, never guessed from a
//! buffer's length (vLLM #47056 is what guessing does).

use crate::error::{invalid, Error, Result};

/// Token-major K or V input: token `t`, head `h`, element `d` at element offset
/// `t * token_stride + h * head_stride + d`.
///
/// ```
/// # fn main() -> kvio::Result<()> {
/// // K heads inside a packed `[T, Hq + 2 * Hkv, D]` qkv tensor: a strided view, no copy.
/// let (t, hq, hkv, d) = (4, 32, 8, 128);
/// let mut k = kvio::TokenLayout::contiguous(t, hkv, d, 2);
/// k.token_stride = (hq + 2 * hkv) * d; // the view starts at element hq * d of the qkv buffer
/// assert_eq!(k.extent("key")?, (((t - 1) * (hq + 2 * hkv) * d + hkv * d) * 2) as u64);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenLayout {
    /// Number of tokens `T`.
    pub num_tokens: usize,
    /// Heads per token.
    pub num_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Bytes per element: 1, 2 or 4.
    pub elem_bytes: usize,
    /// Elements between consecutive tokens.
    pub token_stride: usize,
    /// Elements between consecutive heads.
    pub head_stride: usize,
}

impl TokenLayout {
    /// A contiguous `[T, H, D]` tensor.
    ///
    /// ```
    /// let l = kvio::TokenLayout::contiguous(4, 8, 128, 2);
    /// assert_eq!(l.token_stride, 8 * 128);
    /// ```
    pub fn contiguous(
        num_tokens: usize,
        num_heads: usize,
        head_dim: usize,
        elem_bytes: usize,
    ) -> Self {
        TokenLayout {
            num_tokens,
            num_heads,
            head_dim,
            elem_bytes,
            token_stride: num_heads.saturating_mul(head_dim),
            head_stride: head_dim,
        }
    }

    /// Bytes of one token's row of all heads (`H * D * elem`).
    pub fn row_bytes(&self) -> usize {
        self.num_heads * self.head_dim * self.elem_bytes
    }

    /// Checks the shape and returns the number of bytes the layout reaches from its base.
    pub fn extent(&self, name: &'static str) -> Result<u64> {
        check_elem(name, self.elem_bytes)?;
        nonzero(name, "num_heads", self.num_heads)?;
        nonzero(name, "head_dim", self.head_dim)?;
        check_strides(
            name,
            &[
                self.token_stride,
                self.head_stride,
                self.head_dim,
                self.num_heads,
            ],
            self.elem_bytes,
        )?;
        if self.num_tokens == 0 {
            return Ok(0);
        }
        extent_bytes(
            name,
            &[
                (self.num_tokens, self.token_stride),
                (self.num_heads, self.head_stride),
            ],
            self.head_dim,
            self.elem_bytes,
        )
    }
}

/// A paged cache of one of K or V: `num_blocks` blocks (pages) of `block_size` token slots,
/// each `num_heads × head_dim` elements. Slot `s` is block `s / block_size`, position
/// `s % block_size`; element `(b, t, h, d)` is at element offset
/// `b * block_stride + t * token_stride + h * head_stride + (d / piece_elems) * piece_stride +
/// d % piece_elems`.
///
/// [`PagedLayout::nhd`] (= the flat `[blocks * block_size, H, D]` layout) and
/// [`PagedLayout::hnd`] build the usual ones, with each head vector contiguous (one piece of
/// `head_dim` elements); [`PagedLayout::v0_key`] and [`PagedLayout::v0_value`] build vLLM's v0
/// paged layout, whose head vectors are split into pieces. Any strides may be given, so a view
/// into a larger allocation (a layer of a cross-layer cache) is described exactly.
///
/// Layouts with pieces (`piece_elems < head_dim`) are written by [`crate::Kvio::update_slots`]
/// and moved by [`crate::Kvio::copy_blocks`]: between pools of the same layout each block is
/// one dense region, copied whole; to or from pools of another layout (NHD, HND, cross-layer)
/// each head vector moves piece by piece (a pool's V laid out apart from its K:
/// [`crate::BlockPool::value_layout`]). Slice updates refuse them with a typed error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedLayout {
    /// Number of blocks.
    pub num_blocks: usize,
    /// Token slots per block (the page size).
    pub block_size: usize,
    /// Heads per token.
    pub num_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Bytes per element: 1, 2 or 4.
    pub elem_bytes: usize,
    /// Elements between consecutive blocks.
    pub block_stride: usize,
    /// Elements between consecutive slots of a block.
    pub token_stride: usize,
    /// Elements between consecutive heads.
    pub head_stride: usize,
    /// Contiguous elements of a head vector (`head_dim` when it is contiguous; must divide
    /// `head_dim`).
    pub piece_elems: usize,
    /// Elements between consecutive pieces of a head vector (unused when `piece_elems ==
    /// head_dim`).
    pub piece_stride: usize,
}

impl PagedLayout {
    /// `[num_blocks, block_size, H, D]`, contiguous (vLLM's FlashAttention NHD cache; also the
    /// flat `[num_blocks * block_size, H, D]` layout).
    ///
    /// ```
    /// let l = kvio::PagedLayout::nhd(100, 16, 8, 128, 2);
    /// assert_eq!(l.num_slots(), 1600);
    /// ```
    pub fn nhd(
        num_blocks: usize,
        block_size: usize,
        num_heads: usize,
        head_dim: usize,
        elem_bytes: usize,
    ) -> Self {
        PagedLayout {
            num_blocks,
            block_size,
            num_heads,
            head_dim,
            elem_bytes,
            block_stride: block_size
                .saturating_mul(num_heads)
                .saturating_mul(head_dim),
            token_stride: num_heads.saturating_mul(head_dim),
            head_stride: head_dim,
            piece_elems: head_dim,
            piece_stride: head_dim,
        }
    }

    /// `[num_blocks, H, block_size, D]`, contiguous (HND).
    ///
    /// ```
    /// let l = kvio::PagedLayout::hnd(100, 16, 8, 128, 2);
    /// assert_eq!((l.head_stride, l.token_stride), (16 * 128, 128));
    /// ```
    pub fn hnd(
        num_blocks: usize,
        block_size: usize,
        num_heads: usize,
        head_dim: usize,
        elem_bytes: usize,
    ) -> Self {
        PagedLayout {
            num_blocks,
            block_size,
            num_heads,
            head_dim,
            elem_bytes,
            block_stride: block_size
                .saturating_mul(num_heads)
                .saturating_mul(head_dim),
            token_stride: head_dim,
            head_stride: block_size.saturating_mul(head_dim),
            piece_elems: head_dim,
            piece_stride: head_dim,
        }
    }

    /// vLLM's v0 paged key cache `[num_blocks, H, D / x, block_size, x]` with `x = 16 /
    /// elem_bytes` (paged attention v1/v2; mistral.rs, candle-vllm): a token's head vector is
    /// `D / x` pieces of 16 bytes, `16 * block_size` bytes apart. `head_dim` must be a multiple
    /// of `x` ([`PagedLayout::extent`] checks).
    ///
    /// ```
    /// let l = kvio::PagedLayout::v0_key(100, 16, 8, 128, 2); // bf16: x = 8
    /// assert_eq!((l.token_stride, l.piece_elems, l.piece_stride), (8, 8, 16 * 8));
    /// assert_eq!(l.extent("key_cache").unwrap(), 100 * 8 * 128 * 16 * 2);
    /// assert!(kvio::PagedLayout::v0_key(100, 16, 8, 120, 1).extent("k").is_err()); // x = 16
    /// ```
    pub fn v0_key(
        num_blocks: usize,
        block_size: usize,
        num_heads: usize,
        head_dim: usize,
        elem_bytes: usize,
    ) -> Self {
        let x = 16 / elem_bytes.clamp(1, 16);
        Self::v0(num_blocks, block_size, num_heads, head_dim, elem_bytes, x)
    }

    /// vLLM's v0 paged value cache `[num_blocks, H, D, block_size]`: transposed, a token's
    /// `D` values are `block_size` elements apart (pieces of one element).
    ///
    /// ```
    /// let l = kvio::PagedLayout::v0_value(100, 16, 8, 128, 2);
    /// assert_eq!((l.token_stride, l.piece_elems, l.piece_stride), (1, 1, 16));
    /// ```
    pub fn v0_value(
        num_blocks: usize,
        block_size: usize,
        num_heads: usize,
        head_dim: usize,
        elem_bytes: usize,
    ) -> Self {
        Self::v0(num_blocks, block_size, num_heads, head_dim, elem_bytes, 1)
    }

    /// vLLM's v0 cache `[num_blocks, H, D / x, block_size, x]`: the key cache with `x = 16 /
    /// elem_bytes`, the value cache with `x = 1` (`[num_blocks, H, D, block_size]`).
    fn v0(
        num_blocks: usize,
        block_size: usize,
        num_heads: usize,
        head_dim: usize,
        elem_bytes: usize,
        x: usize,
    ) -> Self {
        let head = head_dim.saturating_mul(block_size);
        PagedLayout {
            num_blocks,
            block_size,
            num_heads,
            head_dim,
            elem_bytes,
            block_stride: head.saturating_mul(num_heads),
            token_stride: x,
            head_stride: head,
            piece_elems: x,
            piece_stride: block_size.saturating_mul(x),
        }
    }

    /// `(num_blocks, block_size, num_heads, head_dim, elem_bytes)`: what two layouts of one
    /// cache's K and V must share.
    pub(crate) fn shape(&self) -> (usize, usize, usize, usize, usize) {
        (
            self.num_blocks,
            self.block_size,
            self.num_heads,
            self.head_dim,
            self.elem_bytes,
        )
    }

    /// Whether head vectors are split into pieces (`piece_elems < head_dim`).
    pub fn is_pieced(&self) -> bool {
        self.piece_elems < self.head_dim
    }

    /// Bytes of one block when its elements fill `[0, bytes)` exactly (`bytes = block_size *
    /// H * D * elem`, no gaps: vLLM's v0 blocks, contiguous NHD/HND blocks); `None` otherwise.
    /// Block copies move such a block whole, whatever the order inside it.
    pub(crate) fn dense_block_bytes(&self) -> Option<u64> {
        let mut one = *self;
        one.num_blocks = 1;
        let ext = one.extent("block").ok()?;
        let n = (self.block_size as u64)
            .checked_mul(self.num_heads as u64)?
            .checked_mul(self.head_dim as u64)?
            .checked_mul(self.elem_bytes as u64)?;
        (ext == n).then_some(n)
    }

    /// A typed error naming `name` unless head vectors are contiguous (operations that move
    /// whole head chunks call this).
    pub(crate) fn contiguous_heads(&self, name: &'static str) -> Result<()> {
        if self.is_pieced() {
            return Err(invalid(
                name,
                (self.piece_elems, self.head_dim),
                "head vectors split into pieces (v0 layout) are written by slot and slice updates only",
            ));
        }
        Ok(())
    }

    /// Total token slots (`num_blocks * block_size`).
    pub fn num_slots(&self) -> usize {
        self.num_blocks.saturating_mul(self.block_size)
    }

    /// Bytes of one head chunk (`head_dim * elem_bytes`).
    pub fn chunk_bytes(&self) -> usize {
        self.head_dim * self.elem_bytes
    }

    /// The (count, byte stride) of each dimension above the head chunk.
    pub(crate) fn dims(&self) -> [(usize, u64); 3] {
        let e = self.elem_bytes as u64;
        [
            (self.num_blocks, self.block_stride as u64 * e),
            (self.block_size, self.token_stride as u64 * e),
            (self.num_heads, self.head_stride as u64 * e),
        ]
    }

    /// Checks the shape (non-zero sizes, element size, no two slots or heads sharing bytes,
    /// no overflow) and returns the number of bytes the layout reaches from its base.
    ///
    /// ```
    /// let l = kvio::PagedLayout::nhd(100, 16, 8, 128, 2);
    /// assert_eq!(l.extent("cache").unwrap(), 100 * 16 * 8 * 128 * 2);
    /// let mut bad = l;
    /// bad.token_stride = 64; // two slots would share bytes
    /// assert!(bad.extent("cache").is_err());
    /// ```
    pub fn extent(&self, name: &'static str) -> Result<u64> {
        check_elem(name, self.elem_bytes)?;
        nonzero(name, "num_blocks", self.num_blocks)?;
        nonzero(name, "block_size", self.block_size)?;
        nonzero(name, "num_heads", self.num_heads)?;
        nonzero(name, "head_dim", self.head_dim)?;
        nonzero(name, "piece_elems", self.piece_elems)?;
        if !self.head_dim.is_multiple_of(self.piece_elems) {
            return Err(invalid(
                name,
                (self.head_dim, self.piece_elems),
                "head_dim is not a multiple of piece_elems (v0 layout: of x = 16 / elem_bytes)",
            ));
        }
        // A contiguous head is one piece: its piece stride is never used.
        let pieces = self.head_dim / self.piece_elems;
        let piece_stride = if pieces == 1 { 0 } else { self.piece_stride };
        check_strides(
            name,
            &[
                self.block_stride,
                self.token_stride,
                self.head_stride,
                piece_stride,
            ],
            self.elem_bytes,
        )?;
        (self.num_heads as u64)
            .checked_mul(self.head_dim as u64)
            .and_then(|v| v.checked_mul(self.elem_bytes as u64))
            .filter(|&v| v <= isize::MAX as u64)
            .ok_or(Error::Overflow { name })?;
        if self.num_slots() > i64::MAX as usize || self.num_slots() == usize::MAX {
            return Err(Error::Overflow { name });
        }
        let ext = extent_bytes(
            name,
            &[
                (self.num_blocks, self.block_stride),
                (self.block_size, self.token_stride),
                (self.num_heads, self.head_stride),
                (pieces, piece_stride),
            ],
            self.piece_elems,
            self.elem_bytes,
        )?;
        let e = self.elem_bytes as u64;
        let [blocks, slots, heads] = self.dims();
        let dims = [blocks, slots, heads, (pieces, piece_stride as u64 * e)];
        if !chunks_disjoint(&dims, self.piece_elems as u64 * e) {
            return Err(invalid(
                name,
                self,
                "strides make two (block, slot, head, piece) chunks share bytes",
            ));
        }
        Ok(ext)
    }
}

/// Every stride (and size) times the element size must be a byte count that fits `isize`:
/// the launchers and kernels compute byte offsets from them.
fn check_strides(name: &'static str, strides: &[usize], elem: usize) -> Result<()> {
    for &s in strides {
        (s as u64)
            .checked_mul(elem as u64)
            .filter(|&v| v <= isize::MAX as u64)
            .ok_or(Error::Overflow { name })?;
    }
    Ok(())
}

/// Accepts element sizes 1, 2 and 4 (fp8/int8, f16/bf16, f32).
fn check_elem(name: &'static str, elem: usize) -> Result<()> {
    if matches!(elem, 1 | 2 | 4) {
        Ok(())
    } else {
        Err(invalid(name, elem, "elem_bytes must be 1, 2 or 4"))
    }
}

fn nonzero(name: &'static str, what: &'static str, v: usize) -> Result<()> {
    if v == 0 {
        Err(Error::InvalidArgument {
            name,
            value: format!("{what} = 0"),
            reason: "sizes must be non-zero",
        })
    } else {
        Ok(())
    }
}

/// Bytes reached by a strided layout: 1 + the largest byte offset of its last element.
fn extent_bytes(
    name: &'static str,
    dims: &[(usize, usize)],
    inner: usize,
    elem: usize,
) -> Result<u64> {
    // The error built only on the failing path (an eager value would be built, cloned and
    // dropped on every call: measurable in a decode step's plan).
    let of = || Error::Overflow { name };
    let mut last: u64 = (inner as u64).checked_sub(1).ok_or_else(of)?;
    for &(count, stride) in dims {
        let step = (count as u64)
            .checked_sub(1)
            .and_then(|c| c.checked_mul(stride as u64))
            .ok_or_else(of)?;
        last = last.checked_add(step).ok_or_else(of)?;
    }
    let bytes = last
        .checked_add(1)
        .and_then(|v| v.checked_mul(elem as u64))
        .filter(|&v| v <= isize::MAX as u64)
        .ok_or_else(of)?;
    Ok(bytes)
}

/// True when chunks of `chunk` bytes placed at every combination of `dims` (count, byte
/// stride) never share a byte. Sufficient test: sorted by stride, each dimension's stride is at
/// least the span of everything below it. Layouts that interleave in stranger ways are
/// rejected even if they happen to be disjoint.
pub(crate) fn chunks_disjoint(dims: &[(usize, u64)], chunk: u64) -> bool {
    // A handful of dimensions (at most 5 from kvio's callers): those of more than one entry
    // insertion-sorted by stride (stable) into a fixed array on the stack, in the same pass.
    // Written out rather than `d[..n].sort_by_key`: that call on the same array cost a
    // block-copy plan 30–70 ns more (BENCHMARKS.md, session 33).
    let mut d = [(0usize, 0u64); 8];
    assert!(dims.len() <= d.len(), "at most {} dimensions", d.len());
    let mut n = 0;
    for &(c, s) in dims {
        if c > 1 {
            let mut i = n;
            while i > 0 && d[i - 1].1 > s {
                d[i] = d[i - 1];
                i -= 1;
            }
            d[i] = (c, s);
            n += 1;
        }
    }
    let mut span = chunk as u128;
    for &(count, stride) in &d[..n] {
        if (stride as u128) < span {
            return false;
        }
        span += (count as u128 - 1) * stride as u128;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nhd_and_hnd_extents() {
        assert_eq!(
            PagedLayout::nhd(3, 16, 8, 128, 2).extent("c").unwrap(),
            3 * 16 * 8 * 128 * 2
        );
        assert_eq!(
            PagedLayout::hnd(3, 16, 8, 128, 2).extent("c").unwrap(),
            3 * 16 * 8 * 128 * 2
        );
    }

    #[test]
    fn overlapping_strides_rejected() {
        let mut l = PagedLayout::nhd(4, 16, 8, 128, 2);
        l.token_stride = 64; // slots overlap heads
        assert!(matches!(
            l.extent("c"),
            Err(Error::InvalidArgument { name: "c", .. })
        ));
    }

    #[test]
    fn disjointness() {
        // interleaved K/V heads: part stride D, head stride 2D
        assert!(chunks_disjoint(&[(2, 256), (8, 512)], 256));
        assert!(!chunks_disjoint(&[(2, 128), (8, 512)], 256));
        assert!(chunks_disjoint(&[(1, 0), (5, 10)], 10));
        // The dimensions in any order (sorted by stride inside): the same answers.
        assert!(chunks_disjoint(&[(8, 512), (2, 256)], 256));
        assert!(!chunks_disjoint(&[(8, 512), (2, 128)], 256));
        let five = [(4, 4096), (1, 7), (2, 128), (16, 256), (3, 65536)];
        assert!(chunks_disjoint(&five, 128));
        assert!(!chunks_disjoint(&five, 129));
        let mut shuffled = five;
        shuffled.reverse();
        assert!(chunks_disjoint(&shuffled, 128));
        assert!(!chunks_disjoint(&shuffled, 129));
    }

    #[test]
    fn bad_sizes_rejected() {
        assert!(PagedLayout::nhd(0, 16, 8, 128, 2).extent("c").is_err());
        assert!(PagedLayout::nhd(1, 16, 8, 128, 3).extent("c").is_err());
        let huge = PagedLayout::nhd(usize::MAX / 2, 16, 8, 128, 2);
        assert!(matches!(huge.extent("c"), Err(Error::Overflow { .. })));
    }

    #[test]
    fn huge_strides_of_unit_dimensions_are_overflows() {
        // A dimension of extent 1 never multiplies its stride into the extent, but the
        // launchers still turn every stride into a byte offset: it must fit.
        let mut l = PagedLayout::nhd(1, 16, 8, 128, 2);
        l.block_stride = usize::MAX;
        assert!(matches!(l.extent("c"), Err(Error::Overflow { name: "c" })));
        let mut l = PagedLayout::nhd(4, 1, 8, 128, 2);
        l.token_stride = usize::MAX / 2;
        assert!(matches!(l.extent("c"), Err(Error::Overflow { .. })));
        let mut t = TokenLayout::contiguous(1, 8, 128, 2);
        t.token_stride = usize::MAX;
        assert!(matches!(t.extent("i"), Err(Error::Overflow { name: "i" })));
        let mut t = TokenLayout::contiguous(0, 8, 128, 2);
        t.head_stride = usize::MAX;
        assert!(matches!(t.extent("i"), Err(Error::Overflow { .. })));
    }

    #[test]
    fn absurd_constructor_shapes_saturate_and_are_rejected() {
        let l = PagedLayout::nhd(2, usize::MAX / 2, 8, 128, 2);
        assert!(matches!(l.extent("c"), Err(Error::Overflow { .. })));
        let l = PagedLayout::hnd(2, 16, usize::MAX / 4, 128, 2);
        assert!(matches!(l.extent("c"), Err(Error::Overflow { .. })));
    }
}
