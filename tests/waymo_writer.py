"""Test-only: the synthetic street recorded as a Waymo Open Dataset v1 segment (a TFRecord of Frame records, with
gsim's own minimal schema), for the converter's round trip. It applies Waymo's conventions the other way:

- times: the log's microseconds + ``BASE_US`` (Waymo's are epoch times; a frame time must be > 0);
- cameras: OpenCV -> Waymo camera axes (x forward = OpenCV z, y left = -x, z up = -y), intrinsics [f_u, f_v, c_u,
  c_v, k1, k2, p1, p2, k3] unshifted, images as JPEG (quality 95), each with its ego pose; ``front_left`` is
  declared LEFT_TO_RIGHT (trigger / readout done centred on the image time), the others GLOBAL_SHUTTER;
- a TOP LiDAR cast anew on the street in Waymo's order (the synthetic sweep spins the other way): column c at
  azimuth pi - 2 pi (c + 0.5) / W, fired (c + 0.5) * 100 ms / W after the frame time from the ego pose of that
  time, rows from the highest beam; first and second returns (the ray continued 5 cm behind its first hit), and
  the per-pixel poses (roll, pitch, yaw, x, y, z), float32 as in the format;
- a FRONT LiDAR as a "virtual" range image (no per-pixel poses): all columns cast from the frame pose at its time
  (the frame's middle), uniform inclinations;
- laser_labels: every car's box in the frame pose's vehicle frame at the time the TOP swept its centre.
``write_waymo`` returns the reference: what the converter must give back."""
import math
import struct
import zlib
from pathlib import Path

import numpy as np

from gsim.scenes.formats.waymo import masked_crc32c, schema

BASE_US = 1_553_735_853_000_000
SWEEP_US = 100_000
CAMERAS = {"front": 1, "front_left": 2, "front_right": 3}
SHUTTERS = {"front_left": 2}  # LEFT_TO_RIGHT; others 5, GLOBAL_SHUTTER
SHUTTER_S = 0.002
TOP_RANGE = (1.0, 75.0)
TOP_YAW_DEG = 148.0  # the TOP is mounted turned about z, as the real one (its x axis backwards left)
SIDE = {"name": 2, "T": np.array([[1.0, 0, 0, 3.6], [0, 1, 0, 0], [0, 0, 1, 0.7], [0, 0, 0, 1]]), "rows": 6,
        "cols": 90, "incl_deg": (-30.0, 10.0), "range": (0.5, 20.0)}


def write_records(path: Path, records) -> Path:
    with open(path, "wb") as f:
        for data in records:
            head = struct.pack("<Q", len(data))
            f.write(head + struct.pack("<I", masked_crc32c(head)) + data + struct.pack("<I", masked_crc32c(data)))
    return path


def _transform(msg, T) -> None:
    msg.transform.extend(np.asarray(T, np.float64).ravel().tolist())


def _euler(T: np.ndarray) -> np.ndarray:
    """(N,4,4) -> (N,6) roll, pitch, yaw, x, y, z (R = Rz(yaw) Ry(pitch) Rx(roll))."""
    R = T[:, :3, :3]
    return np.stack([np.arctan2(R[:, 2, 1], R[:, 2, 2]), -np.arcsin(np.clip(R[:, 2, 0], -1, 1)),
                     np.arctan2(R[:, 1, 0], R[:, 0, 0]), *T[:, :3, 3].T], 1)


def _matrix(a: np.ndarray) -> bytes:
    m = schema().MatrixFloat()
    m.data.extend(np.asarray(a, np.float32).ravel().tolist())
    m.shape.dims.extend(a.shape)
    return zlib.compress(m.SerializeToString())


def _directions(incl_asc: np.ndarray, width: int, R_vehicle_laser: np.ndarray) -> np.ndarray:
    """(H,W,3) laser-frame ray directions: column c points at vehicle azimuth pi - 2 pi (c + 0.5) / W, row r at
    the r-th highest inclination (a laser turned about its z only)."""
    el = np.asarray(incl_asc)[::-1, None]
    az = (math.pi - 2 * math.pi * (np.arange(width) + 0.5) / width)[None]
    d = np.stack(np.broadcast_arrays(np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)), -1)
    return d @ R_vehicle_laser  # R^T d for each d


def _cast(street, T_cols, times, dirs, rng):
    """Cast (H,W,3) laser-frame directions, column c from T_cols[c] with the cars at times[c]: (range (H,W) with
    -1 where nothing is hit within rng, raw intensity (H,W) = 2 |cos incidence|, world hit points, world dirs)."""
    h, w = dirs.shape[:2]
    cars = street.car_poses(times)
    hits = street._cast(T_cols, dirs.reshape(-1, 3), np.tile(np.arange(w), h), cars)
    world_dirs = np.einsum("cij,rcj->rci", T_cols[:, :3, :3], dirs).reshape(-1, 3)
    t = hits.t.reshape(h, w)
    ok = (t >= rng[0]) & (t <= rng[1])
    intensity = 2 * np.abs(np.einsum("ni,ni->n", hits.normal, world_dirs)).reshape(h, w)
    origins = np.broadcast_to(T_cols[:, :3, 3], (h, w, 3)).reshape(-1, 3)
    world = origins + world_dirs * np.where(ok.ravel(), hits.t, 0.0)[:, None]
    return np.where(ok, t, -1.0), np.where(ok, intensity, 0.0), world, world_dirs


def _second(street, first_world, world_dirs, first_range, T_cols, times, rng):
    """Second returns: each first hit's ray continued from 5 cm behind the hit."""
    h, w = first_range.shape
    idx = np.nonzero(first_range.ravel() > 0)[0]
    T = np.tile(np.eye(4), (len(idx), 1, 1))
    T[:, :3, 3] = first_world[idx] + 0.05 * world_dirs[idx]
    cars = street.car_poses(times)[idx % w]
    hits = street._cast(T, world_dirs[idx], np.arange(len(idx)), cars)
    r = first_range.ravel()[idx] + 0.05 + hits.t
    ok = np.isfinite(hits.t) & (r <= rng[1])
    r2, i2 = np.full(h * w, -1.0), np.zeros(h * w)
    r2[idx[ok]] = r[ok]
    i2[idx[ok]] = 0.5 * np.abs(np.einsum("ni,ni->n", hits.normal[ok], world_dirs[idx[ok]]))
    return r2.reshape(h, w), i2.reshape(h, w)


def _image(ri: np.ndarray, intensity: np.ndarray) -> np.ndarray:
    return np.stack([ri, intensity, np.zeros_like(ri), np.zeros_like(ri)], -1).astype(np.float32)


def _reference(ri, dirs, T_vl, poses_col=None, offsets=None):
    """The sweep the converter must give: laser-frame points of the valid pixels (row major), tanh intensity,
    time offsets (raw sweeps); and their world points (poses_col: T_world_vehicle per column)."""
    r, i = ri[..., 0].astype(np.float64), ri[..., 1].astype(np.float64)
    rr, cc = np.nonzero(r > 0)
    p = dirs[rr, cc] * r[rr, cc, None]
    cols = [p, np.tanh(i[rr, cc])] + ([offsets[cc]] if offsets is not None else [])
    world = None
    if poses_col is not None:
        T = poses_col[cc] @ T_vl
        world = np.einsum("nij,nj->ni", T[:, :3, :3], p) + T[:, :3, 3]
    return np.column_stack(cols), world


def write_waymo(log, street, out: Path, cameras=True, lidars=("top", "front"), labels=True, frame_pose=True):
    """Write the synthetic log ``log`` (its street ``street``, `build_street`) as one Waymo segment ``out`` (the
    TOP with the log's LiDAR beams);
    returns {"top": [(first (N,5), second (M,5), first world (N,3))], "front": [(sweep (N,4), world)],
    "labels": {(actor id, frame): label time (log us)}, "jpeg": {(camera, frame): bytes}, "frame_pose": [4x4],
    "T_top": the TOP's extrinsic}."""
    from io import BytesIO

    from PIL import Image
    pb = schema()
    lidar = log.lidars["top"]
    incl_top = np.radians(lidar.beams.elevations_deg)
    width = round(360 / lidar.beams.azimuth_resolution_deg)
    cy, sy = math.cos(math.radians(TOP_YAW_DEG)), math.sin(math.radians(TOP_YAW_DEG))
    T_top = lidar.T_vehicle_lidar @ np.array([[cy, -sy, 0, 0], [sy, cy, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1.0]])
    offsets = np.round((np.arange(width) + 0.5) * SWEEP_US / width).astype(np.int64)
    side_incl = np.radians(SIDE["incl_deg"][0]) + (np.arange(SIDE["rows"]) + 0.5) * \
        np.radians(SIDE["incl_deg"][1] - SIDE["incl_deg"][0]) / SIDE["rows"]
    ref = {"top": [], "front": [], "labels": {}, "jpeg": {}, "frame_pose": [], "T_top": T_top}
    records = []
    for k, frame in enumerate(log.frames):
        t = frame.timestamp_us
        f = pb.Frame(timestamp_micros=t + BASE_US)
        ctx = f.context
        ctx.name = log.name
        FP = street.ego.poses([t + SWEEP_US // 2])[0]
        ref["frame_pose"].append(FP)
        if frame_pose:
            _transform(f.pose, FP)
        for name, obs in frame.cameras.items() if cameras else ():
            sensor = log.cameras[name]
            cam, T_vc = sensor.camera, sensor.T_vehicle_camera
            c = ctx.camera_calibrations.add(name=CAMERAS[name], width=cam.width, height=cam.height,
                                            rolling_shutter_direction=SHUTTERS.get(name, 5))
            c.intrinsic.extend([cam.fx, cam.fy, cam.cx, cam.cy] + [getattr(cam, a, 0.0)
                                                                  for a in ("k1", "k2", "p1", "p2", "k3")])
            E = T_vc.copy()
            E[:3, :3] = np.stack([T_vc[:3, 2], -T_vc[:3, 0], -T_vc[:3, 1]], 1)
            _transform(c.extrinsic, E)
            buf = BytesIO()
            Image.fromarray((log.image(obs) * 255 + 0.5).astype(np.uint8)).save(buf, format="JPEG", quality=95)
            ref["jpeg"][name, k] = buf.getvalue()
            s = (obs.timestamp_us + BASE_US) / 1e6
            half = 0.02 if name in SHUTTERS else SHUTTER_S / 2
            im = f.images.add(name=CAMERAS[name], image=buf.getvalue(), pose_timestamp=s, shutter=SHUTTER_S,
                              camera_trigger_time=s - half, camera_readout_done_time=s + half + 0.01 * (
                                  name not in SHUTTERS))
            _transform(im.pose, log.T_world_vehicle(obs.timestamp_us))
        if "top" in lidars:
            c = ctx.laser_calibrations.add(name=1)
            c.beam_inclinations.extend(incl_top.tolist())
            _transform(c.extrinsic, T_top)
            dirs = _directions(incl_top, width, T_top[:3, :3])
            E_cols = street.ego.poses(t + offsets)
            T_cols = E_cols @ T_top
            r1, i1, world, wdirs = _cast(street, T_cols, t + offsets, dirs, TOP_RANGE)
            ri1, ri2 = _image(r1, i1), _image(*_second(street, world, wdirs, r1, T_cols, t + offsets, TOP_RANGE))
            laser = f.lasers.add(name=1)
            laser.ri_return1.range_image_compressed = _matrix(ri1)
            laser.ri_return2.range_image_compressed = _matrix(ri2)
            pose_img = np.broadcast_to(_euler(E_cols)[None], (len(incl_top), width, 6))
            laser.ri_return1.range_image_pose_compressed = _matrix(pose_img)
            first, first_world = _reference(ri1, dirs, T_top, E_cols, offsets)
            ref["top"].append((first, _reference(ri2, dirs, T_top, E_cols, offsets)[0], first_world))
        if "front" in lidars:
            c = ctx.laser_calibrations.add(name=SIDE["name"], beam_inclination_min=np.radians(SIDE["incl_deg"][0]),
                                           beam_inclination_max=np.radians(SIDE["incl_deg"][1]))
            _transform(c.extrinsic, SIDE["T"])
            dirs = _directions(side_incl, SIDE["cols"], SIDE["T"][:3, :3])
            T_cols = np.repeat((FP @ SIDE["T"])[None], SIDE["cols"], 0)
            r1, i1, _, _ = _cast(street, T_cols, np.full(SIDE["cols"], t + SWEEP_US // 2), dirs, SIDE["range"])
            ri = _image(r1, i1)
            f.lasers.add(name=SIDE["name"]).ri_return1.range_image_compressed = _matrix(ri)
            sweep, world = _reference(ri, dirs, SIDE["T"], np.repeat(FP[None], SIDE["cols"], 0))
            ref["front"].append((sweep, world))
        for a in log.actors if labels else ():
            tl = t + SWEEP_US // 2
            for _ in range(6):  # the time the TOP sweeps the box centre, which moves with the car
                box = np.linalg.solve(FP, a.pose_at(tl))
                az = math.atan2(box[1, 3] - T_top[1, 3], box[0, 3] - T_top[0, 3])
                tl = t + round((math.pi - az) / (2 * math.pi) * SWEEP_US) % SWEEP_US
            box = np.linalg.solve(FP, a.pose_at(tl))
            ref["labels"][a.id, k] = tl
            lab = f.laser_labels.add(id=a.id, type=1)
            b = lab.box
            b.center_x, b.center_y, b.center_z = box[:3, 3]
            b.length, b.width, b.height = a.size
            b.heading = math.atan2(box[1, 0], box[0, 0])
        records.append(f.SerializeToString())
    write_records(Path(out), records)
    return ref
