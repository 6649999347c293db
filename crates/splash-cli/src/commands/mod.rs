//! One module per subcommand.

pub mod bench;
pub mod generate;
pub mod launch;
pub mod list;
pub mod perplexity;
pub mod pull;
pub mod serve;
pub mod serve_multi;
