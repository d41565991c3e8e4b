//! `cargo bench`: kvio's throughput per page size, with the GPU's own ceilings and naive
//! baselines measured in the same process, so every figure is also a ratio.
//!
//! GPU time comes from CUDA events recorded on the launch stream (criterion `iter_custom`);
//! criterion warms up, samples and writes its HTML report under `target/criterion`. At the end
//! a table per group (GB/s, % of ceiling, speedup over each baseline) is printed and the same
//! rows are written as JSON to `target/kvio-bench.json` (or `$KVIO_BENCH_JSON`).
//!
//! Settings (environment): `KVIO_BENCH_LAYERS` (32), `KVIO_BENCH_HEADS` (8), `KVIO_BENCH_DIM`
//! (128), `KVIO_BENCH_ELEM` (2 = bf16), `KVIO_BENCH_PAGES` (`1,2,4,8,16,32,64,128,256`),
//! `KVIO_BENCH_GROUPS` (comma list of groups to run; default all), `KVIO_BENCH_SPLIT`
//! (`2,4,1,4`: pairs of CTA budgets, offload then onload, of the kernel transfers in group
//! `concurrent`; the first pair is the main split),
//! `KVIO_BENCH_PRODUCER_ITERS` (256: arithmetic steps per thread of the `pdl` group's
//! producer), `KVIO_BENCH_VLLM_CUBIN` (a cubin of vLLM's own cache-write kernels, built from
//! vLLM's source as BENCHMARKS.md describes: with it, groups `slot-update`, `fp8-update`,
//! `v0-update` and `mla-update` add a `vllm…` row beside kvio's `kvio…` rows, first checking
//! that both write the same bytes, and the tables gain an `x vllm` column; bf16 models only).
//! Without a GPU it says so and exits 0.
//!
//! A filter on the command line (`cargo bench -- 'v0-update-page-kvio-bf16/16$'`, criterion's
//! regular expression over `group/row`) selects rows before anything of theirs runs: a row left
//! out makes no untimed first call either, so under Nsight Compute `--launch-skip 0` catches
//! the first selected row's first launch (the rows' data is still set up).
//!
//! Group `concurrent` (`KVIO_BENCH_GROUPS=concurrent`) runs offload (GPU -> pinned host) and
//! onload (pinned host -> GPU) at the same time on two non-blocking streams, A and B. Its timer
//! (`time_across`) records a start event on the first stream that the others wait for, an end
//! event on each stream, and a stop event after the first stream has waited for every end, so
//! the wall time spans all streams; each stream's own span (start to its end) is kept too.
//! Page sizes: `KVIO_BENCH_PAGES` when set, else 1, 16 and 256.
//!
//! - `concurrent/ceiling`: one 128 MiB D2H `cuMemcpyAsync` on A and one H2D on B at once
//!   (`bidirectional`: both directions' bytes over the wall time; `bidirectional/d2h` and
//!   `/h2d`: each stream's span), and each alone (`d2h-alone`, `h2d-alone`).
//! - `concurrent/layer-separate`, `concurrent/cross-layer` (the offload/onload groups' pools;
//!   param = page size): 128 MiB offloaded on A while as many bytes of other pools are onloaded
//!   on B. Variant `<offload>+<onload>`: `kernelN` = kvio's transfer kernel on at most N CTAs
//!   (device block map), `dma` = kvio's DMA backend (host map; one `cuMemcpyBatchAsync` per
//!   call where the driver has it); every further `KVIO_BENCH_SPLIT` pair adds a
//!   `kernelN+kernelM` variant. GB/s of both directions together, as % of `bidirectional`;
//!   `/offload` and `/onload` rows against the same direction's stream in `bidirectional`.
//! - `concurrent/interference/<layout>` (page size 16): the compute-bound spin yardstick
//!   (`kvio_spin`: a dependent multiply-add chain per thread, `SMs - (offload + onload CTAs)`
//!   CTAs of 1024 threads for the largest split, calibrated to about 1 ms a round) alone on a
//!   third stream (`spin-alone`), then beside every kernel+kernel pair, the dma+dma and the
//!   bulk-copy pairs (`<pair>/spin`: its time
//!   there; the report gives the slowdown and whether both transfers outlasted it).
//!
//! Group `pdl` (programmatic dependent launch, `StreamRef::pdl`): the per-call floor of a
//! decode-size slot update chained after the kernel that produced its K/V. The producer is
//! `kvio_produce` (one CTA of 256 threads per SM, `KVIO_BENCH_PRODUCER_ITERS` dependent integer
//! steps per thread, then it writes the K and V the update reads, signalling its dependents
//! just before those stores); the update is the NHD slot update of `slot-update` (H × D ×
//! elem of the model, page size 16, random distinct slots) at T = 1, 16, 64, 256. Each row is a
//! CUDA graph of 100 of something, timed per replay: `producer-x100` (the producer alone),
//! `update-x100` (the update alone), `pair-x100` (producer then update, plain launches) and
//! `pair-pdl-x100` (the update launched with PDL: a programmatic edge in the graph). The
//! report gives µs per item and the time a pair adds to the producer alone
//! (`added` = pair − producer, `added-pdl` = pair-pdl − producer), the target being ≤ 1.0 µs
//! with PDL. The floor of any kernel chained so: `wait-x100` and `wait-pdl-x100` chain
//! `kvio_wait` (one thread that only runs `griddepcontrol.wait`, as every kvio entry point
//! does before it touches memory) after the producer instead of the update, plainly and with
//! PDL (`floor` = wait − producer, `floor-pdl` = wait-pdl − producer).
//!
//! Group `host` (`KVIO_BENCH_GROUPS=host`): host time per call of every operation, the CPU
//! side of the per-call floor (plan + enqueue; issue 13's target is 2 µs). Each variant runs
//! `KVIO_BENCH_HOST_ROUNDS` (50) batches of `KVIO_BENCH_HOST_CALLS` (100) back-to-back calls on
//! one stream, each batch timed with `Instant` and nothing inside it waiting for the GPU; the
//! stream is synchronised before each batch, outside the timing, so a batch starts on an empty
//! queue and never fills it (DMA calls, which enqueue a copy per span, take fewer calls per
//! batch: at most 256 spans). Rows: median µs per call over the batches (p10, p90), and the
//! ratio to `empty-launch` (an empty kernel launched from the host the same way).
//! - `host/update` (param = T = 16, the model's heads × head size): `empty-launch`,
//!   `naive-kernel` (the `slot-update` baseline's launch), `slots-nhd` (`update_slots`, NHD
//!   bf16, K and V), `slots-nhd-pdl` (the same through `StreamRef::pdl`), `slots-fp8` (e4m3
//!   per-tensor scales), `slots-v0`, `slots-v0-fp8` (vLLM v0 layout), `mla`, `mla-fp8`
//!   (`update_mla`, 512 + 64), `slices` (`update_slices`).
//! - `host/copy-blocks` (GPU → GPU, one pool, copy-on-write), `host/offload` (GPU → pinned
//!   host), `host/onload` (pinned host → GPU), param = 4 pairs of page size 16: variants
//!   `<pools>/<how>`, pools `layer-separate` (GPU: per-layer caches through a `LayerTable`;
//!   host: SGLang's layer-first pool) or `cross-layer`, how `kernel-device-map` (kernel
//!   backend, map in device memory), `kernel-host-map` (kernel, host map uploaded through
//!   kvio's scratch), `kernel-host-map-staging` (through a caller's staging buffer), `dma`
//!   (`Backend::Dma`) and `auto-host-map` (`Backend::Auto`, host map, no staging).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use criterion::{measurement::WallTime, BenchmarkGroup, Criterion, Throughput};
use std::sync::OnceLock;

mod filter;
mod peer;
use cust::memory::DeviceBuffer;
use cust::sys as cu;
use filter::Filter;
use kvio::plan::{slices_to_table, slots_to_slices};
use kvio::{
    Backend, BlockCopy, BlockMap, BlockPool, DeviceBytes, LayerTable, PagedLayout, SliceUpdate,
    SlotMapping, SlotUpdate, StreamRef, TokenLayout,
};
use kvio::{Event, Stream};
use kvio_suite::{random_bytes, upload, Gpu, Graph, Mem, Rng};

/// Model shape and sweep, from the environment.
#[derive(Clone, Debug)]
struct Cfg {
    layers: usize,
    heads: usize,
    dim: usize,
    elem: usize,
    pages: Vec<usize>,
    groups: Option<Vec<String>>,
    /// CTA budgets of the kernel transfers in group `concurrent`: (offload, onload), the main
    /// split (`KVIO_BENCH_SPLIT`'s first pair).
    split: (u32, u32),
    /// Further (offload, onload) budgets of group `concurrent`'s kernel pairs
    /// (`KVIO_BENCH_SPLIT`'s later pairs).
    more_splits: Vec<(u32, u32)>,
    /// Page sizes of group `concurrent`: `KVIO_BENCH_PAGES` when set, else 1, 16 and 256.
    concurrent_pages: Vec<usize>,
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl Cfg {
    fn from_env() -> Cfg {
        let pages = std::env::var("KVIO_BENCH_PAGES")
            .ok()
            .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
            .unwrap_or_else(|| vec![1, 2, 4, 8, 16, 32, 64, 128, 256]);
        let groups = std::env::var("KVIO_BENCH_GROUPS")
            .ok()
            .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
        let split: Vec<u32> = std::env::var("KVIO_BENCH_SPLIT")
            .ok()
            .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
            .unwrap_or_default();
        // Pairs (offload, onload); the first is the main split.
        let mut splits: Vec<(u32, u32)> = split
            .chunks_exact(2)
            .filter(|p| p[0] > 0 && p[1] > 0)
            .map(|p| (p[0], p[1]))
            .collect();
        if splits.is_empty() {
            splits = vec![(2, 4), (1, 4)];
        }
        let split = splits[0];
        let concurrent_pages = if std::env::var("KVIO_BENCH_PAGES").is_ok() {
            pages.clone()
        } else {
            vec![1, 16, 256]
        };
        Cfg {
            layers: env_usize("KVIO_BENCH_LAYERS", 32),
            heads: env_usize("KVIO_BENCH_HEADS", 8),
            dim: env_usize("KVIO_BENCH_DIM", 128),
            elem: env_usize("KVIO_BENCH_ELEM", 2),
            pages,
            groups,
            split,
            more_splits: splits[1..].to_vec(),
            concurrent_pages,
        }
    }
    fn wants(&self, group: &str) -> bool {
        self.groups
            .as_ref()
            .is_none_or(|g| g.iter().any(|x| x == group))
    }
    /// Bytes of one (block, layer, K or V) chunk at page size `bs`.
    fn chunk(&self, bs: usize) -> usize {
        bs * self.heads * self.dim * self.elem
    }
}

/// Bytes moved through device memory by device-side benchmarks (read + write counted).
const D2D_BYTES: usize = 512 << 20;
/// Bytes moved over the host link by each offload/onload iteration.
const PCIE_BYTES: usize = 128 << 20;
/// The per-chunk memcpy baseline issues at most this many copies per iteration.
const MAX_MEMCPY_SPANS: usize = 16384;

/// One measured benchmark: bytes per iteration and the seconds per iteration of each sample.
#[derive(Default, Clone)]
struct Run {
    bytes: u64,
    secs: Vec<f64>,
}

impl Run {
    fn median(&self) -> f64 {
        let mut v = self.secs.clone();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        if v.is_empty() {
            f64::NAN
        } else {
            v[v.len() / 2]
        }
    }
    fn gbps(&self) -> f64 {
        self.bytes as f64 / self.median() / 1e9
    }
}

/// Results by (group, parameter, variant).
#[derive(Default)]
struct Rec {
    runs: BTreeMap<(String, usize, String), Run>,
}

/// A criterion group and its name: a row's full id (`name/row`) is matched against the
/// command line's filter before the row's untimed first call, so a filtered run launches no
/// kernel of a row it does not measure (an Nsight Compute `--launch-skip` counts only the
/// selected rows' launches).
struct Group<'a> {
    name: String,
    inner: BenchmarkGroup<'a, WallTime>,
}

/// Opens criterion group `name`.
fn group<'a>(c: &'a mut Criterion, name: &str) -> Group<'a> {
    Group {
        name: name.to_string(),
        inner: c.benchmark_group(name),
    }
}

impl Group<'_> {
    /// Whether criterion runs row `id` of this group (the filter [`Filter::from_args`] reads).
    fn selects(&self, id: &str) -> bool {
        static FILTER: OnceLock<Filter> = OnceLock::new();
        FILTER
            .get_or_init(|| Filter::from_args(std::env::args().skip(1)))
            .selects(&format!("{}/{id}", self.name))
    }
    /// Whether criterion runs any of the rows `variants` of `group` at `param`: a setup that
    /// only those rows use is built only when this holds, so a filtered run allocates and
    /// fills no buffers for the rows it skips (before, session 30's v0 runs of 12 rows built
    /// 33 setups of up to 65,536 tokens, with random caches and inputs generated on the host
    /// and uploaded, and took 16–17 s each with the module already compiled).
    fn wants(&self, group: &str, param: usize, variants: &[&str]) -> bool {
        variants
            .iter()
            .any(|v| self.selects(&row_id(group, v, param)))
    }
    /// Closes the group (criterion's summary of it).
    fn finish(self) {
        self.inner.finish()
    }
}

/// GPU time of `iters` calls of `f` on `stream`, from events recorded on that stream.
fn time_on(stream: &Stream, iters: u64, f: &mut dyn FnMut()) -> Duration {
    let start = Event::new().expect("event");
    let stop = Event::new().expect("event");
    start.record(stream.sref()).expect("record");
    for _ in 0..iters {
        f();
    }
    stop.record(stream.sref()).expect("record");
    stop.synchronize()
        .expect("event sync (a kernel fault shows here)");
    let ms = stop.elapsed_ms(&start).expect("elapsed");
    Duration::from_secs_f64(ms as f64 / 1e3)
}

/// A row's id within its criterion group (`group` with `-` for `/`, the variant, the
/// parameter), which the command line's filter matches.
fn row_id(group: &str, variant: &str, param: usize) -> String {
    format!("{}-{variant}/{param}", group.replace('/', "-"))
}

/// Measures one variant with criterion and records its per-iteration samples.
#[allow(clippy::too_many_arguments)]
fn measure(
    grp: &mut Group<'_>,
    rec: &RefCell<Rec>,
    group: &str,
    param: usize,
    variant: &str,
    bytes: u64,
    stream: &Stream,
    mut f: impl FnMut(),
) {
    let id = row_id(group, variant, param);
    if !grp.selects(&id) {
        return;
    }
    f(); // first call outside timing: module/JIT/first-touch costs
    stream.synchronize().expect("sync");
    grp.inner.throughput(Throughput::Bytes(bytes.max(1)));
    grp.inner.bench_function(id, |b| {
        b.iter_custom(|iters| {
            let d = time_on(stream, iters, &mut f);
            let mut r = rec.borrow_mut();
            let run = r
                .runs
                .entry((group.to_string(), param, variant.to_string()))
                .or_default();
            run.bytes = bytes;
            run.secs.push(d.as_secs_f64() / iters as f64);
            d
        })
    });
}

/// GPU time of `iters` rounds of `f`, which enqueues work on each of `streams`. A start event
/// is recorded on the first stream and every other stream waits for it; after the rounds an
/// end event is recorded on each stream, the first stream waits for every other stream's end
/// and a stop event is recorded on it. Returns start to stop (the wall time, spanning every
/// stream) and start to each stream's own end.
fn time_across(streams: &[&Stream], iters: u64, f: &mut dyn FnMut()) -> (Duration, Vec<Duration>) {
    let first = streams[0];
    let start = Event::new().expect("event");
    let stop = Event::new().expect("event");
    let ends: Vec<Event> = streams
        .iter()
        .map(|_| Event::new().expect("event"))
        .collect();
    start.record(first.sref()).expect("record");
    for s in &streams[1..] {
        start.wait_on(s.sref()).expect("cuStreamWaitEvent");
    }
    for _ in 0..iters {
        f();
    }
    for (s, e) in streams.iter().zip(&ends) {
        e.record(s.sref()).expect("record");
    }
    for e in &ends[1..] {
        e.wait_on(first.sref()).expect("cuStreamWaitEvent");
    }
    stop.record(first.sref()).expect("record");
    stop.synchronize()
        .expect("event sync (a kernel fault shows here)");
    let since_start =
        |e: &Event| Duration::from_secs_f64(e.elapsed_ms(&start).expect("elapsed") as f64 / 1e3);
    (since_start(&stop), ends.iter().map(since_start).collect())
}

/// One stream's share of a multi-stream benchmark: the stream, a label and the bytes it moves
/// per round.
type Part<'a> = (&'a Stream, &'a str, u64);

/// [`measure`] for work spread over several streams ([`time_across`]): records the wall time
/// as `variant` (bytes: every part's), and with more than one part each stream's own span as
/// `variant/label` (its part's bytes).
#[allow(clippy::too_many_arguments)]
fn measure_across(
    grp: &mut Group<'_>,
    rec: &RefCell<Rec>,
    group: &str,
    param: usize,
    variant: &str,
    parts: &[Part<'_>],
    mut f: impl FnMut(),
) {
    let id = row_id(group, variant, param);
    if !grp.selects(&id) {
        return;
    }
    let streams: Vec<&Stream> = parts.iter().map(|p| p.0).collect();
    let bytes: u64 = parts.iter().map(|p| p.2).sum();
    f(); // first round outside timing
    for s in &streams {
        s.synchronize().expect("sync");
    }
    grp.inner.throughput(Throughput::Bytes(bytes.max(1)));
    grp.inner.bench_function(id, |b| {
        b.iter_custom(|iters| {
            let (wall, spans) = time_across(&streams, iters, &mut f);
            let mut r = rec.borrow_mut();
            let mut push = |v: String, bytes: u64, d: Duration| {
                let run = r.runs.entry((group.to_string(), param, v)).or_default();
                run.bytes = bytes;
                run.secs.push(d.as_secs_f64() / iters as f64);
            };
            push(variant.to_string(), bytes, wall);
            if parts.len() > 1 {
                for (p, d) in parts.iter().zip(spans) {
                    push(format!("{variant}/{}", p.1), p.2, d);
                }
            }
            wall
        })
    });
}

fn check(call: &str, r: cu::CUresult) {
    assert_eq!(r, cu::CUresult::CUDA_SUCCESS, "{call}");
}

fn memcpy(dst: u64, src: u64, bytes: usize, stream: &Stream) {
    // SAFETY: callers pass ranges inside live allocations.
    check("cuMemcpyAsync", unsafe {
        cu::cuMemcpyAsync(dst, src, bytes, stream.cu_stream())
    });
}

/// Uploads `(src, dst)` span address pairs for the naive kernel.
fn span_table(spans: &[(u64, u64)]) -> DeviceBuffer<u64> {
    upload(
        &spans
            .iter()
            .flat_map(|&(s, d)| [s, d])
            .chain([0, 0])
            .collect::<Vec<u64>>(),
    )
}

/// The naive baseline: one thread per element over the spans.
fn naive(
    g: &Gpu,
    table: &DeviceBuffer<u64>,
    n: usize,
    span_bytes: usize,
    elem: usize,
    stream: &Stream,
) {
    // SAFETY: the table lists spans inside live allocations.
    unsafe {
        g.kv.bench_naive_spans(
            DeviceBytes::of(table),
            n as u64,
            (span_bytes / elem) as u64,
            elem as u32,
            StreamRef::from(stream),
        )
    }
    .expect("naive kernel");
}

/// The per-chunk memcpy baseline over (at most MAX_MEMCPY_SPANS of) the spans; returns the
/// bytes one iteration moves.
fn memcpy_spans<'a>(
    spans: &'a [(u64, u64)],
    span_bytes: usize,
    stream: &'a Stream,
) -> impl FnMut() + 'a {
    let spans = &spans[..spans.len().min(MAX_MEMCPY_SPANS)];
    move || {
        for &(s, d) in spans {
            memcpy(d, s, span_bytes, stream);
        }
    }
}

/// A device copy of `m` made now: the caches a `vllm-*` row writes, taken from the setup's
/// caches before kvio writes them, so that [`peer_row`] compares both writers' output from the
/// same starting bytes.
fn twin(m: &Mem, stream: &Stream) -> Mem {
    let t = Mem::new(false, m.bytes().len());
    memcpy(t.bytes().ptr(), m.bytes().ptr(), m.bytes().len(), stream);
    stream.synchronize().expect("sync");
    t
}

/// The addresses of the two halves of `m` (K's cache, then V's, in one allocation).
fn halves(m: &Mem) -> [u64; 2] {
    let b = m.bytes();
    [b.ptr(), b.ptr() + b.len() as u64 / 2]
}

/// Twins ([`twin`]) of `caches` when vLLM's kernels are loaded.
fn twins<const N: usize>(
    peer: Option<&peer::Vllm>,
    caches: [&Mem; N],
    stream: &Stream,
) -> Option<[Mem; N]> {
    peer.map(|_| caches.map(|m| twin(m, stream)))
}

/// A `vllm-*` row: kvio's call (`kvio`, writing `ours`) and vLLM's kernel (`vllm`, writing
/// `theirs`, twins of `ours` made before kvio's first write) each run once, every cache must
/// then hold the same bytes as its twin (the same work, done the same way; a panic says where
/// they differ), then vLLM's kernel is measured as [`measure`] measures kvio's.
#[allow(clippy::too_many_arguments)]
fn peer_row(
    grp: &mut Group<'_>,
    rec: &RefCell<Rec>,
    group: &str,
    param: usize,
    variant: &str,
    bytes: u64,
    stream: &Stream,
    (ours, theirs): (&[&Mem], &[Mem]),
    mut kvio: impl FnMut(),
    vllm: impl FnMut(),
) {
    let id = row_id(group, variant, param);
    if !grp.selects(&id) {
        return;
    }
    let mut vllm = vllm;
    kvio();
    vllm();
    stream
        .synchronize()
        .expect("sync (a kernel fault shows here)");
    for (a, b) in ours.iter().zip(theirs) {
        let (x, y) = (a.read(), b.read());
        let differ = x.iter().zip(&y).filter(|(p, q)| p != q).count();
        assert!(
            differ == 0,
            "{id}: vLLM's kernel and kvio wrote different bytes: {differ} of {} differ, the first at {:?}",
            x.len(),
            kvio_suite::first_diff(&x, &y)
        );
    }
    println!("{id}: vLLM's output equals kvio's, byte for byte");
    measure(grp, rec, group, param, variant, bytes, stream, vllm);
}

/// A graph-latency row of vLLM's: a CUDA graph of 100 launches of its kernel (`launch`
/// enqueues one on `stream`), measured as kvio's `-x100` rows are.
#[allow(clippy::too_many_arguments)]
fn peer_graph_row(
    grp: &mut Group<'_>,
    rec: &RefCell<Rec>,
    group: &str,
    t: usize,
    variant: &str,
    stream: &Stream,
    mut launch: impl FnMut(),
) {
    let graph = Graph::capture(stream, |_| {
        for _ in 0..100 {
            launch();
        }
    });
    measure(grp, rec, group, t, variant, 0, stream, || {
        graph.launch(stream)
    });
}

fn ceilings(c: &mut Criterion, rec: &RefCell<Rec>, g: &Gpu, stream: &Stream) {
    let mut grp = group(c, "ceiling");
    let a = Mem::new(false, D2D_BYTES / 2);
    let b = Mem::new(false, D2D_BYTES / 2);
    measure(
        &mut grp,
        rec,
        "ceiling",
        0,
        "device-copy",
        D2D_BYTES as u64,
        stream,
        || memcpy(b.bytes().ptr(), a.bytes().ptr(), D2D_BYTES / 2, stream),
    );
    // The same copy at the size of a T = 16,384 K+V update (128 MiB moved), for comparison.
    let small = 64 << 20;
    measure(
        &mut grp,
        rec,
        "ceiling",
        0,
        "device-copy-128MiB",
        2 * small as u64,
        stream,
        || memcpy(b.bytes().ptr(), a.bytes().ptr(), small, stream),
    );
    let h = Mem::new(true, PCIE_BYTES);
    let d = Mem::new(false, PCIE_BYTES);
    measure(
        &mut grp,
        rec,
        "ceiling",
        0,
        "pinned-h2d",
        PCIE_BYTES as u64,
        stream,
        || memcpy(d.bytes().ptr(), h.bytes().ptr(), PCIE_BYTES, stream),
    );
    measure(
        &mut grp,
        rec,
        "ceiling",
        0,
        "pinned-d2h",
        PCIE_BYTES as u64,
        stream,
        || memcpy(h.bytes().ptr(), d.bytes().ptr(), PCIE_BYTES, stream),
    );
    // Launch costs, recorded as seconds per call (bytes 0).
    measure(
        &mut grp,
        rec,
        "ceiling",
        0,
        "empty-launch",
        0,
        stream,
        || g.kv.bench_noop(StreamRef::from(stream)).expect("noop"),
    );
    let graph = Graph::capture(stream, |s| {
        for _ in 0..100 {
            g.kv.bench_noop(s).expect("noop");
        }
    });
    measure(
        &mut grp,
        rec,
        "ceiling",
        0,
        "empty-launch-in-graph-x100",
        0,
        stream,
        || graph.launch(stream),
    );
    grp.finish();
}

/// A K/V write-path setup: inputs of `t` tokens, NHD caches of `blocks × bs`.
struct WriteSetup {
    key: DeviceBuffer<u8>,
    value: DeviceBuffer<u8>,
    kc: Mem,
    vc: Mem,
    input: TokenLayout,
    cache: PagedLayout,
    slots: DeviceBuffer<i64>,
    slot_host: Vec<i64>,
}

/// `t` distinct slots of a cache of `num_slots`, in random order.
fn random_slots(num_slots: usize, t: usize, seed: u64) -> Vec<i64> {
    let mut all: Vec<i64> = (0..num_slots as i64).collect();
    Rng::new(seed).shuffle(&mut all);
    all.truncate(t);
    all
}

/// `len` bytes of device memory holding random bytes.
fn random_mem(len: usize, seed: u64) -> Mem {
    let mut m = Mem::new(false, len);
    m.fill(&random_bytes(len, seed));
    m
}

impl WriteSetup {
    fn new(cfg: &Cfg, t: usize, bs: usize, seed: u64) -> WriteSetup {
        let blocks = t.div_ceil(bs) + 8;
        let cache = PagedLayout::nhd(blocks, bs, cfg.heads, cfg.dim, cfg.elem);
        let input = TokenLayout::contiguous(t, cfg.heads, cfg.dim, cfg.elem);
        let n = input.extent("i").unwrap() as usize;
        let slot_host = random_slots(blocks * bs, t, seed);
        let ext = cache.extent("c").unwrap() as usize;
        let (kc, vc) = (random_mem(ext, seed + 1), random_mem(ext, seed + 2));
        WriteSetup {
            key: upload(&random_bytes(n, seed + 3)),
            value: upload(&random_bytes(n, seed + 4)),
            kc,
            vc,
            input,
            cache,
            slots: upload(&slot_host),
            slot_host,
        }
    }
    fn op(&self) -> SlotUpdate<'_> {
        SlotUpdate {
            key: kvio::CacheWrite {
                src: DeviceBytes::of(&self.key),
                dst: self.kc.bytes_mut(),
            },
            value: Some(kvio::CacheWrite {
                src: DeviceBytes::of(&self.value),
                dst: self.vc.bytes_mut(),
            }),
            input: self.input,
            cache: self.cache,
            value_layout: None,
            slots: SlotMapping::I64(DeviceBytes::of(&self.slots)),
            errors: None,
            quantize: None,
        }
    }
    /// (src, dst) spans of one token row each, K then V.
    fn spans(&self) -> Vec<(u64, u64)> {
        let row = self.input.row_bytes() as u64;
        let mut v = Vec::new();
        for (src, dst) in [
            (DeviceBytes::of(&self.key), self.kc.bytes()),
            (DeviceBytes::of(&self.value), self.vc.bytes()),
        ] {
            for (t, &s) in self.slot_host.iter().enumerate() {
                v.push((src.ptr() + t as u64 * row, dst.ptr() + s as u64 * row));
            }
        }
        v
    }
    /// Bytes read + written by one update (K and V).
    fn bytes(&self) -> u64 {
        2 * 2 * (self.slot_host.len() * self.input.row_bytes()) as u64
    }
    /// vLLM's `reshape_and_cache_flash` of the same update into caches `[kc, vc]` (this
    /// setup's or their twins). Its bf16 entry reads no scale: it gets the slot array's
    /// address.
    fn flash(&self, kc: &Mem, vc: &Mem) -> peer::Flash {
        let slots = DeviceBytes::of(&self.slots).ptr();
        peer::Flash::new(
            [&self.key, &self.value].map(|b| DeviceBytes::of(b).ptr()),
            [kc, vc].map(|m| m.bytes().ptr()),
            slots,
            &self.input,
            self.cache.block_size,
            slots,
        )
    }
}

/// The `(tokens, page size)` cases of the write benchmarks: token counts at page size 16,
/// then 16384 tokens at every page size of `cfg`.
fn write_cases(cfg: &Cfg) -> Vec<(usize, usize)> {
    let mut cases: Vec<(usize, usize)> = [1usize, 16, 256, 4096, 65536]
        .iter()
        .map(|&t| (t, 16))
        .collect();
    cases.extend(cfg.pages.iter().map(|&bs| (16384usize, bs)));
    cases
}

fn slot_update(
    c: &mut Criterion,
    rec: &RefCell<Rec>,
    g: &Gpu,
    stream: &Stream,
    cfg: &Cfg,
    peer: Option<&peer::Vllm>,
) {
    let mut grp = group(c, "slot-update");
    let row = cfg.heads * cfg.dim * cfg.elem;
    // The rows each setup serves (a setup is built only where one of them runs).
    let (ours, plain, naive_kernel, per_chunk, theirs) = (
        "kvio",
        "kvio-plain",
        "naive-kernel",
        "memcpy-per-chunk",
        "vllm",
    );
    for (t, bs) in write_cases(cfg) {
        let name = if bs == 16 && t != 16384 {
            "slot-update/T"
        } else {
            "slot-update/page"
        };
        let param = if name == "slot-update/T" { t } else { bs };
        if !grp.wants(name, param, &[ours, plain, naive_kernel, per_chunk, theirs]) {
            continue;
        }
        let w = WriteSetup::new(cfg, t, bs, t as u64 ^ bs as u64);
        let tw = twins(peer, [&w.kc, &w.vc], stream);
        let op = w.op();
        measure(&mut grp, rec, name, param, ours, w.bytes(), stream, || {
            g.kv.update_slots(&op, StreamRef::from(stream))
                .expect("update_slots")
        });
        // The same update launched plainly (kvio's default is PDL where supported: a cheaper
        // launch, which binds decode sizes, and back-to-back launches overlap their tails).
        {
            measure(&mut grp, rec, name, param, plain, w.bytes(), stream, || {
                g.kv.update_slots(&op, StreamRef::from(stream).pdl(false))
                    .expect("update_slots")
            });
        }
        let spans = w.spans();
        let table = span_table(&spans);
        measure(
            &mut grp,
            rec,
            name,
            param,
            naive_kernel,
            w.bytes(),
            stream,
            || naive(g, &table, spans.len(), row, cfg.elem, stream),
        );
        let n = spans.len().min(MAX_MEMCPY_SPANS);
        measure(
            &mut grp,
            rec,
            name,
            param,
            per_chunk,
            2 * (n * row) as u64,
            stream,
            memcpy_spans(&spans, row, stream),
        );
        if let (Some(p), Some(tw)) = (peer, &tw) {
            let a = w.flash(&tw[0], &tw[1]);
            peer_row(
                &mut grp,
                rec,
                name,
                param,
                theirs,
                w.bytes(),
                stream,
                (&[&w.kc, &w.vc], tw),
                || {
                    g.kv.update_slots(&op, StreamRef::from(stream))
                        .expect("update_slots")
                },
                // SAFETY: the setup's inputs and slots, the twins of its caches.
                || unsafe { p.flash(false, &a, stream) },
            );
        }
    }
    // Decode-size updates inside a CUDA graph: time per call, against an empty kernel.
    let rows = [("kvio-x100", None), ("kvio-plain-x100", Some(false))];
    let graph_rows = [rows[0].0, rows[1].0, "vllm-x100"];
    for t in [1usize, 16, 64, 256] {
        if !grp.wants("slot-update/graph-latency", t, &graph_rows) {
            continue;
        }
        let w = WriteSetup::new(cfg, t, 16, 77 + t as u64);
        let op = w.op();
        // kvio's default (programmatic edges between the updates where PDL is supported),
        // and plain launches.
        for (variant, pdl) in rows {
            let graph = Graph::capture(stream, |s| {
                let s = pdl.map_or(s, |on| s.pdl(on));
                for _ in 0..100 {
                    g.kv.update_slots(&op, s).expect("update_slots");
                }
            });
            measure(
                &mut grp,
                rec,
                "slot-update/graph-latency",
                t,
                variant,
                0,
                stream,
                || graph.launch(stream),
            );
        }
        if let Some(p) = peer {
            let a = w.flash(&w.kc, &w.vc);
            // SAFETY: the setup's buffers.
            let launch = || unsafe { p.flash(false, &a, stream) };
            peer_graph_row(
                &mut grp,
                rec,
                "slot-update/graph-latency",
                t,
                graph_rows[2],
                stream,
                launch,
            );
        }
    }
    grp.finish();
}

/// The `pdl` group's setup: one buffer the producer writes (K then V, `t` tokens each) and the
/// NHD caches the update writes.
struct PdlSetup {
    kv: Mem,
    kc: Mem,
    vc: Mem,
    input: TokenLayout,
    cache: PagedLayout,
    slots: DeviceBuffer<i64>,
}

impl PdlSetup {
    fn new(cfg: &Cfg, t: usize, seed: u64) -> PdlSetup {
        let bs = 16;
        let blocks = t.div_ceil(bs) + 8;
        let cache = PagedLayout::nhd(blocks, bs, cfg.heads, cfg.dim, cfg.elem);
        let input = TokenLayout::contiguous(t, cfg.heads, cfg.dim, cfg.elem);
        let n = input.extent("i").unwrap() as usize;
        let ext = cache.extent("c").unwrap() as usize;
        PdlSetup {
            kv: random_mem(2 * n, seed),
            kc: random_mem(ext, seed + 1),
            vc: random_mem(ext, seed + 2),
            input,
            cache,
            slots: upload(&random_slots(blocks * bs, t, seed + 3)),
        }
    }
    fn op(&self) -> SlotUpdate<'_> {
        let kv = self.kv.bytes();
        let n = kv.len() / 2;
        SlotUpdate::new(
            kv.slice(0, n).unwrap(),
            self.input,
            self.kc.bytes_mut(),
            self.cache,
            SlotMapping::I64(DeviceBytes::of(&self.slots)),
        )
        .value(kv.slice(n, n).unwrap(), self.vc.bytes_mut())
    }
}

/// Group `pdl` (see the module docs): producer → decode-size update pairs in CUDA graphs, with
/// and without programmatic dependent launch.
fn pdl(c: &mut Criterion, rec: &RefCell<Rec>, g: &Gpu, stream: &Stream, cfg: &Cfg) {
    let mut grp = group(c, "pdl");
    let iters = env_usize("KVIO_BENCH_PRODUCER_ITERS", 256) as u32;
    println!(
        "pdl: programmatic dependent launch {} ({:?} PTX); producer {iters} steps per thread",
        if g.kv.supports_pdl() {
            "on"
        } else {
            "NOT available: the pdl rows launch plainly"
        },
        g.kv.arch()
    );
    for t in [1usize, 16, 64, 256] {
        let w = PdlSetup::new(cfg, t, 500 + t as u64);
        let op = w.op();
        let produce = |s: StreamRef<'_>| {
            g.kv.bench_produce(w.kv.bytes_mut(), iters, t as u32, false, s)
                .expect("producer")
        };
        let graphs = [
            (
                "producer-x100",
                Graph::capture(stream, |s| {
                    for _ in 0..100 {
                        produce(s);
                    }
                }),
            ),
            (
                "update-x100",
                Graph::capture(stream, |s| {
                    for _ in 0..100 {
                        g.kv.update_slots(&op, s.pdl(false)).expect("update_slots");
                    }
                }),
            ),
            (
                "pair-x100",
                Graph::capture(stream, |s| {
                    for _ in 0..100 {
                        produce(s);
                        g.kv.update_slots(&op, s.pdl(false)).expect("update_slots");
                    }
                }),
            ),
            (
                "pair-pdl-x100",
                Graph::capture(stream, |s| {
                    for _ in 0..100 {
                        produce(s);
                        g.kv.update_slots(&op, s.pdl(true))
                            .expect("update_slots with PDL");
                    }
                }),
            ),
            // The floor: a kernel that only waits for the producer, chained the same two ways.
            (
                "wait-x100",
                Graph::capture(stream, |s| {
                    for _ in 0..100 {
                        produce(s);
                        g.kv.bench_wait(s.pdl(false)).expect("wait kernel");
                    }
                }),
            ),
            (
                "wait-pdl-x100",
                Graph::capture(stream, |s| {
                    for _ in 0..100 {
                        produce(s);
                        g.kv.bench_wait(s.pdl(true)).expect("wait kernel with PDL");
                    }
                }),
            ),
        ];
        for (variant, graph) in &graphs {
            measure(&mut grp, rec, "pdl", t, variant, 0, stream, || {
                graph.launch(stream)
            });
        }
    }
    grp.finish();
}

/// Calls per timed batch of group `host` (`KVIO_BENCH_HOST_CALLS`, default 100): few enough
/// that the stream's queue never fills (a full queue would make the host wait for the GPU).
fn host_calls() -> usize {
    env_usize("KVIO_BENCH_HOST_CALLS", 100).clamp(1, 1000)
}

/// Timed batches per variant of group `host` (`KVIO_BENCH_HOST_ROUNDS`, default 50).
fn host_rounds() -> usize {
    env_usize("KVIO_BENCH_HOST_ROUNDS", 50).max(1)
}

/// Host time of one call of `f`: `rounds` batches of `calls` back-to-back calls each timed with
/// `Instant` (plan and enqueue only: nothing waits for the GPU inside the timed region), the
/// stream synchronised before each batch (outside the timing) so every batch starts on an
/// empty queue. Records each batch's seconds per call under (`group`, `param`, `variant`);
/// the report gives the median.
#[allow(clippy::too_many_arguments)]
fn measure_host(
    rec: &RefCell<Rec>,
    group: &str,
    param: usize,
    variant: &str,
    calls: usize,
    stream: &Stream,
    mut f: impl FnMut(),
) {
    f(); // first call outside timing: module/JIT/first-touch costs, scratch pool growth
    stream.synchronize().expect("sync");
    let mut secs = Vec::with_capacity(host_rounds());
    for _ in 0..host_rounds() {
        stream.synchronize().expect("sync");
        let t0 = Instant::now();
        for _ in 0..calls {
            f();
        }
        secs.push(t0.elapsed().as_secs_f64() / calls as f64);
    }
    stream
        .synchronize()
        .expect("sync (a kernel fault shows here)");
    rec.borrow_mut().runs.insert(
        (group.to_string(), param, variant.to_string()),
        Run { bytes: 0, secs },
    );
}

/// Tokens of the write-path operations of group `host` (decode size).
const HOST_T: usize = 16;
/// Block pairs of the block-copy operations of group `host`.
const HOST_PAIRS: usize = 4;

/// Group `host` (see the module docs): host time per call of every operation, no GPU wait.
fn host(rec: &RefCell<Rec>, g: &Gpu, stream: &Stream, cfg: &Cfg) {
    let calls = host_calls();
    let s = StreamRef::from(stream);
    let t = HOST_T;
    // Yardsticks: an empty kernel, and the naive update kernel of `slot-update` at T.
    let grp = "host/update";
    measure_host(rec, grp, t, "empty-launch", calls, stream, || {
        g.kv.bench_noop(s).expect("noop")
    });
    let w = WriteSetup::new(cfg, t, 16, 4000);
    let spans = w.spans();
    let table = span_table(&spans);
    let row = cfg.heads * cfg.dim * cfg.elem;
    measure_host(rec, grp, t, "naive-kernel", calls, stream, || {
        naive(g, &table, spans.len(), row, cfg.elem, stream)
    });
    let op = w.op();
    measure_host(rec, grp, t, "slots-nhd", calls, stream, || {
        g.kv.update_slots(&op, s).expect("update_slots")
    });
    measure_host(rec, grp, t, "slots-nhd-pdl", calls, stream, || {
        g.kv.update_slots(&op, s.pdl(true))
            .expect("update_slots pdl")
    });
    measure_host(rec, grp, t, "slots-nhd-plain", calls, stream, || {
        g.kv.update_slots(&op, s.pdl(false))
            .expect("update_slots plain")
    });
    let f8 = Fp8Setup::new(t, cfg.heads, cfg.dim, 16, 4001);
    let op = f8.op();
    measure_host(rec, grp, t, "slots-fp8", calls, stream, || {
        g.kv.update_slots(&op, s).expect("update_slots fp8")
    });
    for fp8 in [false, true] {
        let v0 = V0Setup::new(t, 16, fp8, V0Fill::Random, cfg, 4002);
        let op = v0.op();
        let v = if fp8 { "slots-v0-fp8" } else { "slots-v0" };
        measure_host(rec, grp, t, v, calls, stream, || {
            g.kv.update_slots(&op, s).expect("update_slots v0")
        });
        let mla = MlaSetup::new(t, fp8, 4003, false);
        let op = mla.op();
        let v = if fp8 { "mla-fp8" } else { "mla" };
        measure_host(rec, grp, t, v, calls, stream, || {
            g.kv.update_mla(&op, s).expect("update_mla")
        });
    }
    {
        let heads = 2 * cfg.heads;
        let bs = 16;
        let blocks = t.div_ceil(bs) + 8;
        let layout = PagedLayout::nhd(blocks, bs, heads, cfg.dim, cfg.elem);
        let input = TokenLayout::contiguous(t, heads, cfg.dim, cfg.elem);
        let src = upload(&random_bytes(input.extent("i").unwrap() as usize, 7));
        let cache = Mem::new(false, layout.extent("l").unwrap() as usize);
        let slots = random_slots(blocks * bs, t, 4004);
        let slices = slots_to_slices(&slots, bs).unwrap();
        let padded = slices.len() + 8;
        let table = upload(&slices_to_table(&slices, padded).unwrap());
        let count = upload(&[slices.len() as i32]);
        let op = SliceUpdate::new(
            DeviceBytes::of(&src),
            input,
            cache.bytes_mut(),
            layout,
            DeviceBytes::of(&table),
            padded,
            DeviceBytes::of(&count),
        );
        measure_host(rec, grp, t, "slices", calls, stream, || {
            g.kv.update_slices(&op, s).expect("update_slices")
        });
    }
    // Block copies: HOST_PAIRS pairs at page size 16, every backend and map kind, inside the
    // GPU (one pool, copy-on-write) and to and from pinned host pools.
    let bs = 16;
    let n = HOST_PAIRS;
    let staging = Mem::new(false, 16 * n);
    for (grp, src_host, dst_host) in [
        ("host/copy-blocks", false, false),
        ("host/offload", false, true),
        ("host/onload", true, false),
    ] {
        for (label, gpu_kind, host_kind) in [
            (
                "layer-separate",
                PoolKind::LayerSeparate,
                PoolKind::LayerFirst,
            ),
            ("cross-layer", PoolKind::CrossLayer, PoolKind::CrossLayer),
        ] {
            let kind = |on_host: bool| if on_host { host_kind } else { gpu_kind };
            // Inside the GPU: one pool, blocks 0..n copied to n..2n.
            let (src, dst, pairs) = if !src_host && !dst_host {
                let pool = Pool::new(cfg, gpu_kind, false, 2 * n, bs);
                (pool, None, shuffled_pairs(n, n, n, 4005))
            } else {
                let src = Pool::new(cfg, kind(src_host), src_host, n, bs);
                let dst = Pool::new(cfg, kind(dst_host), dst_host, n, bs);
                (src, Some(dst), shuffled_pairs(n, n, 0, 4006))
            };
            let dst_pool = dst.as_ref().unwrap_or(&src);
            let map_d = upload(&pairs.iter().flatten().copied().collect::<Vec<i64>>());
            let base = BlockCopy {
                src: src.pool(cfg, bs).into(),
                dst: dst_pool.pool(cfg, bs),
                map: BlockMap::Device {
                    pairs: DeviceBytes::of(&map_d),
                    len: n,
                },
                backend: Backend::Kernel,
                max_ctas: None,
                staging: None,
                errors: None,
            };
            let host_map = BlockCopy {
                map: BlockMap::Host(&pairs),
                ..base
            };
            // Copy-engine spans one call enqueues (blocks merge only between cross-layer
            // pools; shuffled pairs never form runs).
            let dma_spans = if label == "cross-layer" {
                n
            } else {
                n * cfg.layers * 2
            };
            let cases = [
                ("kernel-device-map", base),
                ("kernel-host-map", host_map),
                (
                    "kernel-host-map-staging",
                    BlockCopy {
                        staging: Some(staging.bytes_mut()),
                        ..host_map
                    },
                ),
                (
                    "dma",
                    BlockCopy {
                        backend: Backend::Dma,
                        ..host_map
                    },
                ),
                (
                    "auto-host-map",
                    BlockCopy {
                        backend: Backend::Auto,
                        ..host_map
                    },
                ),
            ];
            for (v, op) in cases {
                let ran = g.kv.copy_blocks(&op, s).expect("copy_blocks");
                // Keep a batch's queue short: DMA calls enqueue one copy per span (or one
                // batch of them).
                let calls = if ran == Backend::Dma {
                    (256 / dma_spans).clamp(1, calls)
                } else {
                    calls
                };
                measure_host(rec, grp, n, &format!("{label}/{v}"), calls, stream, || {
                    g.kv.copy_blocks(&op, s).expect("copy_blocks");
                });
            }
        }
    }
}

/// `n` bf16 values spread like activations (uniform in [-4, 4), no NaN or inf), as bytes: what
/// a model's K and V hold (random bit patterns would be mostly huge, tiny or NaN, the rare
/// cases of the conversion).
fn activations(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    (0..n)
        .flat_map(|_| {
            let x = (rng.below(1 << 20) as f32 / (1 << 20) as f32) * 8.0 - 4.0;
            ((x.to_bits() >> 16) as u16).to_le_bytes()
        })
        .collect()
}

/// Buffers of one fp8 update benchmark: bf16 inputs, both e4m3 caches in one allocation.
struct Fp8Setup {
    input: TokenLayout,
    cache: PagedLayout,
    caches: Mem,
    key: DeviceBuffer<u8>,
    value: DeviceBuffer<u8>,
    scales: DeviceBuffer<f32>,
    slots: DeviceBuffer<i64>,
}

impl Fp8Setup {
    fn new(t: usize, h: usize, d: usize, bs: usize, seed: u64) -> Fp8Setup {
        let blocks = t.div_ceil(bs) + 8;
        let cache = PagedLayout::nhd(blocks, bs, h, d, 1);
        let input = TokenLayout::contiguous(t, h, d, 2);
        let n = input.extent("i").unwrap() as usize;
        let ext = cache.extent("c").unwrap() as usize;
        Fp8Setup {
            input,
            cache,
            caches: random_mem(2 * ext, seed + 1),
            key: upload(&activations(n / 2, seed + 2)),
            value: upload(&activations(n / 2, seed + 3)),
            scales: upload(&[0.37f32, 1.9]),
            slots: upload(&random_slots(blocks * bs, t, seed)),
        }
    }

    fn op(&self) -> SlotUpdate<'_> {
        let all = self.caches.bytes_mut();
        let (kc, vc) = all.split_at(all.len() / 2).unwrap();
        let sc = DeviceBytes::of(&self.scales);
        let q = kvio::Quantize::new(
            kvio::SrcType::Bf16,
            kvio::Fp8::E4m3,
            kvio::Scale::PerTensor(sc.slice(0, 4).unwrap()),
        )
        .value_scale(kvio::Scale::PerTensor(sc.slice(4, 4).unwrap()));
        SlotUpdate::new(
            DeviceBytes::of(&self.key),
            self.input,
            kc,
            self.cache,
            SlotMapping::I64(DeviceBytes::of(&self.slots)),
        )
        .value(DeviceBytes::of(&self.value), vc)
        .quantize(q)
    }

    /// vLLM's `reshape_and_cache_flash` of the same update into `caches` (K then V, this
    /// setup's or their twin), with the same scales.
    fn flash(&self, caches: &Mem) -> peer::Flash {
        peer::Flash::new(
            [&self.key, &self.value].map(|b| DeviceBytes::of(b).ptr()),
            halves(caches),
            DeviceBytes::of(&self.slots).ptr(),
            &self.input,
            self.cache.block_size,
            DeviceBytes::of(&self.scales).ptr(),
        )
    }
}

/// fp8 quantize-on-write: bf16 K and V `[T, H, D]` into e4m3 NHD caches (16-token pages) with
/// per-tensor scales; bytes = bf16 read + fp8 written. vLLM's anchor on this GPU
/// (`reshape_and_cache_flash`, fp8 e4m3, `../shared/LAYOUTS.md`): 827 / 844 GB/s at T = 4,096
/// / 65,536, 2.32 / 2.75 / 3.10 µs per call in a graph at T = 1 / 64 / 256.
fn fp8_update(
    c: &mut Criterion,
    rec: &RefCell<Rec>,
    g: &Gpu,
    stream: &Stream,
    cfg: &Cfg,
    peer: Option<&peer::Vllm>,
) {
    let mut grp = group(c, "fp8-update");
    let (h, d, bs) = (cfg.heads, cfg.dim, 16);
    let (ours, theirs) = ("kvio-e4m3", "vllm-e4m3");
    for t in [1usize, 16, 256, 4096, 16384, 65536] {
        if !grp.wants("fp8-update/T", t, &[ours, theirs]) {
            continue;
        }
        let s = Fp8Setup::new(t, h, d, bs, 500 + t as u64);
        let tw = twins(peer, [&s.caches], stream);
        let u = s.op();
        let bytes = 2 * (t * h * d * (2 + 1)) as u64;
        measure(
            &mut grp,
            rec,
            "fp8-update/T",
            t,
            ours,
            bytes,
            stream,
            || {
                g.kv.update_slots(&u, StreamRef::from(stream))
                    .expect("update_slots")
            },
        );
        if let (Some(p), Some(tw)) = (peer, &tw) {
            let a = s.flash(&tw[0]);
            peer_row(
                &mut grp,
                rec,
                "fp8-update/T",
                t,
                theirs,
                bytes,
                stream,
                (&[&s.caches], tw),
                || {
                    g.kv.update_slots(&u, StreamRef::from(stream))
                        .expect("update_slots")
                },
                // SAFETY: the setup's inputs, slots and scales, the twin of its caches.
                || unsafe { p.flash(true, &a, stream) },
            );
        }
    }
    let (ours, theirs) = ("kvio-x100", "vllm-x100");
    for t in [1usize, 64, 256] {
        if !grp.wants("fp8-update/graph-latency", t, &[ours, theirs]) {
            continue;
        }
        let s = Fp8Setup::new(t, h, d, bs, 900 + t as u64);
        let u = s.op();
        let graph = Graph::capture(stream, |st| {
            for _ in 0..100 {
                g.kv.update_slots(&u, st).expect("update_slots");
            }
        });
        measure(
            &mut grp,
            rec,
            "fp8-update/graph-latency",
            t,
            ours,
            0,
            stream,
            || graph.launch(stream),
        );
        if let Some(p) = peer {
            let a = s.flash(&s.caches);
            // SAFETY: the setup's buffers.
            let launch = || unsafe { p.flash(true, &a, stream) };
            peer_graph_row(
                &mut grp,
                rec,
                "fp8-update/graph-latency",
                t,
                theirs,
                stream,
                launch,
            );
        }
    }
    grp.finish();
}

/// How a v0 benchmark's tokens map to slots.
#[derive(Clone, Copy, PartialEq)]
enum V0Fill {
    /// Every token a random free slot (decode-like scatter).
    Random,
    /// One sequence filling whole pages in a random page order (prefill of one sequence).
    Pages,
    /// A prefill batch: sequences of 1 to `2 * mean - 1` tokens (uniform), each on its own
    /// pages, from the start of its first page or (`chunked`: a chunked prefill's
    /// continuation) from a random slot of it.
    Batch { mean: usize, chunked: bool },
}

/// Buffers of one v0-layout update benchmark (vLLM `reshape_and_cache`, mistral.rs and
/// candle-vllm paged attention): bf16 K and V `[T, H, D]` into a v0 key cache `[NB, H, D/x,
/// bs, x]` and value cache `[NB, H, D, bs]`, bf16 or e4m3; tokens fill whole pages (prefill)
/// or take random slots.
struct V0Setup {
    input: TokenLayout,
    key_layout: PagedLayout,
    value_layout: PagedLayout,
    caches: Mem,
    key: DeviceBuffer<u8>,
    value: DeviceBuffer<u8>,
    scales: DeviceBuffer<f32>,
    slots: DeviceBuffer<i64>,
    fp8: bool,
}

impl V0Setup {
    fn new(t: usize, bs: usize, fp8: bool, fill: V0Fill, cfg: &Cfg, seed: u64) -> V0Setup {
        let (h, d) = (cfg.heads, cfg.dim);
        let e = if fp8 { 1 } else { 2 };
        let mut rng = Rng::new(seed);
        // Sequences as (first token's offset in its first page, tokens): one for `Pages`.
        let seqs = match fill {
            V0Fill::Random | V0Fill::Pages => vec![(0, t)],
            V0Fill::Batch { mean, chunked } => {
                kvio_suite::batch_sequences(&mut rng, t, 2 * mean - 1, bs, chunked)
            }
        };
        let blocks = kvio_suite::batch_pages(&seqs, bs).max(t.div_ceil(bs)) + 8;
        let key_layout = PagedLayout::v0_key(blocks, bs, h, d, e);
        let value_layout = PagedLayout::v0_value(blocks, bs, h, d, e);
        let input = TokenLayout::contiguous(t, h, d, 2);
        let n = t * h * d;
        let ext = key_layout.extent("c").unwrap() as usize;
        let slots = if fill == V0Fill::Random {
            random_slots(blocks * bs, t, seed)
        } else {
            // Each sequence takes fresh pages of a shuffled order, from `off` in its first.
            let mut order: Vec<i64> = (0..blocks as i64).collect();
            rng.shuffle(&mut order);
            kvio_suite::batch_slots(&seqs, bs, order)
        };
        V0Setup {
            input,
            key_layout,
            value_layout,
            caches: random_mem(2 * ext, seed + 1),
            key: upload(&activations(n, seed + 2)),
            value: upload(&activations(n, seed + 3)),
            scales: upload(&[0.37f32, 1.9]),
            slots: upload(&slots),
            fp8,
        }
    }

    fn op(&self) -> SlotUpdate<'_> {
        let all = self.caches.bytes_mut();
        let (kc, vc) = all.split_at(all.len() / 2).unwrap();
        let op = SlotUpdate::new(
            DeviceBytes::of(&self.key),
            self.input,
            kc,
            self.key_layout,
            SlotMapping::I64(DeviceBytes::of(&self.slots)),
        )
        .value(DeviceBytes::of(&self.value), vc)
        .value_layout(self.value_layout);
        if !self.fp8 {
            return op;
        }
        let sc = DeviceBytes::of(&self.scales);
        op.quantize(
            kvio::Quantize::new(
                kvio::SrcType::Bf16,
                kvio::Fp8::E4m3,
                kvio::Scale::PerTensor(sc.slice(0, 4).unwrap()),
            )
            .value_scale(kvio::Scale::PerTensor(sc.slice(4, 4).unwrap())),
        )
    }

    /// vLLM's `reshape_and_cache` of the same update into `caches` (K then V, this setup's or
    /// their twin), with the same scales (read for e4m3 caches only).
    fn vllm(&self, caches: &Mem) -> peer::V0 {
        peer::V0::new(
            [&self.key, &self.value].map(|b| DeviceBytes::of(b).ptr()),
            halves(caches),
            DeviceBytes::of(&self.slots).ptr(),
            &self.input,
            self.key_layout.block_size,
            DeviceBytes::of(&self.scales).ptr(),
        )
    }

    /// Bytes read (bf16) and written (cache elements), K and V.
    fn bytes(&self) -> u64 {
        let i = &self.input;
        2 * (i.num_tokens * i.num_heads * i.head_dim * (2 + self.key_layout.elem_bytes)) as u64
    }
}

/// vLLM's v0 paged layout (`reshape_and_cache`), bf16 and fp8 e4m3 caches: tokens filling
/// whole pages (prefill; from T = 256, else random slots) per token count at page 16 and per
/// page size at T = 16,384 (bf16 also launched plainly, `kvio-bf16-plain`, from T = 4,096),
/// prefill batches of many sequences per page size at T = 16,384 (`v0-update/batch`: variants
/// `-seq1024`, `-seq128`, `-chunked1024`, see [`V0Fill::Batch`]), then decode sizes in a CUDA graph beside the NHD update's latency measured the same way. vLLM's
/// anchor on this GPU (`../shared/LAYOUTS.md`): bf16 324 / 170 GB/s, fp8 362 / 169 GB/s at
/// T = 16,384 / 65,536.
fn v0_update(
    c: &mut Criterion,
    rec: &RefCell<Rec>,
    g: &Gpu,
    stream: &Stream,
    cfg: &Cfg,
    peer: Option<&peer::Vllm>,
) {
    let mut grp = group(c, "v0-update");
    // (group, T, page size, how the tokens fill pages, variant suffix)
    let fill = |t: usize| {
        if t >= 256 {
            V0Fill::Pages
        } else {
            V0Fill::Random
        }
    };
    let mut cases: Vec<(&str, usize, usize, V0Fill, &str)> = [1usize, 16, 256, 4096, 16384, 65536]
        .iter()
        .map(|&t| ("v0-update/T", t, 16, fill(t), ""))
        .collect();
    cases.extend(
        cfg.pages
            .iter()
            .map(|&bs| ("v0-update/page", 16384usize, bs, V0Fill::Pages, "")),
    );
    // A prefill batch at T = 16,384 per page size: sequences of 1,024 tokens on average
    // (uniform 1 to 2,047), of 128 on average, and of 1,024 on average each continuing a
    // chunked prefill (starting at a random slot of its first page).
    for (fill, what) in [
        (
            V0Fill::Batch {
                mean: 1024,
                chunked: false,
            },
            "-seq1024",
        ),
        (
            V0Fill::Batch {
                mean: 128,
                chunked: false,
            },
            "-seq128",
        ),
        (
            V0Fill::Batch {
                mean: 1024,
                chunked: true,
            },
            "-chunked1024",
        ),
    ] {
        cases.extend(
            cfg.pages
                .iter()
                .map(|&bs| ("v0-update/batch", 16384usize, bs, fill, what)),
        );
    }
    // `-plain`: launched without programmatic dependent launch, so a launch does not overlap
    // the tail of the one before it.
    for (fp8, pdl, variant) in [
        (false, None, "kvio-bf16"),
        (false, Some(false), "kvio-bf16-plain"),
        (true, None, "kvio-fp8-e4m3"),
    ] {
        for &(name, t, bs, fill, what) in &cases {
            if pdl.is_some() && (t < 4096 || fill != V0Fill::Pages) {
                continue;
            }
            let param = if name == "v0-update/T" { t } else { bs };
            let ours = format!("{variant}{what}");
            let theirs = format!("vllm{}{what}", &variant["kvio".len()..]);
            if !grp.wants(name, param, &[&ours, &theirs]) {
                continue;
            }
            let s = V0Setup::new(t, bs, fp8, fill, cfg, 1100 + t as u64 + bs as u64);
            // vLLM beside kvio's default launch.
            let tw = twins(peer.filter(|_| pdl.is_none()), [&s.caches], stream);
            let u = s.op();
            let sref = match pdl {
                Some(on) => StreamRef::from(stream).pdl(on),
                None => StreamRef::from(stream),
            };
            measure(&mut grp, rec, name, param, &ours, s.bytes(), stream, || {
                g.kv.update_slots(&u, sref).expect("update_slots")
            });
            if let (Some(p), Some(tw)) = (peer, &tw) {
                let a = s.vllm(&tw[0]);
                peer_row(
                    &mut grp,
                    rec,
                    name,
                    param,
                    &theirs,
                    s.bytes(),
                    stream,
                    (&[&s.caches], tw),
                    || g.kv.update_slots(&u, sref).expect("update_slots"),
                    // SAFETY: the setup's inputs, slots and scales, the twin of its caches.
                    || unsafe { p.v0(fp8, &a, stream) },
                );
            }
        }
    }
    let graph_rows = ["kvio-v0-x100", "kvio-nhd-x100", "vllm-v0-x100"];
    for t in [1usize, 16, 64, 256] {
        if !grp.wants("v0-update/graph-latency", t, &graph_rows) {
            continue;
        }
        let s = V0Setup::new(t, 16, false, V0Fill::Random, cfg, 1300 + t as u64);
        let nhd = WriteSetup::new(cfg, t, 16, 1400 + t as u64);
        for (variant, op) in [(graph_rows[0], s.op()), (graph_rows[1], nhd.op())] {
            let graph = Graph::capture(stream, |st| {
                for _ in 0..100 {
                    g.kv.update_slots(&op, st).expect("update_slots");
                }
            });
            measure(
                &mut grp,
                rec,
                "v0-update/graph-latency",
                t,
                variant,
                0,
                stream,
                || graph.launch(stream),
            );
        }
        if let Some(p) = peer {
            let a = s.vllm(&s.caches);
            // SAFETY: the setup's buffers.
            let launch = || unsafe { p.v0(false, &a, stream) };
            peer_graph_row(
                &mut grp,
                rec,
                "v0-update/graph-latency",
                t,
                graph_rows[2],
                stream,
                launch,
            );
        }
    }
    grp.finish();
}

/// Buffers of one MLA write benchmark: `[T, 576]` bf16 rows (latent 512 + rope 64, one
/// tensor split as vLLM does), an NHD cache of 64-token pages.
struct MlaSetup {
    input: DeviceBuffer<u8>,
    cache: Mem,
    layout: PagedLayout,
    scale: DeviceBuffer<f32>,
    slots: DeviceBuffer<i64>,
    t: usize,
}

impl MlaSetup {
    /// `t` rows at random slots of a cache of 64-token pages (as vLLM's kernel benchmark draws
    /// them), or with `prefill` as a prefill writes them: whole pages, taken in random order.
    fn new(t: usize, fp8: bool, seed: u64, prefill: bool) -> MlaSetup {
        let bs = 64;
        let blocks = t.div_ceil(bs) + 8;
        let slots = if prefill {
            let mut pages: Vec<i64> = (0..blocks as i64).collect();
            Rng::new(seed).shuffle(&mut pages);
            kvio_suite::batch_slots(&[(0, t)], bs, pages)
        } else {
            random_slots(blocks * bs, t, seed)
        };
        let layout = PagedLayout::nhd(blocks, bs, 1, 576, if fp8 { 1 } else { 2 });
        let ext = layout.extent("c").unwrap() as usize;
        MlaSetup {
            input: upload(&activations(t * 576, seed + 2)),
            cache: random_mem(ext, seed + 1),
            layout,
            scale: upload(&[0.37f32]),
            slots: upload(&slots),
            t,
        }
    }

    fn op(&self) -> kvio::MlaUpdate<'_> {
        let mut lk = TokenLayout::contiguous(self.t, 1, 512, 2);
        let mut lp = TokenLayout::contiguous(self.t, 1, 64, 2);
        (lk.token_stride, lp.token_stride) = (576, 576);
        let input = DeviceBytes::of(&self.input);
        let op = kvio::MlaUpdate::new(
            input,
            lk,
            input.slice(1024, input.len() - 1024).unwrap(),
            lp,
            self.cache.bytes_mut(),
            self.layout,
            SlotMapping::I64(DeviceBytes::of(&self.slots)),
        );
        if self.layout.elem_bytes == 1 {
            let scale = kvio::Scale::PerTensor(DeviceBytes::of(&self.scale));
            op.quantize(kvio::Quantize::new(
                kvio::SrcType::Bf16,
                kvio::Fp8::E4m3,
                scale,
            ))
        } else {
            op
        }
    }

    /// vLLM's `concat_and_cache_mla` of the same rows into `cache` (this setup's or its
    /// twin), with the same scale (read for an e4m3 cache only).
    fn vllm(&self, cache: &Mem) -> peer::Mla {
        peer::Mla {
            rows: DeviceBytes::of(&self.input).ptr(),
            cache: cache.bytes().ptr(),
            slots: DeviceBytes::of(&self.slots).ptr(),
            tokens: self.t,
            block_size: self.layout.block_size,
            scale: DeviceBytes::of(&self.scale).ptr(),
        }
    }
}

/// MLA cache writes (vLLM `concat_and_cache_mla`), bf16 copied and quantized to e4m3; bytes =
/// bf16 read + cache bytes written. `mla-update/T`: random slots; `mla-update/prefill`
/// (T ≥ 4,096): whole 64-token pages in random order. Then decode sizes in a CUDA graph.
/// vLLM's anchor on this GPU (random slots): bf16 1,013 / 735 GB/s, fp8 732 / 532 GB/s at
/// T = 16,384 / 65,536.
fn mla_update(
    c: &mut Criterion,
    rec: &RefCell<Rec>,
    g: &Gpu,
    stream: &Stream,
    peer: Option<&peer::Vllm>,
) {
    let mut grp = group(c, "mla-update");
    for fp8 in [false, true] {
        let variant = if fp8 { "kvio-fp8-e4m3" } else { "kvio-bf16" };
        for t in [1usize, 16, 256, 4096, 16384, 65536] {
            let bytes = (t * 576 * (2 + if fp8 { 1 } else { 2 })) as u64;
            // Random slots at every size; from T = 4,096 also whole pages in random order
            // (`mla-update/prefill`), as a prefill's slot mapping places its rows.
            for prefill in [false, true] {
                if prefill && t < 4096 {
                    continue;
                }
                let name = if prefill {
                    "mla-update/prefill"
                } else {
                    "mla-update/T"
                };
                let theirs = format!("vllm{}", &variant["kvio".len()..]);
                if !grp.wants(name, t, &[variant, &theirs]) {
                    continue;
                }
                let s = MlaSetup::new(t, fp8, 700 + t as u64, prefill);
                let tw = twins(peer, [&s.cache], stream);
                let u = s.op();
                measure(&mut grp, rec, name, t, variant, bytes, stream, || {
                    g.kv.update_mla(&u, StreamRef::from(stream))
                        .expect("update_mla")
                });
                if let (Some(p), Some(tw)) = (peer, &tw) {
                    let a = s.vllm(&tw[0]);
                    peer_row(
                        &mut grp,
                        rec,
                        name,
                        t,
                        &theirs,
                        bytes,
                        stream,
                        (&[&s.cache], tw),
                        || {
                            g.kv.update_mla(&u, StreamRef::from(stream))
                                .expect("update_mla")
                        },
                        // SAFETY: the setup's rows, slots and scale, the twin of its cache.
                        || unsafe { p.mla(fp8, &a, stream) },
                    );
                }
            }
        }
    }
    // Decode sizes in a CUDA graph: time per call.
    for fp8 in [false, true] {
        let variant = if fp8 {
            "kvio-fp8-x100"
        } else {
            "kvio-bf16-x100"
        };
        let theirs = format!("vllm{}", &variant["kvio".len()..]);
        for t in [1usize, 64, 256] {
            if !grp.wants("mla-update/graph-latency", t, &[variant, &theirs]) {
                continue;
            }
            let s = MlaSetup::new(t, fp8, 750 + t as u64, false);
            let u = s.op();
            let graph = Graph::capture(stream, |st| {
                for _ in 0..100 {
                    g.kv.update_mla(&u, st).expect("update_mla");
                }
            });
            measure(
                &mut grp,
                rec,
                "mla-update/graph-latency",
                t,
                variant,
                0,
                stream,
                || graph.launch(stream),
            );
            if let Some(p) = peer {
                let a = s.vllm(&s.cache);
                // SAFETY: the setup's buffers.
                let launch = || unsafe { p.mla(fp8, &a, stream) };
                peer_graph_row(
                    &mut grp,
                    rec,
                    "mla-update/graph-latency",
                    t,
                    &theirs,
                    stream,
                    launch,
                );
            }
        }
    }
    grp.finish();
}

fn slice_update(c: &mut Criterion, rec: &RefCell<Rec>, g: &Gpu, stream: &Stream, cfg: &Cfg) {
    let mut grp = group(c, "slice-update");
    // vLLM TPU layout: rows of K and V heads together (H' = 2H), flat cache.
    let heads = 2 * cfg.heads;
    let row = heads * cfg.dim * cfg.elem;
    // The rows each setup serves (a setup is built only where one of them runs).
    let (row_kvio, row_fp8, row_fp8_slots, row_v0, row_v0_slots, row_naive) = (
        "kvio",
        "kvio-fp8",
        "kvio-fp8-slots",
        "kvio-v0",
        "kvio-v0-slots",
        "naive-kernel",
    );
    let all_rows = [
        row_kvio,
        row_fp8,
        row_fp8_slots,
        row_v0,
        row_v0_slots,
        row_naive,
    ];
    for (t, bs) in write_cases(cfg) {
        let name = if bs == 16 && t != 16384 {
            "slice-update/T"
        } else {
            "slice-update/page"
        };
        let param = if name == "slice-update/T" { t } else { bs };
        if !grp.wants(name, param, &all_rows) {
            continue;
        }
        let blocks = t.div_ceil(bs) + 8;
        let layout = PagedLayout::nhd(blocks, bs, heads, cfg.dim, cfg.elem);
        let input = TokenLayout::contiguous(t, heads, cfg.dim, cfg.elem);
        let src = upload(&random_bytes(input.extent("i").unwrap() as usize, 5));
        let mut cache = Mem::new(false, layout.extent("l").unwrap() as usize);
        cache.fill(&random_bytes(cache.bytes().len(), 6));
        // Prefill-like: tokens fill whole pages, taken in random order.
        let mut rng = Rng::new(t as u64);
        let mut pages: Vec<i64> = (0..blocks as i64).collect();
        rng.shuffle(&mut pages);
        let slots: Vec<i64> = (0..t)
            .map(|i| pages[i / bs] * bs as i64 + (i % bs) as i64)
            .collect();
        let slices = slots_to_slices(&slots, bs).unwrap();
        let padded = slices.len() + 8;
        let table = upload(&slices_to_table(&slices, padded).unwrap());
        let count = upload(&[slices.len() as i32]);
        let op = SliceUpdate {
            new_kv: DeviceBytes::of(&src),
            input,
            cache: cache.bytes_mut(),
            layout,
            slices: DeviceBytes::of(&table),
            padded,
            num_slices: DeviceBytes::of(&count),
            errors: None,
            value: None,
            value_layout: None,
            quantize: None,
            slot_list: None,
        };
        let bytes = 2 * (t * row) as u64;
        measure(&mut grp, rec, name, param, row_kvio, bytes, stream, || {
            g.kv.update_slices(&op, StreamRef::from(stream))
                .expect("update_slices")
        });
        // Through the slot list (`kvio_slices_to_slots`, then the slot update): the same rows
        // quantized to fp8 e4m3 (bf16 read, fp8 written), and K and V of H heads each into
        // v0 caches, beside the slot update of the same v0 write (what the list costs).
        if cfg.elem == 2 {
            let fp8_layout = PagedLayout::nhd(blocks, bs, heads, cfg.dim, 1);
            let mut fp8_cache = Mem::new(false, fp8_layout.extent("l").unwrap() as usize);
            fp8_cache.fill(&random_bytes(fp8_cache.bytes().len(), 7));
            let scale = upload(&[0.75f32]);
            // Activation-like bf16 values, as the fp8 group quantizes.
            let acts = upload(&activations(src.len() / 2, 8));
            let q = SliceUpdate {
                new_kv: DeviceBytes::of(&acts),
                cache: fp8_cache.bytes_mut(),
                layout: fp8_layout,
                quantize: Some(kvio::Quantize::new(
                    kvio::SrcType::Bf16,
                    kvio::Fp8::E4m3,
                    kvio::Scale::PerTensor(DeviceBytes::of(&scale)),
                )),
                ..op
            };
            let fp8_bytes = (t * row + t * row / 2) as u64;
            measure(
                &mut grp,
                rec,
                name,
                param,
                row_fp8,
                fp8_bytes,
                stream,
                || {
                    g.kv.update_slices(&q, StreamRef::from(stream))
                        .expect("update_slices fp8")
                },
            );
            let slots_dev = upload(&slots);
            let q_slots = SlotUpdate::new(
                q.new_kv,
                input,
                q.cache,
                fp8_layout,
                SlotMapping::I64(DeviceBytes::of(&slots_dev)),
            )
            .quantize(q.quantize.unwrap());
            measure(
                &mut grp,
                rec,
                name,
                param,
                row_fp8_slots,
                fp8_bytes,
                stream,
                || {
                    g.kv.update_slots(&q_slots, StreamRef::from(stream))
                        .expect("update_slots fp8")
                },
            );
        }
        let h = cfg.heads;
        let (kl, vl) = (
            PagedLayout::v0_key(blocks, bs, h, cfg.dim, cfg.elem),
            PagedLayout::v0_value(blocks, bs, h, cfg.dim, cfg.elem),
        );
        let one = TokenLayout::contiguous(t, h, cfg.dim, cfg.elem);
        let half = one.extent("i").unwrap() as usize;
        let v0_cache = Mem::new(false, 2 * kl.extent("l").unwrap() as usize);
        let (kc, vc) = v0_cache
            .bytes_mut()
            .split_at(kl.extent("l").unwrap() as usize)
            .unwrap();
        let whole = DeviceBytes::of(&src);
        let (ks, vs) = (
            whole.slice(0, half).unwrap(),
            whole.slice(half, half).unwrap(),
        );
        let v0 = SliceUpdate::new(
            ks,
            one,
            kc,
            kl,
            DeviceBytes::of(&table),
            padded,
            DeviceBytes::of(&count),
        )
        .value(vs, vc)
        .value_layout(vl);
        measure(&mut grp, rec, name, param, row_v0, bytes, stream, || {
            g.kv.update_slices(&v0, StreamRef::from(stream))
                .expect("update_slices v0")
        });
        let slots_dev = upload(&slots);
        let v0_slots = SlotUpdate::new(
            ks,
            one,
            kc,
            kl,
            SlotMapping::I64(DeviceBytes::of(&slots_dev)),
        )
        .value(vs, vc)
        .value_layout(vl);
        measure(
            &mut grp,
            rec,
            name,
            param,
            row_v0_slots,
            bytes,
            stream,
            || {
                g.kv.update_slots(&v0_slots, StreamRef::from(stream))
                    .expect("update_slots v0")
            },
        );
        let spans: Vec<(u64, u64)> = slots
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                (
                    src.as_device_ptr().as_raw() + (i * row) as u64,
                    cache.bytes().ptr() + s as u64 * row as u64,
                )
            })
            .collect();
        let st = span_table(&spans);
        measure(&mut grp, rec, name, param, row_naive, bytes, stream, || {
            naive(g, &st, spans.len(), row, cfg.elem, stream)
        });
    }
    grp.finish();
}

/// Pool layouts of the block benchmarks.
#[derive(Clone, Copy, Debug, PartialEq)]
enum PoolKind {
    /// Per-layer K and V caches (NHD) through a pointer table.
    LayerSeparate,
    /// SGLang's layer-first host pool `(2, L, NB, bs, H, D)` in one allocation.
    LayerFirst,
    /// vLLM's cross-layer blocks `(NB, L, 2, bs, H, D)`.
    CrossLayer,
    /// Per-layer K and V caches in vLLM's v0 layout (K `v0_key`, V `v0_value`) through a
    /// pointer table, as mistral.rs and candle-vllm keep them.
    V0,
}

struct Pool {
    /// Views of `mem` (declared first: dropped before it).
    table: Option<LayerTable<'static>>,
    mem: Mem,
    kind: PoolKind,
    blocks: usize,
    layers: usize,
    chunk: usize,
}

impl Pool {
    fn new(cfg: &Cfg, kind: PoolKind, on_host: bool, blocks: usize, bs: usize) -> Pool {
        let chunk = cfg.chunk(bs);
        let mut mem = Mem::new(on_host, blocks * cfg.layers * 2 * chunk);
        mem.fill(&random_bytes(mem.bytes().len(), blocks as u64 ^ bs as u64));
        let table = matches!(kind, PoolKind::LayerSeparate | PoolKind::V0).then(|| {
            let part = blocks * chunk;
            let whole = mem.bytes();
            let views: Vec<kvio::DeviceBytesMut<'static>> = (0..2 * cfg.layers)
                .map(|i| {
                    let v = whole.slice(i * part, part).unwrap();
                    // SAFETY: `mem` moves into the same Pool, which drops the table first; the
                    // bench reads pools from the host only after synchronising.
                    unsafe { kvio::DeviceBytesMut::from_raw(v.ptr(), v.len()) }
                })
                .collect();
            LayerTable::new(&views, 2).unwrap()
        });
        Pool {
            mem,
            table,
            kind,
            blocks,
            layers: cfg.layers,
            chunk,
        }
    }
    fn pool(&self, cfg: &Cfg, bs: usize) -> BlockPool<'_, kvio::Writable> {
        let layout = PagedLayout::nhd(self.blocks, bs, cfg.heads, cfg.dim, cfg.elem);
        match self.kind {
            PoolKind::LayerSeparate => {
                BlockPool::layer_separate(self.table.as_ref().unwrap(), layout)
            }
            PoolKind::LayerFirst => BlockPool::strided(
                self.mem.bytes_mut(),
                self.blocks * self.chunk,
                self.layers * self.blocks * self.chunk,
                self.layers,
                2,
                layout,
            ),
            PoolKind::CrossLayer => BlockPool::cross_layer_nhd(
                self.mem.bytes_mut(),
                self.blocks,
                cfg.layers,
                bs,
                cfg.heads,
                cfg.dim,
                cfg.elem,
            ),
            PoolKind::V0 => {
                let (nb, h, d, e) = (self.blocks, cfg.heads, cfg.dim, cfg.elem);
                BlockPool::layer_separate(
                    self.table.as_ref().unwrap(),
                    PagedLayout::v0_key(nb, bs, h, d, e),
                )
                .value_layout(PagedLayout::v0_value(nb, bs, h, d, e))
            }
        }
    }
    /// Address of the contiguous (block, layer, part) chunk.
    fn chunk_addr(&self, block: usize, layer: usize, part: usize) -> u64 {
        let (b, c, l) = (block as u64, self.chunk as u64, self.layers as u64);
        let nb = self.blocks as u64;
        self.mem.bytes().ptr()
            + match self.kind {
                PoolKind::LayerSeparate | PoolKind::V0 => ((layer * 2 + part) as u64 * nb + b) * c,
                PoolKind::LayerFirst => ((part as u64 * l + layer as u64) * nb + b) * c,
                PoolKind::CrossLayer => (b * l * 2 + (layer * 2 + part) as u64) * c,
            }
    }
}

/// Spans of a block copy: whole blocks when both pools are cross-layer, else one span per
/// (block, layer, K/V) chunk.
fn block_spans(src: &Pool, dst: &Pool, pairs: &[[i64; 2]]) -> (Vec<(u64, u64)>, usize) {
    if src.kind == PoolKind::CrossLayer && dst.kind == PoolKind::CrossLayer {
        let whole = src.layers * 2 * src.chunk;
        let v = pairs
            .iter()
            .map(|p| {
                (
                    src.chunk_addr(p[0] as usize, 0, 0),
                    dst.chunk_addr(p[1] as usize, 0, 0),
                )
            })
            .collect();
        return (v, whole);
    }
    let mut v = Vec::new();
    for p in pairs {
        for l in 0..src.layers {
            for part in 0..2 {
                v.push((
                    src.chunk_addr(p[0] as usize, l, part),
                    dst.chunk_addr(p[1] as usize, l, part),
                ));
            }
        }
    }
    (v, src.chunk)
}

/// One block-copy benchmark set: kvio kernel (device map), kvio bulk copies (`Backend::Tma`,
/// device map, `sm_90`), kvio DMA, kvio's default (Auto, host map, no staging), per-chunk
/// memcpy, naive kernel.
#[allow(clippy::too_many_arguments)]
fn block_case(
    grp: &mut Group<'_>,
    rec: &RefCell<Rec>,
    g: &Gpu,
    stream: &Stream,
    cfg: &Cfg,
    group: &str,
    bs: usize,
    src: &Pool,
    dst: &Pool,
    pairs: &[[i64; 2]],
    bytes_factor: u64,
    ctas: Option<u32>,
) {
    let moved = (pairs.len() * cfg.layers * 2 * cfg.chunk(bs)) as u64;
    let map_d = upload(&pairs.iter().flatten().copied().collect::<Vec<i64>>());
    let base = BlockCopy {
        src: src.pool(cfg, bs).into(),
        dst: dst.pool(cfg, bs),
        map: BlockMap::Device {
            pairs: DeviceBytes::of(&map_d),
            len: pairs.len(),
        },
        backend: Backend::Kernel,
        max_ctas: ctas,
        staging: None,
        errors: None,
    };
    measure(
        grp,
        rec,
        group,
        bs,
        "kvio-kernel",
        moved * bytes_factor,
        stream,
        || {
            g.kv.copy_blocks(&base, StreamRef::from(stream))
                .expect("copy_blocks kernel");
        },
    );
    // The bulk-copy path (sm_90, 16-byte aligned pools), same map and CTA budget as
    // `kvio-kernel` (a CTA there is one warp); skipped where it would run as the kernel.
    let tma = BlockCopy {
        backend: Backend::Tma,
        ..base
    };
    let ran =
        g.kv.copy_blocks(&tma, StreamRef::from(stream))
            .expect("copy_blocks tma");
    if ran == Backend::Tma {
        measure(
            grp,
            rec,
            group,
            bs,
            "kvio-tma",
            moved * bytes_factor,
            stream,
            || {
                g.kv.copy_blocks(&tma, StreamRef::from(stream))
                    .expect("copy_blocks tma");
            },
        );
        // Four times the CTAs (one warp each): still a fraction of one SM's threads per SM.
        if let Some(c) = ctas {
            let wide = BlockCopy {
                max_ctas: Some(4 * c),
                ..tma
            };
            measure(
                grp,
                rec,
                group,
                bs,
                "kvio-tma-x4",
                moved * bytes_factor,
                stream,
                || {
                    g.kv.copy_blocks(&wide, StreamRef::from(stream))
                        .expect("copy_blocks tma");
                },
            );
        }
    }
    let dma = BlockCopy {
        map: BlockMap::Host(pairs),
        backend: Backend::Dma,
        ..base
    };
    measure(
        grp,
        rec,
        group,
        bs,
        "kvio-dma",
        moved * bytes_factor,
        stream,
        || {
            g.kv.copy_blocks(&dma, StreamRef::from(stream))
                .expect("copy_blocks dma");
        },
    );
    // The default a caller gets with a host map and nothing else: Auto, no staging buffer
    // (the map goes through kvio's scratch; DMA only for spans of DMA_MIN_SPAN or more).
    let auto = BlockCopy {
        map: BlockMap::Host(pairs),
        backend: Backend::Auto,
        ..base
    };
    measure(
        grp,
        rec,
        group,
        bs,
        "kvio-auto-host-map",
        moved * bytes_factor,
        stream,
        || {
            g.kv.copy_blocks(&auto, StreamRef::from(stream))
                .expect("copy_blocks auto");
        },
    );
    let (spans, span_bytes) = block_spans(src, dst, pairs);
    let n = spans.len().min(MAX_MEMCPY_SPANS);
    measure(
        grp,
        rec,
        group,
        bs,
        "memcpy-per-chunk",
        (n * span_bytes) as u64 * bytes_factor,
        stream,
        memcpy_spans(&spans, span_bytes, stream),
    );
    let table = span_table(&spans);
    measure(
        grp,
        rec,
        group,
        bs,
        "naive-kernel",
        moved * bytes_factor,
        stream,
        || naive(g, &table, spans.len(), span_bytes, cfg.elem, stream),
    );
}

fn shuffled_pairs(n: usize, src_blocks: usize, dst_offset: usize, seed: u64) -> Vec<[i64; 2]> {
    let mut rng = Rng::new(seed);
    let mut src: Vec<i64> = (0..src_blocks as i64).collect();
    let mut dst: Vec<i64> = (0..n as i64).map(|d| d + dst_offset as i64).collect();
    rng.shuffle(&mut src);
    rng.shuffle(&mut dst);
    (0..n).map(|i| [src[i], dst[i]]).collect()
}

/// Copy engines per descriptor size: `n` blocks of `size` bytes between one device buffer and
/// one pinned host buffer (blocks in shuffled order, so no two copies merge), 64 MiB per call,
/// by `Backend::Dma` (one batched `cuMemcpyBatchAsync` per call where the driver has it)
/// beside one `cuMemcpyAsync` per block issued here. Groups `offload/dma-batch` and
/// `onload/dma-batch` (against the pinned ceilings); param = descriptor bytes.
fn dma_batch(c: &mut Criterion, rec: &RefCell<Rec>, g: &Gpu, stream: &Stream) {
    const TOTAL: usize = 64 << 20;
    for offload in [true, false] {
        let name = if offload {
            "offload/dma-batch"
        } else {
            "onload/dma-batch"
        };
        let mut grp = group(c, name);
        for size in [
            4096usize,
            16 << 10,
            32 << 10,
            64 << 10,
            128 << 10,
            256 << 10,
            2 << 20,
        ] {
            let n = TOTAL / size;
            let layout = PagedLayout::nhd(n, 1, 1, size, 1);
            let dev = random_mem(TOTAL, size as u64);
            let mut host = Mem::new(true, TOTAL);
            host.fill(&random_bytes(TOTAL, size as u64 + 1));
            let (from, to) = if offload {
                (&dev, &host)
            } else {
                (&host, &dev)
            };
            let pairs = shuffled_pairs(n, n, 0, size as u64 + 2);
            let op = BlockCopy::new(
                BlockPool::strided(from.bytes(), 0, 0, 1, 1, layout),
                BlockPool::strided(to.bytes_mut(), 0, 0, 1, 1, layout),
                BlockMap::Host(&pairs),
            )
            .backend(Backend::Dma);
            measure(
                &mut grp,
                rec,
                name,
                size,
                "kvio-dma",
                TOTAL as u64,
                stream,
                || {
                    g.kv.copy_blocks(&op, StreamRef::from(stream))
                        .expect("copy_blocks");
                },
            );
            let (fb, tb) = (from.bytes().ptr(), to.bytes().ptr());
            let spans: Vec<(u64, u64)> = pairs
                .iter()
                .map(|p| {
                    (
                        fb + p[0] as u64 * size as u64,
                        tb + p[1] as u64 * size as u64,
                    )
                })
                .collect();
            let per = spans.len().min(MAX_MEMCPY_SPANS);
            measure(
                &mut grp,
                rec,
                name,
                size,
                "memcpy-per-block",
                (per * size) as u64,
                stream,
                memcpy_spans(&spans, size, stream),
            );
        }
        grp.finish();
    }
}

fn copy_blocks(c: &mut Criterion, rec: &RefCell<Rec>, g: &Gpu, stream: &Stream, cfg: &Cfg) {
    let mut grp = group(c, "copy-blocks");
    for &bs in &cfg.pages {
        let block = cfg.layers * 2 * cfg.chunk(bs);
        let n = (D2D_BYTES / 2 / block).max(1);
        for kind in [PoolKind::LayerSeparate, PoolKind::CrossLayer] {
            // Copy-on-write inside one pool: blocks 0..n to n..2n.
            let pool = Pool::new(cfg, kind, false, 2 * n, bs);
            let pairs = shuffled_pairs(n, n, n, bs as u64);
            let group = format!("copy-blocks/{kind:?}");
            block_case(
                &mut grp, rec, g, stream, cfg, &group, bs, &pool, &pool, &pairs, 2, None,
            );
        }
    }
    grp.finish();
}

/// Group `v0-convert`: block copies between per-layer v0 caches (K and V in their own
/// layouts, through a table) and vLLM's cross-layer NHD blocks, by the kernel backend with a
/// device map, param = page size: `v0-to-cross` and `cross-to-v0` inside the GPU (bytes read
/// and written, against the device-copy ceiling), `v0-to-v0` (whole blocks, the same pools'
/// plain copy) beside them; `offload` (GPU v0 → pinned cross-layer, 2 CTAs, 16 and the
/// default budget) and `onload` (back, 4 CTAs, 16 and the default), against the pinned
/// ceilings (the JSON's percentages there are of the device-copy ceiling).
fn v0_convert(c: &mut Criterion, rec: &RefCell<Rec>, g: &Gpu, stream: &Stream, cfg: &Cfg) {
    let mut grp = group(c, "v0-convert");
    for &bs in &cfg.pages {
        let block = cfg.layers * 2 * cfg.chunk(bs);
        let n = (D2D_BYTES / 4 / block).max(1);
        let v0 = Pool::new(cfg, PoolKind::V0, false, 2 * n, bs);
        let cross = Pool::new(cfg, PoolKind::CrossLayer, false, n, bs);
        let pairs = shuffled_pairs(n, n, 0, bs as u64 + 3);
        let map = upload(&pairs.iter().flatten().copied().collect::<Vec<i64>>());
        let moved = (n * block) as u64;
        let within = shuffled_pairs(n, n, n, bs as u64 + 4);
        let within_map = upload(&within.iter().flatten().copied().collect::<Vec<i64>>());
        let cases: [(&str, &Pool, &Pool, &DeviceBuffer<i64>); 3] = [
            ("v0-to-cross", &v0, &cross, &map),
            ("cross-to-v0", &cross, &v0, &map),
            ("v0-to-v0", &v0, &v0, &within_map),
        ];
        for (label, src, dst, m) in cases {
            let op = kernel_copy(cfg, bs, src, dst, m, n, u32::MAX);
            let group = format!("v0-convert/{label}");
            measure(
                &mut grp,
                rec,
                &group,
                bs,
                "kvio-kernel",
                2 * moved,
                stream,
                || {
                    g.kv.copy_blocks(&op, StreamRef::from(stream))
                        .expect("copy_blocks");
                },
            );
        }
        let n_pcie = (PCIE_BYTES / block).max(1).min(2 * n);
        let host = Pool::new(cfg, PoolKind::CrossLayer, true, n_pcie, bs);
        let pairs = shuffled_pairs(n_pcie, n_pcie, 0, bs as u64 + 5);
        let map = upload(&pairs.iter().flatten().copied().collect::<Vec<i64>>());
        let moved = (n_pcie * block) as u64;
        for (label, src, dst, ctas) in [("offload", &v0, &host, 2u32), ("onload", &host, &v0, 4)] {
            for budget in [Some(ctas), Some(16), None] {
                let mut op = kernel_copy(cfg, bs, src, dst, &map, n_pcie, ctas);
                op.max_ctas = budget;
                let variant = budget.map_or("kvio-kernel-default".to_string(), |c| {
                    format!("kvio-kernel{c}")
                });
                let group = format!("v0-convert/{label}");
                measure(&mut grp, rec, &group, bs, &variant, moved, stream, || {
                    g.kv.copy_blocks(&op, StreamRef::from(stream))
                        .expect("copy_blocks");
                });
            }
        }
    }
    grp.finish();
}

fn transfers(
    c: &mut Criterion,
    rec: &RefCell<Rec>,
    g: &Gpu,
    stream: &Stream,
    cfg: &Cfg,
    offload: bool,
) {
    let dir = if offload { "offload" } else { "onload" };
    let mut grp = group(c, dir);
    // D2H on 2 CTAs, H2D on 4 (the targets' budgets).
    let ctas = Some(if offload { 2 } else { 4 });
    for &bs in &cfg.pages {
        let block = cfg.layers * 2 * cfg.chunk(bs);
        let n = (PCIE_BYTES / block).max(1);
        for (gpu_kind, host_kind, label) in [
            (
                PoolKind::LayerSeparate,
                PoolKind::LayerFirst,
                "layer-separate",
            ),
            (PoolKind::CrossLayer, PoolKind::CrossLayer, "cross-layer"),
            (
                PoolKind::LayerSeparate,
                PoolKind::CrossLayer,
                "convert-lf-pf",
            ),
        ] {
            let gpu_pool = Pool::new(cfg, gpu_kind, false, n, bs);
            let host_pool = Pool::new(cfg, host_kind, true, n, bs);
            let pairs = shuffled_pairs(n, n, 0, bs as u64 + 1);
            let group = format!("{dir}/{label}");
            if offload {
                block_case(
                    &mut grp, rec, g, stream, cfg, &group, bs, &gpu_pool, &host_pool, &pairs, 1,
                    ctas,
                );
            } else {
                block_case(
                    &mut grp, rec, g, stream, cfg, &group, bs, &host_pool, &gpu_pool, &pairs, 1,
                    ctas,
                );
            }
        }
    }
    grp.finish();
}

/// A kernel-backend block copy between bench pools, `len` pairs in `map`, on `ctas` CTAs.
fn kernel_copy<'a>(
    cfg: &Cfg,
    bs: usize,
    src: &'a Pool,
    dst: &'a Pool,
    map: &'a DeviceBuffer<i64>,
    len: usize,
    ctas: u32,
) -> BlockCopy<'a> {
    BlockCopy {
        src: src.pool(cfg, bs).into(),
        dst: dst.pool(cfg, bs),
        map: BlockMap::Device {
            pairs: DeviceBytes::of(map),
            len,
        },
        backend: Backend::Kernel,
        max_ctas: Some(ctas),
        staging: None,
        errors: None,
    }
}

/// Length of the spin yardstick's first run, from which its length per round is scaled.
const SPIN_PROBE_ITERS: u32 = 1 << 16;
/// GPU time of one spin round beside the transfers (each transfer round moves `PCIE_BYTES` per
/// direction, about 2.5 ms on a 55 GB/s link, so the spins end well before the transfers).
const SPIN_TARGET_S: f64 = 1e-3;
/// Threads per CTA of the spin yardstick.
const SPIN_THREADS: u32 = 1024;

/// Group `concurrent`: offload and onload at the same time on two non-blocking streams.
///
/// - `concurrent/ceiling` (param 0): one `PCIE_BYTES` D2H `cuMemcpyAsync` on stream A and one
///   H2D on stream B at once (`bidirectional`, with each stream's own span as
///   `bidirectional/d2h` and `/h2d`), and each alone on its stream (`d2h-alone`, `h2d-alone`).
/// - `concurrent/layer-separate` (GPU layer-separate caches <-> SGLang's layer-first host pool)
///   and `concurrent/cross-layer` (cross-layer on both sides), param = page size: an offload
///   of `PCIE_BYTES` (GPU pool -> host pool) on A and an onload of as many bytes (another host
///   pool -> another GPU pool) on B, shuffled block ids, each by kvio's kernel (`kernelN`, N =
///   CTA budget: `KVIO_BENCH_SPLIT`'s pairs, 2,4 and 1,4 by default, the first for the mixed
///   and bulk-copy pairs) or its DMA backend (`dma`, host map,
///   batched where the driver has `cuMemcpyBatchAsync`): variant `<offload>+<onload>`, with
///   `/offload` and `/onload` the two streams' own spans.
/// - `concurrent/interference/<layout>` (param = page size: 16, or the first page size when 16
///   is not swept): the spin yardstick (`kvio_spin`, a dependent multiply-add chain per
///   thread, `sms - (off + on)` CTAs of 1024 threads for the largest split, about 1 ms a
///   round) alone on stream C (`spin-alone`), then beside the kernel+kernel (every split),
///   dma+dma and bulk-copy pairs on A and B (all three
///   released by one event): `<pair>/spin` is the spin's own time, `<pair>/offload` and
///   `/onload` the transfers', `<pair>` the wall time (GB/s of both transfers).
fn concurrent(c: &mut Criterion, rec: &RefCell<Rec>, g: &Gpu, cfg: &Cfg) {
    let (a, b, cs) = (g.stream(), g.stream(), g.stream());
    for s in [&a, &b, &cs] {
        assert!(s.is_non_blocking().expect("cuStreamGetFlags"));
    }
    println!(
        "concurrent: kernel transfers on {} (offload) + {} (onload) CTAs, also {:?}; DMA batched: {}",
        cfg.split.0,
        cfg.split.1,
        cfg.more_splits,
        g.kv.batched_dma()
    );
    let mut grp = group(c, "concurrent");

    // The bidirectional DMA ceiling, and each direction alone.
    {
        let (d_src, h_dst) = (random_mem(PCIE_BYTES, 901), Mem::new(true, PCIE_BYTES));
        let mut h_src = Mem::new(true, PCIE_BYTES);
        h_src.fill(&random_bytes(PCIE_BYTES, 902));
        let d_dst = Mem::new(false, PCIE_BYTES);
        let d2h = || memcpy(h_dst.bytes().ptr(), d_src.bytes().ptr(), PCIE_BYTES, &a);
        let h2d = || memcpy(d_dst.bytes().ptr(), h_src.bytes().ptr(), PCIE_BYTES, &b);
        let bytes = PCIE_BYTES as u64;
        let group = "concurrent/ceiling";
        measure_across(
            &mut grp,
            rec,
            group,
            0,
            "bidirectional",
            &[(&a, "d2h", bytes), (&b, "h2d", bytes)],
            || {
                d2h();
                h2d();
            },
        );
        measure_across(
            &mut grp,
            rec,
            group,
            0,
            "d2h-alone",
            &[(&a, "d2h", bytes)],
            d2h,
        );
        measure_across(
            &mut grp,
            rec,
            group,
            0,
            "h2d-alone",
            &[(&b, "h2d", bytes)],
            h2d,
        );
    }

    // The spin yardstick: its grid leaves off + on SMs free for the transfer kernel (512-thread
    // CTAs of 120 registers: each needs nearly a whole SM's register file). At 10 registers two spin
    // CTAs could share an SM; the block scheduler spreads them over empty SMs first in practice.
    let reserved = std::iter::once(cfg.split)
        .chain(cfg.more_splits.iter().copied())
        .map(|(off, on)| off + on)
        .max()
        .unwrap_or(0);
    let spin_grid = g.kv.sm_count().saturating_sub(reserved).max(1);
    let spin_out = Mem::new(false, spin_grid as usize * SPIN_THREADS as usize * 4);
    let spin = |iters: u32| {
        g.kv.bench_spin(
            spin_out.bytes_mut(),
            iters,
            spin_grid,
            SPIN_THREADS,
            cs.sref(),
        )
        .expect("spin kernel")
    };
    spin(SPIN_PROBE_ITERS); // first launch outside timing
    cs.synchronize().expect("sync");
    let (probe, _) = time_across(&[&cs], 3, &mut || spin(SPIN_PROBE_ITERS));
    let per_probe = probe.as_secs_f64() / 3.0;
    let spin_iters = ((SPIN_PROBE_ITERS as f64 * SPIN_TARGET_S / per_probe) as u64)
        .clamp(1024, u32::MAX as u64) as u32;
    println!(
        "concurrent: spin yardstick {spin_grid} CTAs x {SPIN_THREADS} threads on {} SMs, {spin_iters} multiply-adds per thread",
        g.kv.sm_count()
    );

    let spin_page = if cfg.concurrent_pages.contains(&16) {
        16
    } else {
        cfg.concurrent_pages.first().copied().unwrap_or(16)
    };
    for &bs in &cfg.concurrent_pages {
        let block = cfg.layers * 2 * cfg.chunk(bs);
        let n = (PCIE_BYTES / block).max(1);
        let moved = (n * block) as u64;
        for (gpu_kind, host_kind, label) in [
            (
                PoolKind::LayerSeparate,
                PoolKind::LayerFirst,
                "layer-separate",
            ),
            (PoolKind::CrossLayer, PoolKind::CrossLayer, "cross-layer"),
        ] {
            // Four pools: what the offload reads and writes is disjoint from the onload's.
            let off_src = Pool::new(cfg, gpu_kind, false, n, bs);
            let off_dst = Pool::new(cfg, host_kind, true, n, bs);
            let on_src = Pool::new(cfg, host_kind, true, n, bs);
            let on_dst = Pool::new(cfg, gpu_kind, false, n, bs);
            let off_pairs = shuffled_pairs(n, n, 0, bs as u64 + 11);
            let on_pairs = shuffled_pairs(n, n, 0, bs as u64 + 12);
            let flat = |p: &[[i64; 2]]| upload(&p.iter().flatten().copied().collect::<Vec<i64>>());
            let (off_map, on_map) = (flat(&off_pairs), flat(&on_pairs));
            let off_k = kernel_copy(cfg, bs, &off_src, &off_dst, &off_map, n, cfg.split.0);
            let on_k = kernel_copy(cfg, bs, &on_src, &on_dst, &on_map, n, cfg.split.1);
            let off_d = BlockCopy::new(
                off_src.pool(cfg, bs),
                off_dst.pool(cfg, bs),
                BlockMap::Host(&off_pairs),
            )
            .backend(Backend::Dma);
            let on_d = BlockCopy::new(
                on_src.pool(cfg, bs),
                on_dst.pool(cfg, bs),
                BlockMap::Host(&on_pairs),
            )
            .backend(Backend::Dma);
            let (kk, dd) = (
                format!("kernel{}+kernel{}", cfg.split.0, cfg.split.1),
                "dma+dma".to_string(),
            );
            // The bulk-copy path (sm_90) on four times the kernels' CTA budgets: its CTAs are
            // one warp, and each multiprocessor's bulk copies to or from host memory move
            // about 8 GB/s (`kvio-tma` against `kvio-tma-x4` in the offload/onload groups).
            let (off_t, on_t) = (
                BlockCopy {
                    backend: Backend::Tma,
                    max_ctas: Some(4 * cfg.split.0),
                    ..off_k
                },
                BlockCopy {
                    backend: Backend::Tma,
                    max_ctas: Some(4 * cfg.split.1),
                    ..on_k
                },
            );
            let tma = g.kv.copy_blocks(&off_t, a.sref()).expect("tma offload") == Backend::Tma;
            a.synchronize().expect("sync");
            let tt = format!("tma{}+tma{}", 4 * cfg.split.0, 4 * cfg.split.1);
            let more: Vec<_> = cfg
                .more_splits
                .iter()
                .map(|&(o, i)| {
                    (
                        format!("kernel{o}+kernel{i}"),
                        kernel_copy(cfg, bs, &off_src, &off_dst, &off_map, n, o),
                        kernel_copy(cfg, bs, &on_src, &on_dst, &on_map, n, i),
                    )
                })
                .collect();
            let mut pairs = vec![(kk.clone(), &off_k, &on_k)];
            pairs.extend(more.iter().map(|(name, off, on)| (name.clone(), off, on)));
            pairs.extend([
                (dd.clone(), &off_d, &on_d),
                (format!("kernel{}+dma", cfg.split.0), &off_k, &on_d),
                (format!("dma+kernel{}", cfg.split.1), &off_d, &on_k),
            ]);
            if tma {
                pairs.push((tt.clone(), &off_t, &on_t));
            }
            let run_pair = |off: &BlockCopy<'_>, on: &BlockCopy<'_>| {
                g.kv.copy_blocks(off, a.sref())
                    .expect("copy_blocks offload");
                g.kv.copy_blocks(on, b.sref()).expect("copy_blocks onload");
            };
            let group = format!("concurrent/{label}");
            for (variant, off, on) in &pairs {
                measure_across(
                    &mut grp,
                    rec,
                    &group,
                    bs,
                    variant,
                    &[(&a, "offload", moved), (&b, "onload", moved)],
                    || run_pair(off, on),
                );
            }
            if bs == spin_page {
                // The spin alone right before it runs beside the pairs (same clocks, same
                // memory state), then beside each pair.
                let group = format!("concurrent/interference/{label}");
                measure_across(
                    &mut grp,
                    rec,
                    &group,
                    bs,
                    "spin-alone",
                    &[(&cs, "spin", 0)],
                    || spin(spin_iters),
                );
                let beside =
                    |v: &str| v == kk || v == dd || v == tt || more.iter().any(|m| m.0 == v);
                for (variant, off, on) in pairs.iter().filter(|p| beside(&p.0)) {
                    measure_across(
                        &mut grp,
                        rec,
                        &group,
                        bs,
                        variant,
                        &[
                            (&cs, "spin", 0),
                            (&a, "offload", moved),
                            (&b, "onload", moved),
                        ],
                        || {
                            run_pair(off, on);
                            spin(spin_iters);
                        },
                    );
                }
            }
        }
    }
    grp.finish();
}

/// What a row of a `concurrent/*` group is compared with: its name and GB/s. Transfer pairs:
/// the bidirectional ceiling (`bidirectional`), each stream's span against the same
/// direction's span in it (`bidirectional/d2h`, `/h2d`). In `concurrent/ceiling`: the
/// bidirectional copy against the sum of the two directions alone, each of its streams
/// against its direction alone.
fn concurrent_reference(rec: &Rec, group: &str, variant: &str) -> Option<(String, f64)> {
    let ceiling = |v: &str| {
        rec.runs
            .get(&("concurrent/ceiling".to_string(), 0, v.to_string()))
            .map(Run::gbps)
    };
    let (name, gbps) = if group == "concurrent/ceiling" {
        match variant {
            "bidirectional" => (
                "d2h-alone + h2d-alone",
                ceiling("d2h-alone")? + ceiling("h2d-alone")?,
            ),
            "bidirectional/d2h" => ("d2h-alone", ceiling("d2h-alone")?),
            "bidirectional/h2d" => ("h2d-alone", ceiling("h2d-alone")?),
            _ => return None,
        }
    } else if variant.ends_with("/offload") {
        ("bidirectional/d2h", ceiling("bidirectional/d2h")?)
    } else if variant.ends_with("/onload") {
        ("bidirectional/h2d", ceiling("bidirectional/h2d")?)
    } else {
        ("bidirectional", ceiling("bidirectional")?)
    };
    Some((name.to_string(), gbps))
}

/// Prints one `concurrent/*` group and adds its JSON rows: transfers as GB/s and % of their
/// reference ([`concurrent_reference`]); the spin yardstick as µs per round, its slowdown
/// against `spin-alone`, and whether both transfers beside it ran at least as long as it did
/// (`covered`: otherwise part of the spin ran without them and the slowdown understates).
fn report_concurrent(rec: &Rec, group: &str, rows: &mut Vec<String>) {
    let get = |g: &str, p: usize, v: &str| rec.runs.get(&(g.to_string(), p, v.to_string()));
    println!("\n--- {group} ---");
    println!(
        "{:>8} {:<28} {:>10} {:>10}  reference",
        "param", "variant", "GB/s", "% of ref"
    );
    for ((_, p, v), r) in rec.runs.iter().filter(|(k, _)| k.0 == group) {
        if v == "spin-alone" || v.ends_with("/spin") {
            let us = r.median() * 1e6;
            let pair = v.trim_end_matches("/spin");
            let beside = v != "spin-alone";
            let alone = get(group, *p, "spin-alone")
                .map(Run::median)
                .unwrap_or(f64::NAN);
            let slow = if beside {
                100.0 * (r.median() / alone - 1.0)
            } else {
                f64::NAN
            };
            let covered = beside
                && ["offload", "onload"].iter().all(|d| {
                    get(group, *p, &format!("{pair}/{d}")).is_some_and(|t| t.median() >= r.median())
                });
            if beside {
                println!(
                    "{p:>8} {v:<28} {us:>10.1} us, {slow:+.1}% vs spin-alone{}",
                    if covered {
                        ""
                    } else {
                        " (NOT covered: a transfer ended before the spin)"
                    }
                );
            } else {
                println!("{p:>8} {v:<28} {us:>10.1} us");
            }
            rows.push(format!(
                "    {{\"group\": \"{group}\", \"param\": {p}, \"variant\": \"{v}\", \"spin_us\": {us:.3}, \"slowdown_pct\": {slow:.2}, \"covered\": {covered}}}"
            ));
            continue;
        }
        let gb = r.gbps();
        let (name, pct) = match concurrent_reference(rec, group, v) {
            Some((name, ref_gb)) => (name, 100.0 * gb / ref_gb),
            None => ("-".to_string(), f64::NAN),
        };
        let pct_text = if pct.is_nan() {
            "-".to_string()
        } else {
            format!("{pct:.1}%")
        };
        println!("{p:>8} {v:<28} {gb:>10.1} {pct_text:>10}  {name}");
        rows.push(format!(
            "    {{\"group\": \"{group}\", \"param\": {p}, \"variant\": \"{v}\", \"bytes\": {}, \"median_s\": {:.9}, \"gbps\": {gb:.3}, \"pct_ceiling\": {pct:.2}, \"reference\": \"{name}\"}}",
            r.bytes,
            r.median()
        ));
    }
}

/// Prints one table per group and writes the JSON file.
fn report(rec: &Rec, device: &str, driver: i32, kernels: &str) {
    let get = |g: &str, p: usize, v: &str| rec.runs.get(&(g.to_string(), p, v.to_string()));
    // vLLM's row beside kvio row `v` (`kvio…` → `vllm…`), where it ran.
    let vllm_row = |g: &str, p: usize, v: &str| {
        v.strip_prefix("kvio")
            .and_then(|rest| get(g, p, &format!("vllm{rest}")))
    };
    let ceil = |v: &str| get("ceiling", 0, v).map(Run::gbps).unwrap_or(f64::NAN);
    let (d2d, h2d, d2h) = (ceil("device-copy"), ceil("pinned-h2d"), ceil("pinned-d2h"));
    let launch = get("ceiling", 0, "empty-launch")
        .map(|r| r.median() * 1e6)
        .unwrap_or(f64::NAN);
    let glaunch = get("ceiling", 0, "empty-launch-in-graph-x100")
        .map(|r| r.median() * 1e6 / 100.0)
        .unwrap_or(f64::NAN);
    println!("\n=== kvio benchmarks on {device} (driver {driver}; kernels {kernels}) ===");
    let d2d_small = ceil("device-copy-128MiB");
    println!("ceilings: device copy {d2d:.0} GB/s (read+write; {d2d_small:.0} GB/s at 128 MiB), pinned H2D {h2d:.1} GB/s, D2H {d2h:.1} GB/s");
    println!("empty kernel: {launch:.2} us per stream launch, {glaunch:.2} us per launch inside a CUDA graph");
    let bidir = get("concurrent/ceiling", 0, "bidirectional")
        .map(Run::gbps)
        .unwrap_or(f64::NAN);
    if !bidir.is_nan() {
        println!("bidirectional pinned D2H + H2D at once (two streams): {bidir:.1} GB/s");
    }
    let mut json = Vec::new();
    json.push(format!(
        "  \"device\": \"{device}\",\n  \"driver\": {driver},\n  \"kernels\": \"{kernels}\",\n  \"ceilings\": {{\"device_copy_gbps\": {d2d:.1}, \"device_copy_128mib_gbps\": {d2d_small:.1}, \"pinned_h2d_gbps\": {h2d:.2}, \"pinned_d2h_gbps\": {d2h:.2}, \"bidirectional_gbps\": {bidir:.2}, \"empty_launch_us\": {launch:.3}, \"graph_launch_us\": {glaunch:.3}}}"
    ));
    let mut rows = Vec::new();
    let groups: Vec<String> = {
        let mut v: Vec<String> = rec
            .runs
            .keys()
            .map(|k| k.0.clone())
            .filter(|g| g != "ceiling")
            .collect();
        v.dedup();
        v
    };
    for group in groups {
        if group.starts_with("concurrent/") {
            report_concurrent(rec, &group, &mut rows);
            continue;
        }
        let ceiling = if group.starts_with("offload") {
            d2h
        } else if group.starts_with("onload") {
            h2d
        } else {
            d2d
        };
        println!("\n--- {group} ---");
        if group == "pdl" {
            println!(
                "{:>8} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
                "T",
                "producer",
                "update",
                "pair",
                "pair-pdl",
                "added",
                "added-pdl",
                "floor",
                "floor-pdl"
            );
            let params: std::collections::BTreeSet<usize> = rec
                .runs
                .keys()
                .filter(|k| k.0 == group)
                .map(|k| k.1)
                .collect();
            for p in params {
                // µs per item of the graph's 100.
                let us = |v: &str| {
                    get(&group, p, v)
                        .map(|r| r.median() * 1e6 / 100.0)
                        .unwrap_or(f64::NAN)
                };
                let (prod, upd, pair, pdl) = (
                    us("producer-x100"),
                    us("update-x100"),
                    us("pair-x100"),
                    us("pair-pdl-x100"),
                );
                let (added, added_pdl) = (pair - prod, pdl - prod);
                let (floor, floor_pdl) = (us("wait-x100") - prod, us("wait-pdl-x100") - prod);
                println!(
                    "{p:>8} {prod:>12.3} {upd:>12.3} {pair:>12.3} {pdl:>12.3} {added:>12.3} {added_pdl:>12.3} {floor:>12.3} {floor_pdl:>12.3}"
                );
                for (v, x) in [
                    ("producer-x100", prod),
                    ("update-x100", upd),
                    ("pair-x100", pair),
                    ("pair-pdl-x100", pdl),
                    ("added", added),
                    ("added-pdl", added_pdl),
                    ("floor", floor),
                    ("floor-pdl", floor_pdl),
                ] {
                    rows.push(format!(
                        "    {{\"group\": \"{group}\", \"param\": {p}, \"variant\": \"{v}\", \"us_per_item\": {x:.3}}}"
                    ));
                }
            }
            continue;
        }
        if group.starts_with("host/") {
            // Host time per call (plan + enqueue), against an empty kernel's launch from the
            // host; `p10`/`p90` over the batches.
            let empty = get("host/update", HOST_T, "empty-launch")
                .map(Run::median)
                .unwrap_or(f64::NAN);
            println!(
                "{:>8} {:<40} {:>10} {:>10} {:>10} {:>10}",
                "param", "variant", "us/call", "p10", "p90", "x empty"
            );
            for ((g, p, v), r) in rec.runs.iter().filter(|(k, _)| k.0 == group) {
                let mut sorted = r.secs.clone();
                sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
                let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize] * 1e6;
                let (us, p10, p90) = (r.median() * 1e6, at(0.1), at(0.9));
                let x = r.median() / empty;
                println!("{p:>8} {v:<40} {us:>10.3} {p10:>10.3} {p90:>10.3} {x:>10.2}");
                rows.push(format!(
                    "    {{\"group\": \"{g}\", \"param\": {p}, \"variant\": \"{v}\", \"host_us\": {us:.4}, \"host_us_p10\": {p10:.4}, \"host_us_p90\": {p90:.4}, \"x_empty_launch_host\": {x:.3}}}"
                ));
            }
            continue;
        }
        if group.ends_with("graph-latency") {
            // `x vllm`: a kvio row's time per call over vLLM's same row's (below 1: faster).
            println!(
                "{:>8} {:<18} {:>14} {:>16} {:>8}",
                "T", "variant", "us per call", "x empty launch", "x vllm"
            );
            for ((g, p, v), r) in rec.runs.iter().filter(|(k, _)| k.0 == group) {
                let us = r.median() * 1e6 / 100.0;
                let x_vllm = vllm_row(&group, *p, v)
                    .map(|t| r.median() / t.median())
                    .unwrap_or(f64::NAN);
                println!(
                    "{p:>8} {v:<18} {us:>14.2} {:>16.2} {x_vllm:>8.2}",
                    us / glaunch
                );
                rows.push(format!(
                    "    {{\"group\": \"{g}\", \"param\": {p}, \"variant\": \"{v}\", \"us_per_call\": {us:.3}, \"x_empty_launch\": {:.3}, \"x_vllm\": {x_vllm:.3}}}",
                    us / glaunch
                ));
            }
            continue;
        }
        // `x vllm`: a kvio row's GB/s over vLLM's same row's (above 1: faster).
        println!(
            "{:>8} {:<18} {:>10} {:>10} {:>12} {:>12} {:>8}",
            "param", "variant", "GB/s", "% ceiling", "x memcpy", "x naive", "x vllm"
        );
        let params: Vec<usize> = {
            let mut v: Vec<usize> = rec
                .runs
                .keys()
                .filter(|k| k.0 == group)
                .map(|k| k.1)
                .collect();
            v.dedup();
            v
        };
        for p in params {
            let base_m = get(&group, p, "memcpy-per-chunk")
                .map(Run::gbps)
                .unwrap_or(f64::NAN);
            let base_n = get(&group, p, "naive-kernel")
                .map(Run::gbps)
                .unwrap_or(f64::NAN);
            for ((_, _, v), r) in rec.runs.iter().filter(|(k, _)| k.0 == group && k.1 == p) {
                let gb = r.gbps();
                let pct = 100.0 * gb / ceiling;
                let x_vllm = vllm_row(&group, p, v)
                    .map(|t| gb / t.gbps())
                    .unwrap_or(f64::NAN);
                println!(
                    "{p:>8} {v:<18} {gb:>10.1} {pct:>9.1}% {:>12.2} {:>12.2} {x_vllm:>8.2}",
                    gb / base_m,
                    gb / base_n
                );
                rows.push(format!(
                    "    {{\"group\": \"{group}\", \"param\": {p}, \"variant\": \"{v}\", \"bytes\": {}, \"median_s\": {:.9}, \"gbps\": {gb:.3}, \"pct_ceiling\": {pct:.2}, \"x_memcpy\": {:.3}, \"x_naive\": {:.3}, \"x_vllm\": {x_vllm:.3}}}",
                    r.bytes,
                    r.median(),
                    gb / base_m,
                    gb / base_n
                ));
            }
        }
    }
    json.push(format!("  \"rows\": [\n{}\n  ]", rows.join(",\n")));
    let text = format!("{{\n{}\n}}\n", json.join(",\n"))
        .replace("NaN", "null")
        .replace("inf", "null");
    let path = std::env::var("KVIO_BENCH_JSON").unwrap_or_else(|_| "target/kvio-bench.json".into());
    if let Some(dir) = std::path::Path::new(&path).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::write(&path, text) {
        Ok(()) => println!("\nJSON written to {path}"),
        Err(e) => println!("\ncould not write {path}: {e}"),
    }
}

fn device_info() -> (String, i32) {
    let mut name = [0i8; 256];
    let mut dev = 0;
    let mut ver = 0;
    // SAFETY: out-pointers to locals; a context is current.
    unsafe {
        cu::cuCtxGetDevice(&mut dev);
        cu::cuDeviceGetName(name.as_mut_ptr(), 255, dev);
        cu::cuDriverGetVersion(&mut ver);
    }
    // SAFETY: the driver wrote a NUL-terminated string into the buffer.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    (name, ver)
}

fn main() {
    // `cargo test --benches` runs this binary without `--bench`: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let Some(g) = kvio_suite::gpu("kvio benches") else {
        println!("kvio benches: no usable GPU on this machine; nothing measured.");
        return;
    };
    let cfg = Cfg::from_env();
    let stream = g.stream();
    let (device, driver) = device_info();
    // Which PTX flavour, loaded as PTX or machine code (`Kvio::code`): printed here and kept
    // in the report's JSON.
    let kernels = format!("{:?} {:?}", g.kv.arch(), g.kv.code());
    println!(
        "kvio benches: {device}, kernels {kernels}, model {} layers x {} heads x {} x {} bytes",
        cfg.layers, cfg.heads, cfg.dim, cfg.elem
    );
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_millis(300))
        .sample_size(10)
        .nresamples(1000)
        .configure_from_args();
    let rec = RefCell::new(Rec::default());
    // vLLM's kernels (bf16 inputs) when a cubin of them is given and the model is bf16.
    let vllm = peer::Vllm::load().filter(|_| cfg.elem == 2);
    let peer = vllm.as_ref();
    if let Some(p) = peer {
        println!("vLLM's kernels loaded from {}", p.path);
    }
    ceilings(&mut c, &rec, g, &stream);
    if cfg.wants("slot-update") {
        slot_update(&mut c, &rec, g, &stream, &cfg, peer);
    }
    if cfg.wants("slice-update") {
        slice_update(&mut c, &rec, g, &stream, &cfg);
    }
    if cfg.wants("fp8-update") {
        fp8_update(&mut c, &rec, g, &stream, &cfg, peer);
    }
    if cfg.wants("mla-update") {
        mla_update(&mut c, &rec, g, &stream, peer);
    }
    if cfg.wants("v0-update") {
        v0_update(&mut c, &rec, g, &stream, &cfg, peer);
    }
    if cfg.wants("copy-blocks") {
        copy_blocks(&mut c, &rec, g, &stream, &cfg);
    }
    if cfg.wants("v0-convert") {
        v0_convert(&mut c, &rec, g, &stream, &cfg);
    }
    if cfg.wants("offload") {
        transfers(&mut c, &rec, g, &stream, &cfg, true);
    }
    if cfg.wants("onload") {
        transfers(&mut c, &rec, g, &stream, &cfg, false);
    }
    if cfg.wants("dma-batch") {
        dma_batch(&mut c, &rec, g, &stream);
    }
    if cfg.wants("concurrent") {
        concurrent(&mut c, &rec, g, &cfg);
    }
    if cfg.wants("pdl") {
        pdl(&mut c, &rec, g, &stream, &cfg);
    }
    if cfg.wants("host") {
        host(&rec, g, &stream, &cfg);
    }
    c.final_summary();
    report(&rec.borrow(), &device, driver, &kernels);
}
