"""Make the checkout importable as ansible_collections.sparkfleet.cluster (as an installed collection is)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "collections"))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the fake Hub: from fakehub.server import FakeHub
# Tests start ansible-playbook, molecule's tools and ansible-galaxy: those beside this interpreter (the venv).
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
