//! The CPU backend: the reference definition of every op, multi-threaded with rayon.

mod activation;
mod attention;
mod block_attention;
mod dyn_conv;
mod gdn;
mod kv;
mod matmul;
mod norm;
mod rope;
mod select;

pub use activation::{add_in_place, sigmoid, silu, silu_mul, softmax_in_place, softplus};
pub use attention::attention;
pub use block_attention::BlockAttention;
pub use dyn_conv::grouped_dynamic_conv;
pub use gdn::{causal_conv1d_silu, gdn_chunked, gdn_recurrent, GdnDims, VHeadOrder, GDN_CHUNK};
pub use kv::{KvFormat, KvStore};
pub use matmul::{dot, embedding, matmul, matmul_sums, Sums, ROW_BY_ROW_TOKENS};
pub use norm::{l2_norm_rows, rms_norm, rms_norm_gated};
pub use rope::Rope;
pub use select::{argmax, top_k};
