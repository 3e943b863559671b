//! The sequence API: any number of sequences on one loaded model, each
//! with its own caches and position; truncation and forks. Every check is
//! against a fresh sequence run over the same tokens in the same prefill
//! batches, so the arithmetic is the same and the results are bit for bit
//! the same, on the CPU reference and on the wgpu backend.

mod common;

use turbospark::model::synthetic::{tiny_config, SyntheticSource};
use turbospark::model::{GenerateOptions, Model, ModelOptions, Sampling, Sequence};
use turbospark::ComputeBackend;
use turbospark_cpu::CpuBackend;

/// Prefill batches of 4 tokens, the tiny config's window of 5: each
/// sliding layer keeps a ring of 5 + 4 - 1 = 8 slots, so 64 positions wrap
/// it many times.
const BATCH: usize = 4;

fn load<B: ComputeBackend>(be: B) -> Model<B> {
    let src = SyntheticSource::new(tiny_config(), 42).unwrap();
    let opts = ModelOptions {
        max_context: 64,
        prefill_batch: BATCH,
        ..Default::default()
    };
    Model::load(be, &src, opts).unwrap()
}

fn tokens(n: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 37 + 11 + salt * 13) % 97) as u32)
        .collect()
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: n,
        sampling: Sampling::Greedy,
        stop_at_eos: false,
    }
}

/// Logits of `next` after `prefix`, on a fresh sequence (the prefix's
/// logits computed and dropped, in the same batches as any other run).
fn fresh_logits<B: ComputeBackend>(m: &Model<B>, prefix: &[u32], next: &[u32]) -> Vec<Vec<f32>> {
    let mut s = m.new_sequence().unwrap();
    m.logits(&mut s, prefix).unwrap();
    m.logits(&mut s, next).unwrap()
}

/// Bit-for-bit equality of logits rows, named on failure.
fn same_rows(got: &[Vec<f32>], want: &[Vec<f32>], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: row count");
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.iter().all(|x| x.is_finite()),
            "{what}: row {r} not finite"
        );
        let same = g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{what}: row {r} differs");
    }
}

/// Two sequences decoding interleaved, a step of one then a step of the
/// other, give exactly what each gives alone.
fn interleaved<B: ComputeBackend>(be: B) {
    let m = load(be);
    let (pa, pb) = (tokens(7, 1), tokens(10, 2));
    let alone = |p: &[u32]| {
        let mut s = m.new_sequence().unwrap();
        m.generate(&mut s, p, &greedy(6)).unwrap().tokens
    };
    let (want_a, want_b) = (alone(&pa), alone(&pb));
    let (mut a, mut b) = (m.new_sequence().unwrap(), m.new_sequence().unwrap());
    let mut got_a = m.generate(&mut a, &pa, &greedy(1)).unwrap().tokens;
    let mut got_b = m.generate(&mut b, &pb, &greedy(1)).unwrap().tokens;
    for _ in 1..6 {
        let last = *got_a.last().unwrap();
        got_a.extend(m.generate(&mut a, &[last], &greedy(1)).unwrap().tokens);
        let last = *got_b.last().unwrap();
        got_b.extend(m.generate(&mut b, &[last], &greedy(1)).unwrap().tokens);
    }
    assert_eq!(got_a, want_a, "sequence a interleaved");
    assert_eq!(got_b, want_b, "sequence b interleaved");
    // Each knows its own context: the prompt and all but the last token.
    assert_eq!(a.position(), pa.len() + 5);
    assert_eq!(&a.tokens()[..pa.len()], &pa[..]);
    assert_eq!(&a.tokens()[pa.len()..], &want_a[..5]);

    // Teacher-forced rows too, bit for bit, with a's rows interleaved with b's.
    let (mut a, mut b) = (m.new_sequence().unwrap(), m.new_sequence().unwrap());
    let (ta, tb) = (tokens(12, 3), tokens(12, 4));
    let mut rows_a = Vec::new();
    for (ca, cb) in ta.chunks(BATCH).zip(tb.chunks(BATCH)) {
        rows_a.extend(m.logits(&mut a, ca).unwrap());
        m.logits(&mut b, cb).unwrap();
    }
    let mut s = m.new_sequence().unwrap();
    same_rows(
        &rows_a,
        &m.logits(&mut s, &ta).unwrap(),
        "a's rows beside b's",
    );
}

/// Truncating to p and going on gives what a fresh run to p gives: within
/// the rings' slack without running a token again, past it by running the
/// prefix again.
fn truncation<B: ComputeBackend>(be: B) {
    let m = load(be);
    let (prefix, next) = (tokens(8, 5), tokens(4, 6));
    let want = fresh_logits(&m, &prefix, &next);

    // 8 prompt tokens and 3 decoded: the rings still hold positions 3..
    let mut s = m.new_sequence().unwrap();
    m.generate(&mut s, &prefix, &greedy(4)).unwrap();
    assert_eq!(s.position(), 11);
    assert!(m.window_holds(11, 8));
    let before = s.computed_tokens();
    m.truncate(&mut s, 8).unwrap();
    assert_eq!((s.position(), s.tokens()), (8, &prefix[..]));
    assert_eq!(
        s.computed_tokens(),
        before,
        "a truncation within the rings runs nothing"
    );
    same_rows(
        &m.logits(&mut s, &next).unwrap(),
        &want,
        "truncated within the rings",
    );

    // 16 tokens: position 8's window is gone from the rings, so the 8
    // tokens run again.
    let mut s = m.new_sequence().unwrap();
    let long: Vec<u32> = prefix.iter().chain(&tokens(8, 7)).copied().collect();
    m.logits(&mut s, &long).unwrap();
    assert!(!m.window_holds(16, 8));
    let before = s.computed_tokens();
    m.truncate(&mut s, 8).unwrap();
    assert_eq!(s.computed_tokens(), before + 8, "the prefix ran again");
    same_rows(
        &m.logits(&mut s, &next).unwrap(),
        &want,
        "truncated past the rings",
    );

    // Greedy decode from a truncation equals a fresh generation.
    let mut s = m.new_sequence().unwrap();
    m.generate(&mut s, &long, &greedy(3)).unwrap();
    m.truncate(&mut s, 12).unwrap();
    let got = m.generate(&mut s, &long[12..], &greedy(5)).unwrap().tokens;
    let mut f = m.new_sequence().unwrap();
    let want = m.generate(&mut f, &long, &greedy(5)).unwrap().tokens;
    assert_eq!(got, want, "generation after a truncation");

    let e = m.truncate(&mut s, 99).unwrap_err().to_string();
    assert!(
        e.contains("truncate to position 99") && e.contains("holds only"),
        "{e}"
    );
}

/// A fork from a shared prefix equals a fresh run of the whole prompt, and
/// computes only the tokens after the prefix.
fn forks<B: ComputeBackend>(be: B) {
    let m = load(be);
    let (system, user) = (tokens(8, 8), tokens(4, 9));
    let whole: Vec<u32> = system.iter().chain(&user).copied().collect();
    let mut f = m.new_sequence().unwrap();
    let want = m.generate(&mut f, &whole, &greedy(5)).unwrap().tokens;

    // The source went on past the prefix (a reply of its own).
    let mut src = m.new_sequence().unwrap();
    m.generate(&mut src, &system, &greedy(2)).unwrap();
    let src_tokens = src.tokens().to_vec();
    let mut fork = m.fork(&src, 8).unwrap();
    assert_eq!(fork.computed_tokens(), 0, "the prefix is copied, not run");
    let got = m.generate(&mut fork, &user, &greedy(5)).unwrap().tokens;
    assert_eq!(got, want, "forked sequence");
    assert_eq!(
        fork.computed_tokens(),
        (user.len() + 4) as u64,
        "the fork ran its own prompt tokens and decode steps only"
    );
    assert_eq!(
        src.tokens(),
        &src_tokens[..],
        "the source is left as it was"
    );

    // A source whose rings moved on past the prefix's window: the fork runs
    // the prefix afresh, and still equals the fresh run.
    let mut src = m.new_sequence().unwrap();
    m.logits(&mut src, &[system.clone(), tokens(8, 10)].concat())
        .unwrap();
    let mut fork = m.fork(&src, 8).unwrap();
    assert_eq!(fork.computed_tokens(), 8);
    let got = m.generate(&mut fork, &user, &greedy(5)).unwrap().tokens;
    assert_eq!(got, want, "fork past the rings");

    let e = m.fork(&src, 17).err().unwrap().to_string();
    assert!(e.contains("fork at position 17"), "{e}");
}

/// A sequence of one model is refused by another, by name.
fn foreign<B: ComputeBackend>(a: Model<B>, b: &Model<B>) {
    let mut s: Sequence<B> = a.new_sequence().unwrap();
    for e in [
        b.logits(&mut s, &[1]).err(),
        b.generate(&mut s, &[1], &greedy(1)).err(),
        b.truncate(&mut s, 0).err(),
        b.fork(&s, 0).err(),
    ] {
        let e = e.expect("refused").to_string();
        assert!(e.contains("belongs to another model"), "{e}");
    }
}

#[test]
fn cpu_sequences_interleave() {
    interleaved(CpuBackend::new());
}

#[test]
fn cpu_truncation_equals_a_fresh_run() {
    truncation(CpuBackend::new());
}

#[test]
fn cpu_forks_equal_a_fresh_run() {
    forks(CpuBackend::new());
}

#[test]
fn a_sequence_runs_only_on_its_model() {
    foreign(load(CpuBackend::new()), &load(CpuBackend::new()));
}

#[test]
fn wgpu_sequences_interleave() {
    let Some(be) = common::wgpu_backend() else {
        return;
    };
    interleaved(be);
}

#[test]
fn wgpu_truncation_equals_a_fresh_run() {
    let Some(be) = common::wgpu_backend() else {
        return;
    };
    truncation(be);
}

#[test]
fn wgpu_forks_equal_a_fresh_run() {
    let Some(be) = common::wgpu_backend() else {
        return;
    };
    forks(be);
}
