#!/bin/sh
# Start dockerd detached when no init system manages it (CI machines boot with none running),
# then wait until it answers. Prints "started" when it started one, nothing when one already ran.
set -eu
log=${1:-/var/log/sparkfleet-dockerd.log}
if docker info >/dev/null 2>&1; then
  exit 0
fi
setsid dockerd >>"$log" 2>&1 </dev/null &
i=0
while ! docker info >/dev/null 2>&1; do
  i=$((i + 1))
  if [ "$i" -ge 60 ]; then
    echo "dockerd did not answer within 60 s; see $log" >&2
    tail -n 20 "$log" >&2 || true
    exit 1
  fi
  sleep 1
done
echo started
