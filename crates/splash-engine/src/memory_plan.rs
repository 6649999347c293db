//! The memory plan computed at start: from what the device offers, less the weights, the
//! draft, the activations and a safety reserve, how many tokens of KV cache and how many
//! sequence states fit, hence the context limit and the number of decode lanes. A
//! configuration where one full request cannot fit is refused with the breakdown.

use std::fmt;

const GIB: f64 = (1u64 << 30) as f64;
/// The shortest context worth serving: a plan that cannot hold it for one request fails.
const MIN_USEFUL_CONTEXT: usize = 4096;

/// What the plan is computed from (bytes unless said otherwise).
#[derive(Clone, Debug)]
pub struct PlanInputs {
    /// "RAM" or "GPU memory": what `available` measures, for messages.
    pub device: String,
    /// What the device offers to this process (free RAM, or free GPU memory plus what the
    /// weights already took there).
    pub available: u64,
    /// `--max-memory`.
    pub max_memory: Option<u64>,
    pub weights: u64,
    pub draft_weights: u64,
    /// Working buffers of a forward pass (prefill chunk, logits), estimated.
    pub activations: u64,
    /// What the captured CUDA graphs of decode and verify passes hold (0 on the CPU).
    pub graphs: u64,
    /// KV cache of the target plus the draft's context, per token.
    pub kv_bytes_per_token: u64,
    /// Fixed per-sequence state (Gated DeltaNet recurrent and conv states).
    pub state_bytes_per_sequence: u64,
    /// The model's native context limit, and `--max-context`.
    pub native_context: usize,
    pub max_context: Option<usize>,
    /// Decode lanes asked for.
    pub lanes: usize,
    /// The KV-cache format (`--kv-format`), for the advice when nothing fits.
    pub kv_format: String,
}

/// The plan: what the server runs with.
#[derive(Clone, Debug)]
pub struct MemoryPlan {
    pub inputs: PlanInputs,
    /// min(available, --max-memory).
    pub budget: u64,
    pub reserve: u64,
    /// Tokens of KV cache shared by all running sequences.
    pub kv_tokens: u64,
    /// Bytes for prompt-prefix states kept for later requests: a quarter of what is left after
    /// the lanes' states, at most 16 GiB (one 32K-token conversation of a 27B model keeps about
    /// 6 GiB of checkpoints), never below the minimum context.
    pub prefix_cache_bytes: u64,
    /// Per-request context limit.
    pub context: usize,
    pub lanes: usize,
    /// True when the KV cache is sized by `lanes × context` (what the workload can use)
    /// rather than by the memory left.
    pub sized_by_workload: bool,
}

/// A configuration that cannot serve one full request, with its breakdown.
#[derive(Clone, Debug)]
pub struct PlanError {
    pub inputs: PlanInputs,
    pub budget: u64,
    pub reserve: u64,
    pub needed: u64,
    /// The context one request needs at least.
    pub min_context: u64,
}

/// The safety reserve: 5% of the budget, at least 256 MiB, at most 2 GiB.
fn reserve_for(budget: u64) -> u64 {
    (budget / 20).clamp(256 << 20, 2 << 30)
}

impl PlanInputs {
    /// The plan, or why one request of the smallest useful context does not fit.
    pub fn plan(self) -> Result<MemoryPlan, Box<PlanError>> {
        let budget = self
            .max_memory
            .map_or(self.available, |m| m.min(self.available));
        let reserve = reserve_for(budget);
        let fixed = self.weights + self.draft_weights + self.activations + self.graphs + reserve;
        let wanted = self
            .max_context
            .map_or(self.native_context, |m| m.min(self.native_context));
        let min_context = wanted.min(MIN_USEFUL_CONTEXT) as u64;
        let per_token = self.kv_bytes_per_token.max(1);
        let one_request = self.state_bytes_per_sequence + min_context * per_token;
        if budget < fixed + one_request {
            return Err(Box::new(PlanError {
                needed: fixed + one_request,
                inputs: self,
                budget,
                reserve,
                min_context,
            }));
        }
        let free = budget - fixed;
        // Fewer lanes when their states would leave less than the minimum context.
        let mut lanes = self.lanes.max(1);
        while lanes > 1
            && free < lanes as u64 * self.state_bytes_per_sequence + min_context * per_token
        {
            lanes -= 1;
        }
        let for_kv = free - lanes as u64 * self.state_bytes_per_sequence;
        // No more than the workload can use: every lane holding a request of the full
        // context, and a prefix cache no larger than that KV. A small model then takes what it
        // needs rather than all the memory (a second server plans on what is left).
        let demand = lanes as u64 * wanted as u64;
        let prefix_cache_bytes = (for_kv / 4)
            .min(16 << 30)
            .min(for_kv - min_context * per_token)
            .min(demand * per_token);
        let fits = (for_kv - prefix_cache_bytes) / per_token;
        let kv_tokens = fits.min(demand);
        let context = (wanted as u64).min(kv_tokens) as usize;
        Ok(MemoryPlan {
            inputs: self,
            budget,
            reserve,
            kv_tokens,
            prefix_cache_bytes,
            context,
            lanes,
            sized_by_workload: fits > demand,
        })
    }
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / GIB)
}

impl MemoryPlan {
    /// One line for the startup summary.
    pub fn summary(&self) -> String {
        let i = &self.inputs;
        format!(
            "memory plan: {} of {} (available {}{}): weights {}, draft {}, activations {}, graphs {}, \
             reserve {}; KV for {} tokens ({} B/token), prefix cache {}, context {} tokens{}, {} lanes",
            gib(self.budget),
            i.device,
            gib(i.available),
            if i.max_memory.is_some() { ", --max-memory" } else { "" },
            gib(i.weights),
            gib(i.draft_weights),
            gib(i.activations),
            gib(i.graphs),
            gib(self.reserve),
            self.kv_tokens,
            i.kv_bytes_per_token,
            gib(self.prefix_cache_bytes),
            self.context,
            if self.context < i.native_context.min(i.max_context.unwrap_or(usize::MAX)) {
                " (lowered to what fits)"
            } else {
                ""
            },
            self.lanes
        ) + if self.sized_by_workload {
            " (KV sized for lanes × context, not all the memory: raise with --lanes or --max-context)"
        } else {
            ""
        }
    }

    /// The plan as JSON for `/status`.
    pub fn to_json(&self) -> serde_json::Value {
        let i = &self.inputs;
        serde_json::json!({
            "device": i.device,
            "available_bytes": i.available,
            "max_memory_bytes": i.max_memory,
            "budget_bytes": self.budget,
            "weights_bytes": i.weights,
            "draft_bytes": i.draft_weights,
            "activations_bytes": i.activations,
            "graphs_bytes": i.graphs,
            "reserve_bytes": self.reserve,
            "kv_bytes_per_token": i.kv_bytes_per_token,
            "state_bytes_per_sequence": i.state_bytes_per_sequence,
            "kv_tokens": self.kv_tokens,
            "prefix_cache_bytes": self.prefix_cache_bytes,
            "context_tokens": self.context,
            "lanes": self.lanes,
            "sized_by_workload": self.sized_by_workload,
        })
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inputs;
        writeln!(
            f,
            "the model does not fit: one request needs {} of {}, {} is available{}",
            gib(self.needed),
            i.device,
            gib(self.budget),
            if i.max_memory.is_some() {
                " (capped by --max-memory)"
            } else {
                ""
            }
        )?;
        writeln!(f, "  weights               {}", gib(i.weights))?;
        writeln!(f, "  draft                 {}", gib(i.draft_weights))?;
        writeln!(f, "  activations           {}", gib(i.activations))?;
        if i.graphs > 0 {
            writeln!(f, "  CUDA graphs           {}", gib(i.graphs))?;
        }
        writeln!(f, "  safety reserve        {}", gib(self.reserve))?;
        writeln!(
            f,
            "  one sequence          {} (state {} + KV for {} tokens at {} B/token)",
            gib(i.state_bytes_per_sequence + self.min_context * i.kv_bytes_per_token),
            gib(i.state_bytes_per_sequence),
            self.min_context,
            i.kv_bytes_per_token
        )?;
        let mut help = Vec::new();
        if i.max_memory.is_some_and(|m| m < i.available) {
            help.push("raise --max-memory");
        }
        if i.draft_weights > 0 {
            help.push("--speculative off (no draft)");
        }
        if i.kv_format != "int8" {
            help.push("--kv-format int8 (smaller KV)");
        }
        help.push("a smaller quantisation of the model");
        write!(f, "  what would help: {}", help.join(", "))
    }
}

impl std::error::Error for PlanError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> PlanInputs {
        PlanInputs {
            device: "RAM".into(),
            available: 16 << 30,
            max_memory: None,
            weights: 4 << 30,
            draft_weights: 0,
            activations: 256 << 20,
            graphs: 0,
            kv_bytes_per_token: 64 << 10,
            state_bytes_per_sequence: 50 << 20,
            native_context: 262_144,
            max_context: None,
            lanes: 4,
            kv_format: "bf16".into(),
        }
    }

    #[test]
    fn context_is_lowered_to_what_fits() {
        let p = inputs().plan().unwrap();
        // 16 GiB - 4 GiB - 0.25 GiB - reserve 0.8 GiB - 4 × 50 MiB, at 64 KiB per token.
        let free = (16u64 << 30) - (4 << 30) - (256 << 20) - p.reserve - 4 * (50 << 20);
        assert_eq!(p.prefix_cache_bytes, free / 4);
        assert_eq!(p.kv_tokens, (free - free / 4) / (64 << 10));
        assert_eq!(p.context, p.kv_tokens as usize);
        assert!(p.context < 262_144);
        assert_eq!(p.lanes, 4);
        assert!(
            p.summary().contains("lowered to what fits"),
            "{}",
            p.summary()
        );
    }

    #[test]
    fn max_context_and_max_memory_cap_the_plan() {
        let p = PlanInputs {
            max_context: Some(32_768),
            max_memory: Some(8 << 30),
            ..inputs()
        }
        .plan()
        .unwrap();
        assert_eq!(p.budget, 8 << 30);
        assert_eq!(p.context, 32_768);
        assert!(p.kv_tokens > 32_768);
    }

    #[test]
    fn a_small_model_plans_what_its_lanes_can_use_not_all_the_memory() {
        let p = PlanInputs {
            weights: 16 << 20,
            kv_bytes_per_token: 2592,
            state_bytes_per_sequence: 1 << 20,
            native_context: 32_768,
            ..inputs()
        }
        .plan()
        .unwrap();
        assert_eq!((p.kv_tokens, p.context), (4 * 32_768, 32_768));
        assert!(p.prefix_cache_bytes <= 4 * 32_768 * 2592, "{p:?}");
        assert!(p.sized_by_workload);
        assert!(p.summary().contains("raise with --lanes or --max-context"));
        assert_eq!(p.to_json()["sized_by_workload"], true);
        // A big model fills the memory as before.
        assert!(!inputs().plan().unwrap().sized_by_workload);
    }

    #[test]
    fn lanes_shrink_before_the_minimum_context_does() {
        let p = PlanInputs {
            available: (4 << 30) + (256 << 20) + (256 << 20) + (300 << 20) + 4096 * (64 << 10),
            lanes: 8,
            ..inputs()
        }
        .plan()
        .unwrap();
        assert!(p.lanes < 8 && p.lanes >= 1, "{p:?}");
        assert!(p.context >= 4096);
    }

    /// The memory the CUDA graphs hold comes out of the KV cache, and shows in the summary,
    /// `/status` and the refusal.
    #[test]
    fn graph_memory_is_planned_for() {
        let without = inputs().plan().unwrap();
        let with = PlanInputs {
            available: 16 << 30,
            graphs: 1 << 30,
            ..inputs()
        }
        .plan()
        .unwrap();
        let per_token = 64u64 << 10;
        let freed = (without.kv_tokens * per_token + without.prefix_cache_bytes)
            - (with.kv_tokens * per_token + with.prefix_cache_bytes);
        assert!(
            freed.abs_diff(1 << 30) <= per_token,
            "KV and prefix cache shrank by {freed} bytes"
        );
        assert!(
            with.summary().contains("graphs 1.00 GiB"),
            "{}",
            with.summary()
        );
        assert_eq!(with.to_json()["graphs_bytes"], 1u64 << 30);
        let e = PlanInputs {
            max_memory: Some(4 << 30),
            graphs: 1 << 30,
            ..inputs()
        }
        .plan()
        .unwrap_err();
        assert!(
            e.to_string().contains("CUDA graphs           1.00 GiB"),
            "{e}"
        );
    }

    #[test]
    fn impossible_configuration_is_refused_with_the_breakdown() {
        let e = PlanInputs {
            max_memory: Some(3 << 30),
            draft_weights: 1 << 30,
            ..inputs()
        }
        .plan()
        .unwrap_err();
        let text = e.to_string();
        for part in [
            "does not fit",
            "weights               4.00 GiB",
            "draft                 1.00 GiB",
            "one sequence",
            "raise --max-memory",
            "--speculative off",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
    }
}
