"""No merge-conflict marker in any tracked text file (CI runs this first; tests/test_ci.py too).

A marker is a line starting with seven `<` and a space or seven `>` and a space, or a line that is
exactly seven `=` (or starts with seven `|` and a space, diff3's base) between such an opening and
its closing line; a lone `=======` elsewhere (a Markdown heading's underline) is no marker.
Binary files (a NUL byte in the first 8 KiB) are skipped. Prints `path:line: text` for each
marker and exits 1 when any is found.

    python .ci/conflict_markers.py [ROOT]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

OPEN, CLOSE, SEP, BASE = "<" * 7 + " ", ">" * 7 + " ", "=" * 7, "|" * 7 + " "


def markers(text: str) -> list[tuple[int, str]]:
    """(line number from 1, line) of every conflict marker in text."""
    found: list[tuple[int, str]] = []
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith(OPEN):
            inside = True
        elif line.startswith(CLOSE):
            inside = False
        elif not (inside and (line == SEP or line.startswith(BASE))):
            continue
        found.append((number, line))
    return found


def tracked(root: Path) -> list[Path]:
    """The files git tracks under root (`git ls-files`)."""
    done = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"error: `git ls-files` failed in {root} ({done.stderr.strip()}); "
                         "run this in a git checkout of diagnose")
    return [root / name for name in done.stdout.split("\0") if name]


def scan(root: Path) -> list[str]:
    """`path:line: text` for every marker in root's tracked text files."""
    out = []
    for path in tracked(root):
        if not path.is_file():  # deleted in the work tree, not yet in the index
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue
        text = data.decode("utf-8", errors="replace")
        out += [f"{path.relative_to(root).as_posix()}:{n}: {line}" for n, line in markers(text)]
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else Path(__file__).resolve().parents[1])
    found = scan(root)
    for line in found:
        print(line)
    if found:
        print(f"error: {len(found)} merge-conflict marker line(s) in tracked files (above): resolve each "
              "conflict by reading both sides, then commit", file=sys.stderr)
        return 1
    print("== no merge-conflict marker in the tracked files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
