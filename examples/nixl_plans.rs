//! Staging versus per-chunk descriptors, on host memory (DRAM), over NIXL/UCX between two
//! agents of this process: a layer-first local pool (every (layer, K/V) cache apart, as a
//! layer-separate cache) ships all its blocks to a cross-layer remote pool, in runs of
//! `RUN` consecutive blocks scattered over the remote pool.
//!
//! - direct: one descriptor per (layer, part, block) chunk (`kvio::nixl::descriptors`);
//! - staged: the blocks gathered first into a cross-layer staging pool in map order (here
//!   on the CPU, a memcpy per chunk, checked against `kvio::reference::copy_blocks`; on a GPU
//!   kvio's kernel does it, see `nixl_plans_gbps` in tests/gpu_nixl.rs), then one descriptor
//!   per run.
//!
//! `kvio::nixl::plans` gives both descriptor counts. Prints the best of `REPS` runs as GB/s.
//! No GPU needed. The VRAM counterpart is the ignored test `nixl_plans_gbps`.
//!
//! ```sh
//! cargo run --release --features nixl --example nixl_plans
//! ```

use std::error::Error;
use std::time::{Duration, Instant};

use kvio::nixl::nixl_sys::{Agent, XferOp};
use kvio::nixl::{self, Registration};
use kvio::reference::{self, PoolImage};
use kvio::{BlockCopy, BlockMap, BlockPool, DeviceBytes, DeviceBytesMut, PagedLayout, Writable};
use kvio_suite::nixl::{ucx_agent, ucx_loopback};
use kvio_suite::{random_bytes, Rng};

const REPS: usize = 5;
const RUN: usize = 8;
const TIMEOUT: Duration = Duration::from_secs(120);

type Res<T> = Result<T, Box<dyn Error>>;

#[derive(Clone, Copy)]
struct Geo {
    blocks: usize,
    layers: usize,
    bs: usize,
    heads: usize,
    dim: usize,
    elem: usize,
}

impl Geo {
    fn chunk(&self) -> usize {
        self.blocks * self.bs * self.heads * self.dim * self.elem
    }
    fn bytes(&self) -> usize {
        self.chunk() * 2 * self.layers
    }
    fn layout(&self) -> PagedLayout {
        PagedLayout::nhd(self.blocks, self.bs, self.heads, self.dim, self.elem)
    }
    /// Layer-first `(L, 2, NB, bs, H, D)`: each (layer, part) cache contiguous.
    fn layer_first<'a, M: kvio::PoolMemory<'a>>(&self, mem: M) -> BlockPool<'a, M::Access> {
        let c = self.chunk();
        BlockPool::strided(mem, 2 * c, c, self.layers, 2, self.layout())
    }
    fn cross<'a, M: kvio::PoolMemory<'a>>(&self, mem: M) -> BlockPool<'a, M::Access> {
        let g = *self;
        BlockPool::cross_layer_nhd(mem, g.blocks, g.layers, g.bs, g.heads, g.dim, g.elem)
    }
}

/// Read and write descriptions of a host vector.
///
/// # Safety
///
/// The vector outlives the views and is touched only between transfers.
unsafe fn views(v: &mut [u8]) -> (DeviceBytes<'static>, DeviceBytesMut<'static>) {
    (
        DeviceBytes::from_raw(v.as_ptr() as u64, v.len()),
        DeviceBytesMut::from_raw(v.as_mut_ptr() as u64, v.len()),
    )
}

/// Best seconds of `REPS` transfers of `copy`; checks the descriptor count.
fn time(a: &Agent, b: &str, copy: &BlockCopy<'_>, descs: usize) -> Res<f64> {
    let mut best = f64::MAX;
    for _ in 0..REPS {
        let start = Instant::now();
        // SAFETY: the pools are vectors of `main`, alive and untouched until `wait` returns.
        let t = unsafe { nixl::post(a, b, XferOp::Write, copy)? };
        t.wait(Some(TIMEOUT))?;
        best = best.min(start.elapsed().as_secs_f64());
        assert_eq!(t.descs(), descs);
    }
    Ok(best)
}

fn measure(g: Geo, tag: &str) -> Res<()> {
    let mut local = random_bytes(g.bytes(), 1);
    let mut staging = vec![0u8; g.bytes()];
    let mut remote = vec![0u8; g.bytes()];
    // SAFETY: the vectors live to the end of this function; the host reads them only after
    // the transfers completed.
    let ((l_r, _), (s_r, s_w), (_, r_w)) =
        unsafe { (views(&mut local), views(&mut staging), views(&mut remote)) };
    let (a, b) = (
        ucx_agent(&format!("plans-a-{tag}"))?,
        ucx_agent(&format!("plans-b-{tag}"))?,
    );
    let regs: Vec<Registration> = {
        // SAFETY: as above; the registrations are dropped before the vectors.
        unsafe {
            vec![
                nixl::register_pool(&a, &g.layer_first(l_r))?,
                nixl::register_pool(&a, &g.cross(s_r))?,
                nixl::register_pool(&b, &g.cross(r_w))?,
            ]
        }
    };
    let bname = a.load_remote_md(&b.get_local_md()?)?;
    b.load_remote_md(&a.get_local_md()?)?;

    let mut runs: Vec<usize> = (0..g.blocks / RUN).collect();
    Rng::new(3).shuffle(&mut runs);
    let pairs: Vec<[i64; 2]> = runs
        .iter()
        .enumerate()
        .flat_map(|(i, &r)| (0..RUN).map(move |k| [(i * RUN + k) as i64, (r * RUN + k) as i64]))
        .collect();
    let dst: BlockPool<'_, Writable> = g.cross(r_w);
    let direct = BlockCopy::new(g.layer_first(l_r), dst, BlockMap::Host(&pairs));
    let p = nixl::plans(&direct, XferOp::Write)?;
    let t_direct = time(&a, &bname, &direct, p.direct)?;
    let want = remote.clone();

    remote.fill(0);
    let gather: Vec<[i64; 2]> = pairs
        .iter()
        .enumerate()
        .map(|(i, p)| [p[0], i as i64])
        .collect();
    let ship_pairs: Vec<[i64; 2]> = pairs
        .iter()
        .enumerate()
        .map(|(i, p)| [i as i64, p[1]])
        .collect();
    // The gather on the CPU: one memcpy per (layer, part) chunk of each block, into staging
    // block i in cross-layer order (checked once against kvio's reference).
    let bc = g.bs * g.heads * g.dim * g.elem;
    let block = 2 * g.layers * bc;
    let cpu_gather = |staging: &mut [u8]| {
        for (i, p) in gather.iter().enumerate() {
            let s = p[0] as usize;
            for lp in 0..2 * g.layers {
                let from = lp * g.chunk() + s * bc;
                let to = i * block + lp * bc;
                staging[to..to + bc].copy_from_slice(&local[from..from + bc]);
            }
        }
    };
    let mut t_gather = f64::MAX;
    for _ in 0..REPS {
        let start = Instant::now();
        cpu_gather(&mut staging);
        t_gather = t_gather.min(start.elapsed().as_secs_f64());
    }
    let (li, si) = (
        PoolImage::of(&g.layer_first(l_r)).ok_or("image")?,
        PoolImage::of(&g.cross(s_r)).ok_or("image")?,
    );
    let mut check = vec![0u8; g.bytes()];
    reference::copy_blocks(&li, &local, &si, &mut check, &gather);
    assert!(check == staging, "CPU gather differs from the reference");
    let ship = BlockCopy::new(
        g.cross(s_w).read(),
        g.cross(r_w),
        BlockMap::Host(&ship_pairs),
    );
    let t_staged = time(&a, &bname, &ship, p.staged)?;
    assert!(remote == want, "staged and direct transfers differ");
    drop(regs);

    let gb = g.bytes() as f64 / 1e9;
    println!(
        "{tag}: {:.0} MiB, {} blocks, chunk {} KiB: direct {} descriptors {:.2} GB/s; staged {} \
         descriptors {:.2} GB/s transfer, CPU gather {:.2} GB/s, {:.2} GB/s both",
        g.bytes() as f64 / (1 << 20) as f64,
        g.blocks,
        g.bs * g.heads * g.dim * g.elem / 1024,
        p.direct,
        gb / t_direct,
        p.staged,
        gb / t_staged,
        gb / t_gather,
        gb / (t_gather + t_staged),
    );
    Ok(())
}

fn main() -> Res<()> {
    if !nixl::available() {
        println!("nixl_plans: libnixl_capi.so not found (see .ci/run); nothing to measure");
        return Ok(());
    }
    ucx_loopback(false);
    let base = Geo {
        blocks: 128,
        layers: 32,
        bs: 16,
        heads: 8,
        dim: 128,
        elem: 2,
    };
    // Llama-8B-like blocks (32 KiB chunks), then small chunks (4 KiB: one KV head).
    measure(base, "DRAM 8 heads")?;
    measure(
        Geo {
            heads: 1,
            blocks: 512,
            ..base
        },
        "DRAM 1 head",
    )?;
    Ok(())
}
