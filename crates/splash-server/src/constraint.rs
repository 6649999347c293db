//! The output constraint of a request, whatever API it came through: a JSON format, a forced
//! tool call, or strict tool arguments, applied after the reasoning.

use serde_json::Value;
use splash_engine::{Constraint, GrammarRequest};

use crate::error::ApiError;
use crate::state::AppState;

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

/// How a grammar may produce tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallGrammar {
    /// Exactly one call (`tool_choice` required / named).
    Forced,
    /// Free text, optionally followed by one call whose arguments must match the schema
    /// (tools marked `strict`).
    Strict,
}

/// A Lark grammar (llguidance) for calls, in the JSON form, to `only` or to any of `tools`,
/// with arguments valid against the tool's parameter schema. `special_tags`: the tokenizer has
/// `<tool_call>` / `</tool_call>` as special tokens, which the grammar must name as tokens (a
/// model emits those, never the spelled-out text).
pub fn call_grammar(
    tools: &[Value],
    only: Option<&str>,
    mode: CallGrammar,
    special_tags: bool,
) -> Result<String, String> {
    let mut alternatives = Vec::new();
    for t in tools {
        let f = t.get("function").unwrap_or(t);
        let Some(name) = f.get("name").and_then(Value::as_str) else {
            continue;
        };
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let params = f
            .get("parameters")
            .or_else(|| f.get("input_schema"))
            .cloned()
            .unwrap_or_else(|| serde_json::json!({"type": "object"}));
        alternatives.push(serde_json::json!({
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": params},
            "required": ["name", "arguments"],
            "additionalProperties": false,
        }));
    }
    if alternatives.is_empty() {
        return Err(match only {
            Some(n) => format!("tool_choice names `{n}`, which is not among the request's tools"),
            None => "tool_choice `required` needs at least one tool in `tools`".to_string(),
        });
    }
    let schema = splash_engine::with_json_layout(serde_json::json!({"anyOf": alternatives}));
    let (open, close) = if special_tags {
        ("<tool_call>", "</tool_call>")
    } else {
        ("\"<tool_call>\"", "\"</tool_call>\"")
    };
    let body = format!("body: %json {schema}\n");
    Ok(match mode {
        CallGrammar::Forced => format!("start: {open} \"\\n\" body \"\\n\" {close}\n{body}"),
        // Free text without the opening tag, or text up to the tag (a lazy lexeme: it ends at
        // the first tag) and then one call. Lexemes are greedy otherwise, so the split at the
        // tag has to be part of one lexeme.
        CallGrammar::Strict if special_tags => format!(
            "start: FREE | FREE {open} \"\\n\" body \"\\n\" {close}\nFREE: /(.|\\n)*/\n{body}"
        ),
        CallGrammar::Strict => format!(
            "start: FREE | prefix \"\\n\" body \"\\n</tool_call>\"\n\
             FREE: /(.|\\n)*/ & ~/(.|\\n)*<tool_call>(.|\\n)*/\n\
             prefix[lazy]: /(.|\\n)*<tool_call>/\n{body}"
        ),
    })
}

/// True when any tool asks for strict arguments (`strict: true`, OpenAI or Anthropic form).
pub fn any_strict(tools: &[Value]) -> bool {
    tools.iter().any(|t| {
        t.get("strict").and_then(Value::as_bool) == Some(true)
            || t.pointer("/function/strict").and_then(Value::as_bool) == Some(true)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Feeds the call grammars with the tokens a model would emit: the tag tokens are allowed as
    /// the model writes them (a special token, or a plain added token), and the arguments must
    /// match the schema. Run on the real Qwen vocabulary (plain `<tool_call>`) and on the fixture
    /// tokenizer (special `<tool_call>`).
    fn check_call_grammars(dir: &str, expect_special: bool) {
        use splash_engine::{Constraint, GrammarFactory};
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(dir);
        let model = splash_model::load(&dir).unwrap();
        let tok = &model.tokenizer;
        let special = tok.is_special("<tool_call>");
        assert_eq!(special, expect_special);
        let factory = GrammarFactory::new(&model).unwrap();
        let tools = json!([{"type": "function", "function": {"name": "f", "strict": true, "parameters": {
            "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": false}}}]);
        let tools = tools.as_array().unwrap();
        let open = tok.token_to_id("<tool_call>").unwrap();
        let close = tok.token_to_id("</tool_call>").unwrap();
        let ids = |text: &str| tok.encode(text).unwrap();
        let call = |args: &str| {
            [
                vec![open],
                ids(&format!("\n{{\"name\": \"f\", \"arguments\": {args}}}\n")),
                vec![close],
            ]
            .concat()
        };
        // Feeds tokens through the mask; true when every one was allowed.
        let accepts = |grammar: &str, tokens: &[u32]| {
            let mut g = factory
                .start(&Constraint::Lark(grammar.to_string()))
                .unwrap();
            tokens.iter().all(|&t| {
                let mut logits = vec![0.0f32; model.config.vocab_size];
                g.mask(&mut logits).unwrap();
                logits[t as usize].is_finite() && g.consume(t).is_ok()
            })
        };
        let forced = call_grammar(tools, None, CallGrammar::Forced, special).unwrap();
        assert!(accepts(&forced, &call("{\"x\": 5}")));
        assert!(!accepts(&forced, &call("{\"y\": 5}")));
        assert!(!accepts(&forced, &ids("Sure.")));
        let strict = call_grammar(tools, None, CallGrammar::Strict, special).unwrap();
        assert!(accepts(&strict, &ids("No call needed, 1 < 2.")));
        assert!(accepts(
            &strict,
            &[ids("Calling."), call("{\"x\": 7}")].concat()
        ));
        assert!(!accepts(
            &strict,
            &[ids("Calling."), call("{\"x\": \"seven\"}")].concat()
        ));
    }

    #[test]
    fn call_grammars_on_the_qwen_vocabulary() {
        check_call_grammars("models/demo", false);
    }

    #[test]
    fn call_grammars_with_special_tag_tokens() {
        check_call_grammars("tests/fixtures/qwen35-dense", true);
    }
}
