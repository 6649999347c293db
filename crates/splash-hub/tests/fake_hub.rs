//! splash-hub against a fake Hub on loopback (`splash_hub::fake_hub`): the HF cache layout,
//! resuming, offline use, moving branches, private repositories, the probe, corruption and
//! GGUF variants.

use std::cell::RefCell;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use splash_hub::fake_hub::{noise, sha256_hex, FakeFile, FakeHub, Silent, TempDir};
use splash_hub::{list_cache, resolve, HubConfig, HubError, HubSpec, ModelFormat, Probe};

const REPO: &str = "acme/tiny";
const COMMIT_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const COMMIT_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const SHARD_1: &str = "model-00001-of-00002.safetensors";
const SHARD_2: &str = "model-00002-of-00002.safetensors";

/// The files `resolve` must fetch from the safetensors fixture, in its order (small files
/// sorted, then the shards).
const FETCHED: &[&str] = &[
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    SHARD_1,
    SHARD_2,
];

/// A safetensors repository: small git files, two LFS shards (300 KB in all) named by the
/// index, and weights in other formats that must never be fetched.
fn safetensors_repo(model_type: &str) -> Vec<FakeFile> {
    let index = format!(
        r#"{{"metadata": {{"total_size": 300000}}, "weight_map": {{"a.weight": "{SHARD_1}", "b.weight": "{SHARD_2}"}}}}"#
    );
    let tokenizer = format!(r#"{{"model": {{"vocab": "{}"}}}}"#, "ab".repeat(2000));
    vec![
        FakeFile::git(
            ".gitattributes",
            "*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
        ),
        FakeFile::git("README.md", "# tiny\n"),
        FakeFile::git(
            "config.json",
            format!(r#"{{"model_type": "{model_type}", "hidden_size": 64}}"#),
        ),
        FakeFile::git("generation_config.json", r#"{"temperature": 0.6}"#),
        FakeFile::git("tokenizer.json", tokenizer),
        FakeFile::git("tokenizer_config.json", r#"{"eos_token": "<|im_end|>"}"#),
        FakeFile::git(
            "chat_template.jinja",
            "{% for m in messages %}{{ m.content }}{% endfor %}",
        ),
        FakeFile::git("model.safetensors.index.json", index),
        FakeFile::lfs(SHARD_1, noise(150_000, 1)),
        FakeFile::lfs(SHARD_2, noise(150_000, 2)),
        FakeFile::lfs("consolidated.safetensors", noise(30_000, 3)),
        FakeFile::lfs("pytorch_model.bin", noise(30_000, 4)),
        FakeFile::lfs("original/model.safetensors", noise(30_000, 5)),
    ]
}

fn file<'a>(files: &'a [FakeFile], path: &str) -> &'a FakeFile {
    files.iter().find(|f| f.path == path).unwrap()
}

fn config_for(hub_url: &str, cache: &TempDir) -> HubConfig {
    HubConfig {
        endpoint: hub_url.to_string(),
        quiet: true,
        ..HubConfig::new(cache.path())
    }
}

fn spec(s: &str) -> HubSpec {
    HubSpec::parse(s).unwrap()
}

fn accept(_: &Probe) -> Result<(), String> {
    Ok(())
}

fn repo_dir(cache: &TempDir, repo: &str) -> PathBuf {
    cache
        .path()
        .join(format!("models--{}", repo.replace('/', "--")))
}

fn blobs(cache: &TempDir, repo: &str) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(repo_dir(cache, repo).join("blobs"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn read_ref(cache: &TempDir, repo: &str, revision: &str) -> Option<String> {
    fs::read_to_string(repo_dir(cache, repo).join("refs").join(revision)).ok()
}

fn relative_paths(snapshot_dir: &Path, files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .map(|p| {
            p.strip_prefix(snapshot_dir)
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

#[test]
fn fresh_download_lands_in_the_hf_layout() {
    let hub = FakeHub::start();
    let files = safetensors_repo("qwen3_5");
    hub.push(REPO, "main", COMMIT_A, files.clone());
    let cache = TempDir::new();
    let config = HubConfig {
        token: Some("hf_public".to_string()),
        ..config_for(&hub.url, &cache)
    };
    let seen = RefCell::new(Vec::new());
    let snapshot = resolve(&spec(REPO), &config, &|probe| {
        if let Probe::Config { bytes, .. } = probe {
            seen.borrow_mut().push(bytes.to_vec());
        }
        Ok(())
    })
    .unwrap();

    let dir = repo_dir(&cache, REPO);
    assert_eq!(snapshot.commit, COMMIT_A);
    assert_eq!(snapshot.dir, dir.join("snapshots").join(COMMIT_A));
    assert_eq!(snapshot.format, ModelFormat::Safetensors);
    assert!(!snapshot.offline);
    assert_eq!(relative_paths(&snapshot.dir, &snapshot.files), FETCHED);
    assert_eq!(*seen.borrow(), [file(&files, "config.json").bytes.to_vec()]);

    // snapshots/<commit>/<path> -> ../../blobs/<etag>, holding the right bytes.
    for path in FETCHED {
        let f = file(&files, path);
        let link = snapshot.dir.join(path);
        let target = fs::read_link(&link).unwrap();
        assert_eq!(target, Path::new("../../blobs").join(f.etag()), "{path}");
        assert_eq!(fs::read(&link).unwrap(), *f.bytes, "{path}");
    }
    let mut expected_blobs: Vec<String> = FETCHED.iter().map(|p| file(&files, p).etag()).collect();
    expected_blobs.sort();
    assert_eq!(
        blobs(&cache, REPO),
        expected_blobs,
        "no .incomplete left, nothing else"
    );
    assert_eq!(read_ref(&cache, REPO, "main").as_deref(), Some(COMMIT_A));

    // The Hub got the token and the listing with blobs; the CDN got neither the token nor
    // any request for weights in other formats.
    let log = hub.requests();
    assert!(log[0]
        .target
        .starts_with("/api/models/acme/tiny/revision/main?blobs=true"));
    for r in &log {
        let expected = (r.server == "hub").then_some("Bearer hf_public");
        assert_eq!(r.authorization.as_deref(), expected, "{r:?}");
        for never in [
            "pytorch_model.bin",
            "consolidated.safetensors",
            "original/",
            "README.md",
        ] {
            assert!(!r.target.contains(never), "{r:?}");
        }
    }
    assert_eq!(hub.cdn_requests_for(SHARD_1).len(), 1);

    // list_cache sees one repository, one snapshot, blobs counted once.
    let listed = list_cache(&config).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].repo, REPO);
    let total: u64 = FETCHED
        .iter()
        .map(|p| file(&files, p).bytes.len() as u64)
        .sum();
    assert_eq!(listed[0].size_on_disk, total);
    assert_eq!(listed[0].snapshots.len(), 1);
    assert_eq!(listed[0].snapshots[0].commit, COMMIT_A);
    assert_eq!(listed[0].snapshots[0].refs, ["main"]);
    assert_eq!(listed[0].snapshots[0].files.len(), FETCHED.len());

    // A second run lists the repository and downloads nothing.
    hub.clear_log();
    let again = resolve(&spec(REPO), &config, &accept).unwrap();
    assert_eq!(again, snapshot);
    let log = hub.requests();
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(log[0].target.starts_with("/api/models/"));
}

#[test]
fn resume_after_a_cut_connection() {
    let hub = FakeHub::start();
    let files = safetensors_repo("qwen3_5");
    hub.push(REPO, "main", COMMIT_A, files.clone());
    hub.cut_once(SHARD_1, 100_000);
    let cache = TempDir::new();
    let config = config_for(&hub.url, &cache);

    let err = resolve(&spec(REPO), &config, &accept).unwrap_err();
    assert!(matches!(err, HubError::Interrupted { .. }), "{err}");
    assert!(err.to_string().contains("run again to resume"), "{err}");
    let shard = file(&files, SHARD_1);
    let partial = repo_dir(&cache, REPO)
        .join("blobs")
        .join(format!("{}.incomplete", shard.etag()));
    assert_eq!(fs::metadata(&partial).unwrap().len(), 100_000);
    let snapshot_dir = repo_dir(&cache, REPO).join("snapshots").join(COMMIT_A);
    assert!(
        !snapshot_dir.join(SHARD_1).exists(),
        "no half file at the final path"
    );
    assert_eq!(
        read_ref(&cache, REPO, "main"),
        None,
        "the ref waits for a whole snapshot"
    );

    hub.clear_log();
    let snapshot = resolve(&spec(REPO), &config, &accept).unwrap();
    let resumed = hub.cdn_requests_for(SHARD_1);
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0].range.as_deref(), Some("bytes=100000-"));
    let bytes = fs::read(snapshot.dir.join(SHARD_1)).unwrap();
    assert_eq!(sha256_hex(&bytes), shard.sha256());
    assert!(!partial.exists());
    assert_eq!(read_ref(&cache, REPO, "main").as_deref(), Some(COMMIT_A));
}

#[test]
fn offline_start_uses_the_cache() {
    let mut hub = FakeHub::start();
    hub.push(REPO, "main", COMMIT_A, safetensors_repo("qwen3_5"));
    let cache = TempDir::new();
    let config = config_for(&hub.url, &cache);
    let online = resolve(&spec(REPO), &config, &accept).unwrap();

    // Offline mode: the same snapshot, and not one request.
    hub.clear_log();
    let offline = HubConfig {
        offline: true,
        ..config.clone()
    };
    let probed = RefCell::new(0);
    let snapshot = resolve(&spec(REPO), &offline, &|_| {
        *probed.borrow_mut() += 1;
        Ok(())
    })
    .unwrap();
    assert!(snapshot.offline);
    assert_eq!(snapshot.files, online.files);
    assert_eq!(*probed.borrow(), 1, "the probe still runs offline");
    assert!(hub.requests().is_empty());

    // The Hub gone: the revision check fails and the cache stands in.
    hub.shutdown();
    let snapshot = resolve(&spec(REPO), &config, &accept).unwrap();
    assert!(snapshot.offline);
    assert_eq!(snapshot.commit, COMMIT_A);
    assert_eq!(snapshot.files, online.files);

    // Neither network nor cache.
    let empty = TempDir::new();
    let err = resolve(&spec(REPO), &config_for(&hub.url, &empty), &accept).unwrap_err();
    assert!(
        matches!(
            err,
            HubError::NotCached {
                offline_mode: false,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("run once with network access"),
        "{err}"
    );
    let err = resolve(
        &spec(REPO),
        &HubConfig {
            offline: true,
            ..config_for(&hub.url, &empty)
        },
        &accept,
    )
    .unwrap_err();
    assert!(err.to_string().contains("HF_HUB_OFFLINE"), "{err}");
}

#[test]
fn unresponsive_hub_falls_back_after_the_check_timeout() {
    let hub = FakeHub::start();
    hub.push(REPO, "main", COMMIT_A, safetensors_repo("qwen3_5"));
    let cache = TempDir::new();
    resolve(&spec(REPO), &config_for(&hub.url, &cache), &accept).unwrap();

    let silent = Silent::start();
    let config = HubConfig {
        check_timeout: Duration::from_millis(300),
        ..config_for(&silent.url, &cache)
    };
    let start = Instant::now();
    let snapshot = resolve(&spec(REPO), &config, &accept).unwrap();
    assert!(snapshot.offline);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn moved_branch_gets_a_new_snapshot_and_shares_blobs() {
    let hub = FakeHub::start();
    let old = safetensors_repo("qwen3_5");
    hub.push(REPO, "main", COMMIT_A, old.clone());
    hub.push(REPO, "v1", COMMIT_A, old.clone());
    let cache = TempDir::new();
    let config = config_for(&hub.url, &cache);
    let first = resolve(&spec(REPO), &config, &accept).unwrap();

    // main moves on: a new config.json, the same weights.
    let mut new = old.clone();
    new[2] = FakeFile::git(
        "config.json",
        r#"{"model_type": "qwen3_5", "hidden_size": 128}"#,
    );
    hub.push(REPO, "main", COMMIT_B, new.clone());
    hub.clear_log();
    let second = resolve(&spec(REPO), &config, &accept).unwrap();
    assert_eq!(second.commit, COMMIT_B);
    assert_ne!(second.dir, first.dir);
    assert_eq!(read_ref(&cache, REPO, "main").as_deref(), Some(COMMIT_B));
    assert_eq!(
        fs::read(second.dir.join("config.json")).unwrap(),
        *new[2].bytes
    );
    assert_eq!(
        fs::read(first.dir.join("config.json")).unwrap(),
        *old[2].bytes
    );
    let log = hub.requests();
    assert!(
        log.iter().all(|r| r.server == "hub"),
        "no weights re-downloaded: {log:?}"
    );
    assert!(log.iter().any(|r| r
        .target
        .ends_with("/resolve/bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb/config.json")));
    assert_eq!(
        fs::read_link(first.dir.join(SHARD_1)).unwrap(),
        fs::read_link(second.dir.join(SHARD_1)).unwrap()
    );

    // The old commit stays reachable by tag and by hash, without downloads.
    hub.clear_log();
    let tagged = resolve(&spec(REPO).with_revision("v1").unwrap(), &config, &accept).unwrap();
    assert_eq!(tagged.dir, first.dir);
    assert_eq!(read_ref(&cache, REPO, "v1").as_deref(), Some(COMMIT_A));
    let pinned = resolve(
        &spec(REPO).with_revision(COMMIT_A).unwrap(),
        &config,
        &accept,
    )
    .unwrap();
    assert_eq!(pinned.dir, first.dir);
    assert!(hub.requests().iter().all(|r| r.target.starts_with("/api/")));

    let listed = &list_cache(&config).unwrap()[0];
    assert_eq!(listed.snapshots.len(), 2);
    let unique: u64 = FETCHED
        .iter()
        .map(|p| file(&old, p).bytes.len() as u64)
        .sum::<u64>()
        + new[2].bytes.len() as u64;
    assert_eq!(listed.size_on_disk, unique, "shared blobs counted once");
}

#[test]
fn private_repo_needs_the_token() {
    let hub = FakeHub::start();
    hub.push("acme/secret", "main", COMMIT_A, safetensors_repo("qwen3_5"));
    hub.set_private("acme/secret", "hf_good");
    let cache = TempDir::new();
    let config = config_for(&hub.url, &cache);

    let err = resolve(&spec("acme/secret"), &config, &accept).unwrap_err();
    assert!(
        matches!(
            err,
            HubError::Unauthorized {
                status: 401,
                has_token: false,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("set HF_TOKEN"), "{err}");

    let wrong = HubConfig {
        token: Some("hf_bad".into()),
        ..config.clone()
    };
    let err = resolve(&spec("acme/secret"), &wrong, &accept).unwrap_err();
    assert!(
        matches!(
            err,
            HubError::Unauthorized {
                has_token: true,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("private or gated"), "{err}");

    let good = HubConfig {
        token: Some("hf_good".into()),
        ..config.clone()
    };
    let snapshot = resolve(&spec("acme/secret"), &good, &accept).unwrap();
    assert_eq!(snapshot.files.len(), FETCHED.len());
    let cdn: Vec<_> = hub
        .requests()
        .into_iter()
        .filter(|r| r.server == "cdn")
        .collect();
    assert!(!cdn.is_empty());
    assert!(
        cdn.iter().all(|r| r.authorization.is_none()),
        "token kept off the CDN"
    );
}

#[test]
fn renamed_repo_is_followed_with_the_token() {
    let hub = FakeHub::start();
    hub.push(REPO, "main", COMMIT_A, safetensors_repo("qwen3_5"));
    hub.set_private(REPO, "hf_good");
    hub.rename("acme/old-name", REPO);
    let cache = TempDir::new();
    let config = HubConfig {
        token: Some("hf_good".into()),
        ..config_for(&hub.url, &cache)
    };
    let snapshot = resolve(&spec("acme/old-name"), &config, &accept).unwrap();
    assert_eq!(snapshot.commit, COMMIT_A);
    assert_eq!(snapshot.files.len(), FETCHED.len());
    let log = hub.requests();
    assert!(
        log.iter()
            .any(|r| r.target.starts_with("/api/models/acme/tiny/")),
        "{log:?}"
    );
    assert!(log
        .iter()
        .filter(|r| r.server == "hub")
        .all(|r| r.authorization.is_some()));
}

#[test]
fn missing_repo_and_revision_are_named() {
    let hub = FakeHub::start();
    hub.push(REPO, "main", COMMIT_A, safetensors_repo("qwen3_5"));
    let cache = TempDir::new();
    let config = config_for(&hub.url, &cache);
    let err = resolve(&spec("acme/nope"), &config, &accept).unwrap_err();
    assert!(matches!(err, HubError::RepoNotFound { .. }), "{err}");
    let err = resolve(&spec(REPO).with_revision("nope").unwrap(), &config, &accept).unwrap_err();
    assert!(matches!(err, HubError::RevisionNotFound { .. }), "{err}");
    assert!(err.to_string().contains("--revision"), "{err}");
}

#[test]
fn unsupported_model_is_refused_before_the_weights() {
    let hub = FakeHub::start();
    hub.push(REPO, "main", COMMIT_A, safetensors_repo("llama"));
    let cache = TempDir::new();
    let config = config_for(&hub.url, &cache);
    let err = resolve(&spec(REPO), &config, &|probe| match probe {
        Probe::Config { bytes, .. } if String::from_utf8_lossy(bytes).contains("qwen3_5") => Ok(()),
        _ => Err("model_type llama is not supported".to_string()),
    })
    .unwrap_err();
    assert!(matches!(err, HubError::Refused { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("model_type llama is not supported"),
        "{err}"
    );
    let log = hub.requests();
    assert!(
        log.iter().all(|r| r.server == "hub"),
        "the CDN served nothing: {log:?}"
    );
    assert!(
        log.iter().all(|r| !r.target.contains(".safetensors")),
        "{log:?}"
    );
    assert_eq!(blobs(&cache, REPO).len(), 1, "only config.json is cached");
    assert_eq!(read_ref(&cache, REPO, "main"), None);
}

#[test]
fn corrupt_download_is_detected_and_removed() {
    let hub = FakeHub::start();
    let files = safetensors_repo("qwen3_5");
    hub.push(REPO, "main", COMMIT_A, files.clone());
    hub.corrupt(SHARD_2);
    let cache = TempDir::new();
    let config = config_for(&hub.url, &cache);
    let err = resolve(&spec(REPO), &config, &accept).unwrap_err();
    assert!(matches!(err, HubError::Corrupt { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("corrupt download of model-00002-of-00002.safetensors"),
        "{message}"
    );
    assert!(
        message.contains("removed") && message.contains("run again"),
        "{message}"
    );
    let sha = file(&files, SHARD_2).sha256();
    assert!(
        blobs(&cache, REPO).iter().all(|b| !b.starts_with(&sha)),
        "neither blob nor .incomplete"
    );
    let snapshot_dir = repo_dir(&cache, REPO).join("snapshots").join(COMMIT_A);
    assert!(!snapshot_dir.join(SHARD_2).exists());
    assert!(snapshot_dir.join(SHARD_1).exists());
}

fn gguf_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut bytes = b"GGUF\x03\0\0\0".to_vec();
    bytes.extend(noise(len - bytes.len(), seed));
    bytes
}

#[test]
fn gguf_variants_select_their_files_and_probe_a_prefix() {
    const GGUF_REPO: &str = "acme/Foo-GGUF";
    let hub = FakeHub::start();
    let files = vec![
        FakeFile::git("README.md", "# Foo GGUF\n"),
        FakeFile::lfs("Foo-UD-Q4_K_M.gguf", gguf_bytes(1, 20_000)),
        FakeFile::lfs("Foo-Q8_0-00001-of-00002.gguf", gguf_bytes(2, 30_000)),
        FakeFile::lfs("Foo-Q8_0-00002-of-00002.gguf", noise(30_000, 3)),
        FakeFile::lfs("mmproj-F16.gguf", gguf_bytes(4, 10_000)),
    ];
    hub.push(GGUF_REPO, "main", COMMIT_A, files.clone());
    let cache = TempDir::new();
    let config = config_for(&hub.url, &cache);

    let seen = RefCell::new(None);
    let probe = |p: &Probe| {
        if let Probe::Gguf {
            path, prefix, size, ..
        } = p
        {
            *seen.borrow_mut() = Some((path.to_string(), prefix.to_vec(), *size));
        }
        Ok(())
    };
    let snapshot = resolve(&spec("acme/Foo-GGUF:Q8_0"), &config, &probe).unwrap();
    assert_eq!(
        relative_paths(&snapshot.dir, &snapshot.files),
        [
            "Foo-Q8_0-00001-of-00002.gguf",
            "Foo-Q8_0-00002-of-00002.gguf"
        ]
    );
    assert_eq!(
        snapshot.format,
        ModelFormat::Gguf {
            variant: "Q8_0".into()
        }
    );
    let first = file(&files, "Foo-Q8_0-00001-of-00002.gguf");
    assert_eq!(
        *seen.borrow(),
        Some((first.path.clone(), first.bytes.to_vec(), Some(30_000)))
    );
    let ranged = hub.cdn_requests_for(&first.path);
    assert_eq!(
        ranged[0].range.as_deref(),
        Some("bytes=0-29999"),
        "probe by range request"
    );
    let log = hub.requests();
    for never in ["Foo-UD-Q4_K_M.gguf", "mmproj-F16.gguf", "README.md"] {
        assert!(
            log.iter().all(|r| !r.target.contains(never)),
            "{never}: {log:?}"
        );
    }

    let one = resolve(&spec("acme/Foo-GGUF:UD-Q4_K_M"), &config, &accept).unwrap();
    assert_eq!(relative_paths(&one.dir, &one.files), ["Foo-UD-Q4_K_M.gguf"]);

    let err = resolve(&spec("acme/Foo-GGUF:Q5_K"), &config, &accept).unwrap_err();
    assert!(matches!(err, HubError::VariantNotFound { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("Q8_0, UD-Q4_K_M"), "{message}");
    assert!(!message.contains("F16"), "{message}");

    let err = resolve(&spec("acme/Foo-GGUF"), &config, &accept).unwrap_err();
    assert!(matches!(err, HubError::VariantRequired { .. }), "{err}");
}

#[test]
fn gguf_refused_by_its_header_downloads_nothing_big() {
    let hub = FakeHub::start();
    let big = gguf_bytes(7, 5 << 20);
    hub.push(
        "acme/Bar-GGUF",
        "main",
        COMMIT_A,
        vec![FakeFile::lfs("Bar-Q4_0.gguf", big)],
    );
    let cache = TempDir::new();
    let config = config_for(&hub.url, &cache);
    let err = resolve(&spec("acme/Bar-GGUF"), &config, &|p| match p {
        Probe::Gguf { prefix, .. } if prefix.starts_with(b"GGUF") => {
            Err("architecture gemma3 is not supported".into())
        }
        _ => Ok(()),
    })
    .unwrap_err();
    assert!(matches!(err, HubError::Refused { .. }), "{err}");
    let cdn = hub.cdn_requests_for("Bar-Q4_0.gguf");
    assert_eq!(cdn.len(), 1);
    assert_eq!(
        cdn[0].range.as_deref(),
        Some("bytes=0-4194303"),
        "only the first 4 MiB"
    );
    assert!(blobs(&cache, "acme/Bar-GGUF").is_empty());
}
