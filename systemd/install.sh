#!/bin/sh
# Install speakd as a system service: a venv under PREFIX (default /opt/speakd), the systemd
# units and the sysusers.d entry for the `speakd` user under /usr/local/lib (so /etc stays free
# for your drop-ins and masks) and an example /etc/speakd/speakd.toml; then create the user,
# reload systemd and enable + start the service and its sockets.
#
#   sudo systemd/install.sh [--prefix DIR] [--no-enable] [--no-venv] [--user-units] [CHECKOUT]
#
# --user-units also installs the desktop's user units (systemd/user/) into
# /usr/local/lib/systemd/user, not enabled: each user then runs
# `systemctl --user enable --now speakd.socket speakd-ssip.socket` (docs/screen-readers.md).
#
# CHECKOUT is the speakd source tree to pip-install (default: the one holding this script).
# DESTDIR=/some/root stages every file under that root and touches nothing on the live system
# (no user creation, no systemctl): for packaging and tests. Steps that need a running systemd
# are skipped with a message when systemd is not PID 1 (containers, CI); files are still
# installed. PYTHON (default python3) builds the venv; PIP_INSTALL_ARGS adds pip options.
set -eu

usage() {  # the header comment above, to stdout for --help, to stderr for a usage error
    if [ "${1:-0}" = 0 ]; then sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
    else sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" >&2; fi
    exit "${1:-0}"
}

here=$(cd "$(dirname "$0")" && pwd)
prefix=/opt/speakd
enable=yes
venv=yes
user_units=no
checkout=
while [ $# -gt 0 ]; do
    case $1 in
        --prefix) [ $# -ge 2 ] || usage 2; prefix=$2; shift 2 ;;
        --prefix=*) prefix=${1#--prefix=}; shift ;;
        --no-enable) enable=no; shift ;;
        --no-venv) venv=no; shift ;;
        --user-units) user_units=yes; shift ;;
        -h|--help) usage 0 ;;
        -*) echo "install.sh: unknown option $1" >&2; usage 2 ;;
        *) [ -z "$checkout" ] || usage 2; checkout=$1; shift ;;
    esac
done
checkout=${checkout:-$(dirname "$here")}
case $prefix in /*) ;; *) echo "install.sh: --prefix must be absolute: $prefix" >&2; exit 2 ;; esac
[ -f "$checkout/pyproject.toml" ] || { echo "install.sh: $checkout is not a speakd checkout (no pyproject.toml)" >&2; exit 2; }
DESTDIR=${DESTDIR:-}
PYTHON=${PYTHON:-python3}
say() { echo "install.sh: $*"; }

# 1. The venv with speakd and its device dependencies.
if [ "$venv" = yes ]; then
    say "creating venv $DESTDIR$prefix/venv"
    "$PYTHON" -m venv "$DESTDIR$prefix/venv"
    # shellcheck disable=SC2086  # PIP_INSTALL_ARGS is a list of options
    "$DESTDIR$prefix/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        ${PIP_INSTALL_ARGS:-} "$checkout"
fi

# 2. Units (ExecStart rewritten to PREFIX), sysusers.d, config (never overwritten).
units=$DESTDIR/usr/local/lib/systemd/system
sysusers=$DESTDIR/usr/local/lib/sysusers.d
mkdir -p "$units" "$sysusers" "$DESTDIR/etc/speakd"
install_unit() {  # $1: a unit file, $2: the directory it goes to
    sed "s#/opt/speakd/venv/#$prefix/venv/#g" "$1" > "$2/${1##*/}.tmp"
    chmod 0644 "$2/${1##*/}.tmp"
    mv "$2/${1##*/}.tmp" "$2/${1##*/}"
}
for unit in speakd.service speakd.socket speakd-ssip.socket; do
    install_unit "$here/$unit" "$units"
done
install -m 0644 "$here/speakd.sysusers" "$sysusers/speakd.conf"
if [ "$user_units" = yes ]; then
    user_dir=$DESTDIR/usr/local/lib/systemd/user
    mkdir -p "$user_dir"
    for unit in "$here"/user/*; do
        install_unit "$unit" "$user_dir"
    done
    say "installed user units in $user_dir; each user: systemctl --user enable --now speakd.socket speakd-ssip.socket"
fi
if [ -e "$DESTDIR/etc/speakd/speakd.toml" ]; then
    install -m 0644 "$here/speakd.toml" "$DESTDIR/etc/speakd/speakd.toml.example"
    say "kept the existing /etc/speakd/speakd.toml (new example: speakd.toml.example)"
else
    install -m 0644 "$here/speakd.toml" "$DESTDIR/etc/speakd/speakd.toml"
fi
say "installed units in $units"

# 3. The live system: user, systemd, service.
if [ -n "$DESTDIR" ]; then
    say "DESTDIR set: not creating the user or touching systemd"
    exit 0
fi
if command -v systemd-sysusers >/dev/null 2>&1; then
    systemd-sysusers /usr/local/lib/sysusers.d/speakd.conf
elif ! getent passwd speakd >/dev/null; then
    useradd --system --user-group --home-dir /var/lib/speakd --no-create-home \
        --shell /usr/sbin/nologin speakd
fi
if [ ! -d /run/systemd/system ]; then
    say "systemd is not running (container/CI?): skipped daemon-reload and enable;"
    say "on a booted system run: systemctl daemon-reload && systemctl enable --now speakd.socket speakd-ssip.socket speakd.service"
    exit 0
fi
systemctl daemon-reload
if [ "$enable" = yes ]; then
    systemctl enable --now speakd.socket speakd-ssip.socket speakd.service
    systemctl restart speakd.service  # an upgrade must not keep running the old code
    say "speakd enabled and started; check it with: systemctl status speakd"
else
    say "not enabled (--no-enable); start it with: systemctl enable --now speakd.socket speakd-ssip.socket speakd.service"
fi
