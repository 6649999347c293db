//! Passes replayed from captured CUDA graphs: the key a pass is captured under, the
//! capture, and the replay.

use super::*;

/// Captured passes kept per model (most recently used first): one per kind of pass (decode,
/// verify) and set of sequences that run together.
pub(super) const PASS_GRAPHS: usize = 8;

/// The most tokens per sequence of a pass replayed from a graph (a verify block; longer
/// passes are prefill chunks, whose launches cost little beside their work).
const GRAPH_MAX_TOKENS: usize = 32;

/// A captured pass over some sequences' buffers (kept under a key: what was scored and
/// tapped, then per sequence its token count, whether it recorded, and its buffers' addresses
/// and sizes). Each replay reads the tokens' embeddings from `input` and the first positions
/// from `pos`, and leaves the scored rows' logits in `logits` (their argmax ids in `argmax`
/// instead, for [`Logits::Argmax`]) and the tap outputs in `features`.
pub(super) struct PassGraph {
    graph: dev::Graph,
    input: Buf,
    pos: CudaSlice<i32>,
    logits: Buf,
    argmax: CudaSlice<i32>,
    features: Buf,
}

impl GpuModel {
    /// Device memory the captured passes may hold (0 with graphs off): [`PASS_GRAPHS`] passes
    /// of `lanes` sequences of `rows` tokens (a verify block; decoding is 1), each keeping its
    /// input, logits and taps and owning the peak of its working buffers: hidden-sized rows,
    /// the MLP's (or active experts') rows, and the split attention's partial sums over
    /// `context` keys.
    pub(crate) fn graph_memory(
        &self,
        cfg: &ModelConfig,
        lanes: usize,
        rows: usize,
        context: usize,
    ) -> u64 {
        if !self.gpu.graphs() {
            return 0;
        }
        let rows = lanes.max(1) * rows.clamp(1, GRAPH_MAX_TOKENS);
        let ffn = match &cfg.moe {
            Some(m) => m.expert_intermediate * m.experts_per_token + m.shared_intermediate,
            None => cfg.intermediate_size,
        };
        let per_row = cfg.vocab_size + 16 * cfg.hidden_size + 3 * ffn;
        let chunk = self.gpu.options().kernels.attention_chunk();
        let partials = cfg.num_heads * context.div_ceil(chunk) * (cfg.head_dim + 2);
        (PASS_GRAPHS * rows * 4 * (per_row + partials)) as u64
    }

    /// The pass replayed from a captured graph: one launch instead of a few thousand, for
    /// passes of up to [`GRAPH_MAX_TOKENS`] tokens per sequence that score rows (decoding, a
    /// verify block, batched steps of several sequences). The graph is captured at the second
    /// such pass over the sequences' buffers and replayed while they stay (positions are read
    /// on the device); `None` for other passes. Returns what [`Self::launched`] returns.
    pub(super) fn graphed(
        &self,
        weights: &Weights,
        items: &mut [GpuItem<'_>],
        pass: &Pass<'_>,
    ) -> Result<Option<HostOutputs>, ModelError> {
        // Image rows and rows past an image (their own rotary positions) run launched.
        if !self.gpu.graphs()
            || items.iter().any(|i| i.tokens.len() > GRAPH_MAX_TOKENS)
            || items
                .iter()
                .any(|i| i.rotary_table.is_some() || !i.embedded.is_empty())
            || pass.want == Logits::None
            || self.routes_on_host()
        {
            return Ok(None);
        }
        let cfg = &weights.config;
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
        let mut graph = match self.graphs.take(&key) {
            Found::Graph(g) => g,
            Found::FirstSighting => return Ok(None),
            Found::Capture => match self.capture(cfg, items, pass) {
                Ok(g) => g,
                Err(e) => {
                    // A capture runs nothing, so the pass can still be launched; graphs stay
                    // off rather than fail every pass the same way.
                    tracing::warn!("CUDA graph capture failed, graphs turned off: {e}");
                    gpu.set_graphs(false);
                    return Ok(None);
                }
            },
        };
        let positions: Vec<i32> = items.iter().map(|i| i.pos0 as i32).collect();
        gpu.write(&mut graph.input, &self.embed(weights, items, pass.rows_of))?;
        gpu.write(&mut graph.pos, &positions)?;
        gpu.replay(&graph.graph)?;
        let (t, n) = (pass.tokens(), pass.scored_rows());
        let features = if pass.taps.is_empty() {
            Vec::new()
        } else {
            gpu.download(&graph.features, pass.taps.len() * t * h)?
        };
        let mut out = HostOutputs {
            logits: Vec::new(),
            argmax: Vec::new(),
            features,
        };
        if pass.want == Logits::Argmax {
            out.argmax = gpu.download(&graph.argmax, n)?;
        } else {
            out.logits = gpu.download(&graph.logits, n * v)?;
        }
        self.graphs.keep(key, graph);
        Ok(Some(out))
    }

    /// Captures `pass` over the current buffers of `items`.
    fn capture(
        &self,
        cfg: &ModelConfig,
        items: &mut [GpuItem<'_>],
        pass: &Pass<'_>,
    ) -> Result<PassGraph, ModelError> {
        let (gpu, h, t) = (&*self.gpu, cfg.hidden_size, pass.tokens());
        let input = self.scratch(t * h)?;
        let pos = gpu.zeros::<i32>(items.len())?;
        let (n, v) = (pass.scored_rows(), cfg.vocab_size);
        let argmax_only = pass.want == Logits::Argmax;
        let logits = self.scratch(if argmax_only { 0 } else { n * v })?;
        let argmax = gpu.uninit::<i32>(if argmax_only { n } else { 0 })?;
        let features = self.scratch(pass.taps.len() * t * h)?;
        let positions: Vec<dev::Position> = items
            .iter()
            .enumerate()
            .map(|(i, item)| dev::Position::Device {
                at: ptr(gpu, &pos, i),
                limit: item.state.kv_capacity(),
            })
            .collect();
        let (xp, lp, ap, fp) = (
            ptr(gpu, &input, 0),
            ptr(gpu, &logits, 0),
            ptr(gpu, &argmax, 0),
            ptr(gpu, &features, 0),
        );
        let graph = gpu.capture(|| -> Result<(), ModelError> {
            let normed = self.scratch(t * h)?;
            let np = ptr(gpu, &normed, 0);
            let rows = pass.rows_of;
            self.layers(
                cfg,
                xp,
                np,
                items,
                rows,
                (pass.taps, fp),
                Some(&positions),
                &[],
            )?;
            let out = self.score(cfg, xp, np, pass)?;
            if argmax_only {
                let ids = self.argmax(&out, n, v)?;
                gpu.copy(ap, ptr(gpu, &ids, 0), n * 4)?;
            } else {
                gpu.copy(lp, ptr(gpu, &out, 0), n * v * 4)?;
            }
            Ok(())
        })?;
        if tracing::enabled!(tracing::Level::DEBUG) {
            match graph.census() {
                Ok(c) => tracing::debug!("captured a {t}-token pass: {c:?}"),
                Err(e) => tracing::debug!("captured a {t}-token pass (no census: {e})"),
            }
        }
        Ok(PassGraph {
            graph,
            input,
            pos,
            logits,
            argmax,
            features,
        })
    }
}
