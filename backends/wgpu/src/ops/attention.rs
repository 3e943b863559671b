use turbospark::ops::{Attention, KvAppend, Rope};
use turbospark::{Error, Result};

use crate::{WgpuBackend, WgpuBuffer};

fn todo(be: &WgpuBackend, op: &str) -> Error {
    Error::Unsupported {
        backend: be.info.backend.clone(),
        op: op.into(),
        reason: "not yet implemented".into(),
    }
}

pub(crate) fn rope(be: &WgpuBackend, _x: &WgpuBuffer, _pos: &WgpuBuffer, _p: Rope) -> Result<()> {
    Err(todo(be, "rope"))
}

pub(crate) fn kv_append(
    be: &WgpuBackend,
    _k: &WgpuBuffer,
    _v: &WgpuBuffer,
    _kc: &WgpuBuffer,
    _vc: &WgpuBuffer,
    _pos: &WgpuBuffer,
    _p: KvAppend,
) -> Result<()> {
    Err(todo(be, "kv_append"))
}

pub(crate) fn attention(
    be: &WgpuBackend,
    _q: &WgpuBuffer,
    _kc: &WgpuBuffer,
    _vc: &WgpuBuffer,
    _pos: &WgpuBuffer,
    _out: &WgpuBuffer,
    _p: Attention,
) -> Result<()> {
    Err(todo(be, "attention"))
}
