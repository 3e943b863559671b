// Gemma 4 router, one workgroup per token, one dispatch:
//   z       = x * (mean(x^2) + eps)^-1/2 * eff_scale
//   logits  = proj z                          (f32, E <= 256 rows)
//   top-k by logit (ties to the lower expert id), softmax over the k selected
//   (== softmax over all E, renormalised), times per_expert_scale[e].
// IDS [m, k] and WTS [m, k] are written in descending order of probability.
//
// The E dot products: 8 teams of 32 lanes, each team 4 rows at a time (32 rows
// per ps); lanes stride over the row in 32-bit words so every load
// instruction of a team reads one contiguous 128-byte run of each row.

struct Params {
    m: u32,
    hidden: u32,
    experts: u32,
    top_k: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(1) @binding(0) var<storage, read> X: array<f32>;
@group(1) @binding(1) var<storage, read> SCALE: array<f32>;
@group(1) @binding(2) var<storage, read> PROJ: array<u32>;
@group(1) @binding(3) var<storage, read> PES: array<f32>;
@group(1) @binding(4) var<storage, read_write> IDS: array<u32>;
@group(1) @binding(5) var<storage, read_write> WTS: array<f32>;

const RL: u32 = 32u;          // lanes per team
const RROWS: u32 = 32u;       // rows per ps: 8 teams x 4 rows
const MAXE: u32 = 256u;

var<workgroup> red: array<f32, 256>;
var<workgroup> part: array<vec4<f32>, 256>;
var<workgroup> logits: array<f32, MAXE>;
var<workgroup> sel_id: array<u32, 8>;
var<workgroup> sel_v: array<f32, 8>;

// Weight element pair `u` of a row whose first element is `row * hidden`
// (hidden even): one word for 16-bit weights, two for f32.
fn proj_pair(row: u32, u: u32) -> vec2<f32> {
    let base = row * P.hidden;
    if (WDTYPE == 0u) {
        return vec2<f32>(bitcast<f32>(PROJ[base + 2u * u]), bitcast<f32>(PROJ[base + 2u * u + 1u]));
    }
    return decode_pair(PROJ[(base >> 1u) + u]);
}

fn proj_elem(row: u32, i: u32) -> f32 {
    let gi = row * P.hidden + i;
    return decode_weight(PROJ[weight_word(gi)], gi);
}

@compute @workgroup_size(256)
fn router(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let t = linear_group(wg, nwg);
    if (t >= P.m) {
        return;
    }
    let h = P.hidden;
    let ne = P.experts;
    let xb = t * h;

    // 1. mean square of x.
    var ss = 0.0;
    for (var i = lid; i < h; i += 256u) {
        let v = X[xb + i];
        ss += v * v;
    }
    red[lid] = ss;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let inv = inverseSqrt(red[0] / f32(h) + P.eps);

    // 2. logits, 32 rows per ps.
    let team = lid / RL;
    let lane = lid % RL;
    let npass = (ne + RROWS - 1u) / RROWS;
    for (var ps = 0u; ps < npass; ps++) {
        let r0 = ps * RROWS + team * 4u;
        // Rows past E read row E-1 (in range) and are discarded.
        let ra = min(r0, ne - 1u);
        let rb = min(r0 + 1u, ne - 1u);
        let rc = min(r0 + 2u, ne - 1u);
        let rd = min(r0 + 3u, ne - 1u);
        var acc = vec4<f32>(0.0);
        if ((h & 1u) == 0u) {
            let nu = h / 2u;
            for (var u = lane; u < nu; u += RL) {
                let i = 2u * u;
                let z = vec2<f32>(X[xb + i], X[xb + i + 1u]) * inv
                    * vec2<f32>(SCALE[i], SCALE[i + 1u]);
                let wa = proj_pair(ra, u);
                let wb = proj_pair(rb, u);
                let wc = proj_pair(rc, u);
                let wd = proj_pair(rd, u);
                acc += vec4<f32>(dot(wa, z), dot(wb, z), dot(wc, z), dot(wd, z));
            }
        } else {
            for (var i = lane; i < h; i += RL) {
                let z = X[xb + i] * inv * SCALE[i];
                acc += vec4<f32>(proj_elem(ra, i), proj_elem(rb, i), proj_elem(rc, i),
                                 proj_elem(rd, i)) * z;
            }
        }
        part[lid] = acc;
        workgroupBarrier();
        if (lid < RROWS) {
            // Row lid of this ps: team lid / 4, component lid % 4.
            let tb = (lid / 4u) * RL;
            let q = lid % 4u;
            var sum = 0.0;
            for (var l = 0u; l < RL; l++) {
                sum += part[tb + l][q];
            }
            let e = ps * RROWS + lid;
            if (e < ne) {
                logits[e] = sum;
            }
        }
        workgroupBarrier();
    }

    // 3. top-k by rank: expert e's place is the number of experts ahead of
    // it (larger logit, or equal logit and lower id).
    if (lid < ne) {
        let v = logits[lid];
        var rank = 0u;
        for (var j = 0u; j < ne; j++) {
            let o = logits[j];
            rank += u32(o > v || (o == v && j < lid));
        }
        if (rank < P.top_k) {
            sel_id[rank] = lid;
            sel_v[rank] = v;
        }
    }
    workgroupBarrier();

    // 4. softmax over the k selected, times per_expert_scale.
    let k = P.top_k;
    if (lid < k) {
        let mx = sel_v[0];
        var sum = 0.0;
        for (var j = 0u; j < k; j++) {
            sum += exp(sel_v[j] - mx);
        }
        let e = sel_id[lid];
        IDS[t * k + lid] = e;
        WTS[t * k + lid] = exp(sel_v[lid] - mx) / sum * PES[e];
    }
}
