//! Token sampling: penalties, temperature, top-k, top-p, min-p; seeded and reproducible.

pub(crate) use splash_backend::cpu::argmax;
use splash_backend::cpu::top_k;

/// Temperatures below this are greedy (argmax), as in vLLM (`_SAMPLING_EPS`): dividing
/// logits by a tinier one overflows them, and its distribution is the argmax's anyway.
pub const GREEDY_TEMPERATURE: f32 = 1e-5;

/// How the next token is chosen. The defaults sample nothing away: temperature 1, no
/// truncation, no penalties. Temperatures below [`GREEDY_TEMPERATURE`] (0 included) mean
/// greedy (argmax).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one (0: none).
    pub min_p: f32,
    /// Subtracted once from the logit of every token already generated (OpenAI semantics).
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of every token already generated.
    pub frequency_penalty: f32,
    /// CTRL-style penalty on tokens in the prompt or output: positive logits are divided by
    /// it, negative ones multiplied (1: off).
    pub repetition_penalty: f32,
    /// RNG seed; `None` draws one from the OS.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// True when the next token is the argmax (temperature below [`GREEDY_TEMPERATURE`]).
    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_TEMPERATURE
    }

    /// Checks ranges; the message names the parameter and its valid range.
    pub fn validate(&self) -> Result<(), String> {
        let check = |ok: bool, msg: &str| if ok { Ok(()) } else { Err(msg.to_string()) };
        check(
            self.temperature.is_finite() && self.temperature >= 0.0,
            "temperature must be a finite number ≥ 0",
        )?;
        check(
            self.top_p > 0.0 && self.top_p <= 1.0,
            "top_p must be in (0, 1]",
        )?;
        check((0.0..=1.0).contains(&self.min_p), "min_p must be in [0, 1]")?;
        check(
            self.presence_penalty.is_finite() && self.presence_penalty.abs() <= 2.0,
            "presence_penalty must be in [-2, 2]",
        )?;
        check(
            self.frequency_penalty.is_finite() && self.frequency_penalty.abs() <= 2.0,
            "frequency_penalty must be in [-2, 2]",
        )?;
        check(
            self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0,
            "repetition_penalty must be > 0",
        )
    }
}

/// Samples tokens for one sequence with its own RNG stream.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: Xoshiro256,
}

impl Sampler {
    /// A sampler seeded from `params.seed`, or from the OS when absent.
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(random_seed);
        Self {
            params,
            rng: Xoshiro256::new(seed),
        }
    }

    /// The parameters this sampler applies.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// True when the next token is the argmax of the logits as they come (greedy, no
    /// penalties): a forward pass then need not return rows, only their argmax.
    pub fn argmax_suffices(&self) -> bool {
        let p = &self.params;
        p.is_greedy()
            && p.repetition_penalty == 1.0
            && p.presence_penalty == 0.0
            && p.frequency_penalty == 0.0
    }

    /// Picks the next token from `logits` (modified in place). `prompt` and `output` are the
    /// tokens the penalties look at.
    pub fn sample(&mut self, logits: &mut [f32], prompt: &[u32], output: &[u32]) -> u32 {
        let dist = self.distribution(logits, prompt, output);
        if self.params.is_greedy() {
            return dist.entries[0].0;
        }
        self.draw(&dist)
    }

    /// The distribution [`sample`](Self::sample) draws from: penalties, temperature and the
    /// truncations applied to `logits` (modified in place). Greedy is the point mass on the
    /// argmax.
    pub fn distribution(&self, logits: &mut [f32], prompt: &[u32], output: &[u32]) -> Distribution {
        self.apply_penalties(logits, prompt, output);
        self.truncated(logits)
    }

    /// The distribution of `logits` under temperature and truncation, without penalties (a
    /// draft's proposal distribution).
    pub fn truncated(&self, logits: &[f32]) -> Distribution {
        let p = &self.params;
        if p.is_greedy() {
            return Distribution::point(argmax(logits));
        }
        // Candidates sorted by logit, best first; ties keep the lower id first. With top-k,
        // one pass keeps the k best (a real vocabulary row has 248,320 entries). Ranked by the
        // raw logit (a positive temperature keeps the order); the temperature divides the
        // differences to the best in f64 below, which cannot overflow.
        let finite = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, l));
        let cand = if p.top_k > 0 {
            top_k(finite, p.top_k)
        } else {
            top_k(finite, usize::MAX)
        };
        if cand.is_empty() {
            return Distribution::point(argmax(logits));
        }
        // Softmax over the survivors, in f64 so long tails do not lose mass. Every exponent is
        // ≤ 0 and the best's is 0: the sum is in [1, n], never infinite or NaN.
        let (max, t) = (cand[0].1 as f64, p.temperature as f64);
        let mut probs: Vec<f64> = cand
            .iter()
            .map(|c| ((c.1 as f64 - max) / t).exp())
            .collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= sum);
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, &q) in probs.iter().enumerate() {
                acc += q;
                if acc >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p as f64;
            keep = keep.min(probs.iter().take_while(|&&q| q >= floor).count().max(1));
        }
        Distribution {
            entries: cand[..keep]
                .iter()
                .zip(&probs[..keep])
                .map(|(c, &q)| (c.0, q))
                .collect(),
        }
    }

    /// Draws a token from `dist` (its weights need not sum to 1).
    pub fn draw(&mut self, dist: &Distribution) -> u32 {
        let total: f64 = dist.entries.iter().map(|e| e.1).sum();
        let mut u = self.rng.next_f64() * total;
        for &(t, q) in &dist.entries {
            if u < q {
                return t;
            }
            u -= q;
        }
        dist.entries.last().expect("a distribution has an entry").0
    }

    /// A uniform draw in [0, 1) from this sequence's stream.
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    /// Repetition, presence and frequency penalties. Each distinct token is penalised once
    /// (frequency by its count); per-vocabulary arrays instead of hash sets, since a verify
    /// step penalises a dozen rows against a prompt of tens of thousands of tokens.
    fn apply_penalties(&self, logits: &mut [f32], prompt: &[u32], output: &[u32]) {
        let p = &self.params;
        let v = logits.len();
        if p.repetition_penalty != 1.0 {
            let mut seen = vec![0u64; v.div_ceil(64)];
            for &t in prompt.iter().chain(output) {
                let t = t as usize;
                if t < v && seen[t / 64] & (1 << (t % 64)) == 0 {
                    seen[t / 64] |= 1 << (t % 64);
                    let l = &mut logits[t];
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            let mut counts = vec![0u32; v];
            for &t in output {
                if let Some(n) = counts.get_mut(t as usize) {
                    *n += 1;
                }
            }
            for &t in output {
                let t = t as usize;
                if t < v && counts[t] > 0 {
                    logits[t] -= p.presence_penalty + p.frequency_penalty * counts[t] as f32;
                    counts[t] = 0;
                }
            }
        }
    }
}

/// A sparse distribution over tokens: `(token, weight)`, most likely first. The weights of
/// [`Sampler::distribution`] sum to 1 up to the truncations (top-p, min-p keep the head of a
/// normalised softmax without renormalising; [`Distribution::prob`] normalises).
#[derive(Clone, Debug, PartialEq)]
pub struct Distribution {
    pub entries: Vec<(u32, f64)>,
}

impl Distribution {
    /// All mass on `token`.
    pub fn point(token: u32) -> Self {
        Self {
            entries: vec![(token, 1.0)],
        }
    }

    /// Normalised probability of `token` (0 outside the support).
    pub fn prob(&self, token: u32) -> f64 {
        let total: f64 = self.entries.iter().map(|e| e.1).sum();
        self.entries
            .iter()
            .find(|e| e.0 == token)
            .map_or(0.0, |e| e.1 / total)
    }

    /// The same distribution with weights summing to 1.
    pub fn normalized(mut self) -> Self {
        let total: f64 = self.entries.iter().map(|e| e.1).sum();
        self.entries.iter_mut().for_each(|e| e.1 /= total);
        self
    }
}

/// A seed that differs between calls and processes (std's per-process random hasher keys mixed
/// with the clock).
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// xoshiro256** seeded through splitmix64: small, fast and identical on every platform.
#[derive(Clone, Debug)]
struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    fn new(seed: u64) -> Self {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(params: SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(params);
        (0..n)
            .map(|_| s.sample(&mut logits.to_vec(), &[], &[]))
            .collect()
    }

    #[test]
    fn greedy_takes_argmax_with_first_tie() {
        assert_eq!(
            draw(SamplingParams::greedy(), &[0.1, 3.0, 3.0, -1.0], 3),
            vec![1, 1, 1]
        );
    }

    #[test]
    fn same_seed_same_tokens_and_distribution_follows_softmax() {
        let logits = [0.0f32, (3.0f32).ln(), f32::NEG_INFINITY];
        let p = SamplingParams {
            seed: Some(7),
            ..Default::default()
        };
        let a = draw(p.clone(), &logits, 4000);
        assert_eq!(a, draw(p, &logits, 4000));
        let ones = a.iter().filter(|&&t| t == 1).count() as f64 / 4000.0;
        assert!(
            (ones - 0.75).abs() < 0.03,
            "token 1 drawn {ones}, expected 0.75"
        );
        assert!(!a.contains(&2), "-inf logit must never be drawn");
    }

    #[test]
    fn truncations_keep_only_the_head() {
        let logits = [4.0f32, 3.0, 2.0, 1.0, 0.0];
        let seed = Some(3);
        let k = draw(
            SamplingParams {
                top_k: 2,
                seed,
                ..Default::default()
            },
            &logits,
            500,
        );
        assert!(k.iter().all(|&t| t < 2));
        // top_p 0.5: token 0 alone has p ≈ 0.64
        let p = draw(
            SamplingParams {
                top_p: 0.5,
                seed,
                ..Default::default()
            },
            &logits,
            200,
        );
        assert!(p.iter().all(|&t| t == 0));
        // min_p 0.3: tokens with p ≥ 0.3·p0 are 0 and 1 (e^-1 ≈ 0.37)
        let m = draw(
            SamplingParams {
                min_p: 0.3,
                seed,
                ..Default::default()
            },
            &logits,
            500,
        );
        assert!(m.iter().all(|&t| t < 2) && m.contains(&1));
    }

    #[test]
    fn penalties_change_the_greedy_choice() {
        let mut s = Sampler::new(SamplingParams {
            presence_penalty: 1.5,
            ..SamplingParams::greedy()
        });
        assert_eq!(s.sample(&mut [2.0, 1.0], &[], &[0]), 1);
        let mut s = Sampler::new(SamplingParams {
            frequency_penalty: 0.6,
            ..SamplingParams::greedy()
        });
        assert_eq!(s.sample(&mut [2.0, 1.0], &[], &[0]), 0);
        assert_eq!(s.sample(&mut [2.0, 1.0], &[], &[0, 0]), 1);
        let mut s = Sampler::new(SamplingParams {
            repetition_penalty: 3.0,
            ..SamplingParams::greedy()
        });
        assert_eq!(
            s.sample(&mut [2.0, 1.0], &[0], &[]),
            1,
            "prompt tokens count for repetition"
        );
    }

    /// The penalties as first written (hash set and map): each distinct token once.
    fn reference_penalties(p: &SamplingParams, logits: &mut [f32], prompt: &[u32], output: &[u32]) {
        if p.repetition_penalty != 1.0 {
            let mut seen = std::collections::HashSet::new();
            for &t in prompt.iter().chain(output) {
                if seen.insert(t) {
                    if let Some(l) = logits.get_mut(t as usize) {
                        *l = if *l > 0.0 {
                            *l / p.repetition_penalty
                        } else {
                            *l * p.repetition_penalty
                        };
                    }
                }
            }
        }
        let mut counts = std::collections::HashMap::<u32, u32>::new();
        for &t in output {
            *counts.entry(t).or_default() += 1;
        }
        for (t, n) in counts {
            if let Some(l) = logits.get_mut(t as usize) {
                *l -= p.presence_penalty + p.frequency_penalty * n as f32;
            }
        }
    }

    #[test]
    fn penalties_match_their_definition_bit_for_bit() {
        let params = SamplingParams {
            repetition_penalty: 1.3,
            presence_penalty: 0.7,
            frequency_penalty: 0.35,
            ..SamplingParams::greedy()
        };
        let s = Sampler::new(params.clone());
        let mut x = 11u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let v = 300;
        let logits: Vec<f32> = (0..v)
            .map(|_| (next() % 2000) as f32 / 100.0 - 10.0)
            .collect();
        // Repeated tokens, and ids past the vocabulary (ignored).
        let prompt: Vec<u32> = (0..500).map(|_| (next() % 320) as u32).collect();
        let output: Vec<u32> = (0..200).map(|_| (next() % 40) as u32 * 8).collect();
        let (mut got, mut want) = (logits.clone(), logits);
        s.apply_penalties(&mut got, &prompt, &output);
        reference_penalties(&params, &mut want, &prompt, &output);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
    }

    #[test]
    fn tiny_temperatures_are_greedy_and_logits_never_overflow() {
        let logits = [1.0f32, 5.0, 4.9, -3.0];
        for temperature in [0.0, 1e-45, 1e-40, 1e-38, 1e-30, 1e-6] {
            let p = SamplingParams {
                temperature,
                seed: Some(1),
                ..Default::default()
            };
            assert!(p.is_greedy(), "temperature {temperature}");
            assert_eq!(
                draw(p, &logits, 50),
                vec![1; 50],
                "temperature {temperature}"
            );
        }
        // Just above the threshold, logits near f32's limit: the scaled differences would
        // overflow f32, not f64; the best token keeps all the mass.
        let huge = [3e38f32, -3e38, 2.9e38, 0.0];
        let p = SamplingParams {
            temperature: 2e-5,
            seed: Some(1),
            ..Default::default()
        };
        assert!(!p.is_greedy());
        let d = Sampler::new(p.clone()).truncated(&huge);
        assert!(d.entries.iter().all(|e| e.1.is_finite()), "{d:?}");
        assert_eq!(draw(p, &huge, 50), vec![0; 50]);
    }

    #[test]
    fn validation_names_the_parameter() {
        let e = SamplingParams {
            top_p: 0.0,
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.contains("top_p"));
    }
}
