# The two commands a newcomer runs (README "Quick start"):
#   make run    install speakd on this machine and run the daemon in the foreground (embedded voice)
#   make test   install the test dependencies and run the whole test suite (what .ci/run calls)
# Both install the Debian packages they need (as root, or through sudo) and a venv in .venv.
#   make rknn-env   the RK3588 NPU toolkit's own venv in .venv-rknn (speakd-tools rknn convert)
#   make soak       the long soak (docs/reliability.md, "Soak"): every front-end and every fault,
#                   SIGKILL, SIGTERM and a package upgrade among them; SOAK_MINUTES=30
#   make deb        dist/speakd_<version>_{amd64,arm64}.deb for boards (docs/systemd.md); for
#                   Ubuntu 24.04 `make deb DEB_PYTHON=3.12`, for Debian 13 trixie DEB_PYTHON=3.13;
#                   DEB_ARCHES=amd64, DEB_COMPRESS=gzip|none, DEB_VERSION=0.1.0-2 narrow it
#   make image      localhost/speakd:<version>, the amd64 container image (root; podman, no
#                   registry; DEB=path reuses a built .deb), `make image-test` checks it

PY ?= python3
VENV := .venv
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
RUN_APT := libportaudio2 libatomic1
TEST_APT := libportaudio2 ffmpeg mosquitto mosquitto-clients openssl speech-dispatcher python3-speechd alsa-utils systemd curl chromium iproute2 lintian orca xvfb xdotool at-spi2-core dbus-x11 gir1.2-gtk-3.0 python3-gi x11-utils speech-dispatcher-espeak-ng pulseaudio pulseaudio-utils
# make deb: the target CPython (the wheels are ABI-specific; 3.11 = Debian 12 / Pi OS bookworm)
DEB_PYTHON ?= 3.11
DEB_ARCHES ?= amd64 arm64
DEB_COMPRESS ?= xz
DEB_VERSION ?=
IMAGE_APT := podman debootstrap

RKNN_VENV := .venv-rknn
RKNN_TOOLKIT := rknn-toolkit2==2.5.0

SOAK_MINUTES ?= 30

.PHONY: run test apt-run apt-test apt-image venv lint rknn-env deb deb-env image image-test soak

apt-run:
	@dpkg -s $(RUN_APT) >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends $(RUN_APT); }

apt-test:
	@dpkg -s $(TEST_APT) >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(TEST_APT); }

$(VENV)/bin/python:
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip

run: apt-run $(VENV)/bin/python
	$(VENV)/bin/pip install -q .
	$(VENV)/bin/speakd serve $(if $(CONFIG),--config $(CONFIG),)

test: apt-test $(VENV)/bin/python
	$(VENV)/bin/pip install -q -e ".[dev,host]"
	$(VENV)/bin/ruff check daemon tools tests
	$(VENV)/bin/python -m pytest -q -rs -p no:cacheprovider

soak: apt-test $(VENV)/bin/python
	$(VENV)/bin/pip install -q -e ".[dev,host]"
	$(VENV)/bin/speakd-tools soak --minutes $(SOAK_MINUTES) --json-out soak.json

# Rockchip's host toolkit pins old torch/numpy/onnx, so it lives in its own venv, which
# `speakd-tools rknn convert` runs (docs/boards.md, "The NPU").
rknn-env:
	@test -x $(RKNN_VENV)/bin/python || $(PY) -m venv $(RKNN_VENV)
	$(RKNN_VENV)/bin/pip install -q --no-deps $(RKNN_TOOLKIT)
	$(RKNN_VENV)/bin/pip install -q -r tools/rknn/requirements.txt
	$(RKNN_VENV)/bin/python -c "from rknn.api import RKNN"

# Debian packages from wheels for each target architecture: no compiler, no emulation.
# build.sh makes the key-echo pack with the speakd it packages, on this host, which imports
# speakd's device dependencies: deb-env puts them in .venv (a fresh clone's venv is empty).
deb-env: $(VENV)/bin/python
	$(VENV)/bin/pip install -q -e .

deb: deb-env
	for arch in $(DEB_ARCHES); do \
		PYTHON=$(VENV)/bin/python systemd/debian/build.sh --arch $$arch --python $(DEB_PYTHON) \
			--compress $(DEB_COMPRESS) $(if $(DEB_VERSION),--version $(DEB_VERSION),) || exit 1; \
	done

# The container image from the .deb (container/build.sh; docs/home-assistant.md). Needs root:
# debootstrap makes the base once, podman keeps it. ADDON=yes also builds the add-on's image.
# `make image-test` runs `make image` in a fresh clone of this checkout's HEAD (commit first), as
# a newcomer would, then runs the image from its unpacked root as it declares itself
# (tests/test_image.py); the suite skips that file without the image, and .ci/run does not run
# image-test (minutes, and root with podman and debootstrap).
IMAGE_CLONE := $(or $(TMPDIR),/tmp)/speakd-image-test

apt-image:
	@dpkg -s $(IMAGE_APT) >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(IMAGE_APT); }

image: apt-image deb-env
	$(SUDO) env PYTHON=$(VENV)/bin/python container/build.sh $(if $(ADDON),--addon $(ADDON),) $(if $(DEB),--deb $(DEB),)

image-test: apt-image $(VENV)/bin/python
	rm -rf $(IMAGE_CLONE) && git clone -q . $(IMAGE_CLONE)
	$(MAKE) -C $(IMAGE_CLONE) image ADDON=yes $(if $(DEB),DEB=$(abspath $(DEB)),)
	rm -rf $(IMAGE_CLONE)
	$(VENV)/bin/pip install -q -e ".[dev,host]"
	$(SUDO) env SPEAKD_IMAGE_REQUIRED=1 $(VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_image.py
