//! `splash perplexity`: teacher-forced perplexity of a text file.

use anyhow::{bail, Context};
use serde_json::json;
use splash_engine::PerplexityOptions;
use splash_model::KvFormat;

use crate::model_arg;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: model_arg::ModelArgs,
    /// UTF-8 text file to score.
    #[arg(long)]
    file: std::path::PathBuf,
    /// Tokens per scoring window (each window starts from an empty context).
    #[arg(long, default_value_t = 4096)]
    window: usize,
    /// KV-cache storage of the scored run: f32 (exact, the default), bf16, or int8 (what
    /// `serve` stores by default).
    #[arg(long, default_value = "f32")]
    kv_format: KvFormat,
    /// Also score with this KV format, in lockstep, and report the scored run against it:
    /// its perplexity, the mean KL divergence and how often both pick the same top token.
    #[arg(long, value_name = "KV_FORMAT")]
    kv_baseline: Option<KvFormat>,
    /// Print JSON (`perplexity`, `tokens`, `predicted`, `mean_nll`, `top1`, `kv_format`,
    /// and `baseline` when asked for) instead of a sentence.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("cannot read {} as UTF-8 text", a.file.display()))?;
    let model = model_arg::load(&a.model)?;
    let ids = model.tokenizer.encode(&text)?;
    if ids.len() < 2 {
        bail!(
            "{} has {} token(s); perplexity needs at least 2",
            a.file.display(),
            ids.len()
        );
    }
    let opts = PerplexityOptions {
        kv: a.kv_format,
        baseline: a.kv_baseline,
        ..PerplexityOptions::new(a.window.min(model.config.max_position_embeddings), 64)
    };
    let p = splash_engine::perplexity(&model, &ids, &opts)?;
    if a.json {
        let mut out = json!({
            "perplexity": p.perplexity, "tokens": p.tokens, "predicted": p.predicted,
            "mean_nll": p.mean_nll, "top1": p.top1, "kv_format": a.kv_format.name(),
        });
        if let Some(b) = p.baseline {
            out["baseline"] = json!({
                "kv_format": b.kv.name(), "perplexity": b.perplexity,
                "mean_kl": b.mean_kl, "same_top1": b.same_top1,
            });
        }
        println!("{out}");
    } else {
        println!(
            "perplexity {:.4} over {} tokens ({} predicted, mean NLL {:.5} nats, top-1 {:.2} %, {} KV)",
            p.perplexity,
            p.tokens,
            p.predicted,
            p.mean_nll,
            100.0 * p.top1,
            a.kv_format.name()
        );
        if let Some(b) = p.baseline {
            println!(
                "{} KV baseline: perplexity {:.4}; mean KL {:.6} nats; same top-1 token {:.2} %",
                b.kv.name(),
                b.perplexity,
                b.mean_kl,
                100.0 * b.same_top1
            );
        }
    }
    Ok(())
}
