//! The output constraint of a request, whatever API it came through: a JSON format, a forced
//! tool call, or the calls the model starts under `auto`, applied after the reasoning.

use std::collections::HashSet;

use serde_json::Value;
use splash_engine::{Constraint, GrammarRequest};
use splash_model::Model;

use crate::error::ApiError;

/// What a request lets the model do with its tools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// No calls (`none`).
    None,
    /// Text or calls, as the model chooses; at most one call unless `parallel`.
    Auto { parallel: bool },
    /// Exactly one call, to the named tool or to any.
    Forced(Option<String>),
}

/// A request's output constraint, and where it starts.
#[derive(Clone, Debug)]
pub struct OutputConstraint {
    pub constraint: Constraint,
    /// Applies from this token on (the model's first `<tool_call>`): a grammar of the calls
    /// alone, which leaves the text before them, and the draft's speculation, free.
    pub after_call_tag: Option<u32>,
    /// Chosen by splash rather than asked for (calls under `auto`): a grammar that cannot be
    /// compiled is dropped, not refused.
    pub optional: bool,
}

impl OutputConstraint {
    fn required(constraint: Constraint) -> Self {
        Self {
            constraint,
            after_call_tag: None,
            optional: false,
        }
    }

    /// The engine's grammar request: it starts after `</think>` when the prompt leaves the
    /// model reasoning (the reasoning stays free), then after the call tag if it has one.
    pub fn grammar_request(self, model: &Model, in_reasoning: bool) -> GrammarRequest {
        let think_end = model
            .tokenizer
            .token_to_id("</think>")
            .filter(|_| in_reasoning);
        GrammarRequest {
            constraint: self.constraint,
            after: think_end.into_iter().chain(self.after_call_tag).collect(),
        }
    }
}

/// Picks the constraint: `format` (the API's JSON format, named `format_param` in errors), or
/// calls to `tools` as `choice` allows them. A format and a forced call exclude each other; a
/// format wins over tools under `auto`. Under `auto`, calls follow the offered tools and their
/// schemas (as llama.cpp's lazy grammars do) from the opening tag on; a grammar that cannot be
/// compiled is dropped unless a tool in `raw_tools` (as the client sent them) is `strict`.
pub fn output_constraint(
    model: &Model,
    format: Option<Constraint>,
    format_param: &str,
    tools: &[Value],
    raw_tools: &[Value],
    choice: ToolChoice,
) -> Result<Option<OutputConstraint>, ApiError> {
    let form = CallForm {
        special_tags: model.tokenizer.is_special("<tool_call>"),
        xml: model.template.as_ref().is_some_and(|t| t.xml_tool_calls()),
    };
    let grammar = |mode, only: Option<&str>| {
        call_grammar(tools, only, mode, form)
            .map(Constraint::Lark)
            .map_err(|e| ApiError::invalid("tool_choice", e))
    };
    let strict = any_strict(raw_tools);
    match (format, choice) {
        (Some(_), ToolChoice::Forced(_)) => Err(ApiError::invalid(
            format_param,
            format!("{format_param} cannot be combined with a forced tool_choice: the answer is either a tool call or a JSON document"),
        )),
        (Some(f), _) => Ok(Some(OutputConstraint::required(f))),
        (None, ToolChoice::Forced(only)) => Ok(Some(OutputConstraint::required(grammar(
            CallGrammar::Forced,
            only.as_deref(),
        )?))),
        (None, ToolChoice::Auto { .. }) if tools.is_empty() => Ok(None),
        (None, ToolChoice::None) => Ok(None),
        (None, ToolChoice::Auto { parallel }) => {
            match model.tokenizer.token_to_id("<tool_call>") {
                Some(tag) => Ok(Some(OutputConstraint {
                    constraint: grammar(CallGrammar::AfterTag { parallel }, None)?,
                    after_call_tag: Some(tag),
                    optional: !strict,
                })),
                // Every Qwen3.5 vocabulary has the tag as one token.
                None => Ok(None),
            }
        }
    }
}

/// A JSON-schema output format; `strict` (as OpenAI's `strict: true`, and every Anthropic
/// format) allows no keys beyond the declared ones (see [`close_objects`]).
pub fn json_format(schema: Value, strict: bool) -> Constraint {
    Constraint::JsonSchema(if strict {
        close_objects(schema)
    } else {
        schema
    })
}

/// How a grammar may produce tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallGrammar {
    /// Exactly one call (`tool_choice` required / named).
    Forced,
    /// The calls alone, from after the opening tag (which the engine waits for): one call,
    /// or several separated by newlines when `parallel`.
    AfterTag { parallel: bool },
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
        selected.push((name, close_objects(params)));
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
        CallGrammar::AfterTag { parallel: false } => {
            format!("start: \"\\n\" body \"\\n\" {close}\n{body}")
        }
        CallGrammar::AfterTag { parallel: true } => format!(
            "start: call (\"\\n\" {open} call)*\ncall: \"\\n\" body \"\\n\" {close}\n{body}"
        ),
    })
}

/// The `body` rule of XML-form calls: `<function=NAME>\n`, then the parameters as
/// `<parameter=KEY>\nVALUE\n</parameter>\n` (each at most once, the required ones always, in
/// any order up to [`MAX_FREE_ORDER`] parameters, else in the schema's), then `</function>`. A string value is raw text (it ends at the first `\n</parameter>`, so the
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
        let mut keys = Vec::new();
        for (j, (key, schema)) in props.into_iter().flatten().enumerate() {
            let rule = format!("p_{i}_{j}");
            let open = lit(&format!("<parameter={key}>\n"));
            let close = lit("\n</parameter>\n");
            let value = match xml_value(schema) {
                XmlValue::Text { min, max } => {
                    // No tag at a line start inside: the parser ends a value there. (A
                    // length bound and that exclusion together exceed llguidance's lexer
                    // limits, so a bounded value keeps its bound alone.)
                    let value = match (min, max) {
                        (0, None) => format!("/(.|\\n)*\\n<\\/parameter>\\n/ & ~/{LINE_TAG}/"),
                        (min, max) => {
                            let max = max.map(|m| m.to_string()).unwrap_or_default();
                            format!("/(.|\\n){{{min},{max}}}\\n<\\/parameter>\\n/")
                        }
                    };
                    out.push_str(&format!("v_{i}_{j}[lazy]: {value}\n"));
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
            keys.push((rule, required.contains(&key.as_str())));
        }
        if keys.len() <= MAX_FREE_ORDER {
            let all = (1u32 << keys.len()) - 1;
            let mut made = HashSet::new();
            parts.extend(any_order(
                &format!("a_{i}"),
                &keys,
                all,
                &mut made,
                &mut out,
            ));
        } else {
            parts.extend(
                keys.iter()
                    .map(|(rule, req)| format!("{rule}{}", if *req { "" } else { "?" })),
            );
        }
        parts.push(lit("</function>"));
        out.push_str(&format!("call_{i}: {}\n", parts.join(" ")));
        calls.push(format!("call_{i}"));
    }
    format!("body: {}\n{out}", calls.join(" | "))
}

/// A string value (with its closing tag) in which a tag starts a line: the parser reads the
/// value as ending there (a closing tag left out), so the grammar must not let it be written.
const LINE_TAG: &str = r"((.|\n)*\n)?<(parameter=|\/function>|\/tool_call>)(.|\n)*";

/// Up to this many parameters, a call may write them in any order: the schema's order is not
/// the model's (a model trained on shuffled schemas writes them as the request reads), and
/// the grammar takes a rule per subset of them.
const MAX_FREE_ORDER: usize = 8;

/// A reference to the rule for the parameters in `left` (a bit mask over `keys`: rule names
/// and whether they are required) in any order, each once; rules are added to `out` as needed.
/// `None` when nothing is left. `made`: the masks whose rules exist.
fn any_order(
    prefix: &str,
    keys: &[(String, bool)],
    left: u32,
    made: &mut HashSet<u32>,
    out: &mut String,
) -> Option<String> {
    if left == 0 {
        return None;
    }
    let name = format!("{prefix}_{left}");
    let optional = keys
        .iter()
        .enumerate()
        .all(|(j, (_, req))| !req || left & (1 << j) == 0);
    let reference = format!("{name}{}", if optional { "?" } else { "" });
    if !made.insert(left) {
        return Some(reference);
    }
    let mut alternatives = Vec::new();
    for (j, (rule, _)) in keys
        .iter()
        .enumerate()
        .filter(|(j, _)| left & (1 << j) != 0)
    {
        match any_order(prefix, keys, left & !(1 << j), made, out) {
            Some(rest) => alternatives.push(format!("{rule} {rest}")),
            None => alternatives.push(rule.clone()),
        }
    }
    out.push_str(&format!("{name}: {}\n", alternatives.join(" | ")));
    Some(reference)
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

/// The strict reading of a JSON schema, for tool arguments and `strict` formats: an object
/// schema that declares `properties` and says nothing about other keys gets
/// `additionalProperties: false`, as OpenAI's strict mode and xgrammar's strict mode read it.
/// llguidance follows JSON Schema (absent means any key), which lets a constrained model invent
/// keys until `max_tokens`. `additionalProperties` `true` or a schema, `unevaluatedProperties`,
/// and objects without `properties` (free-form maps) keep their meaning.
///
/// Composition needs care, since llguidance intersects an object with its `allOf` branches
/// (and with `anyOf`/`oneOf` branches next to its own `properties`): a closed branch would
/// forbid its siblings' keys. Such branches, and the `$defs` they reference, stay open; the
/// object that composes them is closed over the union of their keys instead (declared as `{}`
/// in its own `properties`), or left open when a branch's keys cannot be known (a non-local
/// `$ref`, a branch that allows other keys).
pub fn close_objects(mut schema: Value) -> Value {
    let root = schema.clone();
    let mut open_refs = Vec::new();
    collect_open_refs(&root, &mut open_refs, 0);
    close_node(&mut schema, &root, &open_refs, false, 0);
    schema
}

/// Deeper than this, the schema is left as it is (llguidance bounds nesting as well).
const MAX_SCHEMA_DEPTH: usize = 64;

/// The subschema arrays whose members an object may be intersected with.
const COMPOSITION: [&str; 3] = ["allOf", "anyOf", "oneOf"];

/// True when llguidance intersects `node` with subschemas: several `allOf` branches, or its
/// own `properties` next to a `$ref` or `allOf`/`anyOf`/`oneOf` branches.
fn is_composed(node: &serde_json::Map<String, Value>) -> bool {
    let several = node
        .get("allOf")
        .and_then(Value::as_array)
        .is_some_and(|a| a.len() > 1);
    let own = node.contains_key("properties");
    several
        || (own && (node.contains_key("$ref") || COMPOSITION.iter().any(|k| node.contains_key(*k))))
}

/// The `$ref`s that composed objects intersect with (their targets must stay open).
fn collect_open_refs(v: &Value, out: &mut Vec<String>, depth: usize) {
    if depth > MAX_SCHEMA_DEPTH {
        return;
    }
    match v {
        Value::Object(o) => {
            if is_composed(o) {
                let branches = COMPOSITION
                    .iter()
                    .filter_map(|k| o.get(*k)?.as_array())
                    .flatten();
                let refs = branches
                    .chain(std::iter::once(v))
                    .filter_map(|b| b.get("$ref")?.as_str());
                out.extend(refs.map(str::to_string));
            }
            for child in o.values() {
                collect_open_refs(child, out, depth + 1);
            }
        }
        Value::Array(a) => a.iter().for_each(|c| collect_open_refs(c, out, depth + 1)),
        _ => {}
    }
}

/// The keys a composed branch declares; `None` when they cannot be known or it allows others.
fn branch_keys(branch: &Value, root: &Value, depth: usize) -> Option<Vec<String>> {
    if depth > 8 {
        return None;
    }
    let o = branch.as_object()?;
    if o.get("additionalProperties")
        .is_some_and(|a| a != &Value::Bool(false))
        || o.contains_key("unevaluatedProperties")
    {
        return None;
    }
    let mut keys: Vec<String> = o
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    if let Some(r) = o.get("$ref") {
        let target = r
            .as_str()?
            .strip_prefix('#')
            .and_then(|p| root.pointer(p))?;
        keys.extend(branch_keys(target, root, depth + 1)?);
    }
    for k in COMPOSITION {
        for b in o.get(k).and_then(Value::as_array).into_iter().flatten() {
            keys.extend(branch_keys(b, root, depth + 1)?);
        }
    }
    Some(keys)
}

/// Closes `v` (unless `open`: it is a composed branch) and the schemas below it.
fn close_node(v: &mut Value, root: &Value, open_refs: &[String], open: bool, depth: usize) {
    if depth > MAX_SCHEMA_DEPTH {
        return;
    }
    let keys = match v.as_object() {
        Some(o) if is_composed(o) => branch_keys(v, root, 0),
        _ => Some(Vec::new()),
    };
    let Some(o) = v.as_object_mut() else {
        return;
    };
    let undecided =
        !o.contains_key("additionalProperties") && !o.contains_key("unevaluatedProperties");
    let composed = is_composed(o);
    if undecided && !open && (composed || o.get("properties").is_some_and(Value::is_object)) {
        // A composed object is closed over its branches' keys, when they are all known.
        if let Some(keys) = keys {
            let props = o
                .entry("properties")
                .or_insert_with(|| Value::Object(Default::default()));
            if let Some(props) = props.as_object_mut() {
                for k in keys {
                    props.entry(k).or_insert_with(|| serde_json::json!({}));
                }
                o.insert("additionalProperties".into(), Value::Bool(false));
            }
        }
    }
    let own = o.contains_key("properties");
    for (key, child) in o.iter_mut() {
        let d = depth + 1;
        match key.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" => {
                let defs = key == "$defs" || key == "definitions";
                for (name, s) in child.as_object_mut().into_iter().flatten() {
                    // A definition that a composed object references stays open.
                    let open = defs && open_refs.iter().any(|r| *r == format!("#/{key}/{name}"));
                    close_node(s, root, open_refs, open, d);
                }
            }
            "additionalProperties" | "items" | "contains" | "propertyNames" => match child {
                Value::Array(items) => {
                    for s in items {
                        close_node(s, root, open_refs, false, d);
                    }
                }
                s => close_node(s, root, open_refs, false, d),
            },
            "prefixItems" => {
                for s in child.as_array_mut().into_iter().flatten() {
                    close_node(s, root, open_refs, false, d);
                }
            }
            "allOf" | "anyOf" | "oneOf" => {
                let alts = child.as_array_mut();
                let several = alts.as_ref().is_some_and(|a| a.len() > 1);
                let branch = own || (key == "allOf" && several);
                for s in alts.into_iter().flatten() {
                    close_node(s, root, open_refs, branch, d);
                }
            }
            // `not`, `if`/`then`/`else` and the rest are left as they are: closing inside a
            // negation or a condition would change what they mean.
            _ => {}
        }
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
    /// A committed checkpoint directory, relative to the repository root.
    fn committed(dir: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(dir)
    }

    fn check_call_grammars(dir: &std::path::Path, expect_special: bool) {
        use splash_engine::{Constraint, GrammarFactory};
        let model = splash_model::load(dir).unwrap();
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
            // After the opening tag (the engine waits for it): the calls alone.
            let after_tag = |c: Vec<u32>| c[1..].to_vec();
            let two = [after_tag(good("-7")), ids("\n"), good("8")].concat();
            let one = CallGrammar::AfterTag { parallel: false };
            let one = call_grammar(tools, None, one, form).unwrap();
            assert!(accepts(&one, &after_tag(good("-7"))), "xml {xml}");
            assert!(!accepts(&one, &after_tag(good("seven"))), "xml {xml}");
            assert!(!accepts(&one, &two), "xml {xml}");
            let many = CallGrammar::AfterTag { parallel: true };
            let many = call_grammar(tools, None, many, form).unwrap();
            assert!(accepts(&many, &two), "xml {xml}");
            assert!(!accepts(&many, &ids("Sure.")), "xml {xml}");
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
        // Any order, each parameter once.
        assert!(accepts(
            &forced,
            &xml_call(&[("unit", "c"), ("note", "n"), ("x", "1")])
        ));
        assert!(!accepts(&forced, &xml_call(&[("x", "1"), ("x", "2")])));
        assert!(!accepts(&forced, &xml_call(&[("x", "1"), ("unit", "k")])));
        // A tag at a line start inside a string value: the parser would end the value there.
        for tag in ["<parameter=unit>", "</function>", "</tool_call>"] {
            let note = format!("a\n{tag}\nb");
            assert!(!accepts(&forced, &xml_call(&[("x", "1"), ("note", &note)])));
        }
        assert!(accepts(
            &forced,
            &xml_call(&[("x", "1"), ("note", "a <parameter=unit> b")])
        ));
        let long: String = (0..40)
            .map(|i| format!("line {i} <b>x</b> </parameter>\n"))
            .collect();
        assert!(accepts(&forced, &xml_call(&[("x", "1"), ("note", &long)])));
    }

    #[test]
    fn undeclared_keys_are_closed_recursively() {
        let got = close_objects(json!({
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "list": {"type": "array", "items": {"type": "object", "properties": {"a": {}}}},
                "either": {"anyOf": [{"type": "object", "properties": {"b": {}}}, {"type": "null"}]},
                "free": {"type": "object"},
                "open": {"type": "object", "properties": {"c": {}}, "additionalProperties": true},
                "typed": {"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}},
                "ref": {"$ref": "#/$defs/D"},
            },
            "$defs": {"D": {"type": "object", "properties": {"d": {}}}},
        }));
        assert_eq!(got["additionalProperties"], false);
        assert_eq!(
            got.pointer("/properties/list/items/additionalProperties"),
            Some(&json!(false))
        );
        assert_eq!(
            got.pointer("/properties/either/anyOf/0/additionalProperties"),
            Some(&json!(false))
        );
        assert_eq!(
            got.pointer("/properties/either/anyOf/1"),
            Some(&json!({"type": "null"}))
        );
        // A free-form map and explicit choices keep their meaning.
        assert_eq!(
            got.pointer("/properties/free"),
            Some(&json!({"type": "object"}))
        );
        assert_eq!(
            got.pointer("/properties/open/additionalProperties"),
            Some(&json!(true))
        );
        assert_eq!(
            got.pointer("/properties/typed/additionalProperties"),
            Some(&json!({"type": "integer"}))
        );
        assert_eq!(
            got.pointer("/$defs/D/additionalProperties"),
            Some(&json!(false))
        );
    }

    #[test]
    fn composed_objects_are_closed_over_their_branches_keys() {
        let got = close_objects(json!({
            "allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"extra": {"type": "integer"}}}],
            "$defs": {"Base": {"type": "object", "properties": {"id": {"type": "string"}}}},
        }));
        // The branches stay open (closing one would forbid the other's keys); the whole is
        // closed over both.
        assert_eq!(got.pointer("/$defs/Base/additionalProperties"), None);
        assert_eq!(got.pointer("/allOf/1/additionalProperties"), None);
        assert_eq!(got["additionalProperties"], false);
        assert_eq!(got["properties"], json!({"id": {}, "extra": {}}));
        // A branch whose keys cannot be known leaves the whole open.
        let unknown = json!({"allOf": [{"$ref": "other.json"}, {"properties": {"x": {}}}]});
        assert_eq!(close_objects(unknown.clone()), unknown);
        // Properties next to a condition-only anyOf are closed as usual.
        let got = close_objects(json!({"properties": {"a": {}, "b": {}},
            "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}));
        assert_eq!(got["additionalProperties"], false);
        assert_eq!(
            got["anyOf"],
            json!([{"required": ["a"]}, {"required": ["b"]}])
        );
    }

    /// The grammars reject a key the schema never declared: in a forced call's arguments (JSON
    /// form, and a nested object in the XML form) and in a strict JSON format.
    #[test]
    fn constrained_output_has_only_declared_keys() {
        use splash_engine::{Constraint, GrammarFactory};
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
        let model = splash_model::load(&dir).unwrap();
        let tok = &model.tokenizer;
        let factory = GrammarFactory::new(&model).unwrap();
        let accepts = |c: Constraint, text: &str| {
            let mut g = factory.start(&c).unwrap();
            tok.encode(text).unwrap().iter().all(|&t| {
                let mut logits = vec![0.0f32; model.config.vocab_size];
                g.mask(&mut logits).unwrap();
                logits[t as usize].is_finite() && g.consume(t).is_ok()
            })
        };
        let tools = [
            json!({"type": "function", "function": {"name": "read_file", "parameters": {
            "type": "object", "properties": {"path": {"type": "string"},
                "range": {"type": "object", "properties": {"start": {"type": "integer"}}}}}}}),
        ];
        let json_form = CallForm {
            special_tags: false,
            xml: false,
        };
        let forced = call_grammar(&tools, None, CallGrammar::Forced, json_form).unwrap();
        let call = |args: &str| {
            format!("<tool_call>\n{{\"name\": \"read_file\", \"arguments\": {args}}}\n</tool_call>")
        };
        let lark = |g: &String| Constraint::Lark(g.clone());
        assert!(accepts(lark(&forced), &call("{\"path\": \"src/main.rs\"}")));
        assert!(!accepts(
            lark(&forced),
            &call("{\"path\": \"src/main.rs\", \"../x\": 1}")
        ));
        assert!(!accepts(
            lark(&forced),
            &call("{\"range\": {\"start\": 1, \"end\": 2}}")
        ));
        let xml_form = CallForm {
            special_tags: false,
            xml: true,
        };
        let forced = call_grammar(&tools, None, CallGrammar::Forced, xml_form).unwrap();
        let xml = |range: &str| {
            format!("<tool_call>\n<function=read_file>\n<parameter=range>\n{range}\n</parameter>\n</function>\n</tool_call>")
        };
        assert!(accepts(lark(&forced), &xml("{\"start\": 1}")));
        assert!(!accepts(lark(&forced), &xml("{\"start\": 1, \"end\": 2}")));
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let strict = Constraint::JsonSchema(close_objects(schema.clone()));
        assert!(accepts(strict.clone(), "{\"a\": 1}"));
        assert!(!accepts(strict, "{\"a\": 1, \"b\": 2}"));
        // Without `strict`, a format follows JSON Schema: other keys are allowed.
        assert!(accepts(
            Constraint::JsonSchema(schema),
            "{\"a\": 1, \"b\": 2}"
        ));
    }

    #[test]
    fn call_grammars_on_the_qwen_vocabulary() {
        // Its weights are generated (tests/fixtures/derived.rs).
        check_call_grammars(&crate::derived::realvocab(), false);
    }

    #[test]
    fn call_grammars_on_the_demo_vocabulary() {
        check_call_grammars(&committed("models/demo"), false);
    }

    #[test]
    fn call_grammars_with_special_tag_tokens() {
        check_call_grammars(&committed("tests/fixtures/qwen35-dense"), true);
    }
}
