//! `kvio::emulate::update_slices_counted` (the host validation and planning of
//! `Kvio::update_slices`, then the kernel bodies run on the CPU with an error word) with
//! arbitrary descriptors, slice tables, capacities and counts on small host buffers. No panic
//! or overflow; an accepted call touches nothing outside its views (AddressSanitizer past the
//! end, checked bytes before), never writes its input, table or count, counts what the
//! kernels refuse (a count outside `0..=padded` once; else each used slice that is not copied
//! once, and, through a slot list, each extra claim of a source row), and — when the slices
//! it uses never write one slot twice (nor, for heads apart, which go through a slot list,
//! read one row twice) — writes exactly what `kvio::reference::update_slices` writes. A
//! refused call writes nothing.
#![no_main]

use kvio::plan::Slice;
use kvio::{reference, SliceUpdate, TokenLayout};
use kvio_fuzz::{
    assert_same, buf_len, cache_shape, elem, index, input_strides, paged_shape, size, slice_copied,
    stride, Buf, MAX_BUF,
};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let _ = run(&mut u);
});

fn run(u: &mut Unstructured) -> Result<()> {
    let (nb, bs, h, d, e) = cache_shape(u)?;
    let mut layout = paged_shape(false, nb, bs, h, d, e);
    layout.head_stride = stride(u, d, 64)?;
    layout.token_stride = stride(u, h.wrapping_mul(d), 64)?;
    layout.block_stride = stride(u, bs.wrapping_mul(h).wrapping_mul(d), 64)?;
    let tokens = size(u, 40)?;
    let mut input = TokenLayout::contiguous(tokens, 1, 1, e);
    (input.num_heads, input.head_dim) = (h, d);
    if u.ratio(1u8, 8)? {
        input.num_heads = size(u, 4)?;
        input.head_dim = size(u, 12)?;
        input.elem_bytes = elem(u)?;
    }
    input_strides(u, &mut input)?;

    let in_ext = input.extent("input").ok();
    let c_ext = layout.extent("layout").ok();
    let mut src = Buf::new(u.int_in_range(0..=15)?, buf_len(u, in_ext)?, 0x11);
    let mut cache = Buf::new(u.int_in_range(0..=15)?, buf_len(u, c_ext)?, 0x22);

    // The [3, padded] table, its view (maybe short or misaligned) and the count.
    let num_slots = nb.saturating_mul(bs);
    let m = u.int_in_range(0usize..=24)?;
    let mut slices = Vec::with_capacity(m);
    for _ in 0..m {
        let mut i32_index = |hint: usize| -> Result<i32> {
            Ok(index(u, hint.min(1 << 16))?.clamp(i32::MIN as i64, i32::MAX as i64) as i32)
        };
        slices.push(Slice {
            cache_start: i32_index(num_slots)?,
            new_kv_start: i32_index(tokens)?,
            len: i32_index(bs)?,
        });
    }
    let padded = match u.int_in_range(0u8..=15)? {
        0 => size(u, 64)?,
        k => m + (k as usize - 1) / 4,
    };
    // The kernel reads the table as [3, padded] (a huge capacity is refused: no table).
    let rows = if padded <= 1024 { padded } else { 0 };
    let mut table = vec![0i32; 3 * rows];
    for (i, s) in slices.iter().take(rows).enumerate() {
        table[i] = s.cache_start;
        table[rows + i] = s.new_kv_start;
        table[2 * rows + i] = s.len;
    }
    let table_bytes: Vec<u8> = table.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let table_pad = u.int_in_range(0usize..=3)? * 4 + if u.ratio(1u8, 16)? { 2 } else { 0 };
    let table_len = match u.int_in_range(0u8..=7)? {
        0 => u.int_in_range(0..=64)?,
        1 => table_bytes.len().saturating_sub(1),
        _ => table_bytes.len(),
    };
    let mut table_buf = Buf::new(table_pad, table_len.min(MAX_BUF), 0);
    let tv = table_buf.view(0, usize::MAX);
    let n = tv.len().min(table_bytes.len());
    // SAFETY: the view holds at least `n` bytes.
    unsafe { std::ptr::copy_nonoverlapping(table_bytes.as_ptr(), tv.ptr() as *mut u8, n) };
    let count: i32 = match u.int_in_range(0u8..=7)? {
        0 => index(u, padded)?.clamp(i32::MIN as i64, i32::MAX as i64) as i32,
        _ => u.int_in_range(0..=m.min(padded))? as i32,
    };
    let count_pad = if u.ratio(1u8, 16)? { 1 } else { 0 };
    let count_len = if u.ratio(1u8, 16)? { 3 } else { 4 };
    let mut count_buf = Buf::new(count_pad, count_len, 0);
    let cv = count_buf.view(0, 4);
    // SAFETY: the view holds `cv.len()` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(count.to_ne_bytes().as_ptr(), cv.ptr() as *mut u8, cv.len())
    };

    let op = SliceUpdate {
        new_kv: src.view(0, usize::MAX),
        input,
        cache: cache.view_mut(0, usize::MAX),
        layout,
        slices: tv,
        padded,
        num_slices: cv,
        errors: None,
        value: None,
        value_layout: None,
        quantize: None,
        slot_list: None,
    };
    let before = (
        src.data().to_vec(),
        cache.data().to_vec(),
        table_buf.data().to_vec(),
        count_buf.data().to_vec(),
    );
    // SAFETY: every view is host memory of its length.
    let r = unsafe { kvio::emulate::update_slices_counted(&op) };
    for (b, what) in [
        (&src, "new_kv"),
        (&cache, "cache"),
        (&table_buf, "slices"),
        (&count_buf, "num_slices"),
    ] {
        b.check_pad(what);
    }
    assert_same("new_kv", src.data(), &before.0);
    assert_same("slices", table_buf.data(), &before.2);
    assert_same("num_slices", count_buf.data(), &before.3);
    let Ok(counts) = r else {
        assert_same("refused: cache", cache.data(), &before.1);
        return Ok(());
    };

    // Accepted: the table view holds [3, padded] (the host checked its length).
    let t: Vec<i32> = before.2[..12 * padded]
        .chunks_exact(4)
        .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    let listed: Vec<Slice> = (0..padded)
        .map(|i| Slice {
            cache_start: t[i],
            new_kv_start: t[padded + i],
            len: t[2 * padded + i],
        })
        .collect();
    let count = i32::from_ne_bytes(before.3[..4].try_into().unwrap());
    // Heads apart go through a slot list: a source row named twice is written once (and each
    // extra claim counted).
    let rows = |h: usize, stride: usize, d: usize| h == 1 || stride == d;
    let row_copy = !layout.is_pieced()
        && rows(layout.num_heads, layout.head_stride, layout.head_dim)
        && rows(input.num_heads, input.head_stride, input.head_dim);
    let mut want_counts = kvio::ErrorCounts::default();
    if count < 0 || count as usize > padded {
        want_counts.bad_counts = 1;
    } else {
        let used = &listed[..count as usize];
        let copied = |s: &&Slice| slice_copied(s, bs, num_slots, tokens);
        want_counts.bad_slices = used.iter().filter(|s| s.len != 0 && !copied(s)).count() as u32;
        if !row_copy {
            let mut claims = vec![0u32; tokens];
            for s in used.iter().filter(copied) {
                let from = s.new_kv_start as usize;
                for c in &mut claims[from..from + s.len as usize] {
                    *c += 1;
                }
            }
            want_counts.bad_slices += claims.iter().map(|&c| c.saturating_sub(1)).sum::<u32>();
        }
    }
    assert_eq!(counts, want_counts, "error word");
    if count >= 0 && (count as usize) <= padded {
        // Whether two copied slices overlap in the rows `at` names (cache or source).
        let overlap = |at: fn(&Slice) -> i32| {
            let mut ranges: Vec<(i64, i64)> = listed[..count as usize]
                .iter()
                .filter(|s| slice_copied(s, bs, num_slots, tokens))
                .map(|s| (at(s) as i64, at(s) as i64 + s.len as i64))
                .collect();
            ranges.sort_unstable();
            ranges.windows(2).any(|w| w[1].0 < w[0].1)
        };
        if overlap(|s| s.cache_start) {
            return Ok(()); // two slices write one slot: a race, no defined result
        }
        if !row_copy && overlap(|s| s.new_kv_start) {
            return Ok(());
        }
    }
    let mut want = before.1.clone();
    reference::update_slices(&before.0, &input, &mut want, &layout, &listed, count);
    if cache.data() != want {
        let n = count.clamp(0, padded.min(64) as i32) as usize;
        let ctx = format!(
            "{layout:?} {input:?} padded={padded} count={count} slices={:?}",
            &listed[..n]
        );
        assert_same(&format!("cache ({ctx})"), cache.data(), &want);
    }
    Ok(())
}
