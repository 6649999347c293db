//! Ids of responses, messages and tool calls.

/// A fresh id: `prefix` (with its separator, as each API writes them: `chatcmpl-`, `msg_`,
/// `resp_`, `call_`) followed by 16 random hex digits.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{:016x}", splash_engine::random_seed())
}
