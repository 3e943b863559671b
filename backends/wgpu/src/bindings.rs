//! How the wgpu backend holds an op's buffer arguments: one rule over every
//! checked op's arguments by role (`ComputeBackend::check_held`), rather
//! than a list of its own per op.

use turbospark::ops::{Args, Role};
use turbospark::{Error, ExpertStack, Result};

use crate::buffer::WgpuBuffer;

/// Every argument is one binding but a weight (split by rows where it did
/// not fit one: the launchers that take a weight read each part or report
/// the case `Unsupported`). An expert stack in tile order (`upload_experts`)
/// is read only as the argument that takes exactly that stack: anything
/// else would read its rows in another order. A weight as uploaded passes.
pub(crate) fn check(args: &Args<'_, WgpuBuffer>) -> Result<()> {
    for a in &args.list {
        if a.role == Role::Plain && a.buf.single().is_none() {
            return Err(Error::shape(
                args.op,
                format!(
                    "`{}` is a weight split across bindings, where the op reads one binding",
                    a.name
                ),
            ));
        }
        if a.buf.host.is_some() {
            return Err(Error::InvalidInput(format!(
                "{}: `{}` is a host store of experts (host_experts), which only copy_experts reads",
                args.op, a.name
            )));
        }
        let takes = match a.role {
            Role::Experts(stack) => Some(stack),
            Role::Plain | Role::Weight => None,
        };
        tiles_read_by(args.op, a.name, a.buf, takes)?;
    }
    Ok(())
}

/// A buffer in tile order is the stack `takes` names; any other buffer
/// passes.
fn tiles_read_by(op: &str, name: &str, b: &WgpuBuffer, takes: Option<ExpertStack>) -> Result<()> {
    let Some(t) = b.tiles else { return Ok(()) };
    if takes == Some(t) {
        return Ok(());
    }
    let what = |s: ExpertStack| {
        let kind = if s.gate_up { "gate_up" } else { "down" };
        format!("{} {kind} experts", s.experts)
    };
    let why = match takes {
        Some(s) => format!("not the {} this op takes", what(s)),
        None => "which only the MoE ops read".into(),
    };
    Err(Error::InvalidInput(format!(
        "{op}: `{name}` holds {} stored in tile order (upload_experts), {why}",
        what(t)
    )))
}
