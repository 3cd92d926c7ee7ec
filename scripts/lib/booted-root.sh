# A throwaway Debian root (12 or 13) booted with its own systemd (systemd-nspawn -b): its own
# journald, logind and D-Bus, never this machine's login stack. Sourced by scripts/package-test
# and scripts/box-test.
#
#   root_suite ARGS...         reads `--suite bookworm|trixie` (or 12|13) off the front of the
#                              caller's arguments into $root_suite (default bookworm); the rest
#                              are left in $root_args
#   root_make DIR PACKAGE...   a minimal root of $root_suite with these packages (mmdebstrap; apt
#                              lists kept, so the packages under test pull their dependencies
#                              from the mirror). With `--make-root-only DIR` among the caller's
#                              arguments it makes the root at DIR and the caller exits there;
#                              with $BOXKEY_PREMADE_ROOT (a root made so, by scripts/test while
#                              the packages build) it takes that one instead of making one
#   root_boot DIR [ARG...]     boots it (extra systemd-nspawn arguments); sets $root_init, the
#                              root's PID 1 seen from here, once its systemd answers
#   inside CMD...              runs CMD in the booted root as root, with a clean environment
#   root_stop                  powers it off (SIGKILL after 15 s) and removes DIR
#
# The caller sets `trap root_stop EXIT`.

root_dir=
root_suite=bookworm
root_args=()
root_nspawn=
root_init=
root_console=

# The supported releases: Debian 12 (bookworm, oldstable) and Debian 13 (trixie, stable).
root_only=

root_suite() {
  root_args=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --make-root-only) root_only=${2:?--make-root-only needs a folder}; shift 2 ;;
      --suite) root_suite=${2:?--suite needs bookworm or trixie}; shift 2 ;;
      --suite=*) root_suite=${1#--suite=}; shift ;;
      *) root_args+=("$1"); shift ;;
    esac
  done
  case "$root_suite" in
    12|bookworm) root_suite=bookworm ;;
    13|trixie) root_suite=trixie ;;
    *) echo "booted-root: unknown suite $root_suite (bookworm or trixie)" >&2; return 2 ;;
  esac
}

# The release a suite is, for people: "Debian 13 (trixie)".
root_release() {
  case "$root_suite" in bookworm) echo "Debian 12 (bookworm)" ;; trixie) echo "Debian 13 (trixie)" ;; esac
}

root_make() {
  local dir=$1
  shift
  local IFS=,
  if [ -n "$root_only" ]; then
    rmdir "$dir" 2>/dev/null || true
    mmdebstrap --quiet --variant=minbase --skip=cleanup/apt/lists --include="$*" "$root_suite" "$root_only"
    touch "$root_only.made"  # whole: a root mmdebstrap left half-made is never taken
    exit 0
  fi
  if [ -n "${BOXKEY_PREMADE_ROOT:-}" ] && [ -f "$BOXKEY_PREMADE_ROOT.made" ]; then
    rmdir "$dir" && mv "$BOXKEY_PREMADE_ROOT" "$dir"
    return
  fi
  mmdebstrap --quiet --variant=minbase --skip=cleanup/apt/lists --include="$*" "$root_suite" "$dir"
}

root_boot() {
  root_dir=$1
  shift
  root_console=$root_dir.console
  # CAP_SYS_RESOURCE: a booted box's systemd sets its units' Limit*= (nspawn drops it by default).
  # Debian 13 boots with the unified cgroup hierarchy (cgroup v2), as on hardware: systemd 257
  # deprecates the legacy one, which nspawn gives a root on a host that has it (this machine).
  # Debian 12 keeps the host's: its systemd 252 on this machine's unified hierarchy cannot kill
  # a unit's processes ("Failed to kill control group ...: Input/output error").
  local cgroups=()
  [ "$root_suite" = bookworm ] || cgroups=(SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1)
  env "${cgroups[@]}" systemd-nspawn --quiet --register=no --keep-unit --directory="$root_dir" --capability=CAP_SYS_RESOURCE "$@" --boot >"$root_console" 2>&1 </dev/null &
  root_nspawn=$!
  root_init=
  local pid
  for _ in $(seq 150); do  # systemd-nspawn's child that is systemd (a helper may come first)
    for pid in $(pgrep -P "$root_nspawn" || true); do
      [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = systemd ] && root_init=$pid
    done
    [ -n "$root_init" ] && break
    sleep 0.1
  done
  if [ -z "$root_init" ]; then
    cat "$root_console" >&2
    echo "booted-root: the root did not start" >&2
    return 1
  fi
  local state=
  for _ in $(seq 300); do  # systemd's own socket comes a moment after its start
    state=$(inside systemctl is-system-running --wait 2>/dev/null || true)
    [ -n "$state" ] && break
    sleep 0.1
  done
  echo "   system: ${state:-not answering}"
}

inside() {
  nsenter --target "$root_init" --all env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb LANG=C.UTF-8 "$@"
}

root_stop() {
  if [ -n "$root_nspawn" ] && kill -0 "$root_nspawn" 2>/dev/null; then
    [ -n "$root_init" ] && inside systemctl poweroff >/dev/null 2>&1 || true
    for _ in $(seq 150); do kill -0 "$root_nspawn" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$root_nspawn" 2>/dev/null || true
  fi
  wait 2>/dev/null || true
  [ -n "$root_dir" ] && rm -rf "$root_dir" "$root_dir.console" "$root_dir.apt"
  root_nspawn=
}
