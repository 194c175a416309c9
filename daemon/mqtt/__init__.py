"""MQTT as speakd speaks it: the topics (``topics.py``), the messages and their JSON
(``messages.py``), the client with TLS, reconnect and the last will (``client.py``), the journal
of says taken but not yet finished (``journal/``), and the board's side of prompt packs rolled
out over MQTT (``packs.py``).

The daemon's front-end (``frontends/mqtt/frontend.py``), the remote speaker sink
(``sinks/mqtt_speaker.py``), ``speakd doctor``, ``speakd-tools pack`` (``speakd_tools.fleet``) and
``speakd-tools bench mqtt`` all import it. It knows nothing of requests, the scheduler or the
front-ends (tests/test_import_cycles.py holds it to that).
"""
