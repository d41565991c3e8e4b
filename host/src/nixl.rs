//! NIXL interop (feature `nixl`): kvio block pools as NIXL memory, a block map between a local
//! and a remote pool as NIXL descriptor lists. DRAM only for now.
//!
//! The mapping is the one Dynamo's block manager and vLLM's `NixlConnector` use: whole pool
//! allocations are registered once ([`register_pool`]), and a transfer names one descriptor per
//! contiguous run of bytes ([`descriptors`]): a run of consecutive blocks of a cross-layer pool,
//! or one (layer, K/V) chunk a run of blocks of a layer-separate pool. The runs are the spans of
//! kvio's DMA backend (`blocks::dma`), computed from the same validated [`BlockCopy`].
//!
//! NIXL itself is loaded at run time: `nixl-sys` is built with `stub-api` and dlopens
//! `libnixl_capi.so` on the first NIXL call, aborting the process when it is missing. Check
//! [`available`] before the first call. The PyPI wheel `nixl-cu12` provides the libraries
//! (`.nixl_cu12.mesonpy.libs/` on `LD_LIBRARY_PATH`, its `plugins/` in `NIXL_PLUGIN_DIR`).
//!
//! A transfer from this process's point of view: [`XferOp::Write`] moves `copy.src` (local) to
//! `copy.dst` (the remote agent's memory); [`XferOp::Read`] moves `copy.src` (remote) to
//! `copy.dst` (local). The remote pool is described by the remote agent's addresses
//! ([`crate::DeviceBytes::from_raw`]); NIXL refuses a descriptor outside memory the remote
//! agent registered.

use std::ffi::{c_char, c_int, c_void};
use std::time::{Duration, Instant};

pub use nixl_sys;
use nixl_sys::{
    Agent, MemType, MemoryRegion, NixlDescriptor, NixlError, RegistrationHandle, XferDescList,
    XferOp, XferRequest, XferStatus,
};

use crate::blocks::{dma, map, plan};
use crate::error::{invalid, Error, Result};
use crate::{BlockCopy, BlockMap, BlockPool, MemoryKind};

/// One NIXL descriptor pair: `len` contiguous bytes at `local` in this agent's memory and at
/// `remote` in the remote agent's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desc {
    /// Address in the local pool.
    pub local: u64,
    /// Address in the remote pool (the remote agent's address space).
    pub remote: u64,
    /// Bytes.
    pub len: u64,
}

/// The descriptors of a block copy run by NIXL as `op`, one per contiguous run: a run of
/// consecutive blocks (`(s, d)`, `(s+1, d+1)`, ...) of cross-layer pools, or one per (layer,
/// part) and run when a block's bytes are split by layer (layer-separate pools); finer
/// (per token or head) when the two layouts differ. Validates the pools and the map as
/// [`crate::Kvio::copy_blocks`] does, except the overlap check between `src` and `dst`: they
/// live in two address spaces. Pure: no NIXL call.
///
/// `op` says which pool is local: [`XferOp::Write`] reads the local `copy.src` and writes the
/// remote `copy.dst`; [`XferOp::Read`] reads the remote `copy.src` into the local `copy.dst`.
/// The map must be on the host; `backend`, `max_ctas`, `staging` and `errors` are ignored.
///
/// ```
/// use kvio::nixl::{descriptors, nixl_sys::XferOp, Desc};
/// use kvio::{BlockCopy, BlockMap, BlockPool, DeviceBytes, DeviceBytesMut};
/// let (nb, l, bs, h, d, e) = (8, 2, 4, 2, 8, 2);
/// let block = (l * 2 * bs * h * d * e) as u64; // a whole cross-layer block
/// // SAFETY: descriptions only.
/// let (local, remote) = unsafe {
///     (DeviceBytes::from_raw(0x1000, nb * block as usize),
///      DeviceBytesMut::from_raw(0x9000_0000, nb * block as usize))
/// };
/// let pairs = [[2, 5], [3, 6], [0, 1]]; // 2..4 -> 5..7 is one run
/// let op = BlockCopy::new(
///     BlockPool::cross_layer_nhd(local, nb, l, bs, h, d, e),
///     BlockPool::cross_layer_nhd(remote, nb, l, bs, h, d, e),
///     BlockMap::Host(&pairs),
/// );
/// let descs = descriptors(&op, XferOp::Write)?;
/// assert_eq!(descs, [
///     Desc { local: 0x1000 + 2 * block, remote: 0x9000_0000 + 5 * block, len: 2 * block },
///     Desc { local: 0x1000, remote: 0x9000_0000 + block, len: block },
/// ]);
/// # Ok::<(), kvio::Error>(())
/// ```
pub fn descriptors(copy: &BlockCopy<'_>, op: XferOp) -> Result<Vec<Desc>> {
    let BlockMap::Host(pairs) = copy.map else {
        return Err(invalid(
            "map",
            "Device",
            "NIXL descriptors need a host block map",
        ));
    };
    // Both pools are plain memory to NIXL: no driver query, every address reachable.
    let geo = plan::geometry(copy, &|_| MemoryKind::PinnedHost)?;
    let dst = copy.dst.read();
    map::check_host_ids(&copy.src, &dst, pairs)?;
    let spans = dma::spans(&copy.src, &dst, &geo, pairs);
    Ok(spans
        .iter()
        .map(|s| match op {
            XferOp::Write => Desc {
                local: s.src,
                remote: s.dst,
                len: s.bytes,
            },
            XferOp::Read => Desc {
                local: s.dst,
                remote: s.src,
                len: s.bytes,
            },
        })
        .collect())
}

/// Whether the NIXL C API library (`libnixl_capi.so`) can be loaded. `nixl-sys` (built with
/// `stub-api`) aborts the process on its first call when it cannot, so check this first.
pub fn available() -> bool {
    const RTLD_NOW: c_int = 2;
    extern "C" {
        fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
        fn dlclose(handle: *mut c_void) -> c_int;
    }
    let name = c"libnixl_capi.so";
    // SAFETY: `name` is a NUL-terminated string; loading runs the library's initialisers,
    // which is what `nixl-sys` does on its first call anyway.
    let handle = unsafe { dlopen(name.as_ptr(), RTLD_NOW) };
    if handle.is_null() {
        return false;
    }
    // SAFETY: `handle` came from `dlopen` and is closed once (the library stays loaded while
    // `nixl-sys` holds its own handle).
    unsafe { dlclose(handle) };
    true
}

/// A NIXL error as kvio's [`Error::Nixl`].
fn nixl_err(op: &'static str) -> impl FnOnce(NixlError) -> Error {
    move |e| Error::Nixl {
        op,
        detail: e.to_string(),
    }
}

/// One byte range of host memory, as NIXL registers it.
#[derive(Debug)]
struct Dram {
    addr: u64,
    len: usize,
}

impl MemoryRegion for Dram {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.addr as *const u8
    }

    fn size(&self) -> usize {
        self.len
    }
}

impl NixlDescriptor for Dram {
    fn mem_type(&self) -> MemType {
        MemType::Dram
    }

    fn device_id(&self) -> u64 {
        0
    }
}

/// A pool's memory registered with a NIXL agent: deregistered when dropped.
#[derive(Debug)]
pub struct Registration {
    handles: Vec<RegistrationHandle>,
}

impl Registration {
    /// Deregisters the memory now, reporting a failure (dropping deregisters too, silently).
    pub fn deregister(mut self) -> Result<()> {
        for h in &mut self.handles {
            h.deregister().map_err(nixl_err("deregister"))?;
        }
        Ok(())
    }
}

/// Registers the memory of `pool` with `agent` as DRAM: the whole allocation of a strided pool,
/// every layer/part cache of a layer-table pool. A remote agent that loads `agent`'s metadata
/// afterwards ([`Agent::get_local_md`]) can read and write these bytes.
///
/// # Safety
///
/// The pool's memory must be host memory (not device memory) that stays allocated until the
/// returned [`Registration`] is dropped, and no Rust reference may be used to access it while a
/// NIXL transfer (one this agent posts, or one a remote agent posts into it) can touch it.
pub unsafe fn register_pool<A: Copy>(
    agent: &Agent,
    pool: &BlockPool<'_, A>,
) -> Result<Registration> {
    let ext = pool.extent("pool")?;
    let mut handles = Vec::new();
    for (start, end) in pool.ranges(ext) {
        let len = usize::try_from(end - start).map_err(|_| Error::Overflow { name: "pool" })?;
        let region = Dram { addr: start, len };
        let h = agent
            .register_memory(&region, None)
            .map_err(nixl_err("register_memory"))?;
        handles.push(h);
    }
    Ok(Registration { handles })
}

/// The local and remote DRAM descriptor lists of `descs` (device id 0), in order.
pub fn desc_lists(descs: &[Desc]) -> Result<(XferDescList<'static>, XferDescList<'static>)> {
    let mut local = XferDescList::new(MemType::Dram).map_err(nixl_err("XferDescList::new"))?;
    let mut remote = XferDescList::new(MemType::Dram).map_err(nixl_err("XferDescList::new"))?;
    for d in descs {
        let addr = |a: u64| usize::try_from(a).map_err(|_| Error::Overflow { name: "descs" });
        let len = addr(d.len)?;
        local.add_desc(addr(d.local)?, len, 0);
        remote.add_desc(addr(d.remote)?, len, 0);
    }
    Ok((local, remote))
}

/// A posted NIXL transfer ([`post`]).
pub struct Transfer {
    agent: Agent,
    req: XferRequest,
    descs: usize,
}

impl Transfer {
    /// Descriptors the transfer moves.
    pub fn descs(&self) -> usize {
        self.descs
    }

    /// Whether the transfer is complete (`Ok(false)`: still in progress); progresses it.
    pub fn done(&self) -> Result<bool> {
        match self.agent.get_xfer_status(&self.req) {
            Ok(XferStatus::Success) => Ok(true),
            Ok(XferStatus::InProgress) => Ok(false),
            Err(e) => Err(nixl_err("get_xfer_status")(e)),
        }
    }

    /// Polls until the transfer is complete, or fails with [`Error::Nixl`] (`op` "wait") once
    /// `timeout` has passed (`None`: no limit).
    pub fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        let start = Instant::now();
        loop {
            if self.done()? {
                return Ok(());
            }
            if timeout.is_some_and(|t| start.elapsed() > t) {
                return Err(Error::Nixl {
                    op: "wait",
                    detail: format!("transfer not complete after {timeout:?}"),
                });
            }
            std::thread::yield_now();
        }
    }
}

/// Posts `copy` as one NIXL transfer of `op` to `remote_agent` (whose metadata `agent` has
/// loaded): its [`descriptors`] as two DRAM descriptor lists, `create_xfer_req`, then
/// `post_xfer_req`. Returns the transfer to wait for; nothing is posted on an error.
///
/// # Safety
///
/// Both pools' memory must stay allocated, and the local pool's bytes untouched by Rust
/// references, until [`Transfer::done`] returned `true` (or [`Transfer::wait`] `Ok`): the
/// transfer outlives the borrows `copy` holds. Dropping an unfinished [`Transfer`] asks NIXL to
/// abort it, which can fail; the memory must not be released then either.
pub unsafe fn post(
    agent: &Agent,
    remote_agent: &str,
    op: XferOp,
    copy: &BlockCopy<'_>,
) -> Result<Transfer> {
    let descs = descriptors(copy, op)?;
    let (local, remote) = desc_lists(&descs)?;
    let req = agent
        .create_xfer_req(op, &local, &remote, remote_agent, None)
        .map_err(nixl_err("create_xfer_req"))?;
    agent
        .post_xfer_req(&req, None)
        .map_err(nixl_err("post_xfer_req"))?;
    Ok(Transfer {
        agent: agent.clone(),
        req,
        descs: descs.len(),
    })
}

/// Runs `copy` as one NIXL transfer of `op` to `remote_agent` and polls until it is complete:
/// [`post`], then [`Transfer::wait`] without a limit. Returns the number of descriptors moved.
///
/// # Safety
///
/// As [`post`] for the time this call runs. On success the transfer is complete when it
/// returns. On an error from NIXL's status query the transfer's state is unknown: the caller
/// must keep both pools' memory allocated and the local pool unread until it knows NIXL is
/// done with it (kvio cannot tell; NIXL does not document that a failed status ends all access).
pub unsafe fn transfer(
    agent: &Agent,
    remote_agent: &str,
    op: XferOp,
    copy: &BlockCopy<'_>,
) -> Result<usize> {
    // SAFETY: forwarded from the caller (the pools outlive the transfer).
    let t = unsafe { post(agent, remote_agent, op, copy)? };
    t.wait(None)?;
    Ok(t.descs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::test_pools::*;
    use crate::{DeviceBytes, PagedLayout};

    fn cross(at: u64, nb: usize) -> Pool {
        nhd(at, nb, L, BS, H, D, E)
    }

    /// Bytes of one whole cross-layer block.
    const BLOCK: u64 = (L * 2 * BS * H * D * E) as u64;

    #[test]
    fn cross_layer_runs_merge_and_padding_is_skipped() {
        let pairs = [[1, 4], [2, 5], [3, 6], [-1, 2], [0, 0], [7, 1]];
        let op = BlockCopy::new(cross(SRC, 8), cross(DST, 8), BlockMap::Host(&pairs));
        let at = |base: u64, i: u64| base + i * BLOCK;
        let desc = |local, remote, len| Desc { local, remote, len };
        assert_eq!(
            descriptors(&op, XferOp::Write).unwrap(),
            [
                desc(at(SRC, 1), at(DST, 4), 3 * BLOCK),
                desc(at(SRC, 0), at(DST, 0), BLOCK),
                desc(at(SRC, 7), at(DST, 1), BLOCK),
            ]
        );
        // Read: the local pool is the destination.
        assert_eq!(
            descriptors(&op, XferOp::Read).unwrap()[0],
            desc(at(DST, 4), at(SRC, 1), 3 * BLOCK)
        );
    }

    #[test]
    fn layer_separate_gives_one_desc_per_layer_part_and_run() {
        let (src, dst) = (
            layer_first(SRC, 8, L, BS, H, D, E),
            layer_first(DST, 8, L, BS, H, D, E),
        );
        let pairs = [[0, 3], [1, 4], [5, 0]];
        let op = BlockCopy::new(src, dst, BlockMap::Host(&pairs));
        let descs = descriptors(&op, XferOp::Write).unwrap();
        assert_eq!(descs.len(), 2 * L * 2); // two runs × layers × K/V
        let chunk = (BS * H * D * E) as u64;
        assert!(descs[..L * 2].iter().all(|d| d.len == 2 * chunk));
        assert!(descs[L * 2..].iter().all(|d| d.len == chunk));
        // Every byte of the copy exactly once.
        let total: u64 = descs.iter().map(|d| d.len).sum();
        assert_eq!(total, 3 * BLOCK);
    }

    #[test]
    fn same_addresses_in_two_address_spaces_are_fine() {
        // The remote pool may sit at the local pool's addresses (another process); a copy
        // inside one pool would refuse these pairs (block 1 read and written).
        let pairs = [[0, 1], [1, 2]];
        let op = BlockCopy::new(cross(SRC, NB), cross(SRC, NB), BlockMap::Host(&pairs));
        assert_eq!(descriptors(&op, XferOp::Write).unwrap().len(), 1);
    }

    #[test]
    fn bad_maps_and_pools_are_refused() {
        let op = |pairs: &'static [[i64; 2]]| {
            BlockCopy::new(cross(SRC, 8), cross(DST, NB), BlockMap::Host(pairs))
        };
        assert!(matches!(
            descriptors(&op(&[[0, NB as i64]]), XferOp::Write),
            Err(Error::IndexOutOfRange {
                name: "map.dst",
                at: 0,
                ..
            })
        ));
        assert!(matches!(
            descriptors(&op(&[[0, 1], [2, 1]]), XferOp::Write),
            Err(Error::Overlap {
                name: "map.dst",
                ..
            })
        ));
        // SAFETY: a description only.
        let pairs = unsafe { DeviceBytes::from_raw(0x10, 16) };
        let mut dev = op(&[]);
        dev.map = BlockMap::Device { pairs, len: 1 };
        assert!(matches!(
            descriptors(&dev, XferOp::Write),
            Err(Error::InvalidArgument { name: "map", .. })
        ));
        // A destination too small for its layout.
        let layout = PagedLayout::nhd(NB, BS, H, D, E);
        let small = BlockPool::strided(bytes_mut(DST, 10), 0, 0, 1, 1, layout);
        let bad = BlockCopy::new(cross(SRC, NB), small, BlockMap::Host(&[]));
        assert!(matches!(
            descriptors(&bad, XferOp::Write),
            Err(Error::BufferTooSmall { name: "dst", .. })
        ));
    }
}
