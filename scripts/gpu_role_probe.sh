#!/usr/bin/env bash
# Run the gpu role twice on this NVIDIA machine (local connection); the second run must change nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
export ANSIBLE_CONFIG=$PWD/ansible.cfg ANSIBLE_COLLECTIONS_PATH=$PWD/collections ANSIBLE_FORCE_COLOR=false
# Only ansible-core travels to such a machine: no ansible.posix timer callback there.
export ANSIBLE_CALLBACKS_ENABLED=ansible.builtin.default
for run in first second; do
  echo "== $run run"
  ansible-playbook -i localhost, -e ansible_python_interpreter="$(command -v python3)" scripts/gpu_role_probe.yml | tee "/tmp/gpu-role-$run.log" | grep -E "msg|ok=|changed:|fatal|FAIL" || true
done
grep -q "changed=0 .*failed=0" /tmp/gpu-role-second.log && echo "second run: changed=0"
