//! One memory-mapped safetensors file, its header parsed and checked against
//! the file size before any tensor is handed out.
//!
//! The 8-byte header length is checked against the file size here first, then
//! `safetensors::SafeTensors::read_metadata` parses the header on the map (no
//! copy of the data). When it rejects the header, [`diagnose`] re-reads the
//! header JSON to name the tensor at fault, since the crate's errors mostly do
//! not.
//!
//! A map is only sound while its file stays as it was: a file truncated
//! under it faults (SIGBUS) on the next read past the new end, and one
//! rewritten in place changes the weights under a running model.
//! [`MappedFile`] records the size and modification time at open, and
//! [`MappedFile::check_unchanged`] compares them, cheaply (one `fstat`),
//! before the mapping is read again.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use memmap2::Mmap;
use safetensors::{SafeTensorError, SafeTensors};
use serde_json::Value;

use crate::error::Error;
use crate::Result;

/// Bytes of the little-endian header length that starts every file.
const N_LEN: usize = 8;

/// Where one tensor lives in its file.
#[derive(Clone, Debug)]
pub(crate) struct RawTensor {
    pub dtype: safetensors::Dtype,
    pub shape: Vec<usize>,
    /// Absolute byte offset of the data in the map.
    pub offset: usize,
    pub len: usize,
}

/// An opened safetensors file.
pub(crate) struct Shard {
    pub path: PathBuf,
    pub map: Arc<Mmap>,
    pub tensors: HashMap<String, RawTensor>,
    /// The file as it was when mapped, for [`MappedFile::check_unchanged`].
    pub file: Arc<MappedFile>,
}

/// A memory-mapped checkpoint file and what it was when mapped (size,
/// modification time), to tell when it has changed under the map.
///
/// The open file is kept, so the check looks at the very file mapped (one
/// `fstat`), not at whatever the path names now: a file replaced by a
/// rename leaves the old one, and the map, intact, and is not a change.
pub struct MappedFile {
    path: PathBuf,
    file: File,
    len: u64,
    modified: Option<SystemTime>,
    map: Arc<Mmap>,
}

impl MappedFile {
    /// The file's path as it was opened.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The addresses the map occupies (while this value lives, the map does
    /// too): what a fault handler compares a faulting address with.
    pub fn address_range(&self) -> std::ops::Range<usize> {
        let start = self.map.as_ptr() as usize;
        start..start + self.map.len()
    }

    /// An error naming the file when its size or modification time is no
    /// longer what it was when mapped: it was truncated (reading the map
    /// past its new end would kill the process with SIGBUS) or rewritten
    /// in place (the map now holds other bytes than those checked at open).
    /// One `fstat`: cheap enough to call before every read of the map.
    pub fn check_unchanged(&self) -> Result<()> {
        let meta = self
            .file
            .metadata()
            .map_err(|e| ckpt_err(&self.path, format!("cannot stat while mapped: {e}")))?;
        let modified = meta.modified().ok();
        if meta.len() == self.len && modified == self.modified {
            return Ok(());
        }
        let what = if meta.len() < self.len {
            "truncated"
        } else {
            "changed"
        };
        Err(ckpt_err(
            &self.path,
            format!(
                "{what} on disk while the run maps it ({} bytes when opened, {} now{}): \
                 its weights can no longer be read; a checkpoint must not change while \
                 it is in use",
                self.len,
                meta.len(),
                if modified == self.modified {
                    ""
                } else {
                    ", modification time changed"
                }
            ),
        ))
    }
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile")
            .field("path", &self.path)
            .field("len", &self.len)
            .field("modified", &self.modified)
            .finish()
    }
}

pub(crate) fn ckpt_err(path: &Path, detail: impl Into<String>) -> Error {
    Error::Checkpoint {
        path: path.display().to_string(),
        detail: detail.into(),
    }
}

impl Shard {
    /// Maps `path` and parses its header; every offset handed out afterwards
    /// lies inside the map.
    pub fn open(path: &Path) -> Result<Shard> {
        // (before opening: opening a FIFO blocks until something writes it)
        check_regular(
            path,
            &std::fs::metadata(path).map_err(|e| ckpt_err(path, format!("cannot open: {e}")))?,
        )?;
        let file = File::open(path).map_err(|e| ckpt_err(path, format!("cannot open: {e}")))?;
        let meta = file
            .metadata()
            .map_err(|e| ckpt_err(path, format!("cannot stat: {e}")))?;
        // (again on the file opened: the path may have changed since)
        check_regular(path, &meta)?;
        let file_len = meta.len();
        if file_len < N_LEN as u64 {
            return Err(ckpt_err(
                path,
                format!("truncated: {file_len} bytes, shorter than the 8-byte header length"),
            ));
        }
        // SAFETY: the map is read-only; the file must not be truncated or
        // rewritten while the checkpoint is open (as with every mmap-based
        // loader): MappedFile::check_unchanged tells when it was, before a
        // read, and the CLI names the file if a read faults all the same.
        // Every access is bounds-checked against the header below.
        let map = unsafe { Mmap::map(&file) }
            .map_err(|e| ckpt_err(path, format!("cannot memory-map: {e}")))?;
        let buf: &[u8] = &map;
        // Checked on the map too: the file may have shrunk since the stat.
        let len_bytes: [u8; N_LEN] = buf
            .get(..N_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| ckpt_err(path, "truncated: shorter than the 8-byte header length"))?;
        let header_len = u64::from_le_bytes(len_bytes);
        let room = (buf.len() - N_LEN) as u64;
        if header_len > room {
            return Err(ckpt_err(
                path,
                format!(
                    "header length field says {header_len} bytes but only {room} bytes follow \
                     (truncated file or corrupt header)"
                ),
            ));
        }
        // header_len <= room < usize::MAX, so the cast is lossless.
        let data_start = N_LEN + header_len as usize;
        let parsed = std::panic::catch_unwind(|| SafeTensors::read_metadata(buf));
        let metadata = match parsed {
            Ok(Ok((_, metadata))) => metadata,
            Ok(Err(e)) => {
                let header = &buf[N_LEN..data_start];
                let detail =
                    diagnose(header, buf.len() - data_start).unwrap_or_else(|| describe(&e));
                return Err(ckpt_err(path, format!("bad safetensors file: {detail}")));
            }
            Err(_) => {
                return Err(ckpt_err(
                    path,
                    "bad safetensors file: the safetensors parser panicked on its header",
                ))
            }
        };
        let mut tensors = HashMap::new();
        for (name, info) in metadata.tensors() {
            let (begin, end) = info.data_offsets;
            // read_metadata proved begin <= end <= data length; check again
            // rather than trust a dependency with our bounds.
            let (Some(offset), Some(stop)) =
                (data_start.checked_add(begin), data_start.checked_add(end))
            else {
                return Err(ckpt_err(path, format!("tensor `{name}`: offsets overflow")));
            };
            if begin > end || stop > buf.len() {
                return Err(ckpt_err(
                    path,
                    format!("tensor `{name}`: data_offsets [{begin}, {end}] outside the file"),
                ));
            }
            tensors.insert(
                name,
                RawTensor {
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    offset,
                    len: end - begin,
                },
            );
        }
        let map = Arc::new(map);
        Ok(Shard {
            path: path.to_path_buf(),
            map: map.clone(),
            tensors,
            file: Arc::new(MappedFile {
                path: path.to_path_buf(),
                file,
                // (the map's length: the file's when it was mapped)
                len: map.len() as u64,
                modified: meta.modified().ok(),
                map,
            }),
        })
    }
}

/// An error naming `path` unless `meta` is a regular file's: a directory
/// cannot be mapped (`No such device`), a FIFO or device must not be.
pub(crate) fn check_regular(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    let ft = meta.file_type();
    if ft.is_file() {
        return Ok(());
    }
    let kind = if ft.is_dir() {
        "a directory"
    } else {
        "not a regular file (a FIFO, socket or device)"
    };
    Err(ckpt_err(path, format!("{kind}, not a safetensors file")))
}

/// The safetensors error in words, for the cases [`diagnose`] cannot pin on
/// one tensor.
fn describe(e: &SafeTensorError) -> String {
    match e {
        SafeTensorError::MetadataIncompleteBuffer => {
            "the data section's size disagrees with the header (truncated file or trailing bytes)"
                .into()
        }
        SafeTensorError::InvalidOffset(name) => {
            format!("tensor `{name}`: data_offsets do not start where the previous tensor ends")
        }
        other => other.to_string(),
    }
}

/// Finds the first tensor in a rejected header whose entry is inconsistent
/// (offsets reversed, past the data, overlapping, or disagreeing with dtype
/// and shape) and says what it claims versus what the file holds.
fn diagnose(header: &[u8], data_len: usize) -> Option<String> {
    let text = std::str::from_utf8(header).map_err(|e| format!("header is not UTF-8: {e}"));
    let text = match text {
        Ok(t) => t,
        Err(m) => return Some(m),
    };
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Some(format!("header is not valid JSON: {e}")),
    };
    let obj = value.as_object()?;
    let mut spans: Vec<(usize, usize, &str)> = Vec::new();
    for (name, entry) in obj {
        if name == "__metadata__" {
            continue;
        }
        let info: safetensors::tensor::TensorInfo = match serde_json::from_value(entry.clone()) {
            Ok(i) => i,
            Err(e) => return Some(format!("tensor `{name}`: malformed entry: {e}")),
        };
        let (s, e) = info.data_offsets;
        if e < s {
            return Some(format!(
                "tensor `{name}`: data_offsets [{s}, {e}] end before they start"
            ));
        }
        if e > data_len {
            return Some(format!(
                "tensor `{name}`: data_offsets end at byte {e} but the file holds only {data_len} \
                 data bytes (truncated?)"
            ));
        }
        let want = info
            .shape
            .iter()
            .try_fold(info.dtype.bitsize(), |a, &d| a.checked_mul(d))
            .map(|bits| bits.div_ceil(8));
        match want {
            Some(w) if w == e - s => {}
            Some(w) => {
                return Some(format!(
                    "tensor `{name}`: dtype {:?} shape {:?} needs {w} bytes, data_offsets span {}",
                    info.dtype,
                    info.shape,
                    e - s
                ))
            }
            None => return Some(format!("tensor `{name}`: shape {:?} overflows", info.shape)),
        }
        spans.push((s, e, name));
    }
    spans.sort();
    let mut pos = 0;
    for &(s, e, name) in &spans {
        if s != pos {
            return Some(format!(
                "tensor `{name}`: data_offsets start at {s}, expected {pos} (gap or overlap)"
            ));
        }
        pos = e;
    }
    if pos != data_len {
        return Some(format!(
            "tensors cover {pos} data bytes but the file holds {data_len} (trailing bytes)"
        ));
    }
    None
}
