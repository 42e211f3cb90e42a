# Shared by scripts/demo and scripts/test: install what the build needs, configure, build.
# Idempotent: packages are installed only when missing, cmake/ninja rebuild only what changed.
set -euo pipefail

TALARIA_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$TALARIA_ROOT"

# Debian packages the build, tests and tools use.
TALARIA_PACKAGES=(
  cmake ninja-build g++ ccache pkg-config
  libfmt-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang-14 libclang-rt-14-dev
  libfabric-dev libfabric-bin libucx-dev ucx-utils
  libssl-dev libboost-dev
  iproute2
  libpmix-dev openmpi-bin
)

talaria_install_deps() {
  local missing=()
  for p in "${TALARIA_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -q
    $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}

# talaria_build PRESET [targets...]
talaria_build() {
  local preset=$1
  shift
  if [ ! -f "build/$preset/build.ninja" ]; then
    cmake --preset "$preset" >/dev/null
  fi
  if [ $# -gt 0 ]; then
    cmake --build --preset "$preset" --target "$@"
  else
    cmake --build --preset "$preset"
  fi
}
