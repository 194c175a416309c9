"""Access: a real ``speakd serve`` on MQTT over TLS with a username/password against a real
mosquitto (password file from ``mosquitto_passwd``, certificates from a throw-away ``openssl`` CA):
refusals, password rotation on SIGHUP, a wrong CA, and ``speakd doctor`` saying which; plus
source-level checks that user text never reaches a shell and SQL is parameterised only.
(tests/test_mqtt.py covers the front-end's TLS connection in-process.)
"""

from __future__ import annotations

import ast
import io
import json
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from speakd.lifecycle.doctor import run_doctor
from tests.daemon_proc import DaemonProc, start_daemon, write_config
from tests.mosquitto import Mosquitto
from tests.test_mqtt import make_tls_files, mqtt_toml
from tests.waits import wait_until

DAEMON = Path(__file__).resolve().parents[1] / "daemon"
SITE = "vault"
USER, PASSWORD = "speakd", "s3cret"  # what make_tls_files puts in the password file

pytestmark = pytest.mark.skipif(
    not (shutil.which("openssl") and shutil.which("mosquitto_passwd")),
    reason="needs openssl and mosquitto_passwd",
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.crt signs server.crt (SAN 127.0.0.1); rogue.crt is another CA that signed nothing."""
    d = tmp_path_factory.mktemp("pki")
    make_tls_files(d)
    rogue = make_tls_files(tmp_path_factory.mktemp("rogue"))["ca.crt"]
    shutil.copy(rogue, d / "rogue.crt")
    return d


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Path) -> Iterator[Mosquitto]:
    b = Mosquitto(
        tmp_path_factory.mktemp("tlsbroker"),
        listener=(
            f"cafile {pki / 'ca.crt'}\ncertfile {pki / 'server.crt'}\n"
            f"keyfile {pki / 'server.key'}\npassword_file {pki / 'passwd'}\n"
        ),
        anonymous=False,
    ).start()
    yield b
    b.stop()


def secure_cli(tool: str, broker: Mosquitto, pki: Path, *args: str) -> list[str]:
    return [
        tool, "-h", "127.0.0.1", "-p", str(broker.port), "-V", "5", "--cafile", str(pki / "ca.crt"),
        "-u", USER, "-P", PASSWORD, *args,
    ]  # fmt: skip


def write_tls_config(tmp: Path, broker: Mosquitto, pki: Path, ca: str) -> Path:
    secret = tmp / "mqtt-password"
    tls = f'tls = true\nca_file = "{pki / ca}"\nusername = "{USER}"\npassword_file = "{secret}"\n'
    return write_config(tmp, mqtt_toml(broker, SITE, tls))


def wait_log(d: DaemonProc, needle: str, after: int = 0, timeout: float = 30) -> str:
    return wait_until(
        lambda: text if needle in (text := d.log_text()[after:]) else "", repr(needle), timeout
    )


def doctor_mqtt(config: Path, d: DaemonProc) -> str:
    out = io.StringIO()
    run_doctor(config, d.socket, out=out)
    return next(line for line in out.getvalue().splitlines() if "] mqtt:" in line)


def test_plain_and_anonymous_clients_are_refused(broker: Mosquitto, pki: Path) -> None:
    """The broker under test really demands TLS and a password (else the tests below prove
    nothing)."""
    plain = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-t", "x", "-m", "1"]
    assert subprocess.run(plain, capture_output=True, timeout=30).returncode != 0
    anonymous = [a for a in secure_cli("mosquitto_pub", broker, pki) if a not in ("-u", USER)]
    anonymous = [a for a in anonymous if a not in ("-P", PASSWORD)] + ["-t", "x", "-m", "1"]
    assert subprocess.run(anonymous, capture_output=True, timeout=30).returncode != 0


def test_tls_with_password_rotation_and_a_wrong_ca(
    tmp_path: Path, broker: Mosquitto, pki: Path
) -> None:
    config = write_tls_config(tmp_path, broker, pki, "ca.crt")
    secret = tmp_path / "mqtt-password"
    secret.write_text("wrong password\n")
    d = start_daemon(config)
    try:
        # 1. wrong password: refused, said so in the log and by doctor; the sockets still serve
        wait_log(d, "refused the connection")
        assert d.cli("status").returncode == 0
        line = doctor_mqtt(config, d)
        assert line.startswith("[FAIL]") and "refused the connection" in line, line

        # 2. the password file is rotated: SIGHUP reconnects with it (same config otherwise)
        secret.write_text(PASSWORD + "\n")
        mark = len(d.log_text())
        d.proc.send_signal(signal.SIGHUP)
        wait_log(d, "MQTT: connected", mark)
        line = doctor_mqtt(config, d)
        assert line.startswith("[ OK ]") and "(TLS): connected as 'speakd'" in line, line
        say = json.dumps({"text": "Over TLS.", "id": "tls1"})
        rr = secure_cli(
            "mosquitto_rr", broker, pki, "-q", "1", "-t", f"speakd/{SITE}/say",
            "-e", "test/tls", "-m", say, "-W", "20",
        )  # fmt: skip
        r = subprocess.run(rr, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr + d.log_text()[-2000:]
        assert json.loads(r.stdout) == {"id": "tls1", "status": "queued", "position": 0}

        # 3. a CA that did not sign the broker's certificate: no connection, doctor says why
        config.write_text(config.read_text().replace(str(pki / "ca.crt"), str(pki / "rogue.crt")))
        mark = len(d.log_text())
        d.proc.send_signal(signal.SIGHUP)
        wait_log(d, "configuration reloaded", mark)
        line = doctor_mqtt(config, d)
        assert line.startswith("[FAIL]") and "TLS failed (" in line, line
        wait_log(d, "unreachable; retrying", mark)  # a connection attempt with it failed
        assert "MQTT: connected" not in d.log_text()[mark:]
        assert d.cli("status").returncode == 0
    finally:
        assert d.stop() == 0, d.log_text()[-3000:]


# ---- source-level checks -----------------------------------------------------------------------


def python_files() -> list[Path]:
    return sorted(DAEMON.rglob("*.py"))


def test_the_daemon_never_starts_processes() -> None:
    """No shell, no subprocess: user text can never reach a command line."""
    banned = {"subprocess", "pty", "commands"}
    calls = {"system", "popen", "spawnl", "spawnlp", "spawnv", "spawnvp", "execv", "execvp"}
    calls |= {"execl", "execlp", "execle", "execve", "posix_spawn", "posix_spawnp", "startfile"}
    found = []
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                found += [f"{path}:{node.lineno} imports {n}" for n in names if n in banned]
            elif (
                isinstance(node, ast.Attribute)
                and node.attr in calls
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
            ):
                found.append(f"{path}:{node.lineno} calls os.{node.attr}")
    assert not found, found


SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|PRAGMA|FROM|WHERE|VALUES|ORDER BY)\b")
# The only interpolations allowed in SQL text: a placeholder list, choices among constants
# (an ORDER BY; the clips table with or without its index, ``source``), constant column lists
# and conditions of speakd.cache.browse, and the store's busy timeout in ms.
SAFE_INTERPOLATIONS = {
    "','.join('?' * len(evicted))",
    "orders[order]",
    "source",
    "COLUMNS",
    "_WHERE",
    "int(BUSY_S * 1000)",
}


def is_sql(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and bool(SQL.search(node.value))
    )


def sql_findings(path: Path) -> list[str]:
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.JoinedStr) and any(is_sql(v) for v in node.values):
            holes = {
                ast.get_source_segment(source, v.value)
                for v in node.values
                if isinstance(v, ast.FormattedValue)
            }
            found += [
                f"{path}:{node.lineno} interpolates {h}"
                for h in sorted(holes - SAFE_INTERPOLATIONS)
            ]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and is_sql(node.left):
            found.append(f"{path}:{node.lineno} %-formats SQL")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "format"
            and is_sql(node.func.value)
        ):
            found.append(f"{path}:{node.lineno} .format()s SQL")
    return found


def test_sql_is_parameterised_only() -> None:
    """SQL text is literal: no f-string, %-format or .format() builds it from values, except the
    reviewed forms above; values always travel as ? parameters."""
    found = [f for path in python_files() for f in sql_findings(path)]
    assert not found, found


def test_sql_check_catches_an_interpolated_value(tmp_path: Path) -> None:
    """The check above can fail: a value interpolated into SQL, or %-formatted, is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f(db, key, n):\n"
        '    db.execute(f"DELETE FROM clips WHERE key = {key}")\n'
        '    db.execute("SELECT * FROM clips LIMIT %d" % n)\n'
        '    db.execute(f"SELECT key FROM clips ORDER BY {orders[order]}")\n'
    )
    found = sql_findings(bad)
    assert [f.split(" ", 1)[1] for f in found] == ["interpolates key", "%-formats SQL"], found
