//! Per-sequence decoding state: KV cache for attention layers, conv + recurrent state for GDN.

use splash_backend::cpu::{KvFormat, KvStore};

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
        Self { layers, len: 0 }
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
}
