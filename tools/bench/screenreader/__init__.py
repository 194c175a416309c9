"""``bench screenreader``: a screen reader's SSIP traffic replayed against speakd and Speech
Dispatcher, its navigation phase, speakd's parts of each new text, and the SSIP client."""
