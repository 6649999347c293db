//! The Qwen3.5 forward pass on the CUDA backend: the same graph as the CPU forward in
//! `mod.rs`, with weights copied to the device in their stored format and the per-sequence
//! state (KV cache, conv and recurrent state) kept on the device.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use splash_backend::cpu::{KvFormat, VHeadOrder};
use splash_backend::cuda::{self as dev, ptr, DeviceWeight, Gpu, GpuError, KernelDims, Kernels};
use splash_backend::Weight;

use super::attention::Attention;
use super::ffn::{Ffn, Mlp, Moe};
use super::gdn::GatedDeltaNet;
use super::{Logits, Mixer, Qwen35};
use crate::config::{LayerKind, ModelConfig};
use crate::error::ModelError;
use crate::image::ImageWriter;
use crate::state::LayerImage;

impl From<GpuError> for ModelError {
    fn from(e: GpuError) -> Self {
        ModelError::Gpu(e.to_string())
    }
}

type Buf = CudaSlice<f32>;

/// The model's weights on one GPU.
pub(crate) struct GpuModel {
    gpu: Arc<Gpu>,
    k: Arc<Kernels>,
    layers: Vec<GpuLayer>,
    final_norm: Buf,
    lm_head: DeviceWeight,
    inv_freq: Buf,
    rotary_dim: usize,
    /// Captured passes (see [`GpuModel::graphed`]).
    graphs: std::sync::Mutex<Vec<PassGraph>>,
    /// Hashes of the keys of recent passes not captured yet.
    seen: std::sync::Mutex<Vec<u64>>,
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

struct GpuGdn {
    /// `in_proj_qkv` and `in_proj_z`.
    in_qkv_z: WeightPair,
    in_b: DeviceWeight,
    in_a: DeviceWeight,
    conv: Buf,
    conv_kernel: usize,
    dt_bias: Buf,
    neg_a: Buf,
    norm: Buf,
    out: DeviceWeight,
    hk: usize,
    hv: usize,
    dv: usize,
    tiled: bool,
}

struct GpuAttn {
    q: DeviceWeight,
    k: DeviceWeight,
    v: DeviceWeight,
    o: DeviceWeight,
    q_norm: Buf,
    k_norm: Buf,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

struct GpuMlp {
    gate_up: WeightPair,
    down: DeviceWeight,
}

/// Two weights that multiply the same input: stacked into one device weight (the rows of the
/// first, then the second) when the tensor-core GEMV can run both in one launch, else apart.
enum WeightPair {
    Stacked { w: DeviceWeight, split: usize },
    Apart(DeviceWeight, DeviceWeight),
}

impl WeightPair {
    /// `a` and `b` on the device; stacked when `stack` allows and their format is one the
    /// tensor-core GEMV reads, with `a`'s rows filling whole 16-row tiles.
    fn upload(gpu: &Gpu, a: &Weight, b: &Weight, stack: bool) -> Result<Self, ModelError> {
        let tiled = dev::GpuFormat::of(a.dtype()).is_ok_and(dev::is_tiled);
        if stack && tiled && a.rows().is_multiple_of(16) {
            if let Some(ab) = a.stack_rows(b) {
                return Ok(Self::Stacked {
                    w: gpu.upload_weight(&ab)?,
                    split: a.rows(),
                });
            }
        }
        Ok(Self::Apart(gpu.upload_weight(a)?, gpu.upload_weight(b)?))
    }

    /// Rows of the first and second weight.
    fn rows(&self) -> (usize, usize) {
        match self {
            Self::Stacked { w, split } => (*split, w.rows() - split),
            Self::Apart(a, b) => (a.rows(), b.rows()),
        }
    }

    /// `x · Aᵀ` into `out.0` and `x · Bᵀ` into `out.1`, for `t` rows of `x`.
    fn multiply(&self, m: &GpuModel, out: (u64, u64), x: u64, t: usize) -> Result<(), ModelError> {
        let (gpu, k) = (&*m.gpu, &*m.k);
        match self {
            Self::Stacked { w, split } => dev::matmul_pair(gpu, k, out, x, w, *split, t)?,
            Self::Apart(a, b) => {
                dev::matmul(gpu, k, out.0, x, a, 0, a.rows(), t)?;
                dev::matmul(gpu, k, out.1, x, b, 0, b.rows(), t)?;
            }
        }
        Ok(())
    }
}

enum GpuFfn {
    Dense(Box<GpuMlp>),
    Moe(Box<GpuMoe>),
}

struct GpuMoe {
    router: DeviceWeight,
    experts: Vec<GpuMlp>,
    top_k: usize,
    shared: GpuMlp,
    shared_gate: DeviceWeight,
    /// The experts' weight addresses, when every expert of each projection has the same
    /// tensor-core format and shape: routing and expert products then stay on the device.
    tables: Option<ExpertTables>,
}

/// Device tables of a MoE layer's expert weights, one address per expert and projection.
struct ExpertTables {
    gate: CudaSlice<u64>,
    up: CudaSlice<u64>,
    down: CudaSlice<u64>,
}

impl ExpertTables {
    /// The tables of `experts`, or `None` when one projection mixes formats or shapes or has
    /// no device kernel for grouped experts.
    fn new(gpu: &Gpu, experts: &[GpuMlp]) -> Result<Option<Self>, ModelError> {
        let table =
            |pick: fn(&GpuMlp) -> &DeviceWeight| -> Result<Option<CudaSlice<u64>>, ModelError> {
                let first = pick(&experts[0]);
                let uniform = experts.iter().map(pick).all(|w| {
                    w.format() == first.format()
                        && (w.rows(), w.cols(), w.row_bytes())
                            == (first.rows(), first.cols(), first.row_bytes())
                });
                if !uniform || !dev::has_expert_kernel(first) {
                    return Ok(None);
                }
                let ptrs: Vec<u64> = experts.iter().map(|e| pick(e).device_ptr(gpu)).collect();
                Ok(Some(gpu.upload(&ptrs)?))
            };
        if experts.is_empty() {
            return Ok(None);
        }
        Ok(
            match (
                table(|e| e.expert_weights().0)?,
                table(|e| e.expert_weights().1)?,
                table(|e| &e.down)?,
            ) {
                (Some(gate), Some(up), Some(down)) => Some(Self { gate, up, down }),
                _ => None,
            },
        )
    }
}

/// One sequence's state on the device.
#[derive(Clone)]
pub(crate) struct GpuState {
    model: Arc<GpuModel>,
    layers: Vec<GpuLayerState>,
    kv: KvFormat,
    /// Per layer, where a pass run from a checkpoint records what [`GpuState::rollback`]
    /// needs (GDN layers; allocated at the first such pass and kept, so a captured verify
    /// pass writes to the same buffers every time).
    replay: Vec<Option<GdnReplay>>,
    /// Whether the last pass recorded into `replay`.
    recorded: bool,
}

/// A GDN layer's state before a verify pass and the pass's conv inputs and gates: enough to
/// rebuild the state after any prefix of the pass (model-spec §2.6 (a), on the device).
#[derive(Clone)]
struct GdnReplay {
    conv: Buf,
    recurrent: Buf,
    /// `in_proj_qkv` rows `[T, C]`, decays `g` and `beta` `[T, hv]` of the pass, for up to
    /// `rows` tokens.
    qkv: Buf,
    g: Buf,
    beta: Buf,
    rows: usize,
}

#[derive(Clone)]
enum GpuLayerState {
    Gdn {
        conv: Buf,
        recurrent: Buf,
    },
    /// Keys and values `[cap, hkv, d]` in the KV format, with int8 row scales `[cap, hkv]`.
    Attn {
        k: CudaSlice<u8>,
        v: CudaSlice<u8>,
        ks: Buf,
        vs: Buf,
        cap: usize,
    },
}

/// One sequence of a batched pass: its device state, tokens and first position, and whether
/// the pass records what [`GpuState::rollback`] needs.
pub(crate) struct GpuItem<'a> {
    pub(crate) state: &'a mut GpuState,
    pub(crate) tokens: &'a [u32],
    pub(crate) pos0: usize,
    pub(crate) record: bool,
}

/// The rows `[off, off + t)` of a batched pass that belong to one sequence.
#[derive(Clone, Copy)]
struct SeqRows {
    off: usize,
    t: usize,
}

/// A sequence's share of a GDN layer in a batched pass.
struct GdnSeq<'a> {
    rows: SeqRows,
    conv: &'a mut Buf,
    rec: &'a mut Buf,
    record: Option<&'a mut GdnReplay>,
}

/// A sequence's share of an attention layer in a batched pass.
struct AttnSeq<'a> {
    rows: SeqRows,
    state: &'a mut GpuLayerState,
    kv: KvFormat,
    pos: dev::Position,
}

/// Positions a fresh attention cache holds before it grows (doubling).
const INITIAL_KV_CAPACITY: usize = 1024;

/// Captured passes kept per model (most recently used first): one per kind of pass (decode,
/// verify) and set of sequences that run together.
const PASS_GRAPHS: usize = 8;

/// The most tokens per sequence of a pass replayed from a graph (a verify block; longer
/// passes are prefill chunks, whose launches cost little beside their work).
const GRAPH_MAX_TOKENS: usize = 32;

/// A captured pass over some sequences' buffers (`key`: what was scored and tapped, then per
/// sequence its token count, whether it recorded, and its buffers' addresses and sizes). Each
/// replay reads the tokens' embeddings from `input` and the first positions from `pos`, and
/// leaves the scored rows' logits in `logits` and the tap outputs in `features`.
struct PassGraph {
    key: Vec<u64>,
    graph: dev::Graph,
    input: Buf,
    pos: CudaSlice<i32>,
    logits: Buf,
    features: Buf,
}

/// A pass's scored rows' logits `[n, V]` and tap outputs `[taps, T, H]`, on the host.
type HostOutputs = (Vec<f32>, Vec<f32>);

/// A hash of a pass graph's key.
fn key_hash(key: &[u64]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
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
            Logits::All => (r.off, r.t),
        }
    }

    /// Scored rows of all sequences.
    fn scored_rows(&self) -> usize {
        self.rows_of.iter().map(|&r| self.scored(r).1).sum()
    }
}

impl std::fmt::Debug for GpuState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GpuState({} layers, {:?} KV, {} bytes)",
            self.layers.len(),
            self.kv,
            self.bytes()
        )
    }
}

impl GpuState {
    /// Keeps the first `keep` of the `ran` tokens of the last (recorded) pass: attention rows
    /// past them are simply overwritten later; GDN layers replay the kept tokens from the
    /// state saved before the pass.
    pub(crate) fn rollback(&mut self, keep: usize, ran: usize) -> Result<(), ModelError> {
        if !std::mem::take(&mut self.recorded) || keep == ran {
            return Ok(());
        }
        let m = self.model.clone();
        for ((layer, ls), r) in m.layers.iter().zip(&mut self.layers).zip(&self.replay) {
            if let (GpuMixer::Gdn(g), GpuLayerState::Gdn { conv, recurrent }, Some(r)) =
                (&layer.mixer, ls, r)
            {
                g.replay(&m, r, keep, conv, recurrent)?;
            }
        }
        Ok(())
    }

    /// A device copy holding the first `len` positions of each attention cache (the prefix
    /// cache keeps these: no room for growth).
    pub(crate) fn try_clone(&self, len: usize) -> Result<GpuState, ModelError> {
        let m = &self.model;
        let g = &*m.gpu;
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(match l {
                    GpuLayerState::Gdn { conv, recurrent } => GpuLayerState::Gdn {
                        conv: m.clone_buf(conv)?,
                        recurrent: m.clone_buf(recurrent)?,
                    },
                    GpuLayerState::Attn { k, v, ks, vs, cap } => {
                        let (row, hkv) = (k.len() / cap, ks.len() / cap);
                        let new_cap = len.max(1);
                        let bytes = new_cap * row;
                        let (k2, v2) = (g.uninit::<u8>(bytes)?, g.uninit::<u8>(bytes)?);
                        let (ks2, vs2) = (m.scratch(new_cap * hkv)?, m.scratch(new_cap * hkv)?);
                        g.copy(ptr(g, &k2, 0), ptr(g, k, 0), len * row)?;
                        g.copy(ptr(g, &v2, 0), ptr(g, v, 0), len * row)?;
                        g.copy(ptr(g, &ks2, 0), ptr(g, ks, 0), 4 * len * hkv)?;
                        g.copy(ptr(g, &vs2, 0), ptr(g, vs, 0), 4 * len * hkv)?;
                        GpuLayerState::Attn {
                            k: k2,
                            v: v2,
                            ks: ks2,
                            vs: vs2,
                            cap: new_cap,
                        }
                    }
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(GpuState {
            model: m.clone(),
            layers,
            kv: self.kv,
            replay: Vec::new(),
            recorded: false,
        })
    }

    /// Writes the layers of a state image (see [`SequenceState::save_image`]): the first `len`
    /// positions of each attention cache, in the same layout as a CPU state.
    pub(crate) fn save_image(&self, w: &mut ImageWriter, len: usize) -> Result<(), ModelError> {
        let g = &*self.model.gpu;
        w.u64(self.layers.len() as u64);
        for l in &self.layers {
            match l {
                GpuLayerState::Gdn { conv, recurrent } => {
                    w.u64(0);
                    w.f32s(&g.download(conv, conv.len())?);
                    w.f32s(&g.download(recurrent, recurrent.len())?);
                }
                GpuLayerState::Attn { k, v, ks, vs, cap } => {
                    w.u64(1);
                    let (row, hkv) = (k.len() / cap, ks.len() / cap);
                    let scales = if self.kv == KvFormat::Int8 {
                        len * hkv
                    } else {
                        0
                    };
                    for (x, xs) in [(k, ks), (v, vs)] {
                        w.bytes(&g.download(x, len * row)?);
                        w.f32s(&g.download(xs, scales)?);
                    }
                }
            }
        }
        Ok(())
    }

    /// What a captured pass over this state depends on: the addresses and capacities of its
    /// buffers (with the rollback buffers for a pass that records), its KV format and the
    /// arithmetic mode.
    fn graph_key(&self, exact: bool, record: bool) -> Vec<u64> {
        let g = &*self.model.gpu;
        let mut key = vec![self.kv.value_bytes() as u64, exact as u64];
        for r in self.replay.iter().flatten().filter(|_| record) {
            let bufs = [&r.conv, &r.recurrent, &r.qkv, &r.g, &r.beta];
            key.extend(bufs.map(|b| ptr(g, b, 0)));
        }
        for l in &self.layers {
            match l {
                GpuLayerState::Gdn { conv, recurrent } => {
                    key.extend([ptr(g, conv, 0), ptr(g, recurrent, 0)]);
                }
                GpuLayerState::Attn { k, v, ks, vs, cap } => {
                    key.extend([ptr(g, k, 0), ptr(g, v, 0), ptr(g, ks, 0), ptr(g, vs, 0)]);
                    key.push(*cap as u64);
                }
            }
        }
        key
    }

    /// Makes the rollback buffers hold a recorded pass of `t` tokens.
    fn ensure_replay(&mut self, t: usize) -> Result<(), ModelError> {
        let m = self.model.clone();
        self.replay.resize_with(self.layers.len(), || None);
        for ((layer, ls), slot) in m.layers.iter().zip(&self.layers).zip(&mut self.replay) {
            let (GpuMixer::Gdn(g), GpuLayerState::Gdn { conv, recurrent }) = (&layer.mixer, ls)
            else {
                continue;
            };
            if slot.as_ref().is_some_and(|r| r.rows >= t) {
                continue;
            }
            // A whole verify block at least, so that blocks of any size up to it share them.
            let rows = t.max(16);
            let c = g.in_qkv_z.rows().0;
            *slot = Some(GdnReplay {
                conv: m.scratch(conv.len())?,
                recurrent: m.scratch(recurrent.len())?,
                qkv: m.scratch(rows * c)?,
                g: m.scratch(rows * g.hv)?,
                beta: m.scratch(rows * g.hv)?,
                rows,
            });
        }
        Ok(())
    }

    /// Positions the attention caches hold (they grow together).
    fn kv_capacity(&self) -> usize {
        self.layers
            .iter()
            .filter_map(|l| match l {
                GpuLayerState::Attn { cap, .. } => Some(*cap),
                GpuLayerState::Gdn { .. } => None,
            })
            .min()
            .unwrap_or(0)
    }

    /// Device bytes held.
    pub(crate) fn bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| match l {
                GpuLayerState::Gdn { conv, recurrent } => 4 * (conv.len() + recurrent.len()),
                GpuLayerState::Attn { k, v, ks, vs, .. } => {
                    k.len() + v.len() + 4 * (ks.len() + vs.len())
                }
            })
            .sum();
        let replay: usize = self
            .replay
            .iter()
            .flatten()
            .map(|r| {
                4 * (r.conv.len() + r.recurrent.len() + r.qkv.len() + r.g.len() + r.beta.len())
            })
            .sum();
        layers + replay
    }
}

fn upload_vec(gpu: &Gpu, v: &[f32]) -> Result<Buf, ModelError> {
    Ok(gpu.upload(v)?)
}

impl GpuMlp {
    /// `m` on the device, gate and up stacked when `stack` allows (not for routed experts,
    /// whose grouped products take each projection's own weight).
    fn upload(gpu: &Gpu, m: &Mlp, stack: bool) -> Result<Self, ModelError> {
        Ok(Self {
            gate_up: WeightPair::upload(gpu, &m.gate, &m.up, stack)?,
            down: gpu.upload_weight(&m.down)?,
        })
    }

    /// The gate and up weights of a routed expert (uploaded apart).
    fn expert_weights(&self) -> (&DeviceWeight, &DeviceWeight) {
        match &self.gate_up {
            WeightPair::Apart(gate, up) => (gate, up),
            WeightPair::Stacked { .. } => unreachable!("routed experts are uploaded apart"),
        }
    }

    /// `down(silu(gate x) * up x)` for `t` rows of `x`.
    fn forward(&self, m: &GpuModel, x: u64, t: usize) -> Result<Buf, ModelError> {
        let (gpu, k) = (&*m.gpu, &*m.k);
        let i = self.gate_up.rows().0;
        let g = m.scratch(t * i)?;
        let u = m.scratch(t * i)?;
        self.gate_up
            .multiply(m, (ptr(gpu, &g, 0), ptr(gpu, &u, 0)), x, t)?;
        dev::silu_mul(gpu, k, ptr(gpu, &g, 0), ptr(gpu, &u, 0), t * i)?;
        let out = m.scratch(t * self.down.rows())?;
        dev::matmul(
            gpu,
            k,
            ptr(gpu, &out, 0),
            ptr(gpu, &g, 0),
            &self.down,
            0,
            self.down.rows(),
            t,
        )?;
        Ok(out)
    }
}

impl GpuModel {
    /// Copies the weights of `cpu` to `gpu` and compiles the kernels for its shapes.
    pub(crate) fn upload(cpu: &Qwen35, gpu: Arc<Gpu>) -> Result<Self, ModelError> {
        let cfg = &cpu.config;
        let k = gpu.kernels(KernelDims {
            head_dim: cfg.head_dim,
            gdn_dk: cfg.gdn.dk,
            gdn_dv: cfg.gdn.dv,
        })?;
        let g = &*gpu;
        let layers = cpu
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
            final_norm: upload_vec(g, &cpu.final_norm)?,
            lm_head: g.upload_weight(&cpu.lm_head)?,
            inv_freq: upload_vec(g, &inv_freq)?,
            rotary_dim: cfg.rotary_dim,
            graphs: std::sync::Mutex::new(Vec::new()),
            seen: std::sync::Mutex::new(Vec::new()),
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

    /// A fresh state: zero conv and recurrent state, empty caches.
    pub(crate) fn new_state(
        self: &Arc<Self>,
        cfg: &ModelConfig,
        kv: KvFormat,
    ) -> Result<GpuState, ModelError> {
        self.zeroed_state(cfg, kv, INITIAL_KV_CAPACITY)
    }

    /// A zeroed state whose attention caches hold `cap` positions.
    fn zeroed_state(
        self: &Arc<Self>,
        cfg: &ModelConfig,
        kv: KvFormat,
        cap: usize,
    ) -> Result<GpuState, ModelError> {
        let layers = cfg
            .layer_kinds
            .iter()
            .map(|kind| {
                Ok(match kind {
                    LayerKind::Linear => GpuLayerState::Gdn {
                        conv: self.gpu.zeros((cfg.conv_kernel - 1) * cfg.conv_dim())?,
                        recurrent: self.gpu.zeros(cfg.gdn.state_len())?,
                    },
                    LayerKind::Full => {
                        // Every format has row scales on the device (unused outside int8).
                        let rows = cap * cfg.num_kv_heads;
                        let bytes = rows * cfg.head_dim * kv.value_bytes();
                        GpuLayerState::Attn {
                            k: self.gpu.zeros(bytes)?,
                            v: self.gpu.zeros(bytes)?,
                            ks: self.gpu.zeros(rows)?,
                            vs: self.gpu.zeros(rows)?,
                            cap,
                        }
                    }
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(GpuState {
            model: self.clone(),
            layers,
            kv,
            replay: Vec::new(),
            recorded: false,
        })
    }

    /// A device state from a parsed image (room for at least the initial capacity).
    pub(crate) fn state_from_image(
        self: &Arc<Self>,
        cfg: &ModelConfig,
        len: usize,
        kv: KvFormat,
        image: Vec<LayerImage<'_>>,
    ) -> Result<GpuState, ModelError> {
        let g = &*self.gpu;
        let mut state = self.zeroed_state(cfg, kv, len.max(INITIAL_KV_CAPACITY))?;
        for (layer, saved) in state.layers.iter_mut().zip(image) {
            match (layer, saved) {
                (
                    GpuLayerState::Gdn { conv, recurrent },
                    LayerImage::Gdn {
                        conv: c,
                        recurrent: r,
                    },
                ) => {
                    g.write(conv, &c)?;
                    g.write(recurrent, &r)?;
                }
                (
                    GpuLayerState::Attn { k, v, ks, vs, .. },
                    LayerImage::Attn {
                        k: hk,
                        ks: hks,
                        v: hv,
                        vs: hvs,
                    },
                ) => {
                    g.write(k, hk)?;
                    g.write(v, hv)?;
                    g.write(ks, &hks)?;
                    g.write(vs, &hvs)?;
                }
                _ => unreachable!("the image was checked against the model's layer kinds"),
            }
        }
        Ok(state)
    }

    /// The forward pass of several sequences' tokens (see [`Qwen35::forward_batch`]): the
    /// linear layers run once over the rows of all of them, the conv, scan and attention of
    /// each on its own state. Returns each item's logits and tap outputs `[T, taps.len() · H]`.
    /// Several items keep every product batch-invariant ([`Gpu::set_batch_invariant`]).
    pub(crate) fn forward(
        &self,
        cpu: &Qwen35,
        items: &mut [GpuItem<'_>],
        want: Logits,
        taps: &[usize],
    ) -> Result<Vec<super::LogitsAndTaps>, ModelError> {
        let batched = items.len() > 1;
        if batched {
            self.gpu.set_batch_invariant(true);
        }
        let out = self.forward_rows(cpu, items, want, taps);
        if batched {
            self.gpu.set_batch_invariant(false);
        }
        out
    }

    fn forward_rows(
        &self,
        cpu: &Qwen35,
        items: &mut [GpuItem<'_>],
        want: Logits,
        taps: &[usize],
    ) -> Result<Vec<super::LogitsAndTaps>, ModelError> {
        let cfg = &cpu.config;
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
        let (logits, f) = match self.graphed(cpu, items, &pass)? {
            Some(out) => out,
            None => self.launched(cpu, items, &pass)?,
        };
        for item in items.iter_mut() {
            item.state.recorded = item.record;
        }
        // Tap outputs [taps, T, H] → per item [t, taps · H]; logits per item's scored rows.
        let mut at = 0;
        Ok(rows_of
            .iter()
            .map(|&r| {
                let mut features = vec![0.0f32; r.t * taps.len() * h];
                for (j, tap) in f.chunks_exact(t * h.max(1)).enumerate() {
                    for ti in 0..r.t {
                        features[(ti * taps.len() + j) * h..][..h]
                            .copy_from_slice(&tap[(r.off + ti) * h..][..h]);
                    }
                }
                let n = pass.scored(r).1;
                let l = logits[at * v..(at + n) * v].to_vec();
                at += n;
                (l, features)
            })
            .collect())
    }

    /// The pass launched kernel by kernel: the logits of the scored rows `[n, V]` and the tap
    /// outputs `[taps, T, H]`, on the host.
    fn launched(
        &self,
        cpu: &Qwen35,
        items: &mut [GpuItem<'_>],
        pass: &Pass<'_>,
    ) -> Result<HostOutputs, ModelError> {
        let cfg = &cpu.config;
        let gpu = &*self.gpu;
        let (h, t) = (cfg.hidden_size, pass.tokens());
        let x = gpu.upload(&self.embed(cpu, items))?;
        let xp = ptr(gpu, &x, 0);
        let normed = self.scratch(t * h)?;
        let np = ptr(gpu, &normed, 0);
        let features = self.scratch(pass.taps.len() * t * h)?;
        let fp = ptr(gpu, &features, 0);
        self.layers(cfg, xp, np, items, pass.rows_of, (pass.taps, fp), None)?;
        let f = if pass.taps.is_empty() {
            Vec::new()
        } else {
            gpu.download(&features, pass.taps.len() * t * h)?
        };
        let n = pass.scored_rows();
        if n == 0 {
            gpu.synchronize()?;
            return Ok((Vec::new(), f));
        }
        let logits = self.score(cfg, xp, np, pass)?;
        Ok((gpu.download(&logits, n * cfg.vocab_size)?, f))
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
    /// table stays in host memory).
    fn embed(&self, cpu: &Qwen35, items: &[GpuItem<'_>]) -> Vec<f32> {
        let tokens: Vec<u32> = items
            .iter()
            .flat_map(|i| i.tokens.iter().copied())
            .collect();
        let mut rows = vec![0.0f32; tokens.len() * cpu.config.hidden_size];
        splash_backend::cpu::embedding(&mut rows, &cpu.embed, &tokens);
        rows
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
    ) -> Result<(), ModelError> {
        let (gpu, k) = (&*self.gpu, &*self.k);
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        let t: usize = rows_of.iter().map(|r| r.t).sum();
        let (xp, np) = (x, normed);
        for (li, layer) in self.layers.iter().enumerate() {
            dev::rms_norm(gpu, k, np, xp, ptr(gpu, &layer.input_norm, 0), t, h, eps)?;
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
                    g.forward(self, np, t, &mut parts, eps)?
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
                            }
                        })
                        .collect();
                    a.forward(self, np, t, &mut parts, eps)?
                }
            };
            dev::add_in_place(gpu, k, xp, ptr(gpu, &mixed, 0), t * h)?;
            dev::rms_norm(gpu, k, np, xp, ptr(gpu, &layer.post_norm, 0), t, h, eps)?;
            let ffn = match &layer.ffn {
                GpuFfn::Dense(m) => m.forward(self, np, t)?,
                GpuFfn::Moe(moe) => self.moe(moe, np, t)?,
            };
            dev::add_in_place(gpu, k, xp, ptr(gpu, &ffn, 0), t * h)?;
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
            GpuFfn::Moe(m) => m.tables.is_none() || self.gpu.exact(),
            GpuFfn::Dense(_) => false,
        })
    }

    /// The pass replayed from a captured graph: one launch instead of a few thousand, for
    /// passes of up to [`GRAPH_MAX_TOKENS`] tokens per sequence that score rows (decoding, a
    /// verify block, batched steps of several sequences). The graph is captured at the first
    /// such pass over the sequences' buffers and replayed while they stay (positions are read
    /// on the device); `None` for other passes. Returns what [`Self::launched`] returns.
    fn graphed(
        &self,
        cpu: &Qwen35,
        items: &mut [GpuItem<'_>],
        pass: &Pass<'_>,
    ) -> Result<Option<HostOutputs>, ModelError> {
        if !self.gpu.graphs()
            || items.iter().any(|i| i.tokens.len() > GRAPH_MAX_TOKENS)
            || pass.want == Logits::None
            || self.routes_on_host()
        {
            return Ok(None);
        }
        let cfg = &cpu.config;
        let (gpu, v, h) = (&*self.gpu, cfg.vocab_size, cfg.hidden_size);
        let mut key = vec![items.len() as u64, pass.want as u64, pass.taps.len() as u64];
        key.extend(pass.taps.iter().map(|&l| l as u64));
        for item in items.iter_mut() {
            // Room for the tokens first: growing a cache moves it, which changes the key.
            let (kv, end) = (item.state.kv, item.pos0 + item.tokens.len());
            for l in &mut item.state.layers {
                if matches!(l, GpuLayerState::Attn { .. }) {
                    ensure_capacity(self, l, kv, end, cfg.num_kv_heads, cfg.head_dim)?;
                }
            }
            key.extend([item.tokens.len() as u64, item.record as u64]);
            key.extend(item.state.graph_key(gpu.exact(), item.record));
        }
        let mut graphs = self.graphs.lock().expect("graph cache lock");
        let mut graph = match graphs.iter().position(|g| g.key == key) {
            Some(i) => graphs.remove(i),
            None => {
                // Captured when the same pass comes a second time: a pass that runs once (the
                // last token of a prompt restored from the cache) would pay the capture for
                // nothing.
                let mut seen = self.seen.lock().expect("graph cache lock");
                let hash = key_hash(&key);
                if !seen.contains(&hash) {
                    seen.insert(0, hash);
                    seen.truncate(4 * PASS_GRAPHS);
                    return Ok(None);
                }
                match self.capture(cfg, items, pass, key) {
                    Ok(g) => g,
                    Err(e) => {
                        // A capture runs nothing, so the pass can still be launched; graphs
                        // stay off rather than fail every pass the same way.
                        tracing::warn!("CUDA graph capture failed, graphs turned off: {e}");
                        gpu.set_graphs(false);
                        return Ok(None);
                    }
                }
            }
        };
        let positions: Vec<i32> = items.iter().map(|i| i.pos0 as i32).collect();
        gpu.write(&mut graph.input, &self.embed(cpu, items))?;
        gpu.write(&mut graph.pos, &positions)?;
        gpu.replay(&graph.graph)?;
        let t = pass.tokens();
        let f = if pass.taps.is_empty() {
            Vec::new()
        } else {
            gpu.download(&graph.features, pass.taps.len() * t * h)?
        };
        let logits = gpu.download(&graph.logits, pass.scored_rows() * v)?;
        graphs.insert(0, graph);
        graphs.truncate(PASS_GRAPHS);
        Ok(Some((logits, f)))
    }

    /// Captures `pass` over the current buffers of `items`.
    fn capture(
        &self,
        cfg: &ModelConfig,
        items: &mut [GpuItem<'_>],
        pass: &Pass<'_>,
        key: Vec<u64>,
    ) -> Result<PassGraph, ModelError> {
        let (gpu, h, t) = (&*self.gpu, cfg.hidden_size, pass.tokens());
        let input = self.scratch(t * h)?;
        let pos = gpu.zeros::<i32>(items.len())?;
        let n = pass.scored_rows();
        let logits = self.scratch(n * cfg.vocab_size)?;
        let features = self.scratch(pass.taps.len() * t * h)?;
        let positions: Vec<dev::Position> = items
            .iter()
            .enumerate()
            .map(|(i, item)| dev::Position::Device {
                at: ptr(gpu, &pos, i),
                limit: item.state.kv_capacity(),
            })
            .collect();
        let (xp, lp, fp) = (
            ptr(gpu, &input, 0),
            ptr(gpu, &logits, 0),
            ptr(gpu, &features, 0),
        );
        let graph = gpu.capture(|| -> Result<(), ModelError> {
            let normed = self.scratch(t * h)?;
            let np = ptr(gpu, &normed, 0);
            let rows = pass.rows_of;
            self.layers(cfg, xp, np, items, rows, (pass.taps, fp), Some(&positions))?;
            let out = self.score(cfg, xp, np, pass)?;
            gpu.copy(lp, ptr(gpu, &out, 0), n * cfg.vocab_size * 4)?;
            Ok(())
        })?;
        Ok(PassGraph {
            key,
            graph,
            input,
            pos,
            logits,
            features,
        })
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

    /// The routed experts and the gated shared expert. With expert tables (tensor-core
    /// formats, not the exact mode) everything stays on the device: routing, one grouped
    /// product per projection, the weighted sum. Otherwise routing (softmax, top-k,
    /// renormalise) runs on the host over the downloaded router logits, exactly as the CPU
    /// does, and each chosen expert runs on its tokens.
    fn moe(&self, moe: &GpuMoe, x: u64, t: usize) -> Result<Buf, ModelError> {
        let GpuMoe {
            router,
            experts,
            top_k,
            shared,
            shared_gate,
            tables,
        } = moe;
        let (gpu, k) = (&*self.gpu, &*self.k);
        let (e, h) = (router.rows(), router.cols());
        let logits = self.scratch(t * e)?;
        dev::matmul(gpu, k, ptr(gpu, &logits, 0), x, router, 0, e, t)?;
        let out = shared.forward(self, x, t)?;
        let sg = self.scratch(t)?;
        dev::matmul(gpu, k, ptr(gpu, &sg, 0), x, shared_gate, 0, 1, t)?;
        dev::scale_rows_sigmoid(gpu, k, ptr(gpu, &out, 0), ptr(gpu, &sg, 0), t, h)?;
        if let Some(tables) = tables.as_ref().filter(|_| !gpu.exact()) {
            let routing = dev::moe_route(gpu, k, ptr(gpu, &logits, 0), t, e, *top_k)?;
            let (pairs, first) = (t * top_k, &experts[0]);
            let (first_gate, first_up) = first.expert_weights();
            let inter = first_gate.rows();
            let g = self.scratch(pairs * inter)?;
            let u = self.scratch(pairs * inter)?;
            let (gp, up) = (ptr(gpu, &g, 0), ptr(gpu, &u, 0));
            let table = |b: &CudaSlice<u64>| ptr(gpu, b, 0);
            dev::matmul_experts(
                gpu,
                k,
                gp,
                x,
                t,
                table(&tables.gate),
                first_gate,
                &routing,
                *top_k,
            )?;
            dev::matmul_experts(
                gpu,
                k,
                up,
                x,
                t,
                table(&tables.up),
                first_up,
                &routing,
                *top_k,
            )?;
            dev::silu_mul(gpu, k, gp, up, pairs * inter)?;
            let y = self.scratch(pairs * h)?;
            let yp = ptr(gpu, &y, 0);
            dev::matmul_experts(
                gpu,
                k,
                yp,
                gp,
                pairs,
                table(&tables.down),
                &first.down,
                &routing,
                1,
            )?;
            dev::moe_combine(gpu, k, ptr(gpu, &out, 0), yp, &routing, t, *top_k, h)?;
            return Ok(out);
        }
        let mut probs = gpu.download(&logits, t * e)?;
        let routed = super::ffn::route(&mut probs, e, *top_k);
        for (expert, tokens) in experts.iter().zip(&routed) {
            if tokens.is_empty() {
                continue;
            }
            let n = tokens.len();
            let idx: Vec<i32> = tokens.iter().map(|&(ti, _)| ti as i32).collect();
            let weights: Vec<f32> = tokens.iter().map(|&(_, w)| w).collect();
            let idx_d = gpu.upload(&idx)?;
            let w_d = gpu.upload(&weights)?;
            let xs = self.scratch(n * h)?;
            dev::gather_rows(gpu, k, ptr(gpu, &xs, 0), x, ptr(gpu, &idx_d, 0), n, h)?;
            let y = expert.forward(self, ptr(gpu, &xs, 0), n)?;
            dev::scatter_add_rows(
                gpu,
                k,
                ptr(gpu, &out, 0),
                ptr(gpu, &y, 0),
                ptr(gpu, &idx_d, 0),
                ptr(gpu, &w_d, 0),
                n,
                h,
            )?;
        }
        Ok(out)
    }
}

fn upload_gdn(gpu: &Gpu, cfg: &ModelConfig, d: &GatedDeltaNet) -> Result<GpuGdn, ModelError> {
    Ok(GpuGdn {
        in_qkv_z: WeightPair::upload(gpu, &d.in_qkv, &d.in_z, true)?,
        in_b: gpu.upload_weight(&d.in_b)?,
        in_a: gpu.upload_weight(&d.in_a)?,
        conv: upload_vec(gpu, &d.conv)?,
        conv_kernel: cfg.conv_kernel,
        dt_bias: upload_vec(gpu, &d.dt_bias)?,
        neg_a: upload_vec(gpu, &d.neg_a)?,
        norm: upload_vec(gpu, &d.norm)?,
        out: gpu.upload_weight(&d.out)?,
        hk: d.dims.hk,
        hv: d.dims.hv,
        dv: d.dims.dv,
        tiled: d.dims.v_order == VHeadOrder::Tiled,
    })
}

fn upload_attn(gpu: &Gpu, a: &Attention) -> Result<GpuAttn, ModelError> {
    Ok(GpuAttn {
        q: gpu.upload_weight(&a.q)?,
        k: gpu.upload_weight(&a.k)?,
        v: gpu.upload_weight(&a.v)?,
        o: gpu.upload_weight(&a.o)?,
        q_norm: upload_vec(gpu, &a.q_norm)?,
        k_norm: upload_vec(gpu, &a.k_norm)?,
        heads: a.heads,
        kv_heads: a.kv_heads,
        head_dim: a.head_dim,
    })
}

fn upload_moe(gpu: &Gpu, m: &Moe) -> Result<GpuFfn, ModelError> {
    let experts = m
        .experts
        .iter()
        .map(|e| GpuMlp::upload(gpu, e, false))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(GpuFfn::Moe(Box::new(GpuMoe {
        router: gpu.upload_weight(&m.router)?,
        tables: ExpertTables::new(gpu, &experts)?,
        experts,
        top_k: m.top_k,
        shared: GpuMlp::upload(gpu, &m.shared, true)?,
        shared_gate: gpu.upload_weight(&m.shared_gate)?,
    })))
}

impl GpuGdn {
    /// The layer over `t` rows of `x` belonging to the sequences `parts`: projections for all
    /// rows, conv and scan per sequence on its own state. A part that records first saves its
    /// conv and recurrent state, then keeps its rows' conv inputs and gates there.
    fn forward(
        &self,
        m: &GpuModel,
        x: u64,
        t: usize,
        parts: &mut [GdnSeq<'_>],
        eps: f32,
    ) -> Result<Buf, ModelError> {
        let (gpu, k) = (&*m.gpu, &*m.k);
        let (c, vd) = self.in_qkv_z.rows();
        let qkv = m.scratch(t * c)?;
        let z = m.scratch(t * vd)?;
        self.in_qkv_z
            .multiply(m, (ptr(gpu, &qkv, 0), ptr(gpu, &z, 0)), x, t)?;
        let b = m.scratch(t * self.hv)?;
        dev::matmul(gpu, k, ptr(gpu, &b, 0), x, &self.in_b, 0, self.hv, t)?;
        let a = m.scratch(t * self.hv)?;
        dev::matmul(gpu, k, ptr(gpu, &a, 0), x, &self.in_a, 0, self.hv, t)?;
        dev::gdn_gates(
            gpu,
            k,
            ptr(gpu, &b, 0),
            ptr(gpu, &a, 0),
            ptr(gpu, &self.dt_bias, 0),
            ptr(gpu, &self.neg_a, 0),
            self.hv,
            t * self.hv,
        )?;
        let mixed = m.scratch(t * c)?;
        let o = m.scratch(t * vd)?;
        for p in parts.iter_mut() {
            let SeqRows { off, t: n } = p.rows;
            if let Some(r) = p.record.as_deref_mut() {
                let hv = self.hv;
                gpu.copy(ptr(gpu, &r.conv, 0), ptr(gpu, p.conv, 0), r.conv.len() * 4)?;
                gpu.copy(
                    ptr(gpu, &r.recurrent, 0),
                    ptr(gpu, p.rec, 0),
                    r.recurrent.len() * 4,
                )?;
                gpu.copy(ptr(gpu, &r.qkv, 0), ptr(gpu, &qkv, off * c), n * c * 4)?;
                gpu.copy(ptr(gpu, &r.g, 0), ptr(gpu, &a, off * hv), n * hv * 4)?;
                gpu.copy(ptr(gpu, &r.beta, 0), ptr(gpu, &b, off * hv), n * hv * 4)?;
            }
            dev::conv1d_silu(
                gpu,
                k,
                ptr(gpu, &mixed, off * c),
                ptr(gpu, &qkv, off * c),
                ptr(gpu, p.conv, 0),
                ptr(gpu, &self.conv, 0),
                n,
                c,
                self.conv_kernel,
            )?;
            dev::gdn_recurrent(
                gpu,
                k,
                ptr(gpu, &o, off * vd),
                ptr(gpu, &mixed, off * c),
                ptr(gpu, &a, off * self.hv),
                ptr(gpu, &b, off * self.hv),
                ptr(gpu, p.rec, 0),
                n,
                self.hk,
                self.hv,
                self.tiled,
            )?;
        }
        dev::rms_norm_gated(
            gpu,
            k,
            ptr(gpu, &o, 0),
            ptr(gpu, &o, 0),
            ptr(gpu, &z, 0),
            ptr(gpu, &self.norm, 0),
            t * self.hv,
            self.dv,
            eps,
        )?;
        let out = m.scratch(t * self.out.rows())?;
        dev::matmul(
            gpu,
            k,
            ptr(gpu, &out, 0),
            ptr(gpu, &o, 0),
            &self.out,
            0,
            self.out.rows(),
            t,
        )?;
        Ok(out)
    }

    /// Restores the state saved before a recorded pass and runs its first `keep` tokens
    /// again (conv and recurrence only: their outputs are not needed).
    fn replay(
        &self,
        m: &GpuModel,
        r: &GdnReplay,
        keep: usize,
        conv: &mut Buf,
        rec: &mut Buf,
    ) -> Result<(), ModelError> {
        let (gpu, k) = (&*m.gpu, &*m.k);
        gpu.copy(ptr(gpu, conv, 0), ptr(gpu, &r.conv, 0), r.conv.len() * 4)?;
        gpu.copy(
            ptr(gpu, rec, 0),
            ptr(gpu, &r.recurrent, 0),
            r.recurrent.len() * 4,
        )?;
        if keep == 0 {
            return Ok(());
        }
        let c = self.in_qkv_z.rows().0;
        let mixed = m.scratch(keep * c)?;
        dev::conv1d_silu(
            gpu,
            k,
            ptr(gpu, &mixed, 0),
            ptr(gpu, &r.qkv, 0),
            ptr(gpu, conv, 0),
            ptr(gpu, &self.conv, 0),
            keep,
            c,
            self.conv_kernel,
        )?;
        let o = m.scratch(keep * self.hv * self.dv)?;
        dev::gdn_recurrent(
            gpu,
            k,
            ptr(gpu, &o, 0),
            ptr(gpu, &mixed, 0),
            ptr(gpu, &r.g, 0),
            ptr(gpu, &r.beta, 0),
            ptr(gpu, rec, 0),
            keep,
            self.hk,
            self.hv,
            self.tiled,
        )?;
        Ok(())
    }
}

impl GpuAttn {
    /// The layer over `t` rows of `x` belonging to the sequences `parts`: projections for all
    /// rows; RoPE, the cache append and attention per sequence.
    fn forward(
        &self,
        m: &GpuModel,
        x: u64,
        t: usize,
        parts: &mut [AttnSeq<'_>],
        eps: f32,
    ) -> Result<Buf, ModelError> {
        let (gpu, k) = (&*m.gpu, &*m.k);
        let (hq, hkv, d) = (self.heads, self.kv_heads, self.head_dim);
        let qg = m.scratch(t * hq * 2 * d)?;
        dev::matmul(gpu, k, ptr(gpu, &qg, 0), x, &self.q, 0, hq * 2 * d, t)?;
        let q = m.scratch(t * hq * d)?;
        let gate = m.scratch(t * hq * d)?;
        dev::split_q_gate(
            gpu,
            k,
            ptr(gpu, &q, 0),
            ptr(gpu, &gate, 0),
            ptr(gpu, &qg, 0),
            t * hq,
            d,
        )?;
        let kb = m.scratch(t * hkv * d)?;
        dev::matmul(gpu, k, ptr(gpu, &kb, 0), x, &self.k, 0, hkv * d, t)?;
        let vb = m.scratch(t * hkv * d)?;
        dev::matmul(gpu, k, ptr(gpu, &vb, 0), x, &self.v, 0, hkv * d, t)?;
        dev::rms_norm(
            gpu,
            k,
            ptr(gpu, &q, 0),
            ptr(gpu, &q, 0),
            ptr(gpu, &self.q_norm, 0),
            t * hq,
            d,
            eps,
        )?;
        dev::rms_norm(
            gpu,
            k,
            ptr(gpu, &kb, 0),
            ptr(gpu, &kb, 0),
            ptr(gpu, &self.k_norm, 0),
            t * hkv,
            d,
            eps,
        )?;
        let inv = ptr(gpu, &m.inv_freq, 0);
        let attn = m.scratch(t * hq * d)?;
        for p in parts.iter_mut() {
            let (SeqRows { off, t: n }, kv, pos) = (p.rows, p.kv, p.pos);
            let (qp, kp, vp) = (
                ptr(gpu, &q, off * hq * d),
                ptr(gpu, &kb, off * hkv * d),
                ptr(gpu, &vb, off * hkv * d),
            );
            dev::rope(gpu, k, qp, inv, n, hq, d, m.rotary_dim, pos)?;
            dev::rope(gpu, k, kp, inv, n, hkv, d, m.rotary_dim, pos)?;
            // (A captured pass's caches were grown before the capture.)
            if let dev::Position::Host(pos0) = pos {
                ensure_capacity(m, p.state, kv, pos0 + n, hkv, d)?;
            }
            let GpuLayerState::Attn {
                k: kc,
                v: vc,
                ks,
                vs,
                ..
            } = &mut *p.state
            else {
                unreachable!("attention layer state")
            };
            let (kcp, vcp) = (ptr(gpu, kc, 0), ptr(gpu, vc, 0));
            let (ksp, vsp) = (ptr(gpu, ks, 0), ptr(gpu, vs, 0));
            dev::kv_append(gpu, k, kcp, ksp, kp, kv, n, hkv, d, pos)?;
            dev::kv_append(gpu, k, vcp, vsp, vp, kv, n, hkv, d, pos)?;
            dev::attention(
                gpu,
                k,
                ptr(gpu, &attn, off * hq * d),
                qp,
                (kcp, ksp),
                (vcp, vsp),
                kv,
                n,
                hq,
                hkv,
                pos,
                (d as f32).powf(-0.5),
                dev::KeyMask::default(),
            )?;
        }
        dev::sigmoid_gate(gpu, k, ptr(gpu, &attn, 0), ptr(gpu, &gate, 0), t * hq * d)?;
        let out = m.scratch(t * self.o.rows())?;
        dev::matmul(
            gpu,
            k,
            ptr(gpu, &out, 0),
            ptr(gpu, &attn, 0),
            &self.o,
            0,
            self.o.rows(),
            t,
        )?;
        Ok(out)
    }
}

/// Grows an attention cache (doubling) so that it holds `needed` positions.
fn ensure_capacity(
    m: &GpuModel,
    state: &mut GpuLayerState,
    kv: KvFormat,
    needed: usize,
    hkv: usize,
    d: usize,
) -> Result<(), ModelError> {
    let GpuLayerState::Attn { k, v, ks, vs, cap } = state else {
        unreachable!("attention layer state")
    };
    if needed <= *cap {
        return Ok(());
    }
    let new_cap = needed.max(*cap * 2);
    let gpu = &*m.gpu;
    let bytes = new_cap * hkv * d * kv.value_bytes();
    *k = gpu.grown(k, bytes)?;
    *v = gpu.grown(v, bytes)?;
    *ks = gpu.grown(ks, new_cap * hkv)?;
    *vs = gpu.grown(vs, new_cap * hkv)?;
    *cap = new_cap;
    Ok(())
}

impl Qwen35 {
    /// Moves the forward pass to `gpu`: the weights are copied in their stored format and new
    /// states live on the device. The CPU weights (memory-mapped) stay for the embedding rows.
    pub fn to_gpu(&mut self, gpu: Arc<Gpu>) -> Result<(), ModelError> {
        self.gpu = Some(Arc::new(GpuModel::upload(self, gpu)?));
        Ok(())
    }

    /// The GPU the forward pass runs on, if any.
    pub fn gpu(&self) -> Option<&Arc<Gpu>> {
        self.gpu.as_ref().map(|g| g.gpu())
    }

    /// The weights on the GPU, if the forward pass runs there.
    pub(crate) fn gpu_model(&self) -> Option<&Arc<GpuModel>> {
        self.gpu.as_ref()
    }
}
