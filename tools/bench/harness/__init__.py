"""What every bench uses the same way: ``stats`` (timing, percentiles, load average, peak
memory), ``machine`` (the machine line every table carries), ``loopstall`` (a daemon's
event-loop stalls during a run)."""
