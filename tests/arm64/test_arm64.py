"""speakd on aarch64, emulated: the boards' CPUs under qemu-user, compared with this x86 machine.

tests/arm64/build.sh makes an arm64 Debian bookworm root (python3.11 from bookworm's .debs),
unpacks qemu-user 10 from bookworm-backports and installs speakd's device dependencies from
aarch64 wheels only. The speakd code under test is this checkout's, built as a wheel and run by
both sides (x86: this venv's dependencies; ARM: the aarch64 wheels). Under ``qemu-aarch64 -cpu
cortex-a76`` (Raspberry Pi 5 / RK3588 big core: NEON + dot product, no i8mm) and ``-cpu max``
with SVE and SME off (i8mm, bf16 and the other ARMv8.6+ features: onnxruntime takes its other
NEON kernels; see CPUS for why not SVE), concurrently:

* ``speakd synth`` with the embedded voice, a tiny fp32 ChatTTS bundle and its quantized sibling
  (``speakd-tools calibrate``'s default mode, 4-bit GPT + int8 KV), through
  tests/arm64/slow_cli.py: the same CLI with the engine guard's 30 s hang timeout raised, since
  emulation is 100-300x slower than a board;
* ``speakd serve`` with the fp32 bundle: a ``say`` over the JSON socket (WAV sink), then the same
  say with ``cache_only``, which only the cache can answer;
* tests/arm64/graphs.py: the three graphs of both bundles on fixed inputs, GPT teacher-forced.

What must hold, and why:

* fp32 audio (embedded voice, ChatTTS fp32, the daemon's WAV): the same length as x86's, every
  16-bit sample within 1 step of x86's before the voice's loudness gain (so within 2 after the
  embedded voice's 1.95x), and an SNR of at least 40 dB. Float rounding differences
  between the x86 and ARM kernels are ~1e-6 relative (the graph check measures them), so a sample
  can only move where its value lies next to a rounding boundary; a decode that went elsewhere (one
  code sampled differently) decorrelates everything after it and gives about 0 dB. The tiny
  random-weight ChatTTS bundle speaks at ~6 steps RMS, so for it the bound is the 1-step one.
* Quantized bundle: its audio is *not* compared. ARM's 4-bit MatMul kernel rounds differently
  from x86's, a near-tie code then flips and the autoregressive decode continues elsewhere
  (equally valid audio). It is compared at the level where it is deterministic: on forced codes,
  ARM's int4 logits must differ from x86's int4 logits by less than x86's own int4-vs-fp32
  error, and its greedy codes must agree with x86's int4 more often than x86's int4 agrees with
  fp32. Its synth must still produce the same number of samples (same stop rule, same steps).
* fp32 graphs: logits, hidden states, mel and spectra within 1e-5 relative of x86.

Timings and errors are printed (``pytest -s``). Measured on the 2-core development VM with the
downloads cached: the emulated commands in 412 s (both CPUs at once) at load average 6-7
(2026-12-03; docs/boards.md has the steps). Downloads are cached in ``$SPEAKD_ARM64_CACHE``
(default /var/cache/speakd-arm64).
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import wave
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TEXT = "The door is open."
SEED = 7
MAX_CONTEXT = 112  # KV capacity of the tiny bundles: ~60 decode steps after the prompt
# -cpu max with qemu's own pointer-authentication algorithm (a cheaper PAC hash, which halves the
# emulation time; programs cannot tell the difference), and without SVE and SME: qemu emulates
# their predicated vectors element by element, and onnxruntime's SVE kernels made the embedded
# voice's `speakd synth` take over 11 min of CPU where the same run without them takes 97 s
# (1.14 s of audio; 128-bit vectors were no better). The boards speakd targets (Pi 5, RK3588:
# Cortex-A76) have neither.
CPUS = {"cortex-a76": "cortex-a76", "max": "max,pauth-impdef=on,sve=off,sme=off"}
SNR_MIN_DB = 40.0
FP32_GRAPH_RTOL = 1e-5
STEP_TIMEOUT_S = 1800  # one emulated command (a loaded 2-core machine is 3-4x slower)

pytestmark = [pytest.mark.arm64, pytest.mark.timeout(3600)]


# --- helpers -------------------------------------------------------------------------------------


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float64)


def snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    noise = float(((ref - test) ** 2).sum())
    return float("inf") if noise == 0 else 10 * np.log10(float((ref**2).sum()) / noise)


def rel(test: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(test - ref) / np.linalg.norm(ref))


def compare_fp32_audio(ref_path: Path, test_path: Path, steps: int = 1) -> tuple[float, float]:
    """Assert equal length and ≤ ``steps`` per sample; SNR ≥ 40 dB where the signal allows it."""
    ref, test = read_wav(ref_path), read_wav(test_path)
    assert len(test) == len(ref), f"{test_path.name}: {len(test)} samples, x86 {len(ref)}"
    diff = float(np.abs(ref - test).max())
    snr = snr_db(ref, test)
    what = f"{test_path.name}: a sample differs by {diff:.0f} steps (SNR {snr:.1f} dB)"
    assert diff <= steps, what
    # Every sample `steps` off would give 10·log10(mean(ref²) / steps²): the bound cannot exceed it.
    floor = 10 * np.log10(max(float((ref**2).mean()) / steps**2, 1.0))
    assert snr >= min(SNR_MIN_DB, floor), f"{test_path.name}: SNR {snr:.1f} dB"
    return snr, diff


@dataclass
class Arm:
    """How to run a Python command on the emulated aarch64 machine."""

    qemu: str
    root: str
    site: str
    speakd: str

    def cmd(self, cpu: str, *args: str) -> list[str]:
        return [self.qemu, "-cpu", cpu, "-L", self.root, f"{self.root}/usr/bin/python3.11", *args]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}  # x86 values
        return {**env, "PYTHONPATH": f"{self.speakd}:{self.site}", "PYTHONHASHSEED": "0"}


def x86_env(speakd: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": speakd, "PYTHONHASHSEED": "0"}


def run(cmd: list[str], env: dict[str, str], timeout: float = STEP_TIMEOUT_S) -> float:
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode:
        raise AssertionError(f"{' '.join(cmd[-6:])} exited {r.returncode}:\n{r.stderr[-4000:]}")
    return time.monotonic() - t0


def speakd_tools(*args: str, env: dict[str, str]) -> None:
    run([sys.executable, "-m", "speakd_tools.cli", *args], env)


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("arm64")


@pytest.fixture(scope="module")
def speakd_site(work: Path) -> str:
    """This checkout as the wheel a board would install, unpacked (run by both sides)."""
    out = work / "wheel"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (whl,) = out.glob("speakd-*.whl")
    site = work / "speakd-site"
    zipfile.ZipFile(whl).extractall(site)
    return str(site)


@pytest.fixture(scope="module")
def arm(speakd_site: str) -> Arm:
    t0 = time.monotonic()
    r = subprocess.run(
        ["bash", str(HERE / "build.sh"), sys.executable],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert r.returncode == 0, f"tests/arm64/build.sh failed:\n{r.stderr[-6000:]}"
    out = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    print(f"\narm64 build: {time.monotonic() - t0:.0f} s, cache {out['CACHE']}")
    return Arm(out["QEMU"], out["ROOT"], out["SITE"], speakd_site)


@pytest.fixture(scope="module")
def bundles(work: Path, speakd_site: str) -> dict[str, Path]:
    """Tiny random ChatTTS: fp32 and the recipe's default quantized mode, made on x86."""
    pytest.importorskip("ChatTTS", reason="needs the host stack: pip install -e '.[host]'")
    env = x86_env(speakd_site)
    ckpt, fp32, q = work / "checkpoint", work / "fp32" / "chattts-tiny", work / "q" / "tiny-q"
    speakd_tools("checkpoint", "--size", "tiny", "--out", str(ckpt), "--seed", "0", env=env)
    speakd_tools("export", "--checkpoint", str(ckpt), "--out", str(fp32),
                 "--max-context", str(MAX_CONTEXT), "--no-parity", env=env)  # fmt: skip
    recipe = (REPO / "calibration/recipes/chattts.toml").read_text()
    for key, value in {"max_new_token": 6, "speed_steps": 3, "speed_rounds": 1}.items():
        recipe = "\n".join(
            f"{key} = {value}" if line.startswith(f"{key} = ") else line
            for line in recipe.splitlines()
        )
    (work / "recipe.toml").write_text(recipe)
    speakd_tools("calibrate", "--bundle", str(fp32), "--out", str(q), "--recipe",
                 str(work / "recipe.toml"), "--corpus", str(REPO / "calibration/corpus"),
                 "--limit", "1", "--eval", "1", env=env)  # fmt: skip
    # Different folders: precision "int8" would otherwise load a <bundle>-int8 sibling.
    return {"fp32": fp32, "q": q}


def synth_args(out: Path, bundle: Path | None, emulated: bool = False) -> list[str]:
    """``speakd synth`` (x86) or tests/arm64/slow_cli.py (the same CLI, hang guard raised)."""
    cli = [str(HERE / "slow_cli.py")] if emulated else ["-m", "speakd"]
    args = [*cli, "synth", TEXT, "-o", str(out), "--seed", str(SEED), "--threads", "1"]
    return args + (["--bundle", str(bundle)] if bundle else [])


@pytest.fixture(scope="module")
def x86(work: Path, speakd_site: str, bundles: dict[str, Path]) -> dict[str, Path]:
    env, out = x86_env(speakd_site), work / "x86"
    out.mkdir()
    for name, bundle in {"embedded": None, **bundles}.items():
        run([sys.executable, *synth_args(out / f"{name}.wav", bundle)], env)
    run([sys.executable, str(HERE / "graphs.py"), str(out), *map(str, bundles.values())], env)
    return {"dir": out}


@dataclass
class ArmRun:
    cpu: str
    out: Path
    seconds: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    serve: dict = field(default_factory=dict)

    def need(self, step: str) -> None:
        assert step not in self.errors, f"-cpu {self.cpu}, {step}: {self.errors[step]}"
        assert step in self.seconds, f"-cpu {self.cpu}: {step} did not run"


def _say(sock: str, fields: dict, timeout: float) -> list[dict]:
    """One say over the JSON socket, events up to the terminal one."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(sock)
        s.sendall((json.dumps({"op": "say", "wait": True, **fields}) + "\n").encode())
        events, buf = [], b""
        while True:
            chunk = s.recv(65536)
            assert chunk, f"the daemon closed the connection after {events}"
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                events.append(json.loads(line))
                if events[-1]["event"] in ("finished", "error"):
                    return events


def _answers(sock: str) -> bool:
    """The socket takes a connection: its file alone can be a stale one, or not yet listening."""
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(sock)
        except OSError:
            return False
    return True


def _serve(arm: Arm, cpu: str, bundle: Path, out: Path) -> dict:
    """`speakd serve` on ARM: a say synthesizes into the WAV sink, the same say cache_only hits."""
    (out / "wav").mkdir(parents=True)
    sock = str(out / "speakd.sock")
    config = out / "speakd.toml"
    config.write_text(
        f"""
[engine]
kind = "chattts"
bundle = "{bundle}"
precision = "exact"
threads = 1
fallback_text = "Sorry."
hang_timeout_s = 900
max_rtf = 1000
accelerator = "auto"

[audio]
sink = "wav"
wav_dir = "{out / "wav"}"

[socket]
path = "{sock}"
ssip_path = "{out / "ssip.sock"}"

[cache]
path = "{out / "cache.db"}"
"""
    )
    log = (out / "serve.log").open("wb")
    proc = subprocess.Popen(
        arm.cmd(cpu, "-m", "speakd", "serve", "--config", str(config)),
        stdout=log, stderr=subprocess.STDOUT, env=arm.env(),
    )  # fmt: skip
    try:
        t0 = time.monotonic()
        while not _answers(sock):
            assert proc.poll() is None, f"speakd serve exited {proc.returncode}"
            assert time.monotonic() - t0 < 600, "speakd serve: no socket after 600 s"
            time.sleep(0.5)
        ready = time.monotonic() - t0
        t1 = time.monotonic()
        first = _say(sock, {"text": TEXT, "id": "arm1", "seed": SEED}, STEP_TIMEOUT_S)
        synth = time.monotonic() - t1
        t2 = time.monotonic()
        cached = _say(sock, {"text": TEXT, "id": "arm2", "seed": SEED, "cache_only": True}, 120)
        hit = time.monotonic() - t2
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        log.close()
    return {"first": first, "cached": cached, "ready_s": ready, "say_s": synth, "hit_s": hit,
            "rc": rc, "wav": out / "wav",
            "log": (out / "serve.log").read_text(errors="replace")}  # fmt: skip


def _arm_steps(arm: Arm, cpu: str, bundles: dict[str, Path], out: Path) -> ArmRun:
    qcpu = CPUS[cpu]
    result = ArmRun(cpu, out)
    out.mkdir()
    steps = {
        f"synth {name}": (
            lambda n=name, b=bundle: arm.cmd(qcpu, *synth_args(out / f"{n}.wav", b, emulated=True))
        )
        for name, bundle in {"embedded": None, **bundles}.items()
    }
    steps["graphs"] = lambda: arm.cmd(qcpu, str(HERE / "graphs.py"), str(out),
                                      *map(str, bundles.values()))  # fmt: skip
    for step, cmd in steps.items():
        try:
            result.seconds[step] = run(cmd(), arm.env())
        except (AssertionError, subprocess.TimeoutExpired) as e:
            result.errors[step] = str(e)
    t0 = time.monotonic()
    try:
        result.serve = _serve(arm, qcpu, bundles["fp32"], out / "serve")
        result.seconds["serve"] = time.monotonic() - t0
    except (AssertionError, OSError, subprocess.TimeoutExpired) as e:
        log = out / "serve" / "serve.log"
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        result.errors["serve"] = f"{e}\n{tail}"
    return result


@pytest.fixture(scope="module")
def arm_runs(arm: Arm, bundles: dict[str, Path], x86: dict, work: Path) -> dict[str, ArmRun]:
    """Both CPU models at once (one core each)."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(len(CPUS)) as pool:
        futures = {cpu: pool.submit(_arm_steps, arm, cpu, bundles, work / cpu) for cpu in CPUS}
        runs = {cpu: f.result() for cpu, f in futures.items()}
    print(f"\narm64 runs: {time.monotonic() - t0:.0f} s wall")
    for r in runs.values():
        print(f"  -cpu {r.cpu}: " + ", ".join(f"{k} {v:.0f} s" for k, v in r.seconds.items()))
    return runs


# --- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("cpu", CPUS)
def test_arm64_synth_embedded_voice_matches_x86(cpu: str, arm_runs, x86) -> None:
    run_ = arm_runs[cpu]
    run_.need("synth embedded")
    from speakd.config import DEFAULT_LUFS
    from speakd.engines.vits.params import EMBEDDED_LOUDNESS
    from speakd.request.loudness import gain_for

    gain = gain_for(EMBEDDED_LOUDNESS["lufs"], DEFAULT_LUFS)  # a step before it is `gain` after
    snr, diff = compare_fp32_audio(
        x86["dir"] / "embedded.wav", run_.out / "embedded.wav", steps=math.ceil(gain)
    )
    print(f"\n-cpu {cpu} embedded voice: SNR {snr:.1f} dB, max diff {diff:.0f} step(s)")


@pytest.mark.parametrize("cpu", CPUS)
def test_arm64_synth_chattts_fp32_matches_x86(cpu: str, arm_runs, x86) -> None:
    run_ = arm_runs[cpu]
    run_.need("synth fp32")
    snr, diff = compare_fp32_audio(x86["dir"] / "fp32.wav", run_.out / "fp32.wav")
    print(f"\n-cpu {cpu} ChatTTS fp32: SNR {snr:.1f} dB, max diff {diff:.0f} step(s)")


@pytest.mark.parametrize("cpu", CPUS)
def test_arm64_synth_chattts_quantized_speaks(cpu: str, arm_runs, x86) -> None:
    """Audio may differ from x86 (see the module docstring); it must exist, same length."""
    run_ = arm_runs[cpu]
    run_.need("synth q")
    ref, test = read_wav(x86["dir"] / "q.wav"), read_wav(run_.out / "q.wav")
    assert len(test) == len(ref) > 0
    assert np.abs(test).max() > 0
    print(
        f"\n-cpu {cpu} ChatTTS quantized: {len(test)} samples, SNR vs x86 "
        f"{snr_db(ref, test):.1f} dB (not bounded: the decode may take another path)"
    )


@pytest.mark.parametrize("cpu", CPUS)
def test_arm64_graphs_fp32_match_x86(cpu: str, arm_runs, x86, bundles) -> None:
    run_ = arm_runs[cpu]
    run_.need("graphs")
    a = np.load(run_.out / f"{bundles['fp32'].name}.npz")
    x = np.load(x86["dir"] / f"{bundles['fp32'].name}.npz")
    assert str(a["machine"]) == "aarch64" and str(x["machine"]) == "x86_64"
    errs = {k: rel(a[k], x[k]) for k in ("logits", "hiddens", "mel", "spec")}
    shown = ", ".join(f"{k} {v:.2g}" for k, v in errs.items())
    print(f"\n-cpu {cpu} fp32 graphs, ARM vs x86: {shown}")
    for k, e in errs.items():
        assert e < FP32_GRAPH_RTOL, f"fp32 {k}: ARM differs from x86 by {e:.3g} (relative)"


@pytest.mark.parametrize("cpu", CPUS)
def test_arm64_graphs_quantized_within_quantization_error(cpu: str, arm_runs, x86, bundles) -> None:
    """ARM's quantized graphs are as accurate as x86's (their error against the fp32 graph is at
    most 1.25x x86's), and differ from x86's by less than that quantization error: strictly for
    the GPT (what decides the codes), for the Decoder/Vocos within the sum of both quantizers'
    errors (2x), since an ARM kernel that rounds closer to fp32 sits a whole x86 error away."""
    run_ = arm_runs[cpu]
    run_.need("graphs")
    a = np.load(run_.out / f"{bundles['q'].name}.npz")
    xq = np.load(x86["dir"] / f"{bundles['q'].name}.npz")
    xf = np.load(x86["dir"] / f"{bundles['fp32'].name}.npz")
    lines, failures = [], []
    for k, factor in (("logits", 1.0), ("hiddens", 1.0), ("mel", 2.0), ("spec", 2.0)):
        arch, quant, own = rel(a[k], xq[k]), rel(xq[k], xf[k]), rel(a[k], xf[k])
        lines.append(f"{k} ARM-vs-x86 {arch:.3g}, x86 quantized-vs-fp32 {quant:.3g}, "
                     f"ARM quantized-vs-fp32 {own:.3g}")  # fmt: skip
        if not arch < max(factor * quant, FP32_GRAPH_RTOL) or not own <= 1.25 * quant + 1e-6:
            failures.append(lines[-1])
    t, qv = a["logits"].shape
    q = int(a["codes"].shape[1])

    def codes(d: np.lib.npyio.NpzFile) -> np.ndarray:
        return d["logits"].reshape(t, q, qv // q).argmax(-1)

    agree_arch = float((codes(a) == codes(xq)).mean())
    agree_quant = float((codes(xq) == codes(xf)).mean())
    lines.append(f"greedy codes ARM=x86 {agree_arch:.1%} (x86 quantized=fp32 {agree_quant:.1%})")
    if agree_arch < agree_quant:
        failures.append(lines[-1])
    print(f"\n-cpu {cpu} quantized graphs: " + "; ".join(lines))
    assert not failures, failures


@pytest.mark.parametrize("cpu", CPUS)
def test_arm64_serve_say_and_cache(cpu: str, arm_runs, x86) -> None:
    run_ = arm_runs[cpu]
    run_.need("serve")
    s = run_.serve
    assert s["first"][-1] == {"event": "finished", "id": "arm1", "status": "done"} or (
        s["first"][-1].get("status") == "done"
    ), s["first"]
    assert s["cached"][-1].get("status") == "done", f"cache_only say: {s['cached']}"
    assert s["rc"] == 0, f"speakd serve exited {s['rc']} on SIGTERM"
    # accelerator = "auto" with no NPU (qemu has none; the NPU path cannot run here): the CPU
    # speaks, and one line says why
    (npu,) = [line for line in s["log"].splitlines() if "engine.accelerator = auto" in line]
    assert "the CPU runs it" in npu, npu
    snr, _ = compare_fp32_audio(x86["dir"] / "fp32.wav", s["wav"] / "arm1.wav")
    compare_fp32_audio(s["wav"] / "arm1.wav", s["wav"] / "arm2.wav")
    print(f"\n-cpu {cpu} serve: socket after {s['ready_s']:.0f} s, say {s['say_s']:.0f} s "
          f"(SNR vs x86 synth {snr:.1f} dB), cache_only say {s['hit_s']:.2f} s")  # fmt: skip
