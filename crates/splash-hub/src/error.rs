//! The one error type of the crate. Every message says what went wrong and what to do.

use std::path::PathBuf;

/// What can go wrong while resolving or downloading a model repository.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HubError {
    /// The model spec string (`OWNER/REPO[:VARIANT]`) or the revision is malformed.
    #[error("invalid model spec {spec:?}: {reason}")]
    InvalidSpec {
        /// The string as given.
        spec: String,
        /// Why it was refused, with the expected form.
        reason: String,
    },
    /// The Hub answered 401 or 403: a private or gated repository, or a bad token.
    #[error(
        "the Hub refused access to {repo} (HTTP {status}): the repository is private or gated{}",
        if *has_token {
            ", and the token in HF_TOKEN has no access to it; check the token, and for a gated \
             model accept its terms on the model page"
        } else {
            " (or does not exist); set HF_TOKEN to a token that has access \
             (https://huggingface.co/settings/tokens)"
        }
    )]
    Unauthorized {
        /// `OWNER/REPO`.
        repo: String,
        /// 401 or 403.
        status: u16,
        /// Whether a token was sent.
        has_token: bool,
    },
    /// The repository (or, when the Hub does not say which, the revision) does not exist.
    #[error("{repo} at revision {revision:?} not found on the Hub: check the OWNER/REPO spelling, the --revision and HF_ENDPOINT")]
    RepoNotFound {
        /// `OWNER/REPO`.
        repo: String,
        /// The revision asked for.
        revision: String,
    },
    /// The repository exists but the revision (branch, tag or commit) does not.
    #[error("revision {revision:?} of {repo} not found: give an existing branch, tag or commit with --revision")]
    RevisionNotFound {
        /// `OWNER/REPO`.
        repo: String,
        /// The revision asked for.
        revision: String,
    },
    /// A file listed or needed is not in the repository at that revision.
    #[error("{path} not found in {repo} at {revision}: the repository is not a model checkpoint splash can load")]
    FileNotFound {
        /// `OWNER/REPO`.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// The file's path in the repository.
        path: String,
    },
    /// Any other HTTP error status.
    #[error("{url} answered HTTP {status}{}: try again later, or check HF_ENDPOINT",
        if message.is_empty() { String::new() } else { format!(" ({message})") })]
    Http {
        /// The URL requested.
        url: String,
        /// The status code.
        status: u16,
        /// The Hub's `X-Error-Message`, if any.
        message: String,
    },
    /// The server could not be reached or the connection failed mid-way.
    #[error("could not reach {url}: {source}; check the network (or HF_ENDPOINT) and run again (downloads resume)")]
    Network {
        /// The URL requested.
        url: String,
        /// What the HTTP client reported.
        #[source]
        source: Box<ureq::Error>,
    },
    /// The Hub answered something this client does not understand.
    #[error(
        "unexpected answer from {url}: {reason}; check HF_ENDPOINT points at a Hugging Face Hub"
    )]
    BadResponse {
        /// The URL requested.
        url: String,
        /// What was wrong with it.
        reason: String,
    },
    /// Offline (by choice or because the Hub was unreachable) and the cache has no snapshot.
    #[error(
        "{repo} at {revision} is not in the cache at {cache_dir} and the Hub cannot be used \
         ({why}): run once with network access{}",
        if *offline_mode { " and without HF_HUB_OFFLINE=1 / --offline" } else { "" }
    )]
    NotCached {
        /// `OWNER/REPO`.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// The hub cache directory searched.
        cache_dir: PathBuf,
        /// Why the network was not used.
        why: String,
        /// Whether offline mode was requested (as opposed to the network failing).
        offline_mode: bool,
    },
    /// A cached snapshot used offline lacks files the model needs.
    #[error("the cached snapshot {dir} is incomplete (missing {}): run again with network access to finish the download",
        missing.join(", "))]
    IncompleteSnapshot {
        /// The snapshot directory.
        dir: PathBuf,
        /// The missing repository paths.
        missing: Vec<String>,
    },
    /// The requested GGUF variant matches no file.
    #[error("no GGUF file in {repo} matches the variant {variant:?}; available variants: {}; pick one with {repo}:VARIANT",
        list_or_none(available))]
    VariantNotFound {
        /// `OWNER/REPO`.
        repo: String,
        /// The variant asked for.
        variant: String,
        /// The variants the repository has.
        available: Vec<String>,
    },
    /// The requested GGUF variant matches several different files.
    #[error("the variant {variant:?} is ambiguous in {repo}: it matches {}; give the full variant name as {repo}:VARIANT",
        matches.join(", "))]
    AmbiguousVariant {
        /// `OWNER/REPO`.
        repo: String,
        /// The variant asked for.
        variant: String,
        /// The variants it matched.
        matches: Vec<String>,
    },
    /// A GGUF-only repository has several variants and none was named.
    #[error("{repo} holds several GGUF variants ({}): pick one with {repo}:VARIANT", available.join(", "))]
    VariantRequired {
        /// `OWNER/REPO`.
        repo: String,
        /// The variants the repository has.
        available: Vec<String>,
    },
    /// A variant was given but the repository has no GGUF files.
    #[error("{repo} has no GGUF files, so the variant {variant:?} means nothing: drop the :{variant} suffix")]
    NotGguf {
        /// `OWNER/REPO`.
        repo: String,
        /// The variant asked for.
        variant: String,
    },
    /// The repository holds neither safetensors nor GGUF weights.
    #[error("{repo} has no *.safetensors or *.gguf weights: splash cannot load it (pick a safetensors or GGUF repository)")]
    NoWeights {
        /// `OWNER/REPO`.
        repo: String,
    },
    /// A file of the repository is not what its name promises.
    #[error("{path} in {repo} is invalid ({reason}): the repository cannot be loaded as it is")]
    InvalidFile {
        /// `OWNER/REPO`.
        repo: String,
        /// The file's path in the repository.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The caller's probe refused the model before the weights were downloaded.
    #[error("{repo} is not supported: {reason} (nothing large was downloaded)")]
    Refused {
        /// `OWNER/REPO`.
        repo: String,
        /// The probe's reason.
        reason: String,
    },
    /// A download stopped before the end; the partial file is kept for resuming.
    #[error("download of {path} stopped after {received} of {expected} bytes ({reason}): run again to resume")]
    Interrupted {
        /// Why it stopped.
        reason: String,
        /// The file's path in the repository.
        path: String,
        /// Bytes on disk so far.
        received: u64,
        /// Bytes expected.
        expected: u64,
    },
    /// A downloaded file's size or sha256 differs from what the Hub advertised.
    #[error("corrupt download of {path}: {what}; the partial file was removed: run again")]
    Corrupt {
        /// The file's path in the repository.
        path: String,
        /// What differed (expected vs got).
        what: String,
    },
    /// A file-system operation failed.
    #[error("could not {action} {}: {source}", path.display())]
    Io {
        /// What was being done (`"create"`, `"read"`, ...).
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

/// Result alias of the crate.
pub type Result<T, E = HubError> = std::result::Result<T, E>;

/// `map_err` helper for file-system calls: `.map_err(io("create", &path))`.
pub(crate) fn io<'a>(
    action: &'static str,
    path: impl Into<std::path::PathBuf> + 'a,
) -> impl FnOnce(std::io::Error) -> HubError + 'a {
    move |source| HubError::Io {
        action,
        path: path.into(),
        source,
    }
}
