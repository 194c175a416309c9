"""``speakd-tools rknn``: the RK3588 NPU's graphs, converted on the host with Rockchip's
rknn-toolkit2 in its own venv (``make rknn-env``) and checked in its simulator."""
