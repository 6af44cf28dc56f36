"""Check every launch configuration of the decode split kernel on a GPU, each in its own process
(an illegal memory access poisons the CUDA context), against the float32 reference.

    PYTHONPATH=src python3 lab/kernels/decode_config_check.py       # prints one line per config
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

SHAPES = [(8, 4096), (32, 16384), (1, 4096)]  # (batch, cache)


def check_one(block_n: int, warps: int, stages: int) -> dict:
    import torch

    from tapa.ops.tapa import decode_kernel as dk
    from tapa.ops.tapa.reference import naive_tapa_attention

    import triton

    class Fixed:  # stands in for the autotuned kernel with one configuration
        best_config = triton.Config({"BLOCK_N": block_n}, num_warps=warps, num_stages=stages)

        def __getitem__(self, grid):
            return lambda *args, **flags: dk._split_kernel[grid](
                *args, **flags, BLOCK_N=block_n, num_warps=warps, num_stages=stages)

    dk._tuned_split_kernel = Fixed()
    errors = {}
    for batch, cache in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(batch * cache)
        q = torch.randn(batch, 1, 32, 128, device="cuda", generator=gen).bfloat16()
        k = torch.randn(batch, 8, cache, 128, device="cuda", generator=gen).bfloat16().transpose(1, 2)
        v = torch.randn(batch, 8, cache, 128, device="cuda", generator=gen).bfloat16().transpose(1, 2)
        lengths = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
        out = dk.tapa_decode_attention(q, k, v, lengths)
        ref = naive_tapa_attention(q.float(), k.float(), v.float(), q_offset=cache - 1)
        torch.cuda.synchronize()
        errors[f"{batch}x{cache}"] = float((out.float() - ref).norm() / ref.norm())
    return errors


def main() -> int:
    if len(sys.argv) == 4:
        print(json.dumps(check_one(*map(int, sys.argv[1:]))))
        return 0
    good = []
    for block_n, warps, stages in itertools.product((32, 64, 128), (4, 8), (1, 2)):
        proc = subprocess.run([sys.executable, __file__, str(block_n), str(warps), str(stages)],
                              capture_output=True, text=True, timeout=120)
        ok = proc.returncode == 0
        detail = proc.stdout.strip() if ok else proc.stderr.strip().splitlines()[-1][:160]
        print(f"BLOCK_N={block_n:3d} warps={warps} stages={stages}: {'ok ' if ok else 'FAIL'} {detail}",
              flush=True)
        if ok and max(json.loads(detail).values()) < 1e-2:
            good.append((block_n, warps, stages))
    print("GOOD", json.dumps(good))
    return 0


if __name__ == "__main__":
    sys.exit(main())
