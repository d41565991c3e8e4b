//! [`InlineVec`]: a list of plain values that lives on the stack up to a few entries, so the
//! planners' per-call lists (spans, checked pairs) cost no heap allocation at decode sizes.

use std::ops::{Deref, DerefMut};

/// A list that holds up to `N` values inline and moves to the heap beyond (once, with the
/// capacity asked for). Only `Copy` values: no drop glue, no `unsafe`.
#[derive(Clone)]
pub(crate) struct InlineVec<T: Copy + Default, const N: usize> {
    inline: [T; N],
    len: usize,
    /// Every value once the list outgrew `inline` (then `inline` is unused).
    heap: Vec<T>,
}

impl<T: Copy + Default, const N: usize> InlineVec<T, N> {
    /// An empty list with room for `cap` values: inline when `cap <= N`, else one heap
    /// allocation of `cap` values now.
    pub(crate) fn with_capacity(cap: usize) -> Self {
        InlineVec {
            inline: [T::default(); N],
            len: 0,
            heap: if cap > N {
                Vec::with_capacity(cap)
            } else {
                Vec::new()
            },
        }
    }

    /// Whether the values live on the heap.
    fn spilled(&self) -> bool {
        self.heap.capacity() > 0
    }

    /// Appends `v`.
    pub(crate) fn push(&mut self, v: T) {
        if !self.spilled() {
            if self.len < N {
                self.inline[self.len] = v;
                self.len += 1;
                return;
            }
            self.heap.reserve(2 * N.max(1));
            self.heap.extend_from_slice(&self.inline[..self.len]);
        }
        self.heap.push(v);
    }
}

impl<T: Copy + Default, const N: usize> Deref for InlineVec<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        if self.spilled() {
            &self.heap
        } else {
            &self.inline[..self.len]
        }
    }
}

impl<T: Copy + Default, const N: usize> DerefMut for InlineVec<T, N> {
    fn deref_mut(&mut self) -> &mut [T] {
        if self.spilled() {
            &mut self.heap
        } else {
            &mut self.inline[..self.len]
        }
    }
}

impl<T: Copy + Default + std::fmt::Debug, const N: usize> std::fmt::Debug for InlineVec<T, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::InlineVec;

    #[test]
    fn inline_then_heap_keeps_order() {
        for cap in [0, 3, 4, 10] {
            let mut v: InlineVec<u32, 4> = InlineVec::with_capacity(cap);
            for i in 0..10 {
                v.push(i);
                assert_eq!(*v, (0..=i).collect::<Vec<_>>()[..], "cap {cap}");
            }
            v.sort_unstable_by(|a, b| b.cmp(a));
            assert_eq!(v[0], 9);
        }
        let v: InlineVec<u32, 4> = InlineVec::with_capacity(2);
        assert!(v.is_empty());
    }
}
