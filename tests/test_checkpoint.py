"""Checkpoints (`gsim.scenes.reconstruction.checkpoint`): nothing in a received checkpoint runs when gsim reads it (a crafted
pickle is refused by every loader and never executes), a save/load round trip gives back the same state, a damaged
file is refused naming the file and the field, a failed write keeps the last good checkpoint, and an old pickled
checkpoint converts only when asked to."""
import importlib.util
import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from gsim import Surfels
from gsim.errors import InputError
from gsim.scenes.reconstruction import checkpoint
from gsim.scenes.reconstruction import train as train_mod
from gsim.scenes.log import ActorTrack
from gsim.scenes.reconstruction.model import SceneModel


class _Plant:
    """Unpickling it creates ``marker``: what a malicious checkpoint could do, made harmless and visible."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def _torch_pickle(path: Path, marker: Path) -> None:
    torch.save({"step": 4, "model": _Plant(marker)}, path)


def _bare_pickle(path: Path, marker: Path) -> None:
    path.write_bytes(pickle.dumps({"step": 4, "model": _Plant(marker)}))


# (how the payload is written, how an unpickler that trusts it would read it)
PAYLOADS = {"torch_save": (_torch_pickle, lambda p: torch.load(p, weights_only=False)),
            "bare_pickle": (_bare_pickle, lambda p: pickle.loads(p.read_bytes()))}
PICKLES = [(name, kind) for name in (checkpoint.LEGACY_NAME, checkpoint.NAME) for kind in PAYLOADS]


def _run():
    """A small run (a background, one tracked actor, two cameras, view corrections) a few Adam steps in."""
    rng = np.random.default_rng(0)

    def surfels(n):
        return Surfels(rng.uniform(-2, 2, (n, 3)).astype(np.float32),
                       np.tile([1.0, 0, 0, 0], (n, 1)).astype(np.float32), np.full((n, 2), 0.1, np.float32),
                       np.full(n, 0.5, np.float32), rng.uniform(0, 1, (n, 3)).astype(np.float32))
    times = np.array([0, 100_000, 200_000])
    track = ActorTrack("car", "car", (4.0, 2.0, 1.5), times, np.tile(np.eye(4), (3, 1, 1)))
    model = SceneModel.from_surfels(surfels(40), {"car": surfels(8)}, [track], ["front", "left"], knots_us=times,
                                    view_centres=rng.normal(size=(3, 3)))
    run = train_mod._Run(train_mod.preset("cpu", iterations=9, train_span=(0.0, 0.5)), model, 2.5)
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        params = {**model.params, **model.extra_params()}
        for k, p in params.items():
            if k != "head/b2":  # one tensor the optimiser has not touched yet: no moments
                p.grad = torch.randn(p.shape, generator=g)
        run.adam.step(params)
        run.step += 1
    run.densifier.grad_sum, run.densifier.count = torch.rand(len(model), generator=g), torch.ones(len(model))
    run.rng.random(3)
    torch.rand(2, generator=run.gen)
    return run, [track]


def _same(a, b, where="state"):
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b), where
    else:
        assert type(a) is type(b) and a == b, where


def test_a_round_trip_gives_back_the_same_state_and_run(tmp_path):
    run, tracks = _run()
    run.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint.NAME]
    state, back = run.state(), train_mod.load_state(tmp_path / checkpoint.NAME)
    assert back["config"] == json.loads(json.dumps(state["config"]))  # the train span's tuple is a JSON list
    _same({**state, "config": None}, {**back, "config": None})
    assert "head/b2" not in back["adam"]["m"] and back["adam"]["step"] == 2
    # restored into a new run: the same optimiser moments, and the same random draws from here on
    again = train_mod._Run(train_mod.TrainConfig.from_dict(back["config"]),
                           SceneModel.from_state(back["model"], tracks, list(back["model"]["affine"])), back["scale"])
    again.restore(back)
    _same(run.adam.state_dict(), again.adam.state_dict())
    assert run.rng.random() == again.rng.random()
    assert torch.equal(torch.rand(4, generator=run.gen), torch.rand(4, generator=again.gen))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch's, reading the bare pickle to refuse it
@pytest.mark.parametrize("name, kind", PICKLES)
def test_a_pickle_is_refused_by_reconstruct_and_expand_and_never_runs(tmp_path, capsys, name, kind):
    from gsim.cli import main
    from gsim.diffusion.expand import expand
    write, unpickle = PAYLOADS[kind]
    marker = tmp_path / "marker"
    write(tmp_path / "control.pt", tmp_path / "control")
    unpickle(tmp_path / "control.pt")  # the payload is live: unpickled, it plants its file
    assert (tmp_path / "control").exists()
    recon = tmp_path / "recon"
    recon.mkdir()
    write(recon / name, marker)
    with pytest.raises(InputError, match=re.escape(f"{recon / name}: a pickle")):
        train_mod.reconstruct(tmp_path / "log", recon, resume=True, progress=False)
    assert main(["reconstruct", str(tmp_path / "log"), str(recon), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "a pickle" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    with pytest.raises(InputError, match="a pickle"):
        expand(recon / "scene", tmp_path / "log", None, tmp_path / "x", progress=False)
    if name == checkpoint.LEGACY_NAME:  # the conversion, even trusted, goes through torch's restricted unpickler
        for trust in (False, True):
            with pytest.raises(InputError, match="restricted unpickler" if trust else "trust_pickle"):
                train_mod.convert_legacy_checkpoint(recon / name, trust_pickle=trust)
    assert not marker.exists()


def _reconstruction_checkpoint(path: Path, marker: Path) -> None:
    _run()[0].save(path.parent)


def _cut(path: Path, marker: Path) -> None:
    path.write_bytes((100).to_bytes(8, "little") + b'{"__metadata__": {"gsim": "')


@pytest.mark.skipif(importlib.util.find_spec("diffusers") is None, reason="needs the diffusion extra")
@pytest.mark.parametrize("name, write, message", [
    (checkpoint.LEGACY_NAME, _torch_pickle, "a pickle.*without --resume"),
    (checkpoint.NAME, _torch_pickle, "a pickle.*without --resume"),
    (checkpoint.NAME, _cut, "not a readable gsim checkpoint"),
    (checkpoint.NAME, _reconstruction_checkpoint, "kind: expected 'repair-training', got 'reconstruction'")])
def test_diffusion_train_resume_refuses_a_pickle_or_a_damaged_file(tmp_path, name, write, message):
    from gsim.diffusion.repair import RepairConfig
    from gsim.diffusion.train import TrainOptions, train
    work = tmp_path / "model-work"
    work.mkdir()
    write(work / name, tmp_path / "marker")
    with pytest.raises(InputError, match=re.escape(f"{work / name}: ") + message):
        train(tmp_path / "scene", tmp_path / "log", tmp_path / "model", TrainOptions(steps=2, crop=16),
              RepairConfig(channels=(8, 16)), resume=True, progress=False)
    assert not (tmp_path / "marker").exists()


def _rewrite(path: Path, tensors=lambda t: None, meta=lambda m: None, metadata=None) -> None:
    """Rewrite the checkpoint at ``path`` with its tensors and header changed in place (or this ``metadata``)."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    with safe_open(str(path), "pt") as f:
        m, t = json.loads(f.metadata()["gsim"]), {k: f.get_tensor(k) for k in f.keys()}
    tensors(t)
    meta(m)
    save_file(t, str(path), metadata=metadata or {"gsim": json.dumps(m)})


def _set(t, name, value):
    t[name] = value


DAMAGE = {
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:-100]), "not a readable gsim checkpoint"),
    "empty": (lambda p: p.write_bytes(b""), "not a readable gsim checkpoint"),
    "header cut": (lambda p: p.write_bytes(p.read_bytes()[:200]), "not a readable gsim checkpoint"),
    "no gsim header": (lambda p: _rewrite(p, metadata={"misc": "x"}), "without gsim's header"),
    "broken JSON": (lambda p: _rewrite(p, metadata={"gsim": '{"format": "gsim-checkpoint", '}),
                    "header 'gsim': not valid JSON"),
    "NaN in JSON": (lambda p: _rewrite(p, meta=lambda m: m.update(scale=float("nan"))), "NaN is not a number"),
    "foreign format": (lambda p: _rewrite(p, meta=lambda m: m.update(format="other")), "format"),
    "other kind": (lambda p: _rewrite(p, meta=lambda m: m.update(kind="repair-training")), "kind: expected"),
    "newer schema": (lambda p: _rewrite(p, meta=lambda m: m.update(schema_version=2)), "schema_version"),
    "missing tensor": (lambda p: _rewrite(p, tensors=lambda t: t.pop("adam/m/means")), "adam/m/means: missing"),
    "extra tensor": (lambda p: _rewrite(p, tensors=lambda t: _set(t, "model/extra", torch.zeros(2))),
                     "model/extra: unexpected"),
    "missing field": (lambda p: _rewrite(p, meta=lambda m: m.pop("step")), "step: missing field"),
    "extra field": (lambda p: _rewrite(p, meta=lambda m: m.update(note=1)), "note: unexpected"),
    "wrong dtype": (lambda p: _rewrite(p, tensors=lambda t: _set(t, "model/owner", t["model/owner"].int())),
                    "model/owner: expected dtype torch.int64"),
    "wrong shape": (lambda p: _rewrite(p, tensors=lambda t: _set(t, "model/quats", t["model/quats"][:, :3].clone())),
                    r"model/quats: expected shape \(48, 4\)"),
    "moment of another shape": (lambda p: _rewrite(p, tensors=lambda t: _set(t, "adam/v/sky", torch.zeros(3))),
                                "adam/v/sky: expected shape"),
    "non-finite": (lambda p: _rewrite(p, tensors=lambda t: t["model/means"].__setitem__((0, 0), float("inf"))),
                   "model/means: non-finite"),
    "owner out of range": (lambda p: _rewrite(p, tensors=lambda t: t["model/owner"].__setitem__(0, 7)),
                           "model/owner: expected -1"),
    "config field type": (lambda p: _rewrite(p, meta=lambda m: m["config"].update(iterations="many")),
                          "config.iterations: expected a non-negative integer"),
    "config unknown field": (lambda p: _rewrite(p, meta=lambda m: m["config"]["init"].update(spam=1)),
                             r"config.init: unexpected keys \['spam'\]"),
    "config value": (lambda p: _rewrite(p, meta=lambda m: m["config"].update(checkpoint_every=0)),
                     "config: TrainConfig: need checkpoint_every >= 1"),
    "numpy generator": (lambda p: _rewrite(p, meta=lambda m: m["rng"].update(bit_generator="MT19937")),
                        "rng: not a PCG64 generator state"),
    "torch generator": (lambda p: _rewrite(p, tensors=lambda t: _set(t, "rng/torch", t["rng/torch"][:100].clone())),
                        "rng/torch: expected shape"),
    "unknown moment": (lambda p: _rewrite(p, meta=lambda m: m["adam"]["moments"].append("pose/bus")),
                       "adam.moments"),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("saved")
    _run()[0].save(d)
    return (d / checkpoint.NAME).read_bytes()


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_checkpoint_is_refused_naming_the_file_and_field(saved, tmp_path, damage):
    path = tmp_path / checkpoint.NAME
    path.write_bytes(saved)
    train_mod.load_state(path)  # whole, it reads
    do, message = DAMAGE[damage]
    do(path)
    with pytest.raises(InputError, match=message) as e:
        train_mod.load_state(path)
    assert str(e.value).startswith(f"{path}: ")


def test_a_failed_write_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    run, _ = _run()
    run.save(tmp_path)

    def disk_full(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 100)
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(checkpoint, "save_file", disk_full)
    run.step = 5
    with pytest.raises(OSError, match="No space"):
        run.save(tmp_path)
    assert train_mod.load_state(tmp_path / checkpoint.NAME)["step"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint.NAME]  # no temporary file left


def test_an_old_pickled_checkpoint_converts_only_when_asked(tmp_path):
    run, _ = _run()
    legacy = tmp_path / checkpoint.LEGACY_NAME
    torch.save(run.state(), legacy)  # what gsim wrote before
    with pytest.raises(InputError, match=re.escape(f"convert_legacy_checkpoint({str(legacy)!r}, trust_pickle=True)")):
        train_mod.reconstruct(tmp_path / "log", tmp_path, resume=True, progress=False)
    with pytest.raises(InputError, match="trust_pickle=True"):
        train_mod.convert_legacy_checkpoint(legacy)
    assert not (tmp_path / checkpoint.NAME).exists()
    out = train_mod.convert_legacy_checkpoint(legacy, trust_pickle=True)
    assert out == tmp_path / checkpoint.NAME
    state, back = run.state(), train_mod.load_state(out)
    _same({**state, "config": None}, {**back, "config": None})
    with pytest.raises(InputError, match="exists already"):
        train_mod.convert_legacy_checkpoint(legacy, trust_pickle=True)
