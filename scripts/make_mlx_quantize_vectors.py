"""Writes tests/fixtures/mlx-quantize/vectors.safetensors: mlx's own
`mx.quantize` (mode "affine") of one seeded random bf16 matrix [8, 256] for
every bits (2, 3, 4, 5, 6, 8) and group (32, 64, 128), so the Rust
quantizer (src/quant.rs) is checked bit for bit against mlx without Python.

Tensors: `input` (BF16 [8, 256]) and, for each case `q{bits}g{group}`,
`<case>.weight` (U32 packed), `<case>.scales` and `<case>.biases` (BF16),
exactly as mlx returns them for a bf16 input.

    pip install "mlx[cpu]"    # mlx 0.32.4 was used
    python scripts/make_mlx_quantize_vectors.py
"""

import mlx.core as mx
import numpy as np

rng = np.random.default_rng(20261202)
w = rng.standard_normal((8, 256)).astype(np.float32) * 0.05
# A few rows that exercise the edge cases: a constant group, a group whose
# maximum is the edge, a wide outlier.
w[1, :32] = 0.125
w[2, :64] = np.abs(w[2, :64])
w[3, 5] = 1.5
x = mx.array(w).astype(mx.bfloat16)
out = {"input": x}
for bits in (2, 3, 4, 5, 6, 8):
    for group in (32, 64, 128):
        q, s, b = mx.quantize(x, group_size=group, bits=bits)
        name = f"q{bits}g{group}"
        out[f"{name}.weight"] = q
        out[f"{name}.scales"] = s
        out[f"{name}.biases"] = b
mx.save_safetensors(
    "tests/fixtures/mlx-quantize/vectors.safetensors",
    out,
    metadata={"mlx": mx.__version__},
)
print("wrote", len(out), "tensors, mlx", mx.__version__)
