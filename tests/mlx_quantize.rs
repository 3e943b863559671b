//! `quant::quantize` against mlx's own `mx.quantize` of the same bf16
//! matrix, for every bits and group (tests/fixtures/mlx-quantize, made by
//! scripts/make_mlx_quantize_vectors.py): packed words, scales and biases
//! bit for bit; and the dequantised values as mlx defines them.

use turbospark::dtype::{decode_f32, encode_f32, DType};
use turbospark::quant::{self, Affine, ScaleType, BITS, GROUPS};

#[test]
fn quantize_is_bit_identical_to_mlx() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/mlx-quantize/vectors.safetensors"
    );
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let input = st.tensor("input").unwrap();
    assert_eq!(input.dtype(), safetensors::Dtype::BF16);
    let n: usize = input.shape().iter().product();
    let x: Vec<f32> = (0..n)
        .map(|i| decode_f32(DType::BF16, input.data(), i))
        .collect();
    let mut cases = 0;
    for bits in BITS {
        for group in GROUPS {
            let name = format!("q{bits}g{group}");
            let get = |part: &str| st.tensor(&format!("{name}.{part}")).unwrap();
            let (w, s, b) = (get("weight"), get("scales"), get("biases"));
            let q = quant::quantize(&x, bits, group as usize);
            let words: Vec<u8> = bytemuck::cast_slice(&q.words).to_vec();
            assert_eq!(words, w.data(), "{name}: packed words");
            assert_eq!(
                encode_f32(DType::BF16, &q.scales),
                s.data(),
                "{name}: scales"
            );
            assert_eq!(
                encode_f32(DType::BF16, &q.biases),
                b.data(),
                "{name}: biases"
            );
            // Read back through the runtime's layout: scale * q + bias.
            let f = Affine::new(bits as u32, group as u32, ScaleType::BF16).unwrap();
            let buf = f.assemble(n, w.data(), s.data(), b.data());
            for i in (0..n).step_by(37) {
                let g = i / group as usize;
                let want = decode_f32(DType::BF16, s.data(), g) * f.q(w.data(), i) as f32
                    + decode_f32(DType::BF16, b.data(), g);
                assert_eq!(f.get(&buf, n, i), want, "{name}: element {i}");
            }
            cases += 1;
        }
    }
    assert_eq!(cases, 18);
}
