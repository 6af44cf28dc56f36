"""Fixtures shared by the training tests."""

import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One data cache for the whole session: the small corpora are built once, then reused."""
    return tmp_path_factory.mktemp("data-cache")
