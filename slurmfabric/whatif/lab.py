"""The GPU Fabric Lab: one offline HTML page where a user breaks the fabric and sees the
step time and the commands that find each fault.

The page has no model of its own. Every combination its controls can reach is computed
here with ``model.step`` and embedded as JSON; the page's script only looks values up and
shows them, so the page and ``slurmfabric whatif --json`` cannot disagree. The page reads
and writes its state in the URL's fragment (``#fabric=ib&nodes=16&...&faults=cable``),
so a link or a test can open any case.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from slurmfabric.whatif import memory
from slurmfabric.whatif import model as whatif

NODES = [*range(1, 17), 32, 64, 128, 256, 512]
GPUS = ("h100", "h200", "a100", "b200")
FABRIC_NAMES = {"ib": "InfiniBand", "roce": "RoCE", "tcp": "TCP (sockets)", "efa": "EFA"}
# The lab's faults, in bit order, with the model field each sets and FINDERS' key.
FAULTS = ("cable", "gpu", "gdr", "pfc")
FAULT_KIND = {"cable": "slow_link", "gpu": "slow_gpu", "gdr": "no_gdr", "pfc": "no_pfc"}
FAULT_NAMES = {"cable": "one cable at half rate (node02)",
               "gpu": "one slow GPU (node01 GPU 3 at half its clocks)",
               "gdr": "GPUDirect RDMA off", "pfc": "one RoCE hop without PFC (node02)"}
CABLE_NODE, PFC_NODE, SLOW_GPU = "node02", "node02", ("node01", 3, 0.5)
# Share of the compute time the collectives can hide behind: FSDP's prefetch (the CLI's
# default) or none (every collective on the critical path).
OVERLAPS = ("0.5", "0")
# The page opens on the issue everyone asks about: one cable at half rate on 16 InfiniBand
# nodes. At FSDP's overlap it hides behind the compute, and the page says so and what it
# costs once it does not.
DEFAULT = {"fabric": "ib", "nodes": 16, "model": "llama3-70b", "gpu": "h100", "overlap": "0.5",
           "faults": "cable"}


def rails(fabric: str, gpu: str) -> tuple[float, int]:
    """(Gb/s per NIC, NICs per node): 8 x 400G (A100 nodes: 8 x 200G HDR); EFA as AWS
    builds it: 32 x 100G on H100-class nodes, 4 x 100G on A100 (p4d)."""
    if fabric == "efa":
        return (100.0, 4) if gpu == "a100" else (100.0, 32)
    return (200.0 if gpu == "a100" else 400.0), 8


def applicable(fabric: str, nodes: int) -> list[str]:
    """The faults that can happen on this fabric and node count (a cable, GDR and PFC need
    a second node; TCP has no RDMA to lose and no lossless hop; PFC is RoCE's)."""
    out = []
    for fault in FAULTS:
        if fault == "gpu" or (nodes > 1 and fabric != "tcp" and
                              (fault != "pfc" or fabric == "roce")):
            out.append(fault)
    return out


def lab_job(fabric: str, nodes: int, model: str, gpu: str, faults: tuple[str, ...] = (),
            overlap: str = "0.5") -> whatif.Job:
    """The job one setting of the page's controls stands for."""
    shape = whatif.MODELS[model]
    rate, nics = rails(fabric, gpu)
    return whatif.Job(params=shape["params"], layers=shape["layers"], hidden=shape["hidden"],
                      nodes=nodes, fabric=fabric, gpu=gpu, port_rate=rate, nics=nics,
                      overlap=float(overlap),
                      slow_link=(CABLE_NODE, 0.5) if "cable" in faults else None,
                      slow_gpu=SLOW_GPU if "gpu" in faults else None,
                      gdr="gdr" not in faults, no_pfc=PFC_NODE if "pfc" in faults else None)


def cli_args(fabric: str, nodes: int, model: str, gpu: str, faults: tuple[str, ...] = (),
             overlap: str = "0.5") -> list[str]:
    """The ``slurmfabric whatif`` arguments that price the same job."""
    rate, nics = rails(fabric, gpu)
    args = ["--model", model, "--nodes", str(nodes), "--gpu", gpu, "--fabric", fabric,
            "--port-rate", f"{rate:g}", "--nics", str(nics), "--overlap", overlap]
    flags = {"cable": ["--halve-cable", CABLE_NODE],
             "gpu": ["--slow-gpu", ":".join(map(str, SLOW_GPU))],
             "gdr": ["--no-gdr"], "pfc": ["--no-pfc", PFC_NODE]}
    return args + [a for f in FAULTS if f in faults for a in flags[f]]


def _sig(x: float) -> float:
    return float(f"{x:.6g}")


def grid() -> dict:
    """Every reachable case: key 'fabric|nodes|model|gpu|overlap|faults' (faults: applicable ones,
    in FAULTS order, joined by ','), value [step s, compute s, collectives s, exposed s,
    busbw GB/s, efficiency, lost vs healthy, limit index]."""
    cases, limits = {}, []
    for fabric, nodes, model, gpu, overlap in itertools.product(
            FABRIC_NAMES, NODES, sorted(whatif.MODELS), GPUS, OVERLAPS):
        can = applicable(fabric, nodes)
        one = whatif.step(lab_job(fabric, 1, model, gpu, (), overlap)).seconds
        base = whatif.step(lab_job(fabric, nodes, model, gpu, (), overlap)).seconds
        for mask in range(2 ** len(can)):
            on = tuple(f for i, f in enumerate(can) if mask >> i & 1)
            result = whatif.step(lab_job(fabric, nodes, model, gpu, on, overlap))
            if result.limit not in limits:
                limits.append(result.limit)
            cases["|".join([fabric, str(nodes), model, gpu, overlap, ",".join(on)])] = [
                _sig(result.seconds), _sig(result.compute), _sig(result.comm),
                _sig(result.exposed), _sig(result.busbw), _sig(one / result.seconds),
                _sig(1 - base / result.seconds), limits.index(result.limit)]
    return {"cases": cases, "limits": limits}


def too_big() -> dict[str, str]:
    """'nodes|model|gpu' -> why that job cannot start (memory.refusal), for every case that
    does not fit; the fabric, faults and overlap do not change the footprint."""
    out = {}
    for nodes, model, gpu in itertools.product(NODES, sorted(whatif.MODELS), GPUS):
        why = memory.refusal(lab_job("ib", nodes, model, gpu))
        if why:
            out[f"{nodes}|{model}|{gpu}"] = why
    return out


def finders() -> dict[str, list[tuple[str, str]]]:
    """Each lab fault's commands with the lines they print, for the lab's node names."""
    out = {}
    for fault in FAULT_KIND:
        job = lab_job("roce", 2, "llama3-8b", "h100", (fault,))
        (priced,) = whatif.faults(job)
        out[fault] = priced["find"]
    out["tcp"] = [(c, line) for c, line in whatif.FINDERS["tcp"]]
    return out


def held_out() -> dict:
    """The published figures the model was not fitted on, model beside published: the
    nccl-tests busbw points (calibration.py) and the training runs (steps.py), and the
    guide's TCP example, for the page's last section."""
    from slurmfabric.whatif import calibration, steps

    busbw = [{"id": r["id"], "what": r["what"], "published": r["published"],
              "model": _sig(r["model"]), "error": _sig(r["error"]),
              "tolerance": r["tolerance"]}
             for r in calibration.evaluate(calibration.points()) if r["set"] == "held-out"]
    rows = steps.evaluate()
    runs = [{"id": r["id"], "run": r["family"], "gpus": r["gpus"], "published": r["published"],
             "model": _sig(r["model"]), "error": _sig(r["error"]), "verdict": steps.label(r),
             "why": r.get("why", "")} for r in rows]
    return {"busbw": busbw, "steps": runs, "tcp": steps.tcp_text(steps.tcp_example())}


def page_data() -> dict:
    data = grid()
    data.update({
        "fabrics": FABRIC_NAMES, "nodes": NODES, "gpus": list(GPUS),
        "models": {m: whatif.MODELS[m]["params"] for m in sorted(whatif.MODELS)},
        "faults": {f: FAULT_NAMES[f] for f in FAULTS},
        "applicable": {f"{fabric}|{n}": applicable(fabric, n)
                       for fabric in FABRIC_NAMES for n in NODES},
        "rails": {f"{fabric}|{gpu}": list(rails(fabric, gpu))
                  for fabric in FABRIC_NAMES for gpu in GPUS},
        "finders": finders(), "default": DEFAULT, "overlaps": list(OVERLAPS),
        "too_big": too_big(), "held_out": held_out(),
        "flags": {"cable": f"--halve-cable {CABLE_NODE}",
                  "gpu": "--slow-gpu " + ":".join(map(str, SLOW_GPU)),
                  "gdr": "--no-gdr", "pfc": f"--no-pfc {PFC_NODE}"},
    })
    return data


def render() -> str:
    """The page: lab.html with the data in place of its marker. ``</`` is escaped so no
    string in the data can close the script element."""
    template = (Path(__file__).parent / "lab.html").read_text()
    payload = json.dumps(page_data(), separators=(",", ":")).replace("</", "<\\/")
    return template.replace("/*LAB_DATA*/null", payload, 1)


def case(fabric: str, nodes: int, model: str, gpu: str, faults: tuple[str, ...] = (),
         overlap: str = "0.5") -> whatif.Step:
    """The model's step for one setting (what the page shows for it)."""
    return whatif.step(lab_job(fabric, nodes, model, gpu,
                               tuple(f for f in faults if f in applicable(fabric, nodes)),
                               overlap))

