"""The screen's second text domain: prose the models never trained on.

The study's models train on Python sources (the built-in corpus: the stdlib and site-packages .py
files). The second domain is the long descriptions of the Python distributions installed where
the study runs: their READMEs as published on PyPI, Markdown or reStructuredText, mostly English
prose with some code. It is on every machine without a download, and none of it is a .py file.

    python3 -m lab.study.domain OUT_DIR [--min-bytes 2000]

writes one file per distribution (name-version.md or .rst), skips short descriptions and exact
duplicates (the CUDA wheels share one), and writes OUT_DIR.json beside the folder: the files,
their bytes and one sha256 over all of them. `tapa eval RUN --data OUT_DIR` reads the folder. The
text depends on the machine's packages: every arm of a screen is evaluated on the same image, and
the manifest says which text that was.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import re
from pathlib import Path

NAME = "package-docs"
SUFFIXES = {"text/markdown": ".md", "text/x-rst": ".rst"}


def descriptions(min_bytes: int = 2000) -> list[tuple[str, str, str]]:
    """(file name, content type, text) of each installed distribution's long description of at
    least min_bytes UTF-8 bytes, first of each distinct text, sorted by file name."""
    found = {}
    for dist in importlib.metadata.distributions():
        meta = dist.metadata
        name, version = meta.get("Name"), meta.get("Version")
        text = meta.get_payload() or meta.get("Description") or ""
        if not name or len(text.encode()) < min_bytes:
            continue
        kind = (meta.get("Description-Content-Type") or "text/plain").split(";")[0].strip()
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{name}-{version}").lower()
        found[slug + SUFFIXES.get(kind, ".txt")] = (kind, text)
    files, seen = [], set()
    for file_name in sorted(found):
        kind, text = found[file_name]
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest not in seen:
            seen.add(digest)
            files.append((file_name, kind, text))
    return files


def build(out_dir: Path, min_bytes: int = 2000) -> dict:
    """Write the domain's files into out_dir (replacing what a previous build left) and its
    manifest to out_dir.json; returns the manifest. ValueError if nothing qualifies."""
    files = descriptions(min_bytes)
    if not files:
        raise ValueError(f"no installed distribution has a long description of {min_bytes}+ bytes")
    digest = hashlib.sha256()
    for file_name, _, text in files:
        digest.update(file_name.encode() + b"\0" + text.encode() + b"\0")
    # the same text already there (an earlier build, or another runner's on a multi-GPU call):
    # leave it untouched, so that a runner never rewrites files another one is reading
    try:
        existing = json.loads(out_dir.with_suffix(".json").read_text())
    except (OSError, ValueError):
        existing = None
    if (existing and existing.get("sha256") == digest.hexdigest() and existing.get("min_bytes") == min_bytes
            and sorted(p.name for p in out_dir.iterdir() if p.is_file()) == [f for f, _, _ in files]):
        return existing
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.iterdir():
        if old.is_file():
            old.unlink()
    for file_name, _, text in files:
        (out_dir / file_name).write_text(text, encoding="utf-8")
    manifest = {"domain": NAME, "directory": str(out_dir), "files": len(files),
                "bytes": sum(len(text.encode()) for _, _, text in files),
                "sha256": digest.hexdigest(), "min_bytes": min_bytes,
                "content_types": {kind: sum(1 for _, k, _ in files if k == kind)
                                  for kind in sorted({k for _, k, _ in files})},
                "names": [file_name for file_name, _, _ in files]}
    out_dir.with_suffix(".json").write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m lab.study.domain", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--min-bytes", type=int, default=2000)
    args = parser.parse_args(argv)
    manifest = build(args.out_dir, args.min_bytes)
    print(f"{NAME}: {manifest['files']} files, {manifest['bytes']:,} bytes, sha256 "
          f"{manifest['sha256'][:12]} -> {args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
