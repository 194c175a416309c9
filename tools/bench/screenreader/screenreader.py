"""A screen reader's SSIP traffic, replayed against speakd and Speech Dispatcher + espeak-ng.

    speakd-tools bench screenreader [--quick] [--only speakd|speechd] [--json]

What Orca sends, in its order (``ssip_session.py`` is the client): once ``CLIENT_NAME``,
``HISTORY GET CLIENT_ID``, ``NOTIFICATION … on``, ``PRIORITY message``, ``SSML_MODE on``; before
every utterance ``RATE``/``PITCH``/``VOLUME``/``LANGUAGE`` (``PITCH 10``, 50 for a capital); each
key echo is ``CANCEL self`` then ``SPEAK`` of the key as Orca 43 sends it (``<speak><mark
name="0:1"/>t </speak>``), typed at 700 ms and at 100 ms per key; arrows are ``CHAR``; say-all
is a paragraph with a ``<mark/>`` before every word, interrupted by ``CANCEL self``; last, the
same sentences with and without marks, each heard to its end.

Measured on the client, ``time.monotonic()``: keypress (the instant before ``CANCEL self``) →
that key's ``701 BEGIN``; ``CANCEL`` → ``703 CANCELED`` of the message it stopped (when one was
playing); BEGIN → END of a marked sentence over the unmarked one. Both contenders play in real
time, or BEGIN/CANCEL mean nothing: speakd into its realtime-paced WAV sink; Speech Dispatcher
(``speech-dispatcher``, ``speech-dispatcher-espeak-ng``) through ``AudioOutputMethod "pulse"``
into a private PulseAudio (``pulseaudio``) with a null sink (ALSA's and libao's null devices do
not pace). A contender that cannot start is reported missing, never faked (``contenders.py``
starts them).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engine import floor
from ..harness import loopstall
from ..harness.machine import describe
from ..harness.machine import line as machine_line
from ..harness.stats import loadavg, summary
from .contenders import CONTENDERS
from .daemon_parts import parts_table
from .screenreader_nav import (
    PACE_S,
    FirstAudio,
    NavTrial,
    Spoken,
    Texts,
    fresh,
)
from .screenreader_nav import samples as nav_samples
from .ssip_session import SsipSession

SETUP = (
    "SET self CLIENT_NAME unknown:Orca:default",
    "HISTORY GET CLIENT_ID",
    *(
        f"SET self NOTIFICATION {kind} on"
        for kind in ("index_marks", "begin", "end", "cancel", "pause", "resume")
    ),
    "SET self PRIORITY message",
    "SET self SSML_MODE on",
)
# Orca's SET self PITCH: 20 × its voice's average-pitch − 90, 5 by default and 7 for uppercase.
ORCA_PITCH, ORCA_PITCH_UPPER = 10, 50
TYPED = "the quick brown fox jumps over the lazy dog"
ARROWS = "hello world"
SAY_ALL = (
    "Say all reads the whole document from the caret onwards, one sentence after another, "
    "until a key stops it."
)
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Name: text field, type in your full name.",
    "Orca is reading this sentence with a mark before every word.",
)


@dataclass
class Options:
    quick: bool = False
    only: str = ""
    phase: str = "all"  # all, keys (typing, arrows, say-all, durations) or nav (new text)
    seed: int = field(default_factory=lambda: int.from_bytes(os.urandom(4), "little"))
    nav_rounds: int = 0  # the navigation phase's rounds (0: as many as the script's)
    nav_pitch: int = ORCA_PITCH  # the navigation phase's SSIP PITCH
    nav_texts: int = 0  # new lines and menu items each per round (0: 20, 3 with quick)
    floor: bool = False  # also bench floor's parts and floors on the same texts

    def texts(self) -> Texts:
        """The navigation phase's new text, the same for every contender of the run."""
        n, each = self.rounds, self.nav_texts or (3 if self.quick else 20)
        return fresh(self.seed, each * n, each * n, max(1, each * 3 // 20) * n)

    @property
    def typed(self) -> str:
        return TYPED[:9] if self.quick else TYPED

    @property
    def rounds(self) -> int:
        return self.nav_rounds or (1 if self.quick else 3)


@dataclass
class Trial:
    """One contender's samples, in ms (ratios unitless)."""

    begin_700: list[float] = field(default_factory=list)
    begin_100: list[float] = field(default_factory=list)
    begin_char: list[float] = field(default_factory=list)
    canceled: list[float] = field(default_factory=list)
    marked_ms: list[float] = field(default_factory=list)
    unmarked_ms: list[float] = field(default_factory=list)
    marks_before_begin: int = 0
    marked_messages: int = 0
    echoes: list[tuple[float, str]] = field(default_factory=list)  # (ms, which key), for the tail
    nav: NavTrial = field(default_factory=NavTrial)
    server: dict[str, Any] = field(default_factory=dict)  # FirstAudio.figures


def marked(text: str) -> str:
    """Orca's SSML: a ``<mark name="start:end"/>`` before every word."""
    out, pos = [], 0
    for word in text.split(" "):
        out.append(f'<mark name="{pos}:{pos + len(word)}"/>{word}')
        pos += len(word) + 1
    return "<speak>" + " ".join(out) + "</speak>"


def orca_key_ssml(key: str) -> str:
    """Orca's SPEAK for a typed key: its name and locking state ("t "), a mark on the word."""
    return f'<speak><mark name="0:{len(key)}"/>{key} </speak>'


def voice(s: SsipSession, pitch: int = ORCA_PITCH) -> None:
    """What Orca sets before nearly every utterance (its uppercase voice: a higher pitch)."""
    for line in ("RATE 0", f"PITCH {pitch}", "VOLUME 100", "LANGUAGE en", "LANGUAGE en-US"):
        s.command(f"SET self {line}")


class Replay:
    """The script on one connection; ``playing`` is the last message not yet ended."""

    def __init__(self, s: SsipSession, trial: Trial) -> None:
        self.s, self.trial, self.playing = s, trial, ""

    def key(self, say: Any, samples: list[float], label: str, pitch: int = ORCA_PITCH) -> str:
        """One keypress: CANCEL self (timing the stopped message's 703), the voice, the echo;
        ``label`` names it among the slowest."""
        t0 = time.monotonic()
        stopped = self.playing if self.playing and not self.s.finished(self.playing) else ""
        self.s.command("CANCEL self")
        voice(self.s, pitch)
        msg_id = say()
        _, at = self.s.wait(msg_id, "701")
        samples.append((at - t0) * 1000)
        self.trial.echoes.append((samples[-1], f"{label}{' (stopped one)' if stopped else ''}"))
        if stopped:
            code, end = self.s.wait(stopped, "703", "702")
            if code == "703":
                self.trial.canceled.append((end - t0) * 1000)
        self.playing = msg_id
        return msg_id

    def typing(self, text: str, every_s: float, samples: list[float]) -> None:
        for c in text:
            t0 = time.monotonic()
            echo = "space" if c == " " else c
            label = f"SPEAK {echo!r} @{every_s * 1000:.0f} ms"
            pitch = ORCA_PITCH_UPPER if c.isupper() else ORCA_PITCH
            self.key(lambda e=echo: self.s.speak(orca_key_ssml(e)), samples, label, pitch)
            time.sleep(max(0.0, t0 + every_s - time.monotonic()))

    def arrows(self, text: str, every_s: float) -> None:
        for c in text:
            t0 = time.monotonic()
            char = "space" if c == " " else c
            self.key(lambda c=char: self.s.char(c), self.trial.begin_char, f"CHAR {char!r}")
            time.sleep(max(0.0, t0 + every_s - time.monotonic()))

    def say_all(self, after_marks: int) -> None:
        """Say-all, interrupted by a key after ``after_marks`` marks (or 0.5 s of speech)."""
        voice(self.s)
        msg_id = self.s.speak(marked(SAY_ALL))
        self.s.wait(msg_id, "701")
        with self.s.changed:
            self.s.changed.wait_for(
                lambda: len(self.s.messages[msg_id].marks) >= after_marks, timeout=0.5
            )
        self.playing = msg_id
        self.key(lambda: self.s.speak(orca_key_ssml("down")), [], "SPEAK 'down' in say-all")
        self.settle()

    def durations(self, text: str) -> None:
        """The sentence unmarked then marked, each to its END: BEGIN → END in ms."""
        for body, out in ((f"<speak>{text}</speak>", self.trial.unmarked_ms), (marked(text), None)):
            voice(self.s)
            msg_id = self.s.speak(body)
            _, begin = self.s.wait(msg_id, "701")
            _, end = self.s.wait(msg_id, "702", "703", timeout=60)
            (out if out is not None else self.trial.marked_ms).append((end - begin) * 1000)
            if out is None:
                msg = self.s.messages[msg_id]
                self.trial.marked_messages += 1
                self.trial.marks_before_begin += msg.order.index("701") > 0
        self.playing = ""

    def navigate(self, phase: str, texts: tuple[str, ...], pitch: int) -> None:
        """Arrowing onto new lines or menu items, or say-all's first sentence: CANCEL self, the
        voice, the marked text; each heard to its end (``screenreader_nav``)."""
        for text in texts:
            self.s.command("CANCEL self")
            voice(self.s, pitch)
            sent = time.monotonic()
            msg_id = self.s.speak(marked(text))
            _, begin = self.s.wait(msg_id, "701")
            _, end = self.s.wait(msg_id, "702", "703", timeout=60)
            self.trial.nav.spoken.append(Spoken(phase, text, msg_id, sent, begin, end))
            time.sleep(PACE_S)

    def settle(self) -> None:
        """Let the last message end (or stop it) so the next phase starts on a quiet server."""
        if self.playing:
            self.s.command("CANCEL self")
            self.s.wait(self.playing, "702", "703")
            self.playing = ""


def replay(path: str, audio: FirstAudio, opts: Options) -> Trial:
    """The whole script once on a fresh connection to the SSIP socket at ``path``; ``audio``
    finds each new text's first audio."""
    trial = Trial()
    texts = opts.texts()
    s = SsipSession(path)
    try:
        for line in SETUP:
            s.command(line)
        r = Replay(s, trial)
        r.durations(SENTENCES[0])  # warm-up: models loaded, first audio out; not counted
        trial.marked_ms.clear()
        trial.unmarked_ms.clear()
        trial.marked_messages = trial.marks_before_begin = 0
        audio.mark()
        for n in range(opts.rounds):
            if opts.phase in ("all", "keys"):
                r.typing(opts.typed, 0.7, trial.begin_700)
                r.settle()
                r.typing(opts.typed, 0.1, trial.begin_100)
                r.settle()
                r.arrows(ARROWS, 0.3)
                r.settle()
                for after in (2, 5):
                    r.say_all(after)
                for text in SENTENCES[: 1 if opts.quick else None]:
                    r.durations(text)
            if opts.phase in ("all", "nav"):
                for phase, all_texts in (
                    ("line", texts.lines),
                    ("menu", texts.menu),
                    ("say_all", texts.say_all),
                ):
                    share = len(all_texts) // opts.rounds
                    r.navigate(phase, all_texts[n * share : (n + 1) * share], opts.nav_pitch)
        for m in trial.nav.spoken:
            trial.nav.first[m.msg_id] = audio.first_audio(m)
        trial.server = audio.figures(trial.nav)
    finally:
        s.close()
    return trial


def results(trial: Trial) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("begin_700", "begin_100", "begin_char", "canceled"):
        samples = getattr(trial, name)
        out[name] = summary(samples) if samples else None
    for name, phases, first, _ in NAV_ROWS:
        samples = nav_samples(trial.nav, phases, first)
        out[name] = summary(samples) if samples else None
    out["nav_silent"] = sum(at is None for at in trial.nav.first.values())
    if trial.unmarked_ms:
        out["marked_ratio"] = round(sum(trial.marked_ms) / sum(trial.unmarked_ms), 3)
    out["marks_before_begin"] = [trial.marks_before_begin, trial.marked_messages]
    out["slowest"] = [[round(ms, 1), what] for ms, what in sorted(trial.echoes, reverse=True)[:5]]
    out.update(trial.server)
    return out


NEW = ("line", "menu")
NAV_ROWS = (  # key, phases, to first audio (else to 701), label
    ("nav_begin", NEW, False, "new line or menu item: SPEAK → 701 BEGIN"),
    ("nav_first", NEW, True, "new line or menu item: SPEAK → first audio"),
    ("line_first", ("line",), True, "… new line alone: SPEAK → first audio"),
    ("menu_first", ("menu",), True, "… menu item alone: SPEAK → first audio"),
    ("say_all_begin", ("say_all",), False, "say-all's first sentence: SPEAK → 701 BEGIN"),
    ("say_all_first", ("say_all",), True, "say-all's first sentence: SPEAK → first audio"),
)
NAV_LABELS = tuple((key, label) for key, _, _, label in NAV_ROWS)
ROWS = (
    ("begin_700", "keypress → 701 BEGIN, 700 ms/key"),
    ("begin_100", "keypress → 701 BEGIN, 100 ms/key"),
    ("begin_char", "arrow (CHAR) → 701 BEGIN"),
    ("canceled", "CANCEL → 703 CANCELED"),
)


def measure(opts: Options) -> dict[str, Any]:
    out: dict[str, Any] = {"options": vars(opts), "loadavg_start": loadavg(), "contenders": {}}
    for name, start in CONTENDERS.items():
        if opts.only and name != opts.only:
            continue
        with tempfile.TemporaryDirectory(prefix=f"bench-sr-{name}-") as tmp:
            try:
                with start(Path(tmp)) as (path, audio):
                    out["contenders"][name] = results(replay(path, audio, opts))
            except RuntimeError as e:
                out["contenders"][name] = {"missing": str(e)}
    if opts.floor:
        from speakd.audio.pitch import ssip_semitones

        args = argparse.Namespace(
            runs=1,
            pitch=ssip_semitones(opts.nav_pitch),
            threads=2,
            bundle=None,
            no_bandwidth=True,
            seed=opts.seed,
        )
        out["floor"] = floor.measure(args, opts.texts())
    out["loadavg_end"] = loadavg()
    out["machine"] = describe(bandwidth=False)
    return out


def _cell(r: dict[str, Any] | None) -> str:
    return "—" if not r else f"{r['p50']:.1f} / {r['p99']:.1f} (n={r['n']})"


def _ratio(a: Any, b: Any) -> str:
    return f"{a / b:.2f}×" if a and b else "—"


def report(result: dict[str, Any]) -> str:
    c = result["contenders"]
    sd, sp = c.get("speakd", {}), c.get("speechd", {})
    phase = result["options"]["phase"]
    rows = [*(ROWS if phase != "nav" else ()), *(() if phase == "keys" else NAV_LABELS)]
    lines = [
        machine_line(result["machine"])
        + f" Load average {result['loadavg_start']} → {result['loadavg_end']} (shared machine).",
        "New texts: seed {seed}, SSIP PITCH {nav_pitch}.".format(**result["options"]),
        "",
        "| ms, p50 / p99 | speakd | Speech Dispatcher + espeak-ng | speakd / SD (p50) |",
        "|---|---|---|---|",
    ]
    for key, label in rows:
        a, b = sd.get(key), sp.get(key)
        lines.append(
            f"| {label} | {_cell(a)} | {_cell(b)} | {_ratio(a and a['p50'], b and b['p50'])} |"
        )
    if phase != "nav":
        ra, rb = sd.get("marked_ratio"), sp.get("marked_ratio")
        lines.append(
            f"| marked / unmarked duration | {ra or '—'}× | {rb or '—'}× | {_ratio(ra, rb)} |"
        )
        mb = [x.get("marks_before_begin") for x in (sd, sp)]
        lines.append(
            "| marked messages with a 700 before 701 | "
            + " | ".join(f"{m[0]} of {m[1]}" if m else "—" for m in mb)
            + " | |"
        )
    for name, r in c.items():
        if "missing" in r:
            lines.append(f"\n{name}: not measured: {r['missing']}")
        elif r["slowest"]:
            slow = ", ".join(f"{ms} ms {what}" for ms, what in r["slowest"])
            lines.append(f"\n{name}, slowest echoes: {slow}")
    silent = {name: r.get("nav_silent") for name, r in c.items() if r.get("nav_silent")}
    if silent:
        lines.append(f"\nnew texts with no audio found (not counted): {silent}")
    if "loop" in sd:
        lines.append(f"\nspeakd's event loop during the run: {loopstall.describe(sd['loop'])}")
    if sd.get("parts"):
        lines += ["", *parts_table(sd["parts"], result.get("floor"))]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quick", action="store_true", help="9 keys, 7 new texts, one round: a smoke run"
    )
    p.add_argument("--only", choices=sorted(CONTENDERS), default="", help="one contender")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.add_argument(
        "--phase",
        choices=("all", "keys", "nav"),
        default="all",
        help="keys: typing, arrows, say-all, durations; nav: new lines, menu items, say-all's "
        "first sentence",
    )
    p.add_argument("--seed", type=int, help="the new texts' draw (default: fresh each run)")
    p.add_argument("--rounds", type=int, default=0, help="rounds of the script (default 3)")
    p.add_argument("--nav-pitch", type=int, default=ORCA_PITCH, help="SSIP PITCH of the new texts")
    p.add_argument(
        "--nav-texts",
        type=int,
        default=0,
        help="new lines and menu items each per round (default 20: n = 40 × rounds)",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="also bench floor's parts and floor on the same texts, beside speakd's own",
    )


def run(args: argparse.Namespace) -> int:
    opts = Options(quick=args.quick, only=args.only, phase=args.phase, nav_rounds=args.rounds)
    opts.nav_pitch, opts.nav_texts, opts.floor = args.nav_pitch, args.nav_texts, args.floor
    if args.seed is not None:
        opts.seed = args.seed
    result = measure(opts)
    print(json.dumps(result, indent=1) if args.json else report(result))
    return 0 if all("missing" not in r for r in result["contenders"].values()) else 1
