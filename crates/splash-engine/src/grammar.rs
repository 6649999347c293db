//! Constrained decoding with llguidance: a token mask per step so the output follows a JSON
//! schema or a Lark grammar.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use splash_model::Model;
use toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie};

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Constraint {
    /// A JSON document valid against this schema.
    JsonSchema(serde_json::Value),
    /// A Lark grammar (llguidance dialect; may embed `%json {...}`).
    Lark(String),
}

/// A constraint and when it starts to apply.
#[derive(Clone, Debug)]
pub struct GrammarRequest {
    pub constraint: Constraint,
    /// Apply the constraint only once these tokens were generated, in this order (`</think>`,
    /// so the reasoning stays free; `<tool_call>`, for a grammar of the calls alone); empty:
    /// from the first token. The draft keeps speculating until the last of them.
    pub after: Vec<u32>,
}

/// A model's [`GrammarFactory`], built by its first user and shared by clones: the engine, its
/// warm-up thread and the server's request checks hold one copy of the tables (hundreds of MB
/// for a 248K vocabulary).
#[derive(Clone, Default)]
pub struct GrammarTables(Arc<OnceLock<Result<Arc<GrammarFactory>, String>>>);

impl GrammarTables {
    /// The tables for `model`, built now unless built already (a build in progress is waited
    /// for, not repeated).
    pub fn get(&self, model: &Model) -> Result<&Arc<GrammarFactory>, &str> {
        self.0
            .get_or_init(|| GrammarFactory::new(model).map(Arc::new))
            .as_ref()
            .map_err(String::as_str)
    }
}

/// Token tables and compiled-lexer caches shared by every constrained request of a model.
pub struct GrammarFactory {
    factory: ParserFactory,
    /// Fresh matchers of recent grammars, most recent last: an agent sends the same tools, so
    /// the same call grammar, with every turn, and compiling it takes milliseconds.
    compiled: Mutex<Vec<(Constraint, Matcher)>>,
}

/// How many compiled grammars [`GrammarFactory`] keeps.
const COMPILED_KEPT: usize = 16;

impl GrammarFactory {
    /// Builds the token trie from the model's tokenizer.json (takes a moment for a large
    /// vocabulary; done once, on the first constrained request).
    pub fn new(model: &Model) -> Result<Self, String> {
        let json = model.tokenizer.json().map_err(|e| e.to_string())?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| format!("tokenizer.json: {e}"))?;
        let vocab = model.config.vocab_size;
        // The embedding may have more rows than the tokenizer has tokens: those ids never
        // decode to anything, so they are never allowed.
        words.resize(vocab.max(words.len()), Vec::new());
        let eos = model.generation.eos_token_ids.first().copied().unwrap_or(0);
        let trie = TokTrie::from(&TokRxInfo::new(words.len() as u32, eos), &words);
        let env: toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Self {
            factory,
            compiled: Mutex::new(Vec::new()),
        })
    }

    /// A fresh matcher for `constraint`; an invalid schema or grammar is an error.
    pub fn start(&self, constraint: &Constraint) -> Result<GrammarState, String> {
        let mut kept = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        let matcher = match kept.iter().position(|(c, _)| c == constraint) {
            Some(i) => {
                let entry = kept.remove(i);
                let matcher = entry.1.deep_clone();
                kept.push(entry);
                matcher
            }
            None => {
                drop(kept);
                let matcher = self.compile(constraint)?;
                let mut kept = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
                if kept.len() == COMPILED_KEPT {
                    kept.remove(0);
                }
                kept.push((constraint.clone(), matcher.deep_clone()));
                matcher
            }
        };
        Ok(GrammarState {
            matcher,
            mask_time: Duration::ZERO,
            masks: 0,
        })
    }

    fn compile(&self, constraint: &Constraint) -> Result<Matcher, String> {
        let grammar = match constraint {
            Constraint::JsonSchema(schema) => TopLevelGrammar::from_lark(json_document(schema)),
            Constraint::Lark(src) => TopLevelGrammar::from_lark(src.clone()),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        match matcher.get_error() {
            Some(e) => Err(e),
            None => Ok(matcher),
        }
    }
}

/// The Lark grammar of a JSON document that follows `schema`, after at most two newlines:
/// Qwen's template puts "\n\n" between `</think>` and the answer, and a grammar that forbids
/// it pushes the model off its distribution before the document starts.
fn json_document(schema: &serde_json::Value) -> String {
    format!(
        "start: LEAD? document\nLEAD: /\\n\\n?/\ndocument: %json {}\n",
        with_json_layout(schema.clone())
    )
}

/// Fixes the JSON layout to Python's `json.dumps` style (`", "`, `": "`, no other whitespace)
/// unless the schema chooses its own (`x-guidance`). With free whitespace a weak or random model
/// can fill the whole output budget with blanks and never close the document.
pub fn with_json_layout(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
        });
    }
    schema
}

/// One sequence's position in its grammar.
pub struct GrammarState {
    matcher: Matcher,
    mask_time: Duration,
    masks: usize,
}

impl GrammarState {
    /// Sets every token the grammar does not allow next to −∞.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let t0 = Instant::now();
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        for (i, l) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(i as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        self.mask_time += t0.elapsed();
        self.masks += 1;
        Ok(())
    }

    /// Advances past a sampled token.
    pub fn consume(&mut self, token: u32) -> Result<(), String> {
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    /// Takes back the last `tokens` consumed tokens.
    pub fn rollback(&mut self, tokens: usize) -> Result<(), String> {
        self.matcher.rollback(tokens).map_err(|e| e.to_string())
    }

    /// True when the grammar is complete and nothing more may follow.
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Total time spent computing masks, and how many were computed.
    pub fn mask_stats(&self) -> (Duration, usize) {
        (self.mask_time, self.masks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grammar started again comes from the kept copy: each matcher goes its own way.
    #[test]
    fn a_kept_grammar_starts_fresh_each_time() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
        let model = splash_model::load(&dir).unwrap();
        let factory = GrammarFactory::new(&model).unwrap();
        let c = Constraint::Lark("start: \"ab\" | \"cd\"\n".into());
        let ids = |t: &str| model.tokenizer.encode(t).unwrap();
        let mut first = factory.start(&c).unwrap();
        for t in ids("ab") {
            first.consume(t).unwrap();
        }
        assert!(first.is_done());
        let mut second = factory.start(&c).unwrap();
        assert!(!second.is_done());
        for t in ids("cd") {
            second.consume(t).unwrap();
        }
        assert!(second.is_done());
        assert_eq!(factory.compiled.lock().unwrap().len(), 1);
    }
}
