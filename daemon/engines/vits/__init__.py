"""Piper-format VITS voices (engine kind ``vits``): the voice and its synthesis (``engine.py``),
what a request resolves to (``params.py``), its files and graph (``graph.py``, rewritten at load by
``noise.py`` and ``layernorm.py``), the graph split for streaming (``split.py``), text to phonemes
(``text.py``) and word timings (``words.py``).
"""
