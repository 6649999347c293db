//! [`HubSpec`]: which repository, which GGUF variant, which revision.

use std::fmt;

use crate::error::{HubError, Result};

/// The revision used when none is given.
pub const DEFAULT_REVISION: &str = "main";

/// A model on the Hub: `OWNER/REPO` or `OWNER/REPO:VARIANT`, at a revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubSpec {
    /// `OWNER/REPO`.
    pub repo: String,
    /// The GGUF quantisation to pick (`Q8_0`, `UD-Q4_K_M`), if any.
    pub variant: Option<String>,
    /// Branch, tag or 40-hex commit; `main` by default.
    pub revision: String,
}

impl HubSpec {
    /// Parses `OWNER/REPO` or `OWNER/REPO:VARIANT` at revision `main`.
    ///
    /// ```
    /// let spec = splash_hub::HubSpec::parse("unsloth/Qwen3-8B-GGUF:UD-Q4_K_XL").unwrap();
    /// assert_eq!(spec.repo, "unsloth/Qwen3-8B-GGUF");
    /// assert_eq!(spec.variant.as_deref(), Some("UD-Q4_K_XL"));
    /// assert_eq!(spec.revision, "main");
    /// ```
    pub fn parse(spec: &str) -> Result<HubSpec> {
        let invalid = |reason: &str| HubError::InvalidSpec {
            spec: spec.to_string(),
            reason: format!("{reason}; expected OWNER/REPO or OWNER/REPO:VARIANT"),
        };
        let (repo, variant) = match spec.split_once(':') {
            Some((repo, variant)) => (repo, Some(variant)),
            None => (spec, None),
        };
        let Some((owner, name)) = repo.split_once('/') else {
            return Err(invalid("no '/' between owner and repository name"));
        };
        for part in [owner, name] {
            check_name(part).map_err(|reason| invalid(&reason))?;
        }
        if let Some(variant) = variant {
            check_name(variant).map_err(|reason| invalid(&format!("variant: {reason}")))?;
        }
        Ok(HubSpec {
            repo: repo.to_string(),
            variant: variant.map(str::to_string),
            revision: DEFAULT_REVISION.to_string(),
        })
    }

    /// The same spec at another revision (a branch, tag or 40-hex commit).
    pub fn with_revision(mut self, revision: &str) -> Result<HubSpec> {
        let bad = revision.is_empty()
            || revision.starts_with('/')
            || revision.ends_with('/')
            || revision.contains("..")
            || revision.contains("//")
            || revision
                .chars()
                .any(|c| c.is_whitespace() || c.is_control());
        if bad {
            return Err(HubError::InvalidSpec {
                spec: revision.to_string(),
                reason: "not a valid revision; give a branch, tag or 40-hex commit".to_string(),
            });
        }
        self.revision = revision.to_string();
        Ok(self)
    }
}

impl fmt::Display for HubSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.repo)?;
        if let Some(variant) = &self.variant {
            write!(f, ":{variant}")?;
        }
        if self.revision != DEFAULT_REVISION {
            write!(f, "@{}", self.revision)?;
        }
        Ok(())
    }
}

/// Whether `revision` is a full commit hash (40 lowercase hex digits).
pub(crate) fn is_commit_hash(revision: &str) -> bool {
    revision.len() == 40
        && revision
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The Hub's rule for owner and repository names: letters, digits, `-`, `_`, `.`; no
/// `--` or `..`; at most 96 characters.
fn check_name(part: &str) -> std::result::Result<(), String> {
    if part.is_empty() {
        return Err("empty name".to_string());
    }
    if part.len() > 96 {
        return Err(format!("{part:?} is longer than 96 characters"));
    }
    if let Some(c) = part
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!("{part:?} contains {c:?}"));
    }
    if part.contains("--") || part.contains("..") {
        return Err(format!("{part:?} contains '--' or '..'"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_repo_and_variant() {
        let s = HubSpec::parse("Qwen/Qwen3.5-0.8B").unwrap();
        assert_eq!(
            (s.repo.as_str(), s.variant, s.revision.as_str()),
            ("Qwen/Qwen3.5-0.8B", None, "main")
        );
        let s = HubSpec::parse("unsloth/Foo-GGUF:Q8_0").unwrap();
        assert_eq!(s.variant.as_deref(), Some("Q8_0"));
        assert_eq!(s.to_string(), "unsloth/Foo-GGUF:Q8_0");
        let s = s.with_revision("v1.0").unwrap();
        assert_eq!(s.to_string(), "unsloth/Foo-GGUF:Q8_0@v1.0");
    }

    #[test]
    fn refuses_malformed_specs() {
        for bad in [
            "", "noslash", "a/b/c", "/repo", "owner/", "o/r:", "o w/r", "a--b/c", "a/b..c",
            "o/r:Q4 K",
        ] {
            let err = HubSpec::parse(bad).unwrap_err().to_string();
            assert!(err.contains("expected OWNER/REPO"), "{bad}: {err}");
        }
        let spec = HubSpec::parse("o/r").unwrap();
        for bad in ["", "a..b", "/x", "a b"] {
            assert!(spec.clone().with_revision(bad).is_err(), "{bad}");
        }
        assert!(spec.with_revision("refs/pr/1").is_ok());
    }

    #[test]
    fn recognises_commit_hashes() {
        assert!(is_commit_hash(&"a".repeat(40)));
        assert!(!is_commit_hash(&"A".repeat(40)));
        assert!(!is_commit_hash("main"));
    }
}
