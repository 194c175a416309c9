"""Markup parsed before ``prepare``: what a request says, as a list of engine-neutral segments.

``segments`` holds the canonical form (text with its voice and prosody, a break, a mark, a clip,
phonemes) and its serialisation for the audio key; ``ssml`` parses the SSML subset into it
(``<say-as>`` numbers are read by ``speakd.engines.sayas``, which ChatTTS's text front-end
shares), ``lexicon`` applies a user's pronunciations and ``punctuation`` says symbols by name.
docs/ssml.md describes the subset.
"""
