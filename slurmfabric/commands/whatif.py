"""``slurmfabric whatif``: the step time of a training job against the fabric, a fault's
cost and the command that finds it. The model is slurmfabric/whatif/model.py."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from slurmfabric.commands._args import number
from slurmfabric.errors import UsageError
from slurmfabric.whatif import memory
from slurmfabric.whatif import model as whatif


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slurmfabric whatif",
        description="Step time of a data-parallel or sharded training job on 1-N nodes over "
        "InfiniBand, RoCE or TCP, and what one halved cable, one slow GPU or GPUDirect RDMA "
        "off costs (the constants and their sources: slurmfabric/whatif/model.py). "
        "--html writes the GPU Fabric Lab, one offline page over every case.")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--params", type=number(1e6, 1e13), help="parameters, e.g. 70e9")
    size.add_argument("--model", choices=sorted(whatif.MODELS),
                      help="a known model (parameters and shape, for attention FLOPs)")
    p.add_argument("--nodes", type=number(1, 100000, integer=True), default=16)
    p.add_argument("--gpus-per-node", type=number(1, 64, integer=True), default=8)
    p.add_argument("--gpu", choices=sorted(whatif.PEAK_FLOPS), default="h100")
    p.add_argument("--fabric", choices=whatif.FABRICS, default="ib")
    p.add_argument("--port-rate", type=number(1, 10000), default=400.0,
                   help="Gb/s per NIC (default 400)")
    p.add_argument("--nics", type=number(1, 64, integer=True), help="NICs per node "
                   "(default: one per GPU)")
    p.add_argument("--frontend-rate", type=number(1, 10000), default=100.0,
                   help="Gb/s of the NIC TCP runs over (default 100)")
    p.add_argument("--mfu", type=number(0.01, 1.0), default=0.4,
                   help="achieved share of the GPU's dense BF16 peak (default 0.4)")
    p.add_argument("--tokens-per-gpu", type=number(1, 1e9, integer=True), default=8192,
                   help="tokens per GPU per step (default 8192)")
    p.add_argument("--seq", type=number(1, 1e7, integer=True), default=8192)
    p.add_argument("--data-parallel", action="store_true",
                   help="all-reduce the gradients (default: sharded, FSDP/ZeRO-3)")
    p.add_argument("--overlap", type=number(0, 1), default=0.5,
                   help="share of the compute time communication can hide behind (0.5)")
    p.add_argument("--halve-cable", metavar="NODE", help="one NIC of NODE at half its rate")
    p.add_argument("--slow-gpu", metavar="NODE:GPU:FRACTION",
                   help="one GPU at a fraction of its clocks, e.g. gpu007:3:0.5")
    p.add_argument("--no-gdr", action="store_true", help="GPUDirect RDMA off")
    p.add_argument("--no-pfc", metavar="NODE", help="RoCE: NODE's switch hop without PFC")
    p.add_argument("--nodelist", metavar="HOSTLIST", help="the nodes' names, Slurm hostlist "
                   "syntax (e.g. gpu[001-016]); faults must name one of them (default: any "
                   "name numbered 0 to --nodes)")
    p.add_argument("--tp", type=number(1, 64, integer=True), default=1,
                   help="tensor parallel degree, inside a node (default 1)")
    p.add_argument("--pp", type=number(1, 1024, integer=True), default=1,
                   help="pipeline parallel stages, across nodes (default 1)")
    p.add_argument("--price-per-gpu-hour", type=number(0, 1e6, low_open=True),
                   metavar="PRICE", help="what one GPU-hour costs: prints the cost per step, "
                   "per useful PFLOP and of each fault per day")
    p.add_argument("--sweep", action="store_true",
                   help="a table over node counts (1, 2, 4 ... --nodes) and fabrics")
    p.add_argument("--svg", metavar="FILE", help="with --sweep: write the step-time plot")
    p.add_argument("--validate", action="store_true",
                   help="the model against published multi-node training runs it was not "
                   "fitted on (predicted beside published, the misses and the guide's TCP "
                   "example); needs no job options")
    p.add_argument("--json", action="store_true")
    p.add_argument("--html", metavar="FILE", help="write the GPU Fabric Lab page (self-contained, "
                   "offline) with every fabric, scale, model, GPU and fault precomputed")
    return p


def _slow_gpu(text: str | None) -> tuple[str, int, float] | None:
    if not text:
        return None
    parts = text.split(":")
    try:
        node, gpu, fraction = parts[0], int(parts[1]), float(parts[2])
    except (IndexError, ValueError):
        raise UsageError(f"--slow-gpu {text!r} is not NODE:GPU:FRACTION",
                         hint="e.g. --slow-gpu gpu007:3:0.5") from None
    if len(parts) != 3 or not node or not 0 < fraction <= 1 or not 0 <= gpu < 1024:
        raise UsageError(f"--slow-gpu {text!r}: FRACTION must be in (0, 1] and GPU a "
                         "device number", hint="e.g. --slow-gpu gpu007:3:0.5")
    return node, gpu, fraction


def job_from(args: argparse.Namespace) -> whatif.Job:
    shape = whatif.MODELS.get(args.model or "", {})
    return whatif.Job(
        params=shape.get("params") or args.params, layers=shape.get("layers"),
        hidden=shape.get("hidden"), nodes=args.nodes, gpus_per_node=args.gpus_per_node,
        fabric=args.fabric, port_rate=args.port_rate, nics=args.nics,
        frontend_rate=args.frontend_rate, gpu=args.gpu, mfu=args.mfu,
        tokens_per_gpu=args.tokens_per_gpu, seq=args.seq, sharded=not args.data_parallel,
        overlap=args.overlap,
        slow_link=(args.halve_cable, 0.5) if args.halve_cable else None,
        slow_gpu=_slow_gpu(args.slow_gpu), gdr=not args.no_gdr, no_pfc=args.no_pfc,
        tp=args.tp, pp=args.pp, nodelist=_nodelist(args.nodelist, args.nodes))


def _nodelist(text: str | None, nodes: int) -> tuple[str, ...]:
    if not text:
        return ()
    from slurmfabric.slurm.hostlist import expand

    try:
        names = tuple(expand(text))
    except ValueError as exc:
        raise UsageError(f"--nodelist {text!r}: {exc}", hint="e.g. --nodelist gpu[001-016]"
                         ) from None
    if len(names) != nodes:
        raise UsageError(f"--nodelist {text!r} names {len(names)} nodes; --nodes is {nodes}",
                         hint="give as many names as --nodes")
    return names


def cost_lines(job: whatif.Job, faults: list[dict], price: float) -> list[str]:
    money = whatif.cost(job, price)
    lines = [f"cost at {price:g} per GPU-hour: {money['per_hour']:,.2f} an hour, "
             f"{money['per_step']:,.4f} a step, {money['per_useful_pflop']:,.4f} per useful "
             f"PFLOP ({100 * money['premium']:.0f} % more than at perfect scaling, "
             f"{money['ideal_per_useful_pflop']:,.4f})"]
    for fault in faults:
        lines.append(f"cost of {fault['fault']}: {money['per_day'] * fault['lost']:,.2f} a day "
                     f"({100 * fault['lost']:.1f} % of {money['per_day']:,.2f})")
    return lines


def table(rows: list[dict]) -> str:
    lines = [f"{'fabric':>6} {'nodes':>6} {'step s':>9} {'busbw GB/s':>11} {'efficiency':>11} "
             f"{'tokens/s':>12}"]
    for row in rows:
        lines.append(f"{row['fabric']:>6} {row['nodes']:>6} {row['step_s']:>9.2f} "
                     f"{row['busbw']:>11.1f} {100 * row['efficiency']:>10.1f}% "
                     f"{row['tokens_per_s']:>12.0f}"
                     + ("" if row.get("fits", True) else "  (does not fit in GPU memory)"))
    return "\n".join(lines)


def validate(as_json: bool) -> int:
    """Print the held-out step-level table (slurmfabric/whatif/steps.py decides it)."""
    from slurmfabric.whatif import steps

    rows = steps.evaluate()
    tcp = steps.tcp_example()
    if as_json:
        print(json.dumps({"runs": rows, "tcp_example": tcp}, indent=2))
    else:
        print("\n".join(steps.text_lines(rows, tcp)))
    return 0


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.html:
        from slurmfabric.site.install import write_atomic
        from slurmfabric.whatif import lab

        write_atomic(args.html, lab.render(), 0o644)
        print(f"wrote {args.html}: open it in a browser (works offline)")
        if not (args.params or args.model):
            return 0
    if args.validate:
        if args.params or args.model:
            raise UsageError("--validate runs the model on the published runs it holds; it "
                             "takes no job", hint="slurmfabric whatif --validate [--json]")
        return validate(args.json)
    if not (args.params or args.model):
        raise UsageError("whatif needs --params or --model (or --html alone for the lab page, "
                         "or --validate)",
                         hint="e.g. slurmfabric whatif --model llama3-70b --nodes 16")
    if args.no_pfc and args.fabric != "roce":
        raise UsageError(f"--no-pfc prices a RoCE hop; --fabric is {args.fabric}",
                         hint="add --fabric roce")
    job = job_from(args)
    if args.halve_cable and job.nodes == 1:
        raise UsageError("--halve-cable needs --nodes 2 or more: one node has no cable "
                         "between nodes")
    try:
        whatif.check(job)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    too_big = memory.refusal(job)
    if too_big:
        raise UsageError(too_big, hint="the estimate is in slurmfabric/whatif/memory.py")
    result = whatif.step(job)
    faults = whatif.faults(job)
    rows = whatif.sweep_rows(job) if args.sweep else []
    if args.svg:
        if not rows:
            raise UsageError("--svg draws the --sweep table; add --sweep")
        from slurmfabric.site.install import write_atomic
        from slurmfabric.whatif import svg

        title = f"whatif: {job.params:.3g} parameters, {job.gpus_per_node} {job.gpu} per node"
        write_atomic(args.svg, svg.render(rows, title), 0o644)
    if args.json:
        fp = memory.footprint(job)
        out = {"job": {k: v for k, v in vars(job).items()}, "step": result.to_dict(),
               "efficiency": whatif.efficiency(job), "faults": faults, "sweep": rows,
               "memory_gb": {"states": fp.states_gb, "activations": fp.activations_gb,
                             "capacity": fp.capacity_gb}}
        if args.price_per_gpu_hour:
            out["cost"] = whatif.cost(job, args.price_per_gpu_hour)
            for fault in faults:
                fault["cost_per_day"] = out["cost"]["per_day"] * fault["lost"]
        print(json.dumps(out, indent=2))
        return 0
    print(whatif.step_line(job))
    for fault in faults:
        healthy = whatif.step(whatif.healthy(job))
        print(f"fault: {fault['fault']}: step {fault['step_s']:.2f} s (healthy "
              f"{healthy.seconds:.2f} s), {100 * fault['lost']:.1f} % of the throughput lost; "
              f"collectives {fault['healthy_comm_s']:.2f} -> {fault['comm_s']:.2f} s (busbw "
              f"{fault['healthy_busbw']:.0f} -> {fault['busbw']:.0f} GB/s)"
              + ("" if fault["lost"] > 0.001 else ": hidden behind the compute (--overlap)"))
        for command, line in fault["find"]:
            print(f"  find it: {command}")
            print(f"    prints: {line}")
    if args.price_per_gpu_hour:
        print("\n".join(cost_lines(job, faults, args.price_per_gpu_hour)))
    if rows:
        print(table(rows))
    if job.fabric != "tcp" and job.nodes > 1:
        tcp = whatif.step(replace(whatif.healthy(job), fabric="tcp"))
        print(f"the same job over TCP: step {tcp.seconds:.2f} s "
              f"({100 * whatif.efficiency(replace(whatif.healthy(job), fabric='tcp')):.1f} % "
              "scaling efficiency)")
    return 0
