"""The commit a results row records (andromeda_nb.provenance.commit_id) in a throwaway git repository."""

import subprocess

import pytest

from andromeda_nb.provenance import commit_id


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.delenv("ANDROMEDA_COMMIT", raising=False)

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "data" / "results").mkdir(parents=True)
    (tmp_path / "data" / "results" / "quality.csv").write_text("a\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    return tmp_path


def test_rows_written_into_the_results_folder_leave_the_commit_clean(repo):
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, capture_output=True,
                          text=True).stdout.strip()
    assert commit_id(repo) == head
    (repo / "data" / "results" / "quality.csv").write_text("a\nb\n")  # a run's own rows
    (repo / "untracked.py").write_text("")  # untracked files are not the code under test
    assert commit_id(repo) == head
    (repo / "code.py").write_text("x = 2\n")
    assert commit_id(repo) == head + "-dirty"


def test_the_environment_names_the_commit_where_the_tree_travels_without_git(tmp_path, monkeypatch):
    monkeypatch.setenv("ANDROMEDA_COMMIT", "abc1234")
    assert commit_id(tmp_path) == "abc1234"
    monkeypatch.delenv("ANDROMEDA_COMMIT")
    assert commit_id(tmp_path) == "unknown"  # no repository there
