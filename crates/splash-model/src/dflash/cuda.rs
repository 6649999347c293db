//! The DFlash draft on the CUDA backend: the same pass as the CPU reference in `dflash/cpu.rs`
//! on the device of the target, with the per-sequence context K/V kept there and the block scored
//! by the target's LM head without leaving the GPU.
//!
//! The context cache keeps every committed row (row `j` = position `j`); sliding layers
//! mask by position in the attention kernel instead of dropping rows.

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::CudaSlice;
use splash_backend::cpu::KvFormat;
use splash_backend::cuda::{self as dev, ptr, DeviceWeight, Gpu, KernelDims, Kernels, KeyMask};

use super::device::{ContextLayer, DeviceContext, DraftDevice, DraftedRows};
use super::{DFlashDraft, DraftConfig, DraftWeights, DynConv};
use crate::device::downcast;
use crate::error::ModelError;
use crate::graph_cache::{Found, GraphCache};
use crate::qwen35::cuda::{GpuModel, WeightPair};
use crate::qwen35::Qwen35;

type Buf = CudaSlice<f32>;

/// A drafted block on the device: hidden rows, logits (or none) and candidates (or none),
/// as [`super::DraftBlock`] holds them.
type DraftOutput = (Vec<f32>, Vec<f32>, Vec<(u32, f32)>);

/// Context rows a fresh draft context holds before it grows (doubling).
const INITIAL_CONTEXT_CAPACITY: usize = 1024;

/// The draft's weights on the target's GPU.
pub(crate) struct GpuDraft {
    target: Arc<GpuModel>,
    /// Kernels compiled for the draft's head dimension.
    k: Arc<Kernels>,
    fc: DeviceWeight,
    hidden_norm: Buf,
    layers: Vec<GpuDraftLayer>,
    norm: Buf,
    inv_freq: Buf,
    /// Captured passes (see [`GpuDraft::graphed`]).
    graphs: GraphCache<DraftGraph>,
    /// Cleared when a capture fails: drafts then stay eager.
    graphs_work: AtomicBool,
}

struct GpuDraftLayer {
    input_norm: Buf,
    post_norm: Buf,
    q: DeviceWeight,
    /// `k_proj` and `v_proj`.
    kv: WeightPair,
    o: DeviceWeight,
    q_norm: Buf,
    k_norm: Buf,
    gate_up: WeightPair,
    down: DeviceWeight,
    window: Option<usize>,
    /// DFlash2: the convolutions around the attention and the MLP sublayers.
    convs: Option<(GpuDynConv, GpuDynConv)>,
}

/// DFlash2's convolution around one sublayer on the device (the CPU's `DynConv`): side 0
/// before the sublayer, side 1 after it, both with dynamic taps from one projection of the
/// sublayer's input.
struct GpuDynConv {
    /// `[2, K, H]`.
    base: Buf,
    /// `[2·K·G, H]`.
    projection: DeviceWeight,
    kernel: usize,
    group: usize,
}

impl GpuDynConv {
    fn upload(gpu: &Gpu, conv: &DynConv) -> Result<Self, ModelError> {
        Ok(Self {
            base: gpu.upload(&conv.base)?,
            projection: gpu.upload_weight(&conv.projection)?,
            kernel: conv.kernel,
            group: conv.group,
        })
    }

    /// Values per token of one side's dynamic taps, `[K, H/group]`.
    fn side(&self, h: usize) -> usize {
        self.kernel * (h / self.group)
    }

    /// Side 0 over `x` `[t, h]`: the convolved rows, and the projection `[t, 2·side]` whose
    /// second half [`finish`](Self::finish) takes.
    fn prepare(&self, d: &GpuDraft, x: u64, t: usize, h: usize) -> Result<(Buf, Buf), ModelError> {
        let dynamic = d.scratch(t * 2 * self.side(h))?;
        let dp = ptr(d.gpu(), &dynamic, 0);
        let xa = dev::Activations::new(x, t, h);
        dev::matmul_batched(
            d.gpu(),
            &d.k,
            dp,
            &xa,
            &self.projection,
            0,
            2 * self.side(h),
        )?;
        Ok((self.convolve(d, 0, x, &dynamic, t, h)?, dynamic))
    }

    /// Side 1 over the sublayer's output `y` `[t, h]`, with the taps `prepare` projected.
    fn finish(
        &self,
        d: &GpuDraft,
        y: u64,
        dynamic: &Buf,
        t: usize,
        h: usize,
    ) -> Result<Buf, ModelError> {
        self.convolve(d, 1, y, dynamic, t, h)
    }

    /// Side `which` of the conv over `x` `[t, h]`.
    fn convolve(
        &self,
        d: &GpuDraft,
        which: usize,
        x: u64,
        dynamic: &Buf,
        t: usize,
        h: usize,
    ) -> Result<Buf, ModelError> {
        let (gpu, side) = (d.gpu(), self.side(h));
        let out = d.scratch(t * h)?;
        dev::grouped_dynamic_conv(
            gpu,
            &d.k,
            ptr(gpu, &out, 0),
            x,
            ptr(gpu, dynamic, which * side),
            2 * side,
            ptr(gpu, &self.base, which * self.kernel * h),
            t,
            h,
            self.kernel,
            self.group,
        )?;
        Ok(out)
    }
}

/// One sequence's draft context on the device: per layer, keys (normed, rotated) and values
/// `[cap, hkv, d]` in f32.
#[derive(Clone)]
pub(crate) struct GpuDraftContext {
    layers: Vec<(Buf, Buf)>,
    cap: usize,
}

impl GpuDraftContext {
    /// Device bytes held.
    fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|(k, v)| 4 * (k.len() + v.len()))
            .sum()
    }
}

/// One sequence's draft context on the GPU, allocated at its first use (making a context
/// cannot fail; allocating device memory can).
struct ContextSlot {
    /// The target's model, for its GPU.
    target: Arc<GpuModel>,
    /// Floats per context row of a layer (`hkv · d`) and the draft's layers.
    row: usize,
    layers: usize,
    context: Option<GpuDraftContext>,
}

impl std::fmt::Debug for ContextSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ContextSlot({} bytes)", self.memory_bytes())
    }
}

impl DeviceContext for ContextSlot {
    fn memory_bytes(&self) -> usize {
        self.context.as_ref().map_or(0, GpuDraftContext::bytes)
    }

    fn try_clone(&self, len: usize) -> Result<Box<dyn DeviceContext>, ModelError> {
        let g = self.target.gpu();
        let row = self.row;
        let context = match &self.context {
            None => None,
            Some(ctx) => {
                let cap = len.max(1);
                let layers = ctx
                    .layers
                    .iter()
                    .map(|(k, v)| {
                        let (k2, v2): (Buf, Buf) = (g.uninit(cap * row)?, g.uninit(cap * row)?);
                        g.copy(ptr(g, &k2, 0), ptr(g, k, 0), 4 * len * row)?;
                        g.copy(ptr(g, &v2, 0), ptr(g, v, 0), 4 * len * row)?;
                        Ok((k2, v2))
                    })
                    .collect::<Result<Vec<_>, ModelError>>()?;
                Some(GpuDraftContext { layers, cap })
            }
        };
        Ok(Box::new(ContextSlot {
            target: self.target.clone(),
            context,
            ..*self
        }))
    }

    fn layers(&self, len: usize) -> Result<Vec<ContextLayer>, ModelError> {
        let Some(ctx) = &self.context else {
            return Ok(vec![ContextLayer::default(); self.layers]);
        };
        let (g, n) = (self.target.gpu(), len * self.row);
        ctx.layers
            .iter()
            .map(|(k, v)| {
                Ok(ContextLayer {
                    pos0: 0,
                    k: g.download(k, n)?,
                    v: g.download(v, n)?,
                })
            })
            .collect()
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl DFlashDraft {
    /// Moves the draft to the GPU its target runs on: weights copied, new contexts kept
    /// there (contexts made before are refused).
    pub fn to_gpu(&mut self, target: &Qwen35) -> Result<(), ModelError> {
        self.device = Box::new(GpuDraft::upload(&self.weights, target)?);
        Ok(())
    }
}

impl DraftDevice for GpuDraft {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn graph_memory(&self, config: &DraftConfig, lanes: usize, context: usize) -> u64 {
        GpuDraft::graph_memory(self, config, lanes, context)
    }

    fn new_context(&self, weights: &DraftWeights) -> Box<dyn DeviceContext> {
        let c = &weights.config;
        Box::new(ContextSlot {
            target: self.target.clone(),
            row: c.num_kv_heads * c.head_dim,
            layers: self.layers.len(),
            context: None,
        })
    }

    fn context_from_image(
        &self,
        weights: &DraftWeights,
        len: usize,
        layers: Vec<ContextLayer>,
    ) -> Result<Box<dyn DeviceContext>, ModelError> {
        if layers.iter().any(|l| l.pos0 > 0) {
            return Err(crate::image::bad(
                "the context was saved without its early rows; the GPU draft needs all of them",
            ));
        }
        let c = &weights.config;
        Ok(Box::new(ContextSlot {
            target: self.target.clone(),
            row: c.num_kv_heads * c.head_dim,
            layers: self.layers.len(),
            context: Some(self.upload_context(c, &layers, len)?),
        }))
    }

    fn append_context(
        &self,
        weights: &DraftWeights,
        ctx: &mut dyn DeviceContext,
        features: &[f32],
        pos0: usize,
    ) -> Result<(), ModelError> {
        let c = &weights.config;
        self.append_rows(c, self.context(c, ctx)?, features, pos0)
    }

    fn draft(
        &self,
        weights: &DraftWeights,
        ctx: &mut dyn DeviceContext,
        _target: &Qwen35,
        x: &[f32],
        pos0: usize,
        top: Option<usize>,
    ) -> Result<DraftedRows, ModelError> {
        let c = &weights.config;
        let block = x.len() / c.hidden_size;
        let (hidden, logits, candidates) =
            self.forward(c, self.context(c, ctx)?, x, block, pos0, top)?;
        Ok(DraftedRows {
            hidden,
            logits,
            candidates,
        })
    }
}

impl GpuDraft {
    /// Copies the draft's `weights` to the GPU `target` runs on.
    pub(crate) fn upload(weights: &DraftWeights, target: &Qwen35) -> Result<Self, ModelError> {
        let c = &weights.config;
        let tm = target
            .gpu_model()
            .ok_or_else(|| ModelError::Gpu("the target model does not run on a GPU".into()))?;
        let gpu = tm.gpu().clone();
        let tc = target.config();
        let k = gpu.kernels(KernelDims {
            head_dim: c.head_dim,
            gdn_dk: tc.gdn.dk,
            gdn_dv: tc.gdn.dv,
        })?;
        let g = &*gpu;
        let vec = |v: &[f32]| g.upload(v).map_err(ModelError::from);
        let w = |w: &splash_backend::Weight| g.upload_weight(w).map_err(ModelError::from);
        // Stacked for one launch only in the tensor-core formats (a quantised draft): a BF16
        // pair would leave cuBLAS for the float GEMV.
        let pair = |a: &splash_backend::Weight, b: &splash_backend::Weight| {
            let stack = dev::GpuFormat::of(a.dtype()).is_ok_and(dev::is_tiled);
            WeightPair::upload(g, a, b, stack)
        };
        let layers = weights
            .layers
            .iter()
            .map(|l| {
                Ok(GpuDraftLayer {
                    input_norm: vec(&l.input_norm)?,
                    post_norm: vec(&l.post_norm)?,
                    q: w(&l.q)?,
                    kv: pair(&l.k, &l.v)?,
                    o: w(&l.o)?,
                    q_norm: vec(&l.q_norm)?,
                    k_norm: vec(&l.k_norm)?,
                    gate_up: pair(&l.gate, &l.up)?,
                    down: w(&l.down)?,
                    window: l.window,
                    convs: match &l.convs {
                        Some((a, m)) => {
                            Some((GpuDynConv::upload(g, a)?, GpuDynConv::upload(g, m)?))
                        }
                        None => None,
                    },
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let d = c.head_dim;
        let inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| 1.0 / (c.rope_theta as f32).powf((2 * i) as f32 / d as f32))
            .collect();
        Ok(Self {
            fc: w(&weights.fc)?,
            hidden_norm: vec(&weights.hidden_norm)?,
            norm: vec(&weights.norm)?,
            inv_freq: vec(&inv_freq)?,
            layers,
            k,
            target: tm.clone(),
            graphs: GraphCache::new(DRAFT_GRAPHS),
            graphs_work: AtomicBool::new(true),
        })
    }

    fn gpu(&self) -> &Gpu {
        self.target.gpu()
    }

    /// The keys the queries of a block of `block` rows see in `layer`: the whole block
    /// (unless the draft is causal), within the layer's window.
    fn key_mask(c: &DraftConfig, layer: &GpuDraftLayer, block: usize) -> KeyMask {
        KeyMask {
            block: if c.causal { 0 } else { block },
            window: layer.window,
        }
    }

    /// Device memory the captured draft passes may hold (0 with graphs off): one per sequence,
    /// at most [`DRAFT_GRAPHS`], each owning its pass's peak working buffers: hidden-sized
    /// rows, the MLP's rows, the logits, and the split attention's partial sums over `context`
    /// keys.
    pub(crate) fn graph_memory(&self, c: &DraftConfig, lanes: usize, context: usize) -> u64 {
        if !self.gpu().graphs() {
            return 0;
        }
        let inter = self.layers.first().map_or(0, |l| l.gate_up.rows().0);
        let per_row = self.target.vocab() + 16 * c.hidden_size + 3 * inter;
        // A sliding layer's split attention covers its window, a full layer the context.
        let at = dev::Position::Device {
            at: 0,
            limit: context,
        };
        let (block, chunk) = (c.block_size, self.gpu().options().kernels.attention_chunk());
        let chunks = self
            .layers
            .iter()
            .map(|l| dev::split_chunks(at, block, Self::key_mask(c, l, block), chunk))
            .max()
            .unwrap_or(0);
        let partials = c.num_heads * chunks * (c.head_dim + 2);
        (lanes.clamp(1, DRAFT_GRAPHS) * block * 4 * (per_row + partials)) as u64
    }

    fn scratch(&self, len: usize) -> Result<Buf, ModelError> {
        Ok(self.gpu().uninit(len)?)
    }

    /// A sequence's device context, allocated in `slot` at its first use.
    fn context<'a>(
        &self,
        c: &DraftConfig,
        slot: &'a mut dyn DeviceContext,
    ) -> Result<&'a mut GpuDraftContext, ModelError> {
        let slot: &mut ContextSlot = downcast(slot.as_any_mut(), "cuda draft")?;
        if slot.context.is_none() {
            slot.context = Some(self.new_context(c)?);
        }
        Ok(slot.context.as_mut().expect("allocated above"))
    }

    /// An empty context.
    fn new_context(&self, c: &DraftConfig) -> Result<GpuDraftContext, ModelError> {
        let len = INITIAL_CONTEXT_CAPACITY * c.num_kv_heads * c.head_dim;
        let layers = self
            .layers
            .iter()
            .map(|_| Ok((self.gpu().zeros(len)?, self.gpu().zeros(len)?)))
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(GpuDraftContext {
            layers,
            cap: INITIAL_CONTEXT_CAPACITY,
        })
    }

    /// A device context holding `layers` (every row from position 0).
    fn upload_context(
        &self,
        c: &DraftConfig,
        layers: &[ContextLayer],
        len: usize,
    ) -> Result<GpuDraftContext, ModelError> {
        let mut ctx = self.new_context(c)?;
        self.reserve(c, &mut ctx, len)?;
        for ((k, v), host) in ctx.layers.iter_mut().zip(layers) {
            self.gpu().write(k, &host.k)?;
            self.gpu().write(v, &host.v)?;
        }
        Ok(ctx)
    }

    /// Grows every layer of `ctx` (doubling) to hold `rows` positions.
    fn reserve(
        &self,
        c: &DraftConfig,
        ctx: &mut GpuDraftContext,
        rows: usize,
    ) -> Result<(), ModelError> {
        if rows <= ctx.cap {
            return Ok(());
        }
        let cap = rows.max(ctx.cap * 2);
        let len = cap * c.num_kv_heads * c.head_dim;
        for (k, v) in &mut ctx.layers {
            *k = self.gpu().grown(k, len)?;
            *v = self.gpu().grown(v, len)?;
        }
        ctx.cap = cap;
        Ok(())
    }

    /// K (k_proj, k_norm, RoPE) and V of rows `x` `[t, H]` at positions `pos0..`, written to
    /// the layer's cache rows `pos0..`.
    fn write_kv(
        &self,
        c: &DraftConfig,
        layer: &GpuDraftLayer,
        cache: &(Buf, Buf),
        x: &dev::Activations,
        pos0: dev::Position,
    ) -> Result<(), ModelError> {
        let (gpu, k, t) = (self.gpu(), &*self.k, x.tokens());
        let (hkv, d) = (c.num_kv_heads, c.head_dim);
        let (kb, vb) = (self.scratch(t * hkv * d)?, self.scratch(t * hkv * d)?);
        let (kp, vp) = (ptr(gpu, &kb, 0), ptr(gpu, &vb, 0));
        layer.kv.multiply_on(gpu, k, (kp, vp), x, true)?;
        let k_norm = ptr(gpu, &layer.k_norm, 0);
        dev::rms_norm(gpu, k, kp, kp, k_norm, t * hkv, d, c.rms_norm_eps)?;
        let inv = ptr(gpu, &self.inv_freq, 0);
        dev::rope(gpu, k, kp, inv, t, hkv, d, d, pos0)?;
        // f32 rows need no scales; the kernel does not touch the pointer.
        let no_scales = ptr(gpu, &self.inv_freq, 0);
        for (src, dst) in [(kp, &cache.0), (vp, &cache.1)] {
            let dst = ptr(gpu, dst, 0);
            dev::kv_append(gpu, k, dst, no_scales, src, KvFormat::F32, t, hkv, d, pos0)?;
        }
        Ok(())
    }

    /// Appends the taps `features` `[T, n·H]` of positions `pos0..` (see
    /// [`DFlashDraft::append_context`]).
    fn append_rows(
        &self,
        c: &DraftConfig,
        ctx: &mut GpuDraftContext,
        features: &[f32],
        pos0: usize,
    ) -> Result<(), ModelError> {
        let t = features.len() / self.fc.cols();
        if t == 0 {
            return Ok(());
        }
        let (gpu, k, h) = (self.gpu(), &*self.k, c.hidden_size);
        self.reserve(c, ctx, pos0 + t)?;
        let f = gpu.upload(features)?;
        let x = self.scratch(t * h)?;
        let xp = ptr(gpu, &x, 0);
        let fa = dev::Activations::new(ptr(gpu, &f, 0), t, self.fc.cols());
        dev::matmul_batched(gpu, k, xp, &fa, &self.fc, 0, h)?;
        let hn = ptr(gpu, &self.hidden_norm, 0);
        dev::rms_norm(gpu, k, xp, xp, hn, t, h, c.rms_norm_eps)?;
        let xa = dev::Activations::new(xp, t, h);
        for (layer, cache) in self.layers.iter().zip(&ctx.layers) {
            self.write_kv(c, layer, cache, &xa, pos0.into())?;
        }
        Ok(())
    }

    /// Drafts one block at positions `s..` after the `s` context rows: the final-normed
    /// hidden states of the `block - 1` mask rows `[block-1, H]` and their logits through the
    /// target's head `[block-1, V]` (before the draft's multiplier and softcap). With `top`
    /// (a DFlash2 selector's k), the rows' best `top` entries instead, after the multiplier
    /// and softcap, picked on the device (`[block-1, top]`, best first), and no logits.
    /// Replayed from a graph captured for the context's buffers when graphs are on.
    fn forward(
        &self,
        c: &DraftConfig,
        ctx: &mut GpuDraftContext,
        embedded: &[f32],
        block: usize,
        s: usize,
        top: Option<usize>,
    ) -> Result<DraftOutput, ModelError> {
        let gpu = self.gpu();
        // The block's own K/V go to rows s.. for this pass; committed rows overwrite them.
        self.reserve(c, ctx, s + block)?;
        let top = top
            .map(|t| t.min(self.target.vocab()))
            .filter(|&t| t <= dev::TOP_K_MAX);
        if let Some(out) = self.graphed(c, ctx, embedded, block, s, top)? {
            return Ok(out);
        }
        let mut x = gpu.upload(embedded)?;
        let out = self.pass(c, ctx, &mut x, block, s.into(), top)?;
        out.download(gpu, c, block - 1, top)
    }

    /// The pass of [`forward`](Self::forward) over the block's embedded rows `x` (the residual
    /// stream, updated in place), at position `pos`; its outputs stay on the device.
    fn pass(
        &self,
        c: &DraftConfig,
        ctx: &GpuDraftContext,
        x: &mut Buf,
        block: usize,
        pos: dev::Position,
        top: Option<usize>,
    ) -> Result<PassOutput, ModelError> {
        let (gpu, k) = (self.gpu(), &*self.k);
        let (h, hq, hkv, d, eps) = (
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.rms_norm_eps,
        );
        let xp = ptr(gpu, x, 0);
        let normed = self.scratch(block * h)?;
        let np = ptr(gpu, &normed, 0);
        let inv = ptr(gpu, &self.inv_freq, 0);
        // The last MLP's output, added to the residual by the next layer's norm (one launch).
        let mut pending: Option<Buf> = None;
        for (layer, cache) in self.layers.iter().zip(&ctx.layers) {
            let input_norm = ptr(gpu, &layer.input_norm, 0);
            match pending.take() {
                Some(m) => {
                    dev::add_rms_norm(gpu, k, np, xp, ptr(gpu, &m, 0), input_norm, block, h, eps)?
                }
                None => dev::rms_norm(gpu, k, np, xp, input_norm, block, h, eps)?,
            }
            // DFlash2: the sublayer reads the convolved rows (its K/V too).
            let a_conv = match &layer.convs {
                Some((conv, _)) => Some(conv.prepare(self, np, block, h)?),
                None => None,
            };
            // One bf16 conversion of the sublayer's input for q, k and v.
            let a_in = dev::Activations::new(
                a_conv.as_ref().map_or(np, |(y, _)| ptr(gpu, y, 0)),
                block,
                h,
            );
            let q = self.scratch(block * hq * d)?;
            let qp = ptr(gpu, &q, 0);
            dev::matmul_batched(gpu, k, qp, &a_in, &layer.q, 0, hq * d)?;
            dev::rms_norm(
                gpu,
                k,
                qp,
                qp,
                ptr(gpu, &layer.q_norm, 0),
                block * hq,
                d,
                eps,
            )?;
            dev::rope(gpu, k, qp, inv, block, hq, d, d, pos)?;
            self.write_kv(c, layer, cache, &a_in, pos)?;
            let att = self.scratch(block * hq * d)?;
            let (kc, vc) = (ptr(gpu, &cache.0, 0), ptr(gpu, &cache.1, 0));
            let mask = Self::key_mask(c, layer, block);
            dev::attention(
                gpu,
                k,
                ptr(gpu, &att, 0),
                qp,
                (kc, inv),
                (vc, inv),
                KvFormat::F32,
                block,
                hq,
                hkv,
                pos,
                (d as f32).powf(-0.5),
                mask,
            )?;
            let mut o = self.scratch(block * h)?;
            let att_a = dev::Activations::new(ptr(gpu, &att, 0), block, hq * d);
            dev::matmul_batched(gpu, k, ptr(gpu, &o, 0), &att_a, &layer.o, 0, h)?;
            if let (Some((conv, _)), Some((_, dynamic))) = (&layer.convs, &a_conv) {
                o = conv.finish(self, ptr(gpu, &o, 0), dynamic, block, h)?;
            }
            let post_norm = ptr(gpu, &layer.post_norm, 0);
            dev::add_rms_norm(gpu, k, np, xp, ptr(gpu, &o, 0), post_norm, block, h, eps)?;
            let m_conv = match &layer.convs {
                Some((_, conv)) => Some(conv.prepare(self, np, block, h)?),
                None => None,
            };
            // One bf16 conversion of the MLP's input for gate and up.
            let m_in = dev::Activations::new(
                m_conv.as_ref().map_or(np, |(y, _)| ptr(gpu, y, 0)),
                block,
                h,
            );
            let inter = layer.gate_up.rows().0;
            let g = self.scratch(block * inter)?;
            let u = self.scratch(block * inter)?;
            let (gp, up) = (ptr(gpu, &g, 0), ptr(gpu, &u, 0));
            layer.gate_up.multiply_on(gpu, k, (gp, up), &m_in, true)?;
            let mut m = self.scratch(block * h)?;
            let mp = ptr(gpu, &m, 0);
            if dev::swiglu_fused(gpu, &layer.down, block) {
                // silu(g)·u converted straight into the tensor-core GEMV's input.
                dev::matmul_swiglu(gpu, k, mp, gp, up, &layer.down, block)?;
            } else {
                dev::silu_mul(gpu, k, gp, up, block * inter)?;
                let g_a = dev::Activations::new(gp, block, inter);
                dev::matmul_batched(gpu, k, mp, &g_a, &layer.down, 0, h)?;
            }
            if let (Some((_, conv)), Some((_, dynamic))) = (&layer.convs, &m_conv) {
                m = conv.finish(self, ptr(gpu, &m, 0), dynamic, block, h)?;
            }
            pending = Some(m);
        }
        if let Some(m) = pending {
            dev::add_in_place(gpu, k, xp, ptr(gpu, &m, 0), block * h)?;
        }
        let rows = block - 1;
        let out = self.scratch(rows * h)?;
        let op = ptr(gpu, &out, 0);
        dev::rms_norm(
            gpu,
            k,
            op,
            xp + (h * 4) as u64,
            ptr(gpu, &self.norm, 0),
            rows,
            h,
            eps,
        )?;
        let logits = self.target.lm_head(op, rows)?;
        let candidates = match top {
            Some(top) => {
                let (v, lp) = (logits.len() / rows.max(1), ptr(gpu, &logits, 0));
                let mult = c.output_multiplier;
                Some(dev::top_k_rows(
                    gpu,
                    k,
                    lp,
                    rows,
                    v,
                    top,
                    mult,
                    c.logit_softcap,
                )?)
            }
            None => None,
        };
        Ok(PassOutput {
            hidden: out,
            logits,
            candidates,
        })
    }

    /// The pass replayed from a graph captured for `ctx`'s buffers (captured when the same
    /// buffers come a second time); `None` with graphs off or when the capture fails.
    fn graphed(
        &self,
        c: &DraftConfig,
        ctx: &GpuDraftContext,
        embedded: &[f32],
        block: usize,
        s: usize,
        top: Option<usize>,
    ) -> Result<Option<DraftOutput>, ModelError> {
        let gpu = self.gpu();
        if !gpu.graphs() || !self.graphs_work.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let mut key = vec![
            block as u64,
            top.map_or(0, |t| t as u64 + 1),
            ctx.cap as u64,
        ];
        key.extend(
            ctx.layers
                .iter()
                .flat_map(|(k, v)| [ptr(gpu, k, 0), ptr(gpu, v, 0)]),
        );
        let mut graph = match self.graphs.take(&key) {
            Found::Graph(g) => g,
            Found::FirstSighting => return Ok(None),
            Found::Capture => match self.capture(c, ctx, block, top) {
                Ok(g) => g,
                Err(e) => {
                    // A capture runs nothing: the pass is launched instead, and drafts stay
                    // eager rather than fail every capture the same way.
                    tracing::warn!("draft graph capture failed, draft graphs off: {e}");
                    self.graphs_work.store(false, Ordering::Relaxed);
                    return Ok(None);
                }
            },
        };
        gpu.write(&mut graph.input, embedded)?;
        gpu.write(&mut graph.pos, &[s as i32])?;
        gpu.replay(&graph.graph)?;
        let out = graph.output.download(gpu, c, block - 1, top);
        self.graphs.keep(key, graph);
        out.map(Some)
    }

    /// Captures the pass over `ctx`'s buffers, reading its rows and position from buffers of
    /// its own and leaving its outputs in others.
    fn capture(
        &self,
        c: &DraftConfig,
        ctx: &GpuDraftContext,
        block: usize,
        top: Option<usize>,
    ) -> Result<DraftGraph, ModelError> {
        let gpu = self.gpu();
        let (h, rows, v) = (c.hidden_size, block - 1, self.target.vocab());
        let mut input = self.scratch(block * h)?;
        let pos = gpu.zeros::<i32>(1)?;
        let output = PassOutput {
            hidden: self.scratch(rows * h)?,
            logits: self.scratch(if top.is_some() { 0 } else { rows * v })?,
            candidates: match top {
                Some(t) => Some((gpu.uninit::<i32>(rows * t)?, self.scratch(rows * t)?)),
                None => None,
            },
        };
        let at = dev::Position::Device {
            at: ptr(gpu, &pos, 0),
            limit: ctx.cap,
        };
        let graph = gpu.capture(|| -> Result<(), ModelError> {
            let o = self.pass(c, ctx, &mut input, block, at, top)?;
            let copy = |dst: u64, src: u64, bytes: usize| gpu.copy(dst, src, bytes);
            copy(
                ptr(gpu, &output.hidden, 0),
                ptr(gpu, &o.hidden, 0),
                4 * rows * h,
            )?;
            match (&output.candidates, &o.candidates) {
                (Some((ids, vals)), Some((oi, ov))) => {
                    let n = 4 * ids.len();
                    copy(ptr(gpu, ids, 0), ptr(gpu, oi, 0), n)?;
                    copy(ptr(gpu, vals, 0), ptr(gpu, ov, 0), n)?;
                }
                _ => copy(
                    ptr(gpu, &output.logits, 0),
                    ptr(gpu, &o.logits, 0),
                    4 * rows * v,
                )?,
            }
            Ok(())
        })?;
        Ok(DraftGraph {
            graph,
            input,
            pos,
            output,
        })
    }
}

/// Draft passes captured per model (most recently used first): one per sequence context
/// (its buffers are in the kernels' parameters), for up to this many sequences.
const DRAFT_GRAPHS: usize = 16;

/// A draft pass's outputs on the device: the final-normed hidden rows `[rows, H]`, the
/// logits `[rows, V]` (empty in a graph with a top), and with a top the rows' best entries.
struct PassOutput {
    hidden: Buf,
    logits: Buf,
    candidates: Option<(CudaSlice<i32>, Buf)>,
}

impl PassOutput {
    /// The outputs of a pass of `rows` scored rows, on the host.
    fn download(
        &self,
        gpu: &Gpu,
        c: &DraftConfig,
        rows: usize,
        top: Option<usize>,
    ) -> Result<DraftOutput, ModelError> {
        let hidden = gpu.download(&self.hidden, rows * c.hidden_size)?;
        match (&self.candidates, top) {
            (Some((ids, vals)), Some(top)) => {
                let ids = gpu.download(ids, rows * top)?;
                let vals = gpu.download(vals, rows * top)?;
                let candidates = ids.iter().map(|&i| i as u32).zip(vals).collect();
                Ok((hidden, Vec::new(), candidates))
            }
            _ => {
                let v = self.logits.len() / rows.max(1);
                Ok((hidden, gpu.download(&self.logits, rows * v)?, Vec::new()))
            }
        }
    }
}

/// A draft pass captured for one context's buffers (kept under a key: block, top, capacity
/// and the buffers' addresses). Each replay reads the block's embedded rows from `input` and
/// its position from `pos`.
struct DraftGraph {
    graph: dev::Graph,
    input: Buf,
    pos: CudaSlice<i32>,
    output: PassOutput,
}
