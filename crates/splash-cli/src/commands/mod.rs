//! One module per subcommand.

pub mod bench;
pub mod generate;
pub mod launch;
pub mod list;
pub mod perplexity;
pub mod pull;
pub mod serve;
pub mod serve_multi;

/// The async runtime the HTTP servers run on.
fn http_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("splash-http")
        .build()
        .context("starting the async runtime")
}
