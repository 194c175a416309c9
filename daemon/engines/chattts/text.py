"""ChatTTS text front-end: verbalise numbers and symbols, apply ChatTTS's character rules, split.

ChatTTS itself registers no text normaliser and *deletes* every character outside
``[\\u4e00-\\u9fffA-Za-z，。、,. ]`` (docs/chattts.md, "Text"): digits, ``?``, ``%``, ``$``
vanish and the model silently skips "12月2日" or "$20". Its examples plug in WeTextProcessing /
NeMo, which need pynini (no ARM wheels, heavy). We verbalise with two small maintained pure-Python
packages:

* ``num2words`` (English cardinals, ordinals and years; pure Python, on every platform), and
* ``cn2an`` (Chinese numerals, ``an2cn``; pure Python). Its ``transform`` mangles ISO dates, times
  and phone numbers ("2026-12-02" → "二千零二十六负十二负二"), so we only use its number
  conversion and do the pattern matching here, the same rules for both languages.

Each sentence is verbalised in its own language (ChatTTS's rule: zh when CJK characters outnumber
English words), so mixed text reads "12月2日" in Chinese and "$20" in English. After verbalising,
ChatTTS's own character policy is applied (full-width punctuation for zh, its
simplifier table) except that ``?`` and ``？`` become sentence ends instead of being deleted.
Word-level tags ``[uv_break]``, ``[laugh]`` and ``[lbreak]`` pass through untouched; other bracket
tags are control tokens the prompt builder owns, so they are removed from user text.

The result is idempotent (normalising normalised text changes nothing), which keeps the cache key
(built from ``normalize``'s output) coherent whichever text the caller passes to ``synthesize``.
ChatTTS's homophone table (``res/homophones_map.json``, AGPL data) is not applied.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import cn2an
from num2words import num2words

from speakd.engines.sayas import Lang, cardinal, digits

WORD_TAGS = frozenset({"[uv_break]", "[laugh]", "[lbreak]"})
_TAG = re.compile(r"(\[[A-Za-z0-9_]+\])")
_CJK = re.compile(r"[\u4e00-\u9fff]")
_EN_WORD = re.compile(r"\b[A-Za-z]+\b")

# ChatTTS norm.py: the characters the model may see (outside tags).
_REJECT = re.compile(r"[^\u4e00-\u9fffA-Za-z，。、,. ]")
# ChatTTS norm.py `halfwidth_2_fullwidth` (zh only), then `character_simplifier`; '?' / '？' are
# ours: a question ends a sentence like '！', which ChatTTS already maps to '。'.
_HALF_TO_FULL = str.maketrans(
    {
        "!": "！", '"': "“", "'": "‘", "#": "＃", "$": "＄", "%": "％", "&": "＆", "(": "（",
        ")": "）", ",": "，", "-": "－", "*": "＊", "+": "＋", ".": "。", "/": "／", ":": "：",
        ";": "；", "<": "＜", "=": "＝", ">": "＞", "?": "？", "@": "＠", "\\": "＼", "^": "＾",
        "`": "｀", "{": "｛", "|": "｜", "}": "｝", "~": "～",
    }
)  # fmt: skip
_SIMPLIFY = str.maketrans(
    {
        "：": "，", "；": "，", "！": "。", "（": "，", "）": "，", "【": "，", "】": "，",
        "『": "，", "』": "，", "「": "，", "」": "，", "《": "，", "》": "，", "－": "，",
        ":": ",", ";": ",", "!": ".", "(": ",", ")": ",", ">": ",", "<": ",", "-": ",",
        "？": "。", "?": ".", "…": "。", "～": "，", "—": "，", "–": ",", "\n": ".",
    }
)  # fmt: skip

_NUM = r"\d+(?:\.\d+)?"
_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
_CURRENCY = {  # symbol: (en singular, en plural, en cents word or "", zh)
    "$": ("dollar", "dollars", "cents", "美元"),
    "€": ("euro", "euros", "cents", "欧元"),
    "£": ("pound", "pounds", "pence", "英镑"),
    "¥": ("yuan", "yuan", "", "元"),  # ¥ is also yen; in speakd's zh/en setting it means yuan
    "￥": ("yuan", "yuan", "", "元"),
}
_UNITS = {  # unit: (en singular, en plural, zh)
    "km/h": ("kilometer per hour", "kilometers per hour", "公里每小时"),
    "m/s": ("meter per second", "meters per second", "米每秒"),
    "kg": ("kilogram", "kilograms", "千克"),
    "mg": ("milligram", "milligrams", "毫克"),
    "g": ("gram", "grams", "克"),
    "km": ("kilometer", "kilometers", "公里"),
    "cm": ("centimeter", "centimeters", "厘米"),
    "mm": ("millimeter", "millimeters", "毫米"),
    "m": ("meter", "meters", "米"),
    "ml": ("milliliter", "milliliters", "毫升"),
    "mL": ("milliliter", "milliliters", "毫升"),
    "L": ("liter", "liters", "升"),
    "°C": ("degree Celsius", "degrees Celsius", "摄氏度"),
    "℃": ("degree Celsius", "degrees Celsius", "摄氏度"),
    "°F": ("degree Fahrenheit", "degrees Fahrenheit", "华氏度"),
    "°": ("degree", "degrees", "度"),
    "ms": ("millisecond", "milliseconds", "毫秒"),
    "min": ("minute", "minutes", "分钟"),
    "h": ("hour", "hours", "小时"),
    "s": ("second", "seconds", "秒"),
    "kHz": ("kilohertz", "kilohertz", "千赫兹"),
    "MHz": ("megahertz", "megahertz", "兆赫兹"),
    "GHz": ("gigahertz", "gigahertz", "吉赫兹"),
    "Hz": ("hertz", "hertz", "赫兹"),
    "KB": ("kilobyte", "kilobytes", "千字节"),
    "MB": ("megabyte", "megabytes", "兆字节"),
    "GB": ("gigabyte", "gigabytes", "吉字节"),
    "TB": ("terabyte", "terabytes", "太字节"),
    "kW": ("kilowatt", "kilowatts", "千瓦"),
    "W": ("watt", "watts", "瓦"),
    "V": ("volt", "volts", "伏"),
    "mAh": ("milliamp hour", "milliamp hours", "毫安时"),
}
_UNIT_RE = "|".join(re.escape(u) for u in sorted(_UNITS, key=len, reverse=True))
_SYMBOLS = {  # symbol: (en, zh)
    "&": ("and", "和"), "+": ("plus", "加"), "=": ("equals", "等于"), "@": ("at", "艾特"),
    "#": ("number", "井号"), "%": ("percent", "百分号"), "×": ("times", "乘"),
    "÷": ("divided by", "除以"), "°": ("degrees", "度"), "/": (" ", " "), "~": ("to", "到"),
    "≈": ("about", "约等于"), "<": ("less than", "小于"), ">": ("greater than", "大于"),
}  # fmt: skip
_ABBREVIATIONS = {
    "Mr.": "Mister", "Mrs.": "Missus", "Dr.": "Doctor", "St.": "Saint", "vs.": "versus",
    "e.g.": "for example", "i.e.": "that is", "etc.": "et cetera", "No.": "number",
}  # fmt: skip


# --- number words -------------------------------------------------------------------------------


def _is_one(s: str) -> bool:
    return s.lstrip("-") in ("1", "1.0")


def _en_clean(words: str) -> str:
    """num2words writes "twenty-six" and "one million, two hundred": hyphens and commas would
    become pauses after ChatTTS's character rules."""
    return words.replace("-", " ").replace(",", "")


# --- rules: (pattern, en handler, zh handler) -----------------------------------------------------


def _date(m: re.Match[str], lang: Lang) -> str:
    y, mo, d = m.group(1), int(m.group(2)), int(m.group(3))
    if not (1 <= mo <= 12 and 1 <= d <= 31):
        return m.group(0).replace("-", " ").replace("/", " ")
    if lang == "zh":
        return f"{digits(y, 'zh')}年{cn2an.an2cn(str(mo))}月{cn2an.an2cn(str(d))}日"
    return f"{_MONTHS[mo - 1]} {num2words(d, to='ordinal')} {num2words(int(y), to='year')}"


def _time(m: re.Match[str], lang: Lang) -> str:
    h, mi, sec = int(m.group(1)), int(m.group(2)), m.group(3)
    if lang == "zh":
        out = f"{cn2an.an2cn(str(h))}点"
        if mi == 0:
            out += "" if sec else "整"
        else:
            out += ("零" if mi < 10 else "") + f"{cn2an.an2cn(str(mi))}分"
        if sec:
            out += f"{cn2an.an2cn(str(int(sec)))}秒"
        return out
    if mi == 0:
        out = f"{num2words(h)} o'clock"
    elif mi < 10:
        out = f"{num2words(h)} oh {num2words(mi)}"
    else:
        out = f"{num2words(h)} {num2words(mi)}"
    if sec:
        out += f" and {num2words(int(sec))} seconds"
    return out


def _currency(m: re.Match[str], lang: Lang) -> str:
    sym, amount, scale = m.group(1), m.group(2).replace(",", ""), m.group(3)
    one, many, cents, zh = _CURRENCY[sym]
    if lang == "zh":
        scale_zh = {"k": "千", "thousand": "千", "million": "百万", "billion": "十亿"}
        return cardinal(amount, "zh") + (scale_zh.get(scale.lower(), "") if scale else "") + zh
    if scale:
        return f"{cardinal(amount, 'en')} {scale.replace('k', 'thousand')} {many}"
    whole, _, frac = amount.partition(".")
    out = f"{num2words(int(whole))} {one if whole == '1' else many}"
    if frac and cents and int(frac[:2].ljust(2, "0")):
        out += f" and {num2words(int(frac[:2].ljust(2, '0')))} {cents}"
    elif frac:
        out = f"{cardinal(amount, 'en')} {many}"
    return out


def _percent(m: re.Match[str], lang: Lang) -> str:
    n = m.group(1)
    if lang == "zh":
        return ("负" if n.startswith("-") else "") + "百分之" + cardinal(n.lstrip("-"), "zh")
    return f"{cardinal(n, 'en')} percent"


def _unit(m: re.Match[str], lang: Lang) -> str:
    n, unit = m.group(1), m.group(2)
    one, many, zh = _UNITS[unit]
    if lang == "zh":
        return cardinal(n, "zh") + zh
    return f"{cardinal(n, 'en')} {one if _is_one(n) else many}"


def _ordinal(m: re.Match[str], lang: Lang) -> str:
    return num2words(int(m.group(1)), to="ordinal") if lang == "en" else cardinal(m.group(1), lang)


def _year_zh(m: re.Match[str], lang: Lang) -> str:
    if lang == "zh":
        return digits(m.group(1), "zh") + "年"
    return f"the year {num2words(int(m.group(1)), to='year')}"


def _year_en(m: re.Match[str], lang: Lang) -> str:
    year = digits(m.group(2), "zh") if lang == "zh" else num2words(int(m.group(2)), to="year")
    return f"{m.group(1)}{year}"


def _range(m: re.Match[str], lang: Lang) -> str:
    a, b = cardinal(m.group(1), lang), cardinal(m.group(2), lang)
    return f"{a}到{b}" if lang == "zh" else f"{a} to {b}"


def _fraction(m: re.Match[str], lang: Lang) -> str:
    a, b = m.group(1), m.group(2)
    if lang == "zh":
        return f"{cardinal(b, 'zh')}分之{cardinal(a, 'zh')}"
    return f"{cardinal(a, 'en')} over {cardinal(b, 'en')}"


def _number(m: re.Match[str], lang: Lang) -> str:
    s = m.group(0).replace(",", "")
    whole = s.lstrip("-").partition(".")[0]
    if (len(whole) > 1 and whole.startswith("0")) or len(whole) >= 10:
        return digits(whole, lang)  # codes, phone numbers: digit by digit
    return cardinal(s, lang)


Handler = Callable[[re.Match[str], Lang], str]
_RULES: list[tuple[re.Pattern[str], Handler]] = [
    (re.compile(r"(?<!\d)(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})(?!\d)"), _date),
    (re.compile(r"(?<!\d)([01]?\d|2[0-4]):([0-5]\d)(?::([0-5]\d))?(?!\d)"), _time),
    (
        re.compile(
            r"([$€£¥￥])\s?(\d{1,3}(?:,\d{3})+(?:\.\d+)?|" + _NUM + r")"
            r"(?:\s?(k|thousand|million|billion)\b)?"
        ),
        _currency,
    ),
    (re.compile(r"(-?" + _NUM + r")\s?[%％]"), _percent),
    (re.compile(r"(-?" + _NUM + r")\s?(" + _UNIT_RE + r")(?![A-Za-z])"), _unit),
    (re.compile(r"(?<!\d)(\d+)(?:st|nd|rd|th)\b"), _ordinal),
    (re.compile(r"(?<!\d)(\d{4})年"), _year_zh),
    (re.compile(r"\b((?:in|since|by|from|until|before|after)\s)(\d{4})\b(?!\s?年)", re.I),
     _year_en),
    (re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s?[-~～–]\s?(\d+(?:\.\d+)?)(?![\d.])"), _range),
    (re.compile(r"(?<![\d/])(\d{1,3})/(\d{1,3})(?![\d/])"), _fraction),
    (re.compile(r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.])-\d+(?:\.\d+)?|\d+(?:\.\d+)?"),
     _number),
]  # fmt: skip


# --- public API -----------------------------------------------------------------------------------


def detect_language(text: str) -> Lang:
    """ChatTTS's rule (norm.py): zh when CJK characters outnumber English words."""
    return "zh" if len(_CJK.findall(text)) > len(_EN_WORD.findall(text)) else "en"


def verbalize(text: str, lang: Lang) -> str:
    """Numbers, dates, times, currencies, units and symbols → words (no tags inside ``text``).

    Each match is spoken in the language of its own sentence ("今天12月2日。It costs $20." reads
    the date in Chinese and the price in English); ``lang`` decides when a sentence has no words.
    """
    for abbr, full in _ABBREVIATIONS.items():
        text = text.replace(abbr, full)
    for pattern, handler in _RULES:
        text = pattern.sub(lambda m, h=handler: _say(h, m, _lang_at(m, lang)), text)
    return _SYMBOL_RE.sub(lambda m: _symbol(m.group(0), _lang_at(m, lang)), text)


def _say(handler: Handler, m: re.Match[str], lang: Lang) -> str:
    words = handler(m, lang)
    return f" {words if lang == 'zh' else _en_clean(words)} "


def _symbol(sym: str, lang: Lang) -> str:
    en, zh = _SYMBOLS[sym]
    return f" {en} " if lang == "en" else zh


_SYMBOL_RE = re.compile("|".join(re.escape(s) for s in _SYMBOLS))
_CLAUSE_END = re.compile(r"[。！？!?\n]|\.(?!\d)")  # not a decimal point
_CLAUSE_SPLIT = re.compile(r"(?<=[。！？!?\n])|(?<=\.)(?!\d)")


def _lang_at(m: re.Match[str], default: Lang) -> Lang:
    """The language of the sentence around a match."""
    s = m.string
    starts = [e.end() for e in _CLAUSE_END.finditer(s, 0, m.start())]
    end = _CLAUSE_END.search(s, m.end())
    clause = s[starts[-1] if starts else 0 : end.start() if end else len(s)]
    return _clause_lang(clause) or default


def _clause_lang(clause: str) -> Lang | None:
    """ChatTTS's rule on one sentence (tag placeholders ignored); None when it has no words."""
    clause = _PLACEHOLDER_RE.sub(" ", clause)
    if not _CJK.search(clause) and not _EN_WORD.search(clause):
        return None
    return detect_language(clause)


def apply_chattts_charset(text: str) -> str:
    """ChatTTS's character policy (norm.py) with '?' kept as a sentence end.

    Half-width punctuation becomes full-width in Chinese sentences (ChatTTS does it to the whole
    text when it is zh); spacing rules do not depend on the language, so the result is stable.
    """
    text = re.sub(r"(?<=[A-Za-z])['’](?=[A-Za-z])", "", text)  # don't → dont, as ChatTTS does
    text = re.sub(r"(?<=[A-Za-z])-(?=[A-Za-z])", " ", text)  # well-known: no pause (ChatTTS: ',')
    text = "".join(
        c.translate(_HALF_TO_FULL) if _clause_lang(c) == "zh" else c
        for c in _CLAUSE_SPLIT.split(text)
    )
    text = _REJECT.sub(" ", text.translate(_SIMPLIFY))
    text = re.sub(r"[\s，、,]*([。.])[\s，。、,.]*", r"\1 ", text)  # one stop, no comma before it
    text = re.sub(r"\s*([，、,])[\s，、,]*", r"\1 ", text)
    text = re.sub(r"\s*([，。、])\s*", r"\1", re.sub(r"\s+", " ", text))
    text = re.sub(r"(?<=[\u4e00-\u9fff]) (?=[\u4e00-\u9fff])", "", text)
    return text.strip(" ，,、。.") + _final_stop(text)


def _final_stop(text: str) -> str:
    """Keep a sentence end the input had (strip above removes it with the leading junk)."""
    tail = text.rstrip(" ，,、")
    return tail[-1] if tail and tail[-1] in "。." and tail.strip(" 。.") else ""


def normalize(text: str, lang: Lang | None = None) -> str:
    """The text as ChatTTS will read it: verbalised, ChatTTS's charset, word tags kept."""
    lang = lang or detect_language(_TAG.sub(" ", text))
    # Word tags ride through the rules as letter-only placeholders; other tags are dropped.
    text = _TAG.sub(lambda m: f" {_PLACEHOLDER.get(m.group(1), '')} ", text)
    text = _end_lines([ln.strip() for ln in text.splitlines()])
    text = apply_chattts_charset(verbalize(text, lang))
    text = _PLACEHOLDER_RE.sub(lambda m: f" {_TAG_OF[m.group(1)]} ", text)
    text = re.sub(r"\s+([，。、,.])", r"\1", re.sub(r"\s+", " ", text))
    # a tag touches CJK and full-width punctuation, and is spaced from Latin words
    return _TAG_SPACE.sub("", text).strip()


_PLACEHOLDER = {tag: f"TAGqxq{c}" for tag, c in zip(sorted(WORD_TAGS), "abc", strict=True)}
_TAG_OF = {p: tag for tag, p in _PLACEHOLDER.items()}
_PLACEHOLDER_RE = re.compile(r"\s*(TAGqxq[abc])\s*")
_TAG_SPACE = re.compile(r"(?<=[\u4e00-\u9fff，。、\]]) (?=\[)|(?<=\]) (?=[\u4e00-\u9fff，。、\[])")


def _end_lines(lines: list[str]) -> str:
    """A line break ends a sentence: give unterminated lines a full stop."""

    def end(ln: str) -> str:
        ln_lang = _clause_lang(ln)
        if ln_lang is None or ln[-1] in "。.!?！？":
            return ln  # a tag alone is no sentence
        return ln + ("。" if ln_lang == "zh" else ".")

    ended = [end(ln) for ln in lines[:-1]]
    return " ".join([*ended, lines[-1]] if lines else [])


# --- sentence splitting ---------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[。])|(?<=\.)(?=\s|\[|$)")
_COMMA = re.compile(r"(?<=[，、,])")


def units(text: str) -> int:
    """Length in "speech units": one per CJK character, one per English word (tags excluded)."""
    bare = _TAG.sub(" ", text)
    return len(_CJK.findall(bare)) + len(_EN_WORD.findall(bare))


@dataclass(frozen=True)
class SplitPolicy:
    max_units: int = 80  # ≈ 15–20 s of speech, well inside max_new_token=2048 steps (43 s)


def split_sentences(text: str, policy: SplitPolicy = SplitPolicy()) -> list[str]:
    """Normalised text → sentences; long ones are cut at commas, then at spaces, to max_units."""
    out: list[str] = []
    for sent in _SENTENCE_END.split(text):
        sent = sent.strip()
        if units(sent) == 0:
            if out and sent:  # a lone tag: keep it with the previous sentence
                out[-1] += sent
            continue
        out.extend(_split_long(sent, policy.max_units))
    return out


def _split_long(sent: str, max_units: int) -> list[str]:
    if units(sent) <= max_units:
        return [sent]
    pieces = [p for p in _COMMA.split(sent) if p.strip()]
    if len(pieces) == 1:
        pieces = _hard_split(sent, max_units)
    out: list[str] = []
    for piece in pieces:
        if out and units(out[-1]) + units(piece) <= max_units:
            out[-1] += piece
        elif units(piece) > max_units:
            out.extend(_hard_split(piece, max_units))
        else:
            out.append(piece)
    return [p.strip() for p in out]


def _hard_split(text: str, max_units: int) -> list[str]:
    """No comma to cut at: cut between words/characters every max_units units."""
    tokens = re.findall(r"\[[a-z_]+\]|[\u4e00-\u9fff][，。、,. ]*|[^\s\u4e00-\u9fff]+\s*|\s+", text)
    out, cur, n = [], "", 0
    for tok in tokens:
        u = units(tok)
        if n + u > max_units and cur.strip():
            out.append(cur.strip())
            cur, n = "", 0
        cur += tok
        n += u
    if cur.strip():
        out.append(cur.strip())
    return out
