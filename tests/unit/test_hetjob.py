"""Heterogeneous jobs ([[job.components]]): config, #SBATCH header, launch step, rank env.

The environments below were recorded on the project's Slurm 22.05 testbed (two simulated
nodes sfn1, sfn2 on one host 'vm') by a het job of component 0 '-N1 --ntasks-per-node=2'
and component 1 '-N1 --ntasks-per-node=1' whose batch shell ran
``srun --het-group=0,1 CMD``; only the variables recorded are used, nothing is added.
Rules: https://slurm.schedmd.com/heterogeneous_jobs.html.
"""

from __future__ import annotations

import pytest

from slurmfabric.config.models import JobConfig
from slurmfabric.errors import ConfigError, UsageError
from slurmfabric.rank import env as rankenv

_GROUPS = {  # the *_HET_GROUP_<n> values, the same in the batch shell and in every task
    "SLURM_JOB_ID_HET_GROUP_0": "238", "SLURM_JOB_ID_HET_GROUP_1": "239",
    "SLURM_JOB_NODELIST_HET_GROUP_0": "sfn1", "SLURM_JOB_NODELIST_HET_GROUP_1": "sfn2",
    "SLURM_JOB_NUM_NODES_HET_GROUP_0": "1", "SLURM_JOB_NUM_NODES_HET_GROUP_1": "1",
    "SLURM_NTASKS_HET_GROUP_0": "2", "SLURM_NTASKS_HET_GROUP_1": "1",
    "SLURM_NTASKS_PER_NODE_HET_GROUP_0": "2", "SLURM_NTASKS_PER_NODE_HET_GROUP_1": "1",
    "SLURM_TASKS_PER_NODE_HET_GROUP_0": "2", "SLURM_TASKS_PER_NODE_HET_GROUP_1": "1",
}

BATCH = {  # the batch shell: SLURM_JOB_NODELIST/NNODES/NTASKS are component 0's only
    **_GROUPS, "SLURM_HET_SIZE": "2", "SLURM_JOB_ID": "238", "SLURM_JOB_NODELIST": "sfn1",
    "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_NODELIST": "sfn1",
    "SLURM_NTASKS": "2",
}


def het_task(procid: int, localid: int, nodeid: int) -> dict[str, str]:
    """One task of step 238.0 as recorded (SLURM_HET_JOB_OFFSET was empty)."""
    return {
        **_GROUPS, "SLURM_PROCID": str(procid), "SLURM_NTASKS": "3",
        "SLURM_LOCALID": str(localid), "SLURM_NODEID": str(nodeid),
        "SLURM_STEP_NODELIST": "sfn[1-2]", "SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "2",
        "SLURM_TASKS_PER_NODE": "2,1", "SLURM_STEP_TASKS_PER_NODE": "2,1",
        "SLURM_HET_JOB_OFFSET": "", "SLURM_HET_SIZE": "2", "SLURM_JOB_ID": "238",
        "SLURM_STEP_ID": "0",
    }


TASKS = [het_task(0, 0, 0), het_task(1, 1, 0), het_task(2, 0, 1)]  # as recorded


def test_every_rank_of_a_het_step_gets_one_world():
    got = [rankenv.resolve(t).variables() for t in TASKS]
    assert [g["RANK"] for g in got] == ["0", "1", "2"]
    assert {g["WORLD_SIZE"] for g in got} == {"3"}
    assert [g["LOCAL_RANK"] for g in got] == ["0", "1", "0"]
    assert [g["LOCAL_WORLD_SIZE"] for g in got] == ["2", "2", "1"]
    assert [g["NODE_RANK"] for g in got] == ["0", "0", "1"]
    assert {g["NNODES"] for g in got} == {"2"}
    assert {(g["MASTER_ADDR"], g["MASTER_PORT"]) for g in got} == {
        (got[0]["MASTER_ADDR"], got[0]["MASTER_PORT"])}
    assert got[0]["MASTER_ADDR"] == "sfn1"


def test_het_batch_shell_counts_every_component_and_agrees_with_the_step():
    job = rankenv.resolve(BATCH)
    assert job.scope == "job"
    assert job.variables()["NNODES"] == "2"  # not component 0's SLURM_JOB_NUM_NODES=1
    exported, _ = rankenv.with_user_values(job, BATCH)  # what 'eval "$(slurmfabric env)"' sets
    for task in TASKS:
        step = rankenv.resolve({**task, **exported}).variables()
        assert (step["MASTER_ADDR"], step["MASTER_PORT"]) == (
            exported["MASTER_ADDR"], exported["MASTER_PORT"])


# --- config and rendering ---------------------------------------------------------------


def het_table(launcher: str = "srun") -> dict:
    return {
        "job": {"name": "het", "nodes": 1, "ntasks_per_node": 2, "partition": "gpu",
                "time": "10",
                "components": [{"nodes": 1, "ntasks_per_node": 1, "partition": "cpu",
                                "mem": "4G", "constraint": "fat"}]},
        "launcher": {"type": launcher},
        "program": {"command": ["python", "probe.py"]},
    }


def het_config(launcher: str = "srun") -> JobConfig:
    return JobConfig.from_dict(het_table(launcher))


def test_header_writes_each_component_after_hetjob():
    from slurmfabric.job.render import render_sbatch_header

    lines = render_sbatch_header(het_config()).splitlines()
    split = lines.index("#SBATCH hetjob")
    first, second = lines[:split], lines[split + 1:]
    assert "#SBATCH --ntasks-per-node=2" in first and "#SBATCH --partition=gpu" in first
    assert "#SBATCH --time=10" in first and "#SBATCH --job-name=het" in first
    assert second == ["#SBATCH --constraint=fat", "#SBATCH --mem=4G", "#SBATCH --nodes=1",
                      "#SBATCH --ntasks-per-node=1", "#SBATCH --partition=cpu"]


def test_a_rendered_het_script_gives_its_config_back():
    from slurmfabric.job.render import config_from_script, render_sbatch

    config = het_config()
    assert config_from_script(render_sbatch(config)) == config


@pytest.mark.parametrize("launcher", ["srun", "srun-pmix"])
def test_launch_step_spans_every_component(launcher: str):
    from slurmfabric.job.render import render_launch

    text = render_launch(het_config(launcher))
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    assert "--het-group=0-1" in srun
    assert "SLURM_NNODES" not in text  # component 0's count alone in a het job


def test_torchrun_counts_the_nodes_of_every_component():
    from slurmfabric.job.render import render_launch

    config = JobConfig.from_dict({
        "job": {"nodes": 2, "gpus_per_node": 8,
                "components": [{"nodes": 3, "gpus_per_node": 8}]},
        "launcher": {"type": "torchrun"}, "program": {"command": ["python", "t.py"]}})
    text = render_launch(config)
    assert text.startswith("srun --het-group=0-1 ")
    assert ('--nnodes="$((SLURM_JOB_NUM_NODES_HET_GROUP_0 + '
            'SLURM_JOB_NUM_NODES_HET_GROUP_1))"') in text
    assert "--nproc-per-node=8" in text


def test_node_check_and_steps_cover_every_component():
    from slurmfabric.job.render import render_sbatch

    table = het_table()
    table["launcher"]["check_nodes"] = True
    table["steps"] = [{"name": "warm", "command": ["hostname"]}]
    config = JobConfig.from_dict(table)
    text = render_sbatch(config)
    for group in (0, 1):
        nodes = f'"$SLURM_JOB_NUM_NODES_HET_GROUP_{group}"'
        assert f"srun --het-group={group} --nodes={nodes} --ntasks={nodes} " \
               "--ntasks-per-node=1 --kill-on-bad-exit=1" in text  # the node check
        assert f"srun --job-name=warm --het-group={group} --nodes={nodes}" in text


@pytest.mark.parametrize(("table", "field"), [
    ({"launcher": {"type": "mpirun"}}, "job.components:"),
    ({"launcher": {"type": "torchrun"},
      "job": {"gpus_per_node": 8, "components": [{"gpus_per_node": 4}]}},
     "job.components[0].gpus_per_node:"),
    ({"job": {"ntasks_per_node": 2, "components": [{"ntasks_per_node": 1, "time": "5"}]}},
     "time is job-wide"),
    ({"job": {"ntasks_per_node": 2, "cpus_per_task": 4,
              "components": [{"ntasks_per_node": 1}]}},
     "job.components[0].cpus_per_task:"),
    ({"job": {"ntasks_per_node": 2, "components": [{"gpus_per_node": 0}]}},
     "job.components[0].ntasks_per_node:"),
])
def test_bad_components_are_refused_naming_the_field(table: dict, field: str):
    base = {"job": {"ntasks_per_node": 2, "components": [{"ntasks_per_node": 1}]},
            "launcher": {"type": "srun"}, "program": {"command": ["x"]}}
    for key, value in table.items():
        base[key] = {**base.get(key, {}), **value}
    if base["launcher"]["type"] == "torchrun":
        base["job"].pop("ntasks_per_node", None)
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(base)
    assert field in str(err.value)


def test_pyslurm_and_kubernetes_refuse_components():
    from slurmfabric.job import k8s, options

    config = het_config()
    with pytest.raises(UsageError, match="job.components"):
        options.pyslurm_fields(config)
    for target in k8s.TARGETS:
        with pytest.raises(UsageError, match="job.components"):
            k8s.build(config, target)


def test_the_docs_block_renders_what_it_says():
    import readme_examples
    import tomllib

    from slurmfabric.job.render import render_launch, render_sbatch_header

    block = readme_examples.block_with("[[job.components]]", "docs/launch.md", "toml")
    config = JobConfig.from_dict(tomllib.loads(block))
    header = render_sbatch_header(config).splitlines()
    assert header[header.index("#SBATCH hetjob") + 1:] == [
        "#SBATCH --mem=200G", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=4",
        "#SBATCH --partition=cpu"]
    assert "#SBATCH --gpus-per-node=8" in header[:header.index("#SBATCH hetjob")]
    assert render_launch(config).startswith("srun --het-group=0-1 ")


def test_auto_backend_submits_a_het_job_through_sbatch(monkeypatch: pytest.MonkeyPatch):
    from slurmfabric.job import submit

    monkeypatch.setattr(submit.slurm_pyslurm, "installed_version", lambda: "25.11.2")
    monkeypatch.setattr(submit.slurm_pyslurm, "check_version", lambda *a: None)  # it matches
    assert submit.build_request(het_config(), backend="auto").backend == "sbatch"
    with pytest.raises(UsageError, match="job.components"):
        submit.build_request(het_config(), backend="pyslurm")
