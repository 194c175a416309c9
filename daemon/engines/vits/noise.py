"""Seeded noise for ONNX graphs: replace ``RandomNormalLike`` with a counter-based generator.

Piper's VITS graphs draw their duration and prior noise with ``RandomNormalLike``, whose values
change on every ``session.run`` (ORT's seed only fixes where the sequence starts), so the same text
never gives the same audio twice. speakd needs audio to be a pure function of (text, params, seed)
for its cache and tests, so at load time each such node becomes a standard-normal generator of the
same shape driven by a new int64 scalar graph input ``seed``:

    key       = odd(squares64(stream, odd(squares64(seed, KEY))))   (one key per replaced node)
    u_j[i]    = squares32(2·i + j, key) / 2^32, top 24 bits  (i = flat element index, j = 0, 1)
    noise[i]  = sqrt(-2·ln(1 - u_0)) · cos(2π·u_1)           (Box–Muller)

``squares`` is Widynski's counter-based generator ("Squares: a fast counter-based RNG", 2020):
rounds of ``x = x·x + y`` and a 32-bit rotation, i.e. only uint64 ``Mul``, ``Add`` and
``BitShift``, which opset 15 has and onnxruntime's CPU kernels wrap modulo 2^64. (A SplitMix-style
hash needs ``BitwiseXor``, opset 18, which Piper's opset-15 graphs cannot import, and its xor-free
variant is nearly linear and visibly correlated.) The rotation's two halves never overlap, so its
``|`` is written as ``+``. Keys come from the full 64-bit state after five rounds (squares64
without its final xor). tests/test_vits.py checks the moments, the normal CDF and correlations.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper

from speakd.engines.vits.builder import GraphBuilder

SEED_INPUT = "seed"
KEY = 0xC8A0737A95ACBA7D  # odd, bits well spread (first 8 bytes of sha256("speakd noise key") | 1)
UNIFORM_BITS = 24  # what float32 holds exactly

_RANDOM_OPS = {
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
}


def make_noise_deterministic(model: onnx.ModelProto, seed_input: str = SEED_INPUT) -> int:
    """Rewrite ``model`` in place; return how many ``RandomNormalLike`` nodes were replaced.

    Adds the int64 scalar input ``seed_input`` (only when something was replaced). Each replaced
    node gets its own key, so e.g. VITS's duration noise and prior noise are independent for one
    seed. Raises ``ValueError`` when the graph holds another random op this rewrite does not cover
    (the determinism promise would be false).
    """
    graph = model.graph
    _reject_other_random_ops(graph)
    if any(i.name == seed_input for i in graph.input):
        raise ValueError(f"graph already has an input named {seed_input!r}")

    random = [n for n in graph.node if n.op_type == "RandomNormalLike"]
    if not random:
        return 0
    key_nodes, keys = _stream_keys(graph, seed_input, len(random))
    nodes: list[onnx.NodeProto] = []
    stream = 0
    for node in graph.node:
        if node.op_type != "RandomNormalLike":
            nodes.append(node)
            continue
        if stream == 0:  # the keys, once for every stream, before the first reads them
            nodes.extend(key_nodes)
        stream += 1
        nodes.extend(_seeded_normal_like(graph, node, keys, stream))
    graph.input.append(helper.make_tensor_value_info(seed_input, TensorProto.INT64, []))
    del graph.node[:]
    graph.node.extend(nodes)
    return stream


def _reject_other_random_ops(graph: onnx.GraphProto, nested: bool = False) -> None:
    for node in graph.node:
        if node.op_type in _RANDOM_OPS and (nested or node.op_type != "RandomNormalLike"):
            where = "inside a subgraph" if nested else "in the main graph"
            raise ValueError(
                f"node {node.name!r}: {node.op_type} {where} cannot be made deterministic"
            )
        for attr in node.attribute:
            for sub in [attr.g, *attr.graphs]:
                _reject_other_random_ops(sub, nested=True)


class _Builder(GraphBuilder):
    """The generator's nodes: uint64 rounds of squares and Box–Muller's floats."""

    def u64(self, value: int) -> str:
        return self.const(np.array(value % 2**64, dtype=np.uint64))

    def f32(self, value: float) -> str:
        return self.const(np.array(value, dtype=np.float32))

    def shift(self, x: str, bits: int, direction: str) -> str:
        return self.op("BitShift", x, self.u64(bits), direction=direction)

    def square_round(self, x: str, add: str) -> str:
        """``x = x*x + add``, then swap its 32-bit halves."""
        x = self.op("Add", self.op("Mul", x, x), add)
        return self.op("Add", self.shift(x, 32, "RIGHT"), self.shift(x, 32, "LEFT"))

    def squares(self, counter: str, key: str, rounds: int) -> str:
        """The state after squares' last ``x*x + z`` (squares32: rounds=4, squares64: 5)."""
        y = self.op("Mul", counter, key)
        z = self.op("Add", y, key)
        x = y
        for r in range(rounds - 1):
            x = self.square_round(x, y if r % 2 == 0 else z)
        return self.op("Add", self.op("Mul", x, x), z if rounds % 2 == 0 else y)

    def odd(self, x: str) -> str:
        """``x`` with its lowest bit set (squares needs an odd key)."""
        return self.op("Add", self.shift(self.shift(x, 1, "RIGHT"), 1, "LEFT"), self.u64(1))

    def uniform(self, counter: str, key: str) -> str:
        """squares32's top ``UNIFORM_BITS`` bits as float32 in [0, 1)."""
        bits = self.shift(self.squares(counter, key, rounds=4), 64 - UNIFORM_BITS, "RIGHT")
        return self.op(
            "Mul", self.op("Cast", bits, to=TensorProto.FLOAT), self.f32(2.0**-UNIFORM_BITS)
        )


def _stream_keys(
    graph: onnx.GraphProto, seed_input: str, streams: int
) -> tuple[list[onnx.NodeProto], str]:
    """The nodes that make every stream's key from the seed, once for all, and the vector they
    make: stream ``s``'s key is its element ``s - 1``."""
    b = _Builder(graph, "/speakd_noise_keys")
    # Two chained squares64 draws: one mixes the seed, one the stream, so no (seed, stream) pair
    # shares a key with another (seed + 1 must not reuse this seed's second stream).
    seed_key = b.odd(b.squares(b.op("Cast", seed_input, to=TensorProto.UINT64), b.u64(KEY), 5))
    numbers = b.const(np.arange(1, streams + 1, dtype=np.uint64))
    return b.nodes, b.odd(b.squares(numbers, seed_key, rounds=5))


def _seeded_normal_like(
    graph: onnx.GraphProto, node: onnx.NodeProto, keys: str, stream: int
) -> list[onnx.NodeProto]:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    b = _Builder(graph, f"/speakd_noise{stream}")
    x = node.input[0]
    key = b.op("Gather", keys, b.const(np.array(stream - 1, np.int64)), axis=0)

    index = b.op(
        "Range",
        b.const(np.array(0, np.int64)),
        b.op("Size", x),
        b.const(np.array(1, np.int64)),
    )
    counter0 = b.op("Mul", b.op("Cast", index, to=TensorProto.UINT64), b.u64(2))
    # two draws of the tensor's size, not one of twice its size in pairs: each round's operands
    # then stay in the core's cache (the prior noise is 192 values a frame; 1.7 ms more CPU)
    u0 = b.uniform(counter0, key)
    u1 = b.uniform(b.op("Add", counter0, b.u64(1)), key)
    # 1 - u0 lies in (0, 1], so the log is finite; |noise| <= sqrt(2·24·ln 2) ≈ 5.8.
    radius = b.op("Sqrt", b.op("Mul", b.op("Log", b.op("Sub", b.f32(1.0), u0)), b.f32(-2.0)))
    normal = b.op("Mul", radius, b.op("Cos", b.op("Mul", u1, b.f32(2.0 * math.pi))))

    scale, mean = float(attrs.get("scale", 1.0)), float(attrs.get("mean", 0.0))
    if scale != 1.0:
        normal = b.op("Mul", normal, b.f32(scale))
    if mean != 0.0:
        normal = b.op("Add", normal, b.f32(mean))
    dtype = attrs.get("dtype")
    if dtype is None:
        normal = b.op("CastLike", normal, x)  # RandomNormalLike's default: the input's dtype
    elif dtype != TensorProto.FLOAT:
        normal = b.op("Cast", normal, to=int(dtype))
    b.op("Reshape", normal, b.op("Shape", x), out=node.output[0])
    return b.nodes
