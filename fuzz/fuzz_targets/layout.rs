//! `PagedLayout::extent` and `TokenLayout::extent` (plus `num_slots`, `chunk_bytes`) on
//! arbitrary descriptors: no panic or overflow; an accepted layout's extent is the byte after
//! its last element (computed here in u128), at most `isize::MAX`, and its (block, slot, head)
//! chunks never share a byte (checked chunk by chunk when there are few); `Overflow` only for
//! an extent, slot count or stride that does not fit.
#![no_main]

use kvio::{Error, PagedLayout, TokenLayout};
use kvio_fuzz::{elem, paged_shape, size};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

fn stride(u: &mut Unstructured, natural: usize) -> Result<usize> {
    Ok(match u.int_in_range(0u8..=3)? {
        0 => natural,
        1 => natural.wrapping_add(size(u, 8)?),
        _ => size(u, 64)?,
    })
}

fn paged(u: &mut Unstructured) -> Result<PagedLayout> {
    let (nb, bs, h, d, e) = (
        size(u, 8)?,
        size(u, 300)?,
        size(u, 8)?,
        size(u, 40)?,
        elem(u)?,
    );
    let nhd_template: bool = u.arbitrary()?;
    let mut l = paged_shape(!nhd_template, nb, bs, h, d, e);
    // The natural strides of the template asked for (both 1-sized templates have strides of
    // 1, so they cannot tell which one they are).
    let (ts, hs) = if nhd_template {
        (h.wrapping_mul(d), d)
    } else {
        (d, bs.wrapping_mul(d))
    };
    l.token_stride = stride(u, ts)?;
    l.head_stride = stride(u, hs)?;
    l.block_stride = stride(u, bs.wrapping_mul(h).wrapping_mul(d))?;
    Ok(l)
}

/// 1 + the byte offset of the last element, in u128 (saturating: anything that large is past
/// `isize::MAX` anyway); `None` for a zero count.
fn last_byte(dims: &[(usize, usize)], inner: usize, elem: usize) -> Option<u128> {
    let mut last = (inner as u128).checked_sub(1)?;
    for &(count, stride) in dims {
        let step = (count as u128)
            .checked_sub(1)?
            .saturating_mul(stride as u128);
        last = last.saturating_add(step);
    }
    Some(last.saturating_add(1).saturating_mul(elem as u128))
}

/// Some stride (or size) times the element size is no byte count that fits `isize` (the
/// validators refuse those: launchers and kernels compute byte offsets from them).
fn too_wide(strides: &[usize], elem: usize) -> bool {
    strides
        .iter()
        .any(|&s| s as u128 * elem as u128 > isize::MAX as u128)
}

fn check_paged(l: &PagedLayout) {
    let got = l.extent("cache");
    let _ = l.num_slots();
    let valid_shape = matches!(l.elem_bytes, 1 | 2 | 4)
        && l.num_blocks > 0
        && l.block_size > 0
        && l.num_heads > 0
        && l.head_dim > 0;
    let want = last_byte(
        &[
            (l.num_blocks, l.block_stride),
            (l.block_size, l.token_stride),
            (l.num_heads, l.head_stride),
        ],
        l.head_dim,
        l.elem_bytes,
    );
    match got {
        Ok(ext) => {
            assert!(
                valid_shape,
                "{l:?}: accepted a zero size or bad element size"
            );
            assert_eq!(Some(ext as u128), want, "{l:?}: extent");
            assert!(
                ext <= isize::MAX as u64,
                "{l:?}: extent {ext} past isize::MAX"
            );
            assert!(l.num_slots() as u128 == l.num_blocks as u128 * l.block_size as u128);
            let _ = l.chunk_bytes();
            check_disjoint(l);
        }
        Err(Error::Overflow { name: "cache" }) => {
            let slots = l.num_blocks as u128 * l.block_size as u128;
            let row =
                (l.num_heads as u128 * l.head_dim as u128).saturating_mul(l.elem_bytes as u128);
            assert!(
                want.is_none_or(|w| w > isize::MAX as u128)
                    || slots > i64::MAX as u128
                    || row > isize::MAX as u128
                    || too_wide(
                        &[l.block_stride, l.token_stride, l.head_stride],
                        l.elem_bytes
                    ),
                "{l:?}: overflow reported for a representable extent {want:?}"
            );
        }
        Err(Error::InvalidArgument { name: "cache", .. }) => {}
        Err(e) => panic!("{l:?}: unexpected error {e:?}"),
    }
}

/// Every (block, slot, head) chunk starts at least a chunk after the previous one.
fn check_disjoint(l: &PagedLayout) {
    let chunks = l.num_blocks as u128 * l.block_size as u128 * l.num_heads as u128;
    if chunks > 1 << 14 {
        return;
    }
    let e = l.elem_bytes as u128;
    let mut starts = Vec::with_capacity(chunks as usize);
    for b in 0..l.num_blocks as u128 {
        for t in 0..l.block_size as u128 {
            for h in 0..l.num_heads as u128 {
                starts.push(
                    (b * l.block_stride as u128
                        + t * l.token_stride as u128
                        + h * l.head_stride as u128)
                        * e,
                );
            }
        }
    }
    starts.sort_unstable();
    let chunk = l.head_dim as u128 * e;
    for w in starts.windows(2) {
        assert!(
            w[1] - w[0] >= chunk,
            "{l:?}: chunks at {} and {} overlap",
            w[0],
            w[1]
        );
    }
}

fn check_token(i: &TokenLayout) {
    let got = i.extent("input");
    let want = if i.num_tokens == 0 {
        Some(0)
    } else {
        last_byte(
            &[(i.num_tokens, i.token_stride), (i.num_heads, i.head_stride)],
            i.head_dim,
            i.elem_bytes,
        )
    };
    let valid_shape = matches!(i.elem_bytes, 1 | 2 | 4) && i.num_heads > 0 && i.head_dim > 0;
    match got {
        Ok(ext) => {
            assert!(
                valid_shape,
                "{i:?}: accepted a zero size or bad element size"
            );
            assert_eq!(Some(ext as u128), want, "{i:?}: extent");
            assert!(
                ext <= isize::MAX as u64,
                "{i:?}: extent {ext} past isize::MAX"
            );
        }
        Err(Error::Overflow { name: "input" }) => assert!(
            want.is_none_or(|w| w > isize::MAX as u128)
                || too_wide(
                    &[i.token_stride, i.head_stride, i.head_dim, i.num_heads],
                    i.elem_bytes
                ),
            "{i:?}: overflow reported for a representable extent {want:?}"
        ),
        Err(Error::InvalidArgument { name: "input", .. }) => {}
        Err(e) => panic!("{i:?}: unexpected error {e:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    if let Ok(l) = paged(&mut u) {
        check_paged(&l);
    }
    let token = (|| -> Result<TokenLayout> {
        let (t, h, d, e) = (
            size(&mut u, 40)?,
            size(&mut u, 8)?,
            size(&mut u, 40)?,
            elem(&mut u)?,
        );
        let mut i = TokenLayout::contiguous(1, 1, 1, e);
        i.num_tokens = t;
        i.num_heads = h;
        i.head_dim = d;
        i.head_stride = stride(&mut u, d)?;
        i.token_stride = stride(&mut u, h.wrapping_mul(d))?;
        Ok(i)
    })();
    if let Ok(i) = token {
        check_token(&i);
    }
});
