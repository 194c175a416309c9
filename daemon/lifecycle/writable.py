"""Whether the service's user can write where the config says, judged for that user.

``speakd doctor`` runs as root on a board, where ``os.access`` says yes to everything; the system
service runs as user ``speakd``. So the file modes are read and judged against that user's uid and
groups: write and search on the directory that holds the file (SQLite makes ``-wal``/``-shm``
files beside it), read and write on the file, search on every directory above. A directory that
systemd makes for the service when it starts (``CacheDirectory=``, ``StateDirectory=``) counts as
the user's own.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass, field
from pathlib import Path

from speakd.cache.versions import FILE as PACK_VERSIONS
from speakd.paths import SERVICE_USER

JOURNAL = "mqtt-journal.db"  # the MQTT journal in the state directory (lifecycle/service.py)
STATE_FILES = (PACK_VERSIONS, JOURNAL)  # the databases speakd writes in [state] dir

# The directories speakd.service's CacheDirectory=/StateDirectory= create, owned by its user.
SERVICE_DIRS = (Path("/var/cache/speakd"), Path("/var/lib/speakd"))


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gids: frozenset[int] = field(default_factory=frozenset)
    made_for_it: tuple[Path, ...] = ()  # directories systemd creates for it at start

    def may(self, st: os.stat_result, read: bool = False, write: bool = False) -> bool:
        """Whether the mode bits let this account search/read/write (x always for a directory)."""
        if self.uid == 0:
            return True
        if st.st_uid == self.uid:
            shift = 6
        elif st.st_gid in self.gids:
            shift = 3
        else:
            shift = 0
        want = (4 if read else 0) | (2 if write else 0) | (1 if stat.S_ISDIR(st.st_mode) else 0)
        return (st.st_mode >> shift) & want == want


def service_account() -> Account:
    """Whom the daemon runs as: as root, the system service's user when it exists; else me."""
    name = SERVICE_USER if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        entry = pwd.getpwuid(os.geteuid())
    made = SERVICE_DIRS if entry.pw_name == SERVICE_USER else ()
    gids = frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))
    return Account(entry.pw_name, entry.pw_uid, gids, made)


def unwritable(path: Path, account: Account, is_dir: bool = False) -> str:
    """Why ``account`` could not create or write ``path`` (a file, or a directory with
    ``is_dir``); empty when it can."""
    path = Path(os.path.abspath(path))
    folder = path if is_dir else path.parent
    existing = folder
    while not existing.exists():
        if existing in account.made_for_it:
            return ""
        existing = existing.parent
    for above in reversed(existing.parents):
        if not account.may(above.stat()):
            return f"{account.name} cannot enter {above}"
    st = existing.stat()
    if not stat.S_ISDIR(st.st_mode):
        return f"{existing} is not a directory"
    if not account.may(st, write=True):
        what = "write in" if existing == folder else f"create {folder} in"
        return f"{account.name} cannot {what} {existing} (owner uid {st.st_uid}, mode " + (
            f"{stat.S_IMODE(st.st_mode):04o})"
        )
    if not is_dir and path.exists() and not account.may(path.stat(), read=True, write=True):
        return f"{account.name} cannot read and write {path}"
    return ""


def unwritable_files(paths: list[Path], account: Account) -> list[str]:
    """Each existing file of ``paths`` that ``account`` cannot read and write, with its owner
    and mode (what to fix)."""
    problems = []
    for path in paths:
        if path.exists() and not account.may(st := path.stat(), read=True, write=True):
            problems.append(
                f"{account.name} cannot write {path} (owner uid {st.st_uid}, mode "
                f"{stat.S_IMODE(st.st_mode):04o})"
            )
    return problems
