"""Loading the embedder (attnrank.index.embed.load_embedder) by hub id, path or default."""

from __future__ import annotations

import numpy as np
import pytest
from _tiny import save_tiny_encoder

from attnrank.errors import ModelError
from attnrank.index.embed import encode, load_embedder


@pytest.fixture(autouse=True)
def _fresh_cache():
    load_embedder.cache_clear()
    yield
    load_embedder.cache_clear()


def test_a_hub_id_in_the_local_cache_loads_from_its_snapshot_without_the_hub(tmp_path, offline_hub):
    encoder = save_tiny_encoder(tmp_path / "enc")
    offline_hub.snapshot("attnrank-test/encoder", "4567def", source=encoder)
    offline_hub.tried.clear()  # (building the test's encoder asked the hub for something): only the load counts
    by_id = encode(load_embedder("attnrank-test/encoder"), ["the cat sat on the mat"])
    assert offline_hub.tried == []
    by_path = encode(load_embedder(str(encoder)), ["the cat sat on the mat"])
    np.testing.assert_allclose(by_id, by_path, atol=1e-6)


def test_a_missing_local_path_is_named_before_loading(tmp_path):
    with pytest.raises(ModelError, match="no such local model folder"):
        load_embedder(str(tmp_path / "missing" / "encoder"))
