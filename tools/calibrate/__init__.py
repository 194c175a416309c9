"""``speakd-tools calibrate``: quantized bundles driven by the corpus in ``calibration/``.

One entry point (``pipeline.calibrate``) takes a float bundle (ChatTTS, a VITS bundle, a Piper
``.onnx`` or the embedded voice), a recipe (``calibration/recipes/<engine>.toml``) and a mode, and
writes a bundle that the daemon loads, with a quality report against the float bundle in the
manifest and in ``report/`` (JSON, Markdown, PNG).
"""

from .errors import CalibrationError

__all__ = ["CalibrationError"]
