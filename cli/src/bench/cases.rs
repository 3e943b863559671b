//! The bench cases: Gemma 4 26B-A4B's decode ops at their real shapes (or
//! small ones under `--quick`), what each must move, and the input sets
//! that rotate between repetitions.

use turbospark::ops::{Attention, Matmul, Moe, PostAttention, PostFfn, QkvPost, RmsNorm, Router};
use turbospark::parity::{case, Case as _, HostTensor, Op, OutSpec};
use turbospark::quant::Affine;
use turbospark::DType::{self, BF16};

/// One bench case.
pub struct Case {
    /// Short readable name (`moe_gate_up m=1`, `attn full ctx=8K m=1`).
    pub label: String,
    /// What it is in the model, for the table's notes and the plot.
    pub group: &'static str,
    pub op: Op,
    /// Tokens per call.
    pub m: usize,
    /// Why the CPU reference skips it by default (`--cpu-all` runs it).
    pub cpu_skip: Option<&'static str>,
    /// The target on the H200, in microseconds, where there is one.
    pub target_us: Option<f64>,
}

/// The sizes the cases are built from.
struct Shapes {
    hidden: usize,
    experts: usize,
    top_k: usize,
    moe_inter: usize,
    dense_inter: usize,
    vocab: usize,
    /// (heads, kv_heads, head_dim) of sliding and full layers.
    sliding: (usize, usize, usize),
    full: (usize, usize, usize),
    window: usize,
    /// Ring capacity of a sliding layer's cache.
    ring: usize,
    contexts: [usize; 3],
    ms: &'static [usize],
    /// A prefill batch (the prefill GEMM's and attn_prefill's shapes).
    prefill: usize,
}

const GEMMA4_26B_A4B: Shapes = Shapes {
    hidden: 2816,
    experts: 128,
    top_k: 8,
    moe_inter: 704,
    dense_inter: 2112,
    vocab: 262144,
    sliding: (16, 8, 256),
    full: (16, 2, 512),
    window: 1024,
    ring: 1039,
    contexts: [1024, 8192, 32768],
    // (4: a speculative verify of 3 drafted tokens, a few streams at once;
    // 8: between the GEMVs' and the small-batch GEMM's measured wins)
    ms: &[1, 4, 8, 16],
    prefill: turbospark::model::DEFAULT_PREFILL_BATCH,
};

/// The same structure, small enough for lavapipe and a debug build in CI.
const QUICK: Shapes = Shapes {
    hidden: 256,
    experts: 8,
    top_k: 2,
    moe_inter: 64,
    dense_inter: 192,
    vocab: 4096,
    sliding: (4, 2, 64),
    full: (4, 1, 128),
    window: 64,
    ring: 79,
    contexts: [64, 256, 512],
    ms: &[1, 4],
    prefill: 24,
};

fn ctx_name(c: usize) -> String {
    if c >= 1024 && c.trailing_zeros() >= 10 {
        format!("{}K", c / 1024)
    } else {
        c.to_string()
    }
}

/// Every case, in table order; the attention and qkv_post cases with KV
/// caches of `kv` (f32 or f16). With `quant`, each case that reads a
/// weight the format takes follows again with its weights quantized
/// (labelled `... q4g64`; the router at 8 bits group 64, as mlx-lm
/// writes it): the q4 target is 1/4 MoE phase 1 at 8 us.
pub fn cases(quick: bool, kv: DType, quant: Option<Affine>) -> Vec<Case> {
    let mut v = plain_cases(quick, kv);
    let Some(q) = quant else {
        return v;
    };
    let mut out = Vec::with_capacity(2 * v.len());
    for c in v.drain(..) {
        let qc = quantized(&c.op, q).map(|op| Case {
            label: format!("{} {}", c.label, q.name()),
            group: c.group,
            op,
            m: c.m,
            cpu_skip: c.cpu_skip,
            target_us: match (&c.op, c.m, quick, q.bits) {
                (Op::MoeGateUp(_), 1, false, 4) => Some(8.0),
                _ => None,
            },
        });
        out.push(c);
        out.extend(qc);
    }
    out
}

/// `op` with the weights it reads (not its norms') in format `q`, the
/// router's at 8 bits group 64; None where it reads none, or the format's
/// group does not divide its rows (mlx-lm leaves those unquantized).
fn quantized(op: &Op, q: Affine) -> Option<Op> {
    let router = Affine::new(8, 64, q.scales).ok()?;
    let fmt = |f: Affine, cols: &[usize]| {
        cols.iter()
            .all(|&c| f.fits_cols(c))
            .then_some(DType::Affine(f))
    };
    Some(match op {
        Op::Matmul(c) => Op::Matmul(case::Matmul {
            w: fmt(q, &[c.p.k])?,
            ..*c
        }),
        Op::Router(c) => Op::Router(case::Router {
            w: fmt(router, &[c.p.hidden])?,
            ..*c
        }),
        Op::MoeGateUp(c) => Op::MoeGateUp(case::MoeGateUp {
            w: fmt(q, &[c.p.hidden])?,
            ..*c
        }),
        Op::MoeDown(c) => Op::MoeDown(case::MoeDown {
            w: fmt(q, &[c.p.inter])?,
            ..*c
        }),
        Op::MoeGateUpPair(c) => Op::MoeGateUpPair(case::MoeGateUpPair {
            w: fmt(q, &[c.a.hidden, c.b.hidden])?,
            ..*c
        }),
        Op::MoeDownPair(c) => Op::MoeDownPair(case::MoeDownPair {
            w: fmt(q, &[c.a.inter, c.b.inter])?,
            ..*c
        }),
        Op::MoeDownPairPostFfn(c) => Op::MoeDownPairPostFfn(case::MoeDownPairPostFfn {
            w: fmt(q, &[c.a.inter, c.b.inter])?,
            ..*c
        }),
        Op::PostAttentionRouter(c) => Op::PostAttentionRouter(case::PostAttentionRouter {
            pw: fmt(router, &[c.r.hidden])?,
            ..*c
        }),
        Op::PostAttentionGateUp(c) => Op::PostAttentionGateUp(case::PostAttentionGateUp {
            pw: fmt(router, &[c.r.hidden])?,
            gw: fmt(q, &[c.r.hidden])?,
            ..*c
        }),
        _ => return None,
    })
}

fn plain_cases(quick: bool, kv: DType) -> Vec<Case> {
    let s = if quick { &QUICK } else { &GEMMA4_26B_A4B };
    let h = s.hidden;
    let mut v = Vec::new();
    let mut push = |label: String, group: &'static str, op: Op, m: usize| {
        v.push(Case {
            label,
            group,
            op,
            m,
            cpu_skip: None,
            target_us: None,
        });
    };
    let mm = |m, n, k| {
        Op::Matmul(case::Matmul {
            p: Matmul {
                m,
                n,
                k,
                precision: turbospark::Precision::Exact,
            },
            w: BF16,
        })
    };
    for &m in s.ms {
        push(
            format!("rms_norm m={m}"),
            "norm",
            Op::RmsNorm(case::RmsNorm {
                p: RmsNorm {
                    rows: m,
                    dim: h,
                    eps: 1e-6,
                    scale: 1.0,
                },
                weight: Some(BF16),
                residual: false,
            }),
            m,
        );
        push(format!("router m={m}"), "moe", router(s, m), m);
        let moe = routed(s, m);
        push(
            format!("moe_gate_up m={m}"),
            "moe",
            Op::MoeGateUp(case::MoeGateUp { p: moe, w: BF16 }),
            m,
        );
        push(
            format!("moe_down m={m}"),
            "moe",
            Op::MoeDown(case::MoeDown { p: moe, w: BF16 }),
            m,
        );
        if m == 1 {
            // What decode runs: the dense MLP (a one-expert MoE) and the
            // routed experts in one launch per phase.
            let dense = Moe {
                m,
                hidden: h,
                inter: s.dense_inter,
                experts: 1,
                top_k: 1,
                precision: turbospark::Precision::Exact,
            };
            push(
                format!("dense+moe gate_up pair m={m}"),
                "moe",
                Op::MoeGateUpPair(case::MoeGateUpPair {
                    a: dense,
                    b: moe,
                    w: BF16,
                }),
                m,
            );
            push(
                format!("dense+moe down pair m={m}"),
                "moe",
                Op::MoeDownPair(case::MoeDownPair {
                    a: dense,
                    b: moe,
                    w: BF16,
                }),
                m,
            );
            // The pair with the post_ffn after it, as decode calls it (one
            // launch where the device takes tails).
            push(
                format!("down pair+post_ffn m={m}"),
                "moe",
                Op::MoeDownPairPostFfn(case::MoeDownPairPostFfn {
                    a: dense,
                    b: moe,
                    w: BF16,
                    p: PostFfn {
                        rows: m,
                        dim: h,
                        eps: 1e-6,
                        scale: 1.0,
                    },
                    next: true,
                    nw: BF16,
                }),
                m,
            );
        }
        push(
            format!("dense gate|up m={m}"),
            "dense mlp",
            mm(m, 2 * s.dense_inter, h),
            m,
        );
        push(
            format!("dense gelu_mul m={m}"),
            "dense mlp",
            Op::GeluMul(case::GeluMul {
                rows: m,
                n: s.dense_inter,
            }),
            m,
        );
        push(
            format!("dense down m={m}"),
            "dense mlp",
            mm(m, h, s.dense_inter),
            m,
        );
        let (sh, skv, sd) = s.sliding;
        push(
            format!("q_proj sliding m={m}"),
            "attn proj",
            mm(m, sh * sd, h),
            m,
        );
        push(
            format!("k_proj sliding m={m}"),
            "attn proj",
            mm(m, skv * sd, h),
            m,
        );
        push(
            format!("v_proj sliding m={m}"),
            "attn proj",
            mm(m, skv * sd, h),
            m,
        );
        // (decode's launch: the three in one GEMV, as the decoder runs them)
        push(
            format!("q|k|v sliding m={m}"),
            "attn proj",
            mm(m, (sh + 2 * skv) * sd, h),
            m,
        );
        push(
            format!("o_proj sliding m={m}"),
            "attn proj",
            mm(m, h, sh * sd),
            m,
        );
        let (fh, fkv, fd) = s.full;
        push(
            format!("q_proj full m={m}"),
            "attn proj",
            mm(m, fh * fd, h),
            m,
        );
        // Full layers have no v_proj: v is k_proj's output (attention_k_eq_v).
        push(
            format!("k_proj full (=v) m={m}"),
            "attn proj",
            mm(m, fkv * fd, h),
            m,
        );
        push(
            format!("q|k (=v) full m={m}"),
            "attn proj",
            mm(m, (fh + fkv) * fd, h),
            m,
        );
        push(
            format!("o_proj full m={m}"),
            "attn proj",
            mm(m, h, fh * fd),
            m,
        );
        for &ctx in &s.contexts {
            let sliding = Attention {
                m,
                heads: sh,
                kv_heads: skv,
                head_dim: sd,
                capacity: s.ring,
                window: s.window,
                scale: 1.0,
                precision: turbospark::Precision::Exact,
            };
            push(
                format!("attn sliding ctx={} m={m}", ctx_name(ctx)),
                "attention",
                Op::attention(sliding, ctx - m).with_kv(kv),
                m,
            );
        }
        for &ctx in &s.contexts {
            let full = Attention {
                m,
                heads: fh,
                kv_heads: fkv,
                head_dim: fd,
                capacity: ctx,
                window: 0,
                scale: 1.0,
                precision: turbospark::Precision::Exact,
            };
            push(
                format!("attn full ctx={} m={m}", ctx_name(ctx)),
                "attention",
                Op::attention(full, ctx - m).with_kv(kv),
                m,
            );
        }
        // The fused steps between the GEMVs (the decoder's "glue").
        let qkv = |heads, kv_heads, head_dim, rot_pairs, theta, capacity, v_from_k| {
            Op::QkvPost(case::QkvPost {
                p: QkvPost {
                    m,
                    heads,
                    kv_heads,
                    head_dim,
                    rot_pairs,
                    theta,
                    eps: 1e-6,
                    capacity,
                    v_from_k,
                },
                pos0: s.ring + 3,
                w: BF16,
                kv,
            })
        };
        push(
            format!("qkv_post sliding m={m}"),
            "glue",
            qkv(sh, skv, sd, sd / 2, 10_000.0, s.ring, false),
            m,
        );
        // Full layers: partial RoPE (a quarter of the dims), V from raw K.
        let ctx = s.contexts[1];
        push(
            format!("qkv_post full m={m}"),
            "glue",
            qkv(fh, fkv, fd, fd / 8, 1_000_000.0, ctx, true),
            m,
        );
        // Both in one op (decode: one launch and the combine on a GPU), at
        // the attention cases' first and middle contexts.
        let fused = |q: Op, window, ctx: usize| match q {
            Op::QkvPost(case::QkvPost { p, w, kv, .. }) => {
                Op::QkvPostAttention(case::QkvPostAttention {
                    p,
                    window,
                    pos0: ctx - m,
                    w,
                    precision: turbospark::Precision::Exact,
                    kv,
                })
            }
            other => other,
        };
        push(
            format!(
                "qkv_post+attn sliding ctx={} m={m}",
                ctx_name(s.contexts[0])
            ),
            "attention",
            fused(
                qkv(sh, skv, sd, sd / 2, 10_000.0, s.ring, false),
                s.window,
                s.contexts[0],
            ),
            m,
        );
        push(
            format!("qkv_post+attn full ctx={} m={m}", ctx_name(ctx)),
            "attention",
            fused(qkv(fh, fkv, fd, fd / 8, 1_000_000.0, ctx, true), 0, ctx),
            m,
        );
        push(
            format!("post_attention m={m}"),
            "glue",
            Op::PostAttention(case::PostAttention {
                p: PostAttention {
                    rows: m,
                    dim: h,
                    eps: 1e-6,
                },
                moe: true,
                w: BF16,
            }),
            m,
        );
        if m == 1 {
            // What decode runs from o_proj's output to both branches'
            // activations: post_attention with the router's logits in one
            // launch, then the gate_up pair picking the experts itself (two
            // launches), beside the pair alone above (its experts given).
            let (pa, router) = (
                PostAttention {
                    rows: m,
                    dim: h,
                    eps: 1e-6,
                },
                Router {
                    m,
                    hidden: h,
                    experts: s.experts,
                    top_k: s.top_k,
                    eps: 1e-6,
                },
            );
            push(
                format!("post_attention+router+gate_up pair m={m}"),
                "moe",
                Op::PostAttentionGateUp(case::PostAttentionGateUp {
                    p: pa,
                    r: router,
                    inter: s.dense_inter,
                    moe_inter: s.moe_inter,
                    w: BF16,
                    pw: BF16,
                    gw: BF16,
                }),
                m,
            );
        }
        push(
            format!("post_ffn m={m}"),
            "glue",
            Op::PostFfn(case::PostFfn {
                p: PostFfn {
                    rows: m,
                    dim: h,
                    eps: 1e-6,
                    scale: 1.0,
                },
                moe: true,
                next: true,
                w: BF16,
            }),
            m,
        );
        push(format!("lm_head m={m}"), "lm head", mm(m, s.vocab, h), m);
        push(
            format!("softcap logits m={m}"),
            "lm head",
            Op::Softcap(case::Softcap {
                n: m * s.vocab,
                cap: 30.0,
            }),
            m,
        );
        push(
            format!("argmax logits m={m}"),
            "lm head",
            Op::Argmax(case::Argmax {
                rows: m,
                n: s.vocab,
            }),
            m,
        );
    }
    prefill_cases(s, kv, &mut push);
    if !quick {
        for c in &mut v {
            match (&c.op, c.m) {
                (Op::MoeGateUp(_), 1) => c.target_us = Some(17.0),
                (Op::MoeDown(_), 1) => c.target_us = Some(9.0),
                (Op::Matmul(mm), 16) if mm.p.n == s.vocab => {
                    c.cpu_skip = Some("about a minute per call on the CPU reference")
                }
                (Op::Attention(a), 16) if a.p.window == 0 && a.p.capacity >= 32768 => {
                    c.cpu_skip = Some("tens of seconds per call on the CPU reference")
                }
                (_, m) if m == s.prefill => {
                    c.cpu_skip = Some("a prefill batch: minutes per call on the CPU reference")
                }
                _ => {}
            }
        }
    }
    v
}

/// The router over `m` tokens at shape `s`.
fn router(s: &Shapes, m: usize) -> Op {
    Op::Router(case::Router {
        p: Router {
            m,
            hidden: s.hidden,
            experts: s.experts,
            top_k: s.top_k,
            eps: 1e-6,
        },
        w: BF16,
    })
}

/// The routed experts over `m` tokens at shape `s`.
fn routed(s: &Shapes, m: usize) -> Moe {
    Moe {
        m,
        hidden: s.hidden,
        inter: s.moe_inter,
        experts: s.experts,
        top_k: s.top_k,
        precision: turbospark::Precision::Exact,
    }
}

/// One prefill batch of the prompt's start through the ops that take a
/// batch (the prefill GEMM, attn_prefill, the router's GEMM path): compute-
/// bound, so read the median, not the GB/s.
fn prefill_cases(s: &Shapes, kv: DType, push: &mut impl FnMut(String, &'static str, Op, usize)) {
    let (m, h) = (s.prefill, s.hidden);
    let mm = |n, k| {
        Op::Matmul(case::Matmul {
            p: Matmul {
                m,
                n,
                k,
                precision: turbospark::Precision::Exact,
            },
            w: BF16,
        })
    };
    let moe = routed(s, m);
    let (sh, skv, sd) = s.sliding;
    let (fh, fkv, fd) = s.full;
    let cases = [
        ("router", "moe", router(s, m)),
        (
            "moe_gate_up",
            "moe",
            Op::MoeGateUp(case::MoeGateUp { p: moe, w: BF16 }),
        ),
        (
            "moe_down",
            "moe",
            Op::MoeDown(case::MoeDown { p: moe, w: BF16 }),
        ),
        ("dense gate|up", "dense mlp", mm(2 * s.dense_inter, h)),
        ("dense down", "dense mlp", mm(h, s.dense_inter)),
        ("q|k|v sliding", "attn proj", mm((sh + 2 * skv) * sd, h)),
        ("o_proj full", "attn proj", mm(h, fh * fd)),
        (
            "attn sliding from 0",
            "attention",
            Op::attention(
                Attention {
                    m,
                    heads: sh,
                    kv_heads: skv,
                    head_dim: sd,
                    capacity: s.window + m - 1,
                    window: s.window,
                    scale: 1.0,
                    precision: turbospark::Precision::Exact,
                },
                0,
            )
            .with_kv(kv),
        ),
        (
            "attn full from 0",
            "attention",
            Op::attention(
                Attention {
                    m,
                    heads: fh,
                    kv_heads: fkv,
                    head_dim: fd,
                    capacity: m,
                    window: 0,
                    scale: 1.0,
                    precision: turbospark::Precision::Exact,
                },
                0,
            )
            .with_kv(kv),
        ),
    ];
    for (name, group, op) in cases {
        push(format!("{name} m={m}"), group, op, m);
    }
}

/// How input `i` of a rotation set other than the first is made.
#[derive(Clone, Debug)]
pub enum Variant {
    /// The first set's device buffer, shared (a tensor larger than any cache).
    Share,
    /// A fresh device buffer holding the first set's data.
    Copy,
    /// A fresh device buffer holding other data (MoE: other experts).
    Replace(HostTensor),
}

/// Inputs of a case: the first set, and how the other sets differ.
pub struct HostSets {
    pub first: Vec<HostTensor>,
    /// One entry per further set, one `Variant` per input.
    pub others: Vec<Vec<Variant>>,
    pub bytes: u64,
}

/// Inputs for `op`, rotated over enough sets that one pass over them all is
/// at least `target` bytes (at most `max_sets`). A tensor over half the
/// target is shared by every set; MoE sets shift the expert ids so each set
/// selects other experts of the shared weights.
pub fn host_sets(op: &Op, seed: u64, target: u64, max_sets: usize) -> HostSets {
    let first = op.inputs(&mut turbospark::rng::Rng::new(seed));
    let bytes = op.bytes(&first);
    let shared: Vec<bool> = first.iter().map(|t| t.bytes() > target / 2).collect();
    let out_bytes: u64 = op
        .outputs()
        .iter()
        .map(|o| match o {
            OutSpec::F32(n) | OutSpec::U32(n) => *n as u64 * 4,
            OutSpec::InPlace(..) => 0,
        })
        .sum();
    let rotating: u64 = first
        .iter()
        .zip(&shared)
        .filter(|(_, s)| !**s)
        .map(|(t, _)| t.bytes())
        .sum::<u64>()
        + out_bytes;
    // Data a call touches per set: what rotates, plus (MoE) the selected experts.
    // Expert-id inputs (index, expert count): each set shifts them.
    let id_inputs: Vec<(usize, u32)> = match op {
        Op::MoeGateUp(case::MoeGateUp { p, .. }) | Op::MoeDown(case::MoeDown { p, .. }) => {
            vec![(2, p.experts as u32)]
        }
        Op::MoeGateUpPair(c) => vec![(2, c.a.experts as u32), (5, c.b.experts as u32)],
        Op::MoeDownPair(case::MoeDownPair { a, b, .. })
        | Op::MoeDownPairPostFfn(case::MoeDownPairPostFfn { a, b, .. }) => {
            vec![(2, a.experts as u32), (6, b.experts as u32)]
        }
        _ => vec![],
    };
    let per_set = if id_inputs.is_empty() {
        rotating
    } else {
        rotating.max(bytes)
    };
    let sets = (target.div_ceil(per_set.max(1)) as usize).clamp(1, max_sets.max(1));
    let others = (1..sets)
        .map(|s| {
            first
                .iter()
                .enumerate()
                .map(
                    |(i, t)| match (id_inputs.iter().find(|(k, _)| *k == i), t) {
                        (Some(&(_, e)), HostTensor::U32(ids)) => {
                            // A bijection on expert ids keeps each token's ids distinct.
                            let shift = (s as u32 * (e / sets as u32).max(1)) % e;
                            Variant::Replace(HostTensor::U32(
                                ids.iter().map(|id| (id + shift) % e).collect(),
                            ))
                        }
                        _ if shared[i] => Variant::Share,
                        // The routed ops pick their experts from o_proj's
                        // row: rotated, each set routes to other experts.
                        (_, HostTensor::F32(o)) if i == 0 && routes(op) => {
                            let mut o = o.clone();
                            let n = o.len().max(1);
                            o.rotate_left(s * 7919 % n);
                            Variant::Replace(HostTensor::F32(o))
                        }
                        _ => Variant::Copy,
                    },
                )
                .collect()
        })
        .collect();
    HostSets {
        first,
        others,
        bytes,
    }
}

/// Whether `op` routes its token from its first input (o_proj's row).
fn routes(op: &Op) -> bool {
    matches!(op, Op::PostAttentionGateUp(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flops_count_products_and_causal_keys() {
        let mm = Op::Matmul(case::Matmul {
            p: Matmul {
                m: 3,
                n: 5,
                k: 7,
                precision: turbospark::Precision::Exact,
            },
            w: BF16,
        });
        assert_eq!(mm.flops(), Some(2 * 3 * 5 * 7));
        // Rows at positions 0, 1, 2 see 1, 2 and 2 keys (window 2): 5 keys.
        let attn = Op::attention(
            Attention {
                m: 3,
                heads: 4,
                kv_heads: 2,
                head_dim: 8,
                capacity: 4,
                window: 2,
                scale: 1.0,
                precision: turbospark::Precision::Exact,
            },
            0,
        );
        assert_eq!(attn.flops(), Some(2 * 2 * 5 * 4 * 8));
        // qkv_post then attention: the attention's products.
        let fused = Op::QkvPostAttention(case::QkvPostAttention {
            p: QkvPost {
                m: 3,
                heads: 4,
                kv_heads: 2,
                head_dim: 8,
                rot_pairs: 4,
                theta: 10_000.0,
                eps: 1e-6,
                capacity: 4,
                v_from_k: false,
            },
            window: 2,
            pos0: 0,
            w: BF16,
            kv: DType::F32,
            precision: turbospark::Precision::Exact,
        });
        assert_eq!(fused.flops(), attn.flops());
        assert_eq!(Op::GeluMul(case::GeluMul { rows: 1, n: 4 }).flops(), None);
    }

    #[test]
    fn routed_gate_up_counts_the_picked_experts_only() {
        let (experts, top_k, hidden, moe_inter) = (16, 4, 64, 24);
        let op = Op::PostAttentionGateUp(case::PostAttentionGateUp {
            p: PostAttention {
                rows: 1,
                dim: hidden,
                eps: 1e-6,
            },
            r: Router {
                m: 1,
                hidden,
                experts,
                top_k,
                eps: 1e-6,
            },
            inter: 32,
            moe_inter,
            w: BF16,
            pw: BF16,
            gw: BF16,
        });
        let inputs = op.inputs(&mut turbospark::rng::Rng::new(7));
        let all: u64 = inputs.iter().map(HostTensor::bytes).sum::<u64>()
            + op.outputs().iter().map(OutSpec::bytes).sum::<u64>();
        let stack = inputs.last().unwrap().bytes();
        assert_eq!(stack, (experts * 2 * moe_inter * hidden * 2) as u64);
        // Of the stack's 16 experts, the 4 picked.
        assert_eq!(op.bytes(&inputs), all - stack / 4 * 3);
        // The sets rotate o_proj's row (other experts), nothing else.
        let sets = host_sets(&op, 1, 1 << 20, 3);
        assert!(sets
            .others
            .iter()
            .all(|set| matches!(set[0], Variant::Replace(_))
                && set[1..].iter().all(|v| !matches!(v, Variant::Replace(_)))));
    }
}
