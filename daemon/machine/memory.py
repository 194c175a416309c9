"""The process's resident memory, and giving freed heap back to the system.

A model load builds the graph several times over (the file's bytes, the parsed ModelProto, the
serialised copy onnxruntime reads) and frees it; glibc keeps that freed heap mapped, so without a
trim the daemon's RSS carries ~90 MB of garbage per Piper voice load (measured on the embedded
voice: 350 MB loaded, 258 MB trimmed).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import mmap
import os


def rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MADV_DONTNEED = 4  # sys/mman.h, the same value on every Linux architecture
MMAP_THRESHOLD = 256 * 1024  # twice glibc's starting value, held fixed
ARENA_MAX = 2


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"))


def _libc_call(function: str, *args: object) -> None:
    """Call one of libc's functions; a no-op where libc has none (musl, macOS)."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        getattr(_libc(), function)(*args)


def trim_heap() -> None:
    """``malloc_trim(0)``: return freed heap to the system."""
    _libc_call("malloc_trim", 0)


def bound_heap() -> None:
    """Keep glibc's heap from growing with the traffic; call before the daemon starts threads.

    Under mixed requests the heap in use stayed flat while the freed heap glibc kept grew
    (mallinfo2: ~215 MB in use throughout, 170 → 320 MB free): once a large block (a long
    text's audio) is freed, glibc raises its mmap threshold to that size, so the next ones come
    from the heap and leave holes it cannot return, in up to 8 arenas per core (one per
    synthesis thread at a time). A fixed threshold keeps every block over 256 KiB in a mapping of
    its own, unmapped when freed, and two arenas bound the rest (docs/reliability.md §8 has the
    measurements). A no-op without glibc.
    """
    _libc_call("mallopt", M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    _libc_call("mallopt", M_ARENA_MAX, ARENA_MAX)


def release_pages(address: int, length: int) -> None:
    """Give back the whole pages inside ``[address, address + length)``; they read as zeros.

    For a buffer that lives as long as the process but is used in bursts (ChatTTS's KV cache:
    a row's slot is touched as far as its sentence went, then left), so RSS follows the rows
    in flight instead of the longest sentence each slot has ever held. Only pages wholly inside
    the range are given back: the bytes around it may belong to something else.
    """
    start = -(-address // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (address + length) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > start:
        _libc_call("madvise", ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_DONTNEED)
