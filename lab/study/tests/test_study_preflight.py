"""lab/study/preflight.py: a study call trains nothing when the fused kernels miss the bar."""

import torch

from lab.study import preflight


def _rows(ratio_dq):
    return [{"check": "N=509 D=128", "tensor": name, "kernel": 1e-3 * r, "reference": 1e-3, "ratio": r}
            for name, r in (("out", 1.2), ("dq", ratio_dq), ("dk", 1.4), ("dv", 1.3), ("lse", 9.0))]


def test_preflight_passes_and_fails_on_the_bar(monkeypatch):
    import tapa.bench.attention as bench

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    lines = []
    monkeypatch.setattr(bench, "accuracy_errors", lambda n, d, **kw: _rows(1.44))
    assert preflight.main(lines.append) == 0  # lse's ratio carries no half-precision bar
    assert lines[-1] == "preflight: ok" and any("kernel defaults" in line for line in lines)
    monkeypatch.setattr(bench, "accuracy_errors", lambda n, d, **kw: _rows(1.51))
    lines.clear()
    assert preflight.main(lines.append) == 1
    assert sum("dq" in line and "FAILED" in line for line in lines) == len(preflight.LENGTHS)
    assert "not training" in lines[-1]


def test_no_gpu_nothing_to_check(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    lines = []
    assert preflight.main(lines.append) == 0 and "no CUDA GPU" in lines[0]


def test_a_kernel_that_raises_fails_the_preflight(monkeypatch):
    import tapa.bench.attention as bench

    def broken(n, d, **kw):
        raise RuntimeError("triton compile error\n  at line 3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(bench, "accuracy_errors", broken)
    lines = []
    assert preflight.main(lines.append) == 1
    assert any("RuntimeError: triton compile error at line 3" in line for line in lines)
