//! The checkpoint's Hugging Face tokenizer, and incremental detokenisation for streaming.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::{json, Value as Json};

use crate::error::ModelError;
use crate::gguf::{GgufHeader, Value};

/// A `tokenizer.json` tokenizer (read plain, or gzip-compressed as `tokenizer.json.gz`), or
/// one built from the vocabulary in a GGUF file's metadata.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    /// The tokenizer.json text when it was built in memory (GGUF), not read from `path`
    /// (kept as text: a parsed document of a 248K vocabulary is many times larger).
    built: Option<String>,
}

/// Pre-tokenizer split patterns of the byte-level BPE vocabularies splash serves, by the
/// `tokenizer.ggml.pre` name llama.cpp's converter writes, with `ignore_merges` as the HF
/// tokenizer sets it.
const PRE_TOKENIZERS: [(&str, &str, bool); 3] = [
    (
        "qwen35",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        true,
    ),
    (
        "qwen2",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        false,
    ),
    (
        "deepseek-r1-qwen",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        false,
    ),
];

/// GGUF token types (llama.cpp `llama_token_type`).
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;

impl Tokenizer {
    /// Loads `dir/tokenizer.json`, else `dir/tokenizer.json.gz`.
    pub fn from_dir(dir: &Path) -> Result<Self, ModelError> {
        let plain = dir.join("tokenizer.json");
        let gz = dir.join("tokenizer.json.gz");
        let path = if plain.exists() {
            plain
        } else if gz.exists() {
            gz
        } else {
            return Err(ModelError::Tokenizer {
                path: plain,
                message: "not found: splash needs the checkpoint's Hugging Face tokenizer.json next to config.json".into(),
            });
        };
        let bytes = read_maybe_gz(&path)?;
        let inner =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| ModelError::Tokenizer {
                path: path.clone(),
                message: format!("not a valid tokenizer.json: {e}"),
            })?;
        Ok(Self {
            inner,
            path,
            built: None,
        })
    }

    /// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata: a
    /// byte-level BPE (`model` "gpt2") with the Qwen pre-tokenizer, control and user-defined
    /// tokens as added tokens.
    pub fn from_gguf(path: &Path, h: &GgufHeader) -> Result<Self, ModelError> {
        let err = |message: String| ModelError::Tokenizer {
            path: path.to_path_buf(),
            message,
        };
        let model = h.get("tokenizer.ggml.model").and_then(Value::as_str);
        if model != Some("gpt2") {
            return Err(err(format!(
                "tokenizer.ggml.model is {model:?}; splash reads byte-level BPE vocabularies (\"gpt2\")"
            )));
        }
        let pre = h
            .get("tokenizer.ggml.pre")
            .and_then(Value::as_str)
            .unwrap_or("default");
        let Some(&(_, pattern, ignore_merges)) = PRE_TOKENIZERS.iter().find(|p| p.0 == pre) else {
            let known: Vec<&str> = PRE_TOKENIZERS.iter().map(|p| p.0).collect();
            return Err(err(format!(
                "tokenizer.ggml.pre `{pre}` is not supported (splash knows {})",
                known.join(", ")
            )));
        };
        let strings = |key: &str| -> Result<Vec<&str>, ModelError> {
            h.get(key)
                .and_then(Value::as_array)
                .ok_or_else(|| err(format!("metadata `{key}` is missing")))?
                .iter()
                .map(|v| {
                    v.as_str()
                        .ok_or_else(|| err(format!("`{key}` holds a non-string")))
                })
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        let types: Vec<i64> = match h.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
            Some(t) => t.iter().map(|v| v.as_f64().unwrap_or(1.0) as i64).collect(),
            None => vec![1; tokens.len()],
        };
        let vocab: serde_json::Map<String, Json> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), json!(i)))
            .collect();
        let merges: Vec<Json> = merges
            .iter()
            .map(|m| {
                let (a, b) = m
                    .split_once(' ')
                    .ok_or_else(|| err(format!("merge `{m}` is not two tokens")))?;
                Ok(json!([a, b]))
            })
            .collect::<Result<_, ModelError>>()?;
        let added: Vec<Json> = tokens
            .iter()
            .zip(&types)
            .enumerate()
            .filter(|(_, (_, &ty))| ty == TOKEN_CONTROL || ty == TOKEN_USER_DEFINED)
            .map(|(id, (t, &ty))| {
                json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": ty == TOKEN_CONTROL})
            })
            .collect();
        let doc = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            ]},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": ignore_merges,
                      "vocab": vocab, "merges": merges},
        });
        let text = doc.to_string();
        drop(doc);
        let inner = tokenizers::Tokenizer::from_bytes(text.as_bytes()).map_err(|e| {
            err(format!(
                "cannot build the tokenizer from GGUF metadata: {e}"
            ))
        })?;
        Ok(Self {
            inner,
            path: path.to_path_buf(),
            built: Some(text),
        })
    }

    /// The text of token `id`, if it exists (special tokens included).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The tokenizer.json document itself (read again from disk: it is only needed to build
    /// grammar token tables, once).
    pub fn json(&self) -> Result<serde_json::Value, ModelError> {
        if let Some(text) = &self.built {
            return serde_json::from_str(text).map_err(|source| ModelError::Json {
                path: self.path.clone(),
                source,
            });
        }
        let bytes = read_maybe_gz(&self.path)?;
        serde_json::from_slice(&bytes).map_err(|source| ModelError::Json {
            path: self.path.clone(),
            source,
        })
    }

    fn err(&self, e: impl std::fmt::Display) -> ModelError {
        ModelError::Tokenizer {
            path: self.path.clone(),
            message: e.to_string(),
        }
    }

    /// Token ids of `text`. Special tokens written in the text (`<|im_start|>`) become their
    /// ids; no BOS/EOS is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let enc = self.inner.encode(text, false).map_err(|e| self.err(e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`; `skip_special` drops special tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, ModelError> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| self.err(e))
    }

    /// Id of a token string, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// True when `token` is a special added token (decoded only with special tokens shown;
    /// grammars must name it as a token, not spell it as text).
    pub fn is_special(&self, token: &str) -> bool {
        self.inner.token_to_id(token).is_some_and(|id| {
            self.inner
                .get_added_tokens_decoder()
                .get(&id)
                .is_some_and(|t| t.special)
        })
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// The bytes of `path`, gunzipped when it ends in `.gz`.
fn read_maybe_gz(path: &Path) -> Result<Vec<u8>, ModelError> {
    if path.extension().is_some_and(|e| e == "gz") {
        let f = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
        let mut b = Vec::new();
        flate2::read::GzDecoder::new(f)
            .read_to_end(&mut b)
            .map_err(|e| ModelError::io(path, e))?;
        Ok(b)
    } else {
        std::fs::read(path).map_err(|e| ModelError::io(path, e))
    }
}

/// Turns a stream of token ids into text pieces, holding back bytes of an unfinished UTF-8
/// character (a token may end in the middle of one).
#[derive(Default, Debug, Clone)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl StreamDecoder {
    /// A decoder with no tokens yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a token; returns the text it completes, if any.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<Option<String>, ModelError> {
        self.ids.push(id);
        // Decoding a window that starts a little before the new tokens keeps the tokenizer's
        // handling of leading spaces and byte fallback consistent.
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], false)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], false)?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.starts_with(&prefix) {
            let piece = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            return Ok(Some(piece));
        }
        Ok(None)
    }

    /// Whatever text is still held back (an incomplete character at the end of the stream).
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<Option<String>, ModelError> {
        if self.read_offset == self.ids.len() {
            return Ok(None);
        }
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], false)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], false)?;
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        Ok(full
            .get(prefix.len()..)
            .map(str::to_string)
            .filter(|s| !s.is_empty()))
    }
}
