//! Slice updates (vLLM TPU `kv_cache_update` semantics) into layouts the row copy does not
//! write, through the slot list (`kvio_slices_to_slots`, then the slot update): vLLM's v0
//! caches (K and V, each its own layout), HND caches, and fp8 quantize-on-write into the TPU
//! layout (K and V heads in one row) with per-tensor and per-head scales. Against the CPU
//! reference, bit for bit, in emulation and on the GPU (with the error word: bad slices and
//! bad counts), in a captured graph replayed with a new table and count, and for a source row
//! that two slices name (written once, counted).

use cust::memory::DeviceBuffer;
use kvio::plan::{slices_to_table, Slice};
use kvio::{
    reference, DeviceBytes, DeviceBytesMut, DeviceErrors, ErrorCounts, Fp8, PagedLayout, Quantize,
    Scale, SliceUpdate, SrcType, StreamRef, TokenLayout,
};
use kvio_suite::{
    assert_same, download, host_view, overwrite, quantize_source, random_bytes, upload, Graph, Rng,
};
use proptest::prelude::{any, Strategy};

/// How a case's rows are stored.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Format {
    /// Bytes copied as they are, elements of this size.
    Copy(usize),
    /// Quantized to fp8 from this source type (per-head scales when `true`).
    Quant(SrcType, Fp8, bool),
}

/// Which caches a case writes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Caches {
    /// vLLM's v0 key and value caches (K and V).
    V0,
    /// v0 key cache only.
    V0Key,
    /// HND caches, K and V.
    Hnd,
    /// The TPU layout: one NHD cache whose rows hold K and V heads (one part, 2H heads).
    Tpu,
}

/// One slice update: shapes, rows, scales, the table and the poisoned caches.
#[derive(Debug)]
struct Case {
    name: String,
    format: Format,
    caches: Caches,
    input: TokenLayout,
    key_layout: PagedLayout,
    value_layout: PagedLayout,
    keys: Vec<u8>,
    values: Vec<u8>,
    scales_k: Vec<f32>,
    scales_v: Vec<f32>,
    /// The padded table's entries (`count` real ones, then entries the kernel must ignore).
    slices: Vec<Slice>,
    count: i32,
    /// K's cache then V's (V's empty for one-part cases), poisoned.
    poison: Vec<u8>,
    /// The slot list goes to a buffer of the test's (`SliceUpdate::slot_list`), checked
    /// afterwards, instead of kvio's scratch.
    given_list: bool,
}

/// Real slices over random whole or partial pages in a random order (never two on one page,
/// so no slot is written twice), some tokens left out, padding entries and bad slices (too
/// long, crossing a page, past the cache or the source) among them; then junk past the
/// count.
fn table(t: usize, nb: usize, bs: usize, rng: &mut Rng) -> (Vec<Slice>, i32) {
    let mut pages: Vec<usize> = (0..nb).collect();
    rng.shuffle(&mut pages);
    let mut pages = pages.into_iter();
    let (mut out, mut tok) = (Vec::new(), 0usize);
    let num_slots = (nb * bs) as i32;
    while tok < t {
        match rng.below(12) {
            0 => out.push(Slice::default()), // padding
            1 => {
                // Bad: crosses a page, too long, past the cache, or past the source.
                let p = pages.next().expect("enough pages") * bs;
                out.push(match rng.below(4) {
                    0 if bs > 1 => Slice {
                        cache_start: (p + bs - 1) as i32,
                        new_kv_start: tok as i32,
                        len: 2,
                    },
                    1 => Slice {
                        cache_start: p as i32,
                        new_kv_start: tok as i32,
                        len: bs as i32 + 1,
                    },
                    2 => Slice {
                        cache_start: num_slots,
                        new_kv_start: tok as i32,
                        len: 1,
                    },
                    _ => Slice {
                        cache_start: p as i32,
                        new_kv_start: t as i32,
                        len: 1,
                    },
                });
            }
            2 => tok += 1, // a row no slice names: never written
            _ => {
                let p = pages.next().expect("enough pages");
                let off = rng.below(bs as u64) as usize;
                let len = (1 + rng.below((bs - off) as u64) as usize).min(t - tok);
                out.push(Slice {
                    cache_start: (p * bs + off) as i32,
                    new_kv_start: tok as i32,
                    len: len as i32,
                });
                tok += len;
            }
        }
    }
    let count = out.len() as i32;
    // Past the count: entries that would write if they were read.
    for _ in 0..3 {
        out.push(Slice {
            cache_start: (rng.below(nb as u64) as usize * bs) as i32,
            new_kv_start: 0,
            len: 1,
        });
    }
    (out, count)
}

/// Pages enough for every slice (each takes a page of its own) and some to spare.
fn pages_for(t: usize, bs: usize) -> usize {
    2 * t + 8 + bs
}

fn case(
    format: Format,
    caches: Caches,
    bs: usize,
    h: usize,
    d: usize,
    t: usize,
    seed: u64,
) -> Case {
    let nb = pages_for(t, bs);
    let mut rng = Rng::new(seed);
    let (ie, e) = match format {
        Format::Copy(e) => (e, e),
        Format::Quant(src, _, _) => (src.bytes(), 1),
    };
    // The TPU layout's rows hold K and V heads: 2H heads, one part.
    let rows = if caches == Caches::Tpu { 2 * h } else { h };
    let input = TokenLayout::contiguous(t, rows, d, ie);
    let (key_layout, value_layout) = match caches {
        Caches::V0 | Caches::V0Key => (
            PagedLayout::v0_key(nb, bs, h, d, e),
            PagedLayout::v0_value(nb, bs, h, d, e),
        ),
        Caches::Hnd => (
            PagedLayout::hnd(nb, bs, h, d, e),
            PagedLayout::hnd(nb, bs, h, d, e),
        ),
        Caches::Tpu => (
            PagedLayout::nhd(nb, bs, rows, d, e),
            PagedLayout::nhd(nb, bs, rows, d, e),
        ),
    };
    let n = t * rows * d;
    let (keys, values, scales_k, scales_v) = match format {
        Format::Copy(e) => (
            random_bytes(n * e, seed ^ 1),
            random_bytes(n * e, seed ^ 2),
            vec![],
            vec![],
        ),
        Format::Quant(src, _, per_head) => {
            let k = if per_head { rows } else { 1 };
            let mut scale = || 0.01 + rng.below(10_000) as f32 / 1000.0;
            let (sk, sv): (Vec<f32>, Vec<f32>) = (0..k).map(|_| (scale(), scale())).unzip();
            (
                quantize_source(n, rows * d, src, &mut rng),
                quantize_source(n, rows * d, src, &mut rng),
                sk,
                sv,
            )
        }
    };
    let (slices, count) = table(t, nb, bs, &mut rng);
    let ext = key_layout.extent("k").unwrap() as usize;
    let parts = if two_parts(caches) { 2 } else { 1 };
    Case {
        name: format!("{format:?} {caches:?} bs={bs} H={h} D={d} T={t}"),
        format,
        caches,
        input,
        key_layout,
        value_layout,
        keys,
        values,
        scales_k,
        scales_v,
        slices,
        count,
        poison: random_bytes(parts * ext, seed ^ 0x0F),
        given_list: seed % 2 == 1,
    }
}

fn two_parts(c: Caches) -> bool {
    matches!(c, Caches::V0 | Caches::Hnd)
}

impl Case {
    fn ext(&self) -> usize {
        self.key_layout.extent("k").unwrap() as usize
    }

    fn padded(&self) -> usize {
        self.slices.len()
    }

    fn table(&self) -> Vec<i32> {
        slices_to_table(&self.slices, self.padded()).unwrap()
    }

    /// Whether the update goes through a slot list: all but rows copied as they are into
    /// contiguous rows (a v0 key cache whose head is one piece, HND on one-slot pages).
    fn through_list(&self) -> bool {
        let l = &self.key_layout;
        two_parts(self.caches)
            || matches!(self.format, Format::Quant(..))
            || l.is_pieced()
            || !(l.num_heads == 1 || l.head_stride == l.head_dim)
    }

    /// The slot list the expansion must leave: each valid slice's rows at their slots, -1
    /// elsewhere (the tables here never name a row twice).
    fn list(&self) -> Vec<i32> {
        let (bs, t) = (
            self.key_layout.block_size as i64,
            self.input.num_tokens as i64,
        );
        let num_slots = self.key_layout.num_slots() as i64;
        let mut list = vec![-1i32; t as usize];
        for s in &self.slices[..self.count as usize] {
            let (start, from, len) = (s.cache_start as i64, s.new_kv_start as i64, s.len as i64);
            let valid = len > 0
                && len <= bs
                && start >= 0
                && from >= 0
                && start + len <= num_slots
                && from + len <= t
                && start / bs == (start + len - 1) / bs;
            if valid {
                for j in 0..len {
                    list[(from + j) as usize] = (start + j) as i32;
                }
            }
        }
        list
    }

    /// Both caches as the reference computes them (rows quantized first for fp8), and the
    /// counts the error word should hold.
    fn expected(&self) -> (Vec<u8>, ErrorCounts) {
        let (k, v, input) = match self.format {
            Format::Copy(_) => (self.keys.clone(), self.values.clone(), self.input),
            Format::Quant(src, fp8, _) => {
                let i = &self.input;
                let q = |rows: &[u8], s: &[f32]| reference::quantize_rows(rows, i, src, fp8, s);
                (
                    q(&self.keys, &self.scales_k),
                    q(&self.values, &self.scales_v),
                    TokenLayout::contiguous(i.num_tokens, i.num_heads, i.head_dim, 1),
                )
            }
        };
        let mut want = self.poison.clone();
        let (kc, vc) = want.split_at_mut(self.ext());
        let counts =
            reference::update_slices(&k, &input, kc, &self.key_layout, &self.slices, self.count);
        if two_parts(self.caches) {
            reference::update_slices(&v, &input, vc, &self.value_layout, &self.slices, self.count);
        }
        (want, counts)
    }

    fn op<'a>(
        &self,
        keys: DeviceBytes<'a>,
        values: DeviceBytes<'a>,
        caches: DeviceBytesMut<'a>,
        table: DeviceBytes<'a>,
        count: DeviceBytes<'a>,
        (sk, sv): (DeviceBytes<'a>, DeviceBytes<'a>),
    ) -> SliceUpdate<'a> {
        let (kc, vc) = if two_parts(self.caches) {
            let (k, v) = caches.split_at(self.ext()).unwrap();
            (k, Some(v))
        } else {
            (caches, None)
        };
        let mut op = SliceUpdate::new(
            keys,
            self.input,
            kc,
            self.key_layout,
            table,
            self.padded(),
            count,
        );
        if let Some(vc) = vc {
            op = op.value(values, vc).value_layout(self.value_layout);
        }
        if let Format::Quant(src, fp8, per_head) = self.format {
            let wrap = |b| {
                if per_head {
                    Scale::PerHead(b)
                } else {
                    Scale::PerTensor(b)
                }
            };
            let mut q = Quantize::new(src, fp8, wrap(sk));
            if vc.is_some() {
                q = q.value_scale(wrap(sv));
            }
            op = op.quantize(q);
        }
        op
    }
}

const FORMATS: [Format; 5] = [
    Format::Copy(2),
    Format::Copy(4),
    Format::Copy(1),
    Format::Quant(SrcType::Bf16, Fp8::E4m3, false),
    Format::Quant(SrcType::F32, Fp8::E5m2, true),
];

/// Every format × cache kind × page size (1, 16, 128) × head dim (64, 128, 256), decode and
/// prefill sizes (the tiled v0 updates from 1,024 tokens); `full` adds head dim 256 and the
/// larger sizes.
fn cases(full: bool) -> Vec<Case> {
    let mut v = Vec::new();
    let mut seed = 500;
    for format in FORMATS {
        for caches in [Caches::V0, Caches::V0Key, Caches::Hnd, Caches::Tpu] {
            // fp8 rows mixing K and V heads are the TPU layout's; a copy into it is the row
            // copy (tests/gpu_write.rs), unless heads are apart.
            if caches == Caches::Tpu && matches!(format, Format::Copy(_)) {
                continue;
            }
            for bs in [1, 16, 128] {
                for d in [64, 128, 256] {
                    if !full && d == 256 {
                        continue;
                    }
                    for t in [1, 37, 1030] {
                        if !full && t == 1030 && bs != 16 {
                            continue;
                        }
                        v.push(case(format, caches, bs, 4, d, t, seed));
                        seed += 1;
                    }
                }
            }
        }
    }
    v
}

impl Case {
    /// The update over the case's host rows and scales, `table` and `count` (the CPU
    /// emulation's views), writing `caches`.
    fn host_op<'a>(
        &'a self,
        caches: DeviceBytesMut<'a>,
        table: &'a [i32],
        count: &'a [i32],
    ) -> SliceUpdate<'a> {
        self.op(
            host_view(&self.keys),
            host_view(&self.values),
            caches,
            host_view(table),
            host_view(count),
            (host_view(&self.scales_k), host_view(&self.scales_v)),
        )
    }
}

/// Runs one case on the CPU (the kernels' own code, through the same plan).
fn emulate(c: &Case) {
    let mut caches = c.poison.clone();
    // SAFETY: host memory, exclusively ours for the call.
    let dst = unsafe { DeviceBytesMut::from_raw(caches.as_mut_ptr() as u64, caches.len()) };
    let (table, count) = (c.table(), [c.count]);
    // A given list starts as garbage: the call must overwrite all of it.
    let mut list: Vec<i32> = random_bytes(4 * c.input.num_tokens, 3)
        .chunks_exact(4)
        .map(|w| i32::from_le_bytes(w.try_into().unwrap()))
        .collect();
    let mut op = c.host_op(dst, &table, &count);
    if c.given_list {
        // SAFETY: host memory, exclusively ours for the call.
        op = op.slot_list(unsafe {
            DeviceBytesMut::from_raw(list.as_mut_ptr() as u64, 4 * list.len())
        });
    }
    // SAFETY: every view is live host memory of its length.
    let counts = unsafe { kvio::emulate::update_slices_counted(&op) }
        .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let (want, want_counts) = c.expected();
    assert_same(&c.name, &caches, &want);
    assert_eq!(counts, want_counts, "{}", c.name);
    if c.given_list && c.through_list() {
        assert_eq!(list, c.list(), "{}: slot list", c.name);
    }
}

/// A given slot list shorter than the source's rows, or misaligned, is refused before
/// anything runs, and so is a list past the emulation's scratch; without one, a device
/// without memory pools is refused too (plan test).
#[test]
fn slot_lists_are_checked() {
    let c = case(Format::Copy(2), Caches::V0, 16, 2, 64, 40, 3);
    let (table, count) = (c.table(), [c.count]);
    let mut caches = c.poison.clone();
    let mut list = vec![0i32; 41];
    for (at, len, what) in [(0, 39 * 4, "short"), (1, 40 * 4, "misaligned")] {
        // SAFETY: host memory, exclusively ours; refused before anything is read or written.
        let (dst, l) = unsafe {
            (
                DeviceBytesMut::from_raw(caches.as_mut_ptr() as u64, caches.len()),
                DeviceBytesMut::from_raw(list.as_mut_ptr() as u64 + at, len),
            )
        };
        let op = c.host_op(dst, &table, &count).slot_list(l);
        // SAFETY: as above.
        let r = unsafe { kvio::emulate::update_slices(&op) };
        assert!(
            matches!(
                r,
                Err(kvio::Error::BufferTooSmall {
                    name: "slot_list",
                    ..
                }) | Err(kvio::Error::InvalidArgument {
                    name: "slot_list",
                    ..
                })
            ),
            "{what}: {r:?}"
        );
    }
    assert_same("refused", &caches, &c.poison);
    // The emulation's scratch holds lists of up to 1 Mi rows (every row the same one here).
    let mut input = c.input;
    input.num_tokens = kvio::emulate::SCRATCH_LIST_BYTES / 4 + 1;
    input.token_stride = 0;
    // SAFETY: host memory, exclusively ours; refused before anything is read or written.
    let dst = unsafe { DeviceBytesMut::from_raw(caches.as_mut_ptr() as u64, caches.len()) };
    let op = SliceUpdate {
        input,
        ..c.host_op(dst, &table, &count)
    };
    // SAFETY: as above.
    let r = unsafe { kvio::emulate::update_slices(&op) };
    assert!(
        matches!(
            r,
            Err(kvio::Error::InvalidArgument {
                name: "slot_list",
                ..
            })
        ),
        "{r:?}"
    );
}

#[test]
fn emulated_slice_updates_of_other_layouts_match_reference() {
    for c in cases(false) {
        emulate(&c);
    }
}

fn params() -> impl Strategy<Value = (usize, usize, usize, usize, usize, usize, u64)> {
    (
        0usize..5,
        0usize..4,
        1usize..40,
        1usize..6,
        1usize..5,
        1usize..80,
        any::<u64>(),
    )
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
        kvio_suite::proptest_cases(48)
    ))]
    /// Random formats, cache kinds, page sizes (1–39), heads (1–5), head dims (16–64, a
    /// multiple of v0's `x` for every element size) and token counts.
    #[test]
    fn slice_updates_of_other_layouts_emulated_property(
        (f, k, bs, h, d8, t, seed) in params()
    ) {
        let caches = [Caches::V0, Caches::V0Key, Caches::Hnd, Caches::Tpu][k];
        let format = FORMATS[f];
        if caches == Caches::Tpu && matches!(format, Format::Copy(_)) {
            return Ok(());
        }
        emulate(&case(format, caches, bs, h, 16 * d8, t, seed));
    }
}

/// Device buffers of one case, and its update over them.
struct OnGpu {
    list: DeviceBuffer<i32>,
    k: DeviceBuffer<u8>,
    v: DeviceBuffer<u8>,
    table: DeviceBuffer<i32>,
    count: DeviceBuffer<i32>,
    sk: DeviceBuffer<f32>,
    sv: DeviceBuffer<f32>,
    caches: DeviceBuffer<u8>,
}

impl OnGpu {
    fn new(c: &Case) -> OnGpu {
        // Copies have no scales: a dummy f32 keeps the buffers non-empty.
        let scales = |s: &[f32]| upload(if s.is_empty() { &[1f32][..] } else { s });
        OnGpu {
            // Garbage the call must overwrite (used when the case gives its own list).
            list: upload(&vec![0x5a5a_5a5a_i32; c.input.num_tokens.max(1)]),
            k: upload(&c.keys),
            v: upload(&c.values),
            table: upload(&c.table()),
            count: upload(&[c.count]),
            sk: scales(&c.scales_k),
            sv: scales(&c.scales_v),
            caches: upload(&c.poison),
        }
    }

    fn op<'a>(&'a mut self, c: &Case, errors: &'a DeviceErrors) -> SliceUpdate<'a> {
        let op = c
            .op(
                DeviceBytes::of(&self.k),
                DeviceBytes::of(&self.v),
                DeviceBytesMut::of(&mut self.caches),
                DeviceBytes::of(&self.table),
                DeviceBytes::of(&self.count),
                (DeviceBytes::of(&self.sk), DeviceBytes::of(&self.sv)),
            )
            .errors(errors);
        if c.given_list {
            op.slot_list(DeviceBytesMut::of(&mut self.list))
        } else {
            op
        }
    }
}

#[test]
fn gpu_slice_updates_of_other_layouts_match_reference() {
    let Some(g) = kvio_suite::gpu("gpu_slice_updates_of_other_layouts_match_reference") else {
        return;
    };
    let stream = g.stream();
    let errors = DeviceErrors::new().unwrap();
    let all = cases(true);
    let mut bad_slices = 0;
    for c in &all {
        let mut m = OnGpu::new(c);
        errors.reset(StreamRef::from(&stream)).unwrap();
        let op = m.op(c, &errors);
        g.kv.update_slices(&op, StreamRef::from(&stream))
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let (want, counts) = c.expected();
        assert_same(&c.name, &download(&m.caches, &stream), &want);
        assert_eq!(
            errors.read(StreamRef::from(&stream)).unwrap(),
            counts,
            "{}",
            c.name
        );
        bad_slices += counts.bad_slices;
        if c.given_list && c.through_list() {
            let mut list = download(&m.list, &stream);
            list.truncate(c.input.num_tokens);
            assert_eq!(list, c.list(), "{}: slot list", c.name);
        }
    }
    assert!(bad_slices > 0, "the tables held bad slices");
    println!("{} slice updates through slot lists matched", all.len());
}

/// A count past the capacity (or negative) writes nothing and is counted once.
#[test]
fn gpu_bad_counts_write_nothing() {
    let Some(g) = kvio_suite::gpu("gpu_bad_counts_write_nothing") else {
        return;
    };
    let stream = g.stream();
    let errors = DeviceErrors::new().unwrap();
    let c = case(
        Format::Quant(SrcType::Bf16, Fp8::E4m3, true),
        Caches::V0,
        16,
        4,
        128,
        300,
        77,
    );
    for bad in [-1, c.padded() as i32 + 1] {
        let mut m = OnGpu::new(&c);
        overwrite(&mut m.count, &[bad], &stream);
        errors.reset(StreamRef::from(&stream)).unwrap();
        g.kv.update_slices(&m.op(&c, &errors), StreamRef::from(&stream))
            .unwrap();
        assert_same("bad count", &download(&m.caches, &stream), &c.poison);
        let counts = errors.read(StreamRef::from(&stream)).unwrap();
        assert_eq!(
            counts,
            ErrorCounts {
                bad_counts: 1,
                ..Default::default()
            }
        );
    }
}

/// A source row two slices name is written to one of their slots (the other keeps its
/// poison) and counted once per extra claim, in emulation's plan on the GPU.
#[test]
fn gpu_rows_named_twice_are_written_once_and_counted() {
    let Some(g) = kvio_suite::gpu("gpu_rows_named_twice_are_written_once_and_counted") else {
        return;
    };
    let stream = g.stream();
    let errors = DeviceErrors::new().unwrap();
    let (bs, h, d, t) = (16, 2, 64, 40);
    let mut c = case(Format::Copy(2), Caches::Hnd, bs, h, d, t, 91);
    // Rows 3..8 to page 0 and rows 5..10 to page 1: rows 5, 6, 7 are named twice.
    c.slices = vec![
        Slice {
            cache_start: 0,
            new_kv_start: 3,
            len: 5,
        },
        Slice {
            cache_start: bs as i32,
            new_kv_start: 5,
            len: 5,
        },
    ];
    c.count = 2;
    let mut m = OnGpu::new(&c);
    errors.reset(StreamRef::from(&stream)).unwrap();
    g.kv.update_slices(&m.op(&c, &errors), StreamRef::from(&stream))
        .unwrap();
    let got = download(&m.caches, &stream);
    let counts = errors.read(StreamRef::from(&stream)).unwrap();
    assert_eq!(counts.bad_slices, 3, "one count per row named twice");
    // Each slice alone, by the reference: every slot is the row or the poison, and each of
    // the shared rows landed in exactly one of its two slots.
    let alone = |s: Slice| {
        let mut want = c.poison.clone();
        let (kc, vc) = want.split_at_mut(c.ext());
        for (rows, cache) in [(&c.keys, kc), (&c.values, vc)] {
            reference::update_slices(rows, &c.input, cache, &c.key_layout, &[s], 1);
        }
        want
    };
    let (a, b) = (alone(c.slices[0]), alone(c.slices[1]));
    let slot_bytes = |w: &[u8], slot: usize| -> Vec<u8> {
        let l = &c.key_layout;
        let (blk, off) = (slot / bs, slot % bs);
        let mut out = Vec::new();
        for part in 0..2 {
            for head in 0..h {
                let at = part * c.ext()
                    + 2 * (blk * l.block_stride + off * l.token_stride + head * l.head_stride);
                out.extend_from_slice(&w[at..at + 2 * d]);
            }
        }
        out
    };
    for row in 3..10usize {
        let (s0, s1) = (row - 3, bs + row - 5);
        let in0 = (3..8).contains(&row) && slot_bytes(&got, s0) == slot_bytes(&a, s0);
        let in1 = (5..10).contains(&row) && slot_bytes(&got, s1) == slot_bytes(&b, s1);
        let poisoned = |s| slot_bytes(&got, s) == slot_bytes(&c.poison, s);
        if (5..8).contains(&row) {
            assert!(in0 ^ in1, "row {row}: written exactly once");
            assert!(
                poisoned(if in0 { s1 } else { s0 }),
                "row {row}: other slot untouched"
            );
        } else {
            assert!(in0 || in1, "row {row}: written");
        }
    }
}

/// A v0 fp8 slice update captured in a graph (memset, expansion and update as nodes, with
/// the list in kvio's scratch (allocation nodes) or in a given buffer) and replayed with a new
/// table, count and rows.
#[test]
fn gpu_slice_update_graph_replays() {
    let Some(g) = kvio_suite::gpu("gpu_slice_update_graph_replays") else {
        return;
    };
    for given_list in [false, true] {
        graph_replays(g, given_list);
    }
}

fn graph_replays(g: &kvio_suite::Gpu, given_list: bool) {
    let stream = g.stream();
    let errors = DeviceErrors::new().unwrap();
    let fmt = Format::Quant(SrcType::Bf16, Fp8::E5m2, false);
    let first = Case {
        given_list,
        ..case(fmt, Caches::V0, 16, 4, 128, 300, 5)
    };
    let mut m = OnGpu::new(&first);
    errors.reset(StreamRef::from(&stream)).unwrap();
    let op = m.op(&first, &errors);
    let graph = Graph::retrying(&stream, |s| g.kv.update_slices(&op, s));
    for seed in [6u64, 7] {
        // The same shapes (so the same buffers), new rows, scales, table and count.
        let mut next = case(fmt, Caches::V0, 16, 4, 128, 300, seed);
        next.slices.truncate(first.padded());
        while next.slices.len() < first.padded() {
            next.slices.push(Slice::default());
        }
        next.count = next.count.min(first.padded() as i32);
        overwrite(&mut m.k, &next.keys, &stream);
        overwrite(&mut m.v, &next.values, &stream);
        overwrite(&mut m.sk, &next.scales_k, &stream);
        overwrite(&mut m.sv, &next.scales_v, &stream);
        overwrite(&mut m.table, &next.table(), &stream);
        overwrite(&mut m.count, &[next.count], &stream);
        overwrite(&mut m.caches, &next.poison, &stream);
        errors.reset(StreamRef::from(&stream)).unwrap();
        graph.launch(&stream);
        let (want, counts) = next.expected();
        assert_same(
            &format!("graph replay (given list: {given_list})"),
            &download(&m.caches, &stream),
            &want,
        );
        assert_eq!(errors.read(StreamRef::from(&stream)).unwrap(), counts);
    }
}
