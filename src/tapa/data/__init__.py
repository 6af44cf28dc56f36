"""Data: text sources, a byte-level BPE tokenizer, and a token cache.

    from tapa.data import DataConfig, build_corpus
    corpus = build_corpus(DataConfig())          # the stdlib .py files, BPE-8192, cached
    ids = corpus.tokens("train")                 # 1-D uint16 memmap, documents end with corpus.eot_id

This package imports nothing else from tapa but tapa._optional.
"""

from tapa.data.cache import Corpus, build_corpus, find_corpus
from tapa.data.config import SPLITS, DataConfig

__all__ = ["Corpus", "DataConfig", "SPLITS", "build_corpus", "find_corpus"]
