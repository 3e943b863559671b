//! The one error type of turbospark. Every failure is a value, never a panic.

/// What went wrong, with enough detail to name the culprit.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The backend does not implement this case. A distinct status: callers
    /// must not fall back silently.
    #[error("{backend} does not support {op}: {reason}")]
    Unsupported {
        backend: String,
        op: String,
        reason: String,
    },
    /// Arguments of an op do not fit together.
    #[error("{op}: {detail}")]
    Shape { op: &'static str, detail: String },
    /// A buffer or binding larger than the device allows.
    #[error("{what} needs {bytes} bytes, over the device limit of {limit} bytes ({limit_name})")]
    DeviceLimit {
        what: String,
        bytes: u64,
        limit: u64,
        limit_name: &'static str,
    },
    #[error("GPU device lost: {0}")]
    DeviceLost(String),
    #[error("out of device memory: {0}")]
    OutOfMemory(String),
    #[error("no GPU adapter found: {0}")]
    NoAdapter(String),
    /// Any other error reported by the GPU API (validation, shader compile).
    #[error("GPU backend error: {0}")]
    Gpu(String),
    /// A checkpoint file that is missing, malformed or does not match its config.
    #[error("checkpoint {path}: {detail}")]
    Checkpoint { path: String, detail: String },
    /// A config that does not describe a supported model.
    #[error("config {path}: {detail}")]
    Config { path: String, detail: String },
    /// A request that cannot be served (token past the vocabulary, prompt past the context).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The model computed NaN or infinite values where a result needs
    /// finite ones (logits): a broken checkpoint, not a token to emit.
    #[error("non-finite values: {0}")]
    NonFinite(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn shape(op: &'static str, detail: impl Into<String>) -> Self {
        Error::Shape {
            op,
            detail: detail.into(),
        }
    }

    pub fn io(path: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// Return early with an error: `bail!(Error::shape(...))`.
#[macro_export]
macro_rules! bail {
    ($e:expr) => {
        return Err($e.into())
    };
}
