"""Benches of what the audio is worth to a listener, by a recogniser's ear: word error rate and
word timings."""
