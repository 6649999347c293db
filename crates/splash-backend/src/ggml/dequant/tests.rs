//! Every type against the `gguf` Python package's dequantisation of the same random blocks
//! (`tests/fixtures/gguf/dequant.safetensors`, made by `make_dequant_fixture.py`).

use super::super::GgmlType;
use super::dequantize;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/gguf/dequant.safetensors"
);

const TYPES: [GgmlType; 21] = [
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::IQ3_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
];

#[test]
fn every_type_matches_the_gguf_reference() {
    let bytes = std::fs::read(FIXTURE).expect("dequant fixture");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    for ty in TYPES {
        let raw = st.tensor(&format!("{ty}.raw")).expect("raw blocks");
        let reference = st.tensor(&format!("{ty}.ref")).expect("reference values");
        let expected: Vec<f32> = reference
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let mut got = vec![f32::NAN; expected.len()];
        dequantize(ty, raw.data(), &mut got);
        let scale = expected.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(scale > 0.0, "{ty}: reference is all zeros");
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            // Same formulas, possibly another operation order: a few ulps of the block scale.
            assert!(
                (g - e).abs() <= 1e-6 * scale + 1e-6 * e.abs(),
                "{ty}: element {i}: got {g}, reference {e}"
            );
        }
    }
}

#[test]
fn block_sizes_match_ggml() {
    // (type, elements per block, bytes per block) as ggml.c's type traits give them.
    for (ty, be, bb) in [
        (GgmlType::Q8_0, 32, 34),
        (GgmlType::Q4_K, 256, 144),
        (GgmlType::Q6_K, 256, 210),
        (GgmlType::IQ4_XS, 256, 136),
        (GgmlType::IQ3_S, 256, 110),
    ] {
        assert_eq!((ty.block_elems(), ty.block_bytes()), (be, bb), "{ty}");
        assert_eq!(GgmlType::from_id(ty.id()), Ok(ty));
    }
    assert_eq!(GgmlType::from_id(39), Err(Some("MXFP4")));
    assert_eq!(GgmlType::from_id(1000), Err(None));
}

#[test]
fn weights_of_every_type_multiply_like_their_values() {
    use crate::cpu::matmul;
    use crate::{DType, HostBytes, Weight};
    let bytes = std::fs::read(FIXTURE).expect("dequant fixture");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    for ty in TYPES {
        let raw = st.tensor(&format!("{ty}.raw")).unwrap();
        let values: Vec<f32> = st
            .tensor(&format!("{ty}.ref"))
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let (n, k) = (3, 512);
        let w = Weight::new(
            DType::Ggml(ty),
            vec![n, k],
            HostBytes::from_vec(raw.data().to_vec()),
        )
        .unwrap();
        // One token (the block GEMV) and seven (the packed GEMM).
        for t in [1, 7] {
            let x: Vec<f32> = (0..t * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect();
            let mut got = vec![f32::NAN; t * n];
            matmul(&mut got, &x, &w);
            for ti in 0..t {
                for r in 0..n {
                    let row = &values[r * k..(r + 1) * k];
                    let xs = &x[ti * k..(ti + 1) * k];
                    let want: f64 = row.iter().zip(xs).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let scale: f64 = row
                        .iter()
                        .zip(xs)
                        .map(|(&a, &b)| (a as f64 * b as f64).abs())
                        .sum();
                    let g = got[ti * n + r] as f64;
                    assert!(
                        (g - want).abs() <= 1e-5 * scale.max(1e-12),
                        "{ty} t={t} row {r}: {g} vs {want}"
                    );
                }
            }
        }
        // Rows narrow and embed like the values they hold.
        let mut row = vec![0.0; k];
        w.narrow_rows(1, 2).row_to_f32(1, &mut row);
        assert_eq!(row, &values[2 * k..3 * k], "{ty} narrowed row");
        let mut part = vec![0.0; 40];
        w.row_slice_to_f32(2, 100, &mut part);
        assert_eq!(part, &values[2 * k + 100..2 * k + 140], "{ty} row slice");
    }
}
