"""What every bench uses the same way: ``stats`` (timing, percentiles, load average, peak
memory), ``machine`` (the machine line every table carries), ``daemon`` (a real daemon to bench
against, free loopback ports), ``loopstall`` (a daemon's event-loop stalls during a run)."""
