//! Codex: `-c` overrides on its command line (it ignores `OPENAI_BASE_URL` for a custom
//! server). A `splash` provider speaks the Responses API (`wire_api = "responses"`, the only
//! one Codex still has) and reads its key from `SPLASH_API_KEY`; the model, its context window
//! and auto-compaction at 90 % of it are set, and web search (a hosted tool) is off. Nothing
//! is written to `~/.codex`.

use super::{Env, Launch, Server};

pub fn launch(server: &Server, env: &Env, args: &[String]) -> Launch {
    let name = server.name();
    let provider = format!(
        "{{name={},base_url={},env_key=\"SPLASH_API_KEY\",wire_api=\"responses\"}}",
        toml_str(&name),
        toml_str(&server.api())
    );
    let overrides = [
        format!("model_provider={}", toml_str(&name)),
        format!("model_providers.{name}={provider}"),
        format!("model={}", toml_str(&server.model)),
        format!("model_context_window={}", server.context),
        format!("model_auto_compact_token_limit={}", server.context * 9 / 10),
        "web_search=\"disabled\"".to_string(),
    ];
    let (user_overrides, rest) = split_config_args(args);
    let mut l = Launch::default();
    for o in overrides.into_iter().chain(user_overrides) {
        l.args.push("-c".into());
        l.args.push(o);
    }
    l.args.extend(rest);
    l.set("SPLASH_API_KEY", env.api_key());
    l
}

/// A TOML basic string.
fn toml_str(s: &str) -> String {
    // JSON string escapes are valid TOML basic-string escapes.
    serde_json::to_string(s).expect("a string serialises")
}

/// The user's own `-c` overrides move up beside splash's (after them, so they win): given to a
/// subcommand (`codex exec -c ...`), they would replace the whole root list.
fn split_config_args(args: &[String]) -> (Vec<String>, Vec<String>) {
    let (mut config, mut rest) = (Vec::new(), Vec::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--" {
            rest.push(a.clone());
            rest.extend(it.by_ref().cloned());
            break;
        }
        if a == "-c" || a == "--config" {
            match it.next() {
                Some(v) => config.push(v.clone()),
                None => rest.push(a.clone()),
            }
        } else if let Some(v) = a.strip_prefix("--config=") {
            config.push(v.to_string());
        } else if let Some(v) = a.strip_prefix("-c").filter(|v| !v.is_empty()) {
            config.push(v.strip_prefix('=').unwrap_or(v).to_string());
        } else {
            rest.push(a.clone());
        }
    }
    (config, rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(port: u16) -> Server {
        Server::local(port, "unsloth/Qwen3.6-35B-A3B-GGUF:UD-Q4_K_M", 65536)
    }

    fn overrides(l: &Launch) -> Vec<&str> {
        l.args
            .chunks(2)
            .take_while(|c| c[0] == "-c")
            .map(|c| c[1].as_str())
            .collect()
    }

    #[test]
    fn config_overrides() {
        let args: Vec<String> = ["exec", "--skip-git-repo-check", "say hi"]
            .map(String::from)
            .into();
        let l = launch(&server(8000), &Env::with(&[]), &args);
        assert_eq!(
            overrides(&l),
            [
                "model_provider=\"splash\"",
                "model_providers.splash={name=\"splash\",base_url=\"http://127.0.0.1:8000/v1\",env_key=\"SPLASH_API_KEY\",wire_api=\"responses\"}",
                "model=\"unsloth/Qwen3.6-35B-A3B-GGUF:UD-Q4_K_M\"",
                "model_context_window=65536",
                "model_auto_compact_token_limit=58982",
                "web_search=\"disabled\"",
            ]
        );
        assert_eq!(l.args[12..], ["exec", "--skip-git-repo-check", "say hi"]);
        assert_eq!(l.env("SPLASH_API_KEY"), Some("local"));
    }

    #[test]
    fn another_port_gets_its_own_provider() {
        let l = launch(&server(9000), &Env::with(&[("SPLASH_API_KEY", "k")]), &[]);
        assert_eq!(overrides(&l)[0], "model_provider=\"splash-9000\"");
        assert!(overrides(&l)[1].starts_with("model_providers.splash-9000={name=\"splash-9000\""));
        assert_eq!(l.env("SPLASH_API_KEY"), Some("k"));
    }

    #[test]
    fn user_overrides_move_up_and_win() {
        let args: Vec<String> = [
            "exec",
            "-c",
            "a=1",
            "--config=b=2",
            "-cc=3",
            "x",
            "--",
            "-c",
            "literal",
        ]
        .map(String::from)
        .into();
        let l = launch(&server(8000), &Env::with(&[]), &args);
        let o = overrides(&l);
        assert_eq!(o[6..], ["a=1", "b=2", "c=3"]);
        assert_eq!(l.args[18..], ["exec", "x", "--", "-c", "literal"]);
    }
}
