//! Programmatic dependent launch (`StreamRef::pdl`): a slow producer kernel (`kvio_produce`)
//! writes K/V over stale bytes, and a slot update launched right after it with PDL reads
//! them. The update may be scheduled while the producer still runs (the producer signals its
//! dependents before its long arithmetic, the widest window), so an update that did not wait
//! (`griddepcontrol.wait`) would copy the stale bytes: the caches are compared bit for bit with
//! `kvio::reference` applied to what the producer wrote (downloaded afterwards), on poisoned
//! caches, eagerly and in a captured CUDA graph (replayed). Skips without a GPU unless
//! `KVIO_REQUIRE_GPU=1`; `KVIO_PDL_ITERS` sets the producer's arithmetic per thread (default
//! 20,000 steps: about 0.1 ms on an H200).

use cust::sys as cu;
use kvio::{reference, DeviceBytes, PagedLayout, SlotMapping, SlotUpdate, StreamRef, TokenLayout};
use kvio_suite::{assert_same, env_usize, gpu, random_bytes, upload, Gpu, Graph, Mem, Rng};

/// Producer → update pairs per run (each pair its own K/V buffer and slots, one cache).
const PAIRS: usize = 4;
const HEADS: usize = 8;
const DIM: usize = 128;
const ELEM: usize = 2;
const BS: usize = 16;

/// Everything one run needs: K/V buffers (K then V in each), slots per pair, the caches.
struct Setup {
    tokens: usize,
    blocks: usize,
    kv: Vec<Mem>,
    stale: Vec<Vec<u8>>,
    slots: Vec<Vec<i64>>,
    slots_dev: Vec<cust::memory::DeviceBuffer<i64>>,
    kc: Mem,
    vc: Mem,
}

impl Setup {
    fn new(tokens: usize, seed: u64) -> Setup {
        let mut rng = Rng::new(seed);
        let blocks = tokens.div_ceil(BS) * 2 + 3;
        let row = HEADS * DIM * ELEM;
        let mut kv = Vec::new();
        let mut stale = Vec::new();
        let mut slots = Vec::new();
        for p in 0..PAIRS {
            let s = random_bytes(2 * tokens * row, seed ^ (0x100 + p as u64));
            let mut m = Mem::new(false, s.len());
            m.fill(&s);
            kv.push(m);
            stale.push(s);
            let mut all: Vec<i64> = (0..(blocks * BS) as i64).collect();
            rng.shuffle(&mut all);
            all.truncate(tokens);
            for x in all.iter_mut() {
                if rng.below(16) == 0 {
                    *x = -1; // skipped
                }
            }
            slots.push(all);
        }
        let slots_dev = slots.iter().map(|s| upload(s)).collect();
        let ext = blocks * BS * row;
        Setup {
            tokens,
            blocks,
            kv,
            stale,
            slots,
            slots_dev,
            kc: Mem::new(false, ext),
            vc: Mem::new(false, ext),
        }
    }

    fn input(&self) -> TokenLayout {
        TokenLayout::contiguous(self.tokens, HEADS, DIM, ELEM)
    }

    fn cache(&self) -> PagedLayout {
        PagedLayout::nhd(self.blocks, BS, HEADS, DIM, ELEM)
    }

    /// Pair `p`'s update: K = the first half of its buffer, V = the second.
    fn op(&self, p: usize) -> SlotUpdate<'_> {
        let n = self.tokens * HEADS * DIM * ELEM;
        let kv = self.kv[p].bytes();
        SlotUpdate::new(
            kv.slice(0, n).unwrap(),
            self.input(),
            self.kc.bytes_mut(),
            self.cache(),
            SlotMapping::I64(DeviceBytes::of(&self.slots_dev[p])),
        )
        .value(kv.slice(n, n).unwrap(), self.vc.bytes_mut())
    }

    /// Stale K/V and poisoned caches again (nothing in flight).
    fn reset(&mut self, round: u64) -> (Vec<u8>, Vec<u8>) {
        for (m, s) in self.kv.iter_mut().zip(&self.stale) {
            m.fill(s);
        }
        let pk = random_bytes(self.kc.bytes().len(), 0xA5A5 ^ round);
        let pv = random_bytes(self.vc.bytes().len(), 0x5A5A ^ round);
        self.kc.fill(&pk);
        self.vc.fill(&pv);
        (pk, pv)
    }

    /// Enqueues the `PAIRS` producer → update pairs on `s`.
    fn enqueue(&self, g: &Gpu, s: StreamRef<'_>, iters: u32) -> kvio::Result<()> {
        for p in 0..PAIRS {
            g.kv.bench_produce(self.kv[p].bytes_mut(), iters, 0x1234 + p as u32, true, s)?;
            g.kv.update_slots(&self.op(p), s.pdl(true))?;
        }
        Ok(())
    }

    /// Checks what the producers wrote and the caches against the reference.
    fn check(&self, what: &str, poison: (Vec<u8>, Vec<u8>)) {
        let (mut want_k, mut want_v) = poison;
        let n = self.tokens * HEADS * DIM * ELEM;
        for p in 0..PAIRS {
            let got = self.kv[p].read();
            // The producer overwrote (nearly) every word of the stale bytes.
            let same = got
                .chunks_exact(4)
                .zip(self.stale[p].chunks_exact(4))
                .filter(|(a, b)| a == b)
                .count();
            assert!(
                same * 100 <= got.len() / 4,
                "{what}: pair {p}: the producer left {same} of {} words as they were",
                got.len() / 4
            );
            reference::update_slots(
                &got[..n],
                None,
                &self.input(),
                &mut want_k,
                0,
                None,
                &self.cache(),
                &self.slots[p],
            );
            reference::update_slots(
                &got[n..],
                None,
                &self.input(),
                &mut want_v,
                0,
                None,
                &self.cache(),
                &self.slots[p],
            );
        }
        assert_same(&format!("{what}: key cache"), &self.kc.read(), &want_k);
        assert_same(&format!("{what}: value cache"), &self.vc.read(), &want_v);
    }
}

fn driver_version() -> i32 {
    let mut v = 0;
    // SAFETY: out-pointer to a local.
    let r = unsafe { cu::cuDriverGetVersion(&mut v) };
    assert_eq!(r, cu::CUresult::CUDA_SUCCESS, "cuDriverGetVersion");
    v
}

/// On the `sm_90` PTX and a CUDA ≥ 12.3 driver, kvio must really use PDL (else the test
/// would prove nothing about the wait).
fn expect_pdl(g: &Gpu) {
    let want = g.kv.arch() == kvio::Arch::Sm90 && driver_version() >= 12030;
    eprintln!(
        "PDL: {} ({:?} PTX, driver {})",
        g.kv.supports_pdl(),
        g.kv.arch(),
        driver_version()
    );
    assert_eq!(g.kv.supports_pdl(), want, "Kvio::supports_pdl");
}

fn iters() -> u32 {
    env_usize("KVIO_PDL_ITERS", 20_000) as u32
}

#[test]
fn pdl_update_waits_for_its_producer_eagerly() {
    let Some(g) = gpu("pdl eager") else { return };
    expect_pdl(g);
    let stream = g.stream();
    for (i, t) in [1usize, 16, 64, 256, 1000].into_iter().enumerate() {
        let mut w = Setup::new(t, 11 + i as u64);
        for round in 0..2 {
            let poison = w.reset(round);
            w.enqueue(g, stream.sref(), iters()).expect("enqueue");
            stream
                .synchronize()
                .expect("sync (a kernel fault shows here)");
            w.check(&format!("eager T={t} round {round}"), poison);
        }
    }
}

/// `cuGraphGetEdges` of CUDA 12.3 (edge data with dependency types), resolved at run time.
type GetEdges = unsafe extern "C" fn(
    cu::CUgraph,
    *mut cu::CUgraphNode,
    *mut cu::CUgraphNode,
    *mut [u8; 8],
    *mut usize,
) -> cu::CUresult;

/// Edges of type `CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC` in `graph`, where the driver can say.
fn programmatic_edges(graph: &Graph) -> Option<usize> {
    if driver_version() < 12030 {
        return None;
    }
    let mut f: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: a NUL-terminated name and an out-pointer to a local.
    let r = unsafe { cu::cuGetProcAddress(c"cuGraphGetEdges".as_ptr(), &mut f, 12030, 0) };
    if r != cu::CUresult::CUDA_SUCCESS || f.is_null() {
        return None;
    }
    // SAFETY: the CUDA 12.3 ABI of cuGraphGetEdges (cuGraphGetEdges_v2: edge data of 8 bytes,
    // `CUgraphEdgeData { from_port, to_port, type, reserved[5] }`).
    let get = unsafe { std::mem::transmute::<*mut std::ffi::c_void, GetEdges>(f) };
    let mut n = 0usize;
    let null = std::ptr::null_mut();
    // SAFETY: a live graph; a count query (null arrays).
    let r = unsafe { get(graph.raw(), null, null, std::ptr::null_mut(), &mut n) };
    assert_eq!(r, cu::CUresult::CUDA_SUCCESS, "cuGraphGetEdges (count)");
    let mut from = vec![std::ptr::null_mut(); n];
    let mut to = vec![std::ptr::null_mut(); n];
    let mut data = vec![[0u8; 8]; n];
    // SAFETY: arrays of `n` entries.
    let r = unsafe {
        get(
            graph.raw(),
            from.as_mut_ptr(),
            to.as_mut_ptr(),
            data.as_mut_ptr(),
            &mut n,
        )
    };
    assert_eq!(r, cu::CUresult::CUDA_SUCCESS, "cuGraphGetEdges");
    Some(data[..n].iter().filter(|d| d[2] == 1).count())
}

#[test]
fn pdl_update_waits_for_its_producer_in_a_graph() {
    let Some(g) = gpu("pdl graph") else { return };
    expect_pdl(g);
    let stream = g.stream();
    for (i, t) in [1usize, 64, 256].into_iter().enumerate() {
        let mut w = Setup::new(t, 101 + i as u64);
        let graph = Graph::retrying(&stream, |s| w.enqueue(g, s, iters()));
        let edges = programmatic_edges(&graph);
        eprintln!("T={t}: programmatic edges in the captured graph: {edges:?}");
        if let Some(e) = edges {
            if g.kv.supports_pdl() {
                assert!(
                    e >= 1,
                    "PDL launches were captured without programmatic edges"
                );
            } else {
                assert_eq!(e, 0, "programmatic edges without PDL");
            }
        }
        for round in 0..3 {
            let poison = w.reset(round);
            graph.launch(&stream);
            stream
                .synchronize()
                .expect("sync (a kernel fault shows here)");
            w.check(&format!("graph T={t} replay {round}"), poison);
        }
    }
}

#[test]
fn producer_refuses_unaligned_buffers() {
    let Some(g) = gpu("pdl producer checks") else {
        return;
    };
    let stream = g.stream();
    let m = Mem::new(false, 64);
    let err =
        g.kv.bench_produce(
            m.bytes_mut().slice(0, 63).unwrap(),
            1,
            1,
            false,
            stream.sref(),
        )
        .unwrap_err();
    assert!(
        matches!(err, kvio::Error::InvalidArgument { name: "dst", .. }),
        "{err}"
    );
}
