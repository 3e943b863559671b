#!/usr/bin/env python3
"""Build MLX-affine quantized Gemma 4 MoE test fixtures for turbospark with mlx-lm's own convert path.

The quantized checkpoints are written by mlx-lm itself (mlx_lm.convert.convert: load + sanitize,
quantize_model, save), so tensor names, config.json and the index are exactly what an mlx-community
conversion of a Gemma 4 checkpoint looks like. The oracle (greedy tokens, logits) is mlx-lm running
the quantized checkpoint in float32. docs/mlx-quantization.md describes the format; read it first.

Why new bf16 sources: mlx-lm's quantize_model skips every module whose input dim is not a multiple of
the DEFAULT group size (utils.quantize_model.wrapped_predicate: `module.weight.shape[-1] % group_size`).
tests/fixtures/tiny-text has moe_intermediate_size 12 and intermediate_size 40, so with group 64 (or
32) mlx-lm leaves experts.switch_glu.down_proj and mlp.down_proj in bf16. The fixtures must have
quantized experts, so this script first builds two new random transformers checkpoints with
scripts/make_fixtures.py's own builder (imported, not modified; same init, prompt search and
checks), with dims that every group size used divides, and quantizes those:

  tests/fixtures/tiny-text-g64/        bf16 source, text spelling (Gemma4ForCausalLM, "model.*", one
                                       model.safetensors): 2 layers S F, hidden 64, intermediate 64,
                                       8 experts x moe_intermediate 64, top_k 2, seed 4348
  tests/fixtures/tiny-multimodal-g32/  bf16 source, multimodal spelling (Gemma4ForConditionalGeneration,
                                       "model.language_model.*", 2 shards + index, mixed f32/f16/bf16,
                                       dummy vision tensors): 3 layers S S F, hidden 64, intermediate 64,
                                       8 experts x moe_intermediate 32, top_k 3, seed 8799
  Both: 4 query heads; sliding 2 KV heads x 32, full 1 KV head x 64 (k_eq_v), vocab 512 tied,
  sliding_window 4, softcap 30, everything else as in make_fixtures.py. Each has config.json,
  tokenizer.json, expected.json and logits.safetensors made exactly like tiny-text's (transformers,
  float32). (2 and 3 layers, not 4: 8 experts x 64 x 64 x 3 projections per layer is most of the
  size; 4 layers would pass 1 MB.)
  tiny-multimodal-g32's text_config also carries "global_head_dim": 64 and
  "num_global_key_value_heads": 1 (next to the per_layer_config that save_pretrained writes), and
  the top level "vocab_size": 512: mlx-lm's gemma4 / gemma4_text ignore per_layer_config (full
  layers would get head_dim 512) and take vocab_size from the top level (default 262144). The
  script re-checks that transformers reloads the edited checkpoint to bit-identical logits.

Quantized fixtures (mlx-lm convert, quantize=True, mode affine; CPU mlx):

  tests/fixtures/tiny-text-q4/           from tiny-text-g64: q_bits 4, q_group_size 64, mlx-lm's own
                                         Gemma 4 quant_predicate (router.proj -> 8 bits group 64)
  tests/fixtures/tiny-text-q8/           from tiny-text-g64: q_bits 8, q_group_size 32, same predicate
                                         (so the router is 8 bits group 64 while the rest is group 32)
  tests/fixtures/tiny-multimodal-mixed/  from tiny-multimodal-g32: default 4 bits group 32, router
                                         8/64 (mlx-lm's rule), dense MLP 8/64, per-module overrides
                                         MIXED_OVERRIDES below (2, 3, 5, 6 bits; groups 32, 64, 128;
                                         the tied embedding at 6 bits)
  Each: config.json, model.safetensors and model.safetensors.index.json exactly as mlx-lm's save
  writes them (generation_config.json too where the source has one); tokenizer.json copied from the
  source (mlx-lm's save re-serialises it; the README.md model card and tokenizer_config.json it also
  writes are dropped); expected.json {prompt_len, tokens, source, quantization, versions, note};
  logits.safetensors "logits" F32 [18, 512].

tokens = the bf16 source's 10 prompt ids + 8 greedy ids from mlx_lm.generate.generate_step (KV
cache, RotatingKVCache for sliding layers, greedy) on the quantized model after
model.set_dtype(mx.float32) (widens scales/biases/norms to f32, packed U32 words untouched);
logits = one teacher-forced float32 mlx-lm forward over all 18 tokens.

Checks (all asserted):
  * greedy tokens == argmax of the teacher-forced logits at positions P-1 .. N-2;
  * the quantized model's continuation is usable as an oracle (QUALITY): no special ids (< 4), at
    least 4 distinct ids, top1-top2 margin >= 0.1 at every greedy step, and a gap >= 0.02 between
    the k-th and (k+1)-th router logit for every (layer, token). The source seeds (4348, 8799) were
    picked by trying seeds 4321.. / 8765.. until every quantized fixture of that source passed this
    (the source's own prompt search does not see the quantized models);
  * every Linear / Embedding / SwitchLinear is quantized (nothing skipped), with the bits and group
    size the recipe asks for;
  * an independent numpy implementation of the quantisation rule and bit packing in
    docs/mlx-quantization.md, applied to the bf16 source, reproduces every packed weight, scale and
    bias bit for bit; every non-quantized tensor equals the source's value;
  * an independent float64 re-implementation of the Gemma 4 math (make_fixtures.reference_from_doc)
    run on the dequantized weights (w = scale * q + bias) agrees with mlx-lm's f32 logits to < 1e-3;
  * the unquantized source loaded by mlx-lm in float32 reproduces the source's transformers logits.
The run is deterministic: running it twice gives byte-identical files (checked with sha256sum).

Run (from the repository root; CPU only, about 30 s) in a Python that has torch, transformers,
mlx and mlx-lm, e.g. a virtual environment made with

    python3 -m venv "$VENV"
    "$VENV"/bin/pip install "mlx[cpu]==0.32.4" mlx-lm==0.32.2 torch==2.15.0 transformers==5.24.0
    "$VENV"/bin/python scripts/make_quant_fixtures.py

Versions used for the committed fixtures: mlx 0.32.4 (mlx[cpu] wheel, Linux x86-64), mlx-lm 0.32.2,
torch 2.15.0, transformers 5.24.0, safetensors 0.8.0, tokenizers 0.23.3, numpy 2.4.6, python 3.11.7.
"""

import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIX = os.path.join(ROOT, "tests", "fixtures")
sys.path.insert(0, HERE)

import make_fixtures as mf  # noqa: E402  (the transformers builder: imported, never modified)
import torch  # noqa: E402
import transformers  # noqa: E402

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from mlx_lm.convert import convert  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.models import gemma4_text  # noqa: E402
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

S, F = mf.S, mf.F

SOURCES = [
    dict(name="tiny-text-g64", seed=4348, layer_types=[S, F], top_k=2, spelling="text", std_router=2.5,
         dims=dict(num_hidden_layers=2, intermediate_size=64, moe_intermediate_size=64)),
    dict(name="tiny-multimodal-g32", seed=8799, layer_types=[S, S, F], top_k=3, spelling="multimodal",
         std_router=3.0, dims=dict(num_hidden_layers=3, intermediate_size=64, moe_intermediate_size=32)),
]
SRC = {s["name"]: s for s in SOURCES}

# Per-module overrides of the mixed fixture, keyed by the module path below "language_model.model."
# (mlx-lm's quantize_model records them in config.json under the FULL path). Dense MLP modules get
# 8 bits group 64 and router.proj mlx-lm's own 8 bits group 64; everything else the default 4/32.
MIXED_OVERRIDES = {
    "embed_tokens": {"group_size": 64, "bits": 6},  # tied: also the LM head
    "layers.0.experts.switch_glu.gate_proj": {"group_size": 32, "bits": 3},
    "layers.0.experts.switch_glu.down_proj": {"group_size": 32, "bits": 2},
    "layers.1.self_attn.q_proj": {"group_size": 32, "bits": 6},
    "layers.1.self_attn.k_proj": {"group_size": 32, "bits": 6},
    "layers.1.self_attn.v_proj": {"group_size": 32, "bits": 6},
    "layers.1.self_attn.o_proj": {"group_size": 32, "bits": 6},
    "layers.2.self_attn.k_proj": {"group_size": 64, "bits": 3},
    "layers.2.self_attn.o_proj": {"group_size": 128, "bits": 5},
    "layers.2.experts.switch_glu.up_proj": {"group_size": 64, "bits": 5},
}

# mlx-lm's own Gemma 4 rule (gemma4_text.Model.quant_predicate: router.proj -> 8 bits group 64,
# everything else True = the default); the property does not use self.
MLX_GEMMA4_RULE = gemma4_text.Model.quant_predicate.fget(None)


def mixed_predicate(path, module):
    r = MLX_GEMMA4_RULE(path, module)
    if r is not True:
        return r
    if ".mlp." in path:
        return {"group_size": 64, "bits": 8}
    key = path.removeprefix("language_model.model.")
    return dict(MIXED_OVERRIDES[key]) if key in MIXED_OVERRIDES else True


QUALITY = dict(min_margin=0.1, min_router_gap=0.02, min_distinct=4, min_id=4)

QUANT = [
    dict(name="tiny-text-q4", source="tiny-text-g64", bits=4, group_size=64, predicate=None),
    dict(name="tiny-text-q8", source="tiny-text-g64", bits=8, group_size=32, predicate=None),
    dict(name="tiny-multimodal-mixed", source="tiny-multimodal-g32", bits=4, group_size=32,
         predicate=mixed_predicate),
]


# ------------------------------------------------------------------------------------------------
# bf16 sources through make_fixtures.build


@contextlib.contextmanager
def patched_common(**dims):
    saved = dict(mf.COMMON)
    mf.COMMON.update(dims)
    try:
        yield
    finally:
        mf.COMMON.clear()
        mf.COMMON.update(saved)


def source_cfg_dict(src):
    """The dict make_fixtures.reference_from_doc reads (flat text fields)."""
    return dict(mf.COMMON, **src["dims"], layer_types=src["layer_types"], top_k_experts=src["top_k"])


def build_source(src):
    fx = dict(name=src["name"], seed=src["seed"], layer_types=src["layer_types"], top_k=src["top_k"],
              spelling=src["spelling"])
    mf.STD_ROUTER[src["name"]] = src["std_router"]
    with patched_common(**src["dims"]):
        outdir = mf.build(fx)
        exp_path = os.path.join(outdir, "expected.json")
        exp = json.load(open(exp_path))
        if src["spelling"] == "multimodal":
            # what mlx-lm's gemma4 wrapper needs to build the same shapes (see the docstring)
            cpath = os.path.join(outdir, "config.json")
            c = json.load(open(cpath))
            c["vocab_size"] = mf.VOCAB
            t = dict(c["text_config"])
            t["global_head_dim"] = mf.COMMON["global_head_dim"]
            t["num_global_key_value_heads"] = mf.COMMON["num_global_key_value_heads"]
            c["text_config"] = dict(sorted(t.items()))
            with open(cpath, "w") as f:
                json.dump(c, f, indent=2)
                f.write("\n")
            ref = load_logits(outdir)
            rl = mf.reload_logits(fx, outdir, exp["tokens"]).numpy()
            assert np.array_equal(rl, ref), float(np.abs(rl - ref).max())
            print("edited multimodal config reloads through transformers to identical logits")
        d = src["dims"]
        exp["note"] = (
            f"bf16 source of the MLX-quantized fixtures, made by scripts/make_quant_fixtures.py through "
            f"scripts/make_fixtures.py's builder (seed {src['seed']}) with num_hidden_layers "
            f"{d['num_hidden_layers']}, intermediate_size {d['intermediate_size']}, moe_intermediate_size "
            f"{d['moe_intermediate_size']} (multiples of the quantization group sizes). "
            + exp["note"].split(". ", 1)[1]
        )
        with open(exp_path, "w") as f:
            json.dump(exp, f, indent=2)
            f.write("\n")
    return outdir


# ------------------------------------------------------------------------------------------------
# independent numpy implementation of docs/mlx-quantization.md


def bf16_round(a):
    """float32 -> nearest bf16 (ties to even), returned as float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def ref_quantize(w, group_size, bits):
    """w float32 [..., K] (values exactly bf16) -> (packed uint32 [..., K*bits/32], scales, biases) with
    scales/biases already rounded to bf16 (returned as float32)."""
    *lead, K = w.shape
    n_bins = np.float32((1 << bits) - 1)
    g = w.reshape(*lead, K // group_size, group_size).astype(np.float32)
    w_max, w_min = g.max(-1), g.min(-1)
    mask = np.abs(w_min) > np.abs(w_max)
    scale = np.maximum((w_max - w_min) / n_bins, np.float32(1e-7))
    scale = np.where(mask, scale, -scale).astype(np.float32)
    edge = np.where(mask, w_min, w_max).astype(np.float32)
    q0 = np.rint(edge / scale)
    nz = q0 != 0
    scale = np.where(nz, edge / np.where(nz, q0, np.float32(1)), scale).astype(np.float32)
    bias = np.where(nz, edge, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint((g - bias[..., None]) / scale[..., None]), 0, n_bins).astype(np.uint8)
    q = q.reshape(*lead, K)
    # LSB-first bit stream per row: value j occupies bits [j*bits, (j+1)*bits) of the row's
    # little-endian byte sequence
    bitsarr = np.unpackbits(q[..., None], axis=-1, bitorder="little")[..., :bits]  # [..., K, bits]
    stream = bitsarr.reshape(*lead, K * bits)
    packed = np.packbits(stream, axis=-1, bitorder="little").view("<u4")
    return packed, bf16_round(scale), bf16_round(bias)


def ref_unpack(words, bits, K):
    b = np.ascontiguousarray(words).view(np.uint8)
    stream = np.unpackbits(b, axis=-1, bitorder="little")[..., : K * bits]
    stream = stream.reshape(*words.shape[:-1], K, bits).astype(np.uint32)
    return (stream << np.arange(bits, dtype=np.uint32)).sum(-1)


def ref_dequantize(words, scales, biases, bits, group_size):
    K = words.shape[-1] * 32 // bits
    q = ref_unpack(words, bits, K).astype(np.float32)
    q = q.reshape(*q.shape[:-1], K // group_size, group_size)
    w = scales.astype(np.float32)[..., None] * q + biases.astype(np.float32)[..., None]
    return w.reshape(*w.shape[:-2], K)


# ------------------------------------------------------------------------------------------------
# io helpers


def read_safetensors_f32(paths):
    """name -> numpy array, read straight from the file: BF16/F16/F32 as float32 (exact), U32 as uint32."""
    out = {}
    for p in paths:
        raw = open(p, "rb").read()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + n])
        base = 8 + n
        for k, info in header.items():
            if k == "__metadata__":
                continue
            a, b = info["data_offsets"]
            buf = raw[base + a : base + b]
            dt = info["dtype"]
            if dt == "BF16":
                v = (np.frombuffer(buf, "<u2").astype(np.uint32) << 16).view(np.float32)
            elif dt == "F16":
                v = np.frombuffer(buf, "<f2").astype(np.float32)
            elif dt == "F32":
                v = np.frombuffer(buf, "<f4").copy()
            elif dt == "U32":
                v = np.frombuffer(buf, "<u4").copy()
            else:
                raise ValueError(f"{p}: {k} has dtype {dt}")
            out[k] = v.reshape(info["shape"])
    return out


def weight_files(d):
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.startswith("model") and f.endswith(".safetensors"))


def load_logits(d):
    with safe_open(os.path.join(d, "logits.safetensors"), framework="np") as f:
        return f.get_tensor("logits")


def source_state_mlx_names(src_dir, spelling):
    """The bf16 source's tensors under the names mlx-lm's sanitize gives them (float32 values)."""
    raw = read_safetensors_f32(weight_files(src_dir))
    out = {}
    for k, v in raw.items():
        if spelling == "multimodal":
            if not k.startswith("model.language_model."):
                continue  # vision dummies: dropped by sanitize
            k = "language_model.model." + k[len("model.language_model."):]
        if k.endswith(".experts.gate_up_proj"):
            base = k[: -len(".gate_up_proj")]
            half = v.shape[-2] // 2
            out[base + ".switch_glu.gate_proj.weight"] = v[..., :half, :]
            out[base + ".switch_glu.up_proj.weight"] = v[..., half:, :]
        elif k.endswith(".experts.down_proj"):
            out[k[: -len(".down_proj")] + ".switch_glu.down_proj.weight"] = v
        else:
            out[k] = v
    return out


def module_params(qcfg, path):
    """bits / group_size of a quantized module: the full-path entry, else the top-level default."""
    p = qcfg.get(path, qcfg)
    return p["bits"], p["group_size"]


# ------------------------------------------------------------------------------------------------


def mlx_f32_model(d):
    model, config = load_model(Path(d))
    model.set_dtype(mx.float32)
    return model, config


def mlx_logits(model, ids):
    out = model(mx.array([ids]))
    mx.eval(out)
    return np.array(out[0].astype(mx.float32))


def mlx_greedy(model, prompt, n):
    toks = []
    for tok, _ in generate_step(mx.array(prompt), model, max_tokens=n):
        toks.append(int(tok))
    assert len(toks) == n
    return toks


def router_gaps(model, ids, top_k):
    """min over layers/tokens of the k-th minus (k+1)-th router logit, recorded from mlx-lm's Router."""
    scores = []
    orig = gemma4_text.Router.__call__

    def rec(self, x):
        z = mx.fast.rms_norm(x, self.scale * self._root_size, self.eps)
        scores.append(np.array(self.proj(z).astype(mx.float32)))
        return orig(self, x)

    gemma4_text.Router.__call__ = rec
    try:
        mlx_logits(model, ids)
    finally:
        gemma4_text.Router.__call__ = orig
    s = np.sort(np.concatenate([a.reshape(-1, a.shape[-1]) for a in scores]), -1)[:, ::-1]
    return float((s[:, top_k - 1] - s[:, top_k]).min())


def check_mlx_reproduces_source(src_dir, tag):
    model, _ = mlx_f32_model(src_dir)
    exp = json.load(open(os.path.join(src_dir, "expected.json")))
    lg = mlx_logits(model, exp["tokens"])
    ref = load_logits(src_dir)
    nmse = float(((lg - ref) ** 2).sum() / (ref ** 2).sum())
    mad = float(np.abs(lg - ref).max())
    print(f"[{tag}] mlx-lm f32 vs transformers f32 logits: max abs diff {mad:.3e}, NMSE {nmse:.3e}")
    assert nmse < 1e-9 and mad < 1e-3, (mad, nmse)
    return mad, nmse


def build_quant(q, tmp):
    src = SRC[q["source"]]
    src_dir = os.path.join(FIX, q["source"])
    outdir = os.path.join(FIX, q["name"])
    print(f"\n=== {q['name']} (from {q['source']}: bits {q['bits']}, group {q['group_size']}) ===")
    stage = os.path.join(tmp, q["name"])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        convert(hf_path=src_dir, mlx_path=stage, quantize=True, q_group_size=q["group_size"], q_bits=q["bits"],
                q_mode="affine", quant_predicate=q["predicate"])
    print(buf.getvalue().strip())

    if os.path.isdir(outdir):
        shutil.rmtree(outdir)
    os.makedirs(outdir)
    written = sorted(os.listdir(stage))
    keep = [f for f in written if f == "config.json" or f == "generation_config.json" or f.startswith("model")]
    for f in keep:
        shutil.copyfile(os.path.join(stage, f), os.path.join(outdir, f))
    shutil.copyfile(os.path.join(src_dir, "tokenizer.json"), os.path.join(outdir, "tokenizer.json"))
    dropped = sorted(set(written) - set(keep) - {"tokenizer.json"})
    print(f"mlx-lm wrote {written}; kept {keep}; tokenizer.json copied from the source; dropped {dropped}")

    cfg = json.load(open(os.path.join(outdir, "config.json")))
    qcfg = cfg["quantization"]
    assert cfg["quantization_config"] == qcfg
    prefix = "language_model.model." if src["spelling"] == "multimodal" else "model."

    # --- every quantizable module is quantized, with the recipe's parameters, and bit-exact vs the
    # independent numpy implementation applied to the source
    model, _ = mlx_f32_model(outdir)
    qmods = {}
    for path, m in model.named_modules():
        if isinstance(m, (SwitchLinear,)) or type(m).__name__ in ("Linear", "Embedding"):
            raise AssertionError(f"{path} left unquantized")
        if isinstance(m, QuantizedSwitchLinear) or type(m).__name__ in ("QuantizedLinear", "QuantizedEmbedding"):
            qmods[path] = (m.bits, m.group_size)
    for path, (b, g) in qmods.items():
        want = (q["bits"], q["group_size"])
        pred = q["predicate"] or MLX_GEMMA4_RULE
        r = pred(path, None)
        if isinstance(r, dict):
            want = (r["bits"], r["group_size"])
        assert (b, g) == want == module_params(qcfg, path), (path, b, g, want)
    src_t = source_state_mlx_names(src_dir, src["spelling"])
    fx_t = read_safetensors_f32(weight_files(outdir))
    n_q = 0
    for path, (b, g) in sorted(qmods.items()):
        w = src_t.pop(path + ".weight")
        pw, ps, pb = ref_quantize(w, g, b)
        assert np.array_equal(fx_t[path + ".weight"], pw), path
        assert np.array_equal(fx_t[path + ".scales"], ps), path
        assert np.array_equal(fx_t[path + ".biases"], pb), path
        n_q += 1
    for k, v in src_t.items():  # not quantized: the source value (as bf16)
        assert np.array_equal(fx_t[k], v), k
    assert len(fx_t) == 3 * n_q + len(src_t), (len(fx_t), n_q, len(src_t))
    print(f"{n_q} quantized modules reproduced bit for bit by the numpy rule; {len(src_t)} float tensors equal the source")

    # --- oracle: greedy continuation of the source's prompt, teacher-forced logits (mlx-lm, f32)
    src_exp = json.load(open(os.path.join(src_dir, "expected.json")))
    P = src_exp["prompt_len"]
    prompt = src_exp["tokens"][:P]
    n_new = len(src_exp["tokens"]) - P
    gen = mlx_greedy(model, prompt, n_new)
    ids = prompt + gen
    N = len(ids)
    logits = mlx_logits(model, ids)
    assert logits.shape == (N, mf.VOCAB) and logits.dtype == np.float32
    am = logits[P - 1 : N - 1].argmax(-1).tolist()
    assert am == gen, (am, gen)
    top2 = np.sort(logits[P - 1 : N - 1], -1)[:, -2:]
    margin = float((top2[:, 1] - top2[:, 0]).min())
    gap = router_gaps(model, ids, src["top_k"])
    print(f"tokens {ids}; min greedy top1-top2 margin {margin:.3f}; min router top-k gap {gap:.3f}; "
          f"logits std {float(logits.std()):.2f}, max |logit| {float(np.abs(logits).max()):.2f}")

    # --- independent float64 forward on the dequantized weights
    sd = {}
    for k, v in fx_t.items():
        if k.endswith((".scales", ".biases")):
            continue
        mod = k[: -len(".weight")] if k.endswith(".weight") else None
        if mod in qmods:
            b, g = qmods[mod]
            v = ref_dequantize(v, fx_t[mod + ".scales"], fx_t[mod + ".biases"], b, g)
        sd["model." + k[len(prefix):]] = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32))
    for L in range(src["dims"]["num_hidden_layers"]):
        e = f"model.layers.{L}.experts"
        sd[e + ".gate_up_proj"] = torch.cat([sd.pop(e + ".switch_glu.gate_proj.weight"),
                                             sd.pop(e + ".switch_glu.up_proj.weight")], -2)
        sd[e + ".down_proj"] = sd.pop(e + ".switch_glu.down_proj.weight")
    ref = mf.reference_from_doc(sd, source_cfg_dict(src), ids).float().numpy()
    dd = float(np.abs(ref - logits).max())
    print(f"max |mlx-lm f32 - float64 re-implementation on the dequantized weights| = {dd:.2e}")
    assert dd < 1e-3, dd

    # --- write the oracle
    save_file({"logits": np.ascontiguousarray(logits)}, os.path.join(outdir, "logits.safetensors"),
              metadata={"format": "np"})
    overrides = {k: v for k, v in qcfg.items() if isinstance(v, dict)}
    per_module = {}
    for path, (b, g) in sorted(qmods.items()):
        per_module.setdefault(f"{b} bits group {g}", []).append(path)
    note = (
        f"MLX-affine quantized tiny Gemma 4 MoE, written by mlx-lm's own convert (quantize=True, q_bits {q['bits']}, "
        f"q_group_size {q['group_size']}, mode affine, "
        + ("mlx-lm's default Gemma 4 quant_predicate: router.proj 8 bits group 64" if q["predicate"] is None else
           "quant_predicate = mlx-lm's Gemma 4 rule (router.proj 8/64) + dense MLP 8/64 + MIXED_OVERRIDES of "
           "scripts/make_quant_fixtures.py")
        + f") from the bf16 checkpoint {q['source']}, on CPU mlx; made by scripts/make_quant_fixtures.py. "
        f"tokens = the source's {P} prompt ids + {n_new} greedy ids from mlx_lm.generate.generate_step (KV cache, "
        f"greedy) on the quantized model in float32 (model.set_dtype(mx.float32): scales/biases/norms widened to f32, "
        f"packed words untouched). logits.safetensors 'logits' [N={N}, {mf.VOCAB}] F32 = final softcapped logits of ONE "
        f"teacher-forced mlx-lm float32 forward over all N tokens. Greedy min top1-top2 margin {margin:.3f}; min gap "
        f"between the k-th and (k+1)-th router logit {gap:.3f}; a float64 re-implementation on the dequantized "
        f"weights agrees to {dd:.1e}."
    )
    exp = {
        "prompt_len": P,
        "tokens": ids,
        "source": f"tests/fixtures/{q['source']}",
        "quantize": {"bits": q["bits"], "group_size": q["group_size"], "mode": "affine",
                     "overrides": overrides},
        "quantized_modules": per_module,
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
        "numpy_version": np.__version__,
        "note": note,
    }
    with open(os.path.join(outdir, "expected.json"), "w") as f:
        json.dump(exp, f, indent=2)
        f.write("\n")
    sizes = {f: os.path.getsize(os.path.join(outdir, f)) for f in sorted(os.listdir(outdir))}
    print(f"files {sizes}, total {sum(sizes.values())} bytes")
    assert sum(sizes.values()) < 700_000
    return dict(margin=margin, gap=gap, distinct=len(set(gen)), min_id=min(gen), tokens=ids)


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    mx.set_default_device(mx.cpu)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, mlx {mx.__version__}, "
          f"mlx-lm {mlx_lm.__version__}, numpy {np.__version__}")
    check_mlx_reproduces_source(os.path.join(FIX, "tiny-text"), "tiny-text")
    check_mlx_reproduces_source_mm()
    for src in SOURCES:
        d = build_source(src)
        check_mlx_reproduces_source(d, src["name"])
    with tempfile.TemporaryDirectory() as tmp:
        for q in QUANT:
            r = build_quant(q, tmp)
            assert (r["margin"] >= QUALITY["min_margin"] and r["gap"] >= QUALITY["min_router_gap"]
                    and r["distinct"] >= QUALITY["min_distinct"] and r["min_id"] >= QUALITY["min_id"]), (q["name"], r)
    print("\ndone")


def check_mlx_reproduces_source_mm():
    """tiny-multimodal as committed: mlx-lm needs the two config additions; pass them as model_config."""
    d = os.path.join(FIX, "tiny-multimodal")
    c = json.load(open(os.path.join(d, "config.json")))
    t = dict(c["text_config"], global_head_dim=64, num_global_key_value_heads=1)
    model, _ = load_model(Path(d), model_config={"vocab_size": mf.VOCAB, "text_config": t})
    model.set_dtype(mx.float32)
    exp = json.load(open(os.path.join(d, "expected.json")))
    lg = mlx_logits(model, exp["tokens"])
    ref = load_logits(d)
    nmse = float(((lg - ref) ** 2).sum() / (ref ** 2).sum())
    print(f"[tiny-multimodal] mlx-lm f32 vs transformers f32 logits: max abs diff "
          f"{float(np.abs(lg - ref).max()):.3e}, NMSE {nmse:.3e}")
    assert nmse < 1e-9


if __name__ == "__main__":
    sys.exit(main())
