# shellcheck shell=bash
# Sourced by scripts/test, after scripts/deps.sh (kshard_debian_mirror): runs kshard's suite on
# today's stack, Debian 13 (trixie) with g++ 14, Open MPI 5 and Kokkos 5 (OpenMP, from Debian
# unstable's libkokkos-dev), inside a chroot kept in a cache outside the clone. Needs root (or
# sudo) for debootstrap, mount and chroot.
#
#   kshard_trixie_root        creates the root once (debootstrap minbase trixie from the mirror
#                             the host's apt sources name, then the packages), checks a cached one
#                             and rebuilds it when it is incomplete or broken
#   kshard_trixie_stage SRC   mounts /proc, /sys, /dev, /dev/shm and SRC (at /src) in the root,
#                             configures, builds (-j2) and tests kshard there (build directory
#                             /build/trixie inside the root, kept between runs), OpenMP Kokkos at
#                             2 threads per rank, and unmounts everything again, also on failure
#   kshard_trixie_run SRC CMD runs CMD in the root, mounted and with the environment the suite
#                             runs in (e.g. one test under mpiexec, for looking into a failure)
#
# Every step is timed; each function prints its times when it ends. Set KSHARD_TRIXIE_MIRROR to
# use another mirror, KSHARD_TRIXIE_JOBS for another -j, KSHARD_TRIXIE_CTEST_ARGS for ctest.
# Launch flags (oversubscription, running as root) live in the environment, never in the build.

: "${KSHARD_CACHE:=$HOME/.cache/kshard}"
KSHARD_TRIXIE_ROOT="$KSHARD_CACHE/trixie-root"
# Debian packages of the root (trixie); libkokkos-dev comes from unstable, pinned low.
KSHARD_TRIXIE_PACKAGES=(
  g++ cmake ninja-build make pkg-config python3 openmpi-bin libopenmpi-dev libfmt-dev
  libgtest-dev googletest nlohmann-json3-dev libcli11-dev zlib1g-dev
)
# Installed when trixie has them: the reference the io_reference test compares with.
KSHARD_TRIXIE_OPTIONAL_PACKAGES=(python3-numpy python3-safetensors)
KSHARD_TRIXIE_KOKKOS_PACKAGE=libkokkos-dev
# Bump to make cached roots rebuild their packages.
KSHARD_TRIXIE_RECIPE=1
KSHARD_TRIXIE_TIMES=()

_ktx_log() { printf '[kshard trixie] %s\n' "$*"; }
_ktx_fail() { printf '[kshard trixie] FAILED: %s\n' "$*" >&2; }
_ktx_priv() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# _ktx_timed LABEL COMMAND...: runs COMMAND, records and prints how long it took.
_ktx_timed() {
  local label=$1 start rc=0
  shift
  start=$SECONDS
  "$@" || rc=$?
  KSHARD_TRIXIE_TIMES+=("$label: $((SECONDS - start)) s$([ $rc -eq 0 ] || echo " (failed, status $rc)")")
  _ktx_log "$label took $((SECONDS - start)) s"
  return $rc
}

kshard_trixie_times() {
  local t
  [ ${#KSHARD_TRIXIE_TIMES[@]} -eq 0 ] && return 0
  _ktx_log "times:"
  for t in "${KSHARD_TRIXIE_TIMES[@]}"; do printf '[kshard trixie]   %s\n' "$t"; done
}

# Mount bookkeeping: every mount point goes on _KTX_MOUNTS; _ktx_unmount_all undoes them in
# reverse order. _ktx_mounts_under ROOT lists whatever is still mounted below ROOT.
_KTX_MOUNTS=()
_ktx_mount() {
  local target=${*: -1}
  _ktx_priv mkdir -p "$target" && _ktx_priv mount "$@" && _KTX_MOUNTS+=("$target")
}
_ktx_mounts_under() {
  local root
  root=$(realpath -m "$1")
  awk -v root="$root" '$5 == root || index($5, root "/") == 1 { print $5 }' /proc/self/mountinfo
}
_ktx_unmount_all() {
  local i mp rc=0
  for ((i = ${#_KTX_MOUNTS[@]} - 1; i >= 0; i--)); do
    mp=${_KTX_MOUNTS[i]}
    _ktx_priv umount "$mp" 2>/dev/null || _ktx_priv umount -l "$mp" ||
      { _ktx_fail "could not unmount $mp"; rc=1; }
  done
  _KTX_MOUNTS=()
  return $rc
}
# _ktx_mount_system ROOT: /proc, /sys (read-only), /dev and a fresh /dev/shm (Open MPI's
# shared-memory transport) inside ROOT, and the host's resolver.
_ktx_mount_system() {
  local root=$1
  _ktx_mount -t proc proc "$root/proc" &&
    _ktx_mount --bind /sys "$root/sys" &&
    _ktx_priv mount -o remount,bind,ro "$root/sys" &&
    _ktx_mount --bind /dev "$root/dev" &&
    _ktx_mount -t tmpfs -o mode=1777,size=2g tmpfs "$root/dev/shm" &&
    _ktx_priv cp -L /etc/resolv.conf "$root/etc/resolv.conf"
}
# _ktx_chroot ROOT COMMAND...: COMMAND inside ROOT with a clean environment plus KSHARD_TRIXIE_ENV.
_ktx_chroot() {
  local root=$1
  shift
  _ktx_priv chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    DEBIAN_FRONTEND=noninteractive "${KSHARD_TRIXIE_ENV[@]}" "$@"
}
KSHARD_TRIXIE_ENV=()

# Removes ROOT, refusing while anything is still mounted below it.
_ktx_remove_root() {
  local root=$1 left
  left=$(_ktx_mounts_under "$root")
  if [ -n "$left" ]; then
    _ktx_fail "will not remove $root: still mounted below it: $(echo "$left" | tr '\n' ' ')"
    return 1
  fi
  _ktx_priv rm -rf "$root"
}

# Quick checks of a finished root; prints what is wrong and returns non-zero.
_ktx_check_root() {
  local root=$1
  [ -d "$root" ] || { echo "it does not exist"; return 1; }
  [ -f "$root/.kshard-trixie-stamp" ] || { echo "no stamp (an earlier build did not finish)"; return 1; }
  [ "$(head -n 1 "$root/.kshard-trixie-stamp")" = "recipe $KSHARD_TRIXIE_RECIPE" ] ||
    { echo "stamp from another recipe"; return 1; }
  _ktx_chroot "$root" g++ --version >/dev/null 2>&1 || { echo "g++ does not run in it"; return 1; }
  _ktx_chroot "$root" cmake --version >/dev/null 2>&1 || { echo "cmake does not run in it"; return 1; }
  _ktx_chroot "$root" mpiexec --version >/dev/null 2>&1 || { echo "mpiexec does not run in it"; return 1; }
  _ktx_kokkos_config "$root" >/dev/null || { echo "no KokkosConfig.cmake in it"; return 1; }
}

# The KokkosConfig.cmake of the root (path inside the root).
_ktx_kokkos_config() {
  local f
  for f in "$1"/usr/lib/*/cmake/Kokkos/KokkosConfig.cmake "$1"/usr/lib/cmake/Kokkos/KokkosConfig.cmake \
           "$1"/usr/share/cmake/Kokkos/KokkosConfig.cmake; do
    [ -f "$f" ] && { echo "${f#"$1"}"; return 0; }
  done
  return 1
}

_ktx_debootstrap() {
  local root=$1 mirror=$2 try
  mkdir -p "$KSHARD_CACHE/trixie-debs"
  for try in 1 2 3; do
    # --cache-dir keeps what was downloaded, so a retry only fetches what is missing.
    if _ktx_priv debootstrap --variant=minbase --cache-dir="$KSHARD_CACHE/trixie-debs" \
         trixie "$root" "$mirror" >"$KSHARD_CACHE/trixie-debootstrap.log" 2>&1; then
      return 0
    fi
    _ktx_log "debootstrap failed (try $try of 3): $(grep -E '^(E|W):' "$KSHARD_CACHE/trixie-debootstrap.log" | tail -n 1)"
    # debootstrap mounts /proc and /sys in the target while it works; never rm -rf through them.
    _ktx_mounts_under "$root" | sort -r | while read -r mp; do _ktx_priv umount -l "$mp"; done
    _ktx_remove_root "$root" || return 1
    [ $try -lt 3 ] && sleep 10
  done
  return 1
}

_ktx_install_packages() (
  local root=$1 mirror=$2 optional=() p
  trap '_ktx_unmount_all' EXIT
  _ktx_mount_system "$root" || exit 1
  # Unstable, for Kokkos 5 only: pinned below trixie so nothing else is taken from it unasked.
  # Its Release file may be past its Valid-Until on the mirror.
  _ktx_priv tee "$root/etc/apt/sources.list.d/kshard-unstable.sources" >/dev/null <<EOF
Types: deb
URIs: $mirror
Suites: unstable
Components: main
Check-Valid-Until: no
EOF
  _ktx_priv tee "$root/etc/apt/preferences.d/kshard-unstable" >/dev/null <<'EOF'
Package: *
Pin: release a=unstable
Pin-Priority: 100
EOF
  _ktx_priv tee "$root/etc/apt/apt.conf.d/80kshard" >/dev/null <<'EOF'
Acquire::Retries "3";
APT::Install-Recommends "false";
APT::Get::Assume-Yes "true";
EOF
  local log="$KSHARD_CACHE/trixie-packages.log"
  : >"$log"
  _ktx_chroot "$root" apt-get update >>"$log" 2>&1 ||
    { tail -n 5 "$log" >&2; _ktx_fail "packages: apt-get update in the root (log: $log)"; exit 1; }
  for p in "${KSHARD_TRIXIE_OPTIONAL_PACKAGES[@]}"; do
    _ktx_chroot "$root" apt-cache show "$p/trixie" >/dev/null 2>&1 && optional+=("$p")
  done
  _ktx_chroot "$root" apt-get install "${KSHARD_TRIXIE_PACKAGES[@]}" "${optional[@]}" >>"$log" 2>&1 ||
    { tail -n 15 "$log" >&2; _ktx_fail "packages: installing trixie's packages (log: $log)"; exit 1; }
  # The package from unstable, with whatever of its dependencies only unstable has.
  _ktx_chroot "$root" apt-get install "$KSHARD_TRIXIE_KOKKOS_PACKAGE/unstable" >>"$log" 2>&1 ||
    { tail -n 15 "$log" >&2
      _ktx_fail "packages: installing $KSHARD_TRIXIE_KOKKOS_PACKAGE from unstable (log: $log)"; exit 1; }
  _ktx_chroot "$root" apt-get clean >>"$log" 2>&1 || true
)

kshard_trixie_root() {
  local root=$KSHARD_TRIXIE_ROOT mirror why
  KSHARD_TRIXIE_TIMES=()
  if [ -d "$root" ]; then
    if why=$(_ktx_check_root "$root"); then
      _ktx_log "using the cached root $root ($(sed -n 2p "$root/.kshard-trixie-stamp"))"
      return 0
    fi
    if [ -f "$root/.kshard-trixie-base" ] && [ ! -f "$root/.kshard-trixie-stamp" ] &&
       _ktx_chroot "$root" apt-get --version >/dev/null 2>&1; then
      _ktx_log "the cached root $root has its base system but not all packages: installing them"
      mirror=$(cat "$root/.kshard-trixie-base")
    else
      _ktx_log "the cached root $root is unusable ($why): rebuilding it"
      _ktx_remove_root "$root" ||
        { _ktx_fail "root: cannot remove the broken root; unmount what is listed, then rm -rf $root"; return 1; }
    fi
  fi
  if ! command -v debootstrap >/dev/null 2>&1 && [ ! -x /usr/sbin/debootstrap ]; then
    _ktx_log "installing debootstrap on the host"
    { _ktx_priv apt-get update -qq &&
        _ktx_priv env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
          debootstrap >/dev/null 2>&1; } ||
      { _ktx_fail "debootstrap: it is not installed and apt-get could not install it"; return 1; }
  fi
  if [ ! -d "$root" ]; then
    mirror=${KSHARD_TRIXIE_MIRROR:-$(kshard_debian_mirror)} ||
      { _ktx_fail "mirror: no Debian mirror in /etc/apt/sources.list{,.d}; set KSHARD_TRIXIE_MIRROR"; return 1; }
    _ktx_log "creating the Debian 13 root $root from $mirror (debootstrap and packages: minutes)"
    mkdir -p "$KSHARD_CACHE"
    _ktx_timed "debootstrap" _ktx_debootstrap "$root" "$mirror" ||
      { _ktx_fail "debootstrap: trixie from $mirror failed 3 times (unreachable mirror or suite?); log: $KSHARD_CACHE/trixie-debootstrap.log; rerun to retry"
        kshard_trixie_times; return 1; }
    echo "$mirror" | _ktx_priv tee "$root/.kshard-trixie-base" >/dev/null
  fi
  _ktx_timed "packages" _ktx_install_packages "$root" "$mirror" ||
    { _ktx_fail "packages: the root is incomplete; rerun to retry the packages, or rm -rf $root to start over"
      kshard_trixie_times; return 1; }
  _ktx_priv tee "$root/.kshard-trixie-stamp.tmp" >/dev/null <<EOF
recipe $KSHARD_TRIXIE_RECIPE
$(_ktx_chroot "$root" dpkg-query -W "$KSHARD_TRIXIE_KOKKOS_PACKAGE" g++ openmpi-bin cmake | tr '\t\n' ' ;' | sed 's/;$//; s/;/, /g')
EOF
  _ktx_priv mv "$root/.kshard-trixie-stamp.tmp" "$root/.kshard-trixie-stamp"
  if ! why=$(_ktx_check_root "$root"); then
    _ktx_fail "root: the new root at $root is broken ($why); rm -rf $root and rerun"
    kshard_trixie_times
    return 1
  fi
  _ktx_log "root ready: $(sed -n 2p "$root/.kshard-trixie-stamp")"
  kshard_trixie_times
}

# The launch environment of Open MPI 5, whose launcher (PRRTE) ignores Open MPI 4's
# OMPI_MCA_rmaps_base_oversubscribe and OMPI_MCA_hwloc_base_binding_policy.
# shellcheck disable=SC2054 # the comma in OMPI_MCA_btl is Open MPI's
KSHARD_TRIXIE_MPI_ENV=(
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # More ranks than cores (4 ranks on 2 cores).
  PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
  # Each rank's OpenMP threads may use every core.
  PRTE_MCA_hwloc_default_binding_policy=none
  # One machine, no fabric: shared memory only (the TCP BTL warns that it finds no pairing of
  # interfaces in the chroot) through ob1 (no UCX probing).
  OMPI_MCA_btl=self,sm
  OMPI_MCA_pml=ob1
  OMPI_MCA_btl_sm_single_copy_mechanism=none
)

# _ktx_enter SRC: (in a subshell) checks the root, mounts the system and SRC (at /src) in it and
# arranges for everything to be unmounted when the subshell exits, however it exits.
_ktx_enter() {
  local src=$1 root=$KSHARD_TRIXIE_ROOT why
  if ! why=$(_ktx_check_root "$root" 2>&1); then
    _ktx_fail "stage: the root at $root is not ready ($why); run kshard_trixie_root (or rm -rf $root and rerun)"
    return 1
  fi
  trap '_ktx_unmount_all; kshard_trixie_times' EXIT
  trap 'exit 130' INT TERM
  if ! _ktx_mount_system "$root" || ! _ktx_mount --bind "$src" "$root/src"; then
    _ktx_fail "stage: mounting into $root"
    return 1
  fi
  KSHARD_TRIXIE_ENV=(OMP_NUM_THREADS=2 OMP_PROC_BIND=false "${KSHARD_TRIXIE_MPI_ENV[@]}")
}

# kshard_trixie_run SRC_DIR COMMAND...: COMMAND in the root (SRC_DIR at /src, the build in
# /build/trixie), with the environment the suite runs in; for looking into a failure.
kshard_trixie_run() (
  local src
  src=$(realpath "${1:?usage: kshard_trixie_run SRC_DIR COMMAND...}") ||
    { _ktx_fail "run: no source directory $1"; exit 1; }
  shift
  KSHARD_TRIXIE_TIMES=()
  _ktx_enter "$src" || exit 1
  _ktx_chroot "$KSHARD_TRIXIE_ROOT" "$@"
)

kshard_trixie_stage() (
  local src root=$KSHARD_TRIXIE_ROOT build=/build/trixie jobs=${KSHARD_TRIXIE_JOBS:-2}
  local kokkos_config kokkos_version gxx mpi
  src=$(realpath "${1:?usage: kshard_trixie_stage SRC_DIR}") ||
    { _ktx_fail "stage: no source directory $1"; exit 1; }
  KSHARD_TRIXIE_TIMES=()
  _ktx_enter "$src" || exit 1
  kokkos_config=$(_ktx_kokkos_config "$root")
  kokkos_version=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")/\1/p' "$root${kokkos_config%/*}/KokkosConfigVersion.cmake")
  gxx=$(_ktx_chroot "$root" g++ -dumpfullversion)
  mpi=$(_ktx_chroot "$root" mpiexec --version 2>&1 | head -n 1)
  mpi=${mpi/mpiexec (Open MPI)/Open MPI}
  _ktx_log "versions: Kokkos $kokkos_version ($(_ktx_chroot "$root" dpkg-query -W "$KSHARD_TRIXIE_KOKKOS_PACKAGE" | tr '\t' ' ')), g++ $gxx, $mpi"
  # -O1 without debug information: a third of RelWithDebInfo's compile time on 2 cores (the
  # Debian 12 stages build with -O2 -g). No precompiled headers: here every test source shows
  # that it includes what it uses, with the newest compiler and standard library.
  _ktx_timed "configure" _ktx_chroot "$root" cmake -S /src -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS=-O1 -DKSHARD_WARNINGS_AS_ERRORS=ON \
    -DKSHARD_PRECOMPILED_HEADERS=OFF \
    -DKokkos_DIR="${kokkos_config%/*}" -DKSHARD_TEST_BACKENDS=OPENMP -DKSHARD_KOKKOS_KERNELS=OFF \
    -DKSHARD_BUILD_BENCHMARKS=OFF -DKSHARD_BUILD_TOOLS=OFF -DKSHARD_BUILD_DOCS=OFF ||
    { _ktx_fail "configure: cmake in $root$build failed"; exit 1; }
  _ktx_timed "build" _ktx_chroot "$root" cmake --build "$build" -j "$jobs" ||
    { _ktx_fail "build: failed in $root$build"; exit 1; }
  # shellcheck disable=SC2086 # KSHARD_TRIXIE_CTEST_ARGS is a list of words
  _ktx_timed "test" _ktx_chroot "$root" ctest --test-dir "$build" --output-on-failure -j "$jobs" \
    ${KSHARD_TRIXIE_CTEST_ARGS:-} ||
    { _ktx_fail "test: ctest failed (Kokkos $kokkos_version, g++ $gxx, $mpi)"; exit 1; }
  _ktx_log "suite passed: Kokkos $kokkos_version, g++ $gxx, $mpi"
)
