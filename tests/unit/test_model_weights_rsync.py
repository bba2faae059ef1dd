"""model_weights' pull from a peer: rsync through module.run_command, its progress read while it runs."""

import os
import stat
import types

import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkfleet.cluster.plugins.module_utils import weights as w
from ansible_collections.sparkfleet.cluster.plugins.modules import model_weights

# What rsync --info=progress2 --stats prints: progress lines ended by CR while it runs, then its statistics.
FAKE_RSYNC = r"""#!/bin/sh
printf '          1,024   1%%    1.00MB/s    0:00:01 (xfr#1, to-chk=2/3)\r'
printf '         65,536  50%%   10.00MB/s    0:00:01 (xfr#2, to-chk=1/3)\r'
printf '        131,072 100%%   10.00MB/s    0:00:01 (xfr#3, to-chk=0/3)\n'
printf '\nNumber of files: 3\nTotal transferred file size: 131,072 bytes\n'
printf 'rsync: a warning on stderr\n' >&2
printf '%s\n' "$@" > "$0.argv"
exit "${FAKE_RSYNC_RC:-0}"
"""


class Recording(w.Progress):
    def __init__(self):
        super().__init__(None, 131072, "rsync", clock=lambda: 0.0)
        self.seen = []

    def advance(self, count, current=""):
        super().advance(count, current)
        self.seen.append(self.done)


@pytest.fixture
def job(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    rsync = bindir / "rsync"
    rsync.write_text(FAKE_RSYNC)
    rsync.chmod(rsync.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    with patch_module_args({}):
        module = AnsibleModule(argument_spec={})
    peer = {"address": "192.168.100.11", "transport": "ssh", "user": "root", "ssh_key": "~/.ssh/id key",
            "known_hosts": None, "bwlimit_kib": 0}
    return types.SimpleNamespace(module=module, p={"peer": peer}, cache_dir=str(tmp_path / "cache"),
                                 repo_id="org/name", argv=bindir / "rsync.argv")


def test_rsync_pull_reports_progress_while_it_runs_and_returns_the_bytes(job):
    progress = Recording()
    assert model_weights.rsync_pull(job, progress) == 131072
    assert progress.seen == [1024, 65536, 131072]
    argv = job.argv.read_text().splitlines()
    assert argv[-1] == w.repo_dir(job.cache_dir, job.repo_id) + "/"
    assert argv[-2] == "root@192.168.100.11:models--org--name/"
    assert "-i ~/.ssh/id key" in argv[argv.index("-e") + 1]  # passed as written, not expanded


def test_rsync_pull_failing_names_the_exit_status_and_stderr(job, monkeypatch):
    monkeypatch.setenv("FAKE_RSYNC_RC", "23")
    with pytest.raises(w.WeightsError) as caught:
        model_weights.rsync_pull(job, Recording())
    assert "exiting 23: rsync: a warning on stderr" in str(caught.value)
