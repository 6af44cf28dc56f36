"""Passkey prompts (placement, length, training samples) and the scorer on stub and real models."""

import re

import numpy as np
import pytest
import torch

from tapa.data.passkey import (INSTRUCTION, KEY_SENTENCE, QUESTION, build_passkey_prompt,
                               passkey_training_sample)
from tapa.eval.passkey_eval import greedy_generate, passkey_grid
from tapa.model import ModelConfig, TapaLM

from helpers import ContextReader, WordTokenizer, char_decode, char_encode, find


@pytest.mark.parametrize("encode", [char_encode, WordTokenizer().encode])
@pytest.mark.parametrize("length", [300, 517, 2048])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_prompt_places_the_key_at_depth_and_length(encode, length, depth):
    prompt = build_passkey_prompt(encode, length=length, depth=depth, passkey="40713")
    assert len(prompt.ids) == length
    instruction, key_sentence = encode(INSTRUCTION), encode(KEY_SENTENCE.format(key="40713"))
    question = encode(QUESTION)
    key_start = find(prompt.ids, key_sentence)  # located independently of key_position
    assert key_start == prompt.key_position
    filler_before = key_start - len(instruction)
    filler_total = length - len(instruction) - len(key_sentence) - len(question)
    assert abs(filler_before - depth * filler_total) <= 1  # within a token
    assert prompt.ids[:len(instruction)] == instruction and prompt.ids[-len(question):] == question
    assert prompt.answer_ids == encode(" 40713")


def test_prompt_with_corpus_filler_and_bad_arguments():
    filler = list(range(300, 340))
    prompt = build_passkey_prompt(char_encode, length=400, depth=0.5, passkey="12345", filler_ids=filler)
    used = [t for t in prompt.ids if t >= 300]
    assert used == (filler * 10)[:len(used)]  # corpus tokens in order, tiled when short
    with pytest.raises(ValueError, match="length"):
        build_passkey_prompt(char_encode, length=50, depth=0.5, passkey="12345")
    with pytest.raises(ValueError, match="depth"):
        build_passkey_prompt(char_encode, length=400, depth=1.5, passkey="12345")
    with pytest.raises(ValueError, match="passkey"):
        build_passkey_prompt(char_encode, length=400, depth=0.5, passkey="12a45")


def test_training_sample_is_prompt_plus_answer():
    rng = np.random.default_rng(0)
    for filler in (None, np.arange(300, 3300)):
        sample = passkey_training_sample(char_encode, length=512, rng=rng, filler_ids=filler)
        assert sample.shape == (513,) and sample.dtype == np.int64
        text = char_decode([t for t in sample.tolist() if t < 256])
        key = re.search(r"The pass key is (\d{5})\. Remember it\. \1 is the pass key\.", text).group(1)
        assert text.endswith(f"What is the pass key? The pass key is {key}")


class CopyStub(ContextReader):
    """Reads the key sentence in its context and emits ' NNNNN' (offset shifts every digit, so
    offset != 0 gives a model that always answers wrong). Keeps its context in the KV cache."""

    def __init__(self, offset=0):
        super().__init__()
        self.offset = offset

    def reply(self, context):
        key = re.search(r"The pass key is (\d+)\.", context).group(1)
        key = "".join(str((int(c) + self.offset) % 10) for c in key)
        return " " + key + ".", "The pass key is"


def test_scorer_on_a_stub_that_copies_the_key():
    grid = passkey_grid(CopyStub(), char_encode, char_decode, lengths=[256, 300], depths=[0.0, 0.5, 1.0],
                        trials=3, progress=False)
    assert grid["accuracy"] == [[1.0] * 3] * 2
    assert grid["examples"][0]["output"] == " " + grid["examples"][0]["passkey"]
    wrong = passkey_grid(CopyStub(offset=1), char_encode, char_decode, lengths=[256], depths=[0.5],
                         trials=3, progress=False)
    assert wrong["accuracy"] == [[0.0]]
    # without decode the ids must match exactly
    ids_only = passkey_grid(CopyStub(), char_encode, None, lengths=[256], depths=[0.5], trials=2,
                            progress=False)
    assert ids_only["accuracy"] == [[1.0]]


@pytest.mark.parametrize("pe", ["tapa", "rope"])
def test_greedy_generation_through_the_cache_matches_full_forward(pe):
    torch.manual_seed(0)
    model = TapaLM(ModelConfig(vocab_size=50, dim=32, n_layers=2, n_heads=2, pe=pe, init_std=0.2)).eval()
    prompt = torch.randint(0, 50, (2, 23))
    generated = greedy_generate(model, prompt, 6, prefill_chunk=7)
    sequence = prompt
    with torch.no_grad():
        for _ in range(6):
            sequence = torch.cat([sequence, model(sequence)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generated, sequence[:, 23:])
