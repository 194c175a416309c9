"""Clients run inside a container's network namespace (``nsenter --net``) by tests/test_image.py:
the ``wyoming`` library's client synthesizes through port 10200 and the ``openai`` SDK through the
HTTP port, as Home Assistant and an OpenAI client would. Prints one JSON line of what came back.

    python -m tests.image_clients WYOMING_PORT HTTP_PORT TOKEN TEXT
    python -m tests.image_clients supervisor PORT OUT   # a stand-in Supervisor for the add-on
"""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import sys
import time

import openai
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize


def wait_for_port(port: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


async def wyoming_synthesize(port: int, text: str) -> dict[str, int]:
    async with AsyncTcpClient("127.0.0.1", port, read_timeout=120) as client:
        await client.write_event(Synthesize(text).event())
        rate, pcm = 0, 0
        while (event := await client.read_event()) is not None:
            if AudioStart.is_type(event.type):
                rate = AudioStart.from_event(event).rate
            elif AudioChunk.is_type(event.type):
                pcm += len(AudioChunk.from_event(event).audio)
            elif AudioStop.is_type(event.type):
                break
    return {"rate": rate, "pcm_bytes": pcm}


def openai_speech(port: int, token: str, text: str) -> dict[str, object]:
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key=token, max_retries=0, timeout=120
    )
    reply = client.audio.speech.with_raw_response.create(
        model="speakd", voice="default", input=text, response_format="wav"
    )
    body = reply.content
    cache = reply.headers.get("X-Speakd-Cache")
    return {"wav_bytes": len(body), "riff": body[:4] == b"RIFF", "cache": cache}


def supervisor(port: int, out: str) -> None:
    """Answer one ``POST /discovery`` as the Supervisor does, and write what came to ``out``."""

    class Discovery(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen = {"path": self.path, "auth": self.headers["Authorization"], "body": body.decode()}
            with open(out, "w") as f:
                json.dump(seen, f)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"result": "ok", "data": {"uuid": "0"}}')

    with http.server.HTTPServer(("127.0.0.1", port), Discovery) as server:
        server.handle_request()


def main() -> None:
    if sys.argv[1] == "supervisor":
        supervisor(int(sys.argv[2]), sys.argv[3])
        return
    wyoming_port, http_port, token, text = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:5]
    wait_for_port(wyoming_port)
    wait_for_port(http_port)
    result = {
        "wyoming": asyncio.run(wyoming_synthesize(wyoming_port, text)),
        "openai": openai_speech(http_port, token, text),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
