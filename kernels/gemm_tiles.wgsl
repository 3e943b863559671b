// Shared by the two prefill GEMM families (kernels/gemm.wgsl and
// kernels/gemm_coop.wgsl; appended to each by the backend): their
// parameter block (the Rust `ops::gemm::Params`) and the token tiles over
// the route list moe_route builds (kernels/moe.wgsl). Each family defines
// ROUTE, DENSE and bm(), its tile's rows.

struct Params {
    // dense: rows of x; grouped: tokens
    m: u32,
    // output row stride
    n: u32,
    k: u32,
    // dense: weight rows of this binding; gate_up: inter (features); down: hidden
    rows: u32,
    // dense: first output feature of this chunk
    row0: u32,
    experts: u32,
    top_k: u32,
    // token tiles dispatched per row block
    mtiles: u32,
    // k per split (dense: k split over workgroups when the output has too
    // few tiles to fill the GPU; = k otherwise), row blocks, splits
    kc: u32,
    nrb: u32,
    ks: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> P: Params;

// The token tile `tm`: (expert, rows, start). Grouped: the slots of ROUTE in
// order, each cut into ceil(count / BM) tiles; past the last, zero rows.
// One thread's walk, a round trip to the route list per slot before tm's:
// the kernels search with tile_search (all of a workgroup's threads).
fn find_tile(mode: u32, tm: u32) -> vec4<u32> {
    let b = bm();
    if (mode == DENSE) {
        let start = tm * b;
        if (start >= P.m) {
            return vec4<u32>(0u);
        }
        return vec4<u32>(0u, min(b, P.m - start), start, 0u);
    }
    let ne = P.experts;
    let used = ROUTE[0];
    var first = 0u;
    for (var s = 0u; s < used; s++) {
        let cnt = ROUTE[1u + ne + s];
        let nt = (cnt + b - 1u) / b;
        if (tm < first + nt) {
            let start = (tm - first) * b;
            return vec4<u32>(ROUTE[1u + s], min(b, cnt - start), ROUTE[1u + 2u * ne + s] + start, 0u);
        }
        first += nt;
    }
    return vec4<u32>(0u);
}

// The workgroup's token tile (what find_tile returns), shared through
// workgroup memory: tile_search writes it, workgroupUniformLoad reads it.
var<workgroup> tile: vec4<u32>;

// tile_search's scratch: the searching threads' tile counts, then their
// inclusive prefix sums.
const TS: u32 = 256u;
var<workgroup> tscan: array<u32, TS>;

// find_tile(mode, tm) into `tile`, by every thread of the workgroup
// (`nthreads` of them; call in uniform control flow). Grouped: searching
// thread t (t < min(nthreads, TS)) counts the tiles of slots t * per ..
// (per + 1) * per, a scan of the counts gives each its first tile, and the
// thread whose range holds tm walks its slots again: two round trips to the
// route list and log2(threads) barrier pairs, not one round trip per slot
// (up to 128 for Gemma 4's experts, microseconds before a workgroup's
// first load).
fn tile_search(mode: u32, tm: u32, lid: u32, nthreads: u32) {
    let np = min(nthreads, TS);
    let ne = P.experts;
    let per = (ne + np - 1u) / np;
    let b = bm();
    let on = mode != DENSE && lid < np;
    var used = 0u;
    var c = 0u;
    if (on) {
        used = ROUTE[0];
        for (var i = 0u; i < per; i++) {
            let s = lid * per + i;
            if (s < used) {
                c += (ROUTE[1u + ne + s] + b - 1u) / b;
            }
        }
        tscan[lid] = c;
    }
    if (lid == 0u) {
        tile = select(vec4<u32>(0u), find_tile(mode, tm), mode == DENSE);
    }
    for (var off = 1u; off < np; off <<= 1u) {
        workgroupBarrier();
        var v = 0u;
        if (lid < np) {
            v = tscan[lid];
            if (lid >= off) {
                v += tscan[lid - off];
            }
        }
        workgroupBarrier();
        if (lid < np) {
            tscan[lid] = v;
        }
    }
    workgroupBarrier();
    if (on && c > 0u) {
        var first = tscan[lid] - c;
        if (tm >= first && tm < first + c) {
            for (var i = 0u; i < per; i++) {
                let s = lid * per + i;
                if (s < used) {
                    let cnt = ROUTE[1u + ne + s];
                    let nt = (cnt + b - 1u) / b;
                    if (tm < first + nt) {
                        let start = (tm - first) * b;
                        tile = vec4<u32>(ROUTE[1u + s], min(b, cnt - start), ROUTE[1u + 2u * ne + s] + start, 0u);
                        break;
                    }
                    first += nt;
                }
            }
        }
    }
}
