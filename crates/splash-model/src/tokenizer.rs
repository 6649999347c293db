//! The checkpoint's Hugging Face tokenizer, and incremental detokenisation for streaming.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::ModelError;

/// A `tokenizer.json` tokenizer (read plain, or gzip-compressed as `tokenizer.json.gz`).
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

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
        Ok(Self { inner, path })
    }

    /// The tokenizer.json document itself (read again from disk: it is only needed to build
    /// grammar token tables, once).
    pub fn json(&self) -> Result<serde_json::Value, ModelError> {
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
