//! Per-sequence decoding state: KV cache for attention layers, conv + recurrent state for GDN.

use splash_backend::cpu::{gdn_recurrent, GdnDims, KvFormat, KvStore};

use crate::config::{LayerKind, ModelConfig};
use crate::image::{bad, ImageReader, ImageWriter};
use crate::ModelError;

/// The tag that starts a saved [`SequenceState`] image (version 1).
const STATE_IMAGE: &[u8; 8] = b"SPLSTAT1";

/// The state of one layer for one sequence.
#[derive(Clone, Debug)]
pub(crate) enum LayerState {
    /// Last `K-1` conv inputs `[K-1, conv_dim]` and the f32 recurrent state `[Hv, dk, dv]`.
    Gdn { conv: Vec<f32>, recurrent: Vec<f32> },
    /// Keys (after norm and RoPE) and values, `[len, Hkv, head_dim]` each.
    Attn { k: KvStore, v: KvStore },
}

/// Everything one sequence carries between forward passes.
#[derive(Clone, Debug)]
pub struct SequenceState {
    pub(crate) layers: Vec<LayerState>,
    len: usize,
    /// Set by [`SequenceState::checkpoint`]: the next forward pass records what
    /// [`SequenceState::rollback`] needs.
    pub(crate) checkpoint: Option<Checkpoint>,
    /// KV heads of the attention layers: one cached row per token and kv head.
    kv_heads: usize,
    /// How keys and values are stored.
    kv: KvFormat,
    /// The state on the GPU when the model runs there (allocated by the first forward pass;
    /// `layers` is then empty).
    #[cfg(feature = "cuda")]
    pub(crate) gpu: Option<crate::qwen35::cuda::GpuState>,
}

/// One layer of a saved state image, checked against the model's shapes.
pub(crate) enum LayerImage<'a> {
    Gdn {
        conv: Vec<f32>,
        recurrent: Vec<f32>,
    },
    /// Keys and values as stored (`[len, hkv, d]` in the KV format) and their int8 row scales.
    Attn {
        k: &'a [u8],
        ks: Vec<f32>,
        v: &'a [u8],
        vs: Vec<f32>,
    },
}

fn kv_code(kv: KvFormat) -> u64 {
    match kv {
        KvFormat::F32 => 0,
        KvFormat::Bf16 => 1,
        KvFormat::Int8 => 2,
    }
}

/// The point a speculative verify pass started from (model-spec §2.6, variant (a)).
#[derive(Clone, Debug)]
pub(crate) struct Checkpoint {
    /// Tokens in the state before the pass.
    start: usize,
    /// Per layer (`None` for attention layers, and for GDN layers until the pass ran).
    pub(crate) gdn: Vec<Option<GdnReplay>>,
}

/// A GDN layer's state before a verify pass and the pass's scan inputs: enough to rebuild
/// the state after any prefix of the pass by replaying the recurrence.
#[derive(Clone, Debug)]
pub(crate) struct GdnReplay {
    /// Conv state `[K-1, C]` and recurrent state `[Hv, dk, dv]` before the pass.
    pub(crate) conv: Vec<f32>,
    pub(crate) recurrent: Vec<f32>,
    /// Conv inputs of the pass `[T, C]` (the `in_proj_qkv` rows).
    pub(crate) qkv: Vec<f32>,
    /// Scan inputs of the pass, as `gdn_recurrent` takes them.
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    pub(crate) g: Vec<f32>,
    pub(crate) beta: Vec<f32>,
    pub(crate) dims: GdnDims,
}

impl GdnReplay {
    /// The conv and recurrent state after the first `keep` tokens of the pass.
    fn state_after(&self, keep: usize, conv: &mut [f32], recurrent: &mut [f32]) {
        let GdnDims { hk, hv, dk, dv, .. } = self.dims;
        let c = self.qkv.len() / (self.g.len() / hv);
        // conv state = the last K-1 rows of [old state | qkv[..keep]].
        let mut ext = self.conv.clone();
        ext.extend_from_slice(&self.qkv[..keep * c]);
        conv.copy_from_slice(&ext[keep * c..]);
        recurrent.copy_from_slice(&self.recurrent);
        let mut out = vec![0.0f32; keep * hv * dv];
        gdn_recurrent(
            &mut out,
            &self.q[..keep * hk * dk],
            &self.k[..keep * hk * dk],
            &self.v[..keep * hv * dv],
            &self.g[..keep * hv],
            &self.beta[..keep * hv],
            recurrent,
            self.dims,
        );
    }
}

impl SequenceState {
    /// A fresh state (zero conv and recurrent state, empty caches) for `config`, with keys
    /// and values stored as `kv`.
    pub fn new(config: &ModelConfig, kv: KvFormat) -> Self {
        let layers = config
            .layer_kinds
            .iter()
            .map(|kind| match kind {
                LayerKind::Linear => LayerState::Gdn {
                    conv: vec![0.0; (config.conv_kernel - 1) * config.conv_dim()],
                    recurrent: vec![0.0; config.gdn.state_len()],
                },
                LayerKind::Full => LayerState::Attn {
                    k: KvStore::new(kv),
                    v: KvStore::new(kv),
                },
            })
            .collect();
        Self {
            layers,
            len: 0,
            checkpoint: None,
            kv_heads: config.num_kv_heads,
            kv,
            #[cfg(feature = "cuda")]
            gpu: None,
        }
    }

    /// A state whose layers live on a device (allocated by the first forward pass).
    #[cfg(feature = "cuda")]
    pub(crate) fn on_device(config: &ModelConfig, kv: KvFormat) -> Self {
        Self {
            layers: Vec::new(),
            ..Self::new(
                &ModelConfig {
                    layer_kinds: Vec::new(),
                    ..config.clone()
                },
                kv,
            )
        }
    }

    /// A copy of this state (on the GPU, holding just its tokens' cache rows); fails instead of
    /// aborting when the device is out of memory.
    pub fn try_clone(&self) -> Result<Self, ModelError> {
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.gpu {
            return Ok(Self {
                gpu: Some(g.try_clone(self.len)?),
                layers: Vec::new(),
                checkpoint: None,
                ..*self
            });
        }
        Ok(self.clone())
    }

    /// The state as bytes, the same whichever device holds it (for the prefix cache's disk
    /// tier); [`Qwen35::load_state`](crate::Qwen35::load_state) reads it back.
    pub fn save_image(&self) -> Result<Vec<u8>, ModelError> {
        let mut w = ImageWriter::new(STATE_IMAGE);
        w.u64(self.len as u64);
        w.u64(kv_code(self.kv));
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.gpu {
            g.save_image(&mut w, self.len)?;
            return Ok(w.finish());
        }
        w.u64(self.layers.len() as u64);
        for layer in &self.layers {
            match layer {
                LayerState::Gdn { conv, recurrent } => {
                    w.u64(0);
                    w.f32s(conv);
                    w.f32s(recurrent);
                }
                LayerState::Attn { k, v } => {
                    w.u64(1);
                    for store in [k, v] {
                        let (bytes, scales) = store.raw();
                        w.bytes(&bytes);
                        w.f32s(&scales);
                    }
                }
            }
        }
        Ok(w.finish())
    }

    /// Reads an image written by [`save_image`](Self::save_image) for a model of `config`:
    /// the layers, lengths and KV format must match, or the image is refused.
    pub(crate) fn parse_image<'a>(
        config: &ModelConfig,
        image: &'a [u8],
    ) -> Result<(usize, KvFormat, Vec<LayerImage<'a>>), ModelError> {
        let mut r = ImageReader::new(image, STATE_IMAGE)?;
        let len = r.u64("the length")? as usize;
        if len > config.max_position_embeddings.max(1 << 24) {
            return Err(bad(format!("a length of {len} tokens is beyond the model")));
        }
        let kv = match r.u64("the KV format")? {
            0 => KvFormat::F32,
            1 => KvFormat::Bf16,
            2 => KvFormat::Int8,
            other => return Err(bad(format!("unknown KV format code {other}"))),
        };
        let n = r.u64("the layer count")? as usize;
        if n != config.layer_kinds.len() {
            return Err(bad(format!(
                "{n} layers, the model has {}",
                config.layer_kinds.len()
            )));
        }
        let rows = len * config.num_kv_heads;
        let kv_bytes = rows * config.head_dim * kv.value_bytes();
        let scales = if kv == KvFormat::Int8 { rows } else { 0 };
        let layers = config
            .layer_kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| {
                let code = r.u64("a layer kind")?;
                Ok(match (kind, code) {
                    (LayerKind::Linear, 0) => LayerImage::Gdn {
                        conv: r
                            .f32s((config.conv_kernel - 1) * config.conv_dim(), "a conv state")?,
                        recurrent: r.f32s(config.gdn.state_len(), "a recurrent state")?,
                    },
                    (LayerKind::Full, 1) => LayerImage::Attn {
                        k: r.bytes(kv_bytes, "the keys")?,
                        ks: r.f32s(scales, "the key scales")?,
                        v: r.bytes(kv_bytes, "the values")?,
                        vs: r.f32s(scales, "the value scales")?,
                    },
                    _ => return Err(bad(format!("layer {i} is of another kind"))),
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        r.end()?;
        Ok((len, kv, layers))
    }

    /// A CPU state from a parsed image.
    pub(crate) fn from_image(
        config: &ModelConfig,
        len: usize,
        kv: KvFormat,
        layers: Vec<LayerImage<'_>>,
    ) -> Self {
        let mut state = Self::new(config, kv);
        state.len = len;
        state.layers = layers
            .into_iter()
            .map(|l| match l {
                LayerImage::Gdn { conv, recurrent } => LayerState::Gdn { conv, recurrent },
                LayerImage::Attn { k, ks, v, vs } => LayerState::Attn {
                    k: KvStore::from_raw(kv, k, &ks, config.head_dim),
                    v: KvStore::from_raw(kv, v, &vs, config.head_dim),
                },
            })
            .collect();
        state
    }

    /// How keys and values are stored.
    pub fn kv_format(&self) -> KvFormat {
        self.kv
    }

    /// Tokens consumed so far (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The KV pages this state holds, as (identity, bytes): copies of a state share them
    /// (see `KvStore::pages`), so a holder of several copies counts each page once. None on a
    /// GPU (its layers live in `gpu`), whose caches are whole buffers.
    pub fn kv_pages(&self) -> Vec<(usize, usize)> {
        let mut pages = Vec::new();
        for layer in &self.layers {
            if let LayerState::Attn { k, v } = layer {
                pages.extend(k.pages().chain(v.pages()));
            }
        }
        pages
    }

    /// Bytes held by this state (shared KV pages included).
    pub fn memory_bytes(&self) -> usize {
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.gpu {
            return g.bytes();
        }
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Gdn { conv, recurrent } => (conv.len() + recurrent.len()) * 4,
                LayerState::Attn { k, v } => k.bytes() + v.bytes(),
            })
            .sum()
    }

    pub(crate) fn advance(&mut self, tokens: usize) {
        self.len += tokens;
    }

    /// Marks the current length: the next forward pass (a speculative verify) records what a
    /// [`rollback`](Self::rollback) into it needs.
    pub fn checkpoint(&mut self) {
        self.checkpoint = Some(Checkpoint {
            start: self.len,
            gdn: vec![None; self.layers.len()],
        });
    }

    /// Keeps the first `keep` tokens of the pass run since [`checkpoint`](Self::checkpoint)
    /// and forgets the rest: the KV cache is truncated, the GDN conv and recurrent state are
    /// rebuilt by replaying the recurrence over the kept tokens (model-spec §2.6 (a)). Ends
    /// the checkpoint; a no-op without one.
    pub fn rollback(&mut self, keep: usize) -> Result<(), crate::ModelError> {
        let Some(cp) = self.checkpoint.take() else {
            return Ok(());
        };
        let ran = self.len - cp.start;
        assert!(
            keep <= ran,
            "cannot keep {keep} of the {ran} tokens of the pass"
        );
        let end = cp.start + keep;
        #[cfg(feature = "cuda")]
        if let Some(g) = &mut self.gpu {
            g.rollback(keep, ran)?;
            self.len = end;
            return Ok(());
        }
        if keep == ran {
            return Ok(());
        }
        let kv_heads = self.kv_heads;
        for (layer, replay) in self.layers.iter_mut().zip(&cp.gdn) {
            match (layer, replay) {
                (LayerState::Attn { k, v }, _) => {
                    k.truncate(end * kv_heads);
                    v.truncate(end * kv_heads);
                }
                (LayerState::Gdn { conv, recurrent }, Some(r)) => {
                    r.state_after(keep, conv, recurrent)
                }
                (LayerState::Gdn { .. }, None) => {
                    unreachable!("a GDN layer ran without recording its replay")
                }
            }
        }
        self.len = end;
        Ok(())
    }
}
