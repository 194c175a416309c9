"""Recipes: ``calibration/recipes/<engine>.toml`` says, per mode and per graph, what is quantized
and how, and what stays float and why. Parsed once into frozen dataclasses; any unknown key or bad
value is refused with the file and key named (a typo must not silently quantize something else).
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import CalibrationError

REPO_RECIPES = Path(__file__).resolve().parents[2] / "calibration" / "recipes"
SCHEMES = ("float", "dynamic", "rows", "static", "int4", "weight_only")
METHODS = ("minmax", "entropy", "percentile")
INT_TYPES = ("int8", "uint8")


@dataclass(frozen=True)
class GraphScheme:
    """How one graph is quantized in one mode.

    ``op_types``/``include``/``exclude`` select nodes: an entry matches node names equal to it or
    starting with it, and must match at least one node (checked against the graph). An empty
    ``include`` means every node of ``op_types``; ``exclude`` wins over ``include``.
    """

    scheme: str = "float"
    op_types: tuple[str, ...] = ("MatMul",)
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    per_channel: bool = True
    weight_type: str = "int8"
    activation_type: str = "uint8"
    weight_symmetric: bool = True
    activation_symmetric: bool = False
    block_size: int = 256  # int4 (MatMulNBits)
    accuracy_level: int = 4  # int4: 4 = int8 compute (fast); 0/1 = fp32 compute
    symmetric: bool = True  # int4
    why: str = ""

    def describe(self) -> str:
        if self.scheme == "float":
            return "float32"
        if self.scheme == "weight_only":
            return (
                f"int8 weight-only {'/'.join(self.op_types)} (per-channel symmetric, float compute)"
            )
        if self.scheme == "int4":
            sym = "symmetric" if self.symmetric else "asymmetric"
            return (
                f"4-bit weight-only MatMulNBits, block {self.block_size}, {sym}, "
                f"accuracy_level {self.accuracy_level}"
            )
        if self.scheme == "rows":
            return (
                "int8 MatMul, per-channel weights, a scale per activation row (exact int32 sums:"
                " a row's result does not depend on the rows beside it)"
            )
        chan = "per-channel" if self.per_channel else "per-tensor"
        ops = "/".join(self.op_types)
        if self.scheme == "dynamic":
            return (
                f"dynamic int8 {ops} ({chan} {self.weight_type} weights, activations at run time)"
            )
        act = "symmetric" if self.activation_symmetric else "asymmetric"
        return (
            f"static QDQ {ops} ({chan} {self.weight_type} weights, {act} "
            f"{self.activation_type} activations from calibration)"
        )


@dataclass(frozen=True)
class Mode:
    name: str
    precision: str  # what the manifest says the GPT/voice runs: int8 | int4
    graphs: dict[str, GraphScheme]
    kv_int8: bool = False  # ChatTTS: int8 KV cache with per-layer scales measured on the corpus
    why: str = ""

    @property
    def needs_calibration(self) -> bool:
        return any(g.scheme == "static" for g in self.graphs.values())


@dataclass(frozen=True)
class Recipe:
    engine: str
    path: Path
    sha256: str
    default_mode: str
    method: str
    calibration_sentences: int
    eval_sentences: int
    graphs: dict[str, str]  # graph name -> file inside the bundle
    modes: dict[str, Mode]
    bounds: dict[str, float]
    options: dict[str, Any] = field(default_factory=dict)  # engine-specific knobs
    raw: dict[str, Any] = field(default_factory=dict)

    def mode(self, name: str | None) -> Mode:
        name = name or self.default_mode
        if name not in self.modes:
            raise CalibrationError(
                f"{self.path}: no mode {name!r} (modes: {', '.join(self.modes)})"
            )
        return self.modes[name]


_TOP = {
    "engine",
    "default_mode",
    "method",
    "calibration_sentences",
    "eval_sentences",
    "graphs",
    "modes",
    "bounds",
    "options",
    "why",
}
_MODE_KEYS = {"precision", "kv_int8", "why"}


def default_recipe_path(engine: str) -> Path:
    return REPO_RECIPES / f"{engine}.toml"


def load_recipe(path: Path) -> Recipe:
    path = Path(path)
    try:
        data = path.read_bytes()
        raw = tomllib.loads(data.decode("utf-8"))
    except FileNotFoundError:
        raise CalibrationError(f"{path}: recipe file missing") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise CalibrationError(f"{path}: unreadable recipe: {e}") from e
    where = str(path)
    _no_unknown(raw, _TOP, where)
    for key in ("engine", "default_mode", "graphs", "modes"):
        if key not in raw:
            raise CalibrationError(f"{where}: missing key {key!r}")
    graphs = {str(k): str(v) for k, v in raw["graphs"].items()}
    method = str(raw.get("method", "minmax"))
    _choice(f"{where}: method", method, METHODS)
    modes = {
        name: _mode(name, body, graphs, f"{where}: modes.{name}")
        for name, body in raw["modes"].items()
    }
    recipe = Recipe(
        engine=str(raw["engine"]),
        path=path,
        sha256=hashlib.sha256(data).hexdigest(),
        default_mode=str(raw["default_mode"]),
        method=method,
        calibration_sentences=int(raw.get("calibration_sentences", 16)),
        eval_sentences=int(raw.get("eval_sentences", 8)),
        graphs=graphs,
        modes=modes,
        bounds={str(k): float(v) for k, v in raw.get("bounds", {}).items()},
        options=dict(raw.get("options", {})),
        raw=raw,
    )
    recipe.mode(None)  # default_mode must exist
    return recipe


def _mode(name: str, body: dict[str, Any], graphs: dict[str, str], where: str) -> Mode:
    if not isinstance(body, dict):
        raise CalibrationError(f"{where}: must be a table")
    _no_unknown(body, _MODE_KEYS | set(graphs), where)
    precision = str(body.get("precision", "int8"))
    _choice(f"{where}.precision", precision, ("int8", "int4"))
    schemes = {g: _scheme(body.get(g, {}), f"{where}.{g}") for g in graphs}
    if all(s.scheme == "float" for s in schemes.values()):
        raise CalibrationError(f"{where}: every graph is float; nothing to quantize")
    return Mode(
        name, precision, schemes, bool(body.get("kv_int8", False)), str(body.get("why", ""))
    )


def _scheme(body: dict[str, Any], where: str) -> GraphScheme:
    known = {f.name for f in fields(GraphScheme)}
    _no_unknown(body, known, where)
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in body.items()}
    scheme = GraphScheme(**values)
    _choice(f"{where}.scheme", scheme.scheme, SCHEMES)
    _choice(f"{where}.weight_type", scheme.weight_type, INT_TYPES)
    _choice(f"{where}.activation_type", scheme.activation_type, INT_TYPES)
    if scheme.scheme == "int4" and scheme.block_size not in (16, 32, 64, 128, 256):
        raise CalibrationError(f"{where}.block_size: {scheme.block_size} (16…256, power of 2)")
    if not scheme.op_types:
        raise CalibrationError(f"{where}.op_types: empty")
    return scheme


def _no_unknown(body: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise CalibrationError(
            f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )


def _choice(where: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise CalibrationError(f"{where} = {value!r}; use one of {', '.join(allowed)}")
