// Shared by the two prefill GEMM families (kernels/gemm.wgsl and
// kernels/gemm_coop.wgsl; appended to each by the backend): their
// parameter block (the Rust `ops::gemm::Params`) and the token tiles over
// the route list moe_route builds (kernels/moe.wgsl). Each family defines
// ROUTE, DENSE, bm() (its tile's rows) and
// `var<workgroup> tile: vec4<u32>`.

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

// Each route slot's tile count, loaded by the whole workgroup at once
// (stage_tile), so find_tile walks workgroup memory: a chain of global
// loads, one per slot before the tile's, set every grouped workgroup's
// start. 256 = ops::MAX_EXPERTS.
var<workgroup> slot_tiles: array<u32, 256>;

// The token tile `tm`: (expert, rows, start). Grouped: the slots of ROUTE in
// order, each cut into ceil(count / BM) tiles; past the last, zero rows.
// Grouped, it reads slot_tiles: call it through stage_tile.
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
        let nt = slot_tiles[s];
        if (tm < first + nt) {
            let cnt = ROUTE[1u + ne + s];
            let start = (tm - first) * b;
            return vec4<u32>(ROUTE[1u + s], min(b, cnt - start), ROUTE[1u + 2u * ne + s] + start, 0u);
        }
        first += nt;
    }
    return vec4<u32>(0u);
}

// find_tile's result into `tile` (each family declares it), by a workgroup
// of `n` threads (every one calls this; read it with workgroupUniformLoad).
fn stage_tile(mode: u32, tm: u32, lid: u32, n: u32) {
    if (mode != DENSE) {
        let used = ROUTE[0];
        let b = bm();
        for (var s = lid; s < used; s += n) {
            slot_tiles[s] = (ROUTE[1u + P.experts + s] + b - 1u) / b;
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        tile = find_tile(mode, tm);
    }
}
