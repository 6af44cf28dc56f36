"""Which code ran a study job. The device machine gets a copy of the working tree without `.git`,
so the runner records the git tree id of `src/tapa` computed from the files themselves (git's
own object format: the same id `git rev-parse COMMIT:src/tapa` prints when the copy equals that
commit's tree). Byte-compiled files are left out, as git ignores them.

    python3 -m lab.study.code_tree                # the tree id of this checkout's src/tapa
    python3 -m lab.study.code_tree TREE_ID        # the commit that made src/tapa that tree
"""

from __future__ import annotations

import argparse
import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIPPED_DIRS = {"__pycache__"}
SKIPPED_SUFFIXES = (".pyc", ".pyo")


def _object(kind: bytes, body: bytes) -> bytes:
    return hashlib.sha1(kind + b" %d\0" % len(body) + body).digest()


def tree_id(folder: Path) -> str | None:
    """The git tree id of `folder` as it is on disk (None when it holds no file git would keep)."""
    digest = _tree(Path(folder))
    return digest.hex() if digest is not None else None


def _tree(folder: Path) -> bytes | None:
    entries = []
    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False):
            if entry.name in SKIPPED_DIRS:
                continue
            digest = _tree(Path(entry.path))
            if digest is not None:  # git keeps no empty folder
                entries.append((entry.name + "/", b"40000", entry.name, digest))
        elif entry.is_symlink():
            entries.append((entry.name, b"120000", entry.name, _object(b"blob", os.fsencode(os.readlink(entry.path)))))
        elif not entry.name.endswith(SKIPPED_SUFFIXES):
            mode = b"100755" if entry.stat(follow_symlinks=False).st_mode & stat.S_IXUSR else b"100644"
            entries.append((entry.name, mode, entry.name, _object(b"blob", Path(entry.path).read_bytes())))
    if not entries:
        return None
    body = b"".join(mode + b" " + os.fsencode(name) + b"\0" + digest
                    for _, mode, name, digest in sorted(entries, key=lambda e: os.fsencode(e[0])))
    return _object(b"tree", body)


def commits_with_tree(tree: str, path: str = "src/tapa", root: Path = ROOT) -> list[str]:
    """The commits, newest first, that left `path` as `tree` (with the first line of each message;
    later commits that did not touch `path` share the tree)."""
    log = subprocess.run(["git", "-C", str(root), "log", "--format=%H %h %s", "--", path],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    found = []
    for line in log:
        full, short, subject = (line.split(" ", 2) + [""])[:3]
        seen = subprocess.run(["git", "-C", str(root), "rev-parse", f"{full}:{path}"],
                              capture_output=True, text=True).stdout.strip()
        if seen == tree:
            found.append(f"{short} {subject[:100]}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", nargs="?", help="a tree id a job recorded (code.src_tree)")
    args = parser.parse_args(argv)
    if args.tree is None:
        print(tree_id(ROOT / "src" / "tapa"))
        return 0
    found = commits_with_tree(args.tree)
    if not found:
        print(f"no commit's src/tapa is {args.tree}: the job ran code that was never committed as it was",
              file=sys.stderr)
        return 1
    print("\n".join(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
