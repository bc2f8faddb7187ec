# shellcheck shell=bash
# The VM tier's plan: one row per test binary run in the guest, four tab-separated fields:
#
#   name        [a-z0-9-], unique: the row's log is OUT/<name>.log, its exit code OUT/<name>.rc
#   environment `-`, or space-separated VAR=value words set for this row alone (each variable
#               from PLAN_VARIABLES, its value matching the pattern there, none twice)
#   binary      the absolute path of an executable test binary
#   arguments   the binary's filters and flags, space-separated words (no quoting, no globs)
#
# Sourced by run.sh (plan_check, before the guest boots) and guest.sh (plan_env).

# The variables a row may set, each with the extended regular expression its value matches. A
# variable outside this list is refused rather than passed on: a misspelt one would otherwise
# leave the row running in the guest's defaults, unnoticed.
declare -A PLAN_VARIABLES=(
  [FORKBOX_NETWORK_DEFAULT]='^(none|loopback)$'
)

# plan_check FILE: prints every malformed row of FILE, naming its line and the problem, and
# fails if there is one (or no row at all).
plan_check() {
  local file=$1 line n=0 bad=0 tabs name env bin args word var value
  local -a words
  local -A seen=()
  local -A vars
  if [ ! -s "$file" ]; then
    echo "plan $file: no row"
    return 1
  fi
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    tabs=${line//[!$'\t']/}
    if [ ${#tabs} != 3 ]; then
      echo "plan line $n: ${#tabs} tabs, not 3 (name, environment, binary, arguments): $line"
      bad=1
      continue
    fi
    plan_fields "$line"
    if ! [[ $name =~ ^[a-z0-9][a-z0-9-]*$ ]]; then
      echo "plan line $n: name '$name' is not made of [a-z0-9-]"
      bad=1
    elif [ -n "${seen[$name]:-}" ]; then
      echo "plan line $n: name '$name' is already line ${seen[$name]}'s"
      bad=1
    else
      seen[$name]=$n
    fi
    if [ "$env" != - ]; then
      vars=()
      if [ -z "$env" ]; then
        echo "plan line $n ($name): empty environment (write - for none)"
        bad=1
      fi
      read -r -a words <<<"$env"
      for word in "${words[@]}"; do
        if ! [[ $word =~ ^([A-Z][A-Z0-9_]*)=(.*)$ ]]; then
          echo "plan line $n ($name): '$word' is not VAR=value"
          bad=1
          continue
        fi
        var=${BASH_REMATCH[1]}
        value=${BASH_REMATCH[2]}
        if [ -z "${PLAN_VARIABLES[$var]+set}" ]; then
          echo "plan line $n ($name): $var is not a variable a row may set (${!PLAN_VARIABLES[*]})"
          bad=1
        elif ! [[ $value =~ ${PLAN_VARIABLES[$var]} ]]; then
          echo "plan line $n ($name): $var='$value' does not match ${PLAN_VARIABLES[$var]}"
          bad=1
        elif [ -n "${vars[$var]:-}" ]; then
          echo "plan line $n ($name): $var is set twice"
          bad=1
        fi
        vars[$var]=1
      done
    fi
    if [[ $bin != /* ]] || [ ! -f "$bin" ] || [ ! -x "$bin" ]; then
      echo "plan line $n ($name): '$bin' is not an executable file's absolute path"
      bad=1
    fi
    if [[ $args == *[\'\"\\\*\?\[\$\`]* ]]; then
      echo "plan line $n ($name): arguments '$args' hold quotes, globs or expansions (words only)"
      bad=1
    fi
  done <"$file"
  return $bad
}

# plan_fields LINE: sets name, env, bin and args (the caller's) from a row; an empty field stays
# empty (tabs are IFS whitespace to read, which would fold two of them into one).
plan_fields() {
  IFS=$'\x1f' read -r name env bin args <<<"${1//$'\t'/$'\x1f'}"
}
