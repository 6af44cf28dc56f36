"""lab/kernels/ncu_stalls.py: the raw-page metrics it reads, the time in ms whatever unit ncu chose,
the stall reasons it does not show summed into "other", and a clear error on a page without them."""

import pytest
from helpers import ROOT, load_file

RAW = """[489] python3.12@127.0.0.1
  _fwd_kernel (256, 64, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
  Metric Name                                     Metric Unit         Metric Value
  gpu__time_duration.sum                                   {unit}           {time}
  smsp__inst_executed.sum                                   inst    5,007,616,256
  smsp__issue_active.avg.per_cycle_active                                    0.59
  smsp__average_warps_issue_stalled_wait_per_issue_active.ratio      inst    0.88
  smsp__average_warps_issue_stalled_selected_per_issue_active.ratio  inst    1.00
  smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio  inst    0.25
  smsp__average_warps_issue_stalled_drain_per_issue_active.ratio     inst    0.50
"""


@pytest.fixture(scope="module")
def stalls():
    return load_file(ROOT / "lab" / "kernels" / "ncu_stalls.py", "ncu_stalls")


@pytest.mark.parametrize("unit, time, ms", [("ms", "9.10", 9.10), ("us", "147.62", 0.14762),
                                            ("s", "1.5", 1500.0)])
def test_reads_the_metrics_in_ms(stalls, tmp_path, unit, time, ms):
    path = tmp_path / "fwd_tapa_64_raw.txt"
    path.write_text(RAW.format(unit=unit, time=time))
    scalars, reasons = stalls.read(path)
    assert scalars["gpu__time_duration.sum"] == pytest.approx(ms)
    assert scalars["smsp__inst_executed.sum"] == 5007616256
    assert reasons == dict(wait=0.88, selected=1.0, sleeping=0.25, drain=0.5)


def test_table_row_and_other(stalls, tmp_path, capsys):
    path = tmp_path / "fwd_tapa_64_raw.txt"
    path.write_text(RAW.format(unit="ms", time="9.10"))
    stalls.main([str(path)])
    row = capsys.readouterr().out.splitlines()[-1].split(" | ")
    assert row[0] == "| fwd_tapa_64" and row[1] == "9.1"
    assert row[-1] == "0.75 |"  # sleeping + drain, the reasons without a column


def test_a_page_without_stall_ratios_is_an_error(stalls, tmp_path):
    path = tmp_path / "details.txt"
    path.write_text("  gpu__time_duration.sum   ms   9.10\n")
    with pytest.raises(SystemExit, match="no raw ncu metrics"):
        stalls.read(path)


def test_an_unknown_time_unit_is_an_error(stalls, tmp_path):
    path = tmp_path / "fwd_tapa_64_raw.txt"
    path.write_text(RAW.format(unit="fortnight", time="1"))
    with pytest.raises(SystemExit, match="unknown unit 'fortnight'"):
        stalls.read(path)
