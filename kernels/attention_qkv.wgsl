// attn_decode_qkv, appended to kernels/attention.wgsl (with its caches
// writable) as the `attention_qkv` family, with kernels/rope_angle.wgsl:
// backends/wgpu/src/kernels.rs VARIANTS. The other attention kernels keep
// the caches read-only.
//
// ---- attn_decode_qkv: qkv_post and attn_decode in one launch -------------
//
// One decode row: each workgroup (split, kv head g) first builds its
// group's queries from the fused projection's raw row RAW ([q | k | v], or
// [q | k] with V from the raw k where P.v_from_k) as kernels/rope.wgsl's
// qkv_post does -- each head RMS-normalised, times WQ, turned by RoPE
// (kernels/rope_angle.wgsl) -- into dq, and split 0 also into QOUT
// (qkv_post's q output). The workgroup whose keys include the new one (the
// row's position) also builds kv head g's key (normalised, times WK,
// turned) and value (normalised) and writes them at the position's cache
// slot before its chunk loop reads them: its own writes (storageBarrier),
// and no other split reads that slot. That is qkv_build, which decode_body
// calls as its prelude: one dependent dispatch a decode layer fewer than
// qkv_post before it.
//
// A thread takes units (head hh, vec4 c of the first half): the dims 4c..
// and half + 4c.. that RoPE pairs. Heads hh < GD are the group's queries,
// GD its key and GD + 1 its value (those two only in the new key's split).

// (0-6: attention.wgsl's, attn_decode's tail outputs among them)
@group(1) @binding(7) var<storage, read> RAW: array<f32>;
@group(1) @binding(8) var<storage, read> WQ: array<u32>;
@group(1) @binding(9) var<storage, read> WK: array<u32>;
@group(1) @binding(10) var<storage, read> QFREQ: array<f32>;
@group(1) @binding(11) var<storage, read_write> QOUT: array<f32>;

// dtype codes of WQ and WK
override WQD: u32 = 0u;
override WKD: u32 = 0u;

// 1 / rms of each unit head (at most 8 queries, a key and a value).
var<workgroup> qinv: array<f32, 16>;

// RAW[i .. i + 4].
fn raw4(i: u32) -> vec4<f32> {
    return vec4<f32>(RAW[i], RAW[i + 1u], RAW[i + 2u], RAW[i + 3u]);
}

// WQ / WK elements i .. i + 4, as f32.
fn wq4(i: u32) -> vec4<f32> {
    return vec4<f32>(decode_as(WQ[word_of(i, WQD)], i, WQD), decode_as(WQ[word_of(i + 1u, WQD)], i + 1u, WQD),
                     decode_as(WQ[word_of(i + 2u, WQD)], i + 2u, WQD), decode_as(WQ[word_of(i + 3u, WQD)], i + 3u, WQD));
}

fn wk4(i: u32) -> vec4<f32> {
    return vec4<f32>(decode_as(WK[word_of(i, WKD)], i, WKD), decode_as(WK[word_of(i + 1u, WKD)], i + 1u, WKD),
                     decode_as(WK[word_of(i + 2u, WKD)], i + 2u, WKD), decode_as(WK[word_of(i + 3u, WKD)], i + 3u, WKD));
}

// Pair j (a, b) turned by RoPE at pos, untouched past rot_pairs.
fn turn_if(a: f32, b: f32, j: u32, pos: u32) -> vec2<f32> {
    if (j < P.rot_pairs) {
        return turn_pair(a, b, pos, QFREQ[j]);
    }
    return vec2<f32>(a, b);
}

// Halves a (dims i..) and b (dims half + i..) turned by RoPE at pos, pairs
// past rot_pairs untouched (qkv_post's arithmetic: turn_pair); returns
// (a', b').
fn turn4(a: vec4<f32>, b: vec4<f32>, i: u32, pos: u32) -> array<vec4<f32>, 2> {
    let t0 = turn_if(a.x, b.x, i, pos);
    let t1 = turn_if(a.y, b.y, i + 1u, pos);
    let t2 = turn_if(a.z, b.z, i + 2u, pos);
    let t3 = turn_if(a.w, b.w, i + 3u, pos);
    return array<vec4<f32>, 2>(vec4<f32>(t0.x, t1.x, t2.x, t3.x), vec4<f32>(t0.y, t1.y, t2.y, t3.y));
}

// The norm weights of unit (head hh, vec4 c): its two halves' (WQ for the
// queries, WK for the key; ones for the value, which has none).
fn unit_weights(hh: u32, c: u32) -> array<vec4<f32>, 2> {
    let half = 2u * D4;
    if (hh < GD) {
        return array<vec4<f32>, 2>(wq4(4u * c), wq4(half + 4u * c));
    }
    if (hh == GD) {
        return array<vec4<f32>, 2>(wk4(4u * c), wk4(half + 4u * c));
    }
    return array<vec4<f32>, 2>(vec4<f32>(1.0), vec4<f32>(1.0));
}

// Unit head hh's offset in the raw row (kv head g).
fn raw_head(hh: u32, g: u32) -> u32 {
    let d = 4u * D4;
    if (hh < GD) {
        return (g * GD + hh) * d;
    }
    let k0 = P.heads * d;
    if (hh == GD) {
        return k0 + g * d;
    }
    return k0 + select(P.kv_heads * d, 0u, P.v_from_k == 1u) + g * d;
}

@compute @workgroup_size(256)
fn attn_decode_qkv(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let id = linear_group(wg, nwg);
    if (id / P.nsplit >= P.kv_heads) {
        return;
    }
    // The build first, then the split's keys; with PRE, decode_body calls
    // the build through decode_prelude once the first keys are issued.
    if (!PRE) {
        qkv_build(id, lid);
    }
    decode_body(id, lid, false);
}

// The queries of workgroup `id`'s (split, kv head g) into dq (split 0: and
// QOUT), and the new key and value where the split holds them (g below the
// kv heads). Every invocation calls it.
fn qkv_build(id: u32, lid: u32) {
    let split = id % P.nsplit;
    let g = id / P.nsplit;
    let pos = POS[0];
    let span = decode_span(0u, split);
    // (uniform: the workgroup's span)
    let new_key = span.x <= pos && pos < span.y;
    let heads = GD + select(0u, 2u, new_key);
    let hv = D4 / 2u;
    let half = 2u * D4;
    // Each unit head's sum of squares: partial per unit, then a thread per
    // head adds its units in order. With PRE and a unit a thread at most
    // (the sliding layers), the unit's raw halves and norm weights are
    // loaded here together and kept for the second pass (its memory waits
    // then come before the barrier, not after it).
    let one = PRE && heads * hv <= 256u;
    var ra = vec4<f32>(0.0);
    var rb = vec4<f32>(0.0);
    var wa = vec4<f32>(1.0);
    var wb = vec4<f32>(1.0);
    if (one && lid < heads * hv) {
        let at = raw_head(lid / hv, g) + 4u * (lid % hv);
        ra = raw4(at);
        rb = raw4(at + half);
        let w = unit_weights(lid / hv, lid % hv);
        wa = w[0];
        wb = w[1];
    }
    // Where a head's units are one whole subgroup (PRE, the subgroup width
    // SGW equal to the units a head: Gemma 4's sliding layers on 32-wide
    // subgroups), the head's sum is a subgroup sum, in registers: no
    // barrier, no thread summing the units one by one.
    let by_lanes = one && SGW == hv;
    var inv_lanes = 0.0;
    if (by_lanes) {
        let ss = lanes_sum(dot(ra, ra) + dot(rb, rb));
        inv_lanes = inverseSqrt(ss / f32(4u * D4) + P.eps);
    } else {
        if (one && lid < heads * hv) {
            dred[lid] = dot(ra, ra) + dot(rb, rb);
        }
        for (var u = lid; u < select(heads * hv, 0u, one); u += 256u) {
            let at = raw_head(u / hv, g) + 4u * (u % hv);
            let a = raw4(at);
            let b = raw4(at + half);
            dred[u] = dot(a, a) + dot(b, b);
        }
        workgroupBarrier();
        if (lid < heads) {
            var ss = 0.0;
            for (var c = 0u; c < hv; c++) {
                ss += dred[lid * hv + c];
            }
            qinv[lid] = inverseSqrt(ss / f32(4u * D4) + P.eps);
        }
        workgroupBarrier();
    }
    let slot = pos % P.capacity;
    for (var u = lid; u < heads * hv; u += 256u) {
        let hh = u / hv;
        let c = u % hv;
        let at = raw_head(hh, g) + 4u * c;
        var inv = inv_lanes;
        if (!by_lanes) {
            inv = qinv[hh];
        }
        var a = ra;
        var b = rb;
        var w0 = wa;
        var w1 = wb;
        if (!one) {
            a = raw4(at);
            b = raw4(at + half);
            let w = unit_weights(hh, c);
            w0 = w[0];
            w1 = w[1];
        }
        a *= inv;
        b *= inv;
        if (hh < GD) {
            let t = turn4(a * w0, b * w1, 4u * c, pos);
            dq[hh * D4 + c] = t[0];
            dq[hh * D4 + hv + c] = t[1];
            if (split == 0u) {
                let o = (g * GD + hh) * 4u * D4 + 4u * c;
                QOUT[o] = t[0].x;
                QOUT[o + 1u] = t[0].y;
                QOUT[o + 2u] = t[0].z;
                QOUT[o + 3u] = t[0].w;
                QOUT[o + half] = t[1].x;
                QOUT[o + half + 1u] = t[1].y;
                QOUT[o + half + 2u] = t[1].z;
                QOUT[o + half + 3u] = t[1].w;
            }
        } else if (hh == GD) {
            let t = turn4(a * w0, b * w1, 4u * c, pos);
            let row = (g * P.capacity + slot) * D4;
            KC[row + c] = to_cache4(t[0]);
            KC[row + hv + c] = to_cache4(t[1]);
        } else {
            let row = (g * P.capacity + slot) * D4;
            VC[row + c] = to_cache4(a);
            VC[row + hv + c] = to_cache4(b);
        }
    }
    // The new key and value for this workgroup's own loads, dq for all.
    storageBarrier();
    workgroupBarrier();
}
