//! `models.json` for `splash serve-multi`: the models one front server may load, each as
//! `--model` names it, with its aliases and its own `splash serve` options.
//!
//! ```json
//! {"models": [
//!   {"model": "Qwen/Qwen3.6-35B-A3B", "aliases": ["fast"], "arguments": ["--kv-format", "bf16"]},
//!   {"model": "/models/qwen3.8-27b.gguf", "aliases": ["smart"], "max_context": 65536, "preload": true}
//! ]}
//! ```

use std::path::Path;

use serde_json::Value;

/// One model of the configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelEntry {
    /// What `--model` takes: `demo`, a directory, a GGUF file, `OWNER/REPO[:VARIANT]`. Also
    /// the id requests name it by.
    pub model: String,
    /// Other names requests may use.
    pub aliases: Vec<String>,
    /// `splash serve` options for this model (flags and their values).
    pub arguments: Vec<String>,
}

impl ModelEntry {
    /// The id, then the aliases.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.model.as_str()).chain(self.aliases.iter().map(String::as_str))
    }
}

/// The parsed configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct MultiConfig {
    pub models: Vec<ModelEntry>,
    /// The model loaded at start (the first with `preload: true`), if any.
    pub preload: Option<usize>,
}

/// Options the front server owns: a per-model value would be ignored or break routing.
const FRONT_FLAGS: [&str; 5] = [
    "--host",
    "--port",
    "--api-key",
    "--model",
    "--served-model-name",
];
const ENTRY_KEYS: [&str; 5] = ["model", "aliases", "arguments", "max_context", "preload"];

impl MultiConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the serve-multi config {}: {e}", path.display()))?;
        let value: Value = serde_json::from_str(&text).map_err(|e| {
            format!(
                "the serve-multi config {} is not valid JSON: {e}",
                path.display()
            )
        })?;
        Self::parse(&value).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Checks a configuration value.
    pub fn parse(value: &Value) -> Result<Self, String> {
        let expected = r#"expected {"models": [{"model": "...", "aliases": [...], "arguments": [...], "max_context": N, "preload": true}, ...]}"#;
        let top = value
            .as_object()
            .ok_or(format!("not an object; {expected}"))?;
        if let Some(k) = top.keys().find(|k| *k != "models") {
            return Err(format!("unknown top-level key `{k}`; {expected}"));
        }
        let list = top
            .get("models")
            .and_then(Value::as_array)
            .filter(|l| !l.is_empty())
            .ok_or(format!("`models` must be a nonempty array; {expected}"))?;
        let mut models = Vec::new();
        let mut preload = None;
        for (i, e) in list.iter().enumerate() {
            let at = format!("models[{i}]");
            let e = e.as_object().ok_or(format!("{at} must be an object"))?;
            if let Some(k) = e.keys().find(|k| !ENTRY_KEYS.contains(&k.as_str())) {
                return Err(format!(
                    "{at}: unknown key `{k}`; an entry takes {}",
                    ENTRY_KEYS.join(", ")
                ));
            }
            let model = match e.get("model") {
                Some(Value::String(m)) if !m.trim().is_empty() => m.trim().to_string(),
                _ => {
                    return Err(format!(
                        "{at}: `model` must be a nonempty string (what --model takes)"
                    ))
                }
            };
            let aliases = match e.get("aliases") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| match v.as_str() {
                        Some(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
                        _ => Err(format!("{at}: `aliases` must be nonempty strings")),
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(format!("{at}: `aliases` must be an array of strings")),
            };
            let mut arguments = match e.get("arguments") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::String(s)) => s.split_whitespace().map(str::to_string).collect(),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| {
                        v.as_str()
                            .map(str::to_string)
                            .ok_or(format!("{at}: `arguments` must be strings"))
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(format!("{at}: `arguments` must be an array of strings")),
            };
            check_arguments(&arguments).map_err(|e| format!("{at}: {e}"))?;
            match e.get("max_context") {
                None | Some(Value::Null) => {}
                Some(v) => match v.as_u64().filter(|&n| n > 0) {
                    Some(n) => {
                        arguments =
                            merge_flags(&[arguments, vec!["--max-context".into(), n.to_string()]]);
                    }
                    None => return Err(format!("{at}: `max_context` must be a positive integer")),
                },
            }
            match e.get("preload") {
                None | Some(Value::Null) | Some(Value::Bool(false)) => {}
                Some(Value::Bool(true)) => {
                    preload.get_or_insert(i);
                }
                Some(_) => return Err(format!("{at}: `preload` must be true or false")),
            }
            models.push(ModelEntry {
                model,
                aliases,
                arguments,
            });
        }
        // Every name routes to one model.
        let mut seen: Vec<&str> = Vec::new();
        for m in &models {
            for n in m.names() {
                if seen.contains(&n) {
                    return Err(format!(
                        "the name `{n}` is used twice: each model and alias must name one model"
                    ));
                }
                seen.push(n);
            }
        }
        Ok(Self { models, preload })
    }

    /// The model a request's name means.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.models
            .iter()
            .position(|m| m.names().any(|n| n == name))
    }

    /// Every name requests may use.
    pub fn names(&self) -> Vec<&str> {
        self.models.iter().flat_map(ModelEntry::names).collect()
    }
}

/// Per-model arguments are `--flag [value...]` groups, without the front server's own flags.
pub fn check_arguments(args: &[String]) -> Result<(), String> {
    if let Some(first) = args.first().filter(|a| !a.starts_with("--")) {
        return Err(format!(
            "`arguments` must start with a --flag, got `{first}` (the model goes in `model`)"
        ));
    }
    for a in args {
        let flag = a.split('=').next().unwrap_or_default();
        if FRONT_FLAGS.contains(&flag) {
            return Err(format!(
                "`{flag}` belongs to serve-multi itself, not to one model: {}",
                match flag {
                    "--model" => "name the model in `model`",
                    "--served-model-name" => "give other names in `aliases`",
                    _ => "pass it to serve-multi",
                }
            ));
        }
    }
    Ok(())
}

/// Options that may be given several times: their values add up instead of replacing.
const REPEATABLE: [&str; 3] = ["--allowed-host", "--allowed-origin", "--served-model-name"];

/// Joins argument lists, later lists winning: a flag given again replaces the earlier one (with
/// its values), except the repeatable ones.
pub fn merge_flags(lists: &[Vec<String>]) -> Vec<String> {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for list in lists {
        let mut mine: Vec<(String, Vec<String>)> = Vec::new();
        for a in list {
            if a.starts_with("--") {
                let name = a.split('=').next().unwrap_or(a).to_string();
                mine.push((name, vec![a.clone()]));
            } else if let Some(last) = mine.last_mut() {
                last.1.push(a.clone());
            }
        }
        for (name, tokens) in mine {
            if !REPEATABLE.contains(&name.as_str()) {
                groups.retain(|(n, _)| *n != name);
            }
            groups.push((name, tokens));
        }
    }
    groups.into_iter().flat_map(|(_, t)| t).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_entries_and_refuses_mistakes() {
        let c = MultiConfig::parse(&json!({"models": [
            {"model": "demo", "aliases": ["small"], "arguments": "--kv-format bf16 --lanes 2"},
            {"model": "Qwen/Qwen3.6-27B:Q4_K_M", "max_context": 4096, "preload": true},
        ]}))
        .unwrap();
        assert_eq!(
            c.models[0].arguments,
            ["--kv-format", "bf16", "--lanes", "2"]
        );
        assert_eq!(c.models[1].arguments, ["--max-context", "4096"]);
        assert_eq!(c.preload, Some(1));
        assert_eq!(c.find("small"), Some(0));
        assert_eq!(c.find("Qwen/Qwen3.6-27B:Q4_K_M"), Some(1));
        assert_eq!(c.find("gpt-4"), None);
        for (bad, words) in [
            (json!({"models": []}), "nonempty array"),
            (
                json!({"models": [{"model": "a"}], "default": "a"}),
                "unknown top-level key",
            ),
            (json!({"models": [{"model": ""}]}), "nonempty string"),
            (
                json!({"models": [{"model": "a", "alias": ["b"]}]}),
                "unknown key `alias`",
            ),
            (
                json!({"models": [{"model": "a", "arguments": ["x"]}]}),
                "start with a --flag",
            ),
            (
                json!({"models": [{"model": "a", "arguments": ["--port", "9"]}]}),
                "serve-multi itself",
            ),
            (
                json!({"models": [{"model": "a", "max_context": 0}]}),
                "positive integer",
            ),
            (
                json!({"models": [{"model": "a"}, {"model": "b", "aliases": ["a"]}]}),
                "used twice",
            ),
        ] {
            let e = MultiConfig::parse(&bad).unwrap_err();
            assert!(e.contains(words), "{bad}: {e}");
        }
    }

    #[test]
    fn later_flags_win_and_repeatable_ones_add_up() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let merged = merge_flags(&[
            s(&["--max-context", "4096", "--allowed-host", "a"]),
            s(&["--kv-format", "bf16", "--max-context=8192"]),
            s(&["--allowed-host", "b", "--kv-format", "f32", "--no-webui"]),
        ]);
        assert_eq!(
            merged,
            s(&[
                "--allowed-host",
                "a",
                "--max-context=8192",
                "--allowed-host",
                "b",
                "--kv-format",
                "f32",
                "--no-webui"
            ])
        );
    }
}
