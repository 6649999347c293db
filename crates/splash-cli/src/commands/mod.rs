//! One module per subcommand.

pub mod bench;
pub mod generate;
pub mod perplexity;
pub mod serve;
