//! DFlash and DFlash2 draft models (model-spec §4): a few Qwen3-style layers that draft a
//! whole block in one parallel pass, conditioned on the target's hidden states.
//!
//! Legend: `B` = block size (anchor + `B-1` mask rows), `H` = hidden size (the target's),
//! `n` = number of tap layers, `C` = committed context rows, `hq`/`hkv`/`d` = draft heads.
//!
//! ```text
//! ctx   = hidden_norm(fc(concat taps))                     [C, H]   once per committed token
//! h     = target.embed([anchor, MASK × (B-1)]) · scale     [B, H]   positions s..s+B-1
//! layer: x = input_ln(h); (DFlash2: x = attn_conv.prepare(x))
//!        K,V = [cached ctx K,V ; block K,V]  (ctx K/V: k_norm + RoPE at their positions)
//!        h += o_proj(attention(q(x), K, V))  no causal mask; sliding layers |Δpos| < W
//!        (DFlash2: attn_conv.finish), then the MLP the same way with mlp_conv
//! out   = norm(h)[1..]                                     [B-1, H]
//! logits = target.lm_head(out) · output_multiplier, optional tanh softcap
//! ```
//!
//! The context K/V rows of each layer depend only on the context features, so they are
//! computed once when a token is committed ([`DFlashDraft::append_context`]) and kept in a
//! per-sequence [`DraftContext`] (sliding layers keep only the last `W-1` rows).

mod config;
mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
mod selector;

use std::path::Path;

use splash_backend::cpu::{grouped_dynamic_conv, matmul, Rope};
use splash_backend::Weight;

pub use config::{build_target_layer_ids, DFlash2Config, DraftConfig, DraftKind};
pub use selector::{Selector, SelectorSlot};

use crate::checkpoint::Checkpoint;
use crate::error::ModelError;
use crate::image::{bad as image_error, ImageReader, ImageWriter};
use crate::qwen35::Qwen35;
use device::{ContextLayer, DeviceContext, DraftDevice, DraftedRows};

/// DFlash2's convolution around one sublayer: `base [2, K, H]`, `kernel_projection [2·K·G, H]`.
struct DynConv {
    base: Vec<f32>,
    projection: Weight,
    kernel: usize,
    group: usize,
}

impl DynConv {
    /// `x [T, H]` → (`conv(x, dyn[:,0], base[0])`, `dyn[:,1]` for [`finish`](Self::finish)).
    fn prepare(&self, x: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let h = self.base.len() / (2 * self.kernel);
        let t = x.len() / h;
        let per_side = self.kernel * (h / self.group);
        let mut dynamic = vec![0.0f32; t * 2 * per_side];
        matmul(&mut dynamic, x, &self.projection);
        // [T, 2, K, G] → the two sides, each [T, K, G].
        let (mut first, mut second) = (
            Vec::with_capacity(t * per_side),
            Vec::with_capacity(t * per_side),
        );
        for row in dynamic.chunks_exact(2 * per_side) {
            first.extend_from_slice(&row[..per_side]);
            second.extend_from_slice(&row[per_side..]);
        }
        let mut out = vec![0.0f32; x.len()];
        grouped_dynamic_conv(
            &mut out,
            x,
            &first,
            &self.base[..self.kernel * h],
            self.kernel,
            self.group,
        );
        (out, second)
    }

    fn finish(&self, y: &[f32], dynamic: &[f32]) -> Vec<f32> {
        let h = self.base.len() / (2 * self.kernel);
        let mut out = vec![0.0f32; y.len()];
        grouped_dynamic_conv(
            &mut out,
            y,
            dynamic,
            &self.base[self.kernel * h..],
            self.kernel,
            self.group,
        );
        out
    }
}

pub(crate) struct DraftLayer {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    q: Weight,
    k: Weight,
    v: Weight,
    o: Weight,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    gate: Weight,
    up: Weight,
    down: Weight,
    window: Option<usize>,
    /// DFlash2: around the attention and the MLP.
    convs: Option<(DynConv, DynConv)>,
}

/// A draft's weights as loaded (host memory): what every device runs from.
pub(crate) struct DraftWeights {
    config: DraftConfig,
    fc: Weight,
    hidden_norm: Vec<f32>,
    layers: Vec<DraftLayer>,
    norm: Vec<f32>,
    selector: Option<Selector>,
    rope: Rope,
}

/// A loaded DFlash or DFlash2 draft, placed on a device (the CPU until moved to its target's
/// GPU). It has no embedding or LM head: the target's are used.
pub struct DFlashDraft {
    weights: DraftWeights,
    device: Box<dyn DraftDevice>,
}

/// The tag that starts a saved [`DraftContext`] image (version 1).
const CONTEXT_IMAGE: &[u8; 8] = b"SPLDRFT1";

/// Per-sequence draft state: the context K/V of every draft layer (normed, rotated keys),
/// held by the draft's device.
pub struct DraftContext {
    /// Context rows appended so far (= the position of the next one).
    len: usize,
    layers: Box<dyn DeviceContext>,
}

impl std::fmt::Debug for DraftContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DraftContext({} rows, {} bytes)",
            self.len,
            self.memory_bytes()
        )
    }
}

/// A drafted block: the final-normed hidden rows of the proposals `[R, H]` and their scores
/// (with the draft's multiplier and softcap): a DFlash draft's logits `[R, V]`; a DFlash2
/// draft's candidates for its selector, `[R, k]` (id, logit) best first, and no logits (the
/// rows of a 248K vocabulary never leave the GPU).
pub struct DraftBlock {
    pub hidden: Vec<f32>,
    pub logits: Vec<f32>,
    pub candidates: Vec<(u32, f32)>,
}

impl DraftContext {
    /// Committed positions whose taps were appended.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True before any context row.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held.
    pub fn memory_bytes(&self) -> usize {
        self.layers.memory_bytes()
    }
}

impl DFlashDraft {
    /// Loads the draft checkpoint in `dir` (config.json + safetensors).
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let config = DraftConfig::from_dir(dir)?;
        let ck = Checkpoint::open(dir)?;
        Self::from_checkpoint(config, &ck)
    }

    fn from_checkpoint(config: DraftConfig, ck: &Checkpoint) -> Result<Self, ModelError> {
        // Saved from the bare draft module (no prefix), or wrapped (`model.`).
        let p = if ck.contains("fc.weight") {
            ""
        } else {
            "model."
        };
        let n = |rest: &str| format!("{p}{rest}");
        let c = &config;
        let (h, hq, hkv, d, i) = (
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.intermediate_size,
        );
        let taps = c.target_layer_ids.len();
        let vec = |name: &str, len: usize| -> Result<Vec<f32>, ModelError> {
            Ok(ck.get_shaped(&n(name), &[len])?.to_f32_vec())
        };
        let layers = c
            .windows
            .iter()
            .enumerate()
            .map(|(l, &window)| {
                let w = |rest: &str, shape: &[usize]| {
                    ck.get_shaped(&n(&format!("layers.{l}.{rest}")), shape)
                };
                let convs = match c.dflash2 {
                    None => None,
                    Some(d2) => {
                        let conv = |side: &str| -> Result<DynConv, ModelError> {
                            let groups = h / d2.conv_group;
                            Ok(DynConv {
                                base: w(&format!("{side}.base_kernel"), &[2, d2.conv_kernel, h])?
                                    .to_f32_vec(),
                                projection: w(
                                    &format!("{side}.kernel_projection.weight"),
                                    &[2 * d2.conv_kernel * groups, h],
                                )?,
                                kernel: d2.conv_kernel,
                                group: d2.conv_group,
                            })
                        };
                        Some((conv("attention_conv")?, conv("mlp_conv")?))
                    }
                };
                Ok(DraftLayer {
                    input_norm: vec(&format!("layers.{l}.input_layernorm.weight"), h)?,
                    post_norm: vec(&format!("layers.{l}.post_attention_layernorm.weight"), h)?,
                    q: w("self_attn.q_proj.weight", &[hq * d, h])?,
                    k: w("self_attn.k_proj.weight", &[hkv * d, h])?,
                    v: w("self_attn.v_proj.weight", &[hkv * d, h])?,
                    o: w("self_attn.o_proj.weight", &[h, hq * d])?,
                    q_norm: vec(&format!("layers.{l}.self_attn.q_norm.weight"), d)?,
                    k_norm: vec(&format!("layers.{l}.self_attn.k_norm.weight"), d)?,
                    gate: w("mlp.gate_proj.weight", &[i, h])?,
                    up: w("mlp.up_proj.weight", &[i, h])?,
                    down: w("mlp.down_proj.weight", &[h, i])?,
                    window,
                    convs,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let selector = match c.dflash2 {
            None => None,
            Some(d2) => Some(Selector::load(ck, p, c.vocab_size, h, d2)?),
        };
        let weights = DraftWeights {
            fc: ck.get_shaped(&n("fc.weight"), &[h, taps * h])?,
            hidden_norm: vec("hidden_norm.weight", h)?,
            norm: vec("norm.weight", h)?,
            layers,
            selector,
            rope: Rope::new(d, c.rope_theta),
            config,
        };
        Ok(Self {
            weights,
            device: Box::new(cpu::CpuDraft),
        })
    }

    /// Where the draft runs: `cpu`, or `cuda`.
    pub fn device(&self) -> &'static str {
        self.device.name()
    }

    /// The draft's hyper-parameters.
    pub fn config(&self) -> &DraftConfig {
        &self.weights.config
    }

    /// DFlash2's candidate selector (`None` for DFlash v1).
    pub fn selector(&self) -> Option<&Selector> {
        self.weights.selector.as_ref()
    }

    /// Quantises the draft's matrices (`fc`, the projections of every layer and of DFlash2's
    /// convolutions) to Q4_K, as the published drafts (BF16) are quantised on load for
    /// speed: a draft pass reads every weight once per block. Matrices whose rows are not
    /// whole 256-value blocks stay as stored. Call before [`to_gpu`](Self::to_gpu). Returns
    /// how many matrices changed.
    pub fn quantize_weights(&mut self) -> usize {
        let w = &mut self.weights;
        let mut changed = 0;
        let mut quantize = |w: &mut Weight| {
            if let Some(q) = w.to_q4_k() {
                *w = q;
                changed += 1;
            }
        };
        quantize(&mut w.fc);
        for l in &mut w.layers {
            for w in [
                &mut l.q,
                &mut l.k,
                &mut l.v,
                &mut l.o,
                &mut l.gate,
                &mut l.up,
                &mut l.down,
            ] {
                quantize(w);
            }
            if let Some((a, m)) = &mut l.convs {
                quantize(&mut a.projection);
                quantize(&mut m.projection);
            }
        }
        changed
    }

    /// Bytes of the weights as held (after any [`quantize_weights`](Self::quantize_weights))
    /// and of the context cached per committed token (f32 keys and values of every layer).
    pub fn memory(&self) -> (u64, u64) {
        let w = &self.weights;
        let c = &w.config;
        let floats = |v: &[f32]| 4 * v.len();
        let layers: usize = w
            .layers
            .iter()
            .map(|l| {
                let convs = l.convs.as_ref().map_or(0, |(a, m)| {
                    a.projection.raw_bytes().len()
                        + m.projection.raw_bytes().len()
                        + floats(&a.base)
                        + floats(&m.base)
                });
                [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]
                    .iter()
                    .map(|w| w.raw_bytes().len())
                    .sum::<usize>()
                    + floats(&l.input_norm)
                    + floats(&l.post_norm)
                    + floats(&l.q_norm)
                    + floats(&l.k_norm)
                    + convs
            })
            .sum();
        let selector = w.selector.as_ref().map_or(0, Selector::bytes);
        let weights =
            w.fc.raw_bytes().len() + floats(&w.hidden_norm) + floats(&w.norm) + layers + selector;
        let per_token = (w.layers.len() * 2 * c.num_kv_heads * c.head_dim * 4) as u64;
        (weights as u64, per_token)
    }

    /// Device memory its captured passes may hold for `lanes` sequences over `context` keys
    /// (0 on the CPU or with graphs off), for the memory plan.
    pub fn graph_memory(&self, lanes: usize, context: usize) -> u64 {
        self.device
            .graph_memory(&self.weights.config, lanes, context)
    }

    /// An empty per-sequence context, on the draft's device.
    pub fn new_context(&self) -> DraftContext {
        DraftContext {
            len: 0,
            layers: self.device.new_context(&self.weights),
        }
    }

    /// A copy of `ctx` (on the GPU, holding just its rows); fails instead of aborting when
    /// the device is out of memory.
    pub fn try_clone_context(&self, ctx: &DraftContext) -> Result<DraftContext, ModelError> {
        Ok(DraftContext {
            len: ctx.len,
            layers: ctx.layers.try_clone(ctx.len)?,
        })
    }

    /// `ctx` as bytes, the same whichever device holds it (for the prefix cache's disk tier).
    pub fn save_context(&self, ctx: &DraftContext) -> Result<Vec<u8>, ModelError> {
        let mut w = ImageWriter::new(CONTEXT_IMAGE);
        w.u64(ctx.len as u64);
        w.u64(self.weights.layers.len() as u64);
        for l in ctx.layers.layers(ctx.len)? {
            w.u64(l.pos0 as u64);
            w.f32s(&l.k);
            w.f32s(&l.v);
        }
        Ok(w.finish())
    }

    /// Reads a context saved by [`save_context`](Self::save_context) for this draft.
    pub fn load_context(&self, image: &[u8]) -> Result<DraftContext, ModelError> {
        let c = &self.weights.config;
        let row = c.num_kv_heads * c.head_dim;
        let mut r = ImageReader::new(image, CONTEXT_IMAGE)?;
        let len = r.u64("the length")? as usize;
        let n = r.u64("the layer count")? as usize;
        if n != self.weights.layers.len() {
            return Err(image_error(format!(
                "{n} draft layers, the draft has {}",
                self.weights.layers.len()
            )));
        }
        let mut layers = Vec::with_capacity(n);
        for _ in 0..n {
            let pos0 = r.u64("a layer's first position")? as usize;
            if pos0 > len {
                return Err(image_error(format!(
                    "a layer starts at position {pos0}, past the length {len}"
                )));
            }
            layers.push(ContextLayer {
                pos0,
                k: r.f32s((len - pos0) * row, "the context keys")?,
                v: r.f32s((len - pos0) * row, "the context values")?,
            });
        }
        r.end()?;
        Ok(DraftContext {
            len,
            layers: self.device.context_from_image(&self.weights, len, layers)?,
        })
    }

    /// Appends the taps `features` `[T, n·H]` of the next `T` committed positions.
    pub fn append_context(
        &self,
        ctx: &mut DraftContext,
        features: &[f32],
    ) -> Result<(), ModelError> {
        let t = features.len() / self.weights.fc.cols();
        if t == 0 {
            return Ok(());
        }
        self.device
            .append_context(&self.weights, &mut *ctx.layers, features, ctx.len)?;
        ctx.len += t;
        Ok(())
    }

    /// Drafts one block: `[anchor, MASK × (block-1)]` at positions `ctx.len()..`, returning
    /// the final-normed hidden states of the `block - 1` mask rows `[block-1, H]` (`ctx` ends
    /// unchanged). [`draft_block`](Self::draft_block) also scores them.
    pub fn forward(
        &self,
        ctx: &mut DraftContext,
        target: &Qwen35,
        anchor: u32,
        block: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let x = self.embed_block(target, anchor, block);
        let rows = self
            .device
            .draft(&self.weights, &mut *ctx.layers, target, &x, ctx.len, None)?;
        Ok(rows.hidden)
    }

    /// Drafts one block after the context (see [`forward`](Self::forward)) and scores it
    /// (see [`logits`](Self::logits)), on the GPU when the draft runs there.
    pub fn draft_block(
        &self,
        ctx: &mut DraftContext,
        target: &Qwen35,
        anchor: u32,
        block: usize,
    ) -> Result<DraftBlock, ModelError> {
        let x = self.embed_block(target, anchor, block);
        let top = self.weights.selector.as_ref().map(Selector::top_k);
        let DraftedRows {
            hidden,
            mut logits,
            candidates,
        } = self
            .device
            .draft(&self.weights, &mut *ctx.layers, target, &x, ctx.len, top)?;
        if !candidates.is_empty() {
            return Ok(DraftBlock {
                hidden,
                logits,
                candidates,
            });
        }
        // No selector, or one the device does not select for: scored here.
        self.shape_logits(&mut logits);
        Ok(self.scored(hidden, logits, block - 1))
    }

    /// A block of `slots` rows from its shaped logits: with a selector, its candidates (and
    /// no logits); without, the logits.
    fn scored(&self, hidden: Vec<f32>, logits: Vec<f32>, slots: usize) -> DraftBlock {
        match &self.weights.selector {
            Some(sel) => DraftBlock {
                candidates: sel.candidates(&logits, slots),
                hidden,
                logits: Vec::new(),
            },
            None => DraftBlock {
                hidden,
                logits,
                candidates: Vec::new(),
            },
        }
    }

    /// The block's input rows: `[anchor, MASK × (block-1)]` embedded by the target, scaled.
    fn embed_block(&self, target: &Qwen35, anchor: u32, block: usize) -> Vec<f32> {
        let c = &self.weights.config;
        let mut tokens = vec![c.mask_token_id; block];
        tokens[0] = anchor;
        let mut x = target.embed(&tokens);
        if c.input_embedding_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= c.input_embedding_scale);
        }
        x
    }

    /// Draft logits of hidden rows `[R, H]` through the target's LM head, with the draft's
    /// `output_multiplier` and softcap: `[R, V]`.
    pub fn logits(&self, target: &Qwen35, hidden: &[f32]) -> Vec<f32> {
        let mut logits = target.lm_head(hidden);
        self.shape_logits(&mut logits);
        logits
    }

    /// The draft's `output_multiplier` and softcap.
    fn shape_logits(&self, logits: &mut [f32]) {
        let c = &self.weights.config;
        if c.output_multiplier != 1.0 {
            logits.iter_mut().for_each(|l| *l *= c.output_multiplier);
        }
        if let Some(cap) = c.logit_softcap {
            logits.iter_mut().for_each(|l| *l = (*l / cap).tanh() * cap);
        }
    }
}
