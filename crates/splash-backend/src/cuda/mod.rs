//! The CUDA backend (feature `cuda`): device memory, kernels compiled by NVRTC at first use
//! with the model's dimensions as compile-time constants (cached on disk), and launch wrappers
//! for every op the models need. The driver and NVRTC are loaded at run time, so building
//! needs no CUDA toolkit; [`Gpu::new`] fails cleanly on a machine without a GPU.
//!
//! Buffers are `CudaSlice`s owned by their users; kernels receive raw device pointers (event
//! tracking is off: everything runs in order on one stream). A pass whose work needs no host
//! round trip can be captured once as a CUDA graph ([`Gpu::capture`]) and replayed with one
//! launch, which removes the host's cost of launching a few thousand kernels.

mod compile;
#[cfg(test)]
mod kernels_on_host;
mod ops;
mod options;
mod signatures;
mod weights;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    LaunchConfig, PushKernelArg, ValidAsZeroBits,
};

use crate::timeline::{spans, BlockRecord, Launch, Span};
pub use compile::{compile_ptx, KernelDims};
pub use ops::*;
pub use options::{GpuOptions, KernelOptions, TiledGemv};
pub use weights::{is_tiled, DeviceWeight, GpuFormat};

/// What went wrong on the GPU side.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("CUDA: {0}")]
    Driver(String),
    #[error("CUDA kernel compilation (NVRTC) failed: {0}")]
    Compile(String),
    #[error("cuBLAS: {0}")]
    Blas(String),
    #[error("{0}")]
    Unsupported(String),
}

impl From<cudarc::driver::DriverError> for GpuError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        GpuError::Driver(e.to_string())
    }
}

/// One GPU: its context, the stream everything runs on, and the compiled kernel modules.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: &'static str,
    name: String,
    /// Streaming multiprocessors (the stream-K GEMV gives each a share of a matrix).
    sms: usize,
    /// The launches of modules built with [`KernelOptions::timeline`] since the last
    /// [`Gpu::timeline_reset`], in queue order (a graph's again at each replay).
    launches: Mutex<Vec<Launch>>,
    modules: Mutex<HashMap<(KernelDims, KernelOptions), Arc<Kernels>>>,
    /// How it runs (see [`Gpu::set_options`]).
    options: std::sync::RwLock<GpuOptions>,
    /// cuBLAS for prefill GEMMs, created at first use (`Err`: the library is missing, and
    /// the GEMV kernels do the work instead).
    blas: Mutex<Option<Result<Arc<cudarc::cublas::CudaBlas>, String>>>,
    /// f32 arithmetic everywhere (the reference path of the parity tests) instead of int8
    /// activations in the GEMV and bf16 operands in the prefill GEMMs.
    exact: std::sync::atomic::AtomicBool,
    /// Keep every product on the batch-invariant GEMV kernels, whatever the token count (see
    /// [`Gpu::set_batch_invariant`]).
    batch_invariant: std::sync::atomic::AtomicBool,
    /// Whether callers may capture passes as graphs (see [`Gpu::set_graphs`]).
    graphs: std::sync::atomic::AtomicBool,
    /// Graph replays so far ([`Gpu::replay`]).
    replays: std::sync::atomic::AtomicU64,
    /// Per-kernel launch counts and seconds with [`GpuOptions::profile`]: every launch is
    /// then synchronised and timed (slow; for finding where the time goes). Printed on drop.
    profile: Option<Mutex<HashMap<String, (u64, f64)>>>,
    /// Kernels captured into graphs launch as programmatic dependents of the one before
    /// (sm_90 and up, with [`GpuOptions::dependent_launch`]): see [`Gpu::launch_dependent`].
    /// Launches outside a capture (prefill) do not: measured 10 % slower there.
    dependent_launch: bool,
    /// Where buffers allocated during a capture come from with [`GpuOptions::capture_pool`]
    /// (created at the first capture; see [`CapturePool`]).
    capture_pool: Option<Mutex<Option<CapturePool>>>,
    /// Page-locked host memory that large downloads go through (a pageable copy is staged
    /// by the driver at a fraction of the bus speed); grown on demand, reused.
    staging: Mutex<Option<cudarc::driver::PinnedHostSlice<u8>>>,
    /// The counter with which `moe_route`'s last block finds itself to group the pairs (at 0
    /// between launches; one serves all, as everything runs in order on one stream).
    route_done: CudaSlice<i32>,
}

impl Drop for Gpu {
    fn drop(&mut self) {
        let Some(rows) = self.profile_table() else {
            return;
        };
        let total: f64 = rows.iter().map(|r| r.2).sum();
        eprintln!(
            "GPU profile (synchronised launches): {:.3} s in kernels",
            total
        );
        eprint!("{}", crate::profile::profile_text(&rows));
    }
}

/// Buffers that a pass allocates while it is captured as a graph. Allocated on the captured
/// stream, they would become graph memory nodes, and a kernel after a memory node cannot
/// launch as a dependent of the kernel before it (3,145 such nodes stood between the 1,364
/// kernels of a 27B decode graph). So they come from a pool of their own through a stream
/// that is not captured, and their frees go back to it at once: the graph holds their
/// addresses, and later captures reuse the same memory. That is safe because only captures
/// allocate from this pool, a pass's buffers live within that pass (its inputs, outputs and
/// states are allocated outside the capture), and graphs replay one at a time on one stream,
/// each waiting for the work before it. The pool keeps its memory mapped for good. On by
/// default (`SPLASH_CAPTURE_POOL=0` turns it off); it relaxes the capture mode, since the
/// thread-local one refuses an allocation on another stream. With kernels that let the next one
/// launch only after their wait (GRID_PROLOGUE), a 1-token pass took 5–8 % less time on the
/// 35B-A3B and 3–4 % less on the 27B, whose 16-row pass took 0.2–1.5 ms more (H100,
/// BENCHMARKS.md, 2026-12-06).
struct CapturePool {
    pool: cudarc::driver::sys::CUmemoryPool,
    stream: Arc<CudaStream>,
}

// SAFETY: the pool handle is a driver object usable from any thread; the owner locks it.
unsafe impl Send for CapturePool {}

impl CapturePool {
    fn new(ctx: &Arc<CudaContext>) -> Result<Self, GpuError> {
        use cudarc::driver::sys;
        // SAFETY: zeroed properties are valid plain data; the fields that matter are set.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = ctx.ordinal() as i32;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        let mut threshold = u64::MAX;
        // SAFETY: `pool` receives a new pool; the attribute takes a u64.
        unsafe {
            sys::cuMemPoolCreate(&mut pool, &props).result()?;
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )
            .result()?;
        }
        Ok(Self {
            pool,
            stream: ctx.new_stream()?,
        })
    }

    fn alloc<T: DeviceRepr>(&self, len: usize) -> Result<CudaSlice<T>, GpuError> {
        use cudarc::driver::sys;
        let mut at: sys::CUdeviceptr = 0;
        // SAFETY: a pool allocation on an idle stream of our own, so it is ready when this
        // returns; the slice frees it on that stream, back to the pool, when dropped.
        unsafe {
            sys::cuMemAllocFromPoolAsync(
                &mut at,
                len * std::mem::size_of::<T>(),
                self.pool,
                self.stream.cu_stream(),
            )
            .result()?;
            Ok(self.stream.upgrade_device_ptr(at, len))
        }
    }
}

thread_local! {
    /// The address of the [`Gpu`] whose stream this thread is capturing (0: none): read at
    /// every launch, so a thread-local cell rather than a lock.
    static CAPTURING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Downloads of at least this many bytes go through the page-locked staging buffer (a
/// verify block's logits are 16 MB).
const STAGED_DOWNLOAD: usize = 256 << 10;

/// Launches the log of a timeline build keeps at most (twice the kernels' ring of records).
const LAUNCH_LOG_MAX: usize = 1 << 21;

/// A captured pass ([`Gpu::capture`]), replayed by [`Gpu::replay`]; with a timeline build, the
/// launches it holds (each replay queues them again).
pub struct Graph(cudarc::driver::CudaGraph, Vec<Launch>);

// SAFETY: a graph is a driver handle; it is launched on the stream it was captured from, whose
// work is ordered, and its owners keep it behind a lock.
unsafe impl Send for Graph {}
unsafe impl Sync for Graph {}

/// What a captured graph holds ([`Graph::census`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphCensus {
    /// Kernel nodes.
    pub kernels: usize,
    /// Every other node (memory allocations and frees, copies, sets).
    pub others: usize,
    /// Edges in all.
    pub edges: usize,
    /// Edges that let a kernel start before the one it depends on has finished.
    pub programmatic: usize,
}

impl Graph {
    /// Counts the graph's nodes and edges (for the bench: whether dependent launches survived
    /// the capture, which turns a launch after a memory node into a full dependency).
    pub fn census(&self) -> Result<GraphCensus, GpuError> {
        use cudarc::driver::sys;
        let g = self.0.cu_graph();
        let mut n = 0usize;
        let mut e = 0usize;
        // SAFETY: the first calls only count; the buffers are sized by those counts.
        unsafe {
            sys::cuGraphGetNodes(g, std::ptr::null_mut(), &mut n).result()?;
            let mut nodes = vec![std::ptr::null_mut(); n];
            sys::cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut n).result()?;
            let mut census = GraphCensus::default();
            for &node in &nodes[..n] {
                let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
                sys::cuGraphNodeGetType(node, &mut t).result()?;
                if t == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
                    census.kernels += 1;
                } else {
                    census.others += 1;
                }
            }
            sys::cuGraphGetEdges_v2(
                g,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut e,
            )
            .result()?;
            let mut from = vec![std::ptr::null_mut(); e];
            let mut to = vec![std::ptr::null_mut(); e];
            let mut data = vec![std::mem::zeroed::<sys::CUgraphEdgeData>(); e];
            sys::cuGraphGetEdges_v2(
                g,
                from.as_mut_ptr(),
                to.as_mut_ptr(),
                data.as_mut_ptr(),
                &mut e,
            )
            .result()?;
            census.edges = e;
            census.programmatic = data[..e]
                .iter()
                .filter(|d| {
                    d.type_
                        == sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8
                })
                .count();
            Ok(census)
        }
    }
}

/// The kernels of one compiled module (one set of model dimensions).
pub struct Kernels {
    dims: KernelDims,
    options: KernelOptions,
    module: Arc<CudaModule>,
    functions: Mutex<HashMap<String, CudaFunction>>,
}

/// A kernel argument.
#[derive(Clone, Debug)]
pub(crate) enum Arg {
    /// A device address.
    Ptr(u64),
    I32(i32),
    I64(i64),
    F32(f32),
    /// The sequences of a pass, by value (`SeqSlots` in kernels/gdn.cu).
    Seqs(Box<SeqSlots>),
    /// The GDN layers of a rollback, by value (`LayerSlots` in kernels/gdn.cu).
    Layers(Box<LayerSlots>),
    /// The sequences of an attention layer's pass, by value (`AttnSlots` in kernels/rope.cu).
    Attn(Box<AttnSlots>),
    /// The products of one launch, by value (`ProductGroup` in kernels/gemv_tc.cu).
    Group(Box<ProductGroup>),
}

/// Sequences a `*_seqs` kernel takes in one launch (`SEQ_SLOTS` in kernels/gdn.cu).
pub const SEQ_SLOTS: usize = 16;

/// Up to [`SEQ_SLOTS`] sequences of one pass, passed by value in a kernel's parameters (so a
/// captured graph keeps them): sequence `i` has rows `off[i] .. off[i] + n[i]` of the pass, its
/// own state at `state[i]`, and where a recorded pass saves what it reads at `save[k][i]` (0:
/// not recorded). `SeqSlots` in kernels/gdn.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SeqSlots {
    pub state: [u64; SEQ_SLOTS],
    pub save: [[u64; SEQ_SLOTS]; 3],
    pub off: [i32; SEQ_SLOTS],
    pub n: [i32; SEQ_SLOTS],
}

// SAFETY: plain data with the C layout of SeqSlots (kernels/gdn.cu).
unsafe impl DeviceRepr for SeqSlots {}

/// Sequences an attention `*_seqs` kernel takes in one launch (`ATTN_SLOTS` in kernels/rope.cu).
pub const ATTN_SLOTS: usize = 16;

/// Up to [`ATTN_SLOTS`] sequences of an attention layer's pass, by value in a kernel's
/// parameters: sequence `i` has rows `off[i] .. off[i] + n[i]` of the pass, its first position
/// `pos0[i]` (plus the `i32` at `pos_at[i]` when that is not 0, see `ops::Position`) and its
/// key and value caches `kc`/`ks`, `vc`/`vs` (rows, int8 scales). `AttnSlots` in kernels/rope.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AttnSlots {
    pub kc: [u64; ATTN_SLOTS],
    pub ks: [u64; ATTN_SLOTS],
    pub vc: [u64; ATTN_SLOTS],
    pub vs: [u64; ATTN_SLOTS],
    pub pos_at: [u64; ATTN_SLOTS],
    pub pos0: [i32; ATTN_SLOTS],
    pub off: [i32; ATTN_SLOTS],
    pub n: [i32; ATTN_SLOTS],
}

// SAFETY: plain data with the C layout of AttnSlots (kernels/rope.cu).
unsafe impl DeviceRepr for AttnSlots {}

/// Products of one input a `*_group` launch takes (`PRODUCT_GROUP_MAX` in kernels/gemv_tc.cu).
pub const PRODUCT_GROUP_MAX: usize = 4;

/// Up to [`PRODUCT_GROUP_MAX`] products of one input in one launch, by value in the kernel's
/// parameters: product `i` by the weight at `w[i]` (`row_bytes[i]`, format code `fmt[i]`, `n[i]`
/// rows, the first `split[i]` into `y[i]`, the others into `y2[i]`, its K blocks in `chains[i]`
/// sums) takes the blocks before `end[i]` and from `end[i - 1]`. `ProductGroup` in
/// kernels/gemv_tc.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProductGroup {
    pub w: [u64; PRODUCT_GROUP_MAX],
    pub y: [u64; PRODUCT_GROUP_MAX],
    pub y2: [u64; PRODUCT_GROUP_MAX],
    pub row_bytes: [i64; PRODUCT_GROUP_MAX],
    pub fmt: [i32; PRODUCT_GROUP_MAX],
    pub n: [i32; PRODUCT_GROUP_MAX],
    pub split: [i32; PRODUCT_GROUP_MAX],
    pub chains: [i32; PRODUCT_GROUP_MAX],
    pub end: [i32; PRODUCT_GROUP_MAX],
}

// SAFETY: plain data with the C layout of ProductGroup (kernels/gemv_tc.cu).
unsafe impl DeviceRepr for ProductGroup {}

/// GDN layers a `*_replay` kernel takes in one launch (`LAYER_SLOTS` in kernels/gdn.cu).
pub const LAYER_SLOTS: usize = 64;

/// Up to [`LAYER_SLOTS`] GDN layers of one sequence's rollback, by value in a kernel's
/// parameters: layer `i`'s state saved before the recorded pass at `saved[i]`, its live state
/// at `live[i]` and three more buffers `buf[k][i]` (see `ops::gdn_replay`). `LayerSlots` in
/// kernels/gdn.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LayerSlots {
    pub saved: [u64; LAYER_SLOTS],
    pub live: [u64; LAYER_SLOTS],
    pub buf: [[u64; LAYER_SLOTS]; 3],
}

impl Default for LayerSlots {
    fn default() -> Self {
        Self {
            saved: [0; LAYER_SLOTS],
            live: [0; LAYER_SLOTS],
            buf: [[0; LAYER_SLOTS]; 3],
        }
    }
}

// SAFETY: plain data with the C layout of LayerSlots (kernels/gdn.cu).
unsafe impl DeviceRepr for LayerSlots {}

/// Keeps memory freed to the device's default pool (stream-ordered allocations) in the pool
/// instead of returning it to the driver at every synchronisation: without it, every pass
/// maps its scratch buffers afresh, and a prefix-cache hit that copies a 1 GB state spends
/// more time mapping memory than copying it.
fn keep_freed_memory(ctx: &CudaContext) -> Result<(), GpuError> {
    use cudarc::driver::sys;
    if !ctx.has_async_alloc() {
        return Ok(());
    }
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: `pool` receives the device's default pool; the attribute takes a u64.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()).result()?;
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .result()?;
    }
    Ok(())
}

impl Gpu {
    /// Opens GPU `ordinal` with the default options: fails with a message when the driver
    /// cannot be loaded or no such device exists.
    pub fn new(ordinal: usize) -> Result<Arc<Self>, GpuError> {
        Self::with_options(ordinal, GpuOptions::default())
    }

    /// Opens GPU `ordinal` to run with `options` (see [`Gpu::new`]).
    pub fn with_options(ordinal: usize, options: GpuOptions) -> Result<Arc<Self>, GpuError> {
        // SAFETY: only probes whether the driver library can be loaded.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(GpuError::Driver(
                "no NVIDIA driver found (libcuda.so cannot be loaded)".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal)?;
        // One in-order stream: cudarc's per-buffer event tracking is not needed.
        // SAFETY: called before any buffer or stream exists in this context.
        unsafe { ctx.disable_event_tracking() };
        // A stream of our own: the legacy default stream cannot be captured into a graph.
        let stream = ctx.new_stream()?;
        keep_freed_memory(&ctx)?;
        let (major, minor) = ctx.compute_capability()?;
        let name = ctx.name()?;
        let sms = ctx.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )? as usize;
        let profile = options.profile.then(|| Mutex::new(HashMap::new()));
        let route_done = stream.alloc_zeros::<i32>(1)?;
        // Profiling synchronises every launch, which a capture cannot contain.
        let graphs = options.graphs && !options.profile;
        Ok(Arc::new(Self {
            arch: compile::arch_for(major, minor),
            name,
            sms,
            launches: Mutex::new(Vec::new()),
            ctx,
            stream,
            modules: Mutex::new(HashMap::new()),
            blas: Mutex::new(None),
            exact: std::sync::atomic::AtomicBool::new(false),
            batch_invariant: std::sync::atomic::AtomicBool::new(false),
            graphs: std::sync::atomic::AtomicBool::new(graphs),
            replays: std::sync::atomic::AtomicU64::new(0),
            profile,
            dependent_launch: major >= 9 && options.dependent_launch,
            capture_pool: options.capture_pool.then(|| Mutex::new(None)),
            options: std::sync::RwLock::new(options),
            staging: Mutex::new(None),
            route_done,
        }))
    }

    /// The device's name, e.g. "NVIDIA H200".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's ordinal (what [`Gpu::new`] opened).
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Streaming multiprocessors of the device.
    pub fn sms(&self) -> usize {
        self.sms
    }

    /// The launch log ([`Gpu::timeline`]).
    fn launch_log(&self) -> std::sync::MutexGuard<'_, Vec<Launch>> {
        self.launches.lock().expect("launch log lock")
    }

    /// Adds `launches` to the log; past `LAUNCH_LOG_MAX` entries (a timeline build left
    /// running, a server) the older half goes, outside a capture (which takes its launches from
    /// the end): only the launches since a reset pair anyway.
    fn log_launches(&self, launches: &[Launch]) {
        let mut log = self.launch_log();
        log.extend_from_slice(launches);
        if log.len() > LAUNCH_LOG_MAX && !self.capturing_here() {
            let old = log.len() - LAUNCH_LOG_MAX / 2;
            log.drain(..old);
        }
    }

    /// Starts a timeline (modules built with [`KernelOptions::timeline`]): forgets the launches
    /// so far and empties `k`'s ring of block records, in stream order. Whether `k` records:
    /// for other modules nothing is done and the answer is `false`.
    pub fn timeline_reset(&self, k: &Kernels) -> Result<bool, GpuError> {
        if !k.options.timeline {
            return Ok(false);
        }
        self.launch_log().clear();
        let mut count = k.module.get_global("timeline_count", &self.stream)?;
        self.stream.memcpy_htod(&0u64.to_ne_bytes(), &mut count)?;
        Ok(true)
    }

    /// The launches since [`Gpu::timeline_reset`] as they ran (after the queued work): `k`'s
    /// block records paired with the launches queued (see [`crate::timeline::spans`]). `None`
    /// when `k` was not built with [`KernelOptions::timeline`]; an error names a pairing that
    /// fails.
    pub fn timeline(&self, k: &Kernels) -> Result<Option<Result<Vec<Span>, String>>, GpuError> {
        if !k.options.timeline {
            return Ok(None);
        }
        self.stream.synchronize()?;
        let count = k.module.get_global("timeline_count", &self.stream)?;
        let mut n = [0u8; 8];
        self.stream.memcpy_dtoh(&count, &mut n)?;
        let size = std::mem::size_of::<BlockRecord>();
        let ring = k.module.get_global("timeline_records", &self.stream)?;
        let held = (u64::from_ne_bytes(n) as usize).min(ring.len() / size);
        let mut bytes = vec![0u8; held * size];
        self.stream
            .memcpy_dtoh(&ring.slice(..held * size), &mut bytes)?;
        let records: Vec<BlockRecord> = bytemuck::pod_collect_to_vec(&bytes);
        Ok(Some(spans(&records, &self.launch_log())))
    }

    /// Free and total device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize), GpuError> {
        Ok(self.ctx.mem_get_info()?)
    }

    /// The device address of `moe_route`'s grouping counter (see the field).
    pub(crate) fn route_done(&self) -> u64 {
        ptr(self, &self.route_done, 0)
    }

    /// The stream all work is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The kernels compiled for `dims` (compiled, or read from the disk cache, on first use).
    pub fn kernels(&self, dims: KernelDims) -> Result<Arc<Kernels>, GpuError> {
        let options = self.options().kernels;
        let mut modules = self.modules.lock().expect("module cache lock");
        if let Some(k) = modules.get(&(dims, options)) {
            return Ok(k.clone());
        }
        options.check(dims.gdn_dk).map_err(GpuError::Unsupported)?;
        let ptx = compile::compile_ptx(dims, &options, self.arch)?;
        let module = self.ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx))?;
        let k = Arc::new(Kernels {
            dims,
            options,
            module,
            functions: Mutex::new(HashMap::new()),
        });
        modules.insert((dims, options), k.clone());
        Ok(k)
    }

    /// The options launches run with.
    pub fn options(&self) -> GpuOptions {
        *self.options.read().expect("options lock")
    }

    /// Changes the options later launches read (tests and benches compare variants this way).
    /// `profile`, `capture_pool`, `dependent_launch` and `graphs` keep the values the GPU was
    /// opened with (see [`set_graphs`](Self::set_graphs)); kernel options apply to the modules
    /// [`kernels`](Self::kernels) returns from then on.
    pub fn set_options(&self, options: GpuOptions) {
        *self.options.write().expect("options lock") = options;
    }

    /// A zeroed device buffer of `len` elements.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<T>, GpuError> {
        if let Some(pool) = self.capture_pool.as_ref().filter(|_| self.capturing_here()) {
            let mut buf = self.captured_alloc(pool, len)?;
            self.stream.memset_zeros(&mut buf)?;
            return Ok(buf);
        }
        Ok(self.stream.alloc_zeros(len.max(1))?)
    }

    /// An uninitialised device buffer of `len` elements, for outputs a kernel writes whole.
    pub fn uninit<T: DeviceRepr>(&self, len: usize) -> Result<CudaSlice<T>, GpuError> {
        if let Some(pool) = self.capture_pool.as_ref().filter(|_| self.capturing_here()) {
            return self.captured_alloc(pool, len);
        }
        // SAFETY: the memory is only read after a kernel has written it.
        Ok(unsafe { self.stream.alloc(len.max(1)) }?)
    }

    /// Whether the calling thread is capturing a graph on this GPU's stream.
    fn capturing_here(&self) -> bool {
        CAPTURING.with(|c| c.get() == self as *const Self as usize)
    }

    /// A buffer for a pass under capture, from the capture pool (see [`CapturePool`]).
    fn captured_alloc<T: DeviceRepr>(
        &self,
        pool: &Mutex<Option<CapturePool>>,
        len: usize,
    ) -> Result<CudaSlice<T>, GpuError> {
        let mut pool = pool.lock().expect("capture pool lock");
        if pool.is_none() {
            *pool = Some(CapturePool::new(&self.ctx)?);
        }
        pool.as_ref().expect("capture pool").alloc(len.max(1))
    }

    /// `true`: every product in f32, weights decoded exactly (the reference path, what the
    /// parity tests use). `false`, the default: the Q4_K and Q6_K GEMVs take activations in
    /// f16 and run on tensor cores, the Q5_K and Q8_0 ones take activations rounded to int8 per
    /// 32 values and multiply integer codes (dp4a), and prefill GEMMs run on bf16 tensor cores;
    /// products accumulate in f32 either way.
    pub fn set_exact(&self, exact: bool) {
        self.exact
            .store(exact, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the exact mode is on (see [`set_exact`](Self::set_exact)).
    pub fn exact(&self) -> bool {
        self.exact.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// While set, products of many tokens stay on the GEMV kernels instead of cuBLAS: each
    /// token's row is then what it would be alone. A pass that batches several sequences sets
    /// it, so that a request's output does not depend on what runs beside it.
    pub fn set_batch_invariant(&self, on: bool) {
        self.batch_invariant
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn batch_invariant(&self) -> bool {
        self.batch_invariant
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Allows or forbids capturing passes as graphs (as [`GpuOptions::graphs`] says at first;
    /// off while profiling). The parity tests turn it off to compare.
    pub fn set_graphs(&self, on: bool) {
        self.graphs.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether passes may be captured as graphs (see [`set_graphs`](Self::set_graphs)).
    pub fn graphs(&self) -> bool {
        self.graphs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Queues one replay of `graph` on the stream.
    pub fn replay(&self, graph: &Graph) -> Result<(), GpuError> {
        self.replays
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.log_launches(&graph.1);
        Ok(graph.0.launch()?)
    }

    /// How many graph replays were queued so far.
    pub fn replays(&self) -> u64 {
        self.replays.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records the work `queue` puts on the stream into a graph instead of running it, and
    /// instantiates the graph. Everything `queue` allocates must be freed before it returns
    /// (the graph then owns that memory); a host round trip inside it (a download, a
    /// synchronisation) fails the capture.
    pub fn capture<E: From<GpuError>>(
        &self,
        queue: impl FnOnce() -> Result<(), E>,
    ) -> Result<Graph, E> {
        use cudarc::driver::sys;
        // The capture pool allocates on a stream that is not captured, which only the relaxed
        // mode allows.
        let mode = match self.capture_pool {
            Some(_) => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            None => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        };
        self.stream.begin_capture(mode).map_err(GpuError::from)?;
        let logged = self.launch_log().len();
        CAPTURING.with(|c| c.set(self as *const Self as usize));
        let queued = queue();
        CAPTURING.with(|c| c.set(0));
        let captured = self.launch_log().split_off(logged);
        // The capture ends whatever happened, so the stream runs work again.
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(GpuError::from);
        queued?;
        match graph? {
            Some(g) => Ok(Graph(g, captured)),
            None => Err(GpuError::Driver("the capture recorded no work".into()).into()),
        }
    }

    /// The cuBLAS handle, if the library can be loaded (tried once).
    pub fn blas(&self) -> Option<Arc<cudarc::cublas::CudaBlas>> {
        let mut b = self.blas.lock().expect("cuBLAS lock");
        let handle = b.get_or_insert_with(|| {
            // SAFETY: only probes whether the library can be loaded.
            if !unsafe { cudarc::cublas::sys::is_culib_present() } {
                return Err("libcublas cannot be loaded".into());
            }
            cudarc::cublas::CudaBlas::new(self.stream.clone())
                .map(Arc::new)
                .map_err(|e| e.to_string())
        });
        match handle {
            Ok(h) => Some(h.clone()),
            Err(_) => None,
        }
    }

    /// A device copy of `data`.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>, GpuError> {
        if data.is_empty() {
            // cudarc refuses zero-length copies; keep a one-element buffer instead.
            return Ok(unsafe { self.stream.alloc(1) }?);
        }
        Ok(self.stream.clone_htod(data)?)
    }

    /// A zeroed buffer of `len` elements that starts with a copy of `old` (a cache that grows).
    pub fn grown<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        old: &CudaSlice<T>,
        len: usize,
    ) -> Result<CudaSlice<T>, GpuError> {
        let mut fresh = self.zeros::<T>(len)?;
        self.stream
            .memcpy_dtod(old, &mut fresh.slice_mut(..old.len()))?;
        Ok(fresh)
    }

    /// Copies `bytes` bytes from device address `src` to `dst` (queued on the stream).
    pub fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<(), GpuError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: callers pass addresses inside live buffers of at least `bytes` bytes
        // (from `ptr`); the copy is ordered with every kernel on the one stream.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream())
        }?;
        Ok(())
    }

    /// Copies `data` into the start of `dst`.
    pub fn write<T: DeviceRepr>(&self, dst: &mut CudaSlice<T>, data: &[T]) -> Result<(), GpuError> {
        if data.is_empty() {
            return Ok(());
        }
        let mut view = dst.slice_mut(..data.len());
        self.stream.memcpy_htod(data, &mut view)?;
        Ok(())
    }

    /// The first `len` elements of `src`, on the host (waits for queued work).
    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        src: &CudaSlice<T>,
        len: usize,
    ) -> Result<Vec<T>, GpuError> {
        let bytes = len * std::mem::size_of::<T>();
        if bytes < STAGED_DOWNLOAD {
            let mut out = vec![T::default(); len];
            if len > 0 {
                self.stream.memcpy_dtoh(&src.slice(..len), &mut out)?;
            }
            return Ok(out);
        }
        let mut staging = self.staging.lock().expect("staging lock");
        if staging.as_ref().is_none_or(|s| s.len() < bytes) {
            // Dropped first: the old buffer's memory goes back before the new one is taken.
            *staging = None;
            // SAFETY: page-locked bytes, only read after the copy below has written them.
            *staging = Some(unsafe { self.ctx.alloc_pinned::<u8>(bytes.next_power_of_two()) }?);
        }
        let host = staging.as_mut().expect("staging buffer").as_mut_ptr()?;
        let (at, _guard) = src.device_ptr(&self.stream);
        // SAFETY: `host` holds at least `bytes`, `src` at least `len` elements; the stream is
        // synchronised before the bytes are read.
        unsafe {
            cudarc::driver::sys::cuMemcpyDtoHAsync_v2(
                host.cast(),
                at,
                bytes,
                self.stream.cu_stream(),
            )
            .result()?;
        }
        self.stream.synchronize()?;
        let mut out = Vec::<T>::with_capacity(len);
        // SAFETY: `T` is plain device data (`DeviceRepr`); `bytes` of it were just copied.
        unsafe {
            std::ptr::copy_nonoverlapping(host.cast::<T>(), out.as_mut_ptr(), len);
            out.set_len(len);
        }
        Ok(out)
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        Ok(self.stream.synchronize()?)
    }

    /// Launches kernel `name` of `k` on a 1-D grid of `grid` blocks of `block` threads.
    ///
    /// # Safety
    /// `args` must be the kernel's parameters in order and type (the launchers of
    /// `signatures.rs` build them from its declaration, checked against the source), and every
    /// address among them a live buffer of this GPU holding what the kernel reads and writes
    /// for the shape the other arguments give. The kernel runs later, on the stream: the
    /// buffers must stay alive until the work queued before their drop has run (frees are
    /// ordered on the same stream).
    pub(crate) unsafe fn launch(
        &self,
        k: &Kernels,
        name: &str,
        grid: u32,
        block: u32,
        args: &[Arg],
    ) -> Result<(), GpuError> {
        if grid == 0 {
            return Ok(());
        }
        let f = k.function(name)?;
        if k.options.timeline {
            self.log_launches(&[Launch {
                name: name.to_string(),
                blocks: grid,
            }]);
        }
        self.profiled(
            || name.to_string(),
            || self.launch_function(&f, grid, block, args),
        )
    }

    /// Runs `work` (which queues GPU work); with `SPLASH_GPU_PROFILE`, synchronised and timed
    /// under the name `name` gives.
    pub(crate) fn profiled<R>(
        &self,
        name: impl FnOnce() -> String,
        work: impl FnOnce() -> Result<R, GpuError>,
    ) -> Result<R, GpuError> {
        let Some(p) = &self.profile else {
            return work();
        };
        self.stream.synchronize()?;
        let t0 = std::time::Instant::now();
        let r = work()?;
        self.stream.synchronize()?;
        let mut p = p.lock().expect("profile lock");
        let e = p.entry(name()).or_default();
        e.0 += 1;
        e.1 += t0.elapsed().as_secs_f64();
        Ok(r)
    }

    /// With `SPLASH_GPU_PROFILE`: every kernel so far, its launches and seconds, most time
    /// first (take two and subtract for the kernels of one piece of work).
    pub fn profile_table(&self) -> Option<Vec<crate::profile::ProfileRow>> {
        let p = self.profile.as_ref()?.lock().expect("profile lock");
        let mut rows: Vec<_> = p.iter().map(|(k, v)| (k.clone(), v.0, v.1)).collect();
        rows.sort_by(|a, b| b.2.total_cmp(&a.2));
        Some(rows)
    }

    fn launch_function(
        &self,
        f: &CudaFunction,
        grid: u32,
        block: u32,
        args: &[Arg],
    ) -> Result<(), GpuError> {
        if self.dependent_launch && self.capturing_here() {
            self.launch_dependent(f, grid, block, args)?;
        } else {
            let mut b = self.stream.launch_builder(f);
            for a in args {
                match a {
                    Arg::Ptr(p) => b.arg(p),
                    Arg::I32(v) => b.arg(v),
                    Arg::I64(v) => b.arg(v),
                    Arg::F32(v) => b.arg(v),
                    Arg::Seqs(v) => b.arg(&**v),
                    Arg::Layers(v) => b.arg(&**v),
                    Arg::Attn(v) => b.arg(&**v),
                    Arg::Group(v) => b.arg(&**v),
                };
            }
            let cfg = LaunchConfig {
                grid_dim: (grid, 1, 1),
                block_dim: (block, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: `args` are the kernel's parameters and its buffers are live (the
            // contract of `Gpu::launch`).
            unsafe { b.launch(cfg) }?;
        }
        Ok(())
    }

    /// Launches `f` as a programmatic dependent of the kernel before it in the stream: it may
    /// start while that one finishes, and waits for it in its prologue (`GRID_PROLOGUE` in
    /// kernels/common.cuh, which every kernel runs before it touches activations).
    fn launch_dependent(
        &self,
        f: &CudaFunction,
        grid: u32,
        block: u32,
        args: &[Arg],
    ) -> Result<(), GpuError> {
        use cudarc::driver::sys;
        let mut params: Vec<*mut std::ffi::c_void> = args
            .iter()
            .map(|a| match a {
                Arg::Ptr(v) => v as *const u64 as *mut std::ffi::c_void,
                Arg::I32(v) => v as *const i32 as *mut std::ffi::c_void,
                Arg::I64(v) => v as *const i64 as *mut std::ffi::c_void,
                Arg::F32(v) => v as *const f32 as *mut std::ffi::c_void,
                Arg::Seqs(v) => &**v as *const SeqSlots as *mut std::ffi::c_void,
                Arg::Layers(v) => &**v as *const LayerSlots as *mut std::ffi::c_void,
                Arg::Attn(v) => &**v as *const AttnSlots as *mut std::ffi::c_void,
                Arg::Group(v) => &**v as *const ProductGroup as *mut std::ffi::c_void,
            })
            .collect();
        // SAFETY: a zeroed attribute is a valid plain-data value; its id and value are set next.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        self.ctx.bind_to_thread()?;
        // SAFETY: `params` points at `args`' values, alive for the call (the driver copies
        // them at launch); the parameter lists match the kernels' as for `launch_builder`.
        unsafe {
            sys::cuLaunchKernelEx(
                &cfg,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
            .result()?;
        }
        Ok(())
    }
}

impl Kernels {
    /// The dimensions this module was compiled for.
    pub fn dims(&self) -> KernelDims {
        self.dims
    }

    /// Lanes sharing a column of the GDN scan's state in this module (`GDN_SLICES`).
    pub(crate) fn gdn_slices(&self) -> usize {
        self.options.gdn_slices(self.dims.gdn_dk)
    }

    /// The options compiled into this module.
    pub(crate) fn options(&self) -> &KernelOptions {
        &self.options
    }

    fn function(&self, name: &str) -> Result<CudaFunction, GpuError> {
        let mut f = self.functions.lock().expect("function cache lock");
        if let Some(func) = f.get(name) {
            return Ok(func.clone());
        }
        let func = self.module.load_function(name)?;
        f.insert(name.to_string(), func.clone());
        Ok(func)
    }
}

/// The device address of a buffer, `offset` elements in.
pub fn ptr<T>(gpu: &Gpu, buf: &CudaSlice<T>, offset: usize) -> u64 {
    let (p, _sync) = buf.device_ptr(&gpu.stream);
    p + (offset * std::mem::size_of::<T>()) as u64
}
