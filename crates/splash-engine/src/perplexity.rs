//! Teacher-forced perplexity of a token stream.

use splash_model::{Logits, Model, ModelError};

/// Result of [`perplexity`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Perplexity {
    /// `exp(mean_nll)`.
    pub perplexity: f64,
    /// Mean negative log-likelihood (nats) of the predicted tokens.
    pub mean_nll: f64,
    /// Tokens in the input.
    pub tokens: usize,
    /// Tokens that were predicted (each window's first token has no prediction).
    pub predicted: usize,
}

/// Scores `ids` in consecutive windows of `window` tokens (fresh state per window), running
/// each window in chunks of `chunk` tokens so only `chunk × vocab` logits are held at once.
pub fn perplexity(
    model: &Model,
    ids: &[u32],
    window: usize,
    chunk: usize,
) -> Result<Perplexity, ModelError> {
    let window = window.max(2);
    let chunk = chunk.max(1);
    let v = model.config.vocab_size;
    let mut nll = 0.0f64;
    let mut predicted = 0usize;
    for win in ids.chunks(window) {
        let mut state = model.graph.new_state();
        for (ci, piece) in win.chunks(chunk).enumerate() {
            let logits = model.graph.forward(&mut state, piece, Logits::All)?;
            for (r, row) in logits.chunks_exact(v).enumerate() {
                let Some(&target) = win.get(ci * chunk + r + 1) else {
                    break;
                };
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                let lse = max
                    + row
                        .iter()
                        .map(|&x| (x as f64 - max).exp())
                        .sum::<f64>()
                        .ln();
                nll += lse - row[target as usize] as f64;
                predicted += 1;
            }
        }
    }
    let mean_nll = if predicted > 0 {
        nll / predicted as f64
    } else {
        0.0
    };
    Ok(Perplexity {
        perplexity: mean_nll.exp(),
        mean_nll,
        tokens: ids.len(),
        predicted,
    })
}
