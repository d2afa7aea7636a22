"""Slurm's request forms (issue 31, part 5): GPUs per node, per task, as a typed gres or not
requested at all; memory exactly as Slurm reads it; the common options as fields; and raw
``job.extra_sbatch`` lines checked against the modelled fields.

What Slurm accepts is taken from sbatch(1) (https://slurm.schedmd.com/sbatch.html) and from
Slurm's own parsers in src/common/proc_args.c (SchedMD/slurm@016994e8d4e5, GitHub):
str_to_mbytes() for sizes, verify_dist_type() for --distribution.
"""

from __future__ import annotations

import re

import pytest

from slurmfabric.config import load_config
from slurmfabric.config.models import slurm_mbytes
from slurmfabric.errors import ConfigError
from slurmfabric.job.options import shape
from slurmfabric.job.render import render_sbatch

SRUN = ["launcher.type=srun", 'program.command=["python", "x.py"]', "job.nodes=2"]
TORCHRUN = ['program.command=["python", "x.py"]', "job.nodes=2"]


def load(*sets: str):
    return load_config(sets=list(sets), site_defaults="")


def problems(*sets: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(*sets)
    return info.value.problems


def sbatch(config) -> list[str]:
    return [line[len("#SBATCH "):] for line in render_sbatch(config).splitlines()
            if line.startswith("#SBATCH ")]


# --- memory ------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "mbytes"), [
    ("440gb", 440 * 1024), ("440GB", 440 * 1024), ("440G", 440 * 1024), ("440g", 440 * 1024),
    ("512000", 512000), ("0", 0), ("1k", 1), ("1025K", 2), ("1Tb", 1024 * 1024),
    ("8mB", 8),
])
def test_mem_takes_every_form_slurm_reads(text: str, mbytes: int) -> None:
    assert load(*SRUN, "job.ntasks_per_node=1", f"job.mem={text}").job.mem == text
    assert slurm_mbytes(text) == mbytes  # str_to_mbytes(): K rounds up, no suffix is MB


@pytest.mark.parametrize("text", ["10GiB", "4.5G", "-1G", "G", "10 G", "10P", "10Gbb",
                                  "10b", "0x10"])
def test_mem_refuses_what_slurm_refuses_in_one_line(text: str) -> None:
    for field in ("mem", "mem_per_cpu"):
        (line,) = problems(*SRUN, "job.ntasks_per_node=1", f"job.{field}={text}")
        assert line.startswith(f"job.{field}: memory {text!r} is not a size Slurm reads")


def test_toml_integer_mem_is_megabytes(tmp_path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('[job]\nmem = 4096\nntasks_per_node = 1\n[launcher]\ntype = "srun"\n'
                    '[program]\ncommand = ["x"]\n')
    config = load_config(path, site_defaults="")
    assert "--mem=4096" in sbatch(config)


def test_memory_options_are_exclusive_as_in_sbatch() -> None:
    (line,) = problems(*SRUN, "job.gpus_per_node=8", "job.mem=400G", "job.mem_per_gpu=40G")
    assert line.startswith("job.mem_per_gpu: sbatch takes one of --mem, --mem-per-cpu")
    config = load(*SRUN, "job.gpus_per_node=8", "job.mem_per_cpu=4g")
    assert "--mem-per-cpu=4g" in sbatch(config)


# --- GPU request forms -------------------------------------------------------------------

def test_gpus_per_node_typed() -> None:
    lines = sbatch(load(*SRUN, "job.gpus_per_node=8", "job.gpu_type=h100"))
    assert "--gpus-per-node=h100:8" in lines and "--ntasks-per-node=8" in lines


def test_gres_form_typed_and_untyped() -> None:
    lines = sbatch(load(*SRUN, "job.gpus_per_node=4", "job.gpu_request=gres"))
    assert "--gres=gpu:4" in lines and not any(x.startswith("--gpus") for x in lines)
    lines = sbatch(load(*TORCHRUN, "job.gpus_per_node=8", "job.gpu_request=gres",
                        "job.gpu_type=a100_80gb"))
    assert "--gres=gpu:a100_80gb:8" in lines and "--ntasks-per-node=1" in lines


@pytest.mark.parametrize(("sets", "per_task", "tasks", "workers"), [
    # srun: one task per GPU; gpus_per_node comes from gpus_per_task x ntasks_per_node
    ([*SRUN, "job.gpus_per_task=1", "job.ntasks_per_node=8"], "1", 8, 8),
    ([*SRUN, "job.gpus_per_node=4"], "1", 4, 4),
    # torchrun: one agent per node, which gets every GPU; 8 workers
    ([*TORCHRUN, "job.gpus_per_node=8"], "8", 1, 8),
    ([*TORCHRUN, "job.gpus_per_task=8", "job.ntasks_per_node=1"], "8", 1, 8),
    # nccl-tests: one rank per gpus_per_rank GPUs
    (["launcher.type=nccl-tests", "job.gpus_per_node=8", "launcher.nccl_tests.gpus_per_rank=2"],
     "2", 4, 4),
    ([*SRUN, "job.gpus_per_node=8", "job.gpu_type=h100"], "h100:1", 8, 8),
])
def test_gpus_per_task_keeps_the_rank_count(sets, per_task, tasks, workers) -> None:
    config = load(*sets, "job.gpu_request=gpus-per-task")
    lines = sbatch(config)
    assert f"--gpus-per-task={per_task}" in lines
    assert f"--ntasks-per-node={tasks}" in lines
    assert not any(x.startswith(("--gpus-per-node", "--gres")) for x in lines)
    job_shape = shape(config)
    assert (job_shape.tasks_per_node, job_shape.workers_per_node) == (tasks, workers)
    if config.launcher.type == "torchrun":
        assert f"--nproc-per-node={workers}" in render_sbatch(config)


def test_gpus_per_task_that_disagrees_with_the_launcher_is_refused() -> None:
    (line,) = problems(*TORCHRUN, "job.gpus_per_node=8", "job.gpu_request=gpus-per-task",
                       "job.gpus_per_task=1")
    assert line == ("job.gpus_per_task: torchrun runs 1 task(s) per node on "
                    "job.gpus_per_node=8 GPUs, so each task gets 8, not 1; accepted: 8 or unset")
    (line,) = problems(*SRUN, "job.gpus_per_node=8", "job.gpus_per_task=1")
    assert line.startswith("job.gpus_per_task: only read with job.gpu_request = "
                           "'gpus-per-task'")
    assert problems(*SRUN, "job.gpu_request=gpus-per-task", "job.ntasks_per_node=2")[0] \
        .startswith("job.gpus_per_node: gpu_request = 'gpus-per-task' needs")


@pytest.mark.parametrize("sets", [[*SRUN], [*TORCHRUN]])
def test_none_requests_no_gpus_but_counts_them(sets) -> None:
    """Clusters without GPU gres: the GPUs come with the node and still set the ranks."""
    config = load(*sets, "job.gpus_per_node=8", "job.gpu_request=none")
    lines = sbatch(config)
    assert not any(re.match(r"--(gpus|gres)", x) for x in lines)
    assert shape(config).workers_per_node == 8
    script = render_sbatch(config)
    assert ("--nproc-per-node=8" in script) if config.launcher.type == "torchrun" \
        else ("--ntasks-per-node=8" in lines)


def test_gpu_fields_need_a_gpu_request() -> None:
    assert problems(*SRUN, "job.gpus_per_node=8", "job.gpu_request=none",
                    "job.gpu_type=h100")[0].startswith("job.gpu_type: 'h100' types a GPU")
    assert problems(*SRUN, "job.ntasks_per_node=2", "job.cpus_per_gpu=4")[0].startswith(
        "job.cpus_per_gpu: counts per requested GPU")
    (line,) = problems(*SRUN, "job.gpus_per_node=8", "job.cpus_per_gpu=4",
                       "job.cpus_per_task=4")
    assert line.startswith("job.cpus_per_gpu: sbatch refuses it beside --cpus-per-task")
    assert problems(*SRUN, "job.gpus_per_node=8", "job.gpu_type=h100:8")[0].startswith(
        "job.gpu_type: GPU type 'h100:8' is not a gres type name")


# --- common options as fields ------------------------------------------------------------

def test_common_options_render_as_sbatch_lines() -> None:
    config = load(*SRUN, "job.gpus_per_node=8", "job.wait_all_nodes=true",
                  "job.ntasks_per_core=1", "job.exclude=gpu[001-003]",
                  "job.nodelist=gpu[004-005]", "job.distribution=block:cyclic,Pack")
    lines = sbatch(config)
    for expected in ("--wait-all-nodes=1", "--ntasks-per-core=1", "--exclude=gpu[001-003]",
                     "--nodelist=gpu[004-005]", "--distribution=block:cyclic,Pack"):
        assert expected in lines
    assert "--wait-all-nodes=0" in sbatch(load(*SRUN, "job.ntasks_per_node=1",
                                               "job.wait_all_nodes=false"))
    assert "--hint=nomultithread" in sbatch(load(*SRUN, "job.ntasks_per_node=1",
                                                 "job.hint=nomultithread"))


@pytest.mark.parametrize("value", ["block", "cyclic", "arbitrary", "plane=4", "Block:FCyclic",
                                   "*:*:fcyclic", "cyclic,nopack", "pack", "hostfile"])
def test_distribution_forms_slurm_takes(value: str) -> None:
    assert load(*SRUN, "job.ntasks_per_node=1", f"job.distribution={value}")


@pytest.mark.parametrize("value", ["fcyclic", "plane", "plane=0", "block:block:block:block",
                                   "block,sideways", "round-robin", "arbitrary:block"])
def test_distribution_forms_slurm_refuses(value: str) -> None:
    (line,) = problems(*SRUN, "job.ntasks_per_node=1", f"job.distribution={value}")
    assert line.startswith(f"job.distribution: distribution {value!r}")


def test_hint_values_and_its_exclusion() -> None:
    assert problems(*SRUN, "job.ntasks_per_node=1", "job.hint=fast")[0].startswith(
        "job.hint: hint 'fast' is not one sbatch --hint takes")
    (line,) = problems(*SRUN, "job.ntasks_per_node=1", "job.hint=compute_bound",
                       "job.ntasks_per_core=1")
    assert line.startswith("job.hint: sbatch --hint is incompatible with --ntasks-per-core")


@pytest.mark.parametrize("field", ["exclude", "nodelist"])
def test_node_lists_are_one_sbatch_word(field: str) -> None:
    (line,) = problems(*SRUN, "job.ntasks_per_node=1", f"job.{field}=a b")
    assert line.startswith(f"job.{field}: {field} 'a b' goes into an #SBATCH line")


# --- extra_sbatch against the modelled fields ---------------------------------------------

@pytest.mark.parametrize("line", ["--nodes=4", "--nodes 4", "-N 4", "-N4", "--node=4"])
def test_extra_sbatch_that_sets_nodes_is_refused_naming_both(line: str) -> None:
    (problem,) = problems(*SRUN, "job.ntasks_per_node=1", f'job.extra_sbatch=["{line}"]')
    assert problem.startswith(f"job.extra_sbatch: {line!r}")
    assert "job.nodes = 2" in problem and "job.nodes" in problem.split("sets what")[1]


@pytest.mark.parametrize(("line", "field"), [
    ("--ntasks=16", "job.ntasks_per_node"), ("-n16", "job.ntasks_per_node"),
    ("--gpus=16", "job.gpus_per_node/job.gpu_request"), ("-G 16", "job.gpus_per_node"),
    ("--gres=gpu:8", "job.gpus_per_node"), ("--gpus-per-task=1", "job.gpus_per_task"),
    ("--mem=100G", "job.mem"), ("-p gpu", "job.partition"), ("-t 10", "job.time"),
    ("--exclusive=user", "job.exclusive"), ("--no-requeue", "job.requeue"),
    ("-x node1", "job.exclude"), ("--hint=compute_bound", "job.hint"),
    ("--wait-all-nodes=1", "job.wait_all_nodes"), ("-c 4", "job.cpus_per_task"),
])
def test_extra_sbatch_modelled_options_are_refused(line: str, field: str) -> None:
    (problem,) = problems(*SRUN, "job.gpus_per_node=8", f'job.extra_sbatch=["{line}"]')
    assert problem.startswith(f"job.extra_sbatch: {line!r}") and field in problem


@pytest.mark.parametrize("line", ["--gres=nvme:1", "--wait", "--gres-flags=enforce-binding",
                                  "--mem-bind=local", "-D /tmp", "--licenses=fs:1",
                                  "--switches=1"])
def test_extra_sbatch_unmodelled_options_pass(line: str) -> None:
    config = load(*SRUN, "job.gpus_per_node=8", f'job.extra_sbatch=["{line}"]')
    assert line in sbatch(config)


def test_a_second_gres_replaces_the_gpu_gres_so_it_is_refused() -> None:
    (problem,) = problems(*SRUN, "job.gpus_per_node=8", "job.gpu_request=gres",
                          'job.extra_sbatch=["--gres=nvme:1"]')
    assert "job.gpus_per_node/job.gpu_request" in problem


def test_signal_lines_clash_only_with_a_modelled_signal() -> None:
    assert load(*SRUN, "job.ntasks_per_node=1", 'job.extra_sbatch=["--signal=B:USR2@60"]')
    (problem,) = problems(*SRUN, "job.ntasks_per_node=1", "launcher.signal=USR2",
                          'job.extra_sbatch=["--signal=B:USR2@60"]')
    assert "launcher.signal" in problem


def test_the_docs_request_block_says_what_it_renders(tmp_path) -> None:
    """docs/launch.md's [job] example, loaded as written, renders what its comments say."""
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "launch.md").read_text()
    block = re.search(r"```toml\n(\[job\]\nnodes = 2\ngpus_per_node = 8\n.*?)```", text,
                      re.S).group(1)
    path = tmp_path / "job.toml"
    path.write_text(block + '[launcher]\ntype = "srun"\n[program]\ncommand = ["train"]\n')
    lines = sbatch(load_config(path, site_defaults=""))
    for expected in ("--gpus-per-node=h100:8", "--cpus-per-gpu=12", "--mem=440gb",
                     "--wait-all-nodes=1", "--exclude=gpu[001-002]", "--ntasks-per-node=8"):
        assert expected in lines
