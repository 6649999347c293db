//! Image prompts end to end on the CPU against transformers 5.17
//! (`tests/fixtures/qwen35-vl-tied`, made by `make_vl_tied_fixture.py`): the image processor's
//! patch rows, the tower's merged rows, every position's logits with the images' rows in place
//! of their placeholders and M-RoPE positions, 24 greedy tokens, and the same through chunked
//! prefill cut inside an image and through a saved state image.

use std::io::Cursor;
use std::sync::Arc;

use safetensors::SafeTensors;

mod common;
use common::{argmax, fixture, max_rel, vl_gguf};
use splash_model::vision::VisionTower;
use splash_model::vision::{prepare, DecodeLimits, ImageProcessorConfig, PreparedImage};
use splash_model::{
    load, BatchItem, ImageSpan, KvFormat, Logits, Model, ModelError, SequenceState,
};

/// The cases of the fixture script, each with its images' sizes (height, width) in order.
const CASES: [(&str, &[(u32, u32)]); 4] = [
    ("one", &[(64, 96)]),
    ("two", &[(96, 64), (32, 32)]),
    ("interleaved", &[(64, 128), (96, 64)]),
    ("resized", &[(150, 100)]),
];
const IMAGE_PAD: u32 = 514;

/// The fixture script's `pattern(h, w)` as PNG bytes: channel c of (y, x) is (7y + 13x + 50c) % 256.
fn pattern_png(h: u32, w: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb(std::array::from_fn(|c| {
            ((7 * y + 13 * x + 50 * c as u32) % 256) as u8
        }))
    });
    let mut png = Vec::new();
    img.write_to(&mut Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    png
}

struct Reference {
    bytes: Vec<u8>,
}

impl Reference {
    fn open() -> Self {
        let path = fixture("qwen35-vl-tied").join("reference.safetensors");
        Self {
            bytes: std::fs::read(path).unwrap(),
        }
    }

    fn raw(&self, name: &str) -> Vec<u8> {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        st.tensor(name).unwrap().data().to_vec()
    }

    fn f32(&self, name: &str) -> Vec<f32> {
        let raw = self.raw(name);
        raw.chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    fn i64(&self, name: &str) -> Vec<i64> {
        let raw = self.raw(name);
        raw.chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    fn ids(&self, name: &str) -> Vec<u32> {
        self.i64(name).into_iter().map(|x| x as u32).collect()
    }
}

/// One case made ready: its ids, its images as spans (our tower's rows), and the tower's rows
/// concatenated.
struct Case {
    name: &'static str,
    ids: Vec<u32>,
    spans: Vec<ImageSpan>,
    merged: Vec<f32>,
}

fn prepared_images(
    name: &str,
    sizes: &[(u32, u32)],
    processor: &ImageProcessorConfig,
    reference: &Reference,
) -> Vec<PreparedImage> {
    let grids = reference.i64(&format!("{name}.grids"));
    let mut images = Vec::new();
    for (k, &(h, w)) in sizes.iter().enumerate() {
        let mut image = prepare(&pattern_png(h, w), processor, DecodeLimits::default()).unwrap();
        let want = (grids[2 * k] as usize, grids[2 * k + 1] as usize);
        assert_eq!(image.grid, want, "{name}: image {k}'s patch grid");
        if name == "resized" {
            // Pillow's and our bicubic resampling round differently by at most one level; the
            // tower then runs on transformers' own rows so the rest compares exactly.
            let levels = reference.raw("resized.pixels");
            let theirs: Vec<f32> = levels.iter().map(|&l| l as f32 / 127.5 - 1.0).collect();
            assert_eq!(image.rows.len(), theirs.len());
            let worst = image
                .rows
                .iter()
                .zip(&theirs)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                worst <= 1.0 / 127.5 + 1e-6,
                "resized: patch rows differ from transformers' by {} levels",
                worst * 127.5
            );
            image.rows = theirs;
        }
        images.push(image);
    }
    images
}

/// The fixture's own tower.
fn fixture_tower() -> VisionTower {
    VisionTower::load(&fixture("qwen35-vl-tied"))
        .unwrap()
        .expect("the fixture has a tower")
}

fn cases(m: &Model, tower: &VisionTower) -> Vec<Case> {
    let dir = fixture("qwen35-vl-tied");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("preprocessor_config.json")).unwrap())
            .unwrap();
    let processor = ImageProcessorConfig::from_json(&json).unwrap();
    let reference = Reference::open();
    assert_eq!(m.config.image_token_id, Some(IMAGE_PAD));
    CASES
        .iter()
        .map(|&(name, sizes)| {
            let ids = reference.ids(&format!("{name}.ids"));
            let images = prepared_images(name, sizes, &processor, &reference);
            let mut merged = Vec::new();
            let mut spans = Vec::new();
            let mut row = 0;
            for image in &images {
                let rows = tower.encode(image).unwrap();
                let start = row + ids[row..].iter().position(|&t| t == IMAGE_PAD).unwrap();
                let m = processor.merge_size;
                let span = ImageSpan {
                    start,
                    grid: (image.grid.0 / m, image.grid.1 / m),
                    embeddings: Arc::from(rows.as_slice()),
                };
                assert!(ids[start..span.end()].iter().all(|&t| t == IMAGE_PAD));
                row = span.end();
                merged.extend_from_slice(&rows);
                spans.push(span);
            }
            let want = reference.f32(&format!("{name}.merged"));
            let err = max_rel(&merged, &want);
            assert!(err < 1e-4, "{name}: the tower's rows differ by {err}");
            Case {
                name,
                ids,
                spans,
                merged,
            }
        })
        .collect()
}

fn run(
    m: &Model,
    state: &mut SequenceState,
    tokens: &[u32],
    spans: &[ImageSpan],
    want: Logits,
) -> Result<Vec<f32>, ModelError> {
    let mut item = [BatchItem {
        state,
        tokens,
        images: spans,
    }];
    Ok(m.graph
        .forward_batch(&mut item, want, &[])?
        .remove(0)
        .logits)
}

/// `n` greedy tokens after a prefilled state whose last logits row is `last`.
fn greedy(m: &Model, state: &mut SequenceState, last: &[f32], n: usize) -> Vec<u32> {
    let mut out = vec![argmax(last) as u32];
    while out.len() < n {
        let row = m
            .graph
            .forward(state, &out[out.len() - 1..], Logits::Last)
            .unwrap();
        out.push(argmax(&row) as u32);
    }
    out
}

fn last_row(logits: &[f32], vocab: usize) -> &[f32] {
    &logits[logits.len() - vocab..]
}

#[test]
fn image_prompts_match_transformers() {
    let m = load(&fixture("qwen35-vl-tied")).unwrap();
    prompts_match_transformers(&m, &fixture_tower());
}

/// The fixture as llama.cpp's converter writes it: the text model in a GGUF file and the tower
/// in the `mmproj` file found beside it.
#[test]
fn a_gguf_model_and_its_mmproj_match_transformers() {
    let path = vl_gguf();
    let m = load(&path).unwrap();
    let mmproj = splash_model::mmproj_beside(&path).expect("the mmproj beside the model");
    prompts_match_transformers(&m, &VisionTower::load_gguf(&mmproj).unwrap());
}

/// Every case's logits within 1e-4 of transformers' and its 24 greedy tokens.
fn prompts_match_transformers(m: &Model, tower: &VisionTower) {
    let reference = Reference::open();
    let vocab = m.config.vocab_size;
    for case in cases(m, tower) {
        let name = case.name;
        assert!(!case.merged.is_empty());
        let mut state = m.graph.new_state_with(KvFormat::F32);
        let logits = run(m, &mut state, &case.ids, &case.spans, Logits::All).unwrap();
        let err = max_rel(&logits, &reference.f32(&format!("{name}.logits")));
        assert!(
            err < 1e-4,
            "{name}: logits differ from transformers by {err}"
        );
        let shift: i64 = case.spans.iter().map(ImageSpan::rotary_shift).sum();
        assert_eq!(
            state.rotary_shift(),
            shift,
            "{name}: the state's rotary shift"
        );
        let tokens = greedy(m, &mut state, last_row(&logits, vocab), 24);
        assert_eq!(
            tokens,
            reference.ids(&format!("{name}.greedy")),
            "{name}: greedy tokens"
        );
    }
}

#[test]
fn chunked_prefill_cut_inside_images_gives_the_same_logits() {
    let m = load(&fixture("qwen35-vl-tied")).unwrap();
    for case in cases(&m, &fixture_tower()) {
        let mut whole = m.graph.new_state_with(KvFormat::F32);
        let want = run(&m, &mut whole, &case.ids, &case.spans, Logits::All).unwrap();
        // Cuts inside each image, at its edges and in the text between.
        let mut cuts: Vec<usize> = case
            .spans
            .iter()
            .flat_map(|s| {
                [
                    s.start,
                    s.start + 1,
                    s.start + s.len() / 2,
                    s.end() - 1,
                    s.end(),
                ]
            })
            .collect();
        cuts.push(case.ids.len());
        cuts.sort_unstable();
        cuts.dedup();
        let mut state = m.graph.new_state_with(KvFormat::F32);
        let mut got = Vec::new();
        let mut from = 0;
        for cut in cuts {
            let chunk = &case.ids[from..cut];
            got.extend(run(&m, &mut state, chunk, &case.spans, Logits::All).unwrap());
            from = cut;
        }
        let err = max_rel(&got, &want);
        assert!(
            err < 1e-5,
            "{}: chunked prefill differs by {err}",
            case.name
        );
        assert_eq!(state.rotary_shift(), whole.rotary_shift());
    }
}

#[test]
fn a_saved_state_after_an_image_keeps_its_rotary_shift() {
    let m = load(&fixture("qwen35-vl-tied")).unwrap();
    let vocab = m.config.vocab_size;
    let case = cases(&m, &fixture_tower())
        .into_iter()
        .find(|c| c.name == "interleaved")
        .unwrap();
    // Saved between the two images and after both.
    let between = case.spans[0].end() + 1;
    for cut in [between, case.ids.len()] {
        let mut original = m.graph.new_state_with(KvFormat::F32);
        run(
            &m,
            &mut original,
            &case.ids[..cut],
            &case.spans,
            Logits::None,
        )
        .unwrap();
        let mut loaded = m.graph.load_state(&original.save_image().unwrap()).unwrap();
        assert_eq!(loaded.rotary_shift(), original.rotary_shift());
        let rest = &case.ids[cut..];
        let (a, b) = if rest.is_empty() {
            let next = [7u32, 11, 13];
            (
                m.graph.forward(&mut original, &next, Logits::All).unwrap(),
                m.graph.forward(&mut loaded, &next, Logits::All).unwrap(),
            )
        } else {
            (
                run(&m, &mut original, rest, &case.spans, Logits::All).unwrap(),
                run(&m, &mut loaded, rest, &case.spans, Logits::All).unwrap(),
            )
        };
        assert!(a == b, "cut {cut}: logits differ after loading");
        let ga = greedy(&m, &mut original, last_row(&a, vocab), 8);
        let gb = greedy(&m, &mut loaded, last_row(&b, vocab), 8);
        assert_eq!(ga, gb);
    }
}

#[test]
fn image_rows_must_cover_placeholders() {
    let m = load(&fixture("qwen35-vl-tied")).unwrap();
    let case = cases(&m, &fixture_tower())
        .into_iter()
        .find(|c| c.name == "one")
        .unwrap();
    let mut moved = case.spans.clone();
    moved[0].start -= 1; // now covers `<|vision_start|>`
    let mut state = m.graph.new_state();
    let e = run(&m, &mut state, &case.ids, &moved, Logits::Last).unwrap_err();
    assert!(
        matches!(&e, ModelError::Image(msg) if msg.contains("placeholder")),
        "{e}"
    );
    assert_eq!(state.len(), 0, "a refused pass leaves the state as it was");
    // A placeholder token with no image runs as its plain embedding (as the model's own output
    // may hold one): no error.
    run(&m, &mut state, &case.ids, &[], Logits::Last).unwrap();
    assert_eq!(state.rotary_shift(), 0);
}
