"""An imported script with a launcher that runs once per node (``accelerate launch``), run on
the real testbed: ``import`` maps it to ``[launcher.per_node]`` (issue 47 part 3), ``submit``
runs the rendered script with real sbatch, srun and slurmstepd, and a recording stand-in for
``accelerate`` (the one program this machine lacks) writes, on every node, the argv and the
variables it was started with. A wrong form starts it once per task, with the script's own
hand-written rank, or with a rendezvous that differs between the nodes.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest
from testbed_cluster import Cluster

pytestmark = pytest.mark.cluster

TIMEOUT = 240

# A CPU variant of the common Slurm + accelerate recipe (the shape of
# https://github.com/huggingface/accelerate/blob/main/examples/slurm/submit_multinode.sh:
# head node from scontrol, one srun task per node, --machine_rank from $SLURM_NODEID).
ORIGINAL = """#!/bin/bash
#SBATCH --job-name=acc-import
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
head_node_ip=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun accelerate launch --cpu --num_processes 4 --num_machines 2 \\
  --machine_rank "$SLURM_NODEID" --main_process_ip "$head_node_ip" \\
  --main_process_port 29500 --mixed_precision no train.py --lr 3e-4
"""

# The stand-in: one record per process, named by node and PID, with argv one word a line.
STANDIN = """#!/bin/bash
out="$SF_RECORDS/$SLURMD_NODENAME.$$"
{
  echo "node=$SLURMD_NODENAME"
  echo "NODE_RANK=${NODE_RANK-unset}"
  echo "NNODES=${NNODES-unset}"
  echo "MASTER_ADDR=${MASTER_ADDR-unset}"
  echo "MASTER_PORT=${MASTER_PORT-unset}"
  echo "SLURM_NODEID=$SLURM_NODEID"
  echo "argv:"
  printf '%s\\n' "$@"
} > "$out"
"""


def _import_and_run(cluster: Cluster, tmp_path: Path, original: str, bindir: Path,
                    records: Path) -> tuple[str, str]:
    """Import ``original`` (exit 0: nothing left to fix), submit the config with the
    stand-ins first on PATH; the written config and the job's output."""
    script, config = tmp_path / "job.sbatch", tmp_path / "job.toml"
    script.write_text(original)
    imported = cluster.run(["slurmfabric", "import", str(script), "-o", str(config)],
                           check=False)
    assert imported.returncode == 0, imported.stderr
    env = {"PATH": f"{bindir}{os.pathsep}{cluster.env['PATH']}", "SF_RECORDS": str(records)}
    proc = cluster.run(["slurmfabric", "submit", "-c", str(config), "--workdir", str(tmp_path),
                        "--set", f"job.output={tmp_path}/job-%j.out"], env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    state = cluster.wait(job_id, timeout=TIMEOUT)
    output = (tmp_path / f"job-{job_id}.out").read_text(errors="replace")
    assert state == "COMPLETED", f"job {job_id} ended {state}:\n{output}"
    return config.read_text(), output


def _records(where: Path) -> list[dict[str, object]]:
    out = []
    for path in sorted(where.iterdir()):
        head, _, argv = path.read_text().partition("argv:\n")
        record: dict[str, object] = dict(line.split("=", 1) for line in head.splitlines())
        record["argv"] = argv.splitlines()
        out.append(record)
    return out


def _after(argv: list[str], option: str) -> str:
    return argv[argv.index(option) + 1]


def test_accelerate_runs_once_per_node_with_slurmfabrics_rank_and_rendezvous(
        cluster: Cluster, tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    bindir, records = tmp_path / "bin", tmp_path / "records"
    bindir.mkdir()
    records.mkdir(mode=0o777)
    standin = bindir / "accelerate"
    standin.write_text(STANDIN)
    standin.chmod(standin.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    written, output = _import_and_run(cluster, tmp_path, ORIGINAL, bindir, records)
    assert '[launcher.per_node]\nkind = "accelerate"' in written

    got = _records(records)
    assert len(got) == 2, (got, output)  # once per node, not once per task or worker
    assert sorted(r["node"] for r in got) == sorted(cluster.nodes[:2]) or \
        len({r["node"] for r in got}) == 2
    by_rank = {int(str(r["NODE_RANK"])): r for r in got}
    assert sorted(by_rank) == [0, 1]
    for rank, record in by_rank.items():
        argv = record["argv"]
        assert isinstance(argv, list)
        assert argv[0] == "launch"
        assert str(record["SLURM_NODEID"]) == str(rank)
        assert _after(argv, "--machine_rank") == str(rank)
        assert _after(argv, "--num_machines") == "2" == record["NNODES"]
        assert _after(argv, "--num_processes") == "4"  # 2 nodes x 2 workers
        assert _after(argv, "--main_process_ip") == record["MASTER_ADDR"]
        assert _after(argv, "--main_process_port") == record["MASTER_PORT"]
        # the script's own options and program, after what slurmfabric supplies
        assert argv[-6:] == ["--cpu", "--mixed_precision", "no", "train.py", "--lr", "3e-4"]
        assert "29500" not in argv  # the hand-written port is derived, not carried
    assert by_rank[0]["MASTER_ADDR"] == by_rank[1]["MASTER_ADDR"]
    assert by_rank[0]["MASTER_PORT"] == by_rank[1]["MASTER_PORT"]
    assert re.fullmatch(r"2[0-9]{4}", str(by_rank[0]["MASTER_PORT"]))  # the job's range


# --- Apptainer/Singularity: imported 'srun apptainer exec --bind ... IMAGE ...' ---

# A recording stand-in for apptainer (this machine has none): 'exec [--nv] --bind B,... IMAGE
# CMD...' records the image and binds, then runs CMD on the host with each bind's destination
# mapped back to its source (apptainer exec(1): --bind src[:dest[:opts]]), as the image would
# see the bound files. Any other option is an error, so the test sees what render passes.
APPTAINER = r"""#!/bin/bash
[ "$1" = exec ] || { echo "stand-in apptainer: only exec, got $1" >&2; exit 64; }
shift
binds=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bind) binds+=("$2"); shift 2 ;;
    --bind=*) binds+=("${1#--bind=}"); shift ;;
    --nv) shift ;;
    -*) echo "stand-in apptainer: unexpected option $1" >&2; exit 64 ;;
    *) break ;;
  esac
done
image=$1
shift
IFS=, read -ra items <<< "$(IFS=,; echo "${binds[*]}")"
args=()
for a in "$@"; do
  for b in "${items[@]}"; do
    src=${b%%:*}; rest=${b#*:}; dst=${rest%%:*}
    if [ "$a" = "$dst" ]; then a=$src; elif [ "${a#"$dst"/}" != "$a" ]; then a=$src/${a#"$dst"/}; fi
  done
  args+=("$a")
done
export SF_STANDIN_IMAGE="$image" SF_STANDIN_BINDS="$(IFS=,; echo "${binds[*]}")"
exec "${args[@]}"
"""

PROGRAM = """import json, os, sys
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_NODEID", "MASTER_ADDR",
        "SF_STANDIN_IMAGE", "SF_STANDIN_BINDS")
record = {k: os.environ.get(k) for k in keys}
record["argv"] = sys.argv[1:]
with open(os.path.join(os.environ["SF_RECORDS"], "rank-%s" % record["RANK"]), "w") as f:
    json.dump(record, f)
"""


def test_apptainer_exec_with_binds_runs_each_rank_in_the_image(cluster: Cluster,
                                                               tmp_path: Path) -> None:
    import json

    tmp_path.chmod(0o755)
    bindir, records, data = tmp_path / "bin", tmp_path / "records", tmp_path / "data"
    for d in (bindir, data):
        d.mkdir()
    records.mkdir(mode=0o777)
    (data / "prog.py").write_text(PROGRAM)
    standin = bindir / "apptainer"
    standin.write_text(APPTAINER)
    standin.chmod(0o755)
    written, output = _import_and_run(
        cluster, tmp_path, "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n"
        f"srun apptainer exec --bind {data}:/data /images/pt.sif python3 /data/prog.py "
        "--epochs 1\n", bindir, records)
    assert 'container_runtime = "apptainer"' in written

    got = [json.loads(p.read_text()) for p in sorted(records.iterdir())]
    assert sorted(int(r["RANK"]) for r in got) == [0, 1, 2, 3], (got, output)
    for record in got:
        assert record["WORLD_SIZE"] == "4"  # slurmfabric launch ran inside the image
        assert record["SF_STANDIN_IMAGE"] == "/images/pt.sif"
        binds = record["SF_STANDIN_BINDS"].split(",")
        assert f"{data}:/data" in binds  # the script's bind
        assert any(b.endswith(":/opt/slurmfabric/slurmfabric.pyz:ro") for b in binds)
        assert record["argv"] == ["--epochs", "1"]
    assert sorted(r["SLURM_NODEID"] for r in got) == ["0", "0", "1", "1"]
