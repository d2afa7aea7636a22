"""The step model against published training runs it was not fitted on (``steps.json``).

A run's throughput depends on how fast its kernels run, which the model takes as an input
(``Job.mfu``) and cannot predict. So each family of runs (one paper's table, one model and
framework) names an anchor run: its published figure sets the family's kernel efficiency,
and the model predicts every other run of the family from that alone. What is then tested
is the rest of the model: the collectives and their overlap, tensor- and pipeline-parallel
traffic, the pipeline bubble, the share of the batch each GPU gets. A row whose miss the
docs admit says why the model cannot know (``why``); the test holds every row to the side
of its tolerance the file claims, so a changed model cannot quietly move a row.

``evaluate`` takes the step function as a parameter so a test can show that a model without
one of its terms (the bubble, say) fails the band the real one meets.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Callable

from slurmfabric.whatif import model as whatif

DATA = Path(__file__).with_name("steps.json")
GPUS_PER_NODE = 8
# Narayanan et al. 2021 (arXiv:2104.04473), equation 3: the vocabulary of every GPT run
MEGATRON_VOCAB = 51200

StepFn = Callable[[whatif.Job], whatif.Step]


def load() -> dict:
    return json.loads(DATA.read_text())


def job_of(spec: dict, gpus: int | None = None) -> whatif.Job:
    """A model Job from a run's ``job`` table: ``gpus`` on nodes of 8, ``batch`` sequences of
    ``seq`` tokens spread over them; ``model`` names a known shape."""
    spec = dict(spec)
    shape = whatif.MODELS.get(spec.pop("model", ""), {})
    batch = spec.pop("batch", None)
    if gpus is not None:
        spec["nodes"] = gpus // GPUS_PER_NODE
        if batch is not None:
            spec["tokens_per_gpu"] = int(batch * spec.get("seq", 8192) // gpus)
    return whatif.Job(**{**shape, **spec})


def flops_per_token(job: whatif.Job, counting: str) -> float:
    """FLOPs per token as the source counts them: ``model`` (6N + attention, the MFU count)
    or ``megatron`` (equation 3 of arXiv:2104.04473, with recomputation and the logits)."""
    if counting == "model":
        return whatif.flops_per_token(job)
    if counting == "megatron":
        layers, h, s = job.layers, job.hidden, job.seq
        return 96 * layers * h * h * (1 + s / (6 * h) + MEGATRON_VOCAB / (16 * layers * h))
    raise ValueError(f"unknown FLOP count {counting!r}")


def achieved(job: whatif.Job, counting: str, step: StepFn = whatif.step) -> float:
    """TFLOP/s per GPU the model gives the job, in the source's count."""
    return job.tokens_per_gpu / step(job).seconds * flops_per_token(job, counting) / 1e12


def kernel_efficiency(job: whatif.Job, counting: str, published: float,
                      step: StepFn = whatif.step) -> float:
    """The ``mfu`` at which the model's job reaches ``published``: achieved throughput only
    grows with it, so a bisection finds it."""
    low, high = 1e-3, 1.0
    if achieved(replace(job, mfu=high), counting, step) < published:
        raise ValueError(f"{published} TFLOP/s is beyond the model at the GPU's peak")
    for _ in range(60):
        mid = (low + high) / 2
        if achieved(replace(job, mfu=mid), counting, step) < published:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def evaluate(data: dict | None = None, step: StepFn = whatif.step) -> list[dict]:
    """Every run with the model's figure, its signed error and whether it lands where the
    file says (anchors: the kernel efficiency they set)."""
    data = data or load()
    runs = data["runs"]
    efficiency = {}
    for run in runs:
        if run.get("anchor"):
            efficiency[run["family"]] = kernel_efficiency(
                job_of(run["job"], run["gpus"]), run["flops"], run["published"], step)
    rows = []
    for run in runs:
        job = replace(job_of(run["job"], run["gpus"]), mfu=efficiency[run["family"]])
        model = achieved(job, run["flops"], step)
        error = (model - run["published"]) / run["published"]
        within = None if run.get("anchor") else abs(error) <= run["tolerance"]
        rows.append({**run, "family_info": data["families"][run["family"]], "model": model,
                     "error": error, "within": within, "mfu": job.mfu,
                     "as_claimed": run.get("anchor") or within == (run["expect"] == "within")})
    return rows


def tcp_example(data: dict | None = None) -> dict:
    """The guide's TCP job at the model's defaults, and at the compute its own two numbers
    imply (3 % of 70 s: a 2.1 s healthy step; the guide gives no batch)."""
    claim = (data or load())["tcp_example"]
    job = job_of(claim["job"])
    at_defaults = whatif.step(job)
    implied = claim["step_s"] * claim["efficiency"]
    tokens = round(job.tokens_per_gpu * implied / at_defaults.compute)
    guide_job = replace(job, tokens_per_gpu=tokens)
    at_guide = whatif.step(guide_job)
    return {"claim": claim, "defaults": {"step_s": at_defaults.seconds,
                                         "efficiency": whatif.efficiency(job),
                                         "comm_s": at_defaults.comm,
                                         "busbw": at_defaults.busbw,
                                         "tokens_per_gpu": job.tokens_per_gpu},
            "implied_compute_s": implied,
            "at_guide_compute": {"step_s": at_guide.seconds,
                                 "efficiency": whatif.efficiency(guide_job),
                                 "comm_s": at_guide.comm, "tokens_per_gpu": tokens},
            # the busbw at which the model's collectives would fill the guide's step
            "busbw_for_claim": at_guide.busbw * at_guide.comm / (claim["step_s"] - implied)}


def label(row: dict) -> str:
    if row.get("anchor"):
        return f"anchor (kernel efficiency {100 * row['mfu']:.1f} %)"
    word = "within" if row["within"] else "MISS"
    return f"{word} {100 * row['tolerance']:.0f} %"


def summary(rows: list[dict]) -> tuple[int, int, int]:
    """(held-out rows, within their tolerance, misses)."""
    held = [r for r in rows if not r.get("anchor")]
    inside = sum(1 for r in held if r["within"])
    return len(held), inside, len(held) - inside


def markdown(rows: list[dict], tcp: dict) -> str:
    """The docs' table (docs/whatif.md, regenerated by a test), then the TCP example."""
    held, inside, misses = summary(rows)
    lines = [f"{held} held-out runs: {inside} within their tolerance, {misses} missed "
             "(each miss with its cause).", "",
             "| id | run | GPUs | published | model | error | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['id']} | {r['family']} | {r['gpus']} | {r['published']:g} | "
                     f"{r['model']:.1f} | {100 * r['error']:+.1f} % | {label(r)} |")
    lines += ["", "Why the misses miss:", ""]
    lines += [f"- {r['id']}: {r['why']}." for r in rows if r.get("why")]
    lines += ["", "The runs (TFLOP/s per GPU; `megatron` FLOPs count recomputation, `model` "
              "is the MFU count):", ""]
    families: dict[str, dict] = {}
    for r in rows:
        families.setdefault(r["family"], r["family_info"])
    lines += [f"- {name}: {f['setup']}. Source: {f['source']}." for name, f in families.items()]
    lines += ["", tcp_text(tcp)]
    return "\n".join(lines) + "\n"


def tcp_text(tcp: dict) -> str:
    d, g = tcp["defaults"], tcp["at_guide_compute"]
    return (f"The guide's TCP example ({tcp['claim']['claim']}; {tcp['claim']['source']}): "
            f"at the model's defaults ({d['tokens_per_gpu']} tokens per GPU) the step is "
            f"{d['step_s']:.1f} s at {100 * d['efficiency']:.1f} % efficiency, with "
            f"{d['comm_s']:.1f} s of collectives at {d['busbw']:.1f} GB/s. The guide's two "
            f"numbers imply {tcp['implied_compute_s']:.1f} s of compute per step (about "
            f"{g['tokens_per_gpu']} tokens per GPU); there the model gives {g['step_s']:.1f} s "
            f"and {100 * g['efficiency']:.1f} %. The remaining gap is the TCP bus bandwidth: "
            f"the guide's step needs {tcp['busbw_for_claim']:.1f} GB/s, where the model takes "
            f"{d['busbw']:.1f} (NVIDIA/nccl#450: 4-6 GB/s on 100 GbE). No model defect: its "
            f"{d['step_s']:.0f} s / {100 * d['efficiency']:.1f} % carried "
            f"{d['tokens_per_gpu'] / g['tokens_per_gpu']:.1f} times the guide's compute.")


def text_lines(rows: list[dict], tcp: dict) -> list[str]:
    """``whatif --validate``: one line per run, predicted beside published, then the TCP
    example."""
    held, inside, misses = summary(rows)
    out = [f"held-out step-level figures: {held} runs, {inside} within their tolerance, "
           f"{misses} missed (why: docs/whatif.md)",
           f"{'id':<4} {'run':<14} {'GPUs':>6} {'published':>10} {'model':>8} {'error':>8}  "
           "verdict"]
    for r in rows:
        out.append(f"{r['id']:<4} {r['family']:<14} {r['gpus']:>6} {r['published']:>10g} "
                   f"{r['model']:>8.1f} {100 * r['error']:>+7.1f}%  {label(r)}")
    return out + ["", tcp_text(tcp)]
