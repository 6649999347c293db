//! Image input of the Qwen3.5 / Qwen3.6 vision tower.

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
mod preprocess;
mod tower;

pub use preprocess::{
    prepare, prepare_rgb, smart_resize, DecodeLimits, ImageError, ImageProcessorConfig,
    PreparedImage, RgbImage,
};
pub use tower::{VisionConfig, VisionTower};
