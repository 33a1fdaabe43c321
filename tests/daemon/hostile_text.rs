//! Text a peer chose, shown to an operator: a client whose process name clears the screen and
//! forges a line sets the node budget; `gpupilot budget`, `gpupilot thermal` and the node's
//! events show that name escaped, on its own line.

use std::process::Stdio;
use std::time::Duration;

use crate::support::home::{Home, node_events};
use crate::support::wait::finish;

#[test]
fn a_hostile_process_name_is_shown_escaped() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    // The kernel names a process after the file it runs.
    let link = home.dir.path().join("gp\u{1b}[2J\nFAKE");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_gpupilot"), &link).unwrap();
    let child = home
        .gpupilot_via(&link, &["budget", "2800"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = finish(
        child,
        "budget 2800 from a hostile name",
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{out:?}");

    let uid = rustix::process::getuid().as_raw();
    let who = match gpupilot::ipc::user_name(uid) {
        Some(name) => format!("{name} (uid {uid})"),
        None => format!("uid {uid}"),
    };
    let by = format!("{who} via gp\\x1b[2J\\nFAKE (pid {pid})");
    for command in ["thermal", "budget"] {
        let text = home.ok(&[command]);
        let lines: Vec<&str> = text.lines().collect();
        // Then the energy line, once the daemon has sampled.
        assert!(matches!(lines.len(), 3 | 4), "{command}: {text}");
        assert_eq!(lines[0], "thermal governor: off", "{command}");
        assert!(
            lines[1].starts_with("budget ") && lines[1].ends_with(&format!(" (by {by})")),
            "{command}: {:?}",
            lines[1]
        );
        assert_eq!(lines[2], "alerts: none", "{command}");
        if let Some(energy) = lines.get(3) {
            assert!(
                energy.starts_with("energy since the daemon started: "),
                "{command}"
            );
        }
    }
    let set: Vec<String> = node_events(&home.paths)
        .iter()
        .filter_map(|e| e["by"].as_str())
        .filter(|b| b.contains("FAKE"))
        .map(String::from)
        .collect();
    assert!(!set.is_empty() && set.iter().all(|b| *b == by), "{set:?}");
}
