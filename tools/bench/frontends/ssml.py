"""SSML bench: how long the parser takes to read a document, and to refuse the XML attacks.

    speakd-tools bench ssml [--repeat 200] [--sentences 20] [--no-bandwidth] [--json]

Each case is ``speakd.markup.ssml.parse_ssml`` called ``--repeat`` times in this process (the
daemon calls the same function on its event loop, in ``Control.build_request``); the time is
wall-clock per call, p50/p99/max:

- ``document``: ``--sentences`` sentences, each with a break, a mark and a ``<say-as>`` number;
- ``billion laughs``: ten levels of entities, 10**9 "lol"s if it were expanded;
- ``quadratic blowup``: one 10 kB entity referenced 10 000 times (100 MB expanded);
- ``nested``: 10 000 ``<p>`` deep.

Prints a Markdown table that starts with the machine line (``machine.py``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from speakd.markup.ssml import parse_ssml
from speakd.request.messages import RequestError

from ..harness.machine import describe
from ..harness.machine import line as machine_line
from ..harness.stats import loadavg, summary


def documents(sentences: int) -> dict[str, str]:
    laughs = '<!ENTITY lol "lol">' + "".join(
        f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">'
        for i in range(1, 10)
    )
    sentence = (
        '<s>Door <break time="700ms"/> open<mark name="m{i}"/>, floor '
        '<say-as interpret-as="cardinal">{i}</say-as>.</s>'
    )
    said = "".join(sentence.format(i=i) for i in range(sentences))
    return {
        "document": f"<speak>{said}</speak>",
        "billion laughs": f"<!DOCTYPE speak [{laughs}]><speak>&lol9;</speak>",
        "quadratic blowup": '<!DOCTYPE speak [<!ENTITY a "'
        + "a" * 10_000
        + '">]><speak>'
        + "&a;" * 10_000
        + "</speak>",
        "nested": "<speak>" + "<p>" * 10_000 + "x" + "</p>" * 10_000 + "</speak>",
    }


def time_parse(document: str, repeat: int) -> tuple[list[float], str]:
    """Milliseconds per call, and what the parser said (segments or the refusal's code)."""
    times, outcome = [], ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        try:
            outcome = f"{len(parse_ssml(document))} segments"
        except RequestError as e:
            outcome = e.code
        times.append((time.perf_counter() - t0) * 1000)
    return times, outcome


def measure(args: argparse.Namespace) -> dict[str, Any]:
    cases = {}
    for name, document in documents(args.sentences).items():
        times, outcome = time_parse(document, args.repeat)
        cases[name] = {"chars": len(document), "outcome": outcome, "ms": summary(times, 4)}
    return {
        "repeat": args.repeat,
        "cases": cases,
        "loadavg": loadavg(),
        "machine": describe(not args.no_bandwidth),
    }


def table(result: dict[str, Any]) -> str:
    rows = [
        machine_line(result["machine"]),
        f"Load average {result['loadavg']}; {result['repeat']} calls per case.",
        "",
        "| case | characters | outcome | p50 ms | p99 ms | max ms |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for name, case in result["cases"].items():
        ms = case["ms"]
        rows.append(
            f"| {name} | {case['chars']:,} | {case['outcome']} | {ms['p50']} | {ms['p99']} "
            f"| {ms['max']} |"
        )
    return "\n".join(rows)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeat", type=int, default=200, help="calls per case")
    p.add_argument("--sentences", type=int, default=20, help="sentences in the document case")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the DRAM bandwidth probe")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
