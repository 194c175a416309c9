"""Benches of a real daemon (``speakd serve``) through its front-ends: the socket, SSIP, MQTT,
Wyoming, HTTP and the page; the SSML parser a request meets on the way in."""
