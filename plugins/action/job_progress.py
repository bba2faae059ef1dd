# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Wait for an async job on a node and show its progress file while it runs.

Documented in plugins/modules/job_progress.py.
"""

from __future__ import annotations

import base64
import json
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights import human_bytes

display = Display()


def describe(host: str, label: str, progress: dict) -> str:
    if "text" in progress:  # a job that counts no bytes says where it is in words (bench_run: the test it runs)
        return f"{host}: {label} {progress['text']}"
    done, total = progress.get("done_bytes", 0), progress.get("total_bytes", 0)
    percent = f" ({100 * done / total:.0f}%)" if total else ""
    rate = progress.get("bytes_per_second", 0)
    return (f"{host}: {label} {progress.get('phase', '')} {human_bytes(done)} / {human_bytes(total)}{percent}"
            f" at {human_bytes(rate)}/s")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        jid = args.get("jid")
        if not jid:
            raise AnsibleActionFail("job_progress: found no jid; expected the ansible_job_id of an async task; "
                                    "fix: register the async task and pass its ansible_job_id")
        progress_file = args.get("progress_file")
        label = args.get("label", "job")
        interval = float(args.get("interval", 2))
        deadline = time.monotonic() + float(args.get("timeout", 86400))
        host = task_vars.get("inventory_hostname", "?")
        async_dir = self._remote_expand_user(self.get_shell_option("async_dir", default="~/.ansible_async"))
        shown = None
        while True:
            status = self._execute_module("ansible.legacy.async_status", task_vars=task_vars,
                                          module_args={"jid": jid, "mode": "status", "_async_dir": async_dir})
            if status.get("finished"):
                self._execute_module("ansible.legacy.async_status", task_vars=task_vars,
                                     module_args={"jid": jid, "mode": "cleanup", "_async_dir": async_dir})
                # The async wrapper's own output is dropped; a command's (it has "cmd") is its result.
                dropped = ["ansible_job_id", "finished", "started", "results_file"]
                if "cmd" not in status:
                    dropped += ["stdout", "stderr", "stdout_lines", "stderr_lines"]
                for key in dropped:
                    status.pop(key, None)
                result.update(status)
                return result
            if status.get("failed") and not status.get("started"):
                result.update(status)
                return result
            if time.monotonic() > deadline:
                result.update(failed=True, msg=f"found {label} still running after {args.get('timeout')} s; "
                                               "expected it to finish; fix: raise the timeout or check the node")
                return result
            if progress_file:
                read = self._execute_module("ansible.builtin.slurp", module_args={"src": progress_file},
                                            task_vars=task_vars)
                if not read.get("failed"):
                    try:
                        line = describe(host, label, json.loads(base64.b64decode(read["content"])))
                    except ValueError:
                        line = None
                    if line and line != shown:
                        display.display(line)
                        shown = line
            time.sleep(interval)
