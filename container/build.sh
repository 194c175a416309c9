#!/bin/sh
# Build speakd's OCI image with podman, no daemon, no registry (`make image`), for this
# machine's architecture (amd64 here; on an arm64 host the same script makes the arm64 image:
# its RUN step executes the target's apt and Python, so it cannot cross-build without binfmt).
#
#   container/build.sh [--deb FILE] [--tag NAME] [--mirror URL] [--addon yes]
#
# 1. The base: a Debian bookworm root made by `debootstrap --variant=minbase`, trimmed the way
#    debian:bookworm-slim is (no manuals, no translations) and imported as
#    localhost/speakd-base:bookworm. It is kept in podman's store: later builds reuse it
#    (`podman rmi localhost/speakd-base:bookworm` makes a new one, with the day's updates).
# 2. The .deb: --deb FILE, else systemd/debian/build.sh builds it now (its downloaded wheels stay
#    in ~/.cache/speakd-deb, shared with `make deb` and tests/test_deb.py).
# 3. `podman build --isolation chroot --format docker` of container/Containerfile: apt installs
#    the .deb and its Debian dependencies (python3.11, libportaudio2) in the base. The docker
#    format keeps HEALTHCHECK, which OCI's image format has no field for.
# 4. With --addon yes, also the Home Assistant add-on's image (homeassistant/speakd/Dockerfile)
#    as the Supervisor builds it, with the same .deb beside it and the same base:
#    localhost/speakd-addon:<version>.
# Prints the image's name (default localhost/speakd:<version>) on its last line.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
deb= tag= mirror=http://deb.debian.org/debian addon=no
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" >&2; exit 2; }
    case $1 in
        --deb) deb=$2 ;;
        --tag) tag=$2 ;;
        --mirror) mirror=$2 ;;
        --addon) addon=$2 ;;
        *) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
    esac
    shift 2
done
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml")
tag=${tag:-localhost/speakd:$version}
base=localhost/speakd-base:bookworm
say() { echo "container/build.sh: $*" >&2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if ! podman image exists "$base"; then
    say "making the base: debootstrap --variant=minbase bookworm from $mirror"
    root=$work/root
    mkdir -p "$root/etc/dpkg/dpkg.cfg.d"
    # What bookworm-slim leaves out, from the first package on (copyright files stay).
    cat >"$root/etc/dpkg/dpkg.cfg.d/speakd-slim" <<'SLIM'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
SLIM
    debootstrap --variant=minbase bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
        tail -20 "$work/debootstrap.log" >&2
        exit 1
    }
    rm -f "$root/etc/apt/sources.list"
    cat >"$root/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
    printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
        >"$root/etc/apt/apt.conf.d/90speakd-slim"
    rm -rf "$root/var/lib/apt/lists"/* "$root/var/cache/apt"/*.bin \
        "$root/var/cache/apt/archives"/*.deb "$root/var/log"/*.log
    tar -C "$root" --numeric-owner -cf - . | podman import \
        --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' \
        --message "debootstrap --variant=minbase bookworm, $(date -u +%F)" - "$base" >/dev/null
    say "base $base: $(podman image inspect --format '{{.Size}}' "$base") bytes"
fi

if [ -z "$deb" ]; then
    arch=$(dpkg --print-architecture)
    say "building the .deb (systemd/debian/build.sh --arch $arch)"
    deb=$(PYTHON=${PYTHON:-python3} "$repo/systemd/debian/build.sh" --arch "$arch" \
        --compress none --out "$work/deb" | tail -1)
fi
context=$work/context
mkdir -p "$context"
cp "$here/Containerfile" "$here/entrypoint" "$context/"
# the files both images share live in the add-on's folder, which the Supervisor builds alone
shared=$repo/homeassistant/speakd/rootfs/usr/local
cp "$shared/share/speakd/speakd.toml" "$shared/sbin/speakd-user" "$shared/bin/speakd-healthcheck" \
    "$context/"
cp "$deb" "$context/speakd.deb"
say "podman build $tag from $(basename "$deb")"
podman build --isolation chroot --format docker --pull=never \
    --build-arg "BASE=$base" --build-arg DEB=speakd.deb --build-arg "VERSION=$version" \
    --build-arg "DEB_SHA256=$(sha256sum "$deb" | cut -d' ' -f1)" \
    --tag "$tag" "$context" >&2
say "built $tag: $(podman image inspect --format '{{.Size}}' "$tag") bytes"
if [ "$addon" = yes ]; then
    # the Supervisor's BUILD_ARCH names aarch64 what Debian calls arm64
    arch=$(dpkg-deb --field "$deb" Architecture)
    case $arch in arm64) build_arch=aarch64 ;; *) build_arch=$arch ;; esac
    package=$(dpkg-deb --field "$deb" Version)
    mkdir -p "$work/addon"
    cp -r "$repo/homeassistant/speakd/." "$work/addon/"
    cp "$deb" "$work/addon/speakd_${package}_$arch.deb"
    say "podman build localhost/speakd-addon:$version (homeassistant/speakd)"
    podman build --isolation chroot --format docker --pull=never \
        --build-arg "BUILD_FROM=$base" --build-arg "BUILD_ARCH=$build_arch" \
        --build-arg "SPEAKD_VERSION=$package" --tag "localhost/speakd-addon:$version" \
        "$work/addon" >&2
fi
echo "$tag"
