"""The Wyoming server Home Assistant speaks through: the server (``frontend``), the events read
and written (``wire``), and the sentence splitter streamed text is cut with (``sentences``)."""
