//! The v0 pages updates store every run of a prefill batch whole, wherever its sequence starts
//! (in emulation): a search that found fewer runs would still write the right bytes, token by
//! token, so the caches alone cannot show it. Its own test binary, alone with the counter it
//! reads (`kvio_kernels::ops::PAGE_RUNS_STORED`).

use std::sync::atomic::Ordering;

use kvio::{DeviceBytesMut, PagedLayout, SlotMapping, SlotUpdate, TokenLayout};
use kvio_kernels::ops::PAGE_RUNS_STORED;
use kvio_suite::{batch_pages, batch_sequences, batch_slots, host_view, random_bytes, Rng};

/// Slots of a batch of sequences of 1 to 99 tokens, each on fresh pages of a shuffled order of
/// `nb`, from the start of its first page or (`chunked`) from a random slot of it.
fn batch(t: usize, bs: usize, nb: usize, chunked: bool, seed: u64) -> Vec<i64> {
    let mut rng = Rng::new(seed);
    let seqs = batch_sequences(&mut rng, t, 99, bs, chunked);
    assert!(batch_pages(&seqs, bs) <= nb);
    let mut pages: Vec<i64> = (0..nb as i64).collect();
    rng.shuffle(&mut pages);
    batch_slots(&seqs, bs, pages)
}

/// Runs of 16 in `slots`: 16 consecutive slots from a multiple of 16.
fn runs(slots: &[i64]) -> u64 {
    (0..slots.len().saturating_sub(15))
        .filter(|&c| slots[c] % 16 == 0 && (1..16).all(|j| slots[c + j] == slots[c] + j as i64))
        .count() as u64
}

#[test]
fn prefill_batches_store_every_run_whole() {
    // bf16 K and V of 8 heads of 128 into v0 caches of 48-token pages (pages of at most 16
    // slots, and of 32, 64 and 128, take the streams, which need no runs): items of 4 heads
    // of one part, so each run of 16 is stored by 2 parts × 2 head groups.
    let (t, h, d, bs) = (2048, 8, 128, 48);
    for (chunked, seed) in [(false, 1u64), (true, 2), (false, 3), (true, 4)] {
        let nb = 2 * t / bs + 64;
        let slots = batch(t, bs, nb, chunked, seed);
        let want = runs(&slots);
        assert!(want > 50, "{want} runs: the batch should hold many");
        let input = TokenLayout::contiguous(t, h, d, 2);
        let (kl, vl) = (
            PagedLayout::v0_key(nb, bs, h, d, 2),
            PagedLayout::v0_value(nb, bs, h, d, 2),
        );
        let (keys, values) = (
            random_bytes(t * h * d * 2, seed),
            random_bytes(t * h * d * 2, !seed),
        );
        let ext = kl.extent("k").unwrap() as usize;
        let mut caches = random_bytes(2 * ext, seed ^ 7);
        // SAFETY: host memory, exclusively ours for the call.
        let dst = unsafe { DeviceBytesMut::from_raw(caches.as_mut_ptr() as u64, caches.len()) };
        let (kc, vc) = dst.split_at(ext).unwrap();
        let op = SlotUpdate::new(
            host_view(&keys),
            input,
            kc,
            kl,
            SlotMapping::I64(host_view(&slots)),
        )
        .value(host_view(&values), vc)
        .value_layout(vl);
        let before = PAGE_RUNS_STORED.load(Ordering::Relaxed);
        // SAFETY: every view is live host memory of its length.
        unsafe { kvio::emulate::update_slots(&op) }.unwrap();
        let stored = PAGE_RUNS_STORED.load(Ordering::Relaxed) - before;
        assert_eq!(stored, want * 2 * 2, "chunked {chunked}: runs stored whole");
    }
}
