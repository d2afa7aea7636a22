"""The config's vocabulary (config/vocabulary.py) against the model and the options table:
every name the model checks ``job.extra_sbatch`` lines with is an option job/options.py
renders, every owning field is a field of the model, and the vocabulary loads without
pydantic (restart/ and the resume command read it)."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

from slurmfabric.config import vocabulary
from slurmfabric.config.models import JobConfig, JobSection, ResumeSection
from slurmfabric.job import options


def _has_field(path: str) -> bool:
    section, _, name = path.partition(".")
    model = JobConfig.model_fields[section].annotation
    return name in model.model_fields  # type: ignore[union-attr]


def test_the_vocabulary_and_the_options_table_name_the_same_options() -> None:
    assert [n.sbatch for n in vocabulary.NAMES] == list(vocabulary.BY_SBATCH)
    assert {o.sbatch for o in options.OPTIONS} == set(vocabulary.BY_SBATCH)
    assert len(options.OPTIONS) == len(vocabulary.NAMES)


def test_every_owner_is_a_field_of_the_model() -> None:
    owners = {part for name in vocabulary.NAMES for part in name.owner.split("/")}
    assert {owner for owner in owners if not _has_field(owner)} == set()
    assert "job.gpus_per_node" in owners and "launcher.resume" in owners  # a wrong split


def test_component_fields_are_job_fields() -> None:
    assert vocabulary.COMPONENT_FIELDS.issubset(JobSection.model_fields)
    assert "time" not in vocabulary.COMPONENT_FIELDS  # job-wide: Slurm propagates it


def test_resume_events_are_the_models_events() -> None:
    annotation = ResumeSection.model_fields["events"].annotation
    assert get_args(get_args(annotation)[0]) == vocabulary.RESUME_EVENTS


def test_an_abbreviation_is_read_as_every_option_it_could_stand_for() -> None:
    # getopt_long takes an unambiguous prefix of a long option (sbatch(1) "OPTIONS");
    # --wait is an option of its own, not --wait-all-nodes abbreviated.
    assert [n.sbatch for n in vocabulary.modelled("part")] == ["partition"]
    assert {n.sbatch for n in vocabulary.modelled("mem-per")} == {"mem-per-cpu", "mem-per-gpu"}
    assert vocabulary.modelled("wait") == []
    assert [n.sbatch for n in vocabulary.modelled("N")] == ["nodes"]
    assert vocabulary.split_extra("--gres=gpu:4") == ("gres", "gpu:4")
    assert vocabulary.split_extra("-N4") == ("N", "4")


def test_an_extra_line_is_refused_through_the_model_naming_its_owner() -> None:
    config = {"job": {"nodes": 2, "gpus_per_node": 8, "extra_sbatch": ["--part=gpu"]},
              "program": {"command": ["python", "train.py"]}}
    try:
        JobConfig.from_dict(config)
    except Exception as exc:  # ConfigError: one line per problem
        message = str(exc)
    else:
        raise AssertionError("a clashing extra_sbatch line was accepted")
    assert "'--part=gpu' (an abbreviation sbatch expands) sets what job.partition sets" in message


def test_the_vocabulary_and_the_restart_package_load_without_pydantic() -> None:
    code = ("import sys, slurmfabric.config.vocabulary, slurmfabric.restart, "
            "slurmfabric.commands.resume\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pydantic', 'pydantic_settings', 'jinja2')\n"
            "        or m in ('slurmfabric.config.models', 'slurmfabric.job'))\n"
            "print(heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


RANGES = ["20000-29999", "1024-65535", "1023-2000", "30000-20000", "5000-5000", "1024-65536",
          "0-0", "65535-65535"]


def test_the_port_range_agrees_with_slurmfabric_env() -> None:
    """launcher.rendezvous.port_range is written into the script as --port-range for
    `slurmfabric env` (rank/env.py, which the config may not import): its default and the
    ranges it accepts are those of the run-time side, else a config that loads would fail
    on every node."""
    from slurmfabric.config.sections.launcher import DEFAULT_PORT_RANGE
    from slurmfabric.errors import ConfigError, RankEnvError
    from slurmfabric.rank import env as rankenv

    assert DEFAULT_PORT_RANGE == rankenv.DEFAULT_PORT_RANGE
    assert JobConfig.from_dict({"program": {"command": ["t"]}, "launcher": {
        "nproc_per_node": 1}}).launcher.rendezvous.port_range == rankenv.DEFAULT_PORT_RANGE
    verdicts = {}
    for text in RANGES:
        low, high = (int(part) for part in text.split("-"))
        try:
            rankenv.parse_port_range(text)
            at_run_time = True
        except RankEnvError:
            at_run_time = False
        try:
            JobConfig.from_dict({"program": {"command": ["t"]}, "launcher": {
                "nproc_per_node": 1, "rendezvous": {"port_range": [low, high]}}})
            in_config = True
        except ConfigError as exc:
            assert "launcher.rendezvous.port_range" in str(exc)
            in_config = False
        verdicts[text] = (in_config, at_run_time)
    assert {text for text, (a, b) in verdicts.items() if a != b} == set()
    assert sum(a for a, _ in verdicts.values()) == 4  # both sides refuse the other four
