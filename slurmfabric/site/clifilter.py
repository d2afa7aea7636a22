"""Site submit policy as a Slurm ``cli_filter.lua``: defaults per partition and refusals.

Slurm's cli_filter/lua plugin (slurm.conf ``CliFilterPlugins=cli_filter/lua``; the script
is ``cli_filter.lua`` beside slurm.conf; https://slurm.schedmd.com/cli_filter_plugins.html)
calls ``slurm_cli_pre_submit(options, offset)`` in sbatch, salloc and srun after the
command line is parsed; returning ``slurm.ERROR`` refuses the submission, and
``slurm.log_error``/``slurm.log_info`` print on the user's terminal. The option values
this filter reads were observed on Slurm 22.05 (Debian 12): ``requeue`` is ``requeue``,
``no-requeue`` or ``unset``; ``signal`` is ``[B:|R:]SIG@TIME`` or ``0@0`` when not given;
``gpus``/``gpus-per-node``/``gres`` are nil when not given; setting ``no-requeue`` to
``set`` or ``signal`` to a value applies it.

The policy comes from the ``[cli_filter]`` table of the site config (TOML), checked here:
a wrong key or value is one line naming it (exit 2) and nothing is written. In the Lua, the
whole policy runs under ``pcall``: an error there (a hand-edited table, an option Slurm
renamed) is logged and the submission goes through (fail open: a broken filter must not
stop the cluster). Steps inside an allocation (srun with SLURM_JOB_ID set) are left alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from slurmfabric.errors import ConfigError

_PARTITION = re.compile(r"^(\*|[A-Za-z0-9_.-]{1,64})$")
_OPTION = re.compile(r"^[a-z][a-z0-9-]{0,40}$")
_SIGNAL = re.compile(r"^(?:SIG)?([A-Z0-9]{1,10})$")
_SIGNAL_SPEC = re.compile(r"^(?:[BR]{1,2}:)?(?:SIG)?[A-Z0-9]{1,10}(?:@[0-9]{1,6})?$")
KEYS = {"gpu_partitions", "default_partition", "refuse_signals", "require_gpus",
        "defaults", "refuse"}
DEFAULT_KEYS = {"requeue", "signal"}
REFUSE_KEYS = {"option", "partitions", "message"}


@dataclass
class Refusal:
    option: str
    message: str
    partitions: list[str] = field(default_factory=list)  # empty: every partition


@dataclass
class Policy:
    gpu_partitions: list[str] = field(default_factory=list)
    default_partition: str = ""
    # GPU partitions only, and only the forms that reach the tasks: B:SIG goes to the batch
    # shell alone, where no rank's library can catch it
    refuse_signals: list[str] = field(default_factory=list)
    require_gpus: bool = False
    defaults: dict[str, dict[str, object]] = field(default_factory=dict)  # partition -> opts
    refuse: list[Refusal] = field(default_factory=list)


def load(path: str) -> Policy:
    from slurmfabric._common.tomlfile import read_toml_file

    data = read_toml_file(path, hint="see docs/site.md, 'cli_filter'")
    table = data.get("cli_filter")
    if not isinstance(table, dict):
        raise ConfigError([f"{path}: no [cli_filter] table"],
                          hint="add [cli_filter] with the policy (docs/site.md)")
    return parse(table, path)


def _fail(where: str, key: str, problem: str, fix: str) -> ConfigError:
    return ConfigError([f"{where}: cli_filter.{key} {problem}"], hint=fix)


def _names(value: object, key: str, where: str, pattern: re.Pattern[str],
           what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(where, key, f"must be a list of {what}", f'e.g. {key} = ["gpu"]')
    bad = [v for v in value if not pattern.match(v)]
    if bad:
        raise _fail(where, key, f"has {bad[0]!r}, not a {what[:-1]}",
                    "letters, digits, '_', '.', '-'")
    return list(value)


def parse(table: dict, where: str) -> Policy:
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise _fail(where, unknown[0], "is not a known key",
                    f"known: {', '.join(sorted(KEYS))}")
    policy = Policy()
    policy.gpu_partitions = _names(table.get("gpu_partitions", []), "gpu_partitions", where,
                                   _PARTITION, "partition names")
    default = table.get("default_partition", "")
    if not isinstance(default, str) or (default and not _PARTITION.match(default)):
        raise _fail(where, "default_partition", f"{default!r} is not a partition name",
                    "the partition slurm.conf marks Default=YES")
    policy.default_partition = default
    signals = _names(table.get("refuse_signals", []), "refuse_signals", where,
                     re.compile(r"^(?:SIG)?[A-Z0-9]{1,10}$"), "signal names")
    policy.refuse_signals = [_SIGNAL.match(s).group(1) for s in signals]  # type: ignore[union-attr]
    require = table.get("require_gpus", False)
    if not isinstance(require, bool):
        raise _fail(where, "require_gpus", f"is {require!r}", "true or false")
    policy.require_gpus = require
    defaults = table.get("defaults", {})
    if not isinstance(defaults, dict):
        raise _fail(where, "defaults", "must be a table of partitions",
                    "[cli_filter.defaults.gpu] requeue = true")
    for partition, opts in defaults.items():
        if not _PARTITION.match(partition):
            raise _fail(where, f"defaults.{partition}", "is not a partition name", "or '*'")
        if not isinstance(opts, dict):
            raise _fail(where, f"defaults.{partition}", "must be a table", "requeue = true")
        bad = sorted(set(opts) - DEFAULT_KEYS)
        if bad:
            raise _fail(where, f"defaults.{partition}.{bad[0]}", "is not a default this "
                        "filter sets", f"known: {', '.join(sorted(DEFAULT_KEYS))}")
        if "requeue" in opts and not isinstance(opts["requeue"], bool):
            raise _fail(where, f"defaults.{partition}.requeue", f"is {opts['requeue']!r}",
                        "true (--requeue) or false (--no-requeue)")
        if "signal" in opts and (not isinstance(opts["signal"], str)
                                 or not _SIGNAL_SPEC.match(opts["signal"])):
            raise _fail(where, f"defaults.{partition}.signal", f"is {opts['signal']!r}",
                        "as sbatch --signal takes it, e.g. B:USR2@120")
        policy.defaults[partition] = dict(opts)
    refuse = table.get("refuse", [])
    if not isinstance(refuse, list):
        raise _fail(where, "refuse", "must be an array of tables",
                    '[[cli_filter.refuse]] option = "wrap" message = "..."')
    for n, item in enumerate(refuse):
        key = f"refuse[{n}]"
        if not isinstance(item, dict):
            raise _fail(where, key, "must be a table", 'option = "wrap", message = "..."')
        bad = sorted(set(item) - REFUSE_KEYS)
        if bad:
            raise _fail(where, f"{key}.{bad[0]}", "is not a known key",
                        f"known: {', '.join(sorted(REFUSE_KEYS))}")
        option, message = item.get("option"), item.get("message")
        if not isinstance(option, str) or not _OPTION.match(option):
            raise _fail(where, f"{key}.option", f"is {option!r}",
                        "an sbatch long option name without dashes, e.g. wrap")
        if not isinstance(message, str) or not message.strip() or len(message) > 300 \
                or not message.isprintable():
            raise _fail(where, f"{key}.message", "must be one printable line (up to 300 "
                        "characters)", "say why and what to do instead")
        partitions = _names(item.get("partitions", []), f"{key}.partitions", where,
                            _PARTITION, "partition names")
        policy.refuse.append(Refusal(option, message, partitions))
    return policy


def _lua(value: object) -> str:
    """A Lua literal for a checked value: strings escaped byte by byte (\\ddd)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        out = []
        for byte in value.encode("utf-8"):
            char = chr(byte)
            out.append(char if 32 <= byte < 127 and char not in '"\\' else f"\\{byte:03d}")
        return '"' + "".join(out) + '"'
    if isinstance(value, list):
        return "{" + ", ".join(_lua(v) for v in value) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{_lua(k)}] = {_lua(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no Lua literal for {value!r}")


def policy_table(policy: Policy) -> str:
    return _lua({
        "gpu_partitions": policy.gpu_partitions,
        "default_partition": policy.default_partition,
        "refuse_signals": policy.refuse_signals,
        "require_gpus": policy.require_gpus,
        "defaults": policy.defaults,
        "refuse": [{"option": r.option, "message": r.message, "partitions": r.partitions}
                   for r in policy.refuse],
    })


def render(policy: Policy) -> str:
    from slurmfabric import __version__

    return LUA.replace("@POLICY@", policy_table(policy)).replace("@VERSION@", __version__)


LUA = r"""-- cli_filter.lua written by slurmfabric @VERSION@ ('slurmfabric site cli-filter').
-- Regenerate it from the site config instead of editing it. slurm.conf:
--   CliFilterPlugins=cli_filter/lua   (this file lives beside slurm.conf)
-- Fail open: any error in the policy below is logged and the submission goes through.

local POLICY = @POLICY@

local SIGNUM = {["1"] = "HUP", ["2"] = "INT", ["3"] = "QUIT", ["9"] = "KILL",
                ["10"] = "USR1", ["12"] = "USR2", ["15"] = "TERM"}

local function member(list, value)
  for _, item in ipairs(list or {}) do
    if item == value or item == "*" then return true end
  end
  return false
end

local function given(value)
  return value ~= nil and value ~= "" and value ~= "unset" and value ~= "0@0"
end

-- "B:USR1@90" -> "USR1"; "10@60" -> "USR1"
-- B: (alone or with R:) sends the signal to the batch shell only, never to the tasks
local function batch_only(spec)
  local flags = string.match(spec, "^([BRbr]+):")
  return flags ~= nil and string.find(string.upper(flags), "B", 1, true) ~= nil
end

local function signal_name(spec)
  local name = string.gsub(spec, "^[BR]+:", "")
  name = string.upper(string.gsub(name, "@.*$", ""))
  name = string.gsub(name, "^SIG", "")
  return SIGNUM[name] or name
end

local function asks_for_gpus(options)
  for _, key in ipairs({"gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket"}) do
    if given(options[key]) then return true end
  end
  local gres = options["gres"]
  return given(gres) and string.find(gres, "gpu", 1, true) ~= nil
end

-- The table above is what 'site cli-filter' checked; a hand edit that breaks its shape is
-- an error here (logged, submission allowed), never a policy silently not applied.
local function check_policy()
  local shape = {gpu_partitions = "table", default_partition = "string",
                 refuse_signals = "table", require_gpus = "boolean", defaults = "table",
                 refuse = "table"}
  if type(POLICY) ~= "table" then error("POLICY is not a table") end
  for key, kind in pairs(shape) do
    if type(POLICY[key]) ~= kind then
      error(string.format("POLICY.%s is a %s, not a %s", key, type(POLICY[key]), kind))
    end
  end
  for _, rule in ipairs(POLICY.refuse) do
    if type(rule.option) ~= "string" or type(rule.message) ~= "string"
        or type(rule.partitions) ~= "table" then
      error("a POLICY.refuse rule lacks option, message or partitions")
    end
  end
end

local function apply(options)
  check_policy()
  if options["type"] == "srun" and os.getenv("SLURM_JOB_ID") ~= nil then
    return slurm.SUCCESS -- a step inside an allocation: the job was checked at submit
  end
  local partition = options["partition"]
  if not given(partition) then partition = POLICY.default_partition end
  -- a job may name several partitions (-p a,b): each is checked
  local parts = {}
  for name in string.gmatch(partition or "", "[^,]+") do table.insert(parts, name) end
  for _, part in ipairs(parts) do
    local gpu = member(POLICY.gpu_partitions, part)
    for _, rule in ipairs(POLICY.refuse) do
      local here = #rule.partitions == 0 or member(rule.partitions, part)
      if here and given(options[rule.option]) then
        slurm.log_error("slurmfabric policy: --%s is not allowed on partition %s: %s",
                        rule.option, part, rule.message)
        return slurm.ERROR
      end
    end
    if gpu and given(options["signal"]) and not batch_only(options["signal"]) then
      local name = signal_name(options["signal"])
      if member(POLICY.refuse_signals, name) then
        slurm.log_error("slurmfabric policy: --signal=%s is refused on GPU partition %s "
                        .. "(SIG%s would reach every task, where a library may catch it); "
                        .. "send it to the batch shell only (--signal=B:%s@120) or use "
                        .. "another signal", options["signal"], part, name, name)
        return slurm.ERROR
      end
    end
    if gpu and POLICY.require_gpus and not asks_for_gpus(options) then
      slurm.log_error("slurmfabric policy: partition %s is for GPU jobs: ask for GPUs "
                      .. "(--gpus-per-node=N, --gpus=N or --gres=gpu:N)", part)
      return slurm.ERROR
    end
  end
  for _, part in ipairs(parts) do
    local defaults = POLICY.defaults[part] or POLICY.defaults["*"]
    if defaults ~= nil then
      if defaults.requeue ~= nil and not given(options["requeue"]) then
        if defaults.requeue then options["requeue"] = "set" else options["no-requeue"] = "set" end
        slurm.log_info("slurmfabric policy: partition %s: default --%s", part,
                       defaults.requeue and "requeue" or "no-requeue")
      end
      if defaults.signal ~= nil and not given(options["signal"]) then
        options["signal"] = defaults.signal
        slurm.log_info("slurmfabric policy: partition %s: default --signal=%s", part,
                       defaults.signal)
      end
      break
    end
  end
  return slurm.SUCCESS
end

function slurm_cli_setup_defaults(options, early_pass)
  return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, offset)
  local ok, result = pcall(apply, options)
  if not ok then
    slurm.log_error("slurmfabric policy: filter error, submission allowed: %s", tostring(result))
    return slurm.SUCCESS
  end
  return result
end

function slurm_cli_post_submit(offset, job_id, step_id)
  return slurm.SUCCESS
end
"""
