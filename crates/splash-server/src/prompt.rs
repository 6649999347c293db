//! Prompt tokenization, off the async threads and bounded: a text far over the context limit
//! is refused after tokenizing just past the limit, in pieces, so a request body of many
//! megabytes costs neither seconds of an HTTP thread nor gigabytes of token bookkeeping
//! (the tokenizer keeps strings, offsets and masks for every token it produces).

use std::sync::Arc;

use splash_model::{Model, Tokenizer};
use tokio::sync::Semaphore;

use crate::error::ApiError;

/// Texts up to this many bytes are tokenized at once; longer ones a piece at a time.
const PIECE: usize = 256 << 10;

/// Texts longer than a piece tokenized at once (each on a blocking thread, holding a piece's
/// bookkeeping): the others wait, so a burst of huge bodies neither takes every core nor
/// multiplies the memory.
static LARGE: Semaphore = Semaphore::const_new(2);

/// A text's tokens, or at least how many it has when that is over the limit.
#[derive(Debug, PartialEq)]
pub enum Tokens {
    Ids(Vec<u32>),
    /// More than the limit: at least this many tokens.
    Over(usize),
}

/// The tokens of a prompt for generation; over the context limit (`limit` tokens) is a 400
/// `context_length_exceeded`.
pub async fn prompt_ids(
    model: &Arc<Model>,
    limit: usize,
    text: String,
) -> Result<Vec<u32>, ApiError> {
    match tokenize(model, text, limit).await? {
        Tokens::Ids(ids) => Ok(ids),
        Tokens::Over(n) => Err(ApiError::context_length(format!(
            "the prompt has more than {n} tokens but the context limit is {limit} tokens (prompt and output together): shorten the prompt"
        ))),
    }
}

/// Tokenizes `text` on a blocking thread, stopping once it has more than `limit` tokens.
pub async fn tokenize(model: &Arc<Model>, text: String, limit: usize) -> Result<Tokens, ApiError> {
    let _permit = if text.len() > PIECE {
        Some(
            LARGE
                .acquire()
                .await
                .map_err(|e| ApiError::engine(e.to_string()))?,
        )
    } else {
        None
    };
    let model = model.clone();
    tokio::task::spawn_blocking(move || encode_bounded(&model.tokenizer, &text, limit))
        .await
        .map_err(|e| ApiError::engine(format!("tokenizing the prompt failed: {e}")))?
        .map_err(ApiError::bad_request)
}

/// The tokens of `text`, or `Over` once more than `limit` are certain.
///
/// A long text is tokenized in pieces that end after a newline followed by a non-blank
/// character: no pre-token of the Qwen tokenizers spans such a point, so the pieces' tokens
/// are the whole text's. Where a piece has no such point it is cut anyway, and the count is
/// only trusted to a few tokens per cut: the text is tokenized whole at the end when it fits.
fn encode_bounded(tok: &Tokenizer, text: &str, limit: usize) -> Result<Tokens, String> {
    let encode = |t: &str| tok.encode(t).map_err(|e| e.to_string());
    if text.len() <= PIECE {
        let ids = encode(text)?;
        return Ok(if ids.len() > limit {
            Tokens::Over(ids.len())
        } else {
            Tokens::Ids(ids)
        });
    }
    let mut ids = Vec::new();
    let mut cuts = 0usize;
    let mut rest = text;
    while !rest.is_empty() {
        let (piece, clean) = next_piece(rest);
        rest = &rest[piece.len()..];
        cuts += usize::from(!clean);
        ids.extend(encode(piece)?);
        // A cut may split what the whole text tokenizes as one token, or join across it:
        // allow a few tokens each.
        let slack = 4 * cuts;
        if ids.len() > limit.saturating_add(slack) {
            return Ok(Tokens::Over(ids.len() - slack));
        }
    }
    if cuts > 0 {
        ids = encode(text)?;
        if ids.len() > limit {
            return Ok(Tokens::Over(ids.len()));
        }
    }
    Ok(Tokens::Ids(ids))
}

/// The next piece of `text` (at most [`PIECE`] bytes), and whether it ends at a clean point.
fn next_piece(text: &str) -> (&str, bool) {
    if text.len() <= PIECE {
        return (text, true);
    }
    let mut end = PIECE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let window = &text.as_bytes()[..end + 1];
    // After the last newline that the next byte is not blank.
    let clean = (1..window.len()).rev().find(|&i| {
        window[i - 1] == b'\n' && !window[i].is_ascii_whitespace() && text.is_char_boundary(i)
    });
    match clean {
        Some(i) => (&text[..i], true),
        None => (&text[..end], false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real Qwen3.5 tokenizer (of the committed real-vocabulary fixture).
    fn tokenizer() -> splash_model::Tokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/qwen35-realvocab");
        splash_model::Tokenizer::from_dir(&dir).unwrap()
    }

    /// A text of lines of prose, code, digits, blank runs and non-ASCII, longer than a piece.
    fn long_text(bytes: usize) -> String {
        let lines = [
            "The quick brown fox jumps over the lazy dog.",
            "    fn main() { println!(\"héllo, wörld\"); }",
            "",
            "12345 67890 — ünïcödé  «quotes»  日本語のテキスト",
            "\t\tindented\t\ttabs   and   spaces   ",
            "<|im_start|>user",
        ];
        let mut s = String::new();
        let mut i = 0;
        while s.len() < bytes {
            s.push_str(lines[i % lines.len()]);
            s.push('\n');
            if i % 7 == 0 {
                s.push_str("\n\n");
            }
            i += 1;
        }
        s
    }

    #[test]
    fn pieces_give_the_whole_texts_tokens() {
        let tok = &tokenizer();
        let text = long_text(3 * PIECE + 12345);
        let whole = tok.encode(&text).unwrap();
        assert_eq!(
            encode_bounded(tok, &text, usize::MAX).unwrap(),
            Tokens::Ids(whole.clone())
        );
        // Over the limit: stops with a count above it, at most the true count.
        match encode_bounded(tok, &text, 1000).unwrap() {
            Tokens::Over(n) => assert!(n > 1000 && n <= whole.len(), "{n}"),
            t => panic!("{t:?}"),
        }
        assert_eq!(
            encode_bounded(tok, &text, whole.len()).unwrap(),
            Tokens::Ids(whole.clone())
        );
        assert!(matches!(
            encode_bounded(tok, &text, whole.len() - 1).unwrap(),
            Tokens::Over(_)
        ));
    }

    #[test]
    fn a_text_without_line_breaks_is_cut_and_counted_whole() {
        let tok = &tokenizer();
        let text = "word ".repeat(PIECE / 2);
        let whole = tok.encode(&text).unwrap();
        assert_eq!(
            encode_bounded(tok, &text, usize::MAX).unwrap(),
            Tokens::Ids(whole.clone())
        );
        assert!(matches!(
            encode_bounded(tok, &text, 100).unwrap(),
            Tokens::Over(n) if n > 100
        ));
        // Cuts land on character boundaries.
        let wide = "é".repeat(PIECE);
        let (piece, clean) = next_piece(&wide);
        assert!(!clean && piece.len() <= PIECE && wide.is_char_boundary(piece.len()));
    }
}
