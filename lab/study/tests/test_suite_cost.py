from lab.study import suite_cost
from lab.study.arms import TOY_GPU_SCREEN


def test_calls_count_prefills_and_the_longest_answer_of_each_batch():
    assert suite_cost.calls([3, 5, 2, 2, 7], 2) == (3, (5 - 1) + (2 - 1) + (7 - 1))
    assert suite_cost.calls([3, 5, 2, 2, 7], 5) == (1, 6)


def test_a_length_at_a_time_takes_fewer_calls_than_a_cell_at_a_time():
    encode = lambda text: list(text.encode())  # bytes: every answer is long
    depths = TOY_GPU_SCREEN.passkey_depths
    cost = suite_cost.suite_cost(encode, ("single-key", "multi-value"), (2048, 16384), depths, 6, 262144)
    # a cell at a time: 6 trials at 2048 (8 a batch) -> 1 batch a cell; at 16384 -> 6 a cell
    assert cost["cell"][0] == 2 * len(depths) * (1 + 6)
    # a length at a time: 30 prompts; 128 a batch at 2048 -> 1, 16 a batch at 16384 -> 2
    assert cost["length"][0] == 2 * (1 + 2)
    assert cost["length"][1] < cost["cell"][1] / 5
    assert suite_cost.answer_lengths("single-key", encode, 0, 0, 0.0, 3) == [6, 6, 6]  # " NNNNN"
