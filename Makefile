# The two commands a newcomer runs (README "Quick start"):
#   make run    install speakd on this machine and run the daemon in the foreground (embedded voice)
#   make test   install the test dependencies and run the whole test suite (what .ci/run calls)
# Both install the Debian packages they need (as root, or through sudo) and a venv in .venv.
#   make rknn-env   the RK3588 NPU toolkit's own venv in .venv-rknn (speakd-tools rknn convert)

PY ?= python3
VENV := .venv
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
RUN_APT := libportaudio2
TEST_APT := libportaudio2 mosquitto mosquitto-clients openssl speech-dispatcher python3-speechd alsa-utils systemd curl chromium iproute2

RKNN_VENV := .venv-rknn
RKNN_TOOLKIT := rknn-toolkit2==2.5.0

.PHONY: run test apt-run apt-test venv lint rknn-env

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
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider

# Rockchip's host toolkit pins old torch/numpy/onnx, so it lives in its own venv, which
# `speakd-tools rknn convert` runs (docs/boards.md, "The NPU").
rknn-env:
	@test -x $(RKNN_VENV)/bin/python || $(PY) -m venv $(RKNN_VENV)
	$(RKNN_VENV)/bin/pip install -q --no-deps $(RKNN_TOOLKIT)
	$(RKNN_VENV)/bin/pip install -q -r tools/rknn/requirements.txt
	$(RKNN_VENV)/bin/python -c "from rknn.api import RKNN"
