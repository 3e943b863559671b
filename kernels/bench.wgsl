// The bandwidth ceiling for `turbospark bench`: a grid-stride read of a
// buffer far larger than the GPU's caches, 16 bytes per load
// (`stream_read`), and a read of an op-sized buffer with every thread's
// loads issued at once (`stream_read_fixed`). The loads are folded into one
// value per thread that is written only if it equals a sentinel, so nothing
// can be eliminated and almost nothing is written.

struct Params {
    // Length of SRC in vec4<u32>.
    n: u32,
    sentinel: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(1) @binding(0) var<storage, read> SRC: array<vec4<u32>>;
@group(1) @binding(1) var<storage, read_write> SINK: array<u32>;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn stream_read(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let threads = nwg.x * nwg.y * WG;
    var i = linear_group(wg, nwg) * WG + lid;
    var acc = vec4<u32>(0u);
    // Two independent loads per iteration keep more reads in flight.
    for (; i + threads < P.n; i += 2u * threads) {
        acc ^= SRC[i] ^ SRC[i + threads];
    }
    if (i < P.n) {
        acc ^= SRC[i];
    }
    let r = acc.x ^ acc.y ^ acc.z ^ acc.w;
    if (r == P.sentinel) {
        SINK[lid] = r;
    }
}

// Loads per thread of stream_read_fixed (compiled in: a constant trip
// count, so a thread's loads all go out before the first returns, as the
// decode kernels' do; the grid-stride loop above takes them two per round
// trip, which at a single op's size is a dispatch's latency, not its
// bandwidth).
override PER: u32 = 8u;

// Thread i of T = ceil(n / PER) reads SRC[i + j T] for j < PER: each load
// instruction coalesced across a warp, the tail (past n) re-reading the
// last element and dropping it.
@compute @workgroup_size(256)
fn stream_read_fixed(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let t = (P.n + PER - 1u) / PER;
    let i = linear_group(wg, nwg) * WG + lid;
    var acc = vec4<u32>(0u);
    if (i < t) {
        for (var j = 0u; j < PER; j++) {
            let k = i + j * t;
            let v = SRC[min(k, P.n - 1u)];
            acc ^= select(vec4<u32>(0u), v, k < P.n);
        }
    }
    let r = acc.x ^ acc.y ^ acc.z ^ acc.w;
    if (r == P.sentinel) {
        SINK[lid] = r;
    }
}
