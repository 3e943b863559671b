// A chain of dependent GEMV steps two ways, for examples/kernel_lab.rs's
// `grid_sync` case (not used by the backend; compiled after
// kernels/common.wgsl, whose decode_pair reads the bf16 weights at its
// default WDTYPE): step s computes
// X[s + 1] = W[s] X[s] (square, `rows` x `rows`, bf16 weights, f32 x),
// either as one dispatch a step (`chain_step`, the way a decode step runs
// today: a barrier between dispatches) or as one dispatch of persistent
// workgroups that walk every step with a grid-wide barrier between steps
// (`chain_persist`). Both share `step_block`, so they compute the same bits
// in the same order, and the lab compares the two outputs exactly: a
// barrier that let a workgroup read a step's input early shows there.
//
// WGSL promises no forward progress between workgroups, so the persistent
// form is only sound when every workgroup of its grid is resident at once,
// which the driver's register allocation decides: on the H200 352
// workgroups ran in one compile and hung in the next (docs/decisions.md,
// 2026-12-01). The lab's default grids stay at 132 and 264.

struct Params {
    rows: u32,
    steps: u32,
    // chain_step's step
    step: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
// steps matrices, each rows x rows bf16, rows of rows / 8 vec4s
@group(1) @binding(0) var<storage, read> W: array<vec4<u32>>;
// (steps + 1) vectors of rows; coherent where the device has it (the lab
// replaces the mark), as a grid barrier's reader must see other
// workgroups' writes past its own cache
@group(1) @binding(1) /* @coherent */ var<storage, read_write> X: array<f32>;
// X again (the same buffer), staged 4 at a time
@group(1) @binding(3) /* @coherent */ var<storage, read_write> X4: array<vec4<f32>>;
// SYNC[0]: arrivals, only ever increased (see grid_sync)
@group(1) @binding(2) var<storage, read_write> SYNC: array<atomic<u32>>;

const LANES: u32 = 32u;
const ROWS: u32 = 8u;
// (a lane loads 11 vec4s of a row, Lw: rows / 8 / LANES at most)

var<workgroup> part: array<f32, 256>;
// vec4s of x a thread stages (2816 / 4 / 256, rounded up)
const XV: u32 = 3u;
var<workgroup> xs: array<vec4<f32>, 704>;


// A lane's weights of rows rb * ROWS .. of step s, as named registers (a
// struct, statically indexed: an array indexed by a loop went to local
// memory on the H200, a rule since 2026-12-01), with no dependence on the
// step's input, so a persistent workgroup can issue them before it waits
// for that input (chain_persist's PRE).
struct Lw {
    a0: vec4<u32>, a1: vec4<u32>, a2: vec4<u32>, a3: vec4<u32>,
    a4: vec4<u32>, a5: vec4<u32>, a6: vec4<u32>, a7: vec4<u32>,
    a8: vec4<u32>, a9: vec4<u32>, a10: vec4<u32>,
}

// Block c of lane t % LANES's row rr of step s (clamped into the row).
fn ld(s: u32, rr: u32, t: u32, c: u32) -> vec4<u32> {
    let kq = P.rows / 8u;
    return W[(s * P.rows + rr) * kq + min(t % LANES + c * LANES, kq - 1u)];
}

fn load_w(s: u32, rb: u32, t: u32) -> Lw {
    let rr = min(rb * ROWS + t / LANES, P.rows - 1u);
    return Lw(
        ld(s, rr, t, 0u),
        ld(s, rr, t, 1u),
        ld(s, rr, t, 2u),
        ld(s, rr, t, 3u),
        ld(s, rr, t, 4u),
        ld(s, rr, t, 5u),
        ld(s, rr, t, 6u),
        ld(s, rr, t, 7u),
        ld(s, rr, t, 8u),
        ld(s, rr, t, 9u),
        ld(s, rr, t, 10u),
    );
}

// Weights v (block c of the lane's row) times the staged x; zero past the row.
fn dotc(v: vec4<u32>, t: u32, c: u32) -> f32 {
    let kq = P.rows / 8u;
    let b = t % LANES + c * LANES;
    let bb = min(b, kq - 1u);
    let x0 = xs[2u * bb];
    let x1 = xs[2u * bb + 1u];
    let d = dot(vec4<f32>(decode_pair(v.x), decode_pair(v.y)), x0)
          + dot(vec4<f32>(decode_pair(v.z), decode_pair(v.w)), x1);
    return select(0.0, d, b < kq);
}

// Rows rb * ROWS .. of step s from their weights `w`: X[s] staged into
// workgroup memory (vec4 loads, a constant trip count, all in flight at
// once), each lane's dot products, a tree sum over the row's lanes.
fn finish_block(s: u32, rb: u32, t: u32, w: Lw) {
    let n = P.rows;
    let lane = t % LANES;
    let r = rb * ROWS + t / LANES;
    let n4 = n / 4u;
    for (var c = 0u; c < XV; c++) {
        let i = min(t + c * 256u, n4 - 1u);
        xs[i] = X4[s * n4 + i];
    }
    workgroupBarrier();
    var acc = dotc(w.a0, t, 0u) + dotc(w.a1, t, 1u) + dotc(w.a2, t, 2u) + dotc(w.a3, t, 3u);
    acc += dotc(w.a4, t, 4u) + dotc(w.a5, t, 5u) + dotc(w.a6, t, 6u) + dotc(w.a7, t, 7u);
    acc += dotc(w.a8, t, 8u) + dotc(w.a9, t, 9u) + dotc(w.a10, t, 10u);
    part[t] = acc;
    workgroupBarrier();
    for (var h = LANES / 2u; h > 0u; h >>= 1u) {
        if (lane < h) {
            part[t] += part[t + h];
        }
        workgroupBarrier();
    }
    if (lane == 0u && r < n) {
        X[(s + 1u) * n + r] = part[t];
    }
    // (xs and part are rewritten by the next block)
    workgroupBarrier();
}

// Every workgroup of the grid (`groups` of them) waits here until all have
// arrived. The arrival count only grows: arrival a (1-based) belongs to
// barrier ceil(a / groups), which is complete once the count reaches that
// times groups; so no reset races a fast workgroup's next arrival, and
// dispatches of the same grid size can share the counter.
fn grid_sync(t: u32, groups: u32) {
    storageBarrier();
    if (t == 0u) {
        let a = atomicAdd(&SYNC[0], 1u) + 1u;
        let want = ((a + groups - 1u) / groups) * groups;
        loop {
            if (atomicLoad(&SYNC[0]) >= want) {
                break;
            }
        }
    }
    workgroupBarrier();
    storageBarrier();
}

@compute @workgroup_size(256)
fn chain_step(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    if (wg.x * ROWS < P.rows) {
        finish_block(P.step, wg.x, t, load_w(P.step, wg.x, t));
    }
}

// How a persistent workgroup orders its weight loads around the barrier:
// 0 waits for the step's input, then loads; 1 issues its first block's
// loads, then waits (the memory system busy across the dependency, which a
// barrier between dispatches rules out); 2 issues the next step's loads
// before it waits and works on this step's (two steps' weights in
// registers: the stream never stops for the chain).
override PRE: u32 = 0u;

@compute @workgroup_size(256)
fn chain_persist(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) t: u32) {
    let blocks = (P.rows + ROWS - 1u) / ROWS;
    let own = wg.x < blocks;
    var w: Lw;
    if (PRE == 2u && own) {
        w = load_w(0u, wg.x, t);
    }
    for (var s = 0u; s < P.steps; s++) {
        var wn: Lw;
        if (PRE == 1u && own) {
            w = load_w(s, wg.x, t);
        }
        if (PRE == 2u && own && s + 1u < P.steps) {
            wn = load_w(s + 1u, wg.x, t);
        }
        if (s > 0u) {
            grid_sync(t, nwg.x);
        }
        for (var rb = wg.x; rb < blocks; rb += nwg.x) {
            if (PRE == 0u || rb != wg.x) {
                w = load_w(s, rb, t);
            }
            finish_block(s, rb, t, w);
        }
        if (PRE == 2u) {
            w = wn;
        }
    }
}
