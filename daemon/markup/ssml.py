"""The SSML subset speakd reads, parsed into segments (``speakd.markup.segments``).

The document is parsed with defusedxml: any entity declaration and any external reference is
refused as the parser meets it, so a billion-laughs document fails at its first declaration
instead of expanding, and nesting deeper than ``MAX_DEPTH`` fails at the element that passes it.
Every refusal is a ``bad_ssml`` ``RequestError`` that says the line and column.

A prefix used without a declaration (Alexa's ``<amazon:effect>``, written as assistants write it)
is declared for it, in a namespace of its own: its element is unknown like any other, and keeps
its text (docs/reliability.md, "Lenient input").

``ELEMENTS`` and ``SAY_AS`` are the subset as data: docs/ssml.md lists exactly these (its test
reads them). Elements outside the subset keep their text, as browsers do with unknown HTML, and
attributes outside it are ignored.
"""

from __future__ import annotations

import logging
import math
import re
import xml.parsers.expat
from dataclasses import dataclass, field, replace
from xml.etree.ElementTree import Element, ParseError, TreeBuilder

from defusedxml import DefusedXmlException, EntitiesForbidden
from defusedxml.ElementTree import DefusedXMLParser

from speakd.audio.pitch import PITCH_RANGE
from speakd.engines import sayas
from speakd.markup.segments import (
    Audio,
    Break,
    Mark,
    Phonemes,
    Segment,
    Style,
    Text,
    speakable,
    tidy,
)
from speakd.request.messages import RequestError

log = logging.getLogger(__name__)

SSML_NS = "http://www.w3.org/2001/10/synthesis"
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
MAX_DEPTH = 32
MAX_BREAK_MS = 10_000

# element: the attributes speakd reads (docs/ssml.md, "Elements")
ELEMENTS: dict[str, tuple[str, ...]] = {
    "speak": ("xml:lang",),
    "p": ("xml:lang",),
    "s": ("xml:lang",),
    "lang": ("xml:lang",),
    "voice": ("name", "xml:lang"),
    "break": ("time", "strength"),
    "prosody": ("rate", "volume", "pitch"),
    "say-as": ("interpret-as", "format"),
    "sub": ("alias",),
    "phoneme": ("alphabet", "ph"),
    "audio": ("src",),
    "mark": ("name",),
}
SAY_AS: tuple[str, ...] = tuple(sayas.READERS)  # docs/ssml.md, "say-as"

BREAK_STRENGTH_MS = {
    "none": 0, "x-weak": 100, "weak": 250, "medium": 400, "strong": 700, "x-strong": 1200,
}  # fmt: skip
RATE_KEYWORDS = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "fast": 1.25, "x-fast": 1.5}
VOLUME_KEYWORDS_DB = {"x-soft": -12.0, "soft": -6.0, "medium": 0.0, "loud": 4.0, "x-loud": 8.0}
PITCH_KEYWORDS_ST = {"x-low": -6.0, "low": -3.0, "medium": 0.0, "high": 3.0, "x-high": 6.0}
RATE_RANGE = (0.25, 4.0)
VOLUME_RANGE = (0.0, 4.0)
# Hz become semitones against a typical speaking voice's pitch: the shift is relative
# (speakd.audio.pitch), and the voice's own f0 is not known before it speaks
REFERENCE_HZ = 120.0

_ROOT = re.compile(r"\s*<(?:\?xml|!DOCTYPE|speak[\s/>])")
_NUMBER = r"(\d+(?:\.\d+)?|\.\d+)"
_SIGNED = r"([+-]" + _NUMBER + ")"
_SENTENCE_END = "。！？.!?…"
# a prefixed element or attribute name, where one can start: after "<", "</" or whitespace
_PREFIXED = re.compile(r"(?:<|</|\s)([A-Za-z_][\w.-]*):[A-Za-z_]")
_ROOT_TAG = re.compile(r"<(?![?!])[^\s/>]+")
UNDECLARED_NS = "urn:speakd:undeclared-prefix:"  # + the prefix: outside SSML, so unknown


class SsmlError(RequestError):
    """A document speakd cannot read: ``bad_ssml``, with where in the document."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__("bad_ssml", f"{message} (line {line}, column {column})")
        self.line = line
        self.column = column


def is_ssml(text: str) -> bool:
    """Whether a plain ``text`` is an SSML document: its root is ``<speak>`` (or it starts with
    an XML declaration or doctype, which only markup does)."""
    return _ROOT.match(text) is not None


def parse_ssml(document: str, lang: str | None = None) -> list[Segment]:
    """The document's segments, canonical (``segments.tidy``). ``lang`` is the request's
    language, used by ``<say-as>`` where no ``xml:lang`` says otherwise."""
    root, positions = _parse_xml(document)
    if _local(root.tag) != "speak":
        raise SsmlError(f"the root element is <{root.tag}>, not <speak>", *positions[root])
    walk = _Walk(positions, lang or sayas.guess_language("".join(root.itertext())))
    walk.element(root, Style())
    segments = tidy(walk.out)
    if all(isinstance(s, Text) and not speakable(s.text) for s in segments):
        raise RequestError("empty_text", "the document has nothing to say")
    return segments


# ---- reading the XML safely ------------------------------------------------------------------


class _PositionedBuilder(TreeBuilder):
    """Keeps each element's line and column and refuses nesting past MAX_DEPTH as it reads."""

    def __init__(self) -> None:
        super().__init__()
        self.expat: xml.parsers.expat.XMLParserType | None = None
        self.positions: dict[Element, tuple[int, int]] = {}
        self.depth = 0

    def start(self, tag: str, attrs: dict[str, str]) -> Element:
        elem = super().start(tag, attrs)
        assert self.expat is not None
        position = (self.expat.CurrentLineNumber, self.expat.CurrentColumnNumber + 1)
        self.positions[elem] = position
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SsmlError(f"elements are nested deeper than {MAX_DEPTH}", *position)
        return elem

    def end(self, tag: str) -> Element:
        self.depth -= 1
        return super().end(tag)


def _parse_xml(document: str) -> tuple[Element, dict[Element, tuple[int, int]]]:
    try:
        return _parse_xml_once(document)
    except SsmlError as e:
        root = _ROOT_TAG.search(document)
        if "unbound prefix" not in str(e) or root is None:
            raise
    at = root.end()
    added = _declarations(document, at)
    try:
        return _parse_xml_once(document[:at] + added + document[at:])
    except SsmlError as e:  # say where in the client's document, not in ours
        line = document.count("\n", 0, at) + 1
        column = at - document.rfind("\n", 0, at)
        if e.line == line and e.column > column:
            e = SsmlError(str(e).rsplit(" (line", 1)[0], line, e.column - len(added))
        raise e from None


def _declarations(document: str, at: int) -> str:
    """Declarations, for the root tag whose name ends at ``at``, of every prefix ``document``
    uses but the root does not declare (a deeper declaration still wins where it is made)."""
    on_root = set(re.findall(r"xmlns:([\w.-]+)\s*=", document[at : document.find(">", at)]))
    return "".join(
        f' xmlns:{p}="{UNDECLARED_NS}{p}"'
        for p in dict.fromkeys(_PREFIXED.findall(document))
        if p not in on_root and not p.lower().startswith("xml")
    )


def _parse_xml_once(document: str) -> tuple[Element, dict[Element, tuple[int, int]]]:
    builder = _PositionedBuilder()
    parser = DefusedXMLParser(target=builder)  # entities and external references forbidden
    builder.expat = parser.parser
    try:
        parser.feed(document)
        root = parser.close()
    except ParseError as e:
        line, column = e.position
        raise SsmlError(
            f"not XML: {xml.parsers.expat.ErrorString(e.code)}", line, column + 1
        ) from None
    except DefusedXmlException as e:
        if isinstance(e, EntitiesForbidden):
            what = f"entity declarations are not allowed (<!ENTITY {e.name}>)"
        else:
            what = "external references are not allowed"
        expat = parser.parser
        raise SsmlError(what, expat.CurrentLineNumber, expat.CurrentColumnNumber + 1) from None
    return root, builder.positions


def _local(tag: str) -> str:
    """An element's SSML name; an element of another namespace is unknown (keeps its text)."""
    if tag.startswith(f"{{{SSML_NS}}}"):
        return tag[len(SSML_NS) + 2 :]
    return "" if tag.startswith("{") else tag


# ---- the walk --------------------------------------------------------------------------------


@dataclass
class _Walk:
    positions: dict[Element, tuple[int, int]]
    lang: str  # the request's language, or the document's guessed one
    out: list[Segment] = field(default_factory=list)

    def element(self, elem: Element, style: Style) -> None:
        name = _local(elem.tag)
        handler = getattr(self, "_" + name.replace("-", "_"), None) if name in ELEMENTS else None
        if handler is None:
            if name not in ELEMENTS:
                log.debug("SSML element <%s> is not in the subset: its text is kept", elem.tag)
            self.children(elem, style)
        else:
            handler(elem, style)

    def children(self, elem: Element, style: Style) -> None:
        if elem.text:
            self.text(elem.text, style)
        for child in elem:
            self.element(child, style)
            if child.tail:
                self.text(child.tail, style)

    def text(self, text: str, style: Style) -> None:
        last = self.out[-1] if self.out else None
        if isinstance(last, Text) and last.style == style:
            self.out[-1] = Text(last.text + text, style)
        else:
            self.out.append(Text(text, style))

    def fail(self, elem: Element, message: str) -> SsmlError:
        return SsmlError(f"<{_local(elem.tag)}>: {message}", *self.positions[elem])

    # -- structure and voice

    def _speak(self, elem: Element, style: Style) -> None:
        self.children(elem, _with_lang(elem, style))

    _lang = _speak

    def _p(self, elem: Element, style: Style) -> None:
        """A paragraph or sentence is a sentence of its own: it ends with a full stop when its
        text does not end one."""
        self._end_sentence()
        self.children(elem, _with_lang(elem, style))
        self._end_sentence()

    _s = _p

    def _end_sentence(self) -> None:
        last = self.out[-1] if self.out else None
        if not isinstance(last, Text):
            return
        text = last.text.rstrip()
        if text and text[-1] not in _SENTENCE_END:
            text += "。" if "\u4e00" <= text[-1] <= "\u9fff" else "."
        self.out[-1] = Text(text + " ", last.style)

    def _voice(self, elem: Element, style: Style) -> None:
        name = (elem.get("name") or "").strip()
        self.children(elem, _with_lang(elem, replace(style, voice=name or style.voice)))

    # -- time: breaks, marks, clips

    def _break(self, elem: Element, style: Style) -> None:
        time, strength = elem.get("time"), elem.get("strength")
        if time is not None:
            m = re.fullmatch(_NUMBER + r"\s*(ms|s)", time.strip())
            if m is None:
                raise self.fail(elem, f"time must be like 500ms or 1.5s, not {time!r}")
            ms = round(float(m.group(1)) * (1000 if m.group(2) == "s" else 1))
            if ms > MAX_BREAK_MS:
                raise self.fail(elem, f"time is {ms} ms, at most {MAX_BREAK_MS} ms")
        elif strength is not None:
            if strength.strip() not in BREAK_STRENGTH_MS:
                raise self.fail(elem, f"strength must be one of {', '.join(BREAK_STRENGTH_MS)}")
            ms = BREAK_STRENGTH_MS[strength.strip()]
        else:
            ms = BREAK_STRENGTH_MS["medium"]
        self.out.append(Break(ms))

    def _mark(self, elem: Element, style: Style) -> None:
        name = (elem.get("name") or "").strip()
        if not name:
            raise self.fail(elem, "name is required")
        self.out.append(Mark(name))

    def _audio(self, elem: Element, style: Style) -> None:
        """A clip by name; without one (no ``src``) it is its content, or nothing, with a
        warning like any clip speakd lacks (``speakd.markup.plan``)."""
        src = (elem.get("src") or "").strip()
        alt = _Walk(self.positions, self.lang)
        alt.children(elem, style)
        self.out.append(Audio(src, tuple(tidy(alt.out))))

    # -- how words are said

    def _prosody(self, elem: Element, style: Style) -> None:
        try:
            style = replace(
                style,
                rate=_rate(elem.get("rate"), style.rate),
                volume=_volume(elem.get("volume"), style.volume),
                pitch=_pitch(elem.get("pitch"), style.pitch),
            )
        except ValueError as e:
            raise self.fail(elem, str(e)) from None
        self.children(elem, style)

    def _say_as(self, elem: Element, style: Style) -> None:
        content = "".join(elem.itertext())
        kind = (elem.get("interpret-as") or "").strip()
        lang = style.lang or self.lang
        words = sayas.say_as(kind, content, lang, elem.get("format"))
        if words is None:
            log.debug("say-as %r of %r in %s: said as written", kind, content, lang)
            self.text(content, style)
        else:  # words apart from their neighbours, except in Chinese, which has no spaces
            self.text(words if sayas.language(lang) == "zh" else f" {words} ", style)

    def _sub(self, elem: Element, style: Style) -> None:
        alias = elem.get("alias")
        if alias:
            self.text(alias, style)
        else:
            self.children(elem, style)

    def _phoneme(self, elem: Element, style: Style) -> None:
        ph = (elem.get("ph") or "").strip()
        if not ph:
            raise self.fail(elem, "ph (the phonemes) is required")
        alphabet = (elem.get("alphabet") or "ipa").strip().lower()
        if alphabet != "ipa":
            log.debug("phoneme alphabet %r is not ipa: the text is said as written", alphabet)
            self.children(elem, style)
            return
        self.out.append(Phonemes(ph, "".join(elem.itertext()), style))


def _with_lang(elem: Element, style: Style) -> Style:
    lang = (elem.get(XML_LANG) or "").strip().replace("_", "-").lower()
    return replace(style, lang=lang) if lang else style


# ---- prosody values --------------------------------------------------------------------------
# Keywords (and "default") are levels of their own; numbers change the enclosing level.


def _rate(value: str | None, current: float) -> float:
    if value is None:
        return current
    v = value.strip().lower()
    if v == "default":
        rate = 1.0
    elif v in RATE_KEYWORDS:
        rate = RATE_KEYWORDS[v]
    elif m := re.fullmatch(_NUMBER + "%", v):
        rate = current * float(m.group(1)) / 100
    elif m := re.fullmatch(_SIGNED + "%", v):
        rate = current * (1 + float(m.group(1)) / 100)
    elif m := re.fullmatch(_NUMBER, v):
        rate = current * float(m.group(1))
    else:
        raise ValueError(
            f"rate must be x-slow..x-fast, default, a percentage or a factor, not {value!r}"
        )
    return round(_clamp(rate, RATE_RANGE), 3)


def _volume(value: str | None, current: float) -> float:
    if value is None:
        return current
    v = value.strip().lower()
    if v == "default":
        gain = 1.0
    elif v == "silent":
        gain = 0.0
    elif v in VOLUME_KEYWORDS_DB:
        gain = 10 ** (VOLUME_KEYWORDS_DB[v] / 20)
    elif m := re.fullmatch(r"([+-]?" + _NUMBER + ")db", v):
        gain = current * 10 ** (float(m.group(1)) / 20)
    else:
        raise ValueError(
            f"volume must be silent, x-soft..x-loud, default or a change in dB, not {value!r}"
        )
    return round(_clamp(gain, VOLUME_RANGE), 3)


def _pitch(value: str | None, current: float) -> float:
    if value is None:
        return current
    v = value.strip().lower()
    if v == "default":
        pitch = 0.0
    elif v in PITCH_KEYWORDS_ST:
        pitch = PITCH_KEYWORDS_ST[v]
    elif m := re.fullmatch(_SIGNED + "st", v):
        pitch = current + float(m.group(1))
    elif (m := re.fullmatch(_SIGNED + "%", v)) and float(m.group(1)) > -100:
        pitch = current + 12 * math.log2(1 + float(m.group(1)) / 100)
    elif (m := re.fullmatch(_SIGNED + "hz", v)) and float(m.group(1)) > -REFERENCE_HZ:
        pitch = current + 12 * math.log2(1 + float(m.group(1)) / REFERENCE_HZ)
    elif (m := re.fullmatch(_NUMBER + "hz", v)) and float(m.group(1)) > 0:
        pitch = 12 * math.log2(float(m.group(1)) / REFERENCE_HZ)
    else:
        raise ValueError(
            "pitch must be x-low..x-high, default, a frequency in Hz, or a change in st, % or "
            f"Hz, not {value!r}"
        )
    return round(_clamp(pitch, PITCH_RANGE), 2) + 0.0  # no -0.0


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    return min(max(value, bounds[0]), bounds[1])
