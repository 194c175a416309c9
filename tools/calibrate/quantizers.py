"""One function per scheme, each turning a float ONNX file into a quantized one.

* ``dynamic``: ``quantize_dynamic`` with ``DefaultTensorType FLOAT`` (graphs with com.microsoft
  ops have no type info for their outputs; docs/chattts.md, "Export traps") and
  ``MatMulConstBOnly`` so attention's activation × activation MatMuls stay float.
* ``rows``: int8 MatMuls with a scale per activation row (``rowquant``): batch-invariant, so
  stacked rows (batched steps, padded prompts, stacked vocoder windows) round as each alone.
* ``static``: ``quantize_static`` in QDQ format with a ``CalibrationDataReader`` fed by the real
  pipeline; MinMax / Entropy / Percentile ranges.
* ``int4``: ``MatMulNBitsQuantizer`` (4-bit weight-only, block-wise scales).
* ``weight_only``: int8 weights (symmetric, per output channel) behind a ``DequantizeLinear``,
  activations and compute float: a quarter of the bytes at float accuracy, for graphs whose int8
  activations hurt (vocoders) or whose ops have no fast int8 kernel.

Node selection is by op type plus ``include``/``exclude`` name prefixes, and every entry must
match a node of the graph, so a recipe that names a node that is not there fails before any work.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

from .errors import CalibrationError
from .recipe import GraphScheme
from .rowquant import quantize_file

log = logging.getLogger(__name__)

_QTYPE = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
_METHOD = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}


class IterReader(CalibrationDataReader):
    """Adapts a generator of feed dicts (produced lazily by the pipeline) to ORT's reader API.

    ORT runs each feed before asking for the next, so a generator may hand out views of live
    buffers. The reader is driven one feed per ``collect_data`` call (``CalibStridedMinMax`` = 1
    with ``set_range``): ORT's histogram calibrators (entropy, percentile) otherwise stack every
    feed's tensors into one array, which fails for variable-length inputs and holds them all in
    memory. ``length`` must be the number of feeds the generator yields.
    """

    def __init__(self, feeds: Iterable[dict[str, Any]], length: int) -> None:
        self._it: Iterator[dict[str, Any]] = iter(feeds)
        self._length = length
        self._left = length
        self.count = 0

    def __len__(self) -> int:
        return self._length

    def set_range(self, start_index: int, end_index: int) -> None:
        self._left = end_index - start_index

    def get_next(self) -> dict[str, Any] | None:
        if self._left <= 0:
            return None
        feed = next(self._it, None)
        if feed is not None:
            self.count += 1
            self._left -= 1
        return feed


def excluded_nodes(model: onnx.ModelProto, scheme: GraphScheme, where: str) -> list[str]:
    """Node names the scheme leaves float: those matching ``scheme.exclude`` plus, when
    ``scheme.include`` is set, every node matching none of its entries. An entry of either list
    that matches nothing is a recipe error."""
    names = [n.name for n in model.graph.node]
    skip = set(_matching(names, scheme.exclude, "exclude", where))
    if scheme.include:
        included = set(_matching(names, scheme.include, "include", where))
        skip.update(n for n in names if n not in included)
    return [n for n in names if n in skip]


def _matching(names: list[str], entries: tuple[str, ...], key: str, where: str) -> list[str]:
    out: list[str] = []
    for entry in entries:
        hits = [n for n in names if n == entry or (entry and n.startswith(entry))]
        if not hits:
            sample = ", ".join(n for n in names[:4] if n) or "(nodes are unnamed)"
            raise CalibrationError(
                f"{where}: {key} entry {entry!r} matches no node of the graph "
                f"(node names look like: {sample})"
            )
        out.extend(hits)
    return out


def selected_count(model: onnx.ModelProto, scheme: GraphScheme, excluded: list[str]) -> int:
    """How many nodes the scheme will touch (for the report; 0 is reported, not hidden)."""
    consts = {i.name for i in model.graph.initializer}
    skip = set(excluded)
    ops = ("MatMul",) if scheme.scheme == "int4" else scheme.op_types
    return sum(
        1
        for n in model.graph.node
        if n.op_type in ops
        and n.name not in skip
        and (n.op_type != "MatMul" or (len(n.input) > 1 and n.input[1] in consts))
    )


def quantize_graph(
    src: Path,
    dst: Path,
    scheme: GraphScheme,
    *,
    where: str,
    method: str = "minmax",
    feeds: Iterable[dict[str, Any]] | None = None,
    feed_count: int | None = None,
) -> dict[str, Any]:
    """Write ``dst`` from ``src`` per ``scheme``; return what was done (for the report).

    ``feeds`` (static only) yields ``feed_count`` input dicts (``len(feeds)`` for a list)."""
    model = onnx.load(str(src), load_external_data=False)
    excluded = excluded_nodes(model, scheme, where)
    touched = selected_count(model, scheme, excluded)
    info: dict[str, Any] = {
        "scheme": scheme.scheme,
        "how": scheme.describe(),
        "nodes_quantized": touched,
        "nodes_excluded": selected_count(model, scheme, []) - touched,  # of the op types
    }
    del model
    if scheme.why:
        info["why"] = scheme.why
    if scheme.scheme == "float" or touched == 0:
        if scheme.scheme != "float":
            log.warning(
                "%s: the recipe selects no node (%s); the graph stays float",
                where,
                "/".join(scheme.op_types),
            )
            info["note"] = "no node matched the recipe; graph kept float"
        dst.write_bytes(src.read_bytes())
        return info
    if scheme.scheme in ("dynamic", "static"):
        with tempfile.TemporaryDirectory(prefix="speakd-typed-") as typed_dir:
            typed = _with_types(src, Path(typed_dir))
            _int8(typed, dst, scheme, excluded, where, method, feeds, feed_count, info)
    elif scheme.scheme == "int4":
        _int4(src, dst, scheme, excluded)
    elif scheme.scheme == "rows":
        quantize_file(src, dst, set(excluded))
    elif scheme.scheme == "weight_only":
        _weight_only(src, dst, scheme, excluded)
    info["nodes_quantized"] = count_quantized(dst)
    info["bytes_in"] = src.stat().st_size
    info["bytes_out"] = dst.stat().st_size
    return info


QUANTIZED_OPS = {
    "MatMulInteger",
    "ConvInteger",
    "MatMulNBits",
    "QLinearConv",
    "QLinearMatMul",
    "DynamicQuantizeMatMul",
}


def count_quantized(path: Path) -> int:
    """Quantized nodes actually in the written graph: integer ops, plus weights behind a
    ``DequantizeLinear`` (QDQ and weight-only)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    consts = {i.name for i in graph.initializer}
    return sum(
        1
        for n in graph.node
        if n.op_type in QUANTIZED_OPS or (n.op_type == "DequantizeLinear" and n.input[0] in consts)
    )


def _with_types(src: Path, tmp: Path) -> Path:
    """``src`` with every tensor's type annotated when it holds com.microsoft ops.

    ONNX's own shape inference does not know contrib ops (GroupQueryAttention,
    SkipSimplifiedLayerNormalization), so everything after them has no type and ORT's quantizer
    skips those MatMuls ("failed to infer the type of tensor"); ORT's symbolic shape inference
    knows them."""
    model = onnx.load(str(src))
    if not any(n.domain == "com.microsoft" for n in model.graph.node):
        return src
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    typed = SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    out = tmp / src.name
    onnx.save(typed, str(out))
    return out


def _int8(
    src: Path,
    dst: Path,
    scheme: GraphScheme,
    excluded: list[str],
    where: str,
    method: str,
    feeds: Iterable[dict[str, Any]] | None,
    feed_count: int | None,
    info: dict[str, Any],
) -> None:
    if scheme.scheme == "dynamic":
        quantize_dynamic(
            src,
            dst,
            op_types_to_quantize=list(scheme.op_types),
            per_channel=scheme.per_channel,
            weight_type=_QTYPE[scheme.weight_type],
            nodes_to_exclude=excluded,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT, "MatMulConstBOnly": True},
        )
    elif scheme.scheme == "static":
        if feeds is None:
            raise CalibrationError(f"{where}: static quantization needs calibration data")
        count = feed_count if feed_count is not None else len(feeds)  # type: ignore[arg-type]
        if count < 1:
            raise CalibrationError(f"{where}: the calibration data reader produced no input")
        reader = IterReader(feeds, count)
        extra = {
            "DefaultTensorType": onnx.TensorProto.FLOAT,
            "MatMulConstBOnly": True,
            "ActivationSymmetric": scheme.activation_symmetric,
            "WeightSymmetric": scheme.weight_symmetric,
            "CalibStridedMinMax": 1,  # one feed per collect (see IterReader)
        }
        quantize_static(
            src,
            dst,
            reader,
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(scheme.op_types),
            per_channel=scheme.per_channel,
            activation_type=_QTYPE[scheme.activation_type],
            weight_type=_QTYPE[scheme.weight_type],
            nodes_to_exclude=excluded,
            calibrate_method=_METHOD[method],
            extra_options=extra,
            calibration_providers=["CPUExecutionProvider"],
        )
        if reader.count != count:
            raise CalibrationError(
                f"{where}: the calibration data reader yielded {reader.count} "
                f"inputs, {count} expected"
            )
        info["calibration_feeds"] = reader.count
        info["method"] = method


def _weight_only(src: Path, dst: Path, scheme: GraphScheme, excluded: list[str]) -> None:
    import numpy as np
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    skip, done = set(excluded), set()
    dq_nodes = []
    for node in graph.node:
        weight = node.input[1] if len(node.input) > 1 else ""
        if node.op_type not in scheme.op_types or node.name in skip or weight not in inits:
            continue
        if weight in done:
            continue
        w = numpy_helper.to_array(inits[weight]).astype(np.float32)
        # output channels: Conv (out, in, k), ConvTranspose (in, out, k), MatMul (in, out)
        axis = {"Conv": 0, "ConvTranspose": 1}.get(node.op_type, w.ndim - 1)
        reduce = tuple(d for d in range(w.ndim) if d != axis)
        scale = np.maximum(np.abs(w).max(axis=reduce), 1e-12) / 127.0
        shape = [1] * w.ndim
        shape[axis] = -1
        q = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8)
        graph.initializer.remove(inits[weight])
        graph.initializer.extend(
            [
                numpy_helper.from_array(q, f"{weight}_q8"),
                numpy_helper.from_array(scale.astype(np.float32), f"{weight}_scale"),
                numpy_helper.from_array(np.zeros_like(scale, np.int8), f"{weight}_zp"),
            ]
        )
        dq_nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [f"{weight}_q8", f"{weight}_scale", f"{weight}_zp"],
                [weight],
                name=f"{weight}_DequantizeLinear",
                axis=axis,
            )
        )
        done.add(weight)
    nodes = dq_nodes + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, str(dst))


def _int4(src: Path, dst: Path, scheme: GraphScheme, excluded: list[str]) -> None:
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    model = onnx.load(str(src))
    config = DefaultWeightOnlyQuantConfig(
        block_size=scheme.block_size,
        is_symmetric=scheme.symmetric,
        accuracy_level=scheme.accuracy_level,
        bits=4,
    )
    q = MatMulNBitsQuantizer(
        model,
        bits=4,
        block_size=scheme.block_size,
        is_symmetric=scheme.symmetric,
        accuracy_level=scheme.accuracy_level,
        nodes_to_exclude=excluded,
        algo_config=config,
    )
    q.process()
    onnx.save(q.model.model, str(dst))
