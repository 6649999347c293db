//! What serving a model costs in memory besides its weights, from its architecture: the
//! memory plan (the server's) sizes the KV cache and the lanes with these.

use splash_backend::cpu::KvFormat;

use crate::config::{LayerKind, ModelConfig};

impl ModelConfig {
    /// KV-cache bytes per token: keys and values of every full-attention layer.
    pub fn kv_bytes_per_token(&self, kv: KvFormat) -> usize {
        self.layers_of(LayerKind::Full) * 2 * self.num_kv_heads * kv.row_bytes(self.head_dim)
    }

    /// Gated DeltaNet state of one sequence: the f32 recurrent state `[Hv, Dk, Dv]` and the
    /// conv window of every linear-attention layer. With speculation (`block`: the draft's
    /// block size), a verify pass also records what its rollback needs: a copy of that state
    /// and the block's conv inputs and gates (kept with the state on the GPU, made per pass on
    /// the CPU).
    pub fn state_bytes_per_sequence(&self, block: Option<usize>) -> u64 {
        let g = &self.gdn;
        let conv_channels = 2 * g.hk * g.dk + g.hv * g.dv;
        let state = g.hv * g.dk * g.dv + conv_channels * self.conv_kernel.saturating_sub(1);
        let record = block.map_or(0, |b| state + b * (conv_channels + 2 * g.hv));
        (self.layers_of(LayerKind::Linear) * 4 * (state + record)) as u64
    }

    /// Working buffers of a pass of `tokens` rows (the largest: a prefill chunk), estimated: a
    /// dozen hidden-sized rows, the MLP's (or the active experts') rows, the logits and the
    /// chunked GDN scan's prepared operands (per token and value head: a row of each of U, W
    /// and P), in f32.
    pub fn activation_bytes(&self, tokens: usize) -> u64 {
        let ffn = match &self.moe {
            Some(m) => m.expert_intermediate * m.experts_per_token + m.shared_intermediate,
            None => self.intermediate_size,
        };
        let g = &self.gdn;
        let gdn_chunked = g.hv * (g.dk + g.dv + 66);
        (tokens * 4 * (12 * self.hidden_size + 3 * ffn + self.vocab_size + gdn_chunked)) as u64
    }

    fn layers_of(&self, kind: LayerKind) -> usize {
        self.layer_kinds.iter().filter(|k| **k == kind).count()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn config() -> ModelConfig {
        let v = crate::config::tests::text_config();
        ModelConfig::from_value(Path::new("config.json"), &v).unwrap()
    }

    #[test]
    fn the_geometry_counts_each_layer_kind_once() {
        let c = config();
        // One attention layer: keys and values of 2 heads of 16 f32.
        assert_eq!(c.kv_bytes_per_token(KvFormat::F32), 2 * 2 * 16 * 4);
        // Per GDN layer: the state 4·8·8 and the conv window 3 × (2·2·8 + 4·8) = 448 values;
        // a verify record of 4 rows adds a copy of it and 4 × (64 conv inputs + 2·4 gates).
        assert_eq!(c.state_bytes_per_sequence(None), 3 * 4 * 448);
        assert_eq!(
            c.state_bytes_per_sequence(Some(4)),
            3 * 4 * (448 + 448 + 4 * 72)
        );
        // 12 hidden rows, 3 MLP rows, the logits and the chunked scan's 4 × (8 + 8 + 66).
        assert_eq!(
            c.activation_bytes(2),
            2 * 4 * (12 * 32 + 3 * 64 + 100 + 4 * 82)
        );
    }
}
