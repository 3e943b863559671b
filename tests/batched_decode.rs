//! Batched decode (`Model::decode_batch`): several sequences, each at its
//! own position with its own caches, stepped in one forward pass, give
//! what each gives alone: the same greedy tokens, the same seeded samples,
//! and with sequences joining and leaving between steps.
//!
//! The logits: a batched pass runs the weight-reading ops over m rows
//! where a lone step runs one (on a GPU, `gemv_rows` and the MoE kernels
//! with a token dimension instead of the decode pairs), and the dense MLP
//! as matmul, gelu_mul, matmul instead of a one-expert MoE. On the CPU
//! reference each row is the same sums in the same order either way, so
//! the rows are held bit for bit. On the wgpu backend the m-row kernels
//! split and order a row's sums their own way: the rows are held to
//! `SAME_PATH_NMSE`, the bound `tests/decoder.rs` holds a backend's
//! batched rows to its one-row ones (f32 sums of a few hundred terms
//! reordered, through a few layers), and the tokens exactly.

mod common;

use turbospark::model::sampling::Sampler;
use turbospark::model::synthetic::{tiny_config, SyntheticSource};
use turbospark::model::{
    Checkpoint, GenerateOptions, Model, ModelOptions, Sampling, Sequence, TensorSource,
};
use turbospark::ComputeBackend;
use turbospark_cpu::CpuBackend;

/// As in tests/decoder.rs: one backend's batched rows against its one-row
/// rows.
const SAME_PATH_NMSE: f64 = 1e-10;

/// Prefill batches of 4: the batched decode passes carry at most 4 rows,
/// so 6 sequences take two passes.
const BATCH: usize = 4;

fn opts() -> ModelOptions {
    ModelOptions {
        max_context: 64,
        prefill_batch: BATCH,
        ..Default::default()
    }
}

fn synthetic<B: ComputeBackend>(be: B) -> Model<B> {
    let src = SyntheticSource::new(tiny_config(), 42).unwrap();
    Model::load(be, &src, opts()).unwrap()
}

fn fixture<B: ComputeBackend>(be: B, name: &str) -> Model<B> {
    fixture_with(be, name, opts())
}

fn fixture_with<B: ComputeBackend>(be: B, name: &str, o: ModelOptions) -> Model<B> {
    let dir = common::repo_root().join("tests/fixtures").join(name);
    let ck = Checkpoint::open(&dir).unwrap();
    let src: &dyn TensorSource = &ck;
    Model::load(be, src, o).unwrap()
}

/// Experts streamed through 3 slots a layer (of 8; top-2): a batched
/// pass's rows (up to 4, so up to 8 experts) can need more experts than
/// the slots hold, its MoE then in waves; each sequence still gets its
/// lone tokens and rows.
fn streamed<B: ComputeBackend>(be: B) -> Model<B> {
    let o = ModelOptions {
        expert_slots: Some(3),
        ..opts()
    };
    fixture_with(be, "tiny-text", o)
}

fn prompt(n: usize, salt: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 37 + 11 + salt * 13) % vocab.min(97)) as u32)
        .collect()
}

fn sampling(seed: Option<u64>) -> Sampling {
    match seed {
        None => Sampling::Greedy,
        Some(seed) => Sampling::Random {
            temperature: 0.9,
            top_k: Some(20),
            top_p: Some(0.95),
            min_p: None,
            repetition_penalty: None,
            seed,
        },
    }
}

/// A generation alone: its `n` tokens ([`Model::generate`]) and the logits
/// of each decode step after the first token (teacher-forced one token at
/// a time: the one-row decode pass).
fn alone<B: ComputeBackend>(
    m: &Model<B>,
    p: &[u32],
    n: usize,
    seed: Option<u64>,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let o = GenerateOptions {
        max_new_tokens: n,
        sampling: sampling(seed),
        stop_at_eos: false,
    };
    let mut s = m.new_sequence().unwrap();
    let tokens = m.generate(&mut s, p, &o).unwrap().tokens;
    let mut s = m.new_sequence().unwrap();
    m.prefill(&mut s, p).unwrap();
    let rows = tokens[..n - 1]
        .iter()
        .map(|&t| m.logits(&mut s, &[t]).unwrap().remove(0))
        .collect();
    (tokens, rows)
}

/// A planned generation: its prompt, its token count, its seed (None:
/// greedy) and the step it joins at.
type Plan = (Vec<u32>, usize, Option<u64>, usize);

/// One generation of a batch: its sequence, sampler, tokens so far, and
/// the step it joins at.
struct Stream<B: ComputeBackend> {
    seq: Sequence<B>,
    sampler: Sampler,
    tokens: Vec<u32>,
    rows: Vec<Vec<f32>>,
    joins: usize,
    n: usize,
}

/// How `together` steps its streams.
#[derive(Clone, Copy, PartialEq)]
enum Step {
    /// `decode_batch`: tokens.
    Tokens,
    /// `decode_batch_logits`: rows (greedy only).
    Logits,
    /// `decode_batch_ahead`: tokens, the next step run ahead.
    Ahead,
}

/// Runs `streams` (prompt, tokens, seed, the step it joins at): each
/// prefills alone when it joins, then steps batched with the others
/// active until it has its tokens and leaves, each step as `how` says.
fn together<B: ComputeBackend>(
    m: &Model<B>,
    streams: &[Plan],
    how: Step,
) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    let mut ahead = m.batch_ahead().unwrap();
    let mut all: Vec<Stream<B>> = streams
        .iter()
        .map(|(_, n, seed, joins)| Stream {
            seq: m.new_sequence().unwrap(),
            sampler: Sampler::new(&sampling(*seed)).unwrap(),
            tokens: Vec::new(),
            rows: Vec::new(),
            joins: *joins,
            n: *n,
        })
        .collect();
    let mut widths = Vec::new();
    for step in 0.. {
        for (st, (p, ..)) in all.iter_mut().zip(streams) {
            if st.joins == step {
                st.sampler.observe(p);
                let t = m
                    .prefill_next(&mut st.seq, p, &mut st.sampler, st.n)
                    .unwrap();
                st.tokens.push(t);
            }
        }
        let mut active: Vec<&mut Stream<B>> = all
            .iter_mut()
            .filter(|s| s.joins <= step && s.tokens.len() < s.n)
            .collect();
        if active.is_empty() {
            if all.iter().all(|s| s.tokens.len() == s.n) {
                break;
            }
            continue;
        }
        widths.push(active.len());
        let last: Vec<u32> = active.iter().map(|s| *s.tokens.last().unwrap()).collect();
        let mut seqs: Vec<&mut Sequence<B>> = Vec::new();
        let mut samplers: Vec<&mut Sampler> = Vec::new();
        let mut outs: Vec<(&mut Vec<u32>, &mut Vec<Vec<f32>>)> = Vec::new();
        for s in active.iter_mut() {
            let Stream {
                seq,
                sampler,
                tokens,
                rows,
                ..
            } = &mut **s;
            seqs.push(seq);
            samplers.push(sampler);
            outs.push((tokens, rows));
        }
        if how == Step::Logits {
            let got = m.decode_batch_logits(&mut seqs, &last).unwrap();
            for ((tokens, rows), row) in outs.into_iter().zip(got) {
                tokens.push(turbospark::model::sampling::argmax(&row));
                rows.push(row);
            }
        } else {
            let got = if how == Step::Ahead {
                m.decode_batch_ahead(&mut ahead, &mut seqs, &last, &mut samplers)
            } else {
                m.decode_batch(&mut seqs, &last, &mut samplers)
            };
            for ((tokens, _), t) in outs.into_iter().zip(got.unwrap()) {
                tokens.push(t);
            }
        }
    }
    eprintln!("rows a step: {widths:?}");
    all.into_iter().map(|s| (s.tokens, s.rows)).collect()
}

/// `got` rows against `want`: bit for bit on an exact backend's CPU
/// reference, else within [`SAME_PATH_NMSE`].
fn same_rows(got: &[Vec<f32>], want: &[Vec<f32>], bits: bool, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: row count");
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.iter().all(|x| x.is_finite()),
            "{what}: row {r} not finite"
        );
        if bits {
            let same = g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{what}: row {r} differs");
        } else {
            let e = common::nmse(g, w);
            assert!(e < SAME_PATH_NMSE, "{what}: row {r} NMSE {e:e}");
        }
    }
}

/// Sequences of different prompt lengths, together from the start, then
/// joining and leaving between steps (1 to 6 rows a step: past the 4 of a
/// pass, two passes), greedy and seeded: each gives its tokens alone, and
/// (greedy, logits read) its rows.
fn together_as_alone<B: ComputeBackend>(m: &Model<B>, bits: bool) {
    let vocab = m.config().vocab;
    let p = |n, salt| prompt(n, salt, vocab);
    // (prompt, tokens, seed, joins at step)
    let plans: [Vec<Plan>; 3] = [
        vec![
            (p(3, 1), 8, None, 0),
            (p(7, 2), 8, None, 0),
            (p(12, 3), 8, None, 0),
        ],
        vec![
            (p(5, 4), 9, None, 0),
            (p(2, 5), 4, None, 2),
            (p(9, 6), 7, None, 3),
            (p(1, 7), 3, None, 3),
            (p(6, 8), 5, None, 4),
            (p(4, 9), 5, None, 4),
            (p(8, 10), 6, None, 4),
        ],
        vec![
            (p(4, 11), 8, Some(7), 0),
            (p(10, 12), 6, Some(8), 1),
            (p(3, 13), 8, None, 1),
            (p(6, 14), 5, Some(9), 2),
        ],
    ];
    for (k, plan) in plans.iter().enumerate() {
        let want: Vec<_> = plan
            .iter()
            .map(|(pr, n, seed, _)| alone(m, pr, *n, *seed))
            .collect();
        for how in [Step::Tokens, Step::Ahead] {
            let got = together(m, plan, how);
            for (i, ((g, _), (w, _))) in got.iter().zip(&want).enumerate() {
                let ahead = if how == Step::Ahead {
                    " (run ahead)"
                } else {
                    ""
                };
                assert_eq!(g, w, "plan {k}, stream {i}: tokens{ahead}");
            }
        }
        if plan.iter().all(|s| s.2.is_none()) {
            let got = together(m, plan, Step::Logits);
            for (i, ((gt, gr), (wt, wr))) in got.iter().zip(&want).enumerate() {
                assert_eq!(gt, wt, "plan {k}, stream {i}: tokens from the rows");
                same_rows(gr, wr, bits, &format!("plan {k}, stream {i}"));
            }
        }
    }
}

/// Bad batches are refused by name before anything runs.
fn refusals<B: ComputeBackend>(m: &Model<B>, other: &Model<B>) {
    let mut a = m.new_sequence().unwrap();
    let mut b = m.new_sequence().unwrap();
    m.prefill(&mut a, &[1, 2]).unwrap();
    let mut g = Sampler::new(&Sampling::Greedy).unwrap();
    let e = m
        .decode_batch(&mut [&mut a, &mut b], &[1], &mut [&mut g])
        .unwrap_err()
        .to_string();
    assert!(e.contains("1 samplers for 2 sequences"), "{e}");
    let e = m
        .decode_batch_logits(&mut [&mut a, &mut b], &[1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("1 tokens for 2 sequences"), "{e}");
    let e = m
        .decode_batch_logits(&mut [&mut a, &mut b], &[1, 1 << 30])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sequence 1") && e.contains("past the vocabulary"),
        "{e}"
    );
    assert_eq!((a.position(), b.position()), (2, 0), "nothing ran");
    let mut c = other.new_sequence().unwrap();
    let e = m
        .decode_batch_logits(&mut [&mut a, &mut c], &[1, 1])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sequence 1") && e.contains("another model"),
        "{e}"
    );
    let e = m
        .prefill_next(&mut b, &[], &mut g, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("empty prompt"), "{e}");
}

/// Two copies of the same sequences, one stepped by `decode_batch`, the
/// other by `decode_batch_ahead`, through everything a caller may do
/// between steps (a token other than the one given, readbacks enough to
/// make the backend let go of the step's, a truncation, a row leaving, one
/// leaving as another joins, rows reordered, a sampled row, a prefill):
/// each step's tokens
/// the same, and the sequences the same after (tokens, and the next
/// token's logits, bit for bit on the CPU reference, else to
/// [`SAME_PATH_NMSE`]), so the step run ahead is dropped wherever it is not
/// the one asked for. Then: a state made for another model is refused.
fn ahead_as_unpipelined<B: ComputeBackend>(m: &Model<B>, other: &Model<B>, bits: bool) {
    let vocab = m.config().vocab;
    let mut ahead = m.batch_ahead().unwrap();
    // (world 0: decode_batch; world 1: decode_batch_ahead)
    let mut worlds: Vec<Vec<Sequence<B>>> = Vec::new();
    let mut lasts: Vec<Vec<u32>> = Vec::new();
    for _ in 0..2 {
        let mut seqs = Vec::new();
        let mut last = Vec::new();
        for i in 0..4 {
            let mut s = m.new_sequence().unwrap();
            let mut g = Sampler::new(&Sampling::Greedy).unwrap();
            last.push(
                m.prefill_next(&mut s, &prompt(4 + i, i, vocab), &mut g, 30)
                    .unwrap(),
            );
            seqs.push(s);
        }
        worlds.push(seqs);
        lasts.push(last);
    }
    // (rows stepped, a seed for a sampled row 0, and what happens first)
    #[derive(Clone, Copy)]
    enum Before {
        Nothing,
        ForceToken,
        Truncate,
        Prefill,
        /// More readbacks begun than a backend keeps in flight (wgpu: 4),
        /// never finished.
        Reads,
    }
    let script: [(&[usize], Option<u64>, Before); 11] = [
        (&[0, 1, 2], None, Before::Nothing),
        (&[0, 1, 2], None, Before::Nothing),
        (&[0, 1, 2], None, Before::ForceToken),
        (&[0, 1, 2], None, Before::Reads),
        (&[0, 1, 2], None, Before::Truncate),
        (&[0, 2], None, Before::Nothing),
        (&[2, 1], None, Before::Nothing),
        (&[0, 2, 3], None, Before::Nothing),
        (&[0, 2, 3], Some(5), Before::Nothing),
        (&[0, 2, 3], None, Before::Prefill),
        (&[3], None, Before::Nothing),
    ];
    for (k, &(rows, seed, before)) in script.iter().enumerate() {
        let mut got = Vec::new();
        for (w, (seqs, last)) in worlds.iter_mut().zip(lasts.iter_mut()).enumerate() {
            match before {
                Before::Nothing => {}
                Before::ForceToken => last[rows[0]] = (last[rows[0]] + 1) % vocab as u32,
                Before::Truncate => {
                    let s = &mut seqs[rows[1]];
                    let p = s.position() - 2;
                    last[rows[1]] = s.tokens()[p];
                    m.truncate(s, p).unwrap();
                }
                Before::Reads => {
                    let be = m.backend();
                    let buf = be.alloc(turbospark::DType::U32, 4, "reads").unwrap();
                    for _ in 0..6 {
                        be.begin_read_u32(&buf).unwrap();
                    }
                }
                Before::Prefill => {
                    let s = &mut seqs[rows[1]];
                    m.prefill(s, &[last[rows[1]], 7]).unwrap();
                    last[rows[1]] = 9;
                }
            }
            let mut samplers: Vec<Sampler> = rows
                .iter()
                .enumerate()
                .map(|(i, _)| Sampler::new(&sampling(seed.filter(|_| i == 0))).unwrap())
                .collect();
            let tokens: Vec<u32> = rows.iter().map(|&r| last[r]).collect();
            // (in `rows`' order, which need not be the sequences')
            let mut by_index: Vec<Option<&mut Sequence<B>>> = seqs.iter_mut().map(Some).collect();
            let mut picked: Vec<&mut Sequence<B>> =
                rows.iter().map(|&r| by_index[r].take().unwrap()).collect();
            let mut p: Vec<&mut Sampler> = samplers.iter_mut().collect();
            let ids = if w == 0 {
                m.decode_batch(&mut picked, &tokens, &mut p)
            } else {
                m.decode_batch_ahead(&mut ahead, &mut picked, &tokens, &mut p)
            }
            .unwrap();
            for (&r, &t) in rows.iter().zip(&ids) {
                last[r] = t;
            }
            got.push(ids);
        }
        assert_eq!(got[0], got[1], "step {k}: tokens run ahead against not");
    }
    // (steps 1 and 3 find theirs run ahead, 3's readback let go by the
    // backend; 5 and 10, rows fewer, theirs for the rows that stay; 6, one
    // row gone and one back, its own for the row that stayed, the other's
    // step run alone; 2, 4, 7 (its row 2 not first any more) and 8 drop
    // theirs; 8, sampled, runs none ahead, so 9 has none to find)
    assert_eq!(ahead.counts(), (5, 4), "steps run ahead: (used, dropped)");
    let [plain, ahead_run] = &mut worlds[..] else {
        unreachable!()
    };
    for (i, (a, b)) in plain.iter_mut().zip(ahead_run.iter_mut()).enumerate() {
        assert_eq!(a.tokens(), b.tokens(), "sequence {i}: tokens");
        assert_eq!(a.position(), b.position(), "sequence {i}: position");
        let t = lasts[0][i];
        let (ra, rb) = (m.logits(a, &[t]).unwrap(), m.logits(b, &[t]).unwrap());
        same_rows(
            &rb,
            &ra,
            bits,
            &format!("sequence {i}: the next token's logits"),
        );
    }
    let mut s = m.new_sequence().unwrap();
    let mut g = Sampler::new(&Sampling::Greedy).unwrap();
    let t = m.prefill_next(&mut s, &[1, 2], &mut g, 4).unwrap();
    let mut theirs = other.batch_ahead().unwrap();
    let e = m
        .decode_batch_ahead(&mut theirs, &mut [&mut s], &[t], &mut [&mut g])
        .unwrap_err()
        .to_string();
    assert!(e.contains("another model"), "{e}");
}

#[test]
fn cpu_batched_decode_equals_each_alone() {
    together_as_alone(&synthetic(CpuBackend::new()), true);
}

#[test]
fn cpu_batched_decode_of_the_fixtures() {
    for name in ["tiny-text", "tiny-text-q4"] {
        together_as_alone(&fixture(CpuBackend::new(), name), true);
    }
}

#[test]
fn cpu_batched_decode_with_streamed_experts() {
    together_as_alone(&streamed(CpuBackend::new()), true);
}

#[test]
fn wgpu_batched_decode_with_streamed_experts() {
    let Some(be) = common::wgpu_backend() else {
        return;
    };
    together_as_alone(&streamed(be), false);
}

#[test]
fn cpu_batched_steps_run_ahead_as_not() {
    ahead_as_unpipelined(
        &synthetic(CpuBackend::new()),
        &synthetic(CpuBackend::new()),
        true,
    );
}

#[test]
fn wgpu_batched_steps_run_ahead_as_not() {
    let Some(be) = common::wgpu_backend() else {
        return;
    };
    let Some(other) = common::wgpu_backend() else {
        return;
    };
    ahead_as_unpipelined(&synthetic(be), &synthetic(other), false);
}

#[test]
fn cpu_bad_batches_are_refused() {
    refusals(&synthetic(CpuBackend::new()), &synthetic(CpuBackend::new()));
}

#[test]
fn wgpu_batched_decode_equals_each_alone() {
    let Some(be) = common::wgpu_backend() else {
        return;
    };
    together_as_alone(&synthetic(be), false);
}

#[test]
fn wgpu_batched_decode_of_a_fixture() {
    let Some(be) = common::wgpu_backend() else {
        return;
    };
    together_as_alone(&fixture(be, "tiny-text"), false);
}

/// A batched step's rows attend in place on the wgpu backend
/// (`qkv_post_attention_row` binding each row of q|k|v and of the heads)
/// wherever the device binds at the row's offsets: such a row records no
/// buffer copy, where the row copied in and out made two a layer. The
/// count expected is from the device's offset alignment and the layers'
/// row sizes, so it holds under any limits profile.
#[test]
fn wgpu_batched_rows_attend_without_copies() {
    let Some(be) = common::wgpu_backend() else {
        return;
    };
    let m = fixture(be, "tiny-text");
    let cfg = m.config().clone();
    let align = m
        .backend()
        .wgpu_limits()
        .min_storage_buffer_offset_alignment as usize;
    let n = 3;
    let mut seqs: Vec<Sequence<_>> = (0..n).map(|_| m.new_sequence().unwrap()).collect();
    let mut samplers: Vec<Sampler> = (0..n)
        .map(|_| Sampler::new(&Sampling::Greedy).unwrap())
        .collect();
    let last: Vec<u32> = seqs
        .iter_mut()
        .zip(samplers.iter_mut())
        .enumerate()
        .map(|(i, (s, p))| {
            m.prefill_next(s, &prompt(5 + i, i, cfg.vocab), p, 4)
                .unwrap()
        })
        .collect();
    let copies_of = |row: usize| -> u64 {
        let copied = cfg.layers.iter().filter(|l| {
            let (raw, heads) = (l.qkv_rows(cfg.heads) * 4, cfg.heads * l.head_dim * 4);
            (row * raw) % align != 0 || (row * heads) % align != 0
        });
        2 * copied.count() as u64
    };
    let want: u64 = (0..n).map(copies_of).sum();
    let before = m.backend().copies();
    let mut s: Vec<&mut Sequence<_>> = seqs.iter_mut().collect();
    let mut p: Vec<&mut Sampler> = samplers.iter_mut().collect();
    m.decode_batch(&mut s, &last, &mut p).unwrap();
    assert_eq!(
        m.backend().copies() - before,
        want,
        "copies in a batched step of {n} rows (offset alignment {align})"
    );
}
