//! The OpenAI Responses API (`/v1/responses`), which Codex speaks: input items, function
//! tools, reasoning effort, `text.format`, `store` with `previous_response_id`, and the
//! streaming event types.

mod convert;
mod handler;
mod store;

pub use handler::{delete, get, handle};
pub use store::ResponseStore;
