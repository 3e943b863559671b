//! The mixture-of-experts ops' contracts: the router, the two MoE phases,
//! and the argument structs of the phases' pair ops.

use super::roles::{Args, Role};
use super::{
    check_buf, check_weight, no_alias, nonzero, pair_apart, F32, MAX_EXPERTS, MAX_TOP_K, U32,
};
use crate::backend::{ComputeBackend, ExpertStack};
use crate::device_buffer::DeviceBuffer;
use crate::error::{Error, Result};
use crate::precision::Precision;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Router {
    pub m: usize,
    pub hidden: usize,
    pub experts: usize,
    pub top_k: usize,
    pub eps: f32,
}

impl Router {
    /// Shapes, dtypes and aliasing of a `router` call; its arguments by
    /// role.
    pub fn validate<'a, B: DeviceBuffer>(
        &self,
        x: &'a B,
        scale: &'a B,
        proj: &'a B,
        pes: &'a B,
        ids: &'a B,
        weights: &'a B,
    ) -> Result<Args<'a, B>> {
        const OP: &str = "router";
        nonzero(
            OP,
            &[
                ("m", self.m),
                ("hidden", self.hidden),
                ("experts", self.experts),
                ("top_k", self.top_k),
            ],
        )?;
        if self.top_k > self.experts || self.top_k > MAX_TOP_K || self.experts > MAX_EXPERTS {
            return Err(Error::shape(
                OP,
                format!(
                    "top_k {} of {} experts is outside the supported range (k <= {MAX_TOP_K}, E <= {MAX_EXPERTS}, k <= E)",
                    self.top_k, self.experts
                ),
            ));
        }
        check_buf(OP, "x", x, &F32, self.m * self.hidden)?;
        check_buf(OP, "eff_scale", scale, &F32, self.hidden)?;
        check_weight(OP, "proj", proj, self.experts * self.hidden)?;
        check_buf(OP, "per_expert_scale", pes, &F32, self.experts)?;
        check_buf(OP, "ids", ids, &U32, self.m * self.top_k)?;
        check_buf(OP, "weights", weights, &F32, self.m * self.top_k)?;
        no_alias(
            OP,
            ids,
            &[Some(x), Some(scale), Some(proj), Some(pes), Some(weights)],
        )?;
        no_alias(OP, weights, &[Some(x), Some(scale), Some(proj), Some(pes)])?;
        Ok(Args::new(OP)
            .plain("x", x)
            .plain("eff_scale", scale)
            .with("proj", proj, Role::Weight)
            .plain("per_expert_scale", pes)
            .plain("ids", ids)
            .plain("weights", weights))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moe {
    pub m: usize,
    pub hidden: usize,
    /// moe_intermediate_size.
    pub inter: usize,
    pub experts: usize,
    pub top_k: usize,
    /// As [`Matmul::precision`](super::Matmul::precision), for the
    /// experts' GEMMs.
    pub precision: Precision,
}

impl Moe {
    fn check_common(&self) -> Result<()> {
        const OP: &str = "moe";
        nonzero(
            OP,
            &[
                ("m", self.m),
                ("hidden", self.hidden),
                ("inter", self.inter),
                ("experts", self.experts),
                ("top_k", self.top_k),
            ],
        )?;
        if self.top_k > self.experts || self.top_k > MAX_TOP_K || self.experts > MAX_EXPERTS {
            return Err(Error::shape(
                OP,
                format!(
                    "top_k {} of {} experts unsupported",
                    self.top_k, self.experts
                ),
            ));
        }
        Ok(())
    }

    /// The expert stack of this problem's `moe_gate_up` (`gate_up`) or
    /// its `moe_down`.
    fn stack(&self, gate_up: bool) -> ExpertStack {
        ExpertStack {
            experts: self.experts,
            gate_up,
        }
    }

    /// Shapes, dtypes and aliasing of a `moe_gate_up` call; its arguments
    /// by role.
    pub fn validate_gate_up<'a, B: DeviceBuffer>(
        &self,
        x: &'a B,
        gate_up: &'a B,
        ids: &'a B,
        act: &'a B,
    ) -> Result<Args<'a, B>> {
        const OP: &str = "moe_gate_up";
        self.check_common()?;
        check_buf(OP, "x", x, &F32, self.m * self.hidden)?;
        check_weight(
            OP,
            "gate_up",
            gate_up,
            self.experts * 2 * self.inter * self.hidden,
        )?;
        check_buf(OP, "ids", ids, &U32, self.m * self.top_k)?;
        check_buf(OP, "act", act, &F32, self.m * self.top_k * self.inter)?;
        no_alias(OP, act, &[Some(x), Some(gate_up), Some(ids)])?;
        Ok(Args::new(OP)
            .plain("x", x)
            .with("gate_up", gate_up, Role::Experts(self.stack(true)))
            .plain("ids", ids)
            .plain("act", act))
    }

    /// Shapes, dtypes and aliasing of a `moe_down` call; its arguments by
    /// role.
    pub fn validate_down<'a, B: DeviceBuffer>(
        &self,
        act: &'a B,
        down: &'a B,
        ids: &'a B,
        weights: &'a B,
        out: &'a B,
    ) -> Result<Args<'a, B>> {
        const OP: &str = "moe_down";
        self.check_common()?;
        check_buf(OP, "act", act, &F32, self.m * self.top_k * self.inter)?;
        check_weight(OP, "down", down, self.experts * self.hidden * self.inter)?;
        check_buf(OP, "ids", ids, &U32, self.m * self.top_k)?;
        check_buf(OP, "weights", weights, &F32, self.m * self.top_k)?;
        check_buf(OP, "out", out, &F32, self.m * self.hidden)?;
        no_alias(OP, out, &[Some(act), Some(down), Some(ids), Some(weights)])?;
        Ok(Args::new(OP)
            .plain("act", act)
            .with("down", down, Role::Experts(self.stack(false)))
            .plain("ids", ids)
            .plain("weights", weights)
            .plain("out", out))
    }
}

/// The arguments of one [`ComputeBackend::moe_gate_up`], for the pair op.
pub struct GateUpArgs<'a, B> {
    pub x: &'a B,
    pub gate_up: &'a B,
    pub ids: &'a B,
    pub act: &'a B,
    pub p: Moe,
}

/// The arguments of one [`ComputeBackend::moe_down`], for the pair op.
pub struct DownArgs<'a, B> {
    pub act: &'a B,
    pub down: &'a B,
    pub ids: &'a B,
    pub weights: &'a B,
    pub out: &'a B,
    pub p: Moe,
}

impl<'a, B: DeviceBuffer> GateUpArgs<'a, B> {
    /// This one call: `be.moe_gate_up(..)`.
    pub fn run<E: ComputeBackend<Buffer = B> + ?Sized>(&self, be: &E) -> Result<()> {
        be.moe_gate_up(self.x, self.gate_up, self.ids, self.act, self.p)
    }

    /// This call's checks ([`Moe::validate_gate_up`]); its arguments by
    /// role.
    pub fn check(&self) -> Result<Args<'a, B>> {
        self.p
            .validate_gate_up(self.x, self.gate_up, self.ids, self.act)
    }

    /// The checks of [`ComputeBackend::moe_gate_up_pair`]: each problem's,
    /// then that neither output aliases the other problem's buffers. Each
    /// problem's arguments by role.
    pub fn check_pair(a: &Self, b: &Self) -> Result<[Args<'a, B>; 2]> {
        let args = [a.check()?, b.check()?];
        pair_apart(
            "moe_gate_up_pair",
            &[a.x, a.gate_up, a.ids, a.act],
            &[b.x, b.gate_up, b.ids, b.act],
        )?;
        Ok(args)
    }
}

impl<'a, B: DeviceBuffer> DownArgs<'a, B> {
    /// This one call: `be.moe_down(..)`.
    pub fn run<E: ComputeBackend<Buffer = B> + ?Sized>(&self, be: &E) -> Result<()> {
        be.moe_down(
            self.act,
            self.down,
            self.ids,
            self.weights,
            self.out,
            self.p,
        )
    }

    /// This call's checks ([`Moe::validate_down`]); its arguments by role.
    pub fn check(&self) -> Result<Args<'a, B>> {
        self.p
            .validate_down(self.act, self.down, self.ids, self.weights, self.out)
    }

    /// The checks of [`ComputeBackend::moe_down_pair`]: each problem's,
    /// then that neither output aliases the other problem's buffers. Each
    /// problem's arguments by role.
    pub fn check_pair(a: &Self, b: &Self) -> Result<[Args<'a, B>; 2]> {
        let args = [a.check()?, b.check()?];
        pair_apart(
            "moe_down_pair",
            &[a.act, a.down, a.ids, a.weights, a.out],
            &[b.act, b.down, b.ids, b.weights, b.out],
        )?;
        Ok(args)
    }
}
