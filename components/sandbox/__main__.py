"""``python -m components.sandbox pod-profile``: print the seccomp profile for pods
that run code rewards (see ``seccomp.pod_profile``); ``probe``: say whether this machine
can build the sandbox, and how (exit 0 if it can, 1 if not)."""

from __future__ import annotations

import json
import sys

from components.sandbox import _run
from components.sandbox.seccomp import pod_profile


def main(argv: list[str]) -> int:
    if argv == ["pod-profile"]:
        print(json.dumps(pod_profile(), indent=2))
        return 0
    if argv == ["probe"]:
        caps = _run.probe()
        print(f"mode: {_run.mode()}")
        print(f"available: {caps.available}, network isolated: {caps.network_isolated}")
        if caps.reason:
            print(f"reason: {caps.reason}")
        return 0 if caps.available and caps.network_isolated else 1
    print("usage: python -m components.sandbox {pod-profile|probe}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
