//! The output constraint of a request, whatever API it came through: a JSON format, a forced
//! tool call, or strict tool arguments, applied after the reasoning.

use serde_json::Value;
use splash_engine::{Constraint, GrammarRequest};

use crate::error::ApiError;
use crate::state::AppState;
use crate::tool_calls::{any_strict, call_grammar, CallGrammar};

/// Picks the constraint: `format` (the API's JSON format, named `format_param` in errors), or a
/// call to one of `tools` when `forced` (`Some(name or any)`), or schema-checked arguments when
/// a tool in `raw_tools` (as the client sent them) is `strict`. A format and a forced call
/// exclude each other; a format wins over strict tools.
pub fn output_constraint(
    s: &AppState,
    format: Option<Constraint>,
    format_param: &str,
    tools: &[Value],
    raw_tools: &[Value],
    forced: Option<Option<String>>,
) -> Result<Option<Constraint>, ApiError> {
    let special_tags = s.model.tokenizer.is_special("<tool_call>");
    let mode = match (format, forced) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                format_param,
                format!("{format_param} cannot be combined with a forced tool_choice: the answer is either a tool call or a JSON document"),
            ))
        }
        (Some(f), None) => return Ok(Some(f)),
        (None, Some(only)) => (CallGrammar::Forced, only),
        (None, None) if any_strict(raw_tools) && !tools.is_empty() => (CallGrammar::Strict, None),
        (None, None) => return Ok(None),
    };
    call_grammar(tools, mode.1.as_deref(), mode.0, special_tags)
        .map(|g| Some(Constraint::Lark(g)))
        .map_err(|e| ApiError::invalid("tool_choice", e))
}

/// The engine's grammar request: the constraint starts after `</think>` when the prompt leaves
/// the model reasoning, so the reasoning stays free.
pub fn grammar_request(
    s: &AppState,
    constraint: Option<Constraint>,
    in_reasoning: bool,
) -> Option<GrammarRequest> {
    constraint.map(|c| GrammarRequest {
        constraint: c,
        after_token: if in_reasoning {
            s.model.tokenizer.token_to_id("</think>")
        } else {
            None
        },
    })
}
