"""``speakd-tools bench <name>``: the benchmarks behind docs/benchmarks.md, one module each.

Measurement modules (each an ``add_arguments(parser)`` and a ``run(args) -> int``): ``chattts``
(every ChatTTS contender in one run), ``engine``, ``batch``, ``cache``, ``mqtt``, ``vits``,
``profile``, ``wyoming``, ``http``, ``pitch``. Shared by them: ``stats`` (percentiles, load
average, peak memory), ``report`` and ``plots`` (the ``chattts`` table and figures). The
reliability figures come from the test suite itself (docs/reliability.md): a tool never runs the
tests.
"""
