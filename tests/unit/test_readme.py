"""Every example in README.md and docs/*.md is exercised: the commands that need no cluster
run here, as written, in bash, and what they print is compared with what the page shows; the
ones that need the Slurm testbed, ibsim or root name the test that runs them, and that test
must exist. Python and TOML blocks name the test that runs or loads them (``BLOCKS``).

A new command with neither fails ``test_every_example_of_a_page_has_a_test``; a new python,
toml or shell block that nothing covers fails ``test_every_block_of_a_page_is_covered``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import fakebw
import fakesysfs
import nodes
import pytest
import readme_examples
from cleanenv import clean_env

import slurmfabric

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
GOLDEN = ROOT / "tests" / "golden"
NCCL = ROOT / "tests" / "fixtures" / "nccl"

# Commands of the pages another suite runs for real, with the test that does.
ELSEWHERE: dict[str, str] = {
    "slurmfabric testbed up --cpus 256":
        "tests/cluster/test_import_corpus.py::test_the_docs_walkthrough_runs_as_shown",
    "slurmfabric import princeton_ddp.slurm -o job.toml --check --quiet":
        "tests/cluster/test_import_corpus.py::test_the_docs_walkthrough_runs_as_shown",
    "slurmfabric submit -c job.toml":
        "tests/cluster/test_import_corpus.py::test_the_docs_walkthrough_runs_as_shown",
    "slurmfabric testbed up":
        "tests/cluster/test_testbed.py::test_second_up_reports_running_cluster",
    'eval "$(slurmfabric testbed env)"':
        "tests/cluster/test_testbed.py::test_status_and_env_commands",
    "slurmfabric testbed status": "tests/cluster/test_testbed.py::test_status_and_env_commands",
    "slurmfabric testbed down":
        "tests/cluster/test_testbed.py::test_separate_testbed_up_and_down_leaves_no_daemon",
    "slurmfabric submit -c examples/smoke-cpu.toml --wait":
        "tests/cluster/test_launch_e2e.py::test_readme_submit_commands_run_as_written",
    "slurmfabric submit -c job.toml --test-only":
        "tests/cluster/test_launch_e2e.py::test_readme_submit_commands_run_as_written",
    'srun --ntasks-per-node=1 torchrun --nnodes "$NNODES" --nproc-per-node 8 --rdzv-backend c10d'
    ' --rdzv-id "$RDZV_ID" --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --no-python slurmfabric'
    " launch --mode torchrun -- python train.py":
        "tests/cluster/test_launch_e2e.py::test_torchrun_workers_get_their_local_ranks_binding",
    "srun slurmfabric launch -- python train.py":
        "tests/cluster/test_launch_e2e.py::test_srun_ranks_on_roce_get_the_gid_index",
    "mpirun --bind-to none slurmfabric launch --mode mpi -- ./app":
        "tests/cluster/test_launch_e2e.py::test_mpi_ranks_go_through_launch",
    "slurmfabric health resume":
        "tests/cluster/test_health_cluster.py::test_faulty_node_is_drained_job_requeued_and_resumed",
    "pdsh -w 'gpu[001-128]' slurmfabric health resume":
        "tests/cluster/test_health_cluster.py::test_faulty_node_is_drained_job_requeued_and_resumed",
    "slurmfabric pairs submit --nodes 'gpu[001-016]' --results /shared/sweep1 --partition gpu"
    " --tasks-per-node 8 --gpus-per-node 8 --mpi pmix --command"
    ' "all_reduce_perf -b 1G -e 8G -f 2 -g 1"':
        "tests/cluster/test_pairs_cluster.py::test_pair_sweep_finds_the_degraded_node",
    "slurmfabric pairs submit --nodes 'gpu[001-016]' --results /shared/burnin1 --burn-in burnin"
    " --state-dir /var/lib/slurmfabric/health":
        "tests/cluster/test_pairs_cluster.py::test_gate_drains_the_suspect_and_burn_in_resumes_only_it",
    "slurmfabric pairs submit --nodes 'gpu[001-016]' --results /shared/burnin2 --burn-in burnin"
    " --gpu-stage --health-config /etc/slurmfabric/health.toml":
        "tests/cluster/test_pairs_cluster.py::test_burn_in_gpu_stage_keeps_a_node_whose_gpus_fail",
    "slurmfabric pairs submit --nodes 'gpu[001-016]' --results /shared/rails1 --test ib_write_bw"
    " --rails mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_6,mlx5_7,mlx5_8,mlx5_9 --cuda":
        "tests/cluster/test_pairs_cluster.py::test_per_rail_rdma_sweep_names_the_one_slow_rail",
    "slurmfabric pairs submit --nodes 'gpu[001-256]' --results /shared/screen1 --pattern k-batch"
    " --batch 16 --tasks-per-node 8 --gpus-per-node 8 --mpi pmix":
        "tests/cluster/test_pairs_cluster.py::test_k_batch_screen_names_the_slow_node_from_two_rounds",
    "slurmfabric pairs report /shared/screen1":
        "tests/cluster/test_pairs_cluster.py::test_k_batch_screen_names_the_slow_node_from_two_rounds",
    "slurmfabric pairs baseline /shared/sweep1 /shared/sweep2 -o /shared/pairs-baseline.json":
        "tests/unit/test_pairsweep.py::test_baseline_from_good_sweeps_flags_a_drop_the_median_"
        "rule_misses",
    "slurmfabric pairs report /shared/sweep3 --baseline /shared/pairs-baseline.json --markdown":
        "tests/unit/test_pairsweep.py::test_baseline_from_good_sweeps_flags_a_drop_the_median_"
        "rule_misses",
    "slurmfabric pairs report /shared/burnin1 --drain --resume-passing --state-dir"
    " /var/lib/slurmfabric/health":
        "tests/cluster/test_pairs_cluster.py::test_gate_drains_the_suspect_and_burn_in_resumes_only_it",
    "slurmfabric ib audit --save /var/lib/slurmfabric/fabric.json":
        "tests/sim/test_ibaudit_sim.py::test_healthy_fabric_reports_nothing",
    "slurmfabric ib audit --baseline /var/lib/slurmfabric/fabric.json --prom"
    " /var/lib/node_exporter/fabric.prom --drain":
        "tests/sim/test_ibaudit_sim.py::test_injected_faults_are_exactly_the_findings",
    "slurmfabric jobs list": "tests/unit/test_jobs.py::test_cli_cancel_and_list_json",
    "slurmfabric roce audit --nodes 'gpu[001-128]' --results /shared/roce1 --interval 10"
    " --partition gpu":
        "tests/cluster/test_roce_cluster.py::test_the_audit_names_the_misconfigured_node_and_"
        "the_dropping_port",
    "slurmfabric roce report /shared/roce1 --health-config /etc/slurmfabric/health.toml"
    " --prom /var/lib/node_exporter/roce.prom":
        "tests/cluster/test_roce_cluster.py::test_the_audit_names_the_misconfigured_node_and_"
        "the_dropping_port",
    "slurmfabric whatif --model llama3-70b --nodes 16 --gpus-per-node 8 --fabric ib"
    " --port-rate 400 --halve-cable gpu007 --overlap 0 --sweep --svg whatif.svg":
        "tests/unit/test_whatif.py::test_the_command_prints_the_table_the_faults_and_an_svg",
    "slurmfabric whatif --model llama3-70b --nodes 16 --overlap 0 --halve-cable gpu007"
    " --price-per-gpu-hour 2.5":
        "tests/unit/test_whatif.py::test_money_per_step_per_useful_flop_and_a_fault_per_day",
    "slurmfabric whatif --params 1e9 --nodes 4 --gpus-per-node 1 --fabric tcp"
    " --frontend-rate 10 --sweep":
        "tests/unit/test_whatif.py::test_the_testbed_shape_sweeps_over_tcp",
    "slurmfabric render -c examples/h100-fsdp.toml --target pytorchjob --set"
    " kubernetes.image=nvcr.io/nvidia/pytorch:24.07-py3 --set"
    " kubernetes.rdma_resource=rdma/rdma_shared_device_a --set kubernetes.networks=rdma-net"
    " --set kubernetes.namespace=ml --set 'program.modules=[]'":
        "tests/unit/test_k8smanifest.py::test_render_target_on_the_command_line",
    "slurmfabric zipapp --configmap --namespace ml | kubectl apply -f -":
        "tests/unit/test_k8s_pods.py::test_a_stock_image_runs_the_pods_slurmfabric_from_the_"
        "configmap",
    "slurmfabric roce facts":
        "tests/unit/test_roce.py::test_a_lossless_node_matches_the_profile",
    "slurmfabric site install /etc/slurm/slurmfabric --config /etc/slurmfabric/site.toml":
        "tests/cluster/test_site_cluster.py::test_a_plain_sbatch_script_gets_the_plan_in_every_task",
    "slurmfabric jobs status 1234 [--json]":
        "tests/cluster/test_jobs_cluster.py::test_the_summary_names_the_rank_its_node_and_exit_7",
    "slurmfabric jobs logs 1234 --rank 3 --tail 50":
        "tests/cluster/test_jobs_cluster.py::test_follow_one_rank_while_the_job_runs",
    "slurmfabric jobs logs 1234 --rank 3 --follow":
        "tests/cluster/test_jobs_cluster.py::test_follow_one_rank_while_the_job_runs",
    "slurmfabric jobs wait 1234":
        "tests/cluster/test_jobs_cluster.py::test_the_summary_names_the_rank_its_node_and_exit_7",
    "slurmfabric jobs diagnose 1234 [--json]":
        "tests/unit/test_progress_diagnose.py::test_cli_runs_one_srun_step_and_prints_the_culprit",
    "slurmfabric jobs cancel 1234 [--signal USR2]":
        "tests/cluster/test_jobs_cluster.py::test_cancel_then_wait_says_cancelled",
    "slurmfabric health versions /shared/slurmfabric/versions":
        "tests/unit/test_health_versions.py::test_versions_command_prints_the_odd_nodes",
    "slurmfabric nccl-tests parse all_reduce.out --ports 8 --port-rate 400 --nodes 16"
    " --gpus-per-node 8 --svg sweep.svg --html sweep.html":
        "tests/unit/test_nccl_curve.py::test_the_command_draws_and_judges_the_curve",
    "slurmfabric ib routes --nodes 'gpu[001-128]'":
        "tests/sim/test_ibroutes_sim.py::test_programmed_detours_and_a_lopsided_leaf_are_named",
    "slurmfabric ib links --node gpu017":
        "tests/sim/test_ibaudit_sim.py::test_links_for_one_node_and_local_ibstat",
}


# Python and TOML blocks of the pages, by a string only that block of its page holds, with
# the test that runs or loads it as written.
BLOCKS: dict[tuple[str, str], str] = {
    ("docs/launch.md", "[[job.components]]"):
        "tests/unit/test_hetjob.py::test_the_docs_block_renders_what_it_says",
    ("README.md", "bash scripts/test.sh"):
        "tests/unit/test_readme.py::test_the_setup_commands_are_what_ci_runs",
    ("docs/site.md", "[cli_filter]"):
        "tests/unit/test_site.py::test_the_readme_policy_is_a_valid_site_config",
    ("docs/restart.md", "[launcher.resume]"):
        "tests/unit/test_readme.py::test_the_resume_table_is_a_valid_job_config",
    ("docs/restart.md", "ckpt = slurmfabric.Checkpoints()"):
        "tests/unit/test_readme.py::test_the_checkpoint_loop_runs_as_written",
    ("docs/progress.md", "with progress.compute():"):
        "tests/unit/test_progress_watch.py::test_the_docs_loop_runs_as_written",
    ("docs/jobs.md", "slurmfabric.submit_job(config)"):
        "tests/unit/test_readme.py::test_the_job_block_runs_as_written",
    ("docs/health.md", "budget_s = 20"):
        "tests/unit/test_readme.py::test_the_health_configs_are_valid",
    ("docs/health.md", "dcgm_levels ="):
        "tests/unit/test_readme.py::test_the_health_configs_are_valid",
    ("docs/health.md", "versions_dir ="):
        "tests/unit/test_readme.py::test_the_health_configs_are_valid",
    ("docs/health.md", "data_mounts = ["):
        "tests/unit/test_health_storage.py::test_the_docs_block_is_a_valid_site_config",
    ("docs/health.md", 'FAMILY = Family("clocks"'):
        "tests/unit/test_health_family.py::test_the_docs_show_the_smallest_family_as_it_is",
    ("docs/roce.md", "roce_profile ="):
        "tests/unit/test_roce.py::test_the_readme_profile_is_a_valid_health_config",
    ("docs/launch.md", "[program.env_prepend]"):
        "tests/unit/test_expansion.py::test_the_docs_block_renders_what_it_says",
    ("docs/import.md", "[program.params]"):
        "tests/unit/test_import.py::test_the_docs_example_is_what_import_writes",
    ("docs/launch.md", "[[steps]]"):
        "tests/unit/test_launch_code.py::test_the_docs_block_renders_what_it_says",
    ("docs/python-api.md", "slurmfabric.make_plan("):
        "tests/unit/test_readme.py::test_readme_python_api_block_runs_as_written",
    ("docs/python-api.md", "render_sbatch_header(config)"):
        "tests/unit/test_generator_api.py::test_the_docs_generator_block_runs_as_written",
    ("docs/launch.md", 'gpu_request = "gpus-per-node"'):
        "tests/unit/test_request_forms.py::test_the_docs_request_block_says_what_it_renders",
}
SHELL = ("console", "bash")  # the languages readme_examples reads commands from
CHECKED = (*SHELL, "sh", "shell", "python", "toml")  # blocks that must be covered


@dataclass
class Case:
    """How to run one command of a page here: what to set up, and what it must print."""

    check: Callable[[subprocess.CompletedProcess[str], Path], None] | None = None
    setup: Callable[[Path], None] | None = None
    env: dict[str, str] | None = None
    run: str | None = None  # the command to run, where the README elides part of it
    rc: int = 0


def _job_toml(work: Path) -> None:
    (work / "job.toml").write_text((ROOT / "examples" / "smoke-cpu.toml").read_text())


def _h100(work: Path) -> None:
    fakesysfs.build(nodes.h100_ib(), work / "h100")


def _render(work: Path, *args: str) -> str:
    return subprocess.run([str(VENV_BIN / "slurmfabric"), "render", *args], cwd=work,
                          capture_output=True, text=True, check=True, env=_env(work)).stdout


def _check_golden(proc: subprocess.CompletedProcess[str], work: Path) -> None:
    # The golden file spells the version VERSION; the CLI's re-render line names the config
    # by its absolute path, so that it works from any directory.
    golden = (GOLDEN / "h100-fsdp.sh").read_text().replace(
        "slurmfabric VERSION from", f"slurmfabric {slurmfabric.__version__} from")
    assert f"render -c {work}/examples/h100-fsdp.toml\n" in proc.stdout
    assert proc.stdout.replace(f"-c {work}/examples/", "-c examples/") == golden


def _check_rendered_file(proc: subprocess.CompletedProcess[str], work: Path) -> None:
    script = (work / "job.sbatch").read_text()
    assert "#SBATCH --nodes=4\n" in script and proc.stdout == ""
    assert script == _render(work, "-c", "job.toml", "--set", "job.nodes=4")


def _check_dry_run(proc: subprocess.CompletedProcess[str], work: Path) -> None:
    head, script = proc.stdout.split("# SCRIPT:\n", 1)
    assert head == "# backend: sbatch\n# command: sbatch --parsable < SCRIPT\n"
    assert script.rstrip("\n") == _render(work, "-c", "job.toml").rstrip("\n")
    assert not (work / "sbatch.calls").exists()  # nothing submitted


def _sbatch_then_from_script(work: Path) -> None:
    _job_toml(work)
    (work / "job.sbatch").write_text(_render(work, "-c", "job.toml", "--set", "job.nodes=4"))


def _check_from_script(proc: subprocess.CompletedProcess[str], work: Path) -> None:
    assert proc.stdout == (work / "job.sbatch").read_text()


def _check_snapshot(proc: subprocess.CompletedProcess[str], work: Path) -> None:
    with tarfile.open(work / "node.tar.gz") as tar:
        names = tar.getnames()
    assert any(name.endswith("/infiniband/mlx5_7/ports/1/state") for name in names)
    assert proc.stdout == "wrote node.tar.gz: 8 GPUs, 10 RDMA ports, 12 netdevs\n"


def _snapshot_first(work: Path) -> None:
    _h100(work)
    subprocess.run([str(VENV_BIN / "slurmfabric"), "topo", "snapshot", "-o", "node.tar.gz"],
                   cwd=work, env=_env(work, SLURMFABRIC_SYSFS_ROOT=str(work / "h100")),
                   check=True, capture_output=True)


def _check_from_snapshot(proc: subprocess.CompletedProcess[str], work: Path) -> None:
    live = subprocess.run([str(VENV_BIN / "slurmfabric"), "topo", "--json"], cwd=work,
                          env=_env(work, SLURMFABRIC_SYSFS_ROOT=str(work / "h100")),
                          capture_output=True, text=True, check=True).stdout
    offline = subprocess.run([str(VENV_BIN / "slurmfabric"), "topo", "--from", "node.tar.gz",
                              "--json"], cwd=work, env=_env(work), capture_output=True,
                             text=True, check=True).stdout
    assert json.loads(offline)["plan"] == json.loads(live)["plan"]
    assert "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_6:1" in proc.stdout


def _opt_slurmfabric(work: Path) -> None:
    """/opt/slurmfabric/bin/slurmfabric: a working install (install-hooks runs it)."""
    target = work / "opt-slurmfabric" / "bin"
    target.mkdir(parents=True)
    (target / "slurmfabric").symlink_to(Path(sys.executable).parent / "slurmfabric")


def _check_hooks(proc: subprocess.CompletedProcess[str], work: Path) -> None:
    for script, hook in (("prolog", "prolog"), ("epilog", "epilog"),
                         ("healthcheck", "periodic")):
        path = work / "etc-slurm-hooks" / f"slurmfabric-{script}"
        text = path.read_text()
        assert os.access(path, os.X_OK)
        assert f"SLURMFABRIC_BIN={work}/opt-slurmfabric/bin/slurmfabric\n" in text
        assert "SLURMFABRIC_HEALTH_CONFIG=/etc/slurmfabric/health.toml\n" in text
        assert f"\nhook={hook}\n" in text and '"$SLURMFABRIC_BIN" health "$hook"' in text
        subprocess.run(["sh", "-n", str(path)], check=True)


def _fake_scontrol(work: Path) -> None:
    (work / "health.toml").write_text('[[nodes]]\nmatch = "*"\ngpus = 8\n')


def _check_health_check(proc: subprocess.CompletedProcess[str], work: Path) -> None:
    lines = proc.stdout.splitlines()
    assert lines[1].split() == ["CHECK", "STATUS", "REASON"]
    assert any(line.split()[:2] == ["gpu.count", "ERROR"] for line in lines[2:])
    assert not (work / "scontrol.calls").exists()  # a failing check here never drains


def _check_gdr_fallback(proc: subprocess.CompletedProcess[str], work: Path) -> None:
    assert "ERROR [socket_fallback]" in proc.stdout and proc.stdout.rstrip().endswith("FAIL")


def _nccl_log(work: Path) -> None:
    # sockets between nodes (a one-rank log is not judged on the network: issue 46)
    (work / "slurm-1234.out").write_text((NCCL / "nccl-no-device-multinode.log").read_text())


def _switch_outputs(work: Path) -> None:
    """Real public switch outputs saved under the switches' names (fixtures SOURCES.md)."""
    switch = ROOT / "tests" / "fixtures" / "switch"
    shutil.copy(switch / "cumulus_nv_show_interface_swp16_qos_roce_status.txt",
                work / "leaf1.txt")
    shutil.copy(switch / "sonic_config_db_qos_azure.json", work / "sonic1.json")


def _allreduce(work: Path) -> None:
    (work / "allreduce.txt").write_text(
        (NCCL / "nccl-tests-allreduce-2node-h100.txt").read_text())
    _h100(work)


def _check_busbw(proc: subprocess.CompletedProcess[str], work: Path) -> None:
    first = proc.stdout.splitlines()[0]
    assert first == "fabric: 8 ports, 400 GB/s line rate -> expected busbw 346-384 GB/s on " \
        "large messages"
    assert "  result: OK" in proc.stdout.splitlines()


def _check_discover(proc: subprocess.CompletedProcess[str], work: Path) -> None:
    _check_busbw(proc, work)  # the 8 rails of this node (its 2 storage NICs left out)
    assert "mlx5_4" not in proc.stdout + proc.stderr


def _sweep(work: Path) -> None:
    fakebw.sweep_results(work / "shared" / "sweep1", ["sfn1", "sfn2", "sfn3", "sfn4"],
                         {"sfn3": 180.0})


def _check_svg(proc: subprocess.CompletedProcess[str], work: Path) -> None:
    assert "every pair with sfn3 is at 50 %" in proc.stdout
    assert "<svg " in (work / "sweep1.svg").read_text()


def _titan_script(work: Path) -> None:
    shutil.copy(ROOT / "tests" / "fixtures" / "scripts" / "torchtitan_multinode.slurm",
                work / "multinode_trainer.slurm")


def _check_imported(proc: subprocess.CompletedProcess[str], work: Path) -> None:
    written = (work / "job.toml").read_text().split("\n", 2)[2]  # after the two comments
    assert written == readme_examples.block_with("[program.params]", "docs/import.md", "toml")


BATCH_SHELL = {"SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "gpu[001-004]",
               "SLURM_JOB_NUM_NODES": "4", "SLURM_NNODES": "4", "SLURM_CLUSTER_NAME": "clu"}
TORCHRUN_WORKER = {"TORCHELASTIC_RUN_ID": "slurm-77", "RANK": "13", "LOCAL_RANK": "5",
                   "LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "16", "GROUP_RANK": "1",
                   "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "10.1.0.2", "MASTER_PORT": "29500",
                   "SLURMFABRIC_FABRIC_TYPE": "ib", "SLURMFABRIC_SYSFS_ROOT": "{work}/h100"}
SRUN_TASK = {**BATCH_SHELL, "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "gpu[001-004]",
             "SLURM_STEP_NUM_NODES": "4", "SLURM_STEP_NUM_TASKS": "32",
             "SLURM_STEP_TASKS_PER_NODE": "8(x4)", "SLURM_PROCID": "9", "SLURM_LOCALID": "1",
             "SLURM_NODEID": "1", "SLURMD_NODENAME": "gpu002", "SLURMFABRIC_FABRIC_TYPE": "ib",
             "SLURMFABRIC_SYSFS_ROOT": "{work}/h100"}

CASES: dict[str, Case] = {
    "slurmfabric render -c examples/h100-fsdp.toml": Case(_check_golden),
    "slurmfabric render -c job.toml --set job.nodes=4 -o job.sbatch":
        Case(_check_rendered_file, _job_toml),
    "slurmfabric submit -c job.toml --dry-run": Case(_check_dry_run, _job_toml),
    "slurmfabric render --from-script job.sbatch":
        Case(_check_from_script, _sbatch_then_from_script),
    "slurmfabric render --set job.nodes=-1 --set job.time=forever --set job.nodez=2": Case(rc=2),
    'eval "$(slurmfabric env)"': Case(
        env=BATCH_SHELL,
        run='eval "$(slurmfabric env)"; echo "$MASTER_ADDR $NNODES $RDZV_ID ${MASTER_PORT:0:1}"',
        check=lambda proc, work: proc.stdout == "gpu001 4 clu-1234 2\n"),
    "srun slurmfabric launch --print -- python train.py": Case(
        setup=_h100, env=SRUN_TASK, run="slurmfabric launch --print -- python train.py",
        check=lambda proc, work: {"export RANK=9\n", "export LOCAL_RANK=1\n",
                                  "export SLURMFABRIC_NIC=mlx5_1:1\n",
                                  "exec python train.py\n"} <= set(proc.stdout.splitlines(True))),
    "env TORCHELASTIC_RUN_ID=slurm-77 RANK=13 LOCAL_RANK=5 LOCAL_WORLD_SIZE=8 ... slurmfabric"
    " launch --mode torchrun --print -- python -m train": Case(
        setup=_h100, env=TORCHRUN_WORKER,
        run="slurmfabric launch --mode torchrun --print -- python -m train"),
    "slurmfabric hostlist expand 'n[098-101]'": Case(),
    "slurmfabric hostlist compress n3 n2 n1 n1": Case(),
    "slurmfabric hostlist count 'rack[01-100]-node[0001-1000]'": Case(),
    "slurmfabric hostlist index 'gpu[01-16]' gpu07": Case(),
    "slurmfabric topo --sysfs-root /tmp/h100 --master-addr 10.1.0.2": Case(setup=_h100),
    "slurmfabric topo snapshot -o node.tar.gz": Case(_check_snapshot, _h100,
                                                     env={"SLURMFABRIC_SYSFS_ROOT": "{work}/h100"}),
    "slurmfabric topo --from node.tar.gz": Case(_check_from_snapshot, _snapshot_first),
    "slurmfabric health install-hooks /etc/slurm/hooks --bin /opt/slurmfabric/bin/slurmfabric"
    " --config /etc/slurmfabric/health.toml": Case(_check_hooks, _opt_slurmfabric),
    "slurmfabric health check": Case(_check_health_check, _fake_scontrol, rc=1,
                                     env={"SLURMFABRIC_HEALTH_CONFIG": "health.toml"}),
    "slurmfabric nccl-log slurm-1234.out --expect-gdr": Case(_check_gdr_fallback, _nccl_log, rc=1),
    "slurmfabric nccl-tests parse allreduce.txt --ports 8 --port-rate 400":
        Case(_check_busbw, _allreduce),
    "slurmfabric nccl-tests parse allreduce.txt --discover":
        Case(_check_discover, _allreduce, env={"SLURMFABRIC_SYSFS_ROOT": "{work}/h100"}),
    "slurmfabric pairs report /shared/sweep1 --svg sweep1.svg": Case(_check_svg, _sweep, rc=1),
    "slurmfabric pairs report /shared/sweep1": Case(setup=_sweep, rc=1),
    "slurmfabric roce audit --switch leaf1.txt --switch sonic1.json --priority 3 --dscp 26":
        Case(setup=_switch_outputs, rc=1),
    "slurmfabric import multinode_trainer.slurm -o job.toml": Case(_check_imported,
                                                                   _titan_script),
}

# Absolute paths in the pages' commands, and where each lands in the test's work directory.
PATHS = {"/tmp/h100": "h100", "/etc/slurm/hooks": "etc-slurm-hooks", "/shared/": "shared/",
         "/opt/slurmfabric/": "opt-slurmfabric/"}


def _env(work: Path, **extra: str) -> dict[str, str]:
    """A clean environment: no SLURM_*/SLURMFABRIC_* from the developer's shell; recording
    stand-ins for sbatch and scontrol first on PATH, so nothing here reaches a real Slurm."""
    bin_dir = work / "bin"
    if not bin_dir.is_dir():
        bin_dir.mkdir(parents=True)
        for tool in ("sbatch", "scontrol"):
            stub = bin_dir / tool
            stub.write_text(f'#!/bin/sh\necho "$@" >> "{work}/{tool}.calls"\nexit 1\n')
            stub.chmod(0o755)
    return clean_env(**{"PATH": f"{bin_dir}:{VENV_BIN}:/usr/bin:/bin", "HOME": str(work),
                        "LANG": "C.UTF-8", "SLURMFABRIC_SITE_DEFAULTS": "",
                        "SLURMFABRIC_PORT_DIR": str(work / "ports"), **extra})


PAGES = readme_examples.pages()


def _shown() -> dict[tuple[str, str], readme_examples.Example]:
    """Every page's commands, by (page, command)."""
    return {(example.page, example.command): example
            for example in readme_examples.all_examples()}


def test_the_pages_are_found() -> None:
    assert PAGES[0] == "README.md" and "docs/launch.md" in PAGES and len(PAGES) > 10


@pytest.mark.parametrize("page", PAGES)
def test_every_example_of_a_page_has_a_test(page: str) -> None:
    shown = {command for where, command in _shown() if where == page}
    missing = sorted(shown - set(CASES) - set(ELSEWHERE))
    assert not missing, f"{page}: commands with no test: {missing}"


def test_every_test_names_a_command_a_page_shows() -> None:
    shown = {command for _page, command in _shown()}
    stale = sorted((set(CASES) | set(ELSEWHERE)) - shown)
    assert not stale, f"tests for commands no page shows any more: {stale}"
    assert not set(CASES) & set(ELSEWHERE)


@pytest.mark.parametrize("page", PAGES)
def test_every_block_of_a_page_is_covered(page: str) -> None:
    """A console or bash block is covered by its commands (each one a CASES or ELSEWHERE
    entry, see above); a python or toml block by a BLOCKS entry; sh and shell blocks must be
    written as console or bash, whose commands are read."""
    text = (ROOT / page).read_text()
    commands = {example.line for example in readme_examples.examples(page=page)}
    problems = []
    for start, lang, lines in readme_examples.blocks(text):
        body = "\n".join(lines)
        named = [key for key in BLOCKS if key[0] == page and key[1] in body]
        if lang in ("sh", "shell"):
            problems.append(f"line {start}: a {lang} block (write console or bash)")
        elif lang in SHELL and not named and not commands & set(range(start, start + len(lines))):
            problems.append(f"line {start}: a {lang} block with no slurmfabric command")
        elif lang in ("python", "toml") and not named:
            problems.append(f"line {start}: a {lang} block that no BLOCKS entry names")
    assert not problems, f"{page}: blocks no test covers: {problems}"


def test_every_block_entry_names_one_block_of_its_page() -> None:
    for (page, needle), test in BLOCKS.items():
        assert readme_examples.block_with(needle, page), (page, needle)
        path, name = test.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(), test


@pytest.mark.parametrize("command", sorted(set(ELSEWHERE.values())))
def test_the_tests_named_for_cluster_examples_exist(command: str) -> None:
    path, name = command.split("::")
    assert f"def {name}(" in (ROOT / path).read_text(), command


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_of_a_page_resolves(page: str) -> None:
    text = (ROOT / page).read_text()
    fenced = {n for start, _lang, lines in readme_examples.blocks(text)
              for n in range(start, start + len(lines))}
    broken = []
    for number, line in enumerate(text.splitlines(), 1):
        if number in fenced:
            continue
        for target in _LINK.findall(line):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor of the same page
            if not ((ROOT / page).parent / target.split("#")[0]).exists():
                broken.append(f"line {number}: {target}")
    assert not broken, f"{page}: links to no file: {broken}"


def test_the_readme_stays_a_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 300, "README.md: move the detail to a docs/ page"
    linked = set(_LINK.findall(text))
    assert {f"docs/{page.removeprefix('docs/')}" for page in PAGES[1:]} <= linked, \
        "every docs page is linked from README.md"


def test_the_setup_commands_are_what_ci_runs() -> None:
    """The set-up section shows exactly the demo and the test command; CI runs the latter."""
    block = readme_examples.block_after("## Set up on a fresh Debian machine")
    commands = [re.sub(r"\s{2,}#.*$", "", line) for line in block]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert "\nbash scripts/test.sh\n" in (ROOT / ".ci" / "run").read_text()
    assert all((ROOT / command.split()[1]).is_file() for command in commands)


def _case_ids() -> list[tuple[str, str]]:
    return [key for key in _shown() if key[1] in CASES]


@pytest.mark.parametrize(("page", "command"), _case_ids())
def test_example_runs_and_prints_what_the_page_shows(page: str, command: str,
                                                     tmp_path: Path) -> None:
    case, example = CASES[command], _shown()[(page, command)]
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(ROOT / "examples", work / "examples")
    if case.setup:
        case.setup(work)
    text = case.run or command
    for absolute, local in PATHS.items():
        text = text.replace(absolute, str(work / local) + ("/" if local.endswith("/") else ""))
    env = _env(work, **{key: value.format(work=work) for key, value in (case.env or {}).items()})
    proc = subprocess.run(["bash", "-c", text], cwd=work, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == case.rc, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    if example.output:
        printed = (proc.stdout + proc.stderr).replace(str(work / "h100"), "/tmp/h100")
        problem = readme_examples.mismatch(example.output, printed.splitlines())
        assert problem is None, f"{page} line {example.line}: {problem}"
    if case.check:
        case.check(proc, work)


def test_readme_python_api_block_runs_as_written(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The 'Python API' block, executed: job.toml is smoke-cpu.toml, discovery reads the H100
    fixture, a recording sbatch on PATH answers ``4242;clu``, and the task is srun rank 9."""
    code = "\n".join(readme_examples.block_after("# Python API", page="docs/python-api.md"))
    work = tmp_path / "work"
    work.mkdir()
    _job_toml(work)
    _h100(work)
    (work / "bin").mkdir()
    (work / "bin" / "sbatch").write_text(
        f'#!/bin/sh\necho "$@" > "{work}/sbatch.args"\ncat > "{work}/sbatch.stdin"\n'
        'echo "4242;clu"\n')
    (work / "bin" / "sbatch").chmod(0o755)
    for name in [n for n in os.environ if n.startswith(("SLURM", "TORCHELASTIC", "OMPI_"))
                 and n != "SLURMFABRIC_PLAN_CACHE"]:  # the session's scratch plan cache
        monkeypatch.delenv(name)
    for name, value in {**SRUN_TASK, "SLURMFABRIC_SYSFS_ROOT": str(work / "h100"),
                        "SLURMFABRIC_SITE_DEFAULTS": "",
                        "PATH": f"{work / 'bin'}:{os.environ['PATH']}"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(work)
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/python-api.md", "exec"), namespace)  # noqa: S102

    assert namespace["script"].startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=4\n" in namespace["script"]
    assert (work / "sbatch.stdin").read_text() == namespace["script"]
    assert (work / "sbatch.args").read_text() == "--parsable\n"
    assert (namespace["job"].job_id, namespace["job"].cluster) == ("4242", "clu")
    assert namespace["launch"] in namespace["script"]
    plan, task = namespace["plan"], namespace["task"]
    assert plan.nccl_env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_6:1," \
        "mlx5_7:1,mlx5_8:1,mlx5_9:1"
    assert plan.bindings[0].nic == "mlx5_0:1"
    assert task.variables["RANK"] == "9" and task.variables["LOCAL_RANK"] == "1"
    assert task.binding.nic == "mlx5_1:1"


@pytest.mark.parametrize(("shown", "printed", "same"), [
    (["a", "...", "d"], ["a", "b", "c", "d"], True),
    (["a", "...", "d"], ["a", "d"], True),
    (["a", "d"], ["a", "b", "d"], False),  # a gap the README does not mark
    (["a", "b"], ["b", "a"], False),
    (["a"], ["a", "extra"], False),  # output the README does not show
    (["x ... z", "..."], ["x middle z", "tail"], True),
    (["x...z"], ["y middle z"], False),
])
def test_output_matching_marks_every_gap(shown: list[str], printed: list[str],
                                         same: bool) -> None:
    assert (readme_examples.mismatch(shown, printed) is None) is same


def test_examples_join_continuations_and_drop_prose_comments() -> None:
    text = ("```console\n$ slurmfabric a \\\n    --b 'c  d'   # why\nout 1\n$ other\n```\n"
            "```bash\nsrun slurmfabric x  # note\n# slurmfabric comment only\n```\n")
    found = readme_examples.examples(text)
    assert [(e.line, e.command, e.output) for e in found] == [
        (2, "slurmfabric a --b 'c  d'", ["out 1"]), (8, "srun slurmfabric x", [])]


def test_the_health_configs_are_valid(tmp_path: Path) -> None:
    """docs/health.md's health.toml, DCGM and version blocks, each loaded as the site config
    of a node they match."""
    from slurmfabric.health import siteconfig

    loaded = {}
    for needle in ("budget_s = 20", "dcgm_levels =", "versions_dir ="):
        path = tmp_path / "health.toml"
        path.write_text(readme_examples.block_with(needle, "docs/health.md", "toml"))
        loaded[needle] = siteconfig.load("gpu007", str(path))
    base = loaded["budget_s = 20"]
    assert base.runner["budget_s"] == 20 and base.expect["rdma_ports"] == 8
    assert base.expect["disks"] == {"/tmp": 20} and base.policy("gpu.temperature").severity \
        == "warn"
    assert loaded["dcgm_levels ="].expect["dcgm_levels"]["burnin"] == 3
    versions = loaded["versions_dir ="].expect
    assert versions["versions"]["hca_fw"] == ["28.39.1002", "22.39.1002"]
    assert versions["versions_dir"] == "/shared/slurmfabric/versions"


def test_the_resume_table_is_a_valid_job_config(tmp_path: Path) -> None:
    """docs/restart.md's [launcher.resume], added to the smoke job, loads and renders."""
    block = readme_examples.block_with("[launcher.resume]", "docs/restart.md", "toml")
    job = tmp_path / "job.toml"
    job.write_text((ROOT / "examples" / "smoke-cpu.toml").read_text() + "\n" + block)
    config = slurmfabric.load_config(str(job))
    resume = config.launcher.resume
    assert (resume.max_restarts, resume.signal, resume.mode, resume.keep) == (
        3, "USR2", "requeue", 2)
    assert "#SBATCH --signal=B:USR2@120\n" in slurmfabric.render_sbatch(config)


class _Torch:
    @staticmethod
    def save(state: object, path: str) -> None:
        Path(path).write_text(json.dumps(state))


def test_the_checkpoint_loop_runs_as_written(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/restart.md's Checkpoints block, executed in a fresh checkpoint directory: it
    starts at step 0 and saves it (step % 100 == 0)."""
    code = readme_examples.block_with("ckpt = slurmfabric.Checkpoints()", "docs/restart.md",
                                      "python")
    monkeypatch.setenv("SLURMFABRIC_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    for name in ("SLURMFABRIC_SAVE_REQUEST", "SLURMFABRIC_CHECKPOINT_KEEP"):
        monkeypatch.delenv(name, raising=False)
    namespace: dict[str, object] = {"torch": _Torch, "state": {"w": 1}}
    exec(compile(code, "docs/restart.md", "exec"), namespace)  # noqa: S102
    saved = tmp_path / "ckpt" / "step-000000000" / "model.pt"
    assert json.loads(saved.read_text()) == {"w": 1}
    assert namespace["ckpt"].latest() == (0, str(saved.parent))


def test_the_job_block_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/jobs.md's Python block against recording sbatch/scontrol/scancel: the smoke job
    with one file per rank, which Slurm reports FAILED with rank 3 exit 7."""
    code = readme_examples.block_with("slurmfabric.submit_job(config)", "docs/jobs.md", "python")
    work, bin_dir = tmp_path / "work", tmp_path / "bin"
    work.mkdir()
    bin_dir.mkdir()
    (work / "out").write_text("srun: error: sfn2: task 3: Exited with exit code 7\n")
    (work / "smoke-cpu-4242-3.out").write_text("rank 3 up on sfn2\nrank 3 gives up\n")
    show = (f"JobId=4242 JobName=smoke-cpu JobState=FAILED Reason=NonZeroExitCode "
            f"NodeList=sfn[1-2] ExitCode=7:0 RunTime=00:00:02 StdOut={work}/out")
    stub = (f'#!/bin/sh\necho "$(basename "$0") $*" >> "{tmp_path}/calls"\n'
            'case "$(basename "$0") $*" in\n'
            '  sbatch*) cat > /dev/null; echo 4242 ;;\n'
            f'  "scontrol show -o job 4242") echo "{show}" ;;\n'
            "esac\n")
    for tool in ("sbatch", "scontrol", "scancel"):
        (bin_dir / tool).write_text(stub)
        (bin_dir / tool).chmod(0o755)
    for name in [n for n in os.environ if n.startswith(("SLURM", "TORCHELASTIC", "OMPI_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURMFABRIC_JOBS_DIR", str(tmp_path / "records"))
    monkeypatch.setenv("SLURMFABRIC_SITE_DEFAULTS", "")
    monkeypatch.chdir(work)
    config = slurmfabric.load_config(str(ROOT / "examples" / "smoke-cpu.toml"),
                                     sets=["launcher.task_output=%x-%j-%t.out"])
    namespace: dict[str, object] = {"slurmfabric": slurmfabric, "config": config}
    exec(compile(code, "docs/jobs.md", "exec"), namespace)  # noqa: S102
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0].startswith("sbatch") and "scancel 4242" in calls
    submitted = slurmfabric.Job("4242")
    assert submitted.logs(rank=3, tail=50) == "rank 3 up on sfn2\nrank 3 gives up\n"
    assert submitted.summary().to_dict()["first"]["rank"] == 3
    assert (namespace["job"].job_id, namespace["job"].cluster) == ("1234", "c1")
