"""The half of ``speakd-tools rknn convert`` that runs inside the toolkit's venv (``make
rknn-env``): one job file in; ``.rknn`` files, the simulator's outputs and a result file out.

It imports only the standard library, numpy and ``rknn.api``, because that venv holds neither
speakd nor its dependencies (tools/rknn/requirements.txt). Everything speakd-specific (which
graphs, which windows, the references and the report) is done by tools/rknn/convert.py (the graphs
and their inputs: tools/rknn/sources.py) in the host-tools venv. Per graph and precision:
``config`` → ``load_onnx`` at the job's fixed input shape → ``build`` (int8: quantized on the job's
calibration windows) → ``export_rknn`` → ``init_runtime()`` with no target, which is the toolkit's
simulator → ``inference`` on every evaluation window. A failing step is recorded with the toolkit's
message, not raised: that graph stays on the CPU and the report says why.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from importlib.metadata import version
from pathlib import Path

import numpy as np


def build_one(graph: dict, build: dict, target: str) -> dict:
    from rknn.api import RKNN

    t0 = time.monotonic()
    rknn = RKNN(verbose=False)
    step = "config"
    try:
        if build["precision"] == "int8":
            rknn.config(
                target_platform=target,
                quantized_dtype="w8a8",
                quantized_algorithm=build.get("algorithm", "normal"),
            )
        else:  # RK3588's float path is fp16
            rknn.config(target_platform=target)
        step = "load_onnx"
        _check(
            rknn.load_onnx(
                model=graph["onnx"], inputs=[graph["input"]], input_size_list=[graph["shape"]]
            )
        )
        step = "build"
        quantize = build["precision"] == "int8"
        _check(rknn.build(do_quantization=quantize, dataset=build.get("dataset")))
        step = "export_rknn"
        _check(rknn.export_rknn(build["rknn"]))
        step = "init_runtime (simulator)"
        _check(rknn.init_runtime())
        step = "inference (simulator)"
        windows = np.load(graph["eval"])
        outputs: list[list[np.ndarray]] = []
        for x in windows:
            outs = rknn.inference(inputs=[x[None]], data_format="nchw")
            if outs is None:
                raise RuntimeError("the simulator returned no output")
            outputs.append([np.asarray(o, np.float32) for o in outs])
        np.savez(
            build["outputs"],
            **{f"out{k}": np.stack([o[k] for o in outputs]) for k in range(len(outputs[0]))},
        )
        return {"ok": True, "seconds": round(time.monotonic() - t0, 2)}
    except Exception as e:
        return {
            "ok": False,
            "step": step,
            "error": f"{type(e).__name__}: {str(e).strip()[-600:]}",
            "traceback": traceback.format_exc()[-2000:],
        }
    finally:
        rknn.release()


def _check(ret: int) -> None:
    if ret != 0:
        raise RuntimeError(f"the toolkit returned {ret} (its log has the reason)")


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    result: dict = {"toolkit": version("rknn-toolkit2"), "builds": {}}
    for graph in job["graphs"]:
        for build in graph["builds"]:
            key = f"{graph['name']}/{build['precision']}"
            print(f"=== {key}", flush=True)
            result["builds"][key] = build_one(graph, build, job["target"])
    Path(job["result"]).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
