"""lab.study.code_tree: the tree id computed from files is git's own, and it names the commit."""

import os
import shutil
import subprocess

import pytest

from lab.study import code_tree

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo, *args):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env=env).stdout.strip()


def test_tree_id_is_gits_and_finds_its_commit(tmp_path):
    """Files, a subfolder, an executable and a name that sorts differently as a folder ("a" before
    "a.py" as files, after it as a folder "a/"); byte-compiled files and empty folders are not
    counted, as git keeps neither. An edit changes the id, and the id names the commit that made it."""
    repo = tmp_path / "repo"
    pkg = repo / "src" / "tapa"
    (pkg / "a").mkdir(parents=True)
    (pkg / "a" / "inner.py").write_text("x = 1\n")
    (pkg / "a.py").write_text("import a\n")
    (pkg / "run.sh").write_text("#!/bin/sh\n")
    (pkg / "run.sh").chmod(0o755)
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0junk")
    (pkg / "empty").mkdir()
    git(repo, "init", "-q")
    (repo / ".gitignore").write_text("__pycache__/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    first = git(repo, "rev-parse", "HEAD:src/tapa")
    assert code_tree.tree_id(pkg) == first

    (pkg / "a.py").write_text("import a  # changed\n")
    edited = code_tree.tree_id(pkg)
    assert edited != first
    git(repo, "commit", "-q", "-am", "second")
    assert git(repo, "rev-parse", "HEAD:src/tapa") == edited
    assert [line.split(" ", 1)[1] for line in code_tree.commits_with_tree(first, root=repo)] == ["first"]
    assert [line.split(" ", 1)[1] for line in code_tree.commits_with_tree(edited, root=repo)] == ["second"]
    assert code_tree.commits_with_tree("0" * 40, root=repo) == []
