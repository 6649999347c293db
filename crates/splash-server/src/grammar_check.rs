//! Output constraints are checked before a request is queued: a schema or tool grammar that
//! cannot be compiled, or that admits no document at all (`{"$ref": "#"}` refers only to
//! itself), is a 400 that names the field, instead of an engine failure after the answer began.

use std::sync::Arc;

use splash_engine::{with_json_layout, Constraint, GrammarRequest, GrammarTables};

use crate::constraint::OutputConstraint;
use splash_model::Model;

use crate::error::ApiError;

/// Compiles `constraint` with `model`'s `tables` and computes its first mask, off the async
/// threads, and returns the engine's grammar request for it (`in_reasoning`: the prompt leaves
/// the model reasoning). `format_param` names the request's JSON-format field (a schema
/// constraint); a grammar comes from `tools`. An optional constraint that fails is dropped.
pub async fn check(
    model: &Arc<Model>,
    tables: &GrammarTables,
    constraint: Option<OutputConstraint>,
    in_reasoning: bool,
    format_param: &str,
) -> Result<Option<GrammarRequest>, ApiError> {
    let Some(c) = constraint else {
        return Ok(None);
    };
    let (param, what, probe) = match &c.constraint {
        // The document alone, without the blank lines the engine's grammar allows first: a
        // schema without any document then has no first token.
        Constraint::JsonSchema(schema) => (
            format_param.to_string(),
            "the JSON schema",
            Constraint::Lark(format!(
                "start: %json {}\n",
                with_json_layout(schema.clone())
            )),
        ),
        Constraint::Lark(src) => (
            "tools".to_string(),
            "the tools' parameter schemas",
            Constraint::Lark(src.clone()),
        ),
    };
    let (shared, tables) = (model.clone(), tables.clone());
    let checked = tokio::task::spawn_blocking(move || -> Result<(), Option<String>> {
        // Tables that cannot be built are the engine's to report (constrained decoding is
        // unavailable for this model); the request goes on to get that answer.
        let Ok(factory) = tables.get(&shared) else {
            return Ok(());
        };
        let mut state = factory.start(&probe).map_err(Some)?;
        let mut logits = vec![0.0f32; shared.config.vocab_size];
        state.mask(&mut logits).map_err(|_| None)
    })
    .await
    .map_err(|e| ApiError::engine(format!("checking the output constraint failed: {e}")))?;
    let Err(e) = checked else {
        return Ok(Some(c.grammar_request(model, in_reasoning)));
    };
    if c.optional {
        let why = e.as_deref().map_or("it admits nothing".into(), short);
        tracing::warn!(
            "the tools' call grammar cannot be used ({why}): calls under `auto` go unchecked"
        );
        return Ok(None);
    }
    Err({
        let msg = match e {
            Some(compile) => format!(
                "{what} in `{param}` cannot be used as an output constraint: {}",
                short(&compile)
            ),
            None => format!(
                "{what} in `{param}` admits no JSON value (a schema that only refers to itself, such as {{\"$ref\": \"#\"}}, has none): give it a type or properties"
            ),
        };
        ApiError::invalid(&param, msg)
    })
}

/// The first line of a grammar error, without the position in the grammar splash wrote
/// (`at 3(11): `) and without parser internals; at most 300 characters.
pub fn short(error: &str) -> String {
    let line = error.lines().next().unwrap_or_default().trim();
    let line = match line.split_once("): ") {
        Some((at, rest))
            if at
                .strip_prefix("at ")
                .is_some_and(|p| p.chars().all(|c| c.is_ascii_digit() || c == '(')) =>
        {
            rest
        }
        _ => line,
    };
    let mut out: String = line.chars().take(300).collect();
    if out.len() < line.len() {
        out.push('…');
    }
    out
}

/// The answer to an engine failure: a constraint with no way forward (its schema admits
/// nothing at this point) is the request's fault, 400; anything else is 500. Either way the
/// message leaves out the grammar parser's internal state.
pub fn engine_failure(message: &str) -> ApiError {
    let first = message.lines().next().unwrap_or_default();
    if first.starts_with("the output constraint failed") && first.contains("NoExtensionBias") {
        ApiError::bad_request(
            "the output constraint admits nothing more at this point of the answer (a schema part that only refers to itself, such as {\"$ref\": \"#\"}, has no value): fix the schema",
        )
    } else if first.starts_with("the output constraint") {
        ApiError::engine(short(message))
    } else {
        ApiError::engine(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar_errors_are_short() {
        let e = "at 3(11): failed to compile JSON schema: Unimplemented keys: [\"not\"]\n   1 | start: LEAD? document";
        assert_eq!(
            short(e),
            "failed to compile JSON schema: Unimplemented keys: [\"not\"]"
        );
        let long = "x".repeat(1000);
        assert_eq!(short(&long).chars().count(), 301);
        let lazy = "the output constraint failed: NoExtensionBias\n<state>\nTokens: ⟦\\n\\n⟧";
        let e = engine_failure(lazy);
        assert_eq!(e.status.as_u16(), 400);
        assert!(!e.message.contains("<state>") && e.message.contains("$ref"));
        let other = engine_failure("the output constraint failed: lexer error\n<state>\nx");
        assert_eq!(other.status.as_u16(), 500);
        assert!(!other.message.contains("<state>"));
        assert_eq!(engine_failure("out of memory").message, "out of memory");
    }
}
