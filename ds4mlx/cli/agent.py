"""`ds4-agent`: not built yet (see the agent issue)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("ds4-agent: not built yet; use `ds4` for one-shot generation", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
