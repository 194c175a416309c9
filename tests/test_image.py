"""The container image (`make image`), run from its unpacked root as it declares itself.

`podman run` cannot work on these machines (the sandbox refuses setrlimit), so the test does what
a runtime does: ``podman image mount`` gives the image's root, and ``unshare`` starts the declared
entry point in new mount, PID and network namespaces, chrooted there, as the declared user, with
exactly the declared environment (plus the default PATH a runtime adds when the image sets none),
in the declared working directory, with a host folder mounted on the declared volume ``/data``
and a tmpfs on /tmp. The ``wyoming`` client and the ``openai`` SDK then speak to it from inside its
network namespace (``nsenter --net``: its ports are its own, as with a container's network).

The image build takes minutes, so the suite only runs this when the image is there;
``make image-test`` builds it (cached base) and runs this file with SPEAKD_IMAGE_REQUIRED=1.
tests/test_addon.py checks the image's config file and the add-on in the suite itself.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import setups

ROOT = Path(__file__).resolve().parent.parent
VERSION = next(
    line.split('"')[1]
    for line in (ROOT / "pyproject.toml").read_text().splitlines()
    if line.startswith("version = ")
)
IMAGE = os.environ.get("SPEAKD_IMAGE", f"localhost/speakd:{VERSION}")
ADDON_IMAGE = f"localhost/speakd-addon:{VERSION}"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SHARED = ROOT / "homeassistant" / "speakd" / "rootfs" / "usr" / "local"  # both images' files
HEALTH = ["CMD", "/usr/local/bin/speakd-healthcheck"]


def _image_there() -> bool:
    if not shutil.which("podman") or os.geteuid() != 0:
        return False
    return subprocess.run(["podman", "image", "exists", IMAGE]).returncode == 0


if not _image_there():
    if os.environ.get("SPEAKD_IMAGE_REQUIRED"):
        raise RuntimeError(f"{IMAGE} is not in podman's store: `make image` builds it")
    pytest.skip(f"no {IMAGE} (`make image-test` builds and checks it)", allow_module_level=True)

pytestmark = pytest.mark.timeout(600)


@dataclass
class Declared:
    """What the image says about how to run it (docker format: podman inspect's Config)."""

    config: dict
    health: dict  # HEALTHCHECK: podman inspect has it beside Config, not in it
    root: Path

    @property
    def argv(self) -> list[str]:
        return list(self.config.get("Entrypoint") or []) + list(self.config.get("Cmd") or [])

    @property
    def env(self) -> dict[str, str]:
        env = dict(e.split("=", 1) for e in self.config.get("Env") or [])
        env.setdefault("PATH", DEFAULT_PATH)
        return env

    def ids(self, user: str) -> tuple[int, int]:
        """uid and gid of ``user`` (a name or UID[:GID]) as the image's /etc/passwd has them."""
        name, _, group = user.partition(":")
        if name.isdigit():
            return int(name), int(group or name)
        for line in (self.root / "etc" / "passwd").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == name:
                return int(fields[2]), int(group or fields[3])
        raise LookupError(f"no user {name} in the image")


def mounted(name: str) -> Iterator[Declared]:
    (info,) = json.loads(subprocess.run(
        ["podman", "image", "inspect", name], capture_output=True, text=True, check=True
    ).stdout)  # fmt: skip
    root = subprocess.run(
        ["podman", "image", "mount", name], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        yield Declared(info["Config"], info.get("Healthcheck") or {}, Path(root))
    finally:
        subprocess.run(["podman", "image", "unmount", name], capture_output=True)


@pytest.fixture(scope="module")
def image() -> Iterator[Declared]:
    yield from mounted(IMAGE)


@pytest.fixture(scope="module")
def addon() -> Iterator[Declared]:
    """The add-on's image, built by `make image-test` (container/build.sh --addon yes)."""
    if subprocess.run(["podman", "image", "exists", ADDON_IMAGE]).returncode != 0:
        if os.environ.get("SPEAKD_IMAGE_REQUIRED"):
            raise RuntimeError(f"no {ADDON_IMAGE}: container/build.sh --addon yes builds it")
        pytest.skip(f"no {ADDON_IMAGE} (`make image-test` builds it)")
    yield from mounted(ADDON_IMAGE)


class Container:
    """The entry point started the way a runtime would, in its own namespaces."""

    def __init__(
        self,
        image: Declared,
        data: Path,
        user: str | None = None,
        reads: str = "/etc/speakd/speakd.toml",
        **env_given: str,
    ) -> None:
        """``user`` as ``--user``, ``env_given`` as ``-e`` (or what the Supervisor sets);
        ``reads``: the config file its entry point reads, recorded with the entry point as the
        repository files this set-up starts (tests/setups.py)."""
        setups.started_in_image(image.root, image.argv[0], reads)
        uid, gid = image.ids(user or image.config.get("User") or "root")
        workdir = image.config.get("WorkingDir") or "/"
        env = [f"{k}={v}" for k, v in {**image.env, **env_given}.items()]
        r = image.root
        script = (
            "set -e; mount --make-rprivate /;"
            f"mount -t proc proc {r}/proc; mount --rbind /dev {r}/dev;"
            f"mount -t tmpfs -o mode=1777 tmpfs {r}/tmp; mount --bind {data} {r}/data;"
            "ip link set lo up;"
            f"exec chroot --userspec={uid}:{gid} --groups={gid} {r}"
            f' /usr/bin/env -i -C {workdir} "$@"'
        )
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--pid", "--net", "--fork", "--kill-child", "--",
             "sh", "-c", script, "container", *env, *image.argv],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        # nsenter joins whatever namespace the pid has: wait until unshare made its own
        ours, deadline = os.readlink("/proc/self/ns/net"), time.monotonic() + 30
        while os.readlink(f"/proc/{self.proc.pid}/ns/net") == ours:
            assert time.monotonic() < deadline and self.proc.poll() is None, self.stop()
            time.sleep(0.01)

    def health(self, image: Declared) -> subprocess.CompletedProcess[str]:
        """The declared health check, run as a runtime runs it: in the container, as its user,
        with its environment."""
        uid, gid = image.ids(image.config.get("User") or "root")
        assert image.health["Test"][0] == "CMD"
        return subprocess.run(
            ["nsenter", "-t", str(self.init_pid()), "-n", "-m", "-r", "-w",
             "-S", str(uid), "-G", str(gid), "--", "/usr/bin/env", "-i",
             *(f"{k}={v}" for k, v in image.env.items()), *image.health["Test"][1:]],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    def nsenter(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run a host program in the container's network namespace."""
        return subprocess.run(
            ["nsenter", f"--net=/proc/{self.proc.pid}/ns/net", "--", *argv],
            capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        )  # fmt: skip

    def init_pid(self) -> int:
        """The entry point's host pid: PID 1 of the container, what a runtime signals."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        return int(children.split()[0])

    def stop(self) -> str:
        """``docker stop``: SIGTERM to PID 1 (the kernel's parent-death signal does not reach a
        process that changed its user), then its output."""
        if self.proc.poll() is None:
            os.kill(self.init_pid(), signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=60)
        return out


def test_the_image_declares_how_it_runs(image: Declared) -> None:
    c = image.config
    assert c["User"] == "speakd" and image.ids("speakd") == (10200, 10200)
    assert c["WorkingDir"] == "/data" and set(c["Volumes"]) == {"/data"}
    assert set(c["ExposedPorts"]) == {"10200/tcp", "5500/tcp"}
    assert image.argv == ["/usr/local/bin/speakd-entrypoint"]
    assert image.health["Test"] == HEALTH
    config = (image.root / "etc/speakd/speakd.toml").read_text()
    assert config == (SHARED / "share/speakd/speakd.toml").read_text()  # the add-on's base too
    labels = c["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.licenses"] == "GPL-3.0-or-later"
    assert labels["org.opencontainers.image.source"]
    # speakd from the project's .deb, known to dpkg inside
    status = (image.root / "var/lib/dpkg/status").read_text()
    assert "Package: speakd\nStatus: install ok installed" in status


def test_the_entry_point_speaks_wyoming_and_openai_with_its_cache_on_data(
    image: Declared, tmp_path: Path
) -> None:
    data = tmp_path / "data"  # a fresh named volume: the image's /data, owned by speakd
    data.mkdir()
    os.chown(data, 10200, 10200)
    container = Container(image, data)
    try:
        token_file = data / "http-token"
        text = "The image speaks from its own root."
        # the token is made by the entry point at its start: wait for the HTTP port first
        r = container.nsenter(sys.executable, "-c", (
            "from tests.image_clients import wait_for_port; wait_for_port(5500)"
        ))  # fmt: skip
        assert r.returncode == 0, r.stderr + container.stop()
        r = container.nsenter(
            sys.executable, "-m", "tests.image_clients", "10200", "5500",
            token_file.read_text().strip(), text,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr + container.stop()
        got = json.loads(r.stdout)
        assert got["wyoming"]["rate"] == 22050 and got["wyoming"]["pcm_bytes"] > 22050
        assert got["openai"]["riff"] and got["openai"]["cache"] == "hit"  # Wyoming cached it
        cache = data / "cache" / "cache.db"
        assert cache.is_file() and cache.stat().st_uid == 10200
        r = container.health(image)
        assert r.returncode == 0 and json.loads(r.stdout) == {"status": "ok"}, r.stdout + r.stderr
    finally:
        log = container.stop()
    print(log)
    assert "Wyoming" in log and "Traceback" not in log


def test_a_data_folder_owned_by_someone_else(image: Declared, tmp_path: Path) -> None:
    """A bind mount of a host folder: the declared user cannot write it and says how to run;
    started with ``--user`` its owner, the same image serves."""
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, 4321, 4321)
    data.chmod(0o755)
    refused = Container(image, data)
    log = refused.stop() if refused.proc.wait(timeout=60) is not None else ""
    assert refused.proc.returncode == 78, log
    assert "--user 4321:4321" in log and "Traceback" not in log
    container = Container(image, data, user="4321:4321")
    try:
        r = container.nsenter(sys.executable, "-c", (
            "from tests.image_clients import wait_for_port; wait_for_port(5500)"
        ))  # fmt: skip
        assert r.returncode == 0, r.stderr + container.stop()
        assert (data / "cache").stat().st_uid == 4321
        assert (data / "http-token").stat().st_mode & 0o077 == 0
    finally:
        container.stop()


def test_the_add_on_image_configures_drops_to_speakd_and_announces(
    addon: Declared, tmp_path: Path
) -> None:
    """The add-on as the Supervisor starts it: as root, options in /data/options.json,
    SUPERVISOR_TOKEN in its environment (the Supervisor's address moved to a stand-in inside
    the container's network)."""
    assert addon.ids("speakd") == (10200, 10200)  # as the container image's
    assert addon.health["Test"] == HEALTH
    data = tmp_path / "data"
    (data / "cache").mkdir(parents=True)
    options = {"voice": "", "speaker": "", "cache_size_mb": 32, "api_token": "addon-token"}
    (data / "options.json").write_text(json.dumps(options))
    # a cache an older image made when speakd had another uid: the start gives it to speakd
    (data / "cache" / "cache.db").touch(mode=0o644)
    os.chown(data / "cache" / "cache.db", 4321, 4321)
    container = Container(
        addon,
        data,
        reads="/usr/local/share/speakd/speakd.toml",  # speakd-addon's base
        SUPERVISOR_TOKEN="sv-token",
        SPEAKD_ADDON_SUPERVISOR="http://127.0.0.1:8765",
    )
    seen = tmp_path / "discovery.json"
    try:
        stand_in = subprocess.Popen(
            ["nsenter", f"--net=/proc/{container.proc.pid}/ns/net", "--", sys.executable,
             "-m", "tests.image_clients", "supervisor", "8765", str(seen)], cwd=ROOT,
        )  # fmt: skip
        r = container.nsenter(
            sys.executable, "-m", "tests.image_clients", "10200", "5500", "addon-token",
            "The add-on speaks.",
        )  # fmt: skip
        assert r.returncode == 0, r.stderr + container.stop()
        got = json.loads(r.stdout)
        assert got["wyoming"]["pcm_bytes"] > 0 and got["openai"]["riff"]
        stand_in.wait(timeout=60)
        discovery = json.loads(seen.read_text())
        assert discovery["path"] == "/discovery" and discovery["auth"] == "Bearer sv-token"
        body = json.loads(discovery["body"])
        assert body["service"] == "wyoming" and body["config"]["uri"].endswith(":10200")
        # the script stays root; speakd, its child, runs as speakd
        script = container.init_pid()
        (child,) = Path(f"/proc/{script}/task/{script}/children").read_text().split()
        uids = Path(f"/proc/{child}/status").read_text().split("Uid:")[1].split()[:2]
        assert uids == [str(addon.ids("speakd")[0])] * 2
        assert (data / "cache" / "cache.db").stat().st_uid == addon.ids("speakd")[0]
        assert got["openai"]["cache"] == "hit"  # Wyoming's audio went into that cache.db
        assert "cache_size_mb" not in (data / "speakd.toml").read_text()
        # the health check, as the add-on's runtime runs it (as root, the image's user)
        r = container.health(addon)
        assert r.returncode == 0 and json.loads(r.stdout) == {"status": "ok"}, r.stdout + r.stderr
        assert f"max_bytes = {32 * 1024 * 1024}" in (data / "speakd.toml").read_text()
    finally:
        log = container.stop()
    assert "Wyoming discovery sent" in log and "Traceback" not in log, log
