//! The inputs of the memory plan, gathered from the loaded model, its draft and the flags.

use splash_engine::{prefill_chunk_for, MemoryPlan, PlanError, PlanInputs};
use splash_model::{KvFormat, LayerKind, Model};

use crate::config::ServerConfig;

/// The plan for serving `model` with `config`; an error when it cannot serve one request.
pub fn plan(model: &Model, config: &ServerConfig) -> Result<MemoryPlan, Box<PlanError>> {
    let weights = model.weight_bytes;
    let (device, available) = match model.graph.device_memory() {
        // The weights are already on the GPU: they count as offered to this process.
        Some((free, _total)) => ("GPU memory", free + weights),
        None => (
            "RAM",
            available_ram().or(config.max_memory).unwrap_or(u64::MAX),
        ),
    };
    let draft = config
        .drafter
        .as_ref()
        .map(|d| d.memory())
        .unwrap_or_default();
    let c = &model.config;
    let block = config.drafter.as_ref().map(|d| d.block_size());
    let context = config.max_context.map_or(c.max_position_embeddings, |m| {
        m.min(c.max_position_embeddings)
    });
    PlanInputs {
        device: device.to_string(),
        available,
        max_memory: config.max_memory,
        weights,
        draft_weights: draft.weights,
        activations: activation_bytes(model),
        graphs: model
            .graph
            .graph_memory(config.lanes, block.unwrap_or(1), context)
            + config
                .drafter
                .as_ref()
                .map_or(0, |d| d.graph_memory(config.lanes, context)),
        kv_bytes_per_token: kv_bytes_per_token(model, config.kv_format) as u64 + draft.per_token,
        state_bytes_per_sequence: state_bytes_per_sequence(model, block),
        native_context: c.max_position_embeddings,
        max_context: config.max_context,
        lanes: config.lanes,
        kv_format: format!("{:?}", config.kv_format).to_lowercase(),
    }
    .plan()
}

/// KV-cache bytes per token: keys and values of every full-attention layer.
pub fn kv_bytes_per_token(model: &Model, kv: KvFormat) -> usize {
    let c = &model.config;
    let layers = c
        .layer_kinds
        .iter()
        .filter(|k| **k == LayerKind::Full)
        .count();
    layers * 2 * c.num_kv_heads * kv.row_bytes(c.head_dim)
}

/// Gated DeltaNet state of one sequence: the f32 recurrent state `[Hv, Dk, Dv]` and the conv
/// window of every linear-attention layer. With speculation (`block`: the draft's block size),
/// a verify pass also records what its rollback needs: a copy of that state and the block's
/// conv inputs and gates (kept with the state on the GPU, made per pass on the CPU).
fn state_bytes_per_sequence(model: &Model, block: Option<usize>) -> u64 {
    let c = &model.config;
    let g = &c.gdn;
    let layers = c
        .layer_kinds
        .iter()
        .filter(|k| **k == LayerKind::Linear)
        .count();
    let conv_channels = 2 * g.hk * g.dk + g.hv * g.dv;
    let state = g.hv * g.dk * g.dv + conv_channels * c.conv_kernel.saturating_sub(1);
    let record = block.map_or(0, |b| state + b * (conv_channels + 2 * g.hv));
    (layers * 4 * (state + record)) as u64
}

/// Working buffers of the largest pass (a prefill chunk), estimated: a dozen hidden-sized
/// rows, the MLP's (or the active experts') rows, the logits and the chunked GDN scan's
/// prepared operands (per token and value head: a row of each of U, W and P), in f32.
fn activation_bytes(model: &Model) -> u64 {
    let c = &model.config;
    let ffn = match &c.moe {
        Some(m) => m.expert_intermediate * m.experts_per_token + m.shared_intermediate,
        None => c.intermediate_size,
    };
    let g = &c.gdn;
    let gdn_chunked = g.hv * (g.dk + g.dv + 66);
    (prefill_chunk_for(model) * 4 * (12 * c.hidden_size + 3 * ffn + c.vocab_size + gdn_chunked))
        as u64
}

/// `MemAvailable` of /proc/meminfo: what new allocations can take without swapping.
fn available_ram() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
