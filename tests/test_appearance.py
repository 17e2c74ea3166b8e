"""Sky and per-camera appearance: lookup conventions, compositing, gradients, scene files."""
import numpy as np
import pytest
import torch

from gsim import PinholeCamera, Scene, SceneFormatError, Surfels, load_scene, save_scene
from gsim.appearance import Sky, camera_ray_directions, compose
from gsim.transforms import look_at


def _two_tone_sky():
    env = np.zeros((8, 16, 3), np.float32)
    env[:4] = [0.2, 0.4, 0.9]  # upper hemisphere
    env[4:] = [0.3, 0.3, 0.3]
    env[:, :8, 0] += 0.05  # azimuth < 0 (y < 0) a little redder
    return Sky(env)


def test_sky_lookup_conventions():
    sky = _two_tone_sky()
    c = sky.color(np.array([[0, 0, 1.0], [0, 0, -1.0], [0.3, -1, 1.0], [0.3, 1, 1.0], [-1, 1e-4, 1.0]]))
    assert np.allclose(c[0, 1:], [0.4, 0.9]) and np.allclose(c[1, 1:], [0.3, 0.3])  # poles: any azimuth
    assert np.allclose(c[2], [0.25, 0.4, 0.9]) and np.allclose(c[3], [0.2, 0.4, 0.9])
    # across the azimuth seam at -x the two sides blend instead of jumping to a border value
    assert 0.2 < c[4, 0] < 0.25


def test_sky_gradients_and_compose():
    env = torch.rand(4, 8, 3, dtype=torch.float64, requires_grad=True)
    dirs = torch.randn(5, 7, 3, dtype=torch.float64)
    torch.autograd.gradcheck(lambda e: Sky(e).color(dirs), (env,))
    rgb, alpha = torch.rand(5, 7, 3, dtype=torch.float64), torch.rand(5, 7, dtype=torch.float64)
    A = torch.tensor(np.hstack([2 * np.eye(3), np.full((3, 1), 0.1)]))
    out = compose(rgb, alpha, Sky(env), dirs, A)
    expect = 2 * (rgb + (1 - alpha)[..., None] * Sky(env).color(dirs)) + 0.1
    assert torch.allclose(out, expect)


def test_camera_ray_directions_are_world_unit_vectors():
    cam = PinholeCamera(4, 2, 2, 2, 2, 1)
    T = look_at([0, 0, 0], [1, 0, 0])  # camera forward = world +x
    d = camera_ray_directions(cam, T)
    assert d.shape == (2, 4, 3) and np.allclose(np.linalg.norm(d, axis=-1), 1, atol=1e-6)
    assert np.all(d[..., 0] > 0) and np.all(d[0, :, 2] > 0) and np.all(d[1, :, 2] < 0)  # row 0 looks up


def test_scene_with_sky_and_appearance_round_trip(tmp_path):
    s = Surfels(np.zeros((2, 3)), np.tile([1.0, 0, 0, 0], (2, 1)), np.ones((2, 2)), np.ones(2) * 0.5,
                np.full((2, 3), 0.5))
    A = np.hstack([np.eye(3) * 1.1, np.full((3, 1), -0.02)])
    scene = Scene(background=s, sky=_two_tone_sky(), appearance={"front": A})
    save_scene(scene, tmp_path / "s")
    back = load_scene(tmp_path / "s")
    assert np.array_equal(back.sky.envmap, scene.sky.envmap) and np.array_equal(back.appearance["front"], A)
    (tmp_path / "s" / "sky.npy").write_bytes(b"\x93NUMPY broken")
    with pytest.raises(SceneFormatError, match="sky.npy"):
        load_scene(tmp_path / "s")


def test_bad_sky_and_appearance():
    with pytest.raises(ValueError, match="envmap"):
        Sky(np.zeros((4, 4)))
    with pytest.raises(ValueError, match="NaN"):
        Sky(np.full((2, 2, 3), np.nan))
    # a trainer's own map: its shape is checked, its values are not (a host synchronisation on a GPU)
    with pytest.raises(ValueError, match="envmap"):
        Sky.derived(np.zeros((4, 4)))
    assert np.isnan(Sky.derived(np.full((2, 2, 3), np.nan)).envmap).all()
    s = Surfels(np.zeros((1, 3)), [[1.0, 0, 0, 0]], np.ones((1, 2)), [0.5], [[0.5, 0.5, 0.5]])
    with pytest.raises(ValueError, match="appearance"):
        Scene(background=s, appearance={"front": np.eye(3)})
