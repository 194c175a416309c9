"""The MQTT front-end: Hermes and speakd's topics turned into ``Control`` calls (``frontend``),
the says journaled, queued and acknowledged in order (``says``). The wire format, the client and
the prompt packs are ``speakd.mqtt``'s."""
