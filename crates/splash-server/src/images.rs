//! Images in prompts: the parts the APIs send (base64 images and PDFs), the vision tower that
//! turns them into embedding rows (cached by content: agents resend every image each turn),
//! and the prompt's tokens with each image's placeholder run in place.
//!
//! While a request's messages are converted, each image or PDF becomes a marker in the text
//! given to the chat template (a random per-request nonce, so no text a user types can stand for an
//! image); the rendered prompt is then tokenized piece by piece between the markers and each
//! marker becomes `<|vision_start|>`, one `<|image_pad|>` per merged patch, `<|vision_end|>`,
//! what Qwen3.5's template writes for an image; a PDF's marker becomes each page's text and
//! image in turn (`documents`). A `<|image_pad|>` typed as text stays a plain token.

use std::path::Path;
use std::sync::{Arc, Mutex};

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use sha2::{Digest, Sha256};
use splash_engine::PromptImage;
use splash_model::vision::{
    prepare, prepare_rgb, DecodeLimits, ImageProcessorConfig, PreparedImage, VisionTower,
};
use splash_model::{ImageSpan, Model};

use crate::content_cache::ContentCache;
use crate::documents::{DocumentCache, Page, PdfLimits, ReadError};
use crate::error::ApiError;
use crate::prompt::{tokenize, Tokens};
use crate::state::AppState;

/// Largest image or PDF file accepted, decoded from base64.
pub const MAX_IMAGE_BYTES: usize = 32 << 20;
/// Most images in one request, PDF pages included.
pub const MAX_IMAGES: usize = 64;
/// Most characters of PDF text in one request.
pub const MAX_PDF_TEXT_CHARS: usize = 1_000_000;
/// Default and floor of `--max-image-pixels`.
pub const DEFAULT_MAX_IMAGE_PIXELS: u64 = 4_194_304;
pub const MIN_MAX_IMAGE_PIXELS: u64 = 65_536;
/// Standard base64, with or without its `=` padding.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
/// Embedding bytes the cache of encoded images keeps.
const CACHE_BYTES: usize = 512 << 20;

/// The model's vision tower and image processor.
pub struct Vision {
    tower: VisionTower,
    processor: ImageProcessorConfig,
    cache: Mutex<ContentCache<Arc<Encoded>>>,
    documents: DocumentCache,
}

/// Memory the vision tower takes in RAM and on the GPU, in bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct VisionMemory {
    pub ram: u64,
    pub gpu: u64,
}

/// An image as the text model takes it.
pub struct Encoded {
    /// Merged patches down and across: the image takes `grid.0 · grid.1` placeholder tokens.
    pub grid: (usize, usize),
    /// The tower's rows, `[tokens, hidden]`.
    pub embeddings: Arc<[f32]>,
    /// SHA-256 of the image file.
    pub digest: [u8; 32],
}

impl Vision {
    /// The tower of the checkpoint in `dir` and its `preprocessor_config.json` (Qwen3.5's
    /// settings when absent), images capped at `max_pixels`; `None` for a text-only checkpoint.
    pub fn load(dir: &Path, max_pixels: u64) -> Result<Option<Self>, String> {
        let Some(tower) = VisionTower::load(dir).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let path = dir.join("preprocessor_config.json");
        let processor = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| e.to_string())
                .and_then(|v| ImageProcessorConfig::from_json(&v))
                .map_err(|e| format!("{}: {e}", path.display()))?,
            Err(_) => ImageProcessorConfig::default(),
        };
        if processor.row_len() != tower.config().patch_len() {
            return Err(format!(
                "{}: patch rows of {} values, but the vision tower takes {}",
                path.display(),
                processor.row_len(),
                tower.config().patch_len()
            ));
        }
        Ok(Some(Self::new(tower, processor, max_pixels)))
    }

    /// The tower of a llama.cpp `mmproj` GGUF file, with Qwen3.5's image processor, images
    /// capped at `max_pixels`.
    pub fn load_gguf(path: &Path, max_pixels: u64) -> Result<Self, String> {
        let tower = VisionTower::load_gguf(path).map_err(|e| e.to_string())?;
        let processor = ImageProcessorConfig {
            patch_size: tower.config().patch_size,
            merge_size: tower.config().spatial_merge_size,
            ..ImageProcessorConfig::default()
        };
        Ok(Self::new(tower, processor, max_pixels))
    }

    /// `tower` with `processor`, images capped at `max_pixels`.
    fn new(tower: VisionTower, mut processor: ImageProcessorConfig, max_pixels: u64) -> Self {
        processor.max_pixels = processor.max_pixels.min(max_pixels);
        processor.min_pixels = processor.min_pixels.min(processor.max_pixels);
        Self {
            tower,
            processor,
            cache: Mutex::new(ContentCache::new(CACHE_BYTES, usize::MAX)),
            documents: DocumentCache::default(),
        }
    }

    /// Runs the tower where `text` runs (its GPU, or the CPU); a tower that cannot go to
    /// the GPU stays on the CPU, with a warning.
    pub fn place_like(&mut self, text: &splash_model::Qwen35) {
        if let Err(e) = self.tower.place_like(text) {
            tracing::warn!("the vision tower runs on the CPU: {e}");
        }
    }

    /// Where the tower's layers run: "cpu" or the GPU's name.
    pub fn device(&self) -> String {
        self.tower.device()
    }

    /// Memory the tower takes: RAM (its weights, and on the CPU the largest image's
    /// activations), and GPU memory beyond its weights (the largest image's activations, when
    /// it runs there).
    pub fn memory(&self) -> VisionMemory {
        let patches = self.processor.max_pixels as usize
            / (self.processor.patch_size * self.processor.patch_size);
        let activations = self.tower.activation_bytes(patches);
        let weights = self.tower.memory_bytes();
        match self.tower.device().as_str() {
            "cpu" => VisionMemory {
                ram: weights + activations,
                gpu: 0,
            },
            _ => VisionMemory {
                ram: weights,
                gpu: activations,
            },
        }
    }

    /// The image in `bytes` through the processor and the tower (blocking: seconds for a large
    /// image on the CPU), or from the cache.
    pub fn encode(&self, bytes: &[u8]) -> Result<Arc<Encoded>, String> {
        self.image(bytes, true)
    }

    /// The image in `bytes` decoded and resized only, for its token count: the tower does
    /// not run (its rows are empty), unless it ran already (then the cached image).
    pub fn measure(&self, bytes: &[u8]) -> Result<Arc<Encoded>, String> {
        self.image(bytes, false)
    }

    /// The cached image of `bytes`, else the processor's, through the tower (and cached) when
    /// `tower`.
    fn image(&self, bytes: &[u8], tower: bool) -> Result<Arc<Encoded>, String> {
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        self.cached_or(digest, tower, || {
            prepare(bytes, &self.processor, DecodeLimits::default())
        })
    }

    /// A rendered PDF page as [`Self::encode`] (`tower`) or [`Self::measure`] makes it.
    pub fn page(&self, page: &Page, tower: bool) -> Result<Arc<Encoded>, String> {
        self.cached_or(page.digest, tower, || {
            prepare_rgb((*page.image).clone(), &self.processor)
        })
    }

    /// The pages of the PDF in `bytes` (rendered once, then cached by content).
    pub fn pdf(&self, bytes: &[u8], limits: PdfLimits) -> Result<Arc<[Page]>, ReadError> {
        self.documents.read(bytes, limits)
    }

    /// The cached image of `digest`, else `prepared()` through the tower (and cached) when
    /// `tower`.
    fn cached_or(
        &self,
        digest: [u8; 32],
        tower: bool,
        prepared: impl FnOnce() -> Result<PreparedImage, splash_model::vision::ImageError>,
    ) -> Result<Arc<Encoded>, String> {
        if let Some(hit) = self.cache.lock().unwrap().get(&digest) {
            return Ok(hit);
        }
        let image = prepared().map_err(|e| e.to_string())?;
        let m = self.processor.merge_size;
        let embeddings = match tower {
            true => self.tower.encode(&image).map_err(|e| e.to_string())?,
            false => Vec::new(),
        };
        let encoded = Arc::new(Encoded {
            grid: (image.grid.0 / m, image.grid.1 / m),
            embeddings: embeddings.into(),
            digest,
        });
        if tower {
            let size = encoded.embeddings.len() * 4;
            self.cache
                .lock()
                .unwrap()
                .insert(digest, encoded.clone(), size);
        }
        Ok(encoded)
    }
}

/// The images and PDFs of one request, in the order their markers appear in the prompt text.
pub struct PromptImages {
    nonce: u64,
    /// Each part's JSON path (for errors) and file.
    parts: Vec<(String, File)>,
}

/// A file a request sent.
enum File {
    Image(Vec<u8>),
    Pdf(Vec<u8>),
}

impl Default for PromptImages {
    fn default() -> Self {
        Self {
            nonce: splash_engine::random_seed(),
            parts: Vec::new(),
        }
    }
}

impl PromptImages {
    /// Takes the base64 image data of the part at `at` (a JSON path for errors), and returns
    /// the marker to put in the text where it goes.
    pub fn push_base64(&mut self, at: &str, data: &str) -> Result<String, ApiError> {
        let bytes = self.decode(at, data, "image")?;
        Ok(self.push(at, File::Image(bytes)))
    }

    /// Takes an image URL: `data:<type>;base64,<data>`; other URLs are refused.
    pub fn push_url(&mut self, at: &str, url: &str) -> Result<String, ApiError> {
        match url.strip_prefix("data:").and_then(|r| r.split_once(',')) {
            Some((meta, data)) if meta.ends_with(";base64") => self.push_base64(at, data),
            Some(_) => Err(ApiError::invalid(
                at,
                "the data URL is not base64: send `data:image/png;base64,...`",
            )),
            None => Err(ApiError::invalid(
                at,
                "splash does not fetch image URLs: send the image inline as a base64 data URL (`data:image/png;base64,...`)",
            )),
        }
    }

    /// Takes a PDF sent as base64 or as a `data:application/pdf;base64,` URL, and returns the
    /// marker to put where its pages go.
    pub fn push_pdf(&mut self, at: &str, data: &str) -> Result<String, ApiError> {
        let data = match data.strip_prefix("data:") {
            None => data,
            Some(url) => match url.split_once(',') {
                Some(("application/pdf;base64", data)) => data,
                _ => {
                    return Err(ApiError::invalid(
                        at,
                        "only PDF files are read: send `data:application/pdf;base64,...`",
                    ))
                }
            },
        };
        let bytes = self.decode(at, data, "PDF")?;
        Ok(self.push(at, File::Pdf(bytes)))
    }

    /// The bytes of base64 `data` (a `what` file) within the size limit.
    fn decode(&self, at: &str, data: &str, what: &str) -> Result<Vec<u8>, ApiError> {
        if self.parts.len() == MAX_IMAGES {
            return Err(too_many(at));
        }
        let too_large = || {
            ApiError::invalid(
                at,
                format!(
                    "the {what} is larger than {} MiB: send a smaller file",
                    MAX_IMAGE_BYTES >> 20
                ),
            )
        };
        // Base64 is 4 characters for 3 bytes: refuse before decoding what cannot fit.
        if data.len() / 4 * 3 > MAX_IMAGE_BYTES + 3 {
            return Err(too_large());
        }
        let compact: String = data.split_ascii_whitespace().collect();
        let bytes = BASE64.decode(compact.as_bytes()).map_err(|e| {
            ApiError::invalid(
                at,
                format!("the {what} data is not valid base64 ({e}): send the file's bytes base64-encoded"),
            )
        })?;
        if bytes.len() > MAX_IMAGE_BYTES {
            return Err(too_large());
        }
        Ok(bytes)
    }

    fn push(&mut self, at: &str, file: File) -> String {
        let marker = self.marker(self.parts.len());
        self.parts.push((at.to_string(), file));
        marker
    }

    /// True when the request holds no image or PDF.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    fn marker(&self, k: usize) -> String {
        format!("\u{E000}splash-image-{:016x}-{k}\u{E001}", self.nonce)
    }
}

fn too_many(at: &str) -> ApiError {
    ApiError::invalid(
        at,
        format!("a request may hold at most {MAX_IMAGES} images and PDF pages: send fewer"),
    )
}

/// What a marker stands for in the prompt, in order.
enum Piece {
    Text(String),
    Image(Arc<Encoded>),
}

/// The pieces of each part of `images`: an image, or a PDF's pages (text, then image), each
/// image through the tower when `tower`, else only measured. Blocking.
fn pieces(
    vision: &Vision,
    images: &PromptImages,
    tower: bool,
) -> Result<Vec<Vec<Piece>>, ApiError> {
    let mut count = 0;
    let mut chars = 0;
    let mut out = Vec::with_capacity(images.parts.len());
    for (at, file) in &images.parts {
        let invalid = |e: String| ApiError::invalid(at, e);
        let mut pieces = Vec::new();
        match file {
            File::Image(bytes) => {
                count += 1;
                let image = match tower {
                    true => vision.encode(bytes),
                    false => vision.measure(bytes),
                };
                pieces.push(Piece::Image(image.map_err(invalid)?));
            }
            File::Pdf(bytes) => {
                // The other parts still to come take one image each at least.
                let later = images.parts.len() - out.len() - 1;
                let limits = PdfLimits {
                    pages: MAX_IMAGES.saturating_sub(count + later),
                    text_chars: MAX_PDF_TEXT_CHARS - chars,
                };
                let pages = vision.pdf(bytes, limits).map_err(|e| match e {
                    ReadError::File(e) => invalid(e),
                    ReadError::Busy(e) => ApiError::overloaded(e),
                })?;
                for page in pages.iter() {
                    count += 1;
                    chars += page.text.chars().count();
                    pieces.push(Piece::Text(page.text.clone()));
                    pieces.push(Piece::Image(vision.page(page, tower).map_err(|e| {
                        invalid(format!("{} {e}", page.text.lines().next().unwrap_or("")))
                    })?));
                }
            }
        }
        if count > MAX_IMAGES {
            return Err(too_many(at));
        }
        out.push(pieces);
    }
    Ok(out)
}

/// `text` with each marker shown as what the template writes (`/apply-template`): an image's
/// `<|vision_start|><|image_pad|><|vision_end|>`, a PDF's pages' text and images. The
/// images are decoded but not encoded.
pub async fn show(s: &AppState, text: String, images: PromptImages) -> Result<String, ApiError> {
    if images.is_empty() {
        return Ok(text);
    }
    let vision = vision(s, &images)?;
    let markers: Vec<String> = (0..images.parts.len()).map(|k| images.marker(k)).collect();
    let pieces = tokio::task::spawn_blocking(move || pieces(&vision, &images, false))
        .await
        .map_err(|e| ApiError::engine(format!("reading the images failed: {e}")))??;
    let mut out = text;
    for (marker, pieces) in markers.iter().zip(pieces) {
        let shown: String = pieces
            .iter()
            .map(|p| match p {
                Piece::Text(t) => t.as_str(),
                Piece::Image(_) => "<|vision_start|><|image_pad|><|vision_end|>",
            })
            .collect();
        out = out.replace(marker, &shown);
    }
    Ok(out)
}

/// The server's vision tower, or the 400 for a server without one.
fn vision(s: &AppState, images: &PromptImages) -> Result<Arc<Vision>, ApiError> {
    s.vision.clone().ok_or_else(|| {
        ApiError::invalid(&images.parts[0].0, "this model reads text only (it has no vision tower, or the server runs with --language-only): send text")
    })
}

/// The tokens of a rendered prompt holding the markers of `images`, with each image's
/// placeholder run, and the images for the engine. Over the context limit is a 400
/// `context_length_exceeded`.
pub async fn prompt_with_images(
    s: &AppState,
    text: String,
    images: PromptImages,
) -> Result<(Vec<u32>, Vec<PromptImage>), ApiError> {
    assemble(s, text, images, true).await
}

/// The tokens of [`prompt_with_images`] without running the vision tower (`/tokenize`,
/// `count_tokens`: an image's token count needs only its decoded size).
pub async fn prompt_token_ids(
    s: &AppState,
    text: String,
    images: PromptImages,
) -> Result<Vec<u32>, ApiError> {
    Ok(assemble(s, text, images, false).await?.0)
}

/// [`prompt_with_images`], the images through the tower when `tower`, else only measured
/// (their spans then hold no rows and must not reach the engine).
async fn assemble(
    s: &AppState,
    text: String,
    images: PromptImages,
    tower: bool,
) -> Result<(Vec<u32>, Vec<PromptImage>), ApiError> {
    let (model, limit) = (&s.model, s.max_context);
    if images.is_empty() {
        let ids = crate::prompt::prompt_ids(model, limit, text).await?;
        return Ok((ids, Vec::new()));
    }
    let vision = vision(s, &images)?;
    let special = |name: &str| {
        model.tokenizer.token_to_id(name).ok_or_else(|| {
            ApiError::engine(format!("the tokenizer has no {name} token for images"))
        })
    };
    let (start, end) = (special("<|vision_start|>")?, special("<|vision_end|>")?);
    let pad = model
        .config
        .image_token_id
        .ok_or_else(|| ApiError::engine("the model config has no image_token_id"))?;
    let markers: Vec<String> = (0..images.parts.len()).map(|k| images.marker(k)).collect();
    let parts = tokio::task::spawn_blocking(move || pieces(&vision, &images, tower))
        .await
        .map_err(|e| ApiError::engine(format!("encoding the images failed: {e}")))??;

    let mut ids = Vec::new();
    let mut spans = Vec::new();
    let mut rest = text.as_str();
    for (k, pieces) in parts.iter().enumerate() {
        let Some((before, after)) = rest.split_once(markers[k].as_str()) else {
            // The template dropped the message holding it (or reordered images).
            return Err(ApiError::engine(format!(
                "the chat template did not render image {k} where it was sent"
            )));
        };
        append_text(model, limit, &mut ids, before).await?;
        for piece in pieces {
            let image = match piece {
                Piece::Text(t) => {
                    append_text(model, limit, &mut ids, t).await?;
                    continue;
                }
                Piece::Image(image) => image,
            };
            let n = image.grid.0 * image.grid.1;
            ids.push(start);
            let at = ids.len();
            ids.extend(std::iter::repeat_n(pad, n));
            ids.push(end);
            if ids.len() > limit {
                return Err(over(limit));
            }
            spans.push(PromptImage {
                span: ImageSpan {
                    start: at,
                    grid: image.grid,
                    embeddings: image.embeddings.clone(),
                },
                digest: image.digest,
            });
        }
        rest = after;
    }
    append_text(model, limit, &mut ids, rest).await?;
    Ok((ids, spans))
}
/// The 400 for a prompt with images over the context limit of `limit` tokens.
fn over(limit: usize) -> ApiError {
    ApiError::context_length(format!(
        "the prompt has more than {limit} tokens (images included), the context limit (prompt and output together): shorten the prompt or send fewer or smaller images"
    ))
}

/// Appends the tokens of `text` to `ids`, within `limit` tokens in all.
async fn append_text(
    model: &Arc<Model>,
    limit: usize,
    ids: &mut Vec<u32>,
    text: &str,
) -> Result<(), ApiError> {
    if text.is_empty() {
        return Ok(());
    }
    let room = limit.saturating_sub(ids.len());
    match tokenize(model, text.to_string(), room).await? {
        Tokens::Ids(piece) => {
            ids.extend(piece);
            Ok(())
        }
        Tokens::Over(_) => Err(over(limit)),
    }
}
