#!/bin/sh
# Build speakd_<version>_<arch>.deb on any host, without a compiler or emulation (`make deb`).
#
#   systemd/debian/build.sh --arch amd64|arm64 [--python 3.11] [--version V] [--out DIR]
#                           [--wheels DIR] [--compress xz|gzip|zstd|none]
#
# The daemon and its device dependencies go into /opt/speakd/venv, a venv laid out by hand from
# wheels for the target (tests/arm64/wheels.py resolves them with --only-binary=:all: and the
# target's manylinux tags, building pure-Python sdists as wheels); its python3 is a relative link
# to the release's /usr/bin/pythonX.Y, so the units' ExecStart=/opt/speakd/venv/bin/speakd is the
# same as systemd/install.sh's. The host tools (speakd_tools, torch) stay out. Units, sysusers.d
# and tmpfiles.d entries come from systemd/, the example config becomes the conffile
# /etc/speakd/speakd.toml, and the maintainer scripts beside this file handle the rest.
#
# --python is the target release's CPython (wheels are ABI-specific): 3.11 for Debian 12 bookworm,
# Raspberry Pi OS bookworm and Armbian bookworm (the default); 3.12 for Ubuntu 24.04; 3.13 for
# Debian 13 trixie. --version defaults to pyproject.toml's version with the revision -1.
# Downloaded wheels stay in --wheels (default ~/.cache/speakd-deb/wheels), so a rebuild only
# re-resolves. PYTHON (default python3) is the host Python whose pip does the work; it also makes
# the key-echo pack (step 2b), so it needs speakd's device dependencies: `make deb` installs them
# into .venv first (make deb-env), so the README's command works on a fresh clone.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$(dirname "$here")")
arch= pyver=3.11 version= out=$repo/dist compress=xz
wheels=${XDG_CACHE_HOME:-$HOME/.cache}/speakd-deb/wheels
usage() {  # the header above: to stdout for --help, to stderr for a usage error
    if [ "$1" = 0 ]; then sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
    else sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" >&2; fi
    exit "$1"
}
while [ $# -gt 0 ]; do
    case $1 in -h | --help) usage 0 ;; esac
    [ $# -ge 2 ] || usage 2
    case $1 in
        --arch) arch=$2 ;;
        --python) pyver=$2 ;;
        --version) version=$2 ;;
        --out) out=$2 ;;
        --wheels) wheels=$2 ;;
        --compress) compress=$2 ;;
        *) usage 2 ;;
    esac
    shift 2
done
case $arch in
    amd64) wheel_arch=x86_64 ;;
    arm64) wheel_arch=aarch64 ;;
    *) echo "build.sh: --arch must be amd64 or arm64, not '$arch'" >&2; exit 2 ;;
esac
case $pyver in 3.[0-9]*) ;; *) echo "build.sh: --python wants X.Y, not '$pyver'" >&2; exit 2 ;; esac
PYTHON=${PYTHON:-python3}
if [ -z "$version" ]; then
    version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml")-1
fi
say() { echo "build.sh ($arch): $*" >&2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
umask 022
stage=$work/root
venv=$stage/opt/speakd/venv
site=$venv/lib/python$pyver/site-packages
mkdir -p "$venv/bin" "$site" "$out" "$wheels"

# 1. The dependencies: resolved and downloaded for the target, installed into site-packages.
say "resolving speakd's dependencies for CPython $pyver $wheel_arch"
"$PYTHON" "$repo/tests/arm64/wheels.py" resolve --arch "$wheel_arch" --python "$pyver" \
    --wheels "$wheels" --pins "$work/pins.txt"
"$PYTHON" "$repo/tests/arm64/wheels.py" install --arch "$wheel_arch" --python "$pyver" \
    --wheels "$wheels" --pins "$work/pins.txt" --target "$site"

# 2. speakd itself (pure Python), without the host tools; no console scripts from pip (their
#    shebang is the host's Python): step 3 writes the one the package ships.
rm -rf "$site/bin"
"$PYTHON" -m pip --disable-pip-version-check wheel -q --no-deps -w "$work/wheel" "$repo"
"$PYTHON" -m pip --disable-pip-version-check install -q --no-deps --no-compile \
    --target "$site" "$work"/wheel/speakd-*.whl
rm -rf "$site/speakd_tools" "$site/bin"
find "$venv" -depth -name __pycache__ -type d -exec rm -rf {} +  # postinst compiles on the board

# 2b. The key-echo pack every user's daemon reads from its first start (cache.shipped_pack): made
#     here, by this speakd's code (the wheel) on the host's CPU, with the packaged config, once for
#     every architecture (its audio does not depend on the board's). It is kept beside the wheels
#     under a digest of what goes into it, so the next build (the other architecture, a rebuild)
#     takes it as it is.
packs=$(dirname "$wheels")/key-echo
mkdir -p "$packs" "$work/host"
"$PYTHON" -m pip --disable-pip-version-check install -q --no-deps --no-compile \
    --target "$work/host" "$work"/wheel/speakd-*.whl
pack=$packs/$(PYTHONPATH=$work/host "$PYTHON" -m speakd.lifecycle.keyecho "$repo/systemd/speakd.toml")
if [ ! -f "$pack" ]; then
    say "making the key-echo pack $pack"
    PYTHONPATH=$work/host "$PYTHON" -m speakd cache --config "$repo/systemd/speakd.toml" \
        key-echo "$work/key-echo.db" >&2 2>"$work/key-echo.log" || { cat "$work/key-echo.log" >&2; exit 1; }
    grep "prewarm done" "$work/key-echo.log" >&2
    cp "$work/key-echo.db" "$pack.$$" && mv "$pack.$$" "$pack"  # whole, for a build beside us
fi
install -D -m 0644 "$pack" "$stage/usr/share/speakd/key-echo.db"
touch "$pack"  # kept while builds use it; packs no build took for a day are dropped
find "$packs" -name 'key-echo-*.db' -mmin +1440 -delete

# 3. The venv: pyvenv.cfg, the interpreter links, the one console script.
printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = %s\n' "$pyver" \
    >"$venv/pyvenv.cfg"
ln -s "../../../../usr/bin/python$pyver" "$venv/bin/python$pyver"  # relative: works under -L
ln -s "python$pyver" "$venv/bin/python3"
ln -s python3 "$venv/bin/python"
cat >"$venv/bin/speakd" <<'EOF'
#!/opt/speakd/venv/bin/python3
import sys

from speakd.cli import main

sys.exit(main())
EOF
mkdir -p "$stage/usr/bin"
ln -s /opt/speakd/venv/bin/speakd "$stage/usr/bin/speakd"

# 4. systemd's files and the config.
install -D -m 0644 -t "$stage/usr/lib/systemd/system" \
    "$repo/systemd/speakd.service" "$repo/systemd/speakd.socket" "$repo/systemd/speakd-ssip.socket"
# The desktop's user units, where user managers look; not enabled (docs/screen-readers.md).
install -D -m 0644 -t "$stage/usr/lib/systemd/user" "$repo"/systemd/user/*
install -D -m 0644 "$repo/systemd/speakd.sysusers" "$stage/usr/lib/sysusers.d/speakd.conf"
install -D -m 0644 "$repo/systemd/speakd.tmpfiles" "$stage/usr/lib/tmpfiles.d/speakd.conf"
install -D -m 0644 "$repo/systemd/speakd.toml" "$stage/etc/speakd/speakd.toml"

# 5. Debian's own files: copyright, changelog, lintian overrides, control, maintainer scripts.
doc=$stage/usr/share/doc/speakd
install -D -m 0644 "$here/copyright" "$doc/copyright"
sed "s/@VERSION@/$version/" "$here/changelog" | gzip -9n >"$doc/changelog.Debian.gz"
install -D -m 0644 "$here/lintian-overrides" "$stage/usr/share/lintian/overrides/speakd"
# Nothing in site-packages is run directly (wheels ship some .so and .py files 0755).
find "$stage" -type d -exec chmod 0755 {} +
find "$stage" -type f -exec chmod 0644 {} +
chmod 0755 "$venv/bin/speakd"
mkdir -p "$stage/DEBIAN"
install -m 0755 "$here/postinst" "$here/prerm" "$here/postrm" "$stage/DEBIAN/"
echo /etc/speakd/speakd.toml >"$stage/DEBIAN/conffiles"
size=$(du -sk --apparent-size "$stage" | cut -f1)
# The glibc the wheels need: each wheel runs on the oldest manylinux tag it lists; the package
# needs the newest of those minimums.
glibc=$(for tags in "$site"/*.dist-info/WHEEL; do
    sed -n 's/^Tag: .*manylinux2014_.*/2.17/p; s/^Tag: .*manylinux_\([0-9]*\)_\([0-9]*\)_.*/\1.\2/p' \
        "$tags" | sort -V | head -1
done | sort -V | tail -1)
next=$(echo "$pyver" | awk -F. '{print $1 "." $2 + 1}')
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" \
    -e "s/@PYTHON@/python3 (>= $pyver~), python3 (<< $next~)/" -e "s/@GLIBC@/$glibc/" \
    "$here/control" >"$stage/DEBIAN/control"

deb=$out/speakd_${version}_$arch.deb
dpkg-deb --root-owner-group -Z"$compress" --build "$stage" "$deb" >&2
say "built $deb ($(du -k "$deb" | cut -f1) KiB, $(wc -l <"$work/pins.txt") wheels)"
echo "$deb"
