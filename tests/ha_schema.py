"""The Home Assistant Supervisor's rules for an add-on folder, written from its documented keys
and types (the add-on configuration page of developers.home-assistant.io, and the Supervisor's
``supervisor/addons/validate.py`` and ``options.py`` as of commit 00788af8 of
home-assistant/supervisor, 2025): which keys ``config.yaml`` and ``build.yaml`` may have, of what
type, and what each option schema element may say. The Supervisor drops keys it does not know;
this check refuses them, so a typo is found here rather than silently ignored there.
"""

from __future__ import annotations

import re
from typing import Any

ARCHES = {"armhf", "armv7", "aarch64", "amd64", "i386"}
SLUG = re.compile(r"^[-_.A-Za-z0-9]+$")
VERSION = re.compile(r"^[\w.+-]+$")
PORT_KEY = re.compile(r"^\d+(?:/(?:tcp|udp))?$")
MAP = re.compile(
    r"^(data|config|ssl|addons|backup|share|media|homeassistant_config|all_addon_configs"
    r"|addon_config)(?::(rw|ro))?$"
)
# ``watchdog``'s form (supervisor/apps/validate.py at commit 090ef31e, 2026-08-21)
WATCHDOG = re.compile(r"^(?:https?|\[PROTO:\w+\]|tcp)://\[HOST\]:(\[PORT:\d+\]|\d+).*$")
# The paths every add-on's token may call, with or without ``hassio_api`` (ADDONS_API_BYPASS of
# supervisor/api/middleware/security.py at commit 0636e49f, 2025; the same paths are the v1
# ``api_bypass`` at 090ef31e, and the add-on communication page lists them); anything else
# needs ``hassio_api: true`` and a role.
API_BYPASS = re.compile(
    r"^(?:|/addons/self/(?!security|update)[^/]+|/addons/self/options/config|/info"
    r"|/services.*|/discovery.*|/auth)$"
)
BUILD_FROM = re.compile(r"^([a-zA-Z\-.:\d{}]+/)*?([\-\w{}]+)/([\-\w{}]+)(:[.\-\w{}]+)?$")
SCHEMA_ELEMENT = re.compile(
    r"^(?:|bool|email|url|port|device(?:\(subsystem=[a-z]+\))?"
    r"|str(?:\((\d+)?,(\d+)?\))?|password(?:\((\d+)?,(\d+)?\))?"
    r"|int(?:\((\d+)?,(\d+)?\))?|float(?:\(([\d.]+)?,([\d.]+)?\))?"
    r"|match\((.*)\)|list\((.+)\))\??$"
)
ENUMS = {
    "startup": {"initialize", "system", "services", "application", "once"},
    "boot": {"auto", "manual", "manual_only"},
    "stage": {"stable", "experimental", "deprecated"},
    "hassio_role": {"default", "homeassistant", "backup", "manager", "admin"},
    "backup": {"hot", "cold"},
}
BOOLS = {
    "init", "advanced", "ingress", "ingress_stream", "panel_admin", "host_network", "host_pid",
    "host_ipc", "host_uts", "host_dbus", "udev", "tmpfs", "apparmor", "full_access", "audio",
    "video", "gpio", "usb", "uart", "devicetree", "kernel_modules", "realtime", "hassio_api",
    "homeassistant_api", "stdin", "legacy", "docker_api", "auth_api", "journald",
}  # fmt: skip
STRINGS = {
    "name", "description", "url", "ingress_entry", "panel_icon", "panel_title", "homeassistant",
    "backup_pre", "backup_post", "image", "webui", "watchdog",
}  # fmt: skip
STRING_LISTS = {"devices", "discovery", "backup_exclude", "privileged", "services", "machine"}
OTHER = {"version", "slug", "arch", "ports", "ports_description", "ingress_port", "map",
         "environment", "options", "schema", "ulimits", "timeout", "breaking_versions"}  # fmt: skip
REQUIRED = ("name", "version", "slug", "description", "arch")


def _port(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535


def check_config(config: dict[str, Any]) -> list[str]:
    """Every way ``config`` breaks the rules (empty: the Supervisor takes it)."""
    errors = [f"{key}: required" for key in REQUIRED if key not in config]
    for key, value in config.items():
        if key in BOOLS and not isinstance(value, bool):
            errors.append(f"{key}: must be true or false")
        elif key in STRINGS and not isinstance(value, str):
            errors.append(f"{key}: must be a string")
        elif key in STRING_LISTS and not (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            errors.append(f"{key}: must be a list of strings")
        elif key in ENUMS and value not in ENUMS[key]:
            errors.append(f"{key}: {value!r} is not one of {sorted(ENUMS[key])}")
        elif key not in BOOLS | STRINGS | STRING_LISTS | set(ENUMS) | OTHER:
            errors.append(f"{key}: not a key the Supervisor knows")
    if not isinstance(config.get("version"), str) or not VERSION.match(config["version"]):
        errors.append("version: must be a quoted version string")
    if not SLUG.match(str(config.get("slug", ""))):
        errors.append("slug: letters, digits, '-', '_' and '.' only")
    if not set(config.get("arch", [])) <= ARCHES or not config.get("arch"):
        errors.append(f"arch: a list of {sorted(ARCHES)}")
    for key, port in (config.get("ports") or {}).items():
        if not PORT_KEY.match(key) or not (port is None or _port(port)):
            errors.append(f"ports.{key}: want 'PORT/tcp': host port or null")
    for key, text in (config.get("ports_description") or {}).items():
        if key not in (config.get("ports") or {}) or not isinstance(text, str):
            errors.append(f"ports_description.{key}: describes no port")
    ingress_port = config.get("ingress_port", 8099)
    if not (_port(ingress_port) or ingress_port == 0):
        errors.append("ingress_port: a port, or 0")
    for entry in config.get("map", []):
        if isinstance(entry, str) and not MAP.match(entry):
            errors.append(f"map: {entry!r} is not a folder the Supervisor maps")
    if "watchdog" in config and not WATCHDOG.match(str(config["watchdog"])):
        errors.append("watchdog: want 'http://[HOST]:[PORT:N]/path' or 'tcp://[HOST]:[PORT:N]'")
    if "timeout" in config and not 10 <= config["timeout"] <= 300:
        errors.append("timeout: 10..300 s")
    return errors + check_options(config.get("options", {}), config.get("schema", {}))


def check_options(options: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """The schema's elements are types the Supervisor knows, and the default options fit it."""
    errors = []
    for key, element in schema.items():
        if not isinstance(element, str) or not SCHEMA_ELEMENT.match(element):
            errors.append(f"schema.{key}: {element!r} is not a Supervisor option type")
            continue
        if key not in options:
            if not element.endswith("?"):
                errors.append(f"options.{key}: missing, and schema says it is required")
            continue
        errors += [f"options.{key}: {e}" for e in fits(element, options[key])]
    errors += [f"options.{k}: not in schema" for k in options if k not in schema]
    return errors


def fits(element: str, value: Any) -> list[str]:
    """Whether a default value fits its element (the checks the Supervisor makes on save)."""
    kind = element.rstrip("?").split("(")[0]
    bounds = re.search(r"\(([\d.]*),([\d.]*)\)", element)
    if kind in ("str", "password", "email", "url", "match", "device"):
        ok = isinstance(value, str)
    elif kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "float":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif kind == "bool":
        ok = isinstance(value, bool)
    elif kind == "port":
        ok = _port(value)
    elif kind == "list":
        ok = str(value) in element.rstrip("?")[5:-1].split("|")
    else:
        ok = False
    if ok and bounds and kind in ("int", "float"):
        lo, hi = (float(b) if b else None for b in bounds.groups())
        ok = (lo is None or value >= lo) and (hi is None or value <= hi)
    return [] if ok else [f"{value!r} does not fit {element}"]


def check_build(build: dict[str, Any]) -> list[str]:
    errors = [
        f"{k}: not a build.yaml key"
        for k in build
        if k not in ("build_from", "args", "labels", "squash")
    ]
    build_from = build.get("build_from", {})
    images = build_from.values() if isinstance(build_from, dict) else [build_from]
    if isinstance(build_from, dict) and not set(build_from) <= ARCHES:
        errors.append("build_from: keys are architectures")
    errors += [
        f"build_from: {i!r} is not an image name" for i in images if not BUILD_FROM.match(str(i))
    ]
    for key in ("args", "labels"):
        if not all(isinstance(v, str) for v in build.get(key, {}).values()):
            errors.append(f"{key}: values must be strings")
    return errors


def supervisor_answers(config: dict[str, Any], path: str, body: dict[str, Any]) -> int:
    """The status the Supervisor gives this add-on's token for ``POST path`` (its security
    middleware, then the discovery API's own check that the service is in ``discovery``):
    200, or 403. With ``hassio_api`` the role decides beyond the bypass: not modelled here, the
    add-on asks for no role."""
    if not API_BYPASS.match(path) and not config.get("hassio_api"):
        return 403  # "missing API permission"
    if path == "/discovery" and body.get("service") not in config.get("discovery", []):
        return 403  # "Add-ons must list services they provide via discovery in their config!"
    return 200
