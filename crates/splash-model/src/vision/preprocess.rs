//! From image bytes to the vision tower's patch rows, as the checkpoint's image processor
//! (transformers' Qwen2-VL processor, `preprocessor_config.json`) makes them: decoded (JPEG,
//! PNG, WebP, GIF's first frame) under limits set before any pixel is allocated, RGB with
//! alpha dropped, resized to a multiple of 32 within the pixel bounds (`smart_resize`),
//! resampled bicubically as Pillow does, normalised, and cut into rows of one 16×16 patch
//! (both temporal frames) in 2×2 merge-block order.

use std::io::Cursor;

use fast_image_resize::images::Image;
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::{ImageFormat, ImageReader, Limits};

/// Why an image cannot be used; the message says what to send instead.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("the image is not a JPEG, PNG, WebP or GIF file")]
    Format,
    #[error("the image cannot be decoded (corrupt or truncated): {0}")]
    Corrupt(String),
    #[error("the image is {width}×{height} pixels, more than the {max} pixels a side or {max_bytes} bytes decoded that splash accepts: send a smaller image")]
    TooLarge {
        width: u32,
        height: u32,
        max: u32,
        max_bytes: u64,
    },
    #[error("the image's aspect ratio is {0:.1}, over 200: crop it")]
    AspectRatio(f64),
    #[error("the image is empty (0 pixels)")]
    Empty,
}

/// What the decoder may allocate: checked from the header, before decoding (images that
/// expand to gigabytes, "decompression bombs", are refused there).
#[derive(Clone, Copy, Debug)]
pub struct DecodeLimits {
    /// Largest width or height.
    pub max_side: u32,
    /// Largest decoded size in bytes.
    pub max_bytes: u64,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self {
            max_side: 16_384,
            max_bytes: 256 << 20,
        }
    }
}

/// The image processor's settings (`preprocessor_config.json`).
#[derive(Clone, Debug, PartialEq)]
pub struct ImageProcessorConfig {
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub merge_size: usize,
    /// Bounds on the resized image's pixels (`size.shortest_edge` / `size.longest_edge`, or
    /// `min_pixels` / `max_pixels`).
    pub min_pixels: u64,
    pub max_pixels: u64,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl Default for ImageProcessorConfig {
    /// Qwen3.5's: patch 16, temporal patch 2, merge 2, 65,536 to 16,777,216 pixels,
    /// mean = std = 0.5.
    fn default() -> Self {
        Self {
            patch_size: 16,
            temporal_patch_size: 2,
            merge_size: 2,
            min_pixels: 65_536,
            max_pixels: 16_777_216,
            mean: [0.5; 3],
            std: [0.5; 3],
        }
    }
}

impl ImageProcessorConfig {
    /// Reads `preprocessor_config.json`; fields it leaves out keep Qwen3.5's values.
    pub fn from_json(v: &serde_json::Value) -> Result<Self, String> {
        let mut c = Self::default();
        let uint = |key: &str| v.get(key).and_then(serde_json::Value::as_u64);
        let size = |key: &str| v.pointer(&format!("/size/{key}")).and_then(|x| x.as_u64());
        let triple = |key: &str| -> Result<Option<[f32; 3]>, String> {
            match v.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => {
                    let vals: Option<Vec<f32>> = x
                        .as_array()
                        .map(|a| a.iter().map(|n| n.as_f64().map(|f| f as f32)).collect())
                        .unwrap_or(None);
                    match vals.as_deref() {
                        Some(&[a, b, c]) => Ok(Some([a, b, c])),
                        _ => Err(format!("`{key}` must be three numbers")),
                    }
                }
            }
        };
        c.patch_size = uint("patch_size").map_or(c.patch_size, |x| x as usize);
        c.temporal_patch_size =
            uint("temporal_patch_size").map_or(c.temporal_patch_size, |x| x as usize);
        c.merge_size = uint("merge_size").map_or(c.merge_size, |x| x as usize);
        c.min_pixels = size("shortest_edge")
            .or(uint("min_pixels"))
            .unwrap_or(c.min_pixels);
        c.max_pixels = size("longest_edge")
            .or(uint("max_pixels"))
            .unwrap_or(c.max_pixels);
        c.mean = triple("image_mean")?.unwrap_or(c.mean);
        c.std = triple("image_std")?.unwrap_or(c.std);
        if c.patch_size == 0 || c.temporal_patch_size == 0 || c.merge_size == 0 {
            return Err("patch_size, temporal_patch_size and merge_size must be positive".into());
        }
        if c.min_pixels > c.max_pixels {
            return Err(format!(
                "the pixel bounds are reversed: {} > {}",
                c.min_pixels, c.max_pixels
            ));
        }
        if c.std.contains(&0.0) {
            return Err("`image_std` must not hold a 0".into());
        }
        Ok(c)
    }

    /// The side every resized image is a multiple of: a merged 2×2 block of patches.
    pub fn factor(&self) -> usize {
        self.patch_size * self.merge_size
    }

    /// Values in one patch row: channels × temporal frames × patch × patch.
    pub fn row_len(&self) -> usize {
        3 * self.temporal_patch_size * self.patch_size * self.patch_size
    }
}

/// An image ready for the tower.
#[derive(Clone, Debug)]
pub struct PreparedImage {
    /// Patches down and across (the resized image is `grid.0 × patch` by `grid.1 × patch`).
    pub grid: (usize, usize),
    /// `grid.0 · grid.1` rows of [`ImageProcessorConfig::row_len`] values, in merge-block
    /// order.
    pub rows: Vec<f32>,
}

impl PreparedImage {
    /// How many `<|image_pad|>` tokens the image takes: one per merged block.
    pub fn tokens(&self, config: &ImageProcessorConfig) -> usize {
        self.grid.0 * self.grid.1 / (config.merge_size * config.merge_size)
    }
}

/// The resized height and width: each rounded to a multiple of `factor` (half to even, as
/// Python's `round`), then scaled to within `min..=max` pixels keeping the aspect ratio, in
/// transformers' order of f64 operations. An aspect ratio over 200 is refused.
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min: u64,
    max: u64,
) -> Result<(usize, usize), ImageError> {
    if height == 0 || width == 0 {
        return Err(ImageError::Empty);
    }
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let ratio = h.max(w) / h.min(w);
    if ratio > 200.0 {
        return Err(ImageError::AspectRatio(ratio));
    }
    let mut hb = (h / f).round_ties_even() * f;
    let mut wb = (w / f).round_ties_even() * f;
    if hb * wb > max as f64 {
        let beta = (h * w / max as f64).sqrt();
        hb = f.max((h / beta / f).floor() * f);
        wb = f.max((w / beta / f).floor() * f);
    } else if hb * wb < min as f64 {
        let beta = (min as f64 / (h * w)).sqrt();
        hb = (h * beta / f).ceil() * f;
        wb = (w * beta / f).ceil() * f;
    }
    Ok((hb as usize, wb as usize))
}

/// An RGB image, 3 bytes a pixel, row by row.
#[derive(Clone, Debug)]
pub struct RgbImage {
    pub width: usize,
    pub height: usize,
    pub pixels: Vec<u8>,
}

/// Decodes `bytes` (the format is read from them) to RGB: alpha dropped, not composited;
/// grey expanded; 16-bit samples scaled to 8; a GIF's first frame.
fn decode(bytes: &[u8], limits: DecodeLimits) -> Result<RgbImage, ImageError> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError::Corrupt(e.to_string()))?;
    match reader.format() {
        Some(ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::WebP | ImageFormat::Gif) => {}
        _ => return Err(ImageError::Format),
    }
    let (width, height) = reader
        .into_dimensions()
        .map_err(|e| ImageError::Corrupt(e.to_string()))?;
    let too_large = || ImageError::TooLarge {
        width,
        height,
        max: limits.max_side,
        max_bytes: limits.max_bytes,
    };
    // 8 bytes a pixel covers every layout the decoders produce (RGBA, 16 bits a sample).
    if width > limits.max_side
        || height > limits.max_side
        || width as u64 * height as u64 * 8 > limits.max_bytes
    {
        return Err(too_large());
    }
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError::Corrupt(e.to_string()))?;
    let mut l = Limits::default();
    l.max_image_width = Some(limits.max_side);
    l.max_image_height = Some(limits.max_side);
    l.max_alloc = Some(limits.max_bytes);
    reader.limits(l);
    let image = reader.decode().map_err(|e| match e {
        image::ImageError::Limits(_) => too_large(),
        e => ImageError::Corrupt(e.to_string()),
    })?;
    if image.width() == 0 || image.height() == 0 {
        return Err(ImageError::Empty);
    }
    let rgb = image.into_rgb8();
    Ok(RgbImage {
        width: rgb.width() as usize,
        height: rgb.height() as usize,
        pixels: rgb.into_raw(),
    })
}

/// Bicubic resampling (a = −0.5, the support widened when shrinking) of u8 RGB as Pillow
/// does it: one pass across, then one down, each rounding to u8.
fn resize(src: RgbImage, width: usize, height: usize) -> Result<RgbImage, ImageError> {
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::CatmullRom));
    let mut resizer = Resizer::new();
    let mut pass = |img: RgbImage, w: usize, h: usize| -> Result<RgbImage, ImageError> {
        if img.width == w && img.height == h {
            return Ok(img);
        }
        let fail = |e: String| ImageError::Corrupt(format!("resampling failed: {e}"));
        let from = Image::from_vec_u8(
            img.width as u32,
            img.height as u32,
            img.pixels,
            PixelType::U8x3,
        )
        .map_err(|e| fail(e.to_string()))?;
        let mut to = Image::new(w as u32, h as u32, PixelType::U8x3);
        resizer
            .resize(&from, &mut to, &options)
            .map_err(|e| fail(e.to_string()))?;
        Ok(RgbImage {
            width: w,
            height: h,
            pixels: to.into_vec(),
        })
    };
    let rows = src.height;
    let across = pass(src, width, rows)?;
    pass(across, width, height)
}

/// The patch rows of a resized image: rows in (block row, block column, row in block, column
/// in block) order, each row's values in (channel, frame, y, x) order, the image copied to
/// every temporal frame, each value `(u8 / 255 − mean) / std`.
fn patch_rows(img: &RgbImage, c: &ImageProcessorConfig) -> Vec<f32> {
    let (p, m, t) = (c.patch_size, c.merge_size, c.temporal_patch_size);
    let (gh, gw) = (img.height / p, img.width / p);
    let scale: Vec<[f32; 256]> = (0..3)
        .map(|ch| std::array::from_fn(|v| (v as f32 / 255.0 - c.mean[ch]) / c.std[ch]))
        .collect();
    let mut rows = Vec::with_capacity(gh * gw * c.row_len());
    for bh in 0..gh / m {
        for bw in 0..gw / m {
            for ih in 0..m {
                for iw in 0..m {
                    let (py, px) = ((bh * m + ih) * p, (bw * m + iw) * p);
                    for (ch, table) in scale.iter().enumerate() {
                        for _ in 0..t {
                            for y in py..py + p {
                                let line = &img.pixels[(y * img.width + px) * 3..];
                                rows.extend((0..p).map(|x| table[line[x * 3 + ch] as usize]));
                            }
                        }
                    }
                }
            }
        }
    }
    rows
}

/// Decodes, resizes and cuts `bytes` into the tower's patch rows, under `limits` and with
/// the resized image's pixels within `config`'s bounds.
pub fn prepare(
    bytes: &[u8],
    config: &ImageProcessorConfig,
    limits: DecodeLimits,
) -> Result<PreparedImage, ImageError> {
    prepare_rgb(decode(bytes, limits)?, config)
}

/// Resizes and cuts an RGB image (a rendered PDF page) into the tower's patch rows, with the
/// resized image's pixels within `config`'s bounds.
pub fn prepare_rgb(
    img: RgbImage,
    config: &ImageProcessorConfig,
) -> Result<PreparedImage, ImageError> {
    if img.width == 0 || img.height == 0 || img.pixels.len() != img.width * img.height * 3 {
        return Err(ImageError::Empty);
    }
    let (h, w) = smart_resize(
        img.height,
        img.width,
        config.factor(),
        config.min_pixels,
        config.max_pixels,
    )?;
    let img = resize(img, w, h)?;
    let rows = patch_rows(&img, config);
    Ok(PreparedImage {
        grid: (h / config.patch_size, w / config.patch_size),
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/vision")
            .join(name)
    }

    fn expected() -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(fixture("expected.json")).unwrap()).unwrap()
    }

    #[test]
    fn smart_resize_matches_transformers() {
        let e = expected();
        for case in e["smart_resize"].as_array().unwrap() {
            let n = |k: &str| case[k].as_u64().unwrap();
            let got = smart_resize(n("h") as usize, n("w") as usize, 32, n("min"), n("max"));
            match case["out"].as_array() {
                Some(out) => {
                    let want = (
                        out[0].as_u64().unwrap() as usize,
                        out[1].as_u64().unwrap() as usize,
                    );
                    assert_eq!(got.unwrap(), want, "{case}");
                }
                None => assert!(matches!(got, Err(ImageError::AspectRatio(_))), "{case}"),
            }
        }
    }

    /// Every format decodes to what Pillow decodes (JPEG and lossy WebP within a few levels:
    /// the decoders round their transforms differently), and the patch rows are what
    /// transformers' processor makes, within one level on a few values (resampling rounds
    /// in two passes there too).
    #[test]
    fn images_match_the_transformers_processor() {
        let e = expected();
        let c = ImageProcessorConfig::from_json(&e["config"]).unwrap();
        assert_eq!((c.min_pixels, c.max_pixels), (1024, 4096));
        for (name, want) in e["images"].as_object().unwrap() {
            let bytes = std::fs::read(fixture(name)).unwrap();
            let img = decode(&bytes, DecodeLimits::default()).unwrap();
            let size = [
                want["size"][0].as_u64().unwrap() as usize,
                want["size"][1].as_u64().unwrap() as usize,
            ];
            assert_eq!([img.height, img.width], size, "{name}");
            let pil = std::fs::read(fixture(&format!("{name}.decoded.rgb"))).unwrap();
            let worst = img
                .pixels
                .iter()
                .zip(&pil)
                .map(|(a, b)| a.abs_diff(*b))
                .max()
                .unwrap();
            let lossy = name.ends_with(".jpg") || name == "lossy.webp";
            assert!(
                worst <= if lossy { 8 } else { 0 },
                "{name}: decoded pixels differ by {worst}"
            );
            // From Pillow's pixels, so that only resampling and layout are compared.
            let from_pil = RgbImage {
                width: img.width,
                height: img.height,
                pixels: pil,
            };
            let (h, w) = smart_resize(
                img.height,
                img.width,
                c.factor(),
                c.min_pixels,
                c.max_pixels,
            )
            .unwrap();
            let rows = patch_rows(&resize(from_pil, w, h).unwrap(), &c);
            let grid = (
                want["grid"][0].as_u64().unwrap() as usize,
                want["grid"][1].as_u64().unwrap() as usize,
            );
            assert_eq!((h / 16, w / 16), grid, "{name}");
            let levels = std::fs::read(fixture(&format!("{name}.patches.u8"))).unwrap();
            assert_eq!(rows.len(), levels.len(), "{name}");
            let mut off = 0;
            for (got, level) in rows.iter().zip(&levels) {
                let want = *level as f32 / 127.5 - 1.0;
                let d = (got - want).abs();
                assert!(d < 1.5 / 127.5, "{name}: {got} against {want}");
                off += (d > 1e-5) as usize;
            }
            assert!(
                off * 100 <= levels.len(),
                "{name}: {off} of {} values off by a level",
                levels.len()
            );
            let prepared = prepare(&bytes, &c, DecodeLimits::default()).unwrap();
            assert_eq!(prepared.grid, grid);
            assert_eq!(prepared.tokens(&c), grid.0 * grid.1 / 4);
        }
    }

    #[test]
    fn bad_images_are_refused_with_the_reason() {
        let c = ImageProcessorConfig::default();
        let png = std::fs::read(fixture("rgb.png")).unwrap();
        let err = |bytes: &[u8], limits| prepare(bytes, &c, limits).unwrap_err();
        assert!(matches!(
            err(b"hello, not an image", DecodeLimits::default()),
            ImageError::Format
        ));
        assert!(matches!(
            err(&png[..png.len() / 2], DecodeLimits::default()),
            ImageError::Corrupt(_)
        ));
        let small = DecodeLimits {
            max_side: 64,
            max_bytes: 1 << 20,
        };
        assert!(matches!(
            err(&png, small),
            ImageError::TooLarge {
                width: 70,
                height: 45,
                ..
            }
        ));
        // A PNG header claiming 60,000 × 60,000 pixels is refused before any decoding.
        let mut bomb = png.clone();
        bomb[16..20].copy_from_slice(&60_000u32.to_be_bytes());
        bomb[20..24].copy_from_slice(&60_000u32.to_be_bytes());
        let crc = crc32(&bomb[12..29]);
        bomb[29..33].copy_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            err(&bomb, DecodeLimits::default()),
            ImageError::TooLarge { .. }
        ));
        assert!(matches!(
            smart_resize(1, 250, 32, 1, 100),
            Err(ImageError::AspectRatio(_))
        ));
    }

    /// PNG's chunk checksum (CRC-32, reflected, polynomial 0xEDB88320).
    fn crc32(bytes: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in bytes {
            c ^= b as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0xEDB8_8320
                } else {
                    c >> 1
                };
            }
        }
        !c
    }

    #[test]
    fn a_processor_config_is_read_and_checked() {
        let v = serde_json::json!({"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
            "size": {"shortest_edge": 65536, "longest_edge": 16777216},
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]});
        assert_eq!(
            ImageProcessorConfig::from_json(&v).unwrap(),
            ImageProcessorConfig::default()
        );
        let old = serde_json::json!({"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14});
        let c = ImageProcessorConfig::from_json(&old).unwrap();
        assert_eq!(
            (c.min_pixels, c.max_pixels, c.factor()),
            (3136, 12845056, 28)
        );
        assert!(ImageProcessorConfig::from_json(
            &serde_json::json!({"image_std": [0.5, 0.0, 0.5]})
        )
        .is_err());
        assert!(
            ImageProcessorConfig::from_json(&serde_json::json!({"image_mean": [0.5]})).is_err()
        );
    }
}
