//! Image input of the Qwen3.5 / Qwen3.6 vision tower.

mod preprocess;
mod tower;

pub use preprocess::{
    prepare, smart_resize, DecodeLimits, ImageError, ImageProcessorConfig, PreparedImage,
};
pub use tower::{VisionConfig, VisionTower};
