//! Helpers for tests (here and in the console) that load the built library as NVML.
//!
//! The cdylib is a build product, not something an rlib can point at, so these look for it
//! where cargo puts it: `FAKE_NVML_LIB` if set, else next to the running test executable
//! (`target/<profile>/deps/..`), else under `CARGO_TARGET_DIR`. Build it first with
//! `cargo build -p fake-nvml` (integration tests of this crate get it built automatically).

use std::io;
use std::path::{Path, PathBuf};

/// File name cargo gives the cdylib on Linux.
pub const CDYLIB_NAME: &str = "libnvidia_ml.so";
/// The name NVML clients load.
pub const SONAME: &str = "libnvidia-ml.so.1";

/// Locates the built cdylib, if there is one: the most recently built of the candidates.
///
/// `cargo build` leaves it in `target/<profile>/`; `cargo test` and `cargo build --example`
/// only in `target/<profile>/deps/` (and then the uplifted copy may be stale), hence both.
pub fn find_cdylib() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FAKE_NVML_LIB") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let mut dirs = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        // target/<profile>/{deps,examples}/<binary> → target/<profile>/
        dirs.extend(exe.ancestors().skip(1).take(2).map(Path::to_path_buf));
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        dirs.push(PathBuf::from(&t).join("debug"));
        dirs.push(PathBuf::from(&t).join("release"));
    }
    dirs.iter()
        .flat_map(|d| [d.join(CDYLIB_NAME), d.join("deps").join(CDYLIB_NAME)])
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max_by_key(|(modified, _)| *modified)
        .map(|(_, p)| p)
}

/// Creates `dir/libnvidia-ml.so.1` as a symlink to `lib` (replacing an old one) and returns
/// `dir`, ready to be put on `LD_LIBRARY_PATH`.
pub fn install_soname_link(lib: &Path, dir: &Path) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let link = dir.join(SONAME);
    match std::fs::remove_file(&link) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let target = std::fs::canonicalize(lib)?;
    std::os::unix::fs::symlink(target, &link)?;
    Ok(dir.to_path_buf())
}
