//! How exactly the tensor-core products are computed ([`Precision`]).

use std::fmt;
use std::str::FromStr;

/// The arithmetic of the products a backend runs on f16 matrix units
/// (tensor cores: the prefill GEMMs and prefill attention,
/// [`crate::GemmRounding`] names them). Backends without such units compute
/// in f32 whatever is asked.
///
/// `Exact` (the default on every device) splits each activation after its
/// power-of-two scale into two f16 parts, `x = hi + lo` (`hi = f16(x)`,
/// `lo = f16(x - hi)`: 22 significant bits), and sums the partial products
/// in f32: `hi w + lo w` where the other operand is a weight (single f16,
/// exact for bf16 values in range), `hi hi' + hi lo' + lo hi'` where both
/// are activations (attention). Its results sit at the f32 floor, so a
/// prompt prefilled in a batch routes its tokens to the experts that
/// token-by-token decode picks.
///
/// `Fast` rounds each activation once to f16 (11 significant bits): fewer
/// matrix products, at the cost of flipping a top-k expert choice wherever
/// two router logits are within that rounding of each other, after which
/// the row, and every later row through the caches, differs by order one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    #[default]
    Exact,
    Fast,
}

impl Precision {
    /// Both, the default first.
    pub const ALL: [Precision; 2] = [Precision::Exact, Precision::Fast];

    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Exact => "exact",
            Precision::Fast => "fast",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Precision {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<Self> {
        match s {
            "exact" => Ok(Precision::Exact),
            "fast" => Ok(Precision::Fast),
            _ => Err(crate::Error::InvalidInput(format!(
                "precision {s:?}: expected exact or fast"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_its_own_names_and_rejects_others() {
        for p in Precision::ALL {
            assert_eq!(p.as_str().parse::<Precision>().unwrap(), p);
        }
        assert_eq!(Precision::default(), Precision::Exact);
        let e = "f16".parse::<Precision>().unwrap_err().to_string();
        assert!(e.contains("\"f16\"") && e.contains("exact or fast"), "{e}");
    }
}
