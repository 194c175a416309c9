"""int8 KV cache for the ChatTTS GPT graph: per-layer K/V scales measured on the corpus, and the
GroupQueryAttention rewrite that uses them (docs/chattts.md, "The GPT graph": GQA's int8 cache
takes static scales, so they must be calibrated).

Scales are per tensor (one for K, one for V, per layer): absmax over every cached position of the
float runs over the calibration corpus, divided by 127. GQA then stores int8 keys/values and
dequantizes inside the kernel; the graph's past/present inputs become int8 and the manifest says
``kv_dtype = "int8"`` so the engine allocates int8 buffers. The graph builder in
``speakd_tools.chattts.gpt_graph`` has no int8-KV option, so the rewrite is done on the finished
(possibly quantized) graph here; it only touches GQA nodes and the KV value infos.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .errors import CalibrationError

GQA_SCALE_SLOT = (
    12  # inputs: q,k,v,past_k,past_v,seqlens,total,cos,sin,pos_ids,bias,sink,k_scale,v_scale
)
HEADROOM = 1.0  # scale = absmax / 127 × HEADROOM (1.0: the corpus maximum maps to 127)


class KvRange:
    """Running absmax of every layer's cached keys and values."""

    def __init__(self, layers: int) -> None:
        self.k = np.zeros(layers, np.float64)
        self.v = np.zeros(layers, np.float64)
        self.positions = 0

    def update(self, kv: list[np.ndarray], length: int) -> None:
        """``kv``: the runner's buffers [k0, v0, k1, v1, …] holding ``length`` valid positions."""
        for i in range(len(self.k)):
            self.k[i] = max(self.k[i], float(np.abs(kv[2 * i][:, :, :length]).max()))
            self.v[i] = max(self.v[i], float(np.abs(kv[2 * i + 1][:, :, :length]).max()))
        self.positions += length

    def scales(self) -> dict[str, list[float]]:
        if self.positions == 0:
            raise CalibrationError("no KV positions were measured (empty calibration run)")
        k = np.maximum(self.k, 1e-6) * HEADROOM / 127.0
        v = np.maximum(self.v, 1e-6) * HEADROOM / 127.0
        return {
            "k_scale": [float(x) for x in k],
            "v_scale": [float(x) for x in v],
            "k_absmax": [float(x) for x in self.k],
            "v_absmax": [float(x) for x in self.v],
            "positions": self.positions,
            "quant_type": "PER_TENSOR",
        }


def apply_int8_kv(path: Path, scales: dict[str, list[float]]) -> int:
    """Rewrite ``path`` in place for an int8 KV cache; return the number of GQA nodes changed."""
    model = onnx.load(str(path))
    graph = model.graph
    changed = 0
    for node in graph.node:
        if node.op_type != "GroupQueryAttention":
            continue
        present_k = node.output[1]
        try:
            layer = int(present_k.rsplit("_", 1)[1])
        except (IndexError, ValueError):
            raise CalibrationError(
                f"{path}: GQA node {node.name!r} output {present_k!r} does "
                "not name its layer (present_key_<i>)"
            ) from None
        if any(a.name == "kv_cache_bit_width" for a in node.attribute):
            raise CalibrationError(f"{path}: layer {layer} already has a quantized KV cache")
        ks, vs = f"kv_k_scale_{layer}", f"kv_v_scale_{layer}"
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.array([scales["k_scale"][layer]], np.float32), ks),
                numpy_helper.from_array(np.array([scales["v_scale"][layer]], np.float32), vs),
            ]
        )
        while len(node.input) < GQA_SCALE_SLOT:
            node.input.append("")
        node.input.extend([ks, vs])
        node.attribute.extend(
            [
                helper.make_attribute("kv_cache_bit_width", 8),
                helper.make_attribute("k_quant_type", "PER_TENSOR"),
                helper.make_attribute("v_quant_type", "PER_TENSOR"),
            ]
        )
        changed += 1
    if not changed:
        raise CalibrationError(f"{path}: no GroupQueryAttention node; int8 KV needs the GQA graph")
    for vi in [*graph.input, *graph.output]:
        if vi.name.startswith(("past_key_", "past_value_", "present_key_", "present_value_")):
            vi.type.tensor_type.elem_type = TensorProto.INT8
    onnx.save(model, str(path))
    return changed
