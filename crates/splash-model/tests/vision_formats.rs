//! The vision tower from every layout splash reads: transformers' (`model.visual.*`), MLX's
//! (`vision_tower.*`, the patch kernel channels last) and a llama.cpp `mmproj` GGUF (`v.*`,
//! `mm.*`, the patch kernel's two temporal frames apart), all made from the same weights of
//! `tests/fixtures/qwen35-vl-tied` (the MLX one here, the mmproj by the fixture scripts): each
//! gives the same rows for the same image.

use std::collections::BTreeMap;
use std::path::PathBuf;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

mod common;
use common::{fixture, vl_gguf};
use splash_model::vision::{PreparedImage, VisionTower};

/// The fixture's vision tensors, by name without `model.visual.`: (shape, f32 values).
fn hf_tensors() -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(fixture("qwen35-vl-tied").join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .filter_map(|(name, view)| {
            let rest = name.strip_prefix("model.visual.")?.to_string();
            assert_eq!(view.dtype(), Dtype::F32, "{name}");
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            Some((rest, (view.shape().to_vec(), values)))
        })
        .collect()
}

/// A scratch directory holding the fixture's config.json, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("splash-vision-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            fixture("qwen35-vl-tied").join("config.json"),
            dir.join("config.json"),
        )
        .unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A 4×6-patch image of deterministic values (a non-square grid, so rows and columns differ).
fn image(patch_len: usize) -> PreparedImage {
    let (gh, gw) = (4, 6);
    let rows = (0..gh * gw * patch_len)
        .map(|i| ((i * 37 + 11) % 255) as f32 / 127.5 - 1.0)
        .collect();
    PreparedImage {
        grid: (gh, gw),
        rows,
    }
}

fn reference() -> (VisionTower, Vec<f32>) {
    let tower = VisionTower::load(&fixture("qwen35-vl-tied"))
        .unwrap()
        .unwrap();
    let rows = tower.encode(&image(tower.config().patch_len())).unwrap();
    (tower, rows)
}

#[test]
fn the_mlx_layout_gives_the_same_rows() {
    let (tower, want) = reference();
    let c = tower.config();
    let (d, ch, t, p) = (
        c.hidden_size,
        c.in_channels,
        c.temporal_patch_size,
        c.patch_size,
    );
    let scratch = Scratch::new("mlx");
    let mut owned: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, (shape, values)) in hf_tensors() {
        let (shape, values) = if name == "patch_embed.proj.weight" {
            // [D, C, T, P, P] → [D, T, P, P, C].
            let mut out = vec![0.0f32; values.len()];
            for (i, v) in values.iter().enumerate() {
                let (x, rest) = (i % p, i / p);
                let (y, rest) = (rest % p, rest / p);
                let (ti, rest) = (rest % t, rest / t);
                let (ci, di) = (rest % ch, rest / ch);
                out[(((di * t + ti) * p + y) * p + x) * ch + ci] = *v;
            }
            (vec![d, t, p, p, ch], out)
        } else {
            (shape, values)
        };
        owned.push((format!("vision_tower.{name}"), shape, f32_bytes(&values)));
    }
    let views: Vec<(String, TensorView<'_>)> = owned
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &scratch.0.join("model.safetensors")).unwrap();
    let mlx = VisionTower::load(&scratch.0)
        .unwrap()
        .expect("an MLX tower");
    let got = mlx.encode(&image(c.patch_len())).unwrap();
    assert!(got == want, "the MLX layout changed the rows");
}

/// The mmproj of the fixture as llama.cpp's converter writes it (`make_gguf_fixture.write_mmproj`,
/// the derived set `vl-gguf`).
#[test]
fn the_mmproj_gguf_gives_the_same_rows() {
    let (tower, want) = reference();
    let c = tower.config();
    let path = splash_model::mmproj_beside(&vl_gguf()).expect("the fixture's mmproj");
    let gguf = VisionTower::load_gguf(&path).unwrap();
    assert_eq!(gguf.config(), c);
    let got = gguf.encode(&image(c.patch_len())).unwrap();
    assert!(got == want, "the mmproj GGUF changed the rows");

    // Another projector (Qwen2-VL's, a name of the same length written over ours) is refused
    // by name.
    let mut bytes = std::fs::read(&path).unwrap();
    let ours = b"qwen3vl_merger";
    let at: Vec<usize> = (0..bytes.len() - ours.len())
        .filter(|&i| &bytes[i..i + ours.len()] == ours)
        .collect();
    assert_eq!(at.len(), 1, "clip.projector_type's value once in the file");
    bytes[at[0]..at[0] + ours.len()].copy_from_slice(b"qwen2vl_merger");
    let scratch = Scratch::new("gguf");
    let other = scratch.0.join("mmproj-other.gguf");
    std::fs::write(&other, bytes).unwrap();
    let e = VisionTower::load_gguf(&other).err().expect("refused");
    assert!(e.to_string().contains("qwen3vl_merger"), "{e}");
}
