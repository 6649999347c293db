//! Saved state images (the prefix cache's disk tier): a state or draft context read back from
//! its image continues exactly like the original, and a damaged or foreign image is refused.

mod common;
use common::fixture;
use splash_model::{load, DFlashDraft, KvFormat, Logits, ModelError};

#[test]
fn a_loaded_state_continues_like_the_original() {
    for name in ["qwen35-dense", "qwen35-moe"] {
        let m = load(&fixture(name)).unwrap();
        let g = &m.graph;
        for kv in [KvFormat::F32, KvFormat::Bf16, KvFormat::Int8] {
            let prompt: Vec<u32> = (0..37).map(|i| (i * 41 + 5) % 500).collect();
            let mut original = g.new_state_with(kv);
            g.forward(&mut original, &prompt, Logits::None).unwrap();
            let image = original.save_image().unwrap();
            let mut loaded = g.load_state(&image).unwrap();
            assert_eq!(loaded.len(), prompt.len());
            assert_eq!(loaded.kv_format(), kv);
            assert_eq!(
                loaded.save_image().unwrap(),
                image,
                "{name} {kv:?}: re-saved"
            );
            let next = [3u32, 1, 4, 1, 5, 9];
            let a = g.forward(&mut original, &next, Logits::All).unwrap();
            let b = g.forward(&mut loaded, &next, Logits::All).unwrap();
            assert!(a == b, "{name} {kv:?}: logits differ after loading");
        }
        // An empty state round-trips too.
        let empty = g.new_state_with(KvFormat::Int8).save_image().unwrap();
        assert_eq!(g.load_state(&empty).unwrap().len(), 0);
    }
}

fn refused(e: ModelError, what: &str) {
    assert!(
        matches!(e, ModelError::StateImage(_)),
        "{what}: wrong error {e}"
    );
}

#[test]
fn damaged_and_foreign_images_are_refused() {
    let dense = load(&fixture("qwen35-dense")).unwrap();
    let moe = load(&fixture("qwen35-moe")).unwrap();
    let mut s = dense.graph.new_state_with(KvFormat::Int8);
    dense
        .graph
        .forward(&mut s, &[1, 2, 3, 4], Logits::None)
        .unwrap();
    let image = s.save_image().unwrap();
    for cut in [0, 7, 8, 30, image.len() / 2, image.len() - 1] {
        refused(
            dense.graph.load_state(&image[..cut]).unwrap_err(),
            &format!("cut at {cut}"),
        );
    }
    let mut longer = image.clone();
    longer.push(0);
    refused(dense.graph.load_state(&longer).unwrap_err(), "extra byte");
    let mut bad_len = image.clone();
    bad_len[8] = 5; // 5 tokens: every cache array is now the wrong size
    refused(dense.graph.load_state(&bad_len).unwrap_err(), "length");
    let mut bad_kv = image.clone();
    bad_kv[16] = 9;
    refused(dense.graph.load_state(&bad_kv).unwrap_err(), "KV format");
    if moe.config.layer_kinds != dense.config.layer_kinds
        || moe.config.conv_dim() != dense.config.conv_dim()
        || moe.config.num_kv_heads != dense.config.num_kv_heads
        || moe.config.head_dim != dense.config.head_dim
    {
        refused(moe.graph.load_state(&image).unwrap_err(), "other model");
    }
}

#[test]
fn a_loaded_draft_context_drafts_like_the_original() {
    for name in ["dense-dflash", "dense-dflash2", "moe-dflash", "moe-dflash2"] {
        let dir = fixture(&format!("dflash/{name}"));
        let draft = DFlashDraft::load(&dir).unwrap();
        let target_name = if name.starts_with("dense") {
            "qwen35-dense"
        } else {
            "qwen35-moe"
        };
        let target = load(&fixture(target_name)).unwrap();
        let g = &target.graph;
        let taps = &draft.config().target_layer_ids;
        let prompt: Vec<u32> = (0..45).map(|i| (i * 13 + 7) % 500).collect();
        let mut state = g.new_state();
        let features = g
            .forward_with_taps(&mut state, &prompt, Logits::None, taps)
            .unwrap()
            .features;
        let mut original = draft.new_context();
        draft.append_context(&mut original, &features).unwrap();
        let image = draft.save_context(&original).unwrap();
        let mut loaded = draft.load_context(&image).unwrap();
        assert_eq!(loaded.len(), original.len());
        let mut copy = draft.try_clone_context(&original).unwrap();
        let block = draft.config().block_size;
        let a = draft.draft_block(&mut original, g, 7, block).unwrap();
        let b = draft.draft_block(&mut loaded, g, 7, block).unwrap();
        let c = draft.draft_block(&mut copy, g, 7, block).unwrap();
        assert!(
            a.logits == b.logits,
            "{name}: loaded context drafts differently"
        );
        assert!(
            a.logits == c.logits,
            "{name}: copied context drafts differently"
        );
        let e = draft.load_context(&image[..image.len() - 3]).unwrap_err();
        refused(e, "truncated draft context");
    }
}
