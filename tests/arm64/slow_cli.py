"""``speakd`` for an emulated CPU: ``python tests/arm64/slow_cli.py synth TEXT -o OUT ...``.

The same ``speakd.cli.main`` with the same arguments, except that the engine guard's hang timeout
and real-time-factor limit are raised for ``speakd synth`` (``speakd serve`` takes them from its
config). Under qemu the embedded voice takes minutes where a board takes a second, and the
default guard (no audio for 30 s = a hung engine) would call that a hang. Nothing else changes:
the request goes through ``prepare`` and the resolver's stream as on a board.
"""

from __future__ import annotations

import functools
import sys

import speakd.request.resolver
from speakd.cli import main
from speakd.request.breaker import Guard

HANG_TIMEOUT_S = 3600.0
MAX_RTF = 1e6

if __name__ == "__main__":
    speakd.request.resolver.Guard = functools.partial(  # type: ignore[misc]
        Guard, hang_timeout_s=HANG_TIMEOUT_S, max_rtf=MAX_RTF
    )
    sys.exit(main(sys.argv[1:]))
