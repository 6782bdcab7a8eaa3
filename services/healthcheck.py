#!/usr/bin/env python3
"""Container health check of the streamdp image (Docker ``HEALTHCHECK``).

One image runs several commands, so the check looks at what the container runs (the command
line of PID 1, i.e. ``streamdp <command> ...`` from the image's ENTRYPOINT):

* ``sketcher`` / ``release``: ``GET http://127.0.0.1:<port>/healthz`` must answer 200. The port
  is ``--metrics-port`` on the command line if given, else ``$STREAMDP_METRICS_PORT`` (the image
  sets 9400; an environment variable overrides the flag in streamdp, so it wins here too).
* ``broker``: a TCP connection to its ``--port`` (default 9092) must succeed.
* anything else (``demo``, ``produce``, ``--help``): healthy — there is no server to ask.

Exit status 0 = healthy, 1 = unhealthy (Docker's convention). Kubernetes ignores HEALTHCHECK and
uses the pod's probes instead (k8s/base). Standard library only; no shell, no curl in the image.
"""
from __future__ import annotations

import os
import socket
import sys
import urllib.error
import urllib.request

COMMANDS = ("sketcher", "release", "broker", "demo", "produce", "control", "topics", "simulate")


def pid1_args(path: str = "/proc/1/cmdline") -> list[str]:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def _flag(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def check(args: list[str], env: dict | None = None, timeout: float = 4.0) -> tuple[bool, str]:
    """``(healthy, reason)`` for a container whose PID 1 runs ``args``."""
    env = os.environ if env is None else env
    command = next((a for a in args if a in COMMANDS), None)
    if command in ("sketcher", "release"):
        port = env.get("STREAMDP_METRICS_PORT") or _flag(args, "--metrics-port") or "9400"
        url = f"http://127.0.0.1:{int(port)}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return resp.status == 200, f"{url}: {resp.status}"
        except urllib.error.HTTPError as exc:      # 503 = poll loop stalled
            return False, f"{url}: {exc.code} {exc.read(300).decode('utf-8', 'replace')}"
        except (OSError, ValueError) as exc:
            return False, f"{url}: {exc}"
    if command == "broker":
        port = int(_flag(args, "--port") or 9092)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=timeout):
                return True, f"broker port {port} accepts connections"
        except OSError as exc:
            return False, f"broker port {port}: {exc}"
    return True, f"no health endpoint for {command or 'this command'}"


def main() -> int:
    ok, reason = check(pid1_args())
    print(reason)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
