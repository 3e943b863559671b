//! Every wait on the device goes through [`wait_for`], so none is unbounded.

use turbospark::{Error, Result};

/// The longest the host waits for the device to finish what it was given
/// (a decode step, a layer of a prefill batch: milliseconds on a real GPU,
/// seconds on lavapipe) before it reports the device hung, rather than
/// waiting for ever (a test binary once waited 300 s on the H200, 2026-12-01,
/// with nothing to say where).
const GPU_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// A failed wait on the device, saying how long it waited where it timed
/// out.
fn poll_error(e: wgpu::PollError) -> Error {
    match e {
        wgpu::PollError::Timeout => Error::Gpu(format!(
            "the device did not finish its work within {} s: it may be hung",
            GPU_WAIT.as_secs()
        )),
        e => Error::Gpu(format!("poll: {e}")),
    }
}

/// Wait until the device has finished `submission` (None: all it was
/// given), for at most GPU_WAIT.
pub(crate) fn wait_for(
    device: &wgpu::Device,
    submission: Option<wgpu::SubmissionIndex>,
) -> Result<()> {
    device
        .poll(wgpu::PollType::Wait {
            submission_index: submission,
            timeout: Some(GPU_WAIT),
        })
        .map(|_| ())
        .map_err(poll_error)
}
