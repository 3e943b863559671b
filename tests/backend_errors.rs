//! Bad calls are errors that name the op, the same on both backends.

mod common;
#[path = "common/primitives_only.rs"]
mod primitives_only;

use primitives_only::PrimitivesOnly;
use turbospark::ops::{
    Attention, CopyRange, KvAppend, Moe, PostAttention, PostFfn, QkvPost, RmsNorm, Router,
};
use turbospark::{
    ComputeBackend, DType, Error, GateUpArgs, HostBytes, PostAttentionArgs, PostFfnArgs, RouterArgs,
};
use turbospark_cpu::CpuBackend;

/// `r` is the op's shape error (`Error::Shape` naming `op`) saying `needle`.
#[track_caller]
fn shape_error<T>(r: turbospark::Result<T>, op: &str, needle: &str) {
    let Err(e) = r else {
        panic!("{op}: accepted, expected an error saying {needle:?}")
    };
    assert!(
        matches!(&e, Error::Shape { op: o, .. } if *o == op) && e.to_string().contains(needle),
        "{e}"
    );
}

fn bad_calls<B: ComputeBackend>(b: &B) {
    let v: Vec<f32> = (0..8).map(|i| i as f32 + 0.5).collect();
    let a = b
        .upload(DType::F32, HostBytes::Slice(bytemuck::cast_slice(&v)), "a")
        .unwrap();
    let c = b
        .upload(DType::F32, HostBytes::Slice(bytemuck::cast_slice(&v)), "c")
        .unwrap();
    // An output aliasing an input.
    shape_error(b.add(&a, &c, &a, 8), "add", "aliases");
    // A buffer too short for the shape.
    shape_error(b.add(&a, &c, &c, 9), "add", "needs 9");
    // A dtype the op does not take.
    let ids = b.alloc(DType::U32, 8, "ids").unwrap();
    let e = b.scale(&ids, &c, 8, 2.0).unwrap_err();
    assert!(e.to_string().contains("dtype u32"), "{e}");
    // A copied range past its buffer, of two dtypes, onto its source.
    let range = |src_offset, dst_offset, len| CopyRange {
        src_offset,
        dst_offset,
        len,
    };
    shape_error(
        b.copy_range(&a, &c, range(5, 0, 4)),
        "copy_range",
        "needs 9",
    );
    shape_error(
        b.copy_range(&a, &c, range(0, usize::MAX, 1)),
        "copy_range",
        "overflows",
    );
    shape_error(
        b.copy_range(&a, &ids, range(0, 0, 4)),
        "copy_range",
        "one dtype",
    );
    shape_error(
        b.copy_range(&a, &a, range(0, 4, 4)),
        "copy_range",
        "aliases",
    );
    b.copy_range(&a, &c, range(6, 1, 2)).unwrap();
    let got = b.download_f32(&c).unwrap();
    assert_eq!(got[..4], [0.5, 6.5, 7.5, 3.5], "copied, the rest left");
    // The slot lookup: a log too short for its offset, a table of more
    // slots than experts, slot ids written over the ids.
    let (table, slots, log) = (
        b.alloc(DType::U32, 8, "table").unwrap(),
        b.alloc(DType::U32, 8, "slots").unwrap(),
        b.alloc(DType::U32, 8, "log").unwrap(),
    );
    let lookup = turbospark::ops::SlotLookup {
        n: 2,
        experts: 8,
        slots: 4,
        at: 7,
    };
    shape_error(
        b.slot_lookup(&ids, &table, &slots, &log, lookup),
        "slot_lookup",
        "`log` holds 8 elements, needs 9",
    );
    let too_many = turbospark::ops::SlotLookup {
        slots: 9,
        at: 0,
        ..lookup
    };
    shape_error(
        b.slot_lookup(&ids, &table, &slots, &log, too_many),
        "slot_lookup",
        "9 slots of 8 experts",
    );
    let at0 = turbospark::ops::SlotLookup { at: 0, ..lookup };
    shape_error(
        b.slot_lookup(&ids, &table, &ids, &log, at0),
        "slot_lookup",
        "aliases",
    );
    // Fused ops: two outputs that are one buffer, an output over an input.
    let w = b
        .upload(DType::F32, HostBytes::Slice(bytemuck::cast_slice(&v)), "w")
        .unwrap();
    let out = b.alloc(DType::F32, 8, "out").unwrap();
    let p = PostAttention {
        rows: 1,
        dim: 8,
        eps: 1e-6,
    };
    shape_error(
        b.post_attention(&a, &c, &w, &w, &out, &out, None, p),
        "post_attention",
        "aliases",
    );
    let p = PostFfn {
        rows: 1,
        dim: 8,
        eps: 1e-6,
        scale: 1.0,
    };
    shape_error(
        b.post_ffn(PostFfnArgs {
            dense: &a,
            w_dense: &w,
            moe: None,
            r: &c,
            x: &c,
            next: None,
            p,
        }),
        "post_ffn",
        "aliases",
    );
    // Pair ops: each half is fine alone, but the second writes the first's
    // input (a GPU runs the halves at once).
    let gu = b
        .upload(
            DType::F32,
            HostBytes::Slice(bytemuck::cast_slice(&[0.5f32; 32])),
            "gu",
        )
        .unwrap();
    let id0 = b
        .upload(
            DType::U32,
            HostBytes::Slice(bytemuck::cast_slice(&[0u32])),
            "ids",
        )
        .unwrap();
    let (act, x2) = (
        b.alloc(DType::F32, 2, "act").unwrap(),
        b.alloc(DType::F32, 8, "x2").unwrap(),
    );
    let p = Moe {
        m: 1,
        hidden: 8,
        inter: 2,
        experts: 1,
        top_k: 1,
        precision: turbospark::Precision::Exact,
    };
    let half = |x, act| GateUpArgs {
        x,
        gate_up: &gu,
        ids: &id0,
        act,
        p,
    };
    let mid = b.alloc(DType::F32, 8, "mid").unwrap();
    let act2 = b.alloc(DType::F32, 2, "act2").unwrap();
    // Apart: accepted. Then the second half's output is the first's x.
    b.moe_gate_up_pair(half(&x2, &act), half(&mid, &act2))
        .unwrap();
    let e = b
        .moe_gate_up_pair(half(&a, &act), half(&mid, &a))
        .unwrap_err();
    assert!(
        matches!(&e, Error::Shape { op, .. } if op.contains("moe_gate_up"))
            && e.to_string().contains("aliases"),
        "{e}"
    );
    // The router: its weights written over its input (`Router::validate`,
    // every backend's check).
    let rp = Router {
        m: 1,
        hidden: 8,
        experts: 2,
        top_k: 1,
        eps: 1e-6,
    };
    let proj = b
        .upload(
            DType::F32,
            HostBytes::Slice(bytemuck::cast_slice(&[0.25f32; 16])),
            "proj",
        )
        .unwrap();
    let rid = b.alloc(DType::U32, 1, "rid").unwrap();
    shape_error(
        b.router(&a, &w, &proj, &c, &rid, &a, rp),
        "router",
        "aliases",
    );
    // post_attention_gate_up: the routed gate_up must read the router's ids.
    let (r, ff, moe_in, rw) = (
        b.alloc(DType::F32, 8, "r").unwrap(),
        b.alloc(DType::F32, 8, "ff").unwrap(),
        b.alloc(DType::F32, 8, "moe_in").unwrap(),
        b.alloc(DType::F32, 1, "rw").unwrap(),
    );
    let pa = || PostAttentionArgs {
        o: &a,
        x: &c,
        w_post: &w,
        w_ff: &w,
        r: &r,
        ff: &ff,
        moe: (&w, &moe_in),
        p: PostAttention {
            rows: 1,
            dim: 8,
            eps: 1e-6,
        },
    };
    let router = || RouterArgs {
        eff_scale: &w,
        proj: &proj,
        per_expert_scale: &c,
        ids: &rid,
        weights: &rw,
        p: rp,
    };
    let routed = GateUpArgs {
        x: &moe_in,
        gate_up: &gu,
        ids: &id0,
        act: &act2,
        p: Moe { experts: 2, ..p },
    };
    shape_error(
        b.post_attention_gate_up((pa(), router()), half(&ff, &act), routed),
        "post_attention_gate_up",
        "router's ids",
    );
    // post_attention_gate_up_slots: the lookup maps the router's 2 experts
    // into the slot stack the routed gate_up reads, of as many slots.
    let (table, slot_ids, log) = (
        b.alloc(DType::U32, 2, "table").unwrap(),
        b.alloc(DType::U32, 1, "slot_ids").unwrap(),
        b.alloc(DType::U32, 4, "log").unwrap(),
    );
    let slots = |n| turbospark::SlotArgs {
        table: &table,
        log: &log,
        p: turbospark::ops::SlotLookup {
            n: 1,
            experts: 2,
            slots: n,
            at: 3,
        },
    };
    let on_slots = |ids| GateUpArgs {
        x: &moe_in,
        gate_up: &gu,
        ids,
        act: &act2,
        p: Moe { experts: 1, ..p },
    };
    shape_error(
        b.post_attention_gate_up_slots(
            (pa(), router()),
            half(&ff, &act),
            on_slots(&slot_ids),
            slots(2),
        ),
        "post_attention_gate_up_slots",
        "slot stack holds 1",
    );
    shape_error(
        b.post_attention_gate_up_slots((pa(), router()), half(&ff, &act), on_slots(&rid), slots(1)),
        "post_attention_gate_up_slots",
        "aliases",
    );
    // attention writing over its queries, kv_append with one cache for both
    // (the aliasing rules live in Attention / KvAppend::validate).
    let ap1 = Attention {
        m: 1,
        heads: 1,
        kv_heads: 1,
        head_dim: 8,
        capacity: 1,
        window: 0,
        scale: 1.0,
        precision: turbospark::Precision::Exact,
    };
    let pos0 = b.alloc(DType::U32, 1, "pos0").unwrap();
    shape_error(
        b.attention(&a, &c, &c, &pos0, &a, ap1),
        "attention",
        "aliases",
    );
    let kv = KvAppend {
        m: 1,
        kv_heads: 1,
        head_dim: 8,
        capacity: 1,
    };
    shape_error(
        b.kv_append(&a, &a, &c, &c, &pos0, kv),
        "kv_append",
        "aliases",
    );
    // qkv_post_attention whose two halves disagree: named, before any work.
    let qp = QkvPost {
        m: 1,
        heads: 2,
        kv_heads: 1,
        head_dim: 8,
        rot_pairs: 4,
        theta: 10_000.0,
        eps: 1e-6,
        capacity: 4,
        v_from_k: true,
    };
    let ap = Attention {
        capacity: 5,
        ..qp.attention(0, 1.0, turbospark::Precision::Exact)
    };
    let raw = b.alloc(DType::F32, 24, "raw").unwrap();
    let pos = b.alloc(DType::U32, 1, "pos").unwrap();
    let (q, att) = (
        b.alloc(DType::F32, 16, "q").unwrap(),
        b.alloc(DType::F32, 16, "att").unwrap(),
    );
    let (kc, vc) = (
        b.alloc(DType::F32, 40, "kc").unwrap(),
        b.alloc(DType::F32, 40, "vc").unwrap(),
    );
    shape_error(
        b.qkv_post_attention(&raw, &w, &w, &pos, &q, &kc, &vc, &att, qp, ap),
        "qkv_post_attention",
        "capacity 4, attention 5",
    );
    // qkv_post_attention_row past the pass's rows (raw holds one row of
    // 24), with its output over its scratch, and over its queries: named,
    // before any work.
    let ap = qp.attention(0, 1.0, turbospark::Precision::Exact);
    let (row_raw, row_out) = (
        b.alloc(DType::F32, 24, "row_raw").unwrap(),
        b.alloc(DType::F32, 16, "row_out").unwrap(),
    );
    let scratch = (&row_raw, &row_out);
    shape_error(
        b.qkv_post_attention_row(1, &raw, &w, &w, &pos, &q, &kc, &vc, &att, scratch, qp, ap),
        "qkv_post_attention_row",
        "`raw`",
    );
    shape_error(
        b.qkv_post_attention_row(
            0, &raw, &w, &w, &pos, &q, &kc, &vc, &row_out, scratch, qp, ap,
        ),
        "qkv_post_attention_row",
        "aliases",
    );
    shape_error(
        b.qkv_post_attention_row(0, &raw, &w, &w, &pos, &q, &kc, &vc, &q, scratch, qp, ap),
        "qkv_post_attention_row",
        "aliases",
    );
}

#[test]
fn cpu_rejects_bad_calls() {
    bad_calls(&CpuBackend::new());
}

/// The trait runs every op's checks, so a backend with none of its own
/// (`PrimitivesOnly`: hooks forwarded unchecked to the CPU reference's)
/// rejects every bad call alike.
#[test]
fn primitives_only_rejects_bad_calls() {
    bad_calls(&PrimitivesOnly::new());
}

/// A bad shape or an aliased output is refused before the backend's hook is
/// reached, in a primitive op and in a fused one (whose default body is
/// primitive ops): the checks live in the trait, not in each backend.
#[test]
fn checks_run_before_any_hook() {
    let b = PrimitivesOnly::new();
    let f32s = |n: usize, label| {
        let v: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 1.0).collect();
        b.upload(
            DType::F32,
            HostBytes::Slice(bytemuck::cast_slice(&v)),
            label,
        )
        .unwrap()
    };
    let (x, w, out, short) = (f32s(8, "x"), f32s(8, "w"), f32s(8, "out"), f32s(4, "short"));
    let norm = RmsNorm {
        rows: 1,
        dim: 8,
        eps: 1e-6,
        scale: 1.0,
    };
    shape_error(
        b.rms_norm(&x, Some(&w), None, &short, norm),
        "rms_norm",
        "`out` holds 4 elements, needs 8",
    );
    shape_error(
        b.rms_norm(&x, Some(&w), None, &x, norm),
        "rms_norm",
        "aliases",
    );
    assert_eq!(b.take_calls(), Vec::<&str>::new(), "a hook saw a bad call");
    b.rms_norm(&x, Some(&w), None, &out, norm).unwrap();
    assert_eq!(b.take_calls(), ["rms_norm"]);

    let (r, ff) = (f32s(8, "r"), f32s(8, "ff"));
    let pa = PostAttention {
        rows: 1,
        dim: 8,
        eps: 1e-6,
    };
    shape_error(
        b.post_attention(&x, &out, &w, &w, &short, &ff, None, pa),
        "post_attention",
        "`r` holds 4 elements, needs 8",
    );
    shape_error(
        b.post_attention(&x, &out, &w, &w, &r, &x, None, pa),
        "post_attention",
        "aliases",
    );
    assert_eq!(b.take_calls(), Vec::<&str>::new(), "a hook saw a bad call");
    b.post_attention(&x, &out, &w, &w, &r, &ff, None, pa)
        .unwrap();
    assert_eq!(b.take_calls(), ["rms_norm", "rms_norm"]);
}

/// Each op's contract names its buffer arguments by role, as a backend's
/// rule on how it holds them (`ComputeBackend::check_held`) reads them: a
/// weight a backend may split, an MoE phase's expert stack with its kind
/// and count, every other argument plain; an absent optional argument is
/// left out, and the op is named.
#[test]
fn contracts_name_arguments_by_role() {
    use turbospark::ops::{Args, Matmul, Role};
    use turbospark::ExpertStack;
    let b = CpuBackend::new();
    let f32s = |n: usize| b.alloc(DType::F32, n, "f32").unwrap();
    let ids = b.alloc(DType::U32, 2, "ids").unwrap();
    let roles = |a: Args<'_, _>| {
        let list: Vec<_> = a.list.iter().map(|x| (x.name, x.role)).collect();
        (a.op, list)
    };
    let (x, w, out) = (f32s(8), f32s(8), f32s(8));
    let norm = RmsNorm {
        rows: 1,
        dim: 8,
        eps: 1e-6,
        scale: 1.0,
    };
    let plain = |names: &[&'static str]| -> Vec<(&'static str, Role)> {
        names.iter().map(|n| (*n, Role::Plain)).collect()
    };
    assert_eq!(
        roles(norm.validate(&x, Some(&w), None, &out).unwrap()),
        ("rms_norm", plain(&["x", "weight", "out"]))
    );
    let mm = Matmul {
        m: 1,
        n: 1,
        k: 8,
        precision: turbospark::Precision::Exact,
    };
    let one = f32s(1);
    assert_eq!(
        roles(mm.validate(&w, &x, &one).unwrap()),
        (
            "matmul",
            vec![
                ("w", Role::Weight),
                ("x", Role::Plain),
                ("out", Role::Plain)
            ]
        )
    );
    // 2 experts of inter 2 over hidden 4, one token's top 2.
    let p = Moe {
        m: 1,
        hidden: 4,
        inter: 2,
        experts: 2,
        top_k: 2,
        precision: turbospark::Precision::Exact,
    };
    let (gate_up, down, act) = (f32s(2 * 2 * 2 * 4), f32s(2 * 4 * 2), f32s(2 * 2));
    let stack = |gate_up| {
        Role::Experts(ExpertStack {
            experts: 2,
            gate_up,
        })
    };
    let (x4, out4, weights) = (f32s(4), f32s(4), f32s(2));
    assert_eq!(
        roles(p.validate_gate_up(&x4, &gate_up, &ids, &act).unwrap()),
        (
            "moe_gate_up",
            vec![
                ("x", Role::Plain),
                ("gate_up", stack(true)),
                ("ids", Role::Plain),
                ("act", Role::Plain)
            ]
        )
    );
    let routed = p.validate_down(&act, &down, &ids, &weights, &out4).unwrap();
    assert_eq!(routed.list[1].name, "down");
    assert_eq!(routed.list[1].role, stack(false));
    let pf = PostFfn {
        rows: 1,
        dim: 8,
        eps: 1e-6,
        scale: 1.0,
    };
    let (dense, r) = (f32s(8), f32s(8));
    assert_eq!(
        roles(pf.check(&dense, &w, None, &r, &out, None).unwrap()),
        ("post_ffn", plain(&["dense", "r", "w_dense", "x"]))
    );
}

#[test]
fn wgpu_rejects_bad_calls() {
    if let Some(b) = common::wgpu_backend() {
        bad_calls(&b);
    }
}

/// Asking for tensor cores where the adapter has none is an error that
/// names what is missing (lavapipe); where it has them, the backend opens
/// with the tensor-core GEMM on. Bad option text is an error too.
#[test]
fn tensor_cores_required_or_named() {
    use turbospark_wgpu::{WgpuBackend, WgpuOptions};
    // (an adapter at all: the usual skip / CI rule)
    let Some(any) = common::wgpu_backend() else {
        return;
    };
    let name = any.info().device_name.clone();
    // What the adapter offers (TURBOSPARK_TENSOR_CORES may have turned the
    // GEMM off for `any` itself).
    let f = any.features();
    let has = f.shader_f16
        && f.cooperative_matrix
            .iter()
            .any(|c| c == "16x16x16 f16->f32")
        && f.subgroup_min_size == 32
        && f.subgroup_max_size == 32;
    drop(any);
    let required = WgpuBackend::new(&WgpuOptions {
        tensor_cores: Some(true),
        ..Default::default()
    });
    match required {
        Ok(b) => assert!(has && b.features().tensor_core_gemm, "{name}"),
        Err(e) => {
            let msg = e.to_string();
            assert!(!has, "{name} has them but: {msg}");
            assert!(
                matches!(e, Error::Unsupported { .. })
                    && msg.contains("16x16x16 f16->f32")
                    && msg.contains(&name),
                "{msg}"
            );
        }
    }
    let off = WgpuBackend::new(&WgpuOptions {
        tensor_cores: Some(false),
        ..Default::default()
    })
    .unwrap();
    assert!(!off.features().tensor_core_gemm);
    drop(off);
    let bad = WgpuBackend::new(&WgpuOptions {
        coop_tiles: Some("2,4".into()),
        ..Default::default()
    });
    let msg = bad.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(msg.contains("\"2,4\" is not wm,wn,stage_x"), "{msg}");
}

/// An expert stack stored in tile order is read only by the MoE op that
/// takes it: any other op, the other phase, or another expert count is an
/// error that says so, never a result read in the wrong order.
#[test]
fn tiled_expert_stacks_only_where_they_belong() {
    use turbospark::ops::{Embed, Matmul};
    use turbospark::ExpertStack;
    let Some(b) = common::wgpu_backend_with(&turbospark_wgpu::WgpuOptions {
        expert_tiles: Some(true),
        ..Default::default()
    }) else {
        return;
    };
    // 2 experts of 64 x 16 (gate_up: 32 features of hidden 16).
    let (e, rows, cols) = (2, 64, 16);
    let bytes = vec![0x3c00u16; e * rows * cols];
    let stack = |gate_up| {
        b.upload_experts(
            DType::F16,
            ExpertStack {
                experts: e,
                gate_up,
            },
            (e * rows, cols),
            HostBytes::Slice(bytemuck::cast_slice(&bytes)),
            "experts",
        )
        .unwrap()
    };
    let (gu, down) = (stack(true), stack(false));
    let f32s = |n: usize| {
        b.upload(
            DType::F32,
            HostBytes::Slice(bytemuck::cast_slice(&vec![0.5f32; n])),
            "f32",
        )
        .unwrap()
    };
    let ids = b
        .upload(
            DType::U32,
            HostBytes::Slice(bytemuck::cast_slice(&[0u32, 1])),
            "ids",
        )
        .unwrap();
    let invalid = |r: turbospark::Result<()>, needle: &str| match r {
        Err(Error::InvalidInput(m)) => assert!(m.contains(needle), "{m}"),
        other => panic!("expected an error saying {needle:?}, got {other:?}"),
    };
    let mm = Matmul {
        m: 1,
        n: e * rows,
        k: cols,
        precision: turbospark::Precision::Exact,
    };
    invalid(
        b.matmul(&gu, &f32s(cols), &f32s(e * rows), mm),
        "matmul: `w` holds 2 gate_up experts stored in tile order (upload_experts), \
         which only the MoE ops read",
    );
    let emb = Embed {
        m: 1,
        vocab: e * rows,
        hidden: cols,
        scale: 1.0,
    };
    invalid(
        b.embed(&ids, &gu, &f32s(cols), emb),
        "embed: `table` holds 2 gate_up experts",
    );
    // As a norm's weight (any op's non-expert argument).
    let norm = turbospark::ops::RmsNorm {
        rows: 1,
        dim: 64,
        eps: 1e-6,
        scale: 1.0,
    };
    invalid(
        b.rms_norm(&f32s(64), Some(&down), None, &f32s(64), norm),
        "rms_norm: `weight` holds 2 down experts",
    );
    // An empty stack is a shape error, not a tiling of nothing.
    let empty = b.upload_experts(
        DType::F16,
        ExpertStack {
            experts: 1,
            gate_up: false,
        },
        (0, 16),
        HostBytes::Slice(&[]),
        "empty",
    );
    assert!(matches!(empty, Err(Error::Shape { .. })), "{empty:?}");
    // gate_up's stack where down's of the same size goes (hidden 64, inter
    // 16): refused for its kind.
    let p = Moe {
        m: 1,
        hidden: 64,
        inter: 16,
        experts: 2,
        top_k: 2,
        precision: turbospark::Precision::Exact,
    };
    invalid(
        b.moe_down(&f32s(2 * 16), &gu, &ids, &f32s(2), &f32s(64), p),
        "moe_down: `down` holds 2 gate_up experts stored in tile order (upload_experts), \
         not the 2 down experts this op takes",
    );
    // The same bytes as one expert of 128 rows, where two of 64 go:
    // refused for its expert count (the tile order is per expert).
    let one = b
        .upload_experts(
            DType::F16,
            ExpertStack {
                experts: 1,
                gate_up: false,
            },
            (e * rows, cols),
            HostBytes::Slice(bytemuck::cast_slice(&bytes)),
            "one expert",
        )
        .unwrap();
    invalid(
        b.moe_down(&f32s(2 * 16), &one, &ids, &f32s(2), &f32s(64), p),
        "moe_down: `down` holds 1 down experts",
    );
    // The right stack passes.
    b.moe_down(&f32s(2 * 16), &down, &ids, &f32s(2), &f32s(64), p)
        .unwrap();
    b.sync().unwrap();
}
