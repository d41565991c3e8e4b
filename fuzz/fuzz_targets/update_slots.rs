//! `kvio::emulate::update_slots_counted` (the host validation and planning of
//! `Kvio::update_slots`, then the kernel body run on the CPU, with an error word) with arbitrary
//! descriptors, views and slots on small host buffers. No panic or overflow; an accepted call
//! touches nothing outside its views (the buffers end where the views end, so AddressSanitizer
//! sees any overrun, and the bytes before each view are checked), never writes its inputs,
//! counts each slot past the cache once, and — when its in-range slots are distinct (no write
//! race) — writes exactly what `kvio::reference::update_slots` writes. A refused call writes
//! nothing.
#![no_main]

use kvio::{reference, CacheWrite, SlotMapping, SlotUpdate, TokenLayout};
use kvio_fuzz::{
    assert_same, buf_len, cache_shape, elem, index, input_strides, paged_shape, size, stride, Buf,
    MAX_BUF,
};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let _ = run(&mut u);
});

fn run(u: &mut Unstructured) -> Result<()> {
    // Cache and input descriptors: mostly usual shapes, any field possibly anything.
    let (nb, bs, h, d, e) = cache_shape(u)?;
    let hnd: bool = u.arbitrary()?;
    let mut cache = paged_shape(hnd, nb, bs, h, d, e);
    let (ts, hs) = if hnd {
        (d, bs.wrapping_mul(d))
    } else {
        (h.wrapping_mul(d), d)
    };
    cache.token_stride = stride(u, ts, 64)?;
    cache.head_stride = stride(u, hs, 64)?;
    cache.block_stride = stride(u, bs.wrapping_mul(h).wrapping_mul(d), 64)?;
    let n = u.int_in_range(0usize..=24)?;
    let mut input = TokenLayout::contiguous(n, 1, 1, e);
    (input.num_heads, input.head_dim) = (h, d);
    if u.ratio(1u8, 4)? {
        input.num_tokens = size(u, 32)?;
        input.num_heads = size(u, 4)?;
        input.head_dim = size(u, 12)?;
        input.elem_bytes = elem(u)?;
    }
    input_strides(u, &mut input)?;

    // Buffers: inputs, one or two cache allocations (K and V views may share one).
    let in_ext = input.extent("input").ok();
    let c_ext = cache.extent("cache").ok();
    let with_value: bool = u.arbitrary()?;
    let shared: bool = u.arbitrary()?;
    let mut pad = || u.int_in_range(0usize..=15);
    let pads = [pad()?, pad()?, pad()?, pad()?];
    let mut key = Buf::new(pads[0], buf_len(u, in_ext)?, 0x11);
    let mut value = Buf::new(pads[1], buf_len(u, in_ext)?, 0x22);
    let kc_len = buf_len(u, c_ext)?;
    let v_off = if shared { size(u, 64)?.min(MAX_BUF) } else { 0 };
    let mut kc = Buf::new(pads[2], (kc_len + v_off).min(MAX_BUF), 0x33);
    let mut vc = Buf::new(pads[3], buf_len(u, c_ext)?, 0x44);
    let k_view_len = match u.int_in_range(0u8..=3)? {
        0 => kc_len,
        _ => c_ext.unwrap_or(0) as usize,
    };

    // Slots: the list, maybe followed by a few more bytes (a length that is not a multiple
    // of the slot size, or one more slot made of filler), maybe misaligned.
    let i64s: bool = u.arbitrary()?;
    let w = if i64s { 8 } else { 4 };
    let num_slots = nb.saturating_mul(bs);
    let mut slot_bytes: Vec<u8> = Vec::new();
    for _ in 0..n {
        let s = index(u, num_slots.min(1 << 16))?;
        if i64s {
            slot_bytes.extend(s.to_ne_bytes());
        } else {
            slot_bytes.extend((s as i32).to_ne_bytes());
        }
    }
    let slot_pad = u.int_in_range(0usize..=3)? * 4 + if u.ratio(1u8, 8)? { 1 } else { 0 };
    let extra = if u.ratio(1u8, 8)? {
        u.int_in_range(1usize..=7)?
    } else {
        0
    };
    let slot_len = slot_bytes.len() + extra;
    let mut slot_buf = Buf::new(slot_pad, slot_len, 0x55);
    let slot_view = slot_buf.view(0, slot_len);
    // SAFETY: the view holds at least `slot_bytes.len()` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(
            slot_bytes.as_ptr(),
            slot_view.ptr() as *mut u8,
            slot_bytes.len(),
        )
    };
    // The slots the kernel reads: every whole slot of the view.
    let used: Vec<i64> = slot_buf
        .data()
        .chunks_exact(w)
        .map(|c| {
            if i64s {
                i64::from_ne_bytes(c.try_into().unwrap())
            } else {
                i32::from_ne_bytes(c.try_into().unwrap()) as i64
            }
        })
        .collect();

    let key_cache = kc.view_mut(0, k_view_len);
    let value_cache = if shared {
        kc.view_mut(v_off, k_view_len)
    } else {
        vc.view_mut(0, usize::MAX)
    };
    // K and V are typed pairs (`CacheWrite`): a value without its cache cannot be expressed.
    let op = SlotUpdate {
        key: CacheWrite {
            src: key.view(0, usize::MAX),
            dst: key_cache,
        },
        value: with_value.then(|| CacheWrite {
            src: value.view(0, usize::MAX),
            dst: value_cache,
        }),
        input,
        cache,
        value_layout: None,
        slots: if i64s {
            SlotMapping::I64(slot_view)
        } else {
            SlotMapping::I32(slot_view)
        },
        errors: None,
        quantize: None,
    };

    let before = (
        key.data().to_vec(),
        value.data().to_vec(),
        kc.data().to_vec(),
        vc.data().to_vec(),
        slot_buf.data().to_vec(),
    );
    // SAFETY: every view is host memory of its length.
    let r = unsafe { kvio::emulate::update_slots_counted(&op) };
    for (b, what) in [
        (&key, "key"),
        (&value, "value"),
        (&kc, "key cache"),
        (&vc, "value cache"),
        (&slot_buf, "slots"),
    ] {
        b.check_pad(what);
    }
    assert_same("key", key.data(), &before.0);
    assert_same("value", value.data(), &before.1);
    assert_same("slots", slot_buf.data(), &before.4);
    let Ok(counts) = r else {
        assert_same("refused: key cache", kc.data(), &before.2);
        assert_same("refused: value cache", vc.data(), &before.3);
        return Ok(());
    };
    // Accepted: the kernels read every slot of the view (one per token; the slot count may
    // be below `num_tokens`) and count each one past the cache once.
    let bad = used
        .iter()
        .filter(|&&s| s >= 0 && s as u64 >= num_slots as u64)
        .count() as u32;
    let want_counts = kvio::ErrorCounts {
        bad_slots: bad,
        ..Default::default()
    };
    assert_eq!(counts, want_counts, "error word");

    // Accepted: compare with the reference when no two tokens write one slot.
    let slots = used;
    let mut live: Vec<i64> = slots
        .iter()
        .copied()
        .filter(|&s| s >= 0 && (s as u64) < num_slots as u64)
        .collect();
    live.sort_unstable();
    if live.windows(2).any(|w| w[0] == w[1]) {
        return Ok(());
    }
    let k_at = (key_cache.ptr() - kc.view(0, 0).ptr()) as usize;
    let mut want_k = before.2.clone();
    let mut want_v = before.3.clone();
    let vsrc = with_value.then_some(before.1.as_slice());
    if shared && with_value {
        let v_at = (value_cache.ptr() - kc.view(0, 0).ptr()) as usize;
        reference::update_slots(
            &before.0,
            vsrc,
            &input,
            &mut want_k,
            k_at,
            Some(v_at),
            &cache,
            &slots,
        );
    } else {
        reference::update_slots(
            &before.0,
            None,
            &input,
            &mut want_k,
            k_at,
            None,
            &cache,
            &slots,
        );
        if let Some(v) = vsrc {
            reference::update_slots(v, None, &input, &mut want_v, 0, None, &cache, &slots);
        }
    }
    assert_same("key cache", kc.data(), &want_k);
    assert_same("value cache", vc.data(), &want_v);
    Ok(())
}
