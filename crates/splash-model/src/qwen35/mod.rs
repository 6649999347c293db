//! The Qwen3.5 / 3.6 hybrid text model (dense and MoE): its weights, loaded once, and the
//! checks and bookkeeping of a forward pass; the pass itself runs on a device (`cpu.rs`, the
//! reference; `cuda/`).
//!
//! Skeleton (model-spec §2.2): embed → per layer `h += mixer(norm(h))`, `h += ffn(norm(h))`
//! where the mixer is Gated DeltaNet or gated full attention → final norm → LM head.

mod attention;
mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod device;
mod ffn;
mod gdn;
pub mod gguf;
mod positions;
pub(crate) mod state;

use splash_backend::cpu::{embedding, matmul_sums, KvFormat, Rope, Sums};
use splash_backend::Weight;

use crate::checkpoint::{Checkpoint, Format};
use crate::config::{LayerKind, ModelConfig, Quantization};
use crate::error::ModelError;
use attention::Attention;
use cpu::Cpu;
use device::{DeviceItem, TextDevice};
use ffn::Ffn;
use gdn::GatedDeltaNet;
pub use positions::ImageSpan;
use positions::{check_images, plan_rows};
use state::SequenceState;

/// One sequence's outputs of a forward pass.
#[derive(Debug, Default)]
pub struct PassOutput {
    /// The logits of the rows [`Logits`] asked for (`[V]` or `[T, V]`; empty for
    /// [`Logits::Argmax`]).
    pub logits: Vec<f32>,
    /// Each token's argmax, ties to the lower id ([`Logits::Argmax`] only; `[T]`).
    pub argmax: Vec<u32>,
    /// The tap layers' outputs `[T, taps · H]`.
    pub features: Vec<f32>,
}

/// One sequence's part of a batched forward pass ([`Qwen35::forward_batch`]).
pub struct BatchItem<'a> {
    pub state: &'a mut SequenceState,
    /// The tokens to run after the state's; may be empty.
    pub tokens: &'a [u32],
    /// The sequence's images, in order (those these tokens do not reach are ignored): their
    /// embedding rows replace the placeholder tokens they cover.
    pub images: &'a [ImageSpan],
}

impl<'a> BatchItem<'a> {
    /// Text tokens only.
    pub fn text(state: &'a mut SequenceState, tokens: &'a [u32]) -> Self {
        Self {
            state,
            tokens,
            images: &[],
        }
    }
}

/// Which rows of logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (prefill of a prompt chunk that is not the last).
    None,
    /// The last token's row only (`[V]`).
    Last,
    /// Every token's row (`[T, V]`, perplexity and verification).
    All,
    /// Every token's argmax only: greedy verification reads no row, so the GPU picks them
    /// on the device and downloads ids instead of `[T, V]` floats.
    Argmax,
}

enum Mixer {
    Linear(GatedDeltaNet),
    Full(Attention),
}

struct Layer {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    mixer: Mixer,
    ffn: Ffn,
}

/// The weights of a Qwen3.5-family text model as loaded (host memory, stored format): what
/// every device runs from.
pub(crate) struct Weights {
    config: ModelConfig,
    embed: Weight,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    lm_head: Weight,
    rope: Rope,
}

/// A loaded Qwen3.5-family text model, placed on a device (the CPU until moved).
pub struct Qwen35 {
    weights: Weights,
    device: Box<dyn TextDevice>,
}

/// The error for images sent to a model without an image token.
fn takes_no_images() -> ModelError {
    ModelError::Image("this model has no image_token_id in its config: it takes no images".into())
}

/// The layout of a checkpoint: tensor-name prefixes (`p` for the text model, `head` for
/// the LM head module), how norms are stored, and the weights' quantisation.
pub(crate) struct Names {
    p: String,
    head: String,
    /// Added to RMSNorm weights: HF stores zero-centred `w` (used as `1 + w`), MLX and GGUF
    /// store `1 + w` already (model-spec §0.1-0.2).
    norm_shift: f32,
    quant: Option<Quantization>,
}

impl Names {
    fn detect(ck: &Checkpoint, config: &ModelConfig) -> Result<Self, ModelError> {
        let quant = config.quantization.clone();
        if ck.format() == Format::Gguf {
            // Renamed to HF names at open; norms are stored shifted, like MLX.
            return Ok(Self {
                p: "model.".to_string(),
                head: "lm_head".to_string(),
                norm_shift: 0.0,
                quant,
            });
        }
        for p in ["model.language_model.", "model."] {
            if ck.contains(&format!("{p}embed_tokens.weight")) {
                return Ok(Self {
                    p: p.to_string(),
                    head: "lm_head".to_string(),
                    norm_shift: 1.0,
                    quant,
                });
            }
        }
        if ck.contains("language_model.model.embed_tokens.weight") {
            return Ok(Self {
                p: "language_model.model.".to_string(),
                head: "language_model.lm_head".to_string(),
                norm_shift: 0.0,
                quant,
            });
        }
        Err(ModelError::MissingTensor {
            name: "model.language_model.embed_tokens.weight (or model.embed_tokens.weight, or MLX language_model.model.embed_tokens.weight)".into(),
            dir: ck.dir().to_path_buf(),
        })
    }

    fn layer(&self, i: usize, rest: &str) -> String {
        format!("{}layers.{i}.{rest}", self.p)
    }

    /// The weight of a linear (or embedding) module: quantised when the checkpoint has
    /// `{module}.scales`, else a float tensor `{module}.weight` of `shape`.
    fn linear(&self, ck: &Checkpoint, module: &str, shape: &[usize]) -> Result<Weight, ModelError> {
        if !ck.contains(&format!("{module}.scales")) {
            return ck.get_shaped(&format!("{module}.weight"), shape);
        }
        let q = self.quant.as_ref().ok_or_else(|| {
            ModelError::config(
                ck.dir().join("config.json"),
                format!("`{module}` is quantised (it has .scales) but config.json has no `quantization` with bits and group_size"),
            )
        })?;
        let (bits, group) = q.for_module(module);
        ck.get_affine(module, shape, bits, group)
    }

    /// An RMSNorm weight as the forward pass uses it (`1 + w` for HF checkpoints).
    fn norm(&self, ck: &Checkpoint, name: &str, dim: usize) -> Result<Vec<f32>, ModelError> {
        let shift = self.norm_shift;
        Ok(ck
            .get_shaped(name, &[dim])?
            .to_f32_vec()
            .into_iter()
            .map(|w| shift + w)
            .collect())
    }
}

impl Qwen35 {
    /// Binds the checkpoint's tensors to the graph, checking every shape.
    pub fn load(config: &ModelConfig, ck: &Checkpoint) -> Result<Self, ModelError> {
        let names = Names::detect(ck, config)?;
        let (v, h) = (config.vocab_size, config.hidden_size);
        let embed = names.linear(ck, &format!("{}embed_tokens", names.p), &[v, h])?;
        let lm_head = if config.tie_word_embeddings {
            embed.clone()
        } else {
            names.linear(ck, &names.head, &[v, h])?
        };
        let layers = config
            .layer_kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| {
                Ok(Layer {
                    input_norm: names.norm(ck, &names.layer(i, "input_layernorm.weight"), h)?,
                    post_norm: names.norm(
                        ck,
                        &names.layer(i, "post_attention_layernorm.weight"),
                        h,
                    )?,
                    mixer: match kind {
                        LayerKind::Linear => {
                            Mixer::Linear(GatedDeltaNet::load(config, ck, &names, i)?)
                        }
                        LayerKind::Full => Mixer::Full(Attention::load(config, ck, &names, i)?),
                    },
                    ffn: Ffn::load(config, ck, &names, i)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self {
            weights: Weights {
                config: config.clone(),
                embed,
                layers,
                final_norm: names.norm(ck, &format!("{}norm.weight", names.p), h)?,
                lm_head,
                rope: Rope::new(config.rotary_dim, config.rope_theta)
                    .with_section(config.mrope_section),
            },
            device: Box::new(Cpu),
        })
    }

    /// Where the forward pass runs: `cpu`, or `cuda (NAME)`.
    pub fn device(&self) -> String {
        self.device.name()
    }

    /// Free and total memory of the GPU the graph runs on; `None` on the CPU.
    pub fn device_memory(&self) -> Option<(u64, u64)> {
        self.device.memory()
    }

    /// Device memory the CUDA graphs of captured passes may hold, for `lanes` sequences
    /// verifying blocks of `rows` tokens over `context` keys (0 on the CPU).
    pub fn graph_memory(&self, lanes: usize, rows: usize, context: usize) -> u64 {
        self.device
            .graph_memory(&self.weights.config, lanes, rows, context)
    }

    /// With `SPLASH_GPU_PROFILE` on a GPU: every kernel launched so far, its launches and
    /// seconds (see `Gpu::profile_table`); `None` otherwise.
    pub fn gpu_profile(&self) -> Option<Vec<splash_backend::profile::ProfileRow>> {
        self.device.profile()
    }

    /// Starts a timeline of the device's launches (`SPLASH_TIMELINE` on a GPU; else nothing):
    /// whether they are timed.
    pub fn gpu_timeline_reset(&self) -> Result<bool, ModelError> {
        self.device.timeline_reset()
    }

    /// The device's launches since [`gpu_timeline_reset`](Self::gpu_timeline_reset) as they ran
    /// (see `Gpu::timeline`); `None` where they are not timed.
    pub fn gpu_timeline(
        &self,
    ) -> Result<Option<Result<Vec<splash_backend::timeline::Span>, String>>, ModelError> {
        self.device.timeline()
    }

    /// Waits for the work queued on the device (a no-op on the CPU): timings end here.
    pub fn synchronize(&self) -> Result<(), ModelError> {
        self.device.synchronize()
    }

    /// The architecture this graph was built for.
    pub fn config(&self) -> &ModelConfig {
        &self.weights.config
    }

    /// A fresh per-sequence state with an exact (f32) KV cache: the reference, used by the
    /// tests against transformers.
    pub fn new_state(&self) -> SequenceState {
        self.new_state_with(KvFormat::F32)
    }

    /// A fresh per-sequence state whose KV cache is stored as `kv`, on this model's device.
    pub fn new_state_with(&self, kv: KvFormat) -> SequenceState {
        SequenceState::new(0, 0, kv, self.device.new_state(&self.weights.config, kv))
    }

    /// A state saved by [`SequenceState::save_image`] (on any device), placed where this
    /// model runs. Fails when the image does not parse or does not fit this model.
    pub fn load_state(&self, image: &[u8]) -> Result<SequenceState, ModelError> {
        let cfg = &self.weights.config;
        let parsed = SequenceState::parse_image(cfg, image)?;
        let (len, kv) = (parsed.len, parsed.kv);
        let layers = self.device.state_from_image(cfg, len, kv, parsed.layers)?;
        Ok(SequenceState::new(len, parsed.rotary_shift, kv, layers))
    }

    /// Number of parameters of the text model (tied embeddings counted once).
    pub fn num_parameters(&self) -> usize {
        // Derived from shapes rather than stored: cheap and always in sync with the weights.
        let w = &self.weights;
        let mut n = w.embed.len() + w.final_norm.len();
        if !w.config.tie_word_embeddings {
            n += w.lm_head.len();
        }
        for l in &w.layers {
            n += l.input_norm.len() + l.post_norm.len() + l.ffn.num_parameters();
            n += match &l.mixer {
                Mixer::Linear(g) => g.num_parameters(),
                Mixer::Full(a) => a.num_parameters(),
            };
        }
        n
    }

    /// Runs `tokens` through the model after the `state.len()` tokens already in `state`,
    /// advancing it. Returns logits as selected by `want` (`[V]` or `[T, V]`; empty for
    /// [`Logits::Argmax`], whose ids [`forward_with_taps`](Self::forward_with_taps) returns).
    pub fn forward(
        &self,
        state: &mut SequenceState,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        Ok(self.forward_with_taps(state, tokens, want, &[])?.logits)
    }

    /// [`forward`](Self::forward) that also returns the hidden states leaving the decoder
    /// layers listed in `taps` (0-based; transformers' `hidden_states[l + 1]`), concatenated
    /// per token in the listed order: `[T, taps.len() · H]` (the DFlash context features).
    pub fn forward_with_taps(
        &self,
        state: &mut SequenceState,
        tokens: &[u32],
        want: Logits,
        taps: &[usize],
    ) -> Result<PassOutput, ModelError> {
        let mut out = self.forward_batch(&mut [BatchItem::text(state, tokens)], want, taps)?;
        Ok(out.pop().expect("one output per item"))
    }

    /// [`forward_with_taps`](Self::forward_with_taps) for several sequences in one pass:
    /// every linear layer reads its weights once for the rows of all of them (batched decode),
    /// while the conv, scan and attention of each run on its own state. Returns each item's
    /// logits and taps, in order.
    pub fn forward_batch(
        &self,
        items: &mut [BatchItem<'_>],
        want: Logits,
        taps: &[usize],
    ) -> Result<Vec<PassOutput>, ModelError> {
        let cfg = &self.weights.config;
        // Drafts are validated against the target when paired (dflash::DraftConfig::check).
        assert!(
            taps.iter().all(|&l| l < cfg.num_layers()),
            "tap layers {taps:?} beyond the model's {} layers",
            cfg.num_layers()
        );
        for item in items.iter() {
            if let Some(&id) = item
                .tokens
                .iter()
                .find(|&&id| id as usize >= cfg.vocab_size)
            {
                return Err(ModelError::TokenOutOfRange {
                    id,
                    vocab: cfg.vocab_size,
                });
            }
            let needed = item.state.len() + item.tokens.len();
            if needed > cfg.max_position_embeddings {
                return Err(ModelError::ContextOverflow {
                    needed,
                    limit: cfg.max_position_embeddings,
                });
            }
        }
        let mut result: Vec<PassOutput> = items.iter().map(|_| Default::default()).collect();
        let mut which = Vec::new();
        let mut running = Vec::new();
        let mut shifts = Vec::new();
        for (i, item) in items.iter_mut().enumerate() {
            if item.tokens.is_empty() {
                continue;
            }
            let (pos0, record) = (item.state.len(), item.state.is_checkpointed());
            check_images(item.images, cfg.hidden_size)?;
            let plan = plan_rows(
                pos0,
                item.tokens.len(),
                item.state.rotary_shift(),
                item.images,
                cfg.hidden_size,
            );
            self.check_placeholders(item.tokens, pos0, &plan.embedded)?;
            if record && !plan.embedded.is_empty() {
                return Err(ModelError::Image(
                    "a speculative (checkpointed) pass cannot hold image rows".into(),
                ));
            }
            which.push(i);
            shifts.push(plan.shift_after);
            running.push(DeviceItem {
                state: item.state.layers_mut(),
                tokens: item.tokens,
                pos0,
                rotary: plan.rotary,
                embedded: plan.embedded,
                record,
            });
        }
        if running.is_empty() {
            return Ok(result);
        }
        let outs = self
            .device
            .forward(&self.weights, &mut running, want, taps)?;
        drop(running);
        for ((i, out), shift) in which.into_iter().zip(outs).zip(shifts) {
            items[i].state.advance(items[i].tokens.len(), shift);
            result[i] = out;
        }
        Ok(result)
    }

    /// Checks a whole prompt's images before any pass: in order, inside `tokens`, one
    /// embedding row per token, each over a run of this model's image placeholder token.
    pub fn check_prompt_images(
        &self,
        tokens: &[u32],
        images: &[ImageSpan],
    ) -> Result<(), ModelError> {
        let cfg = &self.weights.config;
        if images.is_empty() {
            return Ok(());
        }
        if cfg.image_token_id.is_none() {
            return Err(takes_no_images());
        }
        check_images(images, cfg.hidden_size)?;
        if let Some(last) = images.last().filter(|i| i.end() > tokens.len()) {
            return Err(ModelError::Image(format!(
                "an image covers tokens {}..{} of a {}-token prompt: images must be inside the prompt",
                last.start,
                last.end(),
                tokens.len()
            )));
        }
        let embedded: Vec<(usize, &[f32])> = images
            .iter()
            .map(|i| (i.start, &i.embeddings[..]))
            .collect();
        self.check_placeholders(tokens, 0, &embedded)
    }

    /// Image rows must hold the image placeholder token. A placeholder without an image (the
    /// model's own output, or text the server did not take for an image) runs as its plain
    /// embedding, as in transformers.
    /// `tokens` follow `pos0` tokens of the sequence; `embedded` rows index `tokens`.
    fn check_placeholders(
        &self,
        tokens: &[u32],
        pos0: usize,
        embedded: &[(usize, &[f32])],
    ) -> Result<(), ModelError> {
        if embedded.is_empty() {
            return Ok(());
        }
        let Some(pad) = self.weights.config.image_token_id else {
            return Err(takes_no_images());
        };
        let h = self.weights.config.hidden_size;
        for &(row, values) in embedded {
            if let Some(r) = (row..row + values.len() / h).find(|&r| tokens[r] != pad) {
                return Err(ModelError::Image(format!(
                    "token {} of the sequence is {}, but an image covers it: image rows must \
                     hold the placeholder {pad}",
                    pos0 + r,
                    tokens[r],
                )));
            }
        }
        Ok(())
    }

    /// Token embeddings `[T, H]` (the DFlash draft embeds its block with them).
    pub fn embed(&self, tokens: &[u32]) -> Vec<f32> {
        self.weights.embed(tokens)
    }

    /// The LM head over already-normed hidden rows `[T, H]` → logits `[T, V]` (the DFlash
    /// draft scores its proposals with it).
    pub fn lm_head(&self, hidden: &[f32]) -> Vec<f32> {
        self.weights.lm_head(hidden, Sums::Tiled)
    }
}

impl Weights {
    /// Token embeddings `[T, H]`.
    pub(crate) fn embed(&self, tokens: &[u32]) -> Vec<f32> {
        let mut x = vec![0.0f32; tokens.len() * self.config.hidden_size];
        embedding(&mut x, &self.embed, tokens);
        x
    }

    /// The LM head over normed hidden rows `[T, H]` → logits `[T, V]`, on the CPU.
    pub(crate) fn lm_head(&self, hidden: &[f32], sums: Sums) -> Vec<f32> {
        let mut logits =
            vec![0.0f32; hidden.len() / self.config.hidden_size * self.config.vocab_size];
        matmul_sums(&mut logits, hidden, &self.lm_head, sums);
        logits
    }
}
