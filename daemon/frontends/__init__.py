"""The front-ends: a protocol's frames become request fields, ``Control``'s events its replies.

One sub-package per protocol of several modules (``ssip/``, ``http/``, ``wyoming/``, ``mqtt/``),
each with the class the daemon starts in its ``frontend.py``; the JSON lines protocol is one
module (``jsonlines.py``); ``unixserver.py`` is what more than one protocol shares (the Unix
socket server JSON lines and SSIP are served on, who may connect, the listen backlog).
"""
