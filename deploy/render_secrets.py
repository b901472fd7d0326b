#!/usr/bin/env python3
"""Fill a Secret template (``*secrets.example.yaml``) and print it, ready for ``kubectl apply -f -``.

Placeholders:
  CHANGE_ME_RANDOM_<NAME>  a new random value (48 hex characters), the same for every occurrence
                           of the same placeholder, so that e.g. the PostgreSQL password and the
                           DSN that contains it agree;
  CHANGE_ME_FILE_<NAME>    the contents of the file the environment variable <NAME> names (a CA
                           certificate in PEM, say), written as one quoted YAML string;
  CHANGE_ME_<NAME>         the value of the environment variable <NAME> (an error if unset).

Usage: python deploy/render_secrets.py TEMPLATE > deploy/overlays/<overlay>/secrets.yaml
Standard library only; prints nothing but the filled manifest on stdout.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path

PLACEHOLDER = re.compile(r"CHANGE_ME_(RANDOM_|FILE_)?([A-Z0-9_]*[A-Z0-9])")


def fill(text: str, env: Mapping[str, str], token=lambda: secrets.token_hex(24)) -> str:
    """Replace every placeholder of ``text``; random ones consistently, others from ``env``."""
    randoms: dict[str, str] = {}
    missing: list[str] = []
    unreadable: list[str] = []

    def repl(m: re.Match[str]) -> str:
        kind, name = m.group(1), m.group(2)
        if kind == "RANDOM_":
            return randoms.setdefault(name, token())
        if name not in env or not env[name]:
            missing.append(name)
            return m.group(0)
        if kind == "FILE_":
            try:
                return json.dumps(Path(env[name]).read_text())  # a JSON string is a YAML double-quoted scalar
            except (OSError, UnicodeDecodeError) as exc:
                unreadable.append(f"{name}={env[name]} ({exc.__class__.__name__})")
                return m.group(0)
        return env[name]

    # Comment lines are copied as they are (they describe the placeholders).
    out = "".join(
        line if line.lstrip().startswith("#") else PLACEHOLDER.sub(repl, line)
        for line in text.splitlines(keepends=True)
    )
    if missing:
        raise SystemExit("set these environment variables first: " + ", ".join(sorted(set(missing))))
    if unreadable:
        raise SystemExit("cannot read the files these variables name: " + ", ".join(sorted(set(unreadable))))
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    sys.stdout.write(fill(Path(args[0]).read_text(), os.environ))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
