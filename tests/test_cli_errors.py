"""Every command's errors, walked from the parser: a directory where a file belongs, a file where a directory
belongs, a missing path, an unreadable file, a full disk, a corrupt checkpoint and a missing optional extra each
give ONE line on stderr that names the thing, and exit 2; a bug gives exit 3 and "internal error", the traceback
with --debug or GSIM_DEBUG=1. Unreadable files and a full disk are simulated in-process (CI runs as root, where
chmod does not deny), a missing extra in a child process (sys.modules[name] = None)."""
import argparse
import builtins
import errno
import io
import json
import os
import shutil
import string
import subprocess
import sys
from functools import cached_property
from pathlib import Path

import numpy as np
import pytest

import gsim
from gsim.cli import EXTRAS, build_parser, commands, main

CASES = ("dir_for_file", "file_for_dir", "missing", "unreadable", "full_disk", "corrupt_checkpoint", "missing_extra")

# For each command, each case: (argv, what the line must name) or None where the case cannot arise (the reason in a
# comment). argv's {fields} are `Inputs` properties (built on first use), or the test's own folder {tmp} and a
# fresh path in it, {out}. unreadable: the named file is the one made unreadable; full_disk: every file or
# folder created under {tmp} fails with ENOSPC; missing_extra: the named module is made unimportable (the line
# names its extra).
WALK = {
    ("render",): {
        "dir_for_file": ("render {scene} --trajectory {adir} --out {out}", "{adir}"),
        "file_for_dir": ("render {scene} --trajectory {traj} --out {afile} --backend torch", "{afile}"),
        "missing": ("render {missing} --trajectory {traj} --out {out}", "{missing}"),
        "unreadable": ("render {scene} --trajectory {traj} --out {out}", "{traj}"),
        "full_disk": ("render {scene} --trajectory {traj} --out {out} --backend torch", "{tmp}"),
        "corrupt_checkpoint": ("render {scene} --trajectory {traj} --out {out} --repair {bad_model}", "{bad_model}"),
        "missing_extra": ("render {scene} --trajectory {traj} --out {out} --repair {model}", "diffusers"),
    },
    ("info",): {
        "dir_for_file": ("info {adir_ply}", "{adir_ply}"),
        "file_for_dir": ("info {afile}", "{afile}"),
        "missing": ("info {missing}", "{missing}"),
        "unreadable": ("info {scene}", "{scene}/scene.json"),
        "full_disk": None,  # writes nothing
        "corrupt_checkpoint": None,  # takes none
        "missing_extra": None,  # needs none
    },
    ("street",): {
        "dir_for_file": None,  # reads nothing
        "file_for_dir": ("street --out {afile} --frames 2 --surfels 100 --width 16 --height 12", "{afile}"),
        "missing": None,  # reads nothing; its output folder is made
        "unreadable": None,
        "full_disk": ("street --out {out} --frames 2 --surfels 100 --width 16 --height 12", "{tmp}"),
        "corrupt_checkpoint": None,
        "missing_extra": None,
    },
    ("import-ply",): {
        "dir_for_file": ("import-ply {adir} {out}", "{adir}"),
        "file_for_dir": ("import-ply {ply} {afile}", "{afile}"),
        "missing": ("import-ply {missing} {out}", "{missing}"),
        "unreadable": ("import-ply {ply} {out}", "{ply}"),
        "full_disk": ("import-ply {ply} {out}", "{tmp}"),
        "corrupt_checkpoint": None,
        "missing_extra": None,
    },
    ("export-ply",): {
        "dir_for_file": ("export-ply {scene} {adir} --timestamp-us 0", "{adir}"),
        "file_for_dir": ("export-ply {afile} {out}", "{afile}"),
        "missing": ("export-ply {missing} {out}", "{missing}"),
        "unreadable": ("export-ply {scene} {out}", "{scene}/scene.json"),
        "full_disk": ("export-ply {scene} {out}/a.ply --timestamp-us 0", "{tmp}"),
        "corrupt_checkpoint": None,
        "missing_extra": None,
    },
    ("render-lidar",): {
        "dir_for_file": ("render-lidar {scene} --spec velodyne-vlp16 --trajectory {adir} --out {out}", "{adir}"),
        "file_for_dir": ("render-lidar {afile} --spec velodyne-vlp16 --trajectory {ltraj} --out {out}", "{afile}"),
        "missing": ("render-lidar {scene} --spec velodyne-vlp16 --trajectory {missing} --out {out}", "{missing}"),
        "unreadable": ("render-lidar {scene} --spec velodyne-vlp16 --trajectory {ltraj} --out {out}", "{ltraj}"),
        "full_disk": ("render-lidar {scene} --spec velodyne-vlp16 --trajectory {ltraj} --out {out}", "{tmp}"),
        "corrupt_checkpoint": None,
        "missing_extra": None,
    },
    ("demo",): {
        "dir_for_file": None,  # reads nothing of the user's
        "file_for_dir": ("demo --out {afile}", "{afile}"),
        "missing": None,
        "unreadable": None,
        "full_disk": ("demo --out {out}", "{tmp}"),
        "corrupt_checkpoint": None,  # its own reconstruction starts afresh
        "missing_extra": None,
    },
    ("synth",): {
        "dir_for_file": None,
        "file_for_dir": ("synth {afile}", "{afile}"),
        "missing": None,
        "unreadable": None,
        "full_disk": ("synth {out}", "{tmp}"),
        "corrupt_checkpoint": None,
        "missing_extra": None,
    },
    ("convert", "kitti-raw"): {
        "dir_for_file": None,  # reads folders
        "file_for_dir": ("convert kitti-raw {afile} {out}", "{afile}"),
        "missing": ("convert kitti-raw {missing} {out}", "{missing}"),
        "unreadable": None,  # its calibration files are read whole (the nerfstudio case covers the path)
        "full_disk": None,  # the nerfstudio case covers LogWriter's full disk
        "corrupt_checkpoint": None,
        "missing_extra": None,  # kitti-raw without poses needs kiss-icp: its MissingExtra is a GsimError
    },
    ("convert", "dgp"): {
        "dir_for_file": None,  # takes a folder or a file
        "file_for_dir": None,
        "missing": ("convert dgp {missing} {out}", "{missing}"),
        "unreadable": None,
        "full_disk": None,
        "corrupt_checkpoint": None,
        "missing_extra": None,
    },
    ("convert", "nerfstudio"): {
        "dir_for_file": ("convert nerfstudio {adir} {out}", "{adir}"),
        "file_for_dir": None,  # takes a file
        "missing": ("convert nerfstudio {missing} {out}", "{missing}"),
        "unreadable": ("convert nerfstudio {nerfstudio} {out}", "{nerfstudio}"),
        "full_disk": ("convert nerfstudio {nerfstudio} {out}", "{tmp}"),
        "corrupt_checkpoint": None,
        "missing_extra": None,
    },
    ("convert", "av2"): {
        "dir_for_file": None,  # takes a folder
        "file_for_dir": ("convert av2 {afile} {out}", "{afile}"),
        "missing": ("convert av2 {missing} {out}", "{missing}"),
        "unreadable": None,  # its tables are read by pyarrow (the nerfstudio case covers unreadable inputs)
        "full_disk": None,  # the nerfstudio case covers LogWriter's full disk
        "corrupt_checkpoint": None,
        "missing_extra": None,  # pyarrow: tested in tests/test_convert_av2.py
    },
    ("convert", "kitti-tracking"): {
        "dir_for_file": None,  # takes a folder
        "file_for_dir": ("convert kitti-tracking {afile} {out} --sequence 0001", "{afile}"),
        "missing": ("convert kitti-tracking {missing} {out} --sequence 0001", "{missing}"),
        "unreadable": None,  # the kitti-raw and nerfstudio cases cover unreadable inputs
        "full_disk": None,  # the nerfstudio case covers LogWriter's full disk
        "corrupt_checkpoint": None,
        "missing_extra": None,
    },
    ("convert", "nuscenes"): {
        "dir_for_file": None,  # takes a folder
        "file_for_dir": ("convert nuscenes {afile} {out}", "{afile}"),
        "missing": ("convert nuscenes {missing} {out}", "{missing}"),
        "unreadable": None,  # the kitti-raw and nerfstudio cases cover unreadable inputs
        "full_disk": None,  # the nerfstudio case covers LogWriter's full disk
        "corrupt_checkpoint": None,
        "missing_extra": None,
    },
    ("convert", "waymo"): {
        "dir_for_file": ("convert waymo {adir} {out}", "{adir}"),
        "file_for_dir": None,  # takes a file
        "missing": ("convert waymo {missing} {out}", "{missing}"),
        "unreadable": None,  # the kitti-raw and nerfstudio cases cover unreadable inputs
        "full_disk": None,  # the nerfstudio case covers LogWriter's full disk
        "corrupt_checkpoint": None,
        "missing_extra": None,  # protobuf: the serve extra has it too, so the test's environment always does
    },
    ("convert", "rosbag"): {
        "dir_for_file": ("convert rosbag {adir} {out}", "{adir}"),  # a folder that is no bag
        "file_for_dir": None,  # takes a file or a folder
        "missing": ("convert rosbag {missing} {out}", "{missing}"),
        "unreadable": None,  # read by rosbags (the nerfstudio case covers unreadable inputs)
        "full_disk": None,  # the nerfstudio case covers LogWriter's full disk
        "corrupt_checkpoint": None,
        "missing_extra": ("convert rosbag {missing} {out}", "rosbags"),
    },
    ("overlay",): {
        "dir_for_file": ("overlay {log} {adir}", "{adir}"),
        "file_for_dir": ("overlay {afile} {out}", "{afile}"),
        "missing": ("overlay {missing} {out}", "{missing}"),
        "unreadable": ("overlay {log} {out}", "{log}/log.json"),
        "full_disk": ("overlay {log} {out}", "{tmp}"),
        "corrupt_checkpoint": None,
        "missing_extra": None,
    },
    ("export-nerfstudio",): {
        "dir_for_file": None,  # its output is a folder
        "file_for_dir": ("export-nerfstudio {log} {afile}", "{afile}"),
        "missing": ("export-nerfstudio {missing} {out}", "{missing}"),
        "unreadable": ("export-nerfstudio {log} {out}", "{log}/log.json"),
        "full_disk": ("export-nerfstudio {log} {out}", "{tmp}"),
        "corrupt_checkpoint": None,
        "missing_extra": None,
    },
    ("validate",): {
        "dir_for_file": None,  # a log is a folder
        "file_for_dir": ("validate {afile}", "{afile}"),
        "missing": ("validate {missing}", "{missing}"),
        "unreadable": ("validate {log}", "{log}/log.json"),
        "full_disk": None,
        "corrupt_checkpoint": None,
        "missing_extra": None,
    },
    ("compile",): {  # takes no paths and no extra; writes numba's cache (numba's own files) and the stamp beside it
        "dir_for_file": None, "file_for_dir": None, "missing": None, "unreadable": None, "full_disk": None,
        "corrupt_checkpoint": None, "missing_extra": None,
    },
    ("reconstruct",): {
        "dir_for_file": None,
        "file_for_dir": ("reconstruct {afile} {out}", "{afile}"),
        "missing": ("reconstruct {missing} {out}", "{missing}"),
        "unreadable": ("reconstruct {log} {out}", "{log}/log.json"),
        "full_disk": ("reconstruct {log} {out} --iterations 1", "{tmp}"),
        "corrupt_checkpoint": ("reconstruct {log} {bad_recon} --resume", "{bad_recon}/checkpoint.safetensors"),
        "missing_extra": None,
    },
    ("eval",): {
        "dir_for_file": None,
        "file_for_dir": ("eval {scene} {afile} --out {out}", "{afile}"),
        "missing": ("eval {missing} {log} --out {out}", "{missing}"),
        "unreadable": ("eval {scene} {log} --out {out}", "{log}/log.json"),
        "full_disk": ("eval {scene} {log} --out {out} --holdout-every 2", "{tmp}"),
        "corrupt_checkpoint": ("eval {scene} {log} --out {out} --repair {bad_model}", "{bad_model}"),
        "missing_extra": ("eval {scene} {log} --out {out} --repair {model}", "diffusers"),
    },
    ("trajectory",): {
        "dir_for_file": ("trajectory {log} {adir}", "{adir}"),
        "file_for_dir": ("trajectory {afile} {out}", "{afile}"),
        "missing": ("trajectory {missing} {out}", "{missing}"),
        "unreadable": ("trajectory {log} {out}", "{log}/log.json"),
        "full_disk": ("trajectory {log} {out}/t.json", "{tmp}"),
        "corrupt_checkpoint": None,
        "missing_extra": None,
    },
    ("truth",): {
        "dir_for_file": ("truth {log} --trajectory {adir} --out {out}", "{adir}"),
        "file_for_dir": ("truth {afile} --trajectory {log_traj} --out {out}", "{afile}"),
        "missing": ("truth {log} --trajectory {missing} --out {out}", "{missing}"),
        "unreadable": ("truth {log} --trajectory {log_traj} --out {out}", "{log_traj}"),
        "full_disk": ("truth {log} --trajectory {log_traj} --out {out}", "{tmp}"),
        "corrupt_checkpoint": None,
        "missing_extra": None,
    },
    ("scenario",): {
        "dir_for_file": ("scenario validate {adir}", "{adir}"),
        "file_for_dir": ("scenario apply {scenario} --out {afile}", "{afile}"),
        "missing": ("scenario validate {missing}", "{missing}"),
        "unreadable": ("scenario validate {scenario}", "{scenario}"),
        "full_disk": ("scenario apply {scenario} --out {out}", "{tmp}"),
        "corrupt_checkpoint": ("scenario render {scenario} --harmonize {bad_model}", "{bad_model}"),
        "missing_extra": ("scenario validate {scenario}", "yaml"),
    },
    ("library", "list"): {
        "dir_for_file": None,  # a library is a folder
        "file_for_dir": ("library list {afile}", "{afile}"),
        "missing": ("library list {missing}", "{missing}"),
        "unreadable": ("library list {library}", "{library}/cone/asset.json"),
        "full_disk": None,
        "corrupt_checkpoint": None,
        "missing_extra": ("library list", "pydantic"),
    },
    ("library", "show"): {
        "dir_for_file": None,
        "file_for_dir": ("library show cone {afile}", "{afile}"),
        "missing": ("library show cone {missing}", "{missing}"),
        "unreadable": ("library show cone {library}", "{library}/cone/asset.json"),
        "full_disk": None,
        "corrupt_checkpoint": None,
        "missing_extra": ("library show cone", "pydantic"),
    },
    ("library", "render"): {
        "dir_for_file": ("library render cone {adir} --frames 1 --width 16 --height 16", "{adir}"),
        "file_for_dir": ("library render cone {out}.png --library {afile}", "{afile}"),
        "missing": ("library render cone {out}.png --library {missing}", "{missing}"),
        "unreadable": ("library render cone {out}.png --library {library}", "{library}/cone/asset.json"),
        "full_disk": ("library render cone {out}/a.png --frames 1 --width 16 --height 16", "{tmp}"),
        "corrupt_checkpoint": None,
        "missing_extra": ("library render cone {out}.png", "pydantic"),
    },
    ("library", "add-actor"): {
        "dir_for_file": None,  # a scene is a folder
        "file_for_dir": ("library add-actor {scene} cone_a {afile}", "{afile}"),
        "missing": ("library add-actor {missing} cone_a {out}", "{missing}"),
        "unreadable": ("library add-actor {scene} cone_a {out}", "{scene}/scene.json"),
        "full_disk": ("library add-actor {scene} cone_a {out}", "{tmp}"),
        "corrupt_checkpoint": None,
        "missing_extra": ("library add-actor {scene} cone_a {out}", "pydantic"),
    },
    ("library", "add-mesh"): {
        "dir_for_file": ("library add-mesh {adir} {out} --id m --category sign", "{adir}"),
        "file_for_dir": ("library add-mesh {mesh} {afile} --id m --category sign --spacing-m 0.1", "{afile}"),
        "missing": ("library add-mesh {missing} {out} --id m --category sign", "{missing}"),
        "unreadable": ("library add-mesh {mesh} {out} --id m --category sign", "{mesh}"),
        "full_disk": ("library add-mesh {mesh} {out} --id m --category sign --spacing-m 0.1", "{tmp}"),
        "corrupt_checkpoint": None,
        "missing_extra": ("library add-mesh {mesh} {out} --id m --category sign", "trimesh"),
    },
    ("library", "add-ply"): {
        "dir_for_file": ("library add-ply {adir} {out} --id p --category sign", "{adir}"),
        "file_for_dir": ("library add-ply {ply} {afile} --id p --category sign", "{afile}"),
        "missing": ("library add-ply {missing} {out} --id p --category sign", "{missing}"),
        "unreadable": ("library add-ply {ply} {out} --id p --category sign", "{ply}"),
        "full_disk": ("library add-ply {ply} {out} --id p --category sign", "{tmp}"),
        "corrupt_checkpoint": None,
        "missing_extra": ("library add-ply {ply} {out} --id p --category sign", "pydantic"),
    },
    ("diffusion", "train"): {
        "dir_for_file": None,
        "file_for_dir": ("diffusion train {scene} {afile} --out {out}", "{afile}"),
        "missing": ("diffusion train {missing} {log} --out {out}", "{missing}"),
        "unreadable": ("diffusion train {scene} {log} --out {out}", "{log}/log.json"),
        "full_disk": ("diffusion train {scene} {log} --out {out} --steps 1", "{tmp}"),
        "corrupt_checkpoint": ("diffusion train {scene} {log} --out {bad_train} --resume", "{bad_train}-work"),
        "missing_extra": ("diffusion train {scene} {log} --out {out}", "diffusers"),
    },
    ("expand",): {
        "dir_for_file": None,
        "file_for_dir": ("expand {scene} {log} --out {out} --model {afile}", "{afile}"),
        "missing": ("expand {scene} {log} --out {out} --model {missing}", "{missing}"),
        "unreadable": ("expand {scene} {log} --out {out} --model {model}", "{model}/gsim_repair.json"),
        "full_disk": ("expand {recon} {log} --out {out} --model {model} --iterations 1 --shifts 1", "{tmp}"),
        "corrupt_checkpoint": ("expand {bad_recon} {log} --out {out} --model {model}", "{bad_recon}"),
        "missing_extra": ("expand {scene} {log} --out {out} --model {model}", "diffusers"),
    },
    ("closed-loop",): {
        "dir_for_file": ("closed-loop {adir} --out {out}", "{adir}"),
        "file_for_dir": ("closed-loop {loop} --out {afile} --steps 1 --agent replay", "{afile}"),
        "missing": ("closed-loop {missing} --out {out}", "{missing}"),
        "unreadable": ("closed-loop {loop} --out {out}", "{loop}"),
        "full_disk": ("closed-loop {loop} --out {out} --steps 1 --agent replay", "{tmp}"),
        "corrupt_checkpoint": None,
        "missing_extra": ("closed-loop {loop} --out {out}", "sumolib"),
    },
    ("batch", "reconstruct"): {
        "dir_for_file": None,  # takes folders
        "file_for_dir": ("batch reconstruct {afile} --out {out}", "{afile}"),
        "missing": ("batch reconstruct {missing} --out {out}", "{missing}"),
        "unreadable": None,  # the logs are read by the tasks: an unreadable one is a failed row (test_batch.py)
        "full_disk": ("batch reconstruct {log} --out {out}", "{tmp}"),
        "corrupt_checkpoint": None,  # a checkpoint is read by its task: a failed row, like any bad input
        "missing_extra": ("batch reconstruct {log} --out {out}", "ray"),
    },
    ("batch", "closed-loop"): {
        "dir_for_file": ("batch closed-loop {adir} --out {out}", "{adir}"),
        "file_for_dir": ("batch closed-loop {loop} --out {afile} --steps 1 --agents replay", "{afile}"),
        "missing": ("batch closed-loop {missing} --out {out}", "{missing}"),
        "unreadable": ("batch closed-loop {loop} --out {out}", "{loop}"),
        "full_disk": ("batch closed-loop {loop} --out {out} --steps 1 --agents replay", "{tmp}"),
        "corrupt_checkpoint": None,
        "missing_extra": ("batch closed-loop {loop} --out {out} --steps 1 --agents replay", "ray"),
    },
    ("batch", "scenario-render"): {
        "dir_for_file": ("batch scenario-render {adir} --out {out}", "{adir}"),
        "file_for_dir": ("batch scenario-render {scenario} --out {afile}", "{afile}"),
        "missing": ("batch scenario-render {missing} --out {out}", "{missing}"),
        "unreadable": ("batch scenario-render {scenario} --out {out}", "{scenario}"),
        "full_disk": ("batch scenario-render {scenario} --out {out}", "{tmp}"),
        "corrupt_checkpoint": None,
        "missing_extra": ("batch scenario-render {scenario} --out {out}", "yaml"),
    },
    ("serve",): {
        "dir_for_file": ("serve {scene} --token-file {adir}", "{adir}"),
        "file_for_dir": ("serve {afile}", "{afile}"),
        "missing": ("serve {missing}", "{missing}"),
        "unreadable": ("serve {scene} --token-file {token}", "{token}"),
        "full_disk": None,  # writes only what sessions record, after it has started
        "corrupt_checkpoint": None,  # serves scenes, not checkpoints
        "missing_extra": ("serve {scene}", "grpc"),
    },
    ("view",): {
        "dir_for_file": ("view {scene} --log {afile} --port 0", "{afile}"),
        "file_for_dir": ("view {afile} --port 0", "{afile}"),
        "missing": ("view {missing} --port 0", "{missing}"),
        "unreadable": ("view {scene} --log {log} --port 0", "{log}/log.json"),
        "full_disk": None,  # writes nothing
        "corrupt_checkpoint": None,  # shows scenes, not checkpoints
        "missing_extra": ("view {scene} --log {log} --port 0", "viser"),
    },
}


class Inputs:
    """The walk's inputs, each made on first use in one folder shared by the module's tests."""

    def __init__(self, root: Path):
        self.root = root

    @cached_property
    def afile(self) -> Path:
        (self.root / "a-file").write_text("a plain file\n")
        return self.root / "a-file"

    @cached_property
    def adir(self) -> Path:
        (self.root / "a-dir").mkdir()
        return self.root / "a-dir"

    @cached_property
    def adir_ply(self) -> Path:
        (self.root / "folder.ply").mkdir()
        return self.root / "folder.ply"

    @property
    def missing(self) -> Path:
        return self.root / "nowhere" / "nothing"

    @cached_property
    def scene(self) -> Path:
        """100 street surfels and an actor (a built-in cone), cone_a."""
        from gsim.editing import AssetLibrary, insert_actor
        from gsim.street import street_surfels
        T = np.eye(4)
        T[:3, 3] = [6.0, 0.0, 0.0]
        cone = AssetLibrary.builtin().get("cone")
        scene = insert_actor(gsim.Scene(background=street_surfels(100, seed=0)), cone, [0, 100_000], [T, T],
                             actor_id="cone_a", shadow=False, on_ground=False)
        scene.save(self.root / "scene")
        return self.root / "scene"

    @cached_property
    def ply(self) -> Path:
        from gsim.ply import save_ply
        from gsim.street import street_surfels
        save_ply(street_surfels(100, seed=1), self.root / "s.ply")
        return self.root / "s.ply"

    @cached_property
    def traj(self) -> Path:
        from gsim.street import demo_camera, drive_trajectory
        from gsim.trajectory import Trajectory
        Trajectory(demo_camera(16, 12), np.array([0, 100_000]), drive_trajectory(2)).save(self.root / "t.json")
        return self.root / "t.json"

    @cached_property
    def ltraj(self) -> Path:
        T = np.eye(4)
        T[:3, 3] = [0.0, 0.0, 1.8]
        (self.root / "lidar.json").write_text(json.dumps(
            {"schema_version": 1, "frames": [{"timestamp_us": 0, "T_world_lidar": T.tolist()}]}))
        return self.root / "lidar.json"

    @cached_property
    def log(self) -> Path:
        from gsim.scenes.synth import SynthOptions, synthesize
        return synthesize(self.root / "log", seed=0, progress=False, options=SynthOptions(
            n_frames=2, width=32, height=16, supersample=1, lidar_beams=4, lidar_azimuth_resolution_deg=4.0))

    @cached_property
    def log_traj(self) -> Path:
        """One frame of the log's front camera, at its own resolution."""
        from gsim.scenes.log import load_log
        from gsim.scenes.evaluation.render_path import camera_path, path_camera
        log = load_log(self.log)
        camera_path(log, path_camera(log), 0.0, every=2).save(self.root / "log-t.json")
        return self.root / "log-t.json"

    @cached_property
    def nerfstudio(self) -> Path:
        from gsim.scenes.formats.nerfstudio import export_nerfstudio
        return export_nerfstudio(self.log, self.root / "ns", progress=False)

    @cached_property
    def library(self) -> Path:
        from gsim.editing import AssetLibrary
        AssetLibrary(self.root / "lib").add(AssetLibrary.builtin().get("cone"))
        return self.root / "lib"

    @cached_property
    def mesh(self) -> Path:
        trimesh = pytest.importorskip("trimesh")
        trimesh.creation.box(extents=(0.5, 0.5, 1.0)).export(self.root / "box.obj")
        return self.root / "box.obj"

    @cached_property
    def scenario(self) -> Path:
        pytest.importorskip("yaml")
        (self.root / "s.yaml").write_text(json.dumps({
            "schema_version": 1, "name": "walk", "scene": str(self.scene), "log": str(self.log),
            "edits": [{"kind": "remove", "actor": "cone_a"}], "sensors": {"cameras": ["front"], "lidars": []},
            "output": str(self.root / "scenario-out")}))  # JSON is YAML
        return self.root / "s.yaml"

    @cached_property
    def loop(self) -> Path:
        pytest.importorskip("yaml")
        (self.root / "loop.yaml").write_text(json.dumps({
            "schema_version": 1, "name": "walk-loop", "scene": str(self.scene), "log": str(self.log),
            "edits": [], "sensors": {"cameras": ["front"], "lidars": []}}))
        return self.root / "loop.yaml"

    @cached_property
    def model(self) -> Path:
        """A tiny repair model (untrained)."""
        pytest.importorskip("diffusers")
        from gsim.diffusion.repair import RepairConfig, RepairModel
        RepairModel.new(RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20)).save(self.root / "model")
        return self.root / "model"

    @cached_property
    def bad_model(self) -> Path:
        """`model` with its weights overwritten by garbage."""
        bad = self.root / "bad-model"
        shutil.copytree(self.model, bad)
        for f in (bad / "unet").iterdir():
            if f.name != "config.json":
                f.write_bytes(b"\x80\x04garbage, not weights")
        return bad

    @cached_property
    def recon(self) -> Path:
        """A 1-iteration reconstruction of `log` (its checkpoint is what expansion continues)."""
        from gsim.scenes.reconstruction.train import preset, reconstruct
        reconstruct(self.log, self.root / "recon", preset("cpu", iterations=1, checkpoint_every=1), progress=False)
        return self.root / "recon"

    @cached_property
    def bad_recon(self) -> Path:
        """A reconstruction folder (a scene) whose checkpoint is garbage."""
        bad = self.root / "bad-recon"
        shutil.copytree(self.scene, bad / "scene")
        (bad / "checkpoint.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a checkpoint")
        return bad

    @cached_property
    def bad_train(self) -> Path:
        """The --out of `gsim diffusion train` whose work folder holds a garbage checkpoint."""
        (self.root / "bad-train-work").mkdir()
        (self.root / "bad-train-work" / "checkpoint.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{no")
        return self.root / "bad-train"

    @cached_property
    def token(self) -> Path:
        (self.root / "token").write_text("s3cret\n")
        return self.root / "token"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return Inputs(tmp_path_factory.mktemp("walk"))


def _fill(template: str, inputs: Inputs, tmp: Path) -> str:
    fields = {name for _, name, _, _ in string.Formatter().parse(template) if name}
    own = {"tmp": tmp, "out": tmp / "out"}
    return template.format(**{n: str(own[n] if n in own else getattr(inputs, n)) for n in fields})


def _path(file):
    """The absolute path ``file`` names (None for a file descriptor)."""
    return os.path.abspath(os.fsdecode(file)) if isinstance(file, (str, bytes, os.PathLike)) else None


def _under(file, root: str) -> bool:
    return (_path(file) or "").startswith(root + os.sep)


def _unreadable(monkeypatch, target: Path) -> None:
    """Opening ``target`` fails as it does for a file the user may not read."""
    target = os.path.abspath(target)
    real_open, real_os_open = io.open, os.open

    def deny(path):
        if _path(path) == target:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(path))

    def fake_open(file, *a, **k):
        deny(file)
        return real_open(file, *a, **k)

    def fake_os_open(path, *a, **k):
        deny(path)
        return real_os_open(path, *a, **k)
    for mod, name, fn in ((builtins, "open", fake_open), (io, "open", fake_open), (os, "open", fake_os_open)):
        monkeypatch.setattr(mod, name, fn)


def _full_disk(monkeypatch, root: Path) -> None:
    """Creating a file or folder under ``root`` fails as it does on a full disk (ENOSPC)."""
    root = os.path.abspath(root)
    real_open, real_os_open, real_mkdir = io.open, os.open, os.mkdir

    def full(path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fsdecode(path))

    def fake_open(file, mode="r", *a, **k):
        if _under(file, root) and any(c in mode for c in "wax+"):
            full(file)
        return real_open(file, mode, *a, **k)

    def fake_os_open(path, flags, *a, **k):
        if _under(path, root) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            full(path)
        return real_os_open(path, flags, *a, **k)

    def fake_mkdir(path, *a, **k):
        if _under(path, root) and not os.path.exists(path):
            full(path)
        return real_mkdir(path, *a, **k)
    for mod, name, fn in ((builtins, "open", fake_open), (io, "open", fake_open), (os, "open", fake_os_open),
                          (os, "mkdir", fake_mkdir)):
        monkeypatch.setattr(mod, name, fn)


def _no_serving(monkeypatch) -> None:
    """`gsim serve` must fail before it binds: starting is a test failure (exit 3), never a server left running."""
    import gsim.bridges.api.server as server

    def start(*a, **k):
        raise AssertionError("gsim serve started a server")
    monkeypatch.setattr(server, "start", start)


def _walk():
    for cmd in commands(build_parser()):
        row = WALK.get(cmd)
        if row is None:
            yield pytest.param(cmd, None, id=" ".join(cmd) + "-no-row")
            continue
        assert set(row) == set(CASES), f"WALK[{cmd}]: give every case ({CASES}), None where it cannot arise"
        yield from (pytest.param(cmd, case, id=f"{' '.join(cmd)}-{case}") for case in CASES if row[case])


def _quiet_progress(monkeypatch):
    """No progress bars on stderr: the error line is then all there is."""
    import tqdm
    init = tqdm.tqdm.__init__

    def quiet(self, *a, **k):
        init(self, *a, **{**k, "disable": True})
    monkeypatch.setattr(tqdm.tqdm, "__init__", quiet)


@pytest.mark.parametrize("cmd,case", list(_walk()))
def test_every_command_fails_in_one_line_naming_the_thing(cmd, case, inputs, tmp_path, monkeypatch, capsys):
    assert case is not None, f"`gsim {' '.join(cmd)}` is not in WALK: add its row (each case, or None and why)"
    argv_t, named_t = WALK[cmd][case]
    argv = _fill(argv_t, inputs, tmp_path).split()
    monkeypatch.setenv("TQDM_DISABLE", "1")  # (a child process reads it; this one has tqdm imported already)
    _quiet_progress(monkeypatch)
    monkeypatch.delenv("GSIM_DEBUG", raising=False)
    if case == "missing_extra":  # in a child process: sys.modules[name] = None makes `import name` fail
        code = (f"import sys; sys.modules[{named_t!r}] = None; from gsim.cli import main; "
                f"sys.exit(main({argv!r}))")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "TQDM_DISABLE": "1"})
        rc, err, named = p.returncode, p.stderr, f"gsim[{EXTRAS[named_t]}]"
    else:
        named = _fill(named_t, inputs, tmp_path)
        if case == "unreadable":
            _unreadable(monkeypatch, Path(named))
        elif case == "full_disk":
            _full_disk(monkeypatch, tmp_path)
        if cmd == ("serve",):
            _no_serving(monkeypatch)
        rc = main(argv)
        err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"gsim {cmd[0]}: error: ") and named in lines[0], err


def _boom(*a, **k):
    raise ZeroDivisionError("float division by zero")


@pytest.mark.parametrize("debug", ["", "--debug", "trailing --debug", "GSIM_DEBUG=1"])
def test_a_bug_is_an_internal_error_with_its_traceback_on_demand(debug, inputs, monkeypatch, capsys):
    monkeypatch.delenv("GSIM_DEBUG", raising=False)
    if debug == "GSIM_DEBUG=1":
        monkeypatch.setenv("GSIM_DEBUG", "1")
    monkeypatch.setattr(gsim, "load_scene", _boom)
    argv = ["info", str(inputs.scene)]
    argv = ["--debug", *argv] if debug == "--debug" else argv + ["--debug"] if debug.startswith("trailing") else argv
    assert main(argv) == 3
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last == ("gsim info: internal error (a bug in gsim; rerun with --debug and report the traceback): "
                    "ZeroDivisionError: float division by zero")
    assert ("Traceback" in err and "_boom" in err) == bool(debug), err
    assert bool(debug) or len(err.strip().splitlines()) == 1


def test_debug_shows_the_traceback_of_an_input_error_too(inputs, capsys):
    assert main(["--debug", "info", str(inputs.missing)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("gsim info: error: ")


@pytest.mark.parametrize("exc,code,text", [
    (KeyboardInterrupt(), 130, "gsim info: interrupted"),
    (ModuleNotFoundError("No module named 'gsim.nothing'", name="gsim.nothing"), 3, "internal error"),
    (ModuleNotFoundError("No module named 'kiss_icp'", name="kiss_icp"), 2, "pip install 'gsim[lidar]'"),
    (ValueError("a library's complaint"), 3, "internal error"),  # bad input reaches the CLI as an InputError
    (OSError(errno.ENOSPC, "No space left on device"), 2, "error: No space left on device"),
])
def test_each_class_of_exception_has_its_exit_status(exc, code, text, monkeypatch, capsys):
    def raise_it(*a, **k):
        raise exc
    monkeypatch.setattr(gsim, "load_scene", raise_it)
    assert main(["info", "x"]) == code
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and text in err and "Traceback" not in err, err


def _float_options():
    for cmd, parser in commands(build_parser()).items():
        for action in parser._actions:
            if action.option_strings and action.type is not None:
                try:
                    v = action.type("1.5")
                except (argparse.ArgumentTypeError, ValueError):
                    continue  # not a number option (or an integer one)
                if isinstance(v, float) or (isinstance(v, tuple) and v and isinstance(v[0], float)):
                    yield pytest.param(cmd, action, id=f"{' '.join(cmd)} {action.option_strings[0]}")


@pytest.mark.parametrize("cmd,action", list(_float_options()))
@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1,nan", "-Infinity"])
def test_every_float_option_refuses_non_finite_numbers(cmd, action, text):
    if "," in text and action.type("1.5") == 1.5:
        text = text.split(",")[1]  # a single number's option: the non-finite part alone
    with pytest.raises(argparse.ArgumentTypeError, match="finite"):
        action.type(text)


def test_a_non_finite_option_is_named_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["render", "s", "--trajectory", "t", "--out", "o", "--fps", "nan"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --fps: expected a finite number > 0, got 'nan'" in err
    with pytest.raises(SystemExit):
        main(["expand", "s", "l", "--out", "o", "--shifts", "1,inf"])
    assert "argument --shifts: expected finite metres" in capsys.readouterr().err


@pytest.fixture
def serve_spy(monkeypatch):
    """`gsim serve` with its server replaced: what start() was given, and whether anything was loaded."""
    pytest.importorskip("grpc")
    import gsim.bridges.api.server as server
    calls = {"start": [], "load": 0}
    real_load = server.load_served

    def load(*a, **k):
        calls["load"] += 1
        return real_load(*a, **k)

    def start(*a, **k):
        calls["start"].append(k)
        return type("S", (), {"port": 1})()
    monkeypatch.setattr(server, "load_served", load)
    monkeypatch.setattr(server, "start", start)
    monkeypatch.setattr(server, "serve_forever", lambda s: None)
    monkeypatch.delenv("GSIM_SERVE_TOKEN", raising=False)
    return calls


def test_serve_takes_only_known_backends(inputs, serve_spy, capsys):
    from gsim.render import BACKENDS
    with pytest.raises(SystemExit) as e:
        main(["serve", str(inputs.scene), "--backend", "vulkan"])
    assert e.value.code == 2 and "argument --backend: invalid choice: 'vulkan'" in capsys.readouterr().err
    assert serve_spy == {"start": [], "load": 0}
    backend = next(a for a in commands(build_parser())[("serve",)]._actions if "--backend" in a.option_strings)
    assert backend.choices == ["auto", *BACKENDS]
    assert main(["serve", str(inputs.scene), "--backend", "torch"]) == 0 and serve_spy["start"][0]["backend"] == "torch"


@pytest.mark.parametrize("extra,refused", [
    ([], "needs a bearer token"),
    (["--token-file", "{token}"], "--insecure"),
    (["--token-file", "{token}", "--tls-cert", "{token}"], "give both"),
])
def test_serve_on_another_host_refuses_a_token_in_clear_before_loading_anything(extra, refused, inputs, serve_spy,
                                                                                capsys):
    argv = ["serve", str(inputs.scene), "--host", "0.0.0.0", *[x.format(token=inputs.token) for x in extra]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and refused in err and "gsim serve: error: --" in err, err
    assert serve_spy == {"start": [], "load": 0}


def test_serve_insecure_passes_on_and_local_or_tls_needs_no_flag(inputs, serve_spy, capsys):
    base = ["serve", str(inputs.scene), "--token-file", str(inputs.token)]
    assert main([*base, "--host", "0.0.0.0", "--insecure"]) == 0
    assert main([*base, "--host", "0.0.0.0", "--tls-cert", str(inputs.token), "--tls-key", str(inputs.token)]) == 0
    assert main(base) == 0
    assert [c["insecure"] for c in serve_spy["start"]] == [True, False, False]


@pytest.mark.parametrize("argv", [["street", "--seed", "-1", "--out", "x"], ["synth", "x", "--seed", "-1"],
                                  ["closed-loop", "stopped-car", "--seed", "0,-1", "--out", "x"]])
def test_a_negative_seed_is_bad_input_not_a_bug(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own refusal
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and "--seed" in err and "internal error" not in err and not (tmp_path / "x").exists(), err
