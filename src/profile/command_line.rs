//! A profile for `gpupilot run -- CMD…`: no file, so knobs are declared on the command line
//! (`--knob batch_size=64:8..512`), and a command that uses `{batch_size}` without one is
//! refused here with a message about `--knob`, not about a `run.toml` the user never wrote.

use super::{Knob, Profile};

/// One `--knob NAME=INITIAL[:MIN..[MAX]]`: `batch_size=64:8..512`, `prefetch=2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnobDecl {
    /// `batch_size` or `prefetch`.
    pub name: &'static str,
    pub knob: Knob,
}

/// The knobs a command may take, with their placeholders and lowest values (as in a profile's
/// `[knobs]`).
const KNOBS: [(&str, &str, i64); 2] = [
    ("batch_size", "{batch_size}", 1),
    ("prefetch", "{prefetch}", 0),
];

impl KnobDecl {
    /// Parse `NAME=INITIAL[:MIN..[MAX]]`; the range defaults to the knob's lowest value and no
    /// upper bound.
    pub fn parse(s: &str) -> Result<KnobDecl, String> {
        let usage = "give NAME=INITIAL:MIN..MAX, e.g. batch_size=64:8..512";
        let (name, spec) = s.split_once('=').ok_or_else(|| format!("`{s}`: {usage}"))?;
        let wanted = name.trim().replace('-', "_");
        let &(name, _, floor) = KNOBS
            .iter()
            .find(|(n, _, _)| *n == wanted)
            .ok_or_else(|| format!("`{}` is no knob: use batch_size or prefetch", name.trim()))?;
        let int = |t: &str, what: &str| {
            t.trim().parse::<i64>().map_err(|_| {
                format!(
                    "{name}: {what} `{}` is not a whole number; {usage}",
                    t.trim()
                )
            })
        };
        let (initial, range) = match spec.split_once(':') {
            Some((i, r)) => (int(i, "initial value")?, Some(r)),
            None => (int(spec, "initial value")?, None),
        };
        let (min, max) = match range {
            None => (floor, None),
            Some(r) => {
                let (lo, hi) = r
                    .split_once("..")
                    .ok_or_else(|| format!("{name}: range `{r}`: {usage}"))?;
                let lo = if lo.trim().is_empty() {
                    floor
                } else {
                    int(lo, "min")?
                };
                let hi = if hi.trim().is_empty() {
                    None
                } else {
                    Some(int(hi.trim_start_matches('='), "max")?)
                };
                (lo, hi)
            }
        };
        if min < floor {
            return Err(format!("{name}: min = {min} is below {floor}"));
        }
        if max.is_some_and(|m| m < min) {
            return Err(format!(
                "{name}: max = {} is below min = {min}",
                max.unwrap_or_default()
            ));
        }
        let knob = Knob { initial, min, max };
        if !knob.allows(initial) {
            return Err(format!(
                "{name}: initial = {initial} is outside {min}..{}",
                max.map_or(String::new(), |m| m.to_string())
            ));
        }
        Ok(KnobDecl { name, knob })
    }
}

impl Profile {
    /// The profile of `run -- argv…` with the knobs declared by `--knob`; a placeholder without
    /// its knob, or a knob declared twice, is refused in the command line's own words.
    pub fn for_command(argv: Vec<String>, knobs: &[KnobDecl]) -> Result<Profile, String> {
        let mut p = Profile::from_command(argv);
        for d in knobs {
            let slot = match d.name {
                "batch_size" => &mut p.knobs.batch_size,
                _ => &mut p.knobs.prefetch,
            };
            if slot.replace(d.knob).is_some() {
                return Err(format!("--knob {} is given twice", d.name));
            }
        }
        let words = match &p.run.command {
            super::CommandSpec::Argv(argv) => argv.clone(),
            super::CommandSpec::Shell(script) => vec![script.clone()],
        };
        for (name, placeholder, _) in KNOBS {
            let declared = match name {
                "batch_size" => p.knobs.batch_size.is_some(),
                _ => p.knobs.prefetch.is_some(),
            };
            if !declared && words.iter().any(|w| w.contains(placeholder)) {
                let example = if name == "batch_size" {
                    "64:8..512"
                } else {
                    "2:0..16"
                };
                return Err(format!(
                    "the command uses {placeholder}: declare the knob with its starting value \
                     and range, e.g. `gpupilot run --knob {name}={example} -- …`"
                ));
            }
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn knob_declarations_parse_with_their_ranges() {
        let d = KnobDecl::parse("batch_size=64:8..512").unwrap();
        assert_eq!(d.name, "batch_size");
        assert_eq!(
            d.knob,
            Knob {
                initial: 64,
                min: 8,
                max: Some(512)
            }
        );
        let d = KnobDecl::parse("batch-size=32").unwrap();
        assert_eq!((d.knob.min, d.knob.max), (1, None));
        let d = KnobDecl::parse("prefetch=2:..16").unwrap();
        assert_eq!((d.name, d.knob.min, d.knob.max), ("prefetch", 0, Some(16)));
        let d = KnobDecl::parse("prefetch=2:1..").unwrap();
        assert_eq!((d.knob.min, d.knob.max), (1, None));
        for bad in [
            "batch_size",
            "lr=3",
            "batch_size=x",
            "batch_size=64:8-512",
            "batch_size=64:0..512",
            "batch_size=64:100..50",
            "batch_size=600:8..512",
            "batch_size=1e308",
        ] {
            let e = KnobDecl::parse(bad).unwrap_err();
            assert!(e.len() < 160, "{bad}: {e}");
        }
        assert!(
            KnobDecl::parse("lr=3")
                .unwrap_err()
                .contains("batch_size or prefetch")
        );
    }

    #[test]
    fn a_placeholder_needs_its_knob_declared() {
        let cmd = argv(&["python3", "t.py", "--batch-size", "{batch_size}"]);
        let e = Profile::for_command(cmd.clone(), &[]).unwrap_err();
        assert!(
            e.contains("--knob batch_size=") && !e.contains("run.toml"),
            "{e}"
        );
        let decl = KnobDecl::parse("batch_size=64:8..512").unwrap();
        let p = Profile::for_command(cmd.clone(), &[decl]).unwrap();
        assert_eq!(p.knobs.batch_size, Some(decl.knob));
        assert_eq!(p.knobs.prefetch, None);
        // What the daemon checks again: the profile as TOML loads back the same.
        let again = crate::profile::parse_str("run.toml", &p.to_toml()).unwrap();
        assert_eq!(again.knobs, p.knobs);
        assert!(Profile::for_command(cmd, &[decl, decl]).is_err());
        assert!(Profile::for_command(argv(&["true"]), &[]).is_ok());
    }
}
