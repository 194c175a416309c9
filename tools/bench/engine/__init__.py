"""Benches of the engines and their kernels, run in this process (or a child per contender):
ChatTTS against its torch pipeline, its decode step, batching and profiles; the Piper voice's
first audio and floor; pitch shifting."""
