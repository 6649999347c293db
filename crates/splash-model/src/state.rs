//! Per-sequence decoding state: KV cache for attention layers, conv + recurrent state for GDN.

use splash_backend::cpu::{gdn_recurrent, GdnDims, KvFormat, KvStore};

use crate::config::{LayerKind, ModelConfig};

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
    /// `(kv heads, head dim)` of the attention layers: one cached row per token and kv head.
    kv_row: (usize, usize),
    /// How keys and values are stored.
    kv: KvFormat,
    /// The state on the GPU when the model runs there (allocated by the first forward pass;
    /// `layers` is then empty).
    #[cfg(feature = "cuda")]
    pub(crate) gpu: Option<crate::qwen35::cuda::GpuState>,
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
            kv_row: (config.num_kv_heads, config.head_dim),
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

    /// Bytes held by this state.
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
        let (kv_heads, head_dim) = self.kv_row;
        for (layer, replay) in self.layers.iter_mut().zip(&cp.gdn) {
            match (layer, replay) {
                (LayerState::Attn { k, v }, _) => {
                    k.truncate(end * kv_heads, head_dim);
                    v.truncate(end * kv_heads, head_dim);
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
