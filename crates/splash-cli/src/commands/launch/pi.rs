//! Pi: custom providers live only in `~/.pi/agent/models.json` (or `$PI_CODING_AGENT_DIR`).
//! The launch upserts one provider there, `splash` (`splash-PORT` for another port), and leaves
//! every other provider and key as it was. Pi resolves `apiKey` as the name of an environment
//! variable, so the file holds `SPLASH_API_KEY`, never the key.

use std::path::PathBuf;

use serde_json::{json, Map, Value};

use super::{files, read_json_object, Env, Launch, Server};

pub fn prepare(server: &Server, env: &Env, args: &[String]) -> anyhow::Result<Launch> {
    let path = models_path(env)?;
    let existing = read_json_object(&path)?;
    let updated = upsert(existing, server)?;
    files::replace(&path, &(serde_json::to_string_pretty(&updated)? + "\n"))?;
    Ok(launch(server, env, args))
}

/// `$PI_CODING_AGENT_DIR/models.json`, else `~/.pi/agent/models.json`.
pub fn models_path(env: &Env) -> anyhow::Result<PathBuf> {
    let dir = match env.get("PI_CODING_AGENT_DIR") {
        Some(d) => match d.strip_prefix("~/") {
            Some(rest) => env.home()?.join(rest),
            None => PathBuf::from(d),
        },
        None => env.home()?.join(".pi/agent"),
    };
    Ok(dir.join("models.json"))
}

pub fn launch(server: &Server, env: &Env, args: &[String]) -> Launch {
    let mut l = Launch {
        args: vec![
            "--provider".to_string(),
            server.name(),
            "--model".into(),
            server.model.clone(),
        ],
        ..Launch::default()
    };
    l.args.extend(args.iter().cloned());
    l.set("SPLASH_API_KEY", env.api_key());
    l
}

/// `models.json` with this server's provider replaced.
pub fn upsert(mut root: Map<String, Value>, server: &Server) -> anyhow::Result<Value> {
    let providers = root
        .entry("providers")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| anyhow::anyhow!("models.json: `providers` must be an object"))?;
    let input: Vec<&str> = if server.vision {
        vec!["text", "image"]
    } else {
        vec!["text"]
    };
    providers.insert(
        server.name(),
        json!({
            "baseUrl": server.api(),
            "api": "openai-completions",
            "apiKey": "SPLASH_API_KEY",
            "models": [{
                "id": server.model,
                "reasoning": true,
                // Pi sends no effort when thinking is off, which leaves the template's
                // default on; `none` turns it off.
                "thinkingLevelMap": {"off": "none"},
                "input": input,
                "contextWindow": server.context,
                "maxTokens": server.response_tokens(),
            }],
        }),
    );
    Ok(Value::Object(root))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(port: u16) -> Server {
        Server::local(port, "demo", 262144)
    }

    #[test]
    fn provider_is_upserted_and_others_kept() {
        let existing: Map<String, Value> = serde_json::from_str(
            r#"{"providers": {"ollama": {"baseUrl": "http://localhost:11434/v1", "api": "openai-completions", "apiKey": "x", "models": [{"id": "llama"}]},
                              "splash": {"baseUrl": "old"}}, "extra": 1}"#,
        )
        .unwrap();
        let v = upsert(existing, &server(8000)).unwrap();
        assert_eq!(v["extra"], 1);
        assert_eq!(v["providers"]["ollama"]["models"][0]["id"], "llama");
        let p = &v["providers"]["splash"];
        assert_eq!(p["baseUrl"], "http://127.0.0.1:8000/v1");
        assert_eq!(p["api"], "openai-completions");
        assert_eq!(p["apiKey"], "SPLASH_API_KEY");
        let m = &p["models"][0];
        assert_eq!(m["id"], "demo");
        assert_eq!(m["contextWindow"], 262144);
        assert_eq!(m["maxTokens"], 32768);
        assert_eq!(m["thinkingLevelMap"], json!({"off": "none"}));
        assert_eq!(m["input"], json!(["text"]));
        // Provider order: the user's first, as written.
        let names: Vec<&String> = v["providers"].as_object().unwrap().keys().collect();
        assert_eq!(names, ["ollama", "splash"]);
    }

    #[test]
    fn another_port_is_another_provider() {
        let v = upsert(Map::new(), &server(8001)).unwrap();
        assert!(v["providers"]["splash-8001"].is_object());
        let l = launch(&server(8001), &Env::with(&[]), &["-p".into(), "hi".into()]);
        assert_eq!(
            l.args,
            ["--provider", "splash-8001", "--model", "demo", "-p", "hi"]
        );
        assert_eq!(l.env("SPLASH_API_KEY"), Some("local"));
    }

    #[test]
    fn where_models_json_is() {
        let home = Env::with(&[("HOME", "/home/u")]);
        assert_eq!(
            models_path(&home).unwrap(),
            PathBuf::from("/home/u/.pi/agent/models.json")
        );
        let custom = Env::with(&[("HOME", "/home/u"), ("PI_CODING_AGENT_DIR", "~/pi")]);
        assert_eq!(
            models_path(&custom).unwrap(),
            PathBuf::from("/home/u/pi/models.json")
        );
    }

    #[test]
    fn writes_the_file_and_leaves_the_rest() {
        let dir = std::env::temp_dir().join(format!("splash-pi-{}", std::process::id()));
        let env = Env::with(&[
            ("HOME", "/nonexistent"),
            ("PI_CODING_AGENT_DIR", dir.to_str().unwrap()),
        ]);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("models.json"),
            r#"{"providers": {"mine": {"baseUrl": "u"}}}"#,
        )
        .unwrap();
        std::fs::write(dir.join("settings.json"), "{\"theme\": \"dark\"}").unwrap();
        prepare(&server(8000), &env, &[]).unwrap();
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("models.json")).unwrap())
                .unwrap();
        assert_eq!(v["providers"]["mine"]["baseUrl"], "u");
        assert_eq!(v["providers"]["splash"]["apiKey"], "SPLASH_API_KEY");
        assert_eq!(
            std::fs::read_to_string(dir.join("settings.json")).unwrap(),
            "{\"theme\": \"dark\"}"
        );
        // A file that is not JSON is refused, not replaced.
        std::fs::write(dir.join("models.json"), "// my notes\n{").unwrap();
        assert!(prepare(&server(8000), &env, &[]).is_err());
        assert_eq!(
            std::fs::read_to_string(dir.join("models.json")).unwrap(),
            "// my notes\n{"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
