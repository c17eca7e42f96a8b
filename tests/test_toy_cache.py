"""The toy tier's pretrained base is built once per machine: cached on disk by its config and torch version, loaded
bit for bit as a rebuild computes it, and never trusted when damaged or of another config."""

import torch

from flowzoo.models import toy2d

SMALL = dict(hidden=16, layers=2, steps=30, seed=7)


def _key(**kw):
    args = {**SMALL, **kw}
    return (args["hidden"], args["layers"], args["steps"], 256, 3e-3, args["seed"], 0.1, toy2d.NUM_CLASSES,
            toy2d.DEFAULT_LAYOUT)


def _forget(key):
    toy2d._PRETRAINED.pop(key, None)


def test_cached_base_equals_a_rebuild_and_is_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv(toy2d.CACHE_ENV, str(tmp_path))
    key = _key()
    _forget(key)
    built = toy2d.pretrain(**SMALL).state_dict()
    path = toy2d.cache_path(key)
    assert path is not None and path.parent == tmp_path and path.is_file()
    _forget(key)
    calls = []
    monkeypatch.setattr(toy2d, "_pretrain_state", lambda k: calls.append(k) or {})
    loaded = toy2d.pretrain(**SMALL).state_dict()
    assert calls == []  # read from the file, not rebuilt
    assert all(torch.equal(built[k], loaded[k]) for k in built)
    _forget(key)


def test_rebuild_leaves_the_global_generator_as_a_cache_hit_does(tmp_path, monkeypatch):
    monkeypatch.setenv(toy2d.CACHE_ENV, str(tmp_path))
    key = _key(seed=8)
    _forget(key)
    torch.manual_seed(0)
    toy2d.pretrain(**{**SMALL, "seed": 8})  # a rebuild
    after_rebuild = torch.rand(3)
    _forget(key)
    torch.manual_seed(0)
    toy2d.pretrain(**{**SMALL, "seed": 8})  # a cache hit
    assert torch.equal(torch.rand(3), after_rebuild)
    _forget(key)


def test_damaged_or_foreign_cache_files_are_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv(toy2d.CACHE_ENV, str(tmp_path))
    key = _key(seed=9)
    _forget(key)
    reference = toy2d.pretrain(**{**SMALL, "seed": 9}).state_dict()
    path = toy2d.cache_path(key)
    for damage in (b"not a torch file", None):
        if damage is None:  # a readable file that holds another key's weights
            torch.save({"key": list(_key(seed=10)), "state": {"w": torch.zeros(1)}}, path)
        else:
            path.write_bytes(damage)
        _forget(key)
        again = toy2d.pretrain(**{**SMALL, "seed": 9}).state_dict()
        assert all(torch.equal(reference[k], again[k]) for k in reference)
        assert torch.load(path, weights_only=True)["key"] == list(key)  # rewritten with the right weights
    _forget(key)


def test_cache_can_be_switched_off_and_an_unwritable_one_costs_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(toy2d.CACHE_ENV, "off")
    assert toy2d.cache_dir() is None and toy2d.cache_path(_key()) is None
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory would go")
    monkeypatch.setenv(toy2d.CACHE_ENV, str(blocker / "cache"))
    key = _key(seed=11)
    _forget(key)
    net = toy2d.pretrain(**{**SMALL, "seed": 11})  # the write fails quietly; the weights are still right
    assert isinstance(net, toy2d.VelocityMLP)
    _forget(key)


def test_cache_name_depends_on_the_config_and_the_torch_version(tmp_path, monkeypatch):
    monkeypatch.setenv(toy2d.CACHE_ENV, str(tmp_path))
    a, b = toy2d.cache_path(_key()), toy2d.cache_path(_key(seed=12))
    assert a != b
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    assert toy2d.cache_path(_key()) != a
