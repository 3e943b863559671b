//! The quantized-weight families: every op that reads a weight, with MLX
//! affine weights of each bits x group mlx writes (`quant::BITS` x
//! `quant::GROUPS`), at Gemma 4 26B-A4B's decode shapes in mlx-community's
//! formats (4-bit group 64, the router at 8-bit group 64) and small odd
//! ones. The limits are the plain weights' (`Case::limit`): a dequantised
//! weight is exact in f32 on both sides.

use super::{case, Op};
use crate::ops::{Embed, Matmul, Moe, PostAttention, PostFfn, Router};
use crate::quant::{Affine, ScaleType, BITS, GROUPS};
use crate::DType;
use crate::DType::{BF16, F32};

const EPS: f32 = 1e-6;

fn q(bits: u8, group: u16) -> DType {
    DType::Affine(Affine {
        bits,
        group,
        scales: ScaleType::BF16,
    })
}

/// Every (bits, group) mlx writes, in a fixed order.
fn formats() -> impl Iterator<Item = (u8, u16)> {
    BITS.into_iter()
        .flat_map(|b| GROUPS.into_iter().map(move |g| (b, g)))
}

fn matmul(full: bool) -> Vec<Op> {
    let c = |m, n, k, w| {
        Op::Matmul(case::Matmul {
            p: Matmul {
                m,
                n,
                k,
                precision: crate::Precision::Exact,
            },
            w,
        })
    };
    // Every format at one of the M the decoder uses (decode, micro-batches,
    // a prefill batch), rows not a multiple of any workgroup's.
    let ms = [1, 2, 5, 16, 20];
    let mut v: Vec<Op> = formats()
        .enumerate()
        .map(|(i, (b, g))| c(ms[i % ms.len()], 67 + 13 * i, 384, q(b, g)))
        .collect();
    v.extend([
        c(1, 2 * 2112, 2816, q(4, 64)), // dense gate|up
        c(1, 2816, 2112, q(4, 64)),     // dense down
        c(16, 2816, 2112, q(8, 64)),    // dense down, micro-batch
        c(1, 16 * 256, 2816, q(4, 64)), // q_proj, sliding
        c(2, 2816, 16 * 512, q(4, 32)), // o_proj, full
        c(1, 300, 8192, q(4, 32)),      // one-row teams of 256 lanes
        c(1, 1000, 8192, q(8, 128)),    // 8 bits, one-row teams of 128
        c(40, 131, 256, q(5, 32)),      // a prefill batch, partial blocks
        c(
            3,
            77,
            128,
            DType::Affine(Affine::new(6, 64, ScaleType::F32).unwrap()),
        ),
        c(
            2,
            45,
            256,
            DType::Affine(Affine::new(3, 128, ScaleType::F16).unwrap()),
        ),
    ]);
    // Every format at a prefill batch (the tiled GEMMs' loaders: values
    // across word edges at 3, 5 and 6 bits, a group's scale every 32-128),
    // then 4 bits over several row blocks and k steps.
    v.extend(
        formats()
            .enumerate()
            .map(|(i, (b, g))| c(17 + 3 * i, 40 + 7 * i, 256, q(b, g))),
    );
    v.push(c(33, 300, 1024, q(4, 64)));
    v.push(c(
        24,
        70,
        384,
        DType::Affine(Affine::new(4, 64, ScaleType::F16).unwrap()),
    ));
    if full {
        v.push(c(1, 262144, 2816, q(4, 64))); // tied LM head
        v.push(c(80, 1408, 2816, q(4, 64))); // dense gate|up, a prefill batch
    }
    v
}

fn router() -> Vec<Op> {
    let c = |m, experts, top_k, hidden, w| {
        Op::Router(case::Router {
            p: Router {
                m,
                hidden,
                experts,
                top_k,
                eps: EPS,
            },
            w,
        })
    };
    vec![
        c(1, 128, 8, 2816, q(8, 64)), // mlx-lm's router
        c(16, 128, 8, 2816, q(8, 64)),
        c(40, 37, 3, 256, q(4, 32)), // a prefill batch
        c(2, 9, 2, 384, q(3, 128)),
    ]
}

fn moe(full: bool) -> Vec<Op> {
    let mut shapes = vec![
        (1, 9, 8, 2816, 704, q(4, 64)),
        (16, 16, 8, 1024, 704, q(4, 64)),
        (5, 7, 3, 256, 64, q(8, 32)),
        (2, 4, 2, 128, 96, q(6, 32)),
        (17, 6, 3, 384, 128, q(2, 128)), // route lists past 16 tokens
        (40, 6, 3, 64, 32, q(5, 32)),    // a prefill batch
        (1, 5, 3, 96, 32, q(3, 32)),
    ];
    // prefill batches at 4 bits (several token tiles an expert), at 8 bits
    shapes.push((64, 8, 4, 512, 256, q(4, 64)));
    shapes.push((24, 5, 2, 256, 96, q(8, 32)));
    if full {
        shapes.push((1, 128, 8, 2816, 704, q(4, 64)));
        shapes.push((128, 32, 8, 2816, 704, q(4, 64)));
    }
    let mut v = Vec::new();
    for (m, experts, top_k, hidden, inter, w) in shapes {
        let p = Moe {
            m,
            hidden,
            inter,
            experts,
            top_k,
            precision: crate::Precision::Exact,
        };
        v.push(Op::MoeGateUp(case::MoeGateUp { p, w }));
        v.push(Op::MoeDown(case::MoeDown { p, w }));
    }
    v
}

/// Decode's pair ops: the dense MLP beside the routed experts, each at its
/// own format (a mixed checkpoint may hold the dense MLP at 8 bits).
fn moe_pair() -> Vec<Op> {
    let moe = |m, experts, top_k, hidden, inter| Moe {
        m,
        hidden,
        inter,
        experts,
        top_k,
        precision: crate::Precision::Exact,
    };
    let mut v = Vec::new();
    // Every format as one launch (kernels/affine_pair.wgsl): the two
    // problems differ in inter (the down pair's reduced dimension, KU) and
    // top-k, hidden a multiple of every group.
    for (b, g) in formats() {
        let (a, r) = (moe(1, 1, 1, 256, 384), moe(1, 5, 3, 256, 128));
        v.push(Op::MoeGateUpPair(case::MoeGateUpPair {
            a,
            b: r,
            w: q(b, g),
        }));
        v.push(Op::MoeDownPair(case::MoeDownPair {
            a,
            b: r,
            w: q(b, g),
        }));
    }
    for (i, (a, b, w)) in [
        // the 26B-A4B's decode layer (9 of its 128 experts)
        (moe(1, 1, 1, 2816, 2112), moe(1, 9, 8, 2816, 704), q(4, 64)),
        (moe(1, 1, 1, 256, 128), moe(1, 6, 3, 256, 64), q(4, 64)),
        (moe(1, 1, 1, 128, 64), moe(1, 5, 2, 128, 32), q(8, 32)),
        (moe(2, 1, 1, 64, 32), moe(2, 4, 2, 64, 32), q(4, 32)),
        // a micro-batch of 16 tokens, as one launch too
        (moe(16, 1, 1, 256, 192), moe(16, 7, 4, 256, 64), q(6, 64)),
    ]
    .into_iter()
    .enumerate()
    {
        v.push(Op::MoeGateUpPair(case::MoeGateUpPair { a, b, w }));
        v.push(Op::MoeDownPair(case::MoeDownPair { a, b, w }));
        v.push(Op::MoeDownPairPostFfn(case::MoeDownPairPostFfn {
            a,
            b,
            w,
            p: PostFfn {
                rows: a.m,
                dim: a.hidden,
                eps: EPS,
                scale: 0.75,
            },
            next: i % 2 == 0,
            nw: [BF16, F32][i % 2],
        }));
    }
    v
}

fn embed() -> Vec<Op> {
    let c = |m, hidden, vocab, scale, w| {
        Op::Embed(case::Embed {
            p: Embed {
                m,
                hidden,
                vocab,
                scale,
            },
            w,
        })
    };
    vec![
        c(5, 2816, 3001, 53.0, q(4, 64)),
        c(1, 256, 512, 16.0, q(6, 64)),
        c(3, 96, 77, 5.75, q(3, 32)),
    ]
}

/// The fused decode ops with a quantized router or experts.
fn fused() -> Vec<Op> {
    let pa = |dim| PostAttention {
        rows: 1,
        dim,
        eps: EPS,
    };
    let r = |dim, experts, top_k| Router {
        m: 1,
        hidden: dim,
        experts,
        top_k,
        eps: EPS,
    };
    vec![
        Op::PostAttentionRouter(case::PostAttentionRouter {
            p: pa(2816),
            r: r(2816, 128, 8),
            w: BF16,
            pw: q(8, 64),
        }),
        Op::PostAttentionGateUp(case::PostAttentionGateUp {
            p: pa(256),
            r: r(256, 16, 4),
            inter: 96,
            moe_inter: 64,
            w: BF16,
            pw: q(8, 64),
            gw: q(4, 64),
        }),
        // a plain router beside quantized experts
        Op::PostAttentionGateUp(case::PostAttentionGateUp {
            p: pa(128),
            r: r(128, 6, 2),
            inter: 64,
            moe_inter: 32,
            w: BF16,
            pw: BF16,
            gw: q(4, 32),
        }),
        // streamed 4-bit experts: 8 slots of 16, the lookup in the pair
        Op::PostAttentionGateUpSlots(case::PostAttentionGateUpSlots {
            g: case::PostAttentionGateUp {
                p: pa(256),
                r: r(256, 16, 4),
                inter: 96,
                moe_inter: 64,
                w: BF16,
                pw: q(8, 64),
                gw: q(4, 64),
            },
            slots: 8,
            at: 4,
        }),
    ]
}

/// Every quantized case.
pub fn cases(full: bool) -> Vec<Op> {
    [
        matmul(full),
        router(),
        moe(full),
        moe_pair(),
        embed(),
        fused(),
    ]
    .concat()
}
