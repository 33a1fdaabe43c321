//! Names the build in `gpupilot --version`, so that a bug report says what ran:
//! `gpupilot 0.1.0 (abc1234 2026-12-01, release)`.
//!
//! Sets `GPUPILOT_BUILD` to the commit (short hash and commit date, from git) and the Cargo
//! profile the binary was built with. Without git or outside this repository's own checkout (a
//! source tarball, the crate unpacked into another repository) the commit is left out, or taken
//! from `GPUPILOT_BUILD_COMMIT` when a packager sets it (`abc1234 2026-12-01`). It reruns only
//! when HEAD moves (`.git/HEAD` and the ref it points to), never on every build, and the value
//! is a compile-time constant: `--version` does no work at run time.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=GPUPILOT_BUILD_COMMIT");
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = match std::env::var("GPUPILOT_BUILD_COMMIT") {
        Ok(c) if !c.trim().is_empty() => Some(c.trim().to_string()),
        _ => git_commit(&manifest_dir),
    };
    let profile = profile();
    let build = match commit {
        Some(commit) => format!("{commit}, {profile}"),
        None => profile,
    };
    println!("cargo:rustc-env=GPUPILOT_BUILD={build}");
}

/// `abc1234 2026-12-01` for HEAD of the checkout at `dir`, or None when `dir` is not the top
/// of a git work tree (or git is missing). Registers the files whose change moves HEAD.
fn git_commit(dir: &Path) -> Option<String> {
    let top = git(dir, &["rev-parse", "--show-toplevel"])?;
    // The crate inside someone else's repository (vendored, unpacked) is not their commit.
    if Path::new(&top).canonicalize().ok()? != dir.canonicalize().ok()? {
        return None;
    }
    // HEAD names a branch (or a commit, detached); a commit on the branch rewrites the branch's
    // ref: its loose file, or, where refs were packed, a new loose file in its directory.
    // Worktrees keep HEAD apart and the refs in the common directory: `--git-path` resolves both.
    rerun_if_changed(dir, "HEAD");
    rerun_if_changed(dir, "packed-refs");
    if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        if !rerun_if_changed(dir, &branch) {
            if let Some((parent, _)) = branch.rsplit_once('/') {
                rerun_if_changed(dir, parent);
            }
        }
    }
    git(
        dir,
        &[
            "log",
            "-1",
            "--no-show-signature",
            "--format=%h %cd",
            "--date=short",
            "--abbrev=7",
        ],
    )
}

/// Rerun when the file (or directory) `rel` of the git directory changes; false when it does
/// not exist, and is not registered: Cargo would rerun on every build for a missing path.
fn rerun_if_changed(dir: &Path, rel: &str) -> bool {
    match git(
        dir,
        &["rev-parse", "--path-format=absolute", "--git-path", rel],
    ) {
        Some(path) if Path::new(&path).exists() => {
            println!("cargo:rerun-if-changed={path}");
            true
        }
        _ => false,
    }
}

/// Trimmed stdout of `git ARGS` in `dir`, or None when git fails or says nothing.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// The Cargo profile: the directory name of OUT_DIR's profile (`release`, `debug`, or a custom
/// profile's own name, which `PROFILE` does not give), else `PROFILE`.
fn profile() -> String {
    // OUT_DIR is `<target>/[<triple>/]<profile>/build/<pkg>-<hash>/out`.
    let from_out_dir = std::env::var_os("OUT_DIR").and_then(|out| {
        Path::new(&out)
            .ancestors()
            .nth(3)
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
    });
    from_out_dir
        .or_else(|| std::env::var("PROFILE").ok())
        .unwrap_or_else(|| "unknown profile".into())
}
