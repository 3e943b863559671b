//! An op call's buffer arguments by name and role, as its contract returns
//! them once its checks pass: what a backend needs to check how it holds
//! them ([`crate::ComputeBackend::check_held`]) with one rule for every op
//! rather than a list of its own per op.

use crate::backend::ExpertStack;

/// How an op reads one of its buffer arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A buffer as `alloc` or `upload` made it (activations, ids,
    /// positions, caches, norm weights), read as one buffer.
    Plain,
    /// A matrix from `upload_weight`, which a backend may hold split by
    /// rows (the op's launcher reads each part, or reports the case
    /// unsupported).
    Weight,
    /// An MoE op's expert stack (`upload_experts`): a weight that a backend
    /// may also hold in an order of its own, read only by the op that
    /// takes exactly this stack.
    Experts(ExpertStack),
}

/// One buffer argument of an op call: its name in the op's errors, the
/// buffer, and how the op reads it.
#[derive(Debug)]
pub struct Arg<'a, B> {
    pub name: &'static str,
    pub buf: &'a B,
    pub role: Role,
}

/// Every buffer argument of one op call, inputs first; an absent optional
/// argument is left out.
#[derive(Debug)]
pub struct Args<'a, B> {
    /// The op's name, as its errors give it.
    pub op: &'static str,
    pub list: Vec<Arg<'a, B>>,
}

impl<'a, B> Args<'a, B> {
    pub fn new(op: &'static str) -> Self {
        Args {
            op,
            list: Vec::new(),
        }
    }

    /// With `buf` as argument `name`, read in `role`.
    pub fn with(mut self, name: &'static str, buf: &'a B, role: Role) -> Self {
        self.list.push(Arg { name, buf, role });
        self
    }

    /// With `buf` as a [`Role::Plain`] argument.
    pub fn plain(self, name: &'static str, buf: &'a B) -> Self {
        self.with(name, buf, Role::Plain)
    }

    /// With `buf`, if present, as a [`Role::Plain`] argument.
    pub fn maybe(self, name: &'static str, buf: Option<&'a B>) -> Self {
        match buf {
            Some(b) => self.plain(name, b),
            None => self,
        }
    }
}
