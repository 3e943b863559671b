#!/usr/bin/env python3
"""Build tests/fixtures/wide-text: a Gemma 4 MoE checkpoint wide enough that single f16 rounding of
the activations changes which experts a token gets (turbospark::Precision), with transformers' outputs.

Shape: hidden 256, 2 query heads; a sliding layer (1 KV head x head_dim 256, window 32, RoPE 1e4) then
a full layer (attention_k_eq_v, 1 KV head x head_dim 512, proportional RoPE 1e6, factor 0.25); dense
MLP 64; 16 experts of moe_intermediate_size 32, top-4; vocab 512 tied; softcap 30. Two layers keep
the directory near 4 MB. Weights are drawn and rounded to bf16 as in make_fixtures.py (same scales),
the reference is transformers in float32 (eager attention, eager experts) on exactly those values.

tokens = a prompt of 80 random ids + 20 greedy ids (100 tokens, past the window of 32 and across
several prefill batches); logits = one teacher-forced forward over all 100. The prompt is the first
of a seeded list of 40 candidates whose greedy ids are >= 4 (at least 3 distinct) with a
top1-top2 margin >= 0.05 at each greedy step and whose router never has its k-th and (k+1)-th
logits within 2e-4 (so that any computation at the f32 floor routes every token as transformers
does); among those, the one with the closest such pair: near-ties are what real routers have, and
what a single f16 rounding (2^-11 relative) flips.

The script asserts what make_fixtures.py asserts of its fixtures (greedy == teacher-forced argmax,
the window matters, grouped_mm experts agree, the float64 re-implementation of docs/gemma4.md
agrees, the directory reloads to identical logits).

Run from the repository root (CPU, about a minute; deterministic):

    python3 scripts/make_wide_fixture.py

Versions used: python 3.11.7, torch 2.15.0 (+cu132 wheel, run on CPU), transformers 5.24.0,
safetensors 0.8.0, tokenizers 0.23.3.
"""

import json
import os
import shutil
import sys

import torch

import transformers
from safetensors.torch import load_file, save_file
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

NAME = "wide-text"
SEED = 4242
S, F = mf.S, mf.F
LAYERS = [S, F]
TOP_K = 4
PROMPT_LEN = 80
NEW_TOKENS = 20
N_CANDIDATES = 40
MIN_MARGIN = 0.05
MIN_ROUTER_GAP = 2e-4
MIN_DISTINCT = 3

WIDE = dict(
    mf.COMMON,
    hidden_size=256,
    intermediate_size=64,
    num_hidden_layers=len(LAYERS),
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=256,
    global_head_dim=512,
    num_global_key_value_heads=1,
    num_experts=16,
    moe_intermediate_size=32,
    sliding_window=32,
    layer_types=list(LAYERS),
    top_k_experts=TOP_K,
)


def make_config(**overrides):
    kw = dict(WIDE)
    kw.update(overrides)
    cfg = Gemma4TextConfig(**kw)
    cfg._attn_implementation = "eager"
    return cfg


def greedy(model, prompt):
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
        )
    return out[0].tolist()


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    torch.manual_seed(SEED)
    cfg = make_config()
    model = Gemma4ForCausalLM(cfg).eval()
    model.set_experts_implementation("eager")
    # (embeddings at half the tiny fixtures' scale: logits = h . embedding sum over 4x the dims,
    # and at 0.3 they reach the softcap)
    mf.STD_EMBED = 0.15
    # (the two post norms larger than the tiny fixtures' 2-4: over 256 dims a token's own
    # embedding stands out of the tied head 2x more, and at 2-4 every continuation is the prompt's
    # last token repeated)
    mf.POST_NORM_RANGE = (6.0, 12.0)
    mf.randomise_(model, SEED, 2.5)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}

    P = PROMPT_LEN
    chosen = None
    for attempt in range(N_CANDIDATES):
        g = torch.Generator().manual_seed(SEED * 1000 + attempt)
        prompt = torch.randint(4, mf.VOCAB, (P,), generator=g).tolist()
        ids = greedy(model, prompt)
        logits, probs = mf.forward_with_router(model, ids)
        top2 = logits[P - 1 : len(ids) - 1].topk(2, -1).values
        margin = float((top2[:, 0] - top2[:, 1]).min())
        gap = mf.router_gap(probs, TOP_K)
        distinct = len(set(ids[P:]))
        print(f"candidate {attempt}: margin {margin:.4f}, router gap {gap:.2e}, {distinct} distinct ids")
        if min(ids[P:]) < 4 or margin < MIN_MARGIN or gap < MIN_ROUTER_GAP or distinct < MIN_DISTINCT:
            continue
        if chosen is None or gap < chosen[4]:
            chosen = (attempt, ids, logits, margin, gap)
    if chosen is None:
        raise RuntimeError("no acceptable prompt")
    attempt, ids, logits, margin, gap = chosen
    N = len(ids)
    assert N == P + NEW_TOKENS
    am = logits[P - 1 : N - 1].argmax(-1).tolist()
    assert am == ids[P:], (am, ids[P:])
    print(f"logits: std {float(logits.std()):.2f}, max |logit| {float(logits.abs().max()):.2f}")
    assert float(logits.std()) > 1.0 and float(logits.abs().max()) < 29.0

    experts, _ = mf.routing_stats(model, ids)
    for L, es in experts.items():
        print(f"layer {L}: {len(es)} experts used")
        assert len(es) >= 8, (L, es)

    big = Gemma4ForCausalLM(make_config(sliding_window=1000)).eval()
    big.set_experts_implementation("eager")
    big.load_state_dict(sd)
    diff = float((mf.forward_logits(big, ids) - logits).abs().max())
    print(f"max |logits(window=32) - logits(window=1000)| = {diff:.4f}")
    assert diff > 1e-2

    model.set_experts_implementation("grouped_mm")
    gd = float((mf.forward_logits(model, ids) - logits).abs().max())
    model.set_experts_implementation("eager")
    print(f"max |experts eager - experts grouped_mm| = {gd:.2e}")
    assert gd < 1e-4

    ref = mf.reference_from_doc(sd, dict(WIDE), ids).float()
    dd = float((ref - logits).abs().max())
    print(f"max |transformers f32 - docs/gemma4.md re-implementation f64| = {dd:.2e}")
    assert dd < 1e-3, dd

    outdir = os.path.join(mf.OUT, NAME)
    if os.path.isdir(outdir):
        shutil.rmtree(outdir)
    os.makedirs(outdir)
    model.to(torch.bfloat16).save_pretrained(outdir)
    model.float()
    cpath = os.path.join(outdir, "config.json")
    c = json.load(open(cpath))
    plc = c.pop("per_layer_config")
    assert {int(k): v for k, v in plc.items()} == {1: {"head_dim": 512}}, plc
    c["global_head_dim"] = WIDE["global_head_dim"]
    c["num_global_key_value_heads"] = WIDE["num_global_key_value_heads"]
    json.dump(c, open(cpath, "w"), indent=2, sort_keys=True)
    open(cpath, "a").write("\n")
    names = load_file(os.path.join(outdir, "model.safetensors")).keys()
    assert "lm_head.weight" not in names and all(n.startswith("model.") for n in names)
    mf.write_tokenizer(os.path.join(outdir, "tokenizer.json"))
    save_file({"logits": logits.contiguous()}, os.path.join(outdir, "logits.safetensors"),
              metadata={"format": "pt"})
    note = (
        f"Random wide Gemma 4 MoE, made by scripts/make_wide_fixture.py (seed {SEED}). tokens = {P} "
        f"prompt ids + {NEW_TOKENS} greedy ids from transformers generate (use_cache, do_sample=False, "
        f"no eos stop; prompt = candidate {attempt}). logits.safetensors 'logits' [N={N}, {mf.VOCAB}] "
        f"F32 = final softcapped logits of one teacher-forced forward over all N tokens, transformers "
        f"in float32 (eager) from exactly the stored weights. Greedy min top1-top2 margin {margin:.4f}; "
        f"min gap between the k-th and (k+1)-th router logit {gap:.2e}; window=32 vs window=1000 max "
        f"logit diff {diff:.3f}."
    )
    mf.write_expected(outdir, P, ids, note)

    m2 = Gemma4ForCausalLM.from_pretrained(outdir, dtype=torch.float32, attn_implementation="eager",
                                           experts_implementation="eager").eval()
    with torch.no_grad():
        rl = m2(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    rd = float((rl - logits).abs().max())
    print(f"reloaded-from-disk logits max diff {rd:.2e}")
    assert rd < 1e-5, rd
    print("\n".join(mf.tensor_listing([os.path.join(outdir, "model.safetensors")])))
    print("done")


if __name__ == "__main__":
    sys.exit(main())
