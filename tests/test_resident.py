"""The resident renderer (gsim.resident.Renderer): its device path (the torch backend here, gsplat on a GPU) renders
what render_camera renders, actors composed on the device; its host path is render_camera itself."""
import re

import numpy as np
import pytest

import gsim
from gsim.appearance import Sky
from gsim.errors import GsimWarning, InputError, Unavailable
from gsim.lidar import LidarSpec, render_lidar
from gsim.resident import Renderer
from support import CAMERAS, PIN, own_device_waits, pose, random_scene


def scene_with_an_actor():
    """A view-dependent background, a view-dependent actor driving and turning, a sky and a camera affine."""
    rng = np.random.default_rng(5)
    car = gsim.Actor(id="car", category="car", size=(2.0, 1.5, 1.0), surfels=random_scene(150, 6, spread=(0.6,) * 3,
                                                                                         z=0.0),
                     track_timestamps_us=np.array([0, 1_000_000]),
                     track_poses=np.stack([pose(0.5, 0.0, 0.0, 5.0), pose(-0.5, 0.4, 0.8, 6.0)]))
    affine = np.c_[np.diag([0.9, 1.05, 1.0]), [0.02, -0.01, 0.03]]
    return gsim.Scene(background=random_scene(400, 7), actors=(car,), sky=Sky(rng.uniform(0, 1, (8, 16, 3))),
                      appearance={"front": affine})


VIEWS = [(PIN, np.eye(4), "front"), (CAMERAS[0], pose(0.3, -0.2, 0.1), None), (CAMERAS[1], np.eye(4), "front")]


def test_device_path_renders_what_render_camera_renders():
    scene = scene_with_an_actor()
    r = Renderer(scene, backend="torch")
    for t in (0, 400_000):
        got = r.cameras(VIEWS, t, numpy=True)
        for (cam, T, sensor), f in zip(VIEWS, got):
            ref = gsim.render_camera(scene, cam, T, backend="torch", timestamp_us=t, sensor=sensor)
            assert f.rgb.shape == ref.rgb.shape and isinstance(f.rgb, np.ndarray)
            for k in ("rgb", "alpha", "depth"):
                assert np.abs(getattr(f, k) - getattr(ref, k)).max() < 2e-4, (t, k)
            assert ref.alpha.max() > 0.9  # something is in view
    # the actor really moved between the two times, and tensors stay tensors without numpy=True
    a, b = (r.camera(PIN, np.eye(4), t) for t in (0, 400_000))
    assert hasattr(a.rgb, "device") and float((a.alpha - b.alpha).abs().max()) > 0.1
    # a device frame's 8-bit image (what the loop and the server take) is made on the device, as on the host
    from gsim.io import to_uint8
    assert np.array_equal(to_uint8(a.rgb), to_uint8(a.rgb.numpy())) and to_uint8(a.rgb).std() > 5


@pytest.mark.parametrize("backend", ["torch", "numba", pytest.param("gsplat", marks=pytest.mark.cuda)])
def test_images_are_the_cameras_rgb_in_8_bits(backend):
    """Renderer.images (a camera sensor's images: on a GPU rendered without depth or normals, brought back in one
    copy per size): the 8-bit rgb of `cameras`, sky and affine included, in the views' order, sizes mixed."""
    if backend == "gsplat" and "gsplat" not in gsim.available_backends():
        pytest.skip("needs gsplat on an NVIDIA GPU")
    from gsim.io import to_uint8
    r = Renderer(scene_with_an_actor(), backend=backend)
    views = VIEWS + [(PIN, pose(0.1, 0.0, 0.0, 0.2), "front")]
    images, frames = r.images(views, 400_000), r.cameras(views, 400_000)
    assert [x.shape for x in images] == [(c.height, c.width, 3) for c, _, _ in views]
    for x, f in zip(images, frames):
        assert isinstance(x, np.ndarray) and x.dtype == np.uint8 and np.array_equal(x, to_uint8(f.rgb))
    assert images[0].std() > 5 and not np.array_equal(images[0], images[3])


def test_actors_are_composed_once_per_time():
    scene = scene_with_an_actor()
    r = Renderer(scene, backend="torch")
    s0 = r.surfels_at(0)
    assert r.surfels_at(0) is s0 and r.surfels_at(1) is not s0
    moved = scene.at(400_000)
    got = r.surfels_at(400_000)
    assert np.abs(got.means.numpy() - moved.means).max() < 1e-5
    assert np.abs(np.abs((got.quats.numpy() * moved.quats).sum(1)) - 1).max() < 1e-5
    assert np.abs(got.colors.numpy() - moved.colors).max() < 1e-5  # view-dependent colour turned with the car
    with pytest.raises(InputError, match="give timestamp_us"):
        r.camera(PIN, np.eye(4))


def test_host_path_is_render_camera_and_render_lidar():
    scene = scene_with_an_actor()
    r = Renderer(scene, backend="numba")
    assert r.device == "cpu"
    f = r.camera(PIN, np.eye(4), 300_000, "front")
    ref = gsim.render_camera(scene, PIN, np.eye(4), backend="numba", timestamp_us=300_000, sensor="front")
    assert np.array_equal(f.rgb, ref.rgb) and np.array_equal(f.depth, ref.depth)
    spec = LidarSpec.preset("velodyne-vlp16")
    T = pose(0.0, 0.0, 0.0, 5.5)  # amid the surfels (the cameras look up the z axis at them)
    a, b = r.lidar(spec, T, 300_000), render_lidar(scene, spec, T, timestamp_us=300_000)
    assert np.array_equal(a.range_image, b.range_image) and (a.range_image > 0).sum() > 100


def test_bad_input():
    with pytest.raises(TypeError, match="expected a Scene"):
        Renderer(random_scene(10, 0))
    with pytest.raises(InputError, match="unknown backend"):
        Renderer(scene_with_an_actor(), backend="vulkan")
    if "gsplat" not in gsim.available_backends():
        with pytest.raises(Unavailable, match="gsplat"):
            Renderer(scene_with_an_actor(), backend="gsplat")
    with pytest.raises(ValueError, match="views\\[0\\] T_world_camera"):
        Renderer(scene_with_an_actor(), backend="torch").cameras([(PIN, np.ones((4, 4)), None)], 0)


@pytest.mark.cuda
def test_gsplat_renders_a_new_time_without_waiting_on_the_gpu():
    """The actors moved, three cameras rasterized, sky and affine composed: no line of gsim's makes the host wait
    (a frame's uploads are non-blocking; a distorted camera's sampling grid is made once)."""
    if "gsplat" not in gsim.available_backends():
        pytest.skip("needs gsplat on an NVIDIA GPU")
    r = Renderer(scene_with_an_actor(), backend="gsplat")
    r.cameras(VIEWS, 0)  # (the scene's upload, the cameras' tables)
    assert own_device_waits(lambda: r.cameras(VIEWS, 400_000)) == []


def test_lidar_kernel_follows_the_device():
    """The host path traces with numba; a GPU device with the CUDA kernel with it, and where numba-cuda cannot run
    there, with numba and a warning that says why (here: no GPU, so the device is set by hand)."""
    import torch

    from gsim.lidar.kernel_cuda import unavailable_reason
    r = Renderer(scene_with_an_actor(), backend="torch")
    assert r.lidar_backend == "numba"
    r.device = torch.device("cuda")
    if unavailable_reason() is None:
        assert r.lidar_backend == "cuda"
    else:
        with pytest.warns(GsimWarning, match="with numba on the CPU, not on the GPU: " + re.escape(unavailable_reason())):
            assert r.lidar_backend == "numba"


@pytest.mark.cuda
def test_gsplat_frames_keep_no_graph():
    """A resident render of a scene (nothing to train) records no backward graph: its frames hold no saved tensors."""
    if "gsplat" not in gsim.available_backends():
        pytest.skip("needs gsplat on an NVIDIA GPU")
    f = Renderer(scene_with_an_actor(), backend="gsplat").camera(PIN, np.eye(4), 0, "front")
    assert not f.rgb.requires_grad and not f.depth.requires_grad


@pytest.mark.cuda
def test_gsplat_batch_matches_single_renders():
    """Three cameras of two sizes (one distorted) in one call: each equals gsplat's render of that camera alone."""
    if "gsplat" not in gsim.available_backends():
        pytest.skip("needs gsplat on an NVIDIA GPU")
    scene = scene_with_an_actor()
    r = Renderer(scene, backend="gsplat")
    got = r.cameras(VIEWS, 400_000, numpy=True)
    for (cam, T, sensor), f in zip(VIEWS, got):
        ref = gsim.render_camera(scene, cam, T, backend="gsplat", timestamp_us=400_000, sensor=sensor)
        assert np.abs(f.rgb - ref.rgb).max() < 1e-3 and np.abs(f.depth - ref.depth).max() < 1e-3


def test_update_keeps_what_the_device_has():
    """A closed loop's step: the same surfel sets on new tracks are not uploaded again; a new actor is."""
    from dataclasses import replace
    scene = scene_with_an_actor()
    r = Renderer(scene, backend="torch")
    first = r.cameras(VIEWS[:1], 0)[0]
    background = r._sets[id(scene.background)][1]
    car = scene.actors[0]
    moved = replace(scene, actors=(replace(car, track_timestamps_us=np.array([0]),
                                           track_poses=pose(0.0, 0.3, 0.5, 6.5)[None]),))
    r.update(moved)
    assert r._sets[id(scene.background)][1] is background
    got = r.camera(*VIEWS[0][:2], 0, "front", numpy=True)
    ref = gsim.render_camera(moved, *VIEWS[0][:2], backend="torch", timestamp_us=0, sensor="front")
    assert np.abs(got.rgb - ref.rgb).max() < 2e-4
    assert float((first.alpha - r.cameras(VIEWS[:1], 0)[0].alpha).abs().max()) > 0.1
    two = replace(moved, actors=moved.actors + (replace(car, id="car2"),))
    r.update(two)
    assert len(r._surfels.means) == len(scene.background.means) + 2 * len(car.surfels.means)
    assert len(r._sets) == 2  # the background and the car's set (shared by both cars)
