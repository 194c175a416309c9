"""The GPT's attention alone, by KV cache type: what a batched decode step's GroupQueryAttention
costs beside the bytes its cache holds (``speakd-tools bench profile attention BUNDLE``).

One graph of ``num_layers`` GroupQueryAttention nodes shaped like the bundle's GPT (heads, head
size, rotary, a ``max_context`` cache bound in place as the engine binds it), one new token per
row at context ``ctx``, for each KV type onnxruntime's CPU kernel takes: int8 with one scale per
tensor (what calibrated bundles ship) or per channel, fp32, fp16. The GB/s column is the cache's
bytes over the time, so it says how close each kernel is to reading its cache at DRAM speed.
Random K/V: attention's cost does not depend on the values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from speakd.engines.ortsession import session_options

from ..harness.stats import median_s

KV_TYPES = {  # name → (ONNX type, numpy type, bytes, int8 quantization)
    "int8 per tensor": (TensorProto.INT8, np.int8, 1, "PER_TENSOR"),
    "int8 per channel": (TensorProto.INT8, np.int8, 1, "PER_CHANNEL"),
    "fp32": (TensorProto.FLOAT, np.float32, 4, ""),
    "fp16": (TensorProto.FLOAT16, np.float16, 2, ""),
}


@dataclass(frozen=True)
class Shape:
    layers: int
    heads: int
    head_dim: int
    max_context: int


def graph(shape: Shape, kv: str) -> bytes:
    """``shape.layers`` GQA nodes reading one packed QKV input, each with its own cache."""
    etype, _, _, quant = KV_TYPES[kv]
    h, d, cap = shape.heads, shape.head_dim, shape.max_context
    inputs = [
        helper.make_tensor_value_info("qkv", TensorProto.FLOAT, ["b", 1, 3 * h * d]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["b"]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.random((cap, d // 2), np.float32), name)
        for name in ("cos", "sin")
    ]
    attrs: dict = dict(do_rotary=1, kv_num_heads=h, num_heads=h, rotary_interleaved=0)
    scales: list[str] = []
    if quant:
        size = [1] if quant == "PER_TENSOR" else [h, 1, d]
        inits += [numpy_helper.from_array(np.full(size, 0.02, np.float32), n) for n in ("ks", "vs")]
        attrs |= dict(kv_cache_bit_width=8, k_quant_type=quant, v_quant_type=quant)
        scales = ["", "", "", "ks", "vs"]
    nodes, outputs = [], []
    for i in range(shape.layers):
        cache = ["b", h, cap, d]
        inputs += [helper.make_tensor_value_info(f"past_{kv_}{i}", etype, cache) for kv_ in "kv"]
        outputs += [helper.make_tensor_value_info(f"out{i}", TensorProto.FLOAT, ["b", 1, h * d])]
        outputs += [
            helper.make_tensor_value_info(f"present_{kv_}{i}", etype, cache) for kv_ in "kv"
        ]
        past = [f"past_k{i}", f"past_v{i}"]
        nodes.append(
            helper.make_node(
                "GroupQueryAttention",
                ["qkv", "", "", *past, "seqlens_k", "total", "cos", "sin", *scales],
                [f"out{i}", f"present_k{i}", f"present_v{i}"],
                domain="com.microsoft",
                **attrs,
            )
        )
    model = helper.make_model(
        helper.make_graph(nodes, "attention", inputs, outputs, inits),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = 10
    return model.SerializeToString()


def measure(shape: Shape, kv: str, rows: int, ctx: int, threads: int = 2, runs: int = 30) -> float:
    """Median ms of one decode step's attention (every layer) for ``rows`` rows at ``ctx``."""
    _, dtype, _, quant = KV_TYPES[kv]
    quantized = bool(quant)
    sess = ort.InferenceSession(
        graph(shape, kv), session_options(threads), providers=["CPUExecutionProvider"]
    )
    rng = np.random.default_rng(1)
    io = sess.io_binding()
    qkv = rng.normal(size=(rows, 1, 3 * shape.heads * shape.head_dim)).astype(np.float32)
    io.bind_cpu_input("qkv", qkv)
    io.bind_cpu_input("seqlens_k", np.full(rows, ctx, np.int32))
    io.bind_cpu_input("total", np.array(ctx + 1, np.int32))
    cache_shape = (rows, shape.heads, shape.max_context, shape.head_dim)
    caches = []
    for i in range(shape.layers):
        for kv_ in "kv":  # past and present share one buffer, as the engine binds them
            values = (
                rng.integers(-100, 100, cache_shape) if quantized else rng.normal(size=cache_shape)
            )
            cache = ort.OrtValue.ortvalue_from_numpy(values.astype(dtype))
            io.bind_ortvalue_input(f"past_{kv_}{i}", cache)
            io.bind_ortvalue_output(f"present_{kv_}{i}", cache)
            caches.append(cache)
        io.bind_output(f"out{i}")
    return median_s(lambda: sess.run_with_iobinding(io), runs, warmup=3) * 1e3


def table(shape: Shape, rows: list[int], ctx: int, threads: int = 2) -> list[dict]:
    """Every KV type at every row count, with the cache bytes one step reads."""
    out = []
    for r in rows:
        for kv, (_, _, size, _) in KV_TYPES.items():
            cache = r * shape.layers * 2 * shape.heads * ctx * shape.head_dim * size
            ms = measure(shape, kv, r, ctx, threads)
            out.append(
                {"rows": r, "kv": kv, "ms": ms, "kv_mb": cache / 1e6, "gb_s": cache / ms / 1e6}
            )
    return out
