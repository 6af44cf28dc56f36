"""What a protocol's retrieval suite costs in model calls: prefill batches and decoding steps, for
a cell's prompts at a time in 16k-token batches (how the grids batched before 2026-12-05) against
a length's at a time in `--retrieval-batch-tokens` batches (how they batch now).

    python3 -m lab.study.suite_cost TOKENIZER.json [--protocol toy-gpu-screen] [--batch-tokens 262144]

A batch costs one prefill and (its longest answer - 1) eager decoding steps; on a GPU a decoding
step's time is kernel launches, whatever the batch. The answers' lengths come from the tokenizer
and each cell's generator, seeded as the grid seeds it; the filler window's draw (which depends
on the corpus) is stood in for, so a trial's answer can differ from the suite's own, not their
distribution. No model is needed.
"""

from __future__ import annotations

import argparse

import numpy as np

from lab.study.arms import PROTOCOLS
from tapa.eval.passkey_eval import RETRIEVAL_BATCH_TOKENS
from tapa.eval.tasks import TASK_SEEDS, TaskSettings, _task_pieces, default_trials, parse_tasks

CELL_BATCH_TOKENS = 16384  # the grids' batches before 2026-12-05: one cell's prompts, 16k tokens


def answer_lengths(task: str, encode, length_index: int, depth_index: int, depth: float, trials: int,
                   seed: int = 0, settings: TaskSettings | None = None) -> list[int]:
    """Tokens of each trial's reference answer in one cell (see the module docstring)."""
    rng = np.random.default_rng([seed, TASK_SEEDS[task], length_index, depth_index])
    settings = settings or TaskSettings()
    sizes = []
    for _ in range(trials):
        _, _, _, expected, _ = _task_pieces(task, depth, rng, settings)
        sizes.append(len(encode(" " + (", ".join(expected) if task == "multi-value" else " ".join(expected)))))
        rng.integers(0, 2)  # stands in for the filler window's draw
    return sizes


def calls(sizes: list[int], per_batch: int) -> tuple[int, int]:
    """(prefills, decoding steps) of prompts with these answer lengths, `per_batch` a batch."""
    batches = [sizes[i:i + per_batch] for i in range(0, len(sizes), per_batch)]
    return len(batches), sum(max(batch) - 1 for batch in batches)


def suite_cost(encode, tasks, lengths, depths, trials: int, batch_tokens: int) -> dict:
    """{"cell": (prefills, steps), "length": (prefills, steps)} over the suite's tasks."""
    totals = {"cell": [0, 0], "length": [0, 0]}
    for task in tasks:
        for li, length in enumerate(lengths):
            cells = [answer_lengths(task, encode, li, di, depth, trials) for di, depth in enumerate(depths)]
            for sizes in cells:
                for index, count in enumerate(calls(sizes, max(1, CELL_BATCH_TOKENS // length))):
                    totals["cell"][index] += count
            flat = [size for sizes in cells for size in sizes]
            for index, count in enumerate(calls(flat, max(1, batch_tokens // length))):
                totals["length"][index] += count
    return {name: tuple(values) for name, values in totals.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m lab.study.suite_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("tokenizer", help="a tokenizer.json (tokenizers library)")
    parser.add_argument("--protocol", default="toy-gpu-screen", choices=sorted(PROTOCOLS))
    parser.add_argument("--batch-tokens", type=int, default=RETRIEVAL_BATCH_TOKENS)
    args = parser.parse_args(argv)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(args.tokenizer)
    protocol = PROTOCOLS[args.protocol]
    if not protocol.retrieval_tasks:
        parser.error(f"protocol {args.protocol} runs no retrieval suite")
    tasks = parse_tasks(",".join(protocol.retrieval_tasks))
    trials = protocol.task_trials or default_trials(len(protocol.passkey_depths))
    cost = suite_cost(lambda text: tokenizer.encode(text).ids, tasks, protocol.passkey_lengths,
                      protocol.passkey_depths, trials, args.batch_tokens)
    prompts = len(tasks) * len(protocol.passkey_lengths) * len(protocol.passkey_depths) * trials
    print(f"{args.protocol}: {prompts} prompts ({', '.join(tasks)}; lengths "
          f"{', '.join(map(str, protocol.passkey_lengths))}; {trials} trials a cell)")
    print(f"a cell at a time, {CELL_BATCH_TOKENS} tokens a batch: {cost['cell'][0]} prefills, "
          f"{cost['cell'][1]} decoding steps")
    print(f"a length at a time, {args.batch_tokens} tokens a batch: {cost['length'][0]} prefills, "
          f"{cost['length'][1]} decoding steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
