//! The bounds of the numbers a client sends to change the GPUs or the loops: one place for the
//! command line (which refuses a value outside them before sending anything) and the daemon
//! (which answers a request outside them with `bad_request`, whoever wrote it), so both accept
//! exactly the same values. A GPU's own range (its power limits, its target temperatures) is
//! checked after these, by the daemon, against the GPU.

/// A closed range a number must lie in, and what the number is, for messages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    /// What the number is, in words: `budget in watts`.
    pub what: &'static str,
    pub lo: f64,
    pub hi: f64,
    /// Written after the bounds in messages: ` W`, ` °C`, or nothing.
    pub unit: &'static str,
}

/// A node power budget (`budget WATTS`, `power_budget`'s `budget_w`).
pub const BUDGET_W: Bound = Bound {
    what: "budget in watts",
    lo: 1.0,
    hi: 1_000_000.0,
    unit: " W",
};

/// A power cap of one GPU (`power cap WATTS`, `power_cap`'s `watts`).
pub const CAP_W: Bound = Bound {
    what: "power cap in watts",
    lo: 1.0,
    hi: 10_000.0,
    unit: " W",
};

/// A temperature the thermal governor holds (`thermal target CELSIUS`, `thermal_set`'s
/// `target_c`).
pub const TARGET_C: Bound = Bound {
    what: "target temperature in °C",
    lo: 20.0,
    hi: 120.0,
    unit: " °C",
};

/// Degrees below each GPU's slowdown temperature (`thermal target --margin C`, `thermal_set`'s
/// `margin_c`).
pub const MARGIN_C: Bound = Bound {
    what: "margin in °C",
    lo: 0.0,
    hi: 100.0,
    unit: " °C",
};

/// The driver's target temperature (`power gpu-max CELSIUS`, `gpu_max_temp`'s `celsius`).
pub const GPU_MAX_C: Bound = Bound {
    what: "temperature in °C",
    lo: 0.0,
    hi: 150.0,
    unit: " °C",
};

/// The energy tuner's weight of energy against time (`tune energy --eta`, `tune_start`'s
/// `eta`): 1 energy only, 0 time only.
pub const ETA: Bound = Bound {
    what: "weight eta (0: time only, 1: energy only)",
    lo: 0.0,
    hi: 1.0,
    unit: "",
};

/// MHz between the SM clocks the tuner tries (`--step-mhz`, `step_mhz`): one clock grid step
/// at least.
pub const STEP_MHZ: Bound = Bound {
    what: "step in MHz",
    lo: 15.0,
    hi: 1_000.0,
    unit: " MHz",
};

/// Watts between the caps the tuner tries (`--step-w`, `step_w`).
pub const STEP_W: Bound = Bound {
    what: "step in watts",
    lo: 1.0,
    hi: 1_000.0,
    unit: " W",
};

/// The tuner's warm-up per cap, steps or seconds (`--warmup`, `window.warmup`; 0: none).
pub const WARMUP: Bound = Bound {
    what: "warm-up in steps or seconds",
    lo: 0.0,
    hi: 1e6,
    unit: "",
};

/// A measured window, steps or seconds (`--measure`, `--seconds`, `window.measure`; and
/// `advise --window`).
pub const WINDOW: Bound = Bound {
    what: "number of steps or seconds",
    lo: 1.0,
    hi: 1e6,
    unit: "",
};

impl Bound {
    /// The same bounds under another name (`budget in watts (or `off`)`).
    pub const fn named(self, what: &'static str) -> Bound {
        Bound { what, ..self }
    }

    /// `between 1 and 1000000 W`.
    pub fn range(&self) -> String {
        format!("between {} and {}{}", self.lo, self.hi, self.unit)
    }

    pub fn contains(&self, v: f64) -> bool {
        v.is_finite() && (self.lo..=self.hi).contains(&v)
    }

    /// `v` when it lies within, else why not: `budget in watts must be between 1 and 1000000
    /// W, not 1e-6`.
    pub fn check(&self, v: f64) -> Result<f64, String> {
        if self.contains(v) {
            Ok(v)
        } else if v.is_finite() {
            Err(format!(
                "{} must be {}, not {}",
                self.what,
                self.range(),
                number(v)
            ))
        } else {
            Err(format!(
                "{v} is not a {}: give a number {}",
                self.what,
                self.range()
            ))
        }
    }

    /// Text as typed (the command line): the number when it lies within, else a message that
    /// quotes the text, cut short.
    pub fn parse(&self, s: &str) -> Result<f64, String> {
        let typed = brief(s);
        match s.trim().parse::<f64>() {
            Ok(v) if self.contains(v) => Ok(v),
            Ok(v) if v.is_finite() => Err(format!(
                "{} must be {}, not `{typed}`",
                self.what,
                self.range()
            )),
            _ => Err(format!(
                "`{typed}` is not a {}: give a number {}",
                self.what,
                self.range()
            )),
        }
    }
}

/// `v` as read at a glance: `1e-6` and `1e308` rather than their hundreds of digits.
fn number(v: f64) -> String {
    if v != 0.0 && !(1e-3..1e9).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// Text as typed, cut to a length that reads at a glance.
pub fn brief(s: &str) -> String {
    const MAX: usize = 24;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(MAX).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_bounds_for_text_and_numbers() {
        for b in [BUDGET_W, CAP_W, TARGET_C, MARGIN_C, GPU_MAX_C] {
            for v in [b.lo, b.hi, (b.lo + b.hi) / 2.0] {
                assert_eq!(b.check(v), Ok(v), "{b:?}");
                assert_eq!(b.parse(&v.to_string()), Ok(v), "{b:?}");
            }
            for v in [
                b.lo - 0.5,
                b.hi + 0.5,
                f64::NAN,
                f64::INFINITY,
                -f64::INFINITY,
            ] {
                assert!(
                    b.check(v).is_err() && b.parse(&v.to_string()).is_err(),
                    "{v}"
                );
            }
        }
        assert_eq!(
            BUDGET_W.check(1e-6).unwrap_err(),
            "budget in watts must be between 1 and 1000000 W, not 1e-6"
        );
        assert_eq!(
            BUDGET_W.check(1e308).unwrap_err(),
            "budget in watts must be between 1 and 1000000 W, not 1e308"
        );
        assert_eq!(
            CAP_W.check(0.5).unwrap_err(),
            "power cap in watts must be between 1 and 10000 W, not 0.5"
        );
        assert_eq!(
            TARGET_C.check(f64::NAN).unwrap_err(),
            "NaN is not a target temperature in °C: give a number between 20 and 120 °C"
        );
        assert_eq!(
            BUDGET_W
                .named("budget in watts (or `off`)")
                .parse("1e-6")
                .unwrap_err(),
            "budget in watts (or `off`) must be between 1 and 1000000 W, not `1e-6`"
        );
    }
}
