//! Runs through daemon restarts and many runs of one name: an exit status kept while no daemon
//! watched (and the restart policy applied to it), a `setsid` grandchild that cannot outlive
//! `stop`, followers that reconnect to a restarted daemon, numeric order of `-N` ids, `last`
//! and names resolving to the newest run, and how a kill and a knob restart are described.

use std::process::{Child, Stdio};
use std::time::{Duration, UNIX_EPOCH};

use crate::support::count_lines;
use crate::support::home::Home;
use crate::support::proc::send;
use crate::support::wait::finish as support_finish;
use crate::support::wait::wait_for;
use gpupilot::profile::Profile;
use gpupilot::supervisor::{Caller, LaunchOptions, ManualClock, Run, adopt};
use rustix::process::Signal;

/// The run `id` as `ps --json` shows it.
fn ps_entry(home: &Home, id: &str) -> serde_json::Value {
    let ps: serde_json::Value = serde_json::from_str(&home.ok(&["ps", "--json"])).unwrap();
    ps.as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("{id} not in ps --json: {ps}"))
}

/// Whether a process is gone (or a zombie), or has become another process (its command line
/// no longer holds `marker`).
fn gone(pid: u32, marker: &str) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .unwrap_or("X");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    matches!(state, "Z" | "X" | "x") || !cmdline.contains(marker)
}

/// Kills a process when dropped (a failing test leaves no stray `sleep` behind).
struct KillOnDrop(u32, &'static str);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.0 > 1 && !gone(self.0, self.1) {
            send(self.0, Signal::KILL);
        }
    }
}

#[test]
fn an_exit_while_no_daemon_runs_is_kept_and_restarted_by_its_policy() {
    let home = Home::new();
    let profile = home.dir.path().join("fails.toml");
    std::fs::write(
        &profile,
        "name = \"fails\"\n[run]\ncommand = [\"sh\", \"-c\", \"echo attempt; sleep 1; exit 3\"]\n\
         [run.restart]\npolicy = \"on-failure\"\nmax_restarts = 1\nbackoff_s = 0.2\n",
    )
    .unwrap();
    let mut d = home.daemon(&[]);
    let id = home
        .ok(&["run", "-d", &profile.display().to_string()])
        .trim()
        .to_string();
    let dir = home.run_dir(&id);
    d.signal_and_wait(Signal::KILL);
    // The first attempt ends (exit 3) while no daemon runs.
    let rec = dir.read_pid().unwrap().expect("a pid file");
    wait_for("the run to end", Duration::from_secs(10), || {
        !adopt::is_alive(&rec)
    });
    std::thread::sleep(Duration::from_millis(200));

    let _d2 = home.daemon(&[]);
    let c = home.client();
    wait_for("the restart and its end", Duration::from_secs(20), || {
        c.run(&id).is_ok_and(|r| r.is_final())
    });
    let run = ps_entry(&home, &id);
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["exit_code"], 3, "{run}");
    assert_eq!(run["restarts"], 1, "the policy restarted it once: {run}");
    let events = std::fs::read_to_string(dir.events_path()).unwrap();
    let exits: Vec<serde_json::Value> = events
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["event"] == "exited")
        .collect();
    assert_eq!(exits.len(), 2, "{events}");
    assert!(exits.iter().all(|e| e["code"] == 3), "{events}");
    let out = std::fs::read_to_string(dir.stdout_path()).unwrap();
    assert_eq!(out, "attempt\nattempt\n");
}

/// Start a run whose shell starts `setsid sleep SECONDS` in the background (a session of its
/// own, outside the run's group) and then runs `rest`; the run's id and the sleep's pid (killed
/// when the guard is dropped).
fn run_leaving_a_sleep(home: &Home, seconds: &'static str, rest: &str) -> (String, KillOnDrop) {
    let marker = home.dir.path().join(format!("escaped-{seconds}"));
    let script = format!(
        "setsid sleep {seconds} & echo $! > {0}.tmp && mv {0}.tmp {0}{rest}",
        marker.display()
    );
    let id = home
        .ok(&["run", "-d", "--", "sh", "-c", &script])
        .trim()
        .to_string();
    wait_for("the grandchild", Duration::from_secs(10), || {
        marker.exists()
    });
    let pid: u32 = std::fs::read_to_string(&marker)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The shell writes the pid as soon as it has forked: the child may not have become
    // `sleep` yet.
    wait_for("the grandchild to run", Duration::from_secs(10), || {
        !gone(pid, seconds)
    });
    (id, KillOnDrop(pid, seconds))
}

#[test]
fn a_setsid_grandchild_does_not_outlive_its_run() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    let (id, sleep) = run_leaving_a_sleep(&home, "1003", "; sleep 30");
    let out = home.ok(&["stop", "--grace", "2", &id]);
    assert!(out.contains("stopped"), "{out}");
    wait_for(
        "the grandchild to be gone after stop",
        Duration::from_secs(3),
        || gone(sleep.0, sleep.1),
    );

    // A run that leaves one behind and succeeds: gone too.
    // (It lives a second, so the test sees the grandchild running before it ends.)
    let (id, sleep) = run_leaving_a_sleep(&home, "1004", "; sleep 1");
    let c = home.client();
    wait_for("the run to end", Duration::from_secs(10), || {
        c.run(&id).is_ok_and(|r| r.is_final())
    });
    assert_eq!(c.run(&id).unwrap().status.as_str(), "succeeded");
    wait_for(
        "the grandchild to be gone after its run ended",
        Duration::from_secs(3),
        || gone(sleep.0, sleep.1),
    );
}

/// Every line a follower printed, checked to be 1..=n exactly once each.
fn counted_once(what: &str, text: &str, n: usize) {
    let got: Vec<&str> = text.lines().collect();
    let want: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
    assert_eq!(got, want, "{what} printed otherwise:\n{text}");
}

fn finish(child: Child, what: &str, timeout: Duration) -> (i32, String, String) {
    let out = support_finish(child, what, timeout);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn followers_survive_a_daemon_kill_and_a_clean_restart() {
    let home = Home::new();
    let mut d = home.daemon(&[]);
    const N: usize = 80;
    let script = format!("i=0; while [ $i -lt {N} ]; do i=$((i+1)); echo $i; sleep 0.1; done");
    let run = home
        .gpupilot(&["run", "--name", "counter", "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let c = home.client();
    let mut id = String::new();
    wait_for("the run to start", Duration::from_secs(10), || {
        match c.run("counter") {
            Ok(r) => {
                id = r.id;
                true
            }
            Err(_) => false,
        }
    });
    drop(c);
    let logs = home
        .gpupilot(&["logs", "-f", &id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = home.run_dir(&id).stdout_path();
    wait_for("some output", Duration::from_secs(10), || {
        count_lines(&out) >= 5
    });

    // kill -9, then a new daemon.
    d.signal_and_wait(Signal::KILL);
    std::thread::sleep(Duration::from_millis(500));
    let mut d = home.daemon(&[]);
    let at = count_lines(&out);
    wait_for("more output", Duration::from_secs(10), || {
        count_lines(&out) >= at + 5
    });
    // A clean stop (the upgrade path), then a new daemon.
    d.signal_and_wait(Signal::TERM);
    std::thread::sleep(Duration::from_millis(500));
    let _d = home.daemon(&[]);

    let (code, stdout, stderr) = finish(run, "run -- (attached)", Duration::from_secs(40));
    assert_eq!(
        code, 0,
        "run -- passes on the run's exit 0\nstderr: {stderr}"
    );
    counted_once("run --", &stdout, N);
    assert!(
        stderr.contains("daemon restarted, following again"),
        "{stderr}"
    );
    assert!(!stderr.contains("$STATE"), "{stderr}");
    let (code, stdout, stderr) = finish(logs, "logs -f", Duration::from_secs(20));
    assert_eq!(code, 0, "stderr: {stderr}");
    counted_once("logs -f", &stdout, N);
    assert!(
        stderr.contains("daemon restarted, following again"),
        "{stderr}"
    );
}

#[test]
fn twelve_runs_of_one_name_order_numerically_and_resolve_to_the_newest() {
    let home = Home::new();
    let work = home.dir.path();
    let caller = Caller {
        cwd: work.to_path_buf(),
        env: [("PATH".to_string(), "/usr/bin:/bin".to_string())].into(),
    };
    // Twelve runs in the same second: ids `…-loop`, `…-loop-2`, …, `…-loop-12`. The 9th and
    // the 12th run on.
    let mut ids = Vec::new();
    let mut live = Vec::new();
    for n in 1..=12u64 {
        let clock = ManualClock::at(UNIX_EPOCH + Duration::from_millis(1_796_008_500_000 + n * 10));
        let script = if n == 9 || n == 12 {
            format!("echo {n}; exec sleep 30")
        } else {
            format!("echo {n}")
        };
        let mut p = Profile::from_command(vec!["sh".into(), "-c".into(), script]);
        p.name = "loop".into();
        let mut run = Run::start_new(
            &home.paths.state,
            &p,
            &caller,
            &LaunchOptions::default(),
            &clock,
        )
        .unwrap();
        if n == 9 || n == 12 {
            live.push(run);
        } else {
            assert!(run.wait(&clock, Duration::from_secs(10)).unwrap());
        }
        ids.push(run_id_of(&home, n));
    }
    assert_eq!(ids[1], format!("{}-2", ids[0]));
    assert_eq!(ids[11], format!("{}-12", ids[0]));
    for r in &live {
        wait_for("the output", Duration::from_secs(10), || {
            count_lines(&r.dir().stdout_path()) == 1
        });
    }

    let _d = home.daemon(&[]);
    let ps = home.ok(&["ps"]);
    let order: Vec<&str> = ps
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(order, ids, "{ps}");
    let json: serde_json::Value = serde_json::from_str(&home.ok(&["ps", "--json"])).unwrap();
    let order: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(order, ids);
    assert_eq!(home.ok(&["logs", "loop"]), "12\n");
    assert_eq!(home.ok(&["logs", "last"]), "12\n");

    let out = home.ok(&["stop", "last", "--kill"]);
    assert!(out.starts_with(&ids[11]), "{out}");
    let c = home.client();
    assert_eq!(c.run(&ids[11]).unwrap().status.as_str(), "stopped");
    assert_eq!(c.run(&ids[8]).unwrap().status.as_str(), "running");
    // The name still means the newest run of that name, ended or not.
    assert_eq!(c.run("loop").unwrap().id, ids[11]);
    home.ok(&["stop", &ids[8], "--kill"]);
    drop(live);
}

/// The id of the `n`-th run of `loop` made above.
fn run_id_of(home: &Home, n: u64) -> String {
    let base = "20261130-031500-loop";
    let id = if n == 1 {
        base.to_string()
    } else {
        format!("{base}-{n}")
    };
    assert!(
        home.paths.state.join("runs").join(&id).is_dir(),
        "{id} exists"
    );
    id
}

#[test]
fn stop_kill_says_it_killed_at_once() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    let id = home
        .ok(&["run", "-d", "--", "sleep", "30"])
        .trim()
        .to_string();
    let out = home.ok(&["stop", "--kill", &id]);
    assert!(out.contains("killed by SIGKILL"), "{out}");
    assert!(!out.contains("after the grace period"), "{out}");
    assert!(out.contains("stop --kill"), "{out}");
}

#[test]
fn a_knob_restart_is_shown_as_a_restart_for_the_change() {
    let home = Home::new();
    let _d = home.daemon(&[]);
    let profile = home.dir.path().join("knob.toml");
    std::fs::write(
        &profile,
        "name = \"knob\"\n[run]\ncommand = [\"sh\", \"-c\", \"echo bs=$0; exec sleep 30\", \"{batch_size}\"]\n\
         [knobs.batch_size]\ninitial = 32\nmin = 1\nmax = 512\n",
    )
    .unwrap();
    let id = home
        .ok(&["run", "-d", &profile.display().to_string()])
        .trim()
        .to_string();
    let out = home.run_dir(&id).stdout_path();
    wait_for("the first attempt", Duration::from_secs(10), || {
        count_lines(&out) == 1
    });
    home.ok(&["set", &id, "batch-size", "64", "--restart", "--no-wait"]);
    let c = home.client();
    wait_for("the restart", Duration::from_secs(15), || {
        c.run(&id)
            .is_ok_and(|r| r.restarts == 1 && r.status.as_str() == "running")
    });
    let run = ps_entry(&home, &id);
    let description = run["description"].as_str().unwrap_or_default();
    assert!(!description.contains("SIGTERM"), "{run}");
    assert!(description.contains("restarted"), "{run}");
    assert!(description.contains("batch_size 32 → 64"), "{run}");
    assert!(run["signal_name"].is_null(), "{run}");
    home.ok(&["stop", "--kill", &id]);
}

/// A script that waits until its supervisor recorded its start, then puts a link to
/// `/dev/zero` in place of its `events.jsonl` and a FIFO in place of its `pid` file (as any run
/// can: its directory is `$GPUPILOT_RUN_DIR`), says so in `marker`, and runs `rest`.
fn replacing_its_records(marker: &std::path::Path, rest: &str) -> String {
    format!(
        "d=\"$GPUPILOT_RUN_DIR\"; \
         until grep -q '\"started\"' \"$d/events.jsonl\" 2>/dev/null; do sleep 0.05; done; \
         ln -sfn /dev/zero \"$d/events.jsonl\" && rm -f \"$d/pid\" && mkfifo \"$d/pid\" && \
         touch {}; {rest}",
        marker.display()
    )
}

/// Start `sh -c SCRIPT` (made by [`replacing_its_records`]) and wait for it to replace its
/// records; its id.
fn run_replacing_its_records(home: &Home, name: &str, rest: &str) -> String {
    let marker = home.dir.path().join(format!("{name}.replaced"));
    let script = replacing_its_records(&marker, rest);
    let id = home
        .ok(&["run", "-d", "--name", name, "--", "sh", "-c", &script])
        .trim()
        .to_string();
    wait_for(
        "the run to replace its records",
        Duration::from_secs(10),
        || marker.exists(),
    );
    let dir = home.run_dir(&id);
    assert!(
        std::fs::symlink_metadata(dir.events_path())
            .unwrap()
            .file_type()
            .is_symlink()
    );
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::symlink_metadata(dir.pid_path())
            .unwrap()
            .file_type()
            .is_fifo()
    );
    id
}

/// A run that replaces `events.jsonl` with a link and `pid` with a FIFO still ends with its
/// exit code, can still be stopped, and is still listed (and watched) by a restarted daemon,
/// which says what is wrong with its directory.
#[test]
fn a_run_that_replaces_its_records_still_ends_stops_and_is_adopted() {
    let home = Home::new();
    let mut d = home.daemon(&[]);
    let c = home.client();

    // Ends by itself while this daemon watches.
    let ended = run_replacing_its_records(&home, "ends", "sleep 0.5; exit 7");
    wait_for("the run to end", Duration::from_secs(10), || {
        c.run(&ended).is_ok_and(|r| r.is_final())
    });
    let run = ps_entry(&home, &ended);
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["exit_code"], 7, "{run}");

    // Stopped while it lives.
    let stopped = run_replacing_its_records(&home, "stopped", "sleep 30");
    let out = home.ok(&["stop", "--grace", "2", &stopped]);
    assert!(out.contains("stopped"), "{out}");
    let run = ps_entry(&home, &stopped);
    assert_eq!(run["status"], "stopped", "{run}");
    assert_eq!(run["signal_name"], "SIGTERM", "{run}");

    // Alive through a daemon's kill; the next daemon watches it to its end.
    let adopted = run_replacing_its_records(&home, "adopted", "sleep 4; exit 5");
    drop(c);
    d.signal_and_wait(Signal::KILL);
    let _d = home.daemon(&[]);
    let c = home.client();
    let run = ps_entry(&home, &adopted);
    assert_eq!(run["status"], "running", "{run}");
    let description = run["description"].as_str().unwrap_or_default();
    assert!(
        description.contains("events.jsonl not read") && description.contains("symbolic link"),
        "{run}"
    );
    assert!(description.contains("pid not read"), "{run}");
    wait_for("the adopted run to end", Duration::from_secs(15), || {
        c.run(&adopted).is_ok_and(|r| r.is_final())
    });
    let run = ps_entry(&home, &adopted);
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["exit_code"], 5, "{run}");
    // The runs that ended before the restart are still listed as they ended.
    assert_eq!(ps_entry(&home, &ended)["exit_code"], 7);
    assert_eq!(ps_entry(&home, &stopped)["status"], "stopped");
}

/// A run that ends while no daemon runs has the duration it ran (its monitor's `exit.json`
/// says when it ended), not the time until the next daemon noticed.
#[test]
fn a_run_that_ends_while_no_daemon_runs_keeps_its_real_duration() {
    let home = Home::new();
    let mut d = home.daemon(&[]);
    let id = home
        .ok(&["run", "-d", "--", "sleep", "2"])
        .trim()
        .to_string();
    d.signal_and_wait(Signal::KILL);
    let rec = home.run_dir(&id).read_pid().unwrap().expect("a pid file");
    wait_for("the run to end", Duration::from_secs(10), || {
        !adopt::is_alive(&rec)
    });
    // Well after its end.
    std::thread::sleep(Duration::from_secs(4));
    let _d = home.daemon(&[]);
    let run = ps_entry(&home, &id);
    assert_eq!(run["status"], "succeeded", "{run}");
    let took = run["uptime_s"].as_f64().expect("a duration");
    assert!(
        (1.9..3.0).contains(&took),
        "ran 2 s, shown as {took} s: {run}"
    );
    let started = gpupilot::time::parse_rfc3339(run["started_at"].as_str().unwrap()).unwrap();
    let ended = gpupilot::time::parse_rfc3339(run["ended_at"].as_str().unwrap()).unwrap();
    let shown = ended.duration_since(started).unwrap().as_secs_f64();
    assert!(
        (1.9..3.0).contains(&shown),
        "ended {shown} s after its start: {run}"
    );
}

/// GPU 0's energy counter (J), power (W) and the time of its sample, as the daemon last read it.
fn gpu0_counter(c: &gpupilot::client::Client) -> (f64, f64, f64) {
    let snap = c.status().unwrap().snapshot.expect("telemetry");
    let g = &snap.gpus[0];
    (g.energy_j.unwrap(), g.power_w.unwrap(), g.time_s)
}

/// The run's energy (J) as `ps` shows it, once it has one.
fn run_energy(c: &gpupilot::client::Client, id: &str) -> f64 {
    let mut j = 0.0;
    wait_for("the run's energy", Duration::from_secs(10), || {
        j = c
            .run(id)
            .ok()
            .and_then(|r| r.energy)
            .map_or(0.0, |e| e.energy_j);
        j > 0.0
    });
    j
}

/// On the simulator, as on NVML, the energy counter goes on across a daemon's restart (a kill
/// here): it moves by what the GPU drew meanwhile, and the run on the GPU is charged that too,
/// not only what the second daemon measured itself.
#[test]
fn a_sim_daemon_restart_loses_no_energy() {
    let home = Home::new();
    let mut d = home.daemon(&[]);
    let profile = home.dir.path().join("on-gpu0.toml");
    std::fs::write(
        &profile,
        "name = \"on-gpu0\"\n[run]\ncommand = [\"sleep\", \"60\"]\n\
         env = { CUDA_VISIBLE_DEVICES = \"0\" }\n",
    )
    .unwrap();
    let id = home
        .ok(&["run", "-d", &profile.display().to_string()])
        .trim()
        .to_string();
    let _sleep = KillOnDrop(home.run_dir(&id).read_pid().unwrap().unwrap().pid, "60");
    let c = home.client();
    run_energy(&c, &id);
    std::thread::sleep(Duration::from_secs(3));
    let run0 = run_energy(&c, &id);
    let (e0, p0, t0) = gpu0_counter(&c);
    drop(c);
    d.signal_and_wait(Signal::KILL);
    // Down for a while: the GPU draws all the same.
    std::thread::sleep(Duration::from_secs(3));
    let _d = home.daemon(&[]);
    let c = home.client();
    std::thread::sleep(Duration::from_secs(4));
    let (e1, p1, t1) = gpu0_counter(&c);
    let run1 = run_energy(&c, &id);
    let drawn = (p0 + p1) / 2.0 * (t1 - t0);
    assert!(t1 - t0 > 6.0, "{t0} → {t1}");
    let moved = e1 - e0;
    assert!(
        (0.8 * drawn..1.2 * drawn).contains(&moved),
        "the counter moved {moved:.0} J over {:.1} s at about {:.0} W ({drawn:.0} J)",
        t1 - t0,
        (p0 + p1) / 2.0
    );
    // The run's figure lags its samples by at most a second or so at either end.
    let charged = run1 - run0;
    assert!(
        (0.75 * drawn..1.25 * drawn).contains(&charged),
        "the run was charged {charged:.0} J over {:.1} s at about {:.0} W ({drawn:.0} J)",
        t1 - t0,
        (p0 + p1) / 2.0
    );
}
