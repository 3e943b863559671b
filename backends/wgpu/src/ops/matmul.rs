use turbospark::ops::Matmul;
use turbospark::{Error, Result};

use crate::{WgpuBackend, WgpuBuffer};

pub(crate) fn matmul(
    be: &WgpuBackend,
    _w: &WgpuBuffer,
    _x: &WgpuBuffer,
    _out: &WgpuBuffer,
    _p: Matmul,
) -> Result<()> {
    Err(Error::Unsupported {
        backend: be.info.backend.clone(),
        op: "matmul".into(),
        reason: "not yet implemented".into(),
    })
}
