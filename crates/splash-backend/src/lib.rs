//! Host buffers, weight views and the numerical ops the splash models are built from.
//!
//! The CPU ops in [`cpu`] are the definition of every op: the CUDA backend (feature `cuda`,
//! later) is tested against them. Weights stay in their stored dtype ([`Weight`]); activations
//! are `f32` row-major slices. Legend used in op docs: `T` tokens, `K` input width, `N` output
//! width, `H` heads, `D` head dim.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod ggml;
pub mod profile;
pub mod timeline;
mod weight;

pub use weight::{DType, HostBytes, Weight, WeightError};
