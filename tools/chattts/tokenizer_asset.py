"""A synthetic BERT WordPiece tokenizer in ChatTTS's ``asset/tokenizer/`` layout.

ChatTTS's real tokenizer is BERT-chinese (21128 WordPiece entries) plus 50 prosody/control
specials at ids 21128-21177. Generated checkpoints need the same id space and the same special ids
(the engine hard-codes ``[spk_emb]``, ``[Ptts]``, … through the manifest), so this module builds a
tokenizer with the real file structure: same normalizer, pre-tokenizer, post-processor, added
tokens, and the padding Fixed(256) + truncation 256 that the real ``tokenizer.json`` enables. The
ordinary vocabulary is synthetic (ASCII, common English word pieces, CJK characters), so text
tokenizes sensibly, but ids of ordinary words differ from the real vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

VOCAB_SIZE = 21128
SPECIAL_TOKENS: tuple[str, ...] = (
    "[Sasr]",
    "[Pasr]",
    "[Easr]",
    "[Stts]",
    "[Ptts]",
    "[Etts]",
    "[Sbreak]",
    "[Pbreak]",
    "[Ebreak]",
    "[uv_break]",
    "[v_break]",
    "[lbreak]",
    "[llbreak]",
    "[undefine]",
    "[laugh]",
    "[spk_emb]",
    "[empty_spk]",
    "[music]",
    "[pure]",
    *(f"[break_{i}]" for i in range(8)),
    *(f"[laugh_{i}]" for i in range(3)),
    *(f"[oral_{i}]" for i in range(10)),
    *(f"[speed_{i}]" for i in range(10)),
)
FIRST_SPECIAL_ID = VOCAB_SIZE  # 21128
TOTAL_IDS = VOCAB_SIZE + len(SPECIAL_TOKENS)  # 21178
BERT_SPECIALS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}

# Frequent English words and suffixes, so English text becomes word pieces rather than letters.
_ENGLISH_WORDS = """
the of and to a in is it you that he was for on are with as i his they be at one have this from or
had by hot word but what some we can out other were all there when up use your how said an each she
which do their time if will way about many then them write would like so these her long make thing
see him two has look more day could go come did number sound no most people my over know water than
call first who may down side been now find any new work part take get place made live where after
back little only round man year came show every good me give our under name very through just form
sentence great think say help low line differ turn cause much mean before move right boy old too
same tell does set three want air well also play small end put home read hand port large spell add
even land here must big high such follow act why ask men change went light kind off need house
picture try us again animal point mother world near build self earth father head stand own page
should country found answer school grow study still learn plant cover food sun four between state
keep eye never last let thought city tree cross farm hard start might story saw far sea draw left
late run don't while press close night real life few north open seem together next white children
begin got walk example ease paper group always music those both mark often letter until mile river
car feet care second book carry took science eat room friend began idea fish mountain stop once
base hear horse cut sure watch color face wood main enough plain girl usual young ready above ever
red list though feel talk bird soon body dog family direct pose leave song measure door product
black short numeral class wind question happen complete ship area half rock order fire south
problem piece told knew pass since top whole king space heard best hour better true during hundred
five remember step early hold west ground interest reach fast verb sing listen six table travel
less morning ten simple several vowel toward war lay against pattern slow center love person money
serve appear road map rain rule govern pull cold notice voice unit power town fine certain fly fall
lead cry dark machine note wait plan figure star box noun field rest correct able pound done beauty
drive stood contain front teach week final gave green oh quick develop ocean warm free minute
strong special mind behind clear tail produce fact street inch multiply nothing course stay wheel
full force blue object decide surface deep moon island foot system busy test record boat common
gold possible plane stead dry wonder laugh thousand ago ran check game shape equate miss brought
heat snow tire bring yes distant fill east paint language among hello speak speech kitchen light
lights temperature degrees weather today tomorrow timer alarm minutes seconds hours door window
garage battery low please thank thanks sorry welcome
"""
_SUFFIXES = "s es ed ing er est ly tion ment ness able ful less ous ive al ity ize"
_CJK_PUNCT = "，。、！？：；“”‘’（）《》…—"


def _vocabulary() -> dict[str, int]:
    tokens: list[str] = ["[PAD]", *(f"[unused{i}]" for i in range(1, 100))]
    tokens += ["[UNK]", "[CLS]", "[SEP]", "[MASK]", "<S>", "<T>"]
    tokens += [chr(c) for c in range(33, 127) if not chr(c).isupper()]
    tokens += [f"##{chr(c)}" for c in range(33, 127) if chr(c).isalnum() and not chr(c).isupper()]
    tokens += list(_CJK_PUNCT)
    seen = set(tokens)
    words = [w for w in _ENGLISH_WORDS.split() if w.isalpha()]
    for w in words + [f"##{s}" for s in _SUFFIXES.split()]:
        if w not in seen:
            seen.add(w)
            tokens.append(w)
    cp = 0x4E00  # CJK Unified Ideographs, in code point order (most common characters included)
    while len(tokens) < VOCAB_SIZE:
        tokens.append(chr(cp))
        cp += 1
    assert tokens.index("[UNK]") == 100
    return {t: i for i, t in enumerate(tokens)}


def build_tokenizer() -> Tokenizer:
    """The ChatTTS-shaped tokenizer (padding/truncation enabled exactly like the real file)."""
    tok = Tokenizer(
        models.WordPiece(_vocabulary(), unk_token="[UNK]", max_input_chars_per_word=100)
    )
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 101), ("[SEP]", 102)],
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tok.add_special_tokens(list(BERT_SPECIALS) + list(SPECIAL_TOKENS))
    tok.enable_truncation(max_length=256)
    tok.enable_padding(length=256, pad_id=0, pad_token="[PAD]")
    for i, name in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(name) != FIRST_SPECIAL_ID + i:
            raise AssertionError(f"special token {name} got id {tok.token_to_id(name)}")
    return tok


def _special_entry(content: str) -> dict:
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
    }


def _tokenizer_config() -> dict:
    added = {str(i): {**_special_entry(t), "special": True} for t, i in BERT_SPECIALS.items()}
    added |= {
        str(FIRST_SPECIAL_ID + i): {**_special_entry(t), "special": True}
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "added_tokens_decoder": added,
        "additional_special_tokens": list(SPECIAL_TOKENS),
        "clean_up_tokenization_spaces": True,
        "cls_token": "[CLS]",
        "do_basic_tokenize": True,
        "do_lower_case": True,
        "mask_token": "[MASK]",
        "max_length": 256,
        "model_max_length": 1000000000000000019884624838656,
        "never_split": None,
        "pad_to_multiple_of": None,
        "pad_token": "[PAD]",
        "pad_token_type_id": 0,
        "padding_side": "right",
        "sep_token": "[SEP]",
        "stride": 0,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "tokenizer_class": "BertTokenizer",
        "truncation_side": "right",
        "truncation_strategy": "longest_first",
        "unk_token": "[UNK]",
    }


def _special_tokens_map() -> dict:
    return {
        "additional_special_tokens": [_special_entry(t) for t in SPECIAL_TOKENS],
        **{
            f"{k}_token": _special_entry(f"[{k.upper()}]")
            for k in ("cls", "mask", "pad", "sep", "unk")
        },
    }


def write_tokenizer(folder: Path) -> None:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save(str(folder / "tokenizer.json"), pretty=True)
    for name, data in (
        ("tokenizer_config.json", _tokenizer_config()),
        ("special_tokens_map.json", _special_tokens_map()),
    ):
        (folder / name).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
