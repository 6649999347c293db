//! Hermes Agent: a profile of its own, `splash` (`splash-PORT` for another port), created by
//! Hermes itself (`hermes profile create NAME --no-alias`) so it is a profile like any other,
//! in the user's Hermes root beside their sessions and skills. Only the `model:` section of
//! the profile's `config.yaml` is written (the rest of the file, comments included, stays as
//! it is); the key is `${SPLASH_API_KEY}`, which Hermes expands when it reads the file. Hermes
//! then runs with `HERMES_HOME` set to that profile.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

use super::{files, Env, Launch, Server};

/// Hermes refuses models with a smaller window.
const MIN_CONTEXT: usize = 64000;

pub fn prepare(
    program: &Path,
    server: &Server,
    env: &Env,
    args: &[String],
) -> anyhow::Result<Launch> {
    if server.context < MIN_CONTEXT {
        bail!(
            "Hermes Agent needs a context of at least {MIN_CONTEXT} tokens, and the server at {} has {}: restart it with --max-context 64K or more",
            server.base_url,
            server.context
        );
    }
    let home = profile_home(env, &server.name())?;
    let config = home.join("config.yaml");
    if !home.is_dir() {
        create_profile(program, &server.name(), &home)?;
    }
    let existing = match std::fs::read_to_string(&config) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", config.display())),
    };
    files::replace(
        &config,
        &with_model_section(&existing, &model_section(server))?,
    )?;
    Ok(launch(env, &home, args))
}

pub fn launch(env: &Env, home: &Path, args: &[String]) -> Launch {
    let mut l = Launch {
        args: args.to_vec(),
        ..Launch::default()
    };
    l.set("HERMES_HOME", home.display().to_string());
    l.set("SPLASH_API_KEY", env.api_key());
    l
}

/// `<root>/profiles/NAME`, with Hermes' rule for its root: `~/.hermes`, or `HERMES_HOME` when
/// that points elsewhere (its parent's parent when it is itself a profile).
pub fn profile_home(env: &Env, name: &str) -> anyhow::Result<PathBuf> {
    let native = env.home()?.join(".hermes");
    let root = match env.get("HERMES_HOME").map(PathBuf::from) {
        Some(h) if !h.starts_with(&native) => match h.parent() {
            Some(p) if p.file_name().is_some_and(|n| n == "profiles") => {
                p.parent().map(Path::to_path_buf).unwrap_or(h)
            }
            _ => h,
        },
        _ => native,
    };
    Ok(root.join("profiles").join(name))
}

fn create_profile(program: &Path, name: &str, home: &Path) -> anyhow::Result<()> {
    let out = Command::new(program)
        .args(["profile", "create", name, "--no-alias"])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} profile create", program.display()))?;
    // Another launch may have created it meanwhile.
    if !out.status.success() && !home.is_dir() {
        bail!(
            "`hermes profile create {name}` failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if !home.is_dir() {
        bail!(
            "`hermes profile create {name}` did not create {}: does HERMES_HOME point elsewhere?",
            home.display()
        );
    }
    Ok(())
}

/// The `model:` section for this server (YAML; strings double-quoted, as JSON writes them).
pub fn model_section(server: &Server) -> String {
    let q = |s: &str| serde_json::to_string(s).expect("a string serialises");
    format!(
        "model:\n  default: {}\n  provider: custom\n  base_url: {}\n  api_key: {}\n  api_mode: chat_completions\n  context_length: {}\n  max_tokens: {}\n  supports_vision: {}\n",
        q(&server.model),
        q(&server.api()),
        q("${SPLASH_API_KEY}"),
        server.context,
        server.response_tokens(),
        server.vision
    )
}

/// `yaml` with its top-level `model:` entry replaced by `section` (appended when absent).
/// The entry runs from its key to the next top-level key; comments and blank lines just
/// before that key belong to it.
pub fn with_model_section(yaml: &str, section: &str) -> anyhow::Result<String> {
    if yaml.trim_start().starts_with('{') {
        bail!("config.yaml is a flow mapping ({{...}}); splash edits only block YAML");
    }
    let lines: Vec<&str> = yaml.lines().collect();
    let top_key =
        |l: &str| !l.is_empty() && !l.starts_with([' ', '\t', '#']) && l != "---" && l != "...";
    let Some(start) = lines.iter().position(|l| {
        top_key(l)
            && (l.starts_with("model:") || l.starts_with("\"model\":") || l.starts_with("'model':"))
    }) else {
        let mut out = yaml.to_string();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(section);
        return Ok(out);
    };
    let mut end = lines[start + 1..]
        .iter()
        .position(|l| top_key(l))
        .map_or(lines.len(), |p| start + 1 + p);
    while end > start + 1
        && (lines[end - 1].trim().is_empty() || lines[end - 1].starts_with('#'))
        && end < lines.len()
    {
        end -= 1;
    }
    let mut out = String::new();
    for l in &lines[..start] {
        out.push_str(l);
        out.push('\n');
    }
    out.push_str(section);
    for l in &lines[end..] {
        out.push_str(l);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> Server {
        Server::local(8000, "unsloth/Qwen3.6-27B-GGUF:Q4_K_M", 131072)
    }

    const SECTION: &str = "model:\n  default: \"unsloth/Qwen3.6-27B-GGUF:Q4_K_M\"\n  provider: custom\n  base_url: \"http://127.0.0.1:8000/v1\"\n  api_key: \"${SPLASH_API_KEY}\"\n  api_mode: chat_completions\n  context_length: 131072\n  max_tokens: 32768\n  supports_vision: false\n";

    #[test]
    fn the_model_section() {
        assert_eq!(model_section(&server()), SECTION);
    }

    #[test]
    fn only_the_model_section_is_replaced() {
        let yaml = "# my hermes\nagent:\n  max_turns: 90\nmodel:\n  default: gpt-5\n  provider: openrouter\n  # old note\n\n# display settings\ndisplay:\n  skin: mono\n";
        let out = with_model_section(yaml, SECTION).unwrap();
        assert_eq!(
            out,
            format!("# my hermes\nagent:\n  max_turns: 90\n{SECTION}\n# display settings\ndisplay:\n  skin: mono\n")
        );
        // Idempotent.
        assert_eq!(with_model_section(&out, SECTION).unwrap(), out);
        // A scalar model and a model at the end of the file.
        assert_eq!(
            with_model_section("a: 1\nmodel: gpt-5", SECTION).unwrap(),
            format!("a: 1\n{SECTION}")
        );
    }

    #[test]
    fn a_missing_section_is_appended() {
        assert_eq!(with_model_section("", SECTION).unwrap(), SECTION);
        assert_eq!(
            with_model_section("a: 1", SECTION).unwrap(),
            format!("a: 1\n{SECTION}")
        );
        assert!(with_model_section("{model: x}", SECTION).is_err());
        // `model_aliases:` is another key.
        let out = with_model_section("model_aliases:\n  x: y\n", SECTION).unwrap();
        assert_eq!(out, format!("model_aliases:\n  x: y\n{SECTION}"));
    }

    #[test]
    fn profile_homes() {
        let env = Env::with(&[("HOME", "/home/u")]);
        assert_eq!(
            profile_home(&env, "splash").unwrap(),
            PathBuf::from("/home/u/.hermes/profiles/splash")
        );
        let inside = Env::with(&[
            ("HOME", "/home/u"),
            ("HERMES_HOME", "/home/u/.hermes/profiles/work"),
        ]);
        assert_eq!(
            profile_home(&inside, "splash").unwrap(),
            PathBuf::from("/home/u/.hermes/profiles/splash")
        );
        let docker = Env::with(&[("HOME", "/root"), ("HERMES_HOME", "/opt/data")]);
        assert_eq!(
            profile_home(&docker, "splash-9000").unwrap(),
            PathBuf::from("/opt/data/profiles/splash-9000")
        );
        let docker_profile =
            Env::with(&[("HOME", "/root"), ("HERMES_HOME", "/opt/data/profiles/x")]);
        assert_eq!(
            profile_home(&docker_profile, "splash").unwrap(),
            PathBuf::from("/opt/data/profiles/splash")
        );
    }

    #[test]
    fn environment() {
        let l = launch(
            &Env::with(&[]),
            Path::new("/h/profiles/splash"),
            &["-z".into(), "hi".into()],
        );
        assert_eq!(l.args, ["-z", "hi"]);
        assert_eq!(l.env("HERMES_HOME"), Some("/h/profiles/splash"));
        assert_eq!(l.env("SPLASH_API_KEY"), Some("local"));
    }
}
