//! Runs the end-to-end API tests in `tests/sdk/` (pytest with the real `openai` SDK) against
//! this build of `splash`. They need the Python environment that `scripts/test` creates in
//! `.venv` (or a Python with `tests/sdk/requirements.txt` installed, named by
//! `SPLASH_TEST_PYTHON`).

use std::path::Path;
use std::process::Command;

#[test]
fn openai_sdk_end_to_end() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var("SPLASH_TEST_PYTHON")
        .map(Into::into)
        .unwrap_or_else(|_| root.join(".venv/bin/python"));
    assert!(
        python.exists(),
        "{} not found: run `scripts/test` (it creates .venv with tests/sdk/requirements.txt), or set SPLASH_TEST_PYTHON",
        python.display()
    );
    let status = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/sdk"])
        .current_dir(&root)
        .env("SPLASH_BIN", env!("CARGO_BIN_EXE_splash"))
        .env("PYTHONUNBUFFERED", "1")
        .status()
        .expect("run pytest");
    assert!(
        status.success(),
        "the SDK tests in tests/sdk failed (output above)"
    );
}
