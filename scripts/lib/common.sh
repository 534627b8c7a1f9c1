# Shared settings of the scripts in scripts/. Sourced, not run.
#
# Everything a script installs or builds outside the source tree goes under MINIONS_CACHE, so a
# second run (and every later build) reuses it.

MINIONS_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MINIONS_CACHE="${MINIONS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/minions}"
MINIONS_BUILD_DIR="${MINIONS_BUILD_DIR:-$MINIONS_ROOT/build}"
# The pinned llama.cpp: the release carried by this version of the npm package node-llama-cpp
# (its llama/gitRelease.bundle is a git bundle of that release).
NODE_LLAMA_CPP_VERSION="3.21.1"
MINIONS_JOBS="${MINIONS_JOBS:-$(nproc 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || echo 2)}"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
