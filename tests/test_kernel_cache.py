"""Priming numba's kernel cache (gsim.scenes.kernel_cache): the stamp follows gsim's sources, a stale stamp runs the
child that compiles, a fresh one does not, and a reconstruction in a fresh process equals one in this process bit
for bit (both run the cached kernels; a batch's workers are such processes, tests/test_batch.py)."""
import subprocess
import sys

import pytest

from gsim.scenes import kernel_cache


@pytest.fixture
def unprimed(monkeypatch):
    monkeypatch.setattr(kernel_cache, "_primed", False)


def test_the_fingerprint_follows_every_source_file(monkeypatch, tmp_path):
    src = tmp_path / "kernel.py"
    src.write_text("x = 1\n")
    monkeypatch.setattr(kernel_cache, "_sources", lambda: [src])
    a = kernel_cache.fingerprint()
    assert kernel_cache.fingerprint() == a
    src.write_text("x = 22\n")  # an edit: numba recompiles, so the cache must be primed again
    assert kernel_cache.fingerprint() != a


def test_gsims_sources_include_every_kernel_module():
    files = {p.as_posix() for p in kernel_cache._sources()}
    for module in ("gsim/render/numba_grad.py", "gsim/render/numba_raster.py", "lidar/kernel.py", "lidar/sweep.py",
                   "scenes/reconstruction/movers.py"):
        assert any(f.endswith(module) for f in files), module


def test_a_fresh_stamp_skips_the_child_and_a_stale_one_runs_it(unprimed, monkeypatch):
    stamp = kernel_cache.stamp_path()
    kernel_cache.prime(progress=False)  # (primed by the session already: a no-op, or this makes it fresh)
    assert stamp.read_text() == kernel_cache.fingerprint()
    monkeypatch.setattr(kernel_cache, "_primed", False)
    assert kernel_cache.prime(progress=False) is False  # fresh: no child
    assert kernel_cache.prime(progress=False) is False  # and once per process
    good = stamp.read_text()
    stamp.write_text("stale")
    monkeypatch.setattr(kernel_cache, "_primed", False)
    try:
        assert kernel_cache.prime(progress=False) is True  # the child ran and wrote the stamp
    finally:
        if stamp.read_text() != good:
            stamp.write_text(good)
    assert stamp.read_text() == good


def test_a_failing_child_is_an_error_with_its_output(unprimed, monkeypatch):
    from gsim.errors import InputError
    monkeypatch.setattr(kernel_cache, "fingerprint", lambda: "never primed")
    # the child is told it is one under another name, so it refuses to run (as when started by hand) and exits 1
    monkeypatch.setattr(kernel_cache, "CHILD", "GSIM_TEST_NOT_THE_CHILD_VARIABLE")
    with pytest.raises(InputError, match=r"(?s)-m gsim.scenes.kernel_workload\) failed.*run `gsim compile`"):
        kernel_cache.prime(progress=False)


def test_a_reconstruction_in_a_fresh_process_equals_one_here(tmp_path):
    from gsim.scenes.synth import SynthOptions, synthesize
    from gsim.scenes.reconstruction.train import preset, reconstruct
    tiny = SynthOptions(n_frames=9, width=64, height=40, supersample=1, lidar_beams=8, lidar_azimuth_resolution_deg=2.0)
    log = synthesize(tmp_path / "log", seed=3, options=tiny, progress=False)
    reconstruct(log, tmp_path / "here", preset("cpu", iterations=10), progress=False)
    code = ("from gsim.scenes.reconstruction.train import preset, reconstruct; "
            f"reconstruct({str(log)!r}, {str(tmp_path / 'there')!r}, preset('cpu', iterations=10), progress=False)")
    subprocess.run([sys.executable, "-c", code], check=True)
    files = sorted(p.relative_to(tmp_path / "here") for p in (tmp_path / "here" / "scene").rglob("*") if p.is_file())
    assert len(files) >= 3
    for f in files:  # the trained scene, byte for byte
        assert (tmp_path / "here" / f).read_bytes() == (tmp_path / "there" / f).read_bytes(), f


def test_gsim_compile_says_where_the_stamp_is(unprimed, capsys):
    from gsim.cli import main
    kernel_cache.prime(progress=False)
    kernel_cache._primed = False
    assert main(["compile"]) == 0
    assert f"were already in numba's cache (stamp {kernel_cache.stamp_path()})" in capsys.readouterr().out


def test_a_stamp_that_cannot_be_written_is_said_not_fatal(monkeypatch, tmp_path, capsys):
    """A read-only install: the priming child cannot write the stamp; it says so and the reconstruction goes on
    (the parent echoes the child's "gsim: " lines)."""
    blocked = tmp_path / "ro"
    blocked.write_text("a file where the stamp's folder would be")
    monkeypatch.setattr(kernel_cache, "stamp_path", lambda: blocked / "sub" / "gsim-kernels.stamp")
    kernel_cache.write_stamp("abc")
    err = capsys.readouterr().err
    assert err.startswith(f"gsim: cannot write {blocked / 'sub' / 'gsim-kernels.stamp'}") and "NUMBA_CACHE_DIR" in err
