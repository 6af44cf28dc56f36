"""The output-directory rule every command follows (tapa._paths)."""

import os

import pytest

from tapa._paths import check_output_dir, is_run_dir, replacing_outputs, run_dirs_inside, set_default_mode

OUTPUTS = ("result.json", "plot_*.png")


def check(path, **kwargs):
    return check_output_dir(path, outputs=OUTPUTS, marker="result.json", command="tapa test", **kwargs)


def make_run(path):
    (path / "checkpoints").mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def test_what_a_command_may_write_into(tmp_path):
    assert check(tmp_path / "new") == tmp_path / "new"  # absent: fine (created when written)
    (tmp_path / "empty").mkdir()
    check(tmp_path / "empty")
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "result.json").write_text("{}")
    (earlier / "plot_a.png").write_text("")
    check(earlier)  # an earlier output of the same command
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file"):
        check(tmp_path / "file", overwrite=True)
    run = make_run(tmp_path / "run")
    with pytest.raises(ValueError, match="is a training run directory .*overwrite its files"):
        check(run, overwrite=True)  # never, not even with --overwrite
    (earlier / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds files tapa test did not write \(notes.txt\).*--overwrite"):
        check(earlier)
    check(earlier, overwrite=True)
    lookalike = tmp_path / "lookalike"  # our file names, but not our marker: another program's
    lookalike.mkdir()
    (lookalike / "plot_x.png").write_text("")
    with pytest.raises(ValueError, match="did not write"):
        check(lookalike)


def test_rewriting_replaces_every_earlier_output_and_keeps_other_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("result.json", "plot_old.png", "notes.txt"):
        (out / name).write_text("old")
    with replacing_outputs(out, OUTPUTS):
        (out / "result.json").write_text("new")
        (out / "plot_new.png").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "plot_new.png", "result.json"]
    assert (out / "result.json").read_text() == "new" and (out / "notes.txt").read_text() == "old"


def test_a_failed_rewrite_restores_the_earlier_outputs(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "result.json").write_text("old")
    (out / "plot_old.png").write_text("old")
    with pytest.raises(RuntimeError):
        with replacing_outputs(out, OUTPUTS):
            (out / "result.json").write_text("half")
            (out / "plot_new.png").write_text("half")
            raise RuntimeError("disk full")
    assert {p.name: p.read_text() for p in out.iterdir()} == {"result.json": "old", "plot_old.png": "old"}
    (out / ".tapa-replaced-0123abcd").mkdir()  # left by a killed rewrite: neither foreign nor kept
    check(out)
    with replacing_outputs(out, OUTPUTS):
        pass
    assert not list(out.glob(".tapa-replaced-*"))


def test_run_directories_and_file_modes(tmp_path):
    make_run(tmp_path / "demo" / "rope")
    make_run(tmp_path / "demo" / "tapa")
    (tmp_path / "demo" / "results.json").write_text("{}")
    assert not is_run_dir(tmp_path / "demo")
    assert [p.name for p in run_dirs_inside(tmp_path / "demo")] == ["rope", "tapa"]
    path = tmp_path / "weights"
    path.write_text("")
    os.chmod(path, 0o600)
    previous = os.umask(0o027)
    try:
        set_default_mode(path)
    finally:
        os.umask(previous)
    assert path.stat().st_mode & 0o777 == 0o640
