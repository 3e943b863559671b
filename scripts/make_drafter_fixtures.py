#!/usr/bin/env python3
"""Build tiny Gemma 4 drafters ("assistant" models) for tests/fixtures/tiny-text, with
transformers' expected outputs.

What it makes (each directory well under 1 MB):

  tests/fixtures/tiny-text-assistant/           use_ordered_embeddings false (plain tied LM head)
  tests/fixtures/tiny-text-assistant-ordered/   use_ordered_embeddings true (centroid-masked head)
      config.json, generation_config.json, model.safetensors   as save_pretrained writes them (bf16;
                                       masked_embedding.token_ordering I64)
      expected.json                    the drafter-logits case and the assisted generations (below)
      draft.safetensors                F32 "logits" [steps, vocab] and "hidden" [steps, backbone]

The drafter (transformers 5.24 Gemma4AssistantForCausalLM, model_type gemma4_assistant): 2 dense
layers (sliding, full) of hidden 48, 2 query heads; every layer reads the target's keys and values
(the target's last sliding layer, 2 KV heads x 32, and its last full layer, 1 KV head x 64,
attention_k_eq_v); backbone_hidden_size 64 (the target's hidden); ordered: 16 centroids of 32
tokens, the top 4 kept.

Weights: random (seeded), then 80 Adam steps (about a minute on two cores) of distillation each on the target's own greedy
continuations (cross-entropy of the drafter's logits against the target's argmax, three drafting
steps unrolled, the ordered one also on its centroids), then rounded to bf16. The references are
computed in float32 from exactly the stored values.

The drafter-logits case: the target runs tokens[:p]; the drafter, at position p, reads the target's
embedding of tokens[p] and its final hidden state at p - 1, and the shared keys and values of
positions < p; three steps, each fed its own argmax and projected hidden state, as transformers'
SinglePositionMultiTokenCandidateGenerator drafts.

The assisted generations: for each prompt and k in 1..4, greedy with the drafter (max_new_tokens
16) two ways: transformers' own generate(assistant_model=...) (its tokens, and the drafts it
accepted as transformers_accepted), and a plain loop that hands the drafter exactly the target's
keys and values of the positions before the drafting position (the runtime's semantics: accepted,
drafted, rounds). Both give the target's greedy tokens. Their acceptance may differ after a round
that rejected a draft: transformers then drafts from the cache its verification pass left, which
still holds the rejected tokens' keys (full layers: the one at the drafting position; sliding
layers: the window ending at the last verified position). See docs/decisions.md, "Speculative
decoding".

Run from the repository root (CPU, a few minutes, deterministic: seeded, a fixed step count):

    python scripts/make_drafter_fixtures.py

Versions used: torch 2.15.0, transformers 5.24.0, safetensors 0.8.0, python 3.11.7.
"""

import json
import os
import shutil
import sys
import time

import torch
import torch.nn.functional as F

import transformers
from safetensors.torch import load_file, save_file
from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4ForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures")
TARGET = os.path.join(FIX, "tiny-text")

S, Fu = "sliding_attention", "full_attention"
W = 4  # sliding window (the target's)
TRAIN_STEPS = int(os.environ.get("TRAIN_STEPS", "80"))  # about a minute each on two cores
STEPS_UNROLLED = 3
MAX_NEW = 16
PROMPTS = [
    [17, 301, 88, 5, 412, 230, 77, 150, 9, 499],
    [44, 45, 46, 200, 201, 13, 380],
    [260, 7, 7, 311, 98, 441, 52, 19, 333, 128, 64, 470],
]
DRAFT_CASE = [23, 480, 91, 6, 377, 142, 250, 18, 409, 66, 305, 120, 71]  # p = 12

torch.set_num_threads(2)


def drafter_config(ordered):
    text = dict(
        model_type="gemma4_text",
        vocab_size=512,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        global_head_dim=64,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        enable_moe_block=False,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0,
        num_kv_shared_layers=2,
        layer_types=[S, Fu],
        sliding_window=W,
        final_logit_softcapping=None,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        rope_parameters={
            S: {"rope_type": "default", "rope_theta": 10000.0},
            Fu: {"rope_type": "proportional", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25},
        },
    )
    cfg = Gemma4AssistantConfig(
        text_config=text,
        backbone_hidden_size=64,
        use_ordered_embeddings=ordered,
        num_centroids=16,
        centroid_intermediate_top_k=4,
        tie_word_embeddings=True,
    )
    cfg.get_text_config()._attn_implementation = "eager"
    cfg._attn_implementation = "eager"
    return cfg


def load_target():
    t = Gemma4ForCausalLM.from_pretrained(TARGET, dtype=torch.float32, attn_implementation="eager")
    t.config._experts_implementation = "eager"
    t.eval()
    return t


def target_states(target, ids):
    """Hidden states (final-normed), shared K/V (last sliding, last full layer) and argmax of ids [B, N]."""
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True, return_shared_kv_states=True, use_cache=False)
    kv = {k: (v[0], v[1]) for k, v in out.shared_kv_states.items()}
    return out.hidden_states[-1], kv, out.logits.argmax(-1)


def masks(q_pos, n_kv, sliding_back):
    """Additive masks [B, 1, Q, n_kv]: full sees kv < p, sliding sees p - sliding_back <= kv < p."""
    kv = torch.arange(n_kv)[None, None, :]
    p = q_pos[:, :, None]
    full = kv < p
    sl = full & (kv >= p - sliding_back)
    f = lambda m: torch.where(m, 0.0, float("-inf"))[:, None]
    return {"full_attention": f(full), "sliding_attention": f(sl)}


def drafter_step(drafter, emb, hidden, q_pos, kv, sliding_back):
    """One batched drafting step at positions q_pos [B, Q]: (lm-head logits, centroid logits or None, projected hidden)."""
    x = drafter.pre_projection(torch.cat([emb, hidden], -1))
    out = drafter.model(
        inputs_embeds=x,
        attention_mask=masks(q_pos, kv[Fu][0].shape[2], sliding_back),
        position_ids=q_pos,
        shared_kv_states=kv,
        use_cache=False,
        output_hidden_states=True,  # (keeps every query row: the shared-layers slicing is for generate)
    )
    last = out.last_hidden_state
    logits = drafter.lm_head(last)
    cent = drafter.masked_embedding.centroids(last) if drafter.masked_embedding is not None else None
    return logits, cent, drafter.post_projection(last)


def sliding_back_of(drafter, target):
    """How many positions before the query the drafter's sliding layer reads, found by comparing
    transformers' own forward (its masks) against explicit masks."""
    ids = torch.tensor([DRAFT_CASE])
    p = len(DRAFT_CASE) - 1
    h, kv, _ = target_states(target, ids[:, :p])
    emb = target.model.embed_tokens(ids[:, p : p + 1])
    with torch.no_grad():
        ref = drafter(inputs_embeds=torch.cat([emb, h[:, -1:]], -1), position_ids=torch.tensor([[p]]),
                      shared_kv_states=kv, use_cache=False).logits
        found = []
        for back in range(1, p + 1):
            lg, _, _ = drafter_step(drafter, emb, h[:, -1:], torch.tensor([[p]]), kv, back)
            if drafter.masked_embedding is None and torch.allclose(lg, ref, atol=1e-5, rtol=0):
                found.append(back)
            elif drafter.masked_embedding is not None:
                full = drafter.masked_embedding(drafter.model(
                    inputs_embeds=drafter.pre_projection(torch.cat([emb, h[:, -1:]], -1)),
                    attention_mask=masks(torch.tensor([[p]]), p, back), position_ids=torch.tensor([[p]]),
                    shared_kv_states=kv, use_cache=False, output_hidden_states=True).last_hidden_state,
                    drafter.lm_head.weight)
                if torch.allclose(full, ref, atol=1e-5, rtol=0):
                    found.append(back)
    assert len(found) == 1, found
    return found[0]


def training_data(target, n_seq=192, prompt_len=10, new=40, seed=7):
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(4, 512, (n_seq, prompt_len), generator=g)
    with torch.no_grad():
        seqs = target.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
    h, kv, am = target_states(target, seqs)
    return seqs, h, kv, am, prompt_len


def distil(drafter, target, data, steps, sliding_back, seed):
    seqs, h, kv, am, plen = data
    B, N = seqs.shape
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(drafter.parameters(), lr=1e-2)
    emb_all = target.model.embed_tokens(seqs).detach()
    ordered = drafter.masked_embedding is not None
    if ordered:
        cluster_of = torch.empty(512, dtype=torch.long)
        per = 512 // drafter.config.num_centroids
        cluster_of[drafter.masked_embedding.token_ordering] = torch.arange(512) // per
    start, it = time.time(), 0
    while it < steps:
        if it >= 0.7 * steps:
            for group in opt.param_groups:
                group["lr"] = 2e-3
        idx = torch.randint(0, B, (32,), generator=g)
        # query positions: p in [plen, N - STEPS_UNROLLED], drafting tokens plen.. (greedy ones)
        q = torch.arange(plen, N - STEPS_UNROLLED + 1)[None].expand(32, -1)
        kvb = {k: (v[0][idx], v[1][idx]) for k, v in kv.items()}
        hid = torch.gather(h[idx], 1, (q - 1)[..., None].expand(-1, -1, 64))
        loss = 0.0
        for j in range(STEPS_UNROLLED):
            tok_pos = q + j  # the token fed at step j+1 (position p + j), label: argmax at p + j
            emb = torch.gather(emb_all[idx], 1, tok_pos[..., None].expand(-1, -1, 64))
            label = torch.gather(am[idx], 1, tok_pos)
            logits, cent, hid = drafter_step(drafter, emb, hid, q, kvb, sliding_back)
            loss = loss + F.cross_entropy(logits.reshape(-1, 512), label.reshape(-1))
            if ordered:
                loss = loss + F.cross_entropy(cent.reshape(-1, cent.shape[-1]), cluster_of[label].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        it += 1
        if it % 20 == 0:
            print(f"  step {it}: loss {loss.item():.3f}", flush=True)
    print(f"  {it} steps in {time.time() - start:.0f} s, final loss {loss.item():.3f}")


def round_bf16_(model):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())


def clean_assisted(target, drafter, prompt, k, sliding_back):
    """Greedy with the drafter, the drafter reading the target's K/V of exactly the positions before
    its drafting position: (tokens, accepted, drafted, rounds)."""
    ids = list(prompt)
    P = len(prompt)
    _, _, am = target_states(target, torch.tensor([ids]))
    ids.append(int(am[0, -1]))
    accepted = drafted = rounds = 0
    while len(ids) - P < MAX_NEW:
        p = len(ids) - 1
        kk = min(k, P + MAX_NEW - len(ids) - 1)
        h, kv, _ = target_states(target, torch.tensor([ids[:p]]))
        hid = h[:, -1:]
        tok = ids[p]
        drafts = []
        with torch.no_grad():
            for _ in range(kk):
                out = drafter(inputs_embeds=torch.cat([target.model.embed_tokens(torch.tensor([[tok]])), hid], -1),
                              position_ids=torch.tensor([[p]]), shared_kv_states=kv, use_cache=False)
                tok = int(out.logits[0, -1].argmax())
                hid = out.last_hidden_state
                drafts.append(tok)
        _, _, am = target_states(target, torch.tensor([ids + drafts]))
        verdict = am[0, p:].tolist()
        n = 0
        while n < kk and drafts[n] == verdict[n]:
            n += 1
        ids += drafts[:n] + [verdict[n]]
        accepted += n
        drafted += kk
        rounds += 1
    return ids[P:], accepted, drafted, rounds


def transformers_assisted(target, drafter, prompt, k):
    drafter.generation_config.num_assistant_tokens = k
    drafter.generation_config.num_assistant_tokens_schedule = "constant"
    matches = []
    from transformers.generation import candidate_generator as cg

    orig = cg.SinglePositionMultiTokenCandidateGenerator.update_candidate_strategy

    def record(self, input_ids, scores, num_matches):
        matches.append(int(num_matches))

    cg.SinglePositionMultiTokenCandidateGenerator.update_candidate_strategy = record
    try:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=drafter,
                                  do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=None, pad_token_id=0)
    finally:
        cg.SinglePositionMultiTokenCandidateGenerator.update_candidate_strategy = orig
    # the first iteration is the target's plain step (no candidates)
    return out[0, len(prompt):].tolist(), sum(matches[1:])


def greedy(target, prompt):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW,
                              eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def draft_case(target, drafter):
    ids = torch.tensor([DRAFT_CASE])
    p = len(DRAFT_CASE) - 1
    h, kv, _ = target_states(target, ids[:, :p])
    hid, tok = h[:, -1:], DRAFT_CASE[p]
    logits, hiddens, toks = [], [], []
    with torch.no_grad():
        for _ in range(3):
            out = drafter(inputs_embeds=torch.cat([target.model.embed_tokens(torch.tensor([[tok]])), hid], -1),
                          position_ids=torch.tensor([[p]]), shared_kv_states=kv, use_cache=False)
            logits.append(out.logits[0, -1])
            hiddens.append(out.last_hidden_state[0, -1])
            hid = out.last_hidden_state
            tok = int(out.logits[0, -1].argmax())
            toks.append(tok)
    return torch.stack(logits), torch.stack(hiddens), toks


def build(name, ordered, seed, target, data):
    print(f"{name}:")
    torch.manual_seed(seed)
    cfg = drafter_config(ordered)
    drafter = Gemma4AssistantForCausalLM(cfg).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, prm in sorted(drafter.named_parameters()):
            if n.endswith("norm.weight"):
                prm.copy_(torch.empty(prm.shape).uniform_(0.5, 1.5, generator=g))
            elif n.endswith("layer_scalar"):
                prm.copy_(torch.empty(prm.shape).uniform_(0.6, 1.4, generator=g))
            else:
                prm.copy_(torch.randn(prm.shape, generator=g) * 0.1)
        for n, b in drafter.named_buffers():
            if n.endswith("layer_scalar"):
                b.copy_(torch.empty(b.shape).uniform_(0.6, 1.4, generator=g))
        if ordered:
            drafter.masked_embedding.token_ordering.copy_(torch.randperm(512, generator=g))
    back = sliding_back_of(drafter, target)
    print(f"  the drafter's sliding layer reads the {back} positions before the query (window {W})")
    drafter.train()
    distil(drafter, target, data, TRAIN_STEPS, back, seed)
    drafter.eval()
    round_bf16_(drafter)

    out = os.path.join(FIX, name)
    shutil.rmtree(out, ignore_errors=True)
    drafter.to(torch.bfloat16).save_pretrained(out)
    drafter = Gemma4AssistantForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    assert sliding_back_of(drafter, target) == back

    logits, hidden, toks = draft_case(target, drafter)
    save_file({"logits": logits.contiguous(), "hidden": hidden.contiguous()}, os.path.join(out, "draft.safetensors"))
    gens = []
    for prompt in PROMPTS:
        ref = greedy(target, prompt)
        for k in range(1, 5):
            tf_tokens, tf_acc = transformers_assisted(target, drafter, prompt, k)
            tokens, acc, drafted, rounds = clean_assisted(target, drafter, prompt, k, back)
            assert tf_tokens == ref, (tf_tokens, ref)
            assert tokens == ref, (tokens, ref)
            gens.append(dict(prompt=prompt, k=k, tokens=tokens, accepted=acc, drafted=drafted, rounds=rounds,
                             transformers_accepted=tf_acc))
            print(f"  prompt {len(prompt)} k {k}: accepted {acc}/{drafted} in {rounds} rounds "
                  f"(transformers' generate: {tf_acc})")
    expected = dict(
        draft=dict(tokens=DRAFT_CASE, position=len(DRAFT_CASE) - 1, drafted=toks, sliding_back=back),
        assisted=gens,
        max_new_tokens=MAX_NEW,
        transformers_version=transformers.__version__,
        torch_version=torch.__version__,
    )
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"  {out}: {size} bytes")


def main():
    target = load_target()
    data = training_data(target)
    build("tiny-text-assistant", False, 11, target, data)
    build("tiny-text-assistant-ordered", True, 12, target, data)


if __name__ == "__main__":
    sys.exit(main())
