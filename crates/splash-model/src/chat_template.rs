//! The checkpoint's Jinja chat template, rendered as Hugging Face transformers renders it.

use std::path::Path;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

use crate::error::{read_json, ModelError};

const TEMPLATE_NAME: &str = "chat";

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template writes tool calls in Qwen3.5's XML form (`<function=NAME>`).
    xml_tool_calls: bool,
    /// `bos_token`, `eos_token`, ... from tokenizer_config.json, which transformers passes too.
    special_tokens: serde_json::Map<String, serde_json::Value>,
}

/// What a template is rendered with: the variables transformers passes.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TemplateInputs {
    /// OpenAI-style messages (`role`, `content`, `tool_calls`, `reasoning_content`, ...).
    pub messages: serde_json::Value,
    /// Tool definitions, or none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<serde_json::Value>,
    /// Append the assistant turn opener.
    pub add_generation_prompt: bool,
    /// Extra variables: `enable_thinking`, `reasoning_effort`, other `chat_template_kwargs`.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl ChatTemplate {
    /// Reads `chat_template.jinja`, else `chat_template` from `tokenizer_config.json`
    /// (a string, or the `default` entry of a list of named templates). `None` if neither.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, ModelError> {
        let jinja = dir.join("chat_template.jinja");
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = if cfg_path.exists() {
            Some(read_json(&cfg_path)?)
        } else {
            None
        };
        let source = if jinja.exists() {
            std::fs::read_to_string(&jinja).map_err(|e| ModelError::io(&jinja, e))?
        } else {
            let Some(cfg) = &cfg else {
                return Ok(None);
            };
            match cfg.get("chat_template") {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(serde_json::Value::Array(named)) => named
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str())
                    .ok_or_else(|| {
                        ModelError::config(&cfg_path, "chat_template list has no `default` entry")
                    })?
                    .to_string(),
                _ => return Ok(None),
            }
        };
        let mut template = Self::new(source)?;
        for key in ["bos_token", "eos_token", "pad_token", "unk_token"] {
            // A token is a string, or an AddedToken object with a `content` field.
            let token = cfg.as_ref().and_then(|c| c.get(key)).and_then(|v| match v {
                serde_json::Value::String(s) => Some(s.clone()),
                other => other.get("content")?.as_str().map(str::to_string),
            });
            if let Some(t) = token {
                template.special_tokens.insert(key.to_string(), t.into());
            }
        }
        Ok(Some(template))
    }

    /// True when the template renders tool calls in the XML form
    /// (`<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>`) rather than as JSON.
    pub fn xml_tool_calls(&self) -> bool {
        self.xml_tool_calls
    }

    /// Compiles template source.
    pub fn new(source: String) -> Result<Self, ModelError> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // transformers: jinja2 with trim_blocks and lstrip_blocks.
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| ModelError::Template(e.to_string()))?,
        );
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        let xml_tool_calls = source.contains("<function=");
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|e| ModelError::Template(format!("cannot compile: {e:#}")))?;
        Ok(Self {
            env,
            xml_tool_calls,
            special_tokens: serde_json::Map::new(),
        })
    }

    /// Sets a variable such as `eos_token` that the template may use (from the tokenizer).
    pub fn set_special_token(&mut self, key: &str, token: &str) {
        self.special_tokens.insert(key.to_string(), token.into());
    }

    /// Renders the template.
    pub fn render(&self, inputs: &TemplateInputs) -> Result<String, ModelError> {
        let tmpl = self.env.get_template(TEMPLATE_NAME).expect("added in new");
        let mut ctx = serde_json::to_value(inputs).expect("template inputs serialise");
        let obj = ctx.as_object_mut().expect("inputs serialise to an object");
        for (k, v) in &self.special_tokens {
            obj.entry(k.clone()).or_insert_with(|| v.clone());
        }
        tmpl.render(Value::from(minijinja::value::Serde(ctx)))
            .map_err(|e| ModelError::Template(format!("{e:#}")))
    }
}

/// Python `json.dumps(x, ensure_ascii=False)`: `", "` and `": "` separators, keys in insertion
/// order, no HTML escaping (minijinja's built-in filter escapes `<` and `>`, which would change
/// tool schemas). Accepts `indent`, `sort_keys`, `separators` and `ensure_ascii` kwargs.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let mut json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    if sort_keys == Some(true) {
        sort_json_keys(&mut json);
    }
    let (item_sep, key_sep) = match &separators {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let mut out = String::new();
    write_py_json(&mut out, &json, indent, 0, &item_sep, &key_sep);
    Ok(Value::from_safe_string(out))
}

fn sort_json_keys(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            let mut entries: Vec<_> = std::mem::take(m).into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            for (k, mut val) in entries {
                sort_json_keys(&mut val);
                m.insert(k, val);
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(sort_json_keys),
        _ => {}
    }
}

fn write_py_json(
    out: &mut String,
    v: &serde_json::Value,
    indent: Option<usize>,
    depth: usize,
    item_sep: &str,
    key_sep: &str,
) {
    use serde_json::Value as J;
    let newline = |out: &mut String, d: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * d));
        }
    };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_py_json(out, item, indent, depth + 1, item_sep, key_sep);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                out.push_str(&serde_json::to_string(k).expect("string serialises"));
                out.push_str(key_sep);
                write_py_json(out, item, indent, depth + 1, item_sep, key_sep);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&serde_json::to_string(other).expect("JSON value serialises")),
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(fmt)` for templates that print today's date (UTC).
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (y, m, d) = civil_from_days(secs.div_euclid(86400));
    let tod = secs.rem_euclid(86400);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('H') => out.push_str(&format!("{:02}", tod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", tod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", tod % 60)),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 → (year, month, day) (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tojson_is_python_style_and_unescaped() {
        let t = ChatTemplate::new("{{ x | tojson }}|{{ x | tojson(indent=2) }}".into()).unwrap();
        let mut extra = serde_json::Map::new();
        extra.insert("x".into(), json!({"b": "<a>", "a": [1, 2]}));
        let out = t
            .render(&TemplateInputs {
                messages: json!([]),
                extra,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(out, "{\"b\": \"<a>\", \"a\": [1, 2]}|{\n  \"b\": \"<a>\",\n  \"a\": [\n    1,\n    2\n  ]\n}");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}".into()).unwrap();
        let e = t
            .render(&TemplateInputs::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("no system role"), "{e}");
    }

    #[test]
    fn special_tokens_come_from_tokenizer_config() {
        let dir = std::env::temp_dir().join(format!("splash-template-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"chat_template": "{{ eos_token }}|{{ bos_token }}", "eos_token": "<|im_end|>",
                "bos_token": {"content": "<s>", "lstrip": false}}"#,
        )
        .unwrap();
        let t = ChatTemplate::from_dir(&dir).unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            t.render(&TemplateInputs::default()).unwrap(),
            "<|im_end|>|<s>"
        );
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_787), (2026, 11, 30));
    }
}
