#!/usr/bin/env bash
# The one test command: installs what the tests need when it is missing, then
# runs the whole suite (format, lints, unit tests, end-to-end tests with real
# Blender).
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib.sh
ensure_blender
ensure_vulkan
ensure_chromium
ensure_ffmpeg
ensure_prometheus
ensure_test_tools
ensure_iptables
ensure_rust
ensure_s3_server
if ensure_postgres; then
  # The servers are installed: tests that need one (S3, PostgreSQL) fail,
  # not skip, when it cannot start.
  export TESSERA_REQUIRE_SERVERS=1
else
  echo "note: the PostgreSQL store and failover tests are skipped (PostgreSQL could not be installed; see above)" >&2
fi

# The end-to-end tests use the worker's test-only flags (--fail-first-render,
# --test-corrupt-pixel, --fake-gpu, --fake-telemetry), which exist only with
# this feature. Every cargo command below that builds the binary builds it
# with the feature, so that none of them leaves a target/debug/tessera
# without them (the e2e harness builds it so too, and checks).
hooks=(--features tessera-cli/test-hooks)

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets "${hooks[@]}" -q -- -D warnings
# ...and as released, without the test hooks.
cargo clippy -p tessera-worker -p tessera-cli --all-targets -q -- -D warnings
echo "== one-way modules (scripts/check-modules.py, layers in ARCHITECTURE.md)"
python3 scripts/check-modules.py
echo "== alert rules (promtool)"
promtool check rules scripts/monitoring/alerts.yml
promtool test rules scripts/monitoring/alerts.test.yml
echo "== build"
cargo build --workspace --all-targets "${hooks[@]}" -q
ensure_bpy_runtime target/debug/tessera
log="$(mktemp)"; trap 'rm -f "$log"' EXIT
echo "== unit tests"
cargo test --workspace --exclude tessera-tests "${hooks[@]}" 2>&1 | tee -a "$log"
echo "== end-to-end tests (real coordinator, workers and Blender)"
# One at a time: each test runs several Blender processes on a small machine.
# (It builds no tessera binary; its harness builds one with the hooks.)
cargo test -p tessera-tests -- --test-threads=1 2>&1 | tee -a "$log"
# One closing line for the whole suite.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tessera: %d passed, %d failed\n", p, f; exit (f > 0) }' "$log"
