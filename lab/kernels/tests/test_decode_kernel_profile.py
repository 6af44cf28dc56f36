"""lab/kernels/decode_kernel_profile.py: the kernel kinds it sums, and its whole run on CPU (--smoke)."""

import pytest
from helpers import ROOT, load_file

SCRIPT = ROOT / "lab" / "kernels" / "decode_kernel_profile.py"


@pytest.fixture(scope="module")
def profiler():
    return load_file(SCRIPT, "decode_kernel_profile")


@pytest.mark.parametrize("name, kind", [
    ("_split_kernel", "attention"),  # tapa.ops.tapa.decode_kernel's two launches
    ("_merge_kernel", "attention"),
    ("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64>>", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64", "matmul"),
    ("nvjet_hsh_64x8_64x16_2x1_v_bz_TNT", "matmul"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", "elementwise"),
    ("aten::linear", "matmul"),
    ("Memcpy DtoD (Device -> Device)", "other"),
])
def test_kernel_kinds(profiler, name, kind):
    assert profiler.kind_of(name) == kind


def test_a_smoke_run_writes_one_row_per_model_and_its_costliest_ops(profiler, tmp_path):
    assert profiler.main(["--smoke", "--steps", "2", "--top", "3", "--out", str(tmp_path), "rope", "tapa:LLLG:4"]) == 0
    text = (tmp_path / "decode_kernels.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith(("| rope | 1 | 24 |", "| tapa:LLLG:4 | 1 | 24 |"))]
    assert len(rows) == 2
    # no graph on CPU; the RoPE model's step runs SDPA in its global layers
    assert all("| - | - |" in row for row in rows)
    assert "`aten::linear`" in text and text.count("costliest kernels per step") == 2


def test_bad_arguments_are_refused(profiler, tmp_path):
    with pytest.raises(SystemExit):
        profiler.main(["--smoke", "--steps", "0", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        profiler.main(["--smoke", "--out", str(tmp_path), "rope:XYZ:-1"])
