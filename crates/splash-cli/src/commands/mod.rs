//! One module per subcommand.

pub mod bench;
pub mod generate;
pub mod list;
pub mod perplexity;
pub mod pull;
pub mod serve;
