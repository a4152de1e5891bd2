#!/usr/bin/env bash
# Runs CI as the landing check does: a fresh clone of the committed main, then .ci/run.
set -euo pipefail
top=$(git rev-parse --show-toplevel)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
git clone -q "$top" "$dir/natsjs"
cd "$dir/natsjs"
CI=true bash .ci/run
