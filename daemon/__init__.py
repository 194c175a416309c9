"""speakd: an offline speech daemon for small boards (device runtime, import name ``speakd``)."""

__version__ = "0.1.0"
