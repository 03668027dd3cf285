# Sourced first by every GPU script: its options are flags (no environment variables). A script declares them,
# then parses its arguments, then sources env.sh:
#   source tests/gpu/flags.sh
#   flag iters 45 "training iterations"          # --iters N   -> $opt_iters (default 45)
#   switch dry-run "resolve, do not train"       # --dry-run   -> $opt_dry_run=1 (default 0)
#   parse_flags "$@"
# Every script also takes --out DIR ($opt_out: where its logs and result files go; default ./gpu-results) and
# --help (the script's header comment and its flags). --name=value works as well as --name value.
# A flag whose help begins with "required:" must be given.
_flag_names=() _flag_kinds=() _flag_help=()

flag() {  # flag NAME DEFAULT HELP: --NAME VALUE sets $opt_NAME (dashes as underscores)
  _flag_names+=("$1") _flag_kinds+=(value) _flag_help+=("$3${2:+ (default: $2)}")
  printf -v "opt_${1//-/_}" '%s' "$2"
}

switch() {  # switch NAME HELP: --NAME sets $opt_NAME=1 (default 0)
  _flag_names+=("$1") _flag_kinds+=(switch) _flag_help+=("$2")
  printf -v "opt_${1//-/_}" '%s' 0
}

flag out gpu-results "where the logs and result files go"

flags_usage() {
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
  echo "options:"
  local i
  for i in "${!_flag_names[@]}"; do
    if [ "${_flag_kinds[$i]}" = value ]; then
      printf '  --%-24s %s\n' "${_flag_names[$i]} VALUE" "${_flag_help[$i]}"
    else
      printf '  --%-24s %s\n' "${_flag_names[$i]}" "${_flag_help[$i]}"
    fi
  done
  printf '  --%-24s %s\n' help "this text"
}

parse_flags() {
  local name i found
  while [ $# -gt 0 ]; do
    case $1 in
      -h|--help) flags_usage; exit 0 ;;
      --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}"; continue ;;
      --*)
        name=${1#--} found=
        for i in "${!_flag_names[@]}"; do [ "${_flag_names[$i]}" = "$name" ] && found=$i; done
        if [ -z "$found" ]; then echo "$0: unknown option $1 (--help lists them)" >&2; exit 2; fi
        if [ "${_flag_kinds[$found]}" = switch ]; then
          printf -v "opt_${name//-/_}" '%s' 1; shift
        else
          if [ $# -lt 2 ]; then echo "$0: $1 needs a value" >&2; exit 2; fi
          printf -v "opt_${name//-/_}" '%s' "$2"; shift 2
        fi ;;
      *) echo "$0: unexpected argument '$1': options are flags (--help lists them)" >&2; exit 2 ;;
    esac
  done
  for i in "${!_flag_names[@]}"; do
    name=opt_${_flag_names[$i]//-/_}
    if [[ "${_flag_help[$i]}" == required:* && -z "${!name}" ]]; then
      echo "$0: --${_flag_names[$i]} is required (--help)" >&2; exit 2
    fi
  done
}
