"""Long-context evaluation: sliding-window perplexity vs length, passkey retrieval, reports, and
the `tapa demo` main job.

    from tapa.eval import EvalOptions, evaluate_run, write_results
    results = evaluate_run("runs/my-run", EvalOptions(eval_pe=("rope-pi", "rope-yarn"), passkey=True))
    write_results(results, "runs/my-run/eval")
"""

from tapa.eval.evaluate import EvalOptions, evaluate_model, evaluate_run
from tapa.eval.passkey_eval import greedy_generate, passkey_grid
from tapa.eval.perplexity import perplexity_vs_length, sliding_window_perplexity, sliding_windows
from tapa.eval.report import merge_results, write_results

__all__ = ["EvalOptions", "evaluate_model", "evaluate_run", "greedy_generate", "passkey_grid",
           "perplexity_vs_length", "sliding_window_perplexity", "sliding_windows", "merge_results",
           "write_results"]
