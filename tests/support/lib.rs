//! Helpers shared by kvio's tests and benches: the GPU gate, random data, poisoning,
//! device buffers on a stream, CUDA-graph capture, block pools under test.
//!
//! GPU tests call [`gpu`] first. Without a usable GPU it prints why the test is skipped and
//! returns `None`, unless `KVIO_REQUIRE_GPU=1`, in which case it panics: a GPU run can never
//! pass by skipping.

use std::sync::OnceLock;

use cust::memory::{CopyDestination, DeviceBuffer, DeviceCopy};
use cust::sys as cu;
use kvio::reference::PoolImage;
use kvio::Stream;
use kvio::{
    BlockPool, DeviceBytes, DeviceBytesMut, Kvio, LayerTable, PagedLayout, PoolMemory,
    PrimaryContext, StreamRef, TokenLayout, Writable,
};

/// The device, kvio loaded on it, and the context made current on the calling thread.
pub struct Gpu {
    ctx: PrimaryContext,
    /// kvio's kernels.
    pub kv: Kvio,
}

// SAFETY: PrimaryContext and Kvio are Send + Sync (documented in kvio).
unsafe impl Sync for Gpu {}

impl Gpu {
    /// A new non-blocking stream (kvio must not rely on legacy-stream synchronisation).
    pub fn stream(&self) -> Stream {
        self.ctx.make_current().expect("cuCtxSetCurrent");
        Stream::new().expect("cuStreamCreate")
    }
}

static GPU: OnceLock<Result<Gpu, String>> = OnceLock::new();

/// Whether this run demands a GPU (`KVIO_REQUIRE_GPU=1`).
pub fn gpu_required() -> bool {
    std::env::var("KVIO_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The GPU, or `None` (after printing why `test` is skipped). Panics when no GPU is usable and
/// `KVIO_REQUIRE_GPU=1`.
pub fn gpu(test: &str) -> Option<&'static Gpu> {
    let g = GPU.get_or_init(|| {
        let ctx = PrimaryContext::retain(0).map_err(|e| format!("no usable CUDA device: {e}"))?;
        // KVIO_TEST_ARCH=sm80 runs the sm_80 PTX on a newer GPU (its software fp8 path, ...).
        let kv = match std::env::var("KVIO_TEST_ARCH").as_deref() {
            Ok("sm80") => Kvio::load_arch(kvio::Arch::Sm80),
            Ok("sm90") => Kvio::load_arch(kvio::Arch::Sm90),
            Ok(other) => panic!("KVIO_TEST_ARCH={other}: expected sm80 or sm90"),
            Err(_) => Kvio::load(),
        }
        .map_err(|e| format!("loading kvio failed: {e}"))?;
        Ok(Gpu { ctx, kv })
    });
    match g {
        Ok(g) => {
            g.ctx.make_current().expect("cuCtxSetCurrent");
            Some(g)
        }
        Err(why) if gpu_required() => panic!("{test}: KVIO_REQUIRE_GPU=1 but {why}"),
        Err(why) => {
            skipped(test, why);
            None
        }
    }
}

/// The number in the environment variable `name`, or `default` when it is unset. Panics when
/// it is set to something else than a number.
pub fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// Folder where skipped tests are noted: beside the test executables (`target/<profile>/`),
/// read and emptied by `tests/zz_skipped.rs`, which `cargo test` runs after the other test
/// executables.
pub fn skip_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("the executable's folder");
    deps.parent().unwrap_or(deps).join("kvio-skipped")
}

/// Prints that `test` is skipped and why, and notes it for the summary at the end of
/// `cargo test` (`tests/zz_skipped.rs`).
pub fn skipped(test: &str, why: &str) {
    use std::io::Write;
    eprintln!("{test}: skipped: {why}");
    let dir = skip_dir();
    let note = std::fs::create_dir_all(&dir).and_then(|()| {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{}.txt", std::process::id())))?;
        // libtest names each test's thread after the test: one note per test, however many
        // times it asks. One short write per line: appends from parallel tests do not
        // interleave.
        let name = std::thread::current().name().unwrap_or(test).to_string();
        f.write_all(format!("{name}\t{why}\n").as_bytes())
    });
    if let Err(e) = note {
        eprintln!("{test}: could not note the skip in {}: {e}", dir.display());
    }
}

/// Cases per property test: `PROPTEST_CASES` when set, else `default`.
pub fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Deterministic random bytes (xorshift), never all zero.
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}

/// A small deterministic random generator for indices.
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// Shuffles a slice (Fisher–Yates).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// A prefill batch's sequences of `t` tokens in all, as `(offset in the first page, tokens)`:
/// lengths uniform in `1..=max_len` (the last cut to fill `t`), each starting at the first
/// slot of its first page or (`chunked`: a chunked prefill's continuation) at a random one of
/// the `bs`.
pub fn batch_sequences(
    rng: &mut Rng,
    t: usize,
    max_len: usize,
    bs: usize,
    chunked: bool,
) -> Vec<(usize, usize)> {
    let mut seqs = vec![];
    let mut left = t;
    while left > 0 {
        let len = (1 + rng.below(max_len as u64) as usize).min(left);
        let off = if chunked {
            rng.below(bs as u64) as usize
        } else {
            0
        };
        seqs.push((off, len));
        left -= len;
    }
    seqs
}

/// Pages of `bs` slots the sequences of [`batch_sequences`] take, each its own.
pub fn batch_pages(seqs: &[(usize, usize)], bs: usize) -> usize {
    seqs.iter()
        .map(|&(off, len)| (off + len).div_ceil(bs))
        .sum()
}

/// The slot mapping of the sequences of [`batch_sequences`], each on the next of `pages`.
pub fn batch_slots(
    seqs: &[(usize, usize)],
    bs: usize,
    pages: impl IntoIterator<Item = i64>,
) -> Vec<i64> {
    let mut pages = pages.into_iter();
    let mut slots = Vec::new();
    for &(off, len) in seqs {
        let mine: Vec<i64> = pages.by_ref().take((off + len).div_ceil(bs)).collect();
        slots.extend((off..off + len).map(|i| mine[i / bs] * bs as i64 + (i % bs) as i64));
    }
    slots
}

/// `n` random block-copy pairs (`n <= dst_blocks`): distinct destinations, random sources,
/// one pair in `pad_one_in` (on average) padding `[-1, -1]`.
pub fn random_pairs(
    n: usize,
    src_blocks: usize,
    dst_blocks: usize,
    pad_one_in: u64,
    rng: &mut Rng,
) -> Vec<[i64; 2]> {
    let mut dsts: Vec<i64> = (0..dst_blocks as i64).collect();
    rng.shuffle(&mut dsts);
    (0..n)
        .map(|i| {
            if rng.below(pad_one_in) == 0 {
                [-1, -1]
            } else {
                [rng.below(src_blocks as u64) as i64, dsts[i]]
            }
        })
        .collect()
}

/// Waits until the synchronous host-to-device copies issued so far (`DeviceBuffer::from_slice`,
/// `copy_from`, `cuMemcpyHtoD`) have landed. From pageable memory they return once the data is
/// staged, and the DMA itself runs on the legacy default stream, which the tests'
/// non-blocking streams do not wait for.
pub fn settle() {
    // SAFETY: the null stream is the legacy default stream of the current context.
    ok("cuStreamSynchronize(legacy)", unsafe {
        cu::cuStreamSynchronize(std::ptr::null_mut())
    });
}

/// Uploads `data` (synchronously, landed before this returns; done before the work under test
/// is queued).
pub fn upload<T: DeviceCopy>(data: &[T]) -> DeviceBuffer<T> {
    let buf = DeviceBuffer::from_slice(data).expect("upload");
    settle();
    buf
}

/// Overwrites a device buffer with `data` after synchronising `stream`.
pub fn overwrite<T: DeviceCopy>(buf: &mut DeviceBuffer<T>, data: &[T], stream: &Stream) {
    stream.synchronize().expect("sync");
    buf.copy_from(data).expect("overwrite");
    settle();
}

/// Waits for `stream`, then downloads `buf`.
pub fn download<T: DeviceCopy + Default + Clone>(buf: &DeviceBuffer<T>, stream: &Stream) -> Vec<T> {
    stream
        .synchronize()
        .expect("cuStreamSynchronize (a kernel fault shows here)");
    let mut v = vec![T::default(); buf.len()];
    buf.copy_to(&mut v[..]).expect("download");
    v
}

/// Index of the first differing byte, for assertion messages.
pub fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or(if a.len() != b.len() {
            Some(a.len().min(b.len()))
        } else {
            None
        })
}

/// Asserts two byte buffers are identical, naming the first difference.
#[track_caller]
pub fn assert_same(what: &str, got: &[u8], want: &[u8]) {
    if let Some(i) = first_diff(got, want) {
        panic!(
            "{what}: first difference at byte {i} of {}: got {:?}, want {:?}",
            want.len(),
            got.get(i),
            want.get(i)
        );
    }
}

/// Tries of [`Graph::retrying`] when another thread invalidates its capture.
pub const CAPTURE_TRIES: u32 = 3;

/// A captured CUDA graph, instantiated and ready to replay.
pub struct Graph {
    graph: cu::CUgraph,
    exec: cu::CUgraphExec,
}

fn ok(call: &str, r: cu::CUresult) {
    assert_eq!(r, cu::CUresult::CUDA_SUCCESS, "{call} failed");
}

impl Graph {
    /// Captures what `body` enqueues on `stream` into a graph (once: see [`Graph::retrying`]
    /// for a capture that other threads may invalidate).
    pub fn capture(stream: &Stream, body: impl FnOnce(StreamRef<'_>)) -> Graph {
        let mut body = Some(body);
        Self::capture_tries(stream, 1, |s| {
            (body.take().expect("one try"))(s);
            Ok(())
        })
    }

    /// Captures what `body` enqueues on `stream` into a graph.
    ///
    /// CUDA invalidates a capture when another thread synchronizes the same device (the tests
    /// of one binary run in parallel threads; a buffer's `cuMemFree` may synchronize). A
    /// capture invalidated that way (`body` failing with, or the capture ending in,
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`) is ended and taken again, up to
    /// [`CAPTURE_TRIES`] times, each retry reported on stderr; any other failure panics, and so
    /// does an invalidation on every try.
    pub fn retrying(stream: &Stream, body: impl FnMut(StreamRef<'_>) -> kvio::Result<()>) -> Graph {
        Self::capture_tries(stream, CAPTURE_TRIES, body)
    }

    fn capture_tries(
        stream: &Stream,
        tries: u32,
        mut body: impl FnMut(StreamRef<'_>) -> kvio::Result<()>,
    ) -> Graph {
        let raw = stream.cu_stream();
        let invalidated = cu::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        for attempt in 1..=tries {
            // SAFETY: valid stream; capture mode relaxed so other threads' tests are unaffected.
            unsafe {
                ok(
                    "cuStreamBeginCapture",
                    cu::cuStreamBeginCapture_v2(
                        raw,
                        cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
                    ),
                )
            };
            let enqueued = body(StreamRef::from(stream));
            let mut graph = std::ptr::null_mut();
            // SAFETY: ends the capture begun above (also an invalidated one, which must be
            // ended to leave capture mode); out-pointer to a local.
            let ended = unsafe { cu::cuStreamEndCapture(raw, &mut graph) };
            let from_outside = ended == invalidated
                || matches!(enqueued, Err(kvio::Error::Driver { code, .. }) if code == invalidated as u32);
            if from_outside && attempt < tries {
                eprintln!(
                    "Graph::retrying: capture invalidated ({enqueued:?}, end: {ended:?}); try {} of {tries}",
                    attempt + 1
                );
                if !graph.is_null() {
                    // SAFETY: the graph the failed capture returned, not used again.
                    unsafe { ok("cuGraphDestroy", cu::cuGraphDestroy(graph)) };
                }
                continue;
            }
            enqueued.expect("enqueueing inside the capture");
            ok("cuStreamEndCapture", ended);
            let mut exec = std::ptr::null_mut();
            // SAFETY: a graph the capture returned; out-pointer to a local.
            unsafe {
                ok(
                    "cuGraphInstantiateWithFlags",
                    cu::cuGraphInstantiateWithFlags(&mut exec, graph, 0),
                );
            }
            return Graph { graph, exec };
        }
        unreachable!("the last try returns or panics")
    }

    /// The captured (not instantiated) graph, for queries of its nodes and edges.
    pub fn raw(&self) -> cu::CUgraph {
        self.graph
    }

    /// Enqueues one replay on `stream`.
    pub fn launch(&self, stream: &Stream) {
        // SAFETY: instantiated graph, valid stream.
        unsafe {
            ok(
                "cuGraphLaunch",
                cu::cuGraphLaunch(self.exec, stream.cu_stream()),
            )
        };
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: handles created in `capture`.
        unsafe {
            cu::cuGraphExecDestroy(self.exec);
            cu::cuGraphDestroy(self.graph);
        }
    }
}

/// A test allocation on the device, in pinned host memory or in plain host memory, with
/// synchronous fill/read.
pub enum Mem {
    /// Device memory.
    Dev(kvio::DeviceAlloc),
    /// Pinned, mapped host memory.
    Host(kvio::PinnedHost),
    /// Pageable host memory (no CUDA needed): for the CPU emulation and NIXL's DRAM. Cells, so
    /// that the write view ([`Mem::bytes_mut`], taken through a shared borrow) may be written
    /// through; [`Mem::plain`] makes one.
    Plain(PlainBytes),
}

/// The bytes of a [`Mem::Plain`]: cells, written through raw views as the other kinds are.
pub struct PlainBytes(Box<[std::cell::Cell<u8>]>);

// SAFETY: as for the device and pinned kinds (shared between test threads through raw views):
// the tests write through views only while no thread reads or fills, and synchronise before
// [`Mem::read`] or [`Mem::fill`].
unsafe impl Sync for PlainBytes {}

impl Mem {
    /// `data` in pageable host memory ([`Mem::Plain`]).
    pub fn plain(data: Vec<u8>) -> Mem {
        Mem::Plain(PlainBytes(
            data.into_iter().map(std::cell::Cell::new).collect(),
        ))
    }

    /// Allocates `len` bytes on the host (pinned) or the device.
    pub fn new(on_host: bool, len: usize) -> Mem {
        if on_host {
            Mem::Host(kvio::PinnedHost::alloc(len).expect("cuMemHostAlloc"))
        } else {
            Mem::Dev(kvio::DeviceAlloc::new(len).expect("cuMemAlloc"))
        }
    }
    /// The device-side view for calls that read it.
    pub fn bytes(&self) -> DeviceBytes<'_> {
        match self {
            Mem::Dev(d) => d.bytes(),
            Mem::Host(h) => h.bytes(),
            // SAFETY: the cells live while `self` is borrowed (a `Cell<u8>` is a byte).
            Mem::Plain(v) => unsafe { DeviceBytes::from_raw(v.0.as_ptr() as u64, v.0.len()) },
        }
    }

    /// A write view through a shared borrow, for tests that share one pool between streams
    /// and threads (what a framework does through [`DeviceBytesMut::from_raw`]). The tests
    /// synchronise the streams that write it before [`Mem::read`].
    pub fn bytes_mut(&self) -> DeviceBytesMut<'_> {
        let b = self.bytes();
        // SAFETY: the allocation lives while `self` is borrowed (its drop waits for the
        // context); host access goes through `fill`/`read`, after the tests synchronise.
        unsafe { DeviceBytesMut::from_raw(b.ptr(), b.len()) }
    }
    /// Whether it lives on the host.
    pub fn on_host(&self) -> bool {
        matches!(self, Mem::Host(_) | Mem::Plain(_))
    }
    /// Overwrites the whole allocation (call with no work in flight on it).
    pub fn fill(&mut self, data: &[u8]) {
        match self {
            Mem::Dev(d) => {
                assert_eq!(data.len(), d.bytes().len());
                // SAFETY: sizes match; synchronous copy.
                ok("cuMemcpyHtoD", unsafe {
                    cu::cuMemcpyHtoD_v2(d.bytes().ptr(), data.as_ptr().cast(), data.len())
                });
                settle();
            }
            Mem::Host(h) => h.as_mut_slice().expect("wait").copy_from_slice(data),
            Mem::Plain(v) => {
                assert_eq!(data.len(), v.0.len());
                v.0.iter().zip(data).for_each(|(c, &d)| c.set(d));
            }
        }
    }
    /// Reads the whole allocation (synchronise the streams that write it first).
    pub fn read(&self) -> Vec<u8> {
        match self {
            Mem::Dev(d) => {
                let mut v = vec![0u8; d.bytes().len()];
                // SAFETY: sizes match; synchronous copy.
                ok("cuMemcpyDtoH", unsafe {
                    cu::cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), d.bytes().ptr(), v.len())
                });
                v
            }
            Mem::Host(h) => h.as_slice().expect("wait").to_vec(),
            Mem::Plain(v) => v.0.iter().map(std::cell::Cell::get).collect(),
        }
    }
}

/// Block-pool layouts of the GPU block-copy tests.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// Layer-separate NHD caches through a pointer table.
    SepNhd,
    /// Layer-separate HND caches through a pointer table.
    SepHnd,
    /// Cross-layer `(NB, L, 2, bs, H, D)` (vLLM).
    CrossNhd,
    /// Cross-layer `(NB, H, L, 2, bs, D)`.
    CrossHnd,
    /// Layer-first, parts outer `(2, L, NB, bs, H, D)` (SGLang's host pool).
    LayerFirst,
}

/// The four kinds the block tests iterate over (the layer-separate and cross-layer ones).
pub const KINDS: [Kind; 4] = [Kind::SepNhd, Kind::SepHnd, Kind::CrossNhd, Kind::CrossHnd];

impl Kind {
    /// Whether pools of this kind go through a [`LayerTable`].
    pub fn has_table(self) -> bool {
        matches!(self, Kind::SepNhd | Kind::SepHnd)
    }
}

/// The shape of a block pool: blocks, layers (each with K and V) and one block's geometry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Blocks.
    pub blocks: usize,
    /// Layers.
    pub layers: usize,
    /// Tokens per block.
    pub bs: usize,
    /// Heads.
    pub heads: usize,
    /// Elements per head.
    pub dim: usize,
    /// Bytes per element.
    pub elem: usize,
}

impl Shape {
    /// Bytes of one layer/part cache (every block).
    pub fn part_bytes(&self) -> usize {
        self.blocks * self.bs * self.heads * self.dim * self.elem
    }

    /// Bytes of a whole pool (every layer, K and V).
    pub fn bytes(&self) -> usize {
        self.part_bytes() * 2 * self.layers
    }

    /// The strided pool of `kind` over `mem` ([`Shape::bytes`] long). Panics for the
    /// layer-separate kinds (they need a table: see [`Shape::table_pool`]).
    pub fn pool<'a, M: PoolMemory<'a>>(&self, kind: Kind, mem: M) -> BlockPool<'a, M::Access> {
        let Shape {
            blocks,
            layers,
            bs,
            heads,
            dim,
            elem,
        } = *self;
        match kind {
            Kind::CrossNhd => BlockPool::cross_layer_nhd(mem, blocks, layers, bs, heads, dim, elem),
            Kind::CrossHnd => BlockPool::cross_layer_hnd(mem, blocks, layers, bs, heads, dim, elem),
            Kind::LayerFirst => {
                let cache = self.part_bytes();
                let layout = PagedLayout::nhd(blocks, bs, heads, dim, elem);
                BlockPool::strided(mem, cache, layers * cache, layers, 2, layout)
            }
            Kind::SepNhd | Kind::SepHnd => panic!("{kind:?} pools need a layer table"),
        }
    }

    /// The layer-separate pool of `kind` (`SepNhd` or `SepHnd`) through `table`.
    pub fn table_pool<'a>(&self, kind: Kind, table: &'a LayerTable<'a>) -> BlockPool<'a, Writable> {
        let Shape {
            blocks,
            bs,
            heads,
            dim,
            elem,
            ..
        } = *self;
        let layout = match kind {
            Kind::SepNhd => PagedLayout::nhd(blocks, bs, heads, dim, elem),
            Kind::SepHnd => PagedLayout::hnd(blocks, bs, heads, dim, elem),
            _ => panic!("{kind:?} pools are strided"),
        };
        BlockPool::layer_separate(table, layout)
    }

    /// The host image of [`Shape::pool`] for `kvio::reference` (strided kinds only).
    pub fn image(&self, kind: Kind) -> PoolImage {
        // SAFETY: a description only, never dereferenced: only the strides are read.
        let mem = unsafe { DeviceBytes::from_raw(0, self.bytes()) };
        PoolImage::of(&self.pool(kind, mem)).expect("strided pools have an image")
    }
}

/// A pool under test: its memory (device or pinned host), its table (layer-separate kinds,
/// the `2 * layers` caches one after another in the memory) and its shape.
pub struct TestPool {
    /// Views of `mem` (declared first: dropped before it).
    table: Option<LayerTable<'static>>,
    /// The pool's memory.
    pub mem: Mem,
    /// Its layout.
    pub kind: Kind,
    /// Its shape.
    pub s: Shape,
}

impl TestPool {
    /// Allocates a pool of `kind` and shape `s` on the host (pinned) or the device; its
    /// contents are undefined.
    pub fn new(kind: Kind, on_host: bool, s: Shape) -> TestPool {
        let part = s.part_bytes();
        let mem = Mem::new(on_host, s.bytes());
        let table = kind.has_table().then(|| {
            let whole = mem.bytes();
            let views: Vec<DeviceBytesMut<'static>> = (0..2 * s.layers)
                .map(|i| {
                    let v = whole.slice(i * part, part).unwrap();
                    // SAFETY: `mem` moves into the same TestPool, which drops the table first;
                    // tests read the pool from the host only after synchronising.
                    unsafe { DeviceBytesMut::from_raw(v.ptr(), v.len()) }
                })
                .collect();
            LayerTable::new(&views, 2).expect("layer table")
        });
        TestPool {
            mem,
            table,
            kind,
            s,
        }
    }

    /// [`TestPool::new`], filled with [`random_bytes`] of `seed` (returned, for the model).
    pub fn random(kind: Kind, on_host: bool, s: Shape, seed: u64) -> (TestPool, Vec<u8>) {
        let mut pool = TestPool::new(kind, on_host, s);
        let init = random_bytes(s.bytes(), seed);
        pool.mem.fill(&init);
        (pool, init)
    }

    /// The pool as kvio sees it (writable: a copy's source or destination).
    pub fn pool(&self) -> BlockPool<'_, Writable> {
        self.view(self.kind)
    }

    /// The pool's memory described as `kind` (a table kind needs a pool made with a table).
    pub fn view(&self, kind: Kind) -> BlockPool<'_, Writable> {
        if kind.has_table() {
            self.s
                .table_pool(kind, self.table.as_ref().expect("table pool"))
        } else {
            self.s.pool(kind, self.mem.bytes_mut())
        }
    }

    /// The same pool as a host image for `kvio::reference`.
    pub fn image(&self) -> PoolImage {
        PoolImage::of(&self.pool()).expect("test pools are evenly spaced")
    }
}

/// Source elements of `n / row` tokens of `row` elements covering every class, in groups of
/// sixteen tokens (the pages the v0 prefill converts together, two of them on larger pages;
/// two of the tiles of eight tokens it converts elsewhere) in three regimes, by the group's
/// index modulo 8:
/// - 0, 2, 4: random bit patterns (NaN, ±inf, zeros, subnormals, huge and tiny values all
///   occur) and, for f32, values spread over the fp8 ranges with specials every 16;
/// - 1, 5: ordinary normal values (|x| from 2^-22 to 2^22, or f16's normal range), one in 64
///   a signed zero or one of the source's smallest magnitudes (far below 2^-80 for bf16 and
///   f32, subnormal or the smallest normal for f16), one in 64 drawn as in the first regime:
///   whole rows and tiles take the division's fast path, zeros and tiny values included, and
///   now and then a single special value sends one elsewhere;
/// - 3, 6, 7: the same without the values of the first regime, so that whole items of
///   sixteen tokens (3, 6, 7) and of 32 (6 and 7) of many heads take the fast path too.
///
/// A case of fewer than seventeen tokens is all of the first regime.
pub fn quantize_source(n: usize, row: usize, src: kvio::SrcType, rng: &mut Rng) -> Vec<u8> {
    use kvio::SrcType;
    let mut out = Vec::with_capacity(n * src.bytes());
    for i in 0..n {
        let r = rng.next_u64();
        let group = i / row.max(1) / 16 % 8;
        let clean = matches!(group, 3 | 6 | 7);
        let ordinary = clean || (matches!(group, 1 | 5) && !r.is_multiple_of(64));
        let sign = ((r >> 40) & 1) as u32;
        if ordinary && r % 64 == 1 {
            // A signed zero or one of the smallest magnitudes.
            let tiny = if (r >> 8) & 1 == 0 {
                0
            } else {
                (r >> 16) as u32
            };
            match src {
                SrcType::Bf16 | SrcType::F16 => {
                    out.extend(((sign << 15 | (tiny & 0x7ff)) as u16).to_le_bytes())
                }
                SrcType::F32 => out.extend((sign << 31 | (tiny & 0xff_ffff)).to_le_bytes()),
            }
            continue;
        }
        match src {
            SrcType::Bf16 if ordinary => {
                let e = ((r >> 8) % 45) as u32 + 127 - 22;
                let bits = sign << 15 | e << 7 | ((r >> 16) & 0x7f) as u32;
                out.extend((bits as u16).to_le_bytes());
            }
            SrcType::F16 if ordinary => {
                let e = ((r >> 8) % 30) as u32 + 1;
                let bits = sign << 15 | e << 10 | ((r >> 16) & 0x3ff) as u32;
                out.extend((bits as u16).to_le_bytes());
            }
            SrcType::Bf16 | SrcType::F16 => out.extend((r as u16).to_le_bytes()),
            SrcType::F32 => {
                let x = match (i % 16, r % 4) {
                    _ if ordinary => ordinary_f32(r),
                    (0, _) => [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY]
                        [(r >> 8) as usize % 4],
                    (1, _) => [0.0, -0.0, 1e-40, -1e-45, 448.0, 464.0, 57344.0, 61440.0]
                        [(r >> 8) as usize % 8],
                    (_, 0) => f32::from_bits(r as u32),
                    _ => ordinary_f32(r),
                };
                out.extend(x.to_le_bytes());
            }
        }
    }
    out
}

/// A normal f32 of magnitude from 2^-22 up to (not including) 2^22, from the bits of `r`.
fn ordinary_f32(r: u64) -> f32 {
    let e = ((r >> 8) % 44) as i32 - 22;
    let m = 1.0 + ((r >> 16) % 4096) as f32 / 4096.0;
    if r & (1 << 40) != 0 {
        -m * 2f32.powi(e)
    } else {
        m * 2f32.powi(e)
    }
}

/// A host view of a vector's bytes, for the CPU emulation (which reads and writes host memory).
pub fn host_view<T>(v: &[T]) -> DeviceBytes<'_> {
    // SAFETY: the vector outlives the (synchronous) emulated call it is passed to.
    unsafe { DeviceBytes::from_raw(v.as_ptr() as u64, std::mem::size_of_val(v)) }
}

/// The host data of one slot-update test case: what the fp8 and v0 tests share their runners
/// ([`emulate_slot_cases`], [`gpu_slot_cases`]) through.
pub struct SlotData {
    /// Names the case in failures.
    pub name: String,
    /// The new rows' layout.
    pub input: TokenLayout,
    /// New keys (bytes).
    pub keys: Vec<u8>,
    /// New values (bytes).
    pub values: Vec<u8>,
    /// K's scales (empty when the case does not quantize).
    pub scales_k: Vec<f32>,
    /// V's scales (empty when the case does not quantize).
    pub scales_v: Vec<f32>,
    /// Slot per token.
    pub slots: Vec<i64>,
    /// Both caches, K then V, poisoned.
    pub poison: Vec<u8>,
    /// Slots past the cache (the error word's expected count).
    pub bad_slots: u32,
    /// The slot mapping is passed as i32 (else i64).
    pub slots_i32: bool,
}

impl SlotData {
    /// The slots as i32 (each must fit).
    pub fn slots32(&self) -> Vec<i32> {
        self.slots
            .iter()
            .map(|&s| i32::try_from(s).expect("i32 slot"))
            .collect()
    }

    /// The slot mapping's bytes as passed: i32 or i64 per slot, little-endian.
    pub fn slot_bytes(&self) -> Vec<u8> {
        if self.slots_i32 {
            self.slots32()
                .iter()
                .flat_map(|s| s.to_le_bytes())
                .collect()
        } else {
            self.slots.iter().flat_map(|s| s.to_le_bytes()).collect()
        }
    }
}

/// A slot-update test case: its data, its update over given views, and the caches the
/// reference computes.
pub trait SlotCase {
    /// The case's host data.
    fn data(&self) -> &SlotData;
    /// The update over these views (`caches`: K then V).
    fn op<'a>(
        &self,
        keys: DeviceBytes<'a>,
        values: DeviceBytes<'a>,
        caches: DeviceBytesMut<'a>,
        slots: DeviceBytes<'a>,
        scales: (DeviceBytes<'a>, DeviceBytes<'a>),
    ) -> kvio::SlotUpdate<'a>;
    /// Both caches (K then V) as the reference computes them.
    fn expected(&self) -> Vec<u8>;
}

/// Runs every case's plan on the CPU (the kernels' own code) with an error word: caches
/// compared with the reference, slots past the cache counted.
pub fn emulate_slot_cases<C: SlotCase>(cases: &[C]) {
    for c in cases {
        let d = c.data();
        let mut caches = d.poison.clone();
        // SAFETY: host memory, exclusively ours for the call.
        let dst = unsafe { DeviceBytesMut::from_raw(caches.as_mut_ptr() as u64, caches.len()) };
        let scales = (host_view(&d.scales_k), host_view(&d.scales_v));
        // Typed vectors, so the slot array is aligned for its element type.
        let s32 = if d.slots_i32 { d.slots32() } else { Vec::new() };
        let slots = if d.slots_i32 {
            host_view(&s32)
        } else {
            host_view(&d.slots)
        };
        let op = c.op(host_view(&d.keys), host_view(&d.values), dst, slots, scales);
        // SAFETY: every view is live host memory of its length.
        let counts = unsafe { kvio::emulate::update_slots_counted(&op) }
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
        assert_same(&d.name, &caches, &c.expected());
        let want = kvio::ErrorCounts {
            bad_slots: d.bad_slots,
            ..Default::default()
        };
        assert_eq!(counts, want, "{}", d.name);
    }
}

/// Runs every case on the GPU with an error word: caches bit-exact against the reference,
/// slots past the cache counted. Returns the number of cases.
pub fn gpu_slot_cases<C: SlotCase>(g: &Gpu, cases: &[C]) -> usize {
    let stream = g.stream();
    let errors = kvio::DeviceErrors::new().unwrap();
    // Copies have no scales: a dummy f32 keeps the buffers non-empty.
    let scales = |s: &[f32]| upload(if s.is_empty() { &[1f32][..] } else { s });
    for c in cases {
        let d = c.data();
        let (k, v, s) = (upload(&d.keys), upload(&d.values), upload(&d.slot_bytes()));
        let (sk, sv) = (scales(&d.scales_k), scales(&d.scales_v));
        let mut caches = upload(&d.poison);
        errors.reset(StreamRef::from(&stream)).unwrap();
        let op = c
            .op(
                DeviceBytes::of(&k),
                DeviceBytes::of(&v),
                DeviceBytesMut::of(&mut caches),
                DeviceBytes::of(&s),
                (DeviceBytes::of(&sk), DeviceBytes::of(&sv)),
            )
            .errors(&errors);
        g.kv.update_slots(&op, StreamRef::from(&stream))
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
        assert_same(&d.name, &download(&caches, &stream), &c.expected());
        let counts = errors.read(StreamRef::from(&stream)).unwrap();
        let want = kvio::ErrorCounts {
            bad_slots: d.bad_slots,
            ..Default::default()
        };
        assert_eq!(counts, want, "{}", d.name);
    }
    cases.len()
}

/// NIXL helpers of the NIXL tests (feature `nixl`): the library gate, UCX kept on this host,
/// agents with a UCX backend.
#[cfg(feature = "nixl")]
pub mod nixl {
    use kvio::nixl::nixl_sys::Agent;

    /// Whether the NIXL libraries are there (`libnixl_capi.so` loads); panics when they must
    /// be (`KVIO_REQUIRE_NIXL=1`), notes the skip otherwise.
    pub fn present(test: &str) -> bool {
        if kvio::nixl::available() {
            return true;
        }
        let why = "libnixl_capi.so not found (install the nixl-cu12 wheel and put its \
                   libraries on LD_LIBRARY_PATH, see .ci/run)";
        if std::env::var("KVIO_REQUIRE_NIXL").as_deref() == Ok("1") {
            panic!("{test}: KVIO_REQUIRE_NIXL=1 but {why}");
        }
        super::skipped(test, why);
        false
    }

    /// Keeps UCX on this host for two agents of this process ([`ucx_loopback`]); with `gpu`
    /// their pools are device memory and `cuda_ipc` is allowed between agents of one process
    /// (`UCX_CUDA_IPC_ENABLE_SAME_PROCESS`). Call before the first agent exists, on one thread.
    pub fn loopback_only(gpu: bool) {
        ucx_loopback(gpu);
        if gpu && std::env::var_os("UCX_CUDA_IPC_ENABLE_SAME_PROCESS").is_none() {
            std::env::set_var("UCX_CUDA_IPC_ENABLE_SAME_PROCESS", "y");
        }
    }

    /// Runs `cmd` (the other process of a two-process example, named `other` in errors) beside
    /// `mine` (this process's side, given that process): kills it when `mine` fails, waits for
    /// it, removes the side-channel folder `dir`, and fails when either side failed.
    pub fn run_pair<E: From<std::io::Error> + From<String>>(
        dir: &std::path::Path,
        cmd: &mut std::process::Command,
        other: &str,
        mine: impl FnOnce(&mut std::process::Child) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut child = cmd.spawn()?;
        let result = mine(&mut child);
        if result.is_err() {
            let _ = child.kill();
        }
        let status = child.wait()?;
        let _ = std::fs::remove_dir_all(dir);
        result?;
        if !status.success() {
            return Err(format!("the {other} process failed ({status})").into());
        }
        Ok(())
    }

    /// Keeps UCX on this host for the two-process examples unless the caller chose: shared
    /// memory, self and TCP on `lo`, plus `cuda_copy` on a machine with NVIDIA GPUs (NIXL
    /// refuses a UCX backend without a CUDA transport there, even for host memory) and
    /// `cuda_ipc` where the pools are device memory (`device_memory`). Call before the first
    /// agent exists, on one thread.
    pub fn ucx_loopback(device_memory: bool) {
        let gpu_host = std::path::Path::new("/dev/nvidiactl").exists();
        let tls = match (device_memory, gpu_host) {
            (false, false) => "sm,self,tcp",
            (false, true) => "sm,self,tcp,cuda_copy",
            (true, _) => "sm,self,tcp,cuda_copy,cuda_ipc",
        };
        for (k, v) in [("UCX_TLS", tls), ("UCX_NET_DEVICES", "lo")] {
            if std::env::var_os(k).is_none() {
                std::env::set_var(k, v);
            }
        }
    }

    /// Pairs in runs of consecutive ids (1 to 4 long, shuffled), one in 8 padding: every block of
    /// `dst_blocks` written once, sources random.
    pub fn run_pairs(src_blocks: usize, dst_blocks: usize, rng: &mut crate::Rng) -> Vec<[i64; 2]> {
        let mut runs = Vec::new();
        let mut d = 0;
        while d < dst_blocks {
            let len = (1 + rng.below(4) as usize).min(dst_blocks - d);
            runs.push((d, len));
            d += len;
        }
        rng.shuffle(&mut runs);
        let mut pairs = Vec::new();
        for (d, len) in runs {
            let s = rng.below((src_blocks - len + 1) as u64) as usize;
            for i in 0..len {
                pairs.push([(s + i) as i64, (d + i) as i64]);
            }
            if rng.below(8) == 0 {
                pairs.push([-1, -1]);
            }
        }
        pairs
    }

    /// An agent with a UCX backend on the plugin's default parameters, with `key=value` pairs
    /// from `KVIO_NIXL_UCX_PARAMS` (comma-separated, e.g. `num_workers=4`) set over them.
    pub fn ucx_agent(name: &str) -> Result<Agent, Box<dyn std::error::Error>> {
        let a = Agent::new(name)?;
        let (_mems, mut params) = a.get_plugin_params("UCX")?;
        if let Ok(extra) = std::env::var("KVIO_NIXL_UCX_PARAMS") {
            for kv in extra.split(',').filter(|kv| !kv.is_empty()) {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or("KVIO_NIXL_UCX_PARAMS: key=value pairs")?;
                params.set(k, v)?;
            }
        }
        a.create_backend("UCX", &params)?;
        Ok(a)
    }

    /// [`ucx_agent`], panicking on failure (tests).
    pub fn agent(name: &str) -> Agent {
        ucx_agent(name).unwrap_or_else(|e| panic!("UCX agent {name}: {e}"))
    }

    /// Writes `data` to `dir/name` atomically (a reader never sees half of it): the side
    /// channel of the two-process examples (NIXL metadata, a pool's address).
    pub fn publish(dir: &std::path::Path, name: &str, data: &[u8]) -> std::io::Result<()> {
        let tmp = dir.join(format!("{name}.tmp"));
        std::fs::write(&tmp, data)?;
        std::fs::rename(tmp, dir.join(name))
    }

    /// Waits up to `timeout` for `dir/name` ([`publish`]) and reads it.
    pub fn fetch(
        dir: &std::path::Path,
        name: &str,
        timeout: std::time::Duration,
    ) -> std::io::Result<Vec<u8>> {
        let start = std::time::Instant::now();
        loop {
            if let Ok(d) = std::fs::read(dir.join(name)) {
                return Ok(d);
            }
            if start.elapsed() > timeout {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("{name} did not appear in {}", dir.display()),
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Two agents that loaded each other's metadata (what a side channel carries between
    /// hosts); call after registering their memory.
    pub fn connect(a: &Agent, b: &Agent) {
        let name = a
            .load_remote_md(&b.get_local_md().expect("metadata"))
            .expect("load_remote_md");
        assert_eq!(name, b.name());
        b.load_remote_md(&a.get_local_md().expect("metadata"))
            .expect("load_remote_md");
    }
}
