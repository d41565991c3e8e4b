//! Property tests of the write path (slot and slice updates) and of block copies.
//!
//! Random layouts (NHD, HND, padded strided views, combined K/V allocations, layers of
//! cross-layer NHD/HND and layer-first pools), element sizes 1/2/4, page sizes 1..=256, odd
//! head dims and random index lists with adversarial entries (negative, huge, `MIN`/`MAX`, out
//! of range, padding, empty lists) run through kvio's CPU emulation of each launch
//! (`kvio::emulate`: the real host validation and planning and the real kernel bodies) and are
//! compared bit for bit with the independent element-by-element reference (`kvio::reference`)
//! on whole poisoned buffers with guard bytes, so bytes nothing may touch are checked too.
//! Targets written by one launch are always distinct (duplicates would be a write race on a
//! GPU); duplicated and overlapping targets are checked for their rejection by the host-side
//! validators instead. Host-side rejections of a launch are checked for the exact typed error
//! and for leaving every buffer as it was.
//!
//! `PROPTEST_CASES` sets the number of cases per operation (default 1000). With
//! `KVIO_PROPTEST_GPU=1` the `gpu_*` tests run the same generators through the real launches
//! on the GPU, error word included (`KVIO_PROPTEST_GPU_CASES` cases, else `PROPTEST_CASES`,
//! else 200); without it they return at once and say so. The CPU emulation counts in an error
//! word of its own (`kvio::emulate::*_counted`), checked as the GPU's.

use std::cell::Cell;

use cust::memory::{CopyDestination, DeviceBuffer};
use kvio::plan::{slices_to_table, slots_to_slices, validate_slices, validate_slots, Slice};
use kvio::reference::{self, PoolImage};
use kvio::Stream;
use kvio::{
    Backend, Bases, BlockCopy, BlockMap, BlockPool, DeviceBytes, DeviceBytesMut, DeviceErrors,
    Error, ErrorCounts, PagedLayout, PinnedHost, PoolMemory, SliceUpdate, SlotMapping, SlotUpdate,
    StreamRef, TokenLayout,
};
use kvio_suite::{assert_same, gpu, random_bytes, Gpu};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, FailurePersistence, FileFailurePersistence, TestRunner};

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

/// Elements one cache (or one block pool) may hold: keeps a case fast in a debug build.
const BUDGET: usize = 16384;
/// Random bytes before and after every buffer (checked untouched like the rest).
const GUARD: usize = 32;

fn env_cases(var: &str) -> Option<u32> {
    std::env::var(var).ok().and_then(|v| v.parse().ok())
}

/// Failing cases are saved to (and replayed from) `proptest-regressions/prop.txt`.
fn persistence() -> Option<Box<dyn FailurePersistence>> {
    Some(Box::new(FileFailurePersistence::Direct(
        "proptest-regressions/prop.txt",
    )))
}

fn cpu_config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: persistence(),
        ..ProptestConfig::with_cases(env_cases("PROPTEST_CASES").unwrap_or(1000))
    }
}

/// The GPU runner when `KVIO_PROPTEST_GPU=1` and a GPU is usable; says why otherwise.
fn gpu_mode(test: &str) -> Option<(&'static Gpu, TestRunner)> {
    if std::env::var("KVIO_PROPTEST_GPU").map_or(true, |v| v != "1") {
        kvio_suite::skipped(
            test,
            "set KVIO_PROPTEST_GPU=1 to run the property tests on the GPU",
        );
        return None;
    }
    let g = gpu(test)?;
    let cases = env_cases("KVIO_PROPTEST_GPU_CASES")
        .or(env_cases("PROPTEST_CASES"))
        .unwrap_or(200);
    Some((g, TestRunner::new(Config::with_cases(cases))))
}

// ---------------------------------------------------------------------------------------------
// Memory: host arenas (emulation) or device/pinned buffers (GPU mode)
// ---------------------------------------------------------------------------------------------

/// Host bytes at a 16-byte aligned address, so offsets inside set the alignment exactly (the
/// same offsets on a device allocation, 256-byte aligned, give the same alignment).
struct Arena {
    words: Vec<u128>,
    len: usize,
}

impl Arena {
    fn new(data: &[u8]) -> Arena {
        let mut words = vec![0u128; data.len().div_ceil(16).max(1)];
        bytemuck::cast_slice_mut::<u128, u8>(&mut words)[..data.len()].copy_from_slice(data);
        Arena {
            words,
            len: data.len(),
        }
    }

    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u128, u8>(&self.words)[..self.len]
    }
}

/// One test buffer.
enum Buf {
    Host(Arena),
    Dev(DeviceBuffer<u8>),
    Pinned(PinnedHost),
}

impl Buf {
    fn len(&self) -> usize {
        match self {
            Buf::Host(a) => a.len,
            Buf::Dev(d) => d.len(),
            Buf::Pinned(p) => p.as_slice().expect("wait").len(),
        }
    }

    fn addr(&mut self) -> u64 {
        match self {
            Buf::Host(a) => a.words.as_mut_ptr() as u64,
            Buf::Dev(d) => d.as_device_ptr().as_raw(),
            Buf::Pinned(p) => p.bytes().ptr(),
        }
    }

    /// The bytes `at..at + len` as a kvio view.
    fn view(&mut self, at: usize, len: usize) -> DeviceBytes<'static> {
        assert!(at + len <= self.len(), "test bug: view past its buffer");
        // SAFETY: inside this buffer, which outlives every launch using the view (each case
        // waits for its launch before dropping its buffers).
        unsafe { DeviceBytes::from_raw(self.addr() + at as u64, len) }
    }

    /// [`Buf::view`] as a write view.
    fn view_mut(&mut self, at: usize, len: usize) -> DeviceBytesMut<'static> {
        let v = self.view(at, len);
        // SAFETY: as for `view`; the host touches the buffer only after the case's launch.
        unsafe { DeviceBytesMut::from_raw(v.ptr(), v.len()) }
    }

    /// The contents (call after [`Exec::finish`]).
    fn read(&self) -> Vec<u8> {
        match self {
            Buf::Host(a) => a.bytes().to_vec(),
            Buf::Dev(d) => {
                let mut v = vec![0u8; d.len()];
                d.copy_to(&mut v[..]).expect("download");
                v
            }
            Buf::Pinned(p) => p.as_slice().expect("wait").to_vec(),
        }
    }
}

/// Where the launches run.
enum Exec {
    /// `kvio::emulate` on host memory; what its error words counted since the last reset.
    Cpu(Cell<ErrorCounts>),
    /// The real launches.
    Gpu {
        g: &'static Gpu,
        stream: Stream,
        errors: DeviceErrors,
    },
}

impl Exec {
    fn cpu() -> Exec {
        Exec::Cpu(Cell::new(ErrorCounts::default()))
    }

    /// Adds what an emulated launch counted (`Ok`) to the counts since the last reset.
    fn count<T>(&self, r: kvio::Result<(T, ErrorCounts)>) -> kvio::Result<T> {
        let Exec::Cpu(total) = self else {
            unreachable!("only the emulation counts on the host")
        };
        r.map(|(v, n)| {
            let t = total.get();
            total.set(ErrorCounts {
                bad_slots: t.bad_slots + n.bad_slots,
                bad_slices: t.bad_slices + n.bad_slices,
                bad_counts: t.bad_counts + n.bad_counts,
                bad_blocks: t.bad_blocks + n.bad_blocks,
            });
            v
        })
    }

    fn gpu(g: &'static Gpu) -> Exec {
        Exec::Gpu {
            g,
            stream: g.stream(),
            errors: DeviceErrors::new().expect("DeviceErrors::new"),
        }
    }

    /// A buffer holding `data`: host memory on the CPU; device memory, or pinned host memory
    /// when `pinned`, on the GPU.
    fn buf(&self, data: &[u8], pinned: bool) -> Buf {
        assert!(!data.is_empty(), "test bug: empty buffer");
        match self {
            Exec::Cpu(_) => Buf::Host(Arena::new(data)),
            Exec::Gpu { .. } if pinned => {
                let mut p = PinnedHost::alloc(data.len()).expect("cuMemHostAlloc");
                p.as_mut_slice().expect("wait").copy_from_slice(data);
                Buf::Pinned(p)
            }
            Exec::Gpu { .. } => Buf::Dev(kvio_suite::upload(data)),
        }
    }

    fn errors(&self) -> Option<&DeviceErrors> {
        match self {
            Exec::Cpu(_) => None,
            Exec::Gpu { errors, .. } => Some(errors),
        }
    }

    fn stream(&self) -> Option<StreamRef<'_>> {
        match self {
            Exec::Cpu(_) => None,
            Exec::Gpu { stream, .. } => Some(StreamRef::from(stream)),
        }
    }

    fn reset(&self) {
        if let Exec::Cpu(total) = self {
            total.set(ErrorCounts::default());
        }
        if let (Some(e), Some(s)) = (self.errors(), self.stream()) {
            e.reset(s).expect("reset the error word");
        }
    }

    /// Waits for the launches; the error word's counts.
    fn finish(&self) -> Option<ErrorCounts> {
        if let Exec::Cpu(total) = self {
            return Some(total.get());
        }
        match (self.errors(), self.stream()) {
            (Some(e), Some(s)) => {
                Some(e.read(s).expect("read the error word (a fault shows here)"))
            }
            _ => None,
        }
    }

    fn update_slots(&self, op: &SlotUpdate<'_>) -> kvio::Result<()> {
        match self {
            // SAFETY: every view in `op` is host memory of its length (`Buf::Host`).
            Exec::Cpu(_) => {
                self.count(unsafe { kvio::emulate::update_slots_counted(op) }.map(|n| ((), n)))
            }
            Exec::Gpu { g, stream, .. } => g.kv.update_slots(op, StreamRef::from(stream)),
        }
    }

    fn update_slices(&self, op: &SliceUpdate<'_>) -> kvio::Result<()> {
        match self {
            // SAFETY: as above.
            Exec::Cpu(_) => {
                self.count(unsafe { kvio::emulate::update_slices_counted(op) }.map(|n| ((), n)))
            }
            Exec::Gpu { g, stream, .. } => g.kv.update_slices(op, StreamRef::from(stream)),
        }
    }

    fn copy_blocks(&self, op: &BlockCopy<'_>) -> kvio::Result<()> {
        match self {
            // SAFETY: as above; a device map's pairs are host memory too.
            Exec::Cpu(_) => {
                self.count(unsafe { kvio::emulate::copy_blocks_counted(op) }.map(|(_, n)| ((), n)))
            }
            Exec::Gpu { g, stream, .. } => {
                g.kv.copy_blocks(op, StreamRef::from(stream)).map(|_| ())
            }
        }
    }
}

/// A buffer of `GUARD + off` random bytes, `len` bytes of random payload and `GUARD` random
/// bytes: the initial contents (also the poison of a destination).
fn guarded(len: usize, off: usize, seed: u64) -> Vec<u8> {
    random_bytes(GUARD + off + len + GUARD, seed)
}

/// A rejection the host must report.
#[derive(Debug)]
enum Reject {
    /// Exactly this error.
    Exact(Error),
    /// `Error::InvalidArgument` naming this argument (value and reason are prose).
    Invalid(&'static str),
}

#[track_caller]
fn check_reject(got: &kvio::Result<()>, want: &Reject, what: &str) {
    let ok = match (want, got) {
        (Reject::Exact(w), Err(g)) => w == g,
        (Reject::Invalid(name), Err(Error::InvalidArgument { name: n, .. })) => name == n,
        _ => false,
    };
    assert!(ok, "{what}: got {got:?}, want {want:?}");
}

fn too_small(name: &'static str, needed: usize) -> Reject {
    Reject::Exact(Error::BufferTooSmall {
        name,
        needed: needed as u64,
        len: needed as u64 - 1,
    })
}

// ---------------------------------------------------------------------------------------------
// Shapes and layouts
// ---------------------------------------------------------------------------------------------

fn page_size() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => Just(1usize),
        3 => Just(2usize),
        4 => Just(16usize),
        3 => Just(256usize),
        2 => 3usize..16,
        2 => 17usize..256,
    ]
}

fn head_dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 1usize..=9,
        1 => Just(16usize),
        1 => Just(17usize),
        1 => Just(31usize),
        1 => Just(64usize),
    ]
}

fn elem() -> impl Strategy<Value = usize> {
    prop::sample::select(vec![1usize, 2, 4])
}

/// Sizes of one paged cache.
#[derive(Clone, Copy, Debug)]
struct Shape {
    blocks: usize,
    bs: usize,
    heads: usize,
    dim: usize,
    elem: usize,
}

impl Shape {
    fn num_slots(&self) -> usize {
        self.blocks * self.bs
    }
}

/// Caps `v` so that `v * other` stays within `budget` (`v` at least 1).
fn cap(v: &mut usize, budget: usize, other: usize) {
    *v = (*v).min((budget / other).max(1));
}

fn shape(max_blocks: usize) -> impl Strategy<Value = Shape> {
    (1..=max_blocks, page_size(), 1usize..=4, head_dim(), elem()).prop_map(
        |(mut blocks, bs, mut heads, mut dim, elem)| {
            cap(&mut dim, BUDGET, bs * heads);
            cap(&mut heads, BUDGET, bs * dim);
            cap(&mut blocks, BUDGET, bs * heads * dim);
            Shape {
                blocks,
                bs,
                heads,
                dim,
                elem,
            }
        },
    )
}

/// Bytes a paged layout reaches from its base (independent of `PagedLayout::extent`).
fn layout_bytes(l: &PagedLayout) -> usize {
    ((l.num_blocks - 1) * l.block_stride
        + (l.block_size - 1) * l.token_stride
        + (l.num_heads - 1) * l.head_stride
        + l.head_dim)
        * l.elem_bytes
}

/// Bytes a token layout reaches from its base.
fn input_bytes(i: &TokenLayout) -> usize {
    if i.num_tokens == 0 {
        return 0;
    }
    ((i.num_tokens - 1) * i.token_stride + (i.num_heads - 1) * i.head_stride + i.head_dim)
        * i.elem_bytes
}

/// How the K and V caches of a slot update sit in one region of memory.
#[derive(Clone, Copy, Debug)]
enum Caches {
    /// Two caches one after the other (`gap` bytes between): NHD or HND, with `pad` extra
    /// elements after each head, slot and block.
    Separate {
        hnd: bool,
        pad: [usize; 3],
        gap: usize,
    },
    /// One allocation `[NB, bs, 2H, D]`: K heads then V heads in each slot.
    CombinedRow,
    /// One allocation `[NB, bs, H, 2, D]`: K and V of each head side by side.
    InterleavedHeads,
    /// One allocation `[NB, 2, bs, H, D]`: the K page then the V page of each block.
    CombinedBlock,
    /// Layer `layer` of a cross-layer pool `(NB, L, 2, bs, H, D)`.
    CrossNhd { layers: usize, layer: usize },
    /// Layer `layer` of a cross-layer pool `(NB, H, L, 2, bs, D)`.
    CrossHnd { layers: usize, layer: usize },
    /// Layer `layer` of a layer-first pool `(L, 2, NB, bs, H, D)`, `gap` bytes between caches.
    LayerFirst {
        layers: usize,
        layer: usize,
        gap: usize,
    },
}

fn layer_of() -> impl Strategy<Value = (usize, usize)> {
    (1usize..=3).prop_flat_map(|l| (Just(l), 0..l))
}

fn caches() -> impl Strategy<Value = Caches> {
    let pad = || prop_oneof![3 => Just(0usize), 1 => 1usize..4];
    prop_oneof![
        5 => (any::<bool>(), [pad(), pad(), pad()], 0usize..24)
            .prop_map(|(hnd, pad, gap)| Caches::Separate { hnd, pad, gap }),
        1 => Just(Caches::CombinedRow),
        1 => Just(Caches::InterleavedHeads),
        1 => Just(Caches::CombinedBlock),
        1 => layer_of().prop_map(|(layers, layer)| Caches::CrossNhd { layers, layer }),
        1 => layer_of().prop_map(|(layers, layer)| Caches::CrossHnd { layers, layer }),
        1 => (layer_of(), 0usize..24)
            .prop_map(|((layers, layer), gap)| Caches::LayerFirst { layers, layer, gap }),
    ]
}

/// A cache layout and where K and V start in a region of `len` bytes.
#[derive(Debug)]
struct Placement {
    layout: PagedLayout,
    len: usize,
    k_at: usize,
    v_at: usize,
    /// For layers of pools: the pool's (layer_stride, part_stride) in bytes.
    pool: Option<(usize, usize)>,
}

fn place(s: &Shape, c: Caches) -> Placement {
    let Shape {
        blocks: nb,
        bs,
        heads: h,
        dim: d,
        elem: e,
    } = *s;
    let hd = h * d;
    let mut l = PagedLayout::nhd(nb, bs, h, d, e);
    let p = |l: PagedLayout, len, k_at, v_at, pool| Placement {
        layout: l,
        len,
        k_at,
        v_at,
        pool,
    };
    match c {
        Caches::Separate {
            hnd,
            pad: [ph, pt, pb],
            gap,
        } => {
            if hnd {
                l.token_stride = d + pt;
                l.head_stride = bs * l.token_stride + ph;
                l.block_stride = h * l.head_stride + pb;
            } else {
                l.head_stride = d + ph;
                l.token_stride = h * l.head_stride + pt;
                l.block_stride = bs * l.token_stride + pb;
            }
            let ext = layout_bytes(&l);
            p(l, 2 * ext + gap, 0, ext + gap, None)
        }
        Caches::CombinedRow => {
            l.token_stride = 2 * hd;
            l.block_stride = bs * 2 * hd;
            p(l, nb * bs * 2 * hd * e, 0, hd * e, None)
        }
        Caches::InterleavedHeads => {
            l.head_stride = 2 * d;
            l.token_stride = 2 * hd;
            l.block_stride = bs * 2 * hd;
            p(l, nb * bs * 2 * hd * e, 0, d * e, None)
        }
        Caches::CombinedBlock => {
            l.block_stride = 2 * bs * hd;
            p(l, nb * 2 * bs * hd * e, 0, bs * hd * e, None)
        }
        Caches::CrossNhd { layers, layer } => {
            l.block_stride = layers * 2 * bs * hd;
            let k = layer * 2 * bs * hd * e;
            let pool = Some((2 * bs * hd * e, bs * hd * e));
            p(l, nb * layers * 2 * bs * hd * e, k, k + bs * hd * e, pool)
        }
        Caches::CrossHnd { layers, layer } => {
            l.token_stride = d;
            l.head_stride = layers * 2 * bs * d;
            l.block_stride = h * layers * 2 * bs * d;
            let k = layer * 2 * bs * d * e;
            let pool = Some((2 * bs * d * e, bs * d * e));
            p(l, nb * h * layers * 2 * bs * d * e, k, k + bs * d * e, pool)
        }
        Caches::LayerFirst { layers, layer, gap } => {
            let cache = nb * bs * hd * e;
            let (ps, ls) = (cache + gap, 2 * (cache + gap));
            let k = layer * ls;
            p(l, (layers - 1) * ls + ps + cache, k, k + ps, Some((ls, ps)))
        }
    }
}

/// For layers of pools: `BlockPool::layer_view` gives exactly the K/V views of `p`.
fn check_layer_view(s: &Shape, c: Caches, p: &Placement, region: DeviceBytes) {
    let (pool, layer) = match c {
        Caches::CrossNhd { layers, layer } => (
            BlockPool::cross_layer_nhd(region, s.blocks, layers, s.bs, s.heads, s.dim, s.elem),
            layer,
        ),
        Caches::CrossHnd { layers, layer } => (
            BlockPool::cross_layer_hnd(region, s.blocks, layers, s.bs, s.heads, s.dim, s.elem),
            layer,
        ),
        Caches::LayerFirst { layers, layer, .. } => {
            let (layer_stride, part_stride) = p.pool.unwrap();
            let pool = BlockPool::strided(region, layer_stride, part_stride, layers, 2, p.layout);
            (pool, layer)
        }
        _ => return,
    };
    let ext = layout_bytes(&p.layout);
    let (k, v, layout) = pool.layer_view(layer).expect("layer_view of a valid pool");
    let at = |b: DeviceBytes| (b.ptr() - region.ptr(), b.len());
    assert_eq!(layout, p.layout, "{c:?}: layer_view layout");
    assert_eq!(at(k), (p.k_at as u64, ext), "{c:?}: layer_view K");
    assert_eq!(v.map(at), Some((p.v_at as u64, ext)), "{c:?}: layer_view V");
}

// ---------------------------------------------------------------------------------------------
// Slot mappings (shared by the slot update and slot -> slice planning)
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum SlotGen {
    /// A valid slot, distinct from every other (picked among the slots still free).
    Valid(Index),
    /// A negative slot (skip), clamped to the slot type.
    Skip(i64),
    /// At or past the end: `num_slots + k`, or the slot type's maximum for `None`.
    Past(Option<u32>),
}

fn slot_gen() -> impl Strategy<Value = SlotGen> {
    prop_oneof![
        8 => any::<Index>().prop_map(SlotGen::Valid),
        2 => prop_oneof![
            Just(-1i64),
            Just(i64::MIN),
            Just(i32::MIN as i64),
            i64::MIN..0,
            -300i64..0,
        ]
        .prop_map(SlotGen::Skip),
        1 => prop_oneof![
            Just(None),
            (0u32..4).prop_map(Some),
            any::<u32>().prop_map(|k| Some(k >> 1)),
        ]
        .prop_map(SlotGen::Past),
    ]
}

fn concretize_slots(gens: &[SlotGen], num_slots: usize, i64s: bool) -> Vec<i64> {
    let (min, max) = if i64s {
        (i64::MIN, i64::MAX)
    } else {
        (i32::MIN as i64, i32::MAX as i64)
    };
    let mut free: Vec<i64> = (0..num_slots as i64).collect();
    gens.iter()
        .map(|g| match *g {
            SlotGen::Valid(ix) if !free.is_empty() => free.swap_remove(ix.index(free.len())),
            SlotGen::Valid(_) => -1,
            SlotGen::Skip(v) => v.max(min),
            SlotGen::Past(None) => max,
            SlotGen::Past(Some(k)) => (num_slots as i64 + k as i64).min(max),
        })
        .collect()
}

fn slot_bytes(slots: &[i64], i64s: bool) -> Vec<u8> {
    if i64s {
        bytemuck::cast_slice(slots).to_vec()
    } else {
        slots
            .iter()
            .flat_map(|&s| i32::try_from(s).expect("i32 slot").to_ne_bytes())
            .collect()
    }
}

/// What `validate_slots` must say: the first out-of-range entry, else the two first tokens
/// of the smallest slot written twice.
fn expected_slot_check(slots: &[i64], num_slots: usize) -> kvio::Result<()> {
    if let Some((at, &value)) = slots
        .iter()
        .enumerate()
        .find(|&(_, &s)| s >= num_slots as i64)
    {
        return Err(Error::IndexOutOfRange {
            name: "slots",
            at,
            value,
            limit: num_slots as u64,
        });
    }
    let mut best: Option<(i64, usize, usize)> = None;
    for (i, &a) in slots.iter().enumerate() {
        if a < 0 || best.is_some_and(|b| b.0 <= a) {
            continue;
        }
        if let Some(j) = (i + 1..slots.len()).find(|&j| slots[j] == a) {
            best = Some((a, i, j));
        }
    }
    match best {
        Some((_, first, second)) => Err(Error::Overlap {
            name: "slots",
            first,
            second,
        }),
        None => Ok(()),
    }
}

fn validate_typed(slots: &[i64], num_slots: usize, i64s: bool) -> kvio::Result<()> {
    if i64s {
        validate_slots(slots, num_slots)
    } else {
        let s32: Vec<i32> = slots.iter().map(|&s| s as i32).collect();
        validate_slots(&s32, num_slots)
    }
}

/// `slots_to_slices` gives slices that write exactly token `t` to `slots[t]` for every
/// non-negative slot, each inside one page, and no two of them could be one slice; or the
/// first slot past `i32::MAX` is reported.
fn check_slots_to_slices(slots: &[i64], page: usize, i64s: bool) -> Option<Vec<Slice>> {
    let got = if i64s {
        slots_to_slices(slots, page)
    } else {
        let s32: Vec<i32> = slots.iter().map(|&s| s as i32).collect();
        slots_to_slices(&s32, page)
    };
    if let Some((at, &value)) = slots
        .iter()
        .enumerate()
        .find(|&(_, &s)| s > i32::MAX as i64)
    {
        let want = Err(Error::IndexOutOfRange {
            name: "slots",
            at,
            value,
            limit: i32::MAX as u64 + 1,
        });
        assert_eq!(got, want, "slots_to_slices({slots:?}, {page})");
        return None;
    }
    let mut slices = got.unwrap_or_else(|e| panic!("slots_to_slices({slots:?}, {page}): {e}"));
    let mut covered = Vec::new();
    for s in &slices {
        let (start, len) = (s.cache_start as i64, s.len as i64);
        assert!(
            len >= 1 && len <= page as i64,
            "slots_to_slices({slots:?}, {page}): length of {s:?}"
        );
        assert_eq!(
            start / page as i64,
            (start + len - 1) / page as i64,
            "slots_to_slices({slots:?}, {page}): {s:?} crosses a page"
        );
        for r in 0..len {
            covered.push((s.new_kv_start as i64 + r, start + r));
        }
    }
    covered.sort_unstable();
    let want: Vec<(i64, i64)> = (0..)
        .zip(slots.iter().copied())
        .filter(|&(_, s)| s >= 0)
        .collect();
    assert_eq!(
        covered, want,
        "slots_to_slices({slots:?}, {page}): coverage"
    );
    slices.sort_by_key(|s| s.new_kv_start);
    for w in slices.windows(2) {
        let (a, b) = (w[0], w[1]);
        let mergeable = b.new_kv_start as i64 == a.new_kv_start as i64 + a.len as i64
            && b.cache_start as i64 == a.cache_start as i64 + a.len as i64
            && b.cache_start as i64 % page as i64 != 0;
        assert!(
            !mergeable,
            "slots_to_slices({slots:?}, {page}): {a:?} and {b:?} are one run"
        );
    }
    Some(slices)
}

/// `slices_to_table` packs the slices (then zeros) into `[3, padded]`, or refuses a
/// `padded` below the slice count.
fn check_table(slices: &[Slice], padded: usize) -> Option<Vec<i32>> {
    let got = slices_to_table(slices, padded);
    if padded < slices.len() {
        check_reject(
            &got.map(|_| ()),
            &Reject::Invalid("padded"),
            "slices_to_table",
        );
        return None;
    }
    let t = got.expect("slices_to_table");
    assert_eq!(t.len(), 3 * padded, "slices_to_table length");
    for i in 0..padded {
        let s = slices.get(i).copied().unwrap_or_default();
        assert_eq!(
            (t[i], t[padded + i], t[2 * padded + i]),
            (s.cache_start, s.new_kv_start, s.len),
            "slices_to_table entry {i}"
        );
    }
    Some(t)
}

// ---------------------------------------------------------------------------------------------
// Slot update
// ---------------------------------------------------------------------------------------------

/// One way to break a valid slot update; the host must refuse it.
#[derive(Clone, Copy, Debug)]
enum SlotMutation {
    KeyCacheShort,
    ValueCacheShort,
    KeyShort,
    ValueShort,
    CacheElem3,
    ShapeMismatch,
    ZeroBlocks,
    CollapsedStride,
    SameKvView,
    SlotsOddLength,
    SlotsMisaligned,
    TooManySlots,
}

fn slot_mutation() -> impl Strategy<Value = SlotMutation> {
    use SlotMutation::*;
    prop::sample::select(vec![
        KeyCacheShort,
        ValueCacheShort,
        KeyShort,
        ValueShort,
        CacheElem3,
        ShapeMismatch,
        ZeroBlocks,
        CollapsedStride,
        SameKvView,
        SlotsOddLength,
        SlotsMisaligned,
        TooManySlots,
    ])
}

#[derive(Clone, Debug)]
struct SlotCase {
    shape: Shape,
    caches: Caches,
    with_value: bool,
    i64s: bool,
    /// Extra elements after each input head and token.
    input_pad: [usize; 2],
    /// Input tokens beyond the slot count.
    extra_tokens: usize,
    slots: Vec<SlotGen>,
    /// Host-list check with a duplicate: (entry copied, position of the copy).
    dup: Option<(Index, Index)>,
    /// Byte offsets (alignment) of the key input, the value input and the cache region.
    offsets: [usize; 3],
    /// Bytes each view extends past what its layout reaches (into the guard).
    slack: usize,
    mutation: Option<SlotMutation>,
    seed: u64,
}

fn slot_case() -> impl Strategy<Value = SlotCase> {
    let pad = || prop_oneof![3 => Just(0usize), 1 => 1usize..5];
    (
        (shape(6), caches(), prop::bool::weighted(0.8), any::<bool>()),
        ([pad(), pad()], 0usize..=3),
        prop::collection::vec(slot_gen(), 0..=48),
        prop::option::weighted(0.3, (any::<Index>(), any::<Index>())),
        ([0usize..16, 0usize..16, 0usize..16], 0usize..=16),
        prop::option::weighted(0.2, slot_mutation()),
        any::<u64>(),
    )
        .prop_map(
            |(
                (shape, caches, with_value, i64s),
                (input_pad, extra_tokens),
                slots,
                dup,
                (offsets, slack),
                mutation,
                seed,
            )| SlotCase {
                shape,
                caches,
                with_value,
                i64s,
                input_pad,
                extra_tokens,
                slots,
                dup,
                offsets,
                slack,
                mutation,
                seed,
            },
        )
}

/// Host-side checks of a slot list: `validate_slots` (with a duplicate added when asked),
/// `slots_to_slices`, `slices_to_table`.
fn host_slot_checks(c: &SlotCase, slots: &[i64], num_slots: usize) {
    assert_eq!(
        validate_typed(slots, num_slots, c.i64s),
        expected_slot_check(slots, num_slots),
        "validate_slots({slots:?}, {num_slots})"
    );
    if let Some((which, at)) = c.dup {
        let valid: Vec<i64> = slots
            .iter()
            .copied()
            .filter(|&s| (0..num_slots as i64).contains(&s))
            .collect();
        if !valid.is_empty() {
            let mut with_dup = slots.to_vec();
            with_dup.insert(at.index(slots.len() + 1), valid[which.index(valid.len())]);
            let want = expected_slot_check(&with_dup, num_slots);
            assert!(
                matches!(
                    want,
                    Err(Error::Overlap { .. } | Error::IndexOutOfRange { .. })
                ),
                "test bug: a duplicate went unnoticed"
            );
            assert_eq!(
                validate_typed(&with_dup, num_slots, c.i64s),
                want,
                "validate_slots({with_dup:?}, {num_slots})"
            );
        }
    }
    if let Some(slices) = check_slots_to_slices(slots, c.shape.bs, c.i64s) {
        check_table(&slices, slices.len() + c.extra_tokens);
        if !slices.is_empty() {
            check_table(&slices, slices.len() - 1);
        }
    }
}

fn run_slot_case(c: &SlotCase, x: &Exec) {
    let s = c.shape;
    let num_slots = s.num_slots();
    let pl = place(&s, c.caches);
    let layout = pl.layout;
    let ext = layout_bytes(&layout);
    assert_eq!(
        layout.extent("cache"),
        Ok(ext as u64),
        "{c:?}: cache extent"
    );
    assert!(
        pl.k_at + ext <= pl.len && pl.v_at + ext <= pl.len,
        "test bug"
    );

    let slots = concretize_slots(&c.slots, num_slots, c.i64s);
    let n = slots.len();
    let [ihp, itp] = c.input_pad;
    let input = TokenLayout {
        num_tokens: n + c.extra_tokens,
        num_heads: s.heads,
        head_dim: s.dim,
        elem_bytes: s.elem,
        head_stride: s.dim + ihp,
        token_stride: s.heads * (s.dim + ihp) + itp,
    };
    let in_ext = input_bytes(&input);
    assert_eq!(
        input.extent("input"),
        Ok(in_ext as u64),
        "{c:?}: input extent"
    );

    host_slot_checks(c, &slots, num_slots);

    // Memory: inputs, the cache region (poisoned), the slot list, each with guard bytes.
    let [ko, vo, co] = c.offsets;
    let key_h = guarded(in_ext + c.slack, ko, c.seed ^ 0x1);
    let val_h = guarded(in_ext + c.slack, vo, c.seed ^ 0x2);
    let poison = guarded(pl.len, co, c.seed ^ 0x3);
    let w = if c.i64s { 8 } else { 4 };
    let mut slots_h = vec![0xA5u8; 8];
    slots_h.extend(slot_bytes(&slots, c.i64s));
    slots_h.extend([0x5Au8; 8]);
    let mut key = x.buf(&key_h, false);
    let mut val = x.buf(&val_h, false);
    let mut cache = x.buf(&poison, false);
    let mut slot_buf = x.buf(&slots_h, false);
    let base = GUARD + co;
    check_layer_view(&s, c.caches, &pl, cache.view(base, pl.len));

    let key_cache = cache.view_mut(base + pl.k_at, ext + c.slack);
    let value_cache = cache.view_mut(base + pl.v_at, ext + c.slack);
    let slot_view = slot_buf.view(8, n * w);
    let mapping = |b: DeviceBytes<'static>| {
        if c.i64s {
            SlotMapping::I64(b)
        } else {
            SlotMapping::I32(b)
        }
    };
    let mut op = SlotUpdate {
        key: kvio::CacheWrite {
            src: key.view(GUARD + ko, in_ext + c.slack),
            dst: key_cache,
        },
        value: (c.with_value.then(|| val.view(GUARD + vo, in_ext + c.slack)))
            .zip(c.with_value.then_some(value_cache))
            .map(|(src, dst)| kvio::CacheWrite { src, dst }),
        input,
        cache: layout,
        value_layout: None,
        slots: mapping(slot_view),
        errors: x.errors(),
        quantize: None,
    };

    let reject = c.mutation.and_then(|m| {
        use SlotMutation::*;
        Some(match m {
            KeyCacheShort => {
                op.key.dst = cache.view_mut(base + pl.k_at, ext - 1);
                too_small("key_cache", ext)
            }
            ValueCacheShort if c.with_value => {
                op.value.as_mut()?.dst = cache.view_mut(base + pl.v_at, ext - 1);
                too_small("value_cache", ext)
            }
            KeyShort if in_ext > 0 => {
                op.key.src = key.view(GUARD + ko, in_ext - 1);
                too_small("key", in_ext)
            }
            ValueShort if c.with_value && in_ext > 0 => {
                op.value.as_mut()?.src = val.view(GUARD + vo, in_ext - 1);
                too_small("value", in_ext)
            }
            CacheElem3 => {
                op.cache.elem_bytes = 3;
                Reject::Invalid("cache")
            }
            ShapeMismatch => {
                op.input.head_dim += 1;
                Reject::Invalid("input")
            }
            ZeroBlocks => {
                op.cache.num_blocks = 0;
                Reject::Invalid("cache")
            }
            CollapsedStride => {
                let l = &mut op.cache;
                if l.num_blocks > 1 {
                    l.block_stride = 0;
                } else if l.block_size > 1 {
                    l.token_stride = 0;
                } else if l.num_heads > 1 {
                    l.head_stride = 0;
                } else {
                    return None;
                }
                Reject::Invalid("cache")
            }
            SameKvView if c.with_value => {
                op.value.as_mut()?.dst = op.key.dst;
                Reject::Invalid("value_cache")
            }
            SlotsOddLength => {
                op.slots = mapping(slot_buf.view(8, n * w + 1 + (c.seed % 3) as usize));
                Reject::Invalid("slots")
            }
            SlotsMisaligned => {
                op.slots = mapping(slot_buf.view(8 + 1 + (c.seed % 3) as usize, n * w));
                Reject::Invalid("slots")
            }
            TooManySlots if n > 0 => {
                op.input.num_tokens = n - 1;
                Reject::Invalid("slots")
            }
            _ => return None,
        })
    });

    x.reset();
    let r = x.update_slots(&op);
    let counts = x.finish();
    let got = cache.read();
    assert_same(&format!("{c:?}: key input"), &key.read(), &key_h);
    assert_same(&format!("{c:?}: value input"), &val.read(), &val_h);
    assert_same(&format!("{c:?}: slots"), &slot_buf.read(), &slots_h);
    if let Some(want) = reject {
        check_reject(&r, &want, &format!("{c:?}"));
        assert_same(&format!("{c:?}: rejected, cache"), &got, &poison);
        if let Some(counts) = counts {
            assert!(counts.is_clean(), "{c:?}: rejected, counted {counts:?}");
        }
        return;
    }
    r.unwrap_or_else(|e| panic!("{c:?}: {e}"));

    let mut want = poison.clone();
    let rc = reference::update_slots(
        &key_h[GUARD + ko..],
        c.with_value.then(|| &val_h[GUARD + vo..]),
        &input,
        &mut want[base..],
        pl.k_at,
        c.with_value.then_some(pl.v_at),
        &layout,
        &slots,
    );
    let bad = slots.iter().filter(|&&s| s >= num_slots as i64).count() as u32;
    let want_counts = ErrorCounts {
        bad_slots: bad,
        ..ErrorCounts::default()
    };
    assert_eq!(rc, want_counts, "{c:?}: reference counts");
    assert_same(&format!("{c:?}: cache"), &got, &want);
    if let Some(counts) = counts {
        assert_eq!(counts, want_counts, "{c:?}: error word");
    }
}

// ---------------------------------------------------------------------------------------------
// Slice update
// ---------------------------------------------------------------------------------------------

/// The cache of a slice update (each slot's heads contiguous).
#[derive(Clone, Copy, Debug)]
enum SliceCache {
    Nhd,
    /// NHD with `token`/`block` extra elements after each slot/block.
    Padded {
        token: usize,
        block: usize,
    },
    /// HND: heads are contiguous per slot only with one head (NHD is used for more).
    Hnd,
    /// K (or V) of layer `layer` of a cross-layer pool `(NB, L, 2, bs, H, D)`.
    CrossNhd {
        layers: usize,
        layer: usize,
        value: bool,
    },
}

fn slice_cache() -> impl Strategy<Value = SliceCache> {
    prop_oneof![
        3 => Just(SliceCache::Nhd),
        2 => (0usize..5, 0usize..5).prop_map(|(token, block)| SliceCache::Padded { token, block }),
        1 => Just(SliceCache::Hnd),
        1 => (layer_of(), any::<bool>()).prop_map(|((layers, layer), value)| {
            SliceCache::CrossNhd { layers, layer, value }
        }),
    ]
}

/// (layout, region bytes, cache offset in the region).
fn place_slices(s: &Shape, k: SliceCache) -> (PagedLayout, usize, usize) {
    let (nb, bs, h, d, e) = (s.blocks, s.bs, s.heads, s.dim, s.elem);
    let hd = h * d;
    let mut l = PagedLayout::nhd(nb, bs, h, d, e);
    match k {
        SliceCache::Nhd => (l, layout_bytes(&l), 0),
        SliceCache::Padded { token, block } => {
            l.token_stride = hd + token;
            l.block_stride = bs * l.token_stride + block;
            (l, layout_bytes(&l), 0)
        }
        SliceCache::Hnd if h == 1 => {
            let l = PagedLayout::hnd(nb, bs, h, d, e);
            (l, layout_bytes(&l), 0)
        }
        SliceCache::Hnd => (l, layout_bytes(&l), 0),
        SliceCache::CrossNhd {
            layers,
            layer,
            value,
        } => {
            l.block_stride = layers * 2 * bs * hd;
            let at = (layer * 2 + value as usize) * bs * hd * e;
            (l, nb * layers * 2 * bs * hd * e, at)
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum BadSlice {
    NegLen(i32),
    TooLong(i32),
    Crossing,
    StartPast(i32),
    StartEdge,
    NegStart(i32),
    SrcPast(i32),
    SrcEdge,
    NegSrc(i32),
    AllMax,
    AllMin,
}

#[derive(Clone, Copy, Debug)]
enum SliceGen {
    /// A valid slice on slots still free: first free slot from `at`, length and source
    /// picked by the indices.
    Valid {
        at: Index,
        len: Index,
        src: Index,
    },
    /// `len == 0` with any start and source.
    Padding {
        start: i32,
        src: i32,
    },
    Bad(BadSlice),
}

fn bad_slice() -> impl Strategy<Value = BadSlice> {
    use BadSlice::*;
    prop_oneof![
        prop_oneof![Just(i32::MIN), Just(-1), i32::MIN..0].prop_map(NegLen),
        (1i32..1000).prop_map(TooLong),
        Just(Crossing),
        (0i32..1000).prop_map(StartPast),
        Just(StartEdge),
        prop_oneof![Just(i32::MIN), i32::MIN..0].prop_map(NegStart),
        (0i32..1000).prop_map(SrcPast),
        Just(SrcEdge),
        prop_oneof![Just(i32::MIN), i32::MIN..0].prop_map(NegSrc),
        Just(AllMax),
        Just(AllMin),
    ]
}

fn slice_gen() -> impl Strategy<Value = SliceGen> {
    prop_oneof![
        6 => (any::<Index>(), any::<Index>(), any::<Index>())
            .prop_map(|(at, len, src)| SliceGen::Valid { at, len, src }),
        1 => (any::<i32>(), any::<i32>()).prop_map(|(start, src)| SliceGen::Padding { start, src }),
        2 => bad_slice().prop_map(SliceGen::Bad),
    ]
}

/// What the kernel (and the reference) does with a slice.
fn slice_ok(s: &Slice, page: usize, num_slots: usize, tokens: usize) -> bool {
    let (start, src, len) = (s.cache_start as i64, s.new_kv_start as i64, s.len as i64);
    let page = page as i64;
    len > 0
        && len <= page
        && start >= 0
        && src >= 0
        && start + len <= num_slots as i64
        && src + len <= tokens as i64
        && start / page == (start + len - 1) / page
}

fn concretize_slices(gens: &[SliceGen], s: &Shape, tokens: usize) -> Vec<Slice> {
    let (page, ns) = (s.bs, s.num_slots());
    let sat = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
    let mut used = vec![false; ns];
    gens.iter()
        .map(|g| {
            let sl = |cache_start, new_kv_start, len| Slice {
                cache_start,
                new_kv_start,
                len,
            };
            match *g {
                SliceGen::Valid { at, len, src } => {
                    let first = at.index(ns);
                    let Some(start) = (0..ns).map(|k| (first + k) % ns).find(|&k| !used[k]) else {
                        return sl(-7, 3, 0);
                    };
                    let page_end = (start / page + 1) * page;
                    let room = (start..page_end).take_while(|&k| !used[k]).count();
                    let n = (1 + len.index(room)).min(tokens);
                    if n == 0 {
                        return sl(start as i32, -1, 0);
                    }
                    used[start..start + n].iter_mut().for_each(|u| *u = true);
                    sl(start as i32, src.index(tokens - n + 1) as i32, n as i32)
                }
                SliceGen::Padding { start, src } => sl(start, src, 0),
                SliceGen::Bad(b) => {
                    use BadSlice::*;
                    match b {
                        NegLen(l) => sl(0, 0, l),
                        TooLong(k) => sl(0, 0, sat(page).saturating_add(k)),
                        Crossing if page >= 2 => sl(page as i32 - 1, 0, 2),
                        Crossing => sl(0, 0, 2),
                        StartPast(k) => sl(sat(ns).saturating_add(k), 0, 1),
                        StartEdge => sl(ns as i32 - 1, 0, 2),
                        NegStart(v) => sl(v, 0, 1),
                        SrcPast(k) => sl(0, sat(tokens).saturating_add(k), 1),
                        SrcEdge => sl(0, tokens.max(1) as i32 - 1, 2),
                        NegSrc(v) => sl(0, v, 1),
                        AllMax => sl(i32::MAX, i32::MAX, i32::MAX),
                        AllMin => sl(i32::MIN, i32::MIN, i32::MIN),
                    }
                }
            }
        })
        .collect()
}

/// What `validate_slices` must say: the first bad slice (index error, or `InvalidArgument`
/// for a slice whose only fault is crossing a page), else whether two slices overlap.
#[derive(Debug, PartialEq)]
enum SliceExpect {
    Ok,
    OutOfRange { at: usize },
    Crossing,
    Overlap,
}

fn expected_slice_check(slices: &[Slice], page: usize, ns: usize, tokens: usize) -> SliceExpect {
    for (at, s) in slices.iter().enumerate() {
        if s.len == 0 || slice_ok(s, page, ns, tokens) {
            continue;
        }
        let (start, src, len) = (s.cache_start as i64, s.new_kv_start as i64, s.len as i64);
        let range_bad = len < 0
            || len > page as i64
            || start < 0
            || start + len > ns as i64
            || src < 0
            || src + len > tokens as i64;
        return if range_bad {
            SliceExpect::OutOfRange { at }
        } else {
            SliceExpect::Crossing
        };
    }
    let live: Vec<(i64, i64)> = slices
        .iter()
        .filter(|s| s.len != 0)
        .map(|s| (s.cache_start as i64, s.cache_start as i64 + s.len as i64))
        .collect();
    for (i, a) in live.iter().enumerate() {
        if live[i + 1..].iter().any(|b| a.0 < b.1 && b.0 < a.1) {
            return SliceExpect::Overlap;
        }
    }
    SliceExpect::Ok
}

#[track_caller]
fn check_validate_slices(slices: &[Slice], page: usize, ns: usize, tokens: usize) {
    let got = validate_slices(slices, page, ns, tokens);
    let want = expected_slice_check(slices, page, ns, tokens);
    let what = format!("validate_slices({slices:?}, {page}, {ns}, {tokens})");
    match (&want, &got) {
        (SliceExpect::Ok, Ok(())) => {}
        (
            SliceExpect::OutOfRange { at },
            Err(Error::IndexOutOfRange {
                name: "slices",
                at: a,
                ..
            }),
        ) if a == at => {}
        (SliceExpect::Crossing, Err(Error::InvalidArgument { name: "slices", .. })) => {}
        (
            SliceExpect::Overlap,
            Err(Error::Overlap {
                name: "slices",
                first,
                second,
            }),
        ) => {
            let (a, b) = (slices[*first], slices[*second]);
            let (a0, a1) = (a.cache_start as i64, a.cache_start as i64 + a.len as i64);
            let (b0, b1) = (b.cache_start as i64, b.cache_start as i64 + b.len as i64);
            assert!(
                first != second && a.len > 0 && b.len > 0 && a0 < b1 && b0 < a1,
                "{what}: reported {a:?} and {b:?}, which do not overlap"
            );
        }
        _ => panic!("{what}: got {got:?}, want {want:?}"),
    }
}

#[derive(Clone, Debug)]
enum SliceSource {
    /// Slices planned by `slots_to_slices` from a slot mapping (i32 slots).
    FromSlots(Vec<SlotGen>),
    /// Slices given directly, `tokens` input tokens.
    Direct {
        slices: Vec<SliceGen>,
        tokens: usize,
    },
}

#[derive(Clone, Copy, Debug)]
enum CountGen {
    /// Every slice.
    All,
    /// `0..=padded` slices (entries past the count must not be used).
    Upto(Index),
    /// A count outside `0..=padded`: `None` is `padded + 1`.
    Bad(Option<i32>),
}

#[derive(Clone, Copy, Debug)]
enum SliceMutation {
    CacheShort,
    NewKvShort,
    TableShort,
    CountShort,
    TableMisaligned,
    CountMisaligned,
    ValueLayoutAlone,
    ShapeMismatch,
    PaddedHuge,
    LayoutElem3,
    ZeroHeads,
}

fn slice_mutation() -> impl Strategy<Value = SliceMutation> {
    use SliceMutation::*;
    prop::sample::select(vec![
        CacheShort,
        NewKvShort,
        TableShort,
        CountShort,
        TableMisaligned,
        CountMisaligned,
        ValueLayoutAlone,
        ShapeMismatch,
        PaddedHuge,
        LayoutElem3,
        ZeroHeads,
    ])
}

#[derive(Clone, Debug)]
struct SliceCase {
    shape: Shape,
    cache: SliceCache,
    source: SliceSource,
    /// Extra elements after each input token, and after the head of a one-head input.
    input_pad: [usize; 2],
    /// Table capacity beyond the slice count.
    extra_padded: usize,
    count: CountGen,
    /// Host-list check with an overlapping slice: (slice overlapped, position of the copy).
    dup: Option<(Index, Index)>,
    /// Byte offsets (alignment) of the input and the cache region.
    offsets: [usize; 2],
    slack: usize,
    mutation: Option<SliceMutation>,
    seed: u64,
}

fn slice_case() -> impl Strategy<Value = SliceCase> {
    let source = prop_oneof![
        1 => prop::collection::vec(slot_gen(), 0..=32).prop_map(SliceSource::FromSlots),
        2 => (prop::collection::vec(slice_gen(), 0..=24), 0usize..=40)
            .prop_map(|(slices, tokens)| SliceSource::Direct { slices, tokens }),
    ];
    let count = prop_oneof![
        4 => Just(CountGen::All),
        2 => any::<Index>().prop_map(CountGen::Upto),
        1 => prop_oneof![Just(None), Just(Some(-1)), Just(Some(i32::MIN)), Just(Some(i32::MAX))]
            .prop_map(CountGen::Bad),
    ];
    let pad = || prop_oneof![3 => Just(0usize), 1 => 1usize..5];
    (
        (shape(6), slice_cache(), source),
        ([pad(), pad()], 0usize..=4, count),
        prop::option::weighted(0.3, (any::<Index>(), any::<Index>())),
        ([0usize..16, 0usize..16], 0usize..=16),
        prop::option::weighted(0.2, slice_mutation()),
        any::<u64>(),
    )
        .prop_map(
            |(
                (shape, cache, source),
                (input_pad, extra_padded, count),
                dup,
                (offsets, slack),
                mutation,
                seed,
            )| SliceCase {
                shape,
                cache,
                source,
                input_pad,
                extra_padded,
                count,
                dup,
                offsets,
                slack,
                mutation,
                seed,
            },
        )
}

fn run_slice_case(c: &SliceCase, x: &Exec) {
    let s = c.shape;
    let (page, ns) = (s.bs, s.num_slots());
    let (layout, region, at) = place_slices(&s, c.cache);
    let ext = layout_bytes(&layout);
    assert_eq!(
        layout.extent("layout"),
        Ok(ext as u64),
        "{c:?}: cache extent"
    );

    // The slices, and the slot mapping they come from (if any).
    let (slices, slots) = match &c.source {
        SliceSource::FromSlots(gens) => {
            let slots = concretize_slots(gens, ns, false);
            let slices = check_slots_to_slices(&slots, page, false).expect("i32 slots");
            (slices, Some(slots))
        }
        SliceSource::Direct { slices, tokens } => (concretize_slices(slices, &s, *tokens), None),
    };
    let tokens = match (&c.source, &slots) {
        (SliceSource::Direct { tokens, .. }, _) => *tokens,
        (_, Some(slots)) => slots.len(),
        _ => unreachable!(),
    };
    let [itp, ihp] = c.input_pad;
    let input = TokenLayout {
        num_tokens: tokens,
        num_heads: s.heads,
        head_dim: s.dim,
        elem_bytes: s.elem,
        head_stride: if s.heads == 1 { s.dim + ihp } else { s.dim },
        token_stride: s.heads * s.dim + itp,
    };
    let in_ext = input_bytes(&input);
    assert_eq!(
        input.extent("input"),
        Ok(in_ext as u64),
        "{c:?}: input extent"
    );
    if let SliceSource::Direct { slices: gens, .. } = &c.source {
        for (g, sl) in gens.iter().zip(&slices) {
            if let SliceGen::Bad(_) = g {
                assert!(!slice_ok(sl, page, ns, tokens), "test bug: {g:?} -> {sl:?}");
            }
        }
    }

    // Table and count.
    let padded = slices.len() + c.extra_padded;
    let table = check_table(&slices, padded).expect("padded >= slices");
    check_table(&slices, padded + 1);
    let (count, count_ok) = match c.count {
        CountGen::All => (slices.len() as i32, true),
        CountGen::Upto(ix) => (ix.index(padded + 1) as i32, true),
        CountGen::Bad(None) => (padded as i32 + 1, false),
        CountGen::Bad(Some(v)) => (v, false),
    };
    let mut listed = slices.clone();
    listed.resize(padded, Slice::default());

    // Host-side validation of the slices the kernel would use, plus an overlapping one.
    if count_ok {
        let used = &listed[..count as usize];
        check_validate_slices(used, page, ns, tokens);
        if let Some((which, pos)) = c.dup {
            let valid: Vec<Slice> = used
                .iter()
                .copied()
                .filter(|s| s.len > 0 && slice_ok(s, page, ns, tokens))
                .collect();
            if !valid.is_empty() {
                let v = valid[which.index(valid.len())];
                let r = (c.seed % v.len as u64) as i32;
                let mut with = used.to_vec();
                let copy = Slice {
                    cache_start: v.cache_start + r,
                    new_kv_start: v.new_kv_start,
                    len: 1,
                };
                with.insert(pos.index(with.len() + 1), copy);
                assert_ne!(
                    expected_slice_check(&with, page, ns, tokens),
                    SliceExpect::Ok,
                    "test bug"
                );
                check_validate_slices(&with, page, ns, tokens);
            }
        }
    }

    // Memory.
    let [io, co] = c.offsets;
    let src_h = guarded(in_ext + c.slack, io, c.seed ^ 0x11);
    let poison = guarded(region, co, c.seed ^ 0x22);
    let mut table_h = vec![0x33u8; 4];
    table_h.extend(bytemuck::cast_slice::<i32, u8>(&table));
    table_h.extend([0x44u8; 4]);
    let mut count_h = count.to_ne_bytes().to_vec();
    count_h.extend([0x55u8; 8]);
    let mut src = x.buf(&src_h, false);
    let mut cache = x.buf(&poison, false);
    let mut table_buf = x.buf(&table_h, false);
    let mut count_buf = x.buf(&count_h, false);
    let base = GUARD + co + at;
    let mut op = SliceUpdate {
        new_kv: src.view(GUARD + io, in_ext + c.slack),
        input,
        cache: cache.view_mut(base, ext + c.slack),
        layout,
        slices: table_buf.view(4, 12 * padded),
        padded,
        num_slices: count_buf.view(0, 4),
        errors: x.errors(),
        value: None,
        value_layout: None,
        quantize: None,
        slot_list: None,
    };
    let reject = c.mutation.and_then(|m| {
        use SliceMutation::*;
        Some(match m {
            CacheShort => {
                op.cache = cache.view_mut(base, ext - 1);
                too_small("cache", ext)
            }
            NewKvShort if in_ext > 0 => {
                op.new_kv = src.view(GUARD + io, in_ext - 1);
                too_small("new_kv", in_ext)
            }
            TableShort if padded > 0 => {
                op.slices = table_buf.view(4, 12 * padded - 1);
                too_small("slices", 12 * padded)
            }
            CountShort => {
                op.num_slices = count_buf.view(0, 3);
                too_small("num_slices", 4)
            }
            TableMisaligned => {
                op.slices = table_buf.view(2, 12 * padded);
                Reject::Invalid("slices")
            }
            CountMisaligned => {
                op.num_slices = count_buf.view(1 + (c.seed % 3) as usize, 4);
                Reject::Invalid("num_slices")
            }
            // A value layout (of another order) without values: the slot list's update refuses
            // it, before the expansion runs.
            ValueLayoutAlone => {
                let mut other = PagedLayout::hnd(s.blocks, s.bs, s.heads, s.dim, s.elem);
                other.token_stride += 1;
                other.head_stride += 1;
                op.value_layout = Some(other);
                Reject::Invalid("value_layout")
            }
            ShapeMismatch => {
                op.input.head_dim += 1;
                Reject::Invalid("input")
            }
            PaddedHuge => {
                op.padded = i32::MAX as usize + 1;
                Reject::Invalid("padded")
            }
            LayoutElem3 => {
                op.layout.elem_bytes = 3;
                Reject::Invalid("layout")
            }
            ZeroHeads => {
                op.input.num_heads = 0;
                Reject::Invalid("input")
            }
            _ => return None,
        })
    });

    x.reset();
    let r = x.update_slices(&op);
    let counts = x.finish();
    let got = cache.read();
    assert_same(&format!("{c:?}: input"), &src.read(), &src_h);
    assert_same(&format!("{c:?}: table"), &table_buf.read(), &table_h);
    if let Some(want) = reject {
        check_reject(&r, &want, &format!("{c:?}"));
        assert_same(&format!("{c:?}: rejected, cache"), &got, &poison);
        if let Some(counts) = counts {
            assert!(counts.is_clean(), "{c:?}: rejected, counted {counts:?}");
        }
        return;
    }
    r.unwrap_or_else(|e| panic!("{c:?}: {e}"));

    let want_counts = if count_ok {
        let bad = listed[..count as usize]
            .iter()
            .filter(|s| s.len != 0 && !slice_ok(s, page, ns, tokens))
            .count() as u32;
        ErrorCounts {
            bad_slices: bad,
            ..ErrorCounts::default()
        }
    } else {
        ErrorCounts {
            bad_counts: 1,
            ..ErrorCounts::default()
        }
    };
    let mut want = poison.clone();
    let rc = reference::update_slices(
        &src_h[GUARD + io..],
        &input,
        &mut want[base..],
        &layout,
        &listed,
        count,
    );
    assert_eq!(rc, want_counts, "{c:?}: reference counts");
    assert_same(&format!("{c:?}: cache"), &got, &want);
    if let Some(counts) = counts {
        assert_eq!(counts, want_counts, "{c:?}: error word");
    }
    if !count_ok {
        assert_same(&format!("{c:?}: bad count, cache"), &got, &poison);
    }
    // Slices planned from a slot mapping write what the slot update writes.
    if let (Some(slots), CountGen::All) = (&slots, c.count) {
        let mut by_slots = poison.clone();
        reference::update_slots(
            &src_h[GUARD + io..],
            None,
            &input,
            &mut by_slots[GUARD + co..],
            at,
            None,
            &layout,
            slots,
        );
        assert_same(&format!("{c:?}: slices vs slots"), &got, &by_slots);
    }
}

// ---------------------------------------------------------------------------------------------
// Block copy
// ---------------------------------------------------------------------------------------------

/// How a pool of blocks is laid out in one allocation.
#[derive(Clone, Copy, Debug, PartialEq)]
enum PoolKind {
    /// Block-major `(NB, L, P, bs, H, D)`, `pad` elements after each block.
    BlockNhd { pad: usize },
    /// Block-major `(NB, H, L, P, bs, D)`, `pad` elements after each block.
    BlockHnd { pad: usize },
    /// Layer-first `(L, P, NB, ...)` with NHD or HND caches, `gap` bytes between caches.
    LayerFirst { hnd: bool, gap: usize },
}

fn pool_kind() -> impl Strategy<Value = PoolKind> {
    let pad = || prop_oneof![3 => Just(0usize), 1 => 1usize..4];
    prop_oneof![
        pad().prop_map(|pad| PoolKind::BlockNhd { pad }),
        pad().prop_map(|pad| PoolKind::BlockHnd { pad }),
        (any::<bool>(), prop_oneof![Just(0usize), 1usize..24])
            .prop_map(|(hnd, gap)| PoolKind::LayerFirst { hnd, gap }),
    ]
}

#[derive(Clone, Copy, Debug)]
struct PoolShape {
    layers: usize,
    parts: usize,
    bs: usize,
    heads: usize,
    dim: usize,
    elem: usize,
}

/// A pool's layout, layer and part strides (bytes) and memory length.
#[derive(Debug)]
struct PoolPlace {
    layout: PagedLayout,
    layer_stride: usize,
    part_stride: usize,
    len: usize,
}

fn place_pool(k: PoolKind, nb: usize, p: &PoolShape) -> PoolPlace {
    let PoolShape {
        layers: l,
        parts: np,
        bs,
        heads: h,
        dim: d,
        elem: e,
    } = *p;
    match k {
        PoolKind::BlockNhd { pad } => {
            let part = bs * h * d;
            let mut layout = PagedLayout::nhd(nb, bs, h, d, e);
            layout.block_stride = l * np * part + pad;
            PoolPlace {
                layout,
                layer_stride: np * part * e,
                part_stride: part * e,
                len: ((nb - 1) * layout.block_stride + l * np * part) * e,
            }
        }
        PoolKind::BlockHnd { pad } => {
            let part = bs * d;
            let layout = PagedLayout {
                num_blocks: nb,
                block_size: bs,
                num_heads: h,
                head_dim: d,
                elem_bytes: e,
                block_stride: h * l * np * part + pad,
                token_stride: d,
                head_stride: l * np * part,
                piece_elems: d,
                piece_stride: d,
            };
            PoolPlace {
                layout,
                layer_stride: np * part * e,
                part_stride: part * e,
                len: ((nb - 1) * layout.block_stride + h * l * np * part) * e,
            }
        }
        PoolKind::LayerFirst { hnd, gap } => {
            let layout = if hnd {
                PagedLayout::hnd(nb, bs, h, d, e)
            } else {
                PagedLayout::nhd(nb, bs, h, d, e)
            };
            let cache = nb * bs * h * d * e;
            let part_stride = cache + gap;
            let layer_stride = np * part_stride + gap;
            PoolPlace {
                layout,
                layer_stride,
                part_stride,
                len: (l - 1) * layer_stride + (np - 1) * part_stride + cache,
            }
        }
    }
}

/// The pool over `mem`: through the cross-layer constructors where they apply (checked
/// against the expected placement), else spelled out.
fn make_pool<M: PoolMemory<'static>>(
    k: PoolKind,
    pl: &PoolPlace,
    p: &PoolShape,
    mem: M,
) -> BlockPool<'static, M::Access> {
    let nb = pl.layout.num_blocks;
    let pool = match k {
        PoolKind::BlockNhd { pad: 0 } if p.parts == 2 => {
            BlockPool::cross_layer_nhd(mem, nb, p.layers, p.bs, p.heads, p.dim, p.elem)
        }
        PoolKind::BlockHnd { pad: 0 } if p.parts == 2 => {
            BlockPool::cross_layer_hnd(mem, nb, p.layers, p.bs, p.heads, p.dim, p.elem)
        }
        _ => {
            return BlockPool::strided(
                mem,
                pl.layer_stride,
                pl.part_stride,
                p.layers,
                p.parts,
                pl.layout,
            )
        }
    };
    let Bases::Strided {
        mem: m,
        layer_stride,
        part_stride,
    } = pool.bases()
    else {
        panic!("{k:?}: constructor gave a table pool");
    };
    assert_eq!(
        (
            m,
            pool.layers,
            pool.parts,
            pool.layout,
            layer_stride,
            part_stride
        ),
        (
            mem.view(),
            p.layers,
            2,
            pl.layout,
            pl.layer_stride,
            pl.part_stride
        ),
        "{k:?}: cross-layer constructor"
    );
    pool
}

/// A strided pool's memory and `(layer, part)` strides.
fn strided<'a, A: Copy>(pool: &BlockPool<'a, A>) -> (DeviceBytes<'a>, usize, usize) {
    match pool.bases() {
        Bases::Strided {
            mem,
            layer_stride,
            part_stride,
        } => (mem, layer_stride, part_stride),
        Bases::Table(_) => unreachable!("block-copy property pools are strided"),
    }
}

#[derive(Clone, Copy, Debug)]
enum PairGen {
    /// Distinct valid destination; valid source (not a destination when memory is shared).
    Valid { src: Index, dst: Index },
    /// A negative id on one side (padding), anything on the other.
    Padding { neg: i64, other: i64, neg_src: bool },
    /// An id past its pool on one side or both (`past` kind per side, `None` = valid).
    Past {
        src: Option<u8>,
        dst: Option<u8>,
        ix: Index,
    },
}

fn pair_gen() -> impl Strategy<Value = PairGen> {
    prop_oneof![
        6 => (any::<Index>(), any::<Index>()).prop_map(|(src, dst)| PairGen::Valid { src, dst }),
        2 => (
            prop_oneof![Just(-1i64), Just(i64::MIN), i64::MIN..0],
            prop_oneof![0i64..8, any::<i64>()],
            any::<bool>(),
        )
            .prop_map(|(neg, other, neg_src)| PairGen::Padding { neg, other, neg_src }),
        1 => (
            prop::option::of(any::<u8>()),
            prop::option::of(any::<u8>()),
            any::<Index>(),
        )
            .prop_map(|(src, dst, ix)| PairGen::Past { src, dst, ix }),
    ]
}

fn past(n: usize, k: u8) -> i64 {
    let n = n as i64;
    match k % 4 {
        0 => n,
        1 => n + 1,
        2 => i64::MAX,
        _ => n + 1000 + k as i64,
    }
}

fn concretize_pairs(gens: &[PairGen], nsrc: usize, ndst: usize, shared: bool) -> Vec<[i64; 2]> {
    let mut free: Vec<i64> = (0..ndst as i64).collect();
    // Shared memory: at most half the blocks are written, so that some are left to read.
    let keep = if shared { ndst - ndst / 2 } else { 0 };
    let mut out: Vec<[i64; 2]> = gens
        .iter()
        .map(|g| match *g {
            PairGen::Valid { dst, .. } if free.len() > keep => {
                [0, free.swap_remove(dst.index(free.len()))]
            }
            PairGen::Valid { .. } => [-1, -1],
            PairGen::Padding {
                neg,
                other,
                neg_src: true,
            } => [neg, other],
            PairGen::Padding { neg, other, .. } => [other, neg],
            PairGen::Past { src, dst, ix } => match (src, dst) {
                (None, None) => [past(nsrc, 0), ix.index(ndst) as i64],
                (Some(s), None) => [past(nsrc, s), ix.index(ndst) as i64],
                (None, Some(d)) => [ix.index(nsrc) as i64, past(ndst, d)],
                (Some(s), Some(d)) => [past(nsrc, s), past(ndst, d)],
            },
        })
        .collect();
    let written: Vec<i64> = gens
        .iter()
        .zip(&out)
        .filter(|(g, p)| matches!(g, PairGen::Valid { .. }) && p[1] >= 0)
        .map(|(_, p)| p[1])
        .collect();
    let readable: Vec<i64> = (0..nsrc as i64)
        .filter(|b| !shared || !written.contains(b))
        .collect();
    for (g, p) in gens.iter().zip(out.iter_mut()) {
        if let (PairGen::Valid { src, .. }, true) = (g, p[1] >= 0) {
            p[0] = if readable.is_empty() {
                -1
            } else {
                readable[src.index(readable.len())]
            };
        }
    }
    out
}

/// What the host check of a host map must say.
#[derive(Debug)]
enum MapExpect {
    Ok,
    Err(Error),
    /// Shared memory: block `block` is written by pair `writer` and read by another pair.
    Conflict {
        block: i64,
        writer: usize,
    },
}

fn expected_host_map(pairs: &[[i64; 2]], nsrc: usize, ndst: usize, shared: bool) -> MapExpect {
    for (at, &[s, d]) in pairs.iter().enumerate() {
        if s < 0 || d < 0 {
            continue;
        }
        let (name, value, limit) = if s >= nsrc as i64 {
            ("map.src", s, nsrc)
        } else if d >= ndst as i64 {
            ("map.dst", d, ndst)
        } else {
            continue;
        };
        return MapExpect::Err(Error::IndexOutOfRange {
            name,
            at,
            value,
            limit: limit as u64,
        });
    }
    let live: Vec<(usize, i64, i64)> = pairs
        .iter()
        .enumerate()
        .filter(|(_, p)| p[0] >= 0 && p[1] >= 0)
        .map(|(i, p)| (i, p[0], p[1]))
        .collect();
    let mut dup: Option<(i64, usize, usize)> = None;
    for (k, &(i, _, d)) in live.iter().enumerate() {
        if dup.is_some_and(|b| b.0 <= d) {
            continue;
        }
        if let Some(&(j, _, _)) = live[k + 1..].iter().find(|p| p.2 == d) {
            dup = Some((d, i, j));
        }
    }
    if let Some((_, first, second)) = dup {
        return MapExpect::Err(Error::Overlap {
            name: "map.dst",
            first,
            second,
        });
    }
    if shared {
        let conflict = live
            .iter()
            .filter(|w| live.iter().any(|r| r.1 == w.2))
            .min_by_key(|w| w.2);
        if let Some(&(writer, _, block)) = conflict {
            return MapExpect::Conflict { block, writer };
        }
    }
    MapExpect::Ok
}

#[derive(Clone, Copy, Debug)]
enum CopyMutation {
    SrcMemShort,
    DstMemShort,
    ShapeMismatch,
    ZeroLayers,
    ZeroParts,
    CollapsedStride,
    MapMisaligned,
    MapShort,
}

#[derive(Clone, Debug)]
struct CopyCase {
    pool: PoolShape,
    src_blocks: usize,
    dst_blocks: usize,
    src: PoolKind,
    dst: PoolKind,
    /// dst is the same memory as src (in-pool copies); dst's kind then follows src's.
    shared: bool,
    device_map: bool,
    /// Host map: keep ids past their pools (else they become padding).
    host_past: bool,
    pairs: Vec<PairGen>,
    /// Host map only: a pair repeating a destination: (pair repeated, position).
    dup: Option<(Index, Index)>,
    /// Shared host map only: a pair reading a written block: (pair, position).
    conflict: Option<(Index, Index)>,
    /// Byte offsets (alignment) of the two pools.
    offsets: [usize; 2],
    slack: usize,
    mutation: Option<CopyMutation>,
    /// GPU mode only: pinned host pools, backend choice, CTA budget.
    src_pinned: bool,
    dst_pinned: bool,
    backend: u8,
    max_ctas: Option<u32>,
    seed: u64,
}

fn copy_case() -> impl Strategy<Value = CopyCase> {
    let shape = (
        1usize..=3,
        1usize..=2,
        page_size(),
        1usize..=3,
        head_dim(),
        elem(),
        1usize..=8,
        1usize..=8,
    )
        .prop_map(|(mut l, p, bs, mut h, mut d, e, mut ns, mut nd)| {
            cap(&mut d, BUDGET, p * bs * h * l);
            cap(&mut h, BUDGET, p * bs * d * l);
            cap(&mut l, BUDGET, p * bs * h * d);
            let per_block = l * p * bs * h * d;
            cap(&mut ns, BUDGET, per_block);
            cap(&mut nd, BUDGET, per_block);
            let shape = PoolShape {
                layers: l,
                parts: p,
                bs,
                heads: h,
                dim: d,
                elem: e,
            };
            (shape, ns, nd)
        });
    let mutation = prop::sample::select(vec![
        CopyMutation::SrcMemShort,
        CopyMutation::DstMemShort,
        CopyMutation::ShapeMismatch,
        CopyMutation::ZeroLayers,
        CopyMutation::ZeroParts,
        CopyMutation::CollapsedStride,
        CopyMutation::MapMisaligned,
        CopyMutation::MapShort,
    ]);
    (
        (shape, pool_kind(), pool_kind(), prop::bool::weighted(0.3)),
        (
            any::<bool>(),
            prop::bool::weighted(0.3),
            prop::collection::vec(pair_gen(), 0..=16),
        ),
        (
            prop::option::weighted(0.25, (any::<Index>(), any::<Index>())),
            prop::option::weighted(0.5, (any::<Index>(), any::<Index>())),
        ),
        ([0usize..16, 0usize..16], 0usize..=16),
        prop::option::weighted(0.2, mutation),
        (any::<bool>(), any::<bool>(), any::<u8>()),
        prop::option::of(1u32..=4),
        any::<u64>(),
    )
        .prop_map(
            |(
                ((pool, ns, nd), src, dst, shared),
                (device_map, host_past, pairs),
                (dup, conflict),
                (offsets, slack),
                mutation,
                (src_pinned, dst_pinned, backend),
                max_ctas,
                seed,
            )| {
                // Shared memory: the same pool, or block-major NHD against HND (same blocks);
                // at least 4 blocks where the budget allows (blocks are read or written).
                let (dst, ns) = if shared {
                    let per_block = pool.layers * pool.parts * pool.bs * pool.heads * pool.dim;
                    let ns = ns.max(4).min((BUDGET / per_block).max(1));
                    let flip = seed & 1 == 1;
                    let d = match src {
                        PoolKind::BlockNhd { pad } if flip => PoolKind::BlockHnd { pad },
                        PoolKind::BlockHnd { pad } if flip => PoolKind::BlockNhd { pad },
                        k => k,
                    };
                    (d, ns)
                } else {
                    (dst, ns)
                };
                let dst_blocks = if shared { ns } else { nd };
                CopyCase {
                    pool,
                    src_blocks: ns,
                    dst_blocks,
                    src,
                    dst,
                    shared,
                    device_map,
                    host_past,
                    pairs,
                    dup,
                    conflict,
                    offsets,
                    slack,
                    mutation,
                    src_pinned,
                    dst_pinned: if shared { src_pinned } else { dst_pinned },
                    backend,
                    max_ctas,
                    seed,
                }
            },
        )
}

fn image(pl: &PoolPlace, p: &PoolShape) -> PoolImage {
    PoolImage {
        layers: p.layers,
        parts: p.parts,
        layout: pl.layout,
        layer_stride: pl.layer_stride,
        part_stride: pl.part_stride,
    }
}

fn run_copy_case(c: &CopyCase, x: &Exec) {
    let p = c.pool;
    let (nsrc, ndst) = (c.src_blocks, c.dst_blocks);
    let sp = place_pool(c.src, nsrc, &p);
    let dp = place_pool(c.dst, ndst, &p);
    for (what, pl) in [("src", &sp), ("dst", &dp)] {
        let ext = layout_bytes(&pl.layout);
        assert_eq!(
            pl.layout.extent(what),
            Ok(ext as u64),
            "{c:?}: {what} extent"
        );
        assert_eq!(
            pl.len,
            (p.layers - 1) * pl.layer_stride + (p.parts - 1) * pl.part_stride + ext,
            "test bug: {what} length"
        );
    }
    if c.shared {
        assert_eq!(sp.len, dp.len, "test bug: shared pools differ in size");
    }

    // The map: distinct valid destinations (never both read and written when shared).
    let mut pairs = concretize_pairs(&c.pairs, nsrc, ndst, c.shared);
    if !c.device_map && !c.host_past {
        for p in pairs
            .iter_mut()
            .filter(|p| p[0] >= nsrc as i64 || p[1] >= ndst as i64)
        {
            p[(c.seed % 2) as usize] = -1;
        }
    }
    let valid: Vec<usize> = (0..pairs.len())
        .filter(|&i| {
            let [s, d] = pairs[i];
            (0..nsrc as i64).contains(&s) && (0..ndst as i64).contains(&d)
        })
        .collect();
    if !c.device_map && !valid.is_empty() {
        let pick = |ix: Index| pairs[valid[ix.index(valid.len())]];
        match (c.shared, c.conflict, c.dup) {
            (true, Some((which, pos)), _) => {
                let [_, d] = pick(which);
                let unwritten =
                    (0..ndst as i64).find(|b| !pairs.iter().any(|p| p[0] >= 0 && p[1] == *b));
                if let Some(u) = unwritten {
                    let at = pos.index(pairs.len() + 1);
                    pairs.insert(at, [d, u]);
                }
            }
            (_, _, Some((which, pos))) => {
                let pair = pick(which);
                let at = pos.index(pairs.len() + 1);
                pairs.insert(at, pair);
            }
            _ => {}
        }
    }
    let expect = if c.device_map {
        MapExpect::Ok
    } else {
        expected_host_map(&pairs, nsrc, ndst, c.shared)
    };

    // Memory.
    let [so, d_o] = c.offsets;
    let src_h = guarded(sp.len, so, c.seed ^ 0x61);
    let dst_h = if c.shared {
        src_h.clone()
    } else {
        guarded(dp.len, d_o, c.seed ^ 0x62)
    };
    let (sbase, dbase) = (GUARD + so, if c.shared { GUARD + so } else { GUARD + d_o });
    let mut src_buf = x.buf(&src_h, c.src_pinned);
    let mut dst_buf = if c.shared {
        None
    } else {
        Some(x.buf(&dst_h, c.dst_pinned))
    };
    let mut map_h = vec![0x77u8; 8];
    map_h.extend(bytemuck::cast_slice::<[i64; 2], u8>(&pairs));
    map_h.extend([0x88u8; 8]);
    let mut map_buf = x.buf(&map_h, false);
    let staging_len = 16 * pairs.len() + 16;
    let mut staging = x.buf(&vec![0u8; staging_len], false);

    let src_mem = src_buf.view(sbase, sp.len + c.slack);
    let dst_mem = match dst_buf.as_mut() {
        Some(b) => b.view_mut(dbase, dp.len + c.slack),
        None => src_buf.view_mut(dbase, dp.len + c.slack),
    };
    let n = pairs.len();
    let device_pairs = map_buf.view(8, 16 * n);
    let (map, backend, staging_view) = if c.device_map {
        let backend = match c.backend % 3 {
            0 => Backend::Auto,
            1 => Backend::Kernel,
            _ => Backend::Tma,
        };
        let map = BlockMap::Device {
            pairs: device_pairs,
            len: n,
        };
        (map, backend, None)
    } else {
        let (backend, staged) = match c.backend % 5 {
            0 => (Backend::Auto, false),
            1 => (Backend::Auto, true),
            2 => (Backend::Dma, false),
            3 => (Backend::Kernel, true),
            _ => (Backend::Tma, c.backend & 8 != 0),
        };
        let stage = staged.then(|| staging.view_mut(0, staging_len));
        (BlockMap::Host(&pairs), backend, stage)
    };
    let mut op = BlockCopy {
        src: make_pool(c.src, &sp, &p, src_mem),
        dst: make_pool(c.dst, &dp, &p, dst_mem),
        map,
        backend,
        max_ctas: c.max_ctas,
        staging: staging_view,
        errors: x.errors(),
    };

    let reject = c.mutation.and_then(|m| {
        Some(match m {
            CopyMutation::SrcMemShort => {
                let (m, ls, ps) = strided(&op.src);
                let short = m.slice(0, sp.len - 1).unwrap();
                op.src = BlockPool::strided(short, ls, ps, p.layers, p.parts, op.src.layout);
                too_small("src", sp.len)
            }
            CopyMutation::DstMemShort => {
                let (m, ls, ps) = strided(&op.dst);
                // SAFETY: a shorter view of the same memory (validation must refuse it).
                let short = unsafe { DeviceBytesMut::from_raw(m.ptr(), dp.len - 1) };
                op.dst = BlockPool::strided(short, ls, ps, p.layers, p.parts, op.dst.layout);
                too_small("dst", dp.len)
            }
            CopyMutation::ShapeMismatch => {
                let d = &mut op.dst;
                if d.layers > 1 {
                    d.layers -= 1;
                } else if d.parts > 1 {
                    d.parts -= 1;
                } else if d.layout.block_size > 1 {
                    d.layout.block_size -= 1;
                } else if d.layout.num_heads > 1 {
                    d.layout.num_heads -= 1;
                } else if d.layout.head_dim > 1 {
                    d.layout.head_dim -= 1;
                } else {
                    return None;
                }
                Reject::Invalid("dst")
            }
            CopyMutation::ZeroLayers => {
                op.src.layers = 0;
                Reject::Invalid("src")
            }
            CopyMutation::ZeroParts => {
                op.src.parts = 0;
                Reject::Invalid("src")
            }
            CopyMutation::CollapsedStride => {
                let (m, mut ls, mut ps) = strided(&op.src);
                if p.parts > 1 {
                    ps = 0;
                } else if p.layers > 1 {
                    ls = 0;
                } else {
                    return None;
                }
                op.src = BlockPool::strided(m, ls, ps, p.layers, p.parts, op.src.layout);
                Reject::Invalid("src")
            }
            CopyMutation::MapMisaligned if c.device_map => {
                op.map = BlockMap::Device {
                    pairs: map_buf.view(12, 16 * n),
                    len: n,
                };
                Reject::Invalid("map.pairs")
            }
            CopyMutation::MapShort if c.device_map && n > 0 => {
                op.map = BlockMap::Device {
                    pairs: map_buf.view(8, 16 * n - 1),
                    len: n,
                };
                too_small("map.pairs", 16 * n)
            }
            _ => return None,
        })
    });
    let reject = reject.or(match &expect {
        MapExpect::Err(e) => Some(Reject::Exact(e.clone())),
        _ => None,
    });

    x.reset();
    let r = x.copy_blocks(&op);
    let counts = x.finish();
    let got_src = src_buf.read();
    let got_dst = dst_buf.as_ref().map(Buf::read);
    assert_same(&format!("{c:?}: map"), &map_buf.read(), &map_h);
    let what = format!("{c:?} pairs={pairs:?}");
    let unchanged = |msg: &str| {
        assert_same(&format!("{what}: {msg}, src"), &got_src, &src_h);
        if let Some(d) = &got_dst {
            assert_same(&format!("{what}: {msg}, dst"), d, &dst_h);
        }
        if let Some(counts) = counts {
            assert!(counts.is_clean(), "{what}: {msg}, counted {counts:?}");
        }
    };
    if let Some(want) = reject {
        check_reject(&r, &want, &what);
        unchanged("rejected");
        return;
    }
    if let MapExpect::Conflict { block, writer } = expect {
        match &r {
            Err(Error::Overlap {
                name: "map",
                first,
                second,
            }) => assert!(
                *second == writer && pairs[*first][0] == block && pairs[*first][1] >= 0,
                "{what}: reported pairs {first} and {second}; \
                 want a reader of block {block} and pair {writer}"
            ),
            _ => panic!("{what}: got {r:?}, want a map overlap on block {block}"),
        }
        unchanged("rejected");
        return;
    }
    r.unwrap_or_else(|e| panic!("{what}: {e}"));

    let bad = pairs
        .iter()
        .filter(|&&[s, d]| s >= 0 && d >= 0 && (s >= nsrc as i64 || d >= ndst as i64))
        .count() as u32;
    let want_counts = ErrorCounts {
        bad_blocks: bad,
        ..ErrorCounts::default()
    };
    let (si, di) = (image(&sp, &p), image(&dp, &p));
    let mut want = dst_h.clone();
    let rc = reference::copy_blocks(&si, &src_h[sbase..], &di, &mut want[dbase..], &pairs);
    assert_eq!(rc, want_counts, "{what}: reference counts");
    match &got_dst {
        Some(d) => {
            assert_same(&format!("{what}: dst"), d, &want);
            assert_same(&format!("{what}: src"), &got_src, &src_h);
        }
        None => assert_same(&format!("{what}: pool"), &got_src, &want),
    }
    if let Some(counts) = counts {
        let want = if c.device_map {
            want_counts
        } else {
            ErrorCounts::default()
        };
        assert_eq!(counts, want, "{what}: error word");
    }
}

// ---------------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(cpu_config())]

    #[test]
    fn slot_update_emulated_matches_reference(c in slot_case()) {
        run_slot_case(&c, &Exec::cpu());
    }

    #[test]
    fn slice_update_emulated_matches_reference(c in slice_case()) {
        run_slice_case(&c, &Exec::cpu());
    }

    #[test]
    fn block_copy_emulated_matches_reference(c in copy_case()) {
        run_copy_case(&c, &Exec::cpu());
    }
}

/// Runs the cases of `strategy` through `run` on the GPU (skips without one).
fn run_on_gpu<S: Strategy>(test: &str, strategy: S, run: fn(&S::Value, &Exec)) {
    let Some((g, mut runner)) = gpu_mode(test) else {
        return;
    };
    let x = Exec::gpu(g);
    runner
        .run(&strategy, |c| {
            run(&c, &x);
            Ok(())
        })
        .unwrap();
}

#[test]
fn gpu_slot_update_matches_reference() {
    run_on_gpu(
        "gpu_slot_update_matches_reference",
        slot_case(),
        run_slot_case,
    );
}

#[test]
fn gpu_slice_update_matches_reference() {
    run_on_gpu(
        "gpu_slice_update_matches_reference",
        slice_case(),
        run_slice_case,
    );
}

#[test]
fn gpu_block_copy_matches_reference() {
    run_on_gpu(
        "gpu_block_copy_matches_reference",
        copy_case(),
        run_copy_case,
    );
}
