//! Teacher-forced perplexity of a token stream, optionally beside a baseline KV format.

use splash_backend::cpu::argmax;
use splash_model::{KvFormat, Logits, Model, ModelError};

/// How [`perplexity`] scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerplexityOptions {
    /// Tokens per window; each window starts from an empty context.
    pub window: usize,
    /// Tokens per forward pass: only `chunk × vocab` logits are held at once.
    pub chunk: usize,
    /// How the scored run stores its KV cache.
    pub kv: KvFormat,
    /// A second run, in lockstep, that the scored one is compared with (e.g. f32 or bf16 KV
    /// as the reference for int8).
    pub baseline: Option<KvFormat>,
}

impl PerplexityOptions {
    /// Windows of `window` tokens in passes of `chunk`, with an exact (f32) KV cache.
    pub fn new(window: usize, chunk: usize) -> Self {
        Self {
            window,
            chunk,
            kv: KvFormat::F32,
            baseline: None,
        }
    }
}

/// Result of [`perplexity`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Perplexity {
    /// `exp(mean_nll)`.
    pub perplexity: f64,
    /// Mean negative log-likelihood (nats) of the predicted tokens.
    pub mean_nll: f64,
    /// Share of predicted tokens that are the row's most likely token.
    pub top1: f64,
    /// Tokens in the input.
    pub tokens: usize,
    /// Tokens that were predicted (each window's first token has no prediction).
    pub predicted: usize,
    /// The comparison with the baseline run, when one was asked for.
    pub baseline: Option<Baseline>,
}

/// The scored run against a baseline run over the same tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Baseline {
    /// The baseline's KV format.
    pub kv: KvFormat,
    /// The baseline's own perplexity.
    pub perplexity: f64,
    /// Mean KL divergence (nats) of the scored run's next-token distributions from the
    /// baseline's.
    pub mean_kl: f64,
    /// Share of positions where both runs' most likely token is the same.
    pub same_top1: f64,
}

/// One run's log-softmax row statistics.
struct Row {
    /// `log Σ exp(x)`.
    lse: f64,
    argmax: usize,
}

impl Row {
    fn of(row: &[f32]) -> Self {
        let argmax = argmax(row) as usize;
        let max = row[argmax] as f64;
        let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
        Self {
            lse: max + sum.ln(),
            argmax,
        }
    }
}

/// Scores `ids` in consecutive windows (fresh state per window), teacher-forced.
pub fn perplexity(
    model: &Model,
    ids: &[u32],
    opts: &PerplexityOptions,
) -> Result<Perplexity, ModelError> {
    let window = opts.window.max(2);
    let chunk = opts.chunk.max(1);
    let v = model.config.vocab_size;
    let (mut nll, mut nll_base, mut kl) = (0.0f64, 0.0f64, 0.0f64);
    let (mut predicted, mut top1, mut same_top1) = (0usize, 0usize, 0usize);
    for win in ids.chunks(window) {
        let mut state = model.graph.new_state_with(opts.kv);
        let mut base_state = opts.baseline.map(|kv| model.graph.new_state_with(kv));
        for (ci, piece) in win.chunks(chunk).enumerate() {
            let logits = model.graph.forward(&mut state, piece, Logits::All)?;
            let base_logits = match &mut base_state {
                Some(s) => Some(model.graph.forward(s, piece, Logits::All)?),
                None => None,
            };
            for (r, row) in logits.chunks_exact(v).enumerate() {
                let Some(&target) = win.get(ci * chunk + r + 1) else {
                    break;
                };
                let s = Row::of(row);
                nll += s.lse - row[target as usize] as f64;
                top1 += usize::from(s.argmax == target as usize);
                predicted += 1;
                if let Some(base_logits) = &base_logits {
                    let base_row = &base_logits[r * v..(r + 1) * v];
                    let b = Row::of(base_row);
                    nll_base += b.lse - base_row[target as usize] as f64;
                    same_top1 += usize::from(s.argmax == b.argmax);
                    // KL(base || scored) = Σ p_b (log p_b - log p_s).
                    kl += base_row
                        .iter()
                        .zip(row)
                        .map(|(&xb, &xs)| {
                            let lb = xb as f64 - b.lse;
                            lb.exp() * (lb - (xs as f64 - s.lse))
                        })
                        .sum::<f64>();
                }
            }
        }
    }
    let per = |x: f64| {
        if predicted > 0 {
            x / predicted as f64
        } else {
            0.0
        }
    };
    let mean_nll = per(nll);
    Ok(Perplexity {
        perplexity: mean_nll.exp(),
        mean_nll,
        top1: per(top1 as f64),
        tokens: ids.len(),
        predicted,
        baseline: opts.baseline.map(|kv| Baseline {
            kv,
            perplexity: per(nll_base).exp(),
            mean_kl: per(kl),
            same_top1: per(same_top1 as f64),
        }),
    })
}
