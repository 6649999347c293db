//! Scoring without generation: `/v1/judgments` (SemIf `direct-options-v1`) and `/v1/systemone`
//! (TypeSafe System One). Both render the same prompt shape — a fixed system instruction and a
//! user turn holding one JSON object `{evidence, criterion, options}`, thinking off — prefill it
//! once, and read the final position's logits at the answer slots: labels (`A`, `B`, ...) that
//! are one token each right after the generation prompt. No sampling, no draft.
//!
//! The evidence comes first in the JSON, so questions about the same evidence share its prefix:
//! each prompt asks the prefix cache to keep the state where the evidence ends, and a second
//! question prefills only its own criterion and options.

pub mod judgments;
mod pyjson;
pub mod systemone;

use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use serde_json::{json, Value};
use splash_engine::ScoreRequest;
use splash_model::{Model, TemplateInputs};

use crate::error::ApiError;
use crate::prompt::{self, Tokens};
use crate::state::AppState;
use crate::worker::{Work, WorkerEvent};

/// The system instruction of a judgment (SemIf `direct-options-v1`, verbatim).
const JUDGMENT_SYSTEM: &str = "Apply the supplied criterion to the supplied evidence. Choose exactly one listed option. Respond with only its uppercase letter, with no explanation or reasoning.";
/// The same for System One, whose answer slots may be longer than one letter.
const SYSTEMONE_SYSTEM: &str = "Apply the supplied criterion to the supplied evidence. Choose exactly one listed option. Respond with only its uppercase slot, with no explanation or reasoning.";
/// Labels of judgment options, in order.
const LETTERS: &str = "ABCDEFGHIJKLMNOP";
/// Answer slots at most (the longest choice or score domain).
pub const MAX_SLOTS: usize = 255;
/// The prompt text right before the answer in Qwen templates starts at this token.
const TURN_START: &str = "<|im_start|>";
/// A request's deadline when it sets no `timeout`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);
/// A shared evidence prefix shorter than this is not worth a prefix-cache entry.
const KEEP_MIN_TOKENS: usize = 64;
/// The header a test build's client sends to make a score non-finite (`--inject-faults`).
const FAULT_HEADER: &str = "x-splash-fault";

/// The answer slots of the served tokenizer: labels `A`..`Z`, `AA`, ... (sorted by length,
/// then alphabetically; at most [`MAX_SLOTS`]) that are one token each, decode back to
/// themselves, and stay one token after the generation prompt of the chat template.
pub struct AnswerSlots {
    slots: Vec<(String, u32)>,
    /// The generation prompt the slots were checked after (the text from the last
    /// `<|im_start|>`, where the tokenizer splits: what comes before cannot merge with a label).
    tail: String,
}

impl AnswerSlots {
    /// Finds the slots; `Err` says why scoring cannot work with this model.
    pub fn build(model: &Model) -> Result<Self, String> {
        let probe = render(model, JUDGMENT_SYSTEM, "{}")?;
        let tail = tail(&probe).to_string();
        let letters = b'A'..=b'Z';
        let singles = letters.clone().map(|a| vec![a]);
        let pairs = letters
            .clone()
            .flat_map(|a| letters.clone().map(move |b| vec![a, b]));
        let triples = letters.clone().flat_map(|a| {
            let l = letters.clone();
            l.clone()
                .flat_map(move |b| l.clone().map(move |c| vec![a, b, c]))
        });
        let mut slots = Vec::new();
        for label in singles.chain(pairs).chain(triples) {
            let label = String::from_utf8(label).expect("ASCII");
            if let Some(token) = one_token_after(model, &tail, &label) {
                slots.push((label, token));
                if slots.len() == MAX_SLOTS {
                    break;
                }
            }
        }
        let missing: Vec<char> = LETTERS
            .chars()
            .filter(|c| {
                slots
                    .get((*c as u8 - b'A') as usize)
                    .is_none_or(|(l, _)| l != &c.to_string())
            })
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "the letters {} are not single tokens after this model's generation prompt, so option letters cannot be scored",
                missing.iter().collect::<String>()
            ));
        }
        Ok(Self { slots, tail })
    }

    /// How many slots there are (choice and score domains are at most this long).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// The first `n` labels.
    fn labels(&self, n: usize) -> Vec<String> {
        self.slots[..n].iter().map(|(l, _)| l.clone()).collect()
    }

    /// The tokens of the first `n` slots after `prompt`; checked again when its generation
    /// prompt is not the one the slots were found after (a template that varies it).
    fn tokens(&self, model: &Model, prompt: &str, n: usize) -> Result<Vec<u32>, String> {
        let tail = tail(prompt);
        self.slots[..n]
            .iter()
            .map(|(label, token)| {
                if tail == self.tail {
                    return Ok(*token);
                }
                one_token_after(model, tail, label)
                    .filter(|t| t == token)
                    .ok_or_else(|| format!("the answer slot `{label}` is not one token after this prompt's generation prompt"))
            })
            .collect()
    }
}

/// The text from the last turn start (all of `prompt` without one).
fn tail(prompt: &str) -> &str {
    prompt.rfind(TURN_START).map_or(prompt, |i| &prompt[i..])
}

/// `label`'s token when it is one token, decodes back to itself, and appending it to `tail`
/// appends exactly that token.
fn one_token_after(model: &Model, tail: &str, label: &str) -> Option<u32> {
    let tok = &model.tokenizer;
    let ids = tok.encode(label).ok()?;
    let [id] = ids[..] else { return None };
    if tok.decode(&[id], false).ok()? != label {
        return None;
    }
    let mut before = tok.encode(tail).ok()?;
    before.push(id);
    (tok.encode(&format!("{tail}{label}")).ok()? == before).then_some(id)
}

/// The chat prompt of a system instruction and one user turn, thinking off.
fn render(model: &Model, system: &str, user: &str) -> Result<String, String> {
    let template = model
        .template
        .as_ref()
        .ok_or("this model has no chat template (chat_template.jinja or tokenizer_config.json)")?;
    let mut extra = serde_json::Map::new();
    extra.insert("enable_thinking".into(), false.into());
    let inputs = TemplateInputs {
        messages: json!([
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ]),
        tools: None,
        add_generation_prompt: true,
        extra,
    };
    template
        .render(&inputs)
        .map_err(|e| format!("the chat template cannot render a scoring prompt: {e}"))
}

/// The slots of this server, or a 501 saying why scoring is unavailable.
fn slots(s: &AppState) -> Result<&AnswerSlots, ApiError> {
    s.answer_slots
        .as_ref()
        .as_ref()
        .map_err(|why| unsupported(&format!("this model: {why}")))
}

/// A prompt ready to score.
struct ScorePrompt {
    text: String,
    ids: Vec<u32>,
    answers: Vec<u32>,
    /// Where the evidence ends (a prefix later questions share), when worth keeping.
    keep: Option<usize>,
}

/// Why a prompt could not be prepared.
enum PrepareError {
    /// More tokens than the context holds: (at least) this many.
    TooLong(usize),
    Other(ApiError),
}

impl From<ApiError> for PrepareError {
    fn from(e: ApiError) -> Self {
        Self::Other(e)
    }
}

/// The tokens of the prompt up to the end of the evidence, which the questions of one request
/// share: tokenized once for all of them.
#[derive(Default)]
struct SharedHead(Option<(String, Option<Vec<u32>>)>);

impl SharedHead {
    /// The tokens of `head` (`None`: more than `limit`).
    async fn ids(
        &mut self,
        s: &AppState,
        head: &str,
        limit: usize,
    ) -> Result<Option<&[u32]>, ApiError> {
        if self.0.as_ref().is_none_or(|(text, _)| text != head) {
            let ids = match prompt::tokenize(&s.model, head.to_string(), limit).await? {
                Tokens::Ids(ids) => Some(ids),
                Tokens::Over(_) => None,
            };
            self.0 = Some((head.to_string(), ids));
        }
        Ok(self.0.as_ref().and_then(|(_, ids)| ids.as_deref()))
    }
}

/// Renders `{"evidence": evidence, ...rest}` as the user turn under `system`, tokenizes it
/// (off the async threads, bounded by the context) and finds the first `n` answer slots.
async fn prepare(
    s: &AppState,
    system: &str,
    evidence: &Value,
    rest: serde_json::Map<String, Value>,
    n: usize,
    shared: &mut SharedHead,
) -> Result<ScorePrompt, PrepareError> {
    let slots = slots(s)?;
    let evidence_json = pyjson::dumps(evidence);
    let mut payload = serde_json::Map::new();
    payload.insert("evidence".into(), evidence.clone());
    payload.extend(rest);
    let user = pyjson::dumps(&payload);
    let text = render(&s.model, system, &user).map_err(ApiError::bad_request)?;
    let answers = slots
        .tokens(&s.model, &text, n)
        .map_err(|why| unsupported(&format!("this prompt: {why}")))?;
    // The engine needs room for the prompt and the position it scores.
    let limit = s.max_context.saturating_sub(1);
    let ids = match prompt::tokenize(&s.model, text.clone(), limit).await? {
        Tokens::Ids(ids) => ids,
        Tokens::Over(n) => return Err(PrepareError::TooLong(n)),
    };
    // The evidence ends `{"evidence": ` + its JSON into the user turn.
    let head = text
        .find(&user)
        .map(|at| &text[..at + "{\"evidence\": ".len() + evidence_json.len()]);
    let keep = match head {
        Some(head) => shared
            .ids(s, head, limit)
            .await?
            .map(|h| ids.iter().zip(h).take_while(|(a, b)| a == b).count()),
        None => None,
    }
    .filter(|&k| k >= KEEP_MIN_TOKENS);
    Ok(ScorePrompt {
        text,
        ids,
        answers,
        keep,
    })
}

/// 501 `scoring_unsupported`: scoring is unavailable for `what` (the model, a prompt).
fn unsupported(what: &str) -> ApiError {
    let mut e = ApiError::engine(format!("scoring is unavailable for {what}"));
    e.status = StatusCode::NOT_IMPLEMENTED;
    e.code = Some("scoring_unsupported");
    e
}

/// What one score job gave.
struct Scored {
    /// The answer slots' logits, in slot order (all finite).
    logits: Vec<f32>,
    prompt_tokens: usize,
    cached_tokens: usize,
    prefill: Duration,
}

/// Runs one score job by `deadline`. Past it the job is cancelled (504); a non-finite logit is
/// a 500 `model_result_invalid` for this request only.
async fn run(
    s: &AppState,
    prompt: ScorePrompt,
    deadline: Instant,
    poison: bool,
) -> Result<Scored, ApiError> {
    let n = prompt.answers.len();
    let mut rx = crate::openai::submit_work(
        s,
        Work::Score(ScoreRequest {
            prompt: prompt.ids,
            answers: prompt.answers,
            keep_state_at: prompt.keep,
        }),
    )?;
    let wait = tokio::time::timeout_at(deadline.into(), rx.recv());
    // Dropping the receiver (on time-out) cancels the job in the engine.
    let usage = match wait.await {
        Err(_) => return Err(timed_out()),
        Ok(Some(WorkerEvent::Done(u))) => u,
        Ok(Some(WorkerEvent::Failed { message, invalid })) => {
            return Err(if invalid {
                ApiError::bad_request(message)
            } else {
                ApiError::engine(message)
            })
        }
        Ok(Some(WorkerEvent::Text(_)) | None) => {
            return Err(ApiError::engine(
                "the engine ended the score request without its scores",
            ))
        }
    };
    let mut logits = usage.scores.unwrap_or_default();
    if logits.len() != n {
        return Err(ApiError::engine(format!(
            "the engine returned {} scores for {n} answer slots",
            logits.len()
        )));
    }
    if poison {
        logits[0] = f32::NAN;
    }
    if let Some(bad) = logits.iter().find(|l| !l.is_finite()) {
        let mut e = ApiError::engine(format!(
            "the model produced a non-finite logit ({bad}) at an answer slot; this request failed, the server goes on serving"
        ));
        e.code = Some("model_result_invalid");
        return Err(e);
    }
    Ok(Scored {
        logits,
        prompt_tokens: usage.prompt_tokens,
        cached_tokens: usage.cached_tokens,
        prefill: usage.prefill,
    })
}

fn timed_out() -> ApiError {
    let mut e = ApiError::engine(
        "the request did not finish within its timeout; raise `timeout` or ask fewer questions at once",
    );
    e.status = StatusCode::GATEWAY_TIMEOUT;
    e.code = Some("request_timeout");
    e
}

/// The deadline of a request started at `t0` with an optional `timeout` in seconds.
fn deadline(t0: Instant, timeout: Option<&Value>) -> Result<Instant, String> {
    match timeout {
        None | Some(Value::Null) => Ok(t0 + DEFAULT_TIMEOUT),
        Some(v) => match v.as_f64() {
            Some(t) if t.is_finite() && t > 0.0 => {
                Ok(t0 + Duration::from_secs_f64(t).min(DEFAULT_TIMEOUT))
            }
            _ => Err(format!(
                "timeout must be a positive number of seconds (at most {}), got {v}",
                DEFAULT_TIMEOUT.as_secs()
            )),
        },
    }
}

/// Whether a test build's client asked for a non-finite score (only with `--inject-faults`).
fn poisoned(s: &AppState, headers: &HeaderMap) -> bool {
    s.config.inject_faults
        && headers
            .get(FAULT_HEADER)
            .is_some_and(|v| v.as_bytes() == b"nonfinite-logits")
}

/// Softmax in f64 (the logits are finite).
fn softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l)) as f64;
    let exp: Vec<f64> = logits.iter().map(|&l| (l as f64 - max).exp()).collect();
    let sum: f64 = exp.iter().sum();
    exp.into_iter().map(|e| e / sum).collect()
}

/// `1 − H(p) / log K`: how concentrated the distribution is, in [0, 1]. Not a calibrated
/// confidence.
fn concentration(p: &[f64]) -> f64 {
    if p.len() < 2 {
        return 1.0;
    }
    let entropy: f64 = p.iter().filter(|&&x| x > 0.0).map(|&x| -x * x.ln()).sum();
    (1.0 - entropy / (p.len() as f64).ln()).max(0.0)
}

/// SHA-256 of the prompt text, in hex.
fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_and_concentration() {
        let p = softmax(&[1.0, 1.0]);
        assert_eq!(p, vec![0.5, 0.5]);
        assert!(concentration(&p).abs() < 1e-12);
        let sharp = softmax(&[100.0, 0.0, 0.0]);
        assert!(sharp[0] > 0.999_999 && concentration(&sharp) > 0.999);
        assert_eq!(concentration(&[1.0]), 1.0);
    }

    #[test]
    fn timeouts_are_positive_and_capped() {
        let t0 = Instant::now();
        assert_eq!(deadline(t0, None).unwrap(), t0 + DEFAULT_TIMEOUT);
        assert_eq!(
            deadline(t0, Some(&json!(2.5))).unwrap(),
            t0 + Duration::from_millis(2500)
        );
        assert_eq!(
            deadline(t0, Some(&json!(1e9))).unwrap(),
            t0 + DEFAULT_TIMEOUT
        );
        for bad in [json!(0), json!(-1), json!("5"), json!(true)] {
            assert!(deadline(t0, Some(&bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn slots_of_the_real_qwen_tokenizer() {
        let dir = crate::derived::realvocab();
        let model = splash_model::load(&dir).unwrap();
        let slots = AnswerSlots::build(&model).unwrap();
        assert_eq!(slots.len(), MAX_SLOTS);
        assert_eq!(slots.labels(3), ["A", "B", "C"]);
        assert!(slots.labels(MAX_SLOTS).iter().all(|l| l.len() <= 3));
    }
}
