//! Feed-forward blocks: dense SwiGLU and the routed mixture of experts (model-spec §2.5).

use splash_backend::cpu::{matmul_sums, sigmoid, silu_mul, softmax_in_place, Sums};
use splash_backend::Weight;

use super::Names;
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::error::ModelError;

/// `down(silu(gate x) * up x)`.
pub(super) struct Mlp {
    pub(super) gate: Weight,
    pub(super) up: Weight,
    pub(super) down: Weight,
}

impl Mlp {
    fn load(
        ck: &Checkpoint,
        names: &Names,
        prefix: &str,
        h: usize,
        i: usize,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            gate: names.linear(ck, &format!("{prefix}gate_proj"), &[i, h])?,
            up: names.linear(ck, &format!("{prefix}up_proj"), &[i, h])?,
            down: names.linear(ck, &format!("{prefix}down_proj"), &[h, i])?,
        })
    }

    fn num_parameters(&self) -> usize {
        self.gate.len() + self.up.len() + self.down.len()
    }

    fn forward(&self, x: &[f32], sums: Sums) -> Vec<f32> {
        let t = x.len() / self.gate.cols();
        let mut g = vec![0.0f32; t * self.gate.rows()];
        matmul_sums(&mut g, x, &self.gate, sums);
        let mut u = vec![0.0f32; g.len()];
        matmul_sums(&mut u, x, &self.up, sums);
        silu_mul(&mut g, &u);
        let mut out = vec![0.0f32; t * self.down.rows()];
        matmul_sums(&mut out, &g, &self.down, sums);
        out
    }
}

/// Softmax router over all experts, top-k renormalised, plus a sigmoid-gated shared expert.
pub(super) struct Moe {
    pub(super) router: Weight,
    pub(super) experts: Vec<Mlp>,
    pub(super) top_k: usize,
    pub(super) shared: Mlp,
    pub(super) shared_gate: Weight,
}

impl Moe {
    fn load(
        cfg: &ModelConfig,
        ck: &Checkpoint,
        names: &Names,
        li: usize,
    ) -> Result<Self, ModelError> {
        let m = cfg.moe.as_ref().expect("MoE config");
        let (h, e, i) = (cfg.hidden_size, m.num_experts, m.expert_intermediate);
        let n = |rest: &str| names.layer(li, &format!("mlp.{rest}"));
        // Experts come fused ([E, 2I, H] gate rows first, [E, H, I]), stacked per projection as
        // MLX writes them (`switch_mlp`, [E, I, H] / [E, H, I]), or one tensor per expert.
        let experts = if ck.contains(&n("switch_mlp.gate_proj.weight")) {
            let gate = names.linear(ck, &n("switch_mlp.gate_proj"), &[e, i, h])?;
            let up = names.linear(ck, &n("switch_mlp.up_proj"), &[e, i, h])?;
            let down = names.linear(ck, &n("switch_mlp.down_proj"), &[e, h, i])?;
            (0..e)
                .map(|x| Mlp {
                    gate: gate.index(x),
                    up: up.index(x),
                    down: down.index(x),
                })
                .collect()
        } else if ck.contains(&n("experts.gate_up_proj")) {
            let gate_up = ck.get_shaped(&n("experts.gate_up_proj"), &[e, 2 * i, h])?;
            let down = ck.get_shaped(&n("experts.down_proj"), &[e, h, i])?;
            (0..e)
                .map(|x| {
                    let gu = gate_up.index(x);
                    Mlp {
                        gate: gu.narrow_rows(0, i),
                        up: gu.narrow_rows(i, i),
                        down: down.index(x),
                    }
                })
                .collect()
        } else {
            (0..e)
                .map(|x| Mlp::load(ck, names, &n(&format!("experts.{x}.")), h, i))
                .collect::<Result<Vec<_>, _>>()?
        };
        Ok(Self {
            router: names.linear(ck, &n("gate"), &[e, h])?,
            experts,
            top_k: m.experts_per_token,
            shared: Mlp::load(ck, names, &n("shared_expert."), h, m.shared_intermediate)?,
            shared_gate: names.linear(ck, &n("shared_expert_gate"), &[1, h])?,
        })
    }

    fn forward(&self, x: &[f32], sums: Sums) -> Vec<f32> {
        let h = self.router.cols();
        let t = x.len() / h;
        let e = self.experts.len();
        let mut probs = vec![0.0f32; t * e];
        matmul_sums(&mut probs, x, &self.router, sums);
        let routed = route(&mut probs, e, self.top_k);
        let mut out = self.shared.forward(x, sums);
        let mut sg = vec![0.0f32; t];
        matmul_sums(&mut sg, x, &self.shared_gate, sums);
        for (row, &g) in out.chunks_exact_mut(h).zip(&sg) {
            let s = sigmoid(g);
            row.iter_mut().for_each(|v| *v *= s);
        }
        let mut xs = Vec::new();
        for (expert, tokens) in self.experts.iter().zip(&routed) {
            if tokens.is_empty() {
                continue;
            }
            xs.clear();
            for &(ti, _) in tokens {
                xs.extend_from_slice(&x[ti * h..(ti + 1) * h]);
            }
            let y = expert.forward(&xs, sums);
            for (&(ti, w), yr) in tokens.iter().zip(y.chunks_exact(h)) {
                for (o, &v) in out[ti * h..(ti + 1) * h].iter_mut().zip(yr) {
                    *o += w * v;
                }
            }
        }
        out
    }

    fn num_parameters(&self) -> usize {
        self.router.len()
            + self.experts.iter().map(Mlp::num_parameters).sum::<usize>()
            + self.shared.num_parameters()
            + self.shared_gate.len()
    }
}

/// Per expert, the tokens routed to it and their weights: softmax over each row of router
/// logits `[T, E]` (in place), the `top_k` most probable experts (ties to the lower index),
/// their probabilities renormalised to sum 1.
pub(super) fn route(logits: &mut [f32], e: usize, top_k: usize) -> Vec<Vec<(usize, f32)>> {
    let mut routed: Vec<Vec<(usize, f32)>> = vec![Vec::new(); e];
    let mut order: Vec<usize> = Vec::with_capacity(e);
    for (ti, p) in logits.chunks_exact_mut(e).enumerate() {
        softmax_in_place(p);
        order.clear();
        order.extend(0..e);
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        let top = &order[..top_k];
        let sum: f32 = top.iter().map(|&ei| p[ei]).sum();
        for &ei in top {
            routed[ei].push((ti, p[ei] / sum));
        }
    }
    routed
}

/// The feed-forward block of a layer.
pub(super) enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

impl Ffn {
    pub(super) fn load(
        cfg: &ModelConfig,
        ck: &Checkpoint,
        names: &Names,
        i: usize,
    ) -> Result<Self, ModelError> {
        Ok(match cfg.moe {
            Some(_) => Ffn::Moe(Moe::load(cfg, ck, names, i)?),
            None => Ffn::Dense(Mlp::load(
                ck,
                names,
                &names.layer(i, "mlp."),
                cfg.hidden_size,
                cfg.intermediate_size,
            )?),
        })
    }

    /// `x` `[T, H]` (normed) → `[T, H]`, products summed as `sums` says.
    pub(super) fn forward(&self, x: &[f32], sums: Sums) -> Vec<f32> {
        match self {
            Ffn::Dense(m) => m.forward(x, sums),
            Ffn::Moe(m) => m.forward(x, sums),
        }
    }

    pub(super) fn num_parameters(&self) -> usize {
        match self {
            Ffn::Dense(m) => m.num_parameters(),
            Ffn::Moe(m) => m.num_parameters(),
        }
    }
}
