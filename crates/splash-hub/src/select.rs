//! Which files of a repository to download: the safetensors checkpoint with its small
//! JSON/template/tokenizer files, or the `.gguf` file(s) of one quantisation variant.

use std::collections::BTreeMap;

use crate::error::{HubError, Result};

/// What [`plan`] picked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// A safetensors checkpoint: `small` holds `config.json` and the other non-weight files
    /// (fetched first), `weights` the `*.safetensors` candidates (narrowed by
    /// `model.safetensors.index.json` once it is downloaded).
    Safetensors {
        small: Vec<String>,
        weights: Vec<String>,
    },
    /// One GGUF variant: its file, or its split parts in order.
    Gguf { variant: String, files: Vec<String> },
}

/// Non-weight files a safetensors checkpoint may need, by extension.
const SMALL_EXTENSIONS: &[&str] = &["json", "jinja", "txt", "model", "tiktoken"];

/// Picks the files to download from a repository listing.
pub(crate) fn plan(repo: &str, files: &[String], variant: Option<&str>) -> Result<Plan> {
    let groups = gguf_groups(files);
    if let Some(variant) = variant {
        if groups.is_empty() {
            return Err(HubError::NotGguf {
                repo: repo.to_string(),
                variant: variant.to_string(),
            });
        }
        return select_variant(repo, &groups, variant);
    }
    let weights = safetensors_weights(files);
    if !weights.is_empty() {
        let mut small: Vec<String> = files.iter().filter(|f| is_small_file(f)).cloned().collect();
        small.sort();
        return Ok(Plan::Safetensors { small, weights });
    }
    match groups.as_slice() {
        [] => Err(HubError::NoWeights {
            repo: repo.to_string(),
        }),
        [one] => Ok(Plan::Gguf {
            variant: one.label.clone(),
            files: one.files.clone(),
        }),
        _ => Err(HubError::VariantRequired {
            repo: repo.to_string(),
            available: labels(&groups),
        }),
    }
}

/// Root-level `*.safetensors`; when `model*.safetensors` exist, other names
/// (`consolidated.safetensors` duplicates) are left out.
fn safetensors_weights(files: &[String]) -> Vec<String> {
    let root: Vec<&String> = files
        .iter()
        .filter(|f| !f.contains('/') && f.ends_with(".safetensors"))
        .collect();
    let has_model = root.iter().any(|f| f.starts_with("model"));
    let mut weights: Vec<String> = root
        .into_iter()
        .filter(|f| !has_model || f.starts_with("model"))
        .cloned()
        .collect();
    weights.sort();
    weights
}

/// A root-level configuration, tokenizer or template file (never weights: `*.bin`, `*.pt`,
/// `*.gguf`, ... are not in the list, nor are index files of those formats).
fn is_small_file(path: &str) -> bool {
    if path.contains('/') {
        return false;
    }
    if path == "tokenizer.json.gz" {
        return true;
    }
    let Some((stem, ext)) = path.rsplit_once('.') else {
        return false;
    };
    SMALL_EXTENSIONS.contains(&ext)
        && ![".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack"]
            .iter()
            .any(|weight| stem.contains(weight))
}

/// Shards named by a `model.safetensors.index.json` (`weight_map` values), sorted.
pub(crate) fn shards_from_index(index: &[u8]) -> Option<Vec<String>> {
    let json: serde_json::Value = serde_json::from_slice(index).ok()?;
    let map = json.get("weight_map")?.as_object()?;
    let mut shards: Vec<String> = map
        .values()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    shards.sort();
    shards.dedup();
    Some(shards)
}

/// The `.gguf` files of one variant: a single file, or the parts of a split file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GgufGroup {
    /// The variant name as the files spell it (`UD-Q4_K_M`).
    pub label: String,
    /// Lower-cased tokens of the directory and file stem, for matching.
    tokens: Vec<String>,
    /// The repository paths, parts in order.
    pub files: Vec<String>,
}

/// Groups the `.gguf` files (except `mmproj*` projectors) by directory and stem, with the
/// `-00001-of-00003` split suffix removed.
pub(crate) fn gguf_groups(files: &[String]) -> Vec<GgufGroup> {
    let mut groups: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for path in files {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        let lower = name.to_ascii_lowercase();
        if !lower.ends_with(".gguf") || lower.starts_with("mmproj") {
            continue;
        }
        let stem = &name[..name.len() - ".gguf".len()];
        let stem = strip_split_suffix(stem).unwrap_or(stem);
        groups
            .entry((dir.to_string(), stem.to_string()))
            .or_default()
            .push(path.clone());
    }
    groups
        .into_iter()
        .map(|((dir, stem), mut files)| {
            files.sort();
            let dir_name = dir.rsplit('/').next().unwrap_or("");
            let label = quant_label(&stem)
                .or_else(|| quant_label(dir_name))
                .unwrap_or(&stem)
                .to_string();
            GgufGroup {
                label,
                tokens: tokens(&format!("{dir}/{stem}")),
                files,
            }
        })
        .collect()
}

/// The parts a split GGUF file needs that `files` lacks: `files` starts with
/// `X-00001-of-00003.gguf`, so `X-00002-of-00003.gguf` and `X-00003-of-00003.gguf` must
/// follow.
pub(crate) fn missing_split_parts(files: &[String]) -> Vec<String> {
    let Some(first) = files.first() else {
        return Vec::new();
    };
    let Some(stem) = first.strip_suffix(".gguf") else {
        return Vec::new();
    };
    let Some(base) = strip_split_suffix(stem) else {
        return Vec::new();
    };
    let total: usize = stem[stem.len() - 5..].parse().unwrap_or(0);
    (1..=total)
        .map(|i| format!("{base}-{i:05}-of-{total:05}.gguf"))
        .filter(|part| !files.contains(part))
        .collect()
}

/// `Foo-Q8_0-00001-of-00002` → `Foo-Q8_0`.
fn strip_split_suffix(stem: &str) -> Option<&str> {
    let (rest, total) = stem.rsplit_once("-of-")?;
    let (base, part) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    (digits(part) && digits(total)).then_some(base)
}

/// The quantisation part of a name: from the first quant-like token (`Q4`, `IQ2`, `F16`,
/// `BF16`, ...) to the end, with a preceding `UD` (Unsloth Dynamic) kept.
fn quant_label(name: &str) -> Option<&str> {
    let spans = token_spans(name);
    let first = spans
        .iter()
        .position(|&(s, e)| is_quant_token(&name[s..e]))?;
    let start = match first.checked_sub(1) {
        Some(prev) if name[spans[prev].0..spans[prev].1].eq_ignore_ascii_case("ud") => prev,
        _ => first,
    };
    Some(&name[spans[start].0..])
}

fn is_quant_token(token: &str) -> bool {
    let t = token.to_ascii_lowercase();
    let digit_after = |prefix: &str| {
        t.strip_prefix(prefix)
            .is_some_and(|r| r.bytes().next().is_some_and(|b| b.is_ascii_digit()))
    };
    digit_after("q")
        || digit_after("iq")
        || digit_after("tq")
        || matches!(
            t.as_str(),
            "f16" | "f32" | "bf16" | "fp16" | "fp32" | "f8" | "fp8" | "mxfp4" | "nvfp4"
        )
}

/// Byte spans of the `-`/`.`/`_`/`/`-delimited tokens of `s`.
fn token_spans(s: &str) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut start = 0;
    for (i, c) in s.char_indices() {
        if matches!(c, '-' | '.' | '_' | '/') {
            if i > start {
                spans.push((start, i));
            }
            start = i + 1;
        }
    }
    if s.len() > start {
        spans.push((start, s.len()));
    }
    spans
}

fn tokens(s: &str) -> Vec<String> {
    token_spans(s)
        .into_iter()
        .map(|(a, b)| s[a..b].to_ascii_lowercase())
        .collect()
}

fn labels(groups: &[GgufGroup]) -> Vec<String> {
    let mut labels: Vec<String> = groups.iter().map(|g| g.label.clone()).collect();
    labels.sort();
    labels.dedup();
    labels
}

/// The group whose path contains the variant as a whole token sequence
/// (case-insensitive); among several, the one whose label is the variant exactly.
fn select_variant(repo: &str, groups: &[GgufGroup], variant: &str) -> Result<Plan> {
    let wanted = tokens(variant);
    let matches: Vec<&GgufGroup> = groups
        .iter()
        .filter(|g| !wanted.is_empty() && g.tokens.windows(wanted.len()).any(|w| w == wanted))
        .collect();
    let exact: Vec<&GgufGroup> = matches
        .iter()
        .copied()
        .filter(|g| g.label.eq_ignore_ascii_case(variant))
        .collect();
    let chosen = match (matches.as_slice(), exact.as_slice()) {
        ([], _) => {
            return Err(HubError::VariantNotFound {
                repo: repo.to_string(),
                variant: variant.to_string(),
                available: labels(groups),
            })
        }
        ([one], _) | (_, [one]) => *one,
        (many, _) => {
            let mut names: Vec<String> = many.iter().map(|g| g.files[0].clone()).collect();
            names.sort();
            return Err(HubError::AmbiguousVariant {
                repo: repo.to_string(),
                variant: variant.to_string(),
                matches: names,
            });
        }
    };
    Ok(Plan::Gguf {
        variant: chosen.label.clone(),
        files: chosen.files.clone(),
    })
}

/// The repository's vision projector for its GGUF models (`mmproj*.gguf`, llama.cpp's
/// name): BF16 first, then F32, then F16, then the first by name.
pub(crate) fn projector(files: &[String]) -> Option<String> {
    let mut found: Vec<&String> = files
        .iter()
        .filter(|f| {
            let name = f.rsplit('/').next().unwrap_or(f).to_ascii_lowercase();
            name.starts_with("mmproj") && name.ends_with(".gguf")
        })
        .collect();
    found.sort();
    let rank = |f: &&String| {
        let name = f.to_ascii_lowercase();
        ["bf16", "f32", "f16"]
            .iter()
            .position(|k| name.contains(k))
            .unwrap_or(3)
    };
    found.into_iter().min_by_key(rank).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn gguf(names: &[&str], variant: &str) -> Result<Vec<String>> {
        match plan("o/r", &files(names), Some(variant))? {
            Plan::Gguf { files, .. } => Ok(files),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_projector_prefers_bf16_then_f32_then_f16() {
        let pick = |names: &[&str]| projector(&files(names));
        assert_eq!(pick(UNSLOTH).as_deref(), Some("mmproj-F16.gguf"));
        let all = [
            "mmproj-F16.gguf",
            "mmproj-F32.gguf",
            "mmproj-BF16.gguf",
            "Foo-Q8_0.gguf",
        ];
        assert_eq!(pick(&all).as_deref(), Some("mmproj-BF16.gguf"));
        assert_eq!(pick(&all[..2]).as_deref(), Some("mmproj-F32.gguf"));
        assert_eq!(pick(&["Foo-Q8_0.gguf", "README.md"]), None);
    }

    const UNSLOTH: &[&str] = &[
        "README.md",
        "Foo-UD-Q4_K_M.gguf",
        "Foo-Q8_0-00001-of-00002.gguf",
        "Foo-Q8_0-00002-of-00002.gguf",
        "mmproj-F16.gguf",
    ];

    #[test]
    fn variant_picks_whole_token_matches() {
        assert_eq!(
            gguf(UNSLOTH, "Q8_0").unwrap(),
            [
                "Foo-Q8_0-00001-of-00002.gguf",
                "Foo-Q8_0-00002-of-00002.gguf"
            ]
        );
        assert_eq!(gguf(UNSLOTH, "ud-q4_k_m").unwrap(), ["Foo-UD-Q4_K_M.gguf"]);
        assert_eq!(gguf(UNSLOTH, "Q4_K_M").unwrap(), ["Foo-UD-Q4_K_M.gguf"]);
        let err = gguf(UNSLOTH, "Q5_K").unwrap_err();
        assert!(
            matches!(&err, HubError::VariantNotFound { available, .. } if available == &["Q8_0", "UD-Q4_K_M"]),
            "{err}"
        );
        // Tokens are whole: Q4 is not a prefix match of Q40.
        assert!(gguf(&["m-Q40.gguf", "m-Q8_0.gguf"], "Q4").is_err());
        assert!(
            gguf(UNSLOTH, "F16").is_err(),
            "mmproj files are never selected"
        );
    }

    #[test]
    fn exact_label_breaks_ties() {
        let repo = ["Foo-Q4_K_M.gguf", "Foo-UD-Q4_K_M.gguf", "Foo-Q4_K_S.gguf"];
        assert_eq!(gguf(&repo, "Q4_K_M").unwrap(), ["Foo-Q4_K_M.gguf"]);
        assert_eq!(gguf(&repo, "UD-Q4_K_M").unwrap(), ["Foo-UD-Q4_K_M.gguf"]);
        let err = gguf(&repo, "Q4_K").unwrap_err();
        assert!(
            matches!(err, HubError::AmbiguousVariant { ref matches, .. } if matches.len() == 3),
            "{err}"
        );
    }

    #[test]
    fn split_parts_in_a_variant_folder_belong_together() {
        let repo = [
            "UD-Q4_K_XL/Foo-UD-Q4_K_XL-00001-of-00002.gguf",
            "UD-Q4_K_XL/Foo-UD-Q4_K_XL-00002-of-00002.gguf",
            "Q8_0/model-00001-of-00002.gguf",
            "Q8_0/model-00002-of-00002.gguf",
            "Foo-Q2_K.gguf",
        ];
        assert_eq!(gguf(&repo, "UD-Q4_K_XL").unwrap().len(), 2);
        assert_eq!(
            gguf(&repo, "q8_0").unwrap(),
            [
                "Q8_0/model-00001-of-00002.gguf",
                "Q8_0/model-00002-of-00002.gguf"
            ]
        );
        let labels = labels(&gguf_groups(&files(&repo)));
        assert_eq!(labels, ["Q2_K", "Q8_0", "UD-Q4_K_XL"]);
    }

    #[test]
    fn no_variant_means_safetensors_or_the_only_gguf() {
        let repo = files(&[
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "consolidated.safetensors",
            "pytorch_model.bin",
            "pytorch_model.bin.index.json",
            "original/params.json",
            "model.gguf",
            "README.md",
            ".gitattributes",
        ]);
        let Plan::Safetensors { small, weights } = plan("o/r", &repo, None).unwrap() else {
            panic!()
        };
        assert_eq!(
            small,
            [
                "chat_template.jinja",
                "config.json",
                "generation_config.json",
                "model.safetensors.index.json",
                "tokenizer.json",
                "tokenizer_config.json",
            ]
        );
        assert_eq!(
            weights,
            [
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        );

        let only = plan("o/r", &files(&["a-Q4_0.gguf", "mmproj-a.gguf"]), None).unwrap();
        assert_eq!(
            only,
            Plan::Gguf {
                variant: "Q4_0".into(),
                files: vec!["a-Q4_0.gguf".into()]
            }
        );
        assert!(matches!(
            plan("o/r", &files(UNSLOTH), None),
            Err(HubError::VariantRequired { .. })
        ));
        assert!(matches!(
            plan("o/r", &files(&["pytorch_model.bin"]), None),
            Err(HubError::NoWeights { .. })
        ));
        assert!(matches!(
            plan("o/r", &files(&["model.safetensors"]), Some("Q4")),
            Err(HubError::NotGguf { .. })
        ));
    }

    #[test]
    fn split_parts_are_all_required() {
        let parts = files(&["d/m-00001-of-00003.gguf", "d/m-00003-of-00003.gguf"]);
        assert_eq!(missing_split_parts(&parts), ["d/m-00002-of-00003.gguf"]);
        assert!(missing_split_parts(&files(&["m-Q8_0.gguf"])).is_empty());
    }

    #[test]
    fn index_lists_its_shards() {
        let index = br#"{"metadata": {}, "weight_map": {"a": "m-2.safetensors", "b": "m-1.safetensors", "c": "m-2.safetensors"}}"#;
        assert_eq!(
            shards_from_index(index).unwrap(),
            ["m-1.safetensors", "m-2.safetensors"]
        );
        assert!(shards_from_index(b"{}").is_none());
    }
}
