"""Byte-level BPE: train, save, load, round trip, end-of-text handling, determinism."""

import json

import pytest

pytest.importorskip("tokenizers")

from tapa.data.tokenizer import (  # noqa: E402
    EOT_TOKEN,
    end_of_text_token,
    file_sha256,
    load_tokenizer,
    save_tokenizer,
    train_bpe,
)

TEXTS = [
    "def add(a, b):\n    return a + b\n\n\nclass Point:\n    x: int = 0\n",
    "import os\nprint(os.path.join('a', 'b'))  # joins\n",
    "Unicode survives: naïve café, Ελληνικά, 日本語, emoji 🎉, tabs\tand\r\nCRLF\n",
] * 20


def test_train_save_load_round_trip(tmp_path):
    tokenizer = train_bpe(iter(TEXTS), 300, progress=False)
    assert tokenizer.get_vocab_size() == 300
    save_tokenizer(tokenizer, tmp_path / "tok")
    loaded = load_tokenizer(tmp_path / "tok")
    eot_id = loaded.token_to_id(EOT_TOKEN)
    assert eot_id is not None and end_of_text_token(loaded, tmp_path / "tok") == EOT_TOKEN
    for text in TEXTS[:3] + ["text never seen: ß ∑ 🐍 \x7f and 0123456789 " * 3]:
        ids = loaded.encode(text).ids
        assert ids == tokenizer.encode(text).ids
        assert loaded.decode(ids) == text
        assert eot_id not in ids
    # merges were learned (only 43 of them here): seen code takes clearly fewer tokens than bytes
    assert len(loaded.encode(TEXTS[0]).ids) < 0.8 * len(TEXTS[0].encode())


def test_literal_end_of_text_in_a_document_is_plain_text(tmp_path):
    tokenizer = train_bpe(iter(TEXTS), 300, progress=False)
    text = f"a string that mentions {EOT_TOKEN} inside"
    ids = tokenizer.encode(text).ids
    assert tokenizer.token_to_id(EOT_TOKEN) not in ids
    assert tokenizer.decode(ids) == text


def test_training_is_deterministic(tmp_path):
    first = save_tokenizer(train_bpe(iter(TEXTS), 320, progress=False), tmp_path / "a")
    second = save_tokenizer(train_bpe(iter(TEXTS), 320, progress=False), tmp_path / "b")
    assert file_sha256(first) == file_sha256(second)


def test_load_errors_name_the_path(tmp_path):
    with pytest.raises(ValueError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match=f"cannot load tokenizer {tmp_path}"):
        load_tokenizer(tmp_path)


def test_existing_tokenizer_without_eot_uses_its_declared_eos(tmp_path):
    tk = pytest.importorskip("tokenizers")
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tk.trainers.BpeTrainer(vocab_size=280, special_tokens=["</s>"], show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(TEXTS, trainer=trainer)
    save_tokenizer(tokenizer, tmp_path)
    with pytest.raises(ValueError, match="no <\\|endoftext\\|> token"):
        end_of_text_token(load_tokenizer(tmp_path), tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert end_of_text_token(load_tokenizer(tmp_path), tmp_path) == "</s>"
