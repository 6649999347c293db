//! OpenCode: a `splash` provider (`@ai-sdk/openai-compatible`, bundled with OpenCode) injected
//! through `OPENCODE_CONFIG_CONTENT`, on top of whatever inline config the user already has
//! there. The served model becomes the default and small model and the model of every built-in
//! agent (an agent's own model outranks the default one), with its context and output limits
//! and one reasoning-effort variant per level. The key is `{env:SPLASH_API_KEY}`, which
//! OpenCode expands itself. No file is written.

use anyhow::{anyhow, bail};
use serde_json::{json, Map, Value};

use super::{Env, Launch, Server};

/// OpenCode 1.x's built-in agents (`opencode agent list`).
const AGENTS: [&str; 7] = [
    "build",
    "plan",
    "general",
    "explore",
    "title",
    "summary",
    "compaction",
];
const EFFORTS: [&str; 5] = ["none", "low", "medium", "high", "xhigh"];

pub fn launch(server: &Server, env: &Env, args: &[String]) -> anyhow::Result<Launch> {
    let config = config(server, env.get("OPENCODE_CONFIG_CONTENT"))?;
    let mut l = Launch {
        args: args.to_vec(),
        ..Launch::default()
    };
    l.set("OPENCODE_CONFIG_CONTENT", config.to_string());
    l.set("SPLASH_API_KEY", env.api_key());
    Ok(l)
}

/// The inline configuration: the user's (if any) with the splash provider and models set.
pub fn config(server: &Server, user: Option<&str>) -> anyhow::Result<Value> {
    let mut root: Map<String, Value> = match user {
        None => Map::new(),
        Some(text) => match serde_json::from_str(text) {
            Ok(Value::Object(m)) => m,
            _ => bail!("OPENCODE_CONFIG_CONTENT must hold a JSON object"),
        },
    };
    let name = server.name();
    let served = format!("{name}/{}", server.model);
    root.insert("model".into(), served.clone().into());
    root.insert("small_model".into(), served.clone().into());
    let agents = object(&mut root, "agent")?;
    for agent in AGENTS {
        let entry = agents
            .entry(agent)
            .or_insert_with(|| Value::Object(Map::new()));
        let entry = entry
            .as_object_mut()
            .ok_or_else(|| anyhow!("OPENCODE_CONFIG_CONTENT: agent.{agent} must be an object"))?;
        entry.insert("model".into(), served.clone().into());
    }
    let output = server.response_tokens();
    let input: Vec<&str> = if server.vision {
        vec!["text", "image", "pdf"]
    } else {
        vec!["text"]
    };
    let variants: Map<String, Value> = EFFORTS
        .iter()
        .map(|e| (e.to_string(), json!({"reasoningEffort": e})))
        .collect();
    object(&mut root, "provider")?.insert(
        name.clone(),
        json!({
            "npm": "@ai-sdk/openai-compatible",
            "name": format!("splash ({})", server.base_url),
            "options": {"baseURL": server.api(), "apiKey": "{env:SPLASH_API_KEY}"},
            "models": {
                (server.model.clone()): {
                    "name": server.model,
                    "reasoning": true,
                    "tool_call": true,
                    "attachment": server.vision,
                    "modalities": {"input": input, "output": ["text"]},
                    "variants": variants,
                    "limit": {
                        "context": server.context,
                        "input": server.context.saturating_sub(output).max(1),
                        "output": output,
                    },
                }
            },
        }),
    );
    Ok(Value::Object(root))
}

fn object<'a>(
    root: &'a mut Map<String, Value>,
    key: &str,
) -> anyhow::Result<&'a mut Map<String, Value>> {
    root.entry(key)
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| anyhow!("OPENCODE_CONFIG_CONTENT: `{key}` must be an object"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> Server {
        Server::local(8000, "demo", 65536)
    }

    #[test]
    fn provider_models_and_agents() {
        let c = config(&server(), None).unwrap();
        assert_eq!(c["model"], "splash/demo");
        assert_eq!(c["small_model"], "splash/demo");
        for agent in AGENTS {
            assert_eq!(c["agent"][agent]["model"], "splash/demo", "{agent}");
        }
        let p = &c["provider"]["splash"];
        assert_eq!(p["npm"], "@ai-sdk/openai-compatible");
        assert_eq!(p["options"]["baseURL"], "http://127.0.0.1:8000/v1");
        assert_eq!(p["options"]["apiKey"], "{env:SPLASH_API_KEY}");
        let m = &p["models"]["demo"];
        assert_eq!(
            m["limit"],
            json!({"context": 65536, "input": 49152, "output": 16384})
        );
        assert_eq!(m["attachment"], false);
        assert_eq!(m["modalities"]["input"], json!(["text"]));
        assert_eq!(m["variants"]["none"], json!({"reasoningEffort": "none"}));
        // A model with vision takes images and PDFs as attachments.
        let vision = Server {
            vision: true,
            ..server()
        };
        let m = &config(&vision, None).unwrap()["provider"]["splash"]["models"]["demo"];
        assert_eq!(m["attachment"], true);
        assert_eq!(m["modalities"]["input"], json!(["text", "image", "pdf"]));
    }

    #[test]
    fn the_users_inline_config_is_kept() {
        let user = r#"{"theme": "tokyonight", "agent": {"build": {"temperature": 0.2}}, "provider": {"other": {"npm": "x"}}}"#;
        let c = config(&server(), Some(user)).unwrap();
        assert_eq!(c["theme"], "tokyonight");
        assert_eq!(
            c["agent"]["build"],
            json!({"temperature": 0.2, "model": "splash/demo"})
        );
        assert_eq!(c["provider"]["other"], json!({"npm": "x"}));
        assert!(config(&server(), Some("[1]")).is_err());
        assert!(config(&server(), Some(r#"{"agent": 3}"#)).is_err());
    }

    #[test]
    fn environment() {
        let l = launch(
            &server(),
            &Env::with(&[("SPLASH_API_KEY", "k")]),
            &["run".into(), "hi".into()],
        )
        .unwrap();
        assert_eq!(l.args, ["run", "hi"]);
        assert_eq!(l.env("SPLASH_API_KEY"), Some("k"));
        let c: Value = serde_json::from_str(l.env("OPENCODE_CONFIG_CONTENT").unwrap()).unwrap();
        assert_eq!(c["model"], "splash/demo");
        assert!(
            !l.env("OPENCODE_CONFIG_CONTENT").unwrap().contains("\"k\""),
            "the key is not inlined"
        );
    }
}
