//! NIXL interop (feature `nixl`): kvio block pools as NIXL memory (host pools as DRAM, device
//! pools as VRAM), a block map between a local and a remote pool as NIXL descriptor lists,
//! transfers that end with a notification to the remote agent ([`PostArgs::notify`],
//! [`Notifications`]).
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

use cust::sys as cu;
pub use nixl_sys;
use nixl_sys::{
    Agent, MemType, MemoryRegion, NixlDescriptor, NixlError, NotificationMap, OptArgs,
    RegistrationHandle, XferDescList, XferOp, XferRequest, XferStatus,
};

use crate::blocks::{dma, map, plan};
use crate::error::{invalid, Error, Result};
use crate::{memory_kind, BlockCopy, BlockMap, BlockPool, MemoryKind};

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
    // Both pools are plain memory to NIXL: no driver query, every address reachable. Pools
    // whose parts are laid out differently convert part by part (K's spans, then V's).
    let parts = plan::split_parts(copy)?;
    let copies = parts
        .as_ref()
        .map_or(std::slice::from_ref(copy), |p| &p[..]);
    let mut spans = Vec::new();
    for c in copies {
        let geo = plan::geometry(c, &|_| MemoryKind::PinnedHost)?;
        let dst = c.dst.read();
        map::check_host_ids(&c.src, &dst, pairs)?;
        spans.extend(dma::spans(&c.src, &dst, &geo, pairs).iter().copied());
    }
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

/// The descriptor counts of the two ways to move a block copy between pools of different
/// layouts ([`plans`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plans {
    /// Descriptors of the direct transfer ([`descriptors`]): one per contiguous run the two
    /// layouts share, per (layer, part) chunk when one side is layer-separate.
    pub direct: usize,
    /// Descriptors of the staged transfer: the local blocks gathered first (by kvio, in map
    /// order) into a staging pool with the remote pool's layout, `staging_blocks` blocks,
    /// staging block `i` holding the map's `i`-th valid pair, then one descriptor per run of
    /// consecutive remote blocks (per (layer, part) chunk of a run when the remote pool is
    /// itself layer-separate). For a [`XferOp::Read`] the staging pool receives the remote
    /// blocks and kvio scatters them afterwards.
    pub staged: usize,
    /// Blocks of the staging pool (the map's valid pairs).
    pub staging_blocks: usize,
}

impl Plans {
    /// Whether staging saves descriptors (the staged plan has fewer).
    pub fn stage(&self) -> bool {
        self.staged < self.direct
    }
}

/// The descriptor counts of moving `copy` as `op` directly and through a staging pool with
/// the remote pool's layout ([`Plans`]). Validates as [`descriptors`]. Pure: no NIXL call.
///
/// ```
/// use kvio::nixl::{plans, nixl_sys::XferOp};
/// use kvio::{BlockCopy, BlockMap, BlockPool, DeviceBytes, DeviceBytesMut, PagedLayout};
/// let (nb, l, bs, h, d, e) = (8, 4, 16, 2, 64, 2);
/// let layout = PagedLayout::nhd(nb, bs, h, d, e);
/// let chunk = nb * bs * h * d * e; // one layer/part cache
/// // SAFETY: descriptions only.
/// let (local, remote) = unsafe {
///     (DeviceBytes::from_raw(0x1000, 2 * l * chunk),
///      DeviceBytesMut::from_raw(0x9000_0000, 2 * l * chunk))
/// };
/// // Local: layer-first caches (layer-separate style); remote: cross-layer blocks.
/// let src = BlockPool::strided(local, chunk, l * chunk, l, 2, layout);
/// let dst = BlockPool::cross_layer_nhd(remote, nb, l, bs, h, d, e);
/// let pairs = [[0, 2], [1, 3], [2, 4], [5, 0]];
/// let p = plans(&BlockCopy::new(src, dst, BlockMap::Host(&pairs)), XferOp::Write)?;
/// assert_eq!((p.direct, p.staged, p.staging_blocks), (4 * 2 * l, 2, 4));
/// assert!(p.stage());
/// # Ok::<(), kvio::Error>(())
/// ```
pub fn plans(copy: &BlockCopy<'_>, op: XferOp) -> Result<Plans> {
    let direct = descriptors(copy, op)?.len();
    let BlockMap::Host(pairs) = copy.map else {
        unreachable!("descriptors refused a device map");
    };
    // The staged transfer is a copy between the staging pool and the remote pool, staging
    // ids in map order: its runs are the runs of the remote ids, in the remote layout.
    // Counted as the remote pool copied onto itself with those ids.
    let (remote, col) = match op {
        XferOp::Write => (copy.dst.read(), 1),
        XferOp::Read => (copy.src, 0),
    };
    let ids: Vec<[i64; 2]> = pairs
        .iter()
        .filter(|p| p[0] >= 0 && p[1] >= 0)
        .map(|p| [p[col], p[col]])
        .collect();
    let own = BlockCopy::new(remote, remote.description(), BlockMap::Host(&ids));
    let staged = descriptors(&own, XferOp::Write)?.len();
    Ok(Plans {
        direct,
        staged,
        staging_blocks: ids.len(),
    })
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

/// Where memory lives, as NIXL registers and addresses it: host memory (`DRAM`, pageable or
/// pinned) or the memory of one CUDA device (`VRAM`, with the device's ordinal as NIXL's
/// device id, the id vLLM's `NixlConnector` and Dynamo register GPU caches with).
///
/// Non-exhaustive: NIXL has more segment kinds (files, blocks, objects) that kvio may address
/// later (match with a wildcard arm).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Memory {
    /// Host memory: a [`crate::PinnedHost`] pool, or any host allocation.
    #[default]
    Dram,
    /// Device memory of CUDA device `device` (its ordinal): a [`crate::DeviceAlloc`] pool or
    /// the device caches of a [`crate::LayerTable`].
    Vram {
        /// CUDA device ordinal.
        device: u32,
    },
}

impl Memory {
    /// NIXL's memory type.
    pub fn mem_type(self) -> MemType {
        match self {
            Memory::Dram => MemType::Dram,
            Memory::Vram { .. } => MemType::Vram,
        }
    }

    /// NIXL's device id (0 for host memory).
    pub fn device_id(self) -> u64 {
        match self {
            Memory::Dram => 0,
            Memory::Vram { device } => u64::from(device),
        }
    }

    /// Classifies the address `ptr` with the CUDA driver: device memory is VRAM of its
    /// device, pinned host memory and memory the driver does not know (pageable host memory)
    /// DRAM. Managed memory is refused ([`Error::InvalidArgument`]). Without a CUDA driver
    /// every address is DRAM.
    pub fn of(ptr: u64) -> Result<Memory> {
        match memory_kind(ptr) {
            MemoryKind::PinnedHost | MemoryKind::Unregistered => Ok(Memory::Dram),
            MemoryKind::Other => Err(invalid(
                "ptr",
                format_args!("{ptr:#x}"),
                "managed memory: register it as DRAM or VRAM explicitly",
            )),
            MemoryKind::Device => {
                let mut ordinal: c_int = -1;
                // SAFETY: one attribute whose value is an int, written to a local int.
                let r = unsafe {
                    cu::cuPointerGetAttribute(
                        (&mut ordinal as *mut c_int).cast(),
                        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                        ptr,
                    )
                };
                crate::driver::check("cuPointerGetAttribute", r)?;
                let device = u32::try_from(ordinal).map_err(|_| Error::Overflow { name: "ptr" })?;
                Ok(Memory::Vram { device })
            }
        }
    }
}

/// Where the memory of `pool` lives ([`Memory::of`] for each cache: the one allocation of a
/// strided pool, every layer/part cache of a layer-table pool). A table whose caches lie in
/// different memories is refused ([`Error::InvalidArgument`]): one NIXL descriptor list has
/// one memory type.
pub fn pool_memory<A: Copy>(pool: &BlockPool<'_, A>) -> Result<Memory> {
    let ext = pool.extent("pool")?;
    let mut found = None;
    for (start, _) in pool.ranges(ext) {
        let m = Memory::of(start)?;
        match found {
            None => found = Some(m),
            Some(f) if f == m => {}
            Some(f) => {
                return Err(invalid(
                    "pool",
                    format_args!("{f:?} and {m:?}"),
                    "caches in different memories",
                ))
            }
        }
    }
    Ok(found.unwrap_or_default())
}

/// One byte range as NIXL registers it.
#[derive(Debug)]
struct Region {
    addr: u64,
    len: usize,
    mem: Memory,
}

impl MemoryRegion for Region {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.addr as *const u8
    }

    fn size(&self) -> usize {
        self.len
    }
}

impl NixlDescriptor for Region {
    fn mem_type(&self) -> MemType {
        self.mem.mem_type()
    }

    fn device_id(&self) -> u64 {
        self.mem.device_id()
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

/// Registers the memory of `pool` with `agent` as DRAM: [`register_pool_in`] with
/// [`Memory::Dram`].
///
/// # Safety
///
/// As [`register_pool_in`]; the pool's memory must be host memory.
pub unsafe fn register_pool<A: Copy>(
    agent: &Agent,
    pool: &BlockPool<'_, A>,
) -> Result<Registration> {
    // SAFETY: forwarded from the caller.
    unsafe { register_pool_in(agent, pool, Memory::Dram) }
}

/// Registers the memory of `pool` with `agent` as `mem`: the whole allocation of a strided
/// pool, every layer/part cache of a layer-table pool (a [`crate::LayerTable`]'s caches, each
/// one registration). A remote agent that loads `agent`'s metadata afterwards
/// ([`Agent::get_local_md`]) can read and write these bytes. [`pool_memory`] tells `mem` for
/// kvio's allocations.
///
/// # Safety
///
/// The pool's memory must be memory of kind `mem` (host memory for [`Memory::Dram`], memory
/// of that CUDA device for [`Memory::Vram`]) that stays allocated until the returned
/// [`Registration`] is dropped, and nothing (no Rust reference, no kernel or copy on a
/// stream) may access it while a NIXL transfer (one this agent posts, or one a remote agent
/// posts into it) can touch it.
pub unsafe fn register_pool_in<A: Copy>(
    agent: &Agent,
    pool: &BlockPool<'_, A>,
    mem: Memory,
) -> Result<Registration> {
    let ext = pool.extent("pool")?;
    let mut handles = Vec::new();
    for (start, end) in pool.ranges(ext) {
        let len = usize::try_from(end - start).map_err(|_| Error::Overflow { name: "pool" })?;
        let region = Region {
            addr: start,
            len,
            mem,
        };
        let h = agent
            .register_memory(&region, None)
            .map_err(nixl_err("register_memory"))?;
        handles.push(h);
    }
    Ok(Registration { handles })
}

/// The local and remote DRAM descriptor lists of `descs` (device id 0), in order.
pub fn desc_lists(descs: &[Desc]) -> Result<(XferDescList<'static>, XferDescList<'static>)> {
    desc_lists_in(descs, Memory::Dram, Memory::Dram)
}

/// The local (`local` memory) and remote (`remote` memory) descriptor lists of `descs`, in
/// order.
pub fn desc_lists_in(
    descs: &[Desc],
    local: Memory,
    remote: Memory,
) -> Result<(XferDescList<'static>, XferDescList<'static>)> {
    let mut l = XferDescList::new(local.mem_type()).map_err(nixl_err("XferDescList::new"))?;
    let mut r = XferDescList::new(remote.mem_type()).map_err(nixl_err("XferDescList::new"))?;
    for d in descs {
        let addr = |a: u64| usize::try_from(a).map_err(|_| Error::Overflow { name: "descs" });
        let len = addr(d.len)?;
        l.add_desc(addr(d.local)?, len, local.device_id());
        r.add_desc(addr(d.remote)?, len, remote.device_id());
    }
    Ok((l, r))
}

/// How [`post_with`] posts a transfer: where the local and the remote memory live, and the
/// notification the remote agent receives once the transfer is complete.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PostArgs<'a> {
    /// The local pool's memory (the default: DRAM).
    pub local: Memory,
    /// The remote pool's memory (the default: DRAM).
    pub remote: Memory,
    /// A message NIXL delivers to the remote agent after the transfer's data (the remote
    /// side's completion signal: [`Notifications`]); `None`: no notification.
    pub notify: Option<&'a [u8]>,
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

    /// Polls until the transfer is complete, or fails with [`Error::Timeout`] once `timeout`
    /// has passed (`None`: no limit); a failed transfer is [`Error::Nixl`].
    pub fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        let start = Instant::now();
        loop {
            if self.done()? {
                return Ok(());
            }
            if timeout.is_some_and(|t| start.elapsed() > t) {
                return Err(Error::Timeout {
                    op: "Transfer::wait",
                    waited: start.elapsed(),
                });
            }
            std::thread::yield_now();
        }
    }
}

/// Posts `copy` as one NIXL transfer of `op` to `remote_agent` (whose metadata `agent` has
/// loaded), DRAM to DRAM, without a notification: [`post_with`] with the default
/// [`PostArgs`].
///
/// # Safety
///
/// As [`post_with`].
pub unsafe fn post(
    agent: &Agent,
    remote_agent: &str,
    op: XferOp,
    copy: &BlockCopy<'_>,
) -> Result<Transfer> {
    // SAFETY: forwarded from the caller.
    unsafe { post_with(agent, remote_agent, op, copy, &PostArgs::default()) }
}

/// Posts `copy` as one NIXL transfer of `op` to `remote_agent` (whose metadata `agent` has
/// loaded): its [`descriptors`] as two descriptor lists in `args`' memories,
/// `create_xfer_req`, then `post_xfer_req` with `args.notify`. Returns the transfer to wait
/// for; nothing is posted on an error.
///
/// # Safety
///
/// Both pools' memory must be of the kinds `args` names, and stay allocated, and the local
/// pool's bytes untouched (by Rust references, kernels or copies), until [`Transfer::done`]
/// returned `true` (or [`Transfer::wait`] `Ok`): the transfer outlives the borrows `copy`
/// holds. Work that wrote the local source (a kernel on a stream) must be complete before
/// this call. Dropping an unfinished [`Transfer`] asks NIXL to abort it, which can fail; the
/// memory must not be released then either.
pub unsafe fn post_with(
    agent: &Agent,
    remote_agent: &str,
    op: XferOp,
    copy: &BlockCopy<'_>,
    args: &PostArgs<'_>,
) -> Result<Transfer> {
    let descs = descriptors(copy, op)?;
    // SAFETY: the descriptors lie in `copy`'s pools; the rest is forwarded from the caller.
    unsafe { post_descs(agent, remote_agent, op, &descs, args) }
}

/// Posts `descs` (from [`descriptors`], or a plan of the caller's such as a staging pool's)
/// as one NIXL transfer of `op` to `remote_agent`, as [`post_with`] does.
///
/// # Safety
///
/// Every descriptor's local bytes must lie in memory of kind `args.local` registered with
/// `agent`, its remote bytes in memory of kind `args.remote` the remote agent registered,
/// and both must satisfy what [`post_with`] requires of the pools, until the transfer is
/// complete.
pub unsafe fn post_descs(
    agent: &Agent,
    remote_agent: &str,
    op: XferOp,
    descs: &[Desc],
    args: &PostArgs<'_>,
) -> Result<Transfer> {
    let (local, remote) = desc_lists_in(descs, args.local, args.remote)?;
    let opt = match args.notify {
        Some(msg) => {
            let mut o = OptArgs::new().map_err(nixl_err("OptArgs::new"))?;
            o.set_notification_message(msg)
                .map_err(nixl_err("set_notification_message"))?;
            o.set_has_notification(true)
                .map_err(nixl_err("set_has_notification"))?;
            Some(o)
        }
        None => None,
    };
    let req = agent
        .create_xfer_req(op, &local, &remote, remote_agent, opt.as_ref())
        .map_err(nixl_err("create_xfer_req"))?;
    agent
        .post_xfer_req(&req, opt.as_ref())
        .map_err(nixl_err("post_xfer_req"))?;
    Ok(Transfer {
        agent: agent.clone(),
        req,
        descs: descs.len(),
    })
}

/// One notification an agent received: the remote agent's name and its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    /// The agent that sent it.
    pub from: String,
    /// Its message.
    pub msg: Vec<u8>,
}

/// The notifications an agent receives ([`PostArgs::notify`] of a remote agent's transfer,
/// or [`notify`]), kept until asked for: [`Notifications::take`] and
/// [`Notifications::wait`] pick one (sender, message) and leave the others.
///
/// A notification sent with a transfer arrives after the transfer's data (NIXL delivers it
/// once the transfer is complete): the receiving side's signal that the bytes are there. The
/// sender must keep progressing its transfer ([`Transfer::done`] or [`Transfer::wait`]) for
/// it to complete and the notification to go out (seen with UCX on its default parameters:
/// a receiver polling alone waits forever).
pub struct Notifications {
    agent: Agent,
    pending: Vec<Notification>,
}

impl Notifications {
    /// Receives `agent`'s notifications (those not yet fetched by another receiver).
    pub fn new(agent: &Agent) -> Notifications {
        Notifications {
            agent: agent.clone(),
            pending: Vec::new(),
        }
    }

    /// Fetches what arrived (progressing the agent's backends); returns how many are pending.
    pub fn poll(&mut self) -> Result<usize> {
        let mut map = NotificationMap::new().map_err(nixl_err("NotificationMap::new"))?;
        self.agent
            .get_notifications(&mut map, None)
            .map_err(nixl_err("get_notifications"))?;
        let agents = map
            .agents()
            .map(|a| a.map(String::from))
            .collect::<std::result::Result<Vec<String>, _>>()
            .map_err(nixl_err("NotificationMap::agents"))?;
        for from in agents {
            let n = map
                .get_notifications_size(&from)
                .map_err(nixl_err("get_notifications_size"))?;
            for i in 0..n {
                let msg = map
                    .get_notification_bytes(&from, i)
                    .map_err(nixl_err("get_notification_bytes"))?;
                self.pending.push(Notification {
                    from: from.clone(),
                    msg,
                });
            }
        }
        Ok(self.pending.len())
    }

    /// Every pending notification, in arrival order (after a [`Notifications::poll`]).
    pub fn drain(&mut self) -> Vec<Notification> {
        std::mem::take(&mut self.pending)
    }

    /// Polls, then removes the first pending notification from `from` with message `msg`;
    /// returns whether there was one.
    pub fn take(&mut self, from: &str, msg: &[u8]) -> Result<bool> {
        self.poll()?;
        match self
            .pending
            .iter()
            .position(|n| n.from == from && n.msg == msg)
        {
            Some(i) => {
                self.pending.remove(i);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Polls until a notification from `from` with message `msg` arrived (and removes it), or
    /// fails with [`Error::Timeout`] once `timeout` has passed (`None`: no limit).
    pub fn wait(&mut self, from: &str, msg: &[u8], timeout: Option<Duration>) -> Result<()> {
        let start = Instant::now();
        loop {
            if self.take(from, msg)? {
                return Ok(());
            }
            if timeout.is_some_and(|t| start.elapsed() > t) {
                return Err(Error::Timeout {
                    op: "Notifications::wait",
                    waited: start.elapsed(),
                });
            }
            std::thread::yield_now();
        }
    }
}

/// Sends `msg` to `remote_agent` as a notification without a transfer (a side signal: "ready",
/// "done").
pub fn notify(agent: &Agent, remote_agent: &str, msg: &[u8]) -> Result<()> {
    agent
        .send_notification(remote_agent, msg, None)
        .map_err(nixl_err("send_notification"))
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

    /// A v0 pool (K and V in their own layouts) to cross-layer NHD blocks: K's descriptors
    /// (16-byte pieces), then V's (one element each), every byte once.
    #[test]
    fn v0_pools_convert_part_by_part() {
        let (k, v) = (
            PagedLayout::v0_key(NB, BS, H, D, E),
            PagedLayout::v0_value(NB, BS, H, D, E),
        );
        let cache = k.extent("k").unwrap() as usize;
        let v0 = BlockPool::strided(bytes_mut(SRC, 2 * L * cache), 2 * cache, cache, L, 2, k)
            .value_layout(v);
        let pairs = [[0, 3], [-1, -1], [2, 1]];
        let op = BlockCopy::new(v0, cross(DST, NB), BlockMap::Host(&pairs));
        let descs = descriptors(&op, XferOp::Write).unwrap();
        let (k_pieces, v_pieces) = (2 * L * BS * H * D / 8, 2 * L * BS * H * D);
        assert_eq!(descs.len(), k_pieces + v_pieces);
        assert!(descs[..k_pieces].iter().all(|d| d.len == 16));
        assert!(descs[k_pieces..].iter().all(|d| d.len == E as u64));
        let total: u64 = descs.iter().map(|d| d.len).sum();
        assert_eq!(total, 2 * BLOCK);
        // V's first piece: the V cache of layer 0 of block 0, into block 3's V of layer 0.
        let v_first = descs[k_pieces];
        assert_eq!(v_first.local, SRC + cache as u64);
        assert_eq!(v_first.remote, DST + 3 * BLOCK + (BS * H * D * E) as u64);
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
    fn memories_name_nixl_types_and_devices() {
        assert_eq!(
            (Memory::Dram.mem_type(), Memory::Dram.device_id()),
            (MemType::Dram, 0)
        );
        let v = Memory::Vram { device: 3 };
        assert_eq!((v.mem_type(), v.device_id()), (MemType::Vram, 3));
        // Host memory, unknown to the driver (or no driver): DRAM.
        let host = [0u8; 64];
        assert_eq!(Memory::of(host.as_ptr() as u64).unwrap(), Memory::Dram);
        assert_eq!(
            pool_memory(&cross(host.as_ptr() as u64, NB)).unwrap(),
            Memory::Dram
        );
    }

    #[test]
    fn plans_count_direct_and_staged_descriptors() {
        let pairs = [[0, 3], [1, 4], [6, 5], [-1, -1], [2, 0]];
        // Same layouts: nothing to gain.
        let same = BlockCopy::new(cross(SRC, 8), cross(DST, 8), BlockMap::Host(&pairs));
        let p = plans(&same, XferOp::Write).unwrap();
        assert_eq!((p.direct, p.staged, p.staging_blocks), (3, 2, 4));
        // Layer-first local, cross-layer remote: per chunk directly, per remote run staged.
        let lf = layer_first(SRC, 8, L, BS, H, D, E);
        let mixed = BlockCopy::new(lf, cross(DST, 8), BlockMap::Host(&pairs));
        let p = plans(&mixed, XferOp::Write).unwrap();
        assert_eq!(
            (p.direct, p.staged),
            (descriptors(&mixed, XferOp::Write).unwrap().len(), 2)
        );
        assert!(p.direct >= 4 * L * 2 && p.stage());
        // Read: the remote pool is the source; its runs count.
        let p = plans(&mixed, XferOp::Read).unwrap();
        // Remote (layer-first) source ids 0, 1, 6, 2: three runs, each one per layer and part.
        assert_eq!(p.staged, 3 * L * 2);
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
