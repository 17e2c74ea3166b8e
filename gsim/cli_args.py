"""argparse types shared by every layer's commands (`gsim.cli` and each layer's ``cli.py``).

A type raises `argparse.ArgumentTypeError`, so argparse's one-line error names the option
(``gsim render: error: argument --fps: expected a finite number > 0, got 'nan'``) and exits 2.
"""
from __future__ import annotations

import argparse
import math
from typing import Callable, Optional, Tuple


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low``."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {v}")
        return v
    return parse


def _bounds(low: Optional[float], high: Optional[float], low_open: bool) -> str:
    parts = ([] if low is None else [f"{'>' if low_open else '>='} {low:g}"]) + ([] if high is None else
                                                                                  [f"<= {high:g}"])
    return f" {' and '.join(parts)}" if parts else ""


def finite_float(low: Optional[float] = None, high: Optional[float] = None, low_open: bool = False
                 ) -> Callable[[str], float]:
    """An argparse type: a finite number (never NaN or infinite), >= ``low`` (> ``low`` if ``low_open``) and
    <= ``high`` where given."""
    expected = f"a finite number{_bounds(low, high, low_open)}"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not math.isfinite(v) or (low is not None and (v <= low if low_open else v < low)) or \
                (high is not None and v > high):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return v
    return parse


positive = finite_float(0.0, low_open=True)  # fps, seconds, metres that must be > 0


def distances(text: str) -> Tuple[float, ...]:
    """An argparse type: comma-separated finite metres, e.g. ``1,2,3`` (their range is the command's to check)."""
    try:
        values = tuple(float(x) for x in text.split(",")) if text.strip() else ()
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected metres separated by commas (e.g. 1,2,3), got {text!r}") from None
    if not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected finite metres separated by commas (e.g. 1,2,3), got {text!r}")
    return values


def share_span(text: str) -> Tuple[float, float]:
    """An argparse type: ``first,last`` shares of something in order, 0 <= first < last <= 1 (e.g. ``0,0.75``)."""
    try:
        span = tuple(float(x) for x in text.split(","))
    except ValueError:
        span = ()
    if len(span) != 2 or not 0 <= span[0] < span[1] <= 1:
        raise argparse.ArgumentTypeError(f"expected two shares FIRST,LAST with 0 <= FIRST < LAST <= 1 (e.g. 0,0.75), "
                                         f"got {text!r}")
    return span


def frame_range(text: str) -> Tuple[int, Optional[int]]:
    """An argparse type: log frame indices ``first:last`` (last excluded, as Python slices; ``first:`` to the end)."""
    first, sep, last = text.partition(":")
    try:
        span = (int(first), int(last) if last.strip() else None)
    except ValueError:
        span = None
    if not sep or span is None or span[0] < 0 or (span[1] is not None and span[1] <= span[0]):
        raise argparse.ArgumentTypeError(f"expected frame indices FIRST:LAST (last excluded, e.g. 30:40) or FIRST: "
                                         f"with 0 <= FIRST < LAST, got {text!r}")
    return span


def seed_list(text: str) -> Tuple[int, ...]:
    """An argparse type: integers >= 0 separated by commas, each one or a range ``a-b`` (both ends in), e.g.
    ``0,1,2`` or ``0-99``."""
    values = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.partition("-")
            values += list(range(int(lo), int(hi) + 1)) if sep else [int(part)]
    except ValueError:
        values = []
    if not values or min(values) < 0 or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected distinct integers >= 0 or ranges a-b separated by commas, "
                                         f"got {text!r}")
    return tuple(values)


def camera_backends() -> list:
    """The ``--backend`` choices of camera rendering: 'auto' and the registry's names (`gsim.render.BACKENDS`)."""
    from .render import BACKENDS
    return ["auto", *BACKENDS]


def add_ros2_bag(parser: argparse.ArgumentParser, cameras: bool = True) -> None:
    """``--ros2-bag DIR`` (and ``--ros2-jpeg`` for a command with cameras): the run also as a ROS 2 bag."""
    parser.add_argument("--ros2-bag", metavar="DIR", default=None,
                        help="also write a ROS 2 bag that `ros2 bag play` replays (a new rosbag2 folder, MCAP; "
                             "the ros2 extra; docs/ros2.md)")
    if cameras:
        parser.add_argument("--ros2-jpeg", action="store_true",
                            help="the ROS 2 bag's images as JPEG CompressedImage (image_raw/compressed) instead of "
                                 "raw rgb8 Image")


def ros2_bag(a):
    """`add_ros2_bag`'s flags as `gsim.ros2_bag.BagOptions` (None: no bag)."""
    if a.ros2_bag is None:
        return None
    from pathlib import Path

    from .ros2_bag import BagOptions
    return BagOptions(Path(a.ros2_bag), jpeg=getattr(a, "ros2_jpeg", False))
