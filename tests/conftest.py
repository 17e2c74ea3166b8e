"""Fixtures that several test modules share (module-scoped: each module builds its own). Helper functions and
constants are in support.py."""
import pytest

import gsim
from support import loop_street as loop_street_at, plane, pose


def pytest_sessionstart(session):
    """numba's cache primed (gsim.scenes.kernel_cache) before a test compiles a kernel in this process: runs then
    load the same machine code here as in a subprocess or a Ray worker."""
    from gsim.scenes.kernel_cache import prime
    prime()


@pytest.fixture(scope="module")
def edit_street(tmp_path_factory):
    """A tiny synthetic log (0.4 s of driving along +x in the lane at y = -1.75) and a scene: a ground
    plane with one parked sedan, actor 'parked_a', at x = 12, y = 4."""
    pytest.importorskip("trimesh")
    from gsim.editing import AssetLibrary, insert_actor
    from gsim.scenes.synth import SynthOptions, synthesize
    root = tmp_path_factory.mktemp("scn")
    tiny = SynthOptions(n_frames=5, width=96, height=60, supersample=1, lidar_beams=8, lidar_azimuth_resolution_deg=2.0)
    log = synthesize(root / "log", seed=0, options=tiny, progress=False)
    sedan = AssetLibrary.builtin().get("sedan")
    scene = insert_actor(gsim.Scene(background=plane()), sedan, [0, 400_000], [pose(12.0, 4.0)] * 2,
                         actor_id="parked_a", shadow=False)
    scene.save(root / "scene")
    return root, log


@pytest.fixture(scope="module")
def loop_street(tmp_path_factory):
    """A 3 s synthetic log (the ego drives along +x in the lane at y = -1.75 from x = 0 to about 22 m) and a
    scene: a ground plane with a parked sedan in the parking lane (x = 12, y = 4.75)."""
    pytest.importorskip("trimesh")
    from gsim.scenes.synth import SynthOptions
    return loop_street_at(tmp_path_factory.mktemp("loop"),
                          SynthOptions(n_frames=30, width=96, height=60, supersample=1, lidar_beams=16,
                                       lidar_azimuth_resolution_deg=1.0))
