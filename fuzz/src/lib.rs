//! Helpers shared by the fuzz targets: value generators biased towards the edges kvio has to
//! handle, and host buffers whose every byte outside the view kvio is given is checked.
//!
//! A [`Buf`] is allocated with exactly `pad + len` bytes and kvio sees `pad..pad + len`: a write
//! or read past the end is a heap overflow AddressSanitizer reports (cargo fuzz enables it),
//! the `pad` bytes before the view hold a pattern checked after every call.

use kvio::plan::Slice;
use kvio::{PagedLayout, TokenLayout};
use libfuzzer_sys::arbitrary::{Result, Unstructured};

/// Largest buffer a target allocates.
pub const MAX_BUF: usize = 1 << 16;

/// A size: mostly small (`0..=small`), sometimes a power of two, the type's edge or anything.
pub fn size(u: &mut Unstructured, small: usize) -> Result<usize> {
    Ok(match u.int_in_range(0u8..=19)? {
        0 => u.arbitrary::<usize>()?,
        1 => usize::MAX - u.int_in_range(0usize..=3)?,
        2 => 1usize << u.int_in_range(0u32..=63)?,
        3 => (i32::MAX as usize).wrapping_add(u.int_in_range(0usize..=2)?),
        4 => (i64::MAX as usize).wrapping_add(u.int_in_range(0usize..=2)?),
        _ => u.int_in_range(0..=small)?,
    })
}

/// An index value: mostly in `-3..=hint + 3`, sometimes an edge or anything.
pub fn index(u: &mut Unstructured, hint: usize) -> Result<i64> {
    let hint = hint.min(1 << 20) as i64;
    Ok(match u.int_in_range(0u8..=15)? {
        0 => u.arbitrary::<i64>()?,
        1 => *u.choose(&[
            i64::MIN,
            i64::MAX,
            i32::MIN as i64,
            i32::MAX as i64,
            i32::MAX as i64 + 1,
            u32::MAX as i64,
            -1,
        ])?,
        _ => u.int_in_range(-3..=hint + 3)?,
    })
}

/// An element size: 1, 2 or 4 mostly, anything sometimes.
pub fn elem(u: &mut Unstructured) -> Result<usize> {
    Ok(match u.int_in_range(0u8..=15)? {
        0 => size(u, 8)?,
        k => [1, 2, 4][k as usize % 3],
    })
}

/// A stride: mostly `natural`, sometimes `natural` plus a little, or any [`size`] up to
/// `small`.
pub fn stride(u: &mut Unstructured, natural: usize, small: usize) -> Result<usize> {
    Ok(match u.int_in_range(0u8..=4)? {
        0 | 1 => natural,
        2 => natural.wrapping_add(size(u, 8)?),
        _ => size(u, small)?,
    })
}

/// A buffer length: the layout's own extent (when it has one) plus a little, or anything small.
pub fn buf_len(u: &mut Unstructured, ext: Option<u64>) -> Result<usize> {
    Ok(match (u.int_in_range(0u8..=3)?, ext) {
        (0, _) | (_, None) => u.int_in_range(0..=4096)?,
        (_, Some(e)) => (e as usize)
            .saturating_add(u.int_in_range(0..=8)?)
            .saturating_sub(u.int_in_range(0..=1)?),
    }
    .min(MAX_BUF))
}

/// The shape `(blocks, block size, heads, head dim, element bytes)` of a write target's cache:
/// mostly usual, any field possibly anything.
pub fn cache_shape(u: &mut Unstructured) -> Result<(usize, usize, usize, usize, usize)> {
    Ok((
        size(u, 6)?,
        size(u, 40)?,
        size(u, 4)?,
        size(u, 12)?,
        elem(u)?,
    ))
}

/// A paged layout (HND or NHD element order) of the given shape; its strides are those of the
/// 1-sized template, for the caller to set.
pub fn paged_shape(hnd: bool, nb: usize, bs: usize, h: usize, d: usize, e: usize) -> PagedLayout {
    let mut l = if hnd {
        PagedLayout::hnd(1, 1, 1, 1, 1)
    } else {
        PagedLayout::nhd(1, 1, 1, 1, 1)
    };
    l.num_blocks = nb;
    l.block_size = bs;
    l.num_heads = h;
    l.head_dim = d;
    l.piece_elems = d;
    l.piece_stride = d;
    l.elem_bytes = e;
    l
}

/// Sets an input's head and token strides: packed, or perturbed by [`stride`].
pub fn input_strides(u: &mut Unstructured, input: &mut TokenLayout) -> Result<()> {
    input.head_stride = stride(u, input.head_dim, 64)?;
    input.token_stride = stride(u, input.num_heads.wrapping_mul(input.head_stride), 64)?;
    Ok(())
}

/// Whether the kernel copies a slice (its `index::check_slice`, restated in i128): non-empty,
/// within one page, inside the cache's `num_slots` and the input's `num_tokens`.
pub fn slice_copied(s: &Slice, page: usize, num_slots: usize, num_tokens: usize) -> bool {
    let (start, from, len) = (s.cache_start as i128, s.new_kv_start as i128, s.len as i128);
    let page = page as i128;
    len > 0
        && len <= page
        && start >= 0
        && from >= 0
        && start + len <= num_slots as i128
        && from + len <= num_tokens as i128
        && start / page == (start + len - 1) / page
}

/// Pattern byte of the pad before a view.
const PAD: u8 = 0xA7;

/// A host buffer seen by kvio as its last `len` bytes.
pub struct Buf {
    bytes: Vec<u8>,
    pad: usize,
}

impl Buf {
    /// `len` bytes of `fill`-derived data after `pad` pattern bytes.
    pub fn new(pad: usize, len: usize, fill: u8) -> Buf {
        let mut bytes = vec![PAD; pad + len];
        for (i, b) in bytes[pad..].iter_mut().enumerate() {
            *b = fill ^ (i as u8).wrapping_mul(31) ^ (i >> 8) as u8;
        }
        Buf { bytes, pad }
    }

    /// The view kvio is given: `len` bytes from `at` inside the view (clamped to it).
    pub fn view(&mut self, at: usize, len: usize) -> kvio::DeviceBytes<'static> {
        let avail = self.bytes.len() - self.pad;
        let at = at.min(avail);
        let len = len.min(avail - at);
        let ptr = self.bytes.as_mut_ptr() as u64 + (self.pad + at) as u64;
        // SAFETY: inside this allocation, which outlives every use of the view (each fuzz
        // case drops its views before its buffers).
        unsafe { kvio::DeviceBytes::from_raw(ptr, len) }
    }

    /// [`Buf::view`] as a write view (the emulation writes it).
    pub fn view_mut(&mut self, at: usize, len: usize) -> kvio::DeviceBytesMut<'static> {
        let v = self.view(at, len);
        // SAFETY: as for `view`; the host reads the buffer only after the emulated call.
        unsafe { kvio::DeviceBytesMut::from_raw(v.ptr(), v.len()) }
    }

    /// The bytes kvio may see.
    pub fn data(&self) -> &[u8] {
        &self.bytes[self.pad..]
    }

    /// Panics when a byte before the view changed.
    pub fn check_pad(&self, what: &str) {
        if let Some(i) = self.bytes[..self.pad].iter().position(|&b| b != PAD) {
            panic!(
                "{what}: byte {i} of the {} before the view was written",
                self.pad
            );
        }
    }
}

/// Asserts two byte buffers are equal, naming the first difference.
#[track_caller]
pub fn assert_same(what: &str, got: &[u8], want: &[u8]) {
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: byte {i} differs: got {}, want {}", got[i], want[i]);
    }
    assert_eq!(got.len(), want.len(), "{what}: lengths");
}
