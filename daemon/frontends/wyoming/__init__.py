"""The Wyoming server Home Assistant speaks through: the server (``frontend``), one connection's
events and answers (``connection``), what a connection is asked to speak (``texts``), the events
read and written (``wire``), and the sentence splitter streamed text is cut with
(``sentences``)."""
