# Container neutralisation for `slurmfabric import --check` on real Slurm (realcheck.py).
# The testbed has none of the images a real job names, so in BOTH scripts alike:
#  - srun (sf_srun REAL_SRUN STANDIN_DIR ARGS...): pyxis's options (https://github.com/NVIDIA/pyxis, args.c: spank_opts),
#    Slurm's own --container/--container-id (srun(1)) and the PYXIS_CONTAINER_* /
#    SLURM_CONTAINER* variables that stand for them are recorded as the job's container
#    request, then removed; the real srun runs the step without them.
#  - apptainer/singularity exec, shifter, enroot start (sf_unwrap, from the stand-in):
#    the runtime's options and image are recorded the same way, then the command it would
#    run in the image runs here (a stand-in or a tool, like any other command).
#  - python3 /opt/slurmfabric/slurmfabric.pyz ... (slurmfabric's own zipapp in the image)
#    runs this slurmfabric instead.
# Only builtins and absolute paths: the job's PATH holds stand-ins.

# One record per request: the runtime's name, its options (a value as --name=value),
# the image last (apptainer/singularity, enroot's container name).
sf_request() {
  local r="$SF_REC_DIR.container/${EPOCHREALTIME/./}.$$.$RANDOM"
  /bin/mkdir -p "${r%/*}" && printf '%s\0' "$@" > "$r"
}

sf_srun() {
  local real="$1" bin="$2" w want="" scan=1 name prev=""
  shift 2
  local args=() req=()
  for w in "$@"; do
    if [[ -n $want ]]; then req+=("--$want=$w"); want=""; continue; fi
    # A program the image has at an absolute path (/opt/nccl-tests/build/all_reduce_perf)
    # that this host lacks: a stand-in of that name, in both scripts alike. A program is a
    # word srun would run (not the value of a bare option before it) or the word after
    # '--' (slurmfabric launch ... -- PROGRAM).
    if [[ $w == /* && ! -e $w ]]; then
      if [[ -x $bin/${w##*/} ]]; then
        w=$bin/${w##*/}
      elif [[ $prev == -- ]] || { (( scan )) && [[ $prev != -* || $prev == *=* ]]; }; then
        /bin/mkdir -p "$bin.image" && /bin/ln -sf "${bin%/*}/standin" "$bin.image/${w##*/}" \
          && w=$bin.image/${w##*/}
      fi
    fi
    prev=$w
    if (( scan )); then
      case $w in
        # pyxis options with a value, and Slurm's OCI container options
        --container-image|--container-mounts|--container-workdir|--container-name|\
        --container-save|--container-env|--container-unshare|--container|--container-id)
          want=${w#--}; continue ;;
        --container*|--no-container*) req+=("$w"); continue ;;
        --) scan=0 ;;
        -*) ;;
        # the program: srun's options end at the first word that names one
        # (a value such as 8 or /path/out.log names no program here)
        *) type -P -- "$w" >/dev/null 2>&1 && scan=0 ;;
      esac
    fi
    args+=("$w")
  done
  for name in $(compgen -e); do
    case $name in
      PYXIS_CONTAINER_*|SLURM_CONTAINER|SLURM_CONTAINER_ID|*SPANK_OPTION_pyxis*)
        req+=("$name=${!name}"); unset "$name" ;;
    esac
  done
  (( ${#req[@]} )) && sf_request srun "${req[@]}"
  exec "$real" "${args[@]}"
}

# sf_unwrap RUNTIME ARGS...: record the runtime's options and image, run the command.
sf_unwrap() {
  local runtime="$1" w want="" image=""
  shift
  local req=()
  case $runtime in
    apptainer|singularity)
      [[ ${1:-} == exec ]] || return 1  # run/shell/instance: the image's own program
      shift ;;
    enroot)
      [[ ${1:-} == start ]] || return 1
      shift ;;
  esac
  while (( $# )); do
    w=$1
    if [[ -n $want ]]; then req+=("$want=$w"); want=""; shift; continue; fi
    # Options that take a value: apptainer/singularity exec
    # (https://apptainer.org/docs/user/main/cli/apptainer_exec.html), shifter
    # (https://docs.nersc.gov/development/containers/shifter/how-to-use/), enroot start
    # (https://github.com/NVIDIA/enroot/blob/main/doc/cmd/start.md).
    case $runtime:$w in
      apptainer:--add-caps|apptainer:--app|apptainer:--apply-cgroups|apptainer:--bind|\
      apptainer:-B|apptainer:--cpu-shares|apptainer:--cpus|apptainer:--cpuset-cpus|\
      apptainer:--cpuset-mems|apptainer:--device|apptainer:--dns|apptainer:--drop-caps|\
      apptainer:--env|apptainer:--env-file|apptainer:--fusemount|apptainer:--home|\
      apptainer:-H|apptainer:--hostname|apptainer:--memory|apptainer:--memory-reservation|\
      apptainer:--memory-swap|apptainer:--mount|apptainer:--network|\
      apptainer:--network-args|apptainer:--no-mount|apptainer:--overlay|apptainer:-o|\
      apptainer:--pem-path|apptainer:--pids-limit|apptainer:--pwd|apptainer:--scratch|\
      apptainer:-S|apptainer:--security|apptainer:--workdir|apptainer:-W|\
      apptainer:--blkio-weight|apptainer:--blkio-weight-device|\
      singularity:--add-caps|singularity:--app|singularity:--apply-cgroups|\
      singularity:--bind|singularity:-B|singularity:--env|singularity:--env-file|\
      singularity:--fusemount|singularity:--home|singularity:-H|singularity:--hostname|\
      singularity:--mount|singularity:--network|singularity:--network-args|\
      singularity:--no-mount|singularity:--overlay|singularity:-o|singularity:--pwd|\
      singularity:--scratch|singularity:-S|singularity:--security|singularity:--workdir|\
      singularity:-W|singularity:--drop-caps|singularity:--pem-path|\
      shifter:--image|shifter:--volume|shifter:-V|shifter:--module|shifter:-m|\
      shifter:--env|shifter:-e|shifter:--env-file|shifter:--workdir|shifter:-w|\
      enroot:--conf|enroot:-c|enroot:--env|enroot:-e|enroot:--mount|enroot:-m)
        want=$w ;;
      *:--) shift; break ;;
      *:-*) req+=("$w") ;;
      *)
        # the image (apptainer, singularity) or the container's name (enroot); shifter
        # takes the image as an option, so its first other word is the command
        [[ $runtime == shifter ]] && break
        image=$w; shift; break ;;
    esac
    shift
  done
  sf_request "$runtime" "${req[@]}" ${image:+"$image"}
  (( $# )) || exit 0  # no command: the image's own (runscript, entrypoint): recorded only
  exec "$@"
}
