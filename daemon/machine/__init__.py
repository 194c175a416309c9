"""This board: its CPU, memory and NPU, and which request a log line belongs to."""
