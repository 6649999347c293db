//! Claude Code: everything through its environment; no file is written.
//!
//! `ANTHROPIC_BASE_URL` points at the server's Messages API; every model slot (main, the
//! Opus/Sonnet/Haiku aliases, the small fast model, subagents) names the served model; the
//! context sets the auto-compaction window. `ANTHROPIC_API_KEY` is removed so it cannot win
//! over the token, the cloud providers are turned off, and the per-request attribution header
//! (which changes the system prompt on every turn and defeats prefix caching) is off.

use super::{Env, Launch, Server};

const MODEL_VARS: [&str; 6] = [
    "ANTHROPIC_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
];

pub fn launch(server: &Server, env: &Env, args: &[String]) -> Launch {
    let mut l = Launch {
        args: args.to_vec(),
        remove_env: vec!["ANTHROPIC_API_KEY"],
        ..Launch::default()
    };
    l.set("ANTHROPIC_BASE_URL", &server.base_url);
    l.set("ANTHROPIC_AUTH_TOKEN", env.api_key());
    for var in MODEL_VARS {
        l.set(var, &server.model);
    }
    let context = server.context.to_string();
    if server.max_output.is_some() {
        l.set(
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS",
            server.response_tokens().to_string(),
        );
    }
    l.set("CLAUDE_CODE_AUTO_COMPACT_WINDOW", &context);
    l.set("CLAUDE_CODE_MAX_CONTEXT_TOKENS", &context);
    for cloud in [
        "CLAUDE_CODE_USE_BEDROCK",
        "CLAUDE_CODE_USE_VERTEX",
        "CLAUDE_CODE_USE_FOUNDRY",
    ] {
        l.set(cloud, "0");
    }
    l.set("CLAUDE_CODE_ATTRIBUTION_HEADER", "0");
    // No telemetry, update checks or other calls to Anthropic's hosts.
    l.set("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1");
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> Server {
        Server::local(8000, "Qwen3.6-27B", 131072)
    }

    #[test]
    fn environment() {
        let l = launch(&server(), &Env::with(&[]), &["-p".into(), "hi".into()]);
        assert_eq!(l.args, ["-p", "hi"]);
        assert_eq!(l.env("ANTHROPIC_BASE_URL"), Some("http://127.0.0.1:8000"));
        assert_eq!(l.env("ANTHROPIC_AUTH_TOKEN"), Some("local"));
        for var in MODEL_VARS {
            assert_eq!(l.env(var), Some("Qwen3.6-27B"), "{var}");
        }
        assert_eq!(l.env("CLAUDE_CODE_AUTO_COMPACT_WINDOW"), Some("131072"));
        assert_eq!(l.env("CLAUDE_CODE_MAX_CONTEXT_TOKENS"), Some("131072"));
        assert_eq!(l.env("CLAUDE_CODE_USE_BEDROCK"), Some("0"));
        assert_eq!(l.env("CLAUDE_CODE_USE_VERTEX"), Some("0"));
        assert_eq!(l.env("CLAUDE_CODE_USE_FOUNDRY"), Some("0"));
        assert_eq!(l.env("CLAUDE_CODE_ATTRIBUTION_HEADER"), Some("0"));
        assert_eq!(l.env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"), Some("1"));
        assert_eq!(l.remove_env, ["ANTHROPIC_API_KEY"]);
        // Claude Code's own output limit stays unless --max-output-tokens is given.
        assert_eq!(l.env("CLAUDE_CODE_MAX_OUTPUT_TOKENS"), None);
        let capped = Server {
            max_output: Some(512),
            ..server()
        };
        let l = launch(&capped, &Env::with(&[]), &[]);
        assert_eq!(l.env("CLAUDE_CODE_MAX_OUTPUT_TOKENS"), Some("512"));
    }

    #[test]
    fn the_key_comes_from_splash_api_key() {
        let l = launch(&server(), &Env::with(&[("SPLASH_API_KEY", "s3cret")]), &[]);
        assert_eq!(l.env("ANTHROPIC_AUTH_TOKEN"), Some("s3cret"));
    }
}
