# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Validate the whole inventory on the controller, before any host is contacted.

Documented in plugins/modules/cluster_validate.py (the action runs no module on the hosts)."""

from __future__ import annotations

import os

import yaml
from ansible.errors import AnsibleActionFail, AnsibleError, AnsibleUndefinedVariable
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

from ansible_collections.sparkfleet.cluster.plugins.module_utils import inventory
from ansible_collections.sparkfleet.cluster.plugins.plugin_utils import profiles

ROLES_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "roles"))


def load_role_specs(roles_dir: str = ROLES_DIR) -> dict:
    specs = {}
    for role in sorted(os.listdir(roles_dir)):
        path = os.path.join(roles_dir, role, "meta", "argument_specs.yml")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                specs[role] = (yaml.safe_load(handle) or {}).get("argument_specs") or {}
    return specs


def ansible_validate(spec, params):
    result = ArgumentSpecValidator(spec).validate(params)
    return result.error_messages, result.validated_parameters


def reaches(task_vars, stage):
    """Whether this run's --tags/--skip-tags let the stage's play run (site.yml tags each play by its stage)."""
    run = set(task_vars.get("ansible_run_tags") or ["all"])
    skipped = set(task_vars.get("ansible_skip_tags") or [])
    return stage not in skipped and "all" not in skipped and bool(run & {"all", stage})


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        unknown = sorted(set(self._task.args) - {"revision"})
        if unknown:
            raise AnsibleActionFail(f"cluster_validate takes only the option revision; found {unknown}")
        task_vars = task_vars or {}
        groups = task_vars.get("groups", {})
        hostvars = task_vars.get("hostvars", {})
        role_specs = load_role_specs()
        prefixes = inventory.checked_prefixes(role_specs)

        hosts, management, unresolved = {}, {}, {}
        for name in groups.get(inventory.CLUSTER_GROUP, []):
            host = hostvars[name]
            facts = set(host.get("ansible_facts") or {})
            hosts[name], unresolved[name] = {}, {}
            for key in host:
                if key.startswith(prefixes) and key not in facts:
                    try:
                        hosts[name][key] = host[key]
                    except AnsibleUndefinedVariable:
                        # A template that needs what only a later task knows (a fact of the node): its role
                        # checks it against its argument_specs when it runs (validate_cluster decides).
                        unresolved[name][key] = None
                    except AnsibleError as err:  # a vault without its secret, a lookup of a missing file
                        unresolved[name][key] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            if "ansible_host" in host:
                management[name] = host["ansible_host"]

        def load_profile(name):
            first = hosts[min(hosts)]
            base = hostvars[min(hosts)].get("inventory_dir") or os.getcwd()
            user_dirs = [os.path.join(base, os.path.expanduser(d)) for d in first.get("sparkfleet_profile_paths") or []]
            return profiles.load(name, [*user_dirs, profiles.collection_profile_dir()])

        try:
            problems, plan = inventory.validate_cluster(hosts, groups.get(inventory.HEAD_GROUP, []), role_specs,
                                                        ansible_validate, load_profile, management=management,
                                                        weights_stage=boolean(self._task.args.get("revision", False))
                                                        and reaches(task_vars, "weights"),
                                                        unresolved=unresolved)
        except Exception as err:  # a value no check foresaw: still one line, and still before any change
            raise AnsibleActionFail(
                f"Inventory check could not finish (nothing was changed on any host): found {type(err).__name__}: "
                f"{err}; expected every value to be checked or refused with its key; fix: this is a sparkfleet "
                "bug, please report it with the inventory values that cause it") from err
        lines = [problem.line() for problem in problems]
        result["changed"] = False
        if lines:
            heading = "Inventory check failed" if len(lines) == 1 else f"Inventory check found {len(lines)} problems"
            result.update(failed=True, msg=f"{heading} (nothing was changed on any host):\n" + "\n".join(lines))
        else:
            result["plan"] = plan
        return result
