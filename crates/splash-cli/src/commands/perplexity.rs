//! `splash perplexity`: teacher-forced perplexity of a text file.

use anyhow::{bail, Context};
use serde_json::json;

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
    /// Print `{"perplexity": f, "tokens": n}` instead of a sentence.
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
    let window = a.window.min(model.config.max_position_embeddings);
    let p = splash_engine::perplexity(&model, &ids, window, 64)?;
    if a.json {
        println!(
            "{}",
            json!({"perplexity": p.perplexity, "tokens": p.tokens, "predicted": p.predicted, "mean_nll": p.mean_nll})
        );
    } else {
        println!(
            "perplexity {:.4} over {} tokens ({} predicted, mean NLL {:.5} nats)",
            p.perplexity, p.tokens, p.predicted, p.mean_nll
        );
    }
    Ok(())
}
