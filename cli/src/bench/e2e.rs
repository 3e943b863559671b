//! End-to-end decode and prefill tokens/s.
//!
//! TODO(issue 4, end to end): decode tokens/s and prefill tokens/s (512-token
//! prompt) on a full-size Gemma 4 26B-A4B-shaped model with random bf16
//! weights created in device memory (`--synthetic gemma-4-26b-a4b`, and a
//! smaller synthetic shape for machines that cannot hold 52 GB), each next to
//! its bandwidth bound (bytes read per token over the ceiling measured in the
//! same run), with dispatches and submits per token from
//! `WgpuBackend::counters`. It needs the Gemma 4 decoder (`src/model/`), which
//! is not merged yet; until then the JSON says so.

/// What the report holds for the end-to-end figures.
pub fn end_to_end() -> serde_json::Value {
    serde_json::json!({
        "status": "todo",
        "note": "end-to-end decode/prefill tokens/s needs the Gemma 4 decoder (src/model/); not measured yet",
    })
}
