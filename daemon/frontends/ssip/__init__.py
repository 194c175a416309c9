"""Speech Dispatcher's protocol (SSIP) on the Unix socket, for spd-say, Orca and other
libspeechd clients: framing (``parser``), a client's settings (``settings``) and state
(``connection``), the commands (``commands``), the server (``frontend``) and the key-echo
prewarm (``keys``)."""
