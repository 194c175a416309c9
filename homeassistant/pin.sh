#!/bin/sh
# Pin the add-on to released packages: write their version and sha256 into speakd/build.yaml
# (the Dockerfile refuses a download that does not match) and the version into config.yaml.
#
#   homeassistant/pin.sh dist/speakd_V_amd64.deb dist/speakd_V_arm64.deb [RELEASES_URL]
#
# Run it on the two .debs you upload to the release (`make deb`), then commit build.yaml.
set -eu
[ $# -ge 2 ] || { sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
amd64=$1 arm64=$2 releases=${3:-}
version=$(basename "$amd64" | sed -n 's/^speakd_\(.*\)_amd64\.deb$/\1/p')
[ -n "$version" ] && [ "$(basename "$arm64")" = "speakd_${version}_arm64.deb" ] || {
    echo "pin.sh: want speakd_V_amd64.deb and speakd_V_arm64.deb of one version" >&2
    exit 2
}
sum() { sha256sum "$1" | cut -d' ' -f1; }
sed -i -e "s|^  SPEAKD_VERSION: .*|  SPEAKD_VERSION: \"$version\"|" \
    -e "s|^  SPEAKD_SHA256_AMD64: .*|  SPEAKD_SHA256_AMD64: \"$(sum "$amd64")\"|" \
    -e "s|^  SPEAKD_SHA256_ARM64: .*|  SPEAKD_SHA256_ARM64: \"$(sum "$arm64")\"|" \
    "$here/speakd/build.yaml"
[ -z "$releases" ] || sed -i "s|^  SPEAKD_RELEASES: .*|  SPEAKD_RELEASES: $releases|" \
    "$here/speakd/build.yaml"
sed -i "s|^version: .*|version: \"${version%-*}\"|" "$here/speakd/config.yaml"
grep -n "SPEAKD_" "$here/speakd/build.yaml"
