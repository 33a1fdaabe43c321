//! `gpupilot man [DIR]`: manual pages made by clap_mangen from [`Cli`]'s definitions, so that
//! they say what `--help` says. Without DIR, `gpupilot.1` to stdout; with DIR, `gpupilot.1` and
//! one page per subcommand, nested ones included (`gpupilot-power-cap.1`), hidden ones left out.
//! The Debian package ships the pages made this way at packaging time.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::CommandFactory as _;

use crate::cli::Cli;

/// `gpupilot man [DIR]`.
pub fn man(dir: Option<&Path>) -> anyhow::Result<ExitCode> {
    match dir {
        None => {
            let mut page = Vec::new();
            page_of(top())
                .render(&mut page)
                .context("rendering the manual page")?;
            super::out(&String::from_utf8_lossy(&page))?;
        }
        Some(dir) => {
            let mut listing = String::new();
            for path in write_pages(dir)? {
                listing.push_str(&path.display().to_string());
                listing.push('\n');
            }
            super::out(&listing)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The top command, built: subcommands know their full names (`gpupilot-power-cap`) and carry
/// the global options. No `help` subcommand: it is not a page of its own.
fn top() -> clap::Command {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// A page for `cmd` (section 1), dated with the commit's date where the build knows it.
fn page_of(cmd: clap::Command) -> clap_mangen::Man {
    let man = clap_mangen::Man::new(cmd).manual("gpupilot manual");
    match date_in(crate::cli::VERSION) {
        Some(date) => man.date(date),
        None => man,
    }
}

/// `2026-12-01` from a version that names its commit (`0.1.0 (abc1234 2026-12-01, release)`).
fn date_in(version: &str) -> Option<&str> {
    let build = version.split_once('(')?.1;
    build.split([' ', ',', ')']).find(|w| {
        let b = w.as_bytes();
        b.len() == 10
            && b.iter().enumerate().all(|(i, c)| {
                if i == 4 || i == 7 {
                    *c == b'-'
                } else {
                    c.is_ascii_digit()
                }
            })
    })
}

/// Write every page into `dir` (made if missing); the paths written, the top page first.
pub fn write_pages(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    let mut cmds = vec![top()];
    let mut written = Vec::new();
    while let Some(cmd) = cmds.pop() {
        cmds.extend(
            cmd.get_subcommands()
                .filter(|s| !s.is_hide_set())
                .cloned()
                .collect::<Vec<_>>()
                .into_iter()
                .rev(),
        );
        let page = page_of(cmd);
        let path = dir.join(page.get_filename());
        let mut text = Vec::new();
        page.render(&mut text)
            .with_context(|| format!("rendering {}", path.display()))?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_date_comes_from_the_version() {
        assert_eq!(
            date_in("0.1.0 (abc1234 2026-12-01, release)"),
            Some("2026-12-01")
        );
        assert_eq!(date_in("0.1.0 (release)"), None);
        assert_eq!(date_in("0.1.0 (abc1234 2026-1201x, debug)"), None);
    }
}
