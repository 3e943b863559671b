// Small-M matmul: OUT[i, row0 + r] = sum_c W[r, c] * X[i, c] for i < P.m,
// r < P.rows (the rows of one weight binding; a weight split across bindings
// is one dispatch per chunk), c < P.k. Accumulates in f32.
//
// A workgroup of 256 threads is WG / KL row groups of KL lanes; each row group
// owns RT consecutive weight rows, so a workgroup computes RT * WG / KL rows
// for all MB rows of x. Per step a lane loads one element pair (one 32-bit
// word of a 16-bit weight; consecutive lanes read consecutive words) of each
// of its RT rows, and multiplies it with the MB rows of x, which are staged
// tile by tile in workgroup memory: every weight element is read from memory
// once whatever M is. Lanes of a row group are then summed by a tree
// reduction in workgroup memory (no subgroup operations).
//
// ALIGNED = 1 when k is even: every row starts on a word, and a word is an
// element pair. Otherwise (odd k with 16-bit weights, rows starting mid-word)
// each element is decoded from its global element index.

struct Params {
    m: u32,
    // Output row stride (all output features), and the first feature of this chunk.
    n: u32,
    k: u32,
    rows: u32,
    row0: u32,
    // First row of x (and of OUT) of this dispatch: m > 16 runs in blocks.
    i0: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(1) @binding(0) var<storage, read> W: array<u32>;
@group(1) @binding(1) var<storage, read> X: array<f32>;
@group(1) @binding(2) var<storage, read_write> OUT: array<f32>;

// Rows of x computed (a bucket >= P.m; rows past P.m see zeros and are not written).
override MB: u32 = 1u;
// Weight rows per thread (<= MAX_RT, RT * MB <= MAX_ACC).
override RT: u32 = 4u;
// Lanes along k per row group: a power of two dividing WG.
override KL: u32 = 64u;
override ALIGNED: u32 = 1u;

const WG: u32 = 256u;
const MAX_RT: u32 = 8u;
const MAX_ACC: u32 = 64u;
// Workgroup memory in element pairs: 16 KiB.
const SH: u32 = 2048u;
var<workgroup> sh: array<vec2<f32>, SH>;

// Word i of the weight (kernels/affine.wgsl).
fn wword(i: u32) -> u32 {
    return W[i];
}

// Elements c and c + 1 (c even) of the row starting at element `re`.
fn weight_pair(re: u32, c: u32) -> vec2<f32> {
    let e = re + c;
    if (QBITS != 0u) {
        return affine_pair(e);
    }
    if (ALIGNED == 1u) {
        if (WDTYPE == 0u) {
            return vec2<f32>(bitcast<f32>(W[e]), bitcast<f32>(W[e + 1u]));
        }
        return decode_pair(W[e >> 1u]);
    }
    let a = decode_weight(W[weight_word(e)], e);
    let b = decode_weight(W[weight_word(e + 1u)], e + 1u);
    // Past the row's end (odd k): the next row's element, or out of bounds.
    return vec2<f32>(a, select(0.0, b, c + 1u < P.k));
}

@compute @workgroup_size(256)
fn matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) t: u32) {
    let lane = t % KL;
    let r0 = linear_group(wg, nwg) * (RT * (WG / KL)) + (t / KL) * RT;
    // No early exit: every thread takes part in the barriers. Rows past the
    // chunk load its last row and are not written.
    var re: array<u32, MAX_RT>;
    for (var r = 0u; r < RT; r++) {
        re[r] = min(r0 + r, P.rows - 1u) * P.k;
    }
    var acc: array<f32, MAX_ACC>;
    // Pairs of x per tile row.
    let tp = SH / MB;
    for (var t0 = 0u; t0 < P.k; t0 += 2u * tp) {
        let len = min(2u * tp, P.k - t0);
        let pairs = (len + 1u) / 2u;
        workgroupBarrier();
        for (var j = t; j < MB * tp; j += WG) {
            let i = j / tp;
            let c = 2u * (j - i * tp);
            var v = vec2<f32>(0.0);
            if (i < P.m && c < len) {
                let xi = (P.i0 + i) * P.k + t0 + c;
                v.x = X[xi];
                if (c + 1u < len) {
                    v.y = X[xi + 1u];
                }
            }
            sh[j] = v;
        }
        workgroupBarrier();
        for (var p = lane; p < pairs; p += KL) {
            var w: array<vec2<f32>, MAX_RT>;
            for (var r = 0u; r < RT; r++) {
                w[r] = weight_pair(re[r], t0 + 2u * p);
            }
            for (var i = 0u; i < MB; i++) {
                let xv = sh[i * tp + p];
                for (var r = 0u; r < RT; r++) {
                    acc[r * MB + i] = fma(w[r].y, xv.y, fma(w[r].x, xv.x, acc[r * MB + i]));
                }
            }
        }
    }
    // Sum the KL lanes of each row group, 16 accumulators per thread per round.
    let nacc = RT * MB;
    for (var q0 = 0u; q0 < nacc; q0 += 16u) {
        workgroupBarrier();
        for (var q = 0u; q < 8u; q++) {
            let a = q0 + 2u * q;
            if (a < nacc) {
                sh[q * WG + t] = vec2<f32>(acc[a], acc[a + 1u]);
            }
        }
        workgroupBarrier();
        for (var s = KL / 2u; s > 0u; s >>= 1u) {
            if (lane < s) {
                for (var q = 0u; q < 8u; q++) {
                    if (q0 + 2u * q < nacc) {
                        sh[q * WG + t] += sh[q * WG + t + s];
                    }
                }
            }
            workgroupBarrier();
        }
        if (lane == 0u) {
            for (var q = 0u; q < 8u; q++) {
                let sum = sh[q * WG + t];
                for (var h = 0u; h < 2u; h++) {
                    let a = q0 + 2u * q + h;
                    let r = a / MB;
                    let i = a - r * MB;
                    let row = r0 + r;
                    if (a < nacc && i < P.m && row < P.rows) {
                        OUT[(P.i0 + i) * P.n + P.row0 + row] = sum[h];
                    }
                }
            }
        }
    }
}
