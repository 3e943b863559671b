// Shared by the two prefill GEMM families (kernels/gemm.wgsl and
// kernels/gemm_coop.wgsl; appended to each by the backend): the token tiles
// over the route list moe_route builds (kernels/moe.wgsl). Each family
// defines P (with m and experts), ROUTE, DENSE and bm(), its tile's rows.

// The token tile `tm`: (expert, rows, start). Grouped: the slots of ROUTE in
// order, each cut into ceil(count / BM) tiles; past the last, zero rows.
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
