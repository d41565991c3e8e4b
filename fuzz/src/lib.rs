//! Helpers shared by the fuzz targets: value generators biased towards the edges kvio has to
//! handle, and host buffers whose every byte outside the view kvio is given is checked.
//!
//! A [`Buf`] is allocated with exactly `pad + len` bytes and kvio sees `pad..pad + len`: a write
//! or read past the end is a heap overflow AddressSanitizer reports (cargo fuzz enables it),
//! the `pad` bytes before the view hold a pattern checked after every call.

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
    pub fn view(&mut self, at: usize, len: usize) -> kvio::DeviceBytes {
        let avail = self.bytes.len() - self.pad;
        let at = at.min(avail);
        let len = len.min(avail - at);
        let ptr = self.bytes.as_mut_ptr() as u64 + (self.pad + at) as u64;
        // SAFETY: inside this allocation, which outlives every use of the view.
        unsafe { kvio::DeviceBytes::from_raw(ptr, len) }
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
