"""Editing benchmarks: ground-truth edits on the synthetic street, rendering speed with inserted actors,
and the time to build assets.

    .venv/bin/python bench/bench_editing.py RECON [--car parked_17] [--donor SCENE:ACTOR] [--out OUT]
        [--harmonize MODEL_DIR]

RECON is a `bench_reconstruct.py` output of the synthetic street with tracks (RECON/log, RECON/recon/scene).
1. Removal: the car is removed from the reconstruction and compared, in the region it covered (its
   pixels in the ground-truth images, from the exact depth maps of the street with and without it),
   with the street synthesized without it (`SynthOptions(omit=...)`); the unedited reconstruction is the
   baseline.
2. Insertion: a library car (the donor: an actor reconstructed from another drive, and the starter sedan)
   is put where the car stood; PSNR in the car's region and the IoU of its instance mask with the car's
   true pixels, against the unedited reconstruction (which has the real car). With --harmonize (a repair
   model, `gsim diffusion train`): also the PSNR in the same region of the same views with the inserted
   car harmonized (`gsim.diffusion.harmonize`: its region repaired by the model, the rest kept).
3. Speed: numba renders of the log's front camera with none and with 20 inserted starter assets, all in
   view ahead of the ego (10 frames), and spread along the drive (every frame); each frame plain then
   edited, so the slowdown is a median of per-frame ratios.
4. Asset build times: from a mesh file (the starter SUV exported as a GLB) and from a reconstructed actor.
Writes OUT/editing.json and OUT/*.png (render | truth | error in the region).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gsim import load_scene, render_camera  # noqa: E402
from gsim.editing import AssetLibrary, EditError, asset_from_actor, asset_from_mesh, insert_actor, remove_actor  # noqa: E402
from gsim.editing.outputs import instances  # noqa: E402
from gsim.io import to_uint8, write_png  # noqa: E402
from gsim.images import render_image  # noqa: E402
from gsim.scenes.log import load_log  # noqa: E402
from gsim.scenes.synth import SynthOptions, made_by, synthesize  # noqa: E402


def psnr(a, b, m):
    return float(-10 * np.log10(((a[m] - b[m]) ** 2).mean() + 1e-12))


def views(log, camera: str):
    for f in log.frames:
        obs = f.cameras.get(camera)
        if obs is not None:
            yield f.index, obs


def region_views(log_with, log_without, camera, min_px=300):
    """(frame index, obs with, obs without, car mask) where the car covers at least ``min_px`` pixels."""
    out = []
    by_t = {f.timestamp_us: f for f in log_without.frames}
    for i, obs in views(log_with, camera):
        o2 = by_t[log_with.frames[i].timestamp_us].cameras[camera]
        d1, d2 = log_with.depth(obs), log_without.depth(o2)
        car = (np.abs(d1 - d2) > 0.05) & (d1 > 0)
        if car.sum() >= min_px:
            out.append((i, obs, o2, car))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recon")
    ap.add_argument("--car", default="parked_17")
    ap.add_argument("--camera", default="front")
    ap.add_argument("--donor", default="out/bench/kitti-s4b/recon/scene:mover_003",
                    help="SCENE:ACTOR, a car reconstructed from another drive")
    ap.add_argument("--out", default="out/bench/editing")
    ap.add_argument("--harmonize", default=None, metavar="MODEL_DIR",
                    help="a repair model directory: also measure the insertions harmonized")
    a = ap.parse_args()
    harmonizer = None
    if a.harmonize:  # loaded first: a bad directory fails before the long parts
        from gsim.diffusion.harmonize import Harmonizer
        from gsim.diffusion.repair import RepairModel
        harmonizer = Harmonizer(RepairModel.load(a.harmonize), a.harmonize)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    recon = Path(a.recon)
    scene, log = load_scene(recon / "recon" / "scene"), load_log(recon / "log")
    seed = int(log.name.rsplit("seed", 1)[-1]) if log.name.startswith("synth-street-seed") else 0
    opts = SynthOptions(omit=(a.car,))
    gt_dir = out / f"log-without-{a.car}"
    try:
        reuse = made_by(load_log(gt_dir), seed, opts)
    except Exception:
        reuse = False
    if not reuse:
        synthesize(gt_dir, seed=seed, options=opts)
    log_wo = load_log(gt_dir)
    rv = region_views(log, log_wo, a.camera)
    print(f"{len(rv)} views of {a.camera} where {a.car} covers >= 300 px")
    res = {"car": a.car, "camera": a.camera, "views": [i for i, *_ in rv]}

    # 1. removal
    removed = remove_actor(scene, a.car)
    rows, p_edit, p_base = [], [], []
    shown = sorted(range(len(rv)), key=lambda j: -rv[j][3].sum())[:3]  # the views where the car is largest
    for j, (i, obs, o2, car) in enumerate(rv):
        T, t = log.T_world_camera(obs), obs.timestamp_us
        cam = log.cameras[a.camera].camera
        truth = log_wo.image(o2)
        e = render_image(removed, cam, T, t, a.camera)[0]
        b = render_image(scene, cam, T, t, a.camera)[0]
        p_edit.append(psnr(e, truth, car))
        p_base.append(psnr(b, truth, car))
        if j in shown:  # edited | truth without the car | unedited, around the car's region
            v, u = np.nonzero(car)
            box = np.s_[max(v.min() - 20, 0):v.max() + 20, max(u.min() - 40, 0):u.max() + 40]
            rows.append(np.concatenate([to_uint8(x[box]) for x in (e, truth, b)], 1))
    w = max(r.shape[1] for r in rows)
    write_png(out / "removal.png", np.concatenate([np.pad(r, ((0, 4), (0, w - r.shape[1]), (0, 0))) for r in rows], 0))
    res["removal"] = {"psnr_region_edited_db": float(np.median(p_edit)), "psnr_region_unedited_db": float(np.median(p_base))}
    print("removal:", res["removal"])

    # 2. insertion where the car stood
    car_actor = next(x for x in scene.actors if x.id == a.car)
    P = car_actor.pose_at(log.frames[0].timestamp_us).copy()
    P[:3, 3] -= P[:3, 2] * car_actor.size[2] / 2  # the asset frame's origin: the bottom face
    donors = {"starter sedan": AssetLibrary.builtin().get("sedan")}
    dscene, dactor = a.donor.rsplit(":", 1)
    if Path(dscene).is_dir():
        t0 = time.perf_counter()
        donors[f"{dactor} of {dscene}"] = asset_from_actor(dscene, dactor, "donor")
        res["asset_from_actor_s"] = round(time.perf_counter() - t0, 3)
    res["insertion"] = {}
    times = [log.frames[0].timestamp_us, log.frames[-1].timestamp_us]
    for name, asset in donors.items():
        edited = insert_actor(removed, asset, times, [P, P], actor_id="inserted")
        k = [x.id for x in edited.actors].index("inserted")
        p_e, p_b, p_h, ious = [], [], [], []
        for i, obs, o2, car in rv:
            T, t = log.T_world_camera(obs), obs.timestamp_us
            cam = log.cameras[a.camera].camera
            truth = log.image(obs)
            e, alpha, depth = render_image(edited, cam, T, t, a.camera)
            mask, full = instances(edited, cam, T, t, depth)
            mine = mask == k + 1
            ious.append(float((mine & car).sum() / max((mine | car).sum(), 1)))
            p_e.append(psnr(e, truth, car))
            if harmonizer is not None:  # the region follows the inserted car's own silhouette, as in a scenario
                p_h.append(psnr(harmonizer(e, alpha, depth, full.get(k, mine))[0], truth, car))
            p_b.append(psnr(render_image(scene, cam, T, t, a.camera)[0], truth, car))
        res["insertion"][name] = {"size_m": [round(x, 2) for x in asset.size], "mask_iou": float(np.median(ious)),
                                  "psnr_region_edited_db": float(np.median(p_e)),
                                  "psnr_region_unedited_db": float(np.median(p_b))}
        if p_h:
            res["insertion"][name]["psnr_region_harmonized_db"] = float(np.median(p_h))
            res["insertion"][name]["harmonize_model"] = a.harmonize
        print("insertion,", name, res["insertion"][name])

    # 3. speed: 20 starter assets (allowed to overlap: only the time is measured), (a) all in front of the
    # ego at the first frame, rendered over 10 frames; (b) spread along the drive (parked 3 m beside the
    # ego's path at evenly spaced times), rendered over every frame
    lib = AssetLibrary.builtin()
    ids = lib.ids()
    cam = log.cameras[a.camera].camera
    obs_all = [obs for _, obs in views(log, a.camera)]
    T0 = log.T_world_vehicle(log.frames[0].timestamp_us)
    ahead, spread = scene, scene
    for j in range(20):
        Q = T0.copy()
        Q[:3, 3] = T0[:3, 3] + T0[:3, 0] * (8 + 2.5 * j) + T0[:3, 1] * (((j % 3) - 1) * 3.0)
        ahead = insert_actor(ahead, lib.get(ids[j % len(ids)]), times, [Q, Q], allow_overlap=True, shadow=True)
        Tj = log.T_world_vehicle(log.frames[int((j + 0.5) * len(log.frames) / 20)].timestamp_us)
        for side in (3.0, 2.0, 1.0):  # beside the path where the scene has ground (a reconstruction's kerbs are thin)
            Q = Tj.copy()
            Q[:3, 3] = Tj[:3, 3] + Tj[:3, 1] * (side if j % 2 else -side)
            try:
                spread = insert_actor(spread, lib.get(ids[j % len(ids)]), times, [Q, Q], allow_overlap=True,
                                      shadow=True)
                break
            except EditError:
                continue

    def frame_ms(crowd, obs_list):
        """Per frame, the plain scene then ``crowd``, one after the other (the VM's speed drifts by more than
        the difference: one run saw the same frame take 1.5x as long minutes later); three passes, the
        first building the actors' detail levels as views need them. Returns the median ms a frame of each
        (first pass, later passes) and the median over frames of crowd / plain - 1 (later passes)."""
        ms = {"none": ([], []), "edited": ([], [])}
        for rep in range(3):
            for obs in obs_list:
                for key, sc in (("none", scene), ("edited", crowd)):
                    t0 = time.perf_counter()
                    render_camera(sc, cam, log.T_world_camera(obs), backend="numba", timestamp_us=obs.timestamp_us)
                    ms[key][min(rep, 1)].append(1e3 * (time.perf_counter() - t0))
        med = {k: [round(float(np.median(x)), 1) for x in v] for k, v in ms.items()}
        ratio = np.array(ms["edited"][1]) / np.array(ms["none"][1]) - 1
        return med["none"], med["edited"], round(float(np.median(ratio)), 3)

    res["speed_ms"] = {}
    for name, crowd, obs_list in (("ahead", ahead, obs_all[:10]), ("spread", spread, obs_all)):
        assert len(crowd.actors) == len(scene.actors) + 20, name
        none, edited, slowdown = frame_ms(crowd, obs_list)
        res["speed_ms"][name] = {"none": none, "20 inserted": edited, "frames": len(obs_list),
                                 "slowdown": slowdown}
    res["speed_ms"]["surfels_scene"] = len(scene.background) + sum(len(x.surfels) for x in scene.actors)
    res["speed_ms"]["surfels_added"] = sum(len(x.surfels) for x in ahead.actors) - sum(len(x.surfels) for x in scene.actors)
    print("speed:", res["speed_ms"])

    # 4. asset from a mesh file: the starter SUV's parts as a GLB with face colours
    import trimesh

    from gsim.editing.starter import STARTER
    parts = STARTER["suv"][1]()
    meshes = []
    for p in parts:
        m = p.mesh.copy()
        rgb = p.rgb if not callable(p.rgb) else (0.4, 0.4, 0.45)
        m.visual.face_colors = np.tile((np.r_[rgb, 1.0] * 255).astype(np.uint8), (len(m.faces), 1))
        meshes.append(m)
    glb = out / "suv.glb"
    trimesh.util.concatenate(meshes).export(glb)
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        asset_from_mesh(glb, "suv_mesh", "car", spacing_m=0.03)
        ts.append(time.perf_counter() - t0)
    res["asset_from_mesh_s"] = round(float(np.median(ts)), 3)
    print("asset from mesh (median of 3):", res["asset_from_mesh_s"], "s; from actor:", res.get("asset_from_actor_s"))
    (out / "editing.json").write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
