#!/usr/bin/env bash
# Unpack a software Vulkan driver (Mesa >= 25 lavapipe) into .cache/vulkan/ so that the LiteRT WebGPU
# accelerator can run on a CPU-only Debian 12 machine (toolchain.md §3.1). Debian 12's own Mesa (22.3)
# is refused by the accelerator ("No adapters found"), so Mesa comes from bookworm-backports.
#
# Nothing outside the project is touched: no apt source in /etc, no system `apt-get update`, no package
# installed, the system Mesa left alone. apt reads a project-local sources list and keeps its package
# lists and cache in .cache/apt/ (the -o Dir::... options below); the .debs are only downloaded and
# unpacked (dpkg -x) into a private folder. Root is not needed.
#
# Result (used by zoo/targets/litert_gpu.py):
#   .cache/vulkan/lib/           every library lavapipe needs that a fresh Debian 12 lacks
#   .cache/vulkan/lvp_icd.json   Vulkan ICD manifest pointing at lib/libvulkan_lvp.so
#   .cache/vulkan/MANIFEST       the package versions that were unpacked
#   .cache/apt/                  the private apt sources list, package lists and download cache
#
# On any other OS or architecture the script says so and exits 1; `make setup` carries on (the Python
# toolchain does not need this), and every LiteRT bundle reports its GPU check as "not run"
# (unless ZOO_REQUIRE_GPU_CHECK=1, as in CI, which makes that a failure).
#
# Usage: scripts/setup_vulkan.sh [--force]
# Env:   ZOO_VULKAN_DIR   target folder (default: <repo>/.cache/vulkan)
#        ZOO_APT_DIR      private apt state (default: <repo>/.cache/apt)
#        ZOO_PYTHON       python with ai_edge_litert, for the final checks (default: <repo>/.venv/bin/python)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=$(realpath -m "${ZOO_VULKAN_DIR:-$REPO/.cache/vulkan}")
APT_DIR=$(realpath -m "${ZOO_APT_DIR:-$REPO/.cache/apt}")
PYTHON=${ZOO_PYTHON:-$REPO/.venv/bin/python}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg  # Debian's own archive keys, read only
STAGE=""  # the folder being built; removed on any exit before it is swapped in

# From bookworm-backports: Mesa >= 25 and the libdrm it was built against.
BACKPORT_PKGS=(mesa-vulkan-drivers libdrm2 libdrm-amdgpu1)
# From bookworm: the Vulkan loader and lavapipe's runtime dependencies that a minimal Debian 12
# (debootstrap --variant=minbase, the debian:12 image) does not have. libc, libstdc++, zlib, zstd,
# libffi, liblzma, libtinfo and libmd are in every Debian 12 and are taken from the system.
# The libllvmNN that Mesa links against is read from Mesa's own Depends (see llvm_package).
BOOKWORM_PKGS=(
    libvulkan1
    libedit2 libbsd0 libxml2 libicu72 libz3-4          # libLLVM's dependencies
    libelf1 libexpat1 libwayland-client0 libxshmfence1
    libx11-6 libx11-xcb1 libxau6 libxdmcp6
    libxcb1 libxcb-dri3-0 libxcb-present0 libxcb-randr0 libxcb-shm0 libxcb-sync1 libxcb-xfixes0
)

say() { printf '[setup_vulkan] %s\n' "$*"; }
die() { printf '[setup_vulkan] ERROR: %s\n' "$*" >&2; exit 1; }
unsupported() {
    printf '[setup_vulkan] unsupported platform: %s\n' "$*" >&2
    printf '[setup_vulkan] the software Vulkan driver is only packaged here for Debian 12 x86_64; the Python\n' >&2
    printf '[setup_vulkan] toolchain works without it, and LiteRT bundles will report the GPU check as "not run".\n' >&2
    exit 1
}

check_platform() {
    [[ $(uname -s) == Linux ]] || unsupported "needs Linux (found $(uname -s))."
    [[ $(uname -m) == x86_64 ]] || unsupported "needs x86_64 (found $(uname -m))."
    local codename
    # shellcheck disable=SC1091
    codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
    [[ $codename == bookworm ]] ||
        unsupported "needs Debian 12 (bookworm); found '${codename:-unknown}'. The package list is bookworm-specific."
    for tool in apt-get apt-cache dpkg dpkg-deb ldd; do
        command -v "$tool" >/dev/null || unsupported "'$tool' not found."
    done
    [[ -r $KEYRING ]] || unsupported "$KEYRING (package debian-archive-keyring) not found."
}

# The accelerator library ships inside the ai_edge_litert wheel; its dependencies are checked too.
accelerator_lib() {
    [[ -x $PYTHON ]] || return 0
    "$PYTHON" -c 'import importlib.util as u; s = u.find_spec("ai_edge_litert"); print(s.submodule_search_locations[0] + "/libLiteRtWebGpuAccelerator.so") if s else None' 2>/dev/null || true
}

# ldd every library the Vulkan path loads, against the private folder; print unresolved ones.
missing_libs() {
    local libdir=$1 lib
    local libs=("$libdir/libvulkan_lvp.so" "$libdir/libvulkan.so.1")
    lib=$(accelerator_lib)
    [[ -n $lib && -f $lib ]] && libs+=("$lib")
    for lib in "${libs[@]}"; do
        [[ -f $lib ]] || { echo "$lib (file missing)"; continue; }
        LD_LIBRARY_PATH=$libdir ldd "$lib" | awk -v l="$(basename "$lib")" '/not found/ {print l ": " $1 " not found"}'
    done
}

is_set_up() {
    [[ -f $DEST/MANIFEST && -f $DEST/lib/libvulkan_lvp.so ]] &&
        grep -qF "\"$DEST/lib/libvulkan_lvp.so\"" "$DEST/lvp_icd.json" 2>/dev/null &&  # not moved since
        [[ -z $(missing_libs "$DEST/lib") ]]
}

# apt, pointed at the project-local sources list, lists and cache instead of /etc/apt and /var/lib/apt.
# (The system's dpkg status is only read: apt-get download and apt-cache show install nothing.)
APT_OPTS=(
    -o "Dir::Etc::sourcelist=$APT_DIR/sources.list"
    -o "Dir::Etc::sourceparts=-"
    -o "Dir::State::Lists=$APT_DIR/lists"
    -o "Dir::Cache=$APT_DIR/cache"
    -o "Dir::Etc::preferences=$APT_DIR/preferences"  # no system pinning: versions are chosen by release
    -o "Dir::Etc::preferencesparts=$APT_DIR/preferences.d"
    -o "APT::Architecture=amd64" -o "APT::Architectures=amd64"
    -o "Acquire::Languages=none"
)
# As root, apt drops to the _apt user to download, which cannot write into a private folder.
if [[ $EUID -eq 0 ]]; then APT_OPTS+=(-o APT::Sandbox::User=root); fi

write_apt_sources() {
    mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial" "$APT_DIR/preferences.d"
    # bookworm (+ updates, security) for the Vulkan loader and lavapipe's dependencies; backports for Mesa.
    cat >"$APT_DIR/sources.list" <<EOF
deb [signed-by=$KEYRING] http://deb.debian.org/debian bookworm main
deb [signed-by=$KEYRING] http://deb.debian.org/debian bookworm-updates main
deb [signed-by=$KEYRING] http://deb.debian.org/debian-security bookworm-security main
deb [signed-by=$KEYRING] http://deb.debian.org/debian bookworm-backports main
EOF
}

apt_update() {
    say "apt-get update into $APT_DIR (project-local; the system's apt lists are not touched)"
    apt-get "${APT_OPTS[@]}" update -qq || die "apt-get update (project-local) failed: is deb.debian.org reachable?"
}

# Mesa links one specific LLVM (libllvm15 for 25.0.x); take it from Mesa's Depends so a newer
# backport that moves to another LLVM still gets the right one.
llvm_package() {
    apt-cache "${APT_OPTS[@]}" show mesa-vulkan-drivers/bookworm-backports 2>/dev/null |
        awk '/^Depends:/ {print; exit}' | grep -o 'libllvm[0-9]*' | head -n1
}

download_and_unpack() {
    local stage=$1 llvm=$2
    mkdir -p "$stage/debs" "$stage/root" "$stage/lib"
    local pkgs=()
    for p in "${BACKPORT_PKGS[@]}"; do pkgs+=("$p/bookworm-backports"); done
    pkgs+=("${BOOKWORM_PKGS[@]}" "$llvm")
    say "downloading ${#pkgs[@]} packages: ${pkgs[*]}"
    (cd "$stage/debs" && apt-get download -qq "${APT_OPTS[@]}" "${pkgs[@]}") ||
        die "apt-get download failed (is bookworm-backports reachable? does it still carry mesa-vulkan-drivers?)."
    local deb
    for deb in "$stage"/debs/*.deb; do
        dpkg -x "$deb" "$stage/root"
        # shellcheck disable=SC2016  # ${...} is dpkg's format syntax, not the shell's
        dpkg-deb -W --showformat='${Package} ${Version}\n' "$deb" >>"$stage/MANIFEST"
    done
    # One flat folder for LD_LIBRARY_PATH: Debian 12 packages put libraries in both /lib and /usr/lib.
    cp -a "$stage"/root/usr/lib/x86_64-linux-gnu/*.so* "$stage/lib/"
    if compgen -G "$stage/root/lib/x86_64-linux-gnu/*.so*" >/dev/null; then
        cp -a "$stage"/root/lib/x86_64-linux-gnu/*.so* "$stage/lib/"
    fi
    write_icd "$stage"
    rm -rf "$stage/debs" "$stage/root"
}

write_icd() {
    local stage=$1 api
    api=$(grep -o '"api_version": *"[^"]*"' "$stage/root/usr/share/vulkan/icd.d/lvp_icd.json" | cut -d'"' -f4)
    # The manifest names the library by absolute path so that no system driver is picked instead.
    printf '{\n  "file_format_version": "1.0.0",\n  "ICD": {"library_path": "%s", "api_version": "%s"}\n}\n' \
        "$DEST/lib/libvulkan_lvp.so" "${api:-1.3.0}" >"$stage/lvp_icd.json"
}

probe_adapter() {
    if [[ ! -x $PYTHON ]]; then
        say "no usable python at $PYTHON: skipped the adapter probe (set ZOO_PYTHON to run it)"
        return
    fi
    say "probing a WebGPU adapter through LiteRT (zoo/targets/litert_gpu.py --probe)"
    (cd "$REPO" && ZOO_VULKAN_DIR=$DEST "$PYTHON" -P "$REPO/zoo/targets/litert_gpu.py" --probe) ||
        die "the libraries resolve but LiteRT could not use the adapter (see above)."
}

main() {
    local force=0
    [[ ${1:-} == --force ]] && force=1
    check_platform
    if [[ $force -eq 0 ]] && is_set_up; then
        say "already set up in $DEST ($(grep '^mesa-vulkan-drivers ' "$DEST/MANIFEST")); --force to redo"
        probe_adapter
        return
    fi
    local t0=$SECONDS
    write_apt_sources
    apt_update
    local llvm; llvm=$(llvm_package)
    [[ -n $llvm ]] || die "mesa-vulkan-drivers not found in bookworm-backports (apt-cache show failed)."

    # Build next to the destination and swap it in, so a failed run never leaves a half-made folder.
    mkdir -p "$(dirname "$DEST")"
    STAGE=$(mktemp -d "$DEST.new.XXXXXX")
    trap 'rm -rf "$STAGE"' EXIT
    download_and_unpack "$STAGE" "$llvm"

    local missing; missing=$(missing_libs "$STAGE/lib")
    [[ -z $missing ]] || die "unresolved libraries with LD_LIBRARY_PATH=$STAGE/lib:"$'\n'"$missing"$'\n'"add the Debian packages that provide them to BOOKWORM_PKGS."

    rm -rf "$DEST.old"
    if [[ -e $DEST ]]; then mv "$DEST" "$DEST.old"; fi
    mv "$STAGE" "$DEST"
    chmod 755 "$DEST"
    rm -rf "$DEST.old"
    trap - EXIT
    say "unpacked into $DEST in $((SECONDS - t0)) s ($(du -sh "$DEST" | cut -f1)):"
    sed 's/^/    /' "$DEST/MANIFEST"
    if [[ -n $(accelerator_lib) ]]; then
        say "all dependencies of libvulkan_lvp.so, libvulkan.so.1 and libLiteRtWebGpuAccelerator.so resolve"
    else
        say "all dependencies of libvulkan_lvp.so and libvulkan.so.1 resolve (ai_edge_litert not found via $PYTHON: accelerator not checked)"
    fi
    say "ICD: $DEST/lvp_icd.json"
    probe_adapter
}

main "$@"
