//! The simulator's one error type. Hand-written `Display`/`Error` keep the crate's only
//! dependency serde.

use std::fmt;

/// What a simulator call refused, with enough detail for a useful message.
#[derive(Debug, Clone, PartialEq)]
pub enum SimError {
    /// A setter got a value outside what the part accepts; `what` names the knob and its unit.
    OutOfRange {
        what: &'static str,
        value: f64,
        min: f64,
        max: f64,
    },
    /// A training config names a model that is not in `MODELS`.
    UnknownModel(String),
    /// A node config names a GPU that `find` does not know.
    UnknownGpu(String),
    /// A GPU index past the end of the node.
    NoSuchGpu(usize),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::OutOfRange {
                what,
                value,
                min,
                max,
            } => write!(
                f,
                "{what} {value} is out of range: this GPU accepts {min} to {max}"
            ),
            SimError::UnknownModel(m) => write!(
                f,
                "unknown training model {m:?}: known models are {}",
                crate::workload::MODELS
                    .iter()
                    .map(|m| m.id)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            SimError::UnknownGpu(g) => write!(
                f,
                "unknown GPU {g:?}: known GPUs are {}",
                crate::catalog::CATALOG
                    .iter()
                    .map(|s| s.id)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            SimError::NoSuchGpu(i) => write!(f, "no GPU with index {i} in the simulated node"),
        }
    }
}

impl std::error::Error for SimError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_range_and_the_choices() {
        let e = SimError::OutOfRange {
            what: "power limit (W)",
            value: 50.0,
            min: 200.0,
            max: 700.0,
        };
        assert_eq!(
            e.to_string(),
            "power limit (W) 50 is out of range: this GPU accepts 200 to 700"
        );
        let e = SimError::UnknownGpu("b300".into());
        assert!(e.to_string().contains("h100-sxm, h200"), "{e}");
        let e = SimError::UnknownModel("gpt-5".into());
        assert!(e.to_string().contains("resnet50"), "{e}");
    }
}
