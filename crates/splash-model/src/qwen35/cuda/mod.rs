//! The Qwen3.5 forward pass on the CUDA backend (the `cuda` device of `crate::device`): the
//! same graph as the CPU reference in `qwen35/cpu.rs`, with weights copied to the device in their stored format and the
//! per-sequence state (KV cache, conv and recurrent state) kept on the device. A pass of
//! a few tokens per sequence is replayed from a captured CUDA graph (`graph.rs`); the
//! layers are in `layers.rs`, the per-sequence state in `state.rs`.

mod graph;
mod layers;
mod state;

use std::any::Any;
use std::sync::Arc;

use cudarc::driver::CudaSlice;
use splash_backend::cpu::{KvFormat, VHeadOrder};
use splash_backend::cuda::{self as dev, ptr, DeviceWeight, Gpu, GpuError, KernelDims, Kernels};
use splash_backend::profile::ProfileRow;
use splash_backend::timeline::Span;
use splash_backend::Weight;

use super::attention::Attention;
use super::cpu::save_fresh_layers;
use super::ffn::{Ffn, Mlp, Moe};
use super::gdn::GatedDeltaNet;
use super::{Logits, Mixer, PassOutput, Qwen35, Weights};
use crate::config::{LayerKind, ModelConfig};
use crate::device::downcast;
use crate::error::ModelError;
use crate::graph_cache::{Found, GraphCache};
use crate::image::ImageWriter;
use crate::qwen35::device::{DeviceItem, DeviceState, LayerImage, TextDevice};
use crate::qwen35::positions::{place_image_rows, Rotary};

use graph::*;
pub(crate) use layers::WeightPair;
use layers::*;
pub(crate) use state::GpuState;
use state::*;

impl From<GpuError> for ModelError {
    fn from(e: GpuError) -> Self {
        ModelError::Gpu(e.to_string())
    }
}

type Buf = CudaSlice<f32>;

/// The model's weights on one GPU.
pub(crate) struct GpuModel {
    gpu: Arc<Gpu>,
    config: ModelConfig,
    k: Arc<Kernels>,
    layers: Vec<GpuLayer>,
    final_norm: Buf,
    lm_head: DeviceWeight,
    inv_freq: Buf,
    rotary_dim: usize,
    /// Captured passes (see [`GpuModel::graphed`]).
    graphs: GraphCache<PassGraph>,
}

struct GpuLayer {
    input_norm: Buf,
    post_norm: Buf,
    mixer: GpuMixer,
    ffn: GpuFfn,
}

enum GpuMixer {
    Gdn(Box<GpuGdn>),
    Attn(Box<GpuAttn>),
}

enum GpuFfn {
    Dense(Box<GpuMlp>),
    Moe(Box<GpuMoe>),
}

impl GpuMixer {
    /// The products of the mixer's input: the first and another that reads it in another form
    /// (a GDN layer's b and a: int8 for the dp4a GEMV).
    fn input_products(&self) -> dev::NextProducts<'_> {
        match self {
            Self::Gdn(g) => dev::NextProducts::Weights(g.input_weight(), Some(g.gates_weight())),
            Self::Attn(a) => dev::NextProducts::Weights(a.input_weight(), None),
        }
    }
}

impl GpuFfn {
    /// The first products of the FFN's input over `tokens` rows.
    fn input_products(&self, gpu: &Gpu, tokens: usize) -> dev::NextProducts<'_> {
        match self {
            Self::Dense(m) => dev::NextProducts::Weights(m.input_weight(), None),
            Self::Moe(m) => m.input_products(gpu, tokens),
        }
    }
}

/// One sequence of a batched pass: its device state, tokens and first position, and whether
/// the pass records what [`GpuState::rollback`] needs.
pub(crate) struct GpuItem<'a> {
    pub(crate) state: &'a mut GpuState,
    pub(crate) tokens: &'a [u32],
    pub(crate) pos0: usize,
    pub(crate) record: bool,
    /// Each row's rotary position per frequency, `[tokens, rotary_dim / 2]`, where it is not
    /// the row's cache position (image rows, text after an image); `None`: it is.
    pub(crate) rotary_table: Option<Vec<f32>>,
    /// Runs of rows whose input is given (image rows): (first row, `[run, hidden]`).
    pub(crate) embedded: Vec<(usize, &'a [f32])>,
}

/// The rows `[off, off + t)` of a batched pass that belong to one sequence.
#[derive(Clone, Copy)]
struct SeqRows {
    off: usize,
    t: usize,
}

/// The shape of a forward pass: each sequence's rows, which rows are scored, which layers are
/// tapped.
struct Pass<'a> {
    rows_of: &'a [SeqRows],
    want: Logits,
    taps: &'a [usize],
}

impl Pass<'_> {
    /// Rows of the pass.
    fn tokens(&self) -> usize {
        self.rows_of.iter().map(|r| r.t).sum()
    }

    /// The first scored row of a sequence and how many.
    fn scored(&self, r: SeqRows) -> (usize, usize) {
        match self.want {
            Logits::None => (r.off, 0),
            Logits::Last => (r.off + r.t - 1, 1),
            Logits::All | Logits::Argmax => (r.off, r.t),
        }
    }

    /// Scored rows of all sequences.
    fn scored_rows(&self) -> usize {
        self.rows_of.iter().map(|&r| self.scored(r).1).sum()
    }
}

/// What a pass leaves on the host: its scored rows' logits `[n, V]` (or, for
/// [`Logits::Argmax`], their argmax ids `[n]`) and the tap outputs `[taps, T, H]`.
struct HostOutputs {
    logits: Vec<f32>,
    argmax: Vec<i32>,
    features: Vec<f32>,
}

fn upload_vec(gpu: &Gpu, v: &[f32]) -> Result<Buf, ModelError> {
    Ok(gpu.upload(v)?)
}

impl GpuModel {
    /// Copies `weights` to `gpu` and compiles the kernels for their shapes.
    pub(crate) fn upload(weights: &Weights, gpu: Arc<Gpu>) -> Result<Self, ModelError> {
        let cfg = &weights.config;
        let k = gpu.kernels(KernelDims {
            head_dim: cfg.head_dim,
            gdn_dk: cfg.gdn.dk,
            gdn_dv: cfg.gdn.dv,
        })?;
        let g = &*gpu;
        let layers = weights
            .layers
            .iter()
            .map(|l| {
                Ok(GpuLayer {
                    input_norm: upload_vec(g, &l.input_norm)?,
                    post_norm: upload_vec(g, &l.post_norm)?,
                    mixer: match &l.mixer {
                        Mixer::Linear(d) => GpuMixer::Gdn(Box::new(upload_gdn(g, cfg, d)?)),
                        Mixer::Full(a) => GpuMixer::Attn(Box::new(upload_attn(g, a)?)),
                    },
                    ffn: match &l.ffn {
                        Ffn::Dense(m) => GpuFfn::Dense(Box::new(GpuMlp::upload(g, m, true)?)),
                        Ffn::Moe(m) => upload_moe(g, m)?,
                    },
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let half = cfg.rotary_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / (cfg.rope_theta as f32).powf((2 * i) as f32 / cfg.rotary_dim as f32))
            .collect();
        Ok(Self {
            final_norm: upload_vec(g, &weights.final_norm)?,
            lm_head: g.upload_weight(&weights.lm_head)?,
            config: cfg.clone(),
            inv_freq: upload_vec(g, &inv_freq)?,
            rotary_dim: cfg.rotary_dim,
            graphs: GraphCache::new(PASS_GRAPHS),
            layers,
            k,
            gpu,
        })
    }

    /// The device the weights live on.
    pub(crate) fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// A device copy of `b`.
    fn clone_buf(&self, b: &Buf) -> Result<Buf, ModelError> {
        let out = self.scratch(b.len())?;
        self.gpu
            .copy(ptr(&self.gpu, &out, 0), ptr(&self.gpu, b, 0), b.len() * 4)?;
        Ok(out)
    }

    /// An uninitialised f32 buffer (every kernel writing it writes every element).
    fn scratch(&self, len: usize) -> Result<Buf, ModelError> {
        Ok(self.gpu.uninit(len)?)
    }

    /// The forward pass of several sequences' tokens (see [`Qwen35::forward_batch`]): the
    /// linear layers run once over the rows of all of them, the conv, scan and attention of
    /// each on its own state. Returns each item's logits and tap outputs `[T, taps.len() · H]`.
    /// Several items keep every product batch-invariant ([`Gpu::set_batch_invariant`]).
    pub(crate) fn forward(
        &self,
        weights: &Weights,
        items: &mut [GpuItem<'_>],
        want: Logits,
        taps: &[usize],
    ) -> Result<Vec<PassOutput>, ModelError> {
        let batched = items.len() > 1;
        if batched {
            self.gpu.set_batch_invariant(true);
        }
        let out = self.forward_rows(weights, items, want, taps);
        if batched {
            self.gpu.set_batch_invariant(false);
        }
        out
    }

    fn forward_rows(
        &self,
        weights: &Weights,
        items: &mut [GpuItem<'_>],
        want: Logits,
        taps: &[usize],
    ) -> Result<Vec<PassOutput>, ModelError> {
        let cfg = &weights.config;
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        // Each item's rows: `[off, off + t)` of the pass.
        let mut rows_of = Vec::with_capacity(items.len());
        let mut t = 0;
        for item in items.iter_mut() {
            rows_of.push(SeqRows {
                off: t,
                t: item.tokens.len(),
            });
            t += item.tokens.len();
            if item.record {
                item.state.ensure_replay(item.tokens.len())?;
            }
        }
        let pass = Pass {
            rows_of: &rows_of,
            want,
            taps,
        };
        let out = match self.graphed(weights, items, &pass)? {
            Some(out) => out,
            None => self.launched(weights, items, &pass)?,
        };
        for item in items.iter_mut() {
            item.state.recorded = item.record;
        }
        // Tap outputs [taps, T, H] → per item [t, taps · H]; logits (or argmax ids) per item's
        // scored rows.
        let mut at = 0;
        Ok(rows_of
            .iter()
            .map(|&r| {
                let mut features = vec![0.0f32; r.t * taps.len() * h];
                for (j, tap) in out.features.chunks_exact(t * h.max(1)).enumerate() {
                    for ti in 0..r.t {
                        features[(ti * taps.len() + j) * h..][..h]
                            .copy_from_slice(&tap[(r.off + ti) * h..][..h]);
                    }
                }
                let n = pass.scored(r).1;
                let scored = at..at + n;
                at += n;
                if want == Logits::Argmax {
                    PassOutput {
                        argmax: out.argmax[scored].iter().map(|&i| i as u32).collect(),
                        features,
                        ..Default::default()
                    }
                } else {
                    PassOutput {
                        logits: out.logits[scored.start * v..scored.end * v].to_vec(),
                        features,
                        ..Default::default()
                    }
                }
            })
            .collect())
    }

    /// The pass launched kernel by kernel.
    fn launched(
        &self,
        weights: &Weights,
        items: &mut [GpuItem<'_>],
        pass: &Pass<'_>,
    ) -> Result<HostOutputs, ModelError> {
        let cfg = &weights.config;
        let gpu = &*self.gpu;
        let (h, t) = (cfg.hidden_size, pass.tokens());
        let x = gpu.upload(&self.embed(weights, items, pass.rows_of))?;
        let xp = ptr(gpu, &x, 0);
        let normed = self.scratch(t * h)?;
        let np = ptr(gpu, &normed, 0);
        let features = self.scratch(pass.taps.len() * t * h)?;
        let fp = ptr(gpu, &features, 0);
        let tables = items
            .iter()
            .map(|i| i.rotary_table.as_ref().map(|t| gpu.upload(t)).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let table_ptrs: Vec<Option<u64>> = tables
            .iter()
            .map(|t| t.as_ref().map(|b| ptr(gpu, b, 0)))
            .collect();
        let rows = pass.rows_of;
        self.layers(cfg, xp, np, items, rows, (pass.taps, fp), None, &table_ptrs)?;
        let features = if pass.taps.is_empty() {
            Vec::new()
        } else {
            gpu.download(&features, pass.taps.len() * t * h)?
        };
        let mut out = HostOutputs {
            logits: Vec::new(),
            argmax: Vec::new(),
            features,
        };
        let n = pass.scored_rows();
        if n == 0 {
            gpu.synchronize()?;
            return Ok(out);
        }
        let logits = self.score(cfg, xp, np, pass)?;
        if pass.want == Logits::Argmax {
            out.argmax = gpu.download(&self.argmax(&logits, n, cfg.vocab_size)?, n)?;
        } else {
            out.logits = gpu.download(&logits, n * cfg.vocab_size)?;
        }
        Ok(out)
    }

    /// Each row's argmax of `logits` `[n, V]`, ties to the lower id (as `cpu::argmax`).
    fn argmax(&self, logits: &Buf, n: usize, v: usize) -> Result<CudaSlice<i32>, ModelError> {
        let lp = ptr(&self.gpu, logits, 0);
        Ok(dev::top_k_rows(&self.gpu, &self.k, lp, n, v, 1, 1.0, None)?.0)
    }

    /// The final norm of the pass's scored rows (into `normed`, one after another) and their
    /// logits `[n, V]`.
    fn score(
        &self,
        cfg: &ModelConfig,
        x: u64,
        normed: u64,
        pass: &Pass<'_>,
    ) -> Result<Buf, ModelError> {
        let (gpu, k, h) = (&*self.gpu, &*self.k, cfg.hidden_size);
        let mut at = 0;
        for &r in pass.rows_of {
            let (first, rows) = pass.scored(r);
            let src = x + (first * h * 4) as u64;
            let dst = normed + (at * h * 4) as u64;
            let w = ptr(gpu, &self.final_norm, 0);
            dev::rms_norm(gpu, k, dst, src, w, rows, h, cfg.rms_norm_eps)?;
            at += rows;
        }
        self.lm_head(normed, at)
    }

    /// The items' token embeddings `[T, H]`, gathered on the host (a few KB per token; the
    /// table stays in host memory), image rows in place of their placeholders'.
    fn embed(&self, weights: &Weights, items: &[GpuItem<'_>], rows_of: &[SeqRows]) -> Vec<f32> {
        let tokens: Vec<u32> = items
            .iter()
            .flat_map(|i| i.tokens.iter().copied())
            .collect();
        let mut x = weights.embed(&tokens);
        let h = weights.config.hidden_size;
        for (item, rows) in items.iter().zip(rows_of) {
            place_image_rows(&mut x, h, rows.off, &item.embedded);
        }
        x
    }

    /// The decoder layers over the pass's hidden rows at `x` (the residual stream, updated in
    /// place), with `normed` (as many rows) as scratch. Tap layer `taps.0[j]`'s output goes to
    /// rows `[j·T, (j+1)·T)` at `taps.1`. `positions`, when set, replace the items' positions
    /// (a captured graph reads them on the device). Items that record save what a rollback
    /// needs in their state's rollback buffers.
    #[allow(clippy::too_many_arguments)]
    fn layers(
        &self,
        cfg: &ModelConfig,
        x: u64,
        normed: u64,
        items: &mut [GpuItem<'_>],
        rows_of: &[SeqRows],
        taps: (&[usize], u64),
        positions: Option<&[dev::Position]>,
        tables: &[Option<u64>],
    ) -> Result<(), ModelError> {
        let (gpu, k) = (&*self.gpu, &*self.k);
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        let t: usize = rows_of.iter().map(|r| r.t).sum();
        let (xp, np) = (x, normed);
        // The next layer's normed input, made with the residual add before it.
        let mut next_input: Option<dev::Activations> = None;
        for (li, layer) in self.layers.iter().enumerate() {
            // Later layers' input norms come with the previous layer's last residual add.
            if li == 0 {
                dev::rms_norm(gpu, k, np, xp, ptr(gpu, &layer.input_norm, 0), t, h, eps)?;
            }
            // The mixer's products share one conversion of the normed rows.
            let normed = next_input
                .take()
                .unwrap_or_else(|| dev::Activations::new(np, t, h));
            let mixed = match &layer.mixer {
                GpuMixer::Gdn(g) => {
                    let mut parts: Vec<GdnSeq<'_>> = items
                        .iter_mut()
                        .zip(rows_of)
                        .map(|(item, &rows)| {
                            let record = item.record;
                            let st = &mut *item.state;
                            let GpuLayerState::Gdn { conv, recurrent } = &mut st.layers[li] else {
                                unreachable!("sequence state was built for another model")
                            };
                            let replay = record.then(|| {
                                st.replay[li]
                                    .as_mut()
                                    .expect("rollback buffers are made before a recorded pass")
                            });
                            GdnSeq {
                                rows,
                                conv,
                                rec: recurrent,
                                record: replay,
                            }
                        })
                        .collect();
                    g.forward(self, &normed, &mut parts, eps)?
                }
                GpuMixer::Attn(a) => {
                    let mut parts: Vec<AttnSeq<'_>> = items
                        .iter_mut()
                        .zip(rows_of)
                        .enumerate()
                        .map(|(i, (item, &rows))| {
                            let kv = item.state.kv;
                            AttnSeq {
                                rows,
                                state: &mut item.state.layers[li],
                                kv,
                                pos: positions.map_or(dev::Position::Host(item.pos0), |p| p[i]),
                                table: tables.get(i).copied().flatten(),
                            }
                        })
                        .collect();
                    a.forward(self, &normed, &mut parts, eps)?
                }
            };
            drop(normed);
            // The norms write the f16 conversion too when the products after them read it.
            let post_norm = ptr(gpu, &layer.post_norm, 0);
            let ffn_in = dev::add_rms_norm_activations(
                gpu,
                k,
                np,
                xp,
                dev::Addend::Rows(ptr(gpu, &mixed, 0)),
                post_norm,
                t,
                h,
                eps,
                layer.ffn.input_products(gpu, t),
            )?;
            let ffn = match &layer.ffn {
                GpuFfn::Dense(m) => FfnOut::Rows(m.forward(self, &ffn_in)?),
                GpuFfn::Moe(moe) => self.moe(moe, &ffn_in)?,
            };
            drop(ffn_in);
            match self.layers.get(li + 1) {
                Some(next) => {
                    let next_norm = ptr(gpu, &next.input_norm, 0);
                    next_input = Some(dev::add_rms_norm_activations(
                        gpu,
                        k,
                        np,
                        xp,
                        ffn.addend(gpu),
                        next_norm,
                        t,
                        h,
                        eps,
                        next.mixer.input_products(),
                    )?);
                }
                None => {
                    let rows = ffn.into_rows(self, t, h)?;
                    dev::add_in_place(gpu, k, xp, ptr(gpu, &rows, 0), t * h)?
                }
            }
            for (j, _) in taps.0.iter().enumerate().filter(|(_, &l)| l == li) {
                gpu.copy(taps.1 + (j * t * h * 4) as u64, xp, t * h * 4)?;
            }
        }
        Ok(())
    }

    /// Whether a pass needs the host midway: MoE layers without device routing download their
    /// router logits. Such passes cannot be captured as graphs.
    fn routes_on_host(&self) -> bool {
        self.layers.iter().any(|l| match &l.ffn {
            GpuFfn::Moe(m) => m.device_tables(&self.gpu).is_none(),
            GpuFfn::Dense(_) => false,
        })
    }

    /// Rows of the LM head (the vocabulary).
    pub(crate) fn vocab(&self) -> usize {
        self.lm_head.rows()
    }

    /// Logits `[n, V]` of `n` already-normed hidden rows at device address `x` (the DFlash
    /// draft scores its block with the target's head).
    pub(crate) fn lm_head(&self, x: u64, n: usize) -> Result<Buf, ModelError> {
        let v = self.lm_head.rows();
        let logits = self.scratch(n * v)?;
        dev::matmul(
            &self.gpu,
            &self.k,
            ptr(&self.gpu, &logits, 0),
            x,
            &self.lm_head,
            0,
            v,
            n,
        )?;
        Ok(logits)
    }
}

impl Qwen35 {
    /// Moves the forward pass to `gpu`: the weights are copied in their stored format and new
    /// states live on the device (states made before stay on the CPU and are refused). The
    /// host weights (memory-mapped) stay for the embedding rows.
    pub fn to_gpu(&mut self, gpu: Arc<Gpu>) -> Result<(), ModelError> {
        let model = GpuModel::upload(&self.weights, gpu)?;
        self.device = Box::new(CudaDevice(Arc::new(model)));
        Ok(())
    }

    /// The GPU the forward pass runs on, if any.
    pub fn gpu(&self) -> Option<&Arc<Gpu>> {
        self.gpu_model().map(|m| m.gpu())
    }

    /// The weights on the GPU, if the forward pass runs there.
    pub(crate) fn gpu_model(&self) -> Option<&Arc<GpuModel>> {
        let device = self.device.as_any().downcast_ref::<CudaDevice>()?;
        Some(&device.0)
    }
}

/// A GPU as the text model's device.
struct CudaDevice(Arc<GpuModel>);

impl TextDevice for CudaDevice {
    fn name(&self) -> String {
        format!("cuda ({})", self.0.gpu.name())
    }

    fn memory(&self) -> Option<(u64, u64)> {
        let (free, total) = self.0.gpu.memory().ok()?;
        Some((free as u64, total as u64))
    }

    fn graph_memory(&self, config: &ModelConfig, lanes: usize, rows: usize, context: usize) -> u64 {
        self.0.graph_memory(config, lanes, rows, context)
    }

    fn profile(&self) -> Option<Vec<ProfileRow>> {
        self.0.gpu.profile_table()
    }

    fn timeline_reset(&self) -> Result<bool, ModelError> {
        Ok(self.0.gpu.timeline_reset(&self.0.k)?)
    }

    fn timeline(&self) -> Result<Option<Result<Vec<Span>, String>>, ModelError> {
        Ok(self.0.gpu.timeline(&self.0.k)?)
    }

    fn synchronize(&self) -> Result<(), ModelError> {
        Ok(self.0.gpu.synchronize()?)
    }

    fn new_state(&self, _config: &ModelConfig, kv: KvFormat) -> Box<dyn DeviceState> {
        Box::new(GpuSequence {
            model: self.0.clone(),
            kv,
            state: None,
        })
    }

    fn state_from_image(
        &self,
        config: &ModelConfig,
        len: usize,
        kv: KvFormat,
        layers: Vec<LayerImage<'_>>,
    ) -> Result<Box<dyn DeviceState>, ModelError> {
        Ok(Box::new(GpuSequence {
            model: self.0.clone(),
            kv,
            state: Some(self.0.state_from_image(config, len, kv, layers)?),
        }))
    }

    fn forward(
        &self,
        weights: &Weights,
        items: &mut [DeviceItem<'_>],
        want: Logits,
        taps: &[usize],
    ) -> Result<Vec<PassOutput>, ModelError> {
        let mut gpu_items = Vec::with_capacity(items.len());
        for item in items.iter_mut() {
            let seq: &mut GpuSequence = downcast(item.state.as_any_mut(), "cuda")?;
            if !Arc::ptr_eq(&seq.model, &self.0) {
                return Err(ModelError::WrongDevice("cuda".into()));
            }
            let n = item.tokens.len();
            let rotary_table = match &item.rotary {
                Rotary::From(p) if *p == item.pos0 => None,
                Rotary::From(p) => {
                    let at: Vec<[u32; 3]> = (*p..*p + n).map(|q| [q as u32; 3]).collect();
                    Some(weights.rope.position_table(&at))
                }
                Rotary::Each(at) => Some(weights.rope.position_table(at)),
            };
            if seq.state.is_none() {
                seq.state = Some(self.0.new_state(&weights.config, seq.kv)?);
            }
            gpu_items.push(GpuItem {
                state: seq.state.as_mut().expect("allocated above"),
                tokens: item.tokens,
                pos0: item.pos0,
                record: item.record,
                rotary_table,
                embedded: std::mem::take(&mut item.embedded),
            });
        }
        self.0.forward(weights, &mut gpu_items, want, taps)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One sequence's state on a GPU, allocated by its first pass (making a state cannot fail;
/// allocating device memory can).
struct GpuSequence {
    model: Arc<GpuModel>,
    kv: KvFormat,
    state: Option<GpuState>,
}

impl std::fmt::Debug for GpuSequence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            Some(s) => s.fmt(f),
            None => write!(f, "GpuState(not allocated, {:?} KV)", self.kv),
        }
    }
}

impl DeviceState for GpuSequence {
    fn try_clone(&self, len: usize) -> Result<Box<dyn DeviceState>, ModelError> {
        let state = match &self.state {
            Some(s) => Some(s.try_clone(len)?),
            None => None,
        };
        Ok(Box::new(GpuSequence {
            model: self.model.clone(),
            kv: self.kv,
            state,
        }))
    }

    fn save_layers(&self, w: &mut ImageWriter, len: usize) -> Result<(), ModelError> {
        match &self.state {
            Some(s) => s.save_image(w, len),
            None => {
                save_fresh_layers(w, &self.model.config, self.kv);
                Ok(())
            }
        }
    }

    fn memory_bytes(&self) -> usize {
        self.state.as_ref().map_or(0, GpuState::bytes)
    }

    fn rollback(&mut self, _start: usize, keep: usize, ran: usize) -> Result<(), ModelError> {
        match &mut self.state {
            Some(s) => s.rollback(keep, ran),
            None => Ok(()),
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
