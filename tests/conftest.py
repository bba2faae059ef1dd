"""Make the checkout importable as ansible_collections.sparkfleet.cluster (as an installed collection is)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "collections"))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the fake Hub: from fakehub.server import FakeHub
# Tests start ansible-playbook, molecule's tools and ansible-galaxy: those beside this interpreter (the venv).
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


def module_env():
    """The environment a module runs in as a script: the collections root the tests import the collection from (a
    checkout's collections/ under pytest, ansible-test's own copy under ansible-test units)."""
    # pylint: disable-next=import-outside-toplevel
    import ansible

    # pylint: disable-next=import-outside-toplevel
    from ansible_collections.sparkfleet.cluster.plugins.module_utils import errors

    package = os.path.abspath(errors.__file__)
    paths = [package[:package.rindex("/ansible_collections/")], os.path.dirname(os.path.dirname(ansible.__file__)),
             os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in paths if path))
