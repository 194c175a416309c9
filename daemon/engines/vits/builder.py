"""What the load-time graph rewrites share: a builder that appends nodes and initializers under
one name prefix, and the pruning of the nodes a rewrite left without readers.

``noise.py`` builds its generator with it, ``attention.py`` Piper's relative-position attention.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper


class GraphBuilder:
    """Appends nodes and initializers under one name prefix; ``op`` returns the output name."""

    def __init__(self, graph: onnx.GraphProto, prefix: str) -> None:
        self.graph = graph
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{self.prefix}/{hint}_{self._count}"

    def const(self, value: np.ndarray) -> str:
        name = self.name(f"const_{value.dtype}")
        self.graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    def ints(self, *values: int) -> str:
        """A 1-D int64 initializer (shapes, axes, pads)."""
        return self.const(np.array(values, np.int64))

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs: object) -> str:
        out = out or self.name(op_type)
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out


def prune_unread(graph: onnx.GraphProto, candidates: Iterable[onnx.NodeProto]) -> int:
    """Remove, in place, the ``candidates`` whose outputs nothing reads any more (no kept node,
    not the graph's outputs), repeatedly, so a chain a rewrite bypassed goes as a whole and a
    node something else still reads stays; returns how many went."""
    pending = {tuple(n.output): n for n in candidates}  # by outputs: protobuf copies nodes
    read = Counter(name for n in graph.node for name in n.input)
    read.update(o.name for o in graph.output)
    gone: set[tuple[str, ...]] = set()
    changed = True
    while changed:
        changed = False
        for key, node in list(pending.items()):
            if all(read[o] == 0 for o in node.output):
                read.subtract(node.input)
                gone.add(key)
                del pending[key]
                changed = True
    kept = [n for n in graph.node if tuple(n.output) not in gone]
    del graph.node[:]
    graph.node.extend(kept)
    return len(gone)
