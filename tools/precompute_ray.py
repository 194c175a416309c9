"""``speakd-tools precompute --ray ADDRESS``: the same workers, as a Ray actor pool.

``ray.util.multiprocessing.Pool`` is Ray's drop-in for a process pool: each worker is an actor
that runs precompute's own initializer (one engine per actor) and its ``imap`` hands the batches
out across the cluster and yields the results in submission order. So the keys pass, the skip of
prompts already in the pack, the batches and the order clips are written are the ones of a
single-host run, and the pack holds the same rows (key, text, voice, params, audio);
``tests/test_precompute_ray.py`` checks it on a local cluster. Ray does the scheduling, retries and
placement; nothing here decides which node runs what.

Every node needs the same speakd (``pip install 'speakd[host]'``) and, for ``--bundle``, the
bundle at the same path (docs/fleet.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from typing import Any

log = logging.getLogger(__name__)


class RayPool(Executor):
    """``workers`` actors (0 = one per CPU of the cluster) behind ``Executor.map``."""

    def __init__(
        self,
        address: str,
        workers: int,
        initializer: Callable[..., None],
        initargs: tuple[Any, ...],
    ) -> None:
        import ray
        from ray.util.multiprocessing import Pool

        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:  # "local" starts a cluster on this host; else connect to ADDRESS
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
        self.workers = workers or int(ray.cluster_resources().get("CPU", 1))
        log.info("precompute on Ray (%s): %d workers", address, self.workers)
        self._pool = Pool(self.workers, initializer=initializer, initargs=initargs)

    def map(self, fn: Callable[..., Any], *iterables: Any, **_: Any) -> Iterator[Any]:  # type: ignore[override]
        (items,) = iterables
        return self._pool.imap(fn, items)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        import ray

        self._pool.close()
        if wait:
            self._pool.join()
        if self._owns_ray:
            ray.shutdown()
