"""Run a ChatTTS bundle's three graphs on fixed inputs and save what they output.

    python tests/arm64/graphs.py OUT_DIR BUNDLE... [--steps N]     (writes OUT_DIR/<bundle>.npz)

Device imports only (numpy, onnxruntime, speakd), so the same script runs on x86 and, under
qemu, on aarch64; tests/test_arm64.py compares the two ``.npz`` files. The inputs do not depend
on the machine: the GPT is teacher-forced with codes drawn from a fixed seed (no sampling, so a
code that one machine would draw differently cannot send the two runs apart), the Decoder gets a
fixed random hidden sequence and Vocos a fixed random mel. What differs between the outputs is
then the kernels' arithmetic alone.
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import numpy as np
import onnxruntime as ort

from speakd.engines.base import SynthesisConfig
from speakd.engines.chattts.engine import ChatTTSEngine

SENTENCE = "the door is open"
SEED = 20


def run(bundle: Path, steps: int) -> dict[str, np.ndarray]:
    eng = ChatTTSEngine.load(bundle, threads=1)
    spec = eng.spec
    rng = np.random.default_rng(SEED)
    codes = rng.integers(0, spec.eos_token, (steps, spec.num_vq))  # EOS (the last id) excluded
    prompt = eng.prompt_embeds(SENTENCE, eng.audio_params(SynthesisConfig()))
    h, lg = eng.gpt.prompt(prompt)
    hiddens, logits = [h.copy()], [lg.copy()]
    for c in codes[:-1]:
        h, lg = eng.gpt.step(c)
        hiddens.append(h.copy())
        logits.append(lg.copy())
    hidden_in = rng.standard_normal((1, spec.hidden_size, steps)).astype(np.float32)
    (mel,) = eng.vocoder.decoder.run(["mel"], {"hidden": hidden_in})
    mel_in = rng.standard_normal(mel.shape).astype(np.float32)
    real, imag = eng.vocoder.vocos.run(["spec_real", "spec_imag"], {"mel": mel_in})
    return {
        "codes": codes,
        "logits": np.array(logits),
        "hiddens": np.array(hiddens),
        "mel": mel,
        "spec": np.concatenate([real, imag], axis=-1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("bundles", type=Path, nargs="+")
    p.add_argument("--steps", type=int, default=24)
    args = p.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for bundle in args.bundles:
        np.savez(
            args.out_dir / f"{bundle.name}.npz",
            machine=np.array(platform.machine()),
            onnxruntime=np.array(ort.__version__),
            **run(bundle, args.steps),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
