//! PDFs in prompts. Each page becomes `PDF page N:` and the page's text, then the page
//! rendered to an image of at most 1 Mpx, which the vision tower reads like any other image.
//! Pages are rendered by hayro (pure Rust); the text is assembled in reading order from the
//! glyphs hayro interprets, one line per baseline.

use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use hayro::hayro_interpret::font::GlyphRun;
use hayro::hayro_interpret::hayro_syntax::{DecryptionError, LoadPdfError, Pdf};
use hayro::hayro_interpret::util::TransformExt;
use hayro::hayro_interpret::{
    interpret_page, BlendMode, ClipPath, Context, Device, DrawMode, DrawProps, Image,
    ImageDrawProps, InterpreterCache, InterpreterSettings, SoftMask,
};
use hayro::kurbo::{BezPath, Rect};
use hayro::vello_cpu::color::palette::css::WHITE;
use hayro::{PixmapSettings, RenderCache, RenderSettings};
use sha2::{Digest, Sha256};
use splash_model::vision::RgbImage;

use crate::content_cache::ContentCache;

/// Largest rendered page, in pixels.
const MAX_PAGE_PIXELS: f64 = 1_048_576.0;
/// Largest ratio of a page's long side to its short side.
const MAX_ASPECT: f64 = 200.0;
/// Rendered PDFs the cache keeps, and the pixel and text bytes it may hold.
const CACHE_ENTRIES: usize = 16;
const CACHE_BYTES: usize = 64 << 20;
/// Stack of the thread a PDF is read on: deeply nested content recurses in the interpreter.
const READER_STACK: usize = 64 << 20;
/// Longest a PDF may take to read, waiting for a reader included: hayro cannot be stopped
/// inside a page, so a file that takes longer is answered with an error and its reader
/// stops at the next page.
const READ_TIME: Duration = Duration::from_secs(60);

/// One page of a PDF as the prompt takes it.
pub struct Page {
    /// `PDF page N:\n`, the page's text, `\n`.
    pub text: String,
    /// The page rendered on white, at most [`MAX_PAGE_PIXELS`].
    pub image: Arc<RgbImage>,
    /// Identifies the page's image (the file's SHA-256 and the page number): the key of the
    /// encoded-image and prefix caches.
    pub digest: [u8; 32],
}

/// What one PDF may hold.
#[derive(Clone, Copy, Debug)]
pub struct PdfLimits {
    pub pages: usize,
    pub text_chars: usize,
}

/// Why a PDF was not read.
#[derive(Debug)]
pub enum ReadError {
    /// The file: damaged, encrypted, over a limit, too slow to render. What to send instead.
    File(String),
    /// Every reader is busy with other PDFs: try again.
    Busy(String),
}

/// Rendered PDFs by the SHA-256 of the file.
pub struct DocumentCache {
    entries: Mutex<ContentCache<Arc<[Page]>>>,
    readers: Arc<Readers>,
    read_time: Duration,
}

impl Default for DocumentCache {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self::new((cores / 4).max(2), READ_TIME)
    }
}

impl DocumentCache {
    /// At most `readers` PDFs read at once, each within `read_time`.
    fn new(readers: usize, read_time: Duration) -> Self {
        Self {
            entries: Mutex::new(ContentCache::new(CACHE_BYTES, CACHE_ENTRIES)),
            readers: Arc::new(Readers {
                free: Mutex::new(readers),
                freed: Condvar::new(),
            }),
            read_time,
        }
    }

    /// The pages of the PDF in `bytes`, from the cache or read within `limits` and the read
    /// time. The error says what is wrong with the file and what to send instead.
    pub fn read(&self, bytes: &[u8], limits: PdfLimits) -> Result<Arc<[Page]>, ReadError> {
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        if let Some(hit) = self.entries.lock().unwrap().get(&digest) {
            check_limits(&hit, limits).map_err(ReadError::File)?;
            return Ok(hit);
        }
        let deadline = Instant::now() + self.read_time;
        let seconds = self.read_time.as_secs_f64();
        let reader = Readers::take(&self.readers, deadline).ok_or_else(|| {
            ReadError::Busy(format!(
                "every PDF reader stayed busy with other files for {seconds} s: try again later"
            ))
        })?;
        let owned = bytes.to_vec();
        let (done, pages) = mpsc::channel();
        std::thread::Builder::new()
            .name("splash-pdf".into())
            .stack_size(READER_STACK)
            .spawn(move || {
                let _reader = reader;
                let _ = done.send(read_pdf(&owned, digest, limits, deadline));
            })
            .map_err(|e| ReadError::Busy(format!("could not start the PDF reader: {e}")))?;
        let wait = deadline.saturating_duration_since(Instant::now());
        let pages: Arc<[Page]> = match pages.recv_timeout(wait) {
            Ok(read) => read.map_err(ReadError::File)?.into(),
            Err(mpsc::RecvTimeoutError::Timeout) => return Err(ReadError::File(too_slow(seconds))),
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err(ReadError::File(
                "the PDF could not be read (the renderer failed on it): send the pages as images, or the text".into(),
            )),
        };
        let size = pages
            .iter()
            .map(|p| p.text.len() + p.image.pixels.len())
            .sum();
        self.entries
            .lock()
            .unwrap()
            .insert(digest, pages.clone(), size);
        Ok(pages)
    }
}

/// A cached PDF read under other limits still has to fit this request's.
fn check_limits(pages: &[Page], limits: PdfLimits) -> Result<(), String> {
    if pages.len() > limits.pages {
        return Err(too_many_pages(pages.len(), limits.pages));
    }
    let chars: usize = pages.iter().map(|p| p.text.chars().count()).sum();
    if chars > limits.text_chars {
        return Err(too_much_text(limits.text_chars));
    }
    Ok(())
}

/// Readers free to start; a reader given up on by its request keeps its place until it stops.
struct Readers {
    free: Mutex<usize>,
    freed: Condvar,
}

/// A place among the readers, given back when dropped.
struct Reader(Arc<Readers>);

impl Readers {
    /// A place, waiting for one until `deadline`.
    fn take(this: &Arc<Self>, deadline: Instant) -> Option<Reader> {
        let mut free = this.free.lock().unwrap();
        while *free == 0 {
            let wait = deadline.checked_duration_since(Instant::now())?;
            free = this.freed.wait_timeout(free, wait).unwrap().0;
        }
        *free -= 1;
        Some(Reader(this.clone()))
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap() += 1;
        self.0.freed.notify_one();
    }
}

fn too_slow(seconds: f64) -> String {
    format!("the PDF took longer than {seconds} s to read: send fewer or simpler pages, the pages as images, or the text")
}

fn too_many_pages(n: usize, max: usize) -> String {
    format!("the PDF has {n} pages, more than the {max} images and PDF pages this request may still hold: send fewer pages")
}

fn too_much_text(max: usize) -> String {
    format!("the PDFs of this request hold more than {max} characters of text: send fewer pages")
}

/// Reads every page of a PDF: its text and its rendering, giving up at the first page that
/// starts after `deadline`.
fn read_pdf(
    bytes: &[u8],
    digest: [u8; 32],
    limits: PdfLimits,
    deadline: Instant,
) -> Result<Vec<Page>, String> {
    let pdf = Pdf::new(bytes.to_vec()).map_err(|e| match e {
        LoadPdfError::Decryption(DecryptionError::PasswordProtected) => {
            "the PDF needs a password to open: send it without the password protection".to_string()
        }
        LoadPdfError::Decryption(e) => {
            format!("the PDF is encrypted in a way splash cannot read ({e:?}): send it decrypted")
        }
        LoadPdfError::Invalid => {
            "the file is not a PDF, or it is damaged: send a valid PDF".to_string()
        }
    })?;
    let pages = pdf.pages();
    if pages.is_empty() {
        return Err("the PDF has no pages".into());
    }
    if pages.len() > limits.pages {
        return Err(too_many_pages(pages.len(), limits.pages));
    }
    let settings = InterpreterSettings::default();
    let cache = RenderCache::new();
    let text_cache = InterpreterCache::new();
    let mut chars = 0;
    let mut out = Vec::with_capacity(pages.len());
    // The request has been answered by then; the message is for the log of a test.
    let past = |i: usize| match Instant::now() > deadline {
        true => Err(format!(
            "stopped at page {} of {}: out of time",
            i + 1,
            pages.len()
        )),
        false => Ok(()),
    };
    for (i, page) in pages.iter().enumerate() {
        past(i)?;
        let (w, h) = page.render_dimensions();
        let (w, h) = (w as f64, h as f64);
        if !(w.is_finite() && h.is_finite() && w > 0.0 && h > 0.0)
            || w.max(h) / w.min(h) > MAX_ASPECT
        {
            return Err(format!(
                "page {} of the PDF is {w}×{h} points: a page needs a positive size and an aspect ratio of at most {MAX_ASPECT}",
                i + 1
            ));
        }
        // Page text, in the page's own y-down coordinates at 1 unit a point.
        let mut device = TextDevice::default();
        let mut context = Context::new(
            page.initial_transform(true).to_kurbo(),
            Rect::new(0.0, 0.0, w, h),
            &text_cache,
            page.xref(),
            settings.clone(),
        );
        interpret_page(page, &mut context, &mut device);
        // Counted as the prompt takes it, as a cached file is counted again (`check_limits`).
        let text = format!("PDF page {}:\n{}\n", i + 1, device.text());
        chars += text.chars().count();
        if chars > limits.text_chars {
            return Err(too_much_text(limits.text_chars));
        }
        past(i)?;
        let scale = page_scale(w, h);
        let pixmap = hayro::render(
            page,
            &cache,
            &settings,
            &RenderSettings::default(),
            &PixmapSettings {
                x_scale: scale as f32,
                y_scale: scale as f32,
                bg_color: WHITE,
            },
        );
        let (pw, ph) = (pixmap.width() as usize, pixmap.height() as usize);
        if pw == 0 || ph == 0 {
            return Err(format!(
                "page {} of the PDF renders to no pixels ({w}×{h} points)",
                i + 1
            ));
        }
        // Drawn on opaque white: premultiplied RGBA is plain RGBA; alpha is dropped.
        let pixels = pixmap
            .data_as_u8_slice()
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect();
        let mut hasher = Sha256::new();
        hasher.update(b"splash-pdf-page");
        hasher.update(digest);
        hasher.update((i as u64).to_le_bytes());
        out.push(Page {
            text,
            image: Arc::new(RgbImage {
                width: pw,
                height: ph,
                pixels,
            }),
            digest: hasher.finalize().into(),
        });
    }
    Ok(out)
}

/// The scale that renders a `w × h` point page within [`MAX_PAGE_PIXELS`], at most 2 pixels a
/// point.
fn page_scale(w: f64, h: f64) -> f64 {
    let mut scale = (MAX_PAGE_PIXELS / (w * h)).sqrt().min(2.0);
    while (w * scale).ceil() * (h * scale).ceil() > MAX_PAGE_PIXELS {
        scale *= 0.99;
    }
    scale
}

/// A glyph's text where the page places it.
struct PlacedGlyph {
    text: String,
    /// Origin on the baseline, and where the glyph's advance ends, in points (y down).
    x: f64,
    y: f64,
    end: f64,
    /// Font size in points.
    size: f64,
}

/// A device that keeps the text of the glyphs drawn (visible or not) and nothing else.
#[derive(Default)]
struct TextDevice {
    glyphs: Vec<PlacedGlyph>,
}

impl TextDevice {
    /// The glyphs in drawing order as lines: a new line where the baseline moves by half a
    /// font size or the text jumps back (a new column); a space where a gap between glyphs is
    /// wider than 0.15 of the font size and the text has none.
    fn text(&self) -> String {
        let mut out = String::new();
        let mut prev: Option<&PlacedGlyph> = None;
        for g in &self.glyphs {
            if let Some(p) = prev {
                let size = g.size.max(p.size).max(1e-3);
                let new_line = (g.y - p.y).abs() > 0.5 * size || g.x < p.x - 0.5 * size;
                let blank =
                    out.ends_with(char::is_whitespace) || g.text.starts_with(char::is_whitespace);
                if new_line {
                    let trimmed = out.trim_end_matches([' ', '\t']).len();
                    out.truncate(trimmed);
                    out.push('\n');
                } else if g.x - p.end > 0.15 * size && !blank {
                    out.push(' ');
                }
            }
            out.push_str(&g.text);
            prev = Some(g);
        }
        out.lines()
            .map(str::trim_end)
            .collect::<Vec<_>>()
            .join("\n")
            .trim()
            .to_string()
    }
}

impl<'a> Device<'a> for TextDevice {
    fn draw_path(&mut self, _: &BezPath, _: DrawProps<'a>, _: &DrawMode) {}
    fn push_clip_path(&mut self, _: &ClipPath) {}
    fn push_transparency_group(&mut self, _: f32, _: Option<SoftMask<'a>>, _: BlendMode) {}
    fn draw_image(&mut self, _: Image<'a, '_>, _: ImageDrawProps<'a>) {}
    fn pop_clip(&mut self) {}
    fn pop_transparency_group(&mut self) {}

    fn draw_glyph_run(&mut self, run: &GlyphRun<'_, 'a>, props: DrawProps<'a>, _: &DrawMode) {
        for glyph in run.glyphs() {
            let Some(text) = glyph.as_unicode() else {
                continue;
            };
            let text = match text {
                hayro::hayro_interpret::hayro_cmap::BfString::Char(c) => c.to_string(),
                hayro::hayro_interpret::hayro_cmap::BfString::String(s) => s,
            };
            // Glyph space is a thousandth of the font size.
            let [a, _, c, d, e, f] = (props.transform * glyph.transform()).as_coeffs();
            let advance = match &**glyph {
                hayro::hayro_interpret::font::Glyph::Outline(g) => g.advance_width(),
                hayro::hayro_interpret::font::Glyph::Type3(g) => g.advance_width(),
            }
            .unwrap_or(500.0) as f64;
            self.glyphs.push(PlacedGlyph {
                text,
                x: e,
                y: f,
                end: e + a * advance,
                size: (c * c + d * d).sqrt() * 1000.0,
            });
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A PDF of US Letter pages, each line of each page in 12-point Helvetica (the standard
    /// font, not embedded), with `extra` added to the trailer dictionary.
    pub(crate) fn pdf(pages: &[&[&str]], extra: &str) -> Vec<u8> {
        let streams: Vec<String> = pages
            .iter()
            .map(|lines| {
                let mut stream = String::from("BT /F1 12 Tf 72 720 Td 14 TL\n");
                for line in *lines {
                    stream.push_str(&format!("({line}) Tj T*\n"));
                }
                stream + "ET\n"
            })
            .collect();
        pdf_of_streams(&streams, extra)
    }

    /// A PDF of US Letter pages with these content streams (font `/F1` is Helvetica).
    fn pdf_of_streams(streams: &[String], extra: &str) -> Vec<u8> {
        let mut objects = vec![
            "<< /Type /Catalog /Pages 2 0 R >>".to_string(),
            String::new(),
            "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".to_string(),
        ];
        let mut kids = Vec::new();
        for stream in streams {
            objects.push(format!(
                "<< /Length {} >>\nstream\n{stream}endstream",
                stream.len()
            ));
            kids.push(format!("{} 0 R", objects.len() + 1));
            objects.push(format!(
                "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> /Contents {} 0 R >>",
                objects.len()
            ));
        }
        objects[1] = format!(
            "<< /Type /Pages /Kids [{}] /Count {} >>",
            kids.join(" "),
            streams.len()
        );
        let mut out = b"%PDF-1.4\n".to_vec();
        let mut offsets = Vec::new();
        for (i, o) in objects.iter().enumerate() {
            offsets.push(out.len());
            out.extend(format!("{} 0 obj\n{o}\nendobj\n", i + 1).bytes());
        }
        let xref = out.len();
        out.extend(format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).bytes());
        for o in offsets {
            out.extend(format!("{o:010} 00000 n \n").bytes());
        }
        out.extend(
            format!(
                "trailer\n<< /Size {} /Root 1 0 R {extra} >>\nstartxref\n{xref}\n%%EOF\n",
                objects.len() + 1
            )
            .bytes(),
        );
        out
    }

    const LIMITS: PdfLimits = PdfLimits {
        pages: 64,
        text_chars: 1_000_000,
    };

    #[test]
    fn pages_give_their_text_and_a_rendering() {
        let bytes = pdf(
            &[
                &["Invoice 2291", "Total due: 4,250 EUR"],
                &["Page two says hello"],
            ],
            "",
        );
        let pages = DocumentCache::default().read(&bytes, LIMITS).unwrap();
        assert_eq!(pages.len(), 2);
        assert_eq!(
            pages[0].text,
            "PDF page 1:\nInvoice 2291\nTotal due: 4,250 EUR\n"
        );
        assert_eq!(pages[1].text, "PDF page 2:\nPage two says hello\n");
        let image = &pages[0].image;
        assert!((image.width * image.height) as f64 <= MAX_PAGE_PIXELS);
        assert_eq!((image.width, image.height), (891, 1153));
        // White paper with dark glyphs on it.
        let dark = image.pixels.chunks(3).filter(|p| p[0] < 128).count();
        assert!(
            dark > 100 && dark < image.width * image.height / 20,
            "{dark}"
        );
        assert_ne!(pages[0].digest, pages[1].digest);
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let cache = DocumentCache::default();
        let err = |bytes: &[u8], limits| match cache.read(bytes, limits) {
            Err(ReadError::File(e)) => e,
            other => panic!("{:?}", other.map(|p| p.len())),
        };
        assert!(err(b"%PDF-1.4 nothing here", LIMITS).contains("not a PDF, or it is damaged"));
        assert!(err(b"GIF89a", LIMITS).contains("not a PDF"));
        let three = pdf(&[&["a"], &["b"], &["c"]], "");
        let two = PdfLimits { pages: 2, ..LIMITS };
        assert!(err(&three, two).contains("has 3 pages, more than the 2"));
        // Once cached, the same file still meets each request's limits.
        cache.read(&three, LIMITS).unwrap();
        assert!(err(&three, two).contains("has 3 pages"));
        let short = PdfLimits {
            text_chars: 20,
            ..LIMITS
        };
        assert!(err(&three, short).contains("more than 20 characters"));
        // The standard security handler with a user password that is not empty.
        let locked = pdf(
            &[&["secret"]],
            "/Encrypt << /Filter /Standard /V 1 /R 2 /Length 40 /P -4 \
             /O <0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef> \
             /U <fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210> >> \
             /ID [<00112233445566778899aabbccddeeff> <00112233445566778899aabbccddeeff>]",
        );
        assert!(
            err(&locked, LIMITS).contains("needs a password"),
            "{}",
            err(&locked, LIMITS)
        );
    }

    /// A page that takes hayro seconds to render: thousands of large, stroked, dashed curves.
    fn slow_page() -> String {
        let mut stream = String::from("0.5 w [3 2] 0 d\n");
        for i in 0..6_000 {
            let (a, b) = (i % 600, (i * 7) % 780);
            stream.push_str(&format!("{a} 0 m {b} 792 612 {a} 0 {b} c S\n"));
        }
        stream
    }

    #[test]
    fn a_slow_pdf_is_given_up_at_its_deadline_and_keeps_its_reader() {
        let cache = DocumentCache::new(1, Duration::from_millis(300));
        let slow = pdf_of_streams(&vec![slow_page(); 3], "");
        let start = Instant::now();
        match cache.read(&slow, LIMITS) {
            Err(ReadError::File(e)) => assert!(e.contains("took longer than 0.3 s"), "{e}"),
            other => panic!("{:?}", other.map(|p| p.len())),
        }
        let waited = start.elapsed();
        assert!(waited < Duration::from_secs(2), "{waited:?}");
        // The reader given up on still renders its page: a second file waits for it, then
        // is told to come back.
        let quick = pdf(&[&["quick"]], "");
        match cache.read(&quick, LIMITS) {
            Err(ReadError::Busy(e)) => assert!(e.contains("try again later"), "{e}"),
            other => panic!("{:?}", other.map(|p| p.len())),
        }
        // It stops at the end of that page; then the next file is read.
        let relaxed = DocumentCache {
            read_time: Duration::from_secs(120),
            readers: cache.readers.clone(),
            ..DocumentCache::default()
        };
        assert_eq!(relaxed.read(&quick, LIMITS).unwrap().len(), 1);
    }

    #[test]
    fn page_scale_keeps_pages_within_a_megapixel() {
        // US Letter at 2 px a point would be 2.2 Mpx.
        let s = page_scale(612.0, 792.0);
        assert!(s < 2.0 && (612.0 * s).ceil() * (792.0 * s).ceil() <= MAX_PAGE_PIXELS);
        assert!(s > 1.4);
        // A small page keeps 2 px a point.
        assert_eq!(page_scale(100.0, 100.0), 2.0);
    }
}
