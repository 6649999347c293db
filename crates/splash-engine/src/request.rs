//! What goes into the engine and what comes out of it: a request, the events of a step, the
//! result of a finished sequence and why it ended.

use std::time::Duration;

use splash_model::{ImageSpan, ModelError};

use crate::grammar::GrammarRequest;
use crate::sampling::SamplingParams;
use crate::speculative::SpecStats;

/// Identifies a sequence inside one engine.
pub type SeqId = u64;

/// A generation request in token space.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// Upper bound on generated tokens.
    pub max_tokens: usize,
    /// Stop strings (the output ends before the first one).
    pub stop: Vec<String>,
    /// Keep generating through end-of-sequence tokens (benchmarks, tests).
    pub ignore_eos: bool,
    /// Constrain the output to a JSON schema or grammar.
    pub grammar: Option<GrammarRequest>,
    /// The prompt's images, in order: each covers a run of the model's image placeholder
    /// token (`image_token_id`) in `prompt`.
    pub images: Vec<PromptImage>,
}

/// An image of a prompt: the vision tower's rows for its placeholder tokens, and a digest of
/// the image, under which the prefix cache keeps the states that hold it (the same
/// conversation with another picture never resumes from the old one's state).
#[derive(Clone, Debug)]
pub struct PromptImage {
    pub span: ImageSpan,
    /// A digest of the image's content (e.g. SHA-256 of its pixels).
    pub digest: [u8; 32],
}

/// `prompt` as the prefix cache keys it: each image's placeholder tokens replaced by ids
/// drawn from its digest and the row, all above the vocabulary (bit 31 set), so a state
/// covering an image matches only the same image at the same place. `None` without images.
pub(crate) fn cache_key(prompt: &[u32], images: &[PromptImage]) -> Option<Vec<u32>> {
    if images.is_empty() {
        return None;
    }
    let mut key = prompt.to_vec();
    for image in images {
        let end = image.span.end().min(key.len());
        for (row, id) in key[image.span.start.min(end)..end].iter_mut().enumerate() {
            *id = image_row_key(&image.digest, row);
        }
    }
    Some(key)
}

/// The key id of row `row` of an image with `digest` (a splitmix64 mix of both).
fn image_row_key(digest: &[u8; 32], row: usize) -> u32 {
    let word = |i: usize| u64::from_le_bytes(digest[8 * i..8 * i + 8].try_into().unwrap());
    let mut x =
        word(0) ^ word(1).rotate_left(17) ^ word(2).rotate_left(31) ^ word(3).rotate_left(47);
    x ^= (row as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    0x8000_0000 | (x as u32 & 0x7FFF_FFFF)
}

/// A request that generates nothing: one prefill of `prompt`, then the final position's
/// logits at `answers` (the tokens of the answer slots), read in f32. No sampling, no draft.
#[derive(Clone, Debug)]
pub struct ScoreRequest {
    pub prompt: Vec<u32>,
    /// Token ids whose logits are read, in order (at least one).
    pub answers: Vec<u32>,
    /// A prompt position whose state the prefix cache should keep (besides the turn starts it
    /// keeps anyway): where the part that later requests share ends, e.g. the evidence of a
    /// judgment, so that a second question on it prefills only what differs.
    pub keep_state_at: Option<usize>,
}

/// What a step produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// New text of a sequence.
    Text { id: SeqId, text: String },
    /// The sequence ended; see [`Engine::take_finished`] for the result.
    Finished { id: SeqId },
}

/// Why a sequence ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end-of-sequence token.
    Eos(u32),
    /// A stop string appeared in the text (it is not part of the output).
    StopString(String),
    /// `max_tokens` were generated.
    Length,
    /// The context limit was reached.
    ContextFull,
    /// The output constraint (JSON schema, grammar) is complete.
    GrammarEnd,
    /// The sequence could not continue (its constraint failed); the message says why.
    Failed(String),
    /// A [`ScoreRequest`] read its logits (see [`crate::Sequence::scores`]).
    Scored,
}

/// A request rejected or a model failure.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{0}")]
    Unavailable(String),
}

/// The result of a finished request.
#[derive(Clone, Debug)]
pub struct Completion {
    pub text: String,
    pub tokens: Vec<u32>,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens restored from the prefix cache instead of prefilled.
    pub cached_tokens: usize,
    pub prefill_time: Duration,
    pub decode_time: Duration,
    /// Speculation counters, when the request decoded with a draft.
    pub speculation: Option<SpecStats>,
}
