//! The inputs of the memory plan, gathered from the loaded model, its draft and the flags.

use splash_engine::{prefill_chunk_for, MemoryPlan, PlanError, PlanInputs};
use splash_model::Model;

use crate::config::ServerConfig;
use crate::images::VisionMemory;

/// The plan for serving `model` with `config`, beside the vision tower's `vision` memory; an
/// error when it cannot serve one request.
pub fn plan(
    model: &Model,
    config: &ServerConfig,
    vision: VisionMemory,
) -> Result<MemoryPlan, Box<PlanError>> {
    let weights = model.weight_bytes;
    let (device, available) = match model.graph.device_memory() {
        // The weights are already on the GPU: they count as offered to this process. The
        // tower's weights are there too (not offered); its largest image's activations are
        // kept free.
        Some((free, _total)) => ("GPU memory", (free + weights).saturating_sub(vision.gpu)),
        // The tower's RAM is taken off what RAM offers.
        None => (
            "RAM",
            available_ram()
                .or(config.max_memory)
                .unwrap_or(u64::MAX)
                .saturating_sub(vision.ram),
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
        activations: c.activation_bytes(prefill_chunk_for(model)),
        graphs: model
            .graph
            .graph_memory(config.lanes, block.unwrap_or(1), context)
            + config
                .drafter
                .as_ref()
                .map_or(0, |d| d.graph_memory(config.lanes, context)),
        kv_bytes_per_token: c.kv_bytes_per_token(config.kv_format) as u64 + draft.per_token,
        state_bytes_per_sequence: c.state_bytes_per_sequence(block),
        native_context: c.max_position_embeddings,
        max_context: config.max_context,
        lanes: config.lanes,
        kv_format: format!("{:?}", config.kv_format).to_lowercase(),
    }
    .plan()
}

/// `MemAvailable` of /proc/meminfo: what new allocations can take without swapping.
fn available_ram() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
