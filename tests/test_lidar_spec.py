"""lidar/spec.py and lidar/estimate.py: LiDAR sensor types, presets, and beam estimation from sweeps."""
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gsim.lidar import LidarSpec, RayTableSpec, estimate_beams, preset_names, spec_from_dict
from gsim.lidar.spec import ray_table_preset_names

KITTI = Path(__file__).resolve().parents[2] / "shared/data/kitti_raw/2011_09_26/velodyne_points/data"

# name: (lasers, columns at 10 Hz, top elevation, bottom elevation), from the sources in lidar/spec.py
EXPECTED = {
    "velodyne-hdl64e": (64, 2000, 2.0, -24.9),
    "velodyne-vlp16": (16, 1800, 15.0, -15.0),
    "velodyne-vlp32c": (32, 1800, 15.0, -25.0),
    "ouster-os1-64": (64, 1024, 21.2, -21.2),
    "ouster-os1-128": (128, 1024, 21.2, -21.2),
    "hesai-pandar64": (64, 1800, 14.882, -24.897),
    "hesai-pandar128": (128, 1800, 15.139, -24.71),
}


def small_spec(**kw):
    base = dict(name="toy", elevations_deg=(2.0, -1.0, 5.0), azimuth_resolution_deg=1.0, spin_hz=10.0,
                min_range_m=0.5, max_range_m=100.0)
    return LidarSpec(**{**base, **kw})


def test_preset_names_are_exactly_the_expected_ones():
    assert set(preset_names()) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_loads_with_its_sheet_numbers(name):
    s = LidarSpec.preset(name)
    lasers, columns, top, bottom = EXPECTED[name]
    assert s.name == name and s.lasers == lasers and s.columns == columns
    assert s.spin_hz == 10.0 and s.spin == "cw"  # all seven spin clockwise seen from above
    assert max(s.elevations_deg) == pytest.approx(top, abs=1e-9)
    assert min(s.elevations_deg) == pytest.approx(bottom, abs=1e-9)
    assert list(s.elevations_deg) == sorted(s.elevations_deg, reverse=True)  # presets: top laser first
    assert 0 <= s.min_range_m < s.max_range_m
    assert s.column_period_us == pytest.approx(1e6 / (10.0 * columns))


def test_preset_tables_match_the_manuals():
    vlp16 = LidarSpec.preset("velodyne-vlp16")
    assert vlp16.elevations_deg == tuple(float(e) for e in range(15, -16, -2))
    # firing in laser-id order, 2.304 us apart: +15 deg is id 15, -15 deg is id 0
    assert vlp16.firing_offsets_us[0] == pytest.approx(15 * 2.304)
    assert vlp16.firing_offsets_us[-1] == 0.0
    assert sorted(vlp16.firing_offsets_us) == pytest.approx([k * 2.304 for k in range(16)])
    hdl = LidarSpec.preset("velodyne-hdl64e")
    np.testing.assert_allclose(np.diff(hdl.elevations_deg[:32]), -1.0 / 3.0, atol=1e-6)  # upper block
    np.testing.assert_allclose(np.diff(hdl.elevations_deg[32:]), -(24.9 - 8.83) / 31, atol=1e-6)
    vlp32 = LidarSpec.preset("velodyne-vlp32c")
    assert set(vlp32.azimuth_offsets_deg) == {1.4, -1.4, 4.2, -4.2}
    assert vlp32.azimuth_offsets_deg[0] == -1.4  # +15 deg is laser 29, rot_correction -1.4 deg
    p64 = LidarSpec.preset("hesai-pandar64")
    assert len(set(p64.firing_offsets_us)) == 32  # channels fire in pairs
    assert min(p64.firing_offsets_us) > 0 and max(p64.firing_offsets_us) < p64.column_period_us


def test_pandar128_matches_its_sheet():
    """Pandar128E3X/E4X sheet: 128 channels, 360 x 40 deg (-25..+15), finest 0.125 deg near the horizon,
    0.2 deg at 10 Hz (standard mode), 0.3-200 m. The table is one unit's calibration: ends within 0.3 deg."""
    s = LidarSpec.preset("hesai-pandar128")
    el = np.array(s.elevations_deg)
    assert s.lasers == 128 and s.spin_hz == 10.0 and s.azimuth_resolution_deg == 0.2
    assert el.max() == pytest.approx(15.0, abs=0.3) and el.min() == pytest.approx(-25.0, abs=0.3)
    fine = el[(el <= 2.1) & (el >= -6.0)]  # the dense band: 65 channels, 0.125 deg apart on average
    assert len(fine) == 65 and (fine.max() - fine.min()) / (len(fine) - 1) == pytest.approx(0.125, abs=0.001)
    az = s.column_azimuths_deg()  # all the way round, one column per 0.2 deg
    assert s.columns * s.azimuth_resolution_deg == pytest.approx(360.0)
    assert len(np.unique(np.round(az, 6))) == s.columns == 1800
    assert s.lasers * s.columns == 230_400  # rays per sweep; x 10 Hz = 2.3 M points/s single return
    assert (s.min_range_m, s.max_range_m) == (0.3, 200.0)


# AT128 channels (1-based) from nebula's PandarAT128.csv: elevation, clockwise azimuth offset
AT128_CHANNELS = {1: (12.93, 2.4), 2: (12.73, -0.65), 17: (9.73, -2.4), 18: (9.53, 0.65), 33: (6.53, 2.4),
                  64: (0.33, 0.65), 65: (0.13, 2.4), 127: (-12.27, -2.4), 128: (-12.47, 0.65)}


@pytest.fixture(scope="module")
def at128():
    return RayTableSpec.preset("hesai-at128")


def at128_grid(values):
    """(1200 columns, 128 channels) view of a per-ray AT128 table (rays stored column by column)."""
    return np.asarray(values).reshape(1200, 128)


def test_at128_is_a_ray_table_preset(at128):
    assert isinstance(at128, RayTableSpec) and at128.name == "hesai-at128"
    assert RayTableSpec.preset("hesai-at128") is at128  # built once
    assert ray_table_preset_names() == ("hesai-at128",) and not set(ray_table_preset_names()) & set(preset_names())
    with pytest.raises(ValueError, match="RayTableSpec.preset"):
        LidarSpec.preset("hesai-at128")  # a 120 deg sensor is not a spinning LidarSpec
    with pytest.raises(ValueError, match="hesai-at128"):
        RayTableSpec.preset("hesai-at64")


def test_at128_matches_its_sheet(at128):
    """AT128E2X: 128 channels, 120 deg (0.1 deg) x 25.4 deg (-12.5..+12.9, 0.2 deg), 10 Hz, 0.5-200 m."""
    assert at128.rays == 128 * 1200 and at128.frame_hz == 10.0
    assert at128.rays * at128.frame_hz == 1_536_000  # points per second, single return
    assert (at128.min_range_m, at128.max_range_m) == (0.5, 200.0)
    el = at128_grid(at128.elevations_deg)
    assert (el == el[:1]).all()  # every column has the same 128 channels, top first
    np.testing.assert_allclose(np.diff(el[0]), -0.2, atol=1e-9)
    assert el.max() == pytest.approx(12.9, abs=0.05) and el.min() == pytest.approx(-12.5, abs=0.05)
    assert el.max() - el.min() == pytest.approx(25.4, abs=1e-9)
    az = at128_grid(at128.azimuths_deg)
    np.testing.assert_allclose(np.diff(az, axis=0), -0.1, atol=1e-9)  # 0.1 deg per column, left to right
    rotor = az.mean(axis=1)  # the channels' offsets cancel
    assert rotor[0] == pytest.approx(59.95) and rotor[-1] == pytest.approx(-59.95)  # 1200 x 0.1 = 120 deg
    assert np.abs(az).max() == pytest.approx(62.35)  # nothing behind: 60 deg each side plus the offsets
    for ch, (e, cw) in AT128_CHANNELS.items():
        assert el[0, ch - 1] == pytest.approx(e) and az[0, ch - 1] == pytest.approx(59.95 - cw)
    d = at128.ray_directions()
    assert (d[:, 0] > 0.45).all()  # all forward of the sensor


def test_at128_timing(at128):
    """Columns 125/3 us apart (0.1 deg at 200 rpm through the mirror), 50 ms of each 100 ms frame; the
    channels fire within 15 us of their column's start, so the columns do not overlap."""
    t = at128_grid(at128.firing_offsets_us)
    np.testing.assert_allclose(np.diff(t, axis=0), 125.0 / 3.0, atol=1e-5)
    assert t[0].min() == 0.0 and t[0].max() == pytest.approx(14.928)
    assert (t[1:].min(axis=1) > t[:-1].max(axis=1)).all()
    assert t.max() < 50_000 < 1e6 / at128.frame_hz
    ts = at128.time_offsets_us()
    assert ts.dtype == np.int64 and ts.max() == 49_973


def test_at128_round_trip(at128):
    d = json.loads(json.dumps(at128.to_dict()))
    assert d["kind"] == "ray_table" and spec_from_dict(d) == at128


def test_at128_and_pandar128_render_a_wall():
    """A wall 10 m ahead (x = 10, |y| <= 25, |z| <= 6): every AT128 ray meets it, at its own azimuth and
    elevation; the Pandar128 meets it only in front."""
    import gsim
    from gsim.lidar import render_lidar
    ys, zs = np.meshgrid(np.arange(-25, 25.01, 0.25), np.arange(-6, 6.01, 0.25))
    n = ys.size
    facing = [math.cos(math.pi / 4), 0.0, math.sin(math.pi / 4), 0.0]  # local z along world x
    wall = gsim.Surfels(np.stack([np.full(n, 10.0), ys.ravel(), zs.ravel()], 1), np.tile(facing, (n, 1)),
                        np.full((n, 2), 0.3), np.full(n, 0.99), np.full((n, 3), 0.5))
    spec = RayTableSpec.preset("hesai-at128")
    f = render_lidar(wall, spec, np.eye(4), backend="numba")
    assert f.range_image.shape == (1, 128 * 1200) and len(f.points) == spec.rays
    np.testing.assert_allclose(f.points[:, 0], 10.0, atol=1e-3)
    az = np.degrees(np.arctan2(f.points[:, 1], f.points[:, 0]))
    el = np.degrees(np.arctan2(f.points[:, 2], np.hypot(f.points[:, 0], f.points[:, 1])))
    np.testing.assert_allclose(az, np.asarray(spec.azimuths_deg)[f.column], atol=1e-3)
    np.testing.assert_allclose(el, np.asarray(spec.elevations_deg)[f.column], atol=1e-3)
    assert np.array_equal(f.time_offset_us, spec.time_offsets_us()[f.column])
    image = f.range_image.reshape(1200, 128).T  # the AT128's own 128 x 1200 range image
    assert (image > 0).all() and image[:, 600].min() > 10.0 - 1e-3
    p = render_lidar(wall, LidarSpec.preset("hesai-pandar128"), np.eye(4), backend="numba")
    assert 0 < len(p.points) < 128 * 1800 // 2 and (p.points[:, 0] > 0).all()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_ray_directions_are_unit_with_the_table_elevations(name):
    s = LidarSpec.preset(name)
    d = s.ray_directions()
    assert d.shape == (s.lasers, s.columns, 3) and d.dtype == np.float64
    np.testing.assert_allclose(np.linalg.norm(d, axis=-1), 1.0, atol=1e-12)
    el = np.degrees(np.arcsin(d[..., 2]))
    np.testing.assert_allclose(el, np.broadcast_to(np.array(s.elevations_deg)[:, None], el.shape), atol=1e-9)
    az = np.degrees(np.arctan2(d[..., 1], d[..., 0])) - np.array(s.azimuth_offsets_deg)[:, None]
    step = (np.diff(az, axis=1) + 180.0) % 360.0 - 180.0
    np.testing.assert_allclose(step, -s.azimuth_resolution_deg, atol=1e-9)  # clockwise: azimuth falls
    np.testing.assert_allclose(np.cos(np.radians(az[:, 0])), -1.0, atol=1e-12)  # sweep starts at the back


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_time_offsets_increase_along_the_spin_within_one_revolution(name):
    s = LidarSpec.preset(name)
    t = s.time_offsets_us()
    assert t.shape == (s.lasers, s.columns) and t.dtype == np.int64
    assert (np.diff(t, axis=1) > 0).all()
    assert t.min() >= 0 and t.max() < 1e6 / s.spin_hz
    assert t[:, -1].min() > 0.99e6 / s.spin_hz - s.column_period_us - 1  # the sweep spans the revolution


def test_spin_direction_and_start_set_the_column_azimuths():
    cw = small_spec(azimuth_resolution_deg=90.0, start_azimuth_deg=0.0)
    np.testing.assert_allclose(cw.column_azimuths_deg(), [0.0, -90.0, -180.0, 90.0])
    ccw = replace(cw, spin="ccw")
    np.testing.assert_allclose(ccw.column_azimuths_deg(), [0.0, 90.0, -180.0, -90.0])
    d = ccw.ray_directions()[1, 1]  # laser at -1 deg, column at +90 deg: pointing left (+y), slightly down
    np.testing.assert_allclose(d, [0.0, math.cos(math.radians(1.0)), -math.sin(math.radians(1.0))], atol=1e-12)


def test_unsorted_table_is_accepted_and_kept_in_order():
    s = small_spec(elevations_deg=(2.0, -1.0, 5.0), firing_offsets_us=(0.0, 10.0, 20.0))
    assert s.elevations_deg == (2.0, -1.0, 5.0)
    assert s.azimuth_offsets_deg == (0.0, 0.0, 0.0)  # empty table = zeros
    np.testing.assert_array_equal(s.time_offsets_us()[:, 1] - s.time_offsets_us()[:, 0], [277, 277, 277])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_to_dict_from_dict_round_trip(name):
    s = LidarSpec.preset(name)
    d = json.loads(json.dumps(s.to_dict()))
    assert d["kind"] == "spinning" and d["schema_version"] == 1
    assert LidarSpec.from_dict(d) == s
    assert spec_from_dict(d) == s


@pytest.mark.parametrize("kw, field", [
    (dict(name=""), "name"),
    (dict(elevations_deg=()), "elevations_deg"),
    (dict(elevations_deg=(1.0, float("nan"), 0.0)), "elevations_deg[1]"),
    (dict(elevations_deg=(1.0, 95.0, 0.0)), "elevations_deg"),
    (dict(azimuth_offsets_deg=(0.0, 1.0)), "azimuth_offsets_deg"),
    (dict(azimuth_offsets_deg=(0.0, 1.0, 200.0)), "azimuth_offsets_deg"),
    (dict(firing_offsets_us=(0.0,) * 4), "firing_offsets_us"),
    (dict(firing_offsets_us=(0.0, 1.0, 300.0)), "firing_offsets_us"),  # column period 277.8 us
    (dict(azimuth_resolution_deg=0.7), "azimuth_resolution_deg"),
    (dict(azimuth_resolution_deg=0.0), "azimuth_resolution_deg"),
    (dict(azimuth_resolution_deg=float("inf")), "azimuth_resolution_deg"),
    (dict(min_range_m=100.0), "min_range_m"),
    (dict(min_range_m=-1.0), "min_range_m"),
    (dict(max_range_m=float("inf")), "max_range_m"),
    (dict(spin_hz=0.0), "spin_hz"),
    (dict(spin_hz=-10.0), "spin_hz"),
    (dict(spin="up"), "spin"),
    (dict(start_azimuth_deg=float("nan")), "start_azimuth_deg"),
])
def test_bad_lidar_spec_raises_naming_the_field(kw, field):
    with pytest.raises(ValueError, match=r"LidarSpec\." + field.replace("[", r"\[").replace("]", r"\]")):
        small_spec(**kw)


def test_from_dict_rejects_bad_dicts():
    d = LidarSpec.preset("velodyne-vlp16").to_dict()
    with pytest.raises(ValueError, match="schema_version"):
        LidarSpec.from_dict({**d, "schema_version": 99})
    with pytest.raises(ValueError, match="color"):
        LidarSpec.from_dict({**d, "color": "red"})
    with pytest.raises(ValueError, match="spin_hz"):
        LidarSpec.from_dict({k: v for k, v in d.items() if k != "spin_hz"})
    with pytest.raises(ValueError, match="kind"):
        RayTableSpec.from_dict(d)
    with pytest.raises(ValueError, match="kind"):
        spec_from_dict({"kind": "phased-array"})


def test_unknown_preset_lists_the_valid_names():
    with pytest.raises(ValueError) as err:
        LidarSpec.preset("velodyne-hdl32")
    assert all(n in str(err.value) for n in EXPECTED)


def test_ray_table_spec_round_trip_and_contract():
    rng = np.random.default_rng(0)
    dirs = rng.normal(size=(50, 3)) * rng.uniform(0.5, 3.0, size=(50, 1))  # any non-zero length
    t = np.sort(rng.uniform(0, 49_999, 50))
    s = RayTableSpec.from_directions("flash", dirs, 0.2, 30.0, frame_hz=20.0, firing_offsets_us=t)
    assert s.rays == 50
    np.testing.assert_allclose(s.ray_directions(), dirs / np.linalg.norm(dirs, axis=1, keepdims=True), atol=1e-12)
    ts = s.time_offsets_us()
    assert ts.dtype == np.int64 and ts.shape == (50,) and ts.max() < 1e6 / 20.0
    np.testing.assert_array_equal(ts, np.floor(t).astype(np.int64))
    d = json.loads(json.dumps(s.to_dict()))
    assert d["kind"] == "ray_table" and RayTableSpec.from_dict(d) == s and spec_from_dict(d) == s


@pytest.mark.parametrize("kw, field", [
    (dict(azimuths_deg=(0.0,)), "azimuths_deg"),
    (dict(elevations_deg=(0.0, -91.0)), "elevations_deg"),
    (dict(firing_offsets_us=(0.0, 100_000.0)), "firing_offsets_us"),  # 10 Hz frame: < 100000 us
    (dict(frame_hz=0.0), "frame_hz"),
    (dict(min_range_m=5.0, max_range_m=5.0), "min_range_m"),
])
def test_bad_ray_table_raises_naming_the_field(kw, field):
    base = dict(name="t", elevations_deg=(0.0, -1.0), azimuths_deg=(10.0, 20.0), min_range_m=0.1, max_range_m=50.0)
    with pytest.raises(ValueError, match=r"RayTableSpec\." + field):
        RayTableSpec(**{**base, **kw})


def test_ray_table_from_bad_directions():
    with pytest.raises(ValueError, match="directions"):
        RayTableSpec.from_directions("t", np.zeros((4, 2)), 0.1, 10.0)
    with pytest.raises(ValueError, match="directions"):
        RayTableSpec.from_directions("t", np.array([[1.0, 0, 0], [0, 0, 0]]), 0.1, 10.0)


def test_import_is_light():
    code = "import sys, gsim.lidar; assert not {'torch', 'numba'} & set(sys.modules), 'heavy import'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- estimate_beams

def synthetic_sweep(spec, quarter=True, seed=0):
    """Points on a preset's own rays (a quarter revolution), at random ranges 3-60 m."""
    d = spec.ray_directions()
    if quarter:
        d = d[:, : spec.columns // 4]
    r = np.random.default_rng(seed).uniform(3.0, 60.0, d.shape[:2])
    return (d * r[..., None]).reshape(-1, 3)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_estimate_recovers_a_presets_own_table(name):
    s = LidarSpec.preset(name)
    e = estimate_beams([synthetic_sweep(s)], s.lasers, max_points=40_000)
    np.testing.assert_allclose(e.elevations_deg, s.elevations_deg, atol=1e-3)
    np.testing.assert_allclose(e.vertical_offsets_m, 0.0, atol=1e-6)
    assert e.counts.sum() == min(40_000, s.lasers * (s.columns // 4)) and e.counts.min() > 0
    assert e.azimuth_resolution_deg == pytest.approx(s.azimuth_resolution_deg, abs=1e-6)


@pytest.mark.parametrize("name", ["velodyne-vlp32c", "hesai-pandar64", "ouster-os1-64"])
def test_estimate_finds_the_laser_count(name):
    s = LidarSpec.preset(name)
    e = estimate_beams(synthetic_sweep(s), max_points=40_000)
    assert len(e.elevations_deg) == s.lasers
    np.testing.assert_allclose(e.elevations_deg, s.elevations_deg, atol=1e-3)


def test_estimate_recovers_beam_origin_heights():
    # two laser blocks whose beams start 0.2 m and 0.1 m above the sensor origin (like the HDL-64E)
    s = small_spec(elevations_deg=tuple(np.linspace(2, -8, 16)) + tuple(np.linspace(-9, -24, 16)),
                   azimuth_resolution_deg=0.5)
    p = synthetic_sweep(s, quarter=False)
    p[:, 2] += np.repeat([0.2] * 16 + [0.1] * 16, s.columns)
    e = estimate_beams(p, 32)
    np.testing.assert_allclose(e.elevations_deg, s.elevations_deg, atol=1e-3)
    np.testing.assert_allclose(e.vertical_offsets_m, [0.2] * 16 + [0.1] * 16, atol=1e-4)


def test_estimate_bad_inputs():
    with pytest.raises(ValueError, match="sweeps"):
        estimate_beams([np.zeros((10, 2))])
    with pytest.raises(ValueError, match="sweeps"):
        estimate_beams([])
    with pytest.raises(ValueError, match="n_lasers"):
        estimate_beams(np.ones((100, 3)), 0)
    with pytest.raises(ValueError, match="too few"):
        estimate_beams(np.ones((100, 3)) * 0.1, 4)


@pytest.mark.skipif(not KITTI.is_dir(), reason=f"KITTI raw sample not found at {KITTI}")
def test_estimate_on_kitti_matches_the_hdl64e_preset():
    """The KITTI unit is calibrated per unit and its points keep each laser's beam-origin offset.
    Measured on this drive: the estimate differs from the nominal table by at most 0.39 deg (rms
    0.19). The tolerance (max 0.5, rms 0.25) catches a wrong table: the often-quoted lower block of
    -8.83 - 0.5 i deg is 0.68 off (rms 0.33), a uniform +2..-24.9 table 2.6 off (rms 1.5), the
    table shifted by one laser 0.57 off (rms 0.32)."""
    files = sorted(KITTI.glob("*.bin"))[::10]
    sweeps = [np.fromfile(f, np.float32).reshape(-1, 4) for f in files]
    e = estimate_beams(sweeps, 64, max_points=60_000)
    ref = np.array(LidarSpec.preset("velodyne-hdl64e").elevations_deg)

    def off(table):
        d = e.elevations_deg - table
        return np.abs(d).max(), np.sqrt(np.mean(d ** 2))

    max_err, rms = off(ref)
    assert max_err <= 0.5 and rms <= 0.25, (max_err, rms)
    quoted = np.concatenate([2.0 - np.arange(32) / 3.0, -8.83 - 0.5 * np.arange(32)])
    for wrong in (quoted, np.linspace(2.0, -24.9, 64), np.append(ref[1:], ref[-1] - 0.5)):
        m, r = off(wrong)
        assert m > 0.5 or r > 0.25, (m, r)
    # 2000 columns of 0.18 deg at 10 Hz; beam origins ~0.2 m (upper block) and ~0.12 m (lower) above
    # the sensor origin, as the HDL-64E calibrations' vert_offset_correction
    assert e.azimuth_resolution_deg == pytest.approx(0.18, abs=0.005)
    assert 0.15 < np.median(e.vertical_offsets_m[:32]) < 0.25
    assert 0.08 < np.median(e.vertical_offsets_m[32:]) < 0.16
