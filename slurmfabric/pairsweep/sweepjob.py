"""``pairs submit``: from the options to the sweep plan its job script is rendered from.

Which pairs (given, round robin, by distance in a topology, or k-node groups), what each
pair runs (nccl-tests, or ``pairs rdma-step`` around a perftest tool), and the burn-in
additions (the GPU stage, the reservation), each checked before a job is written: a bad
combination is refused here, not found on the cluster an hour later."""

from __future__ import annotations

from pathlib import Path

from slurmfabric._common.executable import this_executable
from slurmfabric._common.textcheck import one_line, split_args
from slurmfabric.errors import UsageError
from slurmfabric.pairsweep.plan import (
    DEFAULT_COMMAND,
    SweepPlan,
    parse_pairs,
    round_robin,
    schedule_pairs,
)


def make_plan(*, nodes: list[str], results: str, judge: dict, pairs: str | None = None,
              pattern: str = "round-robin", batch: int | None = None,
              topology: str | None = None, node_map: str | None = None,
              hops: str = "2,4,6", command: str | None = None, test: str = "nccl-tests",
              rails: str | None = None, cuda: bool = False,
              perftest_args: list[str] | None = None, partition: str | None = None,
              time_limit: str | None = None, tasks_per_node: int = 1,
              gpus_per_node: int | None = None, mpi: str | None = None,
              srun_args: list[str] | None = None, sbatch_args: list[str] | None = None,
              retests: int = 2, burn_in: str | None = None, gpu_stage: bool = False,
              health_config: str | None = None) -> SweepPlan:
    """The sweep as ``pairs submit`` options describe it (their names, without dashes)."""
    if pairs:
        chosen = parse_pairs(pairs)
        unknown = sorted({n for p in chosen for n in p} - set(nodes))
        if unknown:
            raise UsageError(f"--pairs names nodes not in --nodes: {', '.join(unknown)}")
        rounds = schedule_pairs(chosen)
    elif pattern == "topology":
        from slurmfabric.pairsweep.paths import rounds_from_file

        if not topology:
            raise UsageError("--pattern topology needs --topology FILE (ibnetdiscover output)")
        rounds = rounds_from_file(topology, node_map, nodes, hops)
    elif pattern == "k-batch":
        rounds = _batch_rounds(nodes, batch, bool(pairs), test)
    else:
        rounds = round_robin(nodes)
    argv = split_args(command, "--command") if command else list(DEFAULT_COMMAND)
    if not argv or not argv[0] or argv[0].startswith("-"):
        raise UsageError(f"--command {one_line(repr(command), 120)}: no program first "
                         "(empty, or a leading '-' that the task's exec would read as an "
                         "option)", hint="give the program first, e.g. --command "
                         "'all_reduce_perf -b 1G -e 8G'")
    if test != "nccl-tests":
        argv = _rdma_command(test, rails, cuda, perftest_args or [], command, tasks_per_node)
    plan = SweepPlan(
        nodes=nodes, rounds=rounds, results=Path(results), command=argv,
        partition=partition, time_limit=time_limit, tasks_per_node=tasks_per_node,
        gpus_per_node=gpus_per_node, mpi=mpi, srun_args=list(srun_args or []),
        sbatch_args=list(sbatch_args or []), retests=0 if pattern == "k-batch" else retests,
        judge=judge, test=test, pattern=pattern,
    )
    plan.retest_cmd = [this_executable()]
    if burn_in:
        plan.sbatch_args.append(f"--reservation={burn_in}")
    if gpu_stage:
        plan.gpu_stage = [this_executable(), "health", "burn-in", "--results",
                          str(plan.results)]
        if health_config:
            plan.gpu_stage += ["--config", str(Path(health_config).resolve())]
    return plan


def _batch_rounds(nodes: list[str], batch: int | None, pairs: bool, test: str) -> list:
    from slurmfabric.pairsweep.batch import batch_rounds

    if batch is None:
        raise UsageError("--pattern k-batch needs --batch K", hint="e.g. --batch 4: groups "
                         "of 4 nodes")
    if pairs:
        raise UsageError("--pairs chooses pairs; --pattern k-batch chooses groups: give one")
    if test != "nccl-tests":
        raise UsageError(f"--test {test} runs between two nodes; --pattern k-batch "
                         "runs nccl-tests on groups", hint="use --pattern round-robin")
    return batch_rounds(nodes, batch)


def _rdma_command(test: str, rails: str | None, cuda: bool, perftest_args: list[str],
                  command: str | None, tasks_per_node: int) -> list[str]:
    from slurmfabric.pairsweep.rdmastep import step_command

    if not rails:
        raise UsageError(f"--test {test} needs --rails", hint="e.g. --rails "
                         "mlx5_0,mlx5_1,mlx5_2,mlx5_3 (the HCAs to test, in GPU order)")
    if command:
        raise UsageError(f"--command is for nccl-tests; --test {test} runs perftest",
                         hint="give perftest options with --perftest-arg")
    if tasks_per_node != 1:
        raise UsageError(f"--test {test} runs one task per node (the server and the "
                         "client), not --tasks-per-node")
    return step_command(this_executable(), test, rails, cuda, perftest_args)
