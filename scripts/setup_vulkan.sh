#!/usr/bin/env bash
# Unpack a software Vulkan driver (Mesa >= 25 lavapipe) into .cache/vulkan/ so that the LiteRT WebGPU
# accelerator can run on a CPU-only Debian 12 machine (toolchain.md §3.1). Debian 12's own Mesa (22.3)
# is refused by the accelerator ("No adapters found"), so Mesa comes from bookworm-backports.
#
# Nothing is installed into the system and the system Mesa is left alone: the .debs are only downloaded
# and unpacked (dpkg -x) into a private folder. The one system change is an apt source for
# bookworm-backports, added only when none is configured.
#
# Result (used by zoo/targets/litert_gpu.py):
#   .cache/vulkan/lib/           every library lavapipe needs that a fresh Debian 12 lacks
#   .cache/vulkan/lvp_icd.json   Vulkan ICD manifest pointing at lib/libvulkan_lvp.so
#   .cache/vulkan/MANIFEST       the package versions that were unpacked
#
# Usage: scripts/setup_vulkan.sh [--force]     (root is needed only to add the apt source and update)
# Env:   ZOO_VULKAN_DIR   target folder (default: <repo>/.cache/vulkan)
#        ZOO_PYTHON       python with ai_edge_litert, for the final checks (default: <repo>/.venv/bin/python)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=$(realpath -m "${ZOO_VULKAN_DIR:-$REPO/.cache/vulkan}")
PYTHON=${ZOO_PYTHON:-$REPO/.venv/bin/python}
BACKPORTS_FILE=/etc/apt/sources.list.d/zoo-bookworm-backports.sources
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

check_platform() {
    [[ $(uname -m) == x86_64 ]] || die "needs x86_64 (found $(uname -m))."
    local codename
    # shellcheck disable=SC1091
    codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
    [[ $codename == bookworm ]] ||
        die "needs Debian 12 (bookworm); found '${codename:-unknown}'. The package list is bookworm-specific."
    for tool in apt-get apt-cache dpkg ldd; do
        command -v "$tool" >/dev/null || die "'$tool' not found."
    done
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

ensure_backports_source() {
    if grep -qsr --include='*.list' --include='*.sources' -E '^[^#]*bookworm-backports' \
        /etc/apt/sources.list /etc/apt/sources.list.d/; then
        say "bookworm-backports already in apt sources"
        return
    fi
    [[ $EUID -eq 0 ]] || die "bookworm-backports is not in the apt sources and adding it needs root: rerun as root."
    cat >"$BACKPORTS_FILE" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    say "added $BACKPORTS_FILE"
}

apt_update() {
    if [[ $EUID -eq 0 ]]; then
        say "apt-get update"
        apt-get update -qq || die "apt-get update failed."
    else
        say "not root: skipping apt-get update (using the existing package lists)"
    fi
}

# Mesa links one specific LLVM (libllvm15 for 25.0.x); take it from Mesa's Depends so a newer
# backport that moves to another LLVM still gets the right one.
llvm_package() {
    apt-cache show mesa-vulkan-drivers/bookworm-backports 2>/dev/null |
        awk '/^Depends:/ {print; exit}' | grep -o 'libllvm[0-9]*' | head -n1
}

download_and_unpack() {
    local stage=$1 llvm=$2
    mkdir -p "$stage/debs" "$stage/root" "$stage/lib"
    local pkgs=()
    for p in "${BACKPORT_PKGS[@]}"; do pkgs+=("$p/bookworm-backports"); done
    pkgs+=("${BOOKWORM_PKGS[@]}" "$llvm")
    say "downloading ${#pkgs[@]} packages: ${pkgs[*]}"
    # As root, apt drops to the _apt user to download, which cannot write into a private folder.
    local sandbox=()
    [[ $EUID -eq 0 ]] && sandbox=(-o APT::Sandbox::User=root)
    (cd "$stage/debs" && apt-get download -qq "${sandbox[@]}" "${pkgs[@]}") ||
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
    ensure_backports_source
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
