//! The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), as
//! Claude Code speaks it: system blocks, text / thinking / tool_use / tool_result content,
//! tools and tool_choice, extended thinking, and the streaming event sequence.
//!
//! Prefix stability: Claude Code puts a per-request billing line
//! (`x-anthropic-billing-header: cch=...;`) into its first system block. Such lines are
//! removed before templating, so consecutive turns render to the same prompt prefix.

mod convert;
mod messages;

pub use messages::{count_tokens, handle};
