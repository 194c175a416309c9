"""``speakd-tools bench <name>``: the benchmarks behind docs/benchmarks.md, one module each,
grouped by what they measure (docs/architecture.md, "The host tools and their benches").

``engine/`` the engines and their kernels in this process; ``frontends/`` a real daemon through its
front-ends; ``memory/`` a real daemon's memory; ``screenreader/`` a screen reader's SSIP traffic;
``quality/`` what the audio sounds like to a recogniser; ``fleet/`` a pack rollout to simulated
boards. Each bench module is an ``add_arguments(parser)`` and a ``run(args) -> int`` (or
``measure``/``table``), registered in ``cli.py``. ``harness/`` is what every bench shares: ``stats``
(timing, percentiles, load average, peak memory), ``machine`` (the machine line), ``daemon`` (a real
``speakd serve`` and free ports), ``loopstall`` (a daemon's event-loop stalls). The reliability
figures come from the test suite itself (docs/reliability.md): a tool never runs the tests.
"""
