//! A layer's routed experts ([`MoeBlock`]): the router, the two expert
//! stacks (all experts resident, or a streamed layer's slots) and the
//! norms around them, with the MoE ops' arguments over them. How the
//! experts' phases are launched beside the dense MLP is the feed-forward
//! block's (`model::decoder::feed_forward`).

use std::cell::RefCell;

use super::slot_cache::{Policy, SlotCache};
use super::stored::StoredExperts;
use super::streaming::{self, ExpertStore, SlotStacks, StreamPass, StreamedLayer};
use crate::backend::{ComputeBackend, ExpertStack, HostBytes, Support};
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::scratch::ExpertScratch;
use crate::model::weights::Loader;
use crate::ops::{DownArgs, GateUpArgs, Moe, OpKind, Router, RouterArgs, SlotArgs, SlotLookup};

/// The routed-expert half of a layer's feed-forward block.
pub(crate) struct MoeBlock<B: ComputeBackend> {
    /// Its layer's index: the column of a routing trace.
    pub layer: usize,
    /// Experts in the model, routed to a token, and their intermediate width.
    pub experts: usize,
    pub top_k: usize,
    pub inter: usize,
    pub router_proj: B::Buffer,
    /// f32 `[hidden]`: `router.scale * hidden^-1/2`.
    pub eff_scale: B::Buffer,
    /// f32 `[experts]`.
    pub per_expert_scale: B::Buffer,
    /// `[E * 2 * moe_inter, hidden]` (gate rows then up rows per expert);
    /// with streamed experts, a stack of slots.
    pub gate_up: B::Buffer,
    /// `[E * hidden, moe_inter]`; with streamed experts, a stack of slots.
    pub down: B::Buffer,
    /// `pre_feedforward_layernorm_2`: the experts' input norm.
    pub pre_norm: B::Buffer,
    /// `post_feedforward_layernorm_2`: the experts' output norm.
    pub post_norm: B::Buffer,
    /// `post_feedforward_layernorm_1`: the dense branch's output norm,
    /// which a layer has only beside experts.
    pub dense_post_norm: B::Buffer,
    /// With streamed experts: the stacks in the source and the slots' cache.
    pub streamed: Option<RefCell<StreamedLayer>>,
    /// With streamed experts from a host store ([`ExpertStore::Host`]):
    /// every expert of the layer (gate_up, down) in host memory the device
    /// copies misses from.
    pub host_store: Option<[B::Buffer; 2]>,
    /// With streamed experts: the slot cache's table on the device (u32
    /// `[experts]`, each expert's slot or `ops::NO_SLOT`), which
    /// `slot_lookup` reads and every placement that loads rewrites.
    pub slot_table: Option<B::Buffer>,
}

/// A routed layer's two phases' arguments (gate_up, down).
pub(crate) type Phases<'s, T> = (GateUpArgs<'s, T>, DownArgs<'s, T>);

/// The routed phases on a streamed layer's slots, and the lookup that
/// puts the router's experts in them ([`MoeBlock::lookup`]).
pub(crate) type SlotPhases<'s, T> = (Phases<'s, T>, SlotArgs<'s, T>);

/// Where a streamed layer's routed experts left their output
/// ([`MoeBlock::place`]).
pub(crate) enum Placed<'s, T> {
    /// One wave: its gate_up ran; this down phase on the slots (the
    /// resident layer's, its ids the slots') is still to run.
    OneWave(DownArgs<'s, T>),
    /// Several waves ran both phases; their sum.
    Waves(&'s T),
}

/// A layer's host stores of its `gate_up` and `down` experts for stacks of
/// `n` slots, where the backend makes them (both, or neither is used).
fn host_stores<B: ComputeBackend>(
    ld: &Loader<'_, B>,
    (gate_up, down): (&StoredExperts, &StoredExperts),
    n: usize,
    prefix: &str,
) -> Result<Option<[B::Buffer; 2]>> {
    let mut made = Vec::with_capacity(2);
    for (st, is_gate_up, part) in [(gate_up, true, "gate_up"), (down, false, "down")] {
        st.check_unchanged()?;
        let experts: Vec<_> = (0..st.experts).map(|e| st.expert(e)).collect();
        let stack = ExpertStack {
            experts: n,
            gate_up: is_gate_up,
        };
        let label = format!("{prefix}experts.{part} (host store)");
        match ld
            .backend
            .host_experts(st.dtype, stack, (st.rows, st.cols), &experts, &label)?
        {
            Some(b) => made.push(b),
            None => return Ok(None),
        }
    }
    Ok(made.try_into().ok())
}

impl<B: ComputeBackend> MoeBlock<B> {
    /// Layer `layer`'s experts from `ld`; with `slots`, that many device
    /// slots a stack, filled from the source as the router asks (after the
    /// backend said it can write the stacks' format into slots).
    pub fn load(
        ld: &Loader<'_, B>,
        cfg: &ModelConfig,
        layer: usize,
        slots: Option<(usize, Policy, ExpertStore)>,
    ) -> Result<Self> {
        let p = format!("layers.{layer}.");
        let (h, e, mi) = (cfg.hidden, cfg.experts, cfg.moe_inter);
        let inv_sqrt_h = 1.0 / (h as f32).sqrt();
        let scale = ld.host_f32(&format!("{p}router.scale"), &[h])?;
        let eff: Vec<f32> = scale.iter().map(|s| s * inv_sqrt_h).collect();
        let pes = ld.host_f32(&format!("{p}router.per_expert_scale"), &[e])?;
        let n = slots.map(|s| s.0);
        let mut host_store = None;
        let (gate_up, stored_gu) =
            ld.experts(&format!("{p}experts.gate_up_proj"), [e, 2 * mi, h], true, n)?;
        let (down, stored_down) =
            ld.experts(&format!("{p}experts.down_proj"), [e, h, mi], false, n)?;
        let streamed = match (stored_gu.zip(stored_down), slots) {
            (Some((gate_up, down)), Some((n, policy, store))) => {
                let be = ld.backend;
                for d in [gate_up.dtype, down.dtype] {
                    if let Support::No(reason) = be.supports(&OpKind::ExpertSlots { w: d }) {
                        return Err(Error::Unsupported {
                            backend: be.info().backend.clone(),
                            op: format!("streamed {d} experts"),
                            reason,
                        });
                    }
                }
                if store == ExpertStore::Host {
                    host_store = host_stores(ld, (&gate_up, &down), n, &p)?;
                }
                Some(RefCell::new(StreamedLayer {
                    gate_up,
                    down,
                    cache: SlotCache::new(e, n, policy)?,
                }))
            }
            _ => None,
        };
        let slot_table = match &streamed {
            Some(_) => Some(ld.backend.upload(
                crate::DType::U32,
                HostBytes::Slice(bytemuck::cast_slice(&vec![crate::ops::NO_SLOT; e])),
                &format!("{p}slot_table"),
            )?),
            None => None,
        };
        Ok(MoeBlock {
            layer,
            experts: e,
            top_k: cfg.top_k,
            inter: mi,
            router_proj: ld.weight(&format!("{p}router.proj.weight"), e, h)?,
            eff_scale: ld.upload_f32(&eff, &format!("{p}router.eff_scale"))?,
            per_expert_scale: ld.upload_f32(&pes, &format!("{p}router.per_expert_scale"))?,
            gate_up,
            down,
            pre_norm: ld.norm(&format!("{p}pre_feedforward_layernorm_2.weight"), h)?,
            post_norm: ld.norm(&format!("{p}post_feedforward_layernorm_2.weight"), h)?,
            dense_post_norm: ld.norm(&format!("{p}post_feedforward_layernorm_1.weight"), h)?,
            streamed,
            slot_table,
            host_store,
        })
    }

    /// The router on `r` (not a pre-norm of it) into `s`'s ids and weights.
    pub fn router<'s>(
        &'s self,
        s: &'s ExpertScratch<B::Buffer>,
        p: Router,
    ) -> RouterArgs<'s, B::Buffer> {
        RouterArgs {
            eff_scale: &self.eff_scale,
            proj: &self.router_proj,
            per_expert_scale: &self.per_expert_scale,
            ids: &s.ids,
            weights: &s.weights,
            p,
        }
    }

    /// The routed gate_up phase of `s`'s input.
    pub fn gate_up<'s>(
        &'s self,
        s: &'s ExpertScratch<B::Buffer>,
        p: Moe,
    ) -> GateUpArgs<'s, B::Buffer> {
        GateUpArgs {
            x: &s.x,
            gate_up: &self.gate_up,
            ids: &s.ids,
            act: &s.act,
            p,
        }
    }

    /// The routed down phase, weighted and summed into `s.out`.
    pub fn down<'s>(&'s self, s: &'s ExpertScratch<B::Buffer>, p: Moe) -> DownArgs<'s, B::Buffer> {
        DownArgs {
            act: &s.act,
            down: &self.down,
            ids: &s.ids,
            weights: &s.weights,
            out: &s.out,
            p,
        }
    }

    /// A streamed layer's routed experts after its router ran
    /// ([`streaming::run`]): placed in the slots, and run as far as their
    /// waves take them.
    pub fn place<'s>(
        &'s self,
        be: &B,
        sp: &mut StreamPass<'_>,
        s: &'s ExpertScratch<B::Buffer>,
        gate_up: &GateUpArgs<'s, B::Buffer>,
        down: &DownArgs<'s, B::Buffer>,
    ) -> Result<Placed<'s, B::Buffer>> {
        let li = self.layer;
        let mut layer = self
            .streamed
            .as_ref()
            .ok_or_else(|| Error::InvalidInput(format!("layer {li} has no streamed experts")))?
            .borrow_mut();
        let ws = s
            .waves
            .as_ref()
            .ok_or_else(|| Error::InvalidInput("streamed experts without wave scratch".into()))?;
        let slot_down = DownArgs {
            ids: &ws.slot_ids,
            p: Moe {
                experts: layer.cache.slots(),
                ..down.p
            },
            ..*down
        };
        let stacks = self.stacks()?;
        match streaming::run(be, &mut layer, li, sp, stacks, s, ws, gate_up, &slot_down)? {
            None => Ok(Placed::OneWave(slot_down)),
            Some(sum) => Ok(Placed::Waves(sum)),
        }
    }

    /// The slot stacks and the device's slot table of a streamed layer.
    pub fn stacks(&self) -> Result<SlotStacks<'_, B>> {
        let table = self.slot_table.as_ref().ok_or_else(|| {
            Error::InvalidInput(format!("layer {} has no streamed experts", self.layer))
        })?;
        Ok(SlotStacks {
            gate_up: &self.gate_up,
            down: &self.down,
            table,
            store: self.host_store.as_ref().map(|[g, d]| [g, d]),
        })
    }

    /// A streamed layer's routed phases on its slots, for a pass recorded
    /// optimistically: the device's slot table to look the router's ids up
    /// in, into the wave scratch's slot ids, logged at this layer's place in
    /// the pass's log (`post_attention_gate_up_slots` records the lookup);
    /// the two phases' arguments on the slots.
    pub fn lookup<'s>(
        &'s self,
        s: &'s ExpertScratch<B::Buffer>,
        gate_up: &GateUpArgs<'s, B::Buffer>,
        down: &DownArgs<'s, B::Buffer>,
    ) -> Result<SlotPhases<'s, B::Buffer>> {
        let li = self.layer;
        let slots = self
            .streamed
            .as_ref()
            .ok_or_else(|| Error::InvalidInput(format!("layer {li} has no streamed experts")))?
            .borrow()
            .cache
            .slots();
        let ws = s
            .waves
            .as_ref()
            .ok_or_else(|| Error::InvalidInput("streamed experts without wave scratch".into()))?;
        let table = self.stacks()?.table;
        let k = gate_up.p.top_k;
        let lookup = SlotArgs {
            table,
            log: &ws.log,
            p: SlotLookup {
                n: gate_up.p.m * k,
                experts: self.experts,
                slots,
                at: li * k,
            },
        };
        let p = Moe {
            experts: slots,
            ..down.p
        };
        Ok((
            (
                GateUpArgs {
                    ids: &ws.slot_ids,
                    p,
                    ..*gate_up
                },
                DownArgs {
                    ids: &ws.slot_ids,
                    p,
                    ..*down
                },
            ),
            lookup,
        ))
    }
}
