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
// and no other split reads that slot. Then decode_body, as attn_decode: one
// dependent dispatch a decode layer fewer than qkv_post before it.
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
    let split = id % P.nsplit;
    let g = id / P.nsplit;
    if (g >= P.kv_heads) {
        return;
    }
    let pos = POS[0];
    let span = decode_span(0u, split);
    // (uniform: the workgroup's span)
    let new_key = span.x <= pos && pos < span.y;
    let heads = GD + select(0u, 2u, new_key);
    let hv = D4 / 2u;
    let half = 2u * D4;
    // Each unit head's sum of squares: partial per unit, then a thread per
    // head adds its units in order.
    for (var u = lid; u < heads * hv; u += 256u) {
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
    let slot = pos % P.capacity;
    for (var u = lid; u < heads * hv; u += 256u) {
        let hh = u / hv;
        let c = u % hv;
        let at = raw_head(hh, g) + 4u * c;
        let inv = qinv[hh];
        let a = raw4(at) * inv;
        let b = raw4(at + half) * inv;
        if (hh < GD) {
            let t = turn4(a * wq4(4u * c), b * wq4(half + 4u * c), 4u * c, pos);
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
            let t = turn4(a * wk4(4u * c), b * wk4(half + 4u * c), 4u * c, pos);
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
    decode_body(id, lid, false);
}
