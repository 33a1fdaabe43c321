//! What the distributed-run tests share (tests/distributed/sdk_ranks.rs and remote.rs): a rank
//! of the Python SDK (standard library only) that trains by sleeping, and the reading of what
//! the ranks printed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// A rank that trains by sleeping: 20 ms steps (STEPS of them, default 100,000); prints the
/// batch size it uses every step, one write per line (the ranks may share one log file).
pub const RANK_SCRIPT: &str = r#"
import json, os, sys, time
sys.path.insert(0, os.environ["SDK_DIR"])
import gpupilot
rank = int(os.environ["RANK"])
gp = gpupilot.connect(knobs={"batch_size": 32})
for step in range(int(os.environ.get("STEPS", "100000"))):
    bs = gp.knob("batch_size")
    sys.stdout.write(json.dumps({"rank": rank, "step": step, "bs": bs}) + "\n")
    sys.stdout.flush()
    time.sleep(0.02)
    gp.report(step=step, samples_per_s=bs / 0.02, step_time_s=0.02, loss=1.0 / (step + 1))
gp.close()
"#;

/// The SDK's directory (SDK_DIR for the script).
pub fn sdk_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python")
}

/// Every JSON line the ranks printed in `texts`: rank → (step → batch size). Other lines (the
/// SDK's log) are skipped; a JSON line that does not parse is two ranks' lines run together,
/// which fails the test.
pub fn printed<'a>(texts: impl IntoIterator<Item = &'a str>) -> BTreeMap<u64, BTreeMap<u64, i64>> {
    let mut by_rank: BTreeMap<u64, BTreeMap<u64, i64>> = BTreeMap::new();
    for line in texts.into_iter().flat_map(str::lines) {
        if !line.starts_with('{') {
            continue;
        }
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        by_rank
            .entry(v["rank"].as_u64().unwrap())
            .or_default()
            .insert(v["step"].as_u64().unwrap(), v["bs"].as_i64().unwrap());
    }
    by_rank
}
