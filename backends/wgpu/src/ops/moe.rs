use turbospark::ops::{Moe, Router};
use turbospark::{Error, Result};

use crate::{WgpuBackend, WgpuBuffer};

fn todo(be: &WgpuBackend, op: &str) -> Error {
    Error::Unsupported {
        backend: be.info.backend.clone(),
        op: op.into(),
        reason: "not yet implemented".into(),
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn router(
    be: &WgpuBackend,
    _x: &WgpuBuffer,
    _s: &WgpuBuffer,
    _proj: &WgpuBuffer,
    _pes: &WgpuBuffer,
    _ids: &WgpuBuffer,
    _w: &WgpuBuffer,
    _p: Router,
) -> Result<()> {
    Err(todo(be, "router"))
}

pub(crate) fn moe_gate_up(
    be: &WgpuBackend,
    _x: &WgpuBuffer,
    _gu: &WgpuBuffer,
    _ids: &WgpuBuffer,
    _act: &WgpuBuffer,
    _p: Moe,
) -> Result<()> {
    Err(todo(be, "moe_gate_up"))
}

pub(crate) fn moe_down(
    be: &WgpuBackend,
    _act: &WgpuBuffer,
    _d: &WgpuBuffer,
    _ids: &WgpuBuffer,
    _w: &WgpuBuffer,
    _out: &WgpuBuffer,
    _p: Moe,
) -> Result<()> {
    Err(todo(be, "moe_down"))
}
