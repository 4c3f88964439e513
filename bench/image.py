"""6. The cpu image: size, full build time, rebuild time after a change under app/.

The rebuild is measured in a temporary copy of the build context (build/bench/ctx-*, wheels hard-linked),
so the working tree is never touched: one untimed build primes the cache for that context, then builds
after changing a throwaway file app/.bench-touch (ours) alternate with builds where nothing changed
(the alternative: docker's fixed cost for this context, fully cached). Images are tagged
gaudi-cluster:bench-* and untagged afterwards; gaudi-cluster:cpu is never rebuilt or retagged.
A full build (10+ minutes on 2 cores) is not run by `make bench`; the last value recorded in
build/bench/full-build.json (written by `python -m bench.image --full`) is reported, with its date.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from bench.common import ROOT, WORK, Ctx, Row, Target, failed_row, log, stat

CONTEXT_PARTS = ("Dockerfile", ".dockerignore", "image", "entrypoint", "app", "requirements")
FULL_BUILD_RECORD = WORK / "full-build.json"


def build_args(rev: str) -> list[str]:
    version = re.search(r'^version = "(.*)"', (ROOT / "pyproject.toml").read_text(), re.M)
    return [
        "--build-arg",
        "FLAVOR=cpu",
        "--build-arg",
        "BASE_IMAGE=gaudi-cluster/debian:bookworm",
        "--build-arg",
        f"VERSION={version.group(1) if version else 'dev'}",
        "--build-arg",
        f"GIT_REV={rev}",
    ]


def git_rev() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=False, capture_output=True, text=True
    )
    return done.stdout.strip() or "nogit"


def copy_context(dest: Path) -> None:
    dest.mkdir(parents=True)
    for part in CONTEXT_PARTS:
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(
                src, dest / part, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        elif src.exists():
            shutil.copy2(src, dest / part)
    wheels = ROOT / "build" / "wheelhouse"
    (dest / "build" / "wheelhouse").mkdir(parents=True)
    for whl in wheels.glob("*.whl"):
        os.link(whl, dest / "build" / "wheelhouse" / whl.name)  # same file system: no copy


def timed_build(ctx_dir: Path, tag: str, rev: str) -> float:
    t = time.perf_counter()
    done = subprocess.run(
        ["docker", "build", "-q", "-t", tag, *build_args(rev), str(ctx_dir)],
        check=False,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    elapsed = time.perf_counter() - t
    if done.returncode != 0:
        raise RuntimeError(f"docker build failed: {done.stderr[-2000:]}")
    return elapsed


def image_size_gb(image: str) -> float:
    done = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Size}}", image], check=True, capture_output=True, text=True
    )
    return int(done.stdout.strip()) / 1e9


def run(ctx: Ctx) -> list[Row]:
    out: list[Row] = []
    try:
        size = image_size_gb(ctx.image)
        out.append(
            Row(
                "image.size",
                f"cpu image size ({ctx.image})",
                "GB",
                stat([size]),
                target=Target("ours", "<=", 2.5, "≤ 2.5 GB"),
                note="docker image inspect .Size, 1 GB = 1e9 B",
            )
        )
    except Exception as exc:
        out.append(failed_row("image.size", "cpu image size", str(exc)[:300]))
    out.append(full_build_row())
    reps = ctx.reps(2)
    ctx_dir = WORK / f"ctx-{uuid.uuid4().hex[:6]}"
    tag = f"gaudi-cluster:bench-{uuid.uuid4().hex[:6]}"
    touch = ctx_dir / "app" / ".bench-touch"
    rev = git_rev()
    changed: list[float] = []
    unchanged: list[float] = []
    try:
        copy_context(ctx_dir)
        touch.write_text("prime\n")
        log("image: priming the build cache for the bench context (untimed)")
        timed_build(ctx_dir, tag, rev)
        t_pair = time.time()
        for rep in range(reps):
            if rep and not ctx.can_start(time.time() - t_pair):
                break
            t_pair = time.time()
            touch.write_text(f"{uuid.uuid4().hex}\n")
            changed.append(timed_build(ctx_dir, tag, rev))
            unchanged.append(timed_build(ctx_dir, tag, rev))
            log(
                f"image: rebuild after an app/ change {changed[-1]:.1f}s, "
                f"nothing changed {unchanged[-1]:.1f}s "
                f"({rep + 1}/{reps})"
            )
        out.append(
            Row(
                "image.rebuild",
                "Rebuild after changing a file under app/ (vs nothing changed)",
                "s",
                stat(changed),
                stat(unchanged),
                "docker build, nothing changed",
                Target("ours", "<=", 15.0, "≤ 15 s"),
                note="classic builder; includes sending the context (wheelhouse included by .dockerignore)",
            )
        )
    except Exception as exc:
        out.append(failed_row("image.rebuild", "Rebuild after changing a file under app/", str(exc)[:800]))
    finally:
        subprocess.run(["docker", "rmi", tag], check=False, capture_output=True, timeout=300)
        shutil.rmtree(ctx_dir, ignore_errors=True)
    return out


def full_build_row() -> Row:
    try:
        record = json.loads(FULL_BUILD_RECORD.read_text())
        return Row(
            "image.full_build",
            "Full cpu image build (no cache), last recorded",
            "s",
            stat([record["seconds"]]),
            note=f"recorded {record['when']}{', ' + record['source'] if record.get('source') else ''} "
            "(not re-run by make bench)",
        )
    except (OSError, ValueError, KeyError):
        return failed_row(
            "image.full_build",
            "Full cpu image build (no cache)",
            "too slow for make bench (README: ~10 min on 2 cores); run `python -m bench.image --full`",
        )


def full_build() -> int:
    """Time a build without cache into a throwaway tag and record it (10+ minutes on 2 cores)."""
    tag = f"gaudi-cluster:bench-full-{uuid.uuid4().hex[:6]}"
    t = time.perf_counter()
    done = subprocess.run(
        ["docker", "build", "--no-cache", "-q", "-t", tag, *build_args(git_rev()), str(ROOT)],
        check=False,
        timeout=7200,
    )
    seconds = time.perf_counter() - t
    subprocess.run(["docker", "rmi", tag], check=False, capture_output=True, timeout=300)
    if done.returncode != 0:
        return done.returncode
    WORK.mkdir(parents=True, exist_ok=True)
    FULL_BUILD_RECORD.write_text(
        json.dumps({"seconds": round(seconds, 1), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
    )
    print(f"full build: {seconds:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(full_build() if "--full" in sys.argv[1:] else 0)
