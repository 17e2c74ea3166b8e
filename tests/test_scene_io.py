"""Scene directory and PLY input/output: exact round trips and helpful errors."""
import json
import os

import numpy as np
import pytest

import gsim
import gsim.scene
from gsim import Actor, Scene, SceneFormatError, Surfels, load_scene, save_scene
from gsim.ply import load_ply, save_ply
from gsim.transforms import quat_to_rotmat

LN_1000 = np.log(1000.0)


# ----------------------------------------------------------------------------- scene directories

def _surfels(rng, n=7, k=16, features=True, dtype=np.float32) -> Surfels:
    q = rng.normal(size=(n, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return Surfels(means=rng.normal(size=(n, 3)).astype(dtype), quats=q.astype(dtype),
                   scales=rng.uniform(0.01, 1, (n, 2)).astype(dtype),
                   opacities=rng.uniform(0, 1, n).astype(dtype),
                   colors=rng.normal(size=(n, k, 3)).astype(dtype),
                   features=rng.normal(size=(n, 5)).astype(dtype) if features else None)


def _scene(seed=0) -> Scene:
    rng = np.random.default_rng(seed)
    poses = np.tile(np.eye(4), (2, 1, 1))
    poses[1, :3, 3] = [5.0, 1.0, 0.0]
    c, s = np.cos(0.3), np.sin(0.3)
    poses[1, :2, :2] = [[c, -s], [s, c]]
    actor = Actor(id="car_0", category="car", size=(4.5, 1.8, 1.5), surfels=_surfels(rng, 4),
                  track_timestamps_us=np.array([0, 100_000]), track_poses=poses)
    corrections = np.tile(np.eye(4), (2, 1, 1))
    corrections[1, :3, 3] = [0.02, -0.01, 0.0]
    return Scene(background=_surfels(rng), actors=(actor,), pose_corrections=(np.array([0, 100_000]), corrections))


def _assert_surfels_identical(a: Surfels, b: Surfels):
    fa, fb = a.arrays(), b.arrays()
    assert fa.keys() == fb.keys()
    for k in fa:
        assert fa[k].dtype == fb[k].dtype and fa[k].shape == fb[k].shape, k
        assert np.array_equal(fa[k], fb[k]), k


def _assert_scenes_identical(a: Scene, b: Scene):
    _assert_surfels_identical(a.background, b.background)
    assert len(a.actors) == len(b.actors)
    for x, y in zip(a.actors, b.actors):
        assert (x.id, x.category, tuple(x.size)) == (y.id, y.category, tuple(y.size))
        _assert_surfels_identical(x.surfels, y.surfels)
        assert x.track_timestamps_us.dtype == y.track_timestamps_us.dtype == np.int64
        assert np.array_equal(x.track_timestamps_us, y.track_timestamps_us)
        assert np.array_equal(x.track_poses, y.track_poses)
    assert all(np.array_equal(u, v) for u, v in zip(a.pose_corrections, b.pose_corrections))


def test_scene_round_trip_exact(tmp_path):
    scene = _scene()
    save_scene(scene, tmp_path / "s")
    back = load_scene(tmp_path / "s")
    _assert_scenes_identical(scene, back)
    assert back.background.sh_degree == 3 and back.background.features.shape == (7, 5)
    assert np.allclose(back.actors[0].pose_at(100_000), scene.actors[0].track_poses[1])


def test_scene_replace_existing(tmp_path):
    a, b = _scene(0), _scene(1)
    save_scene(a, tmp_path / "s")
    save_scene(b, tmp_path / "s")
    _assert_scenes_identical(b, load_scene(tmp_path / "s"))
    assert sorted(os.listdir(tmp_path)) == ["s"]


def test_scene_failed_write_keeps_previous(tmp_path, monkeypatch):
    a = _scene(0)
    save_scene(a, tmp_path / "s")
    real_save, calls = np.save, []

    def flaky_save(*args, **kwargs):
        calls.append(args[0])
        if len(calls) > 1:
            raise OSError("disk full (simulated)")
        return real_save(*args, **kwargs)

    monkeypatch.setattr(gsim.scene.np, "save", flaky_save)
    with pytest.raises(OSError, match="disk full"):
        save_scene(_scene(1), tmp_path / "s")
    monkeypatch.undo()
    assert len(calls) == 2
    assert sorted(os.listdir(tmp_path)) == ["s"]  # no temp dirs left behind
    _assert_scenes_identical(a, load_scene(tmp_path / "s"))


def _break_missing_manifest(d):
    (d / "scene.json").unlink()
    return "scene.json"


def _break_schema(d):
    m = json.loads((d / "scene.json").read_text())
    m["schema_version"] = 99
    (d / "scene.json").write_text(json.dumps(m))
    return "scene.json"


def _break_missing_array(d):
    (d / "background" / "quats.npy").unlink()
    return "quats.npy"


def _break_corrupt_npy(d):
    (d / "background" / "colors.npy").write_bytes(b"\x93NUMPY garbage")
    return "colors.npy"


def _break_shape(d):
    np.save(d / "background" / "quats.npy", np.zeros((7, 3), np.float32))
    return "quats"


def _break_pose_correction(d):
    C = np.load(d / "pose_corrections" / "matrices.npy")
    C[1, :3, :3] *= 2  # not a rotation
    np.save(d / "pose_corrections" / "matrices.npy", C)
    return "pose_corrections[1]"


@pytest.mark.parametrize("breaker", [_break_missing_manifest, _break_schema, _break_missing_array,
                                     _break_corrupt_npy, _break_shape, _break_pose_correction])
def test_scene_load_errors_name_the_file(tmp_path, breaker):
    d = tmp_path / "s"
    save_scene(_scene(), d)
    needle = breaker(d)
    with pytest.raises(SceneFormatError) as ei:
        load_scene(d)
    msg = str(ei.value)
    assert str(d) in msg and needle in msg, msg
    if breaker is _break_schema:
        assert "schema_version" in msg
    if breaker is _break_shape:
        assert "background" in msg and "shape" in msg


# ----------------------------------------------------------------------------- PLY

def _names(k=16, layout="3dgs"):
    names = ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
    names += [f"f_rest_{i}" for i in range(3 * (k - 1))] + ["opacity", "scale_0", "scale_1"]
    return names + (["scale_2"] if layout == "3dgs" else []) + ["rot_0", "rot_1", "rot_2", "rot_3"]


def _random_raw(n=50, k=16, layout="3dgs", seed=0):
    """Raw float32 vertex values in 3DGS order: unit quats, logits in [-8, 8], scale_2 as save_ply writes it."""
    rng = np.random.default_rng(seed)
    names = _names(k, layout)
    v = rng.normal(size=(n, len(names))).astype(np.float32)
    col = {p: i for i, p in enumerate(names)}
    v[:, col["nx"]:col["nz"] + 1] = 0
    v[:, col["opacity"]] = rng.uniform(-8, 8, n)
    v[:, [col["scale_0"], col["scale_1"]]] = rng.uniform(-6, 0, (n, 2))
    q = rng.normal(size=(n, 4))
    v[:, col["rot_0"]:col["rot_3"] + 1] = q / np.linalg.norm(q, axis=1, keepdims=True)
    if layout == "3dgs":
        s01 = v[:, [col["scale_0"], col["scale_1"]]].astype(np.float64)
        v[:, col["scale_2"]] = s01.min(1) - LN_1000
    return names, v


def _write_ply(path, names, v, fmt="binary_little_endian", dtype="float"):
    """Tiny independent PLY writer (float properties)."""
    head = ["ply", f"format {fmt} 1.0", "comment test", f"element vertex {len(v)}"]
    head += [f"property {dtype} {p}" for p in names] + ["end_header", ""]
    if fmt == "ascii":
        body = "".join(" ".join(repr(float(x)) for x in row) + "\n" for row in v).encode()
    else:
        body = np.asarray(v, ("<" if fmt == "binary_little_endian" else ">") + "f4").tobytes()
    path.write_bytes("\n".join(head).encode() + body)
    return path


def _read_raw(path):
    """Property names and float32 values of a little-endian float32 PLY."""
    data = path.read_bytes()
    head, body = data.split(b"end_header\n", 1)
    lines = head.decode().splitlines()
    assert lines[:2] == ["ply", "format binary_little_endian 1.0"]
    names = [ln.split()[2] for ln in lines if ln.startswith("property")]
    assert all(ln.startswith("property float ") for ln in lines if ln.startswith("property"))
    n = int(next(ln.split()[2] for ln in lines if ln.startswith("element vertex")))
    return names, np.frombuffer(body, "<f4").reshape(n, len(names))


@pytest.mark.parametrize("layout", ["3dgs", "2dgs"])
@pytest.mark.parametrize("k", [16, 1])
def test_ply_round_trip_bit_exact(tmp_path, layout, k):
    names, v = _random_raw(k=k, layout=layout)
    s = load_ply(_write_ply(tmp_path / "in.ply", names, v))
    assert s.colors.shape == (50, k, 3) and s.means.dtype == np.float64
    save_ply(s, tmp_path / "out.ply", layout=layout)
    out_names, out = _read_raw(tmp_path / "out.ply")
    assert out_names == names
    assert np.array_equal(out.view(np.uint32), v.view(np.uint32))
    save_ply(s.torch(), tmp_path / "out_torch.ply", layout=layout)  # torch surfels write the same bytes
    assert (tmp_path / "out_torch.ply").read_bytes() == (tmp_path / "out.ply").read_bytes()


def test_ply_activation_one_row(tmp_path):
    names, v = _random_raw(k=16)
    col = {p: i for i, p in enumerate(names)}
    v[3, col["rot_0"]:col["rot_3"] + 1] = [2.0, 0.0, -2.0, 1.0]  # not normalized: norm 3
    s = load_ply(_write_ply(tmp_path / "a.ply", names, v))
    r = v[3].astype(np.float64)
    assert np.array_equal(s.means[3], r[:3])
    assert s.opacities[3] == pytest.approx(1 / (1 + np.exp(-r[col["opacity"]])), rel=1e-14)
    assert np.allclose(s.scales[3], np.exp(r[[col["scale_0"], col["scale_1"]]]), rtol=1e-14, atol=0)
    assert np.allclose(s.quats[3], [2 / 3, 0, -2 / 3, 1 / 3], rtol=0, atol=1e-15)
    assert np.array_equal(s.colors[3, 0], r[col["f_dc_0"]:col["f_dc_2"] + 1])
    for c in range(3):
        for kk in range(15):  # f_rest channel-major: index c*15 + kk is coefficient kk+1 of channel c
            assert s.colors[3, kk + 1, c] == r[col[f"f_rest_{c * 15 + kk}"]]


@pytest.mark.parametrize("axis", [0, 1])
def test_ply_3dgs_smallest_axis_becomes_normal(tmp_path, axis):
    names, v = _random_raw(n=3, k=1)
    col = {p: i for i, p in enumerate(names)}
    raw_scales = np.array([-1.0, -2.0, -0.5], np.float32)
    raw_scales[axis] = -5.0
    v[:, col["scale_0"]:col["scale_2"] + 1] = raw_scales
    v[2, col["scale_0"]:col["scale_2"] + 1] = -3.0  # tie: axis 2 is the normal, quat untouched
    q = v[:, col["rot_0"]:col["rot_3"] + 1].astype(np.float64)
    R = quat_to_rotmat(q / np.linalg.norm(q, axis=1, keepdims=True))
    s = load_ply(_write_ply(tmp_path / "rot.ply", names, v))
    Rn = quat_to_rotmat(s.quats)
    assert np.allclose(np.linalg.det(Rn), 1)
    others = [i for i in range(3) if i != axis]
    for i in range(2):
        assert abs(Rn[i, :, 2] @ R[i, :, axis]) == pytest.approx(1, abs=1e-9)
        assert np.allclose(s.scales[i], np.exp(raw_scales[others].astype(np.float64)), rtol=1e-14)
        # the in-plane covariance is unchanged
        cov = R[i][:, others] @ np.diag(np.exp(2.0 * raw_scales[others])) @ R[i][:, others].T
        assert np.allclose(Rn[i][:, :2] @ np.diag(s.scales[i] ** 2) @ Rn[i][:, :2].T, cov, atol=1e-12)
    assert np.array_equal(s.quats[2], v[2, col["rot_0"]:col["rot_3"] + 1].astype(np.float64))


def test_ply_ascii_and_big_endian_match(tmp_path):
    names, v = _random_raw(n=10, k=4)
    ref = load_ply(_write_ply(tmp_path / "le.ply", names, v))
    for fmt in ("ascii", "binary_big_endian"):
        other = load_ply(_write_ply(tmp_path / f"{fmt}.ply", names, v, fmt=fmt))
        _assert_surfels_identical(ref, other)
    v64 = load_ply(_write_ply(tmp_path / "d.ply", names, v.astype(np.float64), fmt="ascii", dtype="double"))
    _assert_surfels_identical(ref, v64)


def test_ply_load_scene_and_empty(tmp_path):
    names, v = _random_raw(n=5)
    scene = load_scene(_write_ply(tmp_path / "splats.ply", names, v))
    assert isinstance(scene, Scene) and len(scene.background) == 5 and scene.actors == ()
    empty = load_ply(_write_ply(tmp_path / "empty.ply", names, v[:0]))
    assert len(empty) == 0 and empty.colors.shape == (0, 16, 3)
    save_ply(empty, tmp_path / "empty_out.ply")
    assert _read_raw(tmp_path / "empty_out.ply")[1].shape == (0, len(names))


def test_save_ply_clamps_and_layout(tmp_path):
    s = Surfels(means=np.zeros((2, 3)), quats=np.array([[1.0, 0, 0, 0]] * 2), scales=np.array([[0.0, 1.0]] * 2),
                opacities=np.array([0.0, 1.0]), colors=np.full((2, 3), 0.5))
    save_ply(s, tmp_path / "c.ply")
    names, v = _read_raw(tmp_path / "c.ply")
    assert np.all(np.isfinite(v))
    back = load_ply(tmp_path / "c.ply")
    assert np.allclose(back.opacities, [0, 1], atol=1e-9) and np.allclose(back.scales, s.scales, atol=1e-9)
    with pytest.raises(ValueError, match="layout"):
        save_ply(s, tmp_path / "x.ply", layout="gltf")
    assert not (tmp_path / "x.ply").exists()


def test_save_ply_atomic_on_failure(tmp_path, monkeypatch):
    names, v = _random_raw(n=4)
    p = _write_ply(tmp_path / "keep.ply", names, v)
    before = p.read_bytes()
    s = load_ply(p)

    def boom(*a, **k):
        raise OSError("rename failed (simulated)")

    monkeypatch.setattr(gsim.ply.os, "replace", boom)
    with pytest.raises(OSError, match="simulated"):
        save_ply(s, p, layout="2dgs")
    monkeypatch.undo()
    assert p.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["keep.ply"]


def _bad_truncated(p):
    names, v = _random_raw(n=6)
    _write_ply(p, names, v)
    p.write_bytes(p.read_bytes()[:-10])
    return ["truncated", "bytes"]


def _bad_png(p):
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(40))
    return ["not a PLY"]


def _bad_text(p):
    p.write_text("hello, this is a text file\n")
    return ["not a PLY"]


def _bad_format(p):
    names, v = _random_raw(n=2)
    _write_ply(p, names, v, fmt="binary_middle_endian")
    return ["format", "binary_middle_endian"]


def _bad_missing_opacity(p):
    names, v = _random_raw(n=3)
    keep = [i for i, n in enumerate(names) if n != "opacity"]
    _write_ply(p, [names[i] for i in keep], v[:, keep])
    return ["opacity", "missing"]


def _bad_nan(p):
    names, v = _random_raw(n=5)
    v[3, names.index("scale_1")] = np.nan
    _write_ply(p, names, v)
    return ["scale_1", "row 3"]


def _bad_zero_quat(p):
    names, v = _random_raw(n=5)
    v[2, names.index("rot_0"):names.index("rot_3") + 1] = 0
    _write_ply(p, names, v)
    return ["rot_0", "row 2"]


def _bad_f_rest(p):
    names, v = _random_raw(n=3, k=4)
    drop = names.index("f_rest_8")
    _write_ply(p, names[:drop] + names[drop + 1:], np.delete(v, drop, axis=1))
    return ["f_rest", "8"]


@pytest.mark.parametrize("make", [_bad_truncated, _bad_png, _bad_text, _bad_format, _bad_missing_opacity,
                                  _bad_nan, _bad_zero_quat, _bad_f_rest])
def test_ply_bad_input(tmp_path, make):
    p = tmp_path / f"{make.__name__}.ply"
    needles = make(p)
    with pytest.raises(SceneFormatError) as ei:
        load_ply(p)
    msg = str(ei.value)
    assert p.name in msg and all(s in msg for s in needles), msg
    with pytest.raises(SceneFormatError):
        load_scene(p)


def test_a_failed_atomic_write_names_the_destination_not_its_temporary(tmp_path):
    """A full disk (write() names no file) or a failure inside the temporary folder is reported at the path the
    user gave: the temporary beside it is gone and was never theirs."""
    import errno

    from gsim.io import atomic_directory, atomic_path
    with pytest.raises(OSError, match="No space left") as e:
        with atomic_path(tmp_path / "out.bin"):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert e.value.filename == str(tmp_path / "out.bin")
    with pytest.raises(FileNotFoundError) as e:
        with atomic_directory(tmp_path / "scene", "scene.json") as tmp:
            open(tmp / "missing" / "a.npy", "wb")
    assert e.value.filename == str(tmp_path / "scene" / "missing" / "a.npy")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
