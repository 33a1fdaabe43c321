//! How a person names a run, in one place for the daemon's table and for the commands that
//! read run directories without a daemon (`report`).
//!
//! In this order: `name:NAME` is the newest run named NAME, whatever NAME looks like; an
//! exact id is that run; `last` is the newest run; otherwise the runs whose id starts with
//! the text, and the newest run so named. One of them, or both the same run, is the answer;
//! an id prefix that also names another run is ambiguous, and the error says how to pick
//! (`name:`, or more of the id). So a run named `last` or `2026` is reached as `name:last`,
//! `name:2026`.

/// The prefix that makes the rest a run's name, never an id, a prefix or `last`.
pub const NAME_PREFIX: &str = "name:";

/// The keyword for the newest run.
pub const LAST: &str = "last";

/// Why a text names no one run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("name a run: its id, an id prefix, its name (or name:NAME), or `last`")]
    Empty,
    #[error("there are no runs yet")]
    NoRuns,
    #[error("{0}")]
    Unknown(String),
    #[error("{0}")]
    Ambiguous(String),
}

/// The run of `runs` (oldest first) that `spec` names; `id` and `name` read a run's. A name
/// is read only when the text is not an id (`report` reads it from a file).
pub fn resolve<'a, R>(
    spec: &str,
    runs: &'a [R],
    id: impl Fn(&R) -> &str,
    name: impl Fn(&R) -> Option<String>,
) -> Result<&'a R, SpecError> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err(SpecError::Empty);
    }
    let newest_named = |n: &str| runs.iter().rev().find(|r| name(r).as_deref() == Some(n));
    if let Some(wanted) = spec.strip_prefix(NAME_PREFIX) {
        return newest_named(wanted).ok_or_else(|| {
            SpecError::Unknown(format!(
                "no run is named `{wanted}`: `gpupilot ps` lists them"
            ))
        });
    }
    if let Some(r) = runs.iter().find(|r| id(r) == spec) {
        return Ok(r);
    }
    if spec == LAST {
        return runs.last().ok_or(SpecError::NoRuns);
    }
    let prefixed: Vec<&R> = runs.iter().filter(|r| id(r).starts_with(spec)).collect();
    let named = newest_named(spec);
    let same = |a: &R, b: &R| id(a) == id(b);
    match (prefixed.as_slice(), named) {
        ([one], None) => Ok(one),
        ([one], Some(n)) if same(one, n) => Ok(one),
        ([], Some(n)) => Ok(n),
        ([], None) => Err(SpecError::Unknown(format!(
            "no run matches `{spec}`: `gpupilot ps` lists them"
        ))),
        (many, None) => Err(SpecError::Ambiguous(format!(
            "`{spec}` matches {} runs ({}): give more of the id",
            many.len(),
            listed(many, &id)
        ))),
        (many, Some(n)) => Err(SpecError::Ambiguous(format!(
            "`{spec}` is the name of run {} and the start of the id of {} ({}): say \
             `{NAME_PREFIX}{spec}` for the run of that name, or give more of the id",
            id(n),
            if many.len() == 1 {
                "another run".to_string()
            } else {
                format!("{} runs", many.len())
            },
            listed(many, &id)
        ))),
    }
}

/// Up to five ids, then `…`.
fn listed<R>(runs: &[&R], id: &impl Fn(&R) -> &str) -> String {
    let mut shown: Vec<&str> = runs.iter().take(5).map(|r| id(r)).collect();
    if runs.len() > 5 {
        shown.push("…");
    }
    shown.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (id, name), oldest first.
    fn pick<'a>(runs: &'a [(&'a str, &'a str)], spec: &str) -> Result<&'a str, SpecError> {
        resolve(spec, runs, |r| r.0, |r| Some(r.1.to_string())).map(|r| r.0)
    }

    const RUNS: &[(&str, &str)] = &[
        ("20261130-031500-train", "train"),
        ("20261130-031600-last", "last"),
        ("20261130-031700-2026", "2026"),
        ("20261130-041500-train", "train"),
    ];

    #[test]
    fn ids_prefixes_names_and_last() {
        assert_eq!(
            pick(RUNS, "20261130-031500-train"),
            Ok("20261130-031500-train")
        );
        assert_eq!(pick(RUNS, "20261130-0316"), Ok("20261130-031600-last"));
        assert_eq!(pick(RUNS, " train "), Ok("20261130-041500-train"));
        assert_eq!(pick(RUNS, "last"), Ok("20261130-041500-train"));
        assert_eq!(pick(RUNS, ""), Err(SpecError::Empty));
        assert_eq!(pick(&[], "last"), Err(SpecError::NoRuns));
        let Err(SpecError::Unknown(e)) = pick(RUNS, "nope") else {
            panic!()
        };
        assert!(e.contains("no run matches `nope`"), "{e}");
        let Err(SpecError::Ambiguous(e)) = pick(RUNS, "20261130-03") else {
            panic!()
        };
        assert!(
            e.contains("matches 3 runs") && e.contains("more of the id"),
            "{e}"
        );
    }

    #[test]
    fn a_name_that_is_a_keyword_or_looks_like_an_id_is_reached_with_name_prefix() {
        // `last` stays the newest run; the run named `last` is `name:last`.
        assert_eq!(pick(RUNS, "last"), Ok("20261130-041500-train"));
        assert_eq!(pick(RUNS, "name:last"), Ok("20261130-031600-last"));
        // `2026` starts every id and names one run: ambiguous, and the error says how to pick.
        let Err(SpecError::Ambiguous(e)) = pick(RUNS, "2026") else {
            panic!()
        };
        assert!(
            e.contains("`2026` is the name of run 20261130-031700-2026")
                && e.contains("the id of 4 runs")
                && e.contains("say `name:2026`"),
            "{e}"
        );
        assert_eq!(pick(RUNS, "name:2026"), Ok("20261130-031700-2026"));
        // The newest of a name; a name never matches part of a name.
        assert_eq!(pick(RUNS, "name:train"), Ok("20261130-041500-train"));
        let Err(SpecError::Unknown(e)) = pick(RUNS, "name:trai") else {
            panic!()
        };
        assert!(e.contains("no run is named `trai`"), "{e}");
        // A prefix of one id that is also another run's name is ambiguous too.
        let runs = [
            ("20261130-031500-a", "x"),
            ("20261130-031600-b", "20261130-0315"),
        ];
        let Err(SpecError::Ambiguous(e)) = pick(&runs, "20261130-0315") else {
            panic!()
        };
        assert!(e.contains("another run (20261130-031500-a)"), "{e}");
        assert_eq!(pick(&runs, "name:20261130-0315"), Ok("20261130-031600-b"));
        // A run whose name is a prefix of its own id is just that run.
        let runs = [("20261130-031500-a", "20261130-0315"), ("20271130-0", "y")];
        assert_eq!(pick(&runs, "20261130-0315"), Ok("20261130-031500-a"));
    }
}
