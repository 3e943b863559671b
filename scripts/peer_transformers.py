"""The peer a user would otherwise pick: transformers' own Gemma4ForCausalLM at
the Gemma 4 26B-A4B shape, random bf16 weights on CUDA, timed on prefill (a
512-token prompt) and greedy decode, for BENCHMARKS.md beside turbospark's
`bench --synthetic gemma-4-26b-a4b` on the same GPU.

    python3 scripts/peer_transformers.py --json OUT.json [--prompt 512] [--decode 64]

Attention: SDPA (the best implementation transformers ships without extra
packages); experts: transformers' default experts implementation (grouped
matmul) unless --experts names another.
"""

import argparse
import json
import time

import torch
import transformers
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

S, F = "sliding_attention", "full_attention"


def config(experts):
    layer_types = [F if (i + 1) % 6 == 0 else S for i in range(30)]
    cfg = Gemma4TextConfig(
        vocab_size=262144,
        hidden_size=2816,
        intermediate_size=2112,
        num_hidden_layers=30,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=256,
        global_head_dim=512,
        num_global_key_value_heads=2,
        attention_k_eq_v=True,
        enable_moe_block=True,
        num_experts=128,
        top_k_experts=8,
        moe_intermediate_size=704,
        hidden_size_per_layer_input=0,
        sliding_window=1024,
        final_logit_softcapping=30.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        layer_types=layer_types,
        rope_parameters={
            S: {"rope_type": "default", "rope_theta": 10000.0},
            F: {"rope_type": "proportional", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25},
        },
    )
    cfg._attn_implementation = "sdpa"
    if experts:
        cfg._experts_implementation = experts
    return cfg


def sync_time(f):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = f()
    torch.cuda.synchronize()
    return time.perf_counter() - t, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--experts", default=None)
    a = ap.parse_args()
    res = {"transformers": transformers.__version__, "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    torch.manual_seed(0)
    t = time.perf_counter()
    with torch.device("cuda"):
        model = Gemma4ForCausalLM(config(a.experts)).to(torch.bfloat16).eval()
    res["load_seconds"] = time.perf_counter() - t
    res["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
    res["attn_implementation"] = model.config._attn_implementation
    ids = torch.randint(4, 262144, (1, a.prompt), device="cuda")
    with torch.inference_mode():
        # warm-up
        model.generate(ids[:, :32], max_new_tokens=4, min_new_tokens=4, do_sample=False)
        pre = []
        for _ in range(3):
            s, _ = sync_time(lambda: model(ids, use_cache=True))
            pre.append(s)
        res["prefill_seconds"] = sorted(pre)[1]
        res["prefill_tok_s"] = a.prompt / res["prefill_seconds"]
        n = a.decode + 1
        s, _ = sync_time(lambda: model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False))
        res["generate_seconds"] = s
        res["decode_tok_s"] = a.decode / max(s - res["prefill_seconds"], 1e-9)
    res["note"] = "decode tok/s = decoded tokens / (generate time - prefill time); median of 3 prefills"
    print(json.dumps(res, indent=1))
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
