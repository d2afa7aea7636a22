"""The whatif model against published figures, fitted apart from held out.

Each point (``calibration.json`` beside this module) names the job, the collective and its
size, the published figure and whether a constant was fitted on it. This module only
evaluates: the error table in docs/whatif.md is ``markdown(evaluate(points))``, and a test
regenerates it, so the table cannot drift from the model.
"""

from __future__ import annotations

import json
from pathlib import Path

from slurmfabric.whatif import collectives
from slurmfabric.whatif import model as whatif

SETS = ("fitted", "held-out", "compute-only")
DATA = Path(__file__).with_name("calibration.json")


def points() -> list[dict]:
    """The published busbw and throughput points (shipped with the package: the Lab and
    ``whatif --validate`` show them)."""
    return json.loads(DATA.read_text())["points"]


def job_of(spec: dict) -> whatif.Job:
    """A model Job from a point's ``job`` table (``model``: a known model's shape)."""
    spec = dict(spec)
    shape = whatif.MODELS.get(spec.pop("model", ""), {"params": 1.0})
    return whatif.Job(**{**shape, **spec})


def predict(point: dict) -> float:
    """The model's value for one point: busbw at the size (GB/s), a ratio of two busbws
    (``vs``), or tokens per GPU per second (``op: step``)."""
    job = job_of(point["job"])
    if point["op"] == "step":
        return job.tokens_per_gpu / whatif.step(job).seconds
    value = collectives.busbw_at(job, point["op"], point["size"], point.get("algo"))[0]
    if "vs" in point:
        value /= collectives.busbw_at(job_of(point["vs"]), point["op"], point["size"],
                                      point.get("algo"))[0]
    return value


def evaluate(points: list[dict]) -> list[dict]:
    """Each point with the model's value and the signed relative error."""
    rows = []
    for point in points:
        model = predict(point)
        rows.append({**point, "model": model,
                     "error": (model - point["published"]) / point["published"]})
    return rows


def summary(rows: list[dict]) -> dict[str, tuple[int, float, float]]:
    """{set: (points, mean |error|, max |error|)}."""
    out = {}
    for name in SETS:
        errors = [abs(r["error"]) for r in rows if r["set"] == name]
        if errors:
            out[name] = (len(errors), sum(errors) / len(errors), max(errors))
    return out


def markdown(rows: list[dict]) -> str:
    """The docs' table: the summary by set, then every point."""
    lines = ["| set | points | mean abs error | max abs error |", "|---|---|---|---|"]
    for name, (count, mean, top) in summary(rows).items():
        lines.append(f"| {name} | {count} | {100 * mean:.1f} % | {100 * top:.1f} % |")
    lines += ["", "| id | set | measurement | published | model | error | tolerance | fits |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['id']} | {r['set']} | {r['what']} | {r['published']:g} | "
                     f"{r['model']:.4g} | {100 * r['error']:+.1f} % | "
                     f"{100 * r['tolerance']:.0f} % | {r['fits'] or '-'} |")
    return "\n".join(lines) + "\n"
