"""The flow's coupling layers without the arithmetic that does nothing, and its gated
convolutions as one convolution per half.

Piper's flow (VITS's reverse normalising flow, 4 coupling layers of 4 WaveNet layers each) is 292
nodes for 40 convolutions. On a screen reader's first window (~57 frames) its convolutions are
short, so the other ~250 nodes cost a quarter of its time (docs/vits-engine.md, "Where a new
line's time goes"), and most of them compute nothing:

* ``x · y_mask`` (28 of them): the mask is all ones for one unpadded sentence, which is all the
  flow is ever given (``split.py`` feeds ones);
* ``x + zeros_like(x)`` and ``zeros + skip`` (20): WaveNet's conditioning ``g`` when the voice
  has no speaker input, and its skip sum's start; the 24 ``Shape`` → ``ConstantOfShape`` pairs
  that make those zeros;
* ``x · exp(−zeros)`` (4): the coupling's scale when the flow is ``mean_only``.

Each is an identity (``x · 1``, ``x + 0`` are exact in floating point), so the rewrite reads
through them. And each WaveNet layer's convolution makes 2·C channels that two ``Slice`` nodes cut
into the ``tanh`` and the ``sigmoid`` halves (the residual and skip halves likewise): a
convolution per half, with the halves of its weights, computes the same sums and needs no copy,
and onnxruntime then fuses each with its ``tanh`` or ``sigmoid``. 292 nodes become 156 (124
after onnxruntime's fusions); the flow's output is the same to the bit (tests/test_coupling.py).
"""

from __future__ import annotations

from collections import defaultdict

import onnx
from onnx import helper, numpy_helper


def simplify_flow(model: onnx.ModelProto, source: str, ones: str) -> tuple[int, int]:
    """Rewrite the flow ``model`` in place: ``source`` its [1, C, T] input, ``ones`` its [1, 1, T]
    input taken as all ones (and dropped once nothing reads it); returns (identities read through,
    convolutions split by their slices)."""
    identities = _read_through_identities(model.graph, source, ones)
    _drop_dead(model.graph)  # the zeros' Shape nodes, which read the convolutions too
    split = _split_sliced_convs(model.graph)
    _drop_dead(model.graph)
    return identities, split


def _read_through_identities(graph: onnx.GraphProto, source: str, ones: str) -> int:
    """``x · 1``, ``x + 0``, ``x − 0`` become ``x`` wherever the result has ``x``'s shape: ``x``
    is made from ``source`` ([1, C, T], as ``split.reach`` checked), and the constant is the
    [1, 1, T] mask or zeros shaped like a tensor made from ``source`` with C channels too."""
    zeros = {n.output[0]: n.input[0] for n in graph.node if _is_zeros(n)}  # → the Shape's output
    shape_of = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Shape"}
    unit = {ones}
    for n in graph.node:  # exp(−0) = 1: the mean-only coupling's scale
        if n.op_type == "Neg" and n.input[0] in zeros:
            zeros[n.output[0]] = zeros[n.input[0]]
        elif n.op_type == "Exp" and n.input[0] in zeros:
            unit.add(n.output[0])
    outputs = {o.name for o in graph.output}
    channels = _channels(graph, ones)
    timed = {source}  # [1, C, T]: made from the source (not only from a speaker's [1, C, 1])
    for n in graph.node:
        if any(i in timed for i in n.input) and n.op_type not in ("Shape", "ConstantOfShape"):
            timed.update(n.output)
    channels = {k: v for k, v in channels.items() if k in timed}
    alias: dict[str, str] = {}
    for n in graph.node:
        ins = [alias.get(i, i) for i in n.input]
        del n.input[:]
        n.input.extend(ins)
        if n.output[0] in outputs or len(ins) != 2:
            continue
        kept = _identity_operand(n, ins, unit, zeros, shape_of, timed, channels)
        if kept is not None:
            alias[n.output[0]] = kept
    if alias:
        nodes = [n for n in graph.node if n.output[0] not in alias]
        del graph.node[:]
        graph.node.extend(nodes)
    return len(alias)


def _identity_operand(
    n: onnx.NodeProto,
    ins: list[str],
    unit: set[str],
    zeros: dict[str, str],
    shape_of: dict[str, str],
    timed: set[str],
    channels: dict[str, int],
) -> str | None:
    """The operand ``n`` passes through unchanged, or None."""
    a, b = ins
    if n.op_type == "Mul" and b in unit and a in timed:
        return a  # the mask [1, 1, T] or exp(−0) broadcasts into any [1, C, T]
    if n.op_type == "Mul" and a in unit and b in timed:
        return b
    for x, z in ((a, b), (b, a)) if n.op_type == "Add" else ((a, b),) if n.op_type == "Sub" else ():
        shaped = shape_of.get(zeros.get(z, ""), "")
        if z in zeros and x in channels and channels.get(shaped) == channels[x]:
            return x
    return None


def _channels(graph: onnx.GraphProto, ones: str) -> dict[str, int]:
    """Output channels of the tensors whose count the graph fixes: a ``Conv``'s filters, a
    ``Slice`` of known channels along axis 1, and per-element ops on them. Every tensor of the
    flow is [1, C, T] with the one T (``split.reach`` refuses anything else), so two tensors of
    the same C have the same shape."""
    constants = {i.name: i for i in graph.initializer}
    channels = {ones: 1}  # the mask, [1, 1, T]
    shape_of = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Shape"}
    for n in graph.node:
        if _is_zeros(n) and shape_of.get(n.input[0]) in channels:  # zeros_like
            channels[n.output[0]] = channels[shape_of[n.input[0]]]
        elif n.op_type == "Conv" and n.input[1] in constants:
            channels[n.output[0]] = int(constants[n.input[1]].dims[0])
        elif n.op_type == "Slice" and n.input[0] in channels:
            r = _channel_range(n, constants, channels[n.input[0]])
            if r is not None:
                channels[n.output[0]] = r[1] - r[0]
        elif n.op_type in ("Add", "Sub", "Mul", "Tanh", "Sigmoid") and n.input[0] in channels:
            known = [channels[i] for i in n.input if i in channels]
            if len(known) == len(n.input):
                channels[n.output[0]] = max(known)
    return channels


def _is_zeros(n: onnx.NodeProto) -> bool:
    if n.op_type != "ConstantOfShape":
        return False
    values = [numpy_helper.to_array(a.t) for a in n.attribute if a.name == "value"]
    return not values or (values[0].size == 1 and float(values[0].reshape(-1)[0]) == 0.0)


def _split_sliced_convs(graph: onnx.GraphProto) -> int:
    """A ``Conv`` read only by ``Slice`` nodes that each take a constant range of its output
    channels becomes one ``Conv`` per slice, with that range of the weights and bias."""
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for n in graph.node:
        for i in n.input:
            readers[i].append(n)
    constants = {i.name: i for i in graph.initializer}
    outputs = {o.name for o in graph.output}
    replaced: dict[int, list[onnx.NodeProto]] = {}
    gone: set[int] = set()
    for conv in graph.node:
        if conv.op_type != "Conv" or conv.output[0] in outputs or conv.input[1] not in constants:
            continue
        slices = readers[conv.output[0]]
        ranges = [_channel_range(s, constants, constants[conv.input[1]].dims[0]) for s in slices]
        if not slices or None in ranges:
            continue
        parts = []
        for s, (lo, hi) in zip(slices, ranges, strict=True):  # type: ignore[misc]
            name = f"{conv.name}/speakd_channels_{lo}_{hi}"
            inits = [f"{name}/{k}" for k in ("W", "B")[: len(conv.input) - 1]]
            for source, init in zip(conv.input[1:], inits, strict=True):
                _rows(constants[source], lo, hi, graph.initializer.add(), init)
            part = helper.make_node("Conv", [conv.input[0], *inits], [s.output[0]], name=name)
            part.attribute.extend(conv.attribute)
            parts.append(part)
            gone.add(id(s))
        replaced[id(conv)] = parts
    nodes = []
    for n in graph.node:
        if id(n) in replaced:
            nodes.extend(replaced[id(n)])
        elif id(n) not in gone:
            nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)
    return len(replaced)


def _rows(t: onnx.TensorProto, lo: int, hi: int, into: onnx.TensorProto, name: str) -> None:
    """Rows [lo, hi) of ``t`` written into ``into``, a new initializer of the graph: from the raw
    bytes when torch's export stored them so (no float copies: the load's resident memory keeps
    what the heap once held, tests/test_vits_stream.py)."""
    if not t.HasField("raw_data"):
        into.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t)[lo:hi].copy(), name))
        return
    raw = t.raw_data
    row = len(raw) // t.dims[0]
    into.name, into.data_type, into.raw_data = name, t.data_type, raw[lo * row : hi * row]
    into.dims.extend([hi - lo, *t.dims[1:]])


def _channel_range(
    s: onnx.NodeProto, constants: dict[str, onnx.TensorProto], channels: int
) -> tuple[int, int] | None:
    """[lo, hi) of a ``Slice`` along axis 1 with constant starts and ends and step 1, else None."""
    if s.op_type != "Slice" or len(s.input) < 4 or any(i not in constants for i in s.input[1:]):
        return None
    starts, ends, axes, *steps = (numpy_helper.to_array(constants[i]).tolist() for i in s.input[1:])
    if axes != [1] or len(starts) != 1 or (steps and steps[0] != [1]):
        return None
    lo, hi = (max(0, min(v + channels if v < 0 else v, channels)) for v in (starts[0], ends[0]))
    return (lo, hi) if lo < hi else None


def _drop_dead(graph: onnx.GraphProto) -> None:
    """Remove nodes, initializers and inputs nothing reads any more."""
    needed = {o.name for o in graph.output}
    kept: list[onnx.NodeProto] = []
    for n in reversed(graph.node):
        if any(o in needed for o in n.output):
            kept.append(n)
            needed.update(n.input)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    for field in (graph.initializer, graph.input):  # in place: a copy of what stays would
        for i in reversed(range(len(field))):  # hold the weights twice while the graph lives
            if field[i].name not in needed:
                del field[i]
