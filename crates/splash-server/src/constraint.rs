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
    let form = CallForm {
        special_tags: s.model.tokenizer.is_special("<tool_call>"),
        xml: s
            .model
            .template
            .as_ref()
            .is_some_and(|t| t.xml_tool_calls()),
    };
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
    call_grammar(tools, mode.1.as_deref(), mode.0, form)
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

/// How the model writes a call.
#[derive(Clone, Copy, Debug)]
pub struct CallForm {
    /// `<tool_call>` / `</tool_call>` are special tokens, which the grammar must name as tokens
    /// (a model emits those, never the spelled-out text).
    pub special_tags: bool,
    /// Qwen3.5's XML form (`<function=NAME>` and one `<parameter=KEY>` block per argument)
    /// instead of a JSON object `{"name": ..., "arguments": {...}}`.
    pub xml: bool,
}

/// A Lark grammar (llguidance) for calls to `only` or to any of `tools`, in the form the
/// model's template uses, with arguments valid against the tool's parameter schema.
pub fn call_grammar(
    tools: &[Value],
    only: Option<&str>,
    mode: CallGrammar,
    form: CallForm,
) -> Result<String, String> {
    let mut selected = Vec::new();
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
        selected.push((name, params));
    }
    if selected.is_empty() {
        return Err(match only {
            Some(n) => format!("tool_choice names `{n}`, which is not among the request's tools"),
            None => "tool_choice `required` needs at least one tool in `tools`".to_string(),
        });
    }
    let body = if form.xml {
        xml_calls(&selected)
    } else {
        let alternatives: Vec<Value> = selected
            .iter()
            .map(|(name, params)| {
                serde_json::json!({
                    "type": "object",
                    "properties": {"name": {"const": name}, "arguments": params},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })
            })
            .collect();
        let schema = splash_engine::with_json_layout(serde_json::json!({"anyOf": alternatives}));
        format!("body: %json {schema}\n")
    };
    let (open, close) = if form.special_tags {
        ("<tool_call>", "</tool_call>")
    } else {
        ("\"<tool_call>\"", "\"</tool_call>\"")
    };
    Ok(match mode {
        CallGrammar::Forced => format!("start: {open} \"\\n\" body \"\\n\" {close}\n{body}"),
        // Free text without the opening tag, or text up to the tag (a lazy lexeme: it ends at
        // the first tag) and then one call. Lexemes are greedy otherwise, so the split at the
        // tag has to be part of one lexeme.
        CallGrammar::Strict if form.special_tags => format!(
            "start: FREE | FREE {open} \"\\n\" body \"\\n\" {close}\nFREE: /(.|\\n)*/\n{body}"
        ),
        CallGrammar::Strict => format!(
            "start: FREE | prefix \"\\n\" body \"\\n</tool_call>\"\n\
             FREE: /(.|\\n)*/ & ~/(.|\\n)*<tool_call>(.|\\n)*/\n\
             prefix[lazy]: /(.|\\n)*<tool_call>/\n{body}"
        ),
    })
}

/// The `body` rule of XML-form calls: `<function=NAME>\n`, then each parameter of the schema
/// in its order (the required ones always) as `<parameter=KEY>\nVALUE\n</parameter>\n`, then
/// `</function>`. A string value is raw text (it ends at the first `\n</parameter>`, so the
/// value and its closing tag are one lazy lexeme); booleans and null are bare words; numbers
/// and other values are JSON, as the template's `tojson` writes them.
fn xml_calls(tools: &[(&str, Value)]) -> String {
    let lit = |s: &str| Value::from(s).to_string();
    let mut out = String::new();
    let mut calls = Vec::new();
    for (i, (name, params)) in tools.iter().enumerate() {
        let required: Vec<&str> = params
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut parts = vec![lit(&format!("<function={name}>\n"))];
        let props = params.get("properties").and_then(Value::as_object);
        for (j, (key, schema)) in props.into_iter().flatten().enumerate() {
            let rule = format!("p_{i}_{j}");
            let open = lit(&format!("<parameter={key}>\n"));
            let close = lit("\n</parameter>\n");
            let value = match xml_value(schema) {
                XmlValue::Text { min, max } => {
                    let max = max.map(|m| m.to_string()).unwrap_or_default();
                    out.push_str(&format!(
                        "v_{i}_{j}[lazy]: /(.|\\n){{{min},{max}}}\\n<\\/parameter>\\n/\n"
                    ));
                    format!("{open} v_{i}_{j}")
                }
                XmlValue::Lark(v) => format!("{open} {v} {close}"),
                XmlValue::Json => {
                    let s = splash_engine::with_json_layout(schema.clone());
                    out.push_str(&format!("j_{i}_{j}: %json {s}\n"));
                    format!("{open} j_{i}_{j} {close}")
                }
            };
            out.push_str(&format!("{rule}: {value}\n"));
            let optional = if required.contains(&key.as_str()) {
                ""
            } else {
                "?"
            };
            parts.push(format!("{rule}{optional}"));
        }
        parts.push(lit("</function>"));
        out.push_str(&format!("call_{i}: {}\n", parts.join(" ")));
        calls.push(format!("call_{i}"));
    }
    format!("body: {}\n{out}", calls.join(" | "))
}

/// How one argument is written in the XML form.
enum XmlValue {
    /// Raw text up to the closing tag (strings, and schemas without a type), of `min..=max`
    /// characters.
    Text { min: u64, max: Option<u64> },
    /// A Lark expression for a bare scalar.
    Lark(String),
    /// A JSON document: objects, arrays, unions, and numbers (whose JSON text is their bare
    /// text, and whose bounds the JSON grammar enforces).
    Json,
}

fn xml_value(schema: &Value) -> XmlValue {
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        if let Some(strings) = options
            .iter()
            .map(Value::as_str)
            .collect::<Option<Vec<_>>>()
        {
            let alts: Vec<String> = strings
                .iter()
                .map(|s| Value::from(*s).to_string())
                .collect();
            return XmlValue::Lark(format!("({})", alts.join(" | ")));
        }
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") | None if schema.get("anyOf").is_none() => {
            if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
                // An anchored pattern is the whole raw value.
                if let Some(inner) = p.strip_prefix('^').and_then(|p| p.strip_suffix('$')) {
                    return XmlValue::Lark(format!("/{}/", inner.replace('/', "\\/")));
                }
            }
            XmlValue::Text {
                min: schema.get("minLength").and_then(Value::as_u64).unwrap_or(0),
                max: schema.get("maxLength").and_then(Value::as_u64),
            }
        }
        // The template writes Python's `True` / `False` for a boolean it got from a dict.
        Some("boolean") => XmlValue::Lark("(\"true\" | \"false\" | \"True\" | \"False\")".into()),
        Some("null") => XmlValue::Lark("\"null\"".into()),
        _ => XmlValue::Json,
    }
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
    /// match the schema, in the JSON form and in Qwen3.5's XML form.
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
            "type": "object", "properties": {"x": {"type": "integer"}, "note": {"type": "string"},
                                             "unit": {"enum": ["c", "f"]}},
            "required": ["x"], "additionalProperties": false}}}]);
        let tools = tools.as_array().unwrap();
        let open = tok.token_to_id("<tool_call>").unwrap();
        let close = tok.token_to_id("</tool_call>").unwrap();
        let ids = |text: &str| tok.encode(text).unwrap();
        let wrap = |inner: String| [vec![open], ids(&inner), vec![close]].concat();
        let json_call =
            |args: &str| wrap(format!("\n{{\"name\": \"f\", \"arguments\": {args}}}\n"));
        let xml_call = |params: &[(&str, &str)]| {
            let p: String = params
                .iter()
                .map(|(k, v)| format!("<parameter={k}>\n{v}\n</parameter>\n"))
                .collect();
            wrap(format!("\n<function=f>\n{p}</function>\n"))
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
        for xml in [false, true] {
            let form = CallForm {
                special_tags: special,
                xml,
            };
            let good = |x: &str| {
                if xml {
                    xml_call(&[("x", x), ("note", "two lines\n<b>ok</b>")])
                } else {
                    json_call(&format!("{{\"x\": {x}, \"note\": \"two lines\"}}"))
                }
            };
            let forced = call_grammar(tools, None, CallGrammar::Forced, form).unwrap();
            assert!(accepts(&forced, &good("5")), "xml {xml}");
            assert!(!accepts(&forced, &good("\"five\"")), "xml {xml}");
            assert!(!accepts(&forced, &ids("Sure.")));
            let strict = call_grammar(tools, None, CallGrammar::Strict, form).unwrap();
            assert!(accepts(&strict, &ids("No call needed, 1 < 2.")));
            assert!(accepts(&strict, &[ids("Calling."), good("-7")].concat()));
            assert!(!accepts(
                &strict,
                &[ids("Calling."), good("seven")].concat()
            ));
        }
        let form = CallForm {
            special_tags: special,
            xml: true,
        };
        let forced = call_grammar(tools, None, CallGrammar::Forced, form).unwrap();
        // Required parameter missing, unknown parameter, enum outside its values.
        assert!(!accepts(&forced, &xml_call(&[("note", "n")])));
        assert!(!accepts(&forced, &xml_call(&[("x", "1"), ("y", "2")])));
        assert!(accepts(&forced, &xml_call(&[("x", "1"), ("unit", "c")])));
        assert!(!accepts(&forced, &xml_call(&[("x", "1"), ("unit", "k")])));
    }

    #[test]
    fn call_grammars_on_the_qwen_vocabulary() {
        check_call_grammars("tests/fixtures/qwen35-realvocab", false);
    }

    #[test]
    fn call_grammars_on_the_demo_vocabulary() {
        check_call_grammars("models/demo", false);
    }

    #[test]
    fn call_grammars_with_special_tag_tokens() {
        check_call_grammars("tests/fixtures/qwen35-dense", true);
    }
}
