"""``bench fleet``: a signed prompt pack rolled out to simulated boards over one mosquitto."""
