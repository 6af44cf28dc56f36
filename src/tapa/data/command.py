"""`tapa data build|info`: build the token cache and print its sizes, or show a cached manifest."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tapa.data.cache import MANIFEST, build_corpus, find_corpus
from tapa.data.config import SPLITS, DataConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("build", "info"),
                        help="build: tokenize (or reuse) and print sizes; info: show the cached manifest")
    defaults = DataConfig()
    parser.add_argument("--data", "--source", dest="source", default=defaults.source,
                        help="builtin | a text file | a directory | a .jsonl | hf:<name or saved dir> "
                             "(default: builtin, the .py files of this Python's stdlib); the same "
                             "--data as tapa train and tapa eval (--source is its older name)")
    parser.add_argument("--vocab-size", type=int, default=defaults.vocab_size,
                        help="BPE vocabulary size when training a tokenizer (default: %(default)s)")
    parser.add_argument("--tokenizer", default=None, metavar="DIR",
                        help="use this existing tokenizer directory (tokenizer.json) instead of training one")
    parser.add_argument("--cache-dir", default=defaults.cache_dir,
                        help="where caches live (default: $TAPA_CACHE/data or ~/.cache/tapa/data)")
    parser.add_argument("--include-site-packages", action="store_true",
                        help="builtin source: add the site-packages .py files")
    parser.add_argument("--text-field", default=defaults.text_field,
                        help="jsonl / hf sources: the field holding the text (default: %(default)s)")
    parser.add_argument("--val-fraction", type=float, default=defaults.val_fraction,
                        help="share of documents (by hash of their name) for validation (default: %(default)s)")
    parser.add_argument("--test-fraction", type=float, default=defaults.test_fraction,
                        help="share of documents for test (default: %(default)s)")
    parser.add_argument("--max-train-bytes", type=int, default=None,
                        help="keep only this many bytes of the train split (quick runs)")
    parser.add_argument("--tokenizer-train-bytes", type=int, default=None,
                        help="train the BPE on only this many bytes of the train split")
    parser.add_argument("--all", action="store_true",
                        help="info: list every corpus in the cache directory instead of one manifest")
    parser.add_argument("--json", action="store_true", help="info: print the whole manifest as JSON")
    parser.add_argument("--quiet", "--no-progress", dest="quiet", action="store_true",
                        help="no progress bars (--no-progress: the name train and eval use)")


def config_from_args(args: argparse.Namespace) -> DataConfig:
    return DataConfig(
        source=args.source,
        cache_dir=args.cache_dir,
        vocab_size=args.vocab_size,
        tokenizer=args.tokenizer,
        include_site_packages=args.include_site_packages,
        text_field=args.text_field,
        val_fraction=args.val_fraction,
        test_fraction=args.test_fraction,
        max_train_bytes=args.max_train_bytes,
        tokenizer_train_bytes=args.tokenizer_train_bytes,
    )


def sizes_table(manifest: dict) -> str:
    """A markdown table per split: documents, bytes, tokens, bytes per token, the longest document
    and the tokens that sit in documents of at least 4096 tokens (text for long contexts)."""
    rows = ["| split | documents | bytes | tokens | bytes/token | longest doc | tokens in docs >= 4096 |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    columns = ("docs", "bytes", "tokens", "longest", "long")
    total = dict.fromkeys(columns, 0)
    for split in SPLITS:
        counts = manifest["splits"][split]
        row = {"docs": counts["docs"], "bytes": counts["bytes"], "tokens": counts["tokens"],
               "longest": counts["longest_doc_tokens"], "long": counts["tokens_in_docs_of_at_least"]["4096"]}
        rows.append(_row(split, row))
        total = {name: (max if name == "longest" else sum)((total[name], row[name])) for name in columns}
    rows.append(_row("total", total))
    return "\n".join(rows)


def _row(name: str, row: dict) -> str:
    ratio = row["bytes"] / row["tokens"] if row["tokens"] else float("nan")
    return (f"| {name} | {row['docs']:,} | {row['bytes']:,} | {row['tokens']:,} | {ratio:.2f} | "
            f"{row['longest']:,} | {row['long']:,} |")


def describe(manifest: dict, directory: Path) -> str:
    source = manifest["source"]
    tokenizer = manifest["tokenizer"]
    lines = [f"corpus:    {directory}", f"source:    {source['source']} ({source['kind']})"]
    if source["kind"] == "builtin":
        lines.append(
            f"           Python {source['python_version']} stdlib at {source['path']}"
            + (f" and site-packages {', '.join(source['site_dirs'])}" if source["include_site_packages"] else "")
            + f": {source['files']} .py files, {source['empty_files']} empty, "
            f"{len(source['skipped_files'])} skipped (not UTF-8)"
        )
    trained = tokenizer["trained_on_bytes"]
    origin = f"BPE trained here on {trained:,} bytes" if trained else f"from {tokenizer['from']}"
    lines += [
        f"tokenizer: vocab {tokenizer['vocab_size']}, {origin}, "
        f"eot {tokenizer['eot_token']}={tokenizer['eot_id']}, sha256 {tokenizer['sha256'][:16]}",
        f"tokens:    {manifest['dtype']}, built {manifest['created']} in {manifest['build_seconds']} s "
        f"({manifest['tokenizer_seconds']} s of it for the tokenizer"
        + (f", {manifest['encode_seconds']} s encoding, {manifest['write_seconds']} s writing"
           if "encode_seconds" in manifest else "")
        + f") with Python {manifest['python_version']}",
        "",
        sizes_table(manifest),
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.action == "build":
        started = time.perf_counter()
        corpus = build_corpus(cfg, progress=not args.quiet)
        if not corpus.built:  # "reused" only for a cache that checks out (sha256 of every file)
            corpus.verify()
        elapsed = time.perf_counter() - started
        print(describe(corpus.manifest, corpus.directory))
        print(f"\n{'built' if corpus.built else 'reused the cache'} in {elapsed:.1f} s")
        return 0
    if args.all:
        return _list_all(Path(cfg.cache_dir).expanduser())
    corpus = find_corpus(cfg)
    if corpus is None:
        print(f"tapa data: error: no cached corpus for this configuration under {cfg.cache_dir}; run "
              "'tapa data build' with the same options (or 'tapa data info --all' to list what is cached)",
              file=sys.stderr)
        return 1
    print(json.dumps(corpus.manifest, indent=2) if args.json else describe(corpus.manifest, corpus.directory))
    return 0


def _list_all(cache_dir: Path) -> int:
    manifests = sorted(cache_dir.glob(f"*/{MANIFEST}")) if cache_dir.is_dir() else []
    if not manifests:  # an empty listing, not a failure
        print(f"no cached corpora under {cache_dir}")
        return 0
    print("| directory | source | vocab | train tokens | val tokens | test tokens | created |")
    print("|---|---|---:|---:|---:|---:|---|")
    for path in manifests:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        tokens = " | ".join(f"{manifest['splits'][split]['tokens']:,}" for split in SPLITS)
        print(f"| {path.parent.name} | {manifest['source']['source']} | {manifest['tokenizer']['vocab_size']} | "
              f"{tokens} | {manifest['created']} |")
    return 0
