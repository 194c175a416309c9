"""The HTTP API on aiohttp: the app and its server (``frontend``), what every route shares
(``base``), OpenAI's speech API (``openai``), speakd's own ops (``speakd``) and the installer's
page (``page``)."""
