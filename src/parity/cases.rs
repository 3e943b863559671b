//! The case lists: one family of cases per op. Shapes come from Gemma 4
//! 26B-A4B (hidden 2816, dense inter 2112, 128 experts top-8 at 704, head_dim
//! 256 sliding / 512 full), with fewer experts or keys where a CI run on
//! lavapipe needs it, plus odd sizes that are not multiples of any
//! workgroup width, and M in {1, 2, 5, 16} and prefill batches past 16 (the GEMM).

use super::{case, Op};
use crate::ops::{
    Attention, CopyRange, Embed, KvAppend, Matmul, Moe, PostAttention, PostFfn, QkvPost, RmsNorm,
    Rope, Router, SlotLookup,
};
use crate::DType::{BF16, F16, F32};

const EPS: f32 = 1e-6;

fn rms_norm() -> Vec<Op> {
    let c = |rows, dim, weight, residual, scale| {
        Op::RmsNorm(case::RmsNorm {
            p: RmsNorm {
                rows,
                dim,
                eps: EPS,
                scale,
            },
            weight,
            residual,
        })
    };
    vec![
        c(1, 2816, Some(BF16), false, 1.0),
        c(5, 2816, Some(F32), true, 0.7),
        c(16 * 16, 256, Some(BF16), false, 1.0), // q_norm over a micro-batch
        c(2 * 2, 512, None, false, 1.0),         // v_norm, full layer
        c(3, 1001, Some(F16), true, 1.3),
    ]
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
    let mut v = vec![
        c(1, 2 * 2112, 2816, BF16), // dense gate|up
        c(1, 1003, 72, F16),        // decode GEMV path, odd rows, few blocks
        c(1, 77, 1536, BF16),       // decode GEMV, 64 lanes a row
        c(1, 45, 8200, F16),        // decode GEMV, 64 lanes, many loads a lane, a short last pass
        c(1, 4099, 64, BF16),       // decode GEMV past the short rows: 32 lanes
        c(1, 2816, 2112, BF16),     // dense down: a partial last column of blocks
        c(3, 131, 64, F16),         // gemv_rows, one weight row per 64 lanes
        c(2, 4097, 64, BF16),       // gemv_rows, four per 32 lanes, a last group of one
        c(13, 2048, 72, F16), // gemv_rows, four per 64 lanes, x rows in a partial group of four
        c(9, 2051, 64, BF16), // gemv_rows, four per 32 lanes, a last group of three
        c(1, 24001, 2816, BF16), // decode GEMV over a weight split across bindings
        c(16, 2816, 2112, BF16), // dense down, micro-batch
        c(1, 16 * 256, 2816, BF16), // q_proj, sliding
        c(2, 2816, 16 * 512, BF16), // o_proj, full
        c(5, 1001, 777, F16),
        c(2, 333, 129, F32),
        c(3, 130, 257, BF16),   // odd k, 16-bit: rows start mid-word
        c(20, 67, 98, BF16),    // m over 16, k not a multiple of 8: x rows in blocks
        c(20, 67, 96, BF16),    // prefill GEMM: one partial tile each way
        c(40, 200, 96, F16),    // GEMM, a partial second row block
        c(70, 131, 264, BF16),  // GEMM, two token tiles, a partial last k step
        c(520, 4097, 40, BF16), // GEMM, enough tiles for the wide tile (the others take the narrow one)
        // k % 32 == 0 with enough tiles for the tensor-core GEMM's 64 x 256
        // tile (x staged; partial last tiles both ways)
        c(1040, 3841, 64, BF16),
        c(40, 64, 1024, BF16), // GEMM split over k (one output tile)
        c(24, 96, 1000, F16),  // split k, a short last split
        c(21, 37, 2816, BF16), // split k, an odd-sized partial plane
        // split k on tensor cores too (k % 32 == 0): two token tiles, three
        // row blocks, a shorter last split
        c(100, 384, 4000, BF16),
        // Larger than lavapipe's 128 MiB binding: split across bindings.
        c(2, 24001, 2816, BF16),
    ];
    if full {
        v.push(c(1, 262144, 2816, BF16)); // tied LM head
        v.push(c(16, 262144, 2816, BF16));
    }
    v
}

fn router(full: bool) -> Vec<Op> {
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
    let mut v = vec![
        c(1, 128, 8, 2816, BF16),
        c(16, 128, 8, 2816, BF16),
        c(5, 37, 3, 1001, F32),
        c(2, 256, 8, 512, F16),
        // prefill batches: x * eff_scale, then the GEMM
        c(40, 37, 3, 64, BF16),
        c(20, 128, 8, 256, F16),
    ];
    if full {
        v.push(c(2, 128, 8, 2816, BF16));
    }
    v
}

fn moe(full: bool) -> Vec<Op> {
    let shapes = {
        let mut s = vec![
            (1, 9, 8, 2816, 704, BF16),
            (16, 16, 8, 1024, 704, BF16),
            (5, 7, 3, 1001, 37, F16),
            (2, 4, 2, 64, 24, F32),
            // partial row blocks, row tails, more tokens than one group
            (17, 6, 3, 130, 42, BF16),
            // decode fast path with f16 weights and small sizes
            (1, 5, 3, 64, 24, F16),
            // decode gate_up with inter % 4 != 0 (a partial last workgroup
            // wherever a workgroup takes several rows: PAIRS > 1)
            (1, 6, 2, 128, 30, BF16),
            // a prefill micro-batch through the decode down kernel
            (4, 5, 3, 64, 24, F16),
            // decode down with a partial last workgroup (hidden % ROWS != 0
            // for one token and for a micro-batch)
            (1, 5, 3, 66, 24, BF16),
            (3, 5, 3, 66, 24, F16),
            // prefill GEMM: tokens over several experts' tiles, an expert
            // with more pairs than one tile, partial row blocks
            (40, 6, 3, 64, 40, BF16),
            (70, 3, 2, 136, 24, F16),
            // the route-list kernels past 16 tokens (k not a multiple of 8)
            (20, 4, 2, 66, 20, BF16),
            // many pairs (1024 and more)
            (520, 5, 2, 64, 16, F16),
            // gate_up through the route-list kernel (hidden not a multiple
            // of 8), down through the GEMM with an odd-sized moe_sum
            (40, 6, 3, 66, 40, BF16),
            // both phases on tensor cores where the device has them (hidden
            // and inter multiples of 32), then several row blocks of each
            (40, 6, 3, 64, 64, BF16),
            (24, 5, 2, 160, 96, F16),
            // shapes an expert stack can be stored in tile order in
            // (backends/wgpu/src/expert_tiles.rs: whole 64-row blocks and
            // 16-wide chunks of k) for one token, a micro-batch (gate_up
            // through the route-list kernel) and the GEMMs above
            (1, 6, 3, 64, 32, BF16),
            (3, 6, 3, 128, 32, F16),
            // a long route list (about 130 of 200 experts in use): the
            // GEMMs' walk to their token tile passes many slots
            (40, 200, 4, 64, 64, BF16),
        ];
        if full {
            s.push((1, 128, 8, 2816, 704, BF16));
            s.push((16, 128, 8, 2816, 704, BF16));
        }
        s
    };
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

/// The pair ops as decode uses them: the dense MLP as a one-expert MoE
/// (problem a) beside the routed experts (b), and the down pair with the
/// post_ffn that follows it; plus cases a GPU must split back into two
/// launches (different hidden sizes, m > 1, f32 weights).
fn moe_pair(full: bool) -> Vec<Op> {
    let moe = |m, experts, top_k, hidden, inter| Moe {
        m,
        hidden,
        inter,
        experts,
        top_k,
        precision: crate::Precision::Exact,
    };
    let mut shapes = vec![
        (moe(1, 1, 1, 256, 96), moe(1, 6, 3, 256, 40), BF16),
        (moe(1, 1, 1, 64, 30), moe(1, 5, 2, 64, 24), F16),
        (moe(1, 1, 1, 64, 24), moe(1, 4, 2, 128, 16), BF16),
        (moe(2, 1, 1, 64, 24), moe(2, 4, 2, 64, 16), BF16),
        (moe(1, 1, 1, 32, 8), moe(1, 3, 2, 32, 8), F32),
        // experts an expert-tile layout takes, beside a dense MLP it does not
        (moe(1, 1, 1, 128, 48), moe(1, 6, 3, 128, 32), BF16),
    ];
    if full {
        shapes.push((moe(1, 1, 1, 2816, 2112), moe(1, 128, 8, 2816, 704), BF16));
    }
    let mut v = Vec::new();
    for (i, (a, b, w)) in shapes.into_iter().enumerate() {
        v.push(Op::MoeGateUpPair(case::MoeGateUpPair { a, b, w }));
        v.push(Op::MoeDownPair(case::MoeDownPair { a, b, w }));
        // (post_ffn over both outputs: the pairs of one hidden size; the
        // next layer's norm every other case, the norm weights' dtypes in
        // turn)
        if a.hidden == b.hidden {
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
                nw: [BF16, F32, F16][i % 3],
            }));
        }
    }
    v
}

fn rope() -> Vec<Op> {
    let c = |m, heads, head_dim, rot_pairs, theta| {
        Op::Rope(case::Rope {
            p: Rope {
                m,
                heads,
                head_dim,
                rot_pairs,
                theta,
            },
        })
    };
    vec![
        c(1, 16, 256, 128, 1e4),
        c(16, 2, 512, 64, 1e6), // proportional, full layer keys
        c(5, 3, 64, 32, 1e4),
        c(2, 8, 256, 128, 1e4),
    ]
}

fn kv_append() -> Vec<Op> {
    let c = |m, kv_heads, head_dim, capacity, pos0| {
        Op::KvAppend(case::KvAppend {
            p: KvAppend {
                m,
                kv_heads,
                head_dim,
                capacity,
            },
            pos0,
            kv: F32,
        })
    };
    let v = vec![
        c(1, 8, 256, 1039, 5000), // sliding ring, wrapped
        c(16, 2, 512, 64, 30),
        c(5, 1, 64, 7, 3), // wraps inside the batch
    ];
    // f16 caches: the same appends, rounded as kv_half rounds
    let f16: Vec<Op> = v.iter().map(|o| o.clone().with_kv(F16)).collect();
    v.into_iter().chain(f16).collect()
}

fn attention(full: bool) -> Vec<Op> {
    let shape = |m, heads, kv_heads, head_dim, capacity, window| Attention {
        m,
        heads,
        kv_heads,
        head_dim,
        capacity,
        window,
        scale: 1.0,
        precision: crate::Precision::Exact,
    };
    // (the decoder's layout: consecutive positions from pos0)
    let c = |m, heads, kv_heads, head_dim, capacity, window, pos0| {
        Op::attention(shape(m, heads, kv_heads, head_dim, capacity, window), pos0)
    };
    let mut v = vec![
        c(1, 16, 8, 256, 1039, 1024, 3000), // sliding decode over a wrapped ring
        c(1, 16, 2, 512, 4096, 0, 4000),    // full decode, split over key blocks
        c(16, 16, 8, 256, 1039, 1024, 2000), // sliding prefill micro-batch
        c(5, 16, 2, 512, 64, 0, 20),
        c(2, 4, 1, 64, 10, 4, 12),
        c(1, 3, 3, 32, 5, 0, 0),          // first token
        c(3, 8, 2, 128, 300, 0, 250),     // GQA 4: a partial second query tile
        c(16, 16, 2, 512, 2048, 0, 1500), // full prefill: 16 query tiles x splits
        c(7, 8, 4, 256, 40, 16, 100),     // short window inside one split, wrapped ring
        // Prefill batches (attn_prefill): sliding over a wrapped ring, full
        // with 8 query heads per kv head, odd head_dim (a partial dim
        // chunk) under a wrapping window, the first batch of a sequence.
        c(40, 16, 8, 256, 1063, 1024, 2000),
        c(40, 16, 2, 512, 2048, 0, 100),
        c(33, 6, 3, 44, 80, 20, 60),
        c(20, 4, 4, 32, 20, 0, 0),
        // The tensor-core prefill (kernels/attention_coop.wgsl, where the
        // device has it; attn_prefill elsewhere): head_dim 128 with 2 and 1
        // query heads per kv head (a workgroup holds 4: slots past the
        // group), the first batch; 512 over a long span of keys.
        c(48, 8, 4, 128, 200, 0, 150),
        c(24, 4, 4, 128, 64, 0, 0),
        c(20, 4, 1, 512, 2100, 0, 2060),
        // Decode kernel edges: head_dim/4 not a multiple of its 8 dim parts
        // (3, 48), a partial last chunk, a window that wraps a small ring,
        // and 16 query heads per kv head (past its 8: the general kernel).
        c(1, 4, 2, 12, 70, 0, 69),
        c(1, 6, 3, 192, 300, 50, 777),
        c(1, 16, 1, 64, 100, 0, 40),
        // Staged queries (where workgroup memory allows) for 4 and 6 heads
        // per kv head, the latter 6 x 96 vec4 (not a multiple of 256), and
        // head_dim 300: 3 value slices of 11 rows, the last one past the
        // chunk's 32 keys.
        c(1, 8, 2, 512, 300, 0, 250),
        c(1, 12, 2, 384, 200, 0, 150),
        c(1, 4, 2, 300, 80, 0, 70),
        // 3 and 5 query heads per kv head: attn_decode's per-head registers
        // past the group (it names 8) stay unused.
        c(1, 9, 3, 64, 90, 0, 80),
        c(1, 10, 2, 64, 60, 0, 40),
        // Several chunks a split (attn_decode loads a chunk's keys during
        // the chunk before): enough kv heads that the split count hits its
        // cap. One head a group over 3 chunks (the last split's one partial);
        // 8 heads a group over 2; a wrapped window over 2.
        c(1, 64, 64, 32, 700, 0, 699),
        c(1, 32, 4, 128, 4200, 0, 4199),
        c(1, 32, 16, 64, 2100, 2048, 5000),
        // Rows of 16 query heads per kv head (past attn_decode's 8: attn_split
        // and its tiles of 8 slots).
        c(4, 16, 1, 64, 100, 0, 60),
        // Rows of wide groups (attn_decode a row at a time): a window over a
        // wrapped ring, and splits of several chunks.
        c(9, 16, 2, 512, 300, 200, 1000),
        c(4, 8, 1, 256, 9000, 0, 8990),
        // Rows of narrow groups, several a workgroup: one head a kv head (8
        // rows a workgroup, 5 of them here) and three (2 rows, 6 slots).
        c(5, 4, 4, 64, 50, 0, 45),
        c(3, 6, 2, 64, 40, 0, 30),
    ];
    // Value rows past f16's range: the tensor-core prefill scales them down
    // and their probabilities up (the other kernels are f32 throughout).
    for (m, pos0) in [(24, 30), (1, 60)] {
        v.push(Op::Attention(case::Attention {
            p: shape(m, 4, 2, 256, 64, 0),
            pos0,
            stride: 1,
            large_values: true,
            kv: F32,
        }));
    }
    // Rows far apart (positions 40 apart, a 32-key window over a 64-slot
    // cache): their keys span more than the cache and share its slots, as
    // the cache's own keys do; the tensor-core prefill's scratch is indexed
    // by slot. At 4 rows, attn_decode: a narrow group's four rows in one
    // workgroup (each slot masked to its own row's keys), a wide group's
    // rows a workgroup each.
    for (m, heads, kv_heads, head_dim) in [
        (20, 4, 2, 256),
        (20, 8, 2, 128),
        (4, 16, 8, 256),
        (4, 16, 2, 512),
    ] {
        v.push(Op::Attention(case::Attention {
            p: shape(m, heads, kv_heads, head_dim, 64, 32),
            pos0: 70,
            stride: 40,
            large_values: false,
            kv: F32,
        }));
    }
    // A cache under 16 slots: a 16-key step wraps the ring more than once
    // (the tensor-core scratch's mirror rows repeat it).
    v.push(c(20, 4, 2, 128, 8, 8, 40));
    v.push(c(18, 4, 4, 128, 12, 12, 100));
    // f16 caches on each kernel: decode rows of both layer types, several
    // chunks a split, rows of wide and of narrow groups, 16 heads a kv
    // head (attn_split), a sliding micro-batch, the prefill batches (the
    // tensor-core one where the device has it)
    for op in [
        c(1, 16, 8, 256, 1039, 1024, 3000),
        c(1, 16, 2, 512, 4096, 0, 4000),
        c(1, 32, 4, 128, 4200, 0, 4199),
        c(9, 16, 2, 512, 300, 200, 1000),
        c(5, 4, 4, 64, 50, 0, 45),
        c(4, 16, 1, 64, 100, 0, 60),
        c(16, 16, 8, 256, 1039, 1024, 2000),
        c(40, 16, 8, 256, 1063, 1024, 2000),
        c(48, 8, 4, 128, 200, 0, 150),
    ] {
        v.push(op.with_kv(F16));
    }
    if full {
        v.push(c(1, 16, 2, 512, 32768, 0, 32767));
        v.push(c(1, 16, 8, 256, 1039, 1024, 32767));
        v.push(c(1, 16, 2, 512, 32768, 0, 32767).with_kv(F16));
    }
    v
}

fn glue() -> Vec<Op> {
    vec![
        Op::Add(case::Add { n: 5 * 2816 + 3 }),
        Op::Scale(case::Scale {
            n: 2816 * 2 + 1,
            s: 0.73,
        }),
        Op::GeluMul(case::GeluMul { rows: 5, n: 2112 }),
        Op::GeluMul(case::GeluMul { rows: 1, n: 37 }),
        Op::Softcap(case::Softcap {
            n: 262144 + 7,
            cap: 30.0,
        }),
        Op::Embed(case::Embed {
            p: Embed {
                m: 5,
                hidden: 2816,
                vocab: 3001,
                scale: 53.0,
            },
            w: BF16,
        }),
        Op::Embed(case::Embed {
            p: Embed {
                m: 1,
                hidden: 64,
                vocab: 512,
                scale: 8.0,
            },
            w: F32,
        }),
        Op::Embed(case::Embed {
            p: Embed {
                m: 2,
                hidden: 33,
                vocab: 77,
                scale: 5.75,
            },
            w: F16,
        }),
        Op::Argmax(case::Argmax { rows: 1, n: 262144 }),
        Op::Argmax(case::Argmax { rows: 5, n: 1001 }),
        // A row of q|k|v out of a batch's (an odd width, a row past the
        // first) and a head row back into one, both bounded by guards.
        Op::CopyRange(case::CopyRange {
            p: CopyRange {
                src_offset: 2 * 137,
                dst_offset: 0,
                len: 137,
            },
            src_len: 4 * 137,
            dst_len: 137,
        }),
        Op::CopyRange(case::CopyRange {
            p: CopyRange {
                src_offset: 0,
                dst_offset: 3 * 4096,
                len: 4096,
            },
            src_len: 4096,
            dst_len: 16 * 4096,
        }),
        // The 26B-A4B's decode (the last of 30 layers' log) and a prefill
        // batch's ids over many workgroups; the fixtures' 8 experts.
        slot_lookup(8, 128, 16, 29 * 8),
        slot_lookup(512 * 8 + 3, 128, 128, 0),
        slot_lookup(2, 8, 3, 6),
        slot_lookup(1, 1, 1, 0),
    ]
}

fn slot_lookup(n: usize, experts: usize, slots: usize, at: usize) -> Op {
    Op::SlotLookup(case::SlotLookup {
        p: SlotLookup {
            n,
            experts,
            slots,
            at,
        },
    })
}

/// The fused decoder steps at Gemma 4 shapes and odd ones, each weight dtype.
fn fused() -> Vec<Op> {
    let pa = |rows, dim, moe, w| {
        Op::PostAttention(case::PostAttention {
            p: PostAttention {
                rows,
                dim,
                eps: EPS,
            },
            moe,
            w,
        })
    };
    let pf = |rows, dim, moe, next, scale, w| {
        Op::PostFfn(case::PostFfn {
            p: PostFfn {
                rows,
                dim,
                eps: EPS,
                scale,
            },
            moe,
            next,
            w,
        })
    };
    let qkv = |m, heads, kv_heads, head_dim, rot_pairs, capacity, v_from_k, pos0, w| {
        Op::QkvPost(case::QkvPost {
            p: qkv_post(
                m,
                (heads, kv_heads, head_dim),
                rot_pairs,
                capacity,
                v_from_k,
            ),
            pos0,
            w,
            kv: F32,
        })
    };
    vec![
        pa(1, 2816, true, BF16),
        pa(512, 2816, true, BF16), // a prefill batch
        pa(5, 2816, true, F32),
        pa(3, 333, false, F16),
        pa(2, 4097, true, BF16), // 17 columns per thread, the last one partial
        pf(1, 2816, true, true, 0.73, BF16),
        pf(5, 2816, true, false, 1.0, F32),
        pf(2, 333, false, true, 0.5, F16),
        pf(1, 100, false, false, 1.0, BF16),
        pf(1, 8192, true, true, 1.0, BF16), // the widest row a workgroup keeps
        // sliding layer (v projected), full layer (V = raw k, partial RoPE)
        qkv(1, 16, 8, 256, 128, 1039, false, 30_000, BF16),
        qkv(1, 16, 2, 512, 64, 4096, true, 4000, BF16),
        qkv(16, 16, 8, 256, 128, 1039, false, 1030, F32),
        qkv(3, 4, 2, 12, 3, 5, true, 7, F16),
        // enough items (tokens x head slots) for wgpu's warp per item
        // (`QKV_WARPS_MIN_ITEMS`), not a whole number of its eight a
        // workgroup: 103 x 20 and 410 x 5 (head_dim 40: lanes with two
        // elements and with one)
        qkv(103, 16, 2, 512, 64, 4096, true, 4000, BF16),
        qkv(410, 3, 1, 40, 7, 500, false, 11, BF16),
        // f16 caches: a sliding and a full decode row, an odd small shape,
        // the warp per item
        qkv(1, 16, 8, 256, 128, 1039, false, 30_000, BF16).with_kv(F16),
        qkv(1, 16, 2, 512, 64, 4096, true, 4000, BF16).with_kv(F16),
        qkv(3, 4, 2, 12, 3, 5, true, 7, F16).with_kv(F16),
        qkv(103, 16, 2, 512, 64, 4096, true, 4000, BF16).with_kv(F16),
    ]
}

/// A qkv_post shape: Gemma 4's theta for a layer that turns every pair
/// (sliding) or part of them (full).
fn qkv_post(
    m: usize,
    (heads, kv_heads, head_dim): (usize, usize, usize),
    rot_pairs: usize,
    capacity: usize,
    v_from_k: bool,
) -> QkvPost {
    QkvPost {
        m,
        heads,
        kv_heads,
        head_dim,
        rot_pairs,
        theta: if rot_pairs * 2 == head_dim {
            10_000.0
        } else {
            1_000_000.0
        },
        eps: EPS,
        capacity,
        v_from_k,
    }
}

/// qkv_post then attention (one decode launch on wgpu where it fits): the
/// Gemma 4 layers' decode rows, a group of 8 heads at a short context (most
/// splits without keys), the new key in a later split of a wrapped ring,
/// and shapes that take the two ops (head_dim not a multiple of 8, a
/// micro-batch).
fn qkv_post_attention() -> Vec<Op> {
    let c = |m, heads, kv_heads, head_dim, rot_pairs, capacity, v_from_k, window, pos0, w| {
        Op::QkvPostAttention(qkv_attention_case(
            m,
            (heads, kv_heads, head_dim),
            (rot_pairs, capacity, v_from_k),
            (window, pos0),
            w,
        ))
    };
    vec![
        c(1, 16, 8, 256, 128, 1039, false, 1024, 30_000, BF16),
        c(1, 16, 2, 512, 64, 4096, true, 0, 4000, BF16),
        c(1, 16, 2, 512, 64, 700, true, 0, 5, BF16),
        c(1, 8, 4, 64, 32, 300, false, 100, 777, F32),
        c(1, 6, 3, 24, 5, 50, false, 0, 20, F16),
        c(1, 4, 2, 12, 3, 40, true, 0, 30, BF16),
        c(3, 16, 8, 256, 128, 600, false, 512, 590, BF16),
        // a context long enough that wgpu's split phase reaches its most
        // workgroups (2 kv heads, 8192 slots), where it takes the two ops
        c(1, 4, 2, 64, 16, 8192, false, 0, 8190, BF16),
        // two chunks a split in the one launch (one kv head: the split
        // count stops at its 256 cap, short of the workgroup target), the
        // new key in a split's second chunk, loaded during the first
        c(1, 8, 1, 64, 16, 8300, false, 0, 8299, BF16),
        // a prefill batch (the decoder's call at 17 rows and more: on
        // tensor cores the cooperative attention after qkv_post)
        c(20, 4, 2, 256, 128, 64, false, 32, 10, BF16),
        // f16 caches: the fused decode rows of both layer types, the new
        // key in a split's second chunk. (Not a prefill batch: its keys,
        // which the two backends compute a few f32 ulps apart, round to
        // f16 one ulp apart now and then, and at Gemma 4's attention scale
        // of 1 a flip in the leading key moves the output by up to ~1e-8
        // NMSE (lavapipe, 11 seeds: 2e-11 .. 7e-9). The batch's two ops
        // are each checked on f16 caches: qkv_post above, attention's
        // prefill cases on caches given in f16.)
        c(1, 16, 8, 256, 128, 1039, false, 1024, 30_000, BF16).with_kv(F16),
        c(1, 16, 2, 512, 64, 4096, true, 0, 4000, BF16).with_kv(F16),
        c(1, 8, 1, 64, 16, 8300, false, 0, 8299, BF16).with_kv(F16),
    ]
}

/// A qkv_post_attention case of `m` rows: its heads (query, kv, dim), its
/// RoPE pairs, cache and V source, its window and first position, f32
/// caches, exact precision.
fn qkv_attention_case(
    m: usize,
    shape: (usize, usize, usize),
    (rot_pairs, capacity, v_from_k): (usize, usize, bool),
    (window, pos0): (usize, usize),
    w: crate::DType,
) -> case::QkvPostAttention {
    case::QkvPostAttention {
        p: qkv_post(m, shape, rot_pairs, capacity, v_from_k),
        window,
        pos0,
        w,
        kv: F32,
        precision: crate::Precision::Exact,
    }
}

/// One row of a batched decode step on its own caches: the Gemma 4 layers'
/// rows in a pass of several (the fused launch on the row in place), the
/// first row of one, and shapes the fused launch does not take (head_dim
/// not a multiple of 8, a context past its workgroups), which take
/// qkv_post and the split phase, the row still in place.
fn qkv_post_attention_row() -> Vec<Op> {
    let c = |shape, rot_pairs, capacity, v_from_k, window, pos0, w| {
        qkv_attention_case(1, shape, (rot_pairs, capacity, v_from_k), (window, pos0), w)
    };
    let at = |c, row, rows| Op::QkvPostAttentionRow(case::QkvPostAttentionRow { c, row, rows });
    vec![
        at(c((16, 8, 256), 128, 1039, false, 1024, 30_000, BF16), 2, 3),
        at(c((16, 2, 512), 64, 700, true, 0, 5, BF16), 1, 4),
        at(c((8, 4, 64), 32, 300, false, 100, 777, F32), 0, 1),
        at(c((4, 2, 12), 3, 40, true, 0, 30, BF16), 1, 2),
        at(c((4, 2, 64), 16, 8192, false, 0, 8190, BF16), 1, 2),
    ]
}

/// post_attention over `rows` x `dim` and the router on its residual.
fn pa_router(rows: usize, dim: usize, (experts, top_k): (usize, usize)) -> (PostAttention, Router) {
    let p = PostAttention {
        rows,
        dim,
        eps: EPS,
    };
    let r = Router {
        m: rows,
        hidden: dim,
        experts,
        top_k,
        eps: EPS,
    };
    (p, r)
}

/// post_attention and the router in one call (the decode path fuses the
/// router's logits into post_attention's launch).
fn post_attention_router() -> Vec<Op> {
    let c = |rows, dim, experts, top_k, w, pw| {
        let (p, r) = pa_router(rows, dim, (experts, top_k));
        Op::PostAttentionRouter(case::PostAttentionRouter { p, r, w, pw })
    };
    vec![
        c(1, 2816, 128, 8, BF16, BF16), // Gemma 4 26B-A4B
        c(1, 1000, 9, 3, F32, F16),     // a row not a multiple of the threads
        c(1, 64, 5, 2, BF16, F32),      // f32 router weights: two launches
        c(3, 130, 6, 2, F16, BF16),     // several rows: two launches
    ]
}

/// post_attention, the router and both branches' gate_up in one call (the
/// decode path picks the experts inside the gate_up launch).
fn post_attention_gate_up(full: bool) -> Vec<Op> {
    let c = |rows, dim, routing, (inter, moe_inter), w, pw, gw| {
        let (p, r) = pa_router(rows, dim, routing);
        Op::PostAttentionGateUp(case::PostAttentionGateUp {
            p,
            r,
            inter,
            moe_inter,
            w,
            pw,
            gw,
        })
    };
    let mut v = vec![
        c(1, 256, (16, 4), (96, 40), BF16, BF16, BF16),
        // top-k over experts not a multiple of anything, activation rows
        // not a multiple of a workgroup's, f16 weights
        c(1, 1000, (9, 3), (30, 22), F32, F16, F16),
        // f32 expert weights: the decode kernels do not take them (the
        // ops in turn)
        c(1, 64, (5, 2), (24, 16), BF16, BF16, F32),
        // several rows: the ops in turn
        c(3, 128, (6, 2), (24, 16), F16, BF16, BF16),
    ];
    if full {
        // Gemma 4 26B-A4B
        v.push(c(1, 2816, (128, 8), (2112, 704), BF16, BF16, BF16));
    }
    v
}

/// post_attention_gate_up with the routed experts in a slot stack, the
/// lookup inside (streamed experts' decode).
fn post_attention_gate_up_slots(full: bool) -> Vec<Op> {
    let c = |routing, (inter, moe_inter), slots, at, w| {
        let (p, r) = pa_router(1, 256, routing);
        let g = case::PostAttentionGateUp {
            p,
            r,
            inter,
            moe_inter,
            w,
            pw: BF16,
            gw: w,
        };
        Op::PostAttentionGateUpSlots(case::PostAttentionGateUpSlots { g, slots, at })
    };
    let mut v = vec![
        c((16, 4), (96, 40), 8, 12, BF16),
        // as many slots as experts, f16 weights, the log from its start
        c((9, 3), (30, 22), 9, 0, F16),
    ];
    if full {
        // Gemma 4 26B-A4B at 16 slots, its last layer's place in the log
        let (p, r) = pa_router(1, 2816, (128, 8));
        let g = case::PostAttentionGateUp {
            p,
            r,
            inter: 2112,
            moe_inter: 704,
            w: BF16,
            pw: BF16,
            gw: BF16,
        };
        v.push(Op::PostAttentionGateUpSlots(
            case::PostAttentionGateUpSlots {
                g,
                slots: 16,
                at: 29 * 8,
            },
        ));
    }
    v
}

fn cases(full: bool) -> Vec<Op> {
    [
        rms_norm(),
        matmul(full),
        router(full),
        moe(full),
        moe_pair(full),
        rope(),
        kv_append(),
        attention(full),
        glue(),
        fused(),
        qkv_post_attention(),
        qkv_post_attention_row(),
        post_attention_router(),
        post_attention_gate_up(full),
        post_attention_gate_up_slots(full),
        super::quantized_cases::cases(full),
    ]
    .concat()
}

/// The suite `cargo test` runs: sized for lavapipe on two cores.
pub fn ci_cases() -> Vec<Op> {
    cases(false)
}

/// The CI suite plus the full-size shapes (128 experts, the 262144-row LM
/// head, 32K contexts), for real GPUs.
pub fn all_cases() -> Vec<Op> {
    cases(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parity::Case;

    /// Every family `tests/parity.rs` runs by name: the ops, then those
    /// with quantized weights.
    const FAMILIES: [&str; 38] = [
        "rms_norm",
        "matmul",
        "router",
        "moe_gate_up",
        "moe_down",
        "moe_gate_up_pair",
        "moe_down_pair",
        "moe_down_pair_post_ffn",
        "rope",
        "kv_append",
        "attention",
        "add",
        "scale",
        "gelu_mul",
        "softcap",
        "embed",
        "argmax",
        "copy_range",
        "slot_lookup",
        "post_attention",
        "post_attention_router",
        "post_attention_gate_up",
        "post_attention_gate_up_slots",
        "post_ffn",
        "qkv_post",
        "qkv_post_attention",
        "qkv_post_attention_row",
        "matmul_quantized",
        "router_quantized",
        "moe_gate_up_quantized",
        "moe_down_quantized",
        "moe_gate_up_pair_quantized",
        "moe_down_pair_quantized",
        "moe_down_pair_post_ffn_quantized",
        "embed_quantized",
        "post_attention_router_quantized",
        "post_attention_gate_up_quantized",
        "post_attention_gate_up_slots_quantized",
    ];

    /// A name picks one case (filters and failure reports name cases), and
    /// every case is in one of the families, each of which has CI cases.
    #[test]
    fn case_names_are_unique_and_every_family_has_cases() {
        let all = all_cases();
        let mut names: Vec<String> = all.iter().map(|c| c.name()).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "case names repeat");
        for c in &all {
            assert!(
                FAMILIES.contains(&c.family()),
                "{}: no such family",
                c.name()
            );
        }
        let ci = ci_cases();
        for f in FAMILIES {
            assert!(ci.iter().any(|c| c.family() == f), "no CI cases for {f}");
        }
        assert!(ci.len() < all.len());
    }
}
