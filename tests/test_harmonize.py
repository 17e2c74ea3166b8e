"""Harmonization of inserted objects: the region's geometry (dilation, the contact band below, feathering),
repair confined to it, and `render_world` with a harmonizer (renders kept in render/, images changed only
around the inserted actor, everything else as without it)."""
import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("trimesh")
pytest.importorskip("yaml")

from gsim.diffusion.harmonize import Harmonizer, harmonize, region  # noqa: E402
from gsim.diffusion.repair import RepairConfig, RepairModel  # noqa: E402
from support import scenario_dict  # noqa: E402


def box_mask(H=40, W=40, rows=(10, 20), cols=(15, 25)):
    m = np.zeros((H, W), bool)
    m[rows[0]:rows[1], cols[0]:cols[1]] = True
    return m


@pytest.fixture(scope="module")
def model():
    m = RepairModel.new(RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20))
    torch.manual_seed(1)
    torch.nn.init.normal_(m.unet.conv_out.weight, std=0.1)  # a model that changes what it sees
    torch.nn.init.normal_(m.unet.conv_out.bias, std=0.1)
    return m


def test_region_dilates_adds_a_contact_band_below_and_feathers():
    m = box_mask()  # rows 10..19, columns 15..24
    hard = region(m, dilate_px=2, contact_px=5, feather_px=0)
    assert hard.dtype == np.float32 and set(np.unique(hard)) == {0.0, 1.0}
    assert hard[8, 20] == 1 and hard[7, 20] == 0  # dilated 2 px above
    assert hard[15, 13] == 1 and hard[15, 12] == 0 and hard[15, 26] == 1 and hard[15, 27] == 0  # and sideways
    assert hard[24, 20] == 1 and hard[25, 20] == 0  # 5 rows below the lower edge (row 19)
    assert hard[24, 15] == 1 and hard[24, 14] == 0  # the band is under the object only
    soft = region(m, dilate_px=3, contact_px=5, feather_px=3)
    assert np.array_equal(soft > 0, region(m, dilate_px=3, contact_px=5, feather_px=0) > 0)  # feathered inwards
    assert np.all(soft[m] == 1)
    assert np.allclose(soft[6:11, 20], [0, 1 / 3, 2 / 3, 1, 1])  # the ramp from the region's top edge
    assert np.allclose(soft[21:26, 20], [1, 1, 2 / 3, 1 / 3, 0])  # and from its bottom
    assert np.array_equal(region(np.zeros((7, 9))), np.zeros((7, 9), np.float32))
    with pytest.raises(ValueError, match=r"\(H,W\) object mask"):
        region(np.zeros((4, 4, 3)))


def test_harmonize_changes_only_the_region(model):
    rng = np.random.default_rng(0)
    rgb = rng.random((24, 32, 3)).astype(np.float32)
    alpha, depth = np.ones((24, 32), np.float32), np.full((24, 32), 6.0, np.float32)
    img, w = harmonize(rgb, alpha, depth, box_mask(24, 32, (6, 12), (10, 20)), model, seed=2)
    assert img.shape == rgb.shape and img.dtype == np.float32 and w.shape == (24, 32)
    assert 0 < (w > 0).mean() < 0.6
    assert np.allclose(img[w == 0], rgb[w == 0], atol=1e-6)
    assert np.abs(img - rgb)[w == 1].mean() > 1e-2


def test_an_empty_mask_returns_the_render_without_a_model_call():
    class Fails:
        def repair_image(self, *a, **k):
            raise AssertionError("called")

    rgb = np.random.default_rng(0).random((8, 8, 3))
    img, w = harmonize(rgb, np.ones((8, 8)), np.ones((8, 8)), np.zeros((8, 8), bool), Fails())
    assert img is rgb and not w.any()


def test_render_world_harmonizes_around_inserted_actors_only(edit_street, model, tmp_path):
    from PIL import Image

    from gsim.editing.outputs import render_world
    from gsim.editing.scenario import parse_scenario
    from gsim.editing.world import apply
    from gsim.scenes.log import load_log
    root, _ = edit_street
    outs = {}
    for name, h in (("plain", None), ("harmonized", Harmonizer(model, "tiny-model"))):
        sc = parse_scenario(scenario_dict(root, edits=scenario_dict(root)["edits"][:1],  # the insert only
                                          sensors={"cameras": ["front"], "lidars": [], "video": False},
                                          output=str(tmp_path / name)))
        world = apply(sc)  # the log's parked_a stays: it must not be repainted
        assert [a.id for a in world.scene.actors] == ["parked_a", "ahead"] and world.inserted == ("ahead",)
        outs[name] = render_world(world, sc, progress=False, harmonizer=h)
    plain, harm = outs["plain"], outs["harmonized"]
    assert not (plain / "render").exists()
    assert any("harmonized with tiny-model" in n for n in load_log(harm / "log").notes)
    read = lambda p: np.asarray(Image.open(p)).astype(int)  # noqa: E731
    renders = sorted((harm / "render" / "front").glob("*.png"))
    assert len(renders) == 5
    for p in renders:
        name = f"front/{p.name}"
        assert np.array_equal(read(p), read(plain / "log" / "cameras" / name))  # the render, as without harmonizing
        assert np.array_equal(read(harm / "masks" / name), read(plain / "masks" / name))
        mask, img = read(harm / "masks" / name), read(harm / "log" / "cameras" / name)
        assert (mask == 1).sum() > 20 and (mask == 2).sum() > 20  # both cars in view
        changed = np.abs(img - read(p)).max(-1) > 0
        # near the car: its region, grown by 2 px for its full silhouette (a tyre's edge hidden by the ground
        # is in it, not in the visible mask)
        assert not changed[region(mask == 2, dilate_px=8, contact_px=10) == 0].any()
        assert changed[mask == 2].mean() > 0.5 and changed[mask != 2].sum() > 10  # the car and around it


def test_a_reference_model_harmonizes_with_the_logs_images_around_the_insertion(edit_street, tmp_path):
    """A repair model with reference slots, given the view, sees the log's real images warped in (through its
    LiDAR), invalid on the inserted object; without the view, or a model without slots, it sees none."""
    import gsim
    from gsim.images import render_image
    from gsim.scenes.log import load_log
    root, log_path = edit_street
    log, scene = load_log(log_path), gsim.load_scene(root / "scene")
    obs = log.frames[2].cameras["front"]
    cam, T = log.cameras["front"].camera, log.T_world_camera(obs)
    rgb, alpha, depth = render_image(scene, cam, T, obs.timestamp_us, "front")
    obj = box_mask(cam.height, cam.width, (20, 40), (30, 60))
    seen = []

    class Spy:
        def __init__(self, config):
            self.config = config

        def repair_image(self, rgb, alpha, depth, seed=0, mask=None, references=None):
            seen.append(references)
            return rgb
    view = (scene, log, cam, T, obs.timestamp_us, "front")
    Harmonizer(Spy(RepairConfig(references=2, reference_depth="lidar")), "spy")(rgb, alpha, depth, obj, view=view)
    refs = seen.pop()
    assert len(refs) == 2 and all(w.shape == rgb.shape and v.shape == obj.shape for w, v in refs)
    assert not any(v[obj].any() for _, v in refs) and all(v[~obj].mean() > 0.2 for _, v in refs)
    Harmonizer(Spy(RepairConfig(references=2)), "spy")(rgb, alpha, depth, obj)  # no view
    Harmonizer(Spy(RepairConfig()), "spy")(rgb, alpha, depth, obj, view=view)  # no slots
    assert seen == [None, None]
