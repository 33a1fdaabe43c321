#!/usr/bin/env bash
# Build the Debian package: target/debian/gpupilot_VERSION-1_ARCH.deb (its path is printed).
#
#   packaging/deb.sh           a release: `cargo build --release` (fat LTO, one codegen unit: a
#                              few minutes on a small machine), then the package
#   packaging/deb.sh --check   CI's check (.ci/run): packages the debug binary that `cargo test`
#                              has just built, without a second build, compressed quickly
#
# The man pages and completion scripts come from the binary being packaged (`gpupilot man`,
# `gpupilot completions`), so they match it; they go to target/packaging/, which Cargo.toml's
# [package.metadata.deb] lists with the other assets. Needs cargo-deb 3 (`cargo install
# --locked cargo-deb`).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=release
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  *) echo "usage: packaging/deb.sh [--check]" >&2; exit 2 ;;
esac
target=${CARGO_TARGET_DIR:-target}

if [[ $mode == release ]]; then
  cargo build --release --locked --bin gpupilot
  bin=$target/release/gpupilot
  deb=(--no-build)
else
  bin=$target/debug/gpupilot
  [[ -x $bin ]] || cargo build --locked --bin gpupilot
  # cargo-deb warns that the dev profile is not for releases: this package is a check of the
  # packaging, never shipped. Its --version says `debug`.
  deb=(--no-build --profile dev --strip --fast)
fi

assets=target/packaging
rm -rf "$assets"
mkdir -p "$assets/man" "$assets/completions"
"$bin" man "$assets/man" >/dev/null
"$bin" completions bash >"$assets/completions/gpupilot.bash"
"$bin" completions zsh >"$assets/completions/_gpupilot"
"$bin" completions fish >"$assets/completions/gpupilot.fish"

cargo deb --quiet "${deb[@]}"
