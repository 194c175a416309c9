"""``<say-as>``: how a number, date, time, telephone number or spelled-out word is read, in
English and Chinese.

The words come from two small pure-Python packages that run on every board: ``num2words`` for
English and ``cn2an`` for Chinese numerals. ``say_as`` returns None when the content is not of the
kind asked for (``cardinal`` of "abc") or the language is neither; the parser then keeps the text
as written, and the engine reads it as it would anyway.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

import cn2an
from num2words import num2words

Lang = Literal["en", "zh"]

_MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_ORDINAL = re.compile(r"第?(\d+)(?:st|nd|rd|th)?", re.I)
_TIME = re.compile(r"(\d{1,2})[:.](\d{2})(?::(\d{2}))?\s*(?:([ap])\.?\s?m\.?)?", re.I)
_DATE_FORMATS = frozenset({"ymd", "mdy", "dmy", "ym", "my", "md", "dm", "y", "m", "d"})


def guess_language(text: str) -> Lang:
    """zh when CJK characters outnumber English words (ChatTTS's rule, docs/chattts.md)."""
    cjk = len(re.findall(r"[\u4e00-\u9fff]", text))
    return "zh" if cjk > len(re.findall(r"[A-Za-z]+", text)) else "en"


def language(lang: str | None) -> Lang | None:
    """The reading language for a language code: ``zh`` for any Chinese, ``en`` for English."""
    base = (lang or "").replace("_", "-").split("-")[0].lower()
    return base if base in ("en", "zh") else None  # type: ignore[return-value]


def digits(s: str, lang: Lang) -> str:
    """Each digit on its own: "2026" → "two zero two six" / "二零二六"."""
    if lang == "zh":
        return cn2an.an2cn(s, "direct")
    return " ".join(num2words(int(d)) for d in s)


def cardinal(s: str, lang: Lang) -> str:
    """An integer or decimal as a number: "-3.25" → "minus three point two five" / "负三点二五"."""
    if lang == "zh":
        return cn2an.an2cn(s, "low")
    whole, _, frac = s.lstrip("-").partition(".")
    words = _clean(num2words(int(whole or "0")))
    if frac:
        words += " point " + digits(frac, "en")
    return ("minus " if s.startswith("-") else "") + words


def _clean(words: str) -> str:
    """num2words writes "one thousand, two hundred": a comma would be read as a pause."""
    return words.replace(",", "")


def _cardinal(text: str, lang: Lang, fmt: str | None) -> str | None:
    s = re.sub(r"[\s,]", "", text)  # 1,234 is one number in both languages
    return cardinal(s, lang) if _NUMBER.fullmatch(s) else None


def _ordinal(text: str, lang: Lang, fmt: str | None) -> str | None:
    m = _ORDINAL.fullmatch(text.strip())
    if m is None:
        return None
    n = int(m.group(1))
    return "第" + cn2an.an2cn(str(n), "low") if lang == "zh" else num2words(n, to="ordinal")


def _digits(text: str, lang: Lang, fmt: str | None) -> str | None:
    s = re.sub(r"\s", "", text)
    return digits(s, lang) if s.isdigit() and s.isascii() else None


def _characters(text: str, lang: Lang, fmt: str | None) -> str | None:
    """One character at a time: letters as capitals (read by name), digits as words."""
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return None
    return " ".join(digits(c, lang) if c.isdigit() and c.isascii() else c.upper() for c in chars)


def _date(text: str, lang: Lang, fmt: str | None) -> str | None:
    """``format`` is the order of the fields (``ymd``, ``mdy``, ``dmy``, ``ym``, ``md``, ``y``…);
    without it a leading four-digit year means year first, three fields mean mdy in English and
    ymd in Chinese, two fields month and day."""
    fields = re.findall(r"\d+", text)
    if fmt is None and fields:
        year_first = len(fields[0]) == 4 or (lang == "zh" and len(fields) == 3)
        fmt = ("ymd" if year_first else "mdy" if len(fields) == 3 else "md")[: len(fields)]
    if fmt not in _DATE_FORMATS or len(fields) != len(fmt):
        return None
    parts = dict(zip(fmt, (int(f) for f in fields), strict=True))
    year, month, day = parts.get("y"), parts.get("m"), parts.get("d")
    if (month is not None and not 1 <= month <= 12) or (day is not None and not 1 <= day <= 31):
        return None
    if lang == "zh":
        out = f"{digits(fields[fmt.index('y')], 'zh')}年" if year is not None else ""
        out += f"{cn2an.an2cn(str(month), 'low')}月" if month is not None else ""
        return out + (f"{cn2an.an2cn(str(day), 'low')}日" if day is not None else "")
    words = []
    if day is not None and (month is None or fmt.index("d") < fmt.index("m")):
        words.append(f"the {num2words(day, to='ordinal')}" + (" of" if month else ""))
        day = None
    if month is not None:
        words.append(_MONTHS[month - 1])
    if day is not None:
        words.append(num2words(day, to="ordinal"))
    if year is not None:
        words.append(_clean(num2words(year, to="year")))
    return " ".join(words)


def _time(text: str, lang: Lang, fmt: str | None) -> str | None:
    """H:MM or H:MM:SS, optionally with am/pm."""
    m = _TIME.fullmatch(text.strip())
    if m is None:
        return None
    h, mi, sec, half = int(m.group(1)), int(m.group(2)), m.group(3), (m.group(4) or "").lower()
    if h > 24 or mi > 59 or (sec is not None and int(sec) > 59) or (half and not 1 <= h <= 12):
        return None
    if lang == "zh":
        out = {"a": "上午", "p": "下午", "": ""}[half] + f"{cn2an.an2cn(str(h), 'low')}点"
        if mi:
            out += ("零" if mi < 10 else "") + f"{cn2an.an2cn(str(mi), 'low')}分"
        elif not sec:
            out += "整"
        return out + (f"{cn2an.an2cn(str(int(sec)), 'low')}秒" if sec else "")
    if mi == 0:
        out = num2words(h) + (" o'clock" if half or h <= 12 else " hundred")
    else:
        out = f"{num2words(h)} {'oh ' if mi < 10 else ''}{num2words(mi)}"
    if half:
        out += f" {half.upper()} M"
    return out + (f" and {num2words(int(sec))} seconds" if sec else "")


def _telephone(text: str, lang: Lang, fmt: str | None) -> str | None:
    """Digit by digit, a pause between the groups the number was written in; in Chinese a 1 is
    幺, as numbers are read aloud there."""
    s = text.strip()
    groups = re.findall(r"\d+", s)
    if not groups or re.fullmatch(r"\+?[\d\s().-]+", s) is None:
        return None
    if lang == "zh":
        said = "，".join(digits(g, "zh").replace("一", "幺") for g in groups)
        return ("加" if s.startswith("+") else "") + said
    return ("plus " if s.startswith("+") else "") + ", ".join(digits(g, "en") for g in groups)


Reader = Callable[[str, Lang, str | None], str | None]
READERS: dict[str, Reader] = {
    "characters": _characters,
    "spell-out": _characters,
    "digits": _digits,
    "cardinal": _cardinal,
    "ordinal": _ordinal,
    "date": _date,
    "time": _time,
    "telephone": _telephone,
}


def say_as(kind: str, text: str, lang: str | None, fmt: str | None = None) -> str | None:
    """The words for ``text`` read as ``kind`` in ``lang``; None to keep the text as written."""
    reading = language(lang)
    reader = READERS.get(kind)
    if reader is None or reading is None:
        return None
    return reader(text, reading, fmt)
