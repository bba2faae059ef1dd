"""A file of the checkout that is not a package module (a script, a daemon shipped from files/) as a module."""

import importlib.machinery
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(relative_path, name, register=False):
    """Execute ROOT/relative_path as module `name`; `register` puts it in sys.modules first (for dataclasses)."""
    loader = importlib.machinery.SourceFileLoader(name, os.path.join(ROOT, relative_path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    if register:
        sys.modules.setdefault(name, module)
    loader.exec_module(module)
    return module
