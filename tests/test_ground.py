"""The road's height field from the LiDAR (the synthetic street: road at 0, raised sidewalks at 0.15 m, no ground
under cars or walls) and the term that holds the surfels near it on it, flat."""
import numpy as np
import pytest
import torch

from gsim.scenes.log import load_log
from gsim.scenes.reconstruction.ground import GroundField, GroundOptions, road_loss
from gsim.scenes.reconstruction.views import split_frames
from gsim.scenes.synth import ROAD_HALF_WIDTH, SynthOptions, build_street, synthesize

OPTS = SynthOptions(n_frames=9, width=48, height=32, supersample=1, lidar_beams=16, lidar_azimuth_resolution_deg=1.0)


@pytest.fixture(scope="module")
def field(tmp_path_factory):
    log = load_log(synthesize(tmp_path_factory.mktemp("ground") / "log", seed=0, options=OPTS, progress=False))
    return GroundField.fit(log, split_frames(log, 8)[0]), build_street(0, OPTS)


def test_the_field_finds_the_road_and_the_sidewalks_and_no_ground_under_a_car(field):
    g, st = field
    lane = g.height(torch.tensor([[10.0, 0.0], [12.0, 1.75]], dtype=torch.float64))
    assert torch.allclose(lane, torch.zeros(2, dtype=torch.float64), atol=1e-3)
    walk_y = ROAD_HALF_WIDTH + 0.5 * st.sidewalk_width
    walk = g.height(torch.tensor([[8.0, walk_y], [8.0, -walk_y]], dtype=torch.float64))
    want = 0.15 if st.raised_sidewalks else 0.0
    assert torch.allclose(walk[torch.isfinite(walk)], torch.full((int(torch.isfinite(walk).sum()),), want,
                                                                    dtype=torch.float64), atol=1e-3)
    h = g.heights[np.isfinite(g.heights)]
    assert len(h) > 100 and np.mean(h < 0.2) > 0.99  # ground cells; a far roof with no road seen around it is rare
    parked = st.car_poses([0])[0, 5, :2, 3]
    assert torch.isnan(g.height(torch.tensor([parked.tolist()], dtype=torch.float64)))[0]
    assert torch.isnan(g.height(torch.tensor([[1e4, 0.0]], dtype=torch.float64)))[0]  # outside the field


def test_road_loss_is_zero_on_the_road_and_pulls_lying_surfels_onto_it(field):
    g, _ = field
    means = torch.tensor([[10.0, 0.0, 0.0], [12.0, 1.75, 0.1], [11.0, 0.0, 2.0]], requires_grad=True)
    flat = torch.tensor([[1.0, 0.0, 0.0, 0.0]] * 3, requires_grad=True)
    background = torch.tensor([True, True, True])
    loss = road_loss(g, means, flat, background, GroundOptions.band_m)
    # the first lies on the road, the second 0.1 m above it, the third is 2 m up (not the road's): (0 + 0.16) / 2
    assert float(loss.detach()) == pytest.approx((0.1 / GroundOptions.band_m) ** 2 / 2, rel=1e-4)
    loss.backward()
    assert means.grad[1, 2] > 0 and abs(means.grad[0, 2]) < 1e-5 and means.grad[2, 2] == 0
    assert flat.grad is None or not flat.grad.any()  # the tilt is the images' to choose
    tilted = torch.tensor([[np.cos(0.3), np.sin(0.3), 0.0, 0.0]] * 3)  # 0.6 rad about x: still lying, held
    on = road_loss(g, means.detach(), tilted, torch.tensor([False, True, False]), GroundOptions.band_m)
    assert float(on) == pytest.approx((0.1 / GroundOptions.band_m) ** 2, rel=1e-4)
    actor = road_loss(g, means.detach(), tilted, torch.tensor([True, False, True]), GroundOptions.band_m)
    assert float(actor) < 1e-12  # an actor's surfel (owner >= 0) is not held
    standing = torch.tensor([[np.cos(0.7), np.sin(0.7), 0.0, 0.0]] * 3)  # 1.4 rad: a curb's face, not held
    assert float(road_loss(g, means.detach(), standing, background, GroundOptions.band_m)) == 0.0
